"""The certificate of :func:`attnsvm.svm.certificate.certify`, vectorised over B Frobenius
problems whose constraints are all inequalities with b_k = 1 (the ATT-SVM and the prompt
SVM), in one plain-numpy pass: the compiled fast path of the Frobenius strategy
(:mod:`attnsvm.svm.lean`) certifies its answers here.

    cert = certify_unit(D, Z, v, W, lam, tol_active)
    one = certify_unit_one(D[b], Z[b], v[b], W[b], lam[b], tol_active)  # one problem

(:func:`certify_unit_one`: the single-problem path's, the same numbers with Python-float
scalars in half the numpy calls, None where it proves nothing; :func:`unit_one_core`: its
proof and the status numbers, the others, which decide nothing, computed where they are
read: :class:`UnitCore`; with numba, its maxima, minima and counts (exact: one value
whatever the order) from one compiled pass, its sums and products numpy's.)

The same formulas as :func:`~attnsvm.svm.certificate.certify` (its numbers come from the
same :func:`~attnsvm.svm.certificate.fro_sums`, so they are the engine's bit for bit), with
one difference in what is proven: a margin is proven >= 1 by the rigorous rounding-error
bound alone (:func:`~attnsvm.svm.certificate._margin_err`, the comparison
fl(m^_k - 1) >= fl(err_k SLACK) of :func:`~attnsvm.svm.certificate.prove_margins`, on the
margins m^ that :func:`~attnsvm.svm.certificate.fro_sums` computed: the bound holds for
a sum evaluated in any order).  What the bound leaves undecided is not proven here (no
exact arithmetic, no rounding-size scale-up): the caller then hands the problem to the
engine, whose :func:`~attnsvm.svm.certificate.certify` decides it, or (``decide``) proves
those margins itself on its exact data (the batch fast path, :func:`attnsvm.svm.lean.
_exact_margins`: a compensated enclosure, else the engine's rational arithmetic).  So "feasible" here
implies "feasible" there, with the same numbers; tests/test_svm_lean.py holds the two equal
problem by problem.

The data D, Z must be the caller's constraint data scaled by powers of two exactly (the
differences Delta_k = fl(x_{i,alpha_i} - x_it) rounded once: the bound counts that
rounding, as for ``exact=False`` sets).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .active import kernels as _kernels
from .certificate import SLACK, Certificate, _margin_err, fro_sums

try:  # np.einsum's own kernel (what it calls without ``optimize``: the same bits) without
    # its Python wrapper, which costs as much as a small contraction
    from numpy._core._multiarray_umath import c_einsum as _einsum
except ImportError:  # (numpy < 2)
    _einsum = np.einsum

__all__ = ["certify_unit", "certify_unit_one", "UnitOne", "UnitCore", "unit_one_core"]


def certify_unit(D: np.ndarray, Z: np.ndarray, v: np.ndarray, W: np.ndarray, lam: np.ndarray,
                 tol_active: float = 1e-6, *, prove: bool | np.ndarray = True,
                 decide: Callable[[np.ndarray], np.ndarray] | None = None) -> Certificate:
    """The :class:`~attnsvm.svm.certificate.Certificate` of answers W (B, d, e) with
    multipliers lam (B, n, T) for the constraints D_k^T W z_k >= 1, D (B, n, T, d) (0 where
    not valid), Z (B, n, e), on the valid v (B, n, T) bool, each problem with at least one
    constraint: the formulas of :func:`~attnsvm.svm.certificate.certify` (module
    docstring), feasible only where every margin is proven >= 1 by the rounding-error
    bound.  Rows of W that are not finite mean "no answer"; rows of lam that are not
    finite, "no multipliers" (gap and KKT residual NaN).  ``prove`` False: the margin proof
    is not run and nothing is feasible (problems proven infeasible, whose other numbers,
    such as the weak-duality lower bound, are still reported); a (B,) bool: only those
    problems may be feasible (the others' numbers as with False, the same bits: each
    problem's numbers are computed alone).  ``decide``: where the bound
    leaves margins undecided (|fl(m^_k - 1)| < fl(err_k SLACK), err_k finite, as
    :func:`~attnsvm.svm.certificate.prove_margins` calls them) and proves every other one
    of a problem with W and ||W|| finite, ``decide(j)`` (j the positions of those problems
    in this batch, sorted) returns (len(j),) bool: every margin of problem j proven >= 1 on
    the caller's exact data (by a rigorous enclosure or in rational arithmetic); those are
    feasible."""
    B, n, T, d = D.shape
    e = Z.shape[-1]
    W = np.asarray(W, dtype=float)
    has = np.isfinite(W).all((-2, -1))
    every = has.all()
    Wz = W if every else np.where(has[:, None, None], W, 0.0)
    lam_given = np.isfinite(lam).all((-2, -1))
    lam = np.where(v & lam_given[:, None, None], np.maximum(lam, 0.0), 0.0)
    m, S, margin, viol, nrm, dn, lb_num, wms, comp = fro_sums(D, Z, v, None, Wz, lam)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        # the proof (certificate.prove_margins with exact=False, b_k = 1): the rounding-error
        # bound err_k of the computed margins m^_k
        feasible = np.zeros(B, bool)
        mask = np.broadcast_to(np.asarray(prove, bool), (B,))
        if mask.any():  # (on the masked problems only: each problem's bound is its own)
            j = None if mask.all() else np.nonzero(mask)[0]

            def pick(a):
                return a if j is None else a[j]

            Dp, vp, aW, aZ = pick(D), pick(v), np.abs(pick(Wz)), np.abs(pick(Z))
            Bp = len(Dp)
            E = np.einsum("bnte,bne->bnt",
                          (np.abs(Dp).reshape(Bp, n * T, d) @ aW).reshape(Bp, n, T, e), aZ)
            wz = (aW @ np.swapaxes(aZ, -1, -2)).sum(-2)  # (B, n) sum_cf |W_cf| |z_f|
            err = _margin_err(E, wz[..., None], aZ.sum(-1)[..., None], d, e)
            slack = pick(m) - 1.0
            ok = (slack >= err * SLACK) & np.isfinite(slack)
            proven = (ok | ~vp).all((-2, -1))
            answer = pick(has) & np.isfinite(pick(nrm))
            fp = answer & proven
            if decide is not None:
                und = vp & ~ok & (np.abs(slack) < err * SLACK) & np.isfinite(err)
                ask = np.nonzero(answer & ~proven & (ok | und | ~vp).all((-2, -1)))[0]
                if len(ask):
                    fp[ask] = np.asarray(decide(ask if j is None else j[ask]), bool)
            if j is None:
                feasible = fp
            else:
                feasible[j] = fp
        # the numbers (certificate.certify, inequalities with b_k = 1, no equality, every
        # problem needing a margin)
        lower = np.where((dn > 0) & (lb_num > 0), lb_num / np.where(dn > 0, dn, 1.0), 0.0)
        upper = nrm / np.where((margin > 0) & (margin < 1), margin, 1.0)
        gap = np.where(lower > 0, np.maximum(upper - lower, 0.0) / lower, np.inf)
        gap = np.where(feasible & lam_given, gap, np.nan)
        n2 = np.where(nrm > 0, nrm**2, 1.0)
        kkt = np.maximum(wms / np.sqrt(n2), comp / n2)  # self-dual: W = sum lam_k A_k
        kkt = np.where(has & lam_given, np.where(nrm > 0, kkt, np.inf), np.nan)
    support = v & (m <= 1.0 + tol_active)
    if not every:
        support &= has[:, None, None]
        m = np.where(has[:, None, None], m, np.nan)
        nrm, margin, viol = np.where(has, nrm, np.inf), np.where(has, margin, np.nan), \
            np.where(has, viol, np.nan)
    return Certificate(W=W, lam=lam, margins=m, norm=nrm, margin=margin, violation=viol,
                       kkt=kkt, gap=gap, lower=lower, feasible=feasible, support=support)


class UnitOne(NamedTuple):
    """The certificate of one problem proven feasible (:func:`certify_unit_one`): the
    arrays of :class:`~attnsvm.svm.certificate.Certificate` without the batch axis, its
    numbers as Python floats; ``wmax`` = max |W_cf|, ``n_constraints`` the valid count."""

    lam: np.ndarray  # (n, T)
    margins: np.ndarray  # (n, T)
    support: np.ndarray  # (n, T) bool
    norm: float
    margin: float
    violation: float
    kkt: float
    gap: float
    lower: float
    wmax: float
    n_constraints: int


# the reductions of ndarray.max / .min / .sum (the same ufunc reductions, so the same
# bits) without their Python wrappers: a single problem's arrays are small, where each
# wrapper costs as much as the reduction
_max, _min, _sum = np.maximum.reduce, np.minimum.reduce, np.add.reduce


def _fro(A: np.ndarray, m: float) -> float:
    """:func:`~attnsvm.svm.certificate.fro_norm` of one matrix A (finite) with m = max |A|,
    the same operations on the same numbers (m sqrt(sum (A / m)^2)), so the same bits."""
    A1 = A / m if m > 0 else A  # (A / 1.0 = A)
    return m * math.sqrt(float(_einsum("ij,ij->", A1, A1)))


def certify_unit_one(D: np.ndarray, Z: np.ndarray, v: np.ndarray, W: np.ndarray,
                     lam: np.ndarray, tol_active: float = 1e-6) -> UnitOne | None:
    """:func:`certify_unit` of ONE problem (D (n, T, d), Z (n, e), v (n, T), W (d, e)
    finite, lam (n, T)) where it proves the margins, in about half the numpy calls: the
    single-problem fast path's certificate.  Its numbers are fro_sums' operations on the
    same numbers, so the same bits (tests/test_svm_lean.py), with the per-problem scalars
    as Python floats.

    The proof is certify_unit's comparison fl(m^_k - 1) >= fl(err_k SLACK) (module
    docstring), first for every k at once: fl(min_k m^_k - 1) >= fl(err' SLACK), where
    err' is err_k with E_k replaced by E' = d e max |D| max |W| max |z| >= E_k (three
    roundings, fewer than E_k's d + e: the same analysis) and fl(m^_k - 1) >=
    fl(min_k m^_k - 1) (rounding is monotone); where that leaves a margin undecided, with
    E_k itself, as min_k fl(fl(m^_k - 1) - fl(err_k SLACK)) >= 0 (the same test: for
    finite a, b, fl(a - b) has the sign of a - b).  The underflow term of err_k
    (:func:`~attnsvm.svm.certificate._margin_err`) is taken at bounds common to every
    sequence, wz = 2 d e max |W| max |z| >= sum_cf |W_cf| |z_if| and az = 2 e max |z| >=
    sum_f |z_if| (larger by a term of order 2^-1074 |W|; inf where d e max |W| nears the
    overflow threshold).  So every margin proven here is proven by certify_unit.  None where a margin is not proven, lam or a margin is not
    finite, or ||W|| is not: the caller hands the problem to the engine, which decides
    it."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        core = unit_one_core(D, Z, v, W, lam)
        if core is None:
            return None
        m = core.margins()
        lc = core.lam.copy() if core.lam is lam else core.lam  # (not the caller's array)
        return UnitOne(lc, m, core.support(tol_active), core.norm, core.margin,
                       core.violation, core.kkt(m), core.gap, core.lower, core.wmax,
                       core.n_constraints)


class UnitCore(NamedTuple):
    """What :func:`unit_one_core` proves and the numbers of the status (the margins proven,
    ||W||, the gap), and the data of the others, which :meth:`margins`, :meth:`support`
    and :meth:`kkt` compute from it (the operations of :func:`certify_unit_one`, so the same
    bits) where they are read: the single-problem fast path
    (:func:`attnsvm.svm.lean.att_svm_lean`) reports them on first read
    (:class:`attnsvm.svm.result.Solution`'s deferred fields)."""

    lam: np.ndarray  # (n, T) the multipliers, >= 0, 0 where not valid
    m0: np.ndarray  # (n, T) D_k^T W z_k on every (n, T) (the valid ones: the margins)
    mv: np.ndarray | None  # (n, T) m0 where valid, inf elsewhere (None: formed where read)
    v: np.ndarray  # (n, T) bool
    W: np.ndarray  # (d, e)
    S: np.ndarray  # (d, e) sum_k lam_k A_k
    norm: float
    margin: float
    violation: float
    gap: float
    lower: float
    wmax: float
    n_constraints: int
    wmin: float = math.nan  # the least nonzero |W_cf| (inf: none; NaN: not computed)

    def margins(self) -> np.ndarray:
        """(n, T) fro_sums' margins: m_k on the valid constraints, 0 elsewhere."""
        return np.where(self.v, self.m0, 0.0)

    def support(self, tol_active: float) -> np.ndarray:
        """(n, T) bool, certify_unit's support: valid, m_k <= 1 + tol_active."""
        mv = np.where(self.v, self.m0, np.inf) if self.mv is None else self.mv
        return mv <= 1.0 + tol_active

    def kkt(self, m: np.ndarray | None = None) -> float:
        """The KKT residual max(||W - S||_F / ||W||, max_k |lam_k (m_k - 1)| / ||W||^2)
        (certify_unit's, self-dual: W = sum lam_k A_k at the optimum; inf where W = 0);
        ``m``: :meth:`margins` where the caller has them.  Without ``np.errstate``: the
        caller holds the floating-point warnings off."""
        nrm = self.norm
        if not nrm > 0:
            return math.inf
        m = self.margins() if m is None else m
        # |lam_k (m_k - 1)|: lam_k (m_k - 1) >= 0 on the valid ones (proven m_k - 1 >= 0),
        # -0.0 elsewhere (lam_k = 0, m_k = 0)
        comp = abs(float(_max(self.lam * (m - 1.0), None)))
        R = self.W - self.S
        wms = math.sqrt(float(np.einsum("ij,ij->", R, R)))
        n2 = nrm * nrm  # (numpy's nrm**2)
        a, b = wms / math.sqrt(n2), comp / n2
        return math.nan if a != a or b != b else max(a, b)  # (np.maximum)


def unit_one_core(D, Z, v, W, lam) -> UnitCore | None:
    """The proof and the status numbers of :func:`certify_unit_one` (its arguments; None
    where it gives None), the rest deferred (:class:`UnitCore`); without its
    ``np.errstate``: the caller holds every floating-point warning off (over, invalid,
    under, divide).

    With numba, the exact reductions (the maxima of |W|, |z|, |Delta|, |S|, the least
    valid margin, the count of valid constraints, and whether the clipping of lam changes
    a bit) come from one compiled pass
    (:func:`attnsvm.svm._active_kernels.unit_one_scan`): comparisons only, so the same
    values as numpy's reductions here (tests/test_svm_lean.py holds both ways equal); the
    sums and products that depend on their order are numpy's, as without numba.  Where
    the clipping changes nothing, :class:`UnitCore`'s lam is ``lam`` itself (no copy)."""
    n, T, d = D.shape
    e = Z.shape[1]
    K = _kernels()
    if K is None:
        return _unit_one_numpy(D, Z, v, W, lam)
    m0 = _einsum("nte,ne->nt", (D.reshape(n * T, d) @ W).reshape(n, T, e), Z)
    S = _einsum("it,itd->id", lam, D).T @ Z
    plain, wmax, zmax, dmax, margin, nv, smax, wmin = K.unit_one_scan(D, Z, v, W, lam, m0, S)
    if not plain:  # (lam clipped: where(v, max(lam, 0), 0) changes a bit)
        if not math.isfinite(float(_sum(lam, None))):
            return None  # (lam not given: no gap, so never "optimal" here)
        lam = np.where(v, np.maximum(lam, 0.0), 0.0)
        S = _einsum("it,itd->id", lam, D).T @ Z
        smax = float(_max(np.abs(S), None))
    lb_num = float(_sum(lam, None))  # (plain: sum(lam) itself, the check above)
    if not math.isfinite(lb_num):
        return None
    return _unit_one_rest(D, Z, v, W, lam, m0, None, S, wmax, zmax, dmax, margin, nv, smax,
                          lb_num, wmin)


def _unit_one_numpy(D, Z, v, W, lam) -> UnitCore | None:
    """:func:`unit_one_core` in numpy alone (without numba: the definition)."""
    n, T, d = D.shape
    e = Z.shape[1]
    if not math.isfinite(float(_sum(lam, None))):
        return None  # (lam not given: no gap, so never "optimal" here)
    lam = np.where(v, np.maximum(lam, 0.0), 0.0)
    m0 = _einsum("nte,ne->nt", (D.reshape(n * T, d) @ W).reshape(n, T, e), Z)
    mv = np.where(v, m0, np.inf)  # (the valid ones; inf elsewhere)
    wmax, zmax = float(_max(np.abs(W), None)), float(_max(np.abs(Z), None))
    margin = float(_min(mv, None))
    dmax = float(_max(np.abs(D), None))
    S = _einsum("it,itd->id", lam, D).T @ Z
    smax = float(_max(np.abs(S), None))
    return _unit_one_rest(D, Z, v, W, lam, m0, mv, S, wmax, zmax, dmax, margin,
                          int(np.count_nonzero(v)), smax, float(_sum(lam, None)))


def _unit_one_rest(D, Z, v, W, lam, m0, mv, S, wmax, zmax, dmax, margin, nv, smax, lb_num,
                   wmin=math.nan):
    """:func:`unit_one_core` from its reductions: wmax, zmax, dmax, smax = max |W|, |Z|,
    |D|, |S| (S = sum_k lam_k A_k), margin = min_k m0_k over the valid, nv their count,
    lb_num = sum lam (lam clipped: >= 0, 0 where not valid), mv = where(v, m0, inf) or
    None (formed where needed), wmin (:class:`UnitCore`'s)."""
    n, T, d = D.shape
    e = Z.shape[1]
    # the proof: every margin >= 1 by the rounding-error bound, first for every k at
    # once with E_k <= d e max|D| max|W| max|z| (Python floats: fl(m^_k - 1) >=
    # fl(min_k m^_k - 1), rounding is monotone), where that leaves a margin undecided
    # with E_k itself (certify_unit's)
    wz = 2.0 * (d * e) * wmax * zmax  # (>= sum_cf |W_cf| |z_if|, every i)
    under = (wz, 2.0 * e * zmax, d, e)
    Emax = (d * e) * dmax * wmax * zmax
    if not margin - 1.0 >= _margin_err(Emax, *under) * SLACK:
        if mv is None:
            mv = np.where(v, m0, np.inf)
        E = _einsum("nte,ne->nt",
                    (np.abs(D).reshape(n * T, d) @ np.abs(W)).reshape(n, T, e), np.abs(Z))
        if not float(_min((mv - 1.0) - _margin_err(E, *under) * SLACK, None)) >= 0.0:
            return None
    if not (Emax <= 2.0 ** 1000 or math.isfinite(float(_max(np.where(v, m0, 0.0), None)))):
        return None  # (m^_k - 1 finite on every constraint, as certify_unit asks;
        # |m^_k| <= (1 + gamma_{d+e}) E_k <= 2^1000 (1 + 1e-12) is finite)
    nrm = _fro(W, wmax)
    if not math.isfinite(nrm):
        return None
    # the numbers (certificate.fro_sums with b_k = 1, certify_unit)
    viol = max(1.0 - margin, 0.0)
    dn = _fro(S, smax) if math.isfinite(smax) else math.inf
    lower = lb_num / dn if dn > 0 and lb_num > 0 else 0.0
    upper = nrm / (margin if 0 < margin < 1 else 1.0)
    gap = max(upper - lower, 0.0) / lower if lower > 0 else math.inf
    return UnitCore(lam, m0, mv, v, W, S, nrm, margin, viol, gap, lower, wmax, nv, wmin)
