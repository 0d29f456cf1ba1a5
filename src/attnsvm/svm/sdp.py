"""The nuclear-norm SDP methods: min ||W||_* s.t. <A_k, W> >= b_k (== b_k on equality rows),
A_k = Delta_k z_k^T, and its dual max sum_k lam_k b_k s.t. ||sum_k lam_k A_k||_2 <= 1.

* :func:`nuclear_ipm`: the primal-dual SDP interior-point method (Mehrotra predictor-
  corrector, Nesterov-Todd scaling; an N x N Schur complement from the rank-one
  constraints), rows joining the running method; :func:`nuclear_ipm_small`: the same
  iteration by its numba kernel (:mod:`attnsvm.svm._nuc_kernels`, whose numpy reference
  is this module's plain code); :func:`warmup_nuclear` compiles it;
* :func:`nuclear_barrier`: the structured dual log-barrier method.

Which of them runs, on which working set, is :mod:`attnsvm.svm.nuclear` (ATT-SVMs and the
Graph-SVM); the choice per norm is :data:`attnsvm.svm.strategy.STRATEGIES`.  (Formerly in
:mod:`attnsvm.svm.fast`, which re-exports them.)  References: those of
:mod:`attnsvm.svm.fast` (Mehrotra 1992; Nesterov & Todd 1997, 1998; Todd, Toh & Tütüncü
1998; Toh, Todd & Tütüncü 1999; Boyd & Vandenberghe 2004, §11.3).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from .._optional import OptionalImport

__all__ = ["nuclear_barrier", "nuclear_ipm", "nuclear_ipm_small", "warmup_nuclear",
           "NUC_KERNEL_MAX_N"]


def nuclear_barrier(Delta: np.ndarray, Zk: np.ndarray, b: np.ndarray, *, gap_tol: float = 1e-9,
                    mu: float = 30.0, max_newton: int = 300, lam0: np.ndarray | None = None,
                    t_init: float = 1.0, t0: float | None = None, state: dict | None = None,
                    predict: bool = True):
    """Log-barrier Newton method on the DUAL of the nuclear-norm SVM over N constraints

        primal  min ||W||_*  s.t. <W, A_k> >= b_k,   A_k = Delta_k z_k^T   (Delta (N, d), Zk (N, e))
        dual    max b^T lam  s.t. ||S(lam)||_op <= 1, lam >= 0,   S(lam) = sum_k lam_k A_k,

    with ||S||_op <= 1  <=>  F(lam) = [[I, S], [S^T, I]] PSD.  For growing t we minimise
    phi_t(lam) = -t b^T lam - logdet F(lam) - sum_k log lam_k by damped Newton steps.
    B_k = u_k v_k^T + v_k u_k^T (u_k = [Delta_k; 0], v_k = [0; z_k]) is rank two, so with
    G = F^{-1} the Hessian of -logdet F is  2 (P o Q + R o R^T),  P = U^T G U, Q = V^T G V,
    R = U^T G V  (N x N, O(N^2 (d + e)) flops; no (d+e)^2 x (d+e)^2 matrix is formed).
    At the centre of phi_t the primal point  W = -2 G_12 / t  satisfies
    <W, A_k> = b_k + 1 / (t lam_k) >= b_k (exactly feasible), and ||W||_* <= tr(G) / t,
    so the duality gap is <= (d + e + N) / t.  The last centring is run to full Newton
    convergence; ``lam0`` (> 0 with ||S(lam0)||_op < 1) and ``t0`` warm-start the path;
    ``state['t']`` receives the final t. ``predict``: before each increase of t, step along
    the path's tangent (:func:`_predict`; measured 5-15% fewer Newton steps).
    Returns (W (d, e), lam (N,) multipliers of min ||W||_* with ||S(lam)||_op <= 1,
    status "optimal" | "failed" | "infeasible", n_newton).
    """
    N, d = Delta.shape
    e = Zk.shape[1]
    m = d + e
    nu = m + N
    eye = np.eye(m)

    def chol_logdet(lam):
        if np.any(lam <= 0):
            return None, np.inf
        S = (Delta * lam[:, None]).T @ Zk
        F = eye.copy()
        F[:d, d:] = S
        F[d:, :d] = S.T
        try:
            L = np.linalg.cholesky(F)
        except np.linalg.LinAlgError:
            return None, np.inf
        return L, 2.0 * np.log(np.diag(L)).sum()

    s1 = np.linalg.norm(Delta.T @ Zk, 2)
    bmax = max(float(np.abs(b).max()), 1e-300)
    if lam0 is not None:
        lam = np.asarray(lam0, float).copy()
        # warm start without t0: gap nu / t = 1e-3 b^T lam (a point near the optimum)
        t = float(t0) if t0 is not None else nu / max(1e-3 * float(b @ lam), 1e-300)
    else:
        lam = np.full(N, 0.5 / max(s1, 1e-300))
        t = t_init * nu / max(float(b @ lam), 1e-300)
    L, ld = chol_logdet(lam)
    if L is None:
        return None, None, "failed", 0
    it = 0
    final = False
    Hfac = None
    while it < max_newton:
        for k in range(100):  # centring by damped Newton
            it += 1
            Li = np.linalg.inv(L)
            G = Li.T @ Li
            DG12 = Delta @ G[:d, d:]
            P = (Delta @ G[:d, :d]) @ Delta.T
            Q = (Zk @ G[d:, d:]) @ Zk.T
            R = DG12 @ Zk.T
            g = -t * b - 2.0 * (DG12 * Zk).sum(1) - 1.0 / lam
            H = P * Q
            H += R * R.T
            H *= 2.0
            H[np.diag_indices_from(H)] += 1.0 / lam**2
            try:
                Hfac = cho_factor(H, lower=True, check_finite=False)
                dl = -cho_solve(Hfac, g, check_finite=False)
            except np.linalg.LinAlgError:
                Hfac = None
                dl = -np.linalg.lstsq(H, g, rcond=None)[0]
            dec = float(-g @ dl)
            if not np.isfinite(dec) or dec < 1e-14:
                break
            phi0 = -t * float(b @ lam) - ld - np.log(lam).sum()
            neg = dl < 0
            s = min(1.0, 0.99 * float((-lam[neg] / dl[neg]).min())) if neg.any() else 1.0
            ok = False
            while s > 1e-14:
                lam_n = lam + s * dl
                Ln, ldn = chol_logdet(lam_n)
                # phi_t is self-concordant: for a Newton decrement dec = lambda^2 < 0.01 the
                # full step stays feasible and converges quadratically, so it is taken on
                # feasibility alone (at t ~ 1e9 the Armijo test cannot resolve the decrease
                # against |phi| in float64 and would stall the last centring)
                if Ln is not None and ((s == 1.0 and dec < 1e-2) or (
                        -t * float(b @ lam_n) - ldn - np.log(lam_n).sum()
                        <= phi0 - 0.25 * s * dec)):
                    ok = True
                    break
                s *= 0.5
            if not ok:
                break
            lam, L, ld = lam_n, Ln, ldn
            if dec < (1e-10 if final else 1e-1) and s == 1.0:
                break
            if final and k >= 20:  # rounding level reached (F is nearly singular)
                break
        Li = np.linalg.inv(L)
        dual_obj = float(b @ lam)
        if state is not None:
            state["t"] = t
        if final:
            G12 = Li[:, :d].T @ Li[:, d:]
            return -2.0 * G12 / t, lam, "optimal", it
        # dual unbounded: primal infeasible.  bmax / s1 is the natural scale of the
        # optimum (margin b against a constraint operator of norm ~ s1); a dual objective
        # 1e12 times that means ||W|| >= 1e12 that scale, whose margins carry relative
        # rounding ~1e-4: treated as a ray.  (The solver's word only: "infeasible" is
        # reported by the engine only with a verified Farkas certificate)
        if dual_obj > 1e12 * bmax / max(s1, 1e-300):
            return None, None, "infeasible", it
        if nu / t <= gap_tol * dual_obj:
            final = True
            continue
        t_new = min(t * mu, 1.01 * nu / (gap_tol * dual_obj))
        if predict and Hfac is not None:
            lam, L, ld = _predict(lam, L, ld, t, t_new, cho_solve(Hfac, b, check_finite=False),
                                  b, chol_logdet)
        t = t_new
    return None, lam, "failed", it


def _predict(lam, L, ld, t, t_new, dldt, b, chol_logdet):
    """Predictor step along the central path: lam(t') ~ lam + (t' - t) dlam/dt, where
    dlam/dt = H^{-1} b (differentiate grad phi_t(lam(t)) = 0 in t). Halved until strictly
    feasible and better than lam for phi_{t'}; otherwise lam is kept."""
    phi = -t_new * float(b @ lam) - ld - np.log(lam).sum()
    step = t_new - t
    for _ in range(8):
        lam_n = lam + step * dldt
        if np.all(lam_n > 0):
            Ln, ldn = chol_logdet(lam_n)
            if Ln is not None and -t_new * float(b @ lam_n) - ldn - np.log(lam_n).sum() < phi:
                return lam_n, Ln, ldn
        step *= 0.5
    return lam, L, ld


def _sym(A: np.ndarray) -> np.ndarray:
    return 0.5 * (A + A.T)


def _unit_step(T: np.ndarray) -> float:
    """Largest a <= 1 with I + a T PSD (T symmetric up to rounding)."""
    lmin = float(np.linalg.eigvalsh(_sym(T))[0])
    return 1.0 if lmin >= -1.0 else -1.0 / lmin


def _pos_step(x: np.ndarray, dx: np.ndarray) -> float:
    neg = dx < 0
    return float(min(1.0, (-x[neg] / dx[neg]).min())) if neg.any() else 1.0


class _Schur:
    """The N x N Schur complement of :func:`nuclear_ipm` in preallocated buffers (N x N
    temporaries per iteration otherwise cost as much in page faults as the arithmetic)."""

    def __init__(self, N: int):
        self.buf = [np.empty((N, N)) for _ in range(2)]

    def __call__(self, Delta, Zk, Wn, diag, delta=0.0):
        """M = 1/2 (W_uu o W_vv + W_uv o W_uv^T) + diag(diag), W_uu = Delta Wn11 Delta^T,
        W_vv = Zk Wn22 Zk^T, W_uv = Delta Wn12 Zk^T (M_kl = <B_k, Wn B_l Wn>); plus
        delta max(diag M) on the diagonal."""
        d = Delta.shape[1]
        P, Q = self.buf
        np.matmul(Delta @ Wn[:d, :d], Delta.T, out=P)
        np.matmul(Zk @ Wn[d:, d:], Zk.T, out=Q)
        P *= Q
        np.matmul(Delta @ Wn[:d, d:], Zk.T, out=Q)
        Q *= Q.T  # (symmetric: Q_kl Q_lk)
        P += Q
        P *= 0.5
        P.flat[:: P.shape[0] + 1] += diag
        if delta:
            P.flat[:: P.shape[0] + 1] += delta * float(P.diagonal().max())
        return P


def _chol_reg(build):
    """cho_factor of the symmetric M = build(delta) (factorised in place), where build adds
    delta max(diag M) to the diagonal: delta = 0, and if M is numerically singular
    (duplicate constraints with s_k / y_k -> 0) 1e-14, 1e-12, 1e-10; None if all fail."""
    for delta in (0.0, 1e-14, 1e-12, 1e-10):
        try:  # (M is symmetric: its transpose is the same matrix in Fortran order)
            return cho_factor(build(delta).T, lower=False, overwrite_a=True,
                              check_finite=False)
        except np.linalg.LinAlgError:
            continue
    return None


def nuclear_ipm(Delta: np.ndarray, Zk: np.ndarray, b: np.ndarray, *, tol: float = 1e-9,
                max_iter: int = 100, check=None, check_tol: float = 1e-1,
                check_min: float = 0.0, stall_tol: float = 1e-7, drop_tol: float = 0.0,
                drop_slack: float = 0.05, eq: np.ndarray | None = None, refine: int = 0,
                refine_below: float = 1e-5):
    """Primal-dual interior-point method (Mehrotra 1992 predictor-corrector, Nesterov-Todd
    1997/1998 scaling; the NT point and step rule as in SDPT3, Todd-Toh-Tütüncü 1998 and
    Toh-Todd-Tütüncü 1999: see the module's references) for the nuclear-norm SVM over N
    constraints, as the SDP pair

        primal  min 1/2 tr X   s.t.  X = [[X11, W], [W^T, X22]] PSD,  <B_k, X> - s_k = b_k, s >= 0
        dual    max b^T y      s.t.  Z = I/2 - sum_k y_k B_k PSD,  y >= 0,

    B_k = (u_k v_k^T + v_k u_k^T) / 2, u_k = [Delta_k; 0], v_k = [0; z_k]  (Delta (N, d),
    Zk (N, e)), so <B_k, X> = Delta_k^T W z_k and Z PSD <=> ||S(y)||_op <= 1,
    S(y) = sum_k y_k Delta_k z_k^T: the primal is min ||W||_* s.t. <W, A_k> >= b_k
    (min 1/2 tr X over X PSD with off-diagonal block W is ||W||_*).  Infeasible start
    (X = xi I, s = max(1, |b|), y = 1 / (2 ||S(1)||_op), Z = I/2 - sum y_k B_k); with the
    NT scaling point Wn (Wn Z Wn = X) the Schur complement is

        M = 1/2 (Wn_uu o Wn_vv + Wn_uv o Wn_uv^T) + diag(s / y),   Wn_uv = [u_k^T Wn v_l]_kl

    (N x N, O(N^2 (d + e)) to form: :class:`_Schur`; no (d e)^2 matrix).  Stops when
    the relative gap (tr X / 2 - b^T y) / b^T y, the primal residual
    max_k |<B_k, X> - s_k - b_k| / max |b| and the dual one max |sum_k y_k B_k + Z - I/2| / (1/2)
    are all <= ``tol``, or, at the rounding floor (their max not halved in 5 iterations),
    with the best iterate if that is <= ``stall_tol`` (not halved in 16: "failed").

    ``check(W, final)``: constraint generation.  Called at every iterate whose residuals
    are in (``check_min``, ``check_tol``] (``final`` False) and at convergence (True),
    with W = X12; it returns None or rows (Delta', Zk', b') to append, which enter with
    y_k = mean(y) and s_k = max(<B_k, X> - b_k, mu / y_k), Z unchanged: the method goes on
    from there (the primal and dual residuals absorb the new rows) instead of restarting
    (measured: ~22 iterations in all vs ~40 with restarts; rows added at convergence
    converge poorly: callers add them by a new, cold run).
    ``drop_tol`` > 0: once, at the first iterate with gap and residuals <= ``drop_tol``,
    the rows with slack s_k > ``drop_slack`` |b_k| and y_k < 1e-3 max y leave the method
    (their y_k is reported as 0; the caller checks them at the end).
    ``eq`` (N,) bool: equality rows <B_k, X> = b_k (no slack, s_k = 0; y_k free, no sign
    constraint and no complementarity term: their Schur diagonal s_k / y_k is 0, so they
    must be linearly independent of each other); appended rows are inequalities.
    ``refine``: steps of iterative refinement of each Newton direction, on the residual
    of its linearised primal rows computed through the operator (the N x N Schur
    complement's condition grows as the iterates approach the optimum), at the iterates
    whose residual max(gap, primal, dual) is <= ``refine_below`` (before, the directions
    are accurate enough).
    Returns (W = X12 (d, e), y (N_final,) for the rows in order (given, then appended),
    status "optimal" | "failed" | "infeasible", n_iter); "failed" returns the best
    iterate.  y >= 0; ||S(y)||_op <= 1 up to the dual residual (a lower bound on the
    optimum, b^T y / ||S(y)||_op, holds for any y >= 0).
    """
    N, d = Delta.shape
    e = Zk.shape[1]
    m = d + e
    eye = np.eye(m)
    bmax = max(float(np.abs(b).max()), 1e-300)
    ineq = np.ones(N, bool) if eq is None else ~np.asarray(eq, bool)
    s1 = max(float(np.linalg.norm(Delta[ineq].T @ Zk[ineq], 2)), 1e-300)

    def A(R):  # <B_k, R> for a symmetric m x m R
        return ((Delta @ R[:d, d:]) * Zk).sum(1)

    def Bs(v):  # sum_k v_k B_k
        S = Delta.T @ (v[:, None] * Zk)
        out = np.zeros((m, m))
        out[:d, d:] = 0.5 * S
        out[d:, :d] = 0.5 * S.T
        return out

    y = np.where(ineq, 0.5 / s1, 0.0)
    Zm = 0.5 * eye - Bs(y)
    X = max(1.0, 2.0 * float(b @ y) / m) * eye
    s = np.where(ineq, max(1.0, bmax), 0.0)
    schur = _Schur(N)
    status = "failed"
    ids = np.arange(N)  # the rows in the method, among all given / appended so far
    n_all = N
    best = (np.inf, X[:d, d:].copy(), y.copy(), ids)
    since = 0
    it = 0
    while it < max_iter:
        it += 1
        try:
            LZ = np.linalg.cholesky(Zm)
            LX = np.linalg.cholesky(X)
        except np.linalg.LinAlgError:
            break
        rp = A(X) - s - b
        Rd = Bs(y) + Zm - 0.5 * eye
        dobj = float(b @ y)
        rgap = (0.5 * float(np.trace(X)) - dobj) / max(abs(dobj), 1e-300)
        rinf = float(np.abs(rp).max()) / bmax
        res = max(rgap, rinf, 2.0 * float(np.abs(Rd).max()))
        conv = res <= tol
        mu = (float((X * Zm).sum()) + float(s @ y)) / (m + int(ineq.sum()))
        if check is not None and (conv or check_min < res <= check_tol):
            new = check(X[:d, d:], conv)
            if new is not None and len(new[2]):
                Dn, Zn, bn = (np.asarray(a, float) for a in new)
                yn = np.full(len(bn), float(y.mean()))
                sn = np.maximum(((Dn @ X[:d, d:]) * Zn).sum(1) - bn, mu / yn)
                Delta = np.concatenate([Delta, Dn])
                Zk = np.concatenate([Zk, Zn])
                b = np.concatenate([b, bn])
                y = np.concatenate([y, yn])
                s = np.concatenate([s, sn])
                ineq = np.concatenate([ineq, np.ones(len(bn), bool)])
                ids = np.concatenate([ids, np.arange(n_all, n_all + len(bn))])
                n_all += len(bn)
                bmax = max(bmax, float(np.abs(bn).max()))
                schur = _Schur(len(y))
                best = (np.inf, *best[1:])
                since = 0
                continue
        if drop_tol and res <= drop_tol:  # once: rows far from active leave the method
            drop_tol = 0.0
            # far from active: slack above drop_slack (default 0.05) |b_k| (margin 5% past
            # b_k while the gap is <= drop_tol: not active at the optimum) AND multiplier
            # below 1e-3 of the largest (its row adds < 1e-3 of the dual's weight); both, so
            # a row that is nearly active by either measure stays
            # (equality rows always stay)
            keep = ((s <= drop_slack * np.maximum(np.abs(b), 1e-300)) | (y >= 1e-3 * y.max())
                    | ~ineq)
            if not keep.all():
                Delta, Zk, b, y, s, ids, ineq = (a[keep] for a in (Delta, Zk, b, y, s, ids, ineq))
                schur = _Schur(len(y))
                continue
        if res < best[0]:
            if res < 0.5 * best[0]:
                since = 0
            best = (res, X[:d, d:].copy(), y.copy(), ids)
        since += 1
        if conv:
            status = "optimal"
            break
        if since > 4 and best[0] <= stall_tol:  # rounding floor: the best iterate (the
            status = "stalled"  # certificate judges it)
            break
        if since > 15:
            break
        if dobj > 1e12 * bmax / s1:  # dual ray: the primal is infeasible
            # (bmax / s1: the natural scale of the optimum, as in nuclear_barrier; 1e12 times
            # it leaves margins with relative rounding ~1e-4.  The solver's word only)
            status = "infeasible"
            break
        # NT scaling (Nesterov-Todd 1997; the computation of Todd-Toh-Tütüncü 1998, §4):
        # L_Z^T L_X = U diag(sv) V^T, G = L_X V diag(sv)^-1/2, Wn = G G^T, the unique
        # PD matrix with Wn Z Wn = X; then G^-1 X G^-T = G^T Z G = diag(sv) =: D
        U_, sv, Vt = np.linalg.svd(LZ.T @ LX)
        if sv[-1] <= 0:
            break
        G = LX @ (Vt.T / np.sqrt(sv))
        Gi = (U_ / np.sqrt(sv)).T @ LZ.T  # G^-1 = D^-1/2 U^T L_Z^T
        Wn = G @ G.T
        yin = np.where(ineq, y, 1.0)
        F = _chol_reg(lambda delta, Delta=Delta, Zk=Zk, Wn=Wn, s=s, yin=yin, schur=schur:
                      schur(Delta, Zk, Wn, s / yin, delta))
        if F is None:
            break
        Dsum = sv[:, None] + sv[None, :]
        rs = 1.0 / np.sqrt(np.outer(sv, sv))
        r0 = -rp - A(Wn @ Rd @ Wn)
        nref = refine if res <= refine_below else 0

        def direction(Rt, rc, F=F, r0=r0, G=G, Wn=Wn, Rd=Rd, s=s, yin=yin, rp=rp, nref=nref):
            # scaled: dXt + dZt = Rt;  dX = G Rt G^T - Wn dZ Wn,  dZ = -Rd - sum_k dy_k B_k
            # (rc = 0 and s = 0 on equality rows: ds = 0 there)
            GRG = G @ Rt @ G.T
            dy = cho_solve(F, r0 - A(GRG) + rc / yin, check_finite=False)
            for _ in range(nref + 1):
                dZ = -Rd - Bs(dy)
                dX = _sym(GRG - Wn @ dZ @ Wn)
                ds = (rc - s * dy) / yin
                if _ == nref:
                    break
                # residual of the linearised primal rows A(dX) - ds = -rp, through the
                # operator itself (not the factorised, possibly regularised M)
                dy = dy - cho_solve(F, A(dX) - ds + rp, check_finite=False)
            return dX, dy, dZ, ds

        def steps(dX, dy, dZ, ds, G=G, Gi=Gi, rs=rs, s=s, y=y, ineq=ineq):
            # X + a dX = G (D + a dXt) G^T, Z + a dZ = G^-T (D + a dZt) G^-1 (scaled
            # directions dXt = G^-1 dX G^-T, dZt = G^T dZ G): PSD iff I + a D^-1/2 (.) D^-1/2 is
            dXt = Gi @ dX @ Gi.T
            dZt = G.T @ dZ @ G
            return (min(_unit_step(dXt * rs), _pos_step(s[ineq], ds[ineq])),
                    min(_unit_step(dZt * rs), _pos_step(y[ineq], dy[ineq])), dXt, dZt)

        # predictor (affine scaling: target X Z = 0, s y = 0 on the inequality rows), its
        # longest steps ap, ad
        dX, dy, dZ, ds = direction(-np.diag(sv), -s * y * ineq)
        ap, ad, dXt, dZt = steps(dX, dy, dZ, ds)
        mu_aff = (float(((X + ap * dX) * (Zm + ad * dZ)).sum())
                  + float((s + ap * ds) @ (y + ad * dy))) / (m + int(ineq.sum()))
        # centring sigma = (mu_aff / mu)^3, Mehrotra's heuristic (Mehrotra 1992; Nocedal &
        # Wright eq. 14.34): ~0 where the affine step alone closes the gap, ~1 (pure
        # centring) where it stalls; capped at 1 because from the infeasible start the
        # affine step can raise <X, Z> + s^T y (mu_aff > mu)
        sigma = min(1.0, (mu_aff / mu) ** 3)
        # corrector: target sigma mu I, with Mehrotra's second-order term dXt dZt from the
        # scaled affine directions (symmetrised: the NT direction, Todd-Toh-Tütüncü 1998)
        Rc = sigma * mu * eye - np.diag(sv * sv) - _sym(dXt @ dZt)
        dX, dy, dZ, ds = direction(2.0 * Rc / Dsum, (sigma * mu - s * y - ds * dy) * ineq)
        ap, ad, _, _ = steps(dX, dy, dZ, ds)
        # step length: the fraction gamma of the longest step that stays in the cones,
        # gamma = 0.9 + 0.09 min(ap, ad) (SDPT3's rule: Toh-Todd-Tütüncü 1999,
        # Tütüncü-Toh-Todd 2003): 0.9 while the longest steps are short (far from the
        # solution: keep well inside, where the NT direction is reliable), up to 0.99 as
        # ap, ad -> 1 near the solution (nearly full steps: fast local convergence)
        gamma = 0.9 + 0.09 * min(ap, ad)
        ap, ad = min(1.0, gamma * ap), min(1.0, gamma * ad)
        X = _sym(X + ap * dX)
        s = s + ap * ds
        y = y + ad * dy
        Zm = _sym(Zm + ad * dZ)
    W, yb, ib = (X[:d, d:].copy(), y, ids) if status == "optimal" else best[1:]
    y_all = np.zeros(n_all)
    y_all[ib] = yb
    return W, y_all, "optimal" if status in ("optimal", "stalled") else status, it


_nuc_kernels = OptionalImport("._nuc_kernels", __package__)  # the numba kernel, or None
NUC_KERNEL_MAX_N = 160  # the compiled kernel up to this many rows (its Schur complement is
# factorised in plain loops: beyond, the reference's LAPACK wins; measured crossover
# N ~ 150-250 with one BLAS thread)


def nuclear_ipm_small(Delta: np.ndarray, Zk: np.ndarray, b: np.ndarray, *, tol: float = 1e-9,
                      max_iter: int = 100, stall_tol: float = 1e-7, eq: np.ndarray | None = None,
                      refine: int = 0, refine_below: float = 1e-5,
                      compiled: bool | None = None):
    """:func:`nuclear_ipm` without constraint generation, by its numba kernel
    (:mod:`attnsvm.svm._nuc_kernels`: the same iteration, without the interpreter's cost
    per array operation) where numba is importable and N <= NUC_KERNEL_MAX_N, else by
    :func:`nuclear_ipm` itself; ``compiled`` forces the choice (True without numba
    raises).  Same arguments and returns as :func:`nuclear_ipm`."""
    N = Delta.shape[0]
    kern = _nuc_kernels() if compiled is not False else None
    if compiled and kern is None:
        raise RuntimeError("nuclear_ipm_small(compiled=True) needs numba")
    if kern is None or (compiled is None and N > NUC_KERNEL_MAX_N):
        return nuclear_ipm(Delta, Zk, b, tol=tol, max_iter=max_iter, stall_tol=stall_tol,
                           eq=eq, refine=refine, refine_below=refine_below)
    ineq = np.ones(N, bool) if eq is None else ~np.asarray(eq, bool)
    W, y, code, it = kern.nuc_ipm_kernel(
        np.ascontiguousarray(Delta, float), np.ascontiguousarray(Zk, float),
        np.ascontiguousarray(b, float), ineq, float(tol), int(max_iter), int(refine),
        float(refine_below), float(stall_tol))
    status = {kern.OPTIMAL: "optimal", kern.STALLED: "optimal",
              kern.INFEASIBLE: "infeasible"}.get(int(code), "failed")
    return W, y, status, int(it)


def warmup_nuclear() -> bool:
    """Compile (or load from numba's disk cache) the kernel of :func:`nuclear_ipm_small` on a
    tiny problem with an equality row; returns whether numba is available."""
    if _nuc_kernels() is None:
        return False
    Delta = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    Zk = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    nuclear_ipm_small(Delta, Zk, np.array([1.0, 1.0, 0.0]), eq=np.array([False, False, True]),
                      refine=2, compiled=True)
    return True
