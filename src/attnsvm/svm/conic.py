"""Any norm by cvxpy: the norm's own convex expression and a conic solver (Clarabel, SCS).

    W, lam, status, solver, n_iter = solve_cvxpy(cs, norm, solver=None)

The general path behind every norm without a fast solver of its own, the second solver of
the retry rule (:mod:`attnsvm.svm.strategy`) and the inner solver of the SCS nuclear
working set (:mod:`attnsvm.svm.nuclear`).
"""

from __future__ import annotations

import numpy as np

from ..norms import Norm
from .constraints import ConstraintSet

__all__ = ["solve_cvxpy", "solve_quietly"]


def solve_quietly(prob, solver: str, warm_start: bool, opts: dict) -> int:
    """``prob.solve(solver=solver, warm_start=warm_start, **opts)`` as cvxpy runs it
    (``get_problem_data``, the chain's ``solve_via_data``, ``invert``, ``unpack``), without
    the UserWarning cvxpy issues for an inaccurate solution: the caller reads the status
    ("optimal_inaccurate") itself, and the process's warnings filters are not touched (a
    ``warnings.catch_warnings`` block is not thread-safe). Returns the solver's iterations;
    a solver failure raises cvxpy's SolverError, as ``solve`` does."""
    import cvxpy as cp
    from cvxpy import settings

    data, chain, inverse = prob.get_problem_data(solver, solver_opts=opts)
    raw = chain.solve_via_data(prob, data, warm_start, False, dict(opts))
    sol = chain.invert(raw, inverse)
    if sol.status in settings.ERROR:
        raise cp.error.SolverError(f"Solver {solver!r} failed")
    prob.unpack(sol)
    return int((sol.attr or {}).get(settings.NUM_ITERS, 0) or 0)


def solve_cvxpy(cs: ConstraintSet, N: Norm, solver=None, eps: float | None = None, warm=None):
    """min ||W|| s.t. M_in vec(W) >= b_in, M_eq vec(W) == b_eq (cvxpy, vectorised
    constraints; the norm's own expression).  ``solver``: a cvxpy solver name, or None:
    the norm's own default (``Norm.solver``; vectors, e = 1: Clarabel, every norm then
    being a vector norm).  The project's choice per norm (:data:`attnsvm.svm.strategy.
    STRATEGIES`, e.g. Clarabel for the spectral norm) is passed in by
    :func:`attnsvm.svm.strategy.solve_conic`.  A solver error retries once with SCS.

    Returns (W or None, lam (n, T) for 1/2||W||^2 or None, status, solver_name, n_iter).
    The multipliers mu of whatever objective cvxpy minimised are brought to those of
    1/2||W||^2 by the norm-free identity sum_k lam_k b_k = ||W||^2 at the optimum.
    """
    import cvxpy as cp

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
    solver = (solver or (N.solver if e > 1 else "CLARABEL")).upper()
    kw = {}
    if solver == "SCS":
        acc = eps if eps is not None else 1e-8
        kw = dict(eps_abs=acc, eps_rel=acc, max_iters=200_000)
    elif solver == "CLARABEL":
        acc = eps if eps is not None else 1e-10
        kw = dict(tol_gap_abs=acc, tol_gap_rel=acc, tol_feas=acc, tol_ktratio=1e-8, max_iter=400)
    if warm is not None:
        W.value = warm
    try:
        n_iter = solve_quietly(prob, solver, warm is not None, kw)
    except (cp.error.SolverError, ValueError, ArithmeticError) as exc:
        if solver != "SCS":
            return solve_cvxpy(cs, N, "SCS", eps)
        return None, None, f"solver_error: {exc}", solver, 0
    status = str(prob.status)
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

