"""The one engine behind every max-margin problem (single and batched, every norm).

    cs = build_constraints(X, Z, alpha, valid)      # (B, n, T, d) tokens -> normalised set
    out = solve(cs, norm)                          # solve every problem, certify them all
    sol = to_solution(cs, out, ...)                # back to the caller's units

The steps live by concern: constraints (:mod:`attnsvm.svm.constraints`), which solver for
which norm (:mod:`attnsvm.svm.strategy`, one table), the solvers (:mod:`attnsvm.svm.
frobenius`, :mod:`attnsvm.svm.nuclear`, :mod:`attnsvm.svm.conic`), the certificate
(:mod:`attnsvm.svm.certificate`), infeasibility (:mod:`attnsvm.svm.farkas`) and the
results (:mod:`attnsvm.svm.result`) in the caller's units (:mod:`attnsvm.svm.assemble`); this module runs them.  Its former contents are
re-exported here (``build_constraints``, ``farkas_lp``, ``to_solution``, ...).

A single problem is a batch of one.  The steps of :func:`solve`:

1. problems that need no margin (no inequality with b > 0, no equality with b != 0):
   W = 0;  problems with a constraint whose matrix is 0 (a token equal to the selected
   one, a zero query, all-zero keys) but b > 0: infeasible, that constraint is the
   Farkas certificate;
2. the others are solved by the norm's row of :data:`attnsvm.svm.strategy.STRATEGIES`:
   many at once where the norm has a batched solver (Frobenius: the compiled exact
   active-set minimum-norm-point solver, :mod:`attnsvm.svm.frobenius`), else one by one
   (:func:`attnsvm.svm.strategy.solve_one`: Frobenius: active set, dual min-norm point or
   structured primal IPM, then an exact active-set polish; nuclear: the primal-dual SDP
   interior-point method on a working set, cvxpy + Clarabel and the dual barrier on a
   working set as its fallbacks, :mod:`attnsvm.svm.nuclear`; any norm: cvxpy with the norm's own expression,
   :mod:`attnsvm.svm.conic`);
3. every answer is rescaled to minimal margin 1 (times certificate.KAPPA) and certified
   by :func:`~attnsvm.svm.certificate.certify` (one batched call): feasible only where every
   margin is proven >= b_k (:mod:`attnsvm.svm.certificate`);
4. problems without a feasible answer get a Farkas certificate (the solver's own
   multipliers, polished, or an LP vertex), which must be proven by
   :func:`~attnsvm.svm.farkas.farkas_verify` (sum lam_k A_k = 0 exactly) before
   "infeasible" is reported; its support names the conflicting sequences;
5. answers that certify neither way, or certify a gap above what the solver should
   reach (the row's ``retry_gap``), are re-solved with a second, different solver (the
   row's ``fallback``) and re-certified; what is then
   still unresolved gets an LP Farkas vertex (and so does every infeasible problem when
   an irreducible conflict is asked for).  Neither verified: "uncertified".

The status of every problem is read off the certificate, never off a solver's word.

Small single Frobenius problems (:func:`attnsvm.svm.att_svm`, n T < 300) and Frobenius
batches (n T <= 400) first try the Frobenius row's fast path (:mod:`attnsvm.svm.lean`,
the ``fast_single`` / ``fast_batch`` fields of :data:`attnsvm.svm.strategy.STRATEGIES`):
steps 1-3 in one compiled call per problem, then the same certificate in plain numpy;
the problems it settles (certified optimal, or a proven Farkas certificate) keep those
numbers, every other problem comes here.
"""


from __future__ import annotations

import time

import numpy as np

from ..norms import Norm, get_norm
from . import active
from .assemble import to_batch_solution, to_solution, to_user_units
from .certificate import KAPPA, Certificate, certify, verdict
from .constraints import (
    ConstraintSet,
    absmax,
    build_constraints,
    margin_ratio,
    normalise,
    normalise_constraints,
)
from .farkas import (
    conflict_tuples,
    conflicts,
    farkas_conflict,
    farkas_lp,
    farkas_polish,
    farkas_verify,
)
from .records import Outcome, Raw
from .strategy import SOLVERS, solve_conic, solve_one, solver_key, strategy

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
    "Outcome",
    "Raw",
    "absmax",
    "conflict_tuples",
    "to_user_units",
]


def _margins(cs: ConstraintSet, W: np.ndarray) -> np.ndarray:
    """m_k = Delta_k^T W z_k (B, n, T) of a batched set (0 where invalid): compiled
    (:func:`attnsvm.svm._active_kernels.margins_batch`) where numba is, else
    :meth:`ConstraintSet.margins`."""
    K = active.kernels()
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
        ratio = margin_ratio(cs, _margins(cs, np.where(fin[:, None, None], W, 0.0)))
    rhs_eq = np.False_ if cs.eq is None else (cs.eqmask & (cs.b != 0)).any((1, 2))
    fix = (ratio > 0) & np.isfinite(ratio) & ~rhs_eq & fin
    r = np.where(fix, ratio, 1.0)
    # then times KAPPA = 1 + 2^-36 where scaled: margins a rounding-size above 1, which
    # the certificate's error bound proves (certificate.prove_margins) in one pass
    k = np.where(fix, KAPPA, 1.0)[:, None, None]
    # (S(lam) in ||W|| d||W||: degree 1, lam along)
    return W / r[:, None, None] * k, lam / r[:, None, None] * k



def _better(c_old: Certificate, c_new: Certificate) -> np.ndarray:
    """True where the new answer is better: feasible beats not; then the smaller gap."""
    g_old = np.where(np.isnan(c_old.gap), np.inf, c_old.gap)
    g_new = np.where(np.isnan(c_new.gap), np.inf, c_new.gap)
    return (c_new.feasible & ~c_old.feasible) | (c_new.feasible & c_old.feasible & (g_new < g_old))


def solve(cs: ConstraintSet, norm="fro", *, solver=None, tol: float = 1e-6,
          irreducible: bool = True, rank: int | None = None) -> Outcome:
    """Solve and certify the B problems of the (batched, normalised) set ``cs``.

    ``solver``: None (each norm's default: :mod:`attnsvm.svm.strategy`)
    or a solver name; ``tol``: activity tolerance of ``support_``; ``irreducible``: name
    an irreducible conflicting set (one LP per infeasible problem) rather than the
    support of the solver's Farkas multipliers; ``rank`` (B = 1 only): the rank-
    constrained heuristic, see :func:`_rank_heuristic`.
    """
    active.available()  # first: an empty numba cache is compiled before the timer starts
    t0 = time.perf_counter()
    N = get_norm(norm)
    key = solver_key(solver, N)
    st = strategy(N)
    B = cs.batch_shape[0]
    n, T = cs.shape
    d, e = cs.d, cs.e
    W = np.full((B, d, e), np.nan)
    lam = np.zeros((B, n, T))
    names = np.array(["none"] * B, dtype=object)
    second = np.full(B, None, dtype=object)  # the solver each answer names for a 2nd opinion
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
    if st.batch is not None and st.batch_applies(cs, key, len(todo)):
        sub = cs if len(todo) == B else cs.take(todo)  # (todo is sorted: all of them, as is)
        Wb, lb, mu, nb, it = st.batch(sub, key)
        W[todo], lam[todo], cand[todo], names[todo] = Wb, lb, mu, nb
        has_cand[todo] = True
        iters[todo] = it
    else:
        for b in todo:
            r = solve_one(cs.take(b), N, key)
            names[b], hints[b], iters[b], second[b] = r.solver, r.status, r.n_iter, r.fallback
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
    retry = need & ~zb & ~fk_ok & (~cert.feasible | (gap > st.retry_gap))
    for b in np.nonzero(retry)[0]:
        sub = cs.take([b])
        r = solve_one(sub.take(0), N, st.fallback_key(second[b]))
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
    status = verdict(cert.feasible, cert.gap, fk_ok)
    conflict = conflicts(fk_lam, fk_ok)
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
    C, lam, status, name, n_iter = solve_conic(sub, N, None)
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

