"""Step rules (THEORY.md §6) as small pure functions on batched parameter dicts.

An ``Optimizer`` is a NamedTuple (optax style, stateless):

    step(params, grads, gap) -> new params
        params, grads: dict[str, Tensor], every tensor with a leading trial dim B;
        gap: (B,) tensor L - L* (used by Polyak only).
    batch_size: None (full batch) or the mini-batch size used by ``train`` (SGD/SNGD).

Norms are per trial: over all dims but the leading one (``norm="per_tensor"``: each
tensor by its own norm; ``norm="global"``: one norm over all tensors of the trial).
Joint training ((W, v), (p, v)) needs nothing special: the rule acts on every tensor
of the dict. Trials whose gradient is exactly zero are frozen by ``train`` (not here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .metrics import inverse_mirror_map, mirror_map

__all__ = [
    "Optimizer",
    "gd",
    "ngd",
    "polyak",
    "mirror",
    "sgd",
    "sngd",
    "trial_norm",
    "global_norm",
]


class Optimizer(NamedTuple):
    name: str
    step: Callable
    batch_size: int | None = None
    hyper: dict | None = None
    needs_gap: bool = True  # whether ``step`` reads L - L* (the trainer may skip computing it)


def _bshape(t: torch.Tensor) -> tuple:
    return (t.shape[0],) + (1,) * (t.ndim - 1)


def trial_norm(t: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """Entrywise l_p norm per trial (over all dims but the first): (B, ...) -> (B,).

    Computed as m ||t / m||_p with m = max |t| per trial, so that |t|^p cannot underflow
    (for p = 7/3 a gradient of size 1e-139 would otherwise have norm exactly 0 and
    freeze a normalised mirror-descent run long before the gradient itself is 0).
    """
    flat = t.reshape(t.shape[0], -1)
    m = flat.abs().amax(dim=1, keepdim=True)
    scaled = flat / torch.where(m > 0, m, torch.ones_like(m))
    return m.squeeze(1) * torch.linalg.vector_norm(scaled, ord=p, dim=1)


def global_norm(tensors: dict) -> torch.Tensor:
    """sqrt(sum over tensors of ||G||_F^2) per trial: (B,)."""
    return torch.sqrt(sum(t.reshape(t.shape[0], -1).pow(2).sum(1) for t in tensors.values()))


def _safe_div(t: torch.Tensor, nrm: torch.Tensor) -> torch.Tensor:
    """t / nrm per trial, 0 where nrm == 0 (a zero gradient gives a zero step)."""
    nz = nrm > 0
    return t / torch.where(nz, nrm, torch.ones_like(nrm)).reshape(_bshape(t))


def gd(lr: float = 0.1) -> Optimizer:
    """Gradient descent: W <- W - lr G."""
    def step(params, grads, gap=None):
        return {k: params[k] - lr * grads[k] for k in params}

    return Optimizer("gd", step, None, {"lr": lr}, False)


def ngd(lr: float = 0.1, norm: str = "per_tensor") -> Optimizer:
    """Normalized GD: W <- W - lr G / ||G||_F per trial.

    ``norm="per_tensor"``: each tensor by its own norm; ``"global"``: one norm over all
    tensors, sqrt(sum ||G_k||_F^2).
    """
    if norm not in ("per_tensor", "global"):
        raise ValueError(f"norm must be 'per_tensor' or 'global'; got {norm!r}")

    def step(params, grads, gap=None):
        if norm == "global":
            g = global_norm(grads)
            return {k: params[k] - lr * _safe_div(grads[k], g) for k in params}
        return {k: params[k] - lr * _safe_div(grads[k], trial_norm(grads[k])) for k in params}

    return Optimizer("ngd", step, None, {"lr": lr, "norm": norm}, False)


def polyak(c: float = 1.0, max_lr: float | None = None) -> Optimizer:
    """Polyak step: W <- W - eta_t G, eta_t = c (L - L*) / ||G||_F^2 (global norm per trial).

    L - L* is the stable gap of §8 (L* = mean loss(gamma_opt) for a fixed linear head,
    0 otherwise). Computed as c (gap / ||G||) (G / ||G||) to avoid overflow; a zero
    gradient or a zero gap gives a zero step (never NaN). ``max_lr`` caps eta_t.
    """
    def step(params, grads, gap):
        g = global_norm(grads)
        ratio = torch.where(g > 0, gap.clamp_min(0) / torch.where(g > 0, g, torch.ones_like(g)),
                            torch.zeros_like(g))
        if max_lr is not None:
            ratio = torch.minimum(ratio, max_lr * g)
        return {k: params[k] - c * _safe_div(grads[k], g).mul(ratio.reshape(_bshape(grads[k])))
                for k in params}

    return Optimizer("polyak", step, None, {"c": c, "max_lr": max_lr})


def mirror(p: float = 2.0, lr: float = 0.1, normalized: bool = False) -> Optimizer:
    """l_p mirror descent, psi(W) = (1/p) sum |W_j|^p (entrywise, per tensor):

        W <- inv(grad psi(W) - lr G'),  grad psi(W) = sign(W)|W|^{p-1},
        inv(U) = sign(U)|U|^{1/(p-1)},  G' = G or G / ||G||_{p/(p-1)} (``normalized``).

    p = 2 is GD (normalized: NGD with per-tensor norm), bit for bit.
    """
    if p <= 1:
        raise ValueError(f"mirror descent needs p > 1; got p = {p}")
    q = p / (p - 1.0)

    def step(params, grads, gap=None):
        out = {}
        for k in params:
            G = _safe_div(grads[k], trial_norm(grads[k], q)) if normalized else grads[k]
            out[k] = inverse_mirror_map(mirror_map(params[k], p) - lr * G, p)
        return out

    return Optimizer("mirror", step, None, {"p": p, "lr": lr, "normalized": normalized}, False)


def sgd(lr: float = 0.1, batch_size: int = 1) -> Optimizer:
    """Stochastic GD: W <- W - lr G_b, G_b the gradient on a random mini-batch of sequences
    (drawn per trial and step by ``train``, seeded)."""
    return gd(lr)._replace(name="sgd", batch_size=int(batch_size))


def sngd(lr: float = 0.1, batch_size: int = 1, norm: str = "per_tensor") -> Optimizer:
    """Stochastic normalized GD: W <- W - lr G_b / ||G_b||_F on a random mini-batch."""
    return ngd(lr, norm)._replace(name="sngd", batch_size=int(batch_size))
