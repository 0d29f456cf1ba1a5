"""Frobenius max-margin problems, min ||W||_F s.t. <A_k, W> >= 1, A_k = Delta_k z_k^T.

    r = solve_single(cs, key)                 # one problem -> Raw (or None: not applicable)
    W, lam, mu, names, its = solve_batch(cs, key)   # B problems, where batch_applies(...)
    r = polish(cs, r)                         # exact KKT polish of an interior-point answer

The solvers, by shape (the measured rules below):

* the compiled exact active-set minimum-norm-point solver (Wolfe 1976,
  :mod:`attnsvm.svm.active`; numba);
* the dual minimum-norm-point IPM on the N x N Gram matrix (:func:`attnsvm.svm.fast.
  batched_mnp`) where N <= d e, batched over many small problems;
* the structured primal IPM (:func:`attnsvm.svm.fast.primal_ipm`, d e x d e Newton
  systems) otherwise;

each interior-point answer then polished by an exact active-set KKT solve
(:func:`attnsvm.svm.fast.polish_fro`).  Which of them runs first, and what runs when it
fails, is the Frobenius row of :data:`attnsvm.svm.strategy.STRATEGIES`.

The Graph-SVM's rows (equalities with b = 0 and inequalities with b = 1, the (N, 1)
layout of :func:`attnsvm.svm.graph.graph_constraints`): :func:`graph_candidates`
(least-distance programming by NNLS, else Clarabel on the dual QP, each polished), the
row's ``graph`` solver.
"""

from __future__ import annotations

import numpy as np

from . import active
from .constraints import ConstraintSet
from .fast import batched_mnp, polish_fro, primal_ipm
from .records import Raw

__all__ = ["solve_single", "solve_batch", "batch_applies", "solve_batch_active",
           "solve_batch_ipm", "polish", "unit_rhs", "MAX_BATCH_N", "MAX_BATCH_N_ACTIVE",
           "MAX_ACTIVE_N", "ACTIVE_RATIO", "ACTIVE_SMALL_N", "graph_candidates", "null_basis",
           "DENSE_CAP"]

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
#: entries of a dense (rows, d^2) matrix the Graph-SVM's Frobenius NNLS and nuclear cvxpy
#: fallbacks may build (128 MiB); beyond it those paths are not taken
DENSE_CAP = 2 ** 24


def solve_single(cs: ConstraintSet, key) -> Raw | None:
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



def solve_batch_active(cs: ConstraintSet, chunk_bytes: float = 64e6, use_active: bool = True):
    """B Frobenius problems with unit b (N = n T constraints each, A_k = Delta_k z_k^T).

    ``use_active`` (numba present): the compiled exact active-set minimum-norm-point
    solver (:func:`attnsvm.svm.active.mnp_active`, Wolfe's method on
    G = (Delta Delta^T) o (Z Z^T), one problem at a time); the problems it leaves
    unresolved (iteration cap, rounding stall) and every problem without numba go through
    one vectorised minimum-norm-point IPM on their (B, N, N) Gram matrices and a batched
    exact active-set polish (:func:`solve_batch_ipm`).

    Returns (W (B, d, e) NaN where rho = 0, lam (B, n, T), mu (B, n, T) the min-norm point
    (a Farkas candidate where rho ~ 0), solver names (B,), iterations)."""
    if not use_active or not active.available():
        return solve_batch_ipm(cs, chunk_bytes)
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
        Wf, lf, mf, nf, itf = solve_batch_ipm(cs.take(bad), chunk_bytes)
        W[bad], lam[bad], mu[bad] = Wf, lf, mf
        names[bad] = [f"{x} (active: stalled)" for x in nf]
        its = max(its, itf)
    return W, lam, mu, names, its


def solve_batch_ipm(cs: ConstraintSet, chunk_bytes: float = 64e6):
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


def unit_rhs(cs: ConstraintSet) -> bool:
    """Whether every problem of ``cs`` has inequalities only, each with b = 1 (the form
    the minimum-norm-point solvers take)."""
    return not cs.has_eq and bool(np.all(cs.b[cs.ineq] == 1.0))


def _batch_active(key) -> bool:
    """Whether a batch runs through the compiled active-set solver (else the batched IPM)."""
    return key == "active" or (key in (None, "auto") and active.available())


def batch_applies(cs: ConstraintSet, key, n_todo: int) -> bool:
    """Whether the ``n_todo`` problems to solve of ``cs`` go through :func:`solve_batch`
    (rather than one by one): solver None / "auto" / "active" / "mnp", more than one
    problem, n T <= MAX_BATCH_N_ACTIVE (active set) or MAX_BATCH_N (batched IPM), unit b."""
    n, T = cs.shape
    use_active = _batch_active(key) and key != "mnp"
    return (key in (None, "auto", "active", "mnp") and n_todo > 1
            and n * T <= (MAX_BATCH_N_ACTIVE if use_active else MAX_BATCH_N)
            and unit_rhs(cs))


def solve_batch(cs: ConstraintSet, key):
    """B problems at once (:func:`solve_batch_active`, or :func:`solve_batch_ipm` for
    solver "mnp" or without numba); see :func:`batch_applies`."""
    return solve_batch_active(cs, use_active=_batch_active(key) and key != "mnp")


def polish(cs: ConstraintSet, r: Raw) -> Raw:
    """An answer with multipliers polished by the exact active-set KKT solve on its
    support (:func:`attnsvm.svm.fast.polish_fro`), solver name + "+polish"; kept as it is
    where the polish fails or the answer is the active-set solver's verified optimum."""
    exact = r.solver == "mnp-active" and r.status == "optimal"  # verified by the kernel
    if r.W is None or r.lam is None or exact:
        return r
    W, lam, ok = polish_fro(cs, r.W, r.lam)
    if not ok:
        return r
    return Raw(W, lam, r.status, r.solver + "+polish", r.n_iter, r.farkas, r.fallback)


# --------------------------------------------------------------- Graph-SVM rows
def _graph_dual_qp(cs: ConstraintSet):
    """The Frobenius Graph-SVM by Clarabel on its dual QP, min 1/2 lam^T G lam - sum_{ineq}
    lam_k, lam_ineq >= 0, G = (D D^T) o (Z Z^T) (:mod:`attnsvm.svm.graph`); returns (W, lam (N,), status)."""
    import clarabel
    from scipy import sparse

    D = cs.Delta[:, 0, :]
    Z = cs.Z
    G = (D @ D.T) * (Z @ Z.T)
    N = G.shape[0]
    ineq = ~cs.eq[:, 0]
    P = sparse.triu(sparse.csc_matrix(G), format="csc")
    q = -ineq.astype(float)
    idx = np.nonzero(ineq)[0]
    A = sparse.csc_matrix((-np.ones(len(idx)), (np.arange(len(idx)), idx)), shape=(len(idx), N))
    b = np.zeros(len(idx))
    st = clarabel.DefaultSettings()
    st.verbose = False
    st.tol_gap_abs = st.tol_gap_rel = 1e-12
    st.tol_feas = 1e-12
    st.tol_ktratio = 1e-10
    st.max_iter = 200
    cones = [clarabel.NonnegativeConeT(len(idx))] if len(idx) else []
    sol = clarabel.DefaultSolver(P, q, A, b, cones, st).solve()
    status = str(sol.status)
    lam = np.asarray(sol.x, float)
    if not np.all(np.isfinite(lam)) or "Infeasible" in status:
        return None, None, status
    lam = np.where(ineq, np.maximum(lam, 0.0), lam)
    W = D.T @ (lam[:, None] * Z)
    return W, lam, status


def null_basis(M_eq: np.ndarray, n: int) -> np.ndarray:
    """Orthonormal basis (n, p) of {w : M_eq w = 0} (SVD; rank at 1e-12 of the largest
    singular value: equality rows of one SCC are often exactly dependent)."""
    if M_eq.shape[0] == 0:
        return np.eye(n)
    _, s, Vt = np.linalg.svd(M_eq, full_matrices=True)
    r = int((s > 1e-12 * s[0]).sum()) if s.size and s[0] > 0 else 0
    return Vt[r:].T


def _graph_ldp(cs: ConstraintSet):
    """Exact min ||w|| s.t. M_in w >= 1, M_eq w = 0 as least-distance programming (Lawson &
    Hanson, "Solving Least Squares Problems", ch. 23): with w = N c (N an orthonormal
    basis of the equalities' null space), min ||c|| s.t. G c >= 1 is the NNLS
    min_u>=0 ||[G^T; 1^T] u - e_last|| (scipy.optimize.nnls, an exact active-set
    method): r = residual, c = -r[:p] / r[p], lam_in = u / (1 - 1^T u).  Equality
    multipliers from stationarity w = M_in^T lam_in + M_eq^T lam_eq (least squares).
    1 - 1^T u = 1 / (1 + ||c||^2) is below rounding where ||c|| >~ 1e7 (near-collinear
    tokens): the problem is then solved again on G t (optimum c / t, multipliers
    lam / t^2) with t the norm of the first answer, up to twice."""
    from scipy.optimize import nnls

    M = cs.dense()
    eq = cs.eq[:, 0]
    Nb = null_basis(M[eq], M.shape[1])
    G = M[~eq] @ Nb
    p = G.shape[1]
    f = np.zeros(p + 1)
    f[-1] = 1.0
    t = 1.0
    for _ in range(3):
        Gt = G * t
        Em = np.vstack([Gt.T, np.ones((1, G.shape[0]))])
        u, _ = nnls(Em, f, maxiter=50 * Em.shape[1])
        den = 1.0 - u.sum()
        if not den > 0:
            return None, None, "ldp-infeasible"
        c = Gt.T @ u / den
        nc = float(np.linalg.norm(c))
        if den > 1e-6 or not (np.isfinite(nc) and nc > 0):
            break
        t *= nc
    w = Nb @ (c * t)
    lam = np.zeros(M.shape[0])
    lam[~eq] = u / den * (t * t)
    if eq.any():
        resid = w - M[~eq].T @ lam[~eq]
        lam[eq] = np.linalg.lstsq(M[eq].T, resid, rcond=None)[0]
    return w.reshape(cs.d, cs.e), lam, "optimal"


def graph_memory(n_rows: int, d: int) -> tuple[float, str]:
    """(bytes, what) the largest arrays of :func:`graph_candidates` need for ``n_rows``
    rows in dimension d: the (rows, d^2) NNLS matrix where d^2 <= 4096 and rows d^2 <=
    DENSE_CAP, else the dual QP's (rows, rows) Gram matrix, its triangle and its
    factorisation (the ``graph_memory`` field of the norm's strategy row)."""
    N, d = float(n_rows), float(d)
    if d * d <= 4096 and N * d * d <= DENSE_CAP:
        return 8.0 * (3 * N * d * d + 2 * d ** 4), "least-distance programming"
    return 8.0 * 3 * N * N, "the dual QP's (rows, rows) Gram matrix"


def graph_candidates(cs: ConstraintSet):
    """Frobenius Graph-SVM candidates (W, lam, name): least-distance programming by NNLS
    (exact active set; d*d <= 4096), else Clarabel on the dual QP; each followed by the
    exact active-set KKT polish (:func:`attnsvm.svm.fast.polish_fro`)."""
    tried = []
    if cs.d * cs.e <= 4096 and len(cs.eq) * cs.d * cs.e <= DENSE_CAP:
        tried.append(("ldp-nnls", _graph_ldp))
    tried.append(("clarabel-dual", _graph_dual_qp))
    for name, fn in tried:
        W, lam, _ = fn(cs)
        if W is None:
            yield None, None, name
            continue
        yield W, lam, name  # an exact active-set answer usually proves as it is
        Wp, lp, ok = polish_fro(cs, W, lam[:, None])
        if ok:
            yield Wp, lp[:, 0], name + "+polish"
