"""numba kernel of the nuclear-norm SDP interior-point method :func:`attnsvm.svm.fast.nuclear_ipm`
(imported only when numba is; the maths, the notation and the stopping rules are there).

The same iteration step for step (Mehrotra predictor-corrector, Nesterov-Todd scaling,
the N x N Schur complement M = 1/2 (Wn_uu o Wn_vv + Wn_uv o Wn_uv^T) + diag(s / y), its
Cholesky factor regularised as :func:`attnsvm.svm.fast._chol_reg` does, ``refine`` steps
of iterative refinement of each direction, equality rows with free multipliers), without
the constraint-generation hooks (``check``, ``drop_tol``): for the small problems where
the reference's cost is the interpreter's (the Graph-SVM at the published sizes: m = d + e
<= 16, N <= 50, ~20 iterations of ~60 array operations).  tests/test_ntp_graph_svm.py holds
its answers equal to the reference's.  No fastmath.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OPTIMAL, STALLED, FAILED, INFEASIBLE = 0, 1, 2, 3


@njit(cache=True)
def _chol(A, L):
    """Lower Cholesky factor of the symmetric A into L; False if A is not (numerically)
    positive definite.  The compiled twin of :func:`attnsvm.svm.certificate._cholesky`
    (the same column algorithm, one matrix), held equal to it by tests/test_svm_formulas.py."""
    n = A.shape[0]
    for j in range(n):
        s = A[j, j]
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not s > 0.0:
            return False
        ljj = np.sqrt(s)
        L[j, j] = ljj
        for i in range(j + 1, n):
            t = A[i, j]
            for k in range(j):
                t -= L[i, k] * L[j, k]
            L[i, j] = t / ljj
        for i in range(j):
            L[i, j] = 0.0
    return True


@njit(cache=True, nogil=True)
def _lower_solve(L, b, x, n):
    """x[:n] = L[:n, :n]^{-1} b[:n] by forward substitution (L lower triangular; b and x
    may be one array).  The one forward substitution of the kernels (also R^T y = r of
    :func:`attnsvm.svm._active_kernels._qr_min_norm_step`, with L = R.T)."""
    for i in range(n):
        t = b[i]
        for k in range(i):
            t -= L[i, k] * x[k]
        x[i] = t / L[i, i]


@njit(cache=True, nogil=True)
def _upper_solve(R, b, x, n):
    """x[:n] = R[:n, :n]^{-1} b[:n] by back substitution (R upper triangular; b and x may
    be one array).  The one back substitution of the kernels (also R lamS = Q^T w of
    :func:`attnsvm.svm._active_kernels._qr_multipliers`)."""
    for i in range(n - 1, -1, -1):
        t = b[i]
        for k in range(i + 1, n):
            t -= R[i, k] * x[k]
        x[i] = t / R[i, i]


@njit(cache=True)
def _cho_solve(L, r):
    """(L L^T)^{-1} r."""
    n = L.shape[0]
    x = r.copy()
    _lower_solve(L, x, x, n)
    _upper_solve(L.T, x, x, n)
    return x


@njit(cache=True)
def _A(Delta, Zk, R, d):
    """<B_k, R> = Delta_k^T R[:d, d:] z_k for every row k."""
    N = Delta.shape[0]
    e = Zk.shape[1]
    out = np.zeros(N)
    for k in range(N):
        t = 0.0
        for a in range(d):
            u = 0.0
            for c in range(e):
                u += R[a, d + c] * Zk[k, c]
            t += Delta[k, a] * u
        out[k] = t
    return out


@njit(cache=True)
def _Bs(Delta, Zk, v, d):
    """sum_k v_k B_k (m x m)."""
    N = Delta.shape[0]
    e = Zk.shape[1]
    out = np.zeros((d + e, d + e))
    for k in range(N):
        for a in range(d):
            da = 0.5 * v[k] * Delta[k, a]
            for c in range(e):
                out[a, d + c] += da * Zk[k, c]
    for a in range(d):
        for c in range(e):
            out[d + c, a] = out[a, d + c]
    return out


@njit(cache=True)
def _sym(A):
    return 0.5 * (A + A.T)


@njit(cache=True)
def _lmin(A, floor=-np.inf):
    """Smallest eigenvalue of the symmetric A: Householder reduction to tridiagonal form
    (:func:`_tridiag`), then multisection on Sturm counts (:func:`_lmin_tridiag`) to
    1e-12 ||A|| (the reference's eigvalsh: ~eps ||A||; the step lengths it feeds are
    scaled by 0.9-0.99 anyway), without LAPACK's workspace queries and copies.
    ``floor``: where no eigenvalue lies below it (one Sturm count), ``floor`` itself is
    returned (the caller needs no more: a full step)."""
    return _lmin_tridiag(_tridiag(A), floor)


@njit(cache=True)
def _tridiag(A):
    """A copy of the symmetric A reduced to tridiagonal form by Householder reflections
    (Golub & Van Loan §8.3.1); its diagonal and first subdiagonal hold the result."""
    n = A.shape[0]
    a = A.copy()
    v = np.empty(n)
    p = np.empty(n)
    for k in range(n - 2):
        m = n - k - 1
        alpha = 0.0
        for i in range(m):
            alpha += a[k + 1 + i, k] * a[k + 1 + i, k]
        alpha = np.sqrt(alpha)
        if alpha == 0.0:
            continue
        if a[k + 1, k] > 0:
            alpha = -alpha
        vv = 0.0
        for i in range(m):
            v[i] = a[k + 1 + i, k]
        v[0] -= alpha
        for i in range(m):
            vv += v[i] * v[i]
        if vv == 0.0:
            continue
        beta = 2.0 / vv
        vp = 0.0
        for i in range(m):  # p = beta B v, B = a[k+1:, k+1:]
            t = 0.0
            for j in range(m):
                t += a[k + 1 + i, k + 1 + j] * v[j]
            p[i] = beta * t
            vp += v[i] * p[i]
        c = 0.5 * beta * vp
        for i in range(m):  # w = p - c v (in p)
            p[i] -= c * v[i]
        for i in range(m):
            for j in range(m):
                a[k + 1 + i, k + 1 + j] -= v[i] * p[j] + p[i] * v[j]
        a[k + 1, k] = alpha
    return a


@njit(cache=True)
def _lmin_tridiag(a, floor):
    """Smallest eigenvalue of the symmetric tridiagonal matrix held in a's diagonal and
    first subdiagonal: a Gershgorin bracket, then passes of 4 Sturm counts (multisection)
    to 1e-12 of the bracket's scale; ``floor`` as in :func:`_lmin`."""
    n = a.shape[0]
    lo = np.inf
    hi = -np.inf
    for i in range(n):
        r = 0.0
        if i > 0:
            r += abs(a[i, i - 1])
        if i < n - 1:
            r += abs(a[i + 1, i])
        lo = min(lo, a[i, i] - r)
        hi = max(hi, a[i, i] + r)
    tol = 1e-12 * max(abs(lo), abs(hi))  # (a step length needs no more; eigvalsh: ~eps ||A||)
    if np.isfinite(floor):
        if floor <= lo:  # (Gershgorin: no eigenvalue below the floor)
            return floor
        if floor < hi:  # one Sturm count at the floor
            q = a[0, 0] - floor
            below = q < 0
            for i in range(1, n):
                q = a[i, i] - floor - a[i, i - 1] * a[i, i - 1] / (q if q != 0.0 else 1e-300)
                below |= q < 0
            if not below:
                return floor
            hi = floor
    for _ in range(200):  # invariant: no eigenvalue below lo; at least one below hi
        if hi - lo <= tol:
            break
        # multisection: Sturm counts at 4 interior points in one pass (4 independent
        # chains of divisions, which the CPU overlaps): the bracket shrinks 5x per pass
        h = 0.2 * (hi - lo)
        x1, x2, x3, x4 = lo + h, lo + 2.0 * h, lo + 3.0 * h, lo + 4.0 * h
        if not (lo < x1 < x2 < x3 < x4 < hi):
            break  # (the bracket is at the resolution of float64)
        q1, q2, q3, q4 = a[0, 0] - x1, a[0, 0] - x2, a[0, 0] - x3, a[0, 0] - x4
        c1, c2, c3, c4 = q1 < 0, q2 < 0, q3 < 0, q4 < 0
        for i in range(1, n):
            b2 = a[i, i - 1] * a[i, i - 1]
            q1 = a[i, i] - x1 - b2 / (q1 if q1 != 0.0 else 1e-300)
            q2 = a[i, i] - x2 - b2 / (q2 if q2 != 0.0 else 1e-300)
            q3 = a[i, i] - x3 - b2 / (q3 if q3 != 0.0 else 1e-300)
            q4 = a[i, i] - x4 - b2 / (q4 if q4 != 0.0 else 1e-300)
            c1 |= q1 < 0
            c2 |= q2 < 0
            c3 |= q3 < 0
            c4 |= q4 < 0
        # c_j: some eigenvalue below x_j (the counts increase with x)
        if c1:
            hi = x1
        elif c2:
            lo, hi = x1, x2
        elif c3:
            lo, hi = x2, x3
        elif c4:
            lo, hi = x3, x4
        else:
            lo = x4
    return 0.5 * (lo + hi)


@njit(cache=True)
def _unit_step(T, rs, buf):
    """The longest step a <= 1 with I + a sym(T o rs) PSD (rs: the NT scaling's
    1 / sqrt(sv_i sv_j)); the scaled symmetric matrix is formed in ``buf`` (m x m)."""
    n = T.shape[0]
    for i in range(n):
        for j in range(n):
            buf[i, j] = 0.5 * (T[i, j] * rs[i, j] + T[j, i] * rs[j, i])
    lmin = _lmin(buf, -1.0)
    return 1.0 if lmin >= -1.0 else -1.0 / lmin


@njit(cache=True)
def _pos_step(x, dx, mask):
    a = 1.0
    for k in range(x.shape[0]):
        if mask[k] and dx[k] < 0:
            r = -x[k] / dx[k]
            if r < a:
                a = r
    return a


@njit(cache=True)
def _schur_chol(Delta, Zk, Wn, diag, d, L):
    """Cholesky factor of M (:class:`attnsvm.svm.fast._Schur`) into L, with delta max(diag M)
    added for delta = 0, 1e-14, 1e-12, 1e-10 until it factorises; False if none does."""
    N = Delta.shape[0]
    W11 = np.ascontiguousarray(Wn[:d, :d])
    W22 = np.ascontiguousarray(Wn[d:, d:])
    W12 = np.ascontiguousarray(Wn[:d, d:])
    DW = Delta @ W11
    ZW = Zk @ W22
    RW = Delta @ W12
    P = DW @ Delta.T
    Q = ZW @ Zk.T
    R = RW @ Zk.T
    M = 0.5 * (P * Q + R * R.T)
    for k in range(N):
        M[k, k] += diag[k]
    mx = 0.0
    for k in range(N):
        mx = max(mx, M[k, k])
    for delta in (0.0, 1e-14, 1e-12, 1e-10):
        Mr = M.copy()
        for k in range(N):
            Mr[k, k] += delta * mx
        if _chol(Mr, L):
            return True
    return False


@njit(cache=True)
def nuc_ipm_kernel(Delta, Zk, b, ineq, tol, max_iter, refine, refine_below, stall_tol):
    """:func:`attnsvm.svm.fast.nuclear_ipm` (no ``check`` / ``drop_tol``): returns
    (W (d, e), y (N,), status code, n_iter) with the codes OPTIMAL, STALLED (the best
    iterate at the rounding floor), FAILED (the best iterate), INFEASIBLE."""
    N, d = Delta.shape
    e = Zk.shape[1]
    m = d + e
    eye = np.eye(m)
    bmax = max(np.abs(b).max(), 1e-300)
    nin = 0
    S1 = np.zeros((d, e))
    for k in range(N):
        if ineq[k]:
            nin += 1
            for a in range(d):
                for c in range(e):
                    S1[a, c] += Delta[k, a] * Zk[k, c]
    s1 = max(np.linalg.svd(S1)[1][0], 1e-300)
    y = np.zeros(N)
    s = np.zeros(N)
    for k in range(N):
        if ineq[k]:
            y[k] = 0.5 / s1
            s[k] = max(1.0, bmax)
    Zm = 0.5 * eye - _Bs(Delta, Zk, y, d)
    X = max(1.0, 2.0 * (b @ y) / m) * eye
    LZ = np.zeros((m, m))
    LX = np.zeros((m, m))
    LM = np.zeros((N, N))
    buf = np.empty((m, m))
    fin = ineq.astype(np.float64)
    status = FAILED
    best_res = np.inf
    best_W = np.ascontiguousarray(X[:d, d:])
    best_y = y.copy()
    since = 0
    it = 0
    while it < max_iter:
        it += 1
        if not _chol(Zm, LZ) or not _chol(X, LX):
            break
        rp = _A(Delta, Zk, X, d) - s - b
        Rd = _Bs(Delta, Zk, y, d) + Zm - 0.5 * eye
        dobj = b @ y
        rgap = (0.5 * np.trace(X) - dobj) / max(abs(dobj), 1e-300)
        rinf = np.abs(rp).max() / bmax
        res = max(rgap, rinf, 2.0 * np.abs(Rd).max())
        conv = res <= tol
        mu = ((X * Zm).sum() + s @ y) / (m + nin)
        if res < best_res:
            if res < 0.5 * best_res:
                since = 0
            best_res = res
            best_W = np.ascontiguousarray(X[:d, d:])
            best_y = y.copy()
        since += 1
        if conv:
            status = OPTIMAL
            break
        if since > 4 and best_res <= stall_tol:
            status = STALLED
            break
        if since > 15:
            break
        if dobj > 1e12 * bmax / s1:
            status = INFEASIBLE
            break
        U_, sv, Vt = np.linalg.svd(LZ.T @ LX)
        if sv[-1] <= 0:
            break
        rsv = 1.0 / np.sqrt(sv)
        G = LX @ (Vt.T * rsv)
        Gi = (U_ * rsv).T @ LZ.T
        Wn = G @ G.T
        yin = np.where(ineq, y, 1.0)
        if not _schur_chol(Delta, Zk, Wn, s / yin, d, LM):
            break
        Dsum = np.empty((m, m))
        rs = np.empty((m, m))
        for i in range(m):
            for j in range(m):
                Dsum[i, j] = sv[i] + sv[j]
                rs[i, j] = 1.0 / np.sqrt(sv[i] * sv[j])
        r0 = -rp - _A(Delta, Zk, Wn @ Rd @ Wn, d)
        nref = refine if res <= refine_below else 0

        # predictor (affine scaling), then Mehrotra's corrector: two directions
        dX = np.zeros((m, m))
        dZ = np.zeros((m, m))
        dy = np.zeros(N)
        ds = np.zeros(N)
        dXt = np.zeros((m, m))
        dZt = np.zeros((m, m))
        ap = ad = 1.0
        for phase in range(2):
            if phase == 0:
                Rt = -np.diag(sv)
                rc = -s * y * fin
            else:
                mu_aff = (((X + ap * dX) * (Zm + ad * dZ)).sum()
                          + (s + ap * ds) @ (y + ad * dy)) / (m + nin)
                sigma = min(1.0, (mu_aff / mu) ** 3)
                Rc = sigma * mu * eye - np.diag(sv * sv) - _sym(dXt @ dZt)
                Rt = 2.0 * Rc / Dsum
                rc = (sigma * mu - s * y - ds * dy) * fin
            GRG = G @ Rt @ G.T
            dy = _cho_solve(LM, r0 - _A(Delta, Zk, GRG, d) + rc / yin)
            for r in range(nref + 1):
                dZ = -Rd - _Bs(Delta, Zk, dy, d)
                dX = _sym(GRG - Wn @ dZ @ Wn)
                ds = (rc - s * dy) / yin
                if r == nref:
                    break
                dy = dy - _cho_solve(LM, _A(Delta, Zk, dX, d) - ds + rp)
            dXt = Gi @ dX @ Gi.T
            dZt = G.T @ dZ @ G
            ap = min(_unit_step(dXt, rs, buf), _pos_step(s, ds, ineq))
            ad = min(_unit_step(dZt, rs, buf), _pos_step(y, dy, ineq))
        gamma = 0.9 + 0.09 * min(ap, ad)
        ap = min(1.0, gamma * ap)
        ad = min(1.0, gamma * ad)
        X = _sym(X + ap * dX)
        s = s + ap * ds
        y = y + ad * dy
        Zm = _sym(Zm + ad * dZ)
    if status == OPTIMAL:
        return np.ascontiguousarray(X[:d, d:]), y, status, it
    return best_W, best_y, status, it
