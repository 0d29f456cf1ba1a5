"""numba kernels of the fused engine: the scaled gradient of one trial and whole runs of
stateless steps, each trial's working set in cache (imported only when numba is).

The maths is :mod:`attnsvm.models.objective` (fixed and trained linear head) and the
stateless rules of :mod:`attnsvm.optim.rules`, written as loops over one trial. The
formulas follow the torch reference term by term (same anchor, same log-domain scales,
same branches of the losses' stable forms); only the order of floating-point sums
differs, so the two paths agree to rounding (tests/test_fused.py: 1e-12 relative).
No fastmath: every sum is evaluated in a fixed order, and trials are independent, so a
run gives the same bits for any number of threads. The drivers are serial over a slice
of trials and release the GIL; :mod:`attnsvm.fused` runs slices in a thread pool (no
OpenMP runtime whose spinning threads would slow torch down between calls).

Layout. Parameters of a trial are flat float64 rows in three slots P0 (B, s0), P1 (B, s1),
P2 (B, s2), in the order of the model's parameter dict: W | K, Q | k, q | p, then the
trained head v (slot 1 after W or p, slot 2 after K, Q or k, q); unused slots have s = 0.
Integer configuration ``ic`` and real hyper-parameters ``fc`` are arrays, so each kernel
compiles once for every model, loss and rule (cached on disk by numba).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# --------------------------------------------------------------------- codes
W_MODEL, KQ_MODEL, DIAG_MODEL, PROMPT_MODEL = 0, 1, 2, 3
LOGISTIC, EXPONENTIAL, CORRELATION = 0, 1, 2
R_NONE, R_GD, R_NSD, R_POLYAK, R_MIRROR = 0, 1, 2, 3, 4
LP_FRO, LP_INF, LP_ONE, LP_GEN = 0, 1, 2, 3
STOP_ZERO, STOP_NONFINITE, STOP_NOCHANGE = 1, 2, 3

# ic: integer configuration
IC_MODEL, IC_TRAINED, IC_LOSS, IC_RULE, IC_GLOBAL, IC_RELATIVE, IC_NP = 0, 1, 2, 3, 4, 5, 6
IC_N, IC_Q, IC_T, IC_D, IC_M, IC_MASK, IC_STALL, IC_LP, IC_NORMALIZED = 7, 8, 9, 10, 11, 12, 13, 14, 15
IC_MAXLR, IC_NEEDGAP, IC_WID, IC_SIZE = 16, 17, 18, 19
# fc: real hyper-parameters
FC_LR, FC_P, FC_Q, FC_REG, FC_C, FC_MAXLR, FC_SIZE = 0, 1, 2, 3, 4, 5, 6

NINF = -np.inf
LOG_GAP_SWITCH = -35.0


# ------------------------------------------------------------ scalar helpers
@njit(cache=True)
def _log(x):
    """log with numpy semantics: -inf at 0, nan below."""
    if x > 0.0:
        return math.log(x)
    if x == 0.0:
        return NINF
    return np.nan


@njit(cache=True)
def _softplus(x):
    """torch.nn.functional.softplus (beta 1, threshold 20)."""
    if x > 20.0:
        return x
    return math.log1p(math.exp(x))


@njit(cache=True)
def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@njit(cache=True)
def _log_neg_deriv(loss, u):
    """log(-loss'(u)) (attnsvm.losses)."""
    if loss == LOGISTIC:  # logsigmoid(-u) = min(x, 0) - log1p(exp(-|x|)), x = -u
        x = -u
        return min(x, 0.0) - math.log1p(math.exp(-abs(x)))
    if loss == EXPONENTIAL:
        return -u
    return 0.0


@njit(cache=True)
def _value(loss, u):
    if loss == LOGISTIC:
        return _softplus(-u)
    if loss == EXPONENTIAL:
        return math.exp(-u)
    return -u


@njit(cache=True)
def _log_value(loss, u):
    if loss == LOGISTIC:
        if u > 30.0:
            return -u + math.log1p(-0.5 * math.exp(-u))
        return _log(_softplus(-u))
    if loss == EXPONENTIAL:
        return -u
    return _log(-u)


@njit(cache=True)
def _gap(loss, g, D):
    if loss == LOGISTIC:
        return math.log1p(math.expm1(D) * _sigmoid(-g))
    if loss == EXPONENTIAL:
        return math.exp(-g) * math.expm1(D)
    return D


@njit(cache=True)
def _log_gap(loss, g, logD, D):
    """attnsvm.losses.log_gap for one entry (D given in the linear domain)."""
    small = logD < LOG_GAP_SWITCH
    if small:
        D = 1.0
    lead = _log_neg_deriv(loss, g)
    direct = _log(_gap(loss, g, D))
    if (not np.isfinite(direct)) and D > 0.0:
        l1 = _log_value(loss, g - D)
        l2 = _log_value(loss, g)
        diff = l1 + math.log1p(-math.exp(l2 - l1))
        near = lead + _log(math.expm1(D))
        if np.isfinite(diff) and D >= 1e-3:
            direct = diff
        else:
            direct = near
    if small:
        return lead + logD
    return direct


@njit(cache=True)
def _logsumexp(x, k):
    """log sum exp of x[:k] (torch.logsumexp semantics; nan entries count as -inf)."""
    m = NINF
    for i in range(k):
        if x[i] > m:
            m = x[i]
    if m == NINF:
        return NINF
    if m == np.inf:
        return np.inf
    s = 0.0
    for i in range(k):
        if x[i] == x[i]:
            s += math.exp(x[i] - m)
    return m + math.log(s)


# -------------------------------------------------------------- vector helpers
@njit(cache=True)
def _max_abs(x, k):
    """max |x[:k]| (exact in any order; four chains for speed)."""
    m0 = 0.0
    m1 = 0.0
    m2 = 0.0
    m3 = 0.0
    i = 0
    while i + 4 <= k:
        a0 = abs(x[i])
        a1 = abs(x[i + 1])
        a2 = abs(x[i + 2])
        a3 = abs(x[i + 3])
        if a0 > m0:
            m0 = a0
        if a1 > m1:
            m1 = a1
        if a2 > m2:
            m2 = a2
        if a3 > m3:
            m3 = a3
        i += 4
    while i < k:
        a0 = abs(x[i])
        if a0 > m0:
            m0 = a0
        i += 1
    return max(max(m0, m1), max(m2, m3))


@njit(cache=True)
def _sum_sq(x, k):
    """sum x[:k]^2 in a fixed order (four partial sums)."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    i = 0
    while i + 4 <= k:
        s0 += x[i] * x[i]
        s1 += x[i + 1] * x[i + 1]
        s2 += x[i + 2] * x[i + 2]
        s3 += x[i + 3] * x[i + 3]
        i += 4
    while i < k:
        s0 += x[i] * x[i]
        i += 1
    return (s0 + s1) + (s2 + s3)


@njit(cache=True)
def _sum(x, k):
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    i = 0
    while i + 4 <= k:
        s0 += x[i]
        s1 += x[i + 1]
        s2 += x[i + 2]
        s3 += x[i + 3]
        i += 4
    while i < k:
        s0 += x[i]
        i += 1
    return (s0 + s1) + (s2 + s3)


@njit(cache=True)
def _lp_value(x, k, kind, p):
    """||x[:k]|| in an entrywise norm for x with max|x| = 1 (or 0): kind LP_*."""
    if kind == LP_FRO:
        return math.sqrt(_sum_sq(x, k))
    if kind == LP_INF:
        return _max_abs(x, k)
    s = 0.0
    if kind == LP_ONE:
        for i in range(k):
            s += abs(x[i])
        return s
    for i in range(k):
        s += abs(x[i]) ** p
    return s ** (1.0 / p)


@njit(cache=True)
def _normalize(x, k, top):
    """x[:k] /= max|x| in place; returns log max|x| + top (-inf for a zero x)."""
    m = _max_abs(x, k)
    if m > 0.0:
        for i in range(k):
            x[i] = x[i] / m
        return math.log(m) + top
    return NINF


@njit(cache=True)
def _scale(x, k, top, gm, slot):
    """gm[slot] = max|x[:k]| (1 for a zero x); returns log max|x| + top (-inf for a zero
    x). x stays raw: the scaled tensor of optim.base.Scaled is x / gm[slot]."""
    m = _max_abs(x, k)
    if m > 0.0:
        gm[slot] = m
        return math.log(m) + top
    gm[slot] = 1.0
    return NINF


@njit(cache=True)
def _steepest(t, k, kind, q, out):
    """out[:k] = the unit steepest direction of t (max|t| = 1 or 0) for an entrywise
    norm (attnsvm.norms: Frobenius, l_inf sign, l_1 coordinate, l_p; q the dual exponent)."""
    m = _max_abs(t, k)
    if m == 0.0:
        for i in range(k):
            out[i] = 0.0
        return
    if kind == LP_FRO:
        n = math.sqrt(_sum_sq(t, k))
        for i in range(k):
            out[i] = t[i] / n
    elif kind == LP_INF:
        for i in range(k):
            out[i] = np.sign(t[i])
    elif kind == LP_ONE:
        cnt = 0
        for i in range(k):
            if abs(t[i]) == m:
                cnt += 1
        for i in range(k):
            out[i] = np.sign(t[i]) / cnt if abs(t[i]) == m else 0.0
    else:
        s = 0.0
        for i in range(k):
            s += abs(t[i]) ** q
        nq = s ** (1.0 / q)
        den = nq ** (q - 1.0)
        for i in range(k):
            out[i] = np.sign(t[i]) * abs(t[i]) ** (q - 1.0) / den


@njit(cache=True)
def _scaled_add(a, la, ga, e, k):
    """(a / ga e^{la} + e) in scaled form into a (max|a| = 1); returns its log scale
    (optim.base.Scaled.add: the ridge term of KQ)."""
    le = _normalize(e, k, 0.0)
    L = max(la, le)
    Lf = L if np.isfinite(L) else 0.0
    fa = math.exp(la - Lf)
    fe = math.exp(le - Lf)
    for i in range(k):
        a[i] = (a[i] / ga) * fa + e[i] * fe
    return _normalize(a, k, Lf)


@njit(cache=True)
def _dots(X, xo, v, vo, out, oo, T, d):
    """out[oo + t] = X[xo + t d : xo + (t+1) d] . v[vo : vo + d] for t < T (sums over j in
    order), four rows at a time so that the loads of v are shared."""
    t = 0
    while t + 4 <= T:
        b0 = xo + t * d
        b1 = b0 + d
        b2 = b1 + d
        b3 = b2 + d
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        for j in range(d):
            vj = v[vo + j]
            s0 += X[b0 + j] * vj
            s1 += X[b1 + j] * vj
            s2 += X[b2 + j] * vj
            s3 += X[b3 + j] * vj
        out[oo + t] = s0
        out[oo + t + 1] = s1
        out[oo + t + 2] = s2
        out[oo + t + 3] = s3
        t += 4
    while t < T:
        b0 = xo + t * d
        s0 = 0.0
        for j in range(d):
            s0 += X[b0 + j] * v[vo + j]
        out[oo + t] = s0
        t += 1


# ------------------------------------------------------------- the gradient
@njit(cache=True)
def _trial_grad(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, G0, G1, G2, gm, ls,
                KT, WZ, ZQ, A, S, Rr, C, dr, rho, rhov, rlg, acc, tmp):
    """Scaled gradient of one trial: slot k is G_k / gm[k] times exp(ls[k]) (G_k raw,
    gm[k] = max|G_k|); returns log(L - L*) (nan unless ic[IC_NEEDGAP]).

    Flat (1-d) arrays of one trial: X (n, T, d) tokens, Z (n, Q, d) queries, gam (n, Q, T) scores with masked keys 0, gopt (n, Q),
    yl (n, Q) labels, w (n, Q) query weights, mask (n, Q, T) uint8 (read when
    ic[IC_MASK]), Wf (2, d d) the prompt's fixed W: W^T in row 0, W in row 1 (unused
    when ic[IC_WID]: W = I).
    The W model's slot P0 holds W^T (and G0 receives G_W^T): every product then runs
    over contiguous rows. The rest is scratch; inner loops accumulate in ``acc``."""
    model = ic[IC_MODEL]
    trained = ic[IC_TRAINED]
    loss = ic[IC_LOSS]
    n = ic[IC_N]
    Qn = ic[IC_Q]
    T = ic[IC_T]
    d = ic[IC_D]
    m = ic[IC_M]
    hasmask = ic[IC_MASK]
    need_gap = ic[IC_NEEDGAP]
    R = n * Qn
    na = 2 if (model == KQ_MODEL or model == DIAG_MODEL) else 1  # slot of the head v
    Pv = P1 if na == 1 else P2
    Gv = G1 if na == 1 else G2

    # ---- W z for every query row: WZ (R, d); loops: l, then rows, then contiguous j
    if model == W_MODEL:  # W z_r = sum_l z_rl (row l of W^T)
        for x in range(R * d):
            acc[x] = 0.0
        for l in range(d):
            base = l * d
            for r in range(R):
                zl = Z[r * d + l]
                ro = r * d
                for j in range(d):
                    acc[ro + j] += zl * P0[base + j]
        for x in range(R * d):
            WZ[x] = acc[x]
    elif model == KQ_MODEL:  # K (Q^T z_r): ZQ (R, m), then sum_c ZQ_rc (row c of K^T)
        for j in range(d):
            for c in range(m):
                KT[c * d + j] = P0[j * m + c]
        for x in range(R * m):
            acc[x] = 0.0
        for l in range(d):
            base = l * m
            for r in range(R):
                zl = Z[r * d + l]
                ro = r * m
                for c in range(m):
                    acc[ro + c] += zl * P1[base + c]
        for x in range(R * m):
            ZQ[x] = acc[x]
        for x in range(R * d):
            acc[x] = 0.0
        for c in range(m):
            base = c * d
            for r in range(R):
                zc = ZQ[r * m + c]
                ro = r * d
                for j in range(d):
                    acc[ro + j] += zc * KT[base + j]
        for x in range(R * d):
            WZ[x] = acc[x]
    elif model == DIAG_MODEL:
        for r in range(R):
            zo = r * d
            for j in range(d):
                WZ[zo + j] = Z[zo + j] * (P0[j] * P1[j])
    else:  # prompt: W p, the same for every row
        if ic[IC_WID]:
            for j in range(d):
                acc[j] = P0[j]
        else:
            for j in range(d):
                acc[j] = 0.0
            for l in range(d):  # W p = sum_l p_l (row l of W^T)
                pl = P0[l]
                base = l * d
                for j in range(d):
                    acc[j] += pl * Wf[0, base + j]
        for r in range(R):
            for j in range(d):
                WZ[r * d + j] = acc[j]

    # ---- logits a_rt = x_it . (W z)_r: dot products, four tokens at a time
    for r in range(R):
        _dots(X, (r // Qn) * T * d, WZ, r * d, A, r * T, T, d)
    if hasmask:
        for x in range(R * T):
            if mask[x] == 0:
                A[x] = NINF

    # ---- per row: anchor, softmax around it, the loss terms
    for r in range(R):
        i = r // Qn
        ro = r * T
        # anchor k: the first maximiser; with a_j the largest other key,
        # r_t = exp(a_t - a_j) (t != k), s_t = r_t e_j / (1 + e_j sum r), e_j = exp(a_j - a_k),
        # M = log s_j = (a_j - a_k) - log1p(e_j sum r): attention.softmax_terms with one exp
        # per key (exact where e_j underflows: then s_t = 0 off the anchor, M = a_j - a_k).
        k = 0
        mx = A[ro]
        for t in range(1, T):
            if A[ro + t] > mx:
                mx = A[ro + t]
                k = t
        aj = NINF
        for t in range(T):
            if t != k and A[ro + t] > aj:
                aj = A[ro + t]
        if aj == NINF:  # the anchor is the only admissible key
            M = NINF
            for t in range(T):
                Rr[ro + t] = 0.0
                S[ro + t] = 0.0
            S[ro + k] = 1.0
        else:
            sr = 0.0
            for t in range(T):
                if t == k:
                    Rr[ro + t] = 0.0
                else:
                    e = math.exp(A[ro + t] - aj)
                    Rr[ro + t] = e
                    sr += e
            ej = math.exp(aj - mx)
            x = ej * sr
            lse = math.log1p(x)
            M = (aj - mx) - lse
            f = ej / (1.0 + x)
            for t in range(T):
                S[ro + t] = Rr[ro + t] * f
            S[ro + k] = 1.0 / (1.0 + x)
        eM = math.exp(M)
        lw = _log(w[r])
        if trained == 0:
            gk = gam[ro + k]
            s_ = 0.0
            for t in range(T):
                c = gk - gam[ro + t]
                C[ro + t] = c
                s_ += Rr[ro + t] * c
            dr[r] = s_
            go = gopt[r]
            D = (go - gk) + eM * s_
            u = go - D
            rho[r] = lw + _log_neg_deriv(loss, u) + M
            if need_gap:
                logD = M + _log(s_) if gk >= go else _log(D)
                rlg[r] = lw + _log_gap(loss, go, logD, D)
        else:
            _dots(X, i * T * d, Pv, 0, acc, 0, T, d)  # c_t = v . x_t
            ck = acc[k]
            s_ = 0.0
            for t in range(T):
                cd = acc[t] - ck
                if hasmask and mask[ro + t] == 0:
                    cd = 0.0
                C[ro + t] = cd
                s_ += Rr[ro + t] * cd
            dr[r] = s_
            u = yl[r] * (ck + eM * s_)
            rv = lw + _log_neg_deriv(loss, u)
            rhov[r] = rv if rv == rv else NINF
            rho[r] = rv + M
            if need_gap:
                rlg[r] = lw + _log_value(loss, u)
    lgap = np.nan
    if need_gap:
        for r in range(R):
            if rlg[r] != rlg[r]:
                rlg[r] = NINF
        lgap = _logsumexp(rlg, R)

    # ---- row factors exp(rho - max rho) and dL/da (scaled), into A
    top = NINF
    for r in range(R):
        if rho[r] != rho[r]:
            rho[r] = NINF
        if rho[r] > top:
            top = rho[r]
    topf = top if np.isfinite(top) else 0.0
    for r in range(R):
        ro = r * T
        fac = math.exp(rho[r] - topf)
        sdr = dr[r]
        if trained == 0:
            for t in range(T):
                g = -fac * (S[ro + t] * sdr - Rr[ro + t] * C[ro + t])
                A[ro + t] = g if g == g else 0.0
        else:
            f = -yl[r] * fac
            for t in range(T):
                g = f * (Rr[ro + t] * C[ro + t] - S[ro + t] * sdr)
                A[ro + t] = g if g == g else 0.0
    # GX_r = sum_t Ga_rt x_it  (R, d), into WZ (the sum over t in order either way)
    for r in range(R):
        xo = (r // Qn) * T * d
        ao = r * T
        ro = r * d
        if d <= 32:
            for j in range(d):
                s_ = 0.0
                for t in range(T):
                    s_ += A[ao + t] * X[xo + t * d + j]
                WZ[ro + j] = s_
        else:
            for j in range(d):
                acc[j] = 0.0
            for t in range(T):
                g = A[ao + t]
                base = xo + t * d
                for j in range(d):
                    acc[j] += g * X[base + j]
            for j in range(d):
                WZ[ro + j] = acc[j]
    GX = WZ

    # ---- parameter gradients (raw, times exp(top))
    if model == W_MODEL:  # G_W^T = sum_r z_r GX_r^T: row l = sum_r z_rl GX_r
        for l in range(d):
            for j in range(d):
                acc[j] = 0.0
            for r in range(R):
                zl = Z[r * d + l]
                ro = r * d
                for j in range(d):
                    acc[j] += zl * GX[ro + j]
            base = l * d
            for j in range(d):
                G0[base + j] = acc[j]
        ls[0] = _scale(G0, d * d, top, gm, 0)
    elif model == KQ_MODEL:
        # dK = G_W Q: row j = sum_r GX_rj (Q^T z_r); dQ = G_W^T K: row l = sum_r z_rl (K^T GX_r)
        for j in range(d):
            for c in range(m):
                acc[c] = 0.0
            for r in range(R):
                g = GX[r * d + j]
                base = r * m
                for c in range(m):
                    acc[c] += g * ZQ[base + c]
            for c in range(m):
                G0[j * m + c] = acc[c]
        for r in range(R):  # K^T GX_r into ZQ
            for c in range(m):
                acc[c] = 0.0
            for j in range(d):
                g = GX[r * d + j]
                base = j * m
                for c in range(m):
                    acc[c] += g * P0[base + c]
            for c in range(m):
                ZQ[r * m + c] = acc[c]
        for l in range(d):
            for c in range(m):
                acc[c] = 0.0
            for r in range(R):
                zl = Z[r * d + l]
                base = r * m
                for c in range(m):
                    acc[c] += zl * ZQ[base + c]
            for c in range(m):
                G1[l * m + c] = acc[c]
        ls[0] = _scale(G0, d * m, top, gm, 0)
        ls[1] = _scale(G1, d * m, top, gm, 1)
        reg = fc[FC_REG]
        if reg != 0.0:
            for x in range(d * m):
                tmp[x] = 2.0 * reg * P0[x]
            ls[0] = _scaled_add(G0, ls[0], gm[0], tmp, d * m)
            for x in range(d * m):
                tmp[x] = 2.0 * reg * P1[x]
            ls[1] = _scaled_add(G1, ls[1], gm[1], tmp, d * m)
            gm[0] = 1.0
            gm[1] = 1.0
    elif model == DIAG_MODEL:  # g_j = sum_r GX_rj z_rj; dk = g q, dq = g k
        for j in range(d):
            acc[j] = 0.0
        for r in range(R):
            base = r * d
            for j in range(d):
                acc[j] += GX[base + j] * Z[base + j]
        for j in range(d):
            G0[j] = acc[j] * P1[j]
            G1[j] = acc[j] * P0[j]
        ls[0] = _scale(G0, d, top, gm, 0)
        ls[1] = _scale(G1, d, top, gm, 1)
    else:  # prompt: dp = W^T g = sum_l g_l (row l of W), g = sum_r GX_r
        for j in range(d):
            acc[j] = 0.0
        for r in range(R):
            base = r * d
            for j in range(d):
                acc[j] += GX[base + j]
        if ic[IC_WID]:
            for j in range(d):
                G0[j] = acc[j]
        else:
            for j in range(d):
                G0[j] = 0.0
            for l in range(d):
                g = acc[l]
                base = l * d
                for j in range(d):
                    G0[j] += g * Wf[1, base + j]
        ls[0] = _scale(G0, d, top, gm, 0)

    # ---- trained head: dv = sum_it (sum_q lam_iq s_iqt) x_it (scaled by max rho_v)
    if trained:
        topv = NINF
        for r in range(R):
            if rhov[r] > topv:
                topv = rhov[r]
        topvf = topv if np.isfinite(topv) else 0.0
        for j in range(d):
            acc[j] = 0.0
        for i in range(n):
            for t in range(T):
                s_ = 0.0
                for q in range(Qn):
                    r = i * Qn + q
                    s_ += -yl[r] * math.exp(rhov[r] - topvf) * S[r * T + t]
                if s_ != s_:
                    s_ = 0.0
                base = (i * T + t) * d
                for j in range(d):
                    acc[j] += s_ * X[base + j]
        for j in range(d):
            Gv[j] = acc[j]
        ls[na] = _scale(Gv, d, topv, gm, na)
    return lgap


# ------------------------------------------------------------------ the rules
@njit(cache=True)
def _mirror_map(x, p):
    return np.sign(x) * abs(x) ** (p - 1.0)


@njit(cache=True)
def _inv_mirror_map(x, p):
    return np.sign(x) * abs(x) ** (1.0 / (p - 1.0))


@njit(cache=True)
def _apply_generic(ic, fc, Ps, Gs, sizes, ls, lgap, Ns, D, work):
    """New parameters Ns[k] from the scaled gradient (Gs[k] with max|.| = 1, ls[k]) of a
    stateless rule (attnsvm.optim.rules: gd, nsd / ngd / sign / coordinate in an entrywise
    norm, per tensor or global, relative; polyak; l_p mirror descent, plain or
    normalised). D and work (4 nP) are scratch."""
    rule = ic[IC_RULE]
    nP = ic[IC_NP]
    lr = fc[FC_LR]
    if rule == R_GD:
        for k in range(nP):
            f = math.exp(ls[k])
            P, G, N = Ps[k], Gs[k], Ns[k]
            for x in range(sizes[k]):
                N[x] = P[x] - lr * (G[x] * f)
    elif rule == R_NSD:
        kind = ic[IC_LP]
        p = fc[FC_P]
        q = fc[FC_Q]
        wts = work[0:nP]
        for k in range(nP):
            wts[k] = 1.0
        if ic[IC_GLOBAL]:
            # dual norm of each tensor, log ||G_k||_* ; weights exp(ld_k - lt)
            dkind = LP_FRO if kind == LP_FRO else (LP_ONE if kind == LP_INF else
                                                   (LP_INF if kind == LP_ONE else LP_GEN))
            ld = work[nP:2 * nP]
            ld2 = work[2 * nP:3 * nP]
            for k in range(nP):
                ld[k] = _log(_lp_value(Gs[k], sizes[k], dkind, q)) + ls[k]
                ld2[k] = 2.0 * ld[k]
            lt = 0.5 * _logsumexp(ld2, nP)
            for k in range(nP):
                wts[k] = math.exp(ld[k] - lt) if np.isfinite(lt) else 0.0
        step = lr
        if ic[IC_RELATIVE]:
            vals = work[3 * nP:4 * nP]
            for k in range(nP):
                mk = _max_abs(Ps[k], sizes[k])
                if mk > 0.0:
                    for x in range(sizes[k]):
                        D[x] = Ps[k][x] / mk
                    vals[k] = mk * _lp_value(D, sizes[k], kind, p)
                else:
                    vals[k] = 0.0
            mm = 0.0
            for k in range(nP):
                if vals[k] > mm:
                    mm = vals[k]
            safe = mm if mm > 0.0 else 1.0
            s2 = 0.0
            for k in range(nP):
                s2 += (vals[k] / safe) ** 2
            step = lr * (mm * math.sqrt(s2))
        for k in range(nP):
            _steepest(Gs[k], sizes[k], kind, q, D)
            s = step * wts[k] if ic[IC_GLOBAL] else step
            P, N = Ps[k], Ns[k]
            for x in range(sizes[k]):
                N[x] = P[x] - s * D[x]
    elif rule == R_POLYAK:
        logs = work[0:nP]
        for k in range(nP):
            logs[k] = 2.0 * (_log(math.sqrt(_sum_sq(Gs[k], sizes[k]))) + ls[k])
        lg = 0.5 * _logsumexp(logs, nP)
        lr_ = math.log(fc[FC_C]) + lgap - lg
        if ic[IC_MAXLR]:
            lr_ = min(lr_, math.log(fc[FC_MAXLR]) + lg)
        for k in range(nP):
            f = math.exp(lr_ + ls[k] - lg)
            if not (np.isfinite(lg) and np.isfinite(lr_)):
                f = 0.0
            P, G, N = Ps[k], Gs[k], Ns[k]
            for x in range(sizes[k]):
                N[x] = P[x] - f * G[x]
    else:  # mirror
        p = fc[FC_P]
        q = fc[FC_Q]
        for k in range(nP):
            P, G, N = Ps[k], Gs[k], Ns[k]
            if ic[IC_NORMALIZED]:
                nrm = _lp_value(G, sizes[k], LP_GEN if q != 2.0 else LP_FRO, q)
                if not nrm > 0.0:
                    nrm = 1.0
                for x in range(sizes[k]):
                    N[x] = _inv_mirror_map(_mirror_map(P[x], p) - lr * (G[x] / nrm), p)
            else:
                f = math.exp(ls[k])
                for x in range(sizes[k]):
                    N[x] = _inv_mirror_map(_mirror_map(P[x], p) - lr * (G[x] * f), p)


@njit(cache=True)
def _step_checked(P, G, c, N, k):
    """N = P - c G; returns flags: 1 all finite, 2 some entry changed, 4 some |N| > 1e300."""
    chg = False
    fin = True
    big = False
    for x in range(k):
        v = P[x] - c * G[x]
        N[x] = v
        chg |= v != P[x]
        fin &= (v - v) == 0.0
        big |= abs(v) > 1e300
    return (1 if fin else 0) | (2 if chg else 0) | (4 if big else 0)


@njit(cache=True)
def _checked(P, N, k):
    """The flags of _step_checked for an N computed elsewhere."""
    chg = False
    fin = True
    big = False
    for x in range(k):
        v = N[x]
        chg |= v != P[x]
        fin &= (v - v) == 0.0
        big |= abs(v) > 1e300
    return (1 if fin else 0) | (2 if chg else 0) | (4 if big else 0)


@njit(cache=True)
def _sum_sq_scaled(x, k, inv):
    """sum (x[:k] inv)^2 in a fixed order (eight partial sums)."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    s4 = 0.0
    s5 = 0.0
    s6 = 0.0
    s7 = 0.0
    nb = k // 8
    for b in range(nb):
        i = b * 8
        a0 = x[i] * inv
        a1 = x[i + 1] * inv
        a2 = x[i + 2] * inv
        a3 = x[i + 3] * inv
        a4 = x[i + 4] * inv
        a5 = x[i + 5] * inv
        a6 = x[i + 6] * inv
        a7 = x[i + 7] * inv
        s0 += a0 * a0
        s1 += a1 * a1
        s2 += a2 * a2
        s3 += a3 * a3
        s4 += a4 * a4
        s5 += a5 * a5
        s6 += a6 * a6
        s7 += a7 * a7
    for i in range(nb * 8, k):
        a0 = x[i] * inv
        s0 += a0 * a0
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(cache=True)
def _apply_rule(ic, fc, Ps, Gs, gm, sizes, ls, lgap, Ns, D, work):
    """Ns[k] = the rule's step from Ps[k] with the scaled gradient (Gs[k] / gm[k], ls[k]);
    returns the flags of _step_checked over all tensors (1 finite, 2 changed, 4 huge).
    GD, per-tensor NGD and Polyak step from the raw G (one norm pass, one update pass);
    the other rules divide G by gm first (_apply_generic). Gs may be overwritten."""
    rule = ic[IC_RULE]
    nP = ic[IC_NP]
    lr = fc[FC_LR]
    fin = 1
    chg = 0
    big = 0
    fast_nsd = rule == R_NSD and ic[IC_LP] == LP_FRO and ic[IC_GLOBAL] == 0 \
        and ic[IC_RELATIVE] == 0
    if rule == R_GD or fast_nsd:
        for k in range(nP):
            c = 0.0
            if ls[k] > NINF:
                inv = 1.0 / gm[k]
                if rule == R_GD:
                    c = lr * (math.exp(ls[k]) * inv)
                else:
                    c = lr * (inv / math.sqrt(_sum_sq_scaled(Gs[k], sizes[k], inv)))
            f = _step_checked(Ps[k], Gs[k], c, Ns[k], sizes[k])
            fin &= f & 1
            chg |= (f >> 1) & 1
            big |= (f >> 2) & 1
    elif rule == R_POLYAK:
        logs = work[0:nP]
        for k in range(nP):
            logs[k] = 2.0 * (0.5 * _log(_sum_sq_scaled(Gs[k], sizes[k], 1.0 / gm[k])) + ls[k])
        lg = 0.5 * _logsumexp(logs, nP)
        lr_ = math.log(fc[FC_C]) + lgap - lg
        if ic[IC_MAXLR]:
            lr_ = min(lr_, math.log(fc[FC_MAXLR]) + lg)
        for k in range(nP):
            fk = math.exp(lr_ + ls[k] - lg)
            if not (np.isfinite(lg) and np.isfinite(lr_)):
                fk = 0.0
            f = _step_checked(Ps[k], Gs[k], fk / gm[k], Ns[k], sizes[k])
            fin &= f & 1
            chg |= (f >> 1) & 1
            big |= (f >> 2) & 1
    else:
        for k in range(nP):
            inv = 1.0 / gm[k]
            G = Gs[k]
            for x in range(sizes[k]):
                G[x] = G[x] * inv
        _apply_generic(ic, fc, Ps, Gs, sizes, ls, lgap, Ns, D, work)
        for k in range(nP):
            f = _checked(Ps[k], Ns[k], sizes[k])
            fin &= f & 1
            chg |= (f >> 1) & 1
            big |= (f >> 2) & 1
    if fin and big:  # some |entry| > 1e300: the trainer's test, a finite sum of entries
        tot = 0.0
        for k in range(nP):
            tot += _sum(Ns[k], sizes[k])
        fin = 1 if np.isfinite(tot) else 0
    return fin | (chg << 1)


# ------------------------------------------------------------------- drivers
@njit(cache=True)
def _transpose(src, dst, rows, cols):
    """dst (cols, rows) = src (rows, cols)^T, flat."""
    for a in range(rows):
        for b in range(cols):
            dst[b * rows + a] = src[a * cols + b]


@njit(cache=True)
def _row(A, b):
    """Row b of a batched (B, k) array, or row 0 of a shared (1, k) one."""
    return A[0] if A.shape[0] == 1 else A[b]


@njit(cache=True)
def _scratch(ic):
    n, Qn, T, d, m = ic[IC_N], ic[IC_Q], ic[IC_T], ic[IC_D], ic[IC_M]
    R = n * Qn
    big = max(d * max(d, m), R, T, 1)
    return (np.empty(max(m, 1) * d), np.empty(R * d),
            np.empty(R * max(m, 1)), np.empty(R * T), np.empty(R * T), np.empty(R * T),
            np.empty(R * T), np.empty(R), np.empty(R), np.empty(R), np.empty(R),
            np.empty(max(R * max(d, m), T, 1)), np.empty(big))


@njit(nogil=True, cache=True)
def grad_batch(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, G0, G1, G2, LS, LG, b0, b1):
    """Scaled gradients of trials b0 .. b1-1: G0..G2 (B, s) in the parameters' own layout
    (G_W, not its transpose), LS (B, 3) log scales, LG (B,) log gaps. Data arrays are
    flat per trial: X (Bx, n T d), Z (Bz, n Q d), gam (Bx, n Q T), gopt / yl / w
    (., n Q), mask (Bm, n Q T); Wf (2, d d)."""
    d = ic[IC_D]
    KT, WZ, ZQ, A, S, Rr, C, dr, rho, rhov, rlg, acc, tmp = _scratch(ic)
    ls = np.full(3, NINF)
    gm = np.ones(3)
    Wt = np.empty(d * d) if ic[IC_MODEL] == W_MODEL else np.empty(0)
    for b in range(b0, b1):
        Xb = _row(X, b)
        for k in range(3):
            ls[k] = NINF
        if ic[IC_MODEL] == W_MODEL:
            _transpose(P0[b], Wt, d, d)
            LG[b] = _trial_grad(ic, fc, Xb, _row(Z, b), _row(gam, b), _row(gopt, b),
                                _row(yl, b), _row(w, b), _row(mask, b), Wf, Wt, P1[b], P2[b],
                                tmp, G1[b], G2[b], gm, ls, KT, WZ, ZQ, A, S, Rr, C, dr, rho, rhov,
                                rlg, acc, G0[b])
            _transpose(tmp, G0[b], d, d)  # G_W^T -> G_W (tmp held G_W^T, G0 the scratch)
        else:
            LG[b] = _trial_grad(ic, fc, Xb, _row(Z, b), _row(gam, b), _row(gopt, b),
                                _row(yl, b), _row(w, b), _row(mask, b), Wf, P0[b], P1[b],
                                P2[b], G0[b], G1[b], G2[b], gm, ls, KT, WZ, ZQ, A, S, Rr, C, dr,
                                rho, rhov, rlg, acc, tmp)
        for k in range(3):  # the scaled form: max|.| = 1
            LS[b, k] = ls[k]
        for G, k in ((G0[b], 0), (G1[b], 1), (G2[b], 2)):
            inv = 1.0 / gm[k]
            for x in range(G.shape[0]):
                G[x] = G[x] * inv


@njit(nogil=True, cache=True)
def run_steps(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, t0, t1,
              active, stop_step, stop_code, b0, b1):
    """Steps t0 .. t1-1 of a stateless rule for every active trial, in place on P0..P2.

    Per trial and step (the trainer's semantics): the scaled gradient; a zero gradient
    stops the trial (code 1) before the update; an update with a non-finite sum of
    parameters (code 2) or, if ic[IC_STALL], that leaves every parameter bit-identical
    (code 3) stops it and is not applied. active / stop_step / stop_code are updated.
    Trials b0 .. b1-1 (the caller runs slices in threads: the kernel releases the GIL).
    The rules are entrywise in their norms, so the W model steps on W^T throughout."""
    d = ic[IC_D]
    nP = ic[IC_NP]
    wmodel = ic[IC_MODEL] == W_MODEL
    KT, WZ, ZQ, A, S, Rr, C, dr, rho, rhov, rlg, acc, tmp = _scratch(ic)
    s0, s1, s2 = P0.shape[1], P1.shape[1], P2.shape[1]
    sizes = np.zeros(3, dtype=np.int64)
    sizes[0], sizes[1], sizes[2] = s0, s1, s2
    Ps = (np.empty(s0), np.empty(s1), np.empty(s2))
    Ns = (np.empty(s0), np.empty(s1), np.empty(s2))
    Ga, Gb, Gc = np.empty(s0), np.empty(s1), np.empty(s2)
    D = np.empty(max(s0, s1, s2, 1))
    ls = np.full(3, NINF)
    gm = np.ones(3)
    work = np.empty(4 * nP + 4)
    for b in range(b0, b1):
        if not active[b]:
            continue
        Xb = _row(X, b)
        Zb, gb, gob, yb = _row(Z, b), _row(gam, b), _row(gopt, b), _row(yl, b)
        wb, mb = _row(w, b), _row(mask, b)
        Pa, Pb, Pc = Ps
        Na, Nb, Nc = Ns
        if wmodel:
            _transpose(P0[b], Pa, d, d)
        else:
            Pa[:] = P0[b]
        Pb[:] = P1[b]
        Pc[:] = P2[b]
        for t in range(t0, t1):
            for k in range(3):
                ls[k] = NINF
            lgap = _trial_grad(ic, fc, Xb, Zb, gb, gob, yb, wb, mb, Wf, Pa, Pb, Pc,
                               Ga, Gb, Gc, gm, ls, KT, WZ, ZQ, A, S, Rr, C, dr, rho, rhov, rlg,
                               acc, tmp)
            nz = False
            for k in range(nP):
                if np.isfinite(ls[k]):
                    nz = True
            if not nz:
                active[b] = 0
                stop_step[b] = t
                stop_code[b] = STOP_ZERO
                break
            flags = _apply_rule(ic, fc, (Pa, Pb, Pc), (Ga, Gb, Gc), gm, sizes, ls, lgap,
                                (Na, Nb, Nc), D, work)
            if not flags & 1:
                active[b] = 0
                stop_step[b] = t
                stop_code[b] = STOP_NONFINITE
                break
            if ic[IC_STALL] and not flags & 2:
                active[b] = 0
                stop_step[b] = t
                stop_code[b] = STOP_NOCHANGE
                break
            Pa, Na = Na, Pa  # the new parameters become the current ones
            Pb, Nb = Nb, Pb
            Pc, Nc = Nc, Pc
        if wmodel:
            _transpose(Pa, P0[b], d, d)
        else:
            P0[b, :] = Pa
        P1[b, :] = Pb
        P2[b, :] = Pc
