"""Constraint sets of max-margin problems, built and normalised (the engine's step 0).

    cs = build_constraints(X, Z, alpha, valid)      # (B, n, T, d) tokens -> normalised set

Constraints (x_{i,alpha_i} - x_it)^T W z_i >= b_it (docs/theory.md §5) of B problems, as a
:class:`ConstraintSet` whose differences Delta and queries Z are
scaled by powers of two (exact) so that their largest entries lie in [1/2, 1): no overflow
at 1e+308, no lost digits for near-duplicate tokens.  The scaling exponents are kept
(``cs.exp``), so every answer maps back to the caller's units exactly
(:mod:`attnsvm.svm.assemble`).


The layout.  Every problem of docs/theory.md §5 with margin constraints is, after flattening, a set of
linear constraints on a matrix ``W`` (d, e):

    m_k(W) = Delta_k^T W z_k >= b_k   (inequalities)   or   = b_k   (equalities, ``eq``)

for k = (i, t) with valid[i, t]; ``Delta`` (n, T, d) holds the token differences
x_{i,alpha_i} - x_{it}, ``Z`` (n, e) the query of sequence i, ``b`` (n, T) the right-hand
side (1; 0 in the relaxed problem; any value for an equality).  The constraint matrix of
k is A_k = Delta_k z_k^T.  The prompt problem is the case e = 1, z = 1.

Every array may carry leading batch dims (B problems of the same shape): one code path
serves a single problem (B = 1) and a batch.

Scale.  A constraint set is stored *normalised*: Delta and Z are divided by powers of two
so their largest entries lie in [1/2, 1); ``exp`` records the exponent, A_k(original) =
2^exp A_k(stored).  Power-of-two scaling is exact in floating point, so the solution of
the original problem is W = 2^-exp W_stored bit for bit, and every solver and the
certificate work at unit scale (no under/overflow for tokens at 1e-200 or 1e+200).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._shapes import axis_size
from .certificate import two_diff
from .validate import as_array

__all__ = ["ConstraintSet", "row_margins", "exp2", "ldexp", "absmax", "normalise", "has_subnormal", "normalise_constraints", "build_constraints",
           "scaled_keys", "margin_ratio", "SMALLEST_NORMAL"]

SMALLEST_NORMAL = np.finfo(float).tiny


def row_margins(D: np.ndarray, Z: np.ndarray, W: np.ndarray) -> np.ndarray:
    """THE margin formula of :mod:`attnsvm.svm`: m_r = D_r^T W z_r = ((D @ W) * Z).sum(-1)
    for rows D (..., d) and Z (..., e) (broadcast) and W (..., d, e); the compiled twins
    (:mod:`attnsvm.svm._active_kernels`) are held equal to it by tests/test_svm_fastpath.py.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm.constraints import row_margins
        >>> row_margins(np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([[1.0], [1.0]]),
        ...             np.array([[3.0], [4.0]])).tolist()
        [3.0, 8.0]
    """
    return ((D @ W) * Z).sum(-1)


def exp2(m: np.ndarray) -> np.ndarray:
    """Integer e with m = f 2^e, f in [1/2, 1) (0 where m == 0 or not finite)."""
    m = np.asarray(m, dtype=float)
    ok = np.isfinite(m) & (m > 0)
    return np.where(ok, np.frexp(np.where(ok, m, 1.0))[1], 0).astype(np.int64)


def ldexp(a: np.ndarray, e, out=None) -> np.ndarray:
    """a * 2^e with e broadcast over a's leading dims (exact unless it over/underflows);
    ``out``: where to write it (may be ``a`` itself)."""
    a = np.asarray(a, dtype=float)
    e = np.asarray(e, dtype=np.int64)
    if e.size == 1 and e.ndim <= a.ndim and -1022 <= int(e.flat[0]) <= 1023:  # one 2^e
        with np.errstate(over="ignore", under="ignore"):
            return np.multiply(a, 2.0 ** int(e.flat[0]), out=out)
    e = e.reshape(e.shape + (1,) * (a.ndim - e.ndim))
    with np.errstate(over="ignore", under="ignore"):
        if e.size and -1022 <= e.min() and e.max() <= 1023:
            # 2^e is a normal float64: a * 2^e is the correctly rounded a 2^e, as ldexp
            # (bit for bit, subnormal results included), and 10x faster than np.ldexp
            return np.multiply(a, np.exp2(e.astype(float)), out=out)
        return np.ldexp(a, e, out=out)


# ----------------------------------------------------------------------- constraints
@dataclass
class ConstraintSet:
    """Constraints Delta_k^T W z_k >= b_k (== b_k where ``eq``) in padded (..., n, T) layout.

    Delta (..., n, T, d), Z (..., n, e), valid (..., n, T) bool, b (..., n, T),
    eq (..., n, T) bool or None (no equality), exp (...) int: A(original) = 2^exp A(here).
    Invalid entries (the selected token itself, masked tokens, causal future) carry
    Delta = 0 and are ignored everywhere.  Leading dims are batch dims.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import ConstraintSet
        >>> cs = ConstraintSet(Delta=np.array([[[1.0, 0.0], [0.0, 0.0]]]), Z=np.array([[1.0, 0.0]]),
        ...                    valid=np.array([[True, False]]), b=np.ones((1, 2)))
        >>> cs.shape, cs.n_constraints
        ((1, 2), 1)
    """

    Delta: np.ndarray
    Z: np.ndarray
    valid: np.ndarray
    b: np.ndarray
    eq: np.ndarray | None = None
    exp: np.ndarray | int = 0
    Delta_lo: np.ndarray | None = None
    data_err: np.ndarray | None = None
    exact: bool = True

    # Delta_lo (..., n, T, d) or None: the rounding error of the differences, so that the
    # exact constraint data (that of the caller's tokens) is Delta + Delta_lo
    # (:func:`attnsvm.svm.certificate.two_diff`); None: Delta is exact, or (``exact``
    # False) its rounding error, at most u |Delta|, was not kept.  data_err (...) or None (0): a
    # bound on |exact - stored| for every entry of Delta + Delta_lo and of Z beyond that
    # (normalised units: bits that scaling into the subnormal range may drop); the data
    # is held exactly only where it is 0 (the exact-arithmetic checks need that)

    # ------------------------------------------------------------- shape
    @property
    def shape(self) -> tuple[int, int]:
        """(n, T): sequences and tokens per problem."""
        return (self.Delta.shape[-3], self.Delta.shape[-2])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The leading batch dims (() for one problem)."""
        return self.Delta.shape[:-3]

    @property
    def n_constraints(self):
        """Number of valid constraints (an int, or an array over the batch)."""
        c = self.valid.sum((-2, -1))
        return int(c) if np.ndim(c) == 0 else c

    d = axis_size("Delta", -1, "Key dimension d (W is d x e).")
    e = axis_size("Z", -1, "Query dimension e (W is d x e).")

    @property
    def eqmask(self) -> np.ndarray:
        """valid equality constraints (..., n, T)."""
        if self.eq is None:
            return np.zeros(self.valid.shape, bool)
        return self.valid & self.eq

    @property
    def ineq(self) -> np.ndarray:
        """valid inequality constraints (..., n, T)."""
        return self.valid if self.eq is None else self.valid & ~self.eq

    @property
    def has_eq(self) -> bool:
        """Whether any constraint is an equality (Delta_k^T W z_k == b_k)."""
        return self.eq is not None and bool(self.eqmask.any())

    def take(self, idx) -> ConstraintSet:
        """The problems ``idx`` of a batched set (idx an int gives an unbatched set)."""
        exp = np.broadcast_to(np.asarray(self.exp), self.batch_shape)
        return ConstraintSet(self.Delta[idx], self.Z[idx], self.valid[idx], self.b[idx],
                             None if self.eq is None else self.eq[idx], exp[idx],
                             None if self.Delta_lo is None else self.Delta_lo[idx],
                             None if self.data_err is None else self.data_err[idx], self.exact)

    def with_valid(self, valid: np.ndarray) -> ConstraintSet:
        """The same constraints restricted to ``valid`` (a working set)."""
        return ConstraintSet(self.Delta, self.Z, valid, self.b, self.eq, self.exp,
                             self.Delta_lo, self.data_err, self.exact)

    def batched(self) -> ConstraintSet:
        """This (unbatched) set as a batch of one."""
        if self.batch_shape:
            return self
        return ConstraintSet(self.Delta[None], self.Z[None], self.valid[None], self.b[None],
                             None if self.eq is None else self.eq[None],
                             np.asarray(self.exp)[None],
                             None if self.Delta_lo is None else self.Delta_lo[None],
                             None if self.data_err is None else np.asarray(self.data_err)[None],
                             self.exact)

    # ---------------------------------------------------------- algebra
    def margins(self, W: np.ndarray) -> np.ndarray:
        """m_it = Delta_it^T W z_i, (..., n, T) (0 at invalid entries); W (..., d, e)
        (:func:`row_margins`)."""
        m = row_margins(self.Delta, self.Z[..., :, None, :], W[..., None, :, :])
        return np.where(self.valid, m, 0.0)

    def combine(self, lam: np.ndarray) -> np.ndarray:
        """sum_k lam_k A_k = sum_i (sum_t lam_it Delta_it) z_i^T, shape (..., d, e)."""
        lam = np.where(self.valid, lam, 0.0)
        u = np.einsum("...it,...itd->...id", lam, self.Delta)
        return np.swapaxes(u, -1, -2) @ self.Z

    def dense(self) -> np.ndarray:
        """The (N, d*e) matrix of vec(A_k) (C order) over the valid constraints (unbatched)."""
        ii, tt = np.nonzero(self.valid)
        return np.einsum("kd,ke->kde", self.Delta[ii, tt], self.Z[ii]).reshape(len(ii), -1)

    def row_norms(self) -> np.ndarray:
        """||A_k||_F = ||Delta_k|| ||z_k|| (..., n, T) (0 where invalid)."""
        dd = np.einsum("...d,...d->...", self.Delta, self.Delta)  # sums of squares
        zz = np.einsum("...e,...e->...", self.Z, self.Z)
        nrm = np.sqrt(dd) * np.sqrt(zz)[..., :, None]
        return np.where(self.valid, nrm, 0.0)

    def scale(self):
        """max_k ||A_k||_F (0 if there is no constraint); an array over the batch."""
        nrm = self.row_norms()
        if nrm.size == 0:
            return 0.0 if not self.batch_shape else np.zeros(self.batch_shape)
        out = nrm.max((-2, -1))
        return float(out) if np.ndim(out) == 0 else out

    def needs_margin(self) -> np.ndarray:
        """Problems (batch shape) whose answer cannot be W = 0: an inequality with b > 0 or
        an equality with b != 0."""
        pos = (self.ineq & (self.b > 0)) | (self.eqmask & (self.b != 0))
        return pos.any((-2, -1))


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
