"""The one engine behind every max-margin problem (single and batched, every norm).

    cs = build_constraints(X, Z, alpha, valid)      # (B, n, T, d) tokens -> normalised set
    out = solve(cs, norm)                          # solve every problem, certify them all
    sol = to_solutions(cs, out, ...)               # back to the caller's units

A single problem is a batch of one.  The steps of :func:`solve`:

1. problems that need no margin (no inequality with b > 0, no equality with b != 0):
   W = 0;  problems with a constraint whose matrix is 0 (a token equal to the selected
   one, a zero query, all-zero keys) but b > 0: infeasible, that constraint is the
   Farkas certificate;
2. the others are solved: Frobenius problems by the compiled exact active-set
   minimum-norm-point solver (:mod:`attnsvm.svm.active`, numba: batches with
   N <= MAX_BATCH_N_ACTIVE, single problems by the rule of :func:`_fro_fast`), else (no
   numba, or a problem it leaves unresolved) the batched Frobenius min-norm-point IPM for
   many small problems, else one by one (Frobenius: dual min-norm point or structured
   primal IPM, then an exact active-set polish; nuclear: the primal-dual SDP interior-point
   method on a working set, the dual barrier as its fallback; any norm: cvxpy with the
   norm's own expression and solver);
3. every answer is rescaled to minimal margin 1 (times certificate.KAPPA) and certified
   by :func:`~attnsvm.svm.solution.certify` (one batched call): feasible only where every
   margin is proven >= b_k (:mod:`attnsvm.svm.certificate`);
4. problems without a feasible answer get a Farkas certificate (the solver's own
   multipliers, polished, or an LP vertex), which must be proven by
   :func:`~attnsvm.svm.solution.farkas_verify` (sum lam_k A_k = 0 exactly) before
   "infeasible" is reported; its support names the conflicting sequences;
5. answers that certify neither way, or certify a gap above what the solver should
   reach, are re-solved with a second, different solver and re-certified; what is then
   still unresolved gets an LP Farkas vertex (and so does every infeasible problem when
   an irreducible conflict is asked for).  Neither verified: "uncertified".

The status of every problem is read off the certificate, never off a solver's word.

Small single Frobenius problems (:func:`attnsvm.svm.att_svm`, n T < 300) and Frobenius
batches (n T <= 400) first try :mod:`attnsvm.svm.lean`: the steps above for the problems
the active-set solver settles (certified optimal, or a verified Farkas certificate), in
one compiled call per problem; every other problem comes here.
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..norms import FRO, NUC, SPECTRAL, Norm, get_norm
from . import active
from .certificate import KAPPA, two_diff
from .fast import batched_mnp, nuclear_barrier, nuclear_ipm, polish_fro, primal_ipm
from .solution import (
    GAP_INACCURATE,
    GAP_OPTIMAL,
    BatchSolution,
    Certificate,
    ConstraintSet,
    NotRepresentableError,
    Solution,
    _exp2,
    _ldexp,
    certify,
    farkas_verify,
    single_thread,
)

__all__ = [
    "build_constraints",
    "normalise_constraints",
    "normalise",
    "solve",
    "to_batch_solution",
    "to_solution",
    "farkas_lp",
    "farkas_polish",
    "farkas_conflict",
    "SOLVERS",
]

MAX_BATCH_N = 100  # constraints per problem up to which B > 1 problems use the batched Gram IPM
# (measured, 2 cores: N = 70: 3.2 ms/problem batched vs 6.9 one by one; N = 140: 22 vs 15)
MAX_BATCH_N_ACTIVE = 400  # ... and the compiled active-set solver (one problem at a time, no
# (B, N, N) arrays: batched up to this N, then one by one, which is the same kernel)
MAX_ACTIVE_N = 4000  # single problems: the active-set solver when N <= this and
ACTIVE_RATIO = 3  # N <= ACTIVE_RATIO d e or N <= ACTIVE_SMALL_N; else the primal IPM
ACTIVE_SMALL_N = 300
# (measured, 2 cores, att_svm end to end, active vs primal IPM: (20, 8, 10) N/de = 1.4:
# 1.2 vs 5.7 ms; (100, 16, 32) 1.5: 0.084 vs 0.41 s; (200, 16, 32) 2.9: 0.42 vs 0.63 s;
# (300, 16, 32) 4.4: 1.4 vs 0.83 s; (200, 16, 8) 47: 0.098 vs 0.016 s; (100, 64, 16) 25:
# 0.75 vs 0.072 s: the active set costs ~ N |S|^2 with |S| <= d e + 1, the IPM ~ N (d e)^2)
NUC_SLACK = 1e-6  # nuclear SCS working set: Frobenius support + constraints with margin <= 1 + this
NUC_ALL_N = 300  # nuclear IPM: every constraint in the working set up to this N, else a seed
NUC_SEED_K = 5  # ... from the Frobenius solution on each sequence's NUC_SEED_K tightest rows
NUC_SEED_ACTIVE_RATIO = 1.5  # ... by the active-set solver where they are <= this d e
NUC_ADD_SLACK = 0.1  # ... grown by the outside constraints with margin < b (1 + this)
NUC_DROP_TOL = 1e-3  # ... and, once gap and residuals are below this, shed far-inactive rows
SMALLEST_NORMAL = np.finfo(float).tiny
# the largest entry of a returned W must be a normal float64 (full relative precision)
MIN_REPRESENTABLE = SMALLEST_NORMAL

#: solver names accepted besides the cvxpy solvers; the Frobenius ones apply to the
#: Frobenius norm only, the nuclear ones to the nuclear norm only
SOLVERS = {
    FRO: ("auto", "fast", "active", "ipm", "mnp"),
    NUC: ("auto", "fast", "barrier", "working_set"),
}


# ------------------------------------------------------------------ normalisation
def _absmax(A: np.ndarray, axes: tuple[int, ...], where=None) -> np.ndarray:
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
    e = _exp2(_absmax(A, axes, where))
    return _ldexp(A, -e, out=A if inplace else None), e


def _lossy(A: np.ndarray) -> np.ndarray:
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
        Delta_lo = _ldexp(Delta_lo, -eD, out=Delta_lo)
    if exact:
        bad = np.zeros(B, bool) if lossy is None else np.asarray(lossy, bool).copy()
        if B:
            bad |= _lossy(Delta) | _lossy(Z)
            if Delta_lo is not None:
                bad |= _lossy(Delta_lo)
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
        lossy = (_lossy(np.where(valid[..., None], X, 0.0)) if B and exact
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


# --------------------------------------------------------------------- raw solves
@dataclass
class Raw:
    """A solver's answer for one problem (normalised units), before any certificate."""

    W: np.ndarray | None
    lam: np.ndarray | None
    status: str  # the solver's own word: kept for the record, never trusted
    solver: str
    n_iter: int = 0
    farkas: np.ndarray | None = None  # candidate Farkas multipliers (n, T)


def _solver_key(solver, N: Norm) -> str | None:
    """Validate ``solver`` for norm ``N``: None/"auto", a fast solver of this norm, or a
    cvxpy solver name."""
    if solver is None:
        return None
    key = str(solver).lower()
    own = SOLVERS.get(N, ("auto", "fast"))
    if key in own:
        return key
    for nm, keys in SOLVERS.items():
        if key in keys and key not in ("auto", "fast"):
            raise ValueError(f"solver {solver!r} applies to the {nm.name!r} norm only, not "
                             f"{N.name!r}; use one of {list(own)} or a cvxpy solver name")
    if key == "fast":
        return None
    import cvxpy as cp

    if key.upper() not in cp.installed_solvers():
        raise ValueError(f"unknown solver {solver!r}; use one of {list(own)} or an installed "
                         f"cvxpy solver ({', '.join(s.lower() for s in cp.installed_solvers())})")
    return key


def _fro_fast(cs: ConstraintSet, key) -> Raw | None:
    """Frobenius fast path (unit b, no equality). With numba, by default the compiled
    active-set minimum-norm-point solver (:mod:`attnsvm.svm.active`) where
    N <= MAX_ACTIVE_N and (N <= ACTIVE_RATIO d e or N <= ACTIVE_SMALL_N); a problem it
    leaves unresolved, and every other one, by shape: the dual
    minimum-norm-point solver on the N x N constraint Gram matrix when N <= d e (fewer
    constraints than unknowns), the structured primal IPM (d e x d e Newton systems)
    otherwise. Measured crossover (2 cores): N = 300, d e = 1024: mnp 0.05 s vs ipm
    0.29 s; N = 1500, d e = 256: ipm 0.035 s vs mnp 0.75 s; N ~ d e: within 1.3x."""
    N = cs.n_constraints
    if cs.has_eq or not np.all(cs.b[cs.ineq] == 1.0):
        return None
    if key == "active" or (key in (None, "auto", "fast") and active.available()
                           and N <= MAX_ACTIVE_N
                           and (N <= ACTIVE_RATIO * cs.d * cs.e or N <= ACTIVE_SMALL_N)):
        if not active.available():
            raise ValueError("solver='active' needs numba (install attnsvm[fast])")
        mu, lam, W, rho2, st, it = active.mnp_active(
            cs.Delta.reshape(1, -1, cs.d), np.repeat(cs.Z, cs.shape[1], axis=0)[None],
            cs.valid.reshape(1, -1))
        shape = cs.valid.shape
        if st[0] == active.OPTIMAL:
            return Raw(W[0], lam[0].reshape(shape), "optimal", "mnp-active", int(it[0]),
                       farkas=mu[0].reshape(shape))
        if st[0] == active.SMALL_RHO:
            ok = rho2[0] > 0 and np.isfinite(W[0]).all()
            return Raw(W[0] if ok else None, lam[0].reshape(shape) if ok else None,
                       "infeasible", "mnp-active", int(it[0]), farkas=mu[0].reshape(shape))
        # FAILED (iteration cap / rounding stall): the interior-point paths below
    if key == "mnp" or (key not in ("ipm", "active") and N <= cs.d * cs.e):
        ii, tt = np.nonzero(cs.valid)
        M = cs.dense()
        mu, rho2, _, it = batched_mnp((M @ M.T)[None], np.ones((1, N), bool))
        mu_full = np.zeros(cs.valid.shape)
        mu_full[ii, tt] = mu[0]
        rho2 = float(rho2[0])
        W = cs.combine(mu_full) / rho2 if rho2 > 0 else None
        lam = mu_full / rho2 if rho2 > 0 else None
        return Raw(W, lam, "optimal" if W is not None else "infeasible", "mnp-ipm", it,
                   farkas=mu_full)
    W, lam, status, it = primal_ipm(cs)
    if status != "optimal":
        return None
    return Raw(W, lam, status, "ipm", it)


def _nuc_fast(cs: ConstraintSet, key) -> Raw | None:
    """Nuclear fast path: by default the primal-dual SDP interior-point method on a working
    set (:func:`_nuc_ipm_working_set`); "barrier": the dual log-barrier on a working set;
    "working_set": cvxpy + SCS on a working set.  An answer-less failure (not a verdict of
    infeasibility) goes on to the next of these."""
    if cs.e == 1 or cs.has_eq:  # vectors: the nuclear norm is l_2 (the cvxpy path)
        return None
    if key == "working_set":
        return Raw(*_nuc_working_set(cs))
    r = Raw(None, None, "", "")
    if key != "barrier":
        r = Raw(*_nuc_ipm_working_set(cs))
    if r.W is None and "infeasible" not in r.status:
        r = Raw(*_nuc_barrier_working_set(cs))
    if r.W is None and "infeasible" not in r.status:
        r = Raw(*_nuc_working_set(cs))
    return r


#: fast solvers by norm; a norm without one goes to cvxpy with its own expression
FAST = {FRO: _fro_fast, NUC: _nuc_fast}
#: cvxpy solver preferred over the norm's default where measured better: spectral-norm
#: SVM, Clarabel's SDP vs SCS at (20, 8, 10): gap 5.5e-9 vs 1.2e-7; at (50, 10, 20):
#: 1.4e-9 in 1.7 s vs 2.3e-8 in 3.4 s (SCS stays the fallback)
PREFERRED = {SPECTRAL: "CLARABEL"}


def _raw_solve(cs: ConstraintSet, N: Norm, key) -> Raw:
    """One problem (unbatched, normalised) by the fast path of its norm or cvxpy."""
    r = None
    own = key in (None, "auto", "fast", *SOLVERS.get(N, ()))
    if own and N in FAST:
        r = FAST[N](cs, key)
    if r is None:
        r = Raw(*_solve_cvxpy(cs, N, None if own else key))
    exact = r.solver == "mnp-active" and r.status == "optimal"  # verified by the kernel
    if N == FRO and r.W is not None and r.lam is not None and not exact:
        W, lam, ok = polish_fro(cs, r.W, r.lam)
        if ok:
            r = Raw(W, lam, r.status, r.solver + "+polish", r.n_iter, r.farkas)
    return r


def _solve_cvxpy(cs: ConstraintSet, norm, solver=None, eps: float | None = None, warm=None):
    """min ||W|| s.t. M_in vec(W) >= b_in, M_eq vec(W) == b_eq (cvxpy, vectorised
    constraints; the norm's own expression and default solver).

    Returns (W or None, lam (n, T) for 1/2||W||^2 or None, status, solver_name, n_iter).
    The multipliers mu of whatever objective cvxpy minimised are brought to those of
    1/2||W||^2 by the norm-free identity sum_k lam_k b_k = ||W||^2 at the optimum.
    """
    import cvxpy as cp

    N = get_norm(norm)
    d, e = cs.d, cs.e
    ineq, eqm = cs.ineq, cs.eqmask
    ii, ti = np.nonzero(ineq)
    ie, te = np.nonzero(eqm)

    def rows(i, t):
        return np.einsum("kd,ke->kde", cs.Delta[i, t], cs.Z[i]).reshape(len(i), d * e)

    W = cp.Variable((d, e))
    w = cp.vec(W, order="C")
    cons = []
    if len(ii):
        cons.append(rows(ii, ti) @ w >= cs.b[ii, ti])
    if len(ie):
        cons.append(rows(ie, te) @ w == cs.b[ie, te])
    prob = cp.Problem(cp.Minimize(N.objective(W)), cons)
    # vectors (e = 1): every norm is a vector norm (nuc / spectral: l_2), no SDP needed
    solver = (solver or (PREFERRED.get(N, N.solver) if e > 1 else "CLARABEL")).upper()
    kw = {}
    if solver == "SCS":
        acc = eps if eps is not None else 1e-8
        kw = dict(eps_abs=acc, eps_rel=acc, max_iters=200_000)
    elif solver == "CLARABEL":
        acc = eps if eps is not None else 1e-10
        kw = dict(tol_gap_abs=acc, tol_gap_rel=acc, tol_feas=acc, tol_ktratio=1e-8, max_iter=400)
    if warm is not None:
        W.value = warm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prob.solve(solver=solver, warm_start=warm is not None, **kw)
        except (cp.error.SolverError, ValueError, ArithmeticError) as exc:
            if solver != "SCS":
                return _solve_cvxpy(cs, N, "SCS", eps)
            return None, None, f"solver_error: {exc}", solver, 0
    status = str(prob.status)
    n_iter = int(getattr(prob.solver_stats, "num_iters", 0) or 0)
    if W.value is None or status not in ("optimal", "optimal_inaccurate"):
        return None, None, status, solver, n_iter
    Wv = np.asarray(W.value, dtype=float)
    lam = np.zeros(cs.valid.shape)
    k = 0
    if len(ii):
        if cons[0].dual_value is not None:
            lam[ii, ti] = np.asarray(cons[0].dual_value, float).reshape(-1)
        k = 1
    if len(ie) and cons[k].dual_value is not None:
        # cvxpy's Lagrangian adds +nu^T (M_eq w - b_eq): lam_eq = -nu
        lam[ie, te] = -np.asarray(cons[k].dual_value, float).reshape(-1)
    lb = float((lam * cs.b).sum())
    if lb > 0:
        lam *= float(N.value(Wv)) ** 2 / lb
    return Wv, lam, status, solver, n_iter


# --------------------------------------------------------------- nuclear solvers
def _nuc_initial_work(cs: ConstraintSet) -> np.ndarray:
    """Initial working set: the Frobenius support (structured IPM to 1e-5: multipliers
    > 1e-4 max or margin <= 1 + 1e-4) plus each sequence's tightest constraint under the
    Frobenius solution (all constraints if N <= 600)."""
    valid = cs.valid
    if cs.n_constraints <= 600:
        return valid.copy()
    Wf, lf, st, _ = primal_ipm(cs, tol=1e-5)
    if st != "optimal":
        return valid.copy()
    mf = cs.margins(Wf)
    work = valid & ((lf > 1e-4 * lf.max()) | (mf <= 1 + 1e-4))
    m = np.where(valid, mf, np.inf)
    t = m.argmin(1)
    ok = np.isfinite(m.min(1))
    work[np.nonzero(ok)[0], t[ok]] = True
    return work


def _nuc_reduce(cs: ConstraintSet):
    """(U (d, r1), V (e, r2), reduced set): orthonormal bases of span{Delta_k} and
    span{z_k} and the constraints on C = U^T W V (see :func:`_nuc_barrier_working_set`)."""
    ii, tt = np.nonzero(cs.valid)
    Uf, su, _ = np.linalg.svd(cs.Delta[ii, tt].T, full_matrices=False)
    U = Uf[:, su > 1e-12 * max(su.max(), 1e-300)]
    Vf, sv, _ = np.linalg.svd(cs.Z.T, full_matrices=False)
    V = Vf[:, sv > 1e-12 * max(sv.max(), 1e-300)]
    return U, V, ConstraintSet(cs.Delta @ U, cs.Z @ V, cs.valid, cs.b)


def _nuc_seed(cs: ConstraintSet) -> np.ndarray:
    """Initial working set of :func:`_nuc_ipm_working_set`: all constraints if
    N <= NUC_ALL_N; else the support of a Frobenius solution (multipliers > 1e-6 max or
    margin <= b (1 + 1e-4), on all constraints) plus each sequence's tightest constraint
    under it.  That Frobenius solution is the one of a subset: each sequence's NUC_SEED_K
    tightest constraints under W0 = sum_k A_k; it violates constraints outside, which
    thereby join (measured at (100, 16, 32), att_svm nuclear end to end: 0.17 s with
    this seed vs 0.21 s with the exact Frobenius support, which costs 0.08 s itself).
    Solved by the exact active-set solver where the subset has <= NUC_SEED_ACTIVE_RATIO
    d e or <= ACTIVE_SMALL_N constraints (numba), else by the structured primal IPM to 1e-5.

    Returns (work, farkas): farkas is None, or, where the active-set solver finds the
    subset infeasible (then so is every superset, whatever the norm), its Farkas
    candidate on the (n, T) grid (verified by the caller's caller) and work is None."""
    valid = cs.valid
    if cs.n_constraints <= NUC_ALL_N or cs.has_eq:
        return valid.copy(), None
    bs = np.where(valid, cs.b, 1.0)
    m0 = np.where(valid, cs.margins(cs.combine(valid.astype(float))) / bs, np.inf)
    sub = valid & (np.argsort(np.argsort(m0, axis=1), axis=1) < NUC_SEED_K)
    sc = cs.with_valid(sub)
    Wf = lf = None
    n_sub = sc.n_constraints
    if active.available() and (n_sub <= NUC_SEED_ACTIVE_RATIO * cs.d * cs.e
                               or n_sub <= ACTIVE_SMALL_N) and np.all(cs.b[valid] == 1.0):
        r = _fro_fast(sc, "active")
        if r is not None and r.status == "optimal":
            Wf, lf = r.W, r.lam
        elif r is not None and r.status == "infeasible" and r.farkas is not None:
            return None, r.farkas
    if Wf is None:
        Wf, lf, st, _ = primal_ipm(sc, tol=1e-5)
        if st != "optimal":
            return valid.copy(), None
    mf = cs.margins(Wf)
    work = valid & ((lf > 1e-6 * lf.max()) | (mf <= bs * (1 + 1e-4)))
    m = np.where(valid, mf / bs, np.inf)
    ok = np.isfinite(m.min(1))
    work[np.nonzero(ok)[0], m.argmin(1)[ok]] = True
    return work, None


def _nuc_ipm_working_set(cs: ConstraintSet, max_rounds: int = 10, tol: float = 1e-9,
                         add_slack: float = NUC_ADD_SLACK, check_tol: float = 1e-1,
                         check_min: float = 1e-4, drop_tol: float = NUC_DROP_TOL):
    """Nuclear norm: constraint generation around the primal-dual SDP interior-point method
    :func:`attnsvm.svm.fast.nuclear_ipm` (Nesterov-Todd direction, N x N Schur
    complement from the rank-two structure of the constraints), after the dimension
    reduction W = U C V^T of :func:`_nuc_barrier_working_set`.

    Working set: :func:`_nuc_seed`.  While the method runs, every iterate with gap and
    residuals in (``check_min``, ``check_tol``] is scaled to margin >= b on the working
    set and checked against all constraints; if one outside is violated, every outside
    constraint with margin < b (1 + ``add_slack``) joins the running method (no restart).
    After convergence (relative gap and residuals <= ``tol``) the answer is checked on
    all constraints; a violation > 1e-9 b starts a new round, cold, on the grown set (and
    so does a run that failed after growing).  Returns (W (d, e), lam (n, T) multipliers
    of min 1/2 ||W||_*^2, status, "ipm-working-set", total iterations); the certificate
    is computed by the caller from W and lam on all constraints; where the seed's subset is
    infeasible: (None, None, "infeasible", name, 0, Farkas candidate (n, T)).
    """
    valid = cs.valid
    U, V, red = _nuc_reduce(cs)
    work, farkas = _nuc_seed(red)
    if work is None:  # an infeasible subset: no answer, a Farkas candidate for the caller
        return None, None, "infeasible", "ipm-working-set", 0, farkas
    bs = np.where(valid, cs.b, 1.0)
    total = 0
    status = "failed"
    C = lam = None
    for _ in range(max_rounds):
        wi, wt = np.nonzero(work)
        rows = [(wi, wt)]
        n0 = int(work.sum())

        def check(Cw, final, rows=rows, wi=wi, wt=wt, work=work):  # (grows ``work``)
            if final:
                return None
            m = red.margins(Cw)
            bw = red.b[wi, wt]
            ratio = float((m[wi, wt][bw > 0] / bw[bw > 0]).min(initial=np.inf))
            if 0 < ratio < np.inf:
                m = m / ratio
            out = valid & ~work
            if not (out & (m < red.b)).any():
                return None
            ai, at = np.nonzero(out & (m < bs * (1 + add_slack)))
            work[ai, at] = True
            rows.append((ai, at))
            return red.Delta[ai, at], red.Z[ai], red.b[ai, at]

        C, lam, status, it = nuclear_ipm(red.Delta[wi, wt], red.Z[wi], red.b[wi, wt], tol=tol,
                                         check=check, check_tol=check_tol, check_min=check_min,
                                         drop_tol=drop_tol)
        total += it
        wi = np.concatenate([r[0] for r in rows])
        wt = np.concatenate([r[1] for r in rows])
        if status != "optimal":
            if (len(wi) > n0 or drop_tol) and status == "failed":
                drop_tol = 0.0  # it changed the set on the way: once more, cold
                continue
            return None, None, status, "ipm-working-set", total
        m = red.margins(C)
        live = np.zeros(valid.shape, bool)
        live[wi, wt] = lam > 0  # (rows the method dropped have multiplier 0)
        out = valid & ~live
        if not (out & (m < red.b - 1e-9 * bs)).any():
            break
        drop_tol = 0.0  # a dropped row may be the violated one: no dropping from here on
        work |= out & (m < bs * (1 + add_slack))
    else:
        if C is None or status != "optimal":
            return None, None, status, "ipm-working-set", total
        status = "optimal_inaccurate"  # round limit: the certificate reports the true numbers
    W = U @ C @ V.T
    lam_full = np.zeros(valid.shape)
    lam_full[wi, wt] = lam * float(NUC.value(W))  # multipliers of min 1/2 ||W||_*^2
    return W, lam_full, status, "ipm-working-set", total


def _nuc_warm_start(red: ConstraintSet, lam_grid: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Strictly dual-feasible multipliers on the working set ``work`` from the last round's
    ``lam_grid``: old constraints keep theirs; the k new ones get
    eps_j = (1 - ||S(lam)||_op) / (2 k ||Delta_j|| ||z_j||), so ||S||_op stays below
    (1 + ||S(lam)||_op) / 2 < 1 and the barrier path resumes where it was."""
    new = work & ~(lam_grid > 0)
    lam = lam_grid.copy()
    if new.any():
        slack = max(1.0 - float(np.linalg.norm(red.combine(lam_grid), 2)), 0.0)
        ni, nt = np.nonzero(new)
        size = np.linalg.norm(red.Delta[ni, nt], axis=1) * np.linalg.norm(red.Z[ni], axis=1)
        lam[ni, nt] = slack / (2 * len(ni) * np.maximum(size, 1e-300))
    return lam[work]


def _nuc_barrier_working_set(cs: ConstraintSet, max_rounds: int = 20, gap_tol: float = 1e-7,
                             mu: float = 10.0, loose_tol: float = 1e-2, add_slack: float = 0.1,
                             warm_frac: float = 0.1):
    """Nuclear norm: constraint generation around the structured dual barrier method
    (:func:`attnsvm.svm.fast.nuclear_barrier`), no cvxpy and no conic-form build.

    Dimension reduction.  The constraints see W only through U^T W V, U (d, r1) an
    orthonormal basis of span{Delta_k}, V (e, r2) one of span{z_k}:  for any W,
    W' = U U^T W V V^T has the same constraint values (Delta_k^T U U^T = Delta_k^T,
    V V^T z_k = z_k) and ||W'||_* <= ||U U^T|| ||W||_* ||V V^T|| = ||W||_* (the nuclear
    norm is unitarily invariant and ||A W B||_* <= ||A||_op ||W||_* ||B||_op).  Hence
    W = U C V^T with C = argmin ||C||_* s.t. (U^T Delta_k)^T C (V^T z_k) >= b_k is optimal,
    and ||W||_* = ||C||_* (U, V orthonormal).  The (r1 + r2)-sized problem is solved
    (r1 = rank of the Deltas, r2 = rank of the z's; no reduction when both are full).

    Working set: start from :func:`_nuc_initial_work`, solve (barrier gap ``loose_tol``),
    add every violated constraint (and, in loose rounds, those with margin below
    1 + ``add_slack``) and repeat; once a round adds at most ``warm_frac`` of the working
    set, the barrier continues warm from the last multipliers (:func:`_nuc_warm_start`)
    to gap ``gap_tol``.  The final barrier point is feasible on the working set; it is
    scaled to minimal margin 1 on all constraints, and the one certificate reports the
    relative duality gap (measured ~1e-7 at (100, 16, 32)).
    """
    valid = cs.valid
    U, V, red = _nuc_reduce(cs)
    work = _nuc_initial_work(cs)
    total = 0
    scale = max(1.0, float(np.abs(cs.b[valid]).max()))
    tol = loose_tol  # early rounds only identify the working set: a loose gap suffices
    state: dict = {}
    lam_grid = None  # multipliers to continue from, on the (n, T) grid (None: cold start)
    for _ in range(max_rounds):
        wi, wt = np.nonzero(work)
        args = (red.Delta[wi, wt], red.Z[wi], red.b[wi, wt])
        C = None
        if lam_grid is not None:  # continue the central path of the last round
            C, lam, status, it = nuclear_barrier(*args, gap_tol=tol, mu=mu, state=state,
                                                 lam0=_nuc_warm_start(red, lam_grid, work),
                                                 t0=state.get("t"))
            total += it
        if C is None:
            C, lam, status, it = nuclear_barrier(*args, gap_tol=tol, mu=mu, t_init=0.1,
                                                 state=state)
            total += it
        if C is None:
            return None, None, status, "barrier-working-set", total
        m = red.margins(C)
        viol = valid & ~work & (m < cs.b - 1e-9 * scale)
        if tol != gap_tol and viol.any():  # loose round: take the near-active ones along
            viol |= valid & ~work & (m < cs.b * (1 + add_slack))
        n_add = int(viol.sum())
        if n_add == 0 and tol == gap_tol:
            break
        lam_grid = None
        if n_add <= warm_frac * len(wi):  # (nearly) the working set: accurate solve, warm
            tol = gap_tol
            lam_grid = np.zeros(valid.shape)
            lam_grid[wi, wt] = lam
        work |= viol
    else:
        status = "optimal_inaccurate"  # round limit: the certificate reports the true numbers
    W = U @ C @ V.T
    lam_full = np.zeros(valid.shape)
    lam_full[wi, wt] = lam * float(NUC.value(W))  # multipliers of min 1/2 ||W||_*^2
    return W, lam_full, status, "barrier-working-set", total


def _nuc_working_set(cs: ConstraintSet, max_rounds: int = 20):
    """Nuclear norm by constraint generation: SCS on a working set, exact checks on all.

    Start from the Frobenius support (exact fast path) plus, per sequence, the tightest
    constraint; solve the SDP on the working set (SCS, eps 1e-9), add every constraint
    violated by more than 1e-9 and repeat."""
    valid = cs.valid
    Wf, lf, st, _ = primal_ipm(cs) if cs.n_constraints > 600 else (None, None, "skip", 0)
    if st != "optimal":
        W0 = None
        work = valid.copy()
    else:
        mf = cs.margins(Wf)
        work = valid & ((lf > 1e-9 * lf.max()) | (mf <= 1 + NUC_SLACK))
        W0 = Wf
    if W0 is not None:  # always include each sequence's tightest constraint
        m = np.where(valid, cs.margins(W0), np.inf)
        t = m.argmin(1)
        ok = np.isfinite(m.min(1))
        work[np.nonzero(ok)[0], t[ok]] = True
    total_iter = 0
    W = lam = None
    status = "failed"
    for _ in range(max_rounds):
        W, lam, status, _, n_iter = _solve_cvxpy(cs.with_valid(work), NUC, "SCS", eps=1e-9)
        total_iter += n_iter
        if W is None:
            break
        m = cs.margins(W)
        viol = valid & ~work & (m < cs.b - 1e-9)
        if not viol.any():
            break
        work |= viol
    if W is None and "infeasible" not in status:
        return _solve_cvxpy(cs, NUC, "SCS")
    return W, lam, status, "scs-working-set", total_iter


# ------------------------------------------------------------- batched Frobenius
def _fro_batch(cs: ConstraintSet, chunk_bytes: float = 64e6, use_active: bool = True):
    """B Frobenius problems with unit b (N = n T constraints each, A_k = Delta_k z_k^T).

    ``use_active`` (numba present): the compiled exact active-set minimum-norm-point
    solver (:func:`attnsvm.svm.active.mnp_active`, Wolfe's method on
    G = (Delta Delta^T) o (Z Z^T), one problem at a time); the problems it leaves
    unresolved (iteration cap, rounding stall) and every problem without numba go through
    one vectorised minimum-norm-point IPM on their (B, N, N) Gram matrices and a batched
    exact active-set polish (:func:`_fro_batch_ipm`).

    Returns (W (B, d, e) NaN where rho = 0, lam (B, n, T), mu (B, n, T) the min-norm point
    (a Farkas candidate where rho ~ 0), solver names (B,), iterations)."""
    if not use_active or not active.available():
        return _fro_batch_ipm(cs, chunk_bytes)
    B = cs.batch_shape[0]
    n, T = cs.shape
    d = cs.d
    N = n * T
    mu, lam, W, rho2, st, it = active.mnp_active(
        cs.Delta.reshape(B, N, d), np.repeat(cs.Z, T, axis=1), cs.valid.reshape(B, N))
    names = np.array(["batch-mnp-active"] * B, dtype=object)
    lam = lam.reshape(B, n, T)
    mu = mu.reshape(B, n, T)
    its = int(it.max()) if B else 0
    bad = np.nonzero(st == active.FAILED)[0]
    if len(bad):
        Wf, lf, mf, nf, itf = _fro_batch_ipm(cs.take(bad), chunk_bytes)
        W[bad], lam[bad], mu[bad] = Wf, lf, mf
        names[bad] = [f"{x} (active: stalled)" for x in nf]
        its = max(its, itf)
    return W, lam, mu, names, its


def _fro_batch_ipm(cs: ConstraintSet, chunk_bytes: float = 64e6):
    """B Frobenius problems with unit b through one vectorised minimum-norm-point IPM on
    their (B, N, N) Gram matrices and a batched exact active-set polish.

    Returns (W (B, d, e) NaN where rho = 0, lam (B, n, T), mu (B, n, T) the min-norm point
    (a Farkas candidate where rho ~ 0), solver names (B,), iterations)."""
    B = cs.batch_shape[0]
    n, T = cs.shape
    d, e = cs.d, cs.e
    N = n * T
    W = np.full((B, d, e), np.nan)
    lam = np.zeros((B, n, T))
    mu_out = np.zeros((B, n, T))
    names = np.array(["batch-mnp-ipm"] * B, dtype=object)
    its = 0
    chunk = int(max(1, min(1024, chunk_bytes // (8 * N * N))))
    idx = np.arange(N)
    for s in range(0, B, chunk):
        sl = slice(s, min(B, s + chunk))
        D = cs.Delta[sl].reshape(-1, N, d)
        Zr = np.repeat(cs.Z[sl], T, axis=1)
        vf = cs.valid[sl].reshape(-1, N)
        G = np.matmul(D, D.transpose(0, 2, 1)) * np.matmul(Zr, Zr.transpose(0, 2, 1))
        mu, rho2, _, it = batched_mnp(G, vf)
        its = max(its, it)
        scale2 = np.diagonal(G, axis1=1, axis2=2).max(1)
        small = rho2 <= 1e-12 * np.maximum(scale2, 1e-300)  # (nearly) infeasible: no polish
        S = vf & (mu > 1e-6 * mu.max(1, keepdims=True)) & ~small[:, None]
        lp = np.zeros_like(mu)
        mp = np.zeros_like(mu)
        act = np.nonzero(S.any(1))[0]
        for _ in range(6):  # batched primal-dual active-set polish on G_SS lam_S = 1
            if len(act) == 0:
                break
            Sa = S[act]
            Sf = Sa.astype(float)
            Gs = G[act] * Sf[:, :, None] * Sf[:, None, :]
            Gs[:, idx, idx] += 1.0 - Sf
            ev, U = np.linalg.eigh(Gs)
            keep = ev > 1e-12 * np.maximum(ev.max(1, keepdims=True), 1e-300)
            inv = np.where(keep, 1.0 / np.where(keep, ev, 1.0), 0.0)
            Ut = U.transpose(0, 2, 1)

            def gsolve(r, U=U, Ut=Ut, inv=inv, Sf=Sf):
                return (U @ (inv * (Ut @ r[..., None])[..., 0])[..., None])[..., 0] * Sf

            la = gsolve(Sf)
            for _ in range(2):  # iterative refinement: residuals from W, not from G
                Wa = (D[act] * la[..., None]).transpose(0, 2, 1) @ Zr[act]
                ma = (np.matmul(D[act], Wa) * Zr[act]).sum(-1)
                la = la + gsolve((1.0 - ma) * Sf)
            Wa = (D[act] * la[..., None]).transpose(0, 2, 1) @ Zr[act]
            ma = (np.matmul(D[act], Wa) * Zr[act]).sum(-1)
            lp[act], mp[act] = la, ma
            neg = Sa & (la < -1e-10 * np.maximum(np.abs(la).max(1, keepdims=True), 1.0))
            viol = vf[act] & ~Sa & (ma < 1 - 1e-10)
            S[act] = (Sa & ~neg) | viol
            act = act[(neg | viol).any(1)]
        ok_p = (
            (lp >= -1e-9 * np.maximum(np.abs(lp).max(1, keepdims=True), 1.0)).all(1)
            & np.where(vf, mp >= 1 - 1e-10, True).all(1)
            & np.where(S, np.abs(mp - 1) <= 1e-9, True).all(1)
            & ~small & vf.any(1)
        )
        lam_ipm = np.where(rho2[:, None] > 0, mu / np.where(rho2 > 0, rho2, 1.0)[:, None], 0.0)
        lam_b = np.where(ok_p[:, None], np.maximum(lp, 0.0), lam_ipm)
        W_b = (D * lam_b[..., None]).transpose(0, 2, 1) @ Zr
        W_b = np.where((rho2 > 0)[:, None, None], W_b, np.nan)
        W[sl] = W_b
        lam[sl] = lam_b.reshape(-1, n, T)
        mu_out[sl] = mu.reshape(-1, n, T)
        names[sl] = np.where(ok_p, "batch-mnp-ipm+polish", "batch-mnp-ipm")
    return W, lam, mu_out, names, its


# ---------------------------------------------------------------- infeasibility
def farkas_lp(cs: ConstraintSet, max_entries: int = 20_000_000) -> np.ndarray | None:
    """A Farkas vertex: lam with lam >= 0 on inequalities, sum lam_k A_k = 0,
    sum lam_k b_k = 1, by the dual simplex (HiGHS) on one (unbatched) problem.

    By Gleeson & Ryan (1990) the supports of these vertices are the irreducible
    infeasible subsystems of M vec(W) >= b.  Returns lam (n, T), or None if the LP finds
    none (or the problem is too large: N d e > max_entries)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack

    ii, tt = np.nonzero(cs.valid)
    if len(ii) == 0 or len(ii) * cs.d * cs.e > max_entries:
        return None
    M = cs.dense()
    scale = np.linalg.norm(M, axis=1)
    scale[scale == 0] = 1.0
    Ms = M / scale[:, None]  # lambda' = lambda * scale keeps the LP well conditioned
    bs = cs.b[ii, tt] / scale
    free = cs.eqmask[ii, tt]
    A_eq = vstack([csr_matrix(Ms.T), csr_matrix(bs[None, :])]).tocsc()
    b_eq = np.zeros(A_eq.shape[0])
    b_eq[-1] = 1.0
    bounds = [(None, None) if f else (0, None) for f in free]
    c = np.where(free, 0.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = linprog(c, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs-ds")
    if res.status != 0 or res.x is None:
        return None
    lam = np.zeros(cs.valid.shape)
    lam[ii, tt] = res.x / scale
    return lam


def farkas_polish(cs: ConstraintSet, lam0: np.ndarray, iters: int = 3) -> np.ndarray:
    """Refine candidate Farkas multipliers on their support, vectorised over the batch.

    On the support K of ``lam0`` (B, n, T), solve C lam = r with C = [M_K^T; b_K^T],
    r = [0; 1] for the correction of least norm (iterative refinement: the residual
    C lam - r is recomputed from sum lam_k A_k each round, so the Gram-based solve
    (C^T C = G_KK + b b^T, pseudo-inverse by eigh) loses no digits in the result).
    An interior-point min-norm point or an LP vertex has residual ~1e-7; this brings it
    to ~1e-16 where the support carries a certificate.  Returns lam (B, n, T)."""
    lam0 = np.where(cs.valid, np.nan_to_num(np.asarray(lam0, float)), 0.0)
    B = lam0.shape[0]
    n, T = cs.shape
    mx = np.abs(lam0).max((1, 2), keepdims=True)
    supp = cs.valid & (np.abs(lam0) > 1e-9 * mx) & (mx > 0)
    flat = supp.reshape(B, -1)
    K = int(flat.sum(1).max()) if B else 0
    if K == 0:
        return lam0
    order = np.argsort(~flat, axis=1, kind="stable")[:, :K]
    km = np.take_along_axis(flat, order, 1)
    kf = km.astype(float)
    ii, tt = order // T, order % T
    bi = np.arange(B)[:, None]
    Dk = cs.Delta[bi, ii, tt] * kf[..., None]
    Zk = cs.Z[bi, ii] * kf[..., None]
    bk = cs.b[bi, ii, tt] * kf
    lam = lam0[bi, ii, tt] * kf
    lb = (lam * bk).sum(1)
    lam = lam / np.where(lb > 0, lb, 1.0)[:, None]
    G = np.matmul(Dk, Dk.transpose(0, 2, 1)) * np.matmul(Zk, Zk.transpose(0, 2, 1))
    H = G + bk[:, :, None] * bk[:, None, :]
    idx = np.arange(K)
    H[:, idx, idx] += 1.0 - kf
    ev, U = np.linalg.eigh(H)
    keep = ev > 1e-13 * np.maximum(ev.max(1, keepdims=True), 1e-300)
    inv = np.where(keep, 1.0 / np.where(keep, ev, 1.0), 0.0)
    for _ in range(iters):
        S = np.swapaxes(Dk * lam[..., None], 1, 2) @ Zk  # (B, d, e)
        g = ((Dk @ S) * Zk).sum(-1) + bk * ((lam * bk).sum(1) - 1.0)[:, None]
        delta = -(U @ (inv * (np.swapaxes(U, 1, 2) @ g[..., None])[..., 0])[..., None])[..., 0]
        lam = (lam + delta) * kf
    out = np.zeros((B, n, T))
    out[bi, ii, tt] = np.where(km, lam, 0.0)
    out = np.where(cs.valid, out, 0.0)
    # entries that came out of the refinement a rounding error below 0 are 0
    tiny = 1e-12 * np.abs(out).max((1, 2), keepdims=True)
    return np.where(cs.ineq & (out < 0) & (out > -tiny), 0.0, out)


def _conflict(lam: np.ndarray) -> tuple:
    """Sequences i in the support of a verified certificate lam (n, T)."""
    a = np.abs(lam)
    mx = a.max() if a.size else 0.0
    if mx <= 0:
        return ()
    return tuple(sorted({int(i) for i in np.nonzero((a > 1e-9 * mx).any(-1))[0]}))


def _conflicts(lam: np.ndarray, ok: np.ndarray) -> list:
    """[_conflict(lam[b]) if ok[b] else ()] for a batch lam (B, n, T), vectorised: the
    sequences i with |lam_it| > 1e-9 max |lam_b| for some t (:func:`_conflict_tuples`)."""
    B = len(lam)
    ok = np.asarray(ok, bool)
    if not ok.any():
        return [()] * B
    a = np.abs(lam)
    mx = a.max((1, 2), keepdims=True) if a.size else np.zeros((B, 1, 1))
    return _conflict_tuples((a > 1e-9 * mx).any(-1) & (mx[..., 0] > 0), ok)


def _conflict_tuples(hit: np.ndarray, ok: np.ndarray) -> list:
    """conflict_ of a batch from hit (B, n) bool: the tuple of the sequences i with
    hit[b, i] for each problem b with ok[b], () elsewhere.  Up to 12 sequences a row's
    bits index a table of the 2^n tuples (one lookup per problem); beyond, one nonzero
    pass over the hits, the B tuples cut from one list."""
    B, n = hit.shape
    hit = hit & np.asarray(ok, bool)[:, None]
    if n <= 12:
        tab = _subsets(n)
        return [tab[c] for c in (hit.astype(np.int64) << np.arange(n)).sum(1).tolist()]
    rows, cols = np.nonzero(hit)
    cl = cols.tolist()
    off = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=B))]).tolist()
    return [tuple(cl[off[b]:off[b + 1]]) for b in range(B)]


@functools.cache
def _subsets(n: int) -> tuple:
    """The 2^n tuples (i for i < n with bit i of c set), indexed by c."""
    return tuple(tuple(i for i in range(n) if c >> i & 1) for c in range(1 << n))


def farkas_conflict(cs: ConstraintSet, max_entries: int = 20_000_000) -> tuple[int, ...]:
    """Sequences of an irreducible infeasible subsystem of one problem (LP vertex of the
    Farkas system, polished and verified); () when no certificate is verified."""
    cs1 = cs.batched()
    lam = farkas_lp(cs1.take(0), max_entries)
    if lam is None:
        return ()
    lam = farkas_polish(cs1, lam[None])
    ok, _, lam = farkas_verify(cs1, lam)
    return _conflict(lam[0]) if ok[0] else ()


# ------------------------------------------------------------------------ engine
@dataclass
class Outcome:
    """Everything :func:`solve` found for B problems (normalised units)."""

    cert: Certificate
    status: np.ndarray
    solver: np.ndarray
    conflict: list
    n_iter: np.ndarray
    farkas_bound: np.ndarray
    farkas_lam: np.ndarray
    zero: np.ndarray
    time: float = 0.0
    extra: dict = field(default_factory=dict)


def _margins(cs: ConstraintSet, W: np.ndarray) -> np.ndarray:
    """m_k = Delta_k^T W z_k (B, n, T) of a batched set (0 where invalid): compiled
    (:func:`attnsvm.svm._active_kernels.margins_batch`) where numba is, else
    :meth:`ConstraintSet.margins`."""
    K = active._kernels()
    if K is None or cs.Delta.ndim != 4:
        return cs.margins(W)
    c = np.ascontiguousarray
    m = np.empty(cs.valid.shape)
    K.margins_batch(c(cs.Delta, dtype=float), c(cs.Z, dtype=float), c(cs.valid, dtype=bool),
                    c(W, dtype=float), m)
    return m


def _to_feasible(cs: ConstraintSet, W: np.ndarray, lam: np.ndarray):
    """Scale each answer to minimal margin exactly 1 (ratio = min_k m_k / b_k > 0): below 1
    W / ratio is feasible (a conic answer is often a hair infeasible), above 1 it is
    feasible with a smaller norm (a barrier point has margins > 1); lam along.  Not done
    when an equality with b != 0 fixes the scale."""
    fin = np.isfinite(W).all((1, 2))  # rows that are not finite (no answer) stay as they are
    with np.errstate(invalid="ignore", over="ignore"):
        m = _margins(cs, np.where(fin[:, None, None], W, 0.0))
        pos = cs.ineq & (cs.b > 0)
        ratio = np.where(pos, m / np.where(pos, cs.b, 1.0), np.inf).min((1, 2))
    rhs_eq = np.False_ if cs.eq is None else (cs.eqmask & (cs.b != 0)).any((1, 2))
    fix = (ratio > 0) & np.isfinite(ratio) & ~rhs_eq & fin
    r = np.where(fix, ratio, 1.0)
    # then times KAPPA = 1 + 2^-36 where scaled: margins a rounding-size above 1, which
    # the certificate's error bound proves (certificate.prove_margins) in one pass
    k = np.where(fix, KAPPA, 1.0)[:, None, None]
    # (S(lam) in ||W|| d||W||: degree 1, lam along)
    return W / r[:, None, None] * k, lam / r[:, None, None] * k


def _retry_gap(N: Norm) -> float:
    """Gap above which an answer is re-solved by the second solver: exact Frobenius
    solvers must reach GAP_OPTIMAL; conic solvers get GAP_INACCURATE."""
    return GAP_OPTIMAL if N == FRO else GAP_INACCURATE


def _fallback_key(N: Norm, used: str) -> str:
    """A second solver, different from the one used (``used``: the solver name)."""
    u = used.lower()
    if N == NUC and "barrier" in u:
        return "working_set"
    if N == NUC and "ipm" in u:
        return "barrier"
    if "clarabel" in u:
        return "scs"
    return "clarabel"


def _better(c_old: Certificate, c_new: Certificate) -> np.ndarray:
    """True where the new answer is better: feasible beats not; then the smaller gap."""
    g_old = np.where(np.isnan(c_old.gap), np.inf, c_old.gap)
    g_new = np.where(np.isnan(c_new.gap), np.inf, c_new.gap)
    return (c_new.feasible & ~c_old.feasible) | (c_new.feasible & c_old.feasible & (g_new < g_old))


@single_thread
def solve(cs: ConstraintSet, norm="fro", *, solver=None, tol: float = 1e-6,
          irreducible: bool = True, rank: int | None = None) -> Outcome:
    """Solve and certify the B problems of the (batched, normalised) set ``cs``.

    ``solver``: None (each norm's default: see :data:`SOLVERS` and the module docstring)
    or a solver name; ``tol``: activity tolerance of ``support_``; ``irreducible``: name
    an irreducible conflicting set (one LP per infeasible problem) rather than the
    support of the solver's Farkas multipliers; ``rank`` (B = 1 only): the rank-
    constrained heuristic, see :func:`_rank_heuristic`.
    """
    t0 = time.perf_counter()
    N = get_norm(norm)
    key = _solver_key(solver, N)
    B = cs.batch_shape[0]
    n, T = cs.shape
    d, e = cs.d, cs.e
    W = np.full((B, d, e), np.nan)
    lam = np.zeros((B, n, T))
    names = np.array(["none"] * B, dtype=object)
    hints = np.array([""] * B, dtype=object)
    iters = np.zeros(B, np.int64)
    cand = np.zeros((B, n, T))  # Farkas candidates
    has_cand = np.zeros(B, bool)
    need = cs.needs_margin()
    # 1. no margin needed: W = 0;  a zero constraint matrix with b > 0: infeasible
    W[~need] = 0.0
    names[~need] = "trivial"
    zero = cs.valid & (cs.row_norms() == 0) & (
        (cs.ineq & (cs.b > 0)) | (cs.eqmask & (cs.b != 0)))
    zb = zero.any((1, 2)) & need
    for b in np.nonzero(zb)[0]:
        i, t = np.argwhere(zero[b])[0]
        cand[b, i, t] = 1.0 / cs.b[b, i, t]
        has_cand[b] = True
        names[b] = "zero-constraint"
    # 2. solve the others
    todo = np.nonzero(need & ~zb)[0]
    use_active = key == "active" or (key in (None, "auto") and active.available())
    fro_batch = (N == FRO and key in (None, "auto", "active", "mnp") and len(todo) > 1
                 and n * T <= (MAX_BATCH_N_ACTIVE if use_active and key != "mnp" else MAX_BATCH_N)
                 and not cs.has_eq and bool(np.all(cs.b[cs.ineq] == 1.0)))
    if fro_batch:
        sub = cs if len(todo) == B else cs.take(todo)  # (todo is sorted: all of them, as is)
        Wb, lb, mu, nb, it = _fro_batch(sub, use_active=use_active and key != "mnp")
        W[todo], lam[todo], cand[todo], names[todo] = Wb, lb, mu, nb
        has_cand[todo] = True
        iters[todo] = it
    else:
        for b in todo:
            r = _raw_solve(cs.take(b), N, key)
            names[b], hints[b], iters[b] = r.solver, r.status, r.n_iter
            if r.W is not None:
                W[b] = r.W
                lam[b] = r.lam if r.lam is not None else 0.0
            if r.farkas is not None:
                cand[b], has_cand[b] = r.farkas, True
    # 3. the one certificate
    W, lam = _to_feasible(cs, W, lam)
    cert = certify(cs, W, lam, N, tol)
    # 4. Farkas candidates of problems without a feasible answer
    fk_ok = np.zeros(B, bool)
    fk_bound = np.zeros(B)
    fk_lam = np.zeros((B, n, T))

    def try_farkas(idx, lam_c, chunk=1024):
        for s in range(0, len(idx), chunk):  # chunks bound the (chunk, K, K) Gram memory
            ix, lc = idx[s:s + chunk], lam_c[s:s + chunk]
            # the candidates as they are (exact ones, e.g. the active set's, verify at
            # once), then the others polished; a batch of at most ``chunk`` problems is
            # verified whole (zero multipliers elsewhere), not copied problem by problem
            if B <= chunk:
                full = np.zeros((B, n, T))
                full[ix] = lc
                ok, bound, lv = (a[ix] for a in farkas_verify(cs, full))
            else:
                ok, bound, lv = farkas_verify(cs.take(ix), lc)
            redo = np.nonzero(~ok)[0]
            if len(redo):
                sub2 = cs.take(ix[redo])
                ok[redo], bound[redo], lv[redo] = farkas_verify(sub2, farkas_polish(sub2, lc[redo]))
            fk_ok[ix] = ok
            fk_bound[ix] = np.maximum(fk_bound[ix], bound)
            fk_lam[ix] = np.where(ok[:, None, None], lv, fk_lam[ix])

    try_farkas(np.nonzero(~cert.feasible & has_cand)[0], cand[~cert.feasible & has_cand])
    lp_done = np.zeros(B, bool)

    def try_lp(b):
        lp_done[b] = True
        lam_lp = farkas_lp(cs.take(b))
        if lam_lp is None:
            return
        sub = cs.take([b])
        ok, bound, lv = farkas_verify(sub, farkas_polish(sub, lam_lp[None]))
        if ok[0]:
            fk_ok[b] = True
            fk_lam[b] = lv[0]
            fk_bound[b] = max(fk_bound[b], bound[0])

    # 5. an LP vertex for problems the solver gave no answer for (it says "infeasible")
    for b in np.nonzero(need & ~zb & ~fk_ok & ~np.isfinite(cert.W).all((1, 2)))[0]:
        try_lp(b)
    # 6. second solver for answers that do not certify, or certify a large gap
    gap = np.where(np.isnan(cert.gap), np.inf, cert.gap)
    retry = need & ~zb & ~fk_ok & (~cert.feasible | (gap > _retry_gap(N)))
    for b in np.nonzero(retry)[0]:
        sub = cs.take([b])
        r = _raw_solve(sub.take(0), N, _fallback_key(N, str(names[b])))
        if r.W is None:
            continue
        Wn, ln = _to_feasible(sub, r.W[None], (r.lam if r.lam is not None else
                                               np.zeros((n, T)))[None])
        cn = certify(sub, Wn, ln, N, tol)
        if _better(cert.take([b]), cn)[0]:
            cert.put([b], cn)
            names[b] = f"{r.solver} (fallback)"
            hints[b] = r.status
            iters[b] += r.n_iter
    # 7. LP certificates for what is still unresolved, and irreducible sets where asked
    for b in np.nonzero(need & ~cert.feasible & ~lp_done
                        & (~fk_ok | (bool(irreducible) & ~zb)))[0]:
        try_lp(b)
    # a feasible answer and a verified Farkas certificate cannot both exist
    fk_ok &= ~cert.feasible
    status = np.where(
        cert.feasible,
        np.where(cert.gap <= GAP_OPTIMAL, "optimal",
                 np.where(cert.gap <= GAP_INACCURATE, "optimal_inaccurate", "suboptimal")),
        np.where(fk_ok, "infeasible", "uncertified")).astype(object)
    conflict = _conflicts(fk_lam, fk_ok)
    out = Outcome(cert=cert, status=status, solver=names, conflict=conflict, n_iter=iters,
                  farkas_bound=np.where(fk_ok, fk_bound, np.nan), farkas_lam=fk_lam,
                  zero=zero, time=time.perf_counter() - t0,
                  extra={"solver_status": hints, "n_fallback": int(retry.sum())})
    if rank is not None and B == 1 and cert.feasible[0]:
        _rank_heuristic(cs, out, N, int(rank), tol)
    out.time = time.perf_counter() - t0
    return out


def _rank_heuristic(cs: ConstraintSet, out: Outcome, N: Norm, m: int, tol: float) -> None:
    """rank(W) <= m (nonconvex), in place on ``out`` (B = 1).  If the convex solution
    already has numerical rank <= m (singular values > 1e-7 sigma_1) it is optimal: status
    suffix '(rank<=m: exact)'.  Otherwise a clearly-labelled HEURISTIC: U = top-m left
    singular vectors of the convex solution, the convex problem over W = U C
    (||U C|| = ||C|| for orthonormal U and unitarily invariant norms), certified on all
    constraints; status 'heuristic_rank' (gap_ relative to the convex lower bound)."""
    Wc = out.cert.W[0]
    s = np.linalg.svd(Wc, compute_uv=False)
    if int((s > 1e-7 * s[0]).sum()) <= m:
        out.status[0] = f"{out.status[0]} (rank<={m}: exact)"
        return
    U = np.linalg.svd(Wc)[0][:, :m]
    c1 = cs.take(0)
    sub = ConstraintSet(c1.Delta @ U, c1.Z, c1.valid, c1.b, c1.eq)
    C, lam, status, name, n_iter = _solve_cvxpy(sub, N, None)
    out.extra["convex_norm"] = float(out.cert.norm[0])
    if C is None:
        out.cert.W[0] = np.nan
        out.cert.feasible[0] = False
        out.status[0] = f"heuristic_rank_failed ({status})"
        out.solver[0] = name + "+rank"
        return
    Wn, ln = _to_feasible(cs, (U @ C)[None], lam[None])
    cn = certify(cs, Wn, ln, N, max(tol, 1e-5))
    out.cert.put([0], cn)
    out.status[0] = "heuristic_rank" if cn.feasible[0] else "heuristic_rank_failed"
    out.solver[0] = name + "+rank"
    out.n_iter[0] += n_iter


# --------------------------------------------------------------------- assembly
def _to_user_units(cs: ConstraintSet, out: Outcome, N: Norm, tol: float):
    """(W, norm, dual, representable, exp) in the caller's units: W = 2^-exp W_normalised
    (exact: a power of two), dual = 2^-2exp lam.  The certificate in ``out`` was computed
    on W_normalised; where 2^exp W does not give it back bit for bit (entries that went
    subnormal), the answer is re-certified from the returned W.  ``representable`` is
    False where a feasible W over- or underflows float64."""
    e = np.broadcast_to(np.asarray(cs.exp, dtype=np.int64), cs.batch_shape)
    c = out.cert
    W = _ldexp(c.W, -e)
    back = _ldexp(W, e)
    fin = np.isfinite(W).all((1, 2))
    amax_s = np.abs(np.where(np.isfinite(c.W), c.W, 0.0)).max((1, 2))
    amax = np.abs(np.where(fin[:, None, None], W, 0.0)).max((1, 2))
    rep = ~c.feasible | (fin & ((amax_s == 0) | (amax >= MIN_REPRESENTABLE)))
    redo = np.nonzero(c.feasible & rep & ~np.all(back == c.W, (1, 2)))[0]
    if len(redo):
        c.put(redo, certify(cs.take(redo), back[redo], c.lam[redo], N, tol))
    nrm = _ldexp(c.norm, -e)
    dual = _ldexp(c.lam, -2 * e)
    return W, nrm, dual, rep, e


def to_batch_solution(cs: ConstraintSet, out: Outcome, *, alpha, problem: str, vector: bool,
                      norm, tol: float) -> BatchSolution:
    """A :class:`BatchSolution` in the caller's units.  A problem whose solution is not
    representable in float64 gets feasible_ False and status 'not_representable'."""
    N = get_norm(norm)
    c = out.cert
    W, nrm, dual, rep, e = _to_user_units(cs, out, N, tol)
    feas = c.feasible & rep
    status = np.where(rep, out.status, "not_representable").astype(object)
    W = np.where(feas[:, None, None], W, np.nan)
    nrm = np.where(feas, nrm, np.inf)
    dual = np.where(feas[:, None, None], dual, 0.0)
    support = np.where(feas[:, None, None], c.support, False)
    margins = np.where(feas[:, None, None], c.margins, np.nan)
    nanf = np.where(feas, 1.0, np.nan)
    return BatchSolution(
        W_=W[..., 0] if vector else W, norm_=nrm, margin_=c.margin * nanf,
        violation_=c.violation * nanf, kkt_residual_=c.kkt * nanf, gap_=c.gap * nanf,
        dual_=dual, support_=support, margins_=margins, feasible_=feas, status_=status,
        solver_=out.solver, conflict_=out.conflict, alpha_=alpha, norm=N.name,
        problem=problem, time_=out.time, tol_active=tol,
        extra={"n_constraints": cs.valid.sum((1, 2)), "n_fallback": out.extra["n_fallback"],
               "scale_exp": e, "farkas_bound": out.farkas_bound,
               "lower_bound": _ldexp(c.lower, -e), "solver_status": out.extra["solver_status"]},
    )


def to_solution(cs: ConstraintSet, out: Outcome, *, alpha, problem: str, vector: bool,
                norm, tol: float) -> Solution:
    """The :class:`Solution` of a batch of one; raises :class:`NotRepresentableError`
    (with the normalised solution attached) if W over- or underflows float64."""
    N = get_norm(norm)
    c = out.cert
    W, nrm, dual, rep, e = _to_user_units(cs, out, N, tol)
    extra = {"n_constraints": int(cs.valid[0].sum()), "scale_exp": int(e[0]),
             "lower_bound": float(_ldexp(c.lower, -e)[0]), "solver_status": out.extra[
                 "solver_status"][0], "n_fallback": out.extra["n_fallback"]}
    for k in ("convex_norm",):
        if k in out.extra:
            extra[k] = float(_ldexp(np.array([out.extra[k]]), -e)[0])
    if out.status[0] == "infeasible":
        extra["farkas_bound"] = float(out.farkas_bound[0])
        extra["farkas_multipliers"] = out.farkas_lam[0]
        extra["zero_constraints"] = np.argwhere(out.zero[0])
    feas = bool(c.feasible[0])

    def sol(Wout, nrm_out, dual_out, status):
        return Solution(
            W_=(Wout[:, 0] if vector else Wout) if feas else None,
            norm_=float(nrm_out) if feas else float("inf"),
            margin_=float(c.margin[0]) if feas else float("nan"),
            violation_=float(c.violation[0]) if feas else float("nan"),
            kkt_residual_=float(c.kkt[0]) if feas else float("nan"),
            gap_=float(c.gap[0]) if feas else float("nan"),
            dual_=dual_out if feas else None, support_=c.support[0] if feas else None,
            margins_=c.margins[0] if feas else None, status_=str(status),
            solver_=str(out.solver[0]), feasible_=feas, conflict_=tuple(out.conflict[0]),
            alpha_=alpha, norm=N.name, problem=problem, n_iter_=int(out.n_iter[0]),
            time_=out.time, tol_active=tol, extra=extra)

    if not rep[0]:
        scaled = sol(c.W[0], c.norm[0], c.lam[0], out.status[0])
        big = np.abs(c.W[0]).max()
        raise NotRepresentableError(
            f"{problem}: the max-margin solution exists (certified: {out.status[0]}, "
            f"gap {c.gap[0]:.1e}) but ||W|| ~ {big:.3g} * 2^{-int(e[0])} "
            f"({'overflows' if int(e[0]) < 0 else 'underflows'} float64 at this input "
            f"scale); rescale the tokens or queries. The solution in units of 2^{-int(e[0])} "
            "is attached as .solution", solution=scaled, scale_exp=int(e[0]))
    return sol(W[0], nrm[0], dual[0], out.status[0])
