"""Stateless step rules (docs/theory.md §6): GD, normalised steepest descent in any norm (NGD, sign
descent, spectral descent, the coordinate rule), Polyak, l_p mirror descent, SGD / SNGD.

Each constructor returns an :class:`~attnsvm.optim.base.Optimizer`; every rule acts on each
tensor of the parameter dict (joint training of (W, v), (K, Q), (k, q) needs nothing
special). Per-trial norms are over all dims but the leading one; a (B, d) tensor is a
vector, a (B, d, m) tensor a matrix (so the spectral rules see matrices).
"""

from __future__ import annotations

import torch

from attnsvm.metrics import inverse_mirror_map, mirror_map
from attnsvm.norms import FRO, get_norm, l_p

from .base import (
    Optimizer,
    as_scaled,
    check_lr,
    expand,
    item_norm,
    item_steepest,
    log_global_norm,
    log_norm,
    no_state,
    register,
)

__all__ = ["gd", "nsd", "ngd", "sign_descent", "spectral_descent", "coordinate_descent",
           "polyak", "mirror", "sgd", "sngd"]

SCOPES = ("per_tensor", "global")


@register("gd")
def gd(lr: float = 0.1) -> Optimizer:
    """Gradient descent: W <- W - lr G."""
    lr = check_lr(lr)

    def update(grads, state, params, log_gap=None):
        G = as_scaled(grads).value()
        return {k: params[k] - lr * G[k] for k in params}, state

    return Optimizer("gd", no_state, update, {"lr": lr})


def _product_weights(g, N):
    """Weights w_k = ||G_k||_* / sqrt(sum_j ||G_j||_*^2) per trial (the steepest direction of
    the l_2 product of N over the tensors is w_k D*_k); 0 for a zero gradient."""
    ld = {k: log_norm(g, k, N.dual) for k in g.tensors}
    lt = 0.5 * torch.logsumexp(2 * torch.stack(list(ld.values())), dim=0)
    return {k: torch.where(torch.isfinite(lt), torch.exp(l - lt), torch.zeros_like(l))
            for k, l in ld.items()}


def _param_norm(params, N):
    """sqrt(sum_k ||P_k||^2) per trial in the norm N (scale-safe)."""
    vals = torch.stack([item_norm(N, p) for p in params.values()])
    m = vals.amax(0)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return m * (vals / safe).pow(2).sum(0).sqrt()


def _nsd(name: str, norm, lr: float, scope: str, relative: bool) -> Optimizer:
    N = get_norm(norm)
    lr = check_lr(lr)
    if relative and isinstance(lr, torch.Tensor):
        raise ValueError("relative=True takes a number lr (the step is lr * ||params||)")
    if scope not in SCOPES:
        raise ValueError(f"norm scope must be 'per_tensor' or 'global'; got {scope!r}")

    def update(grads, state, params, log_gap=None):
        g = as_scaled(grads)
        w = _product_weights(g, N) if scope == "global" else None
        step = lr * _param_norm(params, N) if relative else None
        out = {}
        for k, P in params.items():
            D = item_steepest(N, g.tensors[k])
            s = lr if step is None else expand(step, P)
            if w is not None:
                s = s * expand(w[k], P)
            out[k] = P - s * D
        return out, state

    hyper = {"norm": N.name, "lr": lr, "scope": scope, "relative": bool(relative)}
    return Optimizer(name, no_state, update, hyper)


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
def polyak(c: float = 1.0, max_lr: float | None = None) -> Optimizer:
    """Polyak step: W <- W - eta_t G, eta_t = c (L - L*) / ||G||_F^2 (one norm per trial).

    Computed as c exp(log(L - L*) - log||G||) G / ||G|| from the scaled gradient and the
    log gap, so the step survives the underflow of both L - L* and G; a zero gradient or a
    zero gap gives a zero step (never NaN). ``max_lr`` caps eta_t."""
    c = check_lr(c, "c")
    if max_lr is not None:
        max_lr = check_lr(max_lr, "max_lr")

    def update(grads, state, params, log_gap):
        g = as_scaled(grads)
        lg = log_global_norm(g)
        lr_ = torch.log(torch.as_tensor(c, dtype=lg.dtype)) + log_gap - lg  # log(c gap / ||G||)
        if max_lr is not None:  # eta_t ||G|| <= max_lr ||G||
            lr_ = torch.minimum(lr_, torch.log(torch.as_tensor(max_lr, dtype=lg.dtype)) + lg)
        out = {}
        for k, P in params.items():
            f = torch.exp(lr_ + g.log_scale[k] - lg)  # |step| factor on the scaled tensor
            f = torch.where(torch.isfinite(lg) & torch.isfinite(lr_), f, torch.zeros_like(f))
            out[k] = P - expand(f, P) * g.tensors[k]
        return out, state

    return Optimizer("polyak", no_state, update, {"c": c, "max_lr": max_lr}, needs_gap=True)


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
    Nq = l_p(p / (p - 1.0))

    def update(grads, state, params, log_gap=None):
        g = as_scaled(grads)
        Gv = None if normalized else g.value()
        out = {}
        for k, P in params.items():
            if normalized:
                t = g.tensors[k]
                n = item_norm(Nq, t)
                G = t / expand(torch.where(n > 0, n, torch.ones_like(n)), t)
            else:
                G = Gv[k]
            out[k] = inverse_mirror_map(mirror_map(P, p) - lr * G, p)
        return out, state

    return Optimizer("mirror", no_state, update, {"p": p, "lr": lr, "normalized": bool(normalized)})


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
