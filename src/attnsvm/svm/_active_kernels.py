"""numba kernels of the exact active-set minimum-norm-point solver (imported only when
numba is; see :mod:`attnsvm.svm.active` for the maths and the public wrapper).

One problem at a time, its Gram matrix and working set in cache; the batch driver is a
serial loop over a slice of problems that releases the GIL, with one workspace for the
slice (no allocation per problem). No fastmath: results do not depend on the number of
threads.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._nuc_kernels import _chol, _lower_solve, _upper_solve

# KAPPA, U and ETA are compile-time constants here: numba's cache keeps the values it was
# compiled with until this file changes (tests/test_svm_lean.py holds the kernel's answers
# equal to the engine's, which catches a stale value)
from .certificate import ETA as _ETA
from .certificate import KAPPA
from .certificate import U as _U

OPTIMAL, SMALL_RHO, FAILED = 0, 1, 2


@njit(cache=True, nogil=True, inline="always")
def _solve_l(L, k, r):
    """In place: r <- L^{-1} r (L lower triangular, leading k x k block).  Each row's dot
    product L[i, :i] . r[:i] in four interleaved partial sums (four independent chains of
    additions instead of one)."""
    for i in range(k):
        _solve_l_row(L, i, r)


@njit(cache=True, nogil=True, inline="always")
def _solve_l_row(L, i, r):
    """Row i of :func:`_solve_l`: r[i] <- (r[i] - L[i, :i] . r[:i]) / L[i, i], r[:i] solved
    (the same bits as there: the incrementally kept L^{-1} 1 of :func:`mnp_one` is the
    vector a full forward substitution gives)."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    j = 0
    while j + 4 <= i:
        s0 += L[i, j] * r[j]
        s1 += L[i, j + 1] * r[j + 1]
        s2 += L[i, j + 2] * r[j + 2]
        s3 += L[i, j + 3] * r[j + 3]
        j += 4
    while j < i:
        s0 += L[i, j] * r[j]
        j += 1
    r[i] = (r[i] - ((s0 + s1) + (s2 + s3))) / L[i, i]


@njit(cache=True, nogil=True, inline="always")
def _solve_lt(L, k, r):
    """In place: r <- L^{-T} r, by columns of L^T = rows of L (contiguous): x_i = r_i / L_ii,
    then r_j -= L_ij x_i for j < i (independent updates, no chain of additions)."""
    for i in range(k - 1, -1, -1):
        xi = r[i] / L[i, i]
        r[i] = xi
        for j in range(i):
            r[j] -= L[i, j] * xi


@njit(cache=True, nogil=True, inline="always")
def _chol_delete(L, k, p):
    """Cholesky factor of M with row / column p removed, in place (Givens rotations on
    columns p..k-1 restore the lower-triangular form; L L^T is unchanged by them)."""
    for i in range(p, k - 1):
        for j in range(k):
            L[i, j] = L[i + 1, j]
    for i in range(p, k - 1):
        a = L[i, i]
        b = L[i, i + 1]
        r = math.hypot(a, b)
        if r == 0.0:
            continue
        c = a / r
        s = b / r
        for row in range(i, k - 1):
            x = L[row, i]
            y = L[row, i + 1]
            L[row, i] = c * x + s * y
            L[row, i + 1] = -s * x + c * y
        L[i, i + 1] = 0.0
    for j in range(k):
        L[k - 1, j] = 0.0
        L[j, k - 1] = 0.0


@njit(cache=True, nogil=True)
def _gram_entry(D, Z, ka, kb):
    """(Delta_ka . Delta_kb)(z_ka . z_kb), the sums in index order (the same bits wherever
    an entry is formed: full matrix, lazy row, diagonal)."""
    s1 = 0.0
    for c in range(D.shape[1]):
        s1 += D[ka, c] * D[kb, c]
    s2 = 0.0
    for c in range(Z.shape[1]):
        s2 += Z[ka, c] * Z[kb, c]
    return s1 * s2


@njit(cache=True, nogil=True)
def _gram(D, Z, vi, nv, G):
    """G[a, b] = (Delta_a . Delta_b)(z_a . z_b) over the valid constraints vi[:nv]."""
    for a in range(nv):
        for b in range(a + 1):
            g = _gram_entry(D, Z, vi[a], vi[b])
            G[a, b] = g
            G[b, a] = g


@njit(cache=True, nogil=True, inline="always")
def _gram_row(Dt, Zt, nv, j, scale, G, acc):
    """Row j of the Gram matrix, on demand: G[j, b] = (Delta_j . Delta_b)(z_j . z_b) / scale
    over the valid constraints, from their transposed copies Dt (d, nv), Zt (e, nv): the
    entries of :func:`_gram` (each sum in index order, same bits), the loop over b inner
    (independent sums, contiguous: no chain of dependent additions per entry). acc (nv,)."""
    for b in range(nv):
        G[j, b] = 0.0
        acc[b] = 0.0
    d = Dt.shape[0]
    c = 0
    while c + 4 <= d:  # four terms per pass over the row (added in the order of c: same bits)
        x0 = Dt[c, j]
        x1 = Dt[c + 1, j]
        x2 = Dt[c + 2, j]
        x3 = Dt[c + 3, j]
        for b in range(nv):
            G[j, b] = (((G[j, b] + Dt[c, b] * x0) + Dt[c + 1, b] * x1) + Dt[c + 2, b] * x2) \
                + Dt[c + 3, b] * x3
        c += 4
    while c < d:
        x = Dt[c, j]
        for b in range(nv):
            G[j, b] += Dt[c, b] * x
        c += 1
    for f in range(Zt.shape[0]):
        x = Zt[f, j]
        for b in range(nv):
            acc[b] += Zt[f, b] * x
    for b in range(nv):
        G[j, b] = G[j, b] * acc[b] / scale


@njit(cache=True, nogil=True, inline="always")
def _margins(D, Z, W, vi, nv, out, ws):
    """out[a] = Delta_k^T W z_k, k = vi[a]: u = W z_k (each u_c summed over f in index
    order, the d sums side by side from W^T: no chain of dependent additions), then
    Delta_k . u.  ws: workspace of d (e + 1) floats (W^T and u)."""
    d = D.shape[1]
    e = Z.shape[1]
    Wt = ws[: e * d].reshape((e, d))
    for c in range(d):
        for f in range(e):
            Wt[f, c] = W[c, f]
    u = ws[e * d: e * d + d]
    for a in range(nv):
        k = vi[a]
        for c in range(d):
            u[c] = 0.0
        for f in range(e):
            zf = Z[k, f]
            for c in range(d):
                u[c] += Wt[f, c] * zf
        s = 0.0
        for c in range(d):
            s += D[k, c] * u[c]
        out[a] = s


@njit(cache=True, nogil=True, inline="always")
def _margins_t(Dt, Zt, W, nv, out, u):
    """:func:`_margins` over every valid constraint from the transposed copies Dt (d, nv),
    Zt (e, nv) of :func:`_gram_row`: out[b] = sum_c Dt[c, b] (sum_f W[c, f] Zt[f, b]), each
    sum in the index order of :func:`_margins` (the same bits), the loop over b inner
    (independent sums, contiguous).  u: workspace (nv,)."""
    d = Dt.shape[0]
    e = Zt.shape[0]
    for b in range(nv):
        out[b] = 0.0
    for c in range(d):
        for b in range(nv):
            u[b] = 0.0
        for f in range(e):
            w = W[c, f]
            for b in range(nv):
                u[b] += w * Zt[f, b]
        for b in range(nv):
            out[b] += Dt[c, b] * u[b]


@njit(cache=True, nogil=True, inline="always")
def _combine(D, Z, lam, S, ks, W):
    """W = sum_{a < ks} lam[a] Delta_{S[a]} z_{S[a]}^T (S: constraint indices)."""
    d = D.shape[1]
    e = Z.shape[1]
    for c in range(d):
        for f in range(e):
            W[c, f] = 0.0
    for a in range(ks):
        k = S[a]
        la = lam[a]
        for c in range(d):
            t = la * D[k, c]
            for f in range(e):
                W[c, f] += t * Z[k, f]


@njit(cache=True, nogil=True, inline="always")
def _affine_min_y(L, ks, v, y):
    """v <- affine minimiser weights of the working set: M u = 1, v = u / 1^T u, with
    M = L L^T, given y = L^{-1} 1 (kept by :func:`mnp_one` as points enter and leave): only
    the back substitution u = L^{-T} y. Returns 1^T u."""
    for q in range(ks):
        v[q] = y[q]
    _solve_lt(L, ks, v)
    sv = 0.0
    for q in range(ks):
        sv += v[q]
    for q in range(ks):
        v[q] /= sv
    return sv


@njit(cache=True, nogil=True)
def _refine(D, Z, L, ks, Sk, x, gmax, lamS, W, r, v, mS, ws, y):
    """lam_S solving G_SS lam = 1 from the weights x (lam = x / rho^2), refined twice with
    residuals 1 - <A_k, W> from W = sum lam_k A_k itself; G_SS^{-1} by Sherman-Morrison on
    M = G_SS + 1 1^T (units: G scaled by 1 / gmax, lamS = gmax lam). Writes W; returns
    sum(lamS) (= 1 / rho^2 scaled) or -1 where G_SS is singular (rho = 0).  y = L^{-1} 1."""
    rho2 = 0.0
    s1 = _affine_min_y(L, ks, v, y)  # v = M^{-1} 1 / s1 (y = L^{-1} 1)
    den = 1.0 - s1  # 1 - 1^T M^{-1} 1 = s1 rho^2 in exact arithmetic
    for q in range(ks):
        v[q] *= s1
    xs = 0.0
    for q in range(ks):
        xs += x[q]
    # rho^2 of the affine minimiser: G v = rho^2 1 with rho^2 = (1 - s1) / s1
    rho2 = den / s1
    if rho2 <= 0.0:
        return -1.0
    for q in range(ks):
        lamS[q] = x[q] / (xs * rho2)
    for _ in range(2):
        for q in range(ks):
            r[q] = lamS[q] / gmax
        _combine(D, Z, r, Sk, ks, W)
        _margins(D, Z, W, Sk, ks, mS, ws)
        for q in range(ks):
            r[q] = 1.0 - mS[q]
        _solve_l(L, ks, r)
        _solve_lt(L, ks, r)  # M^{-1} res
        sr = 0.0
        for q in range(ks):
            sr += r[q]
        for q in range(ks):
            lamS[q] += r[q] + v[q] * sr / den
    for q in range(ks):
        r[q] = lamS[q] / gmax
    _combine(D, Z, r, Sk, ks, W)
    tot = 0.0
    for q in range(ks):
        tot += lamS[q]
    return tot


@njit(cache=True, nogil=True)
def _farkas_refine(D, Z, L, ks, Sk, x, gmax, W, r, v, g, ws, y):
    """rho ~ 0: the weights x (1^T x = 1) of S moved to min ||sum_q x_q A_q|| over the
    affine hull (1^T dx = 0), twice, with the residual S = sum x_q A_q taken from the
    data: dx = -(M^{-1} g - (1^T M^{-1} g) v) / gmax, g_q = <A_q, S>, v = M^{-1} 1 / 1^T M^{-1} 1
    (M = G_SS / gmax + 1 1^T). Kept only while x stays >= 0. W: workspace; y = L^{-1} 1."""
    for _ in range(2):
        _combine(D, Z, x, Sk, ks, W)
        _margins(D, Z, W, Sk, ks, g, ws)
        _affine_min_y(L, ks, v, y)
        for q in range(ks):
            r[q] = g[q]
        _solve_l(L, ks, r)
        _solve_lt(L, ks, r)
        sg = 0.0
        for q in range(ks):
            sg += r[q]
        for q in range(ks):
            if x[q] - (r[q] - sg * v[q]) / gmax < 0.0:
                return
        for q in range(ks):
            x[q] -= (r[q] - sg * v[q]) / gmax


@njit(cache=True, nogil=True)
def _householder(A, ks, V, beta):
    """In place, Householder QR of A (m, ks), m >= ks (Golub & Van Loan 2013, Matrix
    Computations, 4th ed., Alg. 5.2.1): column j's reflector H_j = I - beta_j v_j v_j^T
    (v_j in V[j:, j], zero above) maps A[j:, j] to alpha e_1, alpha = -sign(A_jj) |A[j:, j]|
    (the sign that avoids cancellation in v_j = A[j:, j] - alpha e_1); A's upper triangle
    becomes R, its strict lower part 0.  Returns False where a column's remaining norm is
    <= 1e-14 of the largest so far (R singular to rounding: ~100 eps; no digit of
    R^{-1} would be right) or 0."""
    m = A.shape[0]
    rmax = 0.0
    for j in range(ks):
        nrm = 0.0
        for i in range(j, m):
            nrm += A[i, j] * A[i, j]
        nrm = math.sqrt(nrm)
        rmax = max(rmax, nrm)
        if nrm <= 1e-14 * rmax or nrm == 0.0:
            return False
        alpha = -nrm if A[j, j] >= 0 else nrm
        vn = 0.0
        for i in range(j, m):
            V[i, j] = A[i, j]
        V[j, j] -= alpha
        for i in range(j, m):
            vn += V[i, j] * V[i, j]
        beta[j] = 2.0 / vn if vn > 0 else 0.0
        A[j, j] = alpha
        for i in range(j + 1, m):
            A[i, j] = 0.0
        for col in range(j + 1, ks):
            _reflect(V, beta, j, A[:, col])
    return True


@njit(cache=True, nogil=True)
def _reflect(V, beta, j, y):
    """y <- H_j y = y - beta_j v_j (v_j^T y) (rows j.. only: v_j is 0 above)."""
    m = y.shape[0]
    t = 0.0
    for i in range(j, m):
        t += V[i, j] * y[i]
    t *= beta[j]
    for i in range(j, m):
        y[i] -= t * V[i, j]


@njit(cache=True, nogil=True)
def _qr_min_norm_step(R, V, beta, ks, res, y):
    """y = Q [R^{-T} res; 0] (m,): the least-norm dw with A_S dw = res, for A_S^T = Q R
    (forward substitution with R^T, then the reflectors H_{ks-1}, ..., H_0 applied)."""
    m = y.shape[0]
    for i in range(m):
        y[i] = 0.0
    _lower_solve(R.T, res, y, ks)
    for j in range(ks - 1, -1, -1):
        _reflect(V, beta, j, y)


@njit(cache=True, nogil=True)
def _qr_multipliers(R, V, beta, ks, w, y, lamS):
    """lamS = R^{-1} (Q^T w)[:ks] (the coefficients of w = A_S^T lamS = Q R lamS):
    the reflectors H_0, ..., H_{ks-1} applied to w, then back substitution with R."""
    m = y.shape[0]
    for i in range(m):
        y[i] = w[i]
    for j in range(ks):
        _reflect(V, beta, j, y)
    _upper_solve(R, y, lamS, ks)


@njit(cache=True, nogil=True)
def _qr_refine(D, Z, Sk, ks, W, lamS, gmax, ws):
    """The min-norm solution of <A_k, W> = 1 (k in S) by Householder QR of
    A_S^T = [vec A_k] (d e x |S|) = Q R: W = Q R^{-T} 1 (conditioning cond(A_S), not
    cond(A_S)^2 as through G_SS), refined twice with residuals from W (three solves in
    all: :func:`_qr_min_norm_step`); lamS = gmax R^{-1} Q^T W (:func:`_qr_multipliers`).
    Returns False where R is singular to rounding (then nothing is written).  The plain
    reference: numpy's least-squares solution (tests/test_svm_active.py)."""
    d = D.shape[1]
    e = Z.shape[1]
    m = d * e
    if ks > m:
        return False
    A = np.empty((m, ks))
    for q in range(ks):
        k = Sk[q]
        for c in range(d):
            for f in range(e):
                A[c * e + f, q] = D[k, c] * Z[k, f]
    V = np.zeros((m, ks))
    beta = np.zeros(ks)
    if not _householder(A, ks, V, beta):
        return False
    y = np.empty(m)
    w = np.zeros(m)
    res = np.ones(ks)
    Wt = np.empty((d, e))
    mS = np.empty(ks)
    for _ in range(3):
        _qr_min_norm_step(A, V, beta, ks, res, y)  # dw = Q [R^{-T} res; 0]
        for i in range(m):
            w[i] += y[i]
        for c in range(d):
            for f in range(e):
                Wt[c, f] = w[c * e + f]
        _margins(D, Z, Wt, Sk, ks, mS, ws)
        for q in range(ks):
            res[q] = 1.0 - mS[q]
    for c in range(d):
        for f in range(e):
            W[c, f] = Wt[c, f]
    _qr_multipliers(A, V, beta, ks, w, y, lamS)
    for q in range(ks):
        lamS[q] *= gmax
    return True


@njit(cache=True, nogil=True)
def mnp_one(D, Z, valid, tol, small, max_iter, mu, lam, W, Gin):
    """Wolfe's minimum-norm-point algorithm for one problem; see
    :func:`attnsvm.svm.active.mnp_active`. D (N, d), Z (N, e), valid (N,) bool;
    Gin: the Gram matrix of the valid constraints (nv, nv), overwritten, or (0, 0) (then
    it is formed here); writes mu (N,), lam (N,), W (d, e); returns (status, rho2, n_iter).
    (:func:`_mnp_ws` in a workspace of its own.)"""
    wk = _mnp_work(D.shape[0], D.shape[1], Z.shape[1])
    return _mnp_ws(D, Z, valid, tol, small, max_iter, mu, lam, W, Gin, wk[0], wk[1], wk[2],
                   wk[3], wk[4], wk[1][:0], wk[0][:0].reshape((0, 2)))


@njit(cache=True, nogil=True)
def mnp_trace(D, Z, valid, tol, small, max_iter, mu, lam, W, trace):
    """:func:`mnp_one` (lazy Gram rows) recording its major cycles: trace (max_iter, 2)
    int64 receives, for major cycle c = 0, 1, ..., the constraint index that entered the
    working set and the size of the working set after the minor cycles (-1, -1 where the
    cycle ended the run).  For tests against the plain reference
    (:func:`attnsvm.svm.wolfe.min_norm_point`): the same sequence of working sets."""
    wk = _mnp_work(D.shape[0], D.shape[1], Z.shape[1])
    trace[:, :] = -1
    return _mnp_ws(D, Z, valid, tol, small, max_iter, mu, lam, W, wk[3][:0].reshape((0, 0)),
                   wk[0], wk[1], wk[2], wk[3], wk[4], wk[1][:0], trace)


@njit(cache=True, nogil=True)
def _mnp_work(N, d, e):
    """The workspace of :func:`_mnp_ws` for up to N constraints of (d, e): (int buffer,
    float buffer, bool buffer, Gram buffer N^2, Cholesky buffer cap^2), cap = min(N, d e + 1)
    + 1 (a working set holds at most d e + 1 affinely independent points of R^{d e}).
    Batch drivers allocate it once per slice (small problems: allocations cost as much as
    arithmetic).  Named views into it: :func:`_int_views`, :func:`_float_views`."""
    cap = min(N, d * e + 1) + 1
    return (np.empty(N + 2 * (N + 1), np.int64),
            np.empty((d + e) * N + N + 5 * cap + N + d * (e + 1) + cap),
            np.empty(2 * N, np.bool_), np.empty(N * N), np.empty(cap * cap))


@njit(cache=True, nogil=True, inline="always")
def _int_views(ibuf, N, cap):
    """(vi (N,): the indices of the valid constraints, S (cap,): the working set as
    positions among them, Sk (cap,): the same as constraint indices)."""
    return ibuf[:N], ibuf[N: N + cap], ibuf[N + cap: N + 2 * cap]


@njit(cache=True, nogil=True, inline="always")
def _float_views(fbuf, nv, d, e, cap):
    """Named views into the float workspace of :func:`_mnp_work` for nv valid constraints:

        Dt (d, nv), Zt (e, nv)  the valid constraints transposed (lazy Gram rows)
        acc (nv,)               workspace of :func:`_gram_row` / :func:`_margins_t`
        x (cap,)                the weights of the working set (the iterate)
        v (cap,)                the affine minimiser's weights
        r, lamS, mS (cap,)      workspace; the multipliers on S; margins on S
        Gmu (nv,)               G x over all points (margins <A_k, W> after a refinement)
        ws (d (e + 1),)         workspace of :func:`_margins`
        y (cap,)                L^{-1} 1, kept as points enter and leave"""
    o = (d + e) * nv
    Dt = fbuf[: d * nv].reshape((d, nv))
    Zt = fbuf[d * nv: o].reshape((e, nv))
    acc = fbuf[o: o + nv]
    o += nv
    x = fbuf[o: o + cap]
    v = fbuf[o + cap: o + 2 * cap]
    r = fbuf[o + 2 * cap: o + 3 * cap]
    lamS = fbuf[o + 3 * cap: o + 4 * cap]
    mS = fbuf[o + 4 * cap: o + 5 * cap]
    Gmu = fbuf[o + 5 * cap: o + 5 * cap + nv]
    o += 5 * cap + nv
    ws = fbuf[o: o + d * (e + 1)]
    y = fbuf[o + d * (e + 1): o + d * (e + 1) + cap]
    return Dt, Zt, acc, x, v, r, lamS, mS, Gmu, ws, y


@njit(cache=True, nogil=True, inline="always")
def _collect_valid(valid, vi, mu, lam, W):
    """vi[:nv] = the indices k with valid[k]; mu, lam, W zeroed.  Returns nv."""
    nv = 0
    for k in range(valid.shape[0]):
        mu[k] = 0.0
        lam[k] = 0.0
        if valid[k]:
            vi[nv] = k
            nv += 1
    for c in range(W.shape[0]):
        for f in range(W.shape[1]):
            W[c, f] = 0.0
    return nv


@njit(cache=True, nogil=True, inline="always")
def _lazy_gram_setup(D, Z, vi, nv, Dt, Zt, G, s1, s2, have):
    """The lazy Gram matrix: Dt, Zt the valid constraints transposed (for
    :func:`_gram_row`) and the diagonal G_aa = |Delta_a|^2 |z_a|^2 (the algorithm reads
    only G's diagonal and the rows of S, formed as points enter); have[a] = False (no row
    yet).  s1, s2 (nv,): workspace.  Sums as :func:`_gram_entry` (same bits)."""
    d = Dt.shape[0]
    for a in range(nv):
        k = vi[a]
        for c in range(d):
            Dt[c, a] = D[k, c]
        for f in range(Zt.shape[0]):
            Zt[f, a] = Z[k, f]
    for a in range(nv):
        s1[a] = 0.0
        s2[a] = 0.0
    c = 0
    while c + 4 <= d:  # four terms per pass, added in the order of c (same bits)
        for a in range(nv):
            s1[a] = (((s1[a] + Dt[c, a] * Dt[c, a]) + Dt[c + 1, a] * Dt[c + 1, a])
                     + Dt[c + 2, a] * Dt[c + 2, a]) + Dt[c + 3, a] * Dt[c + 3, a]
        c += 4
    while c < d:
        for a in range(nv):
            s1[a] += Dt[c, a] * Dt[c, a]
        c += 1
    for f in range(Zt.shape[0]):
        for a in range(nv):
            s2[a] += Zt[f, a] * Zt[f, a]
    for a in range(nv):
        have[a] = False
        G[a, a] = s1[a] * s2[a]


@njit(cache=True, nogil=True, inline="always")
def _scale_gram(G, nv, lazy):
    """gmax = max_a G_aa, and G <- G / gmax where gmax > 0 (only the diagonal when lazy:
    rows are divided as they are formed).  Returns gmax.  (Units: every point of norm
    <= 1; rho^2 and the multipliers are mapped back by the caller.)"""
    gmax = 0.0
    for a in range(nv):
        gmax = max(gmax, G[a, a])
    if gmax <= 0.0:
        return gmax
    if lazy:
        for a in range(nv):
            G[a, a] /= gmax
    else:
        for a in range(nv):
            for b in range(nv):
                G[a, b] /= gmax
    return gmax


@njit(cache=True, nogil=True, inline="always")
def _ensure_row(Dt, Zt, nv, j, gmax, G, acc, have):
    """Row j of the lazy Gram matrix, formed on first use (:func:`_gram_row`)."""
    if not have[j]:
        _gram_row(Dt, Zt, nv, j, gmax, G, acc)
        have[j] = True


@njit(cache=True, nogil=True, inline="always")
def _wolfe_start(G, nv):
    """Wolfe's step 0: S = {j0}, the point of smallest norm (the first, in a tie), weight
    x = 1 (:func:`_wolfe_enter_first`, after its Gram row: :func:`_ensure_row`).  Returns j0."""
    j0 = 0
    for a in range(nv):
        if G[a, a] < G[j0, j0]:
            j0 = a
    return j0


@njit(cache=True, nogil=True, inline="always")
def _wolfe_enter_first(G, j0, S, inS, x, L, y):
    """The working set {j0} with weight 1: L = chol(M), M = G_SS + 1 1^T (1 x 1:
    sqrt(G_jj + 1)); y = L^{-1} 1."""
    S[0] = j0
    inS[j0] = True
    x[0] = 1.0
    L[0, 0] = math.sqrt(G[j0, j0] + 1.0)
    y[0] = 1.0
    _solve_l_row(L, 0, y)


# outcomes of :func:`_check_optimal`
_CHECK_SINGULAR, _CHECK_OPTIMAL, _CHECK_NEGATIVE, _CHECK_RESTART = 0, 1, 2, 3


@njit(cache=True, nogil=True, inline="always")
def _check_optimal(D, Z, Dt, Zt, lazy, vi, nv, G, gmax, S, Sk, ks, x, L, lamS, W, r, v, mS,
                   Gmu, acc, ws, y, inS, tol):
    """Wolfe's stopping test, made exact.  Where <a_j, p> >= rho^2 (1 - tol) for every j
    (optimal to the rounding of G x, ~ eps |G|: large against rho^2 when rho is small),
    the multipliers of S are refined from W (:func:`_refine`) and every margin
    <A_j, W> recomputed from W itself (into Gmu); a point outside S with margin below
    1 - tol - 2e-13 sqrt(G_jj) |W| (rounding of a margin ~ eps |A_j| |W|: 2e-13 allows
    ~1000 eps of it) is a true violator.

    Returns (outcome, jm, rho2): _CHECK_SINGULAR (G_SS singular: rho = 0),
    _CHECK_OPTIMAL (no violator), _CHECK_NEGATIVE (a multiplier <= 0: stop, the final
    verification decides), or _CHECK_RESTART: x = lam / sum(lam) (the refined point),
    rho2 = 1 / sum(lam), Gmu = G x, and jm the worst violator, to enter S."""
    for q in range(ks):
        Sk[q] = vi[S[q]]
    tot = _refine(D, Z, L, ks, Sk, x, gmax, lamS, W, r, v, mS, ws, y)
    if tot <= 0.0:
        return _CHECK_SINGULAR, -1, 0.0
    if lazy:  # margins m_j = (G lam)_j
        _margins_t(Dt, Zt, W, nv, Gmu, acc)
    else:
        _margins(D, Z, W, vi, nv, Gmu, ws)
    wn = 0.0
    for c in range(W.shape[0]):
        for f in range(W.shape[1]):
            wn += W[c, f] * W[c, f]
    wn = math.sqrt(wn * gmax)
    jm = 0
    worst = 0.0
    for a in range(nv):
        if inS[a]:
            continue
        viol = 1.0 - tol - 2e-13 * math.sqrt(G[a, a]) * wn - Gmu[a]
        if viol > worst:
            worst = viol
            jm = a
    if worst <= 0.0:
        return _CHECK_OPTIMAL, jm, 0.0
    for q in range(ks):
        if lamS[q] <= 0.0:
            return _CHECK_NEGATIVE, jm, 0.0
    for q in range(ks):  # a true violator: restart from the refined point
        x[q] = lamS[q] / tot
    for a in range(nv):
        Gmu[a] /= tot
    return _CHECK_RESTART, jm, 1.0 / tot


@njit(cache=True, nogil=True, inline="always")
def _step_to_boundary(x, v, ks):
    """theta = min {x_q / (x_q - v_q) : v_q <= 0, x_q > v_q} (1 if none): the longest step
    from x towards the affine minimiser v that stays in the simplex (Wolfe's step 3)."""
    theta = 1.0
    for q in range(ks):
        if v[q] <= 0.0:
            den = x[q] - v[q]
            if den > 0.0:
                t = x[q] / den
                if t < theta:
                    theta = t
    return theta


@njit(cache=True, nogil=True, inline="always")
def _leave(L, ks, x, S, inS):
    """Drop the points whose weight reached 0 (at least the blocking one): x_q <=
    1e-15 max x (a weight a few eps of the largest is a zero of the line search, not a
    point of the face), from the last to the first, each by :func:`_chol_delete`; at
    least one point stays.  Returns (ks, q0): q0 the first position that changed (ks on
    entry where none was dropped)."""
    xmax = 0.0
    for q in range(ks):
        xmax = max(xmax, x[q])
    q = ks - 1
    q0 = ks
    while q >= 0:
        if x[q] <= 1e-15 * xmax and ks > 1:
            inS[S[q]] = False
            _chol_delete(L, ks, q)
            for u in range(q, ks - 1):
                S[u] = S[u + 1]
                x[u] = x[u + 1]
            ks -= 1
            q0 = q
        q -= 1
    return ks, q0


@njit(cache=True, nogil=True, inline="always")
def _minor_cycles(L, ks, v, x, y, S, inS, jm):
    """Wolfe's steps 2-3 (the minor cycles) after jm entered S (weight 0, L and y bordered
    by :func:`_mnp_ws`): v = the affine minimiser of
    S (:func:`_affine_min_y`); if v > 0, x = v and the major cycle ends; else x moves to
    the boundary, x + theta (v - x) (:func:`_step_to_boundary`), the points of weight 0
    leave (:func:`_leave`; y = L^{-1} 1 re-solved from the first changed row), x is
    clipped to >= 0 and renormalised, and the cycle repeats.  Stops early where jm itself
    left (no progress: rounding).  Returns ks."""
    while True:
        _affine_min_y(L, ks, v, y)
        pos = True
        for q in range(ks):
            if v[q] <= 0.0:
                pos = False
                break
        if pos:
            for q in range(ks):
                x[q] = v[q]
            return ks
        theta = _step_to_boundary(x, v, ks)
        for q in range(ks):
            x[q] = (1.0 - theta) * x[q] + theta * v[q]
        k0 = ks
        ks, q0 = _leave(L, ks, x, S, inS)
        if q0 == k0:  # nothing dropped
            return ks
        for q in range(q0, ks):  # rows q0.. of L changed: those of y
            y[q] = 1.0
            _solve_l_row(L, q, y)
        sx = 0.0
        for q in range(ks):
            x[q] = max(x[q], 0.0)
            sx += x[q]
        for q in range(ks):
            x[q] /= sx
        if not inS[jm]:  # the new point left at once: no progress (rounding)
            return ks


@njit(cache=True, nogil=True, inline="always")
def _mnp_finish(D, Z, vi, nv, G, gmax, S, Sk, ks, x, L, lamS, W, r, v, mS, Gmu, ws, y, mu,
                lam, mfin, status, refined, fresh, rho2, it):
    """After the last cycle: the min-norm point mu (weights x on S), and

    * SMALL_RHO (rho ~ 0: the origin in the hull): x refined as a Farkas candidate
      (:func:`_farkas_refine`);
    * else the multipliers of S refined from W (:func:`_refine`, unless the stopping test
      did; G_SS singular: as SMALL_RHO), lam = lamS / gmax, and the verification
      (:func:`_verify`: lam >= 0, every margin >= 1, active margins 1, all from W); where
      the Gram-based refinement is not accurate enough (G_SS ill-conditioned), once more by
      Householder QR (:func:`_qr_refine`).

    Returns (status, rho^2 in the caller's units, n_iter)."""
    for q in range(ks):
        mu[vi[S[q]]] = x[q]
    for q in range(ks):
        Sk[q] = vi[S[q]]
    if status == SMALL_RHO:
        _farkas_refine(D, Z, L, ks, Sk, x, gmax, W, r, v, mS, ws, y)
        for q in range(ks):
            mu[Sk[q]] = x[q]
        return SMALL_RHO, rho2 * gmax, it
    if not refined:
        tot = _refine(D, Z, L, ks, Sk, x, gmax, lamS, W, r, v, mS, ws, y)
        if tot <= 0.0:
            _farkas_refine(D, Z, L, ks, Sk, x, gmax, W, r, v, mS, ws, y)
            for q in range(ks):
                mu[Sk[q]] = x[q]
            return SMALL_RHO, rho2 * gmax, it
    for q in range(ks):
        lam[Sk[q]] = lamS[q] / gmax
    ok = _verify(D, Z, W, vi, nv, G, gmax, S, Sk, ks, lamS, Gmu, mS, ws, refined and fresh)
    if not ok and _qr_refine(D, Z, Sk, ks, W, lamS, gmax, ws):
        for q in range(ks):
            lam[Sk[q]] = lamS[q] / gmax
        ok = _verify(D, Z, W, vi, nv, G, gmax, S, Sk, ks, lamS, Gmu, mS, ws, False)
    if ok and mfin.shape[0] == D.shape[0]:  # _verify's margins of this W (Gmu)
        for a in range(nv):
            mfin[vi[a]] = Gmu[a]
    return (OPTIMAL if ok else FAILED), rho2 * gmax, it


@njit(cache=True, nogil=True)
def _mnp_ws(D, Z, valid, tol, small, max_iter, mu, lam, W, Gin, ibuf, fbuf, bbuf, Gbuf,
            Lbuf, mfin, trace):
    """:func:`mnp_one` in the workspace of :func:`_mnp_work` (ibuf, fbuf, bbuf, Gbuf, Lbuf,
    sized for N constraints or more).  mfin: (N,) or empty; where it has N entries and the
    answer is OPTIMAL it receives the margins <A_k, W> of the returned W over the valid
    constraints (those of the final verification, the order of summation of
    :func:`margins_batch`, hence its bits), untouched elsewhere.  trace: (cycles, 2) or
    empty (:func:`mnp_trace`).

    Wolfe (1976), P. Wolfe, Finding the nearest point in a polytope, Math. Programming
    11, 128-149; the steps: set-up (:func:`_collect_valid`, :func:`_lazy_gram_setup`,
    :func:`_scale_gram`), step 0 (:func:`_wolfe_start`, :func:`_wolfe_enter_first`), the
    major cycle (step 1, here: the test against every point and the entering point, the
    Cholesky factor of M = G_SS + 1 1^T bordered by one row), its stopping test made exact
    (:func:`_check_optimal`), the minor cycles (steps 2-3, :func:`_minor_cycles`), and the
    multipliers, refined and verified (:func:`_mnp_finish`).  The major cycle's hot loops
    stay in this function (as helpers, even inlined, they cost ~10% on small problems:
    measured, 2 cores).  The plain reference: :func:`attnsvm.svm.wolfe.min_norm_point`
    (tests/test_svm_active.py holds the two to the same working sets)."""
    N = D.shape[0]
    d = D.shape[1]
    e = Z.shape[1]
    vi = ibuf[:N]
    nv = _collect_valid(valid, vi, mu, lam, W)
    if nv == 0:
        return FAILED, 0.0, 0
    lazy = Gin.shape[0] != nv
    cap = min(nv, d * e + 1) + 1  # the working set: affinely independent points of R^{d e}
    _, S, Sk = _int_views(ibuf, N, cap)
    have = bbuf[:nv]
    inS = bbuf[nv: 2 * nv]
    have[:] = True
    inS[:] = False
    Dt, Zt, acc, x, v, r, lamS, mS, Gmu, ws, y = _float_views(fbuf, nv, d, e, cap)
    if lazy:
        G = Gbuf[: nv * nv].reshape((nv, nv))
        _lazy_gram_setup(D, Z, vi, nv, Dt, Zt, G, Gmu, acc, have)  # (Gmu, acc: free here)
    else:
        G = Gin
    gmax = _scale_gram(G, nv, lazy)
    if gmax <= 0.0:  # every constraint matrix is 0: origin = every point
        mu[vi[0]] = 1.0
        return SMALL_RHO, 0.0, 0
    L = Lbuf[: cap * cap].reshape((cap, cap))
    L[:, :] = 0.0
    j0 = _wolfe_start(G, nv)
    _ensure_row(Dt, Zt, nv, j0, gmax, G, acc, have)
    _wolfe_enter_first(G, j0, S, inS, x, L, y)
    ks = 1
    status = FAILED
    it = 0
    rho2 = G[j0, j0]
    refined = False
    fresh = False  # Gmu holds the margins <A_k, W> of the current W (all valid k)
    while it < max_iter:
        it += 1
        refined = False
        fresh = False
        # major cycle (Wolfe's step 1): <a_j, p> = (G x)_j for every j (p = sum_S x_q a_q),
        # rho^2 = |p|^2, and the point of least <a_j, p> outside S
        for a in range(nv):
            Gmu[a] = 0.0
        q = 0
        while q + 4 <= ks:  # G symmetric: rows of S, contiguous; four rows per pass (the
            j0 = S[q]       # additions of each entry in the order of q, the same bits)
            j1 = S[q + 1]
            j2 = S[q + 2]
            j3 = S[q + 3]
            x0 = x[q]
            x1 = x[q + 1]
            x2 = x[q + 2]
            x3 = x[q + 3]
            for a in range(nv):
                Gmu[a] = (((Gmu[a] + G[j0, a] * x0) + G[j1, a] * x1) + G[j2, a] * x2) \
                    + G[j3, a] * x3
            q += 4
        while q < ks:
            j = S[q]
            xq = x[q]
            for a in range(nv):
                Gmu[a] += G[j, a] * xq
            q += 1
        rho2 = 0.0
        for q in range(ks):
            rho2 += x[q] * Gmu[S[q]]
        # the most violated point outside S (on S, G mu = rho^2 1 up to rounding): the
        # first strict minimum, one comparison per point before the membership test;
        # only where none lies below +inf (non-finite G), the scan from the first point
        # outside S
        jm = -1
        best = np.inf
        for a in range(nv):
            g = Gmu[a]
            if g < best and not inS[a]:
                best = g
                jm = a
        if jm < 0:
            for a in range(nv):
                if not inS[a] and (jm < 0 or Gmu[a] < Gmu[jm]):
                    jm = a
        if rho2 <= small:  # the origin is (numerically) in the hull
            status = SMALL_RHO
            break
        if jm < 0 or Gmu[jm] >= rho2 * (1.0 - tol):  # the stopping test, made exact
            out, jm, r2 = _check_optimal(D, Z, Dt, Zt, lazy, vi, nv, G, gmax, S, Sk, ks, x, L,
                                         lamS, W, r, v, mS, Gmu, acc, ws, y, inS, tol)
            if out == _CHECK_SINGULAR:
                break
            refined = True
            fresh = True
            if out == _CHECK_OPTIMAL:
                status = OPTIMAL
                break
            if out == _CHECK_NEGATIVE:
                break
            rho2 = r2  # _CHECK_RESTART
            fresh = False
        if inS[jm] or ks == cap:
            break
        if not have[jm]:
            _gram_row(Dt, Zt, nv, jm, gmax, G, acc)
            have[jm] = True
        # jm enters S with weight 0: the Cholesky factor of M = G_SS + 1 1^T bordered by
        # one row (r = L^{-1} (G_{S,jm} + 1), pivot M_jj - |r|^2) and y = L^{-1} 1 by one
        # entry.  M stays positive definite exactly while the points of S are affinely
        # independent: a pivot <= 1e-14 M_jj (~100 eps: no correct digit left in the
        # factor) means jm is affinely dependent on S to rounding, and the run stops
        for q in range(ks):
            r[q] = G[S[q], jm] + 1.0
        _solve_l(L, ks, r)
        dd = G[jm, jm] + 1.0
        for q in range(ks):
            dd -= r[q] * r[q]
        if dd <= 1e-14 * (G[jm, jm] + 1.0):
            break
        for q in range(ks):
            L[ks, q] = r[q]
        L[ks, ks] = math.sqrt(dd)
        y[ks] = 1.0
        _solve_l_row(L, ks, y)
        S[ks] = jm
        inS[jm] = True
        x[ks] = 0.0
        ks = _minor_cycles(L, ks + 1, v, x, y, S, inS, jm)  # Wolfe's steps 2-3
        if it <= trace.shape[0]:
            trace[it - 1, 0] = vi[jm]
            trace[it - 1, 1] = ks
        if not inS[jm]:
            break
    return _mnp_finish(D, Z, vi, nv, G, gmax, S, Sk, ks, x, L, lamS, W, r, v, mS, Gmu, ws, y,
                       mu, lam, mfin, status, refined, fresh, rho2, it)


@njit(cache=True, nogil=True)
def _verify(D, Z, W, vi, nv, G, gmax, S, Sk, ks, lamS, Gmu, mS, ws, fresh):
    """lam >= 0, every margin >= 1 - 1e-10 (less rounding ~ eps ||A_j|| ||W||), margins on
    the support 1 to 1e-9, all computed from W (fresh: Gmu already holds the margins of
    this W, computed by :func:`_margins` as here: the same bits, not recomputed; those of
    the support are its entries S).  The tolerances: a margin proven >= 1 by the
    certificate needs at most 1e-10 slack here (the engine rescales to minimal margin 1
    and proves it, :mod:`attnsvm.svm.certificate`); 1e-13 sqrt(G_jj) |W| is ~500 eps of a
    margin's rounding; 1e-9 on the support (complementary slackness to 1e-9 of the
    margin 1, the gap then well below GAP_OPTIMAL)."""
    d = D.shape[1]
    e = Z.shape[1]
    ok = True
    wn = 0.0
    for c in range(d):
        for f in range(e):
            wn += W[c, f] * W[c, f]
    wn = math.sqrt(wn * gmax)
    if not fresh:
        _margins(D, Z, W, vi, nv, Gmu, ws)
    for a in range(nv):
        if Gmu[a] < 1.0 - 1e-10 - 1e-13 * math.sqrt(G[a, a]) * wn:
            ok = False
    for q in range(ks):
        if lamS[q] < 0.0:
            ok = False
    for q in range(ks):
        mS[q] = Gmu[S[q]]
    for q in range(ks):
        if abs(mS[q] - 1.0) > 1e-9:
            ok = False
    return ok


@njit(cache=True, nogil=True)
def mnp_batch(D, Z, valid, tol, small, max_iter, mu, lam, W, status, rho2, iters, b0, b1):
    """mnp_one over problems b0 .. b1-1 of a batch: D (B, N, d), Z (B, N, e), valid (B, N);
    outputs mu, lam (B, N), W (B, d, e), status, rho2, iters (B,).  One workspace for the
    slice (:func:`_mnp_work`)."""
    none = np.empty((0, 0))
    notrace = np.empty((0, 2), np.int64)
    wk = _mnp_work(D.shape[1], D.shape[2], Z.shape[2])
    for b in range(b0, b1):
        st, r2, it = _mnp_ws(D[b], Z[b], valid[b], tol, small, max_iter, mu[b], lam[b], W[b],
                             none, wk[0], wk[1], wk[2], wk[3], wk[4], wk[1][:0], notrace)
        status[b] = st
        rho2[b] = r2
        iters[b] = it


@njit(cache=True, nogil=True)
def margins_batch(D, Z, valid, W, m):
    """m[b, i, t] = Delta_bit^T W_b z_bi (0 where invalid): D (B, n, T, d), Z (B, n, e),
    valid (B, n, T), W (B, d, e) -> m (B, n, T).  With u = W_b z_bi (d,) once per
    sequence: O(B n (d e + T d))."""
    _margins_batch_ws(D, Z, valid, W, m, np.empty(D.shape[3]))


@njit(cache=True, nogil=True)
def _margins_batch_ws(D, Z, valid, W, m, u):
    """:func:`margins_batch` with its workspace u (d,) given."""
    B, n, T, d = D.shape
    e = Z.shape[2]
    for bb in range(B):
        for i in range(n):
            for c in range(d):
                s = 0.0
                for f in range(e):
                    s += W[bb, c, f] * Z[bb, i, f]
                u[c] = s
            for t in range(T):
                s = 0.0
                if valid[bb, i, t]:
                    for c in range(d):
                        s += D[bb, i, t, c] * u[c]
                m[bb, i, t] = s


@njit(cache=True, nogil=True)
def _exp2(m):
    """Integer e with m = f 2^e, f in [1/2, 1) (0 where m == 0 or not finite), as
    :func:`attnsvm.svm.solution._exp2`."""
    if m > 0.0 and math.isfinite(m):
        return math.frexp(m)[1]
    return 0


LEAN_OK, LEAN_SCALE, LEAN_NO_MARGIN, LEAN_ZERO_ROW = 0, 1, 2, 3  # _lean_one's verdicts


@njit(cache=True, nogil=True)
def _lean_work(n, T, d, e):
    """The workspace of :func:`_lean_one` for problems of (n, T, d, e): that of
    :func:`_mnp_work` for N = n T and a float buffer (z per constraint, a (d,) workspace;
    :func:`_lean_work_views`) and the empty Gram and trace arrays of :func:`_mnp_ws` (no
    Gram given, no trace), allocated once per batch slice."""
    N = n * T
    a = _mnp_work(N, d, e)
    return (a[0], a[1], a[2], a[3], a[4], np.empty(N * e + d),
            np.empty((0, 0)), np.empty((0, 2), np.int64))


@njit(cache=True, nogil=True, inline="always")
def _lean_differences(X, alpha, valid, sx, D, v):
    """v_it = valid_it and t != alpha_i (the constraints); D_it = x_{i,alpha_i} sx - x_it sx
    there, 0 elsewhere (sx = 2^-eX: exact).  Returns (the number of constraints,
    max |D|)."""
    n, T, d = X.shape
    nv = 0
    mx = 0.0
    for i in range(n):
        a = alpha[i]
        for t in range(T):
            ok = valid[i, t] and t != a
            v[i, t] = ok
            if ok:
                nv += 1
            for c in range(d):
                D[i, t, c] = X[i, a, c] * sx - X[i, t, c] * sx if ok else 0.0
                mx = max(mx, abs(D[i, t, c]))
    return nv, mx


@njit(cache=True, nogil=True, inline="always")
def _normal_exponent(e):
    """Whether 2^-e is a normal float64 scale, -1023 <= e <= 1022 (else the engine's general
    path, which scales in two steps, takes over)."""
    return -1023 <= e <= 1022


@njit(cache=True, nogil=True, inline="always")
def _lean_normalise(X, z, alpha, valid, D, Zs, v):
    """Step 1 of :func:`_lean_one`, :func:`attnsvm.svm.constraints.build_constraints` in
    one pass: X 2^-eX (eX the exponent of max |x| over valid tokens), the differences
    (:func:`_lean_differences`), then D 2^-eD and z 2^-eZ, each largest entry in [1/2, 1)
    (powers of two: exact where no nonzero entry lands in the subnormal range).  Returns
    (verdict, eX + eD + eZ): LEAN_SCALE where a scale is out of the normal range or a
    scaled token, difference or query is subnormal (the scaled data would then not be the
    caller's data times a power of two, which the certificate's proof needs),
    LEAN_NO_MARGIN where no constraint is left."""
    n, T, d = X.shape
    e = z.shape[1]
    mx = 0.0
    for i in range(n):
        for t in range(T):
            if valid[i, t]:
                for c in range(d):
                    mx = max(mx, abs(X[i, t, c]))
    eX = _exp2(mx)
    if not _normal_exponent(eX):
        return LEAN_SCALE, 0
    sx = math.ldexp(1.0, -eX)
    nv, mx = _lean_differences(X, alpha, valid, sx, D, v)
    if nv == 0:
        return LEAN_NO_MARGIN, 0
    eD = _exp2(mx)
    mz = 0.0
    for i in range(n):
        for f in range(e):
            mz = max(mz, abs(z[i, f]))
    eZ = _exp2(mz)
    if not (_normal_exponent(eD) and _normal_exponent(eZ)):
        return LEAN_SCALE, 0
    sd = math.ldexp(1.0, -eD)
    sz = math.ldexp(1.0, -eZ)
    lossy = False  # a nonzero entry scaled into the subnormal range: bits may be lost
    for i in range(n):
        for t in range(T):
            if valid[i, t]:
                for c in range(d):
                    lossy |= _subnormal(X[i, t, c] * sx)
            for c in range(d):
                D[i, t, c] *= sd
                lossy |= _subnormal(D[i, t, c])
        for f in range(e):
            Zs[i, f] = z[i, f] * sz
            lossy |= _subnormal(Zs[i, f])
    if lossy:
        return LEAN_SCALE, 0
    return LEAN_OK, eX + eD + eZ


@njit(cache=True, nogil=True, inline="always")
def _subnormal(x):
    """Whether x is a nonzero subnormal float64 (a power-of-two scaling that produced it may
    have lost bits)."""
    return (x != 0.0) & (abs(x) < 2.2250738585072014e-308)  # (no branch: vectorisable)


@njit(cache=True, nogil=True, inline="always")
def _lean_rows(D, Zs, v):
    """LEAN_ZERO_ROW where a constraint matrix A_k = Delta_k z_k^T is 0 (the engine's
    zero-constraint / Farkas path); LEAN_SCALE where |Delta_k| |z_k| < 1e-290: a margin
    of 1 then needs ||W|| > 1e290, within 1e18 of float64's overflow, where the
    certificate's products may overflow (the engine's general path checks
    representability); LEAN_OK otherwise."""
    n, T, d = D.shape
    for i in range(n):
        zz = 0.0
        for f in range(Zs.shape[1]):
            zz += Zs[i, f] * Zs[i, f]
        for t in range(T):
            if v[i, t]:
                dd = 0.0
                for c in range(d):
                    dd += D[i, t, c] * D[i, t, c]
                if dd == 0.0 or zz == 0.0:
                    return LEAN_ZERO_ROW
                if math.sqrt(dd) * math.sqrt(zz) < 1e-290:
                    return LEAN_SCALE
    return LEAN_OK


@njit(cache=True, nogil=True, inline="always")
def _lean_small_rho(W, lf, muf, r2, Df, Zr):
    """Step 2's answer where the solver found rho ~ 0, as :func:`attnsvm.svm.active.
    mnp_active` gives it: lam = mu / rho^2 and W = sum_k lam_k A_k wherever rho > 0, NaN W
    where rho = 0 (terms with lam_k = 0 would add +-0: skipped, the same bits)."""
    d, e = W.shape
    for c in range(d):
        for f in range(e):
            W[c, f] = 0.0 if r2 > 0.0 else np.nan
    for k in range(lf.shape[0]):
        lf[k] = muf[k] / r2 if r2 > 0.0 else 0.0
    if r2 > 0.0:
        for k in range(lf.shape[0]):
            if lf[k] == 0.0:
                continue
            for c in range(d):
                for f in range(e):
                    W[c, f] += Df[k, c] * (lf[k] * Zr[k, f])


@njit(cache=True, nogil=True, inline="always")
def _all_finite(a):
    """Whether every entry of the flat array a is finite."""
    for k in range(a.shape[0]):
        if not math.isfinite(a[k]):
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _lean_min_margin_one(D4, Z3, v3, W, m3, u, lf, st):
    """Step 3, :func:`attnsvm.svm.engine._to_feasible`: W, lam divided by the minimal
    margin min_k m_k (where it is > 0 and finite), then times certificate.KAPPA (margins a
    rounding-size above 1, which the certificate's error bound proves), the same bits.
    OPTIMAL: m3 already holds the margins of the solver's final check (the bits of
    margins_batch); else they are computed here."""
    d, e = W.shape
    if st != OPTIMAL:
        _margins_batch_ws(D4, Z3, v3, W.reshape((1, d, e)), m3, u)
    ratio = np.inf
    for i in range(v3.shape[1]):
        for t in range(v3.shape[2]):
            if v3[0, i, t]:
                ratio = min(ratio, m3[0, i, t] / 1.0)
    if ratio > 0.0 and math.isfinite(ratio):
        for c in range(d):
            for f in range(e):
                W[c, f] = W[c, f] / ratio * KAPPA
        for k in range(lf.shape[0]):
            lf[k] = lf[k] / ratio * KAPPA


@njit(cache=True, nogil=True, inline="always")
def _lean_work_views(fl, N, d, e):
    """Named views into _lean_work's float buffer: (Zr (N, e) z per constraint, u (d,)
    workspace)."""
    o = N * e
    return fl[:o].reshape((N, e)), fl[o: o + d]


@njit(cache=True, nogil=True)
def _lean_one(X, z, alpha, valid, xexp, tol, small, max_iter, D, Zs, v, W, lam, mu, m, info,
              wk):
    """One Frobenius max-margin problem from the raw arrays, the engine's steps up to its
    certificate in one compiled call (the same W and lam, bit for bit):

    1. normalisation (:func:`_lean_normalise`, as :func:`attnsvm.svm.constraints.
       build_constraints`): X 2^-eX (eX the exponent of max |x| over valid tokens),
       Delta_it = x_{i,alpha_i} - x_it on the valid t != alpha_i (0 elsewhere), Delta 2^-eD,
       z 2^-eZ (exact: powers of two); constraints with A_k = 0 or near underflow hand over
       (:func:`_lean_rows`);
    2. the active-set solve (:func:`_mnp_ws`, lazy Gram rows); where it finds rho ~ 0,
       lam = mu / rho^2 and W = sum_k lam_k A_k (:func:`_lean_small_rho`, as
       :func:`attnsvm.svm.active.mnp_active`);
    3. W, lam scaled to minimal margin exactly 1, then by certificate.KAPPA
       (:func:`_lean_min_margin_one`, as :func:`attnsvm.svm.engine._to_feasible`).

    No certificate here: the caller certifies W and lam in plain numpy
    (:func:`attnsvm.svm.unit_certificate.certify_unit`, the formulas of
    :func:`attnsvm.svm.certificate.certify`) and proves a Farkas candidate mu
    (:func:`attnsvm.svm.farkas.farkas_verify`).

    X (n, T, d), z (n, e), alpha (n,), valid (n, T) bool, xexp: the exponent already divided
    out of X; outputs D (n, T, d), Zs (n, e), v (n, T) bool (the constraints), W (d, e),
    lam, mu (n, T); m (n, T) workspace (the margins of the unscaled W); info (5,) int64:
    [verdict, xexp + eX + eD + eZ, kernel status, n_iter, W finite].  The verdict is
    LEAN_OK, or why the engine's general path must take over (LEAN_SCALE: a power of two out
    of the normal range, scaled data in the subnormal range, or a row norm near underflow;
    LEAN_NO_MARGIN: no constraint; LEAN_ZERO_ROW: a constraint with A_k = 0).  wk: the
    workspace (:func:`_lean_work`)."""
    n, T, d = X.shape
    e = z.shape[1]
    info[0] = LEAN_OK
    info[2] = FAILED
    info[4] = 0
    verdict, ex = _lean_normalise(X, z, alpha, valid, D, Zs, v)
    if verdict != LEAN_OK:
        info[0] = verdict
        return
    info[1] = xexp + ex
    verdict = _lean_rows(D, Zs, v)
    if verdict != LEAN_OK:
        info[0] = verdict
        return
    N = n * T
    Df = D.reshape((N, d))
    Zr, u = _lean_work_views(wk[5], N, d, e)
    for i in range(n):
        for t in range(T):
            for f in range(e):
                Zr[i * T + t, f] = Zs[i, f]
    vf = v.reshape(N)
    lf = lam.reshape(N)
    muf = mu.reshape(N)
    mf = m.reshape(N)  # OPTIMAL: the final margins of W on the constraints (_mnp_ws)
    st, r2, it = _mnp_ws(Df, Zr, vf, tol, small, max_iter, muf, lf, W, wk[6], wk[0], wk[1],
                         wk[2], wk[3], wk[4], mf, wk[7])  # (no Gram given, no trace)
    info[2] = st
    info[3] = it
    if st == FAILED:
        return
    if st == SMALL_RHO:
        _lean_small_rho(W, lf, muf, r2, Df, Zr)
    fin = _all_finite(W.reshape(d * e))
    info[4] = fin
    if fin:
        _lean_min_margin_one(D.reshape((1, n, T, d)), Zs.reshape((1, n, e)),
                             v.reshape((1, n, T)), W, m.reshape((1, n, T)), u, lf, st)


@njit(cache=True, nogil=True)
def fro_single(X, z, alpha, valid, tol, small, max_iter, D, Zs, v, W, lam, mu, info):
    """:func:`_lean_one` for one problem (xexp = 0)."""
    n, T, d = X.shape
    _lean_one(X, z, alpha, valid, 0, tol, small, max_iter, D, Zs, v, W, lam, mu,
              np.empty((n, T)), info, _lean_work(n, T, d, z.shape[1]))


@njit(cache=True, nogil=True, inline="always")
def _abs_max(a, m):
    """max(m, max |a_rc|) over a 2-d array a: np.abs(a).max() for m = 0 (NaN where an
    entry is NaN; m >= 0 on entry)."""
    for r in range(a.shape[0]):
        for c in range(a.shape[1]):
            x = abs(a[r, c])
            if x != x:
                return x
            if x > m:
                m = x
    return m


@njit(cache=True, nogil=True)
def unit_one_scan(D, Z, v, W, lam, m0, S):
    """The exact reductions of one problem's certificate
    (:func:`attnsvm.svm.unit_certificate.unit_one_core`) in one pass: comparisons, absolute
    values, maxima and minima only, which have one correctly defined result whatever the
    order (the values of numpy's reductions, bit for bit).  D (n, T, d), Z (n, e), v (n, T)
    bool, W (d, e), lam, m0 (n, T), S (d, e).  Returns (plain, wmax, zmax, dmax, margin,
    nvalid, smax, wmin):

    * plain: every lam_k finite, > 0 or +0.0 where v_k and +0.0 elsewhere (then
      np.where(v, np.maximum(lam, 0), 0) is lam bit for bit);
    * wmax, zmax, dmax, smax: max |W|, max |Z|, max |D|, max |S| (NaN where an entry is
      NaN, as np.abs(a).max());
    * margin: min of m0 over v (np.where(v, m0, inf).min(): inf where none is valid, NaN
      where a valid one is NaN); nvalid: the count of v;
    * wmin: the least nonzero |W_cf| (inf where there is none; NaN entries skipped)."""
    n, T = v.shape
    plain = True
    margin = np.inf
    nan = False
    nvalid = 0
    for i in range(n):
        for t in range(T):
            x = lam[i, t]
            if v[i, t]:
                nvalid += 1
                if not (0.0 < x < np.inf or (x == 0.0 and math.copysign(1.0, x) > 0.0)):
                    plain = False
                m = m0[i, t]
                if m != m:
                    nan = True
                elif m < margin:
                    margin = m
            elif not (x == 0.0 and math.copysign(1.0, x) > 0.0):
                plain = False
    if nan:
        margin = np.nan
    dmax = 0.0
    for i in range(n):
        dmax = _abs_max(D[i], dmax)
        if dmax != dmax:
            break
    wmin = np.inf
    for c in range(W.shape[0]):
        for f in range(W.shape[1]):
            x = abs(W[c, f])
            if 0.0 < x < wmin:
                wmin = x
    return (plain, _abs_max(W, 0.0), _abs_max(Z, 0.0), dmax, margin, nvalid,
            _abs_max(S, 0.0), wmin)


_BIG = 1.7976931348623157e308  # np.nan_to_num's image of +inf


@njit(cache=True, nogil=True)
def _farkas_one(D, Z, valid, ineq, b, lam, lout, S, u, bound_min):
    """The Farkas check of :func:`attnsvm.svm.solution.farkas_verify` for one problem:
    D (n, T, d), Z (n, e), valid, ineq (n, T) bool, b (n, T), lam (n, T) -> lout (n, T)
    (lam with NaN -> 0 and +-inf -> +-max float, 0 where invalid, divided by
    lb = sum_k lam_k b_k when the certificate is usable); S (d, e), u (d,): workspace.

        S = sum_i (sum_t lout_it Delta_it) z_i^T,  bound = 1 / ||S||_F  (inf for S = 0)

    Returns (ok, bound): ok when lam_k >= 0 on the inequalities, lb > 0 finite and
    bound >= bound_min; bound = 0 when lam is not usable or S is not finite.  Sums in index
    order (t, then i), so that every caller (the engine, the compiled batch path) gets the
    same bits."""
    n, T, d = D.shape
    e = Z.shape[1]
    sign_ok = True
    lb = 0.0
    for i in range(n):
        for t in range(T):
            x = lam[i, t]
            if not valid[i, t] or x != x:
                x = 0.0
            elif x > _BIG:
                x = _BIG
            elif x < -_BIG:
                x = -_BIG
            lout[i, t] = x
            if ineq[i, t] and not x >= 0.0:
                sign_ok = False
            lb += x * b[i, t]
    good = sign_ok and lb > 0.0 and math.isfinite(lb)
    if not good:
        return False, 0.0
    for i in range(n):
        for t in range(T):
            lout[i, t] /= lb
    for c in range(d):
        for f in range(e):
            S[c, f] = 0.0
    for i in range(n):
        for c in range(d):
            u[c] = 0.0
        for t in range(T):
            x = lout[i, t]
            if x != 0.0:
                for c in range(d):
                    u[c] += x * D[i, t, c]
        for c in range(d):
            for f in range(e):
                S[c, f] += u[c] * Z[i, f]
    r = 0.0
    for c in range(d):
        for f in range(e):
            r += S[c, f] * S[c, f]
    r = math.sqrt(r)
    if not math.isfinite(r):
        return False, 0.0
    bound = 1.0 / r if r > 0.0 else np.inf
    return bound >= bound_min, bound


@njit(cache=True, nogil=True)
def farkas_batch(D, Z, valid, ineq, b, lam, lout, ok, bound, bound_min):
    """:func:`_farkas_one` over a batch: D (B, n, T, d), Z (B, n, e), valid, ineq, b, lam,
    lout (B, n, T); ok (B,) bool, bound (B,) out."""
    d = D.shape[3]
    S = np.empty((d, Z.shape[2]))
    u = np.empty(d)
    for bb in range(D.shape[0]):
        o, bd = _farkas_one(D[bb], Z[bb], valid[bb], ineq[bb], b[bb], lam[bb], lout[bb], S, u,
                            bound_min)
        ok[bb] = o
        bound[bb] = bd


@njit(cache=True, nogil=True)
def fro_solve_batch(X, z, alpha, valid, xexp, tol, small, max_iter, info, D, Zs, v, W, lam,
                    mu, b0, b1):
    """:func:`_lean_one` over problems b0 .. b1-1 of a batch: X (B, n, T, d), z (B, n, e),
    alpha (B, n), valid (B, n, T), xexp (B,) in; info (B, 5), the normalised constraints
    D (B, n, T, d), Zs (B, n, e), v (B, n, T) and the solutions W (B, d, e), lam, mu
    (B, n, T) out (:func:`_lean_one`'s).  The solver's workspace is allocated once per
    slice.  No certificate here: the caller certifies W, lam (plain numpy,
    :func:`attnsvm.svm.unit_certificate.certify_unit`) and proves Farkas candidates mu
    (:func:`attnsvm.svm.farkas.farkas_verify`)."""
    n, T, d = X.shape[1], X.shape[2], X.shape[3]
    e = z.shape[2]
    wk = _lean_work(n, T, d, e)
    m = np.empty((n, T))
    for b in range(b0, b1):
        _lean_one(X[b], z[b], alpha[b], valid[b], xexp[b], tol, small, max_iter, D[b], Zs[b],
                  v[b], W[b], lam[b], mu[b], m, info[b], wk)


@njit(cache=True, nogil=True, inline="always")
def _gamma(n):
    """certificate.gamma: n u / (1 - n u)."""
    return n * _U / (1.0 - n * _U)


@njit(cache=True, nogil=True, error_model="numpy")
def _enclosure_support(lam, valid, ineq, which, p, max_support, supp, k):
    """The candidates of :func:`attnsvm.svm.certificate.farkas_enclosure`: lam (B, n, T)
    (finite, 0 where invalid); supp (B, n, T) bool <- valid & lam > 1e-9 max |lam| (max > 0),
    k (B,) <- its size where the problem is a candidate (``which``, p + 1 <= k <=
    max_support, lam >= 0 on the inequalities and 0 elsewhere, no equality in the
    support), else -1."""
    B, n, T = lam.shape
    for b in range(B):
        k[b] = -1
        mx = 0.0
        for i in range(n):
            for t in range(T):
                mx = max(mx, abs(lam[b, i, t]))
        cnt = 0
        good = which[b]
        for i in range(n):
            for t in range(T):
                x = lam[b, i, t]
                s = valid[b, i, t] and x > 1e-9 * mx and mx > 0.0
                supp[b, i, t] = s
                if s:
                    cnt += 1
                    if not ineq[b, i, t]:
                        good = False
                if (ineq[b, i, t] and not x >= 0.0) or (not ineq[b, i, t] and x != 0.0):
                    good = False
        if good and p + 1 <= cnt <= max_support:
            k[b] = cnt


@njit(cache=True, nogil=True, inline="always")
def _enclosure_gather(D, Z, lam, bvec, supp, b, Mt, aMt, lk, bk):
    """The support of problem b in ascending (i, t) order: rows vec(A_j) of Mt (and |.| in
    aMt), lam_j in lk, b_j in bk, zero-padded to Mt's K rows.  Returns the support size."""
    n, T, d = D.shape[1], D.shape[2], D.shape[3]
    e = Z.shape[2]
    K, p = Mt.shape
    j = 0
    for i in range(n):
        for t in range(T):
            if supp[b, i, t]:
                for c in range(d):
                    for f in range(e):
                        x = D[b, i, t, c] * Z[b, i, f]
                        Mt[j, c * e + f] = x
                        aMt[j, c * e + f] = abs(x)
                lk[j] = lam[b, i, t]
                bk[j] = bvec[b, i, t]
                j += 1
    for jj in range(j, K):
        for q in range(p):
            Mt[jj, q] = 0.0
            aMt[jj, q] = 0.0
        lk[jj] = 0.0
        bk[jj] = 0.0
    return j


@njit(cache=True, nogil=True, inline="always")
def _enclosure_residual(Mt, aMt, lk, eDb, g1, r, er):
    """(||r|| bound, sum lam, max |M|): r^ = M^ lam and its rounding 1.01 gamma_{K+4}
    |M^| lam, the data error 3 e_D sum lam, gradual underflow eta (sum lam + K + 1),
    every norm inflated by 1 + 1e-8 (:func:`attnsvm.svm.certificate.farkas_enclosure`)."""
    K, p = Mt.shape
    slk = 0.0
    amax = 0.0
    for jj in range(K):
        slk += lk[jj]
        for q in range(p):
            amax = max(amax, aMt[jj, q])
    for q in range(p):
        r[q] = 0.0
        er[q] = 0.0
    for jj in range(K):
        x = lk[jj]
        for q in range(p):
            r[q] += Mt[jj, q] * x
            er[q] += aMt[jj, q] * x
    nr1 = 0.0
    nr2 = 0.0
    for q in range(p):
        er[q] = (g1 * er[q] + 3.0 * eDb * slk) + _ETA * (slk + K + 1) * (1 + 1e-8)
        nr1 += r[q] * r[q]
        nr2 += er[q] * er[q]
    return (math.sqrt(nr1) + math.sqrt(nr2)) * (1 + 1e-8), slk, amax


@njit(cache=True, nogil=True, inline="always")
def _enclosure_gram(Mt, aMt, G, H):
    """G <- M^ M^T, H <- |M^| |M^|^T (upper triangles; G mirrored).  Returns
    (||H||_F^2, G finite)."""
    K, p = Mt.shape
    for q in range(p):
        for q2 in range(p):
            G[q, q2] = 0.0
            H[q, q2] = 0.0
    for q in range(p):  # (symmetric: the upper triangle, mirrored)
        for jj in range(K):
            x = Mt[jj, q]
            y = aMt[jj, q]
            for q2 in range(q, p):
                G[q, q2] += x * Mt[jj, q2]
                H[q, q2] += y * aMt[jj, q2]
    fin = True
    sg = 0.0
    for q in range(p):
        sg += H[q, q] * H[q, q]
        fin = fin and math.isfinite(G[q, q])
        for q2 in range(q + 1, p):
            sg += 2.0 * (H[q, q2] * H[q, q2])
            G[q2, q] = G[q, q2]
            fin = fin and math.isfinite(G[q, q2])
    return sg, fin


@njit(cache=True, nogil=True, inline="always")
def _inv_fro2(L, Li, p):
    """||L^-1||_F^2 of the lower-triangular L (p x p), L^-1 row by row into Li (forward
    substitution, rows m < i done)."""
    sli = 0.0
    for i in range(p):
        for c in range(p):
            Li[i, c] = 0.0
        for m2 in range(i):
            x = L[i, m2]
            for c in range(m2 + 1):
                Li[i, c] -= x * Li[m2, c]
        dinv = 1.0 / L[i, i]
        for c in range(i):
            Li[i, c] *= dinv
            sli += Li[i, c] * Li[i, c]
        Li[i, i] = dinv
        sli += dinv * dinv
    return sli


@njit(cache=True, nogil=True, inline="always")
def _abs_llt_fro2(L, H, p):
    """||(|L| |L|^T)||_F^2 of the lower-triangular L, |L| |L|^T formed in H (its upper
    triangle, sum_{m <= q})."""
    for q in range(p):
        for q2 in range(p):
            H[q, q2] = 0.0
    for q in range(p):
        for m2 in range(q + 1):
            x = abs(L[q, m2])
            for q2 in range(q, p):
                H[q, q2] += x * abs(L[q2, m2])
    sc = 0.0
    for q in range(p):
        sc += H[q, q] * H[q, q]
        for q2 in range(q + 1, p):
            sc += 2.0 * (H[q, q2] * H[q, q2])
    return sc


@njit(cache=True, nogil=True, error_model="numpy")
def farkas_enclosure_batch(D, Z, lam, bvec, eD, supp, k, K, ok, out):
    """The compiled twin of :func:`attnsvm.svm.certificate.farkas_enclosure` (its plain
    reference and definition; tests/test_svm_formulas.py holds the two equal on data):
    the same bounds, each problem alone, its support (:func:`_enclosure_support`: supp,
    k >= 0 for a candidate) in ascending (i, t) order, K the batch's largest support (the
    reference pads every support to K: gamma_{K+4}, gamma_{K+6}, p K in the bounds).

    D (B, n, T, d), Z (B, n, e), lam, bvec (B, n, T) (lam finite, 0 where invalid), eD (B,)
    the data error.  ok (B,) bool <- proven; out (B, 4) <- (lambda_min bound, delta,
    min lam on the support, sum lam b (1 - gamma_{K+1})) for the tests (NaN where no
    candidate).  The sums run in another order than numpy's (independent accumulators,
    contiguous inner loops): the bounds hold for any order (Higham's gamma_n per inner
    product, Theorem 10.3 for the Cholesky factor, every norm inflated by 1 + 1e-8), so
    the proof is the reference's; only the last bits of the numbers may differ."""
    B = D.shape[0]
    p = D.shape[3] * Z.shape[2]
    Mt = np.zeros((K, p))  # row j: vec(A_j) of the j-th support point (zero-padded to K)
    aMt = np.zeros((K, p))
    r = np.empty(p)
    er = np.empty(p)
    G = np.empty((p, p))
    H = np.empty((p, p))  # |M| |M|^T, then G^ - t I, then |L| |L|^T
    L = np.empty((p, p))
    Li = np.empty((p, p))
    lk = np.empty(K)
    bk = np.empty(K)
    g1 = 1.01 * _gamma(K + 4)
    g2 = 1.01 * _gamma(K + 6)
    gc = _gamma(p + 1)
    for b in range(B):
        ok[b] = False
        for q in range(4):
            out[b, q] = np.nan
        if k[b] < 0:
            continue
        j = _enclosure_gather(D, Z, lam, bvec, supp, b, Mt, aMt, lk, bk)
        nr, slk, amax = _enclosure_residual(Mt, aMt, lk, eD[b], g1, r, er)
        sg, fin = _enclosure_gram(Mt, aMt, G, H)
        eG = (g2 * np.sqrt(sg) + 8.0 * eD[b] * K * p) + _ETA * p * K * (2 * amax + 2)
        # t: half an estimate of lambda_min(G^) (1 / ||L0^-1||_F^2), not part of the proof
        if not fin or not _chol(G, L):
            continue
        tt = 0.5 / _inv_fro2(L, Li, p)
        if not (math.isfinite(tt) and tt > 0.0):
            continue
        # the proof's factorisation: L L^T = G^ - t I + F, |F| <= gamma_{p+1} |L| |L|^T
        dmax = 0.0
        for q in range(p):
            for q2 in range(p):
                H[q, q2] = G[q, q2]
            H[q, q] = G[q, q] - tt
            dmax = max(dmax, abs(H[q, q]))
        if not _chol(H, L):
            continue
        eC = gc * np.sqrt(_abs_llt_fro2(L, H, p)) * (1 + 1e-8)
        eA = _U * dmax * (1 + 1e-8)
        lmin = (tt - eC - eA - eG * (1 + 1e-8)) * (1 - 4 * _U)
        lo = np.inf
        sb = 0.0
        nb = 0.0
        for jj in range(K):
            if jj < j:
                lo = min(lo, lk[jj])
            sb += lk[jj] * bk[jj]
            nb += bk[jj] * bk[jj]
        sb *= 1 - _gamma(K + 1)
        delta = nr / np.sqrt(lmin) * (1 + 1e-8) if lmin > 0 else np.inf
        out[b, 0] = lmin
        out[b, 1] = delta
        out[b, 2] = lo
        out[b, 3] = sb
        ok[b] = lmin > 0 and delta < lo * (1 - 1e-8) and sb > np.sqrt(nb) * delta * (1 + 1e-8)
