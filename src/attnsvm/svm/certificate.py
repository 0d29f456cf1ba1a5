"""THE certificate of the max-margin problems (:func:`certify`) and its proofs: the
feasibility and infeasibility verdicts, proven from the returned numbers (plain numpy and
Python integers; this module imports nothing else of :mod:`attnsvm.svm`).

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
solver's word), and both verdicts are proofs (below): feasible iff every inequality
margin is PROVEN >= b_k for the caller's exact data (a rigorous rounding-error bound,
exact rational arithmetic where it is undecided; equalities and the relaxed problem's
m_k >= 0 to FEAS_TOL, a stated tolerance); "optimal" iff feasible and gap <= GAP_OPTIMAL
(the gap evaluated in floating point, its rounding error far below that threshold:
stated, not machine-proven).  An infeasible verdict needs a Farkas certificate verified
in exact arithmetic (:func:`attnsvm.svm.farkas.farkas_verify`: sum lam_k A_k = 0
exactly).

Multipliers ``dual_`` always refer to the squared problem min 1/2 ||W||^2 (whatever the
norm), so that sum_k lam_k b_k = ||W_mm||^2 at the optimum and, for the Frobenius norm,
W_mm = sum_k lambda_k A_k.

The constraints of a (batched, normalised) :class:`~attnsvm.svm.constraints.ConstraintSet`
``cs`` are  m_k(W) = Delta_k^T W z_k >= b_k  (inequalities) with the EXACT difference

    Delta_k = cs.Delta_k + cs.Delta_lo_k          (Delta_lo None: cs.Delta is exact)

(:func:`two_diff`: the rounding error of x_{i,alpha_i} - x_it, itself a float, so the
constraints proven here are those of the caller's tokens, not of their rounded
differences).  Where bits may have been lost (a power-of-two scaling into the subnormal
range) or Delta_lo was not kept, ``cs.data_err`` > 0 bounds the error of every entry:
the rounding-error bounds below take it in, the exact-arithmetic checks refuse.

Feasibility (:func:`prove_margins`).  With u = 2^-53, gamma_n = n u / (1 - n u) and
eta = 2^-1074 (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §2.2
and Lemma 3.1/(3.4): a sum of products evaluated in floating point in ANY order, with or
without fused multiply-adds, each term passing through at most n roundings, has
|error| <= gamma_n sum |terms|; gradual underflow adds at most eta/2 per multiplication,
(2.8)), the computed margin m^ of m_k = sum_{c,f} Delta_c W_cf z_f (every term passes
through at most d + e roundings: two products, d - 1 and e - 1 additions; one more for
the rounded difference, Delta = cs.Delta (1 + delta), |delta| <= u) satisfies

    |m_k - m^_k| <= err_k := 1.01 gamma_n E^_k + eta n (d e + 1)(1 + sum_cf |W_cf| |z_f|
                                                                  + sum_f |z_f|),
    n = d + e + 2,  E^_k = the computed sum_cf |cs.Delta_c| |W_cf| |z_f|

(the exact E_k <= E^_k / (1 - gamma_n); 1.01 > (1 + 2 gamma_n)(1 + u)^2 covers that and
the roundings of err itself while gamma_n <= 1e-3).  A margin is PROVEN when the computed
fl(m^_k - b_k) >= fl(err_k c), c = 1 + 2^-40: then m^_k - b_k >= err_k c (1 - u) / (1 + u)
>= err_k, so m_k >= b_k exactly.  Constraints the
bound leaves undecided (slack within 2 err_k, e.g. b_k = 0 met with equality) are decided
in exact rational arithmetic (:func:`exact_margins`, Python integers on the dyadic
floats).  An answer whose margins are not all proven is first scaled up by the smallest
factor 1 + s (s <= 1e-9, a rounding-size correction) that proves them
(:func:`prove_feasible`); otherwise it is not feasible.  Equality constraints cannot in
general be met exactly in floating point: they are met to ``FEAS_TOL`` (relative), a
stated tolerance, not a proof.

Infeasibility (:func:`farkas_exact`).  The constraints have no slack: for every W,
sum_k lam_k m_k(W) = <sum_k lam_k A_k, W>.  If lam >= 0 (any sign on equalities),
sum lam_k b_k > 0 and S = sum_k lam_k A_k = 0 EXACTLY, a feasible W would give
0 = <S, W> = sum lam_k m_k >= sum lam_k b_k > 0: a contradiction (Farkas' lemma, the
alternative of {M w >= b}).  A residual S != 0, however small, proves nothing: every
W with <S, W> >= sum lam b is then a candidate, and the problem of issue 25
(z_2 = (1, eps)) is feasible with ||W|| ~ 2 / eps for a residual of norm eps.  Nor can a
bound ||S|| <= delta rescue it: it only shows ||W|| >= sum lam b / ||S||_* for every
feasible W, a lower bound on the norm, never emptiness.  So the candidate multipliers
(floats from a solver) are made exact: S is evaluated exactly with the candidate as
given; if it is not 0, the exact rational null space of the matrices A_k on the
candidate's support is computed (fraction-free elimination on integers) and the
candidate replaced by the exact null vector nearest to it (unique up to scale when the
support is that of an LP vertex, Gleeson & Ryan 1990); the verdict needs that exact
vector to satisfy the sign and b conditions.

Optimality.  The relative duality gap of :func:`certify`
(||W|| / lb - 1 with the weak-duality bound lb = sum lam_k b_k / ||S||_*) is evaluated in
floating point; with W proven feasible it bounds the suboptimality up to the rounding of
lb, a relative error of about (N + d e) u (sum_k lam_k ||A_k|| / ||S||_*), reported
as it is (not machine-proven) and far below GAP_OPTIMAL = 1e-6 unless the multipliers
cancel by more than 1e8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

__all__ = [
    "U",
    "ETA",
    "KAPPA",
    "gamma",
    "two_diff",
    "margin_enclosure",
    "exact_margins",
    "prove_margins",
    "prove_unit_margins",
    "prove_feasible",
    "farkas_enclosure",
    "farkas_prove",
    "farkas_exact",
    "fro_norm",
    "fro_upper",
    "svd_bounds",
    "lmin_lower",
    "NormBounds",
    "FRO_BOUNDS",
    "NUC_BOUNDS",
    "Certificate",
    "certify",
    "ForestProof",
    "tie_forest",
    "forest_sigma",
    "margins_dot2",
    "proven_gap",
    "FEAS_TOL",
    "GAP_OPTIMAL",
    "GAP_INACCURATE",
    "verdict",
]

U = 2.0 ** -53  # unit roundoff of float64 (round to nearest)
ETA = 2.0 ** -1074  # the smallest subnormal: gradual underflow adds <= ETA / 2 per operation
# every answer scaled to minimal margin 1 is multiplied by KAPPA (solvers and compiled
# kernels alike, engine._to_feasible): margins 1 + 9.1e-13 are proven by the bound above
# for condition numbers E_k / m_k up to ~360 (d + e = 20) without a second pass
# (prove_feasible scales further where needed)
KAPPA = 1.0 + 2.0 ** -40
SLACK = 1.0 + 2.0 ** -40  # the factor c of the comparison (module docstring)
MAX_BUMP = 1e-9  # largest relative scale-up prove_feasible applies (a rounding correction)
MAX_EXACT = 20_000  # undecided constraints decided exactly per call (beyond: not proven)
MAX_SUPPORT = 96  # largest Farkas support whose exact null space is computed


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u) (Higham, Lemma 3.1)."""
    return n * U / (1.0 - n * U)


def two_diff(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None):
    """(s, lo) with s = fl(a - b) and a - b = s + lo exactly (Knuth's TwoSum on a + (-b),
    no overflow assumed; elementwise).  ``out``: where to write s."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.subtract(a, b, out=out)
        bb = s - a
        lo = (a - (s - bb)) - (b + bb)
    return s, lo


def _data_err(cs) -> np.ndarray:
    """(B,) the bound on |exact - stored| of every entry of Delta + Delta_lo and Z
    (ConstraintSet.data_err; 0 where the data is held exactly)."""
    err = getattr(cs, "data_err", None)
    if err is None:
        return np.zeros(cs.batch_shape)
    return np.broadcast_to(np.asarray(err, float), cs.batch_shape)


def _exact_data(cs) -> np.ndarray:
    """(B,) bool: the problem's constraint data is held exactly (data_err 0, Delta_lo
    finite): the exact-arithmetic checks apply."""
    ok = (_data_err(cs) == 0) & bool(getattr(cs, "exact", True))
    if getattr(cs, "Delta_lo", None) is not None:
        ok = ok & np.isfinite(cs.Delta_lo).all((-3, -2, -1))
    return ok


def _margin_err(E, wz, az, d: int, e: int):
    """The rounding bound of a computed margin m^_k = fl(D_k^T W z_k) (module docstring):
    err_k = 1.01 gamma_{d+e+2} E_k + eta (d+e+2)(d e + 1)(1 + wz + az), with E_k = |D_k|^T
    |W| |z_k|, wz = sum_cf |W_cf| |z_f| and az = sum_f |z_f| (the underflow term, per
    sequence); arrays broadcast. The one formula of :func:`margin_enclosure` and
    :func:`prove_unit_margins`."""
    n = d + e + 2
    return 1.01 * gamma(n) * E + ETA * n * (d * e + 1) * (1.0 + wz + az)


def margin_enclosure(cs, W: np.ndarray):
    """(m^, err): computed margins m^ (B, n, T) of answers W (B, d, e) (finite) and the
    rigorous bound err with |m_k(W) - m^_k| <= err_k for the exact constraint data
    (module docstring; data that may have lost bits to scaling, ``data_err`` = e_D > 0,
    adds e_D (sum_cf |W_cf| |z_f| + sum_cf |Delta_c| |W_cf| + e_D sum |W|), the change of
    m_k under entry perturbations of at most e_D); inf where invalid."""
    d, e = cs.d, cs.e
    eD = _data_err(cs)[:, None, None]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        bs, (n_, T_) = cs.batch_shape, cs.shape
        Dr = cs.Delta.reshape(bs + (n_ * T_, d))  # (one product per problem: its n T rows)
        Z = cs.Z
        m = np.einsum("...nte,...ne->...nt", (Dr @ W).reshape(bs + (n_, T_, e)), Z)
        aW = np.abs(W)
        aZ = np.abs(Z)
        DW = _abs_matmul(Dr, aW).reshape(bs + (n_, T_, e))  # (B, n, T, e) |Delta| |W|
        E = np.einsum("...nte,...ne->...nt", DW, aZ)
        wz = (aW @ np.swapaxes(aZ, -1, -2)).sum(-2)[..., :, None]  # sum_cf |W_cf| |z_f|
        err = _margin_err(E, wz, aZ.sum(-1)[..., :, None], d, e)
        if eD.any():
            err = err + (eD * (wz + DW.sum(-1) + eD * aW.sum((-2, -1))[:, None, None])
                         * (1 + 1e-8))
        m = np.where(cs.valid, m, 0.0)  # (cs.margins(W), the same sums)
    return m, np.where(cs.valid, err, np.inf)


def prove_unit_margins(D: np.ndarray, Z: np.ndarray, valid: np.ndarray, W: np.ndarray) -> bool:
    """:func:`prove_margins` (``exact`` False) of ONE problem whose constraints are all
    inequalities m_k(W) = D_k^T W z_k >= 1 on exactly held data (``Delta_lo`` None, no
    ``data_err``): D (n, T, d), Z (n, e), valid (n, T), W (d, e).  The same bound as
    :func:`margin_enclosure` (err_k = 1.01 gamma_{d+e+2} E^_k + eta (d+e+2)(d e + 1)
    (1 + sum_cf |W_cf| |z_f| + sum_f |z_f|)) and the same comparison fl(m^_k - 1) >=
    fl(err_k SLACK), in 2-d products without the batch's bookkeeping (the small
    single-problem path, :func:`attnsvm.svm.lean.att_svm_lean`); tests hold it equal to
    :func:`prove_margins`."""
    n_, T_, d = D.shape
    e = Z.shape[1]
    if not np.isfinite(W).all():
        return False
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        Dr = D.reshape(n_ * T_, d)
        aW = np.abs(W)
        aZ = np.abs(Z)
        m = np.einsum("nte,ne->nt", (Dr @ W).reshape(n_, T_, e), Z)
        E = np.einsum("nte,ne->nt", (np.abs(Dr) @ aW).reshape(n_, T_, e), aZ)
        wz = (aW @ aZ.T).sum(0)  # (n,) sum_cf |W_cf| |z_f|
        err = _margin_err(E, wz[:, None], aZ.sum(1)[:, None], d, e)
        slack = m - 1.0
        ok = (slack >= err * SLACK) & ~np.isinf(slack)
    return bool((ok | ~valid).all())


def _abs_matmul(A: np.ndarray, C: np.ndarray, chunk: int = 64) -> np.ndarray:
    """|A| @ C for A (B, r, d), C (B, d, e) or (d, e), |A| formed chunk problems at a time in
    one small buffer (a full-size |A| is a large fresh allocation per call)."""
    if A.ndim != 3 or len(A) <= chunk or (C.ndim == 3 and len(C) != len(A)) or C.ndim > 3:
        return np.abs(A) @ C
    out = np.empty(A.shape[:2] + C.shape[-1:])
    buf = np.empty((chunk,) + A.shape[1:])
    for s in range(0, len(A), chunk):
        k = min(chunk, len(A) - s)
        np.abs(A[s:s + k], out=buf[:k])
        np.matmul(buf[:k], C[s:s + k] if C.ndim == 3 else C, out=out[s:s + k])
    return out


def _dyadic(a) -> tuple[list, int]:
    """Exact integers of float array ``a`` (finite): a = ints * 2^exp, ints a flat list of
    Python ints in C order, exp one common exponent."""
    a = np.asarray(a, float).ravel()
    mant, ex = np.frexp(a)
    mi = (mant * 2.0 ** 53).astype(np.int64)  # exact (53-bit mantissas, subnormals too)
    ee = ex.astype(np.int64) - 53
    nz = mi != 0
    e0 = int(ee[nz].min()) if nz.any() else 0
    sh = np.where(nz, ee - e0, 0).tolist()
    return [x << s if x else 0 for x, s in zip(mi.tolist(), sh)], e0


def _exact_delta(cs, b, idx):
    """The exact differences of constraints idx (list of (i, t)) of problem b as (rows of
    ints (K, d), exponent)."""
    D = cs.Delta[b][tuple(np.array(idx).T)] if idx else np.zeros((0, cs.d))
    lo = (np.zeros_like(D) if getattr(cs, "Delta_lo", None) is None
          else cs.Delta_lo[b][tuple(np.array(idx).T)])
    ints, e0 = _dyadic(np.concatenate([D.ravel(), lo.ravel()]))
    h = len(ints) // 2
    rows = np.array([x + y for x, y in zip(ints[:h], ints[h:])], dtype=object)
    return rows.reshape(len(idx), cs.d), e0


def _ge(x: int, ex: int, y: int, ey: int) -> bool:
    """x 2^ex >= y 2^ey exactly."""
    if ex >= ey:
        return (x << (ex - ey)) >= y
    return x >= (y << (ey - ex))


def exact_margins(cs, b: int, W: np.ndarray, idx) -> list[Fraction]:
    """m_k(W) of constraints idx ((i, t) pairs) of problem b, exactly, as Fractions (the
    exact differences Delta + Delta_lo, the float W and z taken as the rationals they are)."""
    Dr, eD = _exact_delta(cs, b, idx)
    wi, eW = _dyadic(W)
    Wm = np.array(wi, dtype=object).reshape(cs.d, cs.e)
    zi, eZ = _dyadic(cs.Z[b])
    Zm = np.array(zi, dtype=object).reshape(-1, cs.e)
    rows = Zm[[i for i, _ in idx]] if idx else np.zeros((0, cs.e), object)
    m = ((Dr @ Wm) * rows).sum(-1) if idx else []
    scale = Fraction(2) ** (eD + eW + eZ)
    return [Fraction(int(x)) * scale for x in m]


def prove_margins(cs, W: np.ndarray, has: np.ndarray | None = None, *,
                  exact: bool = True, positive: bool = False) -> np.ndarray:
    """(B,) bool: every valid inequality k of problem b has m_k(W_b) >= b_k EXACTLY
    (rounding-error bound, undecided constraints in exact arithmetic unless ``exact`` is
    False: then they count as not proven).  Equalities are not examined here, nor, with
    ``positive``, inequalities with b_k <= 0.  W (B, d, e); ``has``: rows that are
    answers (others: False)."""
    W = np.asarray(W, float)
    fin = np.isfinite(W).all((-2, -1))
    has = fin if has is None else has & fin
    Wz = W if has.all() else np.where(has[:, None, None], W, 0.0)
    m, err = margin_enclosure(cs, Wz)
    ineq = cs.ineq & (cs.b > 0) if positive else cs.ineq
    with np.errstate(invalid="ignore", over="ignore"):
        slack = m - cs.b
        thr = err * SLACK
        ok_k = slack >= thr  # (False where either is NaN, or thr inf but slack finite)
        ok_k &= np.isfinite(slack)  # (inf >= inf: no proof)
        ok_k |= ~ineq
        if (cs.b <= 0).any():  # W = 0 exactly: every margin is exactly 0
            zero = (Wz == 0).all((-2, -1))
            ok_k |= zero[:, None, None] & (cs.b <= 0)
        # undecided: the bound neither proves nor refutes (|slack| < 2 err)
        und = ineq & ~ok_k & (np.abs(slack) < thr) & np.isfinite(err)
    ok = has
    und &= (ok & _exact_data(cs))[:, None, None]
    if exact and und.sum() <= MAX_EXACT:
        for b in np.nonzero(und.any((1, 2)))[0]:
            idx = [tuple(int(v) for v in p) for p in np.argwhere(und[b])]
            for (i, t), mk in zip(idx, exact_margins(cs, b, Wz[b], idx)):
                ok_k[b, i, t] = mk >= Fraction(float(cs.b[b, i, t]))
    return ok & ok_k.all((-2, -1))


def prove_feasible(cs, W: np.ndarray, lam: np.ndarray, has: np.ndarray):
    """(W', lam', proven (B,)): answers whose inequality margins with b_k > 0 are all
    proven >= b_k (:func:`prove_margins`); an answer that misses by rounding only (every
    such margin within MAX_BUMP of b_k relative) is scaled up by the smallest factor 1 + s
    that the bound then proves (s <= MAX_BUMP; lam along, so that S(lam) stays in
    ||W|| d||W||), unless an equality with b != 0 fixes the scale.  Inequalities with
    b_k <= 0 (the relaxed problem's m_k >= 0, met with equality at its optimum) are, like
    equalities, left to the caller's stated tolerance: an active one cannot in general be
    met exactly in floating point, and scaling does not move it."""
    W = np.asarray(W, float)
    proven = prove_margins(cs, W, has, positive=True)
    redo = has & ~proven
    if cs.eq is not None:
        redo &= ~(cs.eqmask & (cs.b != 0)).any((1, 2))
    if not redo.any():
        return W, lam, proven
    ix = np.nonzero(redo)[0]
    sub = cs.take(ix)
    Wr = W[ix]
    m, err = margin_enclosure(sub, Wr)
    pos = sub.ineq & (sub.b > 0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        need = np.where(pos, (sub.b + 2.0 * err - m) / np.where(pos, sub.b, 1.0), -np.inf)
        s = np.maximum(need.max((1, 2)), 0.0) * 2.0 + 8.0 * U
    fixable = np.isfinite(s) & (s <= MAX_BUMP)
    if not fixable.any():
        return W, lam, proven
    ix, s = ix[fixable], s[fixable]
    Wn = W[ix] * (1.0 + s)[:, None, None]
    ok = prove_margins(cs.take(ix), Wn, np.ones(len(ix), bool), positive=True)
    if ok.any():
        W = W.copy()
        lam = np.array(lam, dtype=float, copy=True)
        ix, s = ix[ok], s[ok]
        W[ix] = Wn[ok]
        lam[ix] = lam[ix] * (1.0 + s)[:, None, None]
        proven = proven.copy()
        proven[ix] = True
    return W, lam, proven


# ------------------------------------------------------------------------ Farkas
def _null_space(M: list[list[int]], ncol: int) -> list[list[Fraction]]:
    """A basis of the rational null space {x : M x = 0} of an integer matrix (rows of
    Python ints), by fraction-free Gaussian elimination (rows kept primitive by their gcd)
    to reduced echelon form."""
    from math import gcd

    rows = [r[:] for r in M if any(r)]
    piv = []
    r0 = 0
    for c in range(ncol):
        p = next((i for i in range(r0, len(rows)) if rows[i][c] != 0), None)
        if p is None:
            continue
        rows[r0], rows[p] = rows[p], rows[r0]
        pr = rows[r0]
        for i in range(len(rows)):
            if i != r0 and rows[i][c] != 0:
                f, g = rows[i][c], pr[c]
                new = [g * x - f * y for x, y in zip(rows[i], pr)]
                h = 0
                for x in new:
                    h = gcd(h, x)
                rows[i] = [x // h for x in new] if h > 1 else new
        piv.append(c)
        r0 += 1
        if r0 == len(rows):
            break
    free = [c for c in range(ncol) if c not in piv]
    basis = []
    for f in free:
        x = [Fraction(0)] * ncol
        x[f] = Fraction(1)
        for j, c in enumerate(piv):
            x[c] = Fraction(-rows[j][f], rows[j][c])
        basis.append(x)
    return basis


def _valid_lam(lam, valid) -> np.ndarray:
    """np.where(valid, np.nan_to_num(lam), 0.0) (lam as float64), the same bits; where
    every entry is finite (the usual case) without nan_to_num's passes over lam, which
    then returns a plain copy."""
    lam = np.asarray(lam, float)
    if not np.isfinite(lam).all():
        lam = np.nan_to_num(lam)
    return np.where(valid, lam, 0.0)


def _farkas_one(cs, b: int, lam: np.ndarray):
    """Exact Farkas check of problem b for candidate lam (n, T): the exact multipliers
    (dict (i, t) -> Fraction, normalised to sum lam b = 1) or None."""
    valid, ineq = cs.valid[b], cs.ineq[b]
    lam = np.where(valid, np.nan_to_num(np.asarray(lam, float)), 0.0)
    a = np.abs(lam)
    mx = a.max() if a.size else 0.0
    if not mx > 0:
        return None
    tries = [np.argwhere(lam != 0), np.argwhere(a > 1e-9 * mx)]
    for k, supp in enumerate(tries):
        idx = [tuple(int(v) for v in p) for p in supp]
        if not idx or len(idx) > MAX_SUPPORT:
            continue
        Dr, eD = _exact_delta(cs, b, idx)
        zi, eZ = _dyadic(cs.Z[b])
        Zm = np.array(zi, dtype=object).reshape(-1, cs.e)
        Zr = Zm[[i for i, _ in idx]]
        # columns vec(A_k) = vec(Delta_k z_k^T) (one common exponent eD + eZ)
        A = (Dr[:, :, None] * Zr[:, None, :]).reshape(len(idx), -1)
        if k == 0:  # the candidate as given: S = sum lam_k A_k exactly
            li, el = _dyadic(lam[tuple(np.array(idx).T)])
            S = (np.array(li, dtype=object)[:, None] * A).sum(0)
            if all(x == 0 for x in S):
                cand = [Fraction(x) * Fraction(2) ** el for x in li]
            else:
                continue
        else:
            basis = _null_space(A.T.tolist(), len(idx))
            if not basis:
                continue
            if len(basis) == 1:
                cand = basis[0]
            else:  # the exact null vector nearest (least squares) to the candidate
                N = np.array([[float(x) for x in v] for v in basis]).T
                coef, *_ = np.linalg.lstsq(N, lam[tuple(np.array(idx).T)], rcond=None)
                if not np.isfinite(coef).all():
                    continue
                cand = [sum(Fraction(float(c)) * v[j] for c, v in zip(coef, basis))
                        for j in range(len(idx))]
        sb = sum(c * Fraction(float(cs.b[b][p])) for c, p in zip(cand, idx))
        if sb == 0:
            continue
        if sb < 0:  # (a null vector of the matrices: either sign)
            cand, sb = [-c for c in cand], -sb
        if all(c >= 0 for c, p in zip(cand, idx) if ineq[p]):
            return {p: c / sb for c, p in zip(cand, idx)}
    return None


def farkas_enclosure(cs, lam: np.ndarray, which: np.ndarray | None = None) -> np.ndarray:
    """Farkas certificates proven in floating point with rigorous error bounds, vectorised
    over the batch, for the generic case: a candidate lam >= 0 (inequalities only) whose
    support K holds at least d e + 1 constraints whose matrices span R^{d x e}.

    Let M (p x |K|, p = d e) hold the exact vec(A_k), k in K, r = M lam_K (exact) and
    G = M M^T.  If G is positive definite, lam* = lam_K - M^T G^{-1} r satisfies
    M lam* = 0 exactly, and ||lam* - lam_K||_2^2 = r^T G^{-1} r <= ||r||^2 / lambda_min(G)
    =: delta^2.  So when delta < min_K lam_k and sum_K lam_k b_k > ||b_K||_2 delta, the
    real vector lam* >= 0 with sum lam*_k b_k > 0 and sum lam*_k A_k = 0 exists: a Farkas
    certificate (its existence is the proof; it need not be computed).  The bounds:
    ||r|| <= ||r^|| + ||1.01 gamma_{|K|+4} |M^| lam||  (r^ = M^ lam computed, M^ the
    computed products Delta z^T; the exact A_k = (Delta + Delta_lo) z^T, |Delta_lo| <=
    u |Delta|), |G - G^| <= 1.01 gamma_{|K|+6} |M^| |M^|^T, and for the floating-point
    Cholesky factor L of G^ - t I (t = half the smallest computed eigenvalue), which exists
    only if it runs to completion, L L^T = G^ - t I + F with |F| <= gamma_{p+1} |L| |L|^T
    (Higham, Theorem 10.3), so lambda_min(G) >= t - ||gamma_{p+1} |L||L|^T||_F
    - u max_i |G^_ii - t| - ||G - G^||_F (the last subtraction's rounding: a factor
    1 - 4u); gradual underflow adds eta / 2 per product (terms eta (sum lam + K + 1) to r
    and eta p K (2 max |M| + 2) to G, so the bounds hold in the caller's units too, and
    ``data_err`` terms where bits may be lost); every norm is inflated by 1 + 1e-8 against its own rounding (p <= 1e6).
    Returns ok (B,) bool (False where this route does not apply: :func:`farkas_exact`
    decides those)."""
    B = cs.batch_shape[0]
    ok = np.zeros(B, bool)
    which = np.ones(B, bool) if which is None else np.asarray(which, bool)
    lam = _valid_lam(lam, cs.valid)
    p = cs.d * cs.e
    mx = np.abs(lam).max((1, 2))
    supp = cs.valid & (lam > 1e-9 * mx[:, None, None]) & (mx[:, None, None] > 0)
    k = supp.sum((1, 2))
    cand = (which & (k >= p + 1) & (k <= MAX_SUPPORT)
            & np.where(cs.ineq, lam >= 0, lam == 0).all((1, 2)) & ~(supp & ~cs.ineq).any((1, 2)))
    ix = np.nonzero(cand)[0]
    if not len(ix):
        return ok
    K = int(k[ix].max())
    flat = supp[ix].reshape(len(ix), -1)
    if (k[ix] == K).all():  # every support of size K: its positions in ascending order
        order = np.nonzero(flat)[1].reshape(len(ix), K)
        km = np.ones((len(ix), K), bool)
    else:
        order = np.argsort(~flat, axis=1, kind="stable")[:, :K]
        km = np.take_along_axis(flat, order, 1)  # (b', K) the support, padded
    n, T = cs.shape
    fk = ix[:, None] * (n * T) + order  # flat (problem, i, t) indices of the support
    fi = ix[:, None] * n + order // T  # flat (problem, i)
    Dk = np.take(cs.Delta.reshape(-1, cs.d), fk, axis=0)  # (b', K, d)
    Zk = np.take(cs.Z.reshape(-1, cs.e), fi, axis=0)  # (b', K, e)
    if not km.all():  # (padding: zero rows)
        Dk, Zk = Dk * km[..., None], Zk * km[..., None]
    lk = np.where(km, lam.reshape(-1)[fk], 0.0)
    bk = np.where(km, np.asarray(cs.b, float).reshape(-1)[fk], 0.0)
    with np.errstate(all="ignore"):
        M = np.einsum("bkd,bke->bdek", Dk, Zk).reshape(len(ix), p, K)
        aM = np.abs(M)
        r = np.einsum("bpk,bk->bp", M, lk)
        er = 1.01 * gamma(K + 4) * np.einsum("bpk,bk->bp", aM, lk)
        # data that may have lost bits (data_err e_D, entries |Delta|, |z| <= 1): each
        # entry of M moves by at most 3 e_D, so r by 3 e_D sum lam and G by 8 e_D K each
        eD = _data_err(cs)[ix]
        er = er + 3.0 * eD[:, None] * lk.sum(1)[:, None]
        # gradual underflow (any units): <= eta / 2 per product, in M^ and in lam M^
        er = er + ETA * (lk.sum(1) + K + 1)[:, None] * (1 + 1e-8)
        nr = (np.linalg.norm(r, axis=1) + np.linalg.norm(er, axis=1)) * (1 + 1e-8)
        G = M @ np.swapaxes(M, 1, 2)
        eG = (1.01 * gamma(K + 6) * _fro(aM @ np.swapaxes(aM, 1, 2))
              + 8.0 * eD * K * p + ETA * p * K * (2 * aM.max((1, 2)) + 2))  # (underflow)
        # t: half an estimate of lambda_min(G^) (1 / ||L0^-1||_F^2 <= lambda_min, L0 the
        # Cholesky factor of G^ itself); only the second factorisation, of G^ - t I, is
        # part of the proof
        fin = np.isfinite(G)
        try:  # (an estimate only: LAPACK, batched; the proof's factorisation is below)
            L0, good = np.linalg.cholesky(np.where(fin, G, 0.0)), np.ones(len(ix), bool)
        except np.linalg.LinAlgError:
            L0, good = _cholesky(G)
        good &= fin.all((1, 2))
        Li = _tri_inv(L0 if good.all() else np.where(good[:, None, None], L0, np.eye(p)))
        t = 0.5 / np.einsum("bij,bij->b", Li, Li)
        good &= np.isfinite(t) & (t > 0)
        A = G - np.where(good, t, 0.0)[:, None, None] * np.eye(p)
        L, good2 = _cholesky(A)
        good &= good2
        aL = np.abs(L)
        eC = gamma(p + 1) * _fro(aL @ np.swapaxes(aL, 1, 2)) * (1 + 1e-8)
        eA = U * np.abs(np.diagonal(A, axis1=1, axis2=2)).max(1) * (1 + 1e-8)  # G^_ii - t
        lmin = np.where(good, (t - eC - eA - eG * (1 + 1e-8)) * (1 - 4 * U), -np.inf)
        pos = lmin > 0
        delta = np.where(pos, nr / np.sqrt(np.where(pos, lmin, 1.0)) * (1 + 1e-8), np.inf)
        lo = np.where(km, lk, np.inf).min(1)
        sb = (lk * bk).sum(1) * (1 - gamma(K + 1))
        ok[ix] = pos & (delta < lo * (1 - 1e-8)) & (sb > np.linalg.norm(bk, axis=1) * delta
                                                    * (1 + 1e-8))
    return ok


def farkas_enclosure_compiled(K, cs, lam: np.ndarray, which: np.ndarray | None = None,
                              numbers: bool = False):
    """:func:`farkas_enclosure` by its compiled twin
    (:func:`attnsvm.svm._active_kernels.farkas_enclosure_batch`, ``K`` the kernel module):
    the same candidates, bounds and proof, each problem in one compiled pass (the
    reference's ~60 vectorised numpy calls cost ~15 us per problem of 10 unknowns); held
    equal to it by tests/test_svm_formulas.py.  Returns ok (B,) bool, and with
    ``numbers`` also (B, 4): lambda_min's bound, delta, min lam_K, sum lam_K b_K
    (1 - gamma_{K+1}) (NaN where not a candidate)."""
    B = cs.batch_shape[0]
    n, T = cs.shape
    c = np.ascontiguousarray
    which = np.ones(B, bool) if which is None else np.asarray(which, bool)
    valid = c(np.broadcast_to(cs.valid, (B, n, T)))
    lam = c(_valid_lam(lam, valid))
    supp = np.empty((B, n, T), bool)
    k = np.empty(B, np.int64)
    K._enclosure_support(lam, valid, c(np.broadcast_to(cs.ineq, (B, n, T))), c(which),
                         cs.d * cs.e, MAX_SUPPORT, supp, k)
    ok = np.zeros(B, bool)
    out = np.full((B, 4), np.nan)
    if (k >= 0).any():
        K.farkas_enclosure_batch(
            c(np.broadcast_to(cs.Delta, (B, n, T, cs.d)), dtype=float),
            c(np.broadcast_to(cs.Z, (B, n, cs.e)), dtype=float), lam,
            c(np.broadcast_to(np.asarray(cs.b, float), (B, n, T))),
            c(np.broadcast_to(_data_err(cs), (B,)), dtype=float), supp, k, int(k.max()),
            ok, out)
    return (ok, out) if numbers else ok


def _fro(A: np.ndarray) -> np.ndarray:
    """||A_b||_F of a stack (B, p, q), one pass (sqrt of the sum of squares; its rounding,
    a relative O((p q) u), is covered by the 1 + 1e-8 of the bounds that use it)."""
    return np.sqrt(np.einsum("bij,bij->b", A, A))


def _tri_inv(L: np.ndarray) -> np.ndarray:
    """L^-1 of a stack of lower-triangular matrices (B, p, p) by forward substitution,
    row by row (an estimate's ingredient: np.linalg.inv is ~5x slower on small stacks),
    on the batch-last layout (p, p, B) (every step a contiguous elementwise pass; row j
    of L^-1 is 0 right of its diagonal, so only its first j + 1 entries are formed)."""
    B, p, _ = L.shape
    Lt = np.ascontiguousarray(L.transpose(1, 2, 0))
    Li = np.zeros_like(Lt)
    with np.errstate(all="ignore"):
        for j in range(p):
            Li[j, :j] = -(Lt[j, :j, None, :] * Li[:j, :j, :]).sum(0) / Lt[j, j]  # (j, B)
            Li[j, j] = 1.0 / Lt[j, j]
    return Li.transpose(2, 0, 1)


def _cholesky(A: np.ndarray):
    """(L, ok): the Cholesky factors L L^T = A of a stack A (B, p, p), by the standard
    column algorithm in floating point, vectorised over the batch (r_jj = sqrt(a_jj -
    sum_k r_jk^2), r_ij = (a_ij - sum_k r_ik r_jk) / r_jj: the algorithm of Higham's
    Theorem 10.3, its inner products in any order); ok where it runs to completion
    (every pivot > 0), L finite garbage elsewhere.  (Computed on the batch-last layout
    (p, p, B): every step a contiguous elementwise pass.)  The one hand-written Cholesky
    routine of :mod:`attnsvm.svm` (elsewhere LAPACK's ``np.linalg.cholesky``); its compiled
    twin :func:`attnsvm.svm._nuc_kernels._chol` is held equal to it by
    tests/test_svm_formulas.py."""
    B, p, _ = A.shape
    At = np.ascontiguousarray(A.transpose(1, 2, 0))
    L = np.zeros_like(At)
    with np.errstate(all="ignore"):
        ok = np.isfinite(At).all((0, 1))
        for j in range(p):
            Lj = L[j, :j]  # (j, B)
            s = At[j, j] - (Lj * Lj).sum(0)
            ok &= s > 0
            dj = np.sqrt(np.where(ok, s, 1.0))
            L[j, j] = dj
            if j + 1 < p:
                L[j + 1:, j] = (At[j + 1:, j] - (L[j + 1:, :j] * Lj).sum(1)) / dj
    L = L.transpose(2, 0, 1)
    return np.where(ok[:, None, None], L, np.eye(p)), ok


def farkas_prove(cs, lam: np.ndarray, which: np.ndarray | None = None, *, kernels=None):
    """(ok (B,), lam_out (B, n, T)): :func:`farkas_enclosure` (vectorised; lam_out the
    candidate, normalised to sum lam b = 1, whose support is that of the proven lam*; by
    its compiled twin :func:`farkas_enclosure_compiled` where ``kernels``, the compiled
    kernel module, is given), then :func:`farkas_exact` for the others (lam_out the exact
    multipliers)."""
    B = cs.batch_shape[0]
    which = np.ones(B, bool) if which is None else np.asarray(which, bool)
    lam = _valid_lam(lam, cs.valid)
    ok = (farkas_enclosure(cs, lam, which) if kernels is None else
          farkas_enclosure_compiled(kernels, cs, lam, which))
    with np.errstate(over="ignore", invalid="ignore"):
        lb = (lam * cs.b).sum((1, 2))
    out = np.where(ok[:, None, None], lam / np.where(ok & (lb > 0), lb, 1.0)[:, None, None],
                   0.0)
    rest = which & ~ok
    if rest.any():
        ok2, lx = farkas_exact(cs, lam, rest)
        ok |= ok2
        out = np.where(ok2[:, None, None], lx, out)
    return ok, out


def farkas_exact(cs, lam: np.ndarray, which: np.ndarray | None = None):
    """Exact Farkas verification (module docstring) of candidates lam (B, n, T), for the
    problems ``which`` (bool (B,); default all): (ok (B,) bool, lam_exact (B, n, T) the
    proven multipliers normalised to sum lam_k b_k = 1, rounded to float (0 elsewhere)).
    ok only where lam_exact >= 0 on inequalities, sum lam_k b_k = 1 > 0 and
    sum lam_k A_k = 0 hold in exact arithmetic on the exact constraint data."""
    B = cs.batch_shape[0]
    ok = np.zeros(B, bool)
    out = np.zeros(cs.valid.shape)
    which = np.ones(B, bool) if which is None else np.asarray(which, bool)
    exact = _exact_data(cs)
    for b in np.nonzero(which & exact)[0]:
        r = _farkas_one(cs, int(b), lam[b])
        if r is not None:
            ok[b] = True
            for (i, t), c in r.items():
                out[b, i, t] = float(c)
    return ok, out


FEAS_TOL = 1e-9  # equality constraints, and inequalities with b_k <= 0 (relaxed problem):
# violation / max(1, |b_k|) of a feasible answer (a stated tolerance; inequalities with
# b_k > 0 are proven exactly, certificate.prove_feasible)
GAP_OPTIMAL = 1e-6  # certified relative duality gap of an "optimal" answer
GAP_INACCURATE = 1e-3  # ... of an "optimal_inaccurate" one (larger: "suboptimal")


def verdict(feasible, gap, infeasible, gap_optimal: float = GAP_OPTIMAL) -> np.ndarray:
    """THE status rule, from proven numbers only (arrays broadcast; an object array of
    str): where ``feasible`` (a proven feasible answer), "optimal" for gap <=
    ``gap_optimal`` (GAP_OPTIMAL; the Graph-SVM's proven gap: its GAP_GRAPH),
    "optimal_inaccurate" for gap <= GAP_INACCURATE, else "suboptimal" (a NaN gap too);
    elsewhere "infeasible" where ``infeasible`` (a proven Farkas certificate), else
    "uncertified".

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm.certificate import verdict
        >>> verdict(np.array([True, True, False, False]), np.array([1e-9, 1e-2, np.nan, np.nan]),
        ...         np.array([False, False, True, False])).tolist()
        ['optimal', 'suboptimal', 'infeasible', 'uncertified']
    """
    code = np.where(feasible, np.where(gap <= gap_optimal, 0,
                                       np.where(gap <= GAP_INACCURATE, 1, 2)),
                    np.where(infeasible, 3, 4))
    return _VERDICTS[code.ravel()].reshape(code.shape)  # (one lookup: no str array)


_VERDICTS = np.array(["optimal", "optimal_inaccurate", "suboptimal", "infeasible",
                      "uncertified"], dtype=object)  # verdict's statuses, by its codes


# ---------------------------------------------------------------------- certificate
@dataclass
class Certificate:
    """The certificate of B candidate answers (all arrays over the batch, normalised units).

    W (B, d, e) the answer (NaN rows: none), lam (B, n, T) multipliers of
    min 1/2||W||^2 (0 where none), margins (B, n, T), norm, margin, violation, kkt, gap,
    lower (lb) (B,), feasible (B,) bool, support (B, n, T) bool; ``proven``: a proof
    part's further proven numbers by name, each (B,) (:class:`ForestProof`: norm_hi,
    eq_shift, feas_margin, upper), empty for the plain certificate.
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
    proven: dict = field(default_factory=dict)

    def take(self, idx) -> Certificate:
        """The certificates of the problems ``idx`` (every field indexed by ``idx``)."""
        out = {k: getattr(self, k)[idx] for k in self.__dataclass_fields__ if k != "proven"}
        return Certificate(**out, proven={k: v[idx] for k, v in self.proven.items()})

    def put(self, idx, other: Certificate) -> None:
        """Write ``other``'s fields into the problems ``idx`` of this certificate (in place)."""
        for k in self.__dataclass_fields__:
            if k != "proven":
                getattr(self, k)[idx] = getattr(other, k)
        for k, v in other.proven.items():
            self.proven[k][idx] = v


def fro_norm(A: np.ndarray) -> np.ndarray:
    """||A||_F over the last two dims (finite A), shape A.shape[:-2]: m ||A / m||_F with
    m = max |A| per item (no overflow or underflow in the squares; 0 for A = 0), as
    :meth:`attnsvm.norms.Norm.value` computes it.  The one scale-safe Frobenius norm of
    :mod:`attnsvm.svm` (no compiled twin); the computed value is the exact one to
    gamma_{size + 4} (a sum of squares in any order, Higham §3.1, plus the scalings)."""
    if A.size == 0:
        return np.zeros(A.shape[:-2])
    m = np.abs(A).max((-2, -1))
    A1 = A / np.where(m > 0, m, 1.0)[..., None, None]
    return m * np.sqrt(np.einsum("...ij,...ij->...", A1, A1))


def fro_sums(Delta, Z, valid, b, W, lam):
    """The Frobenius certificate's per-problem numbers (inequalities only), from the answers
    W (B, d, e) (finite) and multipliers lam (B, n, T) (>= 0, 0 where invalid) on every
    constraint of Delta (B, n, T, d) (0 where invalid), Z (B, n, e), valid, b (B, n, T)
    (None: b_k = 1 on every valid constraint, the same numbers in fewer passes: x / 1 = x
    and x 1 = x exactly; lam must then be 0 where invalid), in one vectorised numpy pass
    (the formulas of :func:`certify`):

        m_k = Delta_k^T W z_k,  S = sum_k lam_k Delta_k z_k^T,
        margin = min_{b_k > 0} m_k / b_k,  violation = max_k (b_k - m_k)^+ / max(1, |b_k|),
        ||W||_F, ||S||_F (scale-safe, :func:`fro_norm`; inf where S is not finite),
        sum_k lam_k b_k, ||W - S||_F, max_k |lam_k (m_k - b_k)|.

    Returns (m (B, n, T), S (B, d, e), margin, violation, ||W||, ||S||, lb_num, ||W - S||,
    comp), each (B,).  Each problem's numbers are computed alone (per-problem products),
    so they do not depend on the batch they came in."""
    bs, (n, T, d) = Delta.shape[:-3], Delta.shape[-3:]
    e = Z.shape[-1]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        DW = (Delta.reshape(bs + (n * T, d)) @ W).reshape(bs + (n, T, e))
        m = np.where(valid, np.einsum("...nte,...ne->...nt", DW, Z), 0.0)
        if b is None:  # b_k = 1: the formulas below with b = 1, the same bits (the largest
            # fl(1 - m_k) is fl(1 - min_k m_k): rounding is monotone)
            margin = np.where(valid, m, np.inf).min((-2, -1))
            viol = np.maximum(1.0 - margin, 0.0)
            r = m - 1.0
            lb_num = lam.sum((-2, -1))
        else:
            lam = np.where(valid, lam, 0.0)
            pos = valid & (b > 0)
            margin = np.where(pos, m / np.where(pos, b, 1.0), np.inf).min((-2, -1))
            viol = np.where(valid, np.maximum(b - m, 0.0) / np.maximum(1.0, np.abs(b)),
                            0.0).max((-2, -1))
            lb_num = (lam * b).sum((-2, -1))
            r = m - b
        comp = np.abs(lam * r).max((-2, -1))  # (0 where invalid: lam = 0, m = 0, b finite)
        u = np.einsum("...it,...itd->...id", lam, Delta)
        S = np.swapaxes(u, -1, -2) @ Z
        nrm = fro_norm(W)
        fin = np.isfinite(S).all((-2, -1))
        dn = fro_norm(S) if fin.all() else np.where(
            fin, fro_norm(np.where(fin[..., None, None], S, 0.0)), np.inf)
        R = W - S
        wms = np.sqrt(np.einsum("...ij,...ij->...", R, R))
    return m, S, margin, viol, nrm, dn, lb_num, wms, comp


def _fro_sums(cs, Wz: np.ndarray, lam: np.ndarray):
    """:func:`fro_sums` of the batched set ``cs`` (inequalities only)."""
    return fro_sums(cs.Delta, cs.Z, cs.valid, cs.b, Wz, lam)


def certify(cs, W: np.ndarray, lam: np.ndarray | None, N,
            tol_active: float = 1e-6, *, proof: ForestProof | None = None) -> Certificate:
    """THE certificate of answers ``W`` (B, d, e) with multipliers ``lam`` (B, n, T) for the
    batched constraint set ``cs`` (normalised), computed on ALL constraints, vectorised.

    Rows of W that are not finite mean "no answer" (feasible False, numbers NaN).  ``lam``
    may be None (then only the primal numbers are reported; gap and kkt are NaN).
    See the module docstring for the formulas.  ``N``: the :class:`~attnsvm.norms.Norm`
    (converted once, at the caller's door).  ``proof``: the problem's own proof part, an
    object with ``certificate(cs, W, lam, tol_active) -> Certificate`` and ``gap_optimal``
    (:class:`ForestProof`: the Graph-SVM's tie rows), which proves the equality rows and
    the gap as well (then the status is :func:`verdict` with its ``gap_optimal``).
    """
    if proof is not None:  # the part computes the certificate with its own proofs
        return proof.certificate(cs, W, lam, tol_active)
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
    fro = N.euclidean  # the Frobenius norm (self-dual) in numpy, no torch round trip
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        bs = np.maximum(1.0, np.abs(b))
        sums = _fro_sums(cs, Wz, lam) if fro and cs.eq is None else None
        if sums is not None:  # the Frobenius numbers in one numpy pass (fro_sums)
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
            nrm = fro_norm(Wz) if fro else np.asarray(N.value(Wz, vector=False), dtype=float)
            S = cs.combine(lam)
            dn = (fro_norm(S) if fro and np.isfinite(S).all()
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


# ------------------------------- proven bounds of norms and eigenvalues (Graph-SVM proof)
def svd_bounds(A: np.ndarray):
    """(upper bound of ||A||_2, upper bound of ||A||_*, the computed singular values) for a
    float matrix A, from its computed SVD A ~ U diag(s) V^T: with R = A - U diag(s) V^T,
    ||A||_2 <= ||U||_2 ||V||_2 max s + ||R||_F and ||A||_* <= ||U||_2 ||V||_2 sum s +
    sqrt(rank bound) ||R||_F, where ||U||_2^2 <= 1 + ||U^T U - I||_F; every computed
    quantity carries its rounding bound (Higham §3.5: |fl(X Y) - X Y| <= gamma_n |X| |Y|,
    and || |X| |Y| ||_F <= ||X||_F ||Y||_F)."""
    d1, d2 = A.shape
    if not np.all(np.isfinite(A)):
        return np.inf, np.inf, np.zeros(0)
    try:
        Uu, s, Vt = np.linalg.svd(A, full_matrices=False)
    except np.linalg.LinAlgError:  # (no bound without a decomposition)
        return np.inf, np.inf, np.zeros(0)
    r = len(s)
    if r == 0:
        return 0.0, 0.0, s
    def orth_defect(G, Q):  # upper bound of ||Q^T Q - I||_F from G = fl(Q^T Q)
        n = Q.size // r
        fq = float(np.linalg.norm(Q)) ** 2 * (1 + gamma(Q.size + 2))  # >= ||Q||_F^2
        G.flat[::r + 1] -= 1.0
        err = gamma(n + 1) * (fq + np.sqrt(r))  # >= || gamma_n |Q|^T|Q| + u |I| ||_F
        return (float(np.linalg.norm(G)) * (1 + gamma(r * r + 2)) + err) * 1.0001, fq

    eu, _ = orth_defect(Uu.T @ Uu, Uu)
    ev, fv = orth_defect(Vt @ Vt.T, Vt)
    US = Uu * s
    rF = float(np.linalg.norm(A - US @ Vt)) * (1 + gamma(d1 * d2 + 2))
    # rounding of fl(A - US Vt): gamma_{r+2} |U||s| |Vt| + u |A|, in Frobenius norm
    rerr = (gamma(r + 2) * float(np.linalg.norm(US)) * np.sqrt(fv) * (1 + gamma(d1 * r + 2))
            + U * float(np.linalg.norm(A)) * (1 + gamma(d1 * d2 + 2)))
    rF = (rF + rerr * 1.0001) * 1.0001
    fac = np.sqrt((1 + eu) * (1 + ev)) * (1 + 4 * U)
    smax = float(s[0])
    s_sum = float(s.sum()) * (1 + gamma(r + 1))
    two = smax * fac * (1 + 4 * U) + rF
    nuc = s_sum * fac * (1 + 4 * U) + np.sqrt(min(d1, d2)) * rF * (1 + 4 * U)
    return float(two), float(nuc), s


def fro_upper(A: np.ndarray) -> float:
    """A proven upper bound of ||A||_F (float A): the computed :func:`fro_norm` times
    1 + gamma_{size + 4}."""
    return float(fro_norm(A)) * (1 + gamma(A.size + 4))


def lmin_lower(G: np.ndarray) -> float:
    """A proven lower bound of the smallest eigenvalue of the symmetric float matrix G
    (m, m) (0 where none > 0 is proven), from its computed eigendecomposition
    G ~ Q diag(w) Q^T: with R = G - Q diag(w) Q^T, lambda_min(G) >= min(w) (1 - ||Q^T Q -
    I||_F) - ||R||_F when min(w) >= 0 (x^T Q diag(w) Q^T x >= min(w) ||Q^T x||^2); every
    computed norm carries its rounding bound (Higham §3.5), as in :func:`svd_bounds`."""
    m = G.shape[0]
    if m == 0:
        return np.inf
    try:
        w, Q = np.linalg.eigh(G)
    except np.linalg.LinAlgError:  # (nothing proven)
        return 0.0
    if not (np.all(np.isfinite(w)) and w[0] > 0):
        return 0.0
    fq = float(np.linalg.norm(Q)) ** 2 * (1 + gamma(Q.size + 2))
    O = Q.T @ Q
    O.flat[::m + 1] -= 1.0
    eo = (float(np.linalg.norm(O)) * (1 + gamma(m * m + 2)) + gamma(m + 1) * (fq + np.sqrt(m)))
    QW = Q * w
    rF = float(np.linalg.norm(G - QW @ Q.T)) * (1 + gamma(m * m + 2))
    rerr = (gamma(m + 2) * float(np.linalg.norm(QW)) * np.sqrt(fq) * (1 + gamma(m * m + 2))
            + U * float(np.linalg.norm(G)) * (1 + gamma(m * m + 2)))
    lo = float(w[0]) * (1 - eo * 1.0001) * (1 - 4 * U) - (rF + rerr * 1.0001) * 1.0001
    return max(lo, 0.0)


@dataclass(frozen=True)
class NormBounds:
    """The proven bounds of one norm that the Graph-SVM's proof plugs in (the
    ``graph_bounds`` field of the norm's row of :data:`attnsvm.svm.strategy.STRATEGIES`):

    value(A) -> (a proven upper bound of ||A||, ||A|| as computed);
    dual(S) -> (a proven upper bound of ||S||_*, ||S||_* as computed);
    fro_factor(d) -> c with ||X|| <= c ||X||_F for every (d, d) X (the cost, in the norm,
    of a correction bounded in the Frobenius norm);
    self_dual: whether ||.||_* = ||.|| (stationarity is then W = sum lam_r A_r)."""

    value: Callable[[np.ndarray], tuple[float, float]]
    dual: Callable[[np.ndarray], tuple[float, float]]
    fro_factor: Callable[[int], float]
    self_dual: bool


def _fro_both(A: np.ndarray) -> tuple[float, float]:
    return fro_upper(A), float(fro_norm(A))


def _nuc_value(A: np.ndarray) -> tuple[float, float]:
    _, nuc, s = svd_bounds(A)
    return nuc, float(s.sum())


def _nuc_dual(A: np.ndarray) -> tuple[float, float]:
    two, _, s = svd_bounds(A)
    return two, float(s[0]) if s.size else 0.0


#: the Frobenius norm (self-dual) and the nuclear norm (dual: spectral; ||X||_* <=
#: sqrt(d) ||X||_F)
FRO_BOUNDS = NormBounds(_fro_both, _fro_both, lambda d: 1.0, True)
NUC_BOUNDS = NormBounds(_nuc_value, _nuc_dual, lambda d: np.sqrt(d) * (1 + 2 * U), False)


# ------------------------------------------- a proof part: equality rows by a spanning forest
TINY = 2.0 ** -1022  # the smallest normal float64
_SPLIT = 134217729.0  # 2^27 + 1 (Veltkamp's split)


def _two_prod(a: np.ndarray, b: np.ndarray):
    """(p, e): p = fl(a b), a b = p + e exactly (Dekker's TwoProduct by Veltkamp's split;
    no overflow: |a|, |b| < 2^996; exact unless an entry underflows)."""
    p = a * b
    c = _SPLIT * a
    ah = c - (c - a)
    al = a - ah
    c = _SPLIT * b
    bh = c - (c - b)
    bl = b - bh
    return p, al * bl - (((p - ah * bh) - al * bh) - ah * bl)


def margins_dot2(D: np.ndarray, lo: np.ndarray, W: np.ndarray, Z: np.ndarray):
    """(m, err) of m_r = (D_r + lo_r)^T W z_r (the exact difference E_y - E_j = D + lo,
    TwoSum) for a few rows D, lo (R, d), Z (R, e), W (d, e) (or (R, d, e): one per row),
    in twice the working precision
    (Ogita, Rump, Oishi, "Accurate sum and dot product", SIAM J. Sci. Comput. 26, 2005:
    TwoProduct terms, a cascade of TwoSums): |m - m_exact| <= err = u |m| + gamma_n sum
    |e_i| + u sum |pl W| + gamma_2 sum |lo z W| + underflow, every sum rounded upward.
    Where the bound of :func:`margin_enclosure` is too coarse: rows whose margin is a
    cancellation of large terms (near-collinear tokens, a large W)."""
    R, d = D.shape
    Wr = W[None] if W.ndim == 2 else W
    ph, pl = _two_prod(D[:, :, None], Z[:, None, :])  # D_a z_b = ph + pl
    h, l_ = _two_prod(ph, Wr)  # ph W_ab = h + l
    q = pl * Wr
    s = (lo[:, :, None] * Z[:, None, :]) * Wr
    x = np.concatenate([h.reshape(R, -1), l_.reshape(R, -1), q.reshape(R, -1),
                        s.reshape(R, -1)], axis=1)
    errs = []
    while x.shape[1] > 1:
        if x.shape[1] % 2:
            x = np.concatenate([x, np.zeros((R, 1))], axis=1)
        a, b = x[:, 0::2], x[:, 1::2]
        t = a + b
        bb = t - a
        errs.append((a - (t - bb)) + (b - bb))
        x = t
    e = np.concatenate(errs, axis=1) if errs else np.zeros((R, 1))
    ne = e.shape[1]
    m = x[:, 0] + e.sum(1)
    g = lambda n: gamma(n) * (1 + gamma(n + 2))  # noqa: E731 - with the sum's own rounding
    nw = W.shape[-2] * W.shape[-1]
    err = (U * np.abs(m) + g(ne) * np.abs(e).sum(1) * (1 + g(ne))
           + U * np.abs(q).reshape(R, -1).sum(1) * (1 + g(nw)) * (1 + 2 * U)
           + gamma(3) * np.abs(s).reshape(R, -1).sum(1) * (1 + g(nw)) + 64 * nw * TINY) * 1.0001
    return m, err


def tie_forest(k: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Positions of a spanning forest of tie rows (k, a, b) ("token a ties token b at query
    k"), per query: the rows joining tokens not yet joined in query k's tie graph
    (union-find).  Every other tie row (k, a, b) is EXACTLY the sum of the forest's rows
    along the path a .. b (the differences E_a - E_b telescope, z = E_k is shared), so W
    meets every tie row exactly iff it meets the forest's."""
    parent: dict = {}

    def find(x):
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    keep = []
    for r, (kk, aa, bb) in enumerate(zip(np.asarray(k).tolist(), np.asarray(a).tolist(),
                                         np.asarray(b).tolist())):
        ra, rb = find((kk, aa)), find((kk, bb))
        if ra != rb:
            parent[ra] = rb
            keep.append(r)
    return np.asarray(keep, dtype=np.int64)


def forest_sigma(D: np.ndarray, Z: np.ndarray) -> float:
    """A proven lower bound of the smallest singular value of the exact matrix M whose rows
    are vec(Delta_r z_r^T) (a vectorised (m, d e) matrix never formed: its Gram matrix
    M M^T = (Delta Delta^T) o (z z^T) is (m, m)), for rows D (m, d) = fl(exact Delta) with
    |exact - D| <= u |D| (one rounded difference) and Z (m, e) exact; 0 when their
    independence is not proven.  sigma_min(M) >= sqrt(lambda_min(fl(G))) - (rounding of G)
    - ||M - fl-parts||, with G's rounding gamma_{2d+1} (|D||D|^T o |z||z|^T) (Higham
    §3.5)."""
    m_, d = D.shape
    if m_ == 0:
        return np.inf
    if m_ == 1:  # one row: sigma = ||Delta_exact|| ||z|| >= (1 - u) ||Delta|| ||z||
        with np.errstate(over="ignore", under="ignore"):
            a, b = float(np.sqrt(D[0] @ D[0])), float(np.sqrt(Z[0] @ Z[0]))
        if 2.0 ** -400 < min(a, b) and max(a, b) < 2.0 ** 400:  # (no under/overflow)
            return a * b * (1 - gamma(d + 3)) * (1 - 4 * U)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        G = (D @ D.T) * (Z @ Z.T)
        aD, aZ = np.abs(D), np.abs(Z)
        errG = fro_upper((aD @ aD.T) * (aZ @ aZ.T)) * gamma(2 * d + 3) * 1.0001 \
            + 4 * m_ * d * TINY
        lam = lmin_lower(G) if np.all(np.isfinite(G)) else 0.0
        rn = np.sqrt((np.einsum("rd,rd->r", D, D) * np.einsum("rd,rd->r", Z, Z)).sum())
        lo_part = U * float(rn) * (1 + gamma(2 * d + 4)) * 1.0001  # ||M_exact - M_fl||_F
        s = np.sqrt(max(lam - errG, 0.0)) * (1 - 2 * U) - lo_part
    return float(s) if s > 0 and np.isfinite(s) else 0.0


@dataclass(frozen=True)
class ForestProof:
    """A proof part of :func:`certify` (its ``proof`` argument) for ONE problem whose
    inequality rows have b = 1 and whose equality rows are ties: row r = (k, a, b) says
    (E_a - E_b)^T W E_k = 0 (the Graph-SVM's rows, :func:`attnsvm.svm.graph.graph_svm`).
    With it, every number of the certificate is proven (the plain certificate meets
    equalities to FEAS_TOL only, and its gap is evaluated in floating point):

    * margins: :func:`margin_enclosure` (the one rounding bound), refined by
      :func:`margins_dot2` where that bound is coarse (err > 2^-40): proven m_lo <= m_r
      <= m_hi, so ``margin`` = min_ineq m_lo and ``violation`` = max(max_ineq (1 -
      m_lo)^+, max_eq max(|m_lo|, |m_hi|)) (proven upper bound);
    * a feasible point near W: every tie row is a sum of the rows of ``forest``
      (:func:`tie_forest`), whose exact matrix has smallest singular value >= ``sigma``
      (:func:`forest_sigma`), so an exact correction delta puts W + delta on every
      equality with ||delta||_F <= ||forest residuals|| / sigma (``eq_shift``); W + delta
      keeps inequality margins >= m_lo - ||A_r||_F ||delta||_F (``feas_margin``), and
      ``upper`` = (||W||^ + c ||delta||_F) / min(1, feas_margin) (c = bounds.fro_factor(d))
      bounds the norm of an exactly feasible point (inf where none is proven: then never
      'feasible');
    * weak duality: for lam >= 0 on inequalities (free on equalities), lb = sum_ineq lam /
      ||S||_*^ <= the optimal norm, S = sum_r lam_r A_r with its rounding bounded and
      ||S||_*^ the proven upper bound ``bounds.dual``;
    * ``gap`` = (upper - lb) / lb (:func:`proven_gap`), an upper bound of the relative
      suboptimality; the status is :func:`verdict` with ``gap_optimal``.

    ``forest`` (positions in the problem's flattened (n T) rows), ``sigma``, ``bounds``
    (the norm's :class:`NormBounds`), ``gap_optimal``.  Build it with :meth:`of`."""

    forest: np.ndarray
    sigma: float
    bounds: NormBounds
    gap_optimal: float = GAP_OPTIMAL

    @classmethod
    def of(cls, cs, k, a, b, bounds: NormBounds, gap_optimal: float = GAP_OPTIMAL):
        """The part of the (unbatched, or batch of one) constraint set ``cs`` whose flattened
        rows r carry the token ids k[r], a[r], b[r] (tie rows where ``cs.eqmask``):
        the forest of its tie rows and sigma of their data (cs.Delta = fl(E_a - E_b),
        cs.Z = E_k)."""
        eqm = np.asarray(cs.eqmask).reshape(-1)
        idx = np.nonzero(eqm)[0]
        f = idx[tie_forest(np.asarray(k)[idx], np.asarray(a)[idx], np.asarray(b)[idx])]
        if f.size == 0:
            return cls(f, np.inf, bounds, gap_optimal)
        D, Z = _flat_rows(cs)
        return cls(f, forest_sigma(D[f], Z[f]), bounds, gap_optimal)

    def certificate(self, cs, W: np.ndarray, lam: np.ndarray | None,
                    tol_active: float = 1e-6) -> Certificate:
        """The certificate of :func:`certify` with this part (:func:`_certify_forest`)."""
        return _certify_forest(cs, W, lam, tol_active, self)


def _flat_rows(cs):
    """(D (n T, d), Z (n T, e)) of a problem of one (an unbatched set or a batch of one)."""
    n_, T_ = cs.shape
    D = cs.Delta.reshape(n_ * T_, cs.d)
    Z = cs.Z.reshape(n_, cs.e)
    return D, (Z if T_ == 1 else np.repeat(Z, T_, axis=0))


def proven_gap(upper: float, norm_hi: float, lb: float, need: bool) -> float:
    """The proven relative gap (upper - lb) / lb of :class:`ForestProof` (``upper`` a proven
    bound of the norm of a feasible point, ``lb`` a proven lower bound of the optimal
    norm; rounded upward); without a needed margin (no inequality) 0 for W = 0, else inf."""
    if not need:
        return 0.0 if norm_hi == 0 else np.inf
    if lb > 0 and np.isfinite(upper):
        return float(max(upper - lb, 0.0) / lb * (1 + 4 * U) + 4 * U * upper / lb)
    return np.inf


def _forest_primal(cs, D, Z, W, ineq, eq, part: ForestProof) -> dict:
    """The proven primal numbers of W (d, e) under ``part`` (:class:`ForestProof`):
    margins (R,) computed, margin_lo, violation_hi, norm_hi, norm (as computed), eq_shift,
    feas_margin, upper."""
    d = D.shape[1]
    nb = part.bounds
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        m3, e3 = margin_enclosure(cs, W[None])
        m, err = m3.reshape(-1).copy(), e3.reshape(-1).copy()
        rows = ineq | eq
        coarse = np.nonzero(rows & (err > 2.0 ** -40))[0]  # (a margin from cancelling terms)
        aw = float(np.abs(W).max(initial=0.0))
        if coarse.size and np.isfinite(aw) and aw < 2.0 ** 900 and bool(_exact_data(cs)[0]):
            lo_all = (np.zeros_like(D) if cs.Delta_lo is None
                      else cs.Delta_lo.reshape(D.shape))
            step = max(1, 2 ** 20 // (4 * W.size))
            for c0 in range(0, coarse.size, step):
                c = coarse[c0:c0 + step]
                m2, e2 = margins_dot2(D[c], lo_all[c], W, Z[c])
                better = np.isfinite(e2) & (e2 < err[c])
                m[c[better]], err[c[better]] = m2[better], e2[better]
        # the enclosure, rounded outward (one ulp: each side is one rounded operation)
        m_lo = np.nextafter(m - err, -np.inf)
        m_hi = np.nextafter(m + err, np.inf)
        margin_lo = float(m_lo[ineq].min()) if ineq.any() else np.inf
        v_in = float(np.maximum(1.0 - m_lo[ineq], 0.0).max()) if ineq.any() else 0.0
        v_in = float(np.nextafter(v_in, np.inf)) if v_in > 0 else v_in  # (rounded upward)
        v_eq = float(np.maximum(np.abs(m_lo[eq]), np.abs(m_hi[eq])).max()) if eq.any() else 0.0
        norm_hi, nrm = nb.value(W)
        shift, feas = 0.0, margin_lo
        if eq.any():
            res = np.maximum(np.abs(m_lo), np.abs(m_hi))[part.forest]
            rn = float(np.sqrt(np.sum(res * res))) * (1 + gamma(len(res) + 2)) * 1.0001
            shift = rn / part.sigma * (1 + 4 * U) if part.sigma > 0 else (
                0.0 if rn == 0 else np.inf)
            if ineq.any() and shift > 0:
                an = np.sqrt(np.einsum("rd,rd->r", D[ineq], D[ineq])
                             * np.einsum("rd,rd->r", Z[ineq], Z[ineq]))
                an = an * (1 + gamma(2 * d + 4)) * 1.0001  # >= ||A_r(exact)||_F
                feas = float(np.nextafter((m_lo[ineq] - an * shift * (1 + 2 * U)).min(),
                                          -np.inf))  # (an's slack covers the product)
        # upper bounds, each rounded operation stepped upward by one ulp
        up = lambda x: float(np.nextafter(x, np.inf)) if x != 0 else 0.0  # noqa: E731 (0: exact)
        top = up(norm_hi + up(nb.fro_factor(d) * shift)) * (1 + 2 * U)
        upper = up(top / min(1.0, feas)) * (1 + 2 * U) if feas > 0 and np.isfinite(top) \
            else np.inf
    return {"margins": m, "margin_lo": margin_lo, "violation_hi": max(v_in, v_eq),
            "norm_hi": norm_hi, "norm": nrm, "eq_shift": shift, "feas_margin": feas,
            "upper": float(upper)}


def _forest_lower(D, Z, lam, ineq, valid, nb: NormBounds):
    """(lb, S (d, e) as computed, its dual norm as computed; S None without usable
    multipliers): lb = sum_ineq lam / ||S||_*^ a proven lower bound of the optimal norm
    (negative inequality multipliers set to 0), S = Delta^T diag(lam) z row by row with
    |fl(S) - S(exact data)| <= gamma_{R+2} |Delta|^T diag|lam| |z| (the differences'
    rounding <= u |Delta| included) and the norm's proven bound ``nb.dual``."""
    if lam is None or not ineq.any() or not np.all(np.isfinite(lam)):
        return 0.0, None, 0.0
    lam = np.where(ineq, np.maximum(lam, 0.0), np.where(valid, lam, 0.0))
    nr = len(lam)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        d, e = D.shape[1], Z.shape[1]
        S = (D * lam[:, None]).T @ Z
        dS = (np.abs(D) * np.abs(lam)[:, None]).T @ np.abs(Z) * gamma(nr + 3) * 1.0001
        errS = fro_upper(dS) * (1 + gamma(d * e + 4)) + 4 * nr * d * e * TINY
        s_hi, s_val = nb.dual(S)
        dual_hi = s_hi + errS
        num = float(lam[ineq].sum()) * (1 - gamma(nr + 1))
    if dual_hi > 0 and num > 0 and np.isfinite(dual_hi):
        return num / dual_hi * (1 - 2 * U), S, s_val
    return 0.0, S, s_val


def _forest_kkt(D, Z, W, lam, ineq, eq, valid, nb: NormBounds, nrm, m, S_lam):
    """(lam scaled for min 1/2||W||^2: sum_ineq lam = ||W||^2, kkt residual): stationarity
    ||W - S||_F / ||W||_F (self-dual) or max(| ||S||_* / ||W|| - 1 |, |<S, W> / ||W||^2 -
    1|), S = sum_r lam_r A_r; complementarity max_ineq |lam_r (m_r - 1)| / ||W||^2.
    Informative numbers (the proof is the gap)."""
    lam = np.where(ineq, np.maximum(lam, 0.0), np.where(valid, lam, 0.0))
    tot = float(lam[ineq].sum())
    f = nrm * (nrm / tot) if tot > 0 and nrm > 0 else 1.0
    lam = lam * f
    if S_lam[0] is None:
        S = (D * lam[:, None]).T @ Z
        s2 = 0.0 if nb.self_dual else float(nb.dual(S)[1])
    else:
        S, s2 = S_lam[0] * f, S_lam[1] * f
    n2 = max(nrm * nrm, 1e-300)
    if nb.self_dual:
        stat = float(np.linalg.norm(W - S)) / max(nrm, 1e-300)
    else:
        stat = max(abs(s2 / max(nrm, 1e-300) - 1.0), abs(float(np.sum(S * W)) / n2 - 1.0))
    comp = float(np.max(np.where(ineq, np.abs(lam * (m - 1.0)), 0.0), initial=0.0)) / n2
    return lam, max(stat, comp)


def _certify_forest(cs, W: np.ndarray, lam: np.ndarray | None, tol_active: float,
                    part: ForestProof) -> Certificate:
    """:func:`certify` with the proof part ``part`` (:class:`ForestProof`), for a batch of
    one: the Certificate's ``margin``, ``violation``, ``gap``, ``lower`` are proven (the
    part's docstring), ``feasible`` = violation <= FEAS_TOL and a feasible point proven
    near W (``proven["upper"]`` finite), ``lam`` scaled for min 1/2||W||^2 (sum over
    inequalities ||W||^2), ``proven`` the part's further numbers (norm_hi, eq_shift,
    feas_margin, upper), each (1,)."""
    if cs.batch_shape != (1,):
        raise ValueError(f"certify: a proof part belongs to one problem; got a batch of "
                         f"shape {cs.batch_shape}")
    valid = cs.valid.reshape(-1)
    eqm = cs.eqmask.reshape(-1) & valid
    ineq = valid & ~eqm
    b = cs.b.reshape(-1)
    if not (np.all(b[ineq] == 1.0) and np.all(b[eqm] == 0.0)):
        raise ValueError("certify: a ForestProof needs b = 1 on inequalities and 0 on "
                         "equalities")
    D, Z = _flat_rows(cs)
    W = np.asarray(W, dtype=float)
    has = bool(np.isfinite(W).all())
    nb = part.bounds
    if has:
        pr = _forest_primal(cs, D, Z, W[0], ineq, eqm, part)
    else:
        pr = {"margins": np.full(len(b), np.nan), "margin_lo": np.nan, "violation_hi": np.nan,
              "norm_hi": np.inf, "norm": np.inf, "eq_shift": np.inf, "feas_margin": np.nan,
              "upper": np.inf}
    lam1 = None if lam is None else np.asarray(lam, dtype=float).reshape(-1)
    lb, S, s_val = _forest_lower(D, Z, lam1, ineq, valid, nb)
    gap = proven_gap(pr["upper"], pr["norm_hi"], lb, bool(ineq.any()))
    feasible = has and pr["violation_hi"] <= FEAS_TOL and np.isfinite(pr["upper"])
    m = pr["margins"]
    lam_out, kkt = (np.zeros(len(b)) if lam1 is None else lam1), np.nan
    if has and lam1 is not None and np.all(np.isfinite(lam1)):
        try:  # (informative numbers: a failure leaves them NaN, never the proven answer)
            lam_out, kkt = _forest_kkt(D, Z, W[0], lam1, ineq, eqm, valid, nb, pr["norm"],
                                       m, (S, s_val))
        except (np.linalg.LinAlgError, ArithmeticError, ValueError):
            pass
    support = valid & (eqm | (m <= b + tol_active * np.maximum(1.0, np.abs(b)))) & has
    one = lambda x: np.array([x], dtype=float)  # noqa: E731
    sh = cs.valid.shape
    return Certificate(
        W=W, lam=lam_out.reshape(sh), margins=m.reshape(sh), norm=one(pr["norm"]),
        margin=one(pr["margin_lo"]), violation=one(pr["violation_hi"]), kkt=one(kkt),
        gap=one(gap), lower=one(lb), feasible=np.array([feasible]),
        support=support.reshape(sh),
        proven={k: one(pr[k]) for k in ("norm_hi", "eq_shift", "feas_margin", "upper")})
