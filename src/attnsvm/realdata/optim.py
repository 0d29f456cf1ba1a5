"""Optimisers for the real-data networks (``attnsvm vit``): the registered rules of
``attnsvm.optim`` on ``nn.Module`` parameters through :class:`~attnsvm.optim.RuleOptimizer`.

- :class:`SNGD` = ``attnsvm.optim.ngd(lr, norm)``: W <- W - lr G / ||G||_F per tensor
  (``norm="per_tensor"``, the default) or with one norm over all tensors ("global").
- :class:`MirrorDescent` = ``attnsvm.optim.mirror(p, lr, normalized)``:
  W <- inv(grad psi(W) - lr G'), grad psi(W) = sign(W)|W|^{p-1}, inv(U) = sign(U)|U|^{1/(p-1)}
  entrywise, G' = G or G / ||G||_{p/(p-1)}. p = 2 is exactly SGD.
- :func:`make_optimizer`: ``"sgd"`` (torch's own SGD) or any name of ``attnsvm.optim.get``
  (``"sngd"`` is per-tensor NGD here, ``"md<p>"`` mirror descent, ``"adam"``, ``"muon"``, ...).
"""

from __future__ import annotations

import torch

from attnsvm import optim as core
from attnsvm.optim import RuleOptimizer
from attnsvm.optim.base import check_lr

__all__ = ["RuleOptimizer", "SNGD", "MirrorDescent", "make_optimizer"]


class SNGD(RuleOptimizer):
    """Normalised (stochastic) GD, ``attnsvm.optim.ngd``: W <- W - lr G / ||G||_F per tensor."""

    def __init__(self, params, lr: float, norm: str = "per_tensor"):
        super().__init__(params, core.ngd(lr, norm))


class MirrorDescent(RuleOptimizer):
    """l_p mirror descent, ``attnsvm.optim.mirror`` (docs/theory.md §6), entrywise per tensor:

        U = sign(W) |W|^{p-1} - lr G',   W <- sign(U) |U|^{1/(p-1)}

    with G' = G, or G / ||G||_{p/(p-1)} when ``normalized``. p must be > 1; p = 2 is SGD.
    """

    def __init__(self, params, lr: float, p: float = 2.0, normalized: bool = False):
        super().__init__(params, core.mirror(p, lr, normalized))


def make_optimizer(name: str, params, lr: float, **hyper) -> torch.optim.Optimizer:
    """Optimiser by name: ``"sgd"`` (torch's SGD), ``"sngd"`` (per-tensor normalised GD),
    ``"md<p>"`` (l_p mirror descent, e.g. ``"md1.1"``), or any other registered rule."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=check_lr(lr))
    if name == "sngd":
        return SNGD(params, lr=lr, **hyper)
    if name.startswith("md"):
        return MirrorDescent(params, lr=lr, p=core.get(name).hyper["p"], **hyper)
    return RuleOptimizer(params, core.get(name, lr=lr, **hyper))
