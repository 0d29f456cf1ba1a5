"""Losses of the margin u = y f (docs/theory.md §3), with the stable gap forms of §8.

Each ``Loss`` has
    value(u)          loss(u)                               (elementwise, torch)
    deriv(u)          loss'(u)                              (elementwise, torch)
    gap(g, D)         loss(g - D) - loss(g) for D >= 0, computed without cancellation
                      (g = gamma_opt, D = gamma_opt - u >= 0; §8)
    log_neg_deriv(u)  log(-loss'(u))  (finite where loss'(u) underflows)
    log_value(u)      log loss(u)     (finite where loss(u) underflows; nan where loss <= 0)
    name
Stable gaps:  logistic  log1p(expm1(D) * sigmoid(-g));
              exponential  exp(-g) * expm1(D);   correlation  D.
:func:`log_gap` gives log(loss(g - D) - loss(g)) from log D, so that L - L* stays
representable after it underflows float64 (needed by Polyak's step far past saturation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["Loss", "logistic", "exponential", "correlation", "get_loss", "LOSSES", "log_gap",
           "log_neg_deriv", "log_value"]


class Loss(NamedTuple):
    name: str
    value: Callable
    deriv: Callable
    gap: Callable
    log_neg_deriv: Callable | None = None
    log_value: Callable | None = None


def _log_softplus_neg(u):
    """log(log(1 + e^{-u})) = log softplus(-u), accurate for large u (where it is ~ -u)."""
    big = u > 30
    ub = torch.where(big, u, torch.zeros_like(u))
    return torch.where(big, -ub + torch.log1p(-0.5 * torch.exp(-ub)),
                       torch.log(F.softplus(-torch.where(big, torch.zeros_like(u), u))))


def _logistic_gap(g, D):
    return torch.log1p(torch.expm1(D) * torch.sigmoid(-g))


#: logistic loss log(1 + e^{-u}); loss' = -sigmoid(-u).
logistic = Loss("logistic", lambda u: F.softplus(-u), lambda u: -torch.sigmoid(-u), _logistic_gap,
                lambda u: F.logsigmoid(-u), _log_softplus_neg)

#: exponential loss e^{-u}; loss' = -e^{-u}.
exponential = Loss(
    "exponential",
    lambda u: torch.exp(-u),
    lambda u: -torch.exp(-u),
    lambda g, D: torch.exp(-g) * torch.expm1(D),
    lambda u: -u,
    lambda u: -u,
)

#: correlation loss -u; loss' = -1.
correlation = Loss("correlation", lambda u: -u, lambda u: -torch.ones_like(u), lambda g, D: D,
                   lambda u: torch.zeros_like(u), lambda u: torch.log(-u))

LOG_GAP_SWITCH = -35.0  # below log D = -35 (D < 6.3e-16), gap = -loss'(g) D to O(D) relative


def log_neg_deriv(lossf: Loss, u):
    """log(-loss'(u)); -inf where loss'(u) = 0."""
    if lossf.log_neg_deriv is not None:
        return lossf.log_neg_deriv(u)
    return torch.log(-lossf.deriv(u))


def log_value(lossf: Loss, u):
    """log loss(u) (nan where loss(u) <= 0)."""
    if lossf.log_value is not None:
        return lossf.log_value(u)
    return torch.log(lossf.value(u))


def log_gap(lossf: Loss, g, logD, D=None):
    """log(loss(g - D) - loss(g)) for D = exp(logD) >= 0, without under- or overflow
    (``D``: the same D in the linear domain where it is known to full relative accuracy;
    exp(logD) loses |logD| ulps, which matters when D is large and g - D cancels):

        log D <  -35:  log(-loss'(g)) + log D   (first order; relative error <= D ~ 6e-16)
        otherwise:     log gap(g, D), the loss's cancellation-free gap; where that is not
                       finite (loss(g) underflows, or expm1(D) overflows): from the log
                       losses, log loss(g - D) + log1p(-exp(log loss(g) - log loss(g - D)))
                       for D >= 1e-3, else the leading term log(-loss'(g)) + log expm1(D).
    """
    small = logD < LOG_GAP_SWITCH
    if D is None:
        D = torch.exp(torch.where(small, torch.zeros_like(logD), logD))
    else:
        D = torch.where(small, torch.ones_like(D), D)
    lead = log_neg_deriv(lossf, g)
    direct = torch.log(lossf.gap(g, D))
    # (the usual case: every direct finite, so no bad entry; their sum is finite iff each
    # one is, or it overflowed: the per-entry test decides; one read)
    if not math.isfinite((direct if direct.numel() == 1 else direct.sum()).item()) and bool(
            (bad := ~torch.isfinite(direct) & (D > 0)).any()):
        l1, l2 = log_value(lossf, g - D), log_value(lossf, g)
        diff = l1 + torch.log1p(-torch.exp(l2 - l1))
        near = lead + torch.log(torch.expm1(D))
        direct = torch.where(bad, torch.where(torch.isfinite(diff) & (D >= 1e-3), diff, near), direct)
    return torch.where(small, lead + logD, direct)


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
