"""Fast solvers for the Frobenius-norm problems (W with queries z, prompt p).

    min 1/2 ||W||_F^2   s.t.   <W, A_k> >= b_k,   A_k = Delta_k z_k^T

Two exact second-order methods (no first-order tolerance games), each followed by an
active-set polish that solves the KKT system of the identified support exactly:

* ``primal_ipm``: a Mehrotra predictor-corrector interior-point method on the primal.
  Its normal matrix I + sum_k c_k vec(A_k) vec(A_k)^T is formed from the Kronecker
  structure, sum_i C_i (x) z_i z_i^T with C_i = sum_t c_it Delta_it Delta_it^T, in
  O(n T d^2 + n d^2 e^2) time and O(d^2 e^2) memory: the (N x N) Gram matrix is never
  built (N = 63,000 constraints at (1000, 64, 32)).
* ``batched_mnp``: many small problems at once through the equivalent minimum-norm-
  point problem over the simplex,

      rho^2 = min_{mu >= 0, 1^T mu = 1} || sum_k mu_k A_k ||_F^2,   G_kl = (Delta_k.Delta_l)(z_k.z_l),

  solved by a batched interior-point method on (B, N, N) Gram matrices.  rho > 0 iff
  the SVM is feasible, and then W_mm = (sum_k mu_k A_k) / rho^2, ||W_mm|| = 1 / rho;
  rho = 0 makes mu a Farkas certificate (sum mu_k A_k = 0) whose support names the
  conflicting sequences.

Both are Mehrotra's predictor-corrector method (Mehrotra 1992; Wright 1997, ch. 10;
Nocedal & Wright 2006, §14.2): an affine-scaling (predictor) direction, the centring
parameter sigma = (mu_aff / mu)^3 from how far it reduces the complementarity mu, and a
corrector with Mehrotra's second-order term.  The nuclear-norm SDP methods
(``nuclear_ipm``, ``nuclear_ipm_small``, ``nuclear_barrier``, ``warmup_nuclear``) live in
:mod:`attnsvm.svm.sdp`; they are re-exported here (their former home).

References
----------
S. Mehrotra (1992), On the implementation of a primal-dual interior point method, SIAM J.
Optim. 2(4), 575-601.
S. J. Wright (1997), Primal-Dual Interior-Point Methods, SIAM, ch. 10.
J. Nocedal, S. J. Wright (2006), Numerical Optimization, 2nd ed., Springer, §14.2
(Algorithm 14.3; eq. 14.34 for sigma).
Y. Nesterov, M. J. Todd (1997), Self-scaled barriers and interior-point methods for convex
programming, Math. Oper. Res. 22(1), 1-42; (1998) Primal-dual interior-point methods for
self-scaled cones, SIAM J. Optim. 8(2), 324-364.
M. J. Todd, K.-C. Toh, R. H. Tütüncü (1998), On the Nesterov-Todd direction in
semidefinite programming, SIAM J. Optim. 8(3), 769-796.
K.-C. Toh, M. J. Todd, R. H. Tütüncü (1999), SDPT3 - a MATLAB software package for
semidefinite programming, Optim. Methods Softw. 11, 545-581; R. H. Tütüncü, K.-C. Toh,
M. J. Todd (2003), Solving semidefinite-quadratic-linear programs using SDPT3, Math.
Program. 95, 189-217.
S. Boyd, L. Vandenberghe (2004), Convex Optimization, Cambridge, §11.3 (barrier method),
§9.6 (self-concordance).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from .constraints import ConstraintSet
from .sdp import (  # noqa: F401 - re-exported: the SDP methods' former home
    NUC_KERNEL_MAX_N,
    _nuc_kernels,
    nuclear_barrier,
    nuclear_ipm,
    nuclear_ipm_small,
    warmup_nuclear,
)

__all__ = ["primal_ipm", "polish_fro", "batched_mnp", "nuclear_barrier", "nuclear_ipm",
           "nuclear_ipm_small", "warmup_nuclear"]


def _max_step(x: np.ndarray, dx: np.ndarray, mask: np.ndarray) -> float:
    neg = mask & (dx < 0)
    if not neg.any():
        return 1.0
    return float(min(1.0, (-x[neg] / dx[neg]).min()))


def primal_ipm(cs: ConstraintSet, tol: float = 1e-9, max_iter: int = 80):
    """Structured primal-dual IPM for min 1/2||W||^2 s.t. Delta_k^T W z_k >= b_k.

    Returns (W (d, e), lam (n, T), status, n_iter); status "optimal" or "failed"
    (no convergence, e.g. an infeasible problem: the caller then uses the exact
    conic path, which certifies infeasibility).
    """
    valid = cs.valid
    n, T = valid.shape
    d, e = cs.d, cs.e
    s0 = cs.scale()
    if s0 == 0 or not valid.any():
        return np.zeros((d, e)), np.zeros((n, T)), "optimal", 0
    D = cs.Delta / s0  # scaled constraints: W~ = s0 W, lam = lam~ / s0^2
    Z = cs.Z
    b = np.where(valid, cs.b, 0.0)
    vf = valid.astype(float)
    N = vf.sum()
    ZZ = np.einsum("ib,if->ibf", Z, Z).reshape(n, e * e)

    def Mv(W):
        return ((D @ W) * Z[:, None, :]).sum(-1) * vf

    def MTv(lam):
        return np.einsum("it,itd->id", lam * vf, D).T @ Z

    def normal(c):
        C = np.matmul((D * c[..., None]).transpose(0, 2, 1), D)  # (n, d, d)
        K = C.reshape(n, d * d).T @ ZZ  # [(a,c),(b,f)]
        H = K.reshape(d, d, e, e).transpose(0, 2, 1, 3).reshape(d * e, d * e)
        H[np.diag_indices_from(H)] += 1.0
        return H

    W = np.zeros((d, e))
    s = np.ones((n, T))
    lam = np.ones((n, T)) * vf
    status = "failed"
    best = (np.inf, W, lam)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        m = Mv(W)
        r_d = W - MTv(lam)
        r_p = (m - s - b) * vf
        mu = float((s * lam * vf).sum() / N)
        nW = np.linalg.norm(W)
        res = max(np.abs(r_p).max(), np.linalg.norm(r_d) / (1 + nW), mu * N / max(1.0, nW**2))
        if res < best[0]:
            best = (res, W.copy(), lam.copy())
        if res <= tol:
            status = "optimal"
            break
        # divergence: the data are scaled to unit size (D / s0), where the optimum has
        # ||W|| = 1 / rho (rho the distance of the hull of the A_k to 0): ||W|| > 1e12
        # means rho < 1e-12, where a margin of 1 is a cancellation of terms ~1e12 (relative
        # rounding ~1e-4: nothing left to certify); multipliers summing past 1e16 = 1/eps
        # follow a Farkas ray (an infeasible problem).  Either way: stop, the conic path
        # and the Farkas LP decide
        if nW > 1e12 or lam.sum() > 1e16 or not np.isfinite(nW):
            break
        c = np.where(valid, lam / s, 0.0)
        try:
            L = cho_factor(normal(c), lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            break

        def solve(r_c, c=c, L=L, r_p=r_p, r_d=r_d, s=s, lam=lam):
            rhs = -r_d + MTv(c * (-r_p) + np.where(valid, r_c / s, 0.0))
            dW = cho_solve(L, rhs.reshape(-1), check_finite=False).reshape(d, e)
            dlam = (c * (-r_p - Mv(dW)) + np.where(valid, r_c / s, 0.0)) * vf
            ds = np.where(valid, (r_c - s * dlam) / np.where(valid, lam, 1.0), 0.0)
            return dW, dlam, ds

        # predictor: the affine-scaling direction (target s lam = 0)
        dW, dlam, ds = solve(-s * lam * vf)
        a_aff = min(_max_step(s, ds, valid), _max_step(lam, dlam, valid))
        mu_aff = float(((s + a_aff * ds) * (lam + a_aff * dlam) * vf).sum() / N)
        # Mehrotra's centring heuristic (Nocedal & Wright eq. 14.34): little centring
        # where the affine step alone reduces mu well, much where it stalls
        sigma = (mu_aff / mu) ** 3 if mu > 0 else 0.0
        # corrector: target s lam = sigma mu, with the second-order term ds dlam
        dW, dlam, ds = solve((-s * lam - ds * dlam + sigma * mu) * vf)
        # 0.99 of the step to the boundary of s, lam >= 0 (fraction to the boundary,
        # Nocedal & Wright eq. 14.35: iterates stay strictly interior)
        a = 0.99 * min(_max_step(s, ds, valid), _max_step(lam, dlam, valid))
        W = W + a * dW
        lam = lam + a * dlam
        s = np.where(valid, s + a * ds, 1.0)
    if status != "optimal" and best[0] <= 1e-6:
        # numerical breakdown close to the optimum (residuals <= 1e-6: the support is
        # identified): the exact polish + certificate decide
        status, W, lam = "optimal", best[1], best[2]
    return W / s0, lam / s0**2, status, it


def polish_fro(cs: ConstraintSet, W: np.ndarray, lam: np.ndarray, rounds: int = 8):
    """Exact active-set polish: on a support S solve min ||W|| s.t. <A_k, W> = b_k (k in S).

    S starts from the equalities (always in S) and the multipliers / near-active
    inequalities of the given solution; inequalities with negative multipliers are
    dropped and violated ones added (a few primal-dual active-set rounds).  Accepted only
    if the inequality multipliers are >= 0 and every constraint holds to 1e-10
    (relative); returns (W, lam, accepted).  Unbatched ``cs``.
    """
    valid, ineq, eqm = cs.valid, cs.ineq, cs.eqmask
    if not valid.any():
        return W, lam, False
    m = cs.margins(W)
    pos = ineq & (cs.b > 0)
    if pos.any() and not (eqm & (cs.b != 0)).any():  # margins of W scaled to feasibility
        ratio = float((m[pos] / cs.b[pos]).min())
        if ratio > 0:
            m = m / ratio
    lmax = float(np.abs(lam[valid]).max()) if valid.any() else 0.0
    S = eqm | (ineq & ((lam > 1e-6 * lmax) | (m <= cs.b + 1e-9 * np.maximum(1.0, np.abs(cs.b)))))
    scale = max(1.0, float(np.abs(cs.b).max()))
    for _ in range(rounds):
        ii, tt = np.nonzero(S)
        if len(ii) == 0 or len(ii) > 6000:
            return W, lam, False
        M = np.einsum("kd,ke->kde", cs.Delta[ii, tt], cs.Z[ii]).reshape(len(ii), -1)
        bS = cs.b[ii, tt]
        # rows scaled to unit norm (same equations): lstsq is then accurate row by row even
        # when constraints differ in size by 1e9 (near-duplicate tokens)
        rn = np.linalg.norm(M, axis=1)
        rn = np.where(rn > 0, rn, 1.0)
        w, *_ = np.linalg.lstsq(M / rn[:, None], bS / rn, rcond=None)
        l_R, *_ = np.linalg.lstsq((M / rn[:, None]).T, w, rcond=None)  # scaled multipliers
        l_S = l_R / rn
        if not np.all(np.isfinite(w)):
            return W, lam, False
        Wp = w.reshape(W.shape)
        mp = cs.margins(Wp)
        # rounding in m_k = <A_k, W> is ~ eps ||A_k|| ||W||: allowed 500 eps of it
        slack = 1e-13 * cs.row_norms() * np.linalg.norm(w)
        neg = ineq[ii, tt] & (l_R < -1e-10 * max(1e-300, np.abs(l_R).max()))
        viol = ineq & ~S & (mp < cs.b - 1e-10 * scale - slack)
        if not neg.any() and not viol.any():
            if np.any(np.abs(M @ w - bS) > 1e-9 * scale + slack[ii, tt]):
                return W, lam, False
            lp = np.zeros_like(lam)
            lp[ii, tt] = np.where(ineq[ii, tt], np.maximum(l_S, 0.0), l_S)
            return Wp, lp, True
        S[ii[neg], tt[neg]] = False
        S |= viol
    return W, lam, False


def batched_mnp(G: np.ndarray, valid: np.ndarray, tol: float = 1e-14, max_iter: int = 100):
    """Batched minimum-norm point over the simplex: min mu^T G mu, mu >= 0, sum(mu) = 1.

    G (B, N, N) PSD Gram matrices, valid (B, N) bool (invalid entries are fixed at 0).
    A Mehrotra predictor-corrector IPM with per-problem step lengths; each problem is
    frozen when its residuals reach ``tol`` (relative to max diag G).
    Returns (mu (B, N), rho2 (B,), converged (B,) bool, n_iter).
    """
    return _batched_mnp(G, valid, tol, max_iter)


def _batched_mnp(G, valid, tol, max_iter):
    B, N, _ = G.shape
    vf = valid.astype(float)
    nv = np.maximum(vf.sum(1), 1.0)
    scale = np.maximum(np.diagonal(G, axis1=1, axis2=2).max(1), 1e-300)
    Gs = G / scale[:, None, None]
    Gs = Gs * vf[:, :, None] * vf[:, None, :]
    idx = np.arange(N)
    Gs[:, idx, idx] += 1.0 - vf
    mu = vf / nv[:, None]
    zeta = vf.copy()
    nu = np.zeros(B)
    done = np.zeros(B, bool)
    it = 0

    def step_len(x, dx):
        ratio = np.where(valid & (dx < 0), -x / np.where(dx < 0, dx, -1.0), np.inf)
        return np.minimum(1.0, ratio.min(1))

    for it in range(1, max_iter + 1):  # noqa: B007
        Gmu = (Gs @ mu[..., None])[..., 0]
        r1 = (Gmu - nu[:, None] - zeta) * vf
        r2 = mu.sum(1) - 1.0
        comp = (mu * zeta * vf).sum(1) / nv
        conv = (np.abs(r1).max(1) <= tol) & (np.abs(r2) <= tol) & (comp <= tol)
        done |= conv
        if done.all():
            break
        ratio = np.where(valid, zeta / np.where(valid, mu, 1.0), 0.0)
        # zeta / mu grows without bound on an inactive row (mu -> 0): capped at 1e18
        # against G's unit diagonal (scaled), where the row is fixed at 0 to rounding
        # anyway, so that the Newton matrix stays finite
        ratio = np.clip(ratio, 0.0, 1e18)
        H = Gs.copy()
        H[:, idx, idx] += ratio
        if B == 1:
            try:
                F = cho_factor(H[0], lower=True, check_finite=False)
            except np.linalg.LinAlgError:
                F = cho_factor(H[0] + 1e-12 * np.eye(N), lower=True, check_finite=False)

            def hsolve(r, F=F):
                return cho_solve(F, r[0], check_finite=False)[None]
        else:
            try:
                Hi = np.linalg.inv(H)
            except np.linalg.LinAlgError:
                Hi = np.linalg.pinv(H, hermitian=True)

            def hsolve(r, Hi=Hi):
                return (Hi @ r[..., None])[..., 0]

        Hinv_e = hsolve(vf)

        def solve(r3, hsolve=hsolve, Hinv_e=Hinv_e, r1=r1, r2=r2, mu=mu, zeta=zeta):
            rhs = (-r1 + np.where(valid, r3 / np.where(valid, mu, 1.0), 0.0)) * vf
            a = hsolve(rhs)
            dnu = (-r2 - (a * vf).sum(1)) / np.maximum((Hinv_e * vf).sum(1), 1e-300)
            dmu = (a + dnu[:, None] * Hinv_e) * vf
            dzeta = np.where(valid, (r3 - zeta * dmu) / np.where(valid, mu, 1.0), 0.0)
            return dmu, dnu, dzeta

        m = comp
        # Mehrotra predictor-corrector as in primal_ipm, per problem (sigma, step lengths)
        dmu, dnu, dzeta = solve(-mu * zeta * vf)
        a_aff = np.minimum(step_len(mu, dmu), step_len(zeta, dzeta))
        m_aff = ((mu + a_aff[:, None] * dmu) * (zeta + a_aff[:, None] * dzeta) * vf).sum(1) / nv
        sigma = np.where(m > 0, (m_aff / np.maximum(m, 1e-300)) ** 3, 0.0)
        r3 = (-mu * zeta - dmu * dzeta + (sigma * m)[:, None]) * vf
        dmu, dnu, dzeta = solve(r3)
        a = 0.99 * np.minimum(step_len(mu, dmu), step_len(zeta, dzeta))
        a = np.where(done, 0.0, a)
        a = np.where(np.isfinite(a), a, 0.0)
        upd = np.isfinite(dmu).all(1) & np.isfinite(dzeta).all(1) & np.isfinite(dnu)
        a = np.where(upd, a, 0.0)
        dmu = np.where(upd[:, None], dmu, 0.0)
        dzeta = np.where(upd[:, None], dzeta, 0.0)
        dnu = np.where(upd, dnu, 0.0)
        mu = np.where(valid, mu + a[:, None] * dmu, 0.0)
        zeta = np.where(valid, zeta + a[:, None] * dzeta, 0.0)
        nu = nu + a * dnu
    mu = np.maximum(mu, 0.0) * vf
    mu = mu / np.maximum(mu.sum(1, keepdims=True), 1e-300)
    rho2 = (mu * ((G * vf[:, :, None] * vf[:, None, :]) @ mu[..., None])[..., 0]).sum(1)
    return mu, rho2, done, it
