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
IC_MAXLR, IC_NEEDGAP, IC_SIZE = 16, 17, 18
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
def _scaled_add(a, la, e, k):
    """(a e^{la} + e) in scaled form into a (max|a| = 1); returns its log scale
    (optim.base.Scaled.add: the ridge term of KQ)."""
    le = _normalize(e, k, 0.0)
    L = max(la, le)
    Lf = L if np.isfinite(L) else 0.0
    fa = math.exp(la - Lf)
    fe = math.exp(le - Lf)
    for i in range(k):
        a[i] = a[i] * fa + e[i] * fe
    return _normalize(a, k, Lf)


# ------------------------------------------------------------- the gradient
@njit(cache=True)
def _trial_grad(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2,
                G0, G1, G2, ls, WT, WZ, A, S, Rr, C, dr, Mr, rho, rhov, kk, GX, ZQ, tmp):
    """Scaled gradient of one trial: G0..G2 (max|.| = 1 or 0), ls[0..2] log scales;
    returns log(L - L*) (nan unless ic[IC_NEEDGAP]).

    X (n, T, d), Z (n, Q, d) queries, gam (n, Q, T) scores with masked keys 0, gopt
    (n, Q), yl (n, Q) labels, w (n, Q) query weights, mask (n, Q, T) uint8 (read when
    ic[IC_MASK]), Wf (d, d) fixed prompt W; the rest is scratch."""
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

    # ---- W z for every query row: WZ (R, d)
    if model == W_MODEL:
        for j in range(d):
            for l in range(d):
                WT[l * d + j] = P0[j * d + l]
        for r in range(R):
            i = r // Qn
            q = r % Qn
            for j in range(d):
                WZ[r, j] = 0.0
            for l in range(d):
                zl = Z[i, q, l]
                for j in range(d):
                    WZ[r, j] += zl * WT[l * d + j]
    elif model == KQ_MODEL:  # (z Q) K^T
        for j in range(d):
            for c in range(m):
                WT[c * d + j] = P0[j * m + c]  # K^T (m, d)
        for r in range(R):
            i = r // Qn
            q = r % Qn
            for c in range(m):
                ZQ[r, c] = 0.0
            for l in range(d):
                zl = Z[i, q, l]
                for c in range(m):
                    ZQ[r, c] += zl * P1[l * m + c]
            for j in range(d):
                WZ[r, j] = 0.0
            for c in range(m):
                zc = ZQ[r, c]
                for j in range(d):
                    WZ[r, j] += zc * WT[c * d + j]
    elif model == DIAG_MODEL:
        for r in range(R):
            i = r // Qn
            q = r % Qn
            for j in range(d):
                WZ[r, j] = Z[i, q, j] * (P0[j] * P1[j])
    else:  # prompt: W p, the same for every row
        for j in range(d):
            tmp[j] = 0.0
        for l in range(d):
            pl = P0[l]
            for j in range(d):
                tmp[j] += pl * Wf[j, l]
        for r in range(R):
            for j in range(d):
                WZ[r, j] = tmp[j]

    # ---- logits, anchor, softmax around the anchor, per row
    for r in range(R):
        i = r // Qn
        q = r % Qn
        for t in range(T):
            A[r, t] = 0.0
        for j in range(d):
            wj = WZ[r, j]
            for t in range(T):
                A[r, t] += X[i, t, j] * wj
        if hasmask:
            for t in range(T):
                if mask[i, q, t] == 0:
                    A[r, t] = NINF
        # anchor k: the first maximiser; j: the largest other key. With a_j the runner-up,
        # r_t = exp(a_t - a_j) (t != k), s_t = r_t e_j / (1 + e_j sum r), e_j = exp(a_j - a_k),
        # M = log s_j = (a_j - a_k) - log1p(e_j sum r): the softmax of attention.softmax_terms
        # with one exp per key (exact where e_j underflows: then s_t = 0 and M = a_j - a_k).
        k = 0
        mx = A[r, 0]
        for t in range(1, T):
            if A[r, t] > mx:
                mx = A[r, t]
                k = t
        aj = NINF
        for t in range(T):
            if t != k and A[r, t] > aj:
                aj = A[r, t]
        if aj == NINF:  # the anchor is the only admissible key
            M = NINF
            for t in range(T):
                Rr[r, t] = 0.0
                S[r, t] = 0.0
            S[r, k] = 1.0
        else:
            sr = 0.0
            for t in range(T):
                if t == k:
                    Rr[r, t] = 0.0
                else:
                    e = math.exp(A[r, t] - aj)
                    Rr[r, t] = e
                    sr += e
            ej = math.exp(aj - mx)
            x = ej * sr
            lse = math.log1p(x)
            M = (aj - mx) - lse
            f = ej / (1.0 + x)
            for t in range(T):
                S[r, t] = Rr[r, t] * f
            S[r, k] = 1.0 / (1.0 + x)
        kk[r] = k
        Mr[r] = M
        eM = math.exp(M)
        if trained == 0:
            gk = gam[i, q, k]
            s_ = 0.0
            for t in range(T):
                c = gk - gam[i, q, t]
                C[r, t] = c
                s_ += Rr[r, t] * c
            dr[r] = s_
            go = gopt[i, q]
            D = (go - gk) + eM * s_
            u = go - D
            rho[r] = _log(w[i, q]) + _log_neg_deriv(loss, u) + M
            if need_gap:
                if gk >= go:
                    logD = M + _log(s_)
                else:
                    logD = _log(D)
                x = _log(w[i, q]) + _log_gap(loss, go, logD, D)
                A[r, 0] = x  # logits are no longer needed: keep the row's log gap
        else:
            ck = 0.0
            for j in range(d):
                ck += X[i, k, j] * Pv[j]
            s_ = 0.0
            for t in range(T):
                ct = 0.0
                for j in range(d):
                    ct += X[i, t, j] * Pv[j]
                cd = ct - ck
                if hasmask and mask[i, q, t] == 0:
                    cd = 0.0
                C[r, t] = cd
                s_ += Rr[r, t] * cd
            dr[r] = s_
            u = yl[i, q] * (ck + eM * s_)
            rv = _log(w[i, q]) + _log_neg_deriv(loss, u)
            rhov[r] = rv if rv == rv else NINF
            rho[r] = rv + M
            if need_gap:
                A[r, 0] = _log(w[i, q]) + _log_value(loss, u)
    lgap = np.nan
    if need_gap:
        for r in range(R):
            tmp[r] = A[r, 0] if A[r, 0] == A[r, 0] else NINF
        lgap = _logsumexp(tmp, R)

    # ---- row factors exp(rho - max rho) and dL/da (scaled) into A
    top = NINF
    for r in range(R):
        if rho[r] != rho[r]:
            rho[r] = NINF
        if rho[r] > top:
            top = rho[r]
    topf = top if np.isfinite(top) else 0.0
    for r in range(R):
        i = r // Qn
        q = r % Qn
        fac = math.exp(rho[r] - topf)
        sdr = dr[r]
        if trained == 0:
            for t in range(T):
                g = -fac * (S[r, t] * sdr - Rr[r, t] * C[r, t])
                A[r, t] = g if g == g else 0.0
        else:
            f = -yl[i, q] * fac
            for t in range(T):
                g = f * (Rr[r, t] * C[r, t] - S[r, t] * sdr)
                A[r, t] = g if g == g else 0.0
    # GX_r = sum_t Ga_rt x_it  (R, d)
    for r in range(R):
        i = r // Qn
        for j in range(d):
            GX[r, j] = 0.0
        for t in range(T):
            g = A[r, t]
            for j in range(d):
                GX[r, j] += g * X[i, t, j]

    # ---- parameter gradients (raw, times exp(top))
    if model == W_MODEL:  # G_W = sum_r GX_r z_r^T
        for j in range(d):
            for l in range(d):
                G0[j * d + l] = 0.0
            for r in range(R):
                i = r // Qn
                q = r % Qn
                g = GX[r, j]
                for l in range(d):
                    G0[j * d + l] += g * Z[i, q, l]
        ls[0] = _normalize(G0, d * d, top)
    elif model == KQ_MODEL:  # dK = G_W Q = sum_r GX_r (Q^T z_r)^T, dQ = G_W^T K = sum_r z_r (K^T GX_r)^T
        for j in range(d):
            for c in range(m):
                G0[j * m + c] = 0.0
            for r in range(R):
                g = GX[r, j]
                for c in range(m):
                    G0[j * m + c] += g * ZQ[r, c]
        for r in range(R):  # K^T GX_r into ZQ (the z Q rows are used above)
            for c in range(m):
                ZQ[r, c] = 0.0
            for j in range(d):
                g = GX[r, j]
                for c in range(m):
                    ZQ[r, c] += g * P0[j * m + c]
        for l in range(d):
            for c in range(m):
                G1[l * m + c] = 0.0
            for r in range(R):
                i = r // Qn
                q = r % Qn
                zl = Z[i, q, l]
                for c in range(m):
                    G1[l * m + c] += zl * ZQ[r, c]
        ls[0] = _normalize(G0, d * m, top)
        ls[1] = _normalize(G1, d * m, top)
        reg = fc[FC_REG]
        if reg != 0.0:
            for x in range(d * m):
                tmp[x] = 2.0 * reg * P0[x]
            ls[0] = _scaled_add(G0, ls[0], tmp, d * m)
            for x in range(d * m):
                tmp[x] = 2.0 * reg * P1[x]
            ls[1] = _scaled_add(G1, ls[1], tmp, d * m)
    elif model == DIAG_MODEL:  # g_j = sum_r GX_rj z_rj; dk = g q, dq = g k
        for j in range(d):
            g = 0.0
            for r in range(R):
                i = r // Qn
                q = r % Qn
                g += GX[r, j] * Z[i, q, j]
            G0[j] = g * P1[j]
            G1[j] = g * P0[j]
        ls[0] = _normalize(G0, d, top)
        ls[1] = _normalize(G1, d, top)
    else:  # prompt: dp = W_f^T sum_r GX_r
        for j in range(d):
            tmp[j] = 0.0
        for r in range(R):
            for j in range(d):
                tmp[j] += GX[r, j]
        for j in range(d):
            G0[j] = 0.0
        for l in range(d):
            g = tmp[l]
            for j in range(d):
                G0[j] += g * Wf[l, j]
        ls[0] = _normalize(G0, d, top)

    # ---- trained head: dv = sum_it (sum_q lam_iq s_iqt) x_it (scaled by max rho_v)
    if trained:
        topv = NINF
        for r in range(R):
            if rhov[r] > topv:
                topv = rhov[r]
        topvf = topv if np.isfinite(topv) else 0.0
        for j in range(d):
            Gv[j] = 0.0
        for i in range(n):
            for t in range(T):
                s_ = 0.0
                for q in range(Qn):
                    r = i * Qn + q
                    s_ += -yl[i, q] * math.exp(rhov[r] - topvf) * S[r, t]
                if s_ != s_:
                    s_ = 0.0
                for j in range(d):
                    Gv[j] += s_ * X[i, t, j]
        ls[na] = _normalize(Gv, d, topv)
    return lgap


# ------------------------------------------------------------------ the rules
@njit(cache=True)
def _mirror_map(x, p):
    return np.sign(x) * abs(x) ** (p - 1.0)


@njit(cache=True)
def _inv_mirror_map(x, p):
    return np.sign(x) * abs(x) ** (1.0 / (p - 1.0))


@njit(cache=True)
def _apply_rule(ic, fc, Ps, Gs, sizes, ls, lgap, Ns, D):
    """New parameters Ns[k] from the scaled gradient (Gs[k], ls[k]) of a stateless rule
    (attnsvm.optim.rules: gd, nsd / ngd / sign / coordinate in an entrywise norm, per
    tensor or global, relative; polyak; l_p mirror descent, plain or normalised)."""
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
        wts = np.ones(nP)
        if ic[IC_GLOBAL]:
            # dual norm of each tensor, log ||G_k||_* ; weights exp(ld_k - lt)
            dkind = LP_FRO if kind == LP_FRO else (LP_ONE if kind == LP_INF else
                                                   (LP_INF if kind == LP_ONE else LP_GEN))
            ld = np.empty(nP)
            ld2 = np.empty(nP)
            for k in range(nP):
                ld[k] = _log(_lp_value(Gs[k], sizes[k], dkind, q)) + ls[k]
                ld2[k] = 2.0 * ld[k]
            lt = 0.5 * _logsumexp(ld2, nP)
            for k in range(nP):
                wts[k] = math.exp(ld[k] - lt) if np.isfinite(lt) else 0.0
        step = lr
        if ic[IC_RELATIVE]:
            vals = np.empty(nP)
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
        logs = np.empty(nP)
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


# ------------------------------------------------------------------- drivers
@njit(cache=True)
def _bx(A, b):
    return A[0] if A.shape[0] == 1 else A[b]


@njit(nogil=True, cache=True)
def grad_batch(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, G0, G1, G2, LS, LG, b0, b1):
    """Scaled gradients of trials b0 .. b1-1: G0..G2 (B, s), LS (B, 3), LG (B,) log gaps."""
    n, Qn, T, d, m = ic[IC_N], ic[IC_Q], ic[IC_T], ic[IC_D], ic[IC_M]
    R = n * Qn
    big = max(d * d, d * m, R, d)
    for b in range(b0, b1):
        ls = np.full(3, NINF)
        WT = np.empty(big)
        WZ = np.empty((R, d))
        A = np.empty((R, T))
        S = np.empty((R, T))
        Rr = np.empty((R, T))
        C = np.empty((R, T))
        dr = np.empty(R)
        Mr = np.empty(R)
        rho = np.empty(R)
        rhov = np.empty(R)
        kk = np.empty(R, dtype=np.int64)
        GX = np.empty((R, d))
        ZQ = np.empty((R, max(m, 1)))
        tmp = np.empty(big)
        LG[b] = _trial_grad(ic, fc, _bx(X, b), _bx(Z, b), _bx(gam, b), _bx(gopt, b), _bx(yl, b),
                            _bx(w, b), _bx(mask, b), Wf, P0[b], P1[b], P2[b], G0[b], G1[b], G2[b],
                            ls, WT, WZ, A, S, Rr, C, dr, Mr, rho, rhov, kk, GX, ZQ, tmp)
        for k in range(3):
            LS[b, k] = ls[k]


@njit(nogil=True, cache=True)
def run_steps(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, t0, t1,
              active, stop_step, stop_code, b0, b1):
    """Steps t0 .. t1-1 of a stateless rule for every active trial, in place on P0..P2.

    Per trial and step (the trainer's semantics): the scaled gradient; a zero gradient
    stops the trial (code 1) before the update; an update with a non-finite sum of
    parameters (code 2) or, if ic[IC_STALL], that leaves every parameter bit-identical
    (code 3) stops it and is not applied. active / stop_step / stop_code are updated.
    Trials b0 .. b1-1 (the caller runs slices in threads: the kernel releases the GIL)."""
    n, Qn, T, d, m = ic[IC_N], ic[IC_Q], ic[IC_T], ic[IC_D], ic[IC_M]
    nP = ic[IC_NP]
    R = n * Qn
    big = max(d * d, d * m, R, d)
    for b in range(b0, b1):
        if not active[b]:
            continue
        sizes = np.zeros(3, dtype=np.int64)
        sizes[0] = P0.shape[1]
        sizes[1] = P1.shape[1]
        sizes[2] = P2.shape[1]
        # the parameter tensors in dict order (the head v last)
        Pa = P0[b].copy()
        Pb = P1[b].copy()
        Pc = P2[b].copy()
        Ga = np.empty(sizes[0])
        Gb = np.empty(sizes[1])
        Gc = np.empty(sizes[2])
        Na = np.empty(sizes[0])
        Nb = np.empty(sizes[1])
        Nc = np.empty(sizes[2])
        D = np.empty(max(sizes[0], max(sizes[1], sizes[2])))
        Ps = (Pa, Pb, Pc)
        Gs = (Ga, Gb, Gc)
        Ns = (Na, Nb, Nc)
        ls = np.full(3, NINF)
        WT = np.empty(big)
        WZ = np.empty((R, d))
        A = np.empty((R, T))
        S = np.empty((R, T))
        Rr = np.empty((R, T))
        C = np.empty((R, T))
        dr = np.empty(R)
        Mr = np.empty(R)
        rho = np.empty(R)
        rhov = np.empty(R)
        kk = np.empty(R, dtype=np.int64)
        GX = np.empty((R, d))
        ZQ = np.empty((R, max(m, 1)))
        tmp = np.empty(big)
        Xb, Zb, gb, gob, yb = _bx(X, b), _bx(Z, b), _bx(gam, b), _bx(gopt, b), _bx(yl, b)
        wb, mb = _bx(w, b), _bx(mask, b)
        for t in range(t0, t1):
            for k in range(3):
                ls[k] = NINF
            lgap = _trial_grad(ic, fc, Xb, Zb, gb, gob, yb, wb, mb, Wf, Pa, Pb, Pc, Ga, Gb, Gc,
                               ls, WT, WZ, A, S, Rr, C, dr, Mr, rho, rhov, kk, GX, ZQ, tmp)
            nz = False
            for k in range(nP):
                if np.isfinite(ls[k]):
                    nz = True
            if not nz:
                active[b] = 0
                stop_step[b] = t
                stop_code[b] = STOP_ZERO
                break
            _apply_rule(ic, fc, Ps, Gs, sizes, ls, lgap, Ns, D)
            tot = 0.0
            for k in range(nP):
                tot += _sum(Ns[k], sizes[k])
            if not np.isfinite(tot):
                active[b] = 0
                stop_step[b] = t
                stop_code[b] = STOP_NONFINITE
                break
            if ic[IC_STALL]:
                same = True
                for k in range(nP):
                    P, N = Ps[k], Ns[k]
                    for x in range(sizes[k]):
                        if N[x] != P[x]:
                            same = False
                            break
                    if not same:
                        break
                if same:
                    active[b] = 0
                    stop_step[b] = t
                    stop_code[b] = STOP_NOCHANGE
                    break
            for k in range(nP):
                P, N = Ps[k], Ns[k]
                for x in range(sizes[k]):
                    P[x] = N[x]
        P0[b, :] = Pa
        P1[b, :] = Pb
        P2[b, :] = Pc
