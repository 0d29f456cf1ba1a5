"""The max-margin problems of THEORY §5 (single instances).

All problems share one engine: a :class:`~attnsvm.svm.solution.ConstraintSet`
(constraints Delta_k^T W z_k >= b_k) solved either by the exact fast path
(Frobenius norm, :mod:`attnsvm.svm.fast`) or by a vectorised cvxpy model with ONE
matrix inequality ``M @ vec(W) >= b`` (M the (N, d*e) matrix of vec(Delta_k z_k^T)).
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from .fast import batched_mnp, nuclear_barrier, polish_fro, primal_ipm
from .solution import ConstraintSet, Solution, _norm_name, certify, primal_norm, single_thread

__all__ = [
    "att_svm",
    "prompt_svm",
    "seq2seq_svm",
    "head_svm",
    "relaxed_svm",
    "farkas_conflict",
    "scores",
    "opt_tokens",
]

INFEASIBLE_RHO = 1e-6  # rho / max||A_k|| below this: numerically infeasible (||W_mm|| > 1e6 / scale)
NUC_SLACK = 1e-6  # nuclear working set: Frobenius support + constraints with margin <= 1 + this


# ------------------------------------------------------------------------ validation
def _arr(x, name: str, ndim: tuple[int, ...], shape_doc: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a numeric array of shape {shape_doc}") from None
    if a.ndim not in ndim:
        raise ValueError(f"{name} must have shape {shape_doc}; got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or inf")
    return a


def _mask(mask, shape, name="mask") -> np.ndarray:
    if mask is None:
        return np.ones(shape, bool)
    m = np.asarray(mask)
    if m.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {m.shape}")
    return m.astype(bool)


def scores(X, y, v, mask=None) -> np.ndarray:
    """gamma_it = y_i v^T x_it, shape (..., n, T); masked tokens get -inf."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    v = np.asarray(v, dtype=float)
    g = y[..., None] * (X @ v)
    if mask is not None:
        g = np.where(np.asarray(mask, bool), g, -np.inf)
    return g


def opt_tokens(gamma) -> np.ndarray:
    """opt_i = argmax_t gamma_it (ties: the first, lowest index, maximiser), (..., n)."""
    return np.argmax(np.asarray(gamma), axis=-1)


def _alpha(alpha, n: int, T: int, valid: np.ndarray, X=None, y=None, v=None) -> np.ndarray:
    if alpha is None or (isinstance(alpha, str) and alpha == "opt"):
        if y is None or v is None:
            raise ValueError("alpha is required (or give y and v to use alpha = opt)")
        y = _arr(y, "y", (1,), "(n,)")
        v = _arr(v, "v", (1,), "(d,)")
        if y.shape != (n,):
            raise ValueError(f"y must have shape ({n},); got {y.shape}")
        if v.shape != (X.shape[-1],):
            raise ValueError(f"v must have shape ({X.shape[-1]},); got {v.shape}")
        return opt_tokens(scores(X, y, v, valid))
    a = np.asarray(alpha)
    if a.shape != (n,):
        raise ValueError(f"alpha must have shape ({n},); got {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        if not np.all(np.isfinite(a.astype(float))) or np.any(a != np.round(a)):
            raise ValueError("alpha must hold integer token indices")
        a = a.astype(int)
    if np.any(a < 0) or np.any(a >= T):
        raise ValueError(f"alpha out of range: token indices must lie in [0, {T - 1}]")
    if not valid[np.arange(n), a].all():
        bad = np.nonzero(~valid[np.arange(n), a])[0]
        raise ValueError(f"alpha selects masked tokens in sequences {bad.tolist()}")
    return a


def _constraints(X, Z, alpha, valid, b=None) -> ConstraintSet:
    n, T, _ = X.shape
    sel = X[np.arange(n), alpha]  # (n, d)
    Delta = sel[:, None, :] - X
    v = valid.copy()
    v[np.arange(n), alpha] = False
    Delta = np.where(v[..., None], Delta, 0.0)
    bb = np.ones((n, T)) if b is None else np.broadcast_to(np.asarray(b, float), (n, T)).copy()
    return ConstraintSet(Delta=Delta, Z=Z, valid=v, b=np.where(v, bb, 0.0))


# ----------------------------------------------------------------------- infeasibility
def farkas_conflict(cs: ConstraintSet, max_entries: int = 20_000_000) -> tuple[int, ...]:
    """Sequences of an irreducible infeasible subsystem (phase-1 LP, Farkas alternative).

    Finds a vertex lambda of {lambda >= 0, sum_k lambda_k A_k = 0, sum_k lambda_k b_k = 1}
    with the dual simplex (HiGHS).  By Gleeson & Ryan (1990) the supports of these
    vertices are exactly the irreducible infeasible subsystems of M vec(W) >= b.
    Returns () if the LP finds no certificate (the problem is then feasible).
    """
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack

    ii, tt = np.nonzero(cs.valid)
    if len(ii) == 0 or len(ii) * cs.d * cs.e > max_entries:
        return ()
    M = cs.dense()
    scale = np.linalg.norm(M, axis=1)
    scale[scale == 0] = 1.0
    Ms = M / scale[:, None]  # lambda' = lambda * scale keeps the LP well conditioned
    bs = cs.b[ii, tt] / scale
    A_eq = vstack([csr_matrix(Ms.T), csr_matrix(bs[None, :])]).tocsc()
    b_eq = np.zeros(A_eq.shape[0])
    b_eq[-1] = 1.0
    res = linprog(np.ones(len(ii)), A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method="highs-ds")
    if res.status != 0 or res.x is None:
        return ()
    lam = res.x
    supp = lam > 1e-9 * max(1.0, lam.max())
    return tuple(sorted({int(i) for i in ii[supp]}))


# ------------------------------------------------------------------------- cvxpy path
def _cvx_objective(cp, W, norm, vector: bool):
    if norm == "fro":
        return 0.5 * cp.sum_squares(W)
    if norm == "nuc":
        return cp.norm(cp.vec(W, order="C"), 2) if vector else cp.normNuc(W)
    if norm == "l1":
        return cp.norm1(cp.vec(W, order="C"))
    return cp.pnorm(cp.vec(W, order="C"), norm)


def _solve_cvxpy(cs: ConstraintSet, norm, solver=None, eps: float | None = None, warm=None):
    """Solve min ||W|| s.t. M vec(W) >= b with one vectorised cvxpy inequality.

    Returns (W or None, lam (n, T) for 1/2||W||^2 or None, status, solver_name, n_iter).
    """
    import cvxpy as cp

    ii, tt = np.nonzero(cs.valid)
    d, e = cs.d, cs.e
    M = cs.dense()
    b = cs.b[ii, tt]
    W = cp.Variable((d, e))
    con = M @ cp.vec(W, order="C") >= b
    eqs = []
    prob = cp.Problem(cp.Minimize(_cvx_objective(cp, W, norm, e == 1)), [con, *eqs])
    if solver is None:
        solver = "SCS" if (norm == "nuc" and e > 1) else "CLARABEL"
    solver = solver.upper()
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
        except cp.error.SolverError:
            if solver != "SCS":
                return _solve_cvxpy(cs, norm, "SCS", eps)
            return None, None, "solver_error", solver, 0
    status = str(prob.status)
    n_iter = int(getattr(prob.solver_stats, "num_iters", 0) or 0)
    if W.value is None or status not in ("optimal", "optimal_inaccurate"):
        return None, None, status, solver, n_iter
    Wv = np.asarray(W.value, dtype=float)
    lam = np.zeros(cs.valid.shape)
    if con.dual_value is not None:
        dv = np.asarray(con.dual_value, dtype=float).reshape(-1)
        if norm != "fro":  # multipliers of min ||W|| -> of min 1/2 ||W||^2
            dv = dv * primal_norm(Wv, norm)
        lam[ii, tt] = dv
    return Wv, lam, status, solver, n_iter


# ------------------------------------------------------------------------- dispatcher
@single_thread
def _solve(cs: ConstraintSet, *, norm, solver, tol, alpha, problem, vector, irreducible, rank=None):
    t0 = time.perf_counter()
    norm = _norm_name(norm)
    if cs.n_constraints == 0 or not (cs.valid & (cs.b > 0)).any():
        W0 = np.zeros((cs.d, cs.e))
        return certify(cs, W0, np.zeros(cs.valid.shape), norm=norm, status="optimal",
                       solver="trivial", alpha=alpha, problem=problem, vector=vector,
                       tol_active=tol)
    solver_key = None if solver is None else str(solver).lower()
    if norm == "fro" and solver_key in (None, "auto", "fast", "ipm", "mnp"):
        sol = _solve_fro_fast(cs, solver_key, tol=tol, alpha=alpha, problem=problem,
                              vector=vector, irreducible=irreducible, t0=t0)
        if sol is not None:
            return sol
        solver_key = None
    if norm == "nuc" and cs.e > 1 and solver_key in (None, "auto", "fast", "barrier"):
        W, lam, status, name, n_iter = _nuc_barrier_working_set(cs)
        if W is None and "infeasible" not in status:
            W, lam, status, name, n_iter = _nuc_working_set(cs)
    elif norm == "nuc" and cs.e > 1 and solver_key == "working_set":
        W, lam, status, name, n_iter = _nuc_working_set(cs)
    else:
        W, lam, status, name, n_iter = _solve_cvxpy(cs, norm, solver_key)
    if W is None:
        if "infeasible" in status:
            conflict = farkas_conflict(cs) if irreducible else ()
            return certify(cs, None, None, norm=norm, status=status, solver=name, alpha=alpha,
                           problem=problem, n_iter=n_iter, time_=time.perf_counter() - t0,
                           conflict=conflict)
        return certify(cs, None, None, norm=norm, status=status, solver=name, alpha=alpha,
                       problem=problem, n_iter=n_iter, time_=time.perf_counter() - t0)
    if norm == "fro":
        W, lam, ok = polish_fro(cs, W, lam)
        if ok:
            name += "+polish"
    sol = certify(cs, W, lam, norm=norm, status=status, solver=name, alpha=alpha,
                  problem=problem, n_iter=n_iter, time_=time.perf_counter() - t0,
                  tol_active=tol if norm == "fro" else max(tol, 1e-5), vector=vector,
                  rescale=True)
    if rank is not None and sol.feasible_ and not vector:
        sol = _rank_constrained(cs, sol, int(rank), t0)
    return sol


def _solve_fro_fast(cs, solver_key, *, tol, alpha, problem, vector, irreducible, t0):
    """Frobenius fast path. Default choice by shape: the dual minimum-norm-point solver on
    the N x N constraint Gram matrix when N <= d e (fewer constraints than unknowns), the
    structured primal IPM (d e x d e Newton systems) otherwise. Measured crossover (2 cores):
    N = 300, d e = 1024: mnp 0.05 s vs ipm 0.29 s; N = 1500, d e = 256: ipm 0.035 s vs
    mnp 0.75 s; N ~ d e: within 1.3x of each other."""
    N = cs.n_constraints
    unit_b = bool(np.all(cs.b[cs.valid] == 1.0))
    if unit_b and (solver_key == "mnp" or (solver_key != "ipm" and N <= cs.d * cs.e)):
        ii, tt = np.nonzero(cs.valid)
        M = cs.dense()
        G = (M @ M.T)[None]
        mu, rho2, conv, it = batched_mnp(G, np.ones((1, N), bool))
        mu_full = np.zeros(cs.valid.shape)
        mu_full[ii, tt] = mu[0]
        scale = cs.scale()
        rho = float(np.sqrt(max(rho2[0], 0.0)))
        if rho <= INFEASIBLE_RHO * scale:
            conflict = farkas_conflict(cs) if irreducible else ()
            if not conflict:
                conflict = tuple(sorted({int(i) for i in ii[mu[0] > 1e-6 * mu[0].max()]}))
            return certify(cs, None, None, norm="fro", status="infeasible", solver="mnp-ipm",
                           alpha=alpha, problem=problem, n_iter=it,
                           time_=time.perf_counter() - t0, conflict=conflict)
        W = cs.combine(mu_full) / rho**2
        lam = mu_full / rho**2
        name = "mnp-ipm"
    else:
        W, lam, status, it = primal_ipm(cs)
        if status != "optimal":
            return None
        name = "ipm"
    W, lam, ok = polish_fro(cs, W, lam)
    if ok:
        name += "+polish"
    return certify(cs, W, lam, norm="fro", status="optimal", solver=name, alpha=alpha,
                   problem=problem, n_iter=it, time_=time.perf_counter() - t0, tol_active=tol,
                   vector=vector, rescale=True)


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
    add every constraint of the full set violated by more than 1e-9 (relative) and, in
    these loose rounds, also those with margin < b (1 + ``add_slack``) (fewer rounds:
    measured 1.7 s vs 2.2 s at (100, 16, 32)), repeat from a cold start while a round adds
    more than ``warm_frac`` of the working set (a warm start at large t with many violated
    constraints was measured slower than a cold one); once a round adds fewer, continue
    the central path with gap ``gap_tol`` from its multipliers and t (new constraints enter
    strictly dual feasible, :func:`_nuc_warm_start`), and go on adding violated
    constraints, now with accurate warm solves, until none is left. At (100, 16, 32) this
    saved the third cold loose round: 0.84 s instead of 1.12 s.
    Certificate: W is divided by its minimal margin (exactly feasible, min margin 1); the
    working-set multipliers, 0 elsewhere, are dual feasible for the FULL problem, so
    sum lam b / ||sum lam A||_op is a valid lower bound and :func:`certify` reports the
    relative duality gap (measured ~1e-7 at (100, 16, 32)).
    """
    valid = cs.valid
    ii, tt = np.nonzero(valid)
    Uf, su, _ = np.linalg.svd(cs.Delta[ii, tt].T, full_matrices=False)
    U = Uf[:, su > 1e-12 * max(su.max(), 1e-300)]
    Vf, sv, _ = np.linalg.svd(cs.Z.T, full_matrices=False)
    V = Vf[:, sv > 1e-12 * max(sv.max(), 1e-300)]
    red = ConstraintSet(cs.Delta @ U, cs.Z @ V, valid, cs.b)
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
        status = "optimal_inaccurate"  # round limit: certify() still reports the true numbers
    W = U @ C @ V.T
    pos = valid & (cs.b > 0)
    if pos.any():  # scale to minimal margin exactly 1 (the barrier point has margins > b)
        ratio = float((cs.margins(W)[pos] / cs.b[pos]).min())
        if ratio > 0:
            W = W / ratio
    lam_full = np.zeros(valid.shape)
    lam_full[wi, wt] = lam * primal_norm(W, "nuc")  # multipliers of min 1/2 ||W||_*^2
    return W, lam_full, status, "barrier-working-set", total


def _nuc_working_set(cs: ConstraintSet, max_rounds: int = 20):
    """Nuclear norm by constraint generation: SCS on a working set, exact checks on all.

    Start from the Frobenius support (exact fast path) plus, per sequence, the tightest
    constraint; solve the SDP on the working set (SCS, eps 1e-9), add every constraint
    violated by more than 1e-9 and repeat.  The answer is rescaled by its minimal
    margin (exactly feasible) and certified on all constraints.
    """
    valid = cs.valid
    Wf, lf, st, _ = primal_ipm(cs) if cs.n_constraints > 600 else (None, None, "skip", 0)
    if st != "optimal":
        W0 = None
        work = valid.copy()
    else:
        mf = cs.margins(Wf)
        work = valid & ((lf > 1e-9 * lf.max()) | (mf <= 1 + NUC_SLACK))
        W0 = Wf
    # always include each sequence's tightest constraint under the current guess
    if W0 is not None:
        m = np.where(valid, cs.margins(W0), np.inf)
        t = m.argmin(1)
        ok = np.isfinite(m.min(1))
        work[np.nonzero(ok)[0], t[ok]] = True
    total_iter = 0
    W = lam = None
    status = "failed"
    for _ in range(max_rounds):
        sub = ConstraintSet(cs.Delta, cs.Z, work, cs.b)
        W, lam, status, _, n_iter = _solve_cvxpy(sub, "nuc", "SCS", eps=1e-9)
        total_iter += n_iter
        if W is None:
            break
        m = cs.margins(W)
        viol = valid & ~work & (m < cs.b - 1e-9)
        if not viol.any():
            break
        work |= viol
    if W is None and "infeasible" not in status:
        return _solve_cvxpy(cs, "nuc", "SCS")
    return W, lam, status, "scs-working-set", total_iter


def _rank_constrained(cs: ConstraintSet, sol: Solution, m: int, t0: float) -> Solution:
    """rank(W) <= m (nonconvex).  If the convex solution already has numerical rank
    <= m it is optimal and is returned with status suffix '(rank<=m: exact)'.
    Otherwise a clearly-labelled HEURISTIC: take U = top-m left singular vectors of
    the convex solution and solve the convex problem over W = U C (||U C|| = ||C||
    for orthonormal U); status 'heuristic_rank' (no optimality claim)."""
    if sol.rank() <= m:
        sol.status_ = f"{sol.status_} (rank<={m}: exact)"
        return sol
    U = np.linalg.svd(sol.W_)[0][:, :m]
    sub = ConstraintSet(cs.Delta @ U, cs.Z, cs.valid, cs.b)
    C, lam, status, name, n_iter = _solve_cvxpy(sub, sol.norm, None)
    if C is None:
        return certify(cs, None, None, norm=sol.norm, status=f"heuristic_rank_{status}",
                       solver=name, alpha=sol.alpha_, problem=sol.problem,
                       time_=time.perf_counter() - t0)
    out = certify(cs, U @ C, None, norm=sol.norm, status="heuristic_rank", solver=name + "+rank",
                  alpha=sol.alpha_, problem=sol.problem, n_iter=n_iter,
                  time_=time.perf_counter() - t0, rescale=True, tol_active=1e-5)
    out.dual_ = lam
    out.extra["convex_norm"] = sol.norm_
    return out


# ---------------------------------------------------------------------------- problems
def att_svm(X, z, alpha=None, *, y=None, v=None, norm="fro", rank=None, mask=None,
            solver=None, tol=1e-6, irreducible=True) -> Solution:
    """Attention SVM (ATT-SVM), THEORY §5:

        W_mm(alpha) = argmin ||W||  s.t.  (x_{i,alpha_i} - x_it)^T W z_i >= 1,
                                          t != alpha_i (valid tokens), all i.

    Parameters
    ----------
    X : (n, T, d) tokens.  z : (n, e) queries (usually e = d).
    alpha : (n,) selected tokens; default (None or "opt") argmax_t y_i v^T x_it (needs y, v).
    norm : "fro" (default), "nuc", "l1", or a float p > 1 (entrywise l_p).
    rank : optional m for the nuclear norm with rank(W) <= m (nonconvex): if the convex
        solution already has numerical rank <= m it is returned (exact, status says so);
        otherwise a heuristic (status "heuristic_rank"): the convex problem restricted to
        W = U C, U the top-m left singular vectors of the convex solution.
    mask : (n, T) bool, True = valid token.
    solver : None/"fast" (Frobenius: dual min-norm-point solver if n_constraints <= d e, else a
        structured primal IPM, then active-set polish; Clarabel as fallback;
        nuclear: structured dual log-barrier Newton method on a working set of
        constraints after reducing W to span(Delta) x span(z), see
        :func:`_nuc_barrier_working_set`, falling back to the SCS working set),
        "working_set" (nuclear: cvxpy + SCS working set), "ipm", "mnp", or a cvxpy solver
        name ("clarabel", "scs").
    tol : tolerance (relative to the unit margin) for reporting active constraints.
    irreducible : compute an irreducible conflicting set (LP) when infeasible.

    Returns a :class:`Solution` with ``W_`` (d, e); ``feasible_=False`` and
    ``conflict_`` (sequence indices) when no W satisfies the constraints.
    """
    X = _arr(X, "X", (3,), "(n, T, d)")
    n, T, d = X.shape
    z = _arr(z, "z", (2,), "(n, e)")
    if z.shape[0] != n:
        raise ValueError(f"z must have shape ({n}, e); got {z.shape}")
    valid = _mask(mask, (n, T))
    alpha = _alpha(alpha, n, T, valid, X, y, v)
    cs = _constraints(X, z, alpha, valid)
    if rank is not None and (int(rank) < 1):
        raise ValueError(f"rank must be a positive integer; got {rank}")
    return _solve(cs, norm=norm, solver=solver, tol=tol, alpha=alpha, problem="att_svm",
                  vector=False, irreducible=irreducible, rank=rank)


def prompt_svm(X, W=None, alpha=None, *, y=None, v=None, mask=None, solver=None, tol=1e-6,
               irreducible=True) -> Solution:
    """Prompt SVM (THEORY §5): p_mm = argmin ||p||_2 s.t. (k_{i,alpha_i} - k_it)^T p >= 1,

    keys k_it = W^T x_it.  X (n, T, d), W (d, d') fixed (default identity), alpha (n,).
    ``W_`` of the result is the vector p (d',).  Equivalent to :func:`att_svm` with
    tokens K = X W and queries z_i = 1 (e = 1).
    """
    X = _arr(X, "X", (3,), "(n, T, d)")
    n, T, d = X.shape
    Wk = np.eye(d) if W is None else _arr(W, "W", (2,), "(d, d')")
    if Wk.shape[0] != d:
        raise ValueError(f"W must have shape ({d}, d'); got {Wk.shape}")
    valid = _mask(mask, (n, T))
    alpha = _alpha(alpha, n, T, valid, X, y, v)
    cs = _constraints(X @ Wk, np.ones((n, 1)), alpha, valid)
    return _solve(cs, norm="fro", solver=solver, tol=tol, alpha=alpha, problem="prompt_svm",
                  vector=True, irreducible=irreducible)


def seq2seq_svm(X, alpha, causal: bool = False, mask=None, *, norm="fro", solver=None,
                tol=1e-6, irreducible=True) -> Solution:
    """Seq-to-seq attention SVM (SAtt-SVM), THEORY §5:

        min ||W||  s.t.  (x_{i,alpha_ik} - x_it)^T W x_ik >= 1   for t != alpha_ik
                         (causal: only t <= k), every sequence i and query k.

    X (n, T, d), alpha (n, T) selected key of each query (causal: alpha_ik <= k).
    The result's ``dual_``, ``support_``, ``margins_`` have shape (n, T, T) indexed
    [i, query k, key t]; ``conflict_`` lists sequences i.
    """
    X = _arr(X, "X", (3,), "(n, T, d)")
    n, T, d = X.shape
    valid = _mask(mask, (n, T))
    a = np.asarray(alpha)
    if a.shape != (n, T):
        raise ValueError(f"alpha must have shape ({n}, {T}); got {a.shape}")
    if np.any(a < 0) or np.any(a >= T):
        raise ValueError(f"alpha out of range: token indices must lie in [0, {T - 1}]")
    a = a.astype(int)
    ks = np.arange(T)
    if causal and np.any((a > ks[None, :]) & valid):
        raise ValueError("alpha selects a future token (alpha_ik > k) in causal mode")
    # flatten (i, k) into n*T "sequences" with key tokens X_i and query x_ik
    Xf = np.repeat(X, T, axis=0)  # (n*T, T, d)
    Zf = X.reshape(n * T, d)
    keyv = np.repeat(valid, T, axis=0)  # (n*T, T) valid keys
    qv = valid.reshape(-1)  # valid queries
    vf = keyv & qv[:, None]
    if causal:
        vf &= ks[None, :] <= np.tile(ks, n)[:, None]
    af = a.reshape(-1)
    sel_ok = vf[np.arange(n * T), af] | ~qv
    if not sel_ok.all():
        bad = sorted({int(i) // T for i in np.nonzero(~sel_ok)[0]})
        raise ValueError(f"alpha selects masked tokens in sequences {bad}")
    af = np.where(qv, af, 0)
    cs = _constraints(Xf, Zf, af, vf)
    sol = _solve(cs, norm=norm, solver=solver, tol=tol, alpha=a, problem="seq2seq_svm",
                 vector=False, irreducible=irreducible)
    for name in ("dual_", "support_", "margins_"):
        val = getattr(sol, name)
        if val is not None:
            setattr(sol, name, val.reshape(n, T, T))
    sol.conflict_ = tuple(sorted({int(c) // T for c in sol.conflict_}))
    sol.alpha_ = a
    return sol


def head_svm(R, y, p=2, *, alpha=None, solver=None, tol=1e-6) -> Solution:
    """Head SVM (THEORY §5): v_mm = argmin ||v||_p s.t. y_i v^T r_i >= 1.

    R (n, d) selected tokens r_i = x_{i,alpha_i} (or X (n, T, d) with ``alpha``), y (n,)
    in {-1, +1}; p = 2 (default) or p > 1 / "l1".  ``W_`` is v (d,); ``support_`` (n, 1)
    marks the support vectors (``support_indices_`` in ``extra``).
    """
    R = _arr(R, "R", (2, 3), "(n, d) or (n, T, d) with alpha")
    if R.ndim == 3:
        if alpha is None:
            raise ValueError("alpha is required when R is (n, T, d)")
        a = np.asarray(alpha)
        if a.shape != (R.shape[0],):
            raise ValueError(f"alpha must have shape ({R.shape[0]},); got {a.shape}")
        if np.any(a < 0) or np.any(a >= R.shape[1]):
            raise ValueError("alpha out of range")
        R = R[np.arange(R.shape[0]), a.astype(int)]
    n, d = R.shape
    y = _arr(y, "y", (1,), "(n,)")
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},); got {y.shape}")
    if not np.all(np.isin(y, (-1.0, 1.0))):
        raise ValueError("y must hold labels in {-1, +1}")
    cs = ConstraintSet(Delta=(y[:, None] * R)[:, None, :], Z=np.ones((n, 1)),
                       valid=np.ones((n, 1), bool), b=np.ones((n, 1)))
    norm = "fro" if p in (2, 2.0, "fro", "l2") else p
    sol = _solve(cs, norm=norm, solver=solver, tol=tol, alpha=alpha, problem="head_svm",
                 vector=True, irreducible=True)
    if sol.support_ is not None:
        sol.extra["support_indices"] = np.nonzero(sol.support_[:, 0])[0]
    return sol


def relaxed_svm(X, alpha, y=None, *, W=None, z=None, support=None, mask=None, solver=None,
                tol=1e-6) -> Solution:
    """Relaxed joint SVM (THEORY §5) for the attention parameter of a jointly trained (v, p):

        min ||p||  s.t. (k_{i,alpha_i} - k_it)^T p >= 1  for i in S,
                                                   >= 0  for i not in S,

    S = support sequences of the head SVM on r_i = x_{i,alpha_i} (computed from y when
    ``support`` is not given; ``support`` may be a bool (n,) mask or an index list).
    Prompt form with keys k = W^T x (W default identity); with ``z`` (n, e) the W form
    (x_{i,alpha_i} - x_it)^T W z_i instead.  Returns a Solution (``extra['S']`` = S).
    """
    X = _arr(X, "X", (3,), "(n, T, d)")
    n, T, d = X.shape
    valid = _mask(mask, (n, T))
    alpha = _alpha(alpha, n, T, valid)
    if support is None:
        if y is None:
            raise ValueError("relaxed_svm needs y (to compute the head-SVM support) or support")
        hs = head_svm(X[np.arange(n), alpha], y)
        if not hs.feasible_:
            raise ValueError("the head SVM on the selected tokens is infeasible: y not separable")
        S = hs.support_[:, 0]
    else:
        s = np.asarray(support)
        if s.dtype == bool:
            if s.shape != (n,):
                raise ValueError(f"support must have shape ({n},); got {s.shape}")
            S = s
        else:
            S = np.zeros(n, bool)
            S[s.astype(int)] = True
    b = np.where(S[:, None], 1.0, 0.0) * np.ones((1, T))
    if z is not None:
        z = _arr(z, "z", (2,), "(n, e)")
        cs = _constraints(X, z, alpha, valid, b)
        vector = False
    else:
        Wk = np.eye(d) if W is None else _arr(W, "W", (2,), "(d, d')")
        cs = _constraints(X @ Wk, np.ones((n, 1)), alpha, valid, b)
        vector = True
    sol = _solve(cs, norm="fro", solver=solver, tol=tol, alpha=alpha, problem="relaxed_svm",
                 vector=vector, irreducible=True)
    sol.extra["S"] = np.nonzero(S)[0]
    return sol
