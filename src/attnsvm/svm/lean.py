"""The small single Frobenius ATT-SVM in one compiled call (the engine's own steps, none of
its per-call numpy overhead).

For a problem of ~100 constraints the compiled solve takes ~0.1 ms and the general engine
(:func:`attnsvm.svm.engine.solve`: constraint set, batch bookkeeping, certificate,
Farkas and retry logic, result assembly: ~100 numpy calls) several times that.  Here the
normalisation, the active-set solve, the rescaling to minimal margin 1 and the
certificate's sums run in :func:`attnsvm.svm._active_kernels.fro_single`; the
certificate's numbers are derived from those sums by the formulas of
:func:`attnsvm.svm.solution.certify`, and the answer is returned only when that
certificate says "optimal" (feasible, relative duality gap <= GAP_OPTIMAL) and W maps
back to the caller's units exactly.  Anything else (infeasible, no constraint, a zero
constraint, an unresolved or inaccurate solve, extreme scales) returns None and the
caller runs the general engine, which gives the same answer as before (Farkas
certificates, conflict sets, fallbacks, errors).  Where both apply they agree bit for bit
(tests/test_svm_lean.py).
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import active
from .solution import FEAS_TOL, GAP_OPTIMAL, Solution, _ldexp

__all__ = ["att_svm_lean", "MAX_LEAN_N"]

MAX_LEAN_N = active.GRAM_BLAS_N - 1  # n T up to which single problems take this path
# (larger problems: the general engine, whose overhead is then small against the solve)
_SOLVERS = (None, "auto", "fast", "active")


def applies(n: int, T: int, solver) -> bool:
    """Whether :func:`att_svm_lean` may be tried: Frobenius default / active solver,
    numba present, n T <= MAX_LEAN_N (the engine's rule picks the active-set solver
    there, with lazy Gram rows)."""
    key = solver if solver is None else str(solver).lower()
    return key in _SOLVERS and n * T <= MAX_LEAN_N and active.available()


def att_svm_lean(X: np.ndarray, z: np.ndarray, alpha: np.ndarray, valid: np.ndarray, *,
                 tol: float, problem: str = "att_svm") -> Solution | None:
    """The certified optimal :class:`Solution` of the Frobenius ATT-SVM of validated X
    (n, T, d), z (n, e), alpha (n,), valid (n, T), as :func:`attnsvm.att_svm` returns it;
    None where the general engine must decide (see the module docstring)."""
    t0 = time.perf_counter()
    K = active._kernels()
    n, T, d = X.shape
    e = z.shape[1]
    D = np.empty((n, T, d))
    Zs = np.empty((n, e))
    v = np.empty((n, T), bool)
    W = np.empty((d, e))
    lam = np.empty((n, T))
    mu = np.empty((n, T))
    m = np.empty((n, T))
    S = np.empty((d, e))
    info = np.zeros(8, np.int64)
    sums = np.zeros(8)
    K.fro_single(X, z, alpha, valid, 1e-12, 1e-13, 20 * n * T + 50, D, Zs, v, W, lam, mu,
                 m, S, info, sums)
    if info[0] != K.LEAN_OK or info[2] != active.OPTIMAL:
        return None
    # the certificate (solution.certify, Frobenius, inequalities with b = 1, lam given)
    margin, viol, nrm, dn, lb_num, wms, comp = (float(x) for x in sums[1:])
    if not all(math.isfinite(x) for x in (viol, nrm, dn, lb_num, wms, comp)):
        return None
    if not (viol <= FEAS_TOL and math.isfinite(nrm)):
        return None
    lower = lb_num / dn if dn > 0 and lb_num > 0 else 0.0
    fix = margin if 0 < margin < 1 else 1.0
    upper = nrm / fix
    gap = max(upper - lower, 0.0) / lower if lower > 0 else math.inf
    if not gap <= GAP_OPTIMAL:
        return None
    n2 = nrm * nrm if nrm > 0 else 1.0
    kkt = max(wms / math.sqrt(n2), comp / n2) if nrm > 0 else math.inf
    # back to the caller's units: W = 2^-exp W_normalised, exactly
    ex = np.array([info[1]])
    Wu = _ldexp(W[None], -ex)
    if not np.array_equal(_ldexp(Wu, ex), W[None]):
        return None  # entries went subnormal: the engine re-certifies
    amax = float(np.abs(Wu).max()) if Wu.size else 0.0
    if not (np.isfinite(Wu).all() and (amax >= np.finfo(float).tiny
                                       or float(np.abs(W).max()) == 0.0)):
        return None  # not representable: the engine raises NotRepresentableError
    support = v & (m <= 1.0 + tol)
    extra = {"n_constraints": int(v.sum()), "scale_exp": int(ex[0]),
             "lower_bound": float(_ldexp(np.array([lower]), -ex)[0]),
             "solver_status": "optimal", "n_fallback": 0}
    return Solution(
        W_=Wu[0], norm_=float(_ldexp(np.array([nrm]), -ex)[0]), margin_=margin,
        violation_=viol, kkt_residual_=kkt, gap_=gap, dual_=_ldexp(lam[None], -2 * ex)[0],
        support_=support, margins_=m, status_="optimal", solver_="mnp-active",
        feasible_=True, conflict_=(), alpha_=alpha, norm="fro", problem=problem,
        n_iter_=int(info[3]), time_=time.perf_counter() - t0, tol_active=tol, extra=extra)
