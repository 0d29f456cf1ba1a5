"""Constraint sets of max-margin problems, built and normalised (the engine's step 0).

    cs = build_constraints(X, Z, alpha, valid)      # (B, n, T, d) tokens -> normalised set

Constraints (x_{i,alpha_i} - x_it)^T W z_i >= b_it (docs/theory.md §5) of B problems, as a
:class:`~attnsvm.svm.solution.ConstraintSet` whose differences Delta and queries Z are
scaled by powers of two (exact) so that their largest entries lie in [1/2, 1): no overflow
at 1e+308, no lost digits for near-duplicate tokens.  The scaling exponents are kept
(``cs.exp``), so every answer maps back to the caller's units exactly
(:mod:`attnsvm.svm.assemble`).
"""

from __future__ import annotations

import numpy as np

from .certificate import two_diff
from .solution import ConstraintSet, exp2, ldexp
from .validate import as_array

__all__ = ["absmax", "normalise", "has_subnormal", "normalise_constraints", "build_constraints",
           "scaled_keys", "margin_ratio", "SMALLEST_NORMAL"]

SMALLEST_NORMAL = np.finfo(float).tiny


def absmax(A: np.ndarray, axes: tuple[int, ...], where=None) -> np.ndarray:
    """max |A| over ``axes`` (0 where ``where`` is False or A is empty), shape A's other
    dims.  Trailing axes (the usual case) are reduced as one flat axis, and the mask as
    the ``where=`` of the reduction; max |A| = max(max A, -min A): no |A| or masked copy
    of A (large temporaries cost more in page faults than the arithmetic)."""
    k = len(axes)
    lead = A.shape[: A.ndim - k]
    if A.size == 0:
        return np.zeros(lead)
    trailing = sorted(a % A.ndim for a in axes) == list(range(A.ndim - k, A.ndim))
    if where is not None:
        where = np.broadcast_to(where, A.shape)
        if where.all():
            where = None
    if trailing:
        A = A.reshape(*lead, -1)
        where = None if where is None else where.reshape(*lead, -1)
        axes = (-1,)
    kw = {} if where is None else {"where": where}
    return np.maximum(np.maximum(A.max(axes, initial=0.0, **kw), 0.0),
                      -A.min(axes, initial=0.0, **kw))


def normalise(A: np.ndarray, axes: tuple[int, ...], where=None, *, inplace: bool = False):
    """(A 2^-e, e): e (leading dims) the exponent of max |A| over ``axes`` (restricted to
    ``where``), so the largest entry of A 2^-e lies in [1/2, 1); exact scaling
    (``inplace``: A, a float64 array of the caller's own, is overwritten)."""
    e = exp2(absmax(A, axes, where))
    return ldexp(A, -e, out=A if inplace else None), e


def has_subnormal(A: np.ndarray) -> np.ndarray:
    """(B,) bool: A (B, ...) holds a nonzero subnormal entry (a power-of-two scaling into
    that range may have dropped bits: the data is then not held exactly)."""
    with np.errstate(invalid="ignore"):
        a = np.abs(A.reshape(len(A), -1))
        return ((a < SMALLEST_NORMAL) & (a > 0)).any(1)


def normalise_constraints(Delta, Z, valid, b=None, eq=None, exp=0, *,
                          zeroed: bool = False, Delta_lo=None, lossy=None,
                          exact: bool = True) -> ConstraintSet:
    """A normalised :class:`ConstraintSet` from (B, n, T, d) differences and (B, n, e)
    queries (``exp``: the exponent already divided out of Delta; ``zeroed``: Delta is a
    float64 array of the caller's own, already 0 wherever ``valid`` is False: it is
    scaled in place; ``Delta_lo``: the rounding error of the differences, scaled along,
    :func:`attnsvm.svm.certificate.two_diff`; ``lossy`` (B,) bool: problems whose data
    may have lost bits upstream).  ``exact`` False: no check for lost bits; the data
    then counts as not held exactly (``data_err`` the worst case), which the certificate's
    rounding-error bounds take, and its exact-arithmetic checks refuse."""
    valid = np.asarray(valid, bool)
    if not zeroed:
        Delta = np.where(valid[..., None], Delta, 0.0)
    Delta, eD = normalise(Delta, (1, 2, 3), inplace=True)  # our own array either way
    Z, eZ = normalise(np.asarray(Z, float), (1, 2))
    B = len(Delta)
    if Delta_lo is not None:
        Delta_lo = ldexp(Delta_lo, -eD, out=Delta_lo)
    if exact:
        bad = np.zeros(B, bool) if lossy is None else np.asarray(lossy, bool).copy()
        if B:
            bad |= has_subnormal(Delta) | has_subnormal(Z)
            if Delta_lo is not None:
                bad |= has_subnormal(Delta_lo)
    else:
        bad = np.ones(B, bool)
    # bits dropped below 2^-1074 by the scalings: at most 2^-1075 per entry of X 2^-eX (so
    # 2^-1074 per difference), amplified by 2^-eD, plus 2^-1075 in Delta 2^-eD and in Z
    err = np.where(bad, np.exp2(np.minimum(-1073.0 - eD, 1000.0)) + 2.0 ** -1074, 0.0)
    if b is None:
        bb = valid.astype(float)  # ones on the valid entries, 0 elsewhere
    else:
        bb = np.where(valid, np.broadcast_to(np.asarray(b, float), valid.shape), 0.0)
    eqm = None if eq is None else np.asarray(eq, bool) & valid
    return ConstraintSet(Delta, Z, valid, bb, eqm, np.asarray(exp) + eD + eZ, Delta_lo,
                         err if bad.any() else None, exact)


def build_constraints(X, Z, alpha, valid, b=None, eq=None, *, x_exp=0,
                      normalise_data: bool = True, exact: bool = True) -> ConstraintSet:
    """Constraints (x_{i,alpha_i} - x_it)^T W z_i >= b_it of B problems, normalised.

    X (B, n, T, d) tokens (already divided by 2^x_exp), Z (B, n, e), alpha (B, n) int,
    valid (B, n, T) bool (the selected token itself is dropped), b (B, n, T) or None
    (ones), eq (B, n, T) bool or None.  The tokens are scaled by a power of two before
    the differences are taken (no overflow at 1e+308), the differences and the queries
    once more (so near-duplicate tokens keep their digits).  ``exact``: keep the rounding
    errors of the differences (``Delta_lo``) and check for bits lost to scaling, so that
    the certificate's exact-arithmetic checks apply (:mod:`attnsvm.svm.certificate`);
    False (faster): only its rounding-error bounds apply."""
    X = np.asarray(X, float)
    B, n, T, d = X.shape
    valid = np.asarray(valid, bool)
    if normalise_data:
        X, eX = normalise(X, (1, 2, 3), valid[..., None])
        lossy = (has_subnormal(np.where(valid[..., None], X, 0.0)) if B and exact
                 else np.zeros(B, bool))
    else:
        eX = np.zeros(B, np.int64)
        lossy = np.zeros(B, bool)
    bi, ni = np.arange(B)[:, None], np.arange(n)[None, :]
    sel = X[bi, ni, alpha]
    v = valid.copy()
    v[bi, ni, alpha] = False
    # the differences and their exact rounding errors (the certificate proves its verdicts
    # on the exact differences Delta + Delta_lo of the caller's tokens)
    if exact:
        Delta, lo = two_diff(sel[:, :, None, :], X)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            Delta = np.subtract(sel[:, :, None, :], X, out=X if normalise_data else None)
        lo = None
    if not valid.all():  # masked tokens; at alpha, x - x = 0 exactly (finite X)
        np.copyto(Delta, 0.0, where=~v[..., None])
        if lo is not None:
            np.copyto(lo, 0.0, where=~v[..., None])
    with np.errstate(invalid="ignore"):
        lo = lo if lo is not None and (lo != 0).any() else None
    if not normalise_data:
        bb = np.ones(v.shape) if b is None else np.broadcast_to(np.asarray(b, float), v.shape)
        return ConstraintSet(Delta, np.asarray(Z, float), v, np.where(v, bb, 0.0),
                             None if eq is None else np.asarray(eq, bool) & v,
                             np.zeros(B, np.int64), lo, None, exact)
    return normalise_constraints(Delta, Z, v, b, eq, np.asarray(x_exp) + eX, zeroed=True,
                                 Delta_lo=lo, lossy=lossy, exact=exact)


def scaled_keys(X: np.ndarray, Wk, valid: np.ndarray, name: str = "W"):
    """Keys K = X W (..., n, T, d') computed on power-of-two scaled X and W (no overflow):
    returns (K 2^-e, e)."""
    d = X.shape[-1]
    if Wk is None:  # K = X: build_constraints scales it (the same power of two)
        return X, np.zeros(X.shape[:-3], np.int64)
    Xs, eX = normalise(X, (-3, -2, -1), valid[..., None])
    Wk = as_array(Wk, name, (2, 3), "(d, d') or (B, d, d')")
    if Wk.shape[-2] != d or Wk.shape[-1] == 0:
        raise ValueError(f"{name} must have shape ({d}, d') with d' >= 1; got {Wk.shape}")
    Ws, eW = normalise(Wk, (-2, -1))
    K = Xs @ (Ws if Ws.ndim == 2 else Ws[:, None])
    return K, np.asarray(eX) + np.asarray(eW)


def margin_ratio(cs: ConstraintSet, m: np.ndarray) -> np.ndarray:
    """min_k m_k / b_k over the inequalities with b_k > 0 (inf where there is none), per
    problem (shape ``cs.batch_shape``), from the margins m (..., n, T) of an answer W:
    W / ratio has minimal margin exactly 1 relative to b (feasible where ratio > 0; a
    smaller norm where ratio > 1).  The one rescaling rule of every answer, the engine's
    (:func:`attnsvm.svm.engine.solve`) and the Graph-SVM's alike."""
    pos = cs.ineq & (cs.b > 0)
    return np.where(pos, m / np.where(pos, cs.b, 1.0), np.inf).min((-2, -1))
