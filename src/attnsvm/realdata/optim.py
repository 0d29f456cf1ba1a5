"""The core step rules of THEORY §6 (``attnsvm.optim``) as ``torch.optim.Optimizer``s for
``nn.Module`` parameters.

``attnsvm.optim`` rules are pure functions ``step(params, grads, gap) -> new params`` on
``dict[str, Tensor]`` with a leading trial dimension and norms over all other dims. A
module parameter viewed as ``w.unsqueeze(0)`` is a one-trial tensor, so the rules apply
unchanged: :class:`CoreRule` feeds every parameter of a group to the rule as one trial and
copies the result back. Nothing is re-implemented here:

- :class:`SNGD` = ``attnsvm.optim.ngd(lr, norm)``: W <- W - lr G / ||G||_F per tensor
  (``norm="per_tensor"``, the default) or with one norm over all tensors ("global");
  a zero gradient gives a zero step.
- :class:`MirrorDescent` = ``attnsvm.optim.mirror(p, lr, normalized)``:
  W <- inv(grad psi(W) - lr G'), grad psi(W) = sign(W)|W|^{p-1}, inv(U) = sign(U)|U|^{1/(p-1)}
  entrywise, G' = G or G / ||G||_{p/(p-1)}. p = 2 is exactly SGD.
"""

from __future__ import annotations

import torch

from attnsvm import optim as core

__all__ = ["CoreRule", "SNGD", "MirrorDescent", "make_optimizer"]


class CoreRule(torch.optim.Optimizer):
    """Apply an ``attnsvm.optim.Optimizer`` rule to module parameters (one trial, B = 1)."""

    def __init__(self, params, rule: core.Optimizer):
        super().__init__(params, {})
        self.rule = rule

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            ws = [w for w in group["params"] if w.grad is not None]
            params = {str(i): w.unsqueeze(0) for i, w in enumerate(ws)}
            grads = {str(i): w.grad.unsqueeze(0) for i, w in enumerate(ws)}
            new = self.rule.step(params, grads, None)
            for i, w in enumerate(ws):
                w.copy_(new[str(i)].squeeze(0))
        return loss


class SNGD(CoreRule):
    """Normalised (stochastic) GD, ``attnsvm.optim.ngd``: W <- W - lr G / ||G||_F per tensor."""

    def __init__(self, params, lr: float, norm: str = "per_tensor"):
        if lr <= 0:
            raise ValueError(f"lr must be > 0; got {lr}")
        super().__init__(params, core.ngd(lr, norm))


class MirrorDescent(CoreRule):
    """l_p mirror descent, ``attnsvm.optim.mirror`` (THEORY §6), entrywise per tensor:

        U = sign(W) |W|^{p-1} - lr G',   W <- sign(U) |U|^{1/(p-1)}

    with G' = G, or G / ||G||_{p/(p-1)} when ``normalized``. p must be > 1; p = 2 is SGD.
    """

    def __init__(self, params, lr: float, p: float = 2.0, normalized: bool = False):
        if lr <= 0:
            raise ValueError(f"lr must be > 0; got {lr}")
        if not p > 1:
            raise ValueError(f"p must be > 1 for l_p mirror descent; got {p}")
        super().__init__(params, core.mirror(p, lr, normalized))


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """Optimiser by name: ``"sgd"`` (torch's SGD), ``"sngd"`` (per-tensor normalised),
    or ``"md<p>"`` (l_p mirror descent, e.g. ``"md1.1"``, ``"md3"``)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "sngd":
        return SNGD(params, lr=lr)
    if name.startswith("md"):
        try:
            p = float(name[2:])
        except ValueError:
            raise ValueError(f"optimizer name 'md<p>' needs a number p; got {name!r}") from None
        return MirrorDescent(params, lr=lr, p=p)
    raise ValueError(f"optimizer must be 'sgd', 'sngd' or 'md<p>'; got {name!r}")
