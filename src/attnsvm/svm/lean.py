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

from .._parallel import thread_pool
from ..norms import FRO
from . import active, frobenius
from .certificate import farkas_prove, prove_margins, prove_unit_margins
from .constraints import build_constraints
from .farkas import conflict_tuples
from .solution import (
    FARKAS_BOUND,
    FEAS_TOL,
    GAP_OPTIMAL,
    BatchSolution,
    ConstraintSet,
    Solution,
    ldexp,
)

__all__ = ["att_svm_lean", "batch_lean", "MAX_LEAN_N", "warmup"]

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
    K = active.kernels()  # first: an empty numba cache is compiled before the timer starts
    t0 = time.perf_counter()
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
    info = np.zeros(5, np.int64)
    sums = np.zeros(8)
    K.fro_single(X, z, alpha, valid, 1e-12, 1e-13, 20 * n * T + 50, D, Zs, v, W, lam, mu,
                 m, S, info, sums)
    if info[0] != K.LEAN_OK or info[2] != active.OPTIMAL or not info[4]:
        return None
    if _lossy_tokens(X, valid):
        return None  # (tokens scaled into the subnormal range: the engine decides)
    # the certificate (solution.certify, Frobenius, inequalities with b = 1, lam given)
    margin, viol, nrm, dn, lb_num, wms, comp = sums[1:8].tolist()
    if not all(math.isfinite(x) for x in (viol, nrm, dn, lb_num, wms, comp)):
        return None
    if not math.isfinite(nrm):
        return None
    # the proof that every margin is >= 1 (certificate.prove_margins, the rounding-error
    # bound alone: what it leaves undecided goes to the engine, which decides it exactly)
    if not prove_unit_margins(D, Zs, v, W):
        return None
    lower = lb_num / dn if dn > 0 and lb_num > 0 else 0.0
    fix = margin if 0 < margin < 1 else 1.0
    upper = nrm / fix
    gap = max(upper - lower, 0.0) / lower if lower > 0 else math.inf
    if not gap <= GAP_OPTIMAL:
        return None
    n2 = nrm * nrm if nrm > 0 else 1.0
    kkt = max(wms / math.sqrt(n2), comp / n2) if nrm > 0 else math.inf
    # back to the caller's units: W = 2^-exp W_normalised, exactly (assemble.to_user_units;
    # multiplying by a normal power of two is solution.ldexp, bit for bit)
    k = int(info[1])
    if not -511 <= k <= 511:
        return None  # (the engine maps extreme scales)
    up, down, down2 = 2.0 ** k, 2.0 ** -k, 2.0 ** (-2 * k)
    with np.errstate(over="ignore", under="ignore"):
        Wu = W * down
        if not (Wu * up == W).all():
            return None  # entries went subnormal: the engine re-certifies
        # (Wu up == W: Wu is finite and |Wu| = |W| 2^-k exactly)
        wmax = float(np.abs(W).max()) if W.size else 0.0
        if not (wmax * down >= 2.2250738585072014e-308 or wmax == 0.0):  # (finfo.tiny)
            return None  # not representable: the engine raises NotRepresentableError
        dual = lam * down2
    extra = {"n_constraints": int(v.sum()), "scale_exp": k, "lower_bound": lower * down,
             "solver_status": "optimal", "n_fallback": 0}
    return Solution(
        W_=Wu, norm_=nrm * down, margin_=margin, violation_=viol, kkt_residual_=kkt,
        gap_=gap, dual_=dual, support_=v & (m <= 1.0 + tol), margins_=m, status_="optimal",
        solver_="mnp-active", feasible_=True, conflict_=(), alpha_=alpha, norm="fro",
        problem=problem, n_iter_=int(info[3]), time_=time.perf_counter() - t0,
        tol_active=tol, extra=extra)


def _lossy_tokens(X: np.ndarray, valid: np.ndarray) -> bool:
    """Whether scaling the valid tokens of X (n, T, d) (or a batch) to max |x| in [1/2, 1)
    could take a nonzero entry into the subnormal range (bits lost: the compiled path's
    differences are then not those of the caller's tokens)."""
    a = np.abs(X)
    if a.size and not (a < float(a.max()) * 2.0 ** -1020).any():
        return False  # (no entry below the threshold of the largest token, masked included)
    a = a[valid]
    mx = float(a.max()) if a.size else 0.0
    if not mx > 0:
        return False
    small = a < mx * 2.0 ** -1020  # (a nonzero one among them: bits lost)
    return bool(small.any()) and bool((a[small] > 0).any())


def _user_constraints(X, z, alpha, valid, io) -> ConstraintSet:
    """The constraint set of problems ``io`` (None: all) of a batch in the caller's units,
    (x_{i,alpha_i} - x_it) rounded (its error, at most u |.|, in the certificate's bounds:
    ``exact`` False); entries at alpha and masked tokens are invalid (their values are not
    read by the bounds)."""
    if io is not None:
        X, z, alpha, valid = X[io], z[io], alpha[io], valid[io]  # (copies)
    B, n = alpha.shape
    sel = np.take_along_axis(X, alpha[:, :, None, None], 2)  # (B, n, 1, d) x_{i,alpha_i}
    with np.errstate(over="ignore", invalid="ignore"):  # (into X's copy: one allocation)
        D = np.subtract(sel, X, out=X if io is not None else None)
    v = valid if io is not None else valid.copy()
    v[np.arange(B)[:, None], np.arange(n)[None, :], alpha] = False
    return ConstraintSet(D, z, v, v.astype(float), None, np.zeros(B, np.int64), exact=False)


def batch_applies(B: int, n: int, T: int, solver) -> bool:
    """Whether :func:`batch_lean` may be tried: Frobenius default / active solver, numba
    present, B >= 2 and n T <= MAX_BATCH_N_ACTIVE (where the engine runs the batch through
    the compiled active-set solver)."""
    key = solver if solver is None else str(solver).lower()
    return key in _SOLVERS and B >= 2 and n * T <= frobenius.MAX_BATCH_N_ACTIVE and active.available()


def batch_lean(X: np.ndarray, z: np.ndarray, alpha: np.ndarray, valid: np.ndarray, xexp, *,
               solver, tol: float, irreducible: bool, problem: str, vector: bool,
               max_iter: int | None = None):
    """B Frobenius problems (validated X (B, n, T, d) divided by 2^xexp, z (B, n, e), alpha
    (B, n), valid (B, n, T)) as :func:`attnsvm.svm.engine.solve` and
    :func:`~attnsvm.svm.engine.to_batch_solution` give them, each problem's steps in one
    compiled call (:func:`attnsvm.svm._active_kernels.fro_settle_batch`, in threads), the
    verdict included.

    A problem is settled there when its certificate (from the returned W, the formulas of
    :func:`attnsvm.svm.solution.certify`) says "optimal", or, where the solver found the
    origin in the convex hull (rho ~ 0), when its minimum-norm point mu passes the Farkas
    check of :func:`~attnsvm.svm.solution.farkas_verify` (the same compiled function,
    :func:`~attnsvm.svm._active_kernels._farkas_one`) ("infeasible"; with
    ``irreducible`` those go to the engine, which names an irreducible conflict by LP).
    Every other problem (no constraint, a zero constraint, a stalled or inaccurate solve,
    extreme scales, a Farkas candidate that needs polishing) is solved by the engine
    itself, as before.  Settled problems carry the engine's numbers bit for bit, except
    the ``lower_bound`` of infeasible ones (the weak-duality bound of the solver's last
    multipliers mu / rho^2, rho ~ 0: W = sum_k lam_k A_k is summed here in another order
    than numpy's, and cancels to ~ rho).  ``max_iter``: the solver's major-cycle cap
    (default 20 n T + 50, as :func:`attnsvm.svm.active.mnp_active`; tests use a tiny cap
    to send problems to the engine)."""
    from . import engine

    K = active.kernels()  # first: an empty numba cache is compiled before the timer starts
    t0 = time.perf_counter()
    c = np.ascontiguousarray
    B, n, T, d = X.shape
    e = z.shape[2]
    X, z = c(X, dtype=float), c(z, dtype=float)
    alpha, valid = c(alpha, dtype=np.int64), c(valid, dtype=bool)
    xexp = c(np.broadcast_to(np.asarray(xexp, np.int64), (B,)))
    info = np.zeros((B, 5), np.int64)
    mi = 20 * n * T + 50 if max_iter is None else int(max_iter)  # (as mnp_active)
    # the answers as returned: W_, [norm, margin, violation, kkt, gap, lower_bound,
    # farkas_bound, verdict, n_constraints], dual_, support_, margins_, conflict hits
    Wo = np.empty((B, d, e))
    sc = np.empty((B, 9))
    dual = np.empty((B, n, T))
    sup = np.empty((B, n, T), bool)
    margins = np.empty((B, n, T))
    hit = np.empty((B, n), bool)
    fko = np.zeros((B, n, T))
    args = (X, z, alpha, valid, xexp, 1e-12, 1e-13, mi, float(tol), bool(irreducible),
            FEAS_TOL, GAP_OPTIMAL, FARKAS_BOUND, info, Wo, sc, dual, sup, margins, hit, fko)
    if B >= active.PARALLEL_B:  # slices in threads, as mnp_active
        thread_pool(K.fro_settle_batch, B, *args, per_thread=active.PER_THREAD)
    else:
        K.fro_settle_batch(*args, 0, B)
    verdict = sc[:, 7]
    ex = info[:, 1]
    # the kernel's verdicts are a screen; the proofs are the plain ones (certificate.py):
    # every "optimal" has its margins proven here (the rounding-error bound on the exact
    # data, undecided constraints in exact arithmetic), every "infeasible" its Farkas
    # certificate (farkas_prove, as the engine's farkas_verify); the others: the engine
    opt = verdict == K.SETTLED_OPT
    inf = verdict == K.SETTLED_INF
    if opt.any() or inf.any():
        io = np.nonzero(opt | inf)[0]
        # in the caller's units (no normalisation: the bounds hold at any scale), X as given
        # here (the caller's tokens divided by 2^xexp), so W 2^xexp (exact where it maps
        # back bit for bit; elsewhere the engine decides)
        o, f = opt[io], inf[io]
        good = np.zeros(len(io), bool)
        Wx = Wo[io[o]]
        if xexp[io[o]].any():
            Wx = ldexp(Wx, xexp[io[o]])
            back = np.all(ldexp(Wx, -xexp[io[o]]) == Wo[io[o]], (1, 2))
        else:
            back = True
        if o.any():  # (each subset's constraints built directly: no copy of a full set)
            good[o] = prove_margins(_user_constraints(X, z, alpha, valid, io[o]), Wx) & back
        if f.any():
            good[f] = farkas_prove(_user_constraints(X, z, alpha, valid, io[f]),
                                   fko[io[f]])[0]
        if not good.all():  # (e.g. tokens at 2^600: over/underflow) once more, normalised
            j = np.nonzero(~good)[0]
            cn = build_constraints(X[io[j]], z[io[j]], alpha[io[j]], valid[io[j]],
                                          x_exp=xexp[io[j]], exact=False)
            oj, fj = o[j], f[j]
            if oj.any():
                Wn = ldexp(Wo[io[j[oj]]], np.asarray(cn.exp)[oj])  # (exact: kernel-checked)
                good[j[oj]] = prove_margins(cn.take(np.nonzero(oj)[0]), Wn)
            if fj.any():
                good[j[fj]] = farkas_prove(cn.take(np.nonzero(fj)[0]), fko[io[j[fj]]])[0]
        bad = io[~good]
        verdict[bad] = K.TO_ENGINE
        opt[bad] = inf[bad] = False
        sc[io[f & good], 6] = np.inf  # proven: no W at all (solution.farkas_verify)
    out = dict(
        W_=Wo, norm_=sc[:, 0], margin_=sc[:, 1], violation_=sc[:, 2], kkt_residual_=sc[:, 3],
        gap_=sc[:, 4], dual_=dual, support_=sup, margins_=margins, feasible_=opt,
        status_=np.where(opt, "optimal", "infeasible").astype(object),
        solver_=np.full(B, "batch-mnp-active", dtype=object), conflict_=conflict_tuples(hit, inf))
    extra = {"n_constraints": sc[:, 8].astype(np.int64), "n_fallback": 0, "scale_exp": ex.copy(),
             "farkas_bound": sc[:, 6].copy(), "lower_bound": sc[:, 5].copy(),
             "solver_status": np.full(B, "", dtype=object)}
    rest = np.nonzero(verdict == K.TO_ENGINE)[0]
    if len(rest):  # the engine's own path for these (a batch of >= 2, as here)
        sub = rest if len(rest) > 1 else np.array([rest[0], 1 - rest[0] if B == 2 else
                                                   (rest[0] + 1) % B])
        cs = build_constraints(X[sub], z[sub], alpha[sub], valid[sub], x_exp=xexp[sub])
        o = engine.solve(cs, FRO, solver=solver, tol=tol, irreducible=irreducible)
        bs = engine.to_batch_solution(cs, o, alpha=alpha[sub], problem=problem, vector=False,
                                      norm=FRO, tol=tol)
        k = len(rest)
        for f in out:
            val = getattr(bs, f)
            if f == "conflict_":
                for j, b in enumerate(rest):
                    out[f][b] = val[j]
            else:
                out[f][rest] = val[:k]
        for f in ("n_constraints", "scale_exp", "farkas_bound", "lower_bound", "solver_status"):
            extra[f][rest] = bs.extra[f][:k]
        extra["n_fallback"] = bs.extra["n_fallback"]
    if vector:
        out["W_"] = out["W_"][..., 0]
    return BatchSolution(**out, alpha_=alpha, norm="fro", problem=problem,
                         time_=time.perf_counter() - t0, tol_active=tol, extra=extra)


def warmup() -> bool:
    """Compile (or load from numba's disk cache) the active-set kernels, the compiled
    single and batched paths and the Farkas screen on tiny problems; returns whether numba
    is available.  (Here rather than in :mod:`attnsvm.svm.active`, which this module
    imports: no import cycle.)"""
    from .solution import farkas_verify

    if not active.available():
        return False
    rng = np.random.default_rng(0)
    N = active.GRAM_BLAS_N
    active.mnp_active(rng.standard_normal((2, 3, 2)), np.ones((2, 3, 1)), np.ones((2, 3), bool))
    active.mnp_active(rng.standard_normal((1, N, 2)), np.ones((1, N, 1)), np.ones((1, N), bool))
    att_svm_lean(rng.standard_normal((2, 3, 2)), rng.standard_normal((2, 2)),
                 np.zeros(2, np.int64), np.ones((2, 3), bool), tol=1e-6)
    batch_lean(rng.standard_normal((2, 2, 3, 2)), np.ones((2, 2, 1)), np.zeros((2, 2), np.int64),
               np.ones((2, 2, 3), bool), 0, solver=None, tol=1e-6, irreducible=False,
               problem="prompt_svm", vector=True)  # the batched path (fro_settle_batch)
    cs = ConstraintSet(np.ones((1, 1, 2, 2)), np.ones((1, 1, 1)), np.ones((1, 1, 2), bool),
                       np.ones((1, 1, 2)))
    farkas_verify(cs, np.ones((1, 1, 2)))
    from .engine import _margins
    from .solution import _fro_sums

    cs = ConstraintSet(rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 2)),
                       np.ones((1, 2, 3), bool), np.ones((1, 2, 3)))
    _margins(cs, np.ones((1, 2, 2)))  # the engine's margins and the Frobenius certificate
    _fro_sums(cs, np.ones((1, 2, 2)), np.ones((1, 2, 3)))
    return True
