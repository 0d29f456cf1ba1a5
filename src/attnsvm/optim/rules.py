"""Stateless step rules (docs/theory.md §6): GD, normalised steepest descent in any norm (NGD, sign
descent, spectral descent, the coordinate rule), Polyak, l_p mirror descent, SGD / SNGD.

Each constructor chains transforms of :mod:`.transforms` into an
:class:`~attnsvm.optim.base.Optimizer` (one line each); every rule acts on each tensor of
the parameter dict (joint training of (W, v), (K, Q), (k, q) needs nothing special).
Per-trial norms are over all dims but the leading one; a (B, d) tensor is a vector, a
(B, d, m) tensor a matrix (so the spectral rules see matrices).
"""

from __future__ import annotations

import torch

from attnsvm.norms import FRO, get_norm, l_p

from .base import Optimizer, check_lr, register
from .kernel_ops import POLYAK_CAP
from .transforms import (
    SCOPES,
    mirror_step,
    normalize_by,
    rule,
    scale_by_learning_rate,
    scale_by_param_norm,
    scale_by_polyak,
    scale_by_steepest,
)

__all__ = ["gd", "nsd", "ngd", "sign_descent", "spectral_descent", "coordinate_descent",
           "polyak", "mirror", "sgd", "sngd"]


@register("gd")
def gd(lr: float = 0.1) -> Optimizer:
    """Gradient descent: W <- W - lr G."""
    lr = check_lr(lr)
    return rule("gd", {"lr": lr}, scale_by_learning_rate(lr))


def _nsd(name: str, norm, lr: float, scope: str, relative: bool) -> Optimizer:
    N = get_norm(norm)
    lr = check_lr(lr)
    if relative and isinstance(lr, torch.Tensor):
        raise ValueError("relative=True takes a number lr (the step is lr * ||params||)")
    if scope not in SCOPES:
        raise ValueError(f"norm scope must be 'per_tensor' or 'global'; got {scope!r}")
    hyper = {"norm": N.name, "lr": lr, "scope": scope, "relative": bool(relative)}
    rel = (scale_by_param_norm(N),) if relative else ()
    return rule(name, hyper, scale_by_steepest(N, scope), *rel, scale_by_learning_rate(lr))


@register("nsd", "steepest")
def nsd(norm="fro", lr: float = 0.1, scope: str = "per_tensor", relative: bool = False) -> Optimizer:
    """Normalised steepest descent w.r.t. a norm (``attnsvm.norms``):

        W <- W - eta D*,   D* = argmax_{||D|| <= 1} <G, D>   (so <G, D*> = ||G||_dual)

    fro: NGD (G / ||G||_F); linf: sign descent (sign G); spectral: spectral descent
    (U V^T, the polar factor of G: Muon without momentum); l1: the greedy coordinate
    rule; l_p: sign(G)|G|^{q-1} / ||G||_q^{q-1}. D* is computed scale-free (from G / max|G|).

    scope: "per_tensor" (each tensor its own unit step) or "global" (one step of length eta
    in the l_2 product of the norm over all tensors of a trial: D_k = (||G_k||_* / ||G||_*) D*_k,
    i.e. G / ||G||_F over every tensor for the Frobenius norm).
    relative: eta = lr * ||params|| (the same product norm), a step proportional to the
    parameters' size: a change of time of gradient flow that is slow at a small
    initialisation and fast once the loss is small."""
    return _nsd("nsd", norm, lr, scope, relative)


@register("ngd")
def ngd(lr: float = 0.1, norm: str = "per_tensor", relative: bool = False) -> Optimizer:
    """Normalised GD: W <- W - lr G / ||G||_F per trial (``nsd("fro")``).

    ``norm="per_tensor"``: each tensor by its own norm; ``"global"``: one norm over all
    tensors, sqrt(sum ||G_k||_F^2). ``relative=True``: step lr * ||params||_F (global)."""
    return _nsd("ngd", FRO, lr, norm, relative)


@register("sign", "sign_descent")
def sign_descent(lr: float = 0.1, scope: str = "per_tensor") -> Optimizer:
    """Sign descent: W <- W - lr sign(G), normalised steepest descent for the entrywise
    max-norm ||W||_inf (``nsd("linf")``)."""
    return _nsd("sign", "linf", lr, scope, False)


@register("spectral", "spectral_descent")
def spectral_descent(lr: float = 0.1, scope: str = "per_tensor") -> Optimizer:
    """Spectral descent: W <- W - lr U V^T (G = U S V^T, exact SVD; vectors: G / ||G||_2),
    normalised steepest descent for the spectral norm (``nsd("spectral")``)."""
    return _nsd("spectral", "spectral", lr, scope, False)


@register("coordinate", "coordinate_descent")
def coordinate_descent(lr: float = 0.1, scope: str = "per_tensor") -> Optimizer:
    """Greedy coordinate descent: W <- W - lr sign(G_j) e_j on the largest |G_j| (ties split
    evenly), normalised steepest descent for the entrywise l_1 norm (``nsd("l1")``)."""
    return _nsd("coordinate", "l1", lr, scope, False)


@register("polyak")
def polyak(c: float = 1.0, max_lr: float | None = None, cap: float = POLYAK_CAP) -> Optimizer:
    """Polyak step: W <- W - eta_t G, eta_t = c (L - L*) / ||G||_F^2 (one norm per trial).

    Computed as a step of length exp(log c + log(L - L*) - log||G||) along G / ||G|| from
    the scaled gradient and the log gap, so the step survives the underflow of both
    L - L* and G; a zero gradient or a zero gap gives a zero step (never NaN). ``max_lr``
    caps eta_t. A step that would take ||params|| past 2^40 takes the relative length
    ``cap`` ||params|| instead, counted in the state ``"polyak_capped"``
    (:func:`~attnsvm.optim.transforms.scale_by_polyak`; why it is needed: docs/theory.md
    §6.3)."""
    c = check_lr(c, "c")
    if max_lr is not None:
        max_lr = check_lr(max_lr, "max_lr")
    cap = check_lr(cap, "cap")
    return rule("polyak", {"c": c, "max_lr": max_lr, "cap": cap}, scale_by_polyak(c, max_lr, cap))


@register("mirror", "md")
def mirror(p: float = 2.0, lr: float = 0.1, normalized: bool = False) -> Optimizer:
    """l_p mirror descent, psi(W) = (1/p) sum |W_j|^p (entrywise, per tensor):

        W <- inv(grad psi(W) - lr G'),  grad psi(W) = sign(W)|W|^{p-1},
        inv(U) = sign(U)|U|^{1/(p-1)},  G' = G or G / ||G||_{p/(p-1)} (``normalized``,
        computed from the scaled gradient: exact however small G is).

    p = 2 is GD (normalized: NGD with per-tensor norm), bit for bit."""
    p = float(p)
    if not p > 1:
        raise ValueError(f"mirror descent needs p > 1; got p = {p}")
    lr = check_lr(lr)
    norm = (normalize_by(l_p(p / (p - 1.0))),) if normalized else ()
    return rule("mirror", {"p": p, "lr": lr, "normalized": bool(normalized)},
                *norm, scale_by_learning_rate(lr), apply=mirror_step(p))


def _stochastic(opt: Optimizer, name: str, batch_size: int) -> Optimizer:
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    return opt._replace(name=name, batch_size=int(batch_size))


@register("sgd")
def sgd(lr: float = 0.1, batch_size: int = 1) -> Optimizer:
    """Stochastic GD: W <- W - lr G_b, G_b the gradient on a random mini-batch of sequences
    (drawn per trial and step by ``train`` from the trial's own seed)."""
    return _stochastic(gd(lr), "sgd", batch_size)


@register("sngd")
def sngd(lr: float = 0.1, batch_size: int = 1, norm: str = "per_tensor") -> Optimizer:
    """Stochastic normalized GD: W <- W - lr G_b / ||G_b||_F on a random mini-batch."""
    return _stochastic(ngd(lr, norm), "sngd", batch_size)
