"""Any ``attnsvm.optim`` rule as a ``torch.optim.Optimizer`` for ``nn.Module`` parameters.

A parameter viewed as ``w.unsqueeze(0)`` is a one-trial tensor, so the batched rules apply
unchanged: every parameter of a group is one tensor of a one-trial dict (``scope="global"``
rules then use one norm over the group). The rule's state lives in ``self.state`` per
group and is created on the first step. Nothing is re-implemented here.

    opt = torch_optimizer("muon", model.parameters(), lr=0.02)
    opt = torch_optimizer("md1.5", model.parameters(), lr=0.1, normalized=True)
"""

from __future__ import annotations

import torch

from .base import Optimizer, get

__all__ = ["RuleOptimizer", "torch_optimizer"]


class RuleOptimizer(torch.optim.Optimizer):
    """Apply an ``attnsvm.optim.Optimizer`` rule to module parameters (one trial, B = 1).

    A parameter without a gradient in a step is given a zero gradient (its state, if any,
    still advances: the rule sees the whole group as one trial)."""

    def __init__(self, params, rule: Optimizer):
        if not isinstance(rule, Optimizer):
            raise ValueError(f"rule must be an attnsvm.optim.Optimizer; got {type(rule).__name__}")
        if rule.needs_gap:
            raise ValueError(f"rule {rule.name!r} needs L - L* (Polyak): not available for "
                             "a torch module; use it with attnsvm.train")
        super().__init__(params, {})
        self.rule = rule

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            ws = list(group["params"])
            if not any(w.grad is not None for w in ws):
                continue
            params = {str(i): w.unsqueeze(0) for i, w in enumerate(ws)}
            grads = {str(i): (torch.zeros_like(w) if w.grad is None else w.grad).unsqueeze(0)
                     for i, w in enumerate(ws)}
            key = ("attnsvm_rule_state", gi)
            if key not in self.state:
                self.state[key] = self.rule.init(params)
            new, self.state[key] = self.rule.update(grads, self.state[key], params, None)
            for i, w in enumerate(ws):
                w.copy_(new[str(i)].squeeze(0))
        return loss


def torch_optimizer(name, params, **hyper) -> torch.optim.Optimizer:
    """A torch optimiser running the registered rule ``name`` (``attnsvm.optim.get``) on
    module parameters, e.g. ``torch_optimizer("adam", model.parameters(), lr=1e-3, eps=0)``."""
    return RuleOptimizer(params, get(name, **hyper))
