"""Losses of the margin u = y f (THEORY.md §3), with the stable gap forms of §8.

Each ``Loss`` has
    value(u)          loss(u)                               (elementwise, torch)
    deriv(u)          loss'(u)                              (elementwise, torch)
    gap(g, D)         loss(g - D) - loss(g) for D >= 0, computed without cancellation
                      (g = gamma_opt, D = gamma_opt - u >= 0; §8)
    name
Stable gaps:  logistic  log1p(expm1(D) * sigmoid(-g));
              exponential  exp(-g) * expm1(D);   correlation  D.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["Loss", "logistic", "exponential", "correlation", "get_loss", "LOSSES"]


class Loss(NamedTuple):
    name: str
    value: Callable
    deriv: Callable
    gap: Callable


def _logistic_gap(g, D):
    return torch.log1p(torch.expm1(D) * torch.sigmoid(-g))


#: logistic loss log(1 + e^{-u}); loss' = -sigmoid(-u).
logistic = Loss("logistic", lambda u: F.softplus(-u), lambda u: -torch.sigmoid(-u), _logistic_gap)

#: exponential loss e^{-u}; loss' = -e^{-u}.
exponential = Loss(
    "exponential",
    lambda u: torch.exp(-u),
    lambda u: -torch.exp(-u),
    lambda g, D: torch.exp(-g) * torch.expm1(D),
)

#: correlation loss -u; loss' = -1.
correlation = Loss("correlation", lambda u: -u, lambda u: -torch.ones_like(u), lambda g, D: D)

LOSSES = {l.name: l for l in (logistic, exponential, correlation)}


def get_loss(loss) -> Loss:
    """A ``Loss`` from a name ("logistic" | "exponential" | "correlation") or a ``Loss``.

    A plain callable u -> loss(u) is wrapped (derivative by autograd, gap by subtraction:
    not cancellation-free, so prefer the built-in losses for long runs).
    """
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)}; got {loss!r}")
        return LOSSES[loss]
    if callable(loss):
        def deriv(u):
            with torch.enable_grad():
                uu = u.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(loss(uu).sum(), uu)
            return g

        return Loss(getattr(loss, "__name__", "custom"), loss, deriv, lambda g, D: loss(g - D) - loss(g))
    raise ValueError(f"loss must be a name, a Loss or a callable; got {type(loss).__name__}")
