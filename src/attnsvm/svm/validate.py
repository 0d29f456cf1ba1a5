"""Argument validation for the max-margin problems, in one place.

Every public solver (``att_svm``, ``prompt_svm``, ``seq2seq_svm``, ``head_svm``,
``relaxed_svm``, ``multitoken_svm``, the batch solvers) and ``tokens.outcome`` check their
inputs with these functions, so a bad argument gets the same clear :class:`ValueError`
(naming the argument and the problem) whichever entry point it came through.

Rules:
  * arrays are real and finite (NaN / inf refused), of the documented shape;
  * token indices (``alpha``) are integers (floats are refused, not truncated; bools are
    refused), in range, of the right length, and never select a masked token;
  * masks are boolean (or 0/1 numbers, read as booleans);
  * labels are +-1; ``support`` indices are integers in range (or a bool mask);
  * ``alpha="opt"`` (or None) needs valid labels y and a head v;
  * ``tol`` is a finite number > 0;
  * torch tensors are read detached (one that requires grad too), as ``TokenData`` reads them.
"""

from __future__ import annotations

import numpy as np

from .._validation import Interval, as_array, as_numpy, check_param
from .._validation import as_int_array as _int_array
from ..norms import get_norm

__all__ = [
    "as_array",
    "as_mask",
    "as_alpha",
    "as_labels",
    "as_support",
    "resolve_alpha",
    "as_norm",
    "opt_alpha",
    "as_tol",
]


def as_mask(mask, shape: tuple[int, ...], name: str = "mask") -> np.ndarray:
    """Boolean mask of ``shape`` (True = valid token); None = all valid.

    Accepts bool arrays and numeric 0/1 arrays; anything else (0.5, 2, NaN, strings)
    is refused.  A mask may be given without its leading batch dim (broadcast)."""
    if mask is None:
        m = np.empty(shape, bool)  # (np.ones without its Python wrapper)
        m.fill(True)
        return m
    m = np.asarray(as_numpy(mask, name))
    if m.dtype != np.bool_:
        if m.dtype == object or m.dtype.kind not in "iuf":
            raise ValueError(f"{name} must be a boolean array (True = valid token); "
                             f"got dtype {m.dtype}")
        if not np.all((m == 0) | (m == 1)):
            raise ValueError(f"{name} must be boolean (True = valid token); got values other "
                             f"than 0 / 1")
        m = m.astype(bool)
    if m.shape != tuple(shape):
        if len(shape) == 3 and m.shape == tuple(shape[1:]):  # one mask for every problem
            m = np.broadcast_to(m, shape)
        else:
            raise ValueError(f"{name} must have shape {tuple(shape)}; got {m.shape}")
    return np.array(m, dtype=bool)


def as_alpha(alpha, shape: tuple[int, ...], T: int, valid: np.ndarray | None = None,
             name: str = "alpha", what: str = "sequences") -> np.ndarray:
    """Selected-token indices of ``shape`` (e.g. (n,) or (B, n)), integer, in [0, T), not
    selecting a masked token (``valid`` of shape ``shape + (T,)``)."""
    a = _int_array(alpha, name, hi=T - 1)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (one token index per "
                         f"sequence); got {a.shape}")
    if a.size and not np.maximum.reduce(a.view(np.uint64), None) < T:  # (one pass: a
        # negative index reads as >= 2^63 in uint64; a is int64)
        bad = a[(a < 0) | (a >= T)][:5].tolist()
        raise ValueError(f"{name} out of range: token indices must lie in [0, {T - 1}]; "
                         f"got {bad}")
    if valid is not None and a.size and np.count_nonzero(valid) != valid.size:  # (all valid:
        # no token is masked; count_nonzero: the fastest reduction of a bool array)
        ok = (valid[np.arange(a.size), a] if a.ndim == 1 and valid.ndim == 2 else
              np.take_along_axis(valid, a[..., None], -1)[..., 0])
        if not np.logical_and.reduce(ok, None):
            idx = np.argwhere(~ok)
            lead = idx[:, 0] if idx.shape[1] == 1 else idx[:, 0]
            bad = sorted({int(i) for i in lead})[:10]
            raise ValueError(f"{name} selects masked tokens in {what} {bad}")
    return a


def as_labels(y, n: int, name: str = "y") -> np.ndarray:
    """Labels y (n,) in {-1, +1}."""
    y = as_array(y, name, (1,), "(n,)")
    if y.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},); got {y.shape}")
    if not np.all(np.abs(y) == 1.0):
        bad = np.unique(y[np.abs(y) != 1.0])[:5].tolist()
        raise ValueError(f"{name} must hold labels in {{-1, +1}}; got values {bad}")
    return y


def as_support(support, n: int, name: str = "support") -> np.ndarray:
    """Support sequences as a bool mask (n,), from a bool mask or integer indices."""
    s = np.asarray(as_numpy(support, name))
    if s.dtype == np.bool_:
        if s.shape != (n,):
            raise ValueError(f"{name} must be a bool mask of shape ({n},) or integer "
                             f"indices; got a bool array of shape {s.shape}")
        return s.copy()
    idx = _int_array(support, name, "sequence", hi=n - 1)
    if idx.ndim != 1:
        raise ValueError(f"{name} indices must be a 1-d list; got shape {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)][:5].tolist()
        raise ValueError(f"{name} indices out of range [0, {n - 1}]: {bad}")
    S = np.zeros(n, bool)
    S[idx] = True
    return S


def opt_alpha(X: np.ndarray, y: np.ndarray, v: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """opt_i = argmax over valid t of y_i v^T x_it (ties: lowest index), (..., n).

    Computed on X and v scaled by powers of two (exact, order-preserving): no overflow
    for tokens and heads at 1e+200."""
    def p2(a):
        m = np.abs(a).max() if a.size else 0.0
        return np.ldexp(a, -int(np.frexp(m)[1])) if np.isfinite(m) and m > 0 else a

    g = y[..., None] * (p2(X) @ p2(v)[..., :, None])[..., 0]
    return np.argmax(np.where(valid, g, -np.inf), axis=-1)


def resolve_alpha(alpha, X: np.ndarray, valid: np.ndarray, y=None, v=None,
                  name: str = "alpha") -> np.ndarray:
    """alpha (n,) from an explicit index array, or None / "opt" = argmax_t y_i v^T x_it."""
    n, T, d = X.shape
    if alpha is None or (isinstance(alpha, str) and alpha == "opt"):
        if y is None or v is None:
            raise ValueError(f"{name} is required (or give y and v to use {name} = opt)")
        y = as_labels(y, n)
        v = as_array(v, "v", (1,), "(d,)")
        if v.shape != (d,):
            raise ValueError(f"v must have shape ({d},); got {v.shape}")
        return opt_alpha(X, y, v, valid)
    if isinstance(alpha, str):
        raise ValueError(f"{name} must be token indices or 'opt'; got {alpha!r}")
    return as_alpha(alpha, (n,), T, valid, name)


#: The :class:`attnsvm.norms.Norm` of a name / number / Norm (ValueError if unknown): the
#: solvers' name for :func:`attnsvm.norms.get_norm` (one lookup, one home)
as_norm = get_norm


def as_tol(tol, name: str = "tol") -> float:
    """The tolerance for reporting active constraints (support: margin <= 1 + tol), a
    finite number > 0: a negative, zero or NaN tol would report no support vectors at an
    optimum whose active margins came out a rounding error above 1."""
    if type(tol) is float and 0.0 < tol < np.inf:  # (the common case)
        return tol
    return check_param(name, tol, [Interval(float, 0.0, None, closed="neither")])
