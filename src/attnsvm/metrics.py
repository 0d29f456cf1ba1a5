"""Metrics along a run (docs/theory.md §7). Pure functions, numpy or torch in -> same type out.

All functions are batched over leading dims. Matrix metrics reduce over the last two
dims; pass ``vector=True`` to reduce over the last dim only (prompt vectors p of
shape (B, d)). A 1-d input is always treated as a vector.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "correlation",
    "directional_distance",
    "fro_norm",
    "lp_norm",
    "lp_normalize",
    "nuclear_norm",
    "psi",
    "mirror_map",
    "inverse_mirror_map",
    "bregman",
    "directional_bregman",
    "soft_sparsity",
    "entropy",
    "numerical_rank",
]


def _is_torch(a) -> bool:
    return type(a).__module__.startswith("torch")


def _axes(a, vector: bool):
    return (-1,) if (vector or a.ndim == 1) else (-2, -1)


def _sum(a, axes):
    return a.sum(dim=axes) if _is_torch(a) else np.sum(a, axis=axes)


def _abs(a):
    return a.abs() if _is_torch(a) else np.abs(a)


def _sign(a):
    return a.sign() if _is_torch(a) else np.sign(a)


def _sqrt(a):
    return a.sqrt() if _is_torch(a) else np.sqrt(a)


def _expand(x, nd: int):
    """Append ``nd`` singleton dims (to broadcast a per-item value back over the item)."""
    for _ in range(nd):
        x = x[..., None]
    return x


def fro_norm(A, vector: bool = False):
    """||A||_F over the last two dims (last dim if ``vector``). (..., d, d) -> (...)."""
    return _sqrt(_sum(A * A, _axes(A, vector)))


def lp_norm(A, p: float, vector: bool = False):
    """Entrywise ||A||_p = (sum_j |A_j|^p)^{1/p} over the item dims. (..., d, d) -> (...)."""
    return _sum(_abs(A) ** p, _axes(A, vector)) ** (1.0 / p)


def lp_normalize(A, p: float = 2.0, vector: bool = False):
    """A / ||A||_p (entrywise l_p norm over the item dims); same shape as A."""
    ax = _axes(A, vector)
    return A / _expand(lp_norm(A, p, vector), len(ax))


def _max_scaled(A, ax):
    """A / max|A| over the item dims ``ax`` (zeros stay zeros): direction-preserving, and
    sums of squares of the result neither underflow (|A| ~ 1e-200) nor overflow (1e200)."""
    if _is_torch(A):
        m = A.abs().amax(dim=ax, keepdim=True)
        return A / m.masked_fill(m == 0, 1.0)
    m = np.max(np.abs(A), axis=ax, keepdims=True)
    return A / np.where(m > 0, m, 1.0)


def correlation(A, B, vector: bool = False):
    """corr(A, B) = <A, B> / (||A||_F ||B||_F) over the item dims (broadcasting). -> (...).

    Computed on A / max|A| and B / max|B| (same value, no under/overflow at any scale);
    nan where A or B is 0 (no direction), without a warning."""
    ax = _axes(A if A.ndim >= B.ndim else B, vector)
    A, B = _max_scaled(A, ax), _max_scaled(B, ax)
    num = _sum(A * B, ax)
    den = _sqrt(_sum(A * A, ax)) * _sqrt(_sum(B * B, ax))
    if _is_torch(num):
        return num / den
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def directional_distance(A, B, vector: bool = False):
    """|| A/||A||_F - B/||B||_F ||_F over the item dims (broadcasting). -> (...)."""
    ax = _axes(A if A.ndim >= B.ndim else B, vector)
    A, B = _max_scaled(A, ax), _max_scaled(B, ax)
    An = A / _expand(_sqrt(_sum(A * A, ax)), len(ax))
    Bn = B / _expand(_sqrt(_sum(B * B, ax)), len(ax))
    D = An - Bn
    return _sqrt(_sum(D * D, ax))


def nuclear_norm(W):
    """||W||_* = sum of singular values over the last two dims. (..., d, m) -> (...)."""
    if _is_torch(W):
        import torch

        return torch.linalg.svdvals(W).sum(-1)
    return np.linalg.svd(W, compute_uv=False).sum(-1)


def psi(A, p: float, vector: bool = False):
    """Mirror potential psi(A) = (1/p) sum_j |A_j|^p over the item dims. -> (...)."""
    return _sum(_abs(A) ** p, _axes(A, vector)) / p


def mirror_map(W, p: float):
    """grad psi(W) = sign(W) |W|^{p-1} (entrywise, any shape). Underflows to 0 where
    |W|^{p-1} < 1e-308 (float64)."""
    return _sign(W) * _abs(W) ** (p - 1.0)


def inverse_mirror_map(U, p: float):
    """(grad psi)^{-1}(U) = sign(U) |U|^{1/(p-1)} (entrywise, any shape)."""
    return _sign(U) * _abs(U) ** (1.0 / (p - 1.0))


def bregman(A, B, p: float, vector: bool = False):
    """D_psi(A, B) = psi(A) - psi(B) - <grad psi(B), A - B>, psi = (1/p)||.||_p^p. -> (...)."""
    ax = _axes(A if A.ndim >= B.ndim else B, vector)
    return psi(A, p, vector) - psi(B, p, vector) - _sum(mirror_map(B, p) * (A - B), ax)


def directional_bregman(W_mm, W, p: float, vector: bool = False):
    """D_psi(W_mm / ||W_mm||_p, W / ||W||_p): the directional Bregman divergence (§7)."""
    return bregman(lp_normalize(W_mm, p, vector), lp_normalize(W, p, vector), p, vector)


def soft_sparsity(s):
    """1 / ||s||_2^2 along the last dim (between 1 and T; smaller = sparser). (..., T) -> (...)."""
    return 1.0 / _sum(s * s, (-1,))


def entropy(s):
    """-sum_t s_t log s_t along the last dim, with 0 log 0 = 0. (..., T) -> (...)."""
    if _is_torch(s):
        import torch

        return -torch.special.xlogy(s, s).sum(-1)
    from scipy.special import xlogy

    return -np.sum(xlogy(s, s), axis=-1)


def numerical_rank(W, rtol: float = 1e-7):
    """#{singular values > rtol * sigma_max} over the last two dims. (..., d, m) -> (...) int."""
    if _is_torch(W):
        import torch

        sv = torch.linalg.svdvals(W)
        return (sv > rtol * sv[..., :1]).sum(-1)
    sv = np.linalg.svd(W, compute_uv=False)
    return np.sum(sv > rtol * sv[..., :1], axis=-1)
