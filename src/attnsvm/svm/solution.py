"""Constraint sets, solution objects and THE certificate of the max-margin problems.

Every problem of docs/theory.md §5 with margin constraints is, after flattening, a set of
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

The certificate (:func:`certify`), computed from the returned W alone against ALL
constraints, vectorised over the batch:

    margin      min_k m_k / b_k over inequalities with b_k > 0
    violation   max( max_ineq (b_k - m_k)^+, max_eq |m_k - b_k| ) / max(1, |b_k|)
    gap         (||W|| / min(1, margin) - lb) / lb,  lb = sum_k lam_k b_k / ||sum_k lam_k A_k||_*
                (weak duality: lb <= ||W'|| for every feasible W', for any lam >= 0 on the
                inequalities, so gap bounds the relative suboptimality of W)
    kkt         stationarity of min 1/2||W||^2 (||W - S||/||W|| for the self-dual Frobenius
                norm; max(| ||S||_*/||W|| - 1 |, | <S, W>/||W||^2 - 1 |) otherwise) and
                complementarity max_k |lam_k (m_k - b_k)| / ||W||^2

``feasible_`` and ``status_`` are derived from the returned numbers only (never from a
solver's word), and both verdicts are proofs (:mod:`attnsvm.svm.certificate`): feasible
iff every inequality margin is PROVEN >= b_k for the caller's exact data (a rigorous
rounding-error bound, exact rational arithmetic where it is undecided; equalities and
the relaxed problem's m_k >= 0 to FEAS_TOL, a stated tolerance); "optimal" iff feasible and gap <= GAP_OPTIMAL (the gap
evaluated in floating point, its rounding error far below that threshold: stated, not
machine-proven).  An infeasible verdict needs a Farkas certificate verified in exact
arithmetic (:func:`farkas_verify`: sum lam_k A_k = 0 exactly).

Multipliers ``dual_`` always refer to the squared problem min 1/2 ||W||^2 (whatever the
norm), so that sum_k lam_k b_k = ||W_mm||^2 at the optimum and, for the Frobenius norm,
W_mm = sum_k lambda_k A_k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnsvm._optional import OptionalImport

from .certificate import farkas_prove, prove_feasible

# the compiled sums of the certificate and the Farkas screen (numba), or None; the proofs
# themselves are plain (certificate.py)
_kernels = OptionalImport("._active_kernels", __package__)

__all__ = [
    "ConstraintSet",
    "Solution",
    "BatchSolution",
    "Certificate",
    "NotRepresentableError",
    "certify",
    "farkas_verify",
    "primal_norm",
    "dual_norm",
    "FEAS_TOL",
    "GAP_OPTIMAL",
    "GAP_INACCURATE",
    "FARKAS_BOUND",
    "exp2",
    "ldexp",
]

FEAS_TOL = 1e-9  # equality constraints, and inequalities with b_k <= 0 (relaxed problem):
# violation / max(1, |b_k|) of a feasible answer (a stated tolerance; inequalities with
# b_k > 0 are proven exactly, certificate.prove_feasible)
GAP_OPTIMAL = 1e-6  # certified relative duality gap of an "optimal" answer
GAP_INACCURATE = 1e-3  # ... of an "optimal_inaccurate" one (larger: "suboptimal")
# Farkas SCREEN (not a proof): candidates lam >= 0 with sum lam_k b_k = 1 whose residual
# ||sum lam_k A_k||_F exceeds 1 / FARKAS_BOUND (data normalised to max |entry| in
# [1/2, 1)) are not examined by the exact check (certificate.farkas_exact), which alone
# decides "infeasible"
FARKAS_BOUND = 1e9


class NotRepresentableError(OverflowError, ValueError):
    """The max-margin solution exists but over- or underflows float64 at the input's scale.

    ``solution`` holds the certified solution of the normalised problem (W_ in units of
    2^-scale_exp) and ``scale_exp`` the exponent: W = 2^-scale_exp * solution.W_.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import NotRepresentableError, att_svm
        >>> X = np.array([[[1e-300, 0.0], [0.0, 0.0]]])    # a unit margin needs ||W|| ~ 1e600
        >>> try:
        ...     att_svm(X, np.array([[1e-300, 0.0]]), alpha=[0])
        ... except NotRepresentableError as exc:
        ...     print(exc.solution.status_, exc.scale_exp)  # W = 2^-scale_exp * solution.W_
        optimal -1992
    """

    def __init__(self, msg, solution=None, scale_exp=None):
        super().__init__(msg)
        self.solution = solution
        self.scale_exp = scale_exp


# ----------------------------------------------------------------------------- norms
def primal_norm(W: np.ndarray, norm) -> float:
    """||W|| in ``norm`` (any spec of :func:`attnsvm.norms.get_norm`); vectors: the
    vector norm (l_2 for nuc / spectral).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import primal_norm
        >>> W = np.diag([3.0, 4.0])
        >>> primal_norm(W, "fro"), primal_norm(W, "nuc"), primal_norm(W, "spectral")
        (5.0, 7.0, 4.0)
    """
    from ..norms import get_norm

    W = np.asarray(W, dtype=float)
    return float(get_norm(norm).value(W, vector=W.ndim == 1))


def dual_norm(W: np.ndarray, norm) -> float:
    """The dual norm ||W||_* (fro -> fro, nuc <-> spectral, l1 <-> linf, l_p -> l_q).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import dual_norm
        >>> W = np.diag([3.0, 4.0])
        >>> dual_norm(W, "nuc"), dual_norm(W, "l1")        # spectral and linf
        (4.0, 4.0)
    """
    from ..norms import get_norm

    W = np.asarray(W, dtype=float)
    return float(get_norm(norm).dual.value(W, vector=W.ndim == 1))


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

    @property
    def d(self) -> int:
        """Key dimension d (W is d x e)."""
        return self.Delta.shape[-1]

    @property
    def e(self) -> int:
        """Query dimension e (W is d x e)."""
        return self.Z.shape[-1]

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
        """m_it = Delta_it^T W z_i, (..., n, T) (0 at invalid entries); W (..., d, e)."""
        m = ((self.Delta @ W[..., None, :, :]) * self.Z[..., :, None, :]).sum(-1)
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


# ---------------------------------------------------------------------- certificate
@dataclass
class Certificate:
    """The certificate of B candidate answers (all arrays over the batch, normalised units).

    W (B, d, e) the answer (NaN rows: none), lam (B, n, T) multipliers of
    min 1/2||W||^2 (0 where none), margins (B, n, T), norm, margin, violation, kkt, gap,
    lower (lb) (B,), feasible (B,) bool, support (B, n, T) bool.
    """

    W: np.ndarray
    lam: np.ndarray
    margins: np.ndarray
    norm: np.ndarray
    margin: np.ndarray
    violation: np.ndarray
    kkt: np.ndarray
    gap: np.ndarray
    lower: np.ndarray
    feasible: np.ndarray
    support: np.ndarray

    def take(self, idx) -> Certificate:
        """The certificates of the problems ``idx`` (every field indexed by ``idx``)."""
        return Certificate(**{k: getattr(self, k)[idx] for k in self.__dataclass_fields__})

    def put(self, idx, other: Certificate) -> None:
        """Write ``other``'s fields into the problems ``idx`` of this certificate (in place)."""
        for k in self.__dataclass_fields__:
            getattr(self, k)[idx] = getattr(other, k)


def _fro_norm(A: np.ndarray) -> np.ndarray:
    """||A||_F over the last two dims (finite A), shape A.shape[:-2]: m ||A / m||_F with
    m = max |A| per item (no overflow or underflow in the squares; 0 for A = 0), as
    :meth:`attnsvm.norms.Norm.value` computes it."""
    if A.size == 0:
        return np.zeros(A.shape[:-2])
    m = np.abs(A).max((-2, -1))
    A1 = A / np.where(m > 0, m, 1.0)[..., None, None]
    return m * np.sqrt(np.einsum("...ij,...ij->...", A1, A1))


def _fro_sums(cs: ConstraintSet, Wz: np.ndarray, lam: np.ndarray):
    """The Frobenius certificate's per-problem numbers (inequalities only) by the compiled
    :func:`attnsvm.svm._active_kernels.certify_fro`, which evaluates every constraint on
    Wz itself: (m (B, n, T), S = sum lam_k A_k (B, d, e), margin, violation, ||W||_F,
    ||S||_F, sum lam_k b_k, ||W - S||_F, max |lam_k (m_k - b_k)|), each (B,).  None without
    numba or where anything overflowed (the numpy path then gives inf / NaN as it should)."""
    K = _kernels()
    if K is None or cs.Delta.ndim != 4:
        return None
    B = Wz.shape[0]
    m = np.empty(cs.valid.shape)
    S = np.empty(Wz.shape)
    out = np.empty((B, 7))
    c = np.ascontiguousarray
    K.certify_fro(c(cs.Delta, dtype=float), c(cs.Z, dtype=float), c(cs.valid, dtype=bool),
                  c(cs.b, dtype=float), c(Wz, dtype=float), c(lam, dtype=float), m, S, out)
    if not (np.isfinite(m).all() and np.isfinite(S).all() and np.isfinite(out[:, 1:]).all()):
        return None
    return (m, S, *out.T)


def certify(cs: ConstraintSet, W: np.ndarray, lam: np.ndarray | None, N,
            tol_active: float = 1e-6) -> Certificate:
    """THE certificate of answers ``W`` (B, d, e) with multipliers ``lam`` (B, n, T) for the
    batched constraint set ``cs`` (normalised), computed on ALL constraints, vectorised.

    Rows of W that are not finite mean "no answer" (feasible False, numbers NaN).  ``lam``
    may be None (then only the primal numbers are reported; gap and kkt are NaN).
    See the module docstring for the formulas.  ``N``: the :class:`~attnsvm.norms.Norm`
    (converted once, at the caller's door).
    """
    B = cs.batch_shape[0]
    valid, b = cs.valid, cs.b
    ineq, eqm = cs.ineq, cs.eqmask
    W = np.asarray(W, dtype=float)
    has = np.isfinite(W).all((-2, -1))
    Wz = np.where(has[:, None, None], W, 0.0)
    if lam is None:
        lam_given = np.zeros(B, bool)
        lam = np.zeros(valid.shape)
    else:
        lam = np.asarray(lam, dtype=float)
        lam_given = np.isfinite(lam).all((-2, -1))
    lam = np.where(lam_given[:, None, None], lam, 0.0)  # (rows given are finite)
    if cs.eq is None:  # inequalities only: lam >= 0 on the valid ones
        lam = np.where(valid, np.maximum(lam, 0.0), 0.0)
    else:
        lam = np.where(ineq, np.maximum(lam, 0.0), np.where(eqm, lam, 0.0))
    # the proof of feasibility (certificate.prove_feasible): every inequality margin
    # proven >= b_k from the returned W (a rounding-size scale-up where that proves it)
    Wz, lam, proven = prove_feasible(cs, Wz, lam, has)
    W = np.where(has[:, None, None], Wz, W)
    eq_ok = np.ones(B, bool)
    fro = N.name == "fro"  # the Frobenius norm (self-dual) in numpy, no torch round trip
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        bs = np.maximum(1.0, np.abs(b))
        sums = _fro_sums(cs, Wz, lam) if fro and cs.eq is None else None
        if sums is not None:  # the same numbers from one compiled pass per problem
            m, S, margin, viol, nrm, dn, lb_num, wms, comp = sums
        else:
            m = cs.margins(Wz)
            pos = ineq & (b > 0)
            margin = np.where(pos, m / np.where(pos, b, 1.0), np.inf).min((1, 2))
            viol = np.where(ineq, np.maximum(b - m, 0.0) / bs, 0.0).max((1, 2))
            if cs.eq is not None:
                v_eq = np.where(eqm, np.abs(m - b) / bs, 0.0).max((1, 2))
                viol = np.maximum(viol, v_eq)
                eq_ok = v_eq <= FEAS_TOL  # equalities: to a stated tolerance
            nrm = _fro_norm(Wz) if fro else np.asarray(N.value(Wz, vector=False), dtype=float)
            S = cs.combine(lam)
            dn = (_fro_norm(S) if fro and np.isfinite(S).all()
                  else np.asarray(N.dual.value(S, vector=False), dtype=float))
            lb_num = (lam * b).sum((1, 2))
            wms = np.linalg.norm((Wz - S).reshape(B, -1), axis=1)
            comp = np.where(ineq, np.abs(lam * (m - b)), 0.0).max((1, 2))
        # inequalities with b_k <= 0 (relaxed problem): to FEAS_TOL, stated (see
        # certificate.prove_feasible); those with b_k > 0: proven
        nonpos = ineq & (b <= 0)
        if nonpos.any():
            eq_ok = eq_ok & (np.where(nonpos, np.maximum(b - m, 0.0) / bs, 0.0).max((1, 2))
                             <= FEAS_TOL)
        feasible = has & proven & eq_ok & np.isfinite(nrm)
        lower = np.where((dn > 0) & (lb_num > 0), lb_num / np.where(dn > 0, dn, 1.0), 0.0)
        rhs_eq = np.zeros(B, bool) if cs.eq is None else (eqm & (b != 0)).any((1, 2))
        # W / margin is feasible (and no larger in norm when margin >= 1) unless an
        # equality with b != 0 pins the scale
        fix = np.where((margin > 0) & (margin < 1) & ~rhs_eq, margin, 1.0)
        upper = nrm / fix
        need = cs.needs_margin()
        gap = np.where(lower > 0, np.maximum(upper - lower, 0.0) / lower, np.inf)
        gap = np.where(need, gap, np.where(nrm == 0, 0.0, np.inf))
        gap = np.where(feasible & lam_given, gap, np.nan)
        n2 = np.where(nrm > 0, nrm**2, 1.0)
        if N.dual == N:  # self-dual (Hilbert) norm: stationarity is W = sum lam_k A_k
            stat = wms / np.sqrt(n2)
        else:  # S in ||W|| d||W||  <=>  ||S||_* = ||W|| and <S, W> = ||W||^2
            stat = np.maximum(np.abs(dn / np.sqrt(n2) - 1.0),
                              np.abs((S * Wz).sum((1, 2)) / n2 - 1.0))
        comp = comp / n2
        kkt = np.maximum(stat, comp)
        kkt = np.where(need, np.where(nrm > 0, kkt, np.inf), np.where(nrm == 0, 0.0, kkt))
        kkt = np.where(has & lam_given, kkt, np.nan)
    support = valid & (eqm | (m <= b + tol_active * bs)) & has[:, None, None]
    nan = np.full(B, np.nan)
    return Certificate(
        W=W, lam=lam, margins=np.where(has[:, None, None], m, np.nan),
        norm=np.where(has, nrm, np.inf), margin=np.where(has, margin, nan),
        violation=np.where(has, viol, nan), kkt=kkt, gap=gap, lower=lower,
        feasible=feasible, support=support,
    )


def farkas_verify(cs: ConstraintSet, lam: np.ndarray):
    """Verify Farkas certificates of infeasibility, vectorised over the batch: a proof.

    ``lam`` (B, n, T) candidate multipliers.  A verified certificate is lam with
    lam_k >= 0 on inequalities (any sign on equalities), sum_k lam_k b_k = 1 and
    sum_k lam_k A_k = 0 EXACTLY on the exact constraint data
    (:func:`attnsvm.svm.certificate.farkas_prove`: the existence of such a lam next to the
    candidate proven by rigorous error bounds where its support spans the space, else in
    rational arithmetic: the candidate as given, or the exact null vector of the A_k on
    its support nearest to it).  Then no W is feasible:
    0 = <sum lam_k A_k, W> = sum lam_k m_k(W) >= sum lam_k b_k = 1.  A residual that is
    merely small proves nothing (docs/theory.md, "Certificates").

    First a floating-point screen (candidates whose residual ||sum lam_k A_k||_F exceeds
    sum lam_k b_k / FARKAS_BOUND are not examined further; with numba one compiled pass,
    :func:`attnsvm.svm._active_kernels.farkas_batch`, else numpy), then the exact check of
    the screened ones.

    Returns (ok (B,) bool: proven, bound (B,): inf where proven, else the screen's weak
    lower bound sum lam b / ||S||_F on the Frobenius norm of any feasible W (normalised
    units; 0 where lam is not usable), lam (B, n, T): the proven exact multipliers (rounded
    to float) where ok, else the candidate normalised to sum lam b = 1).
    """
    K = _kernels()
    if K is not None:
        screen, bound, lam_n = _farkas_compiled(K, cs, lam)
    else:
        screen, bound, lam_n = _farkas_numpy(cs, lam)
    if not cs.batch_shape:  # one unbatched problem
        ok, lam_x = farkas_prove(cs.batched(), np.asarray(lam_n)[None],
                                 which=np.asarray(screen)[None])
        ok, lam_x = ok[0], lam_x[0]
    else:  # (B,) batches (the engine's layout)
        ok, lam_x = farkas_prove(cs, np.asarray(lam_n), which=screen)
    bound = np.where(ok, np.inf, bound)
    lam_out = np.where(ok[..., None, None], lam_x, lam_n)
    return ok, bound, lam_out


def _farkas_numpy(cs: ConstraintSet, lam):
    """:func:`farkas_verify` in numpy (no numba)."""
    lam = np.nan_to_num(np.asarray(lam, dtype=float))
    ineq = cs.ineq
    lam = np.where(cs.valid, lam, 0.0)
    sign_ok = np.where(ineq, lam >= 0, True).all((-2, -1))
    lb = (lam * cs.b).sum((-2, -1))
    good = sign_ok & (lb > 0) & np.isfinite(lb)
    lam = lam / np.where(good, lb, 1.0)[..., None, None]
    with np.errstate(invalid="ignore", over="ignore"):
        S = cs.combine(lam)
        r = np.linalg.norm(S.reshape(*S.shape[:-2], -1), axis=-1)
    good &= np.isfinite(r)
    bound = np.where(good, np.where(r > 0, 1.0 / np.where(r > 0, r, 1.0), np.inf), 0.0)
    ok = good & (bound >= FARKAS_BOUND)
    return ok, bound, lam


def _farkas_compiled(K, cs: ConstraintSet, lam):
    """:func:`farkas_verify` by the compiled kernel (any leading batch shape)."""
    n, T = cs.shape
    bs = cs.batch_shape
    B = int(np.prod(bs, dtype=np.int64))
    c = np.ascontiguousarray

    def flat(a, tail, dtype=float):
        return c(np.broadcast_to(np.asarray(a, dtype), (*bs, *tail)).reshape(B, *tail))

    lamf = flat(lam, (n, T))
    lout = np.empty((B, n, T))
    ok = np.empty(B, bool)
    bound = np.empty(B)
    K.farkas_batch(flat(cs.Delta, (n, T, cs.d)), flat(cs.Z, (n, cs.e)),
                   flat(cs.valid, (n, T), bool), flat(cs.ineq, (n, T), bool),
                   flat(cs.b, (n, T)), lamf, lout, ok, bound, FARKAS_BOUND)
    return ok.reshape(bs), bound.reshape(bs), lout.reshape(*bs, n, T)


# -------------------------------------------------------------------------- solution
@dataclass(repr=False)
class Solution:
    """A max-margin solution with its certificate (sklearn-style trailing underscores).

    Attributes
    ----------
    W_ : (d, d) / (d, e) matrix, or (d,) vector for prompt / head problems; None if no
        answer (infeasible or uncertified).
    norm_ : ||W_|| in the problem's norm (inf without an answer).
    margin_ : min_k m_k(W_) / b_k over the constraints with b_k > 0.
    violation_ : max_k max(0, b_k - m_k(W_)) (|m_k - b_k| for equalities), relative to the
        unit margin.
    kkt_residual_ : relative stationarity residual of min 1/2||W||^2 (Frobenius:
        ||W - sum lambda_k A_k|| / ||W||; other norms: ||sum lambda A||_* = ||W|| and
        <sum lambda A, W> = ||W||^2) and the complementarity max lambda_k (m_k - b_k) / ||W||^2.
    gap_ : certified relative duality gap (||W|| - lb) / lb, lb = sum lambda_k b_k /
        ||sum lambda_k A_k||_* (a lower bound on the optimal norm).
    dual_ : (n, T) multipliers lambda of min 1/2||W||^2 (0 at alpha, masked tokens).
    support_ : (n, T) bool, active constraints m_k <= b_k + tol_active (SVM-neighbours).
    margins_ : (n, T) constraint values m_k(W_) (0 where invalid).
    status_ : from the certificate only: "optimal" (feasible, gap <= 1e-6),
        "optimal_inaccurate" (gap <= 1e-3), "suboptimal", "infeasible" (a Farkas
        certificate proven exactly: sum lambda_k A_k = 0), "uncertified" (neither proven),
        "heuristic_rank" (rank-constrained heuristic, feasible).
    solver_ : the solver that produced W_.  feasible_ : bool: every margin of W_ proven
        >= b_k for the exact data (:mod:`attnsvm.svm.certificate`; equalities to 1e-9).
    conflict_ : indices of the sequences of an (irreducible where possible) infeasible
        subsystem, from the verified Farkas certificate (empty tuple when feasible).
    alpha_ : the selected token indices the problem was built from.
    extra : n_constraints, scale_exp (the internal normalisation: the solver worked on
        W * 2^scale_exp), farkas_bound (infeasible: inf, no W meets the constraints),
        lower_bound (the weak-duality lower bound on the optimal norm, evaluated in
        floating point).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import att_svm
        >>> sol = att_svm(np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([[1.0, 0.0]]), alpha=[0])
        >>> sol.status_, sol.feasible_, sol.W_.shape, sol.gap_ <= 1e-6
        ('optimal', True, (2, 2), True)
    """

    W_: np.ndarray | None
    norm_: float
    margin_: float
    violation_: float
    kkt_residual_: float
    gap_: float
    dual_: np.ndarray | None
    support_: np.ndarray | None
    margins_: np.ndarray | None
    status_: str
    solver_: str
    feasible_: bool
    conflict_: tuple = ()
    alpha_: np.ndarray | None = None
    norm: str = "fro"
    problem: str = "att_svm"
    n_iter_: int = 0
    time_: float = 0.0
    tol_active: float = 1e-6
    extra: dict = field(default_factory=dict)

    # --------------------------------------------------------------- views
    @property
    def neighbours_(self) -> np.ndarray | None:
        """Alias of ``support_``: the SVM-neighbours (active constraints)."""
        return self.support_

    @property
    def direction_(self) -> np.ndarray | None:
        """W_ / ||W_||_F (None when infeasible)."""
        if self.W_ is None:
            return None
        m = np.abs(self.W_).max() if self.W_.size else 0.0
        if m == 0:
            return self.W_
        W1 = self.W_ / m
        return W1 / np.linalg.norm(W1)

    def rank(self, rtol: float = 1e-7) -> int:
        """Numerical rank of W_ (singular values > rtol * largest)."""
        if self.W_ is None or self.W_.ndim != 2:
            return 0 if self.W_ is None else 1
        s = np.linalg.svd(self.W_, compute_uv=False)
        return int((s > rtol * s[0]).sum()) if s.size and s[0] > 0 else 0

    def __repr__(self) -> str:
        shape = None if self.W_ is None else tuple(self.W_.shape)
        if not self.feasible_:
            return (
                f"Solution({self.problem}, norm={self.norm!r}, {self.status_.upper()}, "
                f"conflict={list(self.conflict_)}, solver={self.solver_!r})"
            )
        return (
            f"Solution({self.problem}, norm={self.norm!r}, shape={shape}, ||W||={self.norm_:.6g}, "
            f"margin={self.margin_:.6g}, violation={self.violation_:.1e}, kkt={self.kkt_residual_:.1e}, "
            f"gap={self.gap_:.1e}, n_support={int(self.support_.sum()) if self.support_ is not None else 0}, "
            f"status={self.status_!r}, solver={self.solver_!r})"
        )

    def summary(self) -> str:
        """A multi-line, human-readable certificate."""
        lines = [f"{self.problem} (norm={self.norm}) solved by {self.solver_}: status {self.status_}"]
        if not self.feasible_:
            if self.status_ == "infeasible":
                lines.append("  INFEASIBLE: no W satisfies all margin constraints (Farkas "
                             "certificate proven: sum lam_k A_k = 0 exactly, lam >= 0, "
                             "sum lam_k b_k > 0).")
                lines.append(f"  conflicting sequences: {list(self.conflict_)}")
                zero = self.extra.get("zero_constraints")
                if zero is not None and len(zero):
                    lines.append(f"  constraints with A_k = 0 (token equal to the selected one, "
                                 f"or a zero query): {len(zero)}, e.g. (i, t) = "
                                 f"{[tuple(int(v) for v in z) for z in zero[:5]]}")
            else:
                lines.append("  NO CERTIFIED ANSWER: neither a W with every margin proven >= 1 nor "
                             "a Farkas certificate of infeasibility could be proven.")
            return "\n".join(lines)
        n_con = int(self.extra.get("n_constraints", 0))
        lines += [
            f"  solution shape        {tuple(self.W_.shape)}",
            f"  norm ||W||            {self.norm_:.10g}",
            f"  min margin            {self.margin_:.10g}   (target 1)",
            f"  max violation         {self.violation_:.3e}",
            f"  KKT residual          {self.kkt_residual_:.3e}",
            f"  relative duality gap  {self.gap_:.3e}",
            f"  active constraints    {int(self.support_.sum())} of {n_con}",
        ]
        if self.W_.ndim == 2:
            lines.append(f"  numerical rank        {self.rank()}")
        lines.append(f"  iterations / time     {self.n_iter_} / {self.time_:.3g} s")
        return "\n".join(lines)


@dataclass(repr=False)
class BatchSolution:
    """Solutions of B problems (leading dimension B on every array).

    W_ (B, d, e) or (B, d) for prompt problems (NaN where there is no answer); norm_,
    margin_, violation_, kkt_residual_, gap_ (B,); dual_, support_, margins_ (B, n, T);
    feasible_ (B,) bool; status_ (B,) str; conflict_ list of B tuples; solver_ (B,) str.
    ``sol[b]`` gives the :class:`Solution` of problem b; ``len(sol)`` = B.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import att_svm_batch
        >>> X = np.tile(np.array([[[1.0, 0.0], [0.0, 1.0]]]), (3, 1, 1, 1))   # B = 3 copies
        >>> sol = att_svm_batch(X, np.ones((3, 1, 2)), alpha=np.zeros((3, 1), int))
        >>> len(sol), sol[0].status_, np.round(sol.norm_, 6)
        (3, 'optimal', array([0.5, 0.5, 0.5]))
    """

    W_: np.ndarray
    norm_: np.ndarray
    margin_: np.ndarray
    violation_: np.ndarray
    kkt_residual_: np.ndarray
    gap_: np.ndarray
    dual_: np.ndarray
    support_: np.ndarray
    margins_: np.ndarray
    feasible_: np.ndarray
    status_: np.ndarray
    solver_: np.ndarray
    conflict_: list
    alpha_: np.ndarray
    norm: str = "fro"
    problem: str = "att_svm"
    time_: float = 0.0
    tol_active: float = 1e-6
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.feasible_)

    @property
    def neighbours_(self) -> np.ndarray:
        """Alias of ``support_`` (B, n, T) bool: the SVM-neighbours (active constraints) per problem."""
        return self.support_

    def __getitem__(self, b: int) -> Solution:
        feas = bool(self.feasible_[b])
        extra = {k: v[b] for k, v in self.extra.items() if isinstance(v, np.ndarray)
                 and v.shape[:1] == (len(self),)}
        return Solution(
            W_=self.W_[b] if feas else None, norm_=float(self.norm_[b]),
            margin_=float(self.margin_[b]), violation_=float(self.violation_[b]),
            kkt_residual_=float(self.kkt_residual_[b]), gap_=float(self.gap_[b]),
            dual_=self.dual_[b] if feas else None, support_=self.support_[b] if feas else None,
            margins_=self.margins_[b] if feas else None, status_=str(self.status_[b]),
            solver_=str(self.solver_[b]), feasible_=feas, conflict_=tuple(self.conflict_[b]),
            alpha_=self.alpha_[b], norm=self.norm, problem=self.problem,
            tol_active=self.tol_active, extra=extra,
        )

    def __repr__(self) -> str:
        B = len(self)
        nf = int(self.feasible_.sum())
        f = self.feasible_
        mv = float(np.nanmax(self.violation_[f])) if nf else float("nan")
        mg = float(np.nanmax(self.gap_[f])) if nf else float("nan")
        ni = int((self.status_ == "infeasible").sum())
        return (f"BatchSolution({self.problem}, norm={self.norm!r}, B={B}, feasible={nf}/{B}, "
                f"infeasible={ni}, max violation={mv:.1e}, max gap={mg:.1e}, "
                f"time={self.time_:.3g}s)")

    def summary(self) -> str:
        """The batch in one line (its repr): B, how many problems are feasible and how many
        proven infeasible, the largest violation and gap over the feasible ones, the time."""
        return repr(self)
