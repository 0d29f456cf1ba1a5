"""The compiled fast path of the Frobenius strategy (the ``fast_single`` / ``fast_batch``
fields of its row in :data:`attnsvm.svm.strategy.STRATEGIES`): the engine's steps for
small problems with none of its per-call numpy overhead, and the same answers.

For a problem of ~100 constraints the compiled solve takes ~0.1 ms and the general engine
(:func:`attnsvm.svm.engine.solve`: constraint set, batch bookkeeping, certificate,
Farkas and retry logic, result assembly: ~100 numpy calls) several times that.  Here the
normalisation, the active-set solve and the rescaling to minimal margin 1 run in one
compiled call per problem (:func:`attnsvm.svm._active_kernels.fro_single`,
:func:`~attnsvm.svm._active_kernels.fro_solve_batch`), which returns the solution (W,
the multipliers lam, the minimum-norm point mu) and nothing else; the status is decided
as the engine decides it, in plain numpy: the certificate of all B answers in one
vectorised pass (:func:`attnsvm.svm.unit_certificate.certify_unit`, the formulas and
numbers of :func:`attnsvm.svm.certificate.certify`, every margin proven by the rigorous
rounding-error bound; a single problem's by
:func:`~attnsvm.svm.unit_certificate.unit_one_core`, the proof and the status numbers of
:func:`~attnsvm.svm.unit_certificate.certify_unit_one` in half the numpy calls, the numbers
that decide nothing, kkt_residual_, margins_, support_, dual_, computed where they are first
read: :class:`~attnsvm.svm.result.DeferredSolution`), the Farkas candidates of the
problems the solver found infeasible proven by :func:`attnsvm.svm.farkas.farkas_verify`;
in batches, the margins the bound leaves undecided (a rounding-size from 1) proven on the
exact data of the engine's constraint set of those few problems, by the compensated
enclosure :func:`attnsvm.svm.certificate.margins_dot2`, else by the engine's own proof
(:func:`~attnsvm.svm.certificate.prove_margins`, rational arithmetic;
:func:`_exact_margins`), the results mapped to the caller's
units by :mod:`attnsvm.svm.assemble` (batches; a single problem as
:func:`~attnsvm.svm.assemble.to_solution` maps it, without its re-certification, which
cannot apply: W must map back exactly).  A problem is settled here when its certificate
says "optimal" and W maps back to the caller's units exactly, or (batches, unless
``irreducible``) when a Farkas certificate is proven ("infeasible").  Every other problem
(no constraint, a zero constraint, an unresolved or inaccurate solve, a margin the bound
leaves undecided (single problems; in batches, one the exact data refutes), extreme
scales, a Farkas candidate that needs polishing) goes through
the engine itself, which gives the same answer as before (fallbacks, LP certificates,
errors).  Where both apply they agree bit for bit (tests/test_svm_lean.py), except the
``lower_bound`` of infeasible problems (from the W = sum_k lam_k A_k of the solver's last
multipliers mu / rho^2, rho ~ 0, summed here in another order than numpy's).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from .._parallel import thread_pool
from ..norms import FRO
from . import active, frobenius
from .assemble import MIN_REPRESENTABLE, to_batch_solution
from .certificate import GAP_OPTIMAL, SLACK, _exact_data, margins_dot2, prove_margins, verdict
from .constraints import ConstraintSet, build_constraints, ldexp
from .farkas import conflicts, farkas_verify
from .records import Outcome
from .result import BatchSolution, DeferredSolution, Solution
from .unit_certificate import certify_unit, unit_one_core

__all__ = ["att_svm_lean", "batch_lean", "applies", "batch_applies", "MAX_LEAN_N", "warmup"]

MAX_LEAN_N = active.GRAM_BLAS_N - 1  # n T up to which single problems take this path
# (larger problems: the general engine, whose overhead is then small against the solve)
_KEYS = (None, "auto", "active")  # the solver keys (strategy.solver_key) it stands for
_MIN_NORMAL = 2.0 ** -1022  # the least normal float64


def applies(n: int, T: int, key) -> bool:
    """Whether :func:`att_svm_lean` may be tried (the Frobenius row's ``fast_single_applies``):
    the default or active-set solver (``key`` from :func:`attnsvm.svm.strategy.solver_key`),
    numba present, n T <= MAX_LEAN_N (where the engine's rule picks the active-set solver,
    with lazy Gram rows)."""
    return key in _KEYS and n * T <= MAX_LEAN_N and active.available()


def batch_applies(B: int, n: int, T: int, key) -> bool:
    """Whether :func:`batch_lean` may be tried (the Frobenius row's ``fast_batch_applies``):
    the default or active-set solver, numba present, B >= 2 and n T <= MAX_BATCH_N_ACTIVE
    (where the engine runs the batch through the compiled active-set solver)."""
    return (key in _KEYS and B >= 2 and n * T <= frobenius.MAX_BATCH_N_ACTIVE
            and active.available())


def _in_user_units(W: np.ndarray, ex: np.ndarray) -> np.ndarray:
    """(B,) bool: W (B, d, e) (normalised) maps to the caller's units 2^-ex W and back bit
    for bit, and the largest entry there is a normal float64 (or W = 0): what
    :func:`attnsvm.svm.assemble.to_user_units` then returns without re-certifying."""
    Wu = ldexp(W, -ex)
    back = np.all(ldexp(Wu, ex) == W, (1, 2))
    amax = np.abs(np.where(np.isfinite(Wu), Wu, 0.0)).max((1, 2))
    return back & ((amax >= MIN_REPRESENTABLE) | (np.abs(W).max((1, 2)) == 0))


def _outcome(cert, status, conflict, fk_bound, fk_lam, n_iter, name: str, hint: str, t0):
    """The engine's :class:`~attnsvm.svm.records.Outcome` of k settled problems."""
    k = len(status)
    n, T = fk_lam.shape[1:]
    return Outcome(cert=cert, status=status, solver=np.full(k, name, dtype=object),
                   conflict=conflict, n_iter=n_iter, farkas_bound=fk_bound, farkas_lam=fk_lam,
                   zero=np.zeros((k, n, T), bool), time=time.perf_counter() - t0,
                   extra={"solver_status": np.full(k, hint, dtype=object), "n_fallback": 0})


def _unit_set(D, Zs, v, ex) -> ConstraintSet:
    """The (normalised) constraint set of the kernel's data: D_k^T W z_k >= 1 on v, the
    differences rounded once (``exact`` False: their error is in the bounds)."""
    return ConstraintSet(D, Zs, v, v.astype(float), None, ex, exact=False)


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
    info = np.zeros(5, np.int64)
    K.fro_single(X, z, alpha, valid, 1e-12, 1e-13, 20 * n * T + 50, D, Zs, v, W, lam, mu,
                 info)
    verdict, k, status, n_iter, finite = info.tolist()  # (Python ints)
    if verdict != K.LEAN_OK or status != active.OPTIMAL or not finite or not -511 <= k <= 511:
        return None  # (extreme scales: the engine decides)
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        cert = unit_one_core(D, Zs, v, W, lam)  # (certify_unit_one; W is finite: info)
        if cert is None or not cert.gap <= GAP_OPTIMAL:
            return None  # (the engine decides: the exact margins, a scale-up, the fallbacks)
        # back to the caller's units as assemble.to_solution maps them (W 2^-k, dual
        # 2^-2k: products with normal powers of two, as constraints.ldexp), where W maps
        # back exactly (then |Wu| = |W| 2^-k exactly: its largest entry is max |W| down)
        down = 2.0 ** -k
        Wu = W * down
        if k > 0 and not cert.wmin * down > _MIN_NORMAL and not np.logical_and.reduce(
                Wu * 2.0 ** k == W, None):
            return None  # (entries underflow: the engine re-certifies or raises; k <= 0:
            # W 2^-k is exact where max |W| 2^-k is finite, below; fl(min |W_cf| 2^-k) >
            # 2^-1022, the least nonzero entry of W: every product normal, so exact)
        if not (cert.wmax * down >= MIN_REPRESENTABLE or cert.wmax == 0.0) or not (
                cert.wmax * down < math.inf):
            return None  # (not representable: the engine raises NotRepresentableError)
    extra = {"n_constraints": cert.n_constraints, "scale_exp": k,
             "lower_bound": cert.lower * down, "solver_status": "optimal", "n_fallback": 0}
    return DeferredSolution.make(
        lambda: _reported(cert, tol, k), W_=Wu, norm_=cert.norm * down, margin_=cert.margin,
        violation_=cert.violation, gap_=cert.gap, solver_="mnp-active", feasible_=True,
        status_="optimal",  # (certificate.verdict's rule: proven feasible, gap <= GAP_OPTIMAL)
        conflict_=(), alpha_=alpha, norm="fro", problem=problem, n_iter_=n_iter,
        time_=time.perf_counter() - t0, tol_active=tol, extra=extra)


def _reported(cert, tol: float, k: int) -> dict:
    """The fields of :func:`att_svm_lean`'s answer that decide nothing, computed on the
    first read of one of them (:class:`~attnsvm.svm.result.DeferredSolution`):
    certify_unit_one's margins, support and KKT residual of ``cert``
    (:class:`~attnsvm.svm.unit_certificate.UnitCore`) and the multipliers in the caller's
    units, lam 2^-2k (as assemble.to_solution scales them: exact where no entry under- or
    overflows)."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        m = cert.margins()
        return {"kkt_residual_": cert.kkt(m), "margins_": m, "support_": cert.support(tol),
                "dual_": cert.lam * 2.0 ** (-2 * k)}


def _solve_batch(X, z, alpha, valid, xexp, max_iter):
    """The compiled solves of a batch (:func:`attnsvm.svm._active_kernels.fro_solve_batch`,
    slices in threads from PARALLEL_B problems, as mnp_active): (info (B, 5), D, Zs, v,
    W, lam, mu)."""
    K = active.kernels()
    B, n, T, d = X.shape
    e = z.shape[2]
    info = np.zeros((B, 5), np.int64)
    D = np.empty((B, n, T, d))
    Zs = np.empty((B, n, e))
    v = np.zeros((B, n, T), bool)
    W = np.empty((B, d, e))
    lam = np.zeros((B, n, T))
    mu = np.zeros((B, n, T))
    args = (X, z, alpha, valid, xexp, 1e-12, 1e-13, max_iter, info, D, Zs, v, W, lam, mu)
    if B >= active.PARALLEL_B:
        thread_pool(K.fro_solve_batch, B, *args, per_thread=active.PER_THREAD)
    else:
        K.fro_solve_batch(*args, 0, B)
    return info, D, Zs, v, W, lam, mu


def _exact_margins(X, z, alpha, valid, xexp, D, Zs, v):
    """``exact(idx, W)`` for :func:`_settle`: (len(idx),) bool, every margin of the answers
    W (k, d, e) (normalised units) of problems idx proven >= 1 on the EXACT data of the
    engine's constraint set of those problems (:func:`attnsvm.svm.constraints.
    build_constraints`: the exact differences Delta + Delta_lo), and only where that set's
    normalised data is the kernel's D, Zs, v bit for bit (else False: the engine decides).
    First by the compensated enclosure :func:`attnsvm.svm.certificate.margins_dot2` (twice
    the working precision, a rigorous bound |m - m_exact| <= err, the comparison
    fl(m - 1) >= fl(err SLACK) of :func:`~attnsvm.svm.certificate.prove_margins`; as the
    Graph-SVM's proof uses it: exact data, max |W| < 2^900), where that leaves a margin
    undecided by the engine's proof itself (:func:`~attnsvm.svm.certificate.prove_margins`:
    the bound, then rational arithmetic).  A margin proven >= 1 is >= 1 whichever proof
    shows it, so this is what the engine finds for the same W, which it then returns
    unchanged (no scale-up: that only where the proof fails)."""

    def exact(idx, W):
        cs = build_constraints(X[idx], z[idx], alpha[idx], valid[idx], x_exp=xexp[idx])
        same = ((cs.Delta == D[idx]).all((1, 2, 3)) & (cs.Z == Zs[idx]).all((1, 2))
                & (cs.valid == v[idx]).all((1, 2)))
        ok = np.zeros(len(idx), bool)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            sharp = same & _exact_data(cs) & (np.abs(W).max((1, 2)) < 2.0 ** 900)
            rows = cs.valid & sharp[:, None, None]
            if rows.any():  # (every valid row of those problems, one call)
                bb, ii, tt = np.nonzero(rows)
                lo = (np.zeros((len(bb), cs.d)) if cs.Delta_lo is None
                      else cs.Delta_lo[bb, ii, tt])
                m, err = margins_dot2(cs.Delta[bb, ii, tt], lo, W[bb], cs.Z[bb, ii])
                slack = m - 1.0
                bad = ~((slack >= err * SLACK) & np.isfinite(slack))
                ok = sharp & (np.bincount(bb, weights=bad, minlength=len(idx)) == 0)
        rest = np.nonzero(same & ~ok)[0]
        if len(rest):
            ok[rest] = prove_margins(cs.take(rest), W[rest], positive=True)
        return ok

    return exact


def _settle(info, D, Zs, v, W, lam, mu, *, tol: float, irreducible: bool, exact=None):
    """The verdicts of the problems the kernel ran: (idx, cert, status, conflict, fk_bound,
    fk_lam, constraint set, n_iter) of those settled, the engine's numbers: certified
    optimal with W exact in the caller's units (the solver's status OPTIMAL), or, where it
    found rho ~ 0 and ``irreducible`` is False, a proven Farkas certificate of its mu
    (no feasible W then exists, so the margin proof is not run; the certificate's numbers
    are, for the lower bound).  ``exact``: :func:`_exact_margins` of the batch, which
    decides the margins the rounding-error bound leaves undecided (None: those problems
    go to the engine)."""
    K = active.kernels()
    B = len(info)
    ran = info[:, 0] == K.LEAN_OK
    ex = info[:, 1]
    opt = ran & (info[:, 2] == active.OPTIMAL)
    c = np.nonzero(ran & (info[:, 2] == active.SMALL_RHO))[0]
    fk_ok = np.zeros(B, bool)
    fk_bound, fk_lam = np.full(B, np.nan), np.zeros(v.shape)
    if len(c) and not irreducible:  # (irreducible: the engine names the conflict by LP)
        ok, bound, lv = farkas_verify(_unit_set(D[c], Zs[c], v[c], ex[c]), mu[c])
        fk_ok[c[ok]] = True
        fk_bound[c[ok]], fk_lam[c[ok]] = bound[ok], lv[ok]
    # one certificate of the answers (proof run on the OPTIMAL ones) and of the proven
    # infeasible ones (numbers only), on the whole batch where the kernel ran every problem
    # (no copies; each problem's numbers are computed alone, the same bits)
    r = np.nonzero(opt | fk_ok)[0]
    every = len(r) == B

    def sub(a):
        return a if every else a[r]

    dec = None if exact is None else (lambda j: exact(r[j], W[r[j]]))
    cr = certify_unit(sub(D), sub(Zs), sub(v), sub(W), sub(lam), tol, prove=opt[r],
                      decide=dec)
    good = (cr.feasible & (cr.gap <= GAP_OPTIMAL) & _in_user_units(cr.W, ex[r])) | fk_ok[r]
    all_good = every and good.all()
    idx = r if all_good else r[good]
    cert = cr if all_good else cr.take(good)
    inf = fk_ok[idx]
    fk_bound, fk_lam = fk_bound[idx], fk_lam[idx]
    status = verdict(cert.feasible, cert.gap, inf)
    cs = (_unit_set(D, Zs, v, ex) if all_good else
          _unit_set(D[idx], Zs[idx], v[idx], ex[idx]))
    return (idx, cert, status, conflicts(fk_lam, inf), fk_bound, fk_lam, cs, info[idx, 3])


_FIELDS = ("W_", "norm_", "margin_", "violation_", "kkt_residual_", "gap_", "dual_",
           "support_", "margins_", "feasible_", "status_", "solver_")
_EXTRA = ("n_constraints", "scale_exp", "farkas_bound", "lower_bound", "solver_status")


def _merge(B: int, parts, **kw) -> BatchSolution:
    """One :class:`BatchSolution` of B problems from parts [(idx, BatchSolution)] that
    cover 0 .. B-1 (the first len(idx) rows of each part; the engine's ``n_fallback``: that
    of the last part)."""
    out, extra, conflict = {}, {}, [()] * B
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(B)):  # one part, every
        bs = parts[0][1]  # problem in order: its own arrays (no copies)
        out = {f: getattr(bs, f)[:B] for f in _FIELDS}
        extra = {f: np.asarray(bs.extra[f])[:B] for f in _EXTRA}
        extra["n_fallback"] = bs.extra["n_fallback"]
        return BatchSolution(**out, conflict_=list(bs.conflict_[:B]), extra=extra, **kw)
    for idx, bs in parts:
        k = len(idx)
        for f in _FIELDS:
            a = getattr(bs, f)[:k]
            out.setdefault(f, np.empty((B,) + a.shape[1:], a.dtype))[idx] = a
        for f in _EXTRA:
            a = np.asarray(bs.extra[f])[:k]
            extra.setdefault(f, np.empty((B,) + a.shape[1:], a.dtype))[idx] = a
        for j, b in enumerate(idx.tolist()):
            conflict[b] = bs.conflict_[j]
        extra["n_fallback"] = bs.extra["n_fallback"]
    return BatchSolution(**out, conflict_=conflict, extra=extra, **kw)


def batch_lean(X: np.ndarray, z: np.ndarray, alpha: np.ndarray, valid: np.ndarray, xexp, *,
               tol: float, irreducible: bool, problem: str, vector: bool,
               rest: Callable[[np.ndarray], BatchSolution], max_iter: int | None = None):
    """B Frobenius problems (validated X (B, n, T, d) divided by 2^xexp, z (B, n, e), alpha
    (B, n), valid (B, n, T)) as :func:`attnsvm.svm.engine.solve` and
    :func:`~attnsvm.svm.engine.to_batch_solution` give them: each problem's steps in one
    compiled call, the verdicts in plain numpy over the batch (module docstring).
    ``rest(idx)``: the problems idx (sorted, at least one) that are not settled here, by
    the general engine (the caller's, :func:`attnsvm.svm.batch._engine_rest`: this module
    does not import the engine), as a :class:`BatchSolution` whose first len(idx) rows are
    theirs.  ``max_iter``: the solver's major-cycle cap (default 20 n T + 50, as
    :func:`attnsvm.svm.active.mnp_active`; tests use a tiny cap to send problems to the
    engine)."""
    active.kernels()  # first: an empty numba cache is compiled before the timer starts
    t0 = time.perf_counter()
    c = np.ascontiguousarray
    B, n, T, d = X.shape
    X, z = c(X, dtype=float), c(z, dtype=float)
    alpha, valid = c(alpha, dtype=np.int64), c(valid, dtype=bool)
    xexp = c(np.broadcast_to(np.asarray(xexp, np.int64), (B,)))
    mi = 20 * n * T + 50 if max_iter is None else int(max_iter)  # (as mnp_active)
    solved = _solve_batch(X, z, alpha, valid, xexp, mi)
    idx, cert, status, conflict, fk_bound, fk_lam, cs, its = _settle(
        *solved, tol=tol, irreducible=irreducible,
        exact=_exact_margins(X, z, alpha, valid, xexp, *solved[1:4]))
    parts = []
    if len(idx):
        out = _outcome(cert, status, conflict, fk_bound, fk_lam, its, "batch-mnp-active", "",
                       t0)
        parts.append((idx, to_batch_solution(cs, out, alpha=alpha[idx], problem=problem,
                                             vector=vector, norm=FRO, tol=tol)))
    left = np.ones(B, bool)
    left[idx] = False
    others = np.flatnonzero(left)  # the problems not settled here, sorted
    if len(others):
        parts.append((others, rest(others)))
    return _merge(B, parts, alpha_=alpha, norm="fro", problem=problem,
                  time_=time.perf_counter() - t0, tol_active=tol)


def warmup() -> bool:
    """Compile (or load from numba's disk cache) the active-set kernels, the compiled
    single and batched paths and the Farkas screen on tiny problems; returns whether numba
    is available.  (Here rather than in :mod:`attnsvm.svm.active`, which this module
    imports: no import cycle.)"""
    if not active.available():
        return False
    rng = np.random.default_rng(0)
    N = active.GRAM_BLAS_N
    active.mnp_active(rng.standard_normal((2, 3, 2)), np.ones((2, 3, 1)), np.ones((2, 3), bool))
    active.mnp_active(rng.standard_normal((1, N, 2)), np.ones((1, N, 1)), np.ones((1, N), bool))
    att_svm_lean(rng.standard_normal((2, 3, 2)), rng.standard_normal((2, 2)),
                 np.zeros(2, np.int64), np.ones((2, 3), bool), tol=1e-6)
    _settle(*_solve_batch(rng.standard_normal((2, 2, 3, 2)), np.ones((2, 2, 1)),
                          np.zeros((2, 2), np.int64), np.ones((2, 2, 3), bool),
                          np.zeros(2, np.int64), 50), tol=1e-6, irreducible=False)
    # (the batched path, fro_solve_batch)
    cs = ConstraintSet(np.array([1.0, -1.0]).reshape(1, 1, 2, 1), np.ones((1, 1, 1)),
                       np.ones((1, 1, 2), bool), np.ones((1, 1, 2)))
    farkas_verify(cs, np.ones((1, 1, 2)))  # (w >= 1 and -w >= 1: the screen and the
    # compiled enclosure, certificate.farkas_enclosure_compiled)
    active.kernels().margins_batch(  # the engine's margins (engine._margins)
        rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 2)),
        np.ones((1, 2, 3), bool), np.ones((1, 2, 2)), np.empty((1, 2, 3)))
    return True
