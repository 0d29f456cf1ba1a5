"""The Graph-SVM of next-token prediction, solved and proven (docs/theory.md "Next-token
prediction"; Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024, the "hard retrieval" part).

    W_svm = argmin ||W||  s.t. for every sample i, label y of i and token j != y of i:
        (e_y - e_j)^T W e_k  = 0    if y, j are in one SCC of the priority graph G_k
        (e_y - e_j)^T W e_k >= 1    otherwise                          (k = k_i = s_iT)

E (K, d) embeddings, seqs (n, T) token ids, y (n,) or (n, L) labels (-1 padding); the
rows are enumerated, merged when repeated, by :func:`attnsvm.ntp.graph.graph_rows`.

Solvers (one matrix constraint each, no Python loop of scalar constraints):

* ``norm="fro"``: the dual QP  min 1/2 lam^T G lam - sum_{ineq} lam_k,  lam_ineq >= 0
  (G_kl = <A_k, A_l> = (Delta_k . Delta_l)(z_k . z_l), A_k = Delta_k z_k^T, Delta_k = e_y - e_j,
  z_k = e_k), solved by Clarabel, W = sum_k lam_k A_k, then the exact active-set polish
  (:func:`attnsvm.svm.fast.polish_fro`: a KKT solve on the support);
* ``norm="nuc"``: the SDP pair min ||W||_* / max sum_ineq lam s.t. ||S(lam)||_2 <= 1 by
  the project's primal-dual interior-point method (:func:`attnsvm.svm.fast.nuclear_ipm`,
  its numba kernel :func:`~attnsvm.svm.fast.nuclear_ipm_small`) with the equalities as
  free-multiplier rows, on the reduced problem W = U C V^T (U, V orthonormal bases of
  span{Delta_r}, span{z_r}: ||W||_* = ||C||_*, C at most min(d, K - 1) x (distinct
  queries)), the answer as it is, else corrected onto its tight rows in the tangent
  space of its rank, else re-solved on its support (:func:`_nuc_ipm`); cvxpy + Clarabel /
  SCS (vectorised rows) only where none of these is proven.

Proof (:func:`prove`), computed from the returned W and multipliers on the ORIGINAL data
with a rounding-error bound for every floating-point step (gamma_n = n u / (1 - n u),
u = 2^-53, Higham, "Accuracy and Stability of Numerical Algorithms", §3):

* margins m_r = e_y^T W e_k - e_j^T W e_k from G = (E W) E^T with |fl(G) - G| <=
  gamma_{2d} |E| |W| |E|^T: a proven lower bound of every inequality margin and a proven
  upper bound of every |equality residual|  ->  ``violation_`` (proven upper bound);
* weak duality: for lam >= 0 on inequalities (free on equalities) and every W' meeting
  the constraints, sum_ineq lam_r <= <S, W'> <= ||S||_* ||W'||, S = sum_r lam_r A_r =
  E^T Lam E; so lb = sum lam / ||S||_* <= the optimal norm, with ||S||_* bounded above
  (computation error of S and of the norm included; spectral / nuclear norms through an
  SVD whose residual and orthogonality defects are bounded as well);
* ``gap_`` = (||W||_up / min(1, margin_lo) - lb) / lb, an upper bound of the relative
  suboptimality.

status_: "optimal" when the proven violation is <= FEAS_TOL (1e-9) and the proven gap
<= GAP_GRAPH (1e-9); "optimal_inaccurate" / "suboptimal" for larger proven gaps;
"infeasible" only with a Farkas certificate verified by
:func:`attnsvm.svm.solution.farkas_verify` (``conflict_`` then names the samples);
"uncertified" when neither is proven.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from ..norms import get_norm
from .solution import (
    FEAS_TOL,
    GAP_INACCURATE,
    ConstraintSet,
    Solution,
    farkas_verify,
    single_thread,
)

__all__ = ["graph_svm", "graph_svm_batch", "prove", "GAP_GRAPH", "graph_constraints"]

GAP_GRAPH = 1e-9  # proven relative gap of an "optimal" Graph-SVM answer
U = 2.0 ** -53
TINY = 2.0 ** -1022


def _gamma(n) -> float:
    n = float(n)
    return n * U / (1.0 - n * U)


# ----------------------------------------------------------------- constraints
def graph_constraints(E: np.ndarray, rows) -> ConstraintSet:
    """The unbatched :class:`ConstraintSet` of the rows (layout (N, 1): one row per
    "sequence"): Delta_r = e_y - e_j, z_r = e_k, b_r = 0 on equalities, 1 otherwise.
    The rounding error of each difference is kept (``Delta_lo``, by TwoSum), so the exact
    checks (Farkas certificates) see the exact E_y - E_j: infeasibility that comes from an
    exact linear relation among the tokens' differences is provable only on those."""
    from .certificate import two_diff

    Delta, lo = two_diff(E[rows.y], E[rows.j])
    Z = E[rows.k]
    N = len(rows)
    valid = np.ones((N, 1), bool)
    b = np.where(rows.eq, 0.0, 1.0)[:, None]
    return ConstraintSet(Delta[:, None, :], Z, valid, b, rows.eq[:, None].copy(), 0,
                         Delta_lo=lo[:, None, :])


def _validate(E, seqs, y, norm):
    from ..ntp.data import NTPData

    N = get_norm(norm)
    if N.name not in ("fro", "nuc"):
        raise ValueError(f"norm must be 'fro' or 'nuc' for graph_svm; got {norm!r}")
    data = NTPData(E, seqs, y)
    return data, N


# ---------------------------------------------------------------------- solvers
def _fro_dual(cs: ConstraintSet):
    """Clarabel on the dual QP (module docstring); returns (W, lam (N,), status)."""
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


def _rows_dense(cs: ConstraintSet) -> np.ndarray:
    """(N, d*d) matrix of vec(A_r) (C order)."""
    return np.einsum("kd,ke->kde", cs.Delta[:, 0], cs.Z).reshape(cs.Delta.shape[0], -1)


def _null_basis(M_eq: np.ndarray, n: int) -> np.ndarray:
    """Orthonormal basis (n, p) of {w : M_eq w = 0} (SVD; rank at 1e-12 of the largest
    singular value: equality rows of one SCC are often exactly dependent)."""
    if M_eq.shape[0] == 0:
        return np.eye(n)
    _, s, Vt = np.linalg.svd(M_eq, full_matrices=True)
    r = int((s > 1e-12 * s[0]).sum()) if s.size and s[0] > 0 else 0
    return Vt[r:].T


def _fro_ldp(cs: ConstraintSet):
    """Exact min ||w|| s.t. M_in w >= 1, M_eq w = 0 as least-distance programming (Lawson &
    Hanson, "Solving Least Squares Problems", ch. 23): with w = N c (N an orthonormal
    basis of the equalities' null space), min ||c|| s.t. G c >= 1 is the NNLS
    min_u>=0 ||[G^T; 1^T] u - e_last|| (scipy.optimize.nnls, an exact active-set
    method): r = residual, c = -r[:p] / r[p], lam_in = u / (1 - 1^T u).  Equality
    multipliers from stationarity w = M_in^T lam_in + M_eq^T lam_eq (least squares)."""
    from scipy.optimize import nnls

    M = _rows_dense(cs)
    eq = cs.eq[:, 0]
    Nb = _null_basis(M[eq], M.shape[1])
    G = M[~eq] @ Nb
    p = G.shape[1]
    Em = np.vstack([G.T, np.ones((1, G.shape[0]))])
    f = np.zeros(p + 1)
    f[-1] = 1.0
    u, _ = nnls(Em, f, maxiter=50 * Em.shape[1])
    r = Em @ u - f
    den = 1.0 - u.sum()
    if not den > 1e-14:
        return None, None, "ldp-infeasible"
    w = Nb @ (G.T @ u / den)
    lam = np.zeros(M.shape[0])
    lam[~eq] = u / den
    if eq.any():
        resid = w - M[~eq].T @ lam[~eq]
        lam[eq] = np.linalg.lstsq(M[eq].T, resid, rcond=None)[0]
    del r
    return w.reshape(cs.d, cs.e), lam, "optimal"


def _solve_fro(cs: ConstraintSet):
    """Frobenius Graph-SVM candidates (W, lam, name): least-distance programming by NNLS
    (exact active set; d*d <= 4096), else Clarabel on the dual QP; each followed by the
    exact active-set KKT polish (:func:`attnsvm.svm.fast.polish_fro`)."""
    from .fast import polish_fro

    tried = []
    if cs.d * cs.e <= 4096:
        tried.append(("ldp-nnls", _fro_ldp))
    tried.append(("clarabel-dual", _fro_dual))
    for name, fn in tried:
        W, lam, _ = fn(cs)
        if W is None:
            yield None, None, name
            continue
        yield W, lam, name  # an exact active-set answer usually proves as it is
        Wp, lp, ok = polish_fro(cs, W, lam[:, None])
        if ok:
            yield Wp, lp[:, 0], name + "+polish"


def _clarabel_kw(eps: float) -> dict:
    return dict(tol_gap_abs=eps, tol_gap_rel=eps, tol_feas=eps, tol_ktratio=1e-10, max_iter=400)


def _nuc_dual(M: np.ndarray, eq: np.ndarray, d: int, e: int, eps: float):
    """The dual of the nuclear Graph-SVM, max sum_ineq lam s.t. ||vec^-1(M^T lam)||_2 <= 1,
    lam_ineq >= 0 (lam_eq free), by cvxpy + Clarabel: multipliers whose weak-duality
    bound is as tight as the conic solver gets; None on failure."""
    import cvxpy as cp

    lam = cp.Variable(M.shape[0])
    S = cp.reshape(M.T @ lam, (d, e), order="C")
    cons = [cp.sigma_max(S) <= 1]
    if (~eq).any():
        cons.append(lam[np.nonzero(~eq)[0]] >= 0)
    prob = cp.Problem(cp.Maximize(cp.sum(lam[np.nonzero(~eq)[0]])), cons)
    try:
        prob.solve(solver="CLARABEL", **_clarabel_kw(eps))
    except (cp.error.SolverError, ValueError, ArithmeticError):
        return None
    return None if lam.value is None else np.asarray(lam.value, float)


def _nuc_polish(D: np.ndarray, Z: np.ndarray, b: np.ndarray, eq: np.ndarray, lam: np.ndarray,
                top_tol: float = 1e-6, act_tol: float = 1e-6):
    """Primal from dual multipliers by complementary slackness (rows A_r = D_r Z_r^T,
    D (N, p), Z (N, q), targets b (N,), equality mask eq (N,)).  At an optimum,
    S = sum_r lam_r A_r / ||.||_2 has top singular subspaces U_k, V_k (singular value 1,
    multiplicity k) and W = U_k P V_k^T with P symmetric PSD, <A_r, W> = b_r on every row
    with lam_r > ``act_tol`` max |lam| (and every equality): a small linear system in P
    (k(k+1)/2 unknowns), solved by least squares.  Any such W with P PSD is optimal
    (||W||_* = tr P = <S, W> = sum lam_r b_r meets weak duality).  It needs accurate
    top subspaces: multipliers at a gap eps can leave them off by ~sqrt(eps) where the
    optimum is flat to second order (measured on Graph-SVMs of rank r2: residuals ~1e-5
    at eps ~1e-9).  Returns W (p, q) or None (system not consistent to 1e-6, or P not
    PSD); the caller proves it."""
    S = D.T @ (lam[:, None] * Z)
    Uu, sv, Vt = np.linalg.svd(S)
    if not sv.size or not sv[0] > 0:
        return None
    k = int((sv >= (1 - top_tol) * sv[0]).sum())
    Uk, Vk = Uu[:, :k], Vt[:k].T
    lmax = float(np.abs(lam[~eq]).max(initial=0.0))
    act = eq | (~eq & (lam > act_tol * lmax))
    a = D[act] @ Uk  # (na, k)
    z = Z[act] @ Vk  # (na, k)
    iu = np.triu_indices(k)
    # P_ij = P_ji: <a, P z> = sum_{i<=j} p_ij (a_i z_j + a_j z_i) (i < j), a_i z_i (i = j)
    Cs = a[:, iu[0]] * z[:, iu[1]]
    off = iu[0] != iu[1]
    Cs[:, off] += a[:, iu[1][off]] * z[:, iu[0][off]]
    bb = b[act]
    p, *_ = np.linalg.lstsq(Cs, bb, rcond=None)
    if not np.all(np.isfinite(p)) or np.abs(Cs @ p - bb).max() > 1e-6 * max(1.0, np.abs(bb).max()):
        return None
    P = np.zeros((k, k))
    P[iu] = p
    P = P + np.triu(P, 1).T
    ev = np.linalg.eigvalsh(P)
    if ev.min() < -1e-6 * max(1e-300, ev.max()):
        return None
    return Uk @ P @ Vk.T


def _independent_rows(M: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """Indices of a maximal linearly independent subset of the rows of M (QR with column
    pivoting of M^T, rank at ``tol`` of the largest diagonal entry): equality rows of one
    SCC are often exactly dependent (e_a - e_c = (e_a - e_b) + (e_b - e_c))."""
    from scipy.linalg import lapack

    if M.shape[0] == 0:
        return np.zeros(0, int)
    # LAPACK's dgeqp3 through scipy.linalg.lapack (scipy.linalg.qr(pivoting=True) is the
    # same routine behind ~12 us of argument checks: as much as the factorisation here)
    R, jpvt, _, _, info = lapack.dgeqp3(np.asarray(M.T, dtype=np.float64))
    if info != 0:  # pragma: no cover (LAPACK argument error)
        raise RuntimeError(f"dgeqp3 failed (info={info})")
    piv = jpvt - 1  # (1-based)
    dg = np.abs(np.diag(R))[:min(M.shape)]
    r = int((dg > tol * max(dg[0], 1e-300)).sum()) if dg.size else 0
    return np.sort(piv[:r])


def _nuc_reduce(D: np.ndarray, Z: np.ndarray):
    """Orthonormal bases U (d, r1) of span{Delta_r} and V (d, r2) of span{z_r} (D, Z (N, d):
    both in the embedding space; one batched SVD, rank at 1e-12 of the largest singular
    value).  Every constraint reads <A_r, W> =
    Delta_r^T (U U^T W V V^T) z_r and ||U U^T W V V^T||_* <= ||W||_*, so the optimum is
    W = U C V^T with C (r1, r2) the optimum of the problem on Delta_r U, z_r V, and
    ||W||_* = ||C||_* (U, V orthonormal)."""
    Q, sv, _ = np.linalg.svd(np.stack([D.T, Z.T]), full_matrices=False)
    return tuple(Q[i][:, sv[i] > 1e-12 * max(float(sv[i].max(initial=0.0)), 1e-300)]
                 for i in range(2))


def _kernels_ready(N) -> None:
    """Load (or, where numba's disk cache is empty, compile: :mod:`attnsvm.compiled`) the
    kernels graph_svm calls in norm ``N``, so that its ``time_`` holds no compile."""
    from . import active
    from .fast import _nuc_kernels

    active.available()
    if N.name == "nuc":
        _nuc_kernels()


def _nuc_ipm(cs: ConstraintSet, tol: float = 3e-10):
    """Nuclear Graph-SVM candidates (W (d, e), lam (N,), name) by the project's primal-dual
    SDP interior-point method (:func:`attnsvm.svm.fast.nuclear_ipm`; compiled:
    :func:`~attnsvm.svm.fast.nuclear_ipm_small`; Nesterov-Todd direction) with the equality
    rows as free-multiplier rows, on the reduced problem of :func:`_nuc_reduce` (C (r1, r2),
    r1 <= min(d, K - 1), r2 <= the number of distinct queries) and an independent subset of
    the equality rows (:func:`_independent_rows`; the others are implied and get
    multiplier 0).  The method's floor is a relative gap ~1e-10 (its primal residual
    drifts there; ``tol`` 3e-10: measured on 120 instances at the published sizes, proven
    gaps <= 1.8e-10); each answer is yielded raw (projected onto the equalities), then
    corrected onto its tight rows (:func:`_nuc_on_rows`) (measured on 600 instances at the
    published sizes: the raw answer proves on 596, the corrected one on 553; one needs
    the correction).  Where the method stops at its rounding floor short
    of a proof (measured: 3 of 600 instances at the published sizes), it runs again on
    the answer's support (the equalities, the rows with a multiplier, the rows within
    1e-3 of their margin): fewer rows, a better-conditioned Schur complement (measured:
    34 of the 35 stalled runs of those 600 then converge); the rows left out get
    multiplier 0 and are checked by the proof like every row.
    W = U C V^T, lam with ||S(lam)||_2 ~ 1; (None, None, name) when the method finds no
    answer (e.g. infeasible).
    """
    from .fast import nuclear_ipm_small

    D, Z = cs.Delta[:, 0], cs.Z
    eq = cs.eq[:, 0]
    b = cs.b[:, 0]
    U, V = _nuc_reduce(D, Z)
    Dr, Zr = D @ U, Z @ V
    ie = np.nonzero(eq)[0]
    Mr_eq = np.einsum("ra,rb->rab", Dr[ie], Zr[ie]).reshape(len(ie), Dr.shape[1] * Zr.shape[1])
    sel_eq = ie[_independent_rows(Mr_eq)] if ie.size else ie
    use = ~eq
    use[sel_eq] = True
    for label in ("ipm-sdp", "ipm-sdp on its support"):
        C, y, status, _ = nuclear_ipm_small(Dr[use], Zr[use], b[use], tol=tol, eq=eq[use],
                                            refine=2)
        if C is None or status == "infeasible" or not np.all(np.isfinite(C)):
            yield None, None, f"{label} ({status})"
            return
        lam = np.zeros(len(b))
        lam[use] = y
        name = label if status == "optimal" else f"{label} ({status})"
        c = C.reshape(-1)
        if sel_eq.size:  # the raw answer, projected onto the equalities' null space
            Me = Mr_eq[np.searchsorted(ie, sel_eq)]
            c = c - Me.T @ np.linalg.solve(Me @ Me.T, Me @ c)
        yield U @ c.reshape(C.shape) @ V.T, lam, name
        m = ((Dr @ C) * Zr).sum(1)  # margins of C
        yield U @ _nuc_on_rows(Dr, Zr, b, eq, sel_eq, C, lam, m) @ V.T, lam, name + "+rows"
        lmax = float(lam[~eq].max(initial=0.0))
        use = ~eq & ((lam > 1e-6 * lmax) | (m < 1 + 1e-3))
        use[sel_eq] = True


def _nuc_on_rows(Dr, Zr, b, eq, sel_eq, C, lam, m):
    """C (r1, r2) plus the least-norm correction, in the tangent space {Uc A + B Vc^T} of
    the rank-k matrices at C = Uc s Vc^T (a step off it costs its full nuclear norm; on
    it, <Uc Vc^T, step> to first order), that meets exactly the rows the answer must
    meet: the (independent) equalities ``sel_eq`` and the inequalities with a multiplier
    (lam_r > 1e-6 max lam) and margin m_r < 1 + 1e-6.  The method leaves a primal
    residual ~1e-10; the norm moves by sum_r lam_r (b_r - m_r) only."""
    act = np.zeros(len(b), bool)
    act[sel_eq] = True
    act |= ~eq & (lam > 1e-6 * float(lam[~eq].max(initial=0.0))) & (m < 1 + 1e-6)
    Uc, sc, Vct = np.linalg.svd(C, full_matrices=False)
    k = int((sc > 1e-8 * sc[0]).sum()) if sc.size and sc[0] > 0 else 0
    if k == 0 or not act.any():
        return C
    du, zv = Dr[act] @ Uc[:, :k], Zr[act] @ Vct[:k].T  # (na, k)
    T = np.concatenate([np.einsum("ri,rb->rib", du, Zr[act]).reshape(len(du), -1),
                        np.einsum("ra,ri->rai", Dr[act], zv).reshape(len(du), -1)], axis=1)
    p, *_ = np.linalg.lstsq(T, b[act] - m[act], rcond=None)
    r1, r2 = C.shape
    return C + Uc[:, :k] @ p[:k * r2].reshape(k, r2) + p[k * r2:].reshape(r1, k) @ Vct[:k]


def _solve_nuc(cs: ConstraintSet):
    """Nuclear Graph-SVM candidates, yielded one at a time (the caller proves each and
    stops as soon as the proven gap is small): (W or None, lam or None, name).

    1. the project's SDP interior-point method on the reduced problem, equalities as
       free-multiplier rows (:func:`_nuc_ipm`);
    2. the dual SDP (:func:`_nuc_dual`, cvxpy + Clarabel) and the primal recovered from
       it by complementary slackness (:func:`_nuc_polish`);
    3. the primal SDP by cvxpy + Clarabel, then by cvxpy + SCS at eps 1e-11.
    A candidate without an answer (the solver's word: infeasible) makes the caller try a
    Farkas certificate at once.
    Primal answers are projected onto the equalities' null space (a conic answer meets
    them to ~1e-9 only).  Any primal pairs with any multipliers in the proof (weak
    duality holds for every lam), so the best of each side is kept."""
    eq = cs.eq[:, 0]
    d, e = cs.d, cs.e
    yield from _nuc_ipm(cs)
    M = _rows_dense(cs)
    Nb = _null_basis(M[eq], M.shape[1]) if eq.any() else None

    def proj(W):
        return W if (Nb is None or W is None) else (Nb @ (Nb.T @ W.reshape(-1))).reshape(W.shape)

    ld = _nuc_dual(M, eq, d, e, 1e-12)
    if ld is not None:
        ld = np.where(eq, ld, np.maximum(ld, 0.0))
        Wd = _nuc_polish(cs.Delta[:, 0], cs.Z, cs.b[:, 0], eq, ld)
        yield proj(Wd), ld, "clarabel-dual+slackness"
    for solver in ("CLARABEL", "SCS"):
        W, lam = _nuc_primal(M, eq, d, e, solver)
        yield proj(W), lam, f"{solver.lower()}-primal"


def _nuc_primal(M, eq, d, e, solver: str):
    """The primal SDP min ||W||_* on the rows by cvxpy + ``solver`` (Clarabel at 1e-12,
    or SCS at 1e-11 with at most 20,000 iterations: a cap keeps a hard instance from
    running for minutes); the rows' multipliers (equality signs as cvxpy's Lagrangian);
    (None, None) on failure."""
    import cvxpy as cp

    W = cp.Variable((d, e))
    w = cp.vec(W, order="C")
    cons = [M[~eq] @ w >= 1] + ([M[eq] @ w == 0] if eq.any() else [])
    prob = cp.Problem(cp.Minimize(cp.normNuc(W)), cons)
    kw = (_clarabel_kw(1e-12) if solver == "CLARABEL"
          else dict(eps_abs=1e-11, eps_rel=1e-11, max_iters=20_000))
    try:
        prob.solve(solver=solver, **kw)
    except (cp.error.SolverError, ValueError, ArithmeticError):
        return None, None
    if W.value is None or cons[0].dual_value is None:
        return None, None
    lam = np.zeros(M.shape[0])
    lam[~eq] = np.asarray(cons[0].dual_value, float).reshape(-1)
    if eq.any() and cons[1].dual_value is not None:
        lam[eq] = -np.asarray(cons[1].dual_value, float).reshape(-1)
    return np.asarray(W.value, float), lam


def _to_feasible(cs: ConstraintSet, W):
    """W / min inequality margin (minimal margin 1)."""
    m = cs.margins(W)[:, 0]
    ineq = ~cs.eq[:, 0]
    if not ineq.any():
        return W
    r = float(m[ineq].min())
    if r > 0 and np.isfinite(r):
        return W / r
    return W


# ------------------------------------------------------------------------ proof
def _svd_bounds(A: np.ndarray):
    """(upper bound of ||A||_2, upper bound of ||A||_*, the computed singular values) for a
    float matrix A, from its computed SVD A ~ U diag(s) V^T: with R = A - U diag(s) V^T,
    ||A||_2 <= ||U||_2 ||V||_2 max s + ||R||_F and ||A||_* <= ||U||_2 ||V||_2 sum s +
    sqrt(rank bound) ||R||_F, where ||U||_2^2 <= 1 + ||U^T U - I||_F; every computed
    quantity carries its rounding bound (Higham §3.5: |fl(X Y) - X Y| <= gamma_n |X| |Y|,
    and || |X| |Y| ||_F <= ||X||_F ||Y||_F)."""
    d1, d2 = A.shape
    Uu, s, Vt = np.linalg.svd(A, full_matrices=False)
    r = len(s)
    if r == 0:
        return 0.0, 0.0, s
    def orth_defect(G, Q):  # upper bound of ||Q^T Q - I||_F from G = fl(Q^T Q)
        n = Q.size // r
        fq = float(np.linalg.norm(Q)) ** 2 * (1 + _gamma(Q.size + 2))  # >= ||Q||_F^2
        G.flat[::r + 1] -= 1.0
        err = _gamma(n + 1) * (fq + np.sqrt(r))  # >= || gamma_n |Q|^T|Q| + u |I| ||_F
        return (float(np.linalg.norm(G)) * (1 + _gamma(r * r + 2)) + err) * 1.0001, fq

    eu, _ = orth_defect(Uu.T @ Uu, Uu)
    ev, fv = orth_defect(Vt @ Vt.T, Vt)
    US = Uu * s
    rF = float(np.linalg.norm(A - US @ Vt)) * (1 + _gamma(d1 * d2 + 2))
    # rounding of fl(A - US Vt): gamma_{r+2} |U||s| |Vt| + u |A|, in Frobenius norm
    rerr = (_gamma(r + 2) * float(np.linalg.norm(US)) * np.sqrt(fv) * (1 + _gamma(d1 * r + 2))
            + U * float(np.linalg.norm(A)) * (1 + _gamma(d1 * d2 + 2)))
    rF = (rF + rerr * 1.0001) * 1.0001
    fac = np.sqrt((1 + eu) * (1 + ev)) * (1 + 4 * U)
    smax = float(s[0])
    s_sum = float(s.sum()) * (1 + _gamma(r + 1))
    two = smax * fac * (1 + 4 * U) + rF
    nuc = s_sum * fac * (1 + 4 * U) + np.sqrt(min(d1, d2)) * rF * (1 + 4 * U)
    return float(two), float(nuc), s


def _fro_upper(A: np.ndarray) -> float:
    m = float(np.abs(A).max()) if A.size else 0.0
    if m == 0:
        return 0.0
    return float(m * np.linalg.norm(A / m) * (1 + _gamma(A.size + 4)))


def _prove_primal(E: np.ndarray, rows, W: np.ndarray, norm: str) -> dict:
    """Proven numbers of W: margins (N,) computed, margin_lo (proven min inequality
    margin; inf without inequality), violation_hi (proven max violation), norm_hi
    (proven ||W||), norm (||W|| as computed, for the report)."""
    E = np.asarray(E, float)
    W = np.asarray(W, float)
    d = E.shape[1]
    ineq, eq = ~rows.eq, rows.eq
    with np.errstate(over="ignore", invalid="ignore"):
        G = (E @ W) @ E.T
        aE = np.abs(E)
        Ab = (aE @ np.abs(W)) @ aE.T
        err_g = _gamma(2 * d) * Ab * 1.0001 + 2 * d * TINY
        m = G[rows.y, rows.k] - G[rows.j, rows.k]
        err = (err_g[rows.y, rows.k] + err_g[rows.j, rows.k] + 2 * U * np.abs(m)) * 1.0001
        m_lo, m_hi = m - err, m + err
        margin_lo = float(m_lo[ineq].min()) if ineq.any() else np.inf
        v_in = float(np.maximum(1.0 - m_lo[ineq], 0.0).max()) if ineq.any() else 0.0
        v_eq = float(np.maximum(np.abs(m_lo[eq]), np.abs(m_hi[eq])).max()) if eq.any() else 0.0
        if get_norm(norm).name == "fro":
            norm_hi, nrm = _fro_upper(W), None
        else:
            _, norm_hi, sv = _svd_bounds(W)
            nrm = float(sv.sum())
    if not np.all(np.isfinite(W)):
        margin_lo, v_in, norm_hi = -np.inf, np.inf, np.inf
    return {"margins": m, "margin_lo": margin_lo, "violation_hi": max(v_in, v_eq),
            "norm_hi": norm_hi, "norm": _norm_value(W, norm) if nrm is None else nrm}


def _lam_matrix(rows, lam: np.ndarray, K: int):
    """Lam (K, K) with sum_r lam_r A_r = E^T Lam E (Lam[y_r, k_r] += lam_r, Lam[j_r, k_r]
    -= lam_r) and Labs, the same sums of |lam_r| (the rounding bound of Lam's sums)."""
    iy, ij = rows.y * K + rows.k, rows.j * K + rows.k
    Lam = np.bincount(iy, lam, K * K) - np.bincount(ij, lam, K * K)
    a = np.abs(lam)
    Labs = np.bincount(iy, a, K * K) + np.bincount(ij, a, K * K)
    return Lam.reshape(K, K), Labs.reshape(K, K)


def _kkt(E, rows, W, lam, norm, margins, tol, nrm=None, S_lam=None):
    """(lam scaled for min 1/2||W||^2: sum_ineq lam = ||W||^2, kkt residual, support):
    stationarity ||W - S||_F / ||W||_F (Frobenius) or max(| ||S||_2 / ||W||_* - 1 |,
    |<S, W> / ||W||_*^2 - 1|) (nuclear), S = sum_r lam_r A_r; complementarity
    max_r |lam_r (m_r - b_r)| / ||W||^2.  Informative numbers (the proof is gap_).
    ``nrm``: ||W|| where the caller has it; ``S_lam``: (S, ||S||_2) of the given lam where
    the caller has them (the dual proof computes both)."""
    ineq = ~rows.eq
    nrm = _norm_value(W, norm) if nrm is None else nrm
    tot = float(lam[ineq].sum())
    f = nrm ** 2 / tot if tot > 0 and nrm > 0 else 1.0
    lam = lam * f
    if S_lam is None:
        Lam, _ = _lam_matrix(rows, lam, E.shape[0])
        S = E.T @ Lam @ E
        s2 = float(np.linalg.norm(S, 2)) if norm != "fro" else 0.0
    else:
        S, s2 = S_lam[0] * f, S_lam[1] * f
    n2 = max(nrm ** 2, 1e-300)
    if norm == "fro":
        stat = float(np.linalg.norm(W - S)) / max(nrm, 1e-300)
    else:
        stat = max(abs(s2 / max(nrm, 1e-300) - 1.0), abs(float(np.sum(S * W)) / n2 - 1.0))
    b = np.where(rows.eq, 0.0, 1.0)
    comp = float(np.max(np.where(ineq, np.abs(lam * (margins - b)), 0.0))) / n2
    support = rows.eq | (margins <= 1.0 + tol)
    return lam, max(stat, comp), support


def _prove_dual(E: np.ndarray, rows, lam: np.ndarray, norm: str) -> float:
    """Proven lower bound lb on the optimal norm from multipliers lam (N,) (negative
    inequality multipliers are set to 0): lb = sum_ineq lam / ||S||_* with S = E^T Lam E
    bounded above including the rounding of Lam, of the products and of the norm."""
    return _dual_parts(E, rows, lam, norm)[0]


def _dual_parts(E: np.ndarray, rows, lam: np.ndarray, norm: str):
    """(lb of :func:`_prove_dual`, S (d, d) as computed, its dual norm as computed (||S||_F
    or ||S||_2); S None where lb is 0 for want of usable multipliers)."""
    E = np.asarray(E, float)
    K = E.shape[0]
    ineq = ~rows.eq
    if lam is None or not ineq.any() or not np.all(np.isfinite(lam)):
        return 0.0, None, 0.0
    lam = np.where(ineq, np.maximum(lam, 0.0), lam)
    Lam, Labs = _lam_matrix(rows, lam, K)
    aE = np.abs(E)
    with np.errstate(over="ignore", invalid="ignore"):
        S = E.T @ (Lam @ E)
        nr = len(lam)
        dS = aE.T @ ((_gamma(nr + 1) * Labs + _gamma(2 * K) * np.abs(Lam)) @ aE) * 1.0001
        errS = _fro_upper(dS) + 4 * K * K * TINY
        if get_norm(norm).name == "fro":
            s_hi, s_val = _fro_upper(S), None
        else:
            s_hi, _, sv = _svd_bounds(S)
            s_val = float(sv[0]) if sv.size else 0.0
        dual_hi = s_hi + errS
        num = float(lam[ineq].sum()) * (1 - _gamma(nr + 1))
        if s_val is None:
            s_val = float(np.linalg.norm(S))
    if dual_hi > 0 and num > 0 and np.isfinite(dual_hi):
        return num / dual_hi * (1 - 2 * U), S, s_val
    return 0.0, S, s_val


def _gap(primal: dict, lb: float, need: bool) -> float:
    """Proven relative gap (||W||_up / min(1, margin_lo) - lb) / lb."""
    if not need:
        return 0.0 if primal["norm_hi"] == 0 else np.inf
    if lb > 0 and primal["margin_lo"] > 0 and np.isfinite(primal["norm_hi"]):
        upper = primal["norm_hi"] / min(1.0, primal["margin_lo"]) * (1 + 2 * U)
        return float(max(upper - lb, 0.0) / lb * (1 + 4 * U) + 4 * U * upper / lb)
    return np.inf


def prove(E: np.ndarray, rows, W: np.ndarray, lam: np.ndarray | None, norm: str) -> dict:
    """Proven numbers of an answer W (d, d) with multipliers lam (N,) (None: primal only)
    on the Graph-SVM rows ``rows`` of embeddings E (module docstring for the bounds).

    Returns {margins (N,) computed, margin_lo (proven min inequality margin, inf without
    inequality), violation_hi (proven max violation), norm_hi (proven ||W||), lb (proven
    lower bound on the optimal norm; 0 without usable lam), gap_hi (proven relative gap;
    inf when lb = 0 but a margin is needed; 0 for W = 0 with nothing needed)}.
    """
    pr = _prove_primal(E, rows, W, norm)
    lb = _prove_dual(E, rows, lam, norm)
    pr["lb"] = lb
    pr["gap_hi"] = _gap(pr, lb, bool((~rows.eq).any()))
    return pr


# --------------------------------------------------------------------- assembly
def _status(pr: dict) -> str:
    if not (pr["violation_hi"] <= FEAS_TOL):
        return "uncertified"
    g = pr["gap_hi"]
    if g <= GAP_GRAPH:
        return "optimal"
    if g <= GAP_INACCURATE:
        return "optimal_inaccurate"
    return "suboptimal"


def _rank(pr: dict) -> tuple:
    """Order of proven primal answers: feasible first, then the smaller proven norm of
    W / min(1, margin)."""
    feas = pr["violation_hi"] <= FEAS_TOL
    up = pr["norm_hi"] / min(1.0, pr["margin_lo"]) if pr["margin_lo"] > 0 else np.inf
    return (not feas, up if np.isfinite(up) else np.inf)


def _farkas(cs: ConstraintSet):
    """A verified Farkas certificate of the rows, or None."""
    from .farkas import farkas_lp, farkas_polish

    csb = cs.batched()
    lam = farkas_lp(csb.take(0))
    if lam is None:
        return None
    ok, bound, lv = farkas_verify(csb, farkas_polish(csb, lam[None]))
    if not ok[0]:
        return None
    return lv[0][:, 0], float(bound[0])


def _norm_value(W: np.ndarray, norm: str) -> float:
    """||W||_F or ||W||_* (numpy; W finite and of moderate scale)."""
    if norm == "fro":
        m = float(np.abs(W).max()) if W.size else 0.0
        return 0.0 if m == 0 else m * float(np.linalg.norm(W / m))
    return float(np.linalg.svd(W, compute_uv=False).sum())


def _pow2_scale(E: np.ndarray) -> tuple[np.ndarray, int]:
    """E * 2^-e with max |E| in [1/2, 1) (exact), and e."""
    mx = float(np.abs(E).max())
    if mx == 0 or not np.isfinite(mx):
        return E, 0
    e = int(np.frexp(mx)[1])
    return np.ldexp(E, -e), e


@single_thread  # (small factorisations: BLAS threads only cost, badly under oversubscription)
def graph_svm(E, seqs, y, norm="fro", *, exclude=None, tol: float = 1e-6) -> Solution:
    """The Graph-SVM of a next-token-prediction dataset, certified (docs/theory.md §10):

        W_svm = argmin ||W||  s.t. for every sample i, label y of i and token j != y of i:
            (e_y - e_j)^T W e_k  = 0    if y, j are in one SCC of the priority graph G_k
            (e_y - e_j)^T W e_k >= 1    otherwise                          (k = k_i = s_iT)

    with e_k = E[k] and G_k the token-priority graph of the samples whose query is k
    (:func:`attnsvm.ntp.graph_rows` enumerates the rows).  The solvers and the proof of
    ``violation_`` and ``gap_``: the docstring of :mod:`attnsvm.svm.graph` (on the API
    page: "The Graph-SVM: its solvers and its proof").

    Parameters
    ----------
    E : (K, d) token embeddings.  seqs : (n, T) token ids (query = last token).
    y : (n,) next-token ids, or (n, L) sets of acceptable next tokens (-1 padding; the
        local-convergence setting).
    norm : "fro" (trained W) or "nuc" (trained (K, Q)).
    exclude : optional (n, T) bool, positions left out of the constraints (the paper's
        local setting drops tokens of small but non-negligible probability).
    tol : activity tolerance of ``support_``.

    Returns
    -------
    :class:`~attnsvm.svm.Solution` with problem "graph_svm".  The constraint layout is one
    row per distinct constraint r (``extra["rows"]``: k, y, j, eq, samples, scc):
    ``margins_``, ``dual_``, ``support_`` are (N, 1).  ``margin_`` is the proven lower
    bound of the inequality margins, ``violation_`` and ``gap_`` proven upper bounds;
    ``extra["proof"]`` holds every proven number.  Without inequality rows (every
    preference is a tie) the answer is W = 0.  ``conflict_`` (infeasible): the samples
    whose rows carry the verified Farkas certificate.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import graph_svm
        >>> E = np.eye(3)                              # K = 3 tokens in d = 3
        >>> seqs = np.array([[0, 1, 2], [1, 0, 2]])    # query token 2 (the last) in both
        >>> sol = graph_svm(E, seqs, y=[0, 1])         # 0 and 1 each beat the other: one SCC, a tie
        >>> sol.status_, sol.extra["rows"].eq.tolist()
        ('optimal', [True, False, True, False])
        >>> sol2 = graph_svm(E, seqs[:1], y=[0])       # 0 alone must beat 1 and 2
        >>> sol2.status_, round(sol2.norm_, 6)
        ('optimal', 0.816497)
    """
    from ..ntp.graph import graph_rows

    data, N = _validate(E, seqs, y, norm)
    _kernels_ready(N)  # an empty numba cache is compiled before the timer starts
    t0 = time.perf_counter()
    rows = graph_rows(data.seqs, data.y, data.K, exclude=exclude)
    Es, e = _pow2_scale(data.E)
    cs = graph_constraints(Es, rows)
    d = data.d
    base = dict(norm=N.name, problem="graph_svm", tol_active=tol)
    extra = {"rows": rows, "scc": rows.scc, "n_constraints": len(rows),
             "n_equalities": int(rows.eq.sum())}
    ineq = ~rows.eq
    if not ineq.any():  # nothing to separate: W = 0 meets every equality
        W = np.zeros((d, d))
        pr = prove(data.E, rows, W, np.zeros(len(rows)), N.name)
        extra["proof"] = pr
        return Solution(W_=W, norm_=0.0, margin_=np.inf, violation_=pr["violation_hi"],
                        kkt_residual_=0.0, gap_=0.0, dual_=np.zeros((len(rows), 1)),
                        support_=np.ones((len(rows), 1), bool), margins_=pr["margins"][:, None],
                        status_="optimal", solver_="trivial", feasible_=True,
                        time_=time.perf_counter() - t0, extra=extra, **base)
    zero = (np.abs(cs.Delta[:, 0]).max(1) == 0) | (np.abs(cs.Z).max(1) == 0)
    best_p = best_lam = None  # (proof, W normalised, W out), (lb, lam normalised, lam out)
    names = []
    fk = None
    if not (zero & ineq).any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for W, lam, name in (_solve_fro if N.name == "fro" else _solve_nuc)(cs):
                names.append(name)
                if W is None and best_p is None and fk is None:  # the solver saw no answer
                    fk = _farkas(cs)
                    if fk is not None:
                        break
                if W is not None and np.all(np.isfinite(W)):
                    W = _to_feasible(cs, W)
                    Wout = np.ldexp(W, -2 * e)  # exact: the margins are bilinear in E
                    pp = _prove_primal(data.E, rows, Wout, N.name)
                    if best_p is None or _rank(pp) < _rank(best_p[0]):
                        best_p = (pp, W, Wout, name)
                if lam is not None and np.all(np.isfinite(lam)):
                    lam_out = np.ldexp(np.where(ineq, np.maximum(lam, 0.0), lam), -2 * e)
                    lb, S, s_val = _dual_parts(data.E, rows, lam_out, N.name)
                    if best_lam is None or lb > best_lam[0]:
                        best_lam = (lb, lam, lam_out, name, S, s_val)
                if best_p is not None and best_lam is not None:
                    g = _gap(best_p[0], best_lam[0], True)
                    if best_p[0]["violation_hi"] <= FEAS_TOL and g <= GAP_GRAPH:
                        break
    if best_p is not None:
        pr, W, Wout, name = best_p
        lb, lam, lam_out, lname, S, s_val = best_lam if best_lam is not None else (
            0.0, np.zeros(len(rows)), np.zeros(len(rows)), "none", None, 0.0)
        pr = {**pr, "lb": lb, "gap_hi": _gap(pr, lb, True)}
        st = _status(pr)
        extra["proof"] = pr
        extra["tried"] = names
        if st != "uncertified":
            nrm = pr["norm"]
            lam_out, kkt, support = _kkt(data.E, rows, Wout, lam_out, N.name, pr["margins"], tol,
                                         nrm, None if S is None else (S, s_val))
            return Solution(
                W_=Wout, norm_=nrm, margin_=pr["margin_lo"],
                violation_=pr["violation_hi"], kkt_residual_=kkt,
                gap_=pr["gap_hi"], dual_=lam_out[:, None], support_=support[:, None],
                margins_=pr["margins"][:, None], status_=st,
                solver_=name if lname == name else f"{name} (multipliers: {lname})",
                feasible_=True, time_=time.perf_counter() - t0, extra=extra, **base)
    name = "+".join(names) or "none"
    fk = _farkas(cs) if fk is None else fk
    if fk is not None:
        lam_f, bound = fk
        hit = np.abs(lam_f) > 1e-9 * np.abs(lam_f).max()
        conflict = tuple(int(s) for s in rows.samples_of(np.nonzero(hit)[0]))
        extra.update(farkas_multipliers=lam_f, farkas_bound=bound)
        return Solution(W_=None, norm_=np.inf, margin_=np.nan, violation_=np.nan,
                        kkt_residual_=np.nan, gap_=np.nan, dual_=None, support_=None,
                        margins_=None, status_="infeasible", solver_=name + "+farkas-lp",
                        feasible_=False, conflict_=conflict, time_=time.perf_counter() - t0,
                        extra=extra, **base)
    return Solution(W_=None, norm_=np.inf, margin_=np.nan, violation_=np.nan,
                    kkt_residual_=np.nan, gap_=np.nan, dual_=None, support_=None,
                    margins_=None, status_="uncertified", solver_=name, feasible_=False,
                    time_=time.perf_counter() - t0, extra=extra, **base)


def graph_svm_batch(problems, norm="fro", **kw) -> list[Solution]:
    """Graph-SVMs of many datasets: ``problems`` a list of (E, seqs, y) tuples or
    :class:`~attnsvm.ntp.NTPData`; returns the list of Solutions (each as
    :func:`graph_svm`).  Inputs are all validated before any solve starts.

    Example::

        >>> from attnsvm.ntp import ntp_random
        >>> from attnsvm.svm import graph_svm_batch
        >>> sols = graph_svm_batch([ntp_random(4, 6, 8, 8, seed=s) for s in range(3)])
        >>> [s.status_ for s in sols]
        ['optimal', 'optimal', 'optimal']
    """
    from ..ntp.data import NTPData

    items = []
    for b, p in enumerate(problems):
        if isinstance(p, NTPData):
            items.append(p)
            continue
        if not isinstance(p, (tuple, list)) or len(p) != 3:
            raise ValueError(f"problems[{b}] must be an NTPData or an (E, seqs, y) tuple")
        try:
            items.append(NTPData(*p))
        except ValueError as exc:
            raise ValueError(f"problems[{b}]: {exc}") from None
    get_norm(norm)
    return [graph_svm(p.E, p.seqs, p.y, norm, **kw) for p in items]
