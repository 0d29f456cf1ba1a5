"""numba kernels of the fused engine: the scaled gradient of one trial and whole runs of
stateless steps, each trial's working set in cache (imported only when numba is).

The maths is :mod:`attnsvm.models.objective` (fixed and trained linear head) and the
stateless rules of :mod:`attnsvm.optim.rules`, written as loops over one trial. The
formulas follow the torch reference term by term (same anchor, same log-domain scales,
same branches of the losses' stable forms), with one exception: the fixed head's row
factors are evaluated in the linear domain while they are far from underflow and
overflow (PLAIN_MIN, PLAIN_MAX; _row_factors), which saves two log1p and an exp per
row. Only the rounding differs, so the two paths agree to 1e-12 relative
(tests/test_fused.py, also at both switches and far past saturation).
No fastmath: every sum is evaluated in a fixed order, and trials are independent, so a
run gives the same bits for any number of threads. The drivers are serial over a slice
of trials and release the GIL; :mod:`attnsvm.fused` runs slices in a thread pool (no
OpenMP runtime whose spinning threads would slow torch down between calls;
:func:`attnsvm._parallel.thread_pool`).

Structure. A trial's run (_trial_run) is a loop over named steps, each the compiled
counterpart of a step of the torch reference: the forward pass (_query_vectors, _logits,
_softmax_rows), the objective's row terms (_fixed_head_rows, _trained_head_rows,
_log_gap_rows), the gradient (_row_factors, _logit_grads, _token_grads, _param_grads,
_head_grad; together _gradient), the trainer's stop rules (_gradient_stop, _update_stop)
and the rule's step (_apply_rule, _apply_generic: attnsvm.optim's transforms; the
saturation-safe update _step_checked). tests/test_fused_steps.py holds the forward steps,
the stop rules and the rule's step each to its reference on its own, and the gradient
steps together (_gradient, through grad_batch) to model.evaluate.

Layout. Parameters of a trial are flat float64 rows in three slots P0 (B, s0), P1 (B, s1),
P2 (B, s2), in the order of the model's parameter dict: W | K, Q | k, q | p, then the
trained head v (slot 1 after W or p, slot 2 after K, Q or k, q); unused slots have s = 0.
Integer configuration ``ic`` and real hyper-parameters ``fc`` are arrays, so each kernel
compiles once for every model, loss and rule (cached on disk by numba).

Speed. Hot loops index with offsets cast to unsigned (_U), so that numba emits no
negative-index wrap-around (four instructions per load, and it stops LLVM from
vectorising); matrix products go through _vecmat_rows, one call per product.
"""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit

# --------------------------------------------------------------------- codes
from .codes import (  # noqa: E402  (the layout shared with attnsvm.fused)
    DIAG_MODEL,
    EXPONENTIAL,
    FC_C,
    FC_CAP,
    FC_LR,
    FC_MAXLR,
    FC_P,
    FC_Q,
    FC_REG,
    IC_D,
    IC_GLOBAL,
    IC_LOSS,
    IC_LP,
    IC_M,
    IC_MASK,
    IC_MAXLR,
    IC_MODEL,
    IC_N,
    IC_NEEDGAP,
    IC_NORMALIZED,
    IC_NP,
    IC_Q,
    IC_RELATIVE,
    IC_RULE,
    IC_STALL,
    IC_T,
    IC_TRAINED,
    IC_WID,
    KQ_MODEL,
    LOGISTIC,
    LP_FRO,
    LP_GEN,
    LP_INF,
    LP_ONE,
    M_CORR,
    M_GAP,
    M_LOG10_GAP,
    M_LOSS,
    M_NORM,
    M_NORM_HEAD,
    M_NORM_NUC,
    M_PMAX,
    M_PSEL_MEAN,
    M_PSEL_MIN,
    M_SPARSITY,
    PARAM_MAX,
    PROMPT_MODEL,
    R_GD,
    R_NONE,
    R_NSD,
    R_POLYAK,
    RC_ALPHA,
    RC_NREF,
    RC_NUC,
    STOP_NOCHANGE,
    STOP_NONFINITE,
    STOP_ZERO,
    W_MODEL,
)

NINF = -np.inf
_U = np.uint64  # an index cast to unsigned: no negative-index wrap-around in numba
LOG_GAP_SWITCH = -35.0
# the fixed head's row factors lam_r are evaluated in the linear domain while the largest
# lies in [PLAIN_MIN, PLAIN_MAX] (2^-900, 2^900: normal floats with 2^122 to spare), in the
# log domain otherwise (_row_factors)
PLAIN_MIN = 2.0 ** -900
PLAIN_MAX = 2.0 ** 900

# --------------------------------------------------------------- workspaces
# One trial's arrays, grouped by role: namedtuples of arrays (numba types them field by
# field; a field is a plain array inside compiled code). The CPU drivers and the CUDA
# kernel (attnsvm.fused.cuda.segment) build them, each from its own layout; _trial_run and
# _trial_record take them.
#: the trial's data, flat (read only): X (n, T, d) tokens, Z (n, Q, d) queries, gam
#: (n, Q, T) scores with masked keys 0, gopt (n, Q), yl (n, Q) labels, logw (n, Q) log
#: query weights, mask (n, Q, T) uint8 (read when ic[IC_MASK]); Wf (2, d d) the prompt's
#: fixed W (shared by the trials): W^T in row 0, W in row 1 (unused when ic[IC_WID]: W = I)
TrialData = namedtuple("TrialData", "X Z gam gopt yl logw mask Wf")
#: the parameters and their scaled gradient, flat vectors in the slots' layout (tensor k
#: at [so[k], so[k+1]); the W model holds W^T): P the current parameters, N the next (the
#: rule writes them; the two swap), G the gradient (tensor k is G_k / gm[k] times
#: exp(ls[k])), gm and ls (3,)
TrialState = namedtuple("TrialState", "P G N so gm ls")
#: the scratch of one trial's step, in this order everywhere (sizes: scratch_sizes;
#: the CUDA workspace's rows: attnsvm.fused.cuda.workspace_rows)
Scratch = namedtuple("Scratch", "KT WZ ZQ A S Rr C dr rho rhov rlg acc tmp D work XT aux")
#: the in-kernel record (_trial_record): its configuration rc (codes.RC_*), the selected
#: tokens alpha (R,) int64 (read when rc[RC_ALPHA]), the references ref (flat, one W's
#: size each), scratch Wm and U (d d each)
RecordWork = namedtuple("RecordWork", "rc alpha ref Wm U")


# ------------------------------------------------------------ scalar helpers
@njit(cache=True, error_model="numpy")
def _log(x):
    """log with numpy semantics: -inf at 0, nan below."""
    if x > 0.0:
        return math.log(x)
    if x == 0.0:
        return NINF
    return np.nan


@njit(cache=True, error_model="numpy")
def _sign(x):
    """np.sign of a float (+0.0 at both zeros, nan at nan) as a plain function: numba-cuda
    compiles no numpy ufunc on scalars (math.isfinite likewise stands for np.isfinite)."""
    if x > 0.0:
        return 1.0
    if x < 0.0:
        return -1.0
    if x == 0.0:
        return 0.0
    return x


@njit(cache=True, error_model="numpy")
def _softplus(x):
    """torch.nn.functional.softplus (beta 1, threshold 20)."""
    if x > 20.0:
        return x
    return math.log1p(math.exp(x))


@njit(cache=True, error_model="numpy")
def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


@njit(cache=True, error_model="numpy")
def _log_neg_deriv(loss, u):
    """log(-loss'(u)) (attnsvm.losses)."""
    if loss == LOGISTIC:  # logsigmoid(-u) = min(x, 0) - log1p(exp(-|x|)), x = -u
        x = -u
        return min(x, 0.0) - math.log1p(math.exp(-abs(x)))
    if loss == EXPONENTIAL:
        return -u
    return 0.0


@njit(cache=True, error_model="numpy")
def _neg_deriv(loss, u):
    """-loss'(u) in the linear domain: sigmoid(-u) = 1 / (1 + e^u), e^-u, 1 (inf / 0 where
    it leaves float64: the caller then takes _log_neg_deriv)."""
    if loss == LOGISTIC:
        return 1.0 / (1.0 + math.exp(u))
    if loss == EXPONENTIAL:
        return math.exp(-u)
    return 1.0


@njit(cache=True, error_model="numpy")
def _log_s_j(am, x):
    """log s_j = (a_j - a_k) - log1p(x), x = e_j sum r (-inf for a_j = -inf: one key)."""
    if am == NINF:
        return NINF
    return am - math.log1p(x)


@njit(cache=True, error_model="numpy")
def _value(loss, u):
    if loss == LOGISTIC:
        return _softplus(-u)
    if loss == EXPONENTIAL:
        return math.exp(-u)
    return -u


@njit(cache=True, error_model="numpy")
def _log_value(loss, u):
    if loss == LOGISTIC:
        if u > 30.0:
            return -u + math.log1p(-0.5 * math.exp(-u))
        return _log(_softplus(-u))
    if loss == EXPONENTIAL:
        return -u
    return _log(-u)


@njit(cache=True, error_model="numpy")
def _gap(loss, g, D):
    if loss == LOGISTIC:
        return math.log1p(math.expm1(D) * _sigmoid(-g))
    if loss == EXPONENTIAL:
        return math.exp(-g) * math.expm1(D)
    return D


@njit(cache=True, error_model="numpy")
def _log_gap(loss, g, logD, D):
    """attnsvm.losses.log_gap for one entry (D given in the linear domain)."""
    small = logD < LOG_GAP_SWITCH
    if small:
        D = 1.0
    lead = _log_neg_deriv(loss, g)
    direct = _log(_gap(loss, g, D))
    if (not math.isfinite(direct)) and D > 0.0:
        l1 = _log_value(loss, g - D)
        l2 = _log_value(loss, g)
        diff = l1 + math.log1p(-math.exp(l2 - l1))
        near = lead + _log(math.expm1(D))
        if math.isfinite(diff) and D >= 1e-3:
            direct = diff
        else:
            direct = near
    if small:
        return lead + logD
    return direct


@njit(cache=True, error_model="numpy")
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
# x[o : o + k] of a flat array: offsets instead of slices (a slice is a new array object,
# and every array argument of a compiled call costs ~15 ns of marshalling).
@njit(cache=True, error_model="numpy")
def _max_abs(x, o, k):
    """max |x[o:o+k]| (exact in any order; four chains for speed)."""
    m0 = 0.0
    m1 = 0.0
    m2 = 0.0
    m3 = 0.0
    i = 0
    while i + 4 <= k:
        a0 = abs(x[_U(o + i)])
        a1 = abs(x[_U(o + i + 1)])
        a2 = abs(x[_U(o + i + 2)])
        a3 = abs(x[_U(o + i + 3)])
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
        a0 = abs(x[_U(o + i)])
        if a0 > m0:
            m0 = a0
        i += 1
    return max(max(m0, m1), max(m2, m3))


@njit(cache=True, error_model="numpy")
def _sum_sq(x, o, k, inv):
    """sum (x[o:o+k] inv)^2 in a fixed order (eight partial sums)."""
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
        i = o + b * 8
        a0 = x[_U(i)] * inv
        a1 = x[_U(i + 1)] * inv
        a2 = x[_U(i + 2)] * inv
        a3 = x[_U(i + 3)] * inv
        a4 = x[_U(i + 4)] * inv
        a5 = x[_U(i + 5)] * inv
        a6 = x[_U(i + 6)] * inv
        a7 = x[_U(i + 7)] * inv
        s0 += a0 * a0
        s1 += a1 * a1
        s2 += a2 * a2
        s3 += a3 * a3
        s4 += a4 * a4
        s5 += a5 * a5
        s6 += a6 * a6
        s7 += a7 * a7
    for i in range(o + nb * 8, o + k):
        a0 = x[_U(i)] * inv
        s0 += a0 * a0
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@njit(cache=True, error_model="numpy")
def _sum(x, o, k):
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    i = 0
    while i + 4 <= k:
        s0 += x[_U(o + i)]
        s1 += x[_U(o + i + 1)]
        s2 += x[_U(o + i + 2)]
        s3 += x[_U(o + i + 3)]
        i += 4
    while i < k:
        s0 += x[_U(o + i)]
        i += 1
    return (s0 + s1) + (s2 + s3)


@njit(cache=True, error_model="numpy")
def _lp_value(x, o, k, kind, p):
    """||x[o:o+k]|| in an entrywise norm for x with max|x| = 1 (or 0): kind LP_*."""
    if kind == LP_FRO:
        return math.sqrt(_sum_sq(x, o, k, 1.0))
    if kind == LP_INF:
        return _max_abs(x, o, k)
    s = 0.0
    if kind == LP_ONE:
        for i in range(o, o + k):
            s += abs(x[i])
        return s
    for i in range(o, o + k):
        s += abs(x[i]) ** p
    return s ** (1.0 / p)


@njit(cache=True, error_model="numpy")
def _normalize(x, o, k, top):
    """x[o:o+k] /= max|x| in place; returns log max|x| + top (-inf for a zero x)."""
    m = _max_abs(x, o, k)
    if m > 0.0:
        for i in range(o, o + k):
            x[i] = x[i] / m
        return math.log(m) + top
    return NINF


@njit(cache=True, error_model="numpy")
def _scale(x, o, k, top, gm, slot):
    """gm[slot] = max|x[o:o+k]| (1 for a zero x); returns log max|x| + top (-inf for a zero
    x; NaN when x has a NaN or inf entry: an overflow, see _trial_run). x stays raw: the
    scaled tensor of optim.base.Scaled is x / gm[slot]."""
    m = _max_abs(x, o, k)
    if not math.isfinite(m) or not math.isfinite(_sum(x, o, k) * 0.0):
        gm[slot] = 1.0
        return np.nan
    if m > 0.0:
        gm[slot] = m
        return math.log(m) + top
    gm[slot] = 1.0
    return NINF


@njit(cache=True, error_model="numpy")
def _steepest(t, o, k, kind, q, out):
    """out[:k] = the unit steepest direction of t[o:o+k] (max|t| = 1 or 0) for an entrywise
    norm (attnsvm.norms: Frobenius, l_inf sign, l_1 coordinate, l_p; q the dual exponent)."""
    m = _max_abs(t, o, k)
    if m == 0.0:
        for i in range(k):
            out[i] = 0.0
        return
    if kind == LP_FRO:
        n = math.sqrt(_sum_sq(t, o, k, 1.0))
        for i in range(k):
            out[i] = t[o + i] / n
    elif kind == LP_INF:
        for i in range(k):
            out[i] = _sign(t[o + i])
    elif kind == LP_ONE:
        cnt = 0
        for i in range(k):
            if abs(t[o + i]) == m:
                cnt += 1
        for i in range(k):
            out[i] = _sign(t[o + i]) / cnt if abs(t[o + i]) == m else 0.0
    else:
        s = 0.0
        for i in range(k):
            s += abs(t[o + i]) ** q
        nq = s ** (1.0 / q)
        den = nq ** (q - 1.0)
        for i in range(k):
            out[i] = _sign(t[o + i]) * abs(t[o + i]) ** (q - 1.0) / den


@njit(cache=True, error_model="numpy")
def _scaled_add(a, o, la, ga, e, k):
    """(a[o:o+k] / ga e^{la} + e[:k]) in scaled form into a (max|.| = 1); returns its log
    scale (optim.base.Scaled.add: the ridge term of KQ)."""
    le = _normalize(e, 0, k, 0.0)
    L = max(la, le)
    Lf = L if math.isfinite(L) else 0.0
    fa = math.exp(la - Lf)
    fe = math.exp(le - Lf)
    for i in range(k):
        a[o + i] = (a[o + i] / ga) * fa + e[i] * fe
    return _normalize(a, o, k, Lf)


@njit(cache=True, error_model="numpy")
def _vecmat_rows(a, ao, ars, ast, M, mo, mrs, out, oo, ors, R, K, N):
    """Row r < R of out = a_r M_r: out[oo + r ors + j] = sum_t a[ao + r ars + t ast]
    M[mo + r mrs + t N + j] for j < N, t < K (a_r a strided vector, M_r a row-major (K, N)
    matrix; mrs = 0 shares one M). Every sum runs over t in order from 0.0: the bits of
    the plain loop ``out = 0; for t: out += a_t M_t``, whatever the blocking.

    Wide rows (N >= 16): four rows of M per pass over out (``out = (((out + a_0 M_0) +
    a_1 M_1) + a_2 M_2) + a_3 M_3``, the same order), so that out makes one trip through
    memory per four terms and the pass vectorises. Narrow rows: four, two, one columns'
    sums in registers (independent chains; an axpy through memory would wait on its own
    stores). Indices are cast to unsigned (_U): numba then skips its negative-index
    wrap-around, which costs four instructions per load and blocks vectorisation."""
    for r in range(R):
        ar = ao + r * ars
        mr = mo + r * mrs
        orr = oo + r * ors
        if N >= 16:
            for j in range(N):
                out[_U(orr + j)] = 0.0
            t = 0
            while t + 4 <= K:
                a0 = a[_U(ar + t * ast)]
                a1 = a[_U(ar + (t + 1) * ast)]
                a2 = a[_U(ar + (t + 2) * ast)]
                a3 = a[_U(ar + (t + 3) * ast)]
                b0 = mr + t * N
                b1 = b0 + N
                b2 = b1 + N
                b3 = b2 + N
                for j in range(N):
                    out[_U(orr + j)] = (((out[_U(orr + j)] + a0 * M[_U(b0 + j)])
                                         + a1 * M[_U(b1 + j)]) + a2 * M[_U(b2 + j)]) \
                        + a3 * M[_U(b3 + j)]
                t += 4
            while t < K:
                at = a[_U(ar + t * ast)]
                b0 = mr + t * N
                for j in range(N):
                    out[_U(orr + j)] = out[_U(orr + j)] + at * M[_U(b0 + j)]
                t += 1
            continue
        j = 0
        while j + 4 <= N:
            s0 = 0.0
            s1 = 0.0
            s2 = 0.0
            s3 = 0.0
            b = mr + j
            for t in range(K):
                at = a[_U(ar + t * ast)]
                s0 += at * M[_U(b)]
                s1 += at * M[_U(b + 1)]
                s2 += at * M[_U(b + 2)]
                s3 += at * M[_U(b + 3)]
                b += N
            out[_U(orr + j)] = s0
            out[_U(orr + j + 1)] = s1
            out[_U(orr + j + 2)] = s2
            out[_U(orr + j + 3)] = s3
            j += 4
        if j + 2 <= N:
            s0 = 0.0
            s1 = 0.0
            b = mr + j
            for t in range(K):
                at = a[_U(ar + t * ast)]
                s0 += at * M[_U(b)]
                s1 += at * M[_U(b + 1)]
                b += N
            out[_U(orr + j)] = s0
            out[_U(orr + j + 1)] = s1
            j += 2
        if j < N:
            s0 = 0.0
            b = mr + j
            for t in range(K):
                s0 += a[_U(ar + t * ast)] * M[_U(b)]
                b += N
            out[_U(orr + j)] = s0

# ------------------------------------------------------------------ the rules
@njit(cache=True, error_model="numpy")
def _mirror_map(x, p):
    return _sign(x) * abs(x) ** (p - 1.0)


@njit(cache=True, error_model="numpy")
def _inv_mirror_map(x, p):
    return _sign(x) * abs(x) ** (1.0 / (p - 1.0))


@njit(cache=True, error_model="numpy")
def _apply_generic(ic, fc, P, G, N, so, ls, lgap, D, work):
    """N = the step of a stateless rule from P with the scaled gradient (G with max|.| = 1
    per tensor, ls) (attnsvm.optim.rules: gd, nsd / ngd / sign / coordinate in an entrywise
    norm, per tensor or global, relative; polyak; l_p mirror descent, plain or normalised).
    Tensor k is [so[k], so[k+1]); D and work (4 nP) are scratch."""
    rule = ic[IC_RULE]
    nP = ic[IC_NP]
    lr = fc[FC_LR]
    if rule == R_GD:
        for k in range(nP):
            f = math.exp(ls[k])
            for x in range(so[k], so[k + 1]):
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
                ld[k] = _log(_lp_value(G, so[k], so[k + 1] - so[k], dkind, q)) + ls[k]
                ld2[k] = 2.0 * ld[k]
            lt = 0.5 * _logsumexp(ld2, nP)
            for k in range(nP):
                wts[k] = math.exp(ld[k] - lt) if math.isfinite(lt) else 0.0
        step = lr
        if ic[IC_RELATIVE]:
            vals = work[3 * nP:4 * nP]
            for k in range(nP):
                sz = so[k + 1] - so[k]
                mk = _max_abs(P, so[k], sz)
                if mk > 0.0:
                    for x in range(sz):
                        D[x] = P[so[k] + x] / mk
                    vals[k] = mk * _lp_value(D, 0, sz, kind, p)
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
            sz = so[k + 1] - so[k]
            _steepest(G, so[k], sz, kind, q, D)
            s = step * wts[k] if ic[IC_GLOBAL] else step
            for x in range(sz):
                N[so[k] + x] = P[so[k] + x] - s * D[x]
    else:  # mirror
        p = fc[FC_P]
        q = fc[FC_Q]
        for k in range(nP):
            if ic[IC_NORMALIZED]:
                nrm = _lp_value(G, so[k], so[k + 1] - so[k], LP_GEN if q != 2.0 else LP_FRO, q)
                if not nrm > 0.0:
                    nrm = 1.0
                for x in range(so[k], so[k + 1]):
                    N[x] = _inv_mirror_map(_mirror_map(P[x], p) - lr * (G[x] / nrm), p)
            else:
                f = math.exp(ls[k])
                for x in range(so[k], so[k + 1]):
                    N[x] = _inv_mirror_map(_mirror_map(P[x], p) - lr * (G[x] * f), p)


@njit(cache=True, error_model="numpy")
def _step_checked(P, G, N, o, k, c):
    """N = P - c G on [o, o + k); returns flags: 1 all finite, 2 some entry changed,
    4 some |N| > 1e300."""
    chg = False
    fin = True
    big = False
    for x in range(o, o + k):
        px = P[_U(x)]
        v = px - c * G[_U(x)]
        N[_U(x)] = v
        chg |= v != px
        fin &= (v - v) == 0.0
        big |= abs(v) > 1e300
    return (1 if fin else 0) | (2 if chg else 0) | (4 if big else 0)


@njit(cache=True, error_model="numpy")
def _checked(P, N, o, k):
    """The flags of _step_checked for an N computed elsewhere."""
    chg = False
    fin = True
    big = False
    for x in range(o, o + k):
        v = N[x]
        chg |= v != P[x]
        fin &= (v - v) == 0.0
        big |= abs(v) > 1e300
    return (1 if fin else 0) | (2 if chg else 0) | (4 if big else 0)


@njit(cache=True, error_model="numpy")
def _param_norm(P, so, nP, vals):
    """||P||_F over every tensor of a trial (scale-safe; attnsvm.optim.transforms._param_norm)."""
    mm = 0.0
    for k in range(nP):
        mk = _max_abs(P, so[k], so[k + 1] - so[k])
        vals[k] = mk * math.sqrt(_sum_sq(P, so[k], so[k + 1] - so[k], 1.0 / mk)) if mk > 0.0 else 0.0
        if vals[k] > mm:
            mm = vals[k]
    if not mm > 0.0:
        return 0.0
    s2 = 0.0
    for k in range(nP):
        s2 += (vals[k] / mm) ** 2
    return mm * math.sqrt(s2)


@njit(cache=True, error_model="numpy")
def _apply_rule(ic, fc, P, G, N, so, gm, ls, lgap, D, work):
    """N = the rule's step from P with the scaled gradient (G / gm per tensor, ls); returns
    1 (every entry finite: the trainer's test) | 2 (some entry changed) | 4 (Polyak's
    range cap was taken). GD, per-tensor
    NGD and Polyak step from the raw G (one norm pass, one update pass); the other rules
    divide G by gm first (_apply_generic). G may be overwritten."""
    rule = ic[IC_RULE]
    nP = ic[IC_NP]
    lr = fc[FC_LR]
    fin = 1
    chg = 0
    big = 0
    cap = 0
    fast_nsd = rule == R_NSD and ic[IC_LP] == LP_FRO and ic[IC_GLOBAL] == 0 \
        and ic[IC_RELATIVE] == 0
    if rule == R_GD or fast_nsd:
        for k in range(nP):
            sz = so[k + 1] - so[k]
            c = 0.0
            if ls[k] > NINF:
                inv = 1.0 / gm[k]
                if rule == R_GD:
                    c = lr * (math.exp(ls[k]) * inv)
                else:
                    c = lr * (inv / math.sqrt(_sum_sq(G, so[k], sz, inv)))
            f = _step_checked(P, G, N, so[k], sz, c)
            fin &= f & 1
            chg |= (f >> 1) & 1
            big |= (f >> 2) & 1
    elif rule == R_POLYAK:
        # attnsvm.optim.transforms.scale_by_polyak: a step of length l along G / ||G||,
        # log l = log c + log(L - L*) - log||G||, with the range cap at PARAM_MAX
        logs = work[0:nP]
        for k in range(nP):
            sz = so[k + 1] - so[k]
            logs[k] = 2.0 * (0.5 * _log(_sum_sq(G, so[k], sz, 1.0 / gm[k])) + ls[k])
        lg = 0.5 * _logsumexp(logs, nP)
        lr_ = math.log(fc[FC_C]) + lgap - lg
        if ic[IC_MAXLR]:
            lr_ = min(lr_, math.log(fc[FC_MAXLR]) + lg)
        pn = _param_norm(P, so, nP, work[nP:2 * nP])
        if lr_ > _log(max(PARAM_MAX - pn, 0.0)) and math.isfinite(lg):  # the range cap
            lr_ = _log(fc[FC_CAP] * max(pn, 1.0))
            cap = 1
        for k in range(nP):
            if cap:  # |lr_| << |ls[k]|, |lg| there: the difference first
                fk = math.exp(lr_ + (ls[k] - lg))
            else:
                fk = math.exp(lr_ + ls[k] - lg)
            if not (math.isfinite(lg) and math.isfinite(lr_)):
                fk = 0.0
            f = _step_checked(P, G, N, so[k], so[k + 1] - so[k], fk / gm[k])
            fin &= f & 1
            chg |= (f >> 1) & 1
            big |= (f >> 2) & 1
        if cap:  # a capped step ending past PARAM_MAX is scaled back onto it
            nn = _param_norm(N, so, nP, work[nP:2 * nP])
            if nn > PARAM_MAX:
                sc = PARAM_MAX / nn
                for x in range(so[0], so[nP]):
                    N[x] = N[x] * sc
    else:
        for k in range(nP):
            inv = 1.0 / gm[k]
            for x in range(so[k], so[k + 1]):
                G[x] = G[x] * inv
        _apply_generic(ic, fc, P, G, N, so, ls, lgap, D, work)
        for k in range(nP):
            f = _checked(P, N, so[k], so[k + 1] - so[k])
            fin &= f & 1
            chg |= (f >> 1) & 1
            big |= (f >> 2) & 1
    if fin and big:  # some |entry| > 1e300: the trainer's test, a finite sum of entries
        tot = 0.0
        for k in range(nP):
            tot += _sum(N, so[k], so[k + 1] - so[k])
        fin = 1 if math.isfinite(tot) else 0
    return fin | (chg << 1) | (cap << 2)


# ------------------------------------------------------------ one trial's gradient
#: the named steps of a trial's run: inlined into _trial_run at numba's IR level (a call
#: would pass each array as seven words and count a reference to it), and callable on their
#: own (from Python too: tests/test_fused_steps.py)
_STEP = dict(cache=True, error_model="numpy", inline="always")

# The scaled gradient of one trial in named steps, each the compiled counterpart of a
# step of the torch reference (attnsvm.models.objective, docs/theory.md §8):
#   _query_vectors  W z_r           (model.W applied to the queries)
#   _logits         a_rt             (model._logits)
#   _softmax_rows   anchored softmax (attention.softmax_terms)
#   _fixed_head_rows / _trained_head_rows   the loss terms of the rows (u_r, -loss'(u_r), gaps)
#   _row_factors    lam_r / max lam  (the scaled form: optim.base.Scaled)
#   _logit_grads    dL/da_rt         (times exp(-top))
#   _token_grads    GX_r = sum_t dL/da_rt x_it
#   _param_grads    dL/dW, dK, dQ, dk, dq, dp (+ the ridge term), _head_grad dL/dv
# tests/test_fused_steps.py holds the forward steps to their references on their own and
# the gradient as a whole to model.evaluate; whole runs are held to the torch engine in
# tests/test_fused.py.
# aux blocks (R each): u_r | a_j - a_k | x = e_j sum r | w_r (the query weights, linear) |
# the anchor k | e_j / (1 + x)
@njit(**_STEP)
def _trial_setup(X, logw, XT, aux, n, T, d, R):
    """Once per trial: aux[3R + r] = w_r = exp(log w_r) for the R query rows, and XT
    (n, d, T) = X (n, T, d) transposed, so that the logits run over contiguous tokens."""
    for r in range(R):
        aux[_U(3 * R + r)] = math.exp(logw[_U(r)])
    for i in range(n):  # XT[i, j, t] = X[i, t, j]
        for t in range(T):
            xo = (i * T + t) * d
            for j in range(d):
                XT[_U(i * d * T + j * T + t)] = X[_U(xo + j)]


@njit(**_STEP)
def _query_vectors(ic, Z, P, Wf, o1, KT, ZQ, WZ, acc):
    """WZ (R, d) = (W z)_r for every query row r, W the model's effective matrix
    (attnsvm.models.params): W (P holds W^T: W z = sum_l z_l (row l of W^T)); K Q^T
    (ZQ (R, m) = Q^T z_r, then sum_c ZQ_rc (row c of K^T), KT scratch); diag(k q) z;
    the prompt's W_fixed p (the same for every row; W = I when ic[IC_WID]). o1: offset of
    the second tensor in P (Q, q)."""
    model = ic[IC_MODEL]
    R = ic[IC_N] * ic[IC_Q]
    d = ic[IC_D]
    m = ic[IC_M]
    if model == W_MODEL:  # W z_r = sum_l z_rl (row l of W^T)
        _vecmat_rows(Z, 0, d, 1, P, 0, 0, WZ, 0, d, R, d, d)
    elif model == KQ_MODEL:  # K (Q^T z_r): ZQ (R, m), then sum_c ZQ_rc (row c of K^T)
        for j in range(d):
            for c in range(m):
                KT[_U(c * d + j)] = P[_U(j * m + c)]
        _vecmat_rows(Z, 0, d, 1, P, o1, 0, ZQ, 0, m, R, d, m)
        _vecmat_rows(ZQ, 0, m, 1, KT, 0, 0, WZ, 0, d, R, m, d)
    elif model == DIAG_MODEL:
        for r in range(R):
            zo = r * d
            for j in range(d):
                WZ[_U(zo + j)] = Z[_U(zo + j)] * (P[_U(j)] * P[_U(o1 + j)])
    else:  # prompt: W p, the same for every row
        if ic[IC_WID]:
            for j in range(d):
                acc[j] = P[j]
        else:
            for j in range(d):
                acc[j] = 0.0
            for l in range(d):  # W p = sum_l p_l (row l of W^T)
                pl = P[l]
                base = l * d
                for j in range(d):
                    acc[j] += pl * Wf[0, base + j]
        for r in range(R):
            for j in range(d):
                WZ[_U(r * d + j)] = acc[_U(j)]


@njit(**_STEP)
def _logits(ic, WZ, XT, mask, A):
    """A (R, T): a_rt = x_it . (W z)_r = sum_j (W z)_rj XT[i, j, t] (over j in order),
    -inf at masked keys (ic[IC_MASK]; mask (R, T) uint8); returns whether some logit is
    +inf or NaN (the parameters left float64: the trainer's overflow test)."""
    n = ic[IC_N]
    Qn = ic[IC_Q]
    T = ic[IC_T]
    d = ic[IC_D]
    R = n * Qn
    if Qn == 1:
        _vecmat_rows(WZ, 0, d, 1, XT, 0, d * T, A, 0, T, R, d, T)
    else:
        for i in range(n):
            _vecmat_rows(WZ, i * Qn * d, d, 1, XT, i * d * T, 0, A, i * Qn * T, T, Qn, d, T)
    if ic[IC_MASK]:
        for x in range(R * T):
            if mask[_U(x)] == 0:
                A[_U(x)] = NINF
    for x in range(R * T):
        ax = A[_U(x)]
        if ax != ax or ax == np.inf:
            return True
    return False


@njit(**_STEP)
def _softmax_rows(A, R, T, Rr, S, aux):
    """The softmax of every row a = A[r T : (r + 1) T] around its anchor k (the first
    maximiser), with a_j the largest other key (attnsvm.models.attention.softmax_terms,
    one exp per key): r_t = exp(a_t - a_j) (r_k = 0) into Rr, e_j = exp(a_j - a_k),
    x = e_j sum r, s_t = r_t e_j / (1 + x) (t != k), s_k = 1 / (1 + x) into S; exact where
    e_j underflows (then s_t = 0 off the anchor); one admissible key: r = 0, s = e_k.
    Per row into aux: k (block 4), a_j - a_k (1), x (2), e_j / (1 + x) (5); then
    log s_j = (a_j - a_k) - log1p(x) (_log_s_j)."""
    for r in range(R):
        ro = r * T
        k = 0
        mx = A[_U(ro)]
        aj = NINF
        for t in range(1, T):
            at = A[_U(ro + t)]
            if at > mx:
                aj = mx
                mx = at
                k = t
            elif at > aj:
                aj = at
        eM = 0.0  # exp(M) = e_j / (1 + e_j sum r)
        x = 0.0
        if aj == NINF:  # the anchor is the only admissible key
            for t in range(T):
                Rr[_U(ro + t)] = 0.0
                S[_U(ro + t)] = 0.0
            S[_U(ro + k)] = 1.0
        else:
            sr = 0.0
            for t in range(T):
                e = math.exp(A[_U(ro + t)] - aj)
                if t == k:
                    e = 0.0
                Rr[_U(ro + t)] = e
                sr += e
            ej = math.exp(aj - mx)
            x = ej * sr
            eM = ej / (1.0 + x)
            for t in range(T):
                S[_U(ro + t)] = Rr[_U(ro + t)] * eM
            S[_U(ro + k)] = 1.0 / (1.0 + x)
        aux[_U(4 * R + r)] = k
        aux[_U(R + r)] = aj - mx
        aux[_U(2 * R + r)] = x
        aux[_U(5 * R + r)] = eM


@njit(**_STEP)
def _fixed_head_rows(ic, gam, gopt, logw, Rr, C, dr, aux, rho, rlg):
    """The loss terms of every row with the fixed head (scores gamma;
    attnsvm.models.objective): c_t = gamma_k - gamma_t into C, dr_r = sum_t r_t c_t, the
    margin deficit D = (gopt - gamma_k) + s_j dr_r, u_r = gopt - D (the row's output, into
    aux block 0), the row factor lam_r = w_r (-loss'(u_r)) s_j in the linear domain (into
    rho); with ic[IC_NEEDGAP], rlg[r] = log w_r + log(loss(u_r) - loss(gopt))
    (attnsvm.losses.log_gap). Returns vtop = max_r lam_r (nan when some lam_r is not
    finite or exceeds PLAIN_MAX: _row_factors then takes the log domain)."""
    R = ic[IC_N] * ic[IC_Q]
    T = ic[IC_T]
    loss = ic[IC_LOSS]
    need_gap = ic[IC_NEEDGAP]
    vtop = 0.0
    for r in range(R):
        ro = r * T
        k = int(aux[_U(4 * R + r)])
        eM = aux[_U(5 * R + r)]
        gk = gam[_U(ro + k)]
        s_ = 0.0
        for t in range(T):
            c = gk - gam[_U(ro + t)]
            C[_U(ro + t)] = c
            s_ += Rr[_U(ro + t)] * c
        dr[_U(r)] = s_
        go = gopt[_U(r)]
        D = (go - gk) + eM * s_
        u = go - D
        aux[_U(r)] = u
        lam = (aux[_U(3 * R + r)] * _neg_deriv(loss, u)) * eM
        rho[_U(r)] = lam
        if not lam <= PLAIN_MAX:  # nan, inf or too large: the log domain
            vtop = np.nan
        elif lam > vtop:
            vtop = lam
        if need_gap:
            M = _log_s_j(aux[_U(R + r)], aux[_U(2 * R + r)])
            logD = M + _log(s_) if gk >= go else _log(D)
            rlg[_U(r)] = logw[_U(r)] + _log_gap(loss, go, logD, D)
    return vtop


@njit(**_STEP)
def _trained_head_rows(ic, P, ov, XT, mask, yl, logw, acc, Rr, C, dr, aux, rho, rhov, rlg):
    """The loss terms of every row with a trained head v (P[ov : ov + d]): c_t = v . x_t
    (into acc), c_t - c_k into C (0 at masked keys), dr_r = sum_t r_t (c_t - c_k), the
    output u_r = y_r (c_k + s_j dr_r), rhov[r] = log w_r + log(-loss'(u_r)) (-inf for
    NaN), rho[r] = rhov[r] + log s_j (log lam_r); with ic[IC_NEEDGAP], rlg[r] =
    log w_r + log loss(u_r)."""
    Qn = ic[IC_Q]
    R = ic[IC_N] * Qn
    T = ic[IC_T]
    d = ic[IC_D]
    loss = ic[IC_LOSS]
    hasmask = ic[IC_MASK]
    need_gap = ic[IC_NEEDGAP]
    for r in range(R):
        ro = r * T
        k = int(aux[_U(4 * R + r)])
        eM = aux[_U(5 * R + r)]
        lw = logw[_U(r)]
        # c_t = v . x_t
        _vecmat_rows(P, ov, 0, 1, XT, (r // Qn) * d * T, 0, acc, 0, 0, 1, d, T)
        ck = acc[_U(k)]
        s_ = 0.0
        for t in range(T):
            cd = acc[_U(t)] - ck
            if hasmask and mask[_U(ro + t)] == 0:
                cd = 0.0
            C[_U(ro + t)] = cd
            s_ += Rr[_U(ro + t)] * cd
        dr[_U(r)] = s_
        u = yl[_U(r)] * (ck + eM * s_)
        aux[_U(r)] = u  # the row's output, as the fixed head keeps it (_trial_record)
        rv = lw + _log_neg_deriv(loss, u)
        rhov[_U(r)] = rv if rv == rv else NINF
        rho[_U(r)] = rv + _log_s_j(aux[_U(R + r)], aux[_U(2 * R + r)])
        if need_gap:
            rlg[_U(r)] = lw + _log_value(loss, u)


@njit(**_STEP)
def _log_gap_rows(rlg, R):
    """log(L - L*) = logsumexp_r rlg[r] (NaN rows count as -inf; attnsvm.losses.log_gap
    summed over rows with their weights)."""
    for r in range(R):
        if rlg[r] != rlg[r]:
            rlg[r] = NINF
    return _logsumexp(rlg, R)


@njit(**_STEP)
def _row_factors(ic, vtop, logw, aux, rho):
    """rho[r] = lam_r / max_r lam_r in place; returns top = log max_r lam_r (the scale of
    the gradient: optim.base.Scaled).

    Fixed head: lam_r = w_r (-loss'(u_r)) s_j,r (the gradient is dL/da_rt = -lam_r
    (s_t dr_r - r_t c_rt)). Two regimes, per step: while the largest lam_r lies in
    [PLAIN_MIN, PLAIN_MAX] (far from underflow and overflow), rho holds lam_r in the
    linear domain (_fixed_head_rows) and lam_r / max lam divides; otherwise (the softmax or
    the loss saturated: the plain lam underflows) log lam_r = log w_r + log(-loss'(u_r))
    + log s_j,r in the log domain and exp(log lam_r - top), as the torch reference does.
    Both give the same numbers to rounding: in the linear regime a row whose lam_r
    underflows weighs < 2^-122 next to the largest (it underflows in exp(log lam_r - top)
    as well). Trained head: rho holds log lam_r already (_trained_head_rows)."""
    R = ic[IC_N] * ic[IC_Q]
    trained = ic[IC_TRAINED]
    if trained == 0 and vtop >= PLAIN_MIN:  # linear (False for nan)
        for r in range(R):
            rho[_U(r)] = rho[_U(r)] / vtop
        return math.log(vtop)
    if trained == 0:  # log lam_r
        loss = ic[IC_LOSS]
        for r in range(R):
            u = aux[_U(r)]
            rho[_U(r)] = logw[_U(r)] + _log_neg_deriv(loss, u) \
                + _log_s_j(aux[_U(R + r)], aux[_U(2 * R + r)])
    top = NINF
    for r in range(R):
        if rho[r] != rho[r]:
            rho[r] = NINF
        if rho[r] > top:
            top = rho[r]
    topf = top if math.isfinite(top) else 0.0
    for r in range(R):
        rho[_U(r)] = math.exp(rho[_U(r)] - topf)
    return top


@njit(**_STEP)
def _logit_grads(ic, rho, dr, S, Rr, C, yl, A):
    """A (R, T) = dL/da_rt / exp(top): -rho_r (s_t dr_r - r_t c_rt) (fixed head),
    -y_r rho_r (r_t c_rt - s_t dr_r) (trained head); NaN (0 * inf) entries are 0."""
    R = ic[IC_N] * ic[IC_Q]
    T = ic[IC_T]
    for r in range(R):
        ro = r * T
        fac = rho[_U(r)]
        sdr = dr[_U(r)]
        if ic[IC_TRAINED] == 0:
            for t in range(T):
                g = -fac * (S[_U(ro + t)] * sdr - Rr[_U(ro + t)] * C[_U(ro + t)])
                A[_U(ro + t)] = g if g == g else 0.0
        else:
            f = -yl[_U(r)] * fac
            for t in range(T):
                g = f * (Rr[_U(ro + t)] * C[_U(ro + t)] - S[_U(ro + t)] * sdr)
                A[_U(ro + t)] = g if g == g else 0.0


@njit(**_STEP)
def _token_grads(ic, A, X, GX):
    """GX (R, d): GX_r = sum_t (dL/da)_rt x_it (sums over t in order)."""
    n = ic[IC_N]
    Qn = ic[IC_Q]
    T = ic[IC_T]
    d = ic[IC_D]
    if Qn == 1:  # R = n rows
        _vecmat_rows(A, 0, T, 1, X, 0, T * d, GX, 0, d, n, T, d)
    else:
        for i in range(n):
            _vecmat_rows(A, i * Qn * T, T, 1, X, i * T * d, 0, GX, i * Qn * d, d, Qn, T, d)


@njit(**_STEP)
def _param_grads(ic, fc, GX, Z, P, Wf, o1, G, ZQ, acc, tmp, gm, ls, top):
    """The parameters' gradients from GX (raw, times exp(top)) into G (same layout as P),
    with gm[k] = max|G_k| and ls[k] = log max|G_k| + top (_scale): W: G_W^T = sum_r z_r
    GX_r^T; KQ: dK = G_W Q, dQ = G_W^T K (+ 2 reg K, 2 reg Q: the ridge, _scaled_add);
    diag: dk = g q, dq = g k with g_j = sum_r GX_rj z_rj; prompt: dp = W^T sum_r GX_r."""
    model = ic[IC_MODEL]
    R = ic[IC_N] * ic[IC_Q]
    d = ic[IC_D]
    m = ic[IC_M]
    if model == W_MODEL:  # G_W^T = sum_r z_r GX_r^T: row l = sum_r z_rl GX_r
        _vecmat_rows(Z, 0, 1, d, GX, 0, 0, G, 0, d, d, R, d)
        ls[0] = _scale(G, 0, d * d, top, gm, 0)
    elif model == KQ_MODEL:
        # dK = G_W Q: row j = sum_r GX_rj (Q^T z_r); dQ = G_W^T K: row l = sum_r z_rl (K^T GX_r)
        _vecmat_rows(GX, 0, 1, d, ZQ, 0, 0, G, 0, m, d, R, m)
        _vecmat_rows(GX, 0, d, 1, P, 0, 0, ZQ, 0, m, R, d, m)  # K^T GX_r into ZQ
        _vecmat_rows(Z, 0, 1, d, ZQ, 0, 0, G, o1, m, d, R, m)
        ls[0] = _scale(G, 0, d * m, top, gm, 0)
        ls[1] = _scale(G, o1, d * m, top, gm, 1)
        reg = fc[FC_REG]
        if reg != 0.0:
            for x in range(d * m):
                tmp[x] = 2.0 * reg * P[x]
            ls[0] = _scaled_add(G, 0, ls[0], gm[0], tmp, d * m)
            for x in range(d * m):
                tmp[x] = 2.0 * reg * P[o1 + x]
            ls[1] = _scaled_add(G, o1, ls[1], gm[1], tmp, d * m)
            gm[0] = 1.0
            gm[1] = 1.0
    elif model == DIAG_MODEL:  # g_j = sum_r GX_rj z_rj; dk = g q, dq = g k
        for j in range(d):
            acc[j] = 0.0
        for r in range(R):
            base = r * d
            for j in range(d):
                acc[_U(j)] += GX[_U(base + j)] * Z[_U(base + j)]
        for j in range(d):
            G[j] = acc[j] * P[o1 + j]
            G[o1 + j] = acc[j] * P[j]
        ls[0] = _scale(G, 0, d, top, gm, 0)
        ls[1] = _scale(G, o1, d, top, gm, 1)
    else:  # prompt: dp = W^T g = sum_l g_l (row l of W), g = sum_r GX_r
        for j in range(d):
            acc[j] = 0.0
        for r in range(R):
            base = r * d
            for j in range(d):
                acc[_U(j)] += GX[_U(base + j)]
        if ic[IC_WID]:
            for j in range(d):
                G[j] = acc[j]
        else:
            for j in range(d):
                G[j] = 0.0
            for l in range(d):
                g = acc[l]
                base = l * d
                for j in range(d):
                    G[j] += g * Wf[1, base + j]
        ls[0] = _scale(G, 0, d, top, gm, 0)


@njit(**_STEP)
def _head_grad(ic, rhov, yl, S, X, ov, na, G, acc, gm, ls):
    """The trained head's gradient dv = sum_it (sum_q -y_iq lam_iq s_iqt) x_it, scaled by
    max_r rho_v into G[ov : ov + d] (tensor na; gm[na], ls[na] as _scale)."""
    n = ic[IC_N]
    Qn = ic[IC_Q]
    T = ic[IC_T]
    d = ic[IC_D]
    R = n * Qn
    topv = NINF
    for r in range(R):
        if rhov[r] > topv:
            topv = rhov[r]
    topvf = topv if math.isfinite(topv) else 0.0
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
                acc[_U(j)] += s_ * X[_U(base + j)]
    for j in range(d):
        G[ov + j] = acc[j]
    ls[na] = _scale(G, ov, d, topv, gm, na)


@njit(**_STEP)
def _gradient(ic, fc, dt, P, st, ws):
    """The scaled gradient of one trial (data dt: TrialData) at P into st (TrialState: G,
    gm, ls; the compiled model.evaluate, stable form): tensor k of the gradient is
    G_k / gm[k] times exp(ls[k]); returns (overflow, log(L - L*))
    (the gap nan unless ic[IC_NEEDGAP]). overflow: a logit is +inf or NaN (the
    parameters left float64); then ls = nan and nothing else is computed. The named steps:
    see the comment above _trial_setup. ws: Scratch (WZ receives GX)."""
    X, Z, gam, gopt, yl, logw, mask, Wf = dt
    G, so, gm, ls = st.G, st.so, st.gm, st.ls
    KT, WZ, ZQ, A, S, Rr, C, dr, rho, rhov, rlg, acc, tmp, _D, _work, XT, aux = ws
    model = ic[IC_MODEL]
    na = 2 if (model == KQ_MODEL or model == DIAG_MODEL) else 1  # slot of the head v
    o1 = so[1]  # offset of the second tensor (K, Q / k, q)
    ov = so[na]  # offset of the head v
    for k in range(3):
        ls[k] = NINF
    _query_vectors(ic, Z, P, Wf, o1, KT, ZQ, WZ, acc)
    if _logits(ic, WZ, XT, mask, A):
        for k in range(3):
            ls[k] = np.nan
        return True, np.nan
    R = ic[IC_N] * ic[IC_Q]
    _softmax_rows(A, R, ic[IC_T], Rr, S, aux)
    vtop = 0.0
    if ic[IC_TRAINED] == 0:
        vtop = _fixed_head_rows(ic, gam, gopt, logw, Rr, C, dr, aux, rho, rlg)
    else:
        _trained_head_rows(ic, P, ov, XT, mask, yl, logw, acc, Rr, C, dr, aux, rho, rhov, rlg)
    lgap = np.nan
    if ic[IC_NEEDGAP]:
        lgap = _log_gap_rows(rlg, R)
    top = _row_factors(ic, vtop, logw, aux, rho)
    _logit_grads(ic, rho, dr, S, Rr, C, yl, A)
    _token_grads(ic, A, X, WZ)
    _param_grads(ic, fc, WZ, Z, P, Wf, o1, G, ZQ, acc, tmp, gm, ls, top)
    if ic[IC_TRAINED]:
        _head_grad(ic, rhov, yl, S, X, ov, na, G, acc, gm, ls)
    return False, lgap


@njit(**_STEP)
def _gradient_stop(ls, nP):
    """Why the trainer stops a trial at this gradient (log scales ls of its nP tensors):
    STOP_NONFINITE when some scale is NaN or +inf (the last step overflowed the
    objective), STOP_ZERO when every tensor is exactly 0, else 0."""
    for k in range(nP):
        if ls[k] != ls[k] or ls[k] == np.inf:
            return STOP_NONFINITE
    for k in range(nP):
        if math.isfinite(ls[k]):
            return 0
    return STOP_ZERO


@njit(**_STEP)
def _update_stop(flags, stall):
    """Why the trainer refuses an update with _apply_rule's ``flags``: STOP_NONFINITE (a
    parameter is not finite), STOP_NOCHANGE (``stall`` and no parameter changed), else 0."""
    if not flags & 1:
        return STOP_NONFINITE
    if stall and not flags & 2:
        return STOP_NOCHANGE
    return 0


# ------------------------------------------------------------ one trial's run
# _nrt=False: compiled without reference counting. _trial_run allocates nothing (its
# scratch comes from the drivers) and only borrows arrays that outlive it; with counting,
# every array argument of every inlined step costs an atomic increment and decrement per
# call, ~30% of a small step (W model, (n, T, d) = (6, 8, 10)).
@njit(cache=True, error_model="numpy", _nrt=False)
def _trial_run(ic, fc, dt, st, ws, out, t0, t1):
    """Steps t0 .. t1-1 of one trial (with ic[IC_RULE] == R_NONE: the gradient at st.P only):
    per step the scaled gradient (_gradient), the trainer's checks (_gradient_stop), the
    rule's step (_apply_rule) and its checks (_update_stop).

    The trial's arrays by role: dt (TrialData) its data, st (TrialState) the parameters
    P, one flat vector, tensor k at [so[k], so[k+1]) (the W model holds W^T: every product
    runs over contiguous rows), the gradient G and the next parameters N (same layout),
    and the gradient's scales gm, ls; ws (Scratch): XT (n, d, T) receives X transposed,
    aux (6 R) the row terms (_softmax_rows).

    Per step (the trainer's semantics, attnsvm.steppers.TorchStepper): a zero gradient
    stops the trial (code 1) before the update; an update with a non-finite parameter
    (code 2) or, if ic[IC_STALL], that leaves every parameter bit-identical (code 3) stops
    it and is not applied; a gradient that overflowed (the last step left float64) undoes
    that step and stops the trial at it (code 2).
    out[0] = the stop step (-1: ran to t1), out[1] = the code, out[2] = log(L - L*) of
    the last gradient (nan unless ic[IC_NEEDGAP]), out[3] = the number of steps that took
    Polyak's range cap. st.P holds the parameters on return."""
    nP = ic[IC_NP]
    P, G, N, so, gm, ls = st
    _trial_setup(dt.X, dt.logw, ws.XT, ws.aux, ic[IC_N], ic[IC_T], ic[IC_D], ic[IC_N] * ic[IC_Q])
    out[0] = -1.0
    out[1] = 0.0
    out[3] = 0.0
    lgap = np.nan
    swapped = False
    for step in range(t0, t1):
        ovf, lg = _gradient(ic, fc, dt, P, st, ws)
        if not ovf:
            lgap = lg
        if ic[IC_RULE] == R_NONE:
            break
        code = _gradient_stop(ls, nP)
        if code == STOP_NONFINITE:  # the last step overflowed the objective: undo it
            if step > t0:
                P, N = N, P  # N still holds the parameters before that step
                swapped = not swapped
            out[0] = max(step - 1, 0)
            out[1] = STOP_NONFINITE
            break
        if code == STOP_ZERO:
            out[0] = step
            out[1] = STOP_ZERO
            break
        flags = _apply_rule(ic, fc, P, G, N, so, gm, ls, lgap, ws.D, ws.work)
        code = _update_stop(flags, ic[IC_STALL])
        if code != 0:
            out[0] = step
            out[1] = code
            break
        if flags & 4:  # Polyak's range cap was taken (and the step applied)
            out[3] += 1.0
        P, N = N, P  # the new parameters become the current ones
        swapped = not swapped
    if swapped:  # the caller's P buffer (now named N) receives the current parameters
        for x in range(so[3]):
            N[x] = P[x]
    out[2] = lgap


# ------------------------------------------------------------ one trial's record
# The metrics of attnsvm.recorder at one trial's parameters, computed inside the kernel so
# that a run is one segment whatever its record stride (attnsvm.steppers.FusedStepper).
# Like _trial_run: no allocation, no exception, scratch and outputs passed in (CUDA-safe).
LN10 = math.log(10.0)


@njit(cache=True, error_model="numpy")
def _fro_value(x, o, k):
    """||x[o:o+k]||_F, scale-safe as attnsvm.norms.FRO.value: m sqrt(sum (x / m)^2) with
    m = max|x| (0 for a zero x; NaN when x has a NaN, inf when it has an inf)."""
    bad = 0.0
    for i in range(o, o + k):
        v = x[i]
        if v != v:
            return np.nan
        if v == np.inf or v == NINF:
            bad = np.inf
    if bad > 0.0:
        return bad
    m = _max_abs(x, o, k)
    if m > 0.0:
        return m * math.sqrt(_sum_sq(x, o, k, 1.0 / m))
    return 0.0


@njit(cache=True, error_model="numpy")
def _correlation(a, ao, b, bo, k):
    """<A, B> / (||A||_F ||B||_F) of a[ao:ao+k] and b[bo:bo+k], on A / max|A| and
    B / max|B| (attnsvm.metrics.correlation: NaN where A or B is 0)."""
    ma = _max_abs(a, ao, k)
    mb = _max_abs(b, bo, k)
    if not ma > 0.0:
        ma = 1.0
    if not mb > 0.0:
        mb = 1.0
    num = 0.0
    sa = 0.0
    sb = 0.0
    for i in range(k):
        x = a[ao + i] / ma
        y = b[bo + i] / mb
        num += x * y
        sa += x * x
        sb += y * y
    return num / (math.sqrt(sa) * math.sqrt(sb))


@njit(cache=True, error_model="numpy")
def _nuclear(Wm, d, U):
    """||W||_* = sum of the singular values of W (d, d) (row-major in Wm): one-sided Jacobi
    (Hestenes) on the rows of W / max|W| in U (d d scratch), rotated until every pair is
    orthogonal to working precision; the singular values are then the row norms (high
    relative accuracy: every value to a few ulps of ||W||, as torch.linalg.svdvals)."""
    dd = d * d
    nrm = _fro_value(Wm, 0, dd)
    if not np.isfinite(nrm):
        return nrm
    m = _max_abs(Wm, 0, dd)
    if not m > 0.0:
        return 0.0
    for i in range(dd):
        U[i] = Wm[i] / m
    for _sweep in range(60):
        rotated = False
        for p in range(d - 1):
            for q in range(p + 1, d):
                a = 0.0
                b = 0.0
                g = 0.0
                for j in range(d):
                    up = U[p * d + j]
                    uq = U[q * d + j]
                    a += up * up
                    b += uq * uq
                    g += up * uq
                if g == 0.0 or abs(g) <= 2.2e-16 * math.sqrt(a * b):
                    continue
                rotated = True
                zeta = (b - a) / (2.0 * g)
                t = 1.0 / (abs(zeta) + math.sqrt(1.0 + zeta * zeta))
                if zeta < 0.0:
                    t = -t
                c = 1.0 / math.sqrt(1.0 + t * t)
                sn = c * t
                for j in range(d):
                    up = U[p * d + j]
                    uq = U[q * d + j]
                    U[p * d + j] = c * up - sn * uq
                    U[q * d + j] = sn * up + c * uq
        if not rotated:
            break
    tot = 0.0
    for p in range(d):
        tot += math.sqrt(_sum_sq(U, p * d, d, 1.0))
    return m * tot


@njit(cache=True, error_model="numpy", _nrt=False)
def _trial_record(ic, dt, P, so, ws, rw, rec):
    """The default metrics of attnsvm.recorder at one trial's parameters P (layout of
    _trial_run) into rec (M_CORR + rc[RC_NREF],): the risk L, L - L* and log10(L - L*) of
    the stable objective (as model.evaluate(grad=False): fixed head L = sum_r w_r
    loss(gopt_r) + exp(log gap), trained head L = sum_r w_r loss(u_r) = the gap), ||W||_F,
    ||W||_* (rc[RC_NUC]; else NaN), ||v||_F (trained head; else NaN), with s = softmax(a)
    per query row: p_sel_mean / p_sel_min of s at the tokens alpha (R,) (rc[RC_ALPHA];
    else NaN), the mean over rows of max_t s_t and of 1 / sum_t s_t^2, and corr(W, R_j)
    for the rc[RC_NREF] references in ref (flat, one W's size each). ic must ask for the
    gap (ic[IC_NEEDGAP] = 1). dt, ws as _trial_run's; rw (RecordWork) holds rc, alpha,
    ref and the scratch Wm, U."""
    X, Z, gam, gopt, yl, logw, mask, Wf = dt
    KT, WZ, ZQ, A, S, Rr, C, dr, rho, rhov, rlg, acc, _tmp, _D, _work, XT, aux = ws
    rc, alpha, ref, Wm, U = rw
    model = ic[IC_MODEL]
    n = ic[IC_N]
    Qn = ic[IC_Q]
    T = ic[IC_T]
    d = ic[IC_D]
    R = n * Qn
    loss = ic[IC_LOSS]
    trained = ic[IC_TRAINED]
    na = 2 if (model == KQ_MODEL or model == DIAG_MODEL) else 1
    o1 = so[1]
    ov = so[na]
    _trial_setup(X, logw, XT, aux, n, T, d, R)
    _query_vectors(ic, Z, P, Wf, o1, KT, ZQ, WZ, acc)
    _logits(ic, WZ, XT, mask, A)
    _softmax_rows(A, R, T, Rr, S, aux)
    if trained == 0:
        _fixed_head_rows(ic, gam, gopt, logw, Rr, C, dr, aux, rho, rlg)
    else:
        _trained_head_rows(ic, P, ov, XT, mask, yl, logw, acc, Rr, C, dr, aux, rho, rhov, rlg)
    lg = _log_gap_rows(rlg, R)
    L = 0.0
    if trained == 0:
        for r in range(R):
            L += aux[3 * R + r] * _value(loss, gopt[r])
        gap = math.exp(lg)
        L = L + gap
    else:
        for r in range(R):
            L += aux[3 * R + r] * _value(loss, aux[r])
        gap = L
    rec[M_LOSS] = L
    rec[M_GAP] = gap
    rec[M_LOG10_GAP] = lg / LN10
    # the softmax s = softmax(a) of every row (as torch.softmax): e_t = exp(a_t - max a)
    # into C, s_t = e_t / sum e
    has_alpha = rc[RC_ALPHA]
    psum = 0.0
    pmin = np.inf
    pmax = 0.0
    spars = 0.0
    for r in range(R):
        ro = r * T
        mx = A[ro]
        for t in range(1, T):
            if A[ro + t] > mx:
                mx = A[ro + t]
        se = 0.0
        for t in range(T):
            e = math.exp(A[ro + t] - mx)
            C[ro + t] = e
            se += e
        top = 0.0
        sq = 0.0
        for t in range(T):
            st = C[ro + t] / se
            C[ro + t] = st
            if st > top or st != st:
                top = st
            sq += st * st
        pmax += top
        spars += 1.0 / sq
        if has_alpha:
            ps = C[ro + alpha[r]]
            psum += ps
            if ps < pmin or ps != ps:
                pmin = ps
    rec[M_PSEL_MEAN] = psum / R if has_alpha else np.nan
    rec[M_PSEL_MIN] = pmin if has_alpha else np.nan
    rec[M_PMAX] = pmax / R
    rec[M_SPARSITY] = spars / R
    # the norms and the correlations of W (the prompt: p)
    if model == PROMPT_MODEL:
        wsz = d
        for j in range(d):
            Wm[j] = P[j]
    else:
        wsz = d * d
        if model == W_MODEL:  # P holds W^T
            for i in range(d):
                for j in range(d):
                    Wm[i * d + j] = P[j * d + i]
        elif model == KQ_MODEL:  # W = K Q^T, K and Q (d, m) row-major
            m = ic[IC_M]
            for i in range(d):
                for j in range(d):
                    s_ = 0.0
                    for c in range(m):
                        s_ += P[i * m + c] * P[o1 + j * m + c]
                    Wm[i * d + j] = s_
        else:  # diag(k q)
            for x in range(wsz):
                Wm[x] = 0.0
            for i in range(d):
                Wm[i * d + i] = P[i] * P[o1 + i]
    rec[M_NORM] = _fro_value(Wm, 0, wsz)
    rec[M_NORM_NUC] = _nuclear(Wm, d, U) if rc[RC_NUC] else np.nan
    rec[M_NORM_HEAD] = _fro_value(P, ov, d) if trained else np.nan
    for j in range(rc[RC_NREF]):
        rec[M_CORR + j] = _correlation(Wm, 0, ref, j * wsz, wsz)


# ------------------------------------------------------------------- drivers
@njit(cache=True, error_model="numpy")
def _transpose(src, so_, dst, do, rows, cols):
    """dst[do:] (cols, rows) = src[so_:] (rows, cols)^T, flat."""
    for a in range(rows):
        for b in range(cols):
            dst[do + b * rows + a] = src[so_ + a * cols + b]


@njit(cache=True, error_model="numpy")
def _row(A, b):
    """Row b of a batched (B, k) array, or row 0 of a shared (1, k) one."""
    return A[0] if A.shape[0] == 1 else A[b]


@njit(cache=True, error_model="numpy")
def scratch_sizes(ic, sP):
    """The sizes (17,) of the Scratch arrays of one trial (sP parameters), in its order:
    the one statement of the layout (the CPU drivers' _scratch, the CUDA workspace)."""
    n, Qn, T, d, m = ic[IC_N], ic[IC_Q], ic[IC_T], ic[IC_D], ic[IC_M]
    R = n * Qn
    big = max(d * max(d, m), R, T, 1)
    return np.array([max(m, 1) * d, R * d, R * max(m, 1), R * T, R * T, R * T, R * T, R, R,
                     R, R, max(R * max(d, m), T, 1), big, max(sP, 1), 4 * ic[IC_NP] + 4,
                     n * T * d, 6 * R], dtype=np.int64)


@njit(cache=True, error_model="numpy")
def _scratch(ic, sP):
    """A Scratch of fresh arrays (scratch_sizes)."""
    z = scratch_sizes(ic, sP)
    return Scratch(np.empty(z[0]), np.empty(z[1]), np.empty(z[2]), np.empty(z[3]),
                   np.empty(z[4]), np.empty(z[5]), np.empty(z[6]), np.empty(z[7]),
                   np.empty(z[8]), np.empty(z[9]), np.empty(z[10]), np.empty(z[11]),
                   np.empty(z[12]), np.empty(z[13]), np.empty(z[14]), np.empty(z[15]),
                   np.empty(z[16]))


@njit(cache=True, error_model="numpy")
def _state(so):
    """A TrialState of fresh arrays for parameters in the slots' layout so."""
    sP = so[3]
    return TrialState(np.empty(sP), np.empty(sP), np.empty(sP), so, np.ones(3), np.full(3, NINF))


@njit(cache=True, error_model="numpy")
def _data(X, Z, gam, gopt, yl, w, mask, Wf, b):
    """The TrialData of trial b (row b of each batched array, row 0 of a shared one)."""
    return TrialData(_row(X, b), _row(Z, b), _row(gam, b), _row(gopt, b), _row(yl, b),
                     _row(w, b), _row(mask, b), Wf)


@njit(cache=True, error_model="numpy")
def _load(ic, P0, P1, P2, b, P, so):
    """The trial's parameters into the flat vector P (the W model's W as W^T)."""
    if ic[IC_MODEL] == W_MODEL:
        _transpose(P0[b], 0, P, 0, ic[IC_D], ic[IC_D])
    else:
        P[0:so[1]] = P0[b]
    P[so[1]:so[2]] = P1[b]
    P[so[2]:so[3]] = P2[b]


@njit(cache=True, error_model="numpy")
def _store(ic, P, so, P0, P1, P2, b):
    if ic[IC_MODEL] == W_MODEL:
        _transpose(P, 0, P0[b], 0, ic[IC_D], ic[IC_D])
    else:
        P0[b, :] = P[0:so[1]]
    P1[b, :] = P[so[1]:so[2]]
    P2[b, :] = P[so[2]:so[3]]


@njit(cache=True, error_model="numpy")
def _slots(P0, P1, P2):
    so = np.zeros(4, dtype=np.int64)
    so[1] = P0.shape[1]
    so[2] = so[1] + P1.shape[1]
    so[3] = so[2] + P2.shape[1]
    return so


@njit(nogil=True, cache=True, error_model="numpy")
def grad_batch(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, G0, G1, G2, LS, LG, b0, b1):
    """Scaled gradients of trials b0 .. b1-1: G0..G2 (B, s) in the parameters' own layout
    (G_W, not its transpose) with max|.| = 1, LS (B, 3) log scales, LG (B,) log gaps.
    Data arrays are flat per trial: X (Bx, n T d), Z (Bz, n Q d), gam (Bx, n Q T), gopt /
    yl / w (log query weights) (., n Q), mask (Bm, n Q T); Wf (2, d d). ic[IC_RULE] must
    be R_NONE."""
    so = _slots(P0, P1, P2)
    ws, st, out = _scratch(ic, so[3]), _state(so), np.zeros(4)
    P, G, gm, ls = st.P, st.G, st.gm, st.ls
    for b in range(b0, b1):
        _load(ic, P0, P1, P2, b, P, so)
        _trial_run(ic, fc, _data(X, Z, gam, gopt, yl, w, mask, Wf, b), st, ws, out, 0, 1)
        for k in range(3):  # the scaled form: max|.| = 1
            LS[b, k] = ls[k]
            inv = 1.0 / gm[k]
            for x in range(so[k], so[k + 1]):
                G[x] = G[x] * inv
        if ic[IC_MODEL] == W_MODEL:
            _transpose(G, 0, G0[b], 0, ic[IC_D], ic[IC_D])  # G_W^T -> G_W
        else:
            G0[b, :] = G[0:so[1]]
        G1[b, :] = G[so[1]:so[2]]
        G2[b, :] = G[so[2]:so[3]]
        LG[b] = out[2]


@njit(nogil=True, cache=True, error_model="numpy")
def run_steps(ic, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, t0, t1,
              active, stop_step, stop_code, capped, b0, b1):
    """Steps t0 .. t1-1 of a stateless rule for every active trial among b0 .. b1-1, in
    place on P0..P2 (the caller runs slices in threads: the kernel releases the GIL);
    active / stop_step / stop_code are updated and capped (B,) counts the steps that
    took Polyak's range cap (see _trial_run)."""
    so = _slots(P0, P1, P2)
    ws, st, out = _scratch(ic, so[3]), _state(so), np.zeros(4)
    for b in range(b0, b1):
        if not active[b]:
            continue
        _load(ic, P0, P1, P2, b, st.P, so)
        _trial_run(ic, fc, _data(X, Z, gam, gopt, yl, w, mask, Wf, b), st, ws, out, t0, t1)
        _store(ic, st.P, so, P0, P1, P2, b)
        capped[b] += out[3]
        if out[0] >= 0:
            active[b] = 0
            stop_step[b] = int(out[0])
            stop_code[b] = int(out[1])


@njit(nogil=True, cache=True, error_model="numpy")
def run_steps_rec(ic, icr, fc, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, t0, t1, every,
                  active, stop_step, stop_code, capped, alpha, ref, rc, RM, b0, b1):
    """run_steps with the metric records inside: for every active trial among b0 .. b1-1,
    the record at each step t in [t0, t1) with t % every == 0 (at the parameters of step t,
    before its update: _trial_record with icr, ic asking for the gap) into RM[b, t // every]
    (B, n_records, n_metrics), then the steps up to the next record (_trial_run). One call
    runs a trial's whole run: its tokens stay in cache from record to record. alpha
    (Ba, R) int64 (Ba = 1 or B; read when rc[RC_ALPHA]), ref (Br, n_ref W sizes) (Br = 1
    or B). A trial that stops is not recorded after it (the caller fills its later
    records with its final one)."""
    so = _slots(P0, P1, P2)
    ws, st, out = _scratch(ic, so[3]), _state(so), np.zeros(4)
    P = st.P
    d = ic[IC_D]
    Wm, U = np.empty(d * d), np.empty(d * d)
    for b in range(b0, b1):
        if not active[b]:
            continue
        _load(ic, P0, P1, P2, b, P, so)
        dt = _data(X, Z, gam, gopt, yl, w, mask, Wf, b)
        rw = RecordWork(rc, _row(alpha, b), _row(ref, b), Wm, U)
        t = t0
        while t < t1:
            if t % every == 0:
                _trial_record(icr, dt, P, so, ws, rw, RM[b, t // every])
            te = min(t1, (t // every + 1) * every)
            _trial_run(ic, fc, dt, st, ws, out, t, te)
            capped[b] += out[3]
            if out[0] >= 0:
                active[b] = 0
                stop_step[b] = int(out[0])
                stop_code[b] = int(out[1])
                break
            t = te
        _store(ic, P, so, P0, P1, P2, b)


@njit(nogil=True, cache=True, error_model="numpy")
def record_batch(icr, X, Z, gam, gopt, yl, w, mask, Wf, P0, P1, P2, alpha, ref, rc, RM, b0, b1):
    """The record (_trial_record) of trials b0 .. b1-1 at their current parameters into
    RM[b] (B, n_metrics)."""
    so = _slots(P0, P1, P2)
    ws = _scratch(icr, so[3])
    P = np.empty(so[3])
    d = icr[IC_D]
    Wm, U = np.empty(d * d), np.empty(d * d)
    for b in range(b0, b1):
        _load(icr, P0, P1, P2, b, P, so)
        _trial_record(icr, _data(X, Z, gam, gopt, yl, w, mask, Wf, b), P, so, ws,
                      RecordWork(rc, _row(alpha, b), _row(ref, b), Wm, U), RM[b])
