"""The risk, its gap L - L* and its gradient, exact far past saturation (docs/theory.md §3, §4, §8).

    L = sum_iq w_iq loss(y_iq f_iq),   w_iq = 1 / (n Q) (or the valid queries' share)

Three objectives, chosen by the head:

* fixed linear head v (L* = sum w loss(gamma_opt) > 0): with the anchor k = argmax_t a_t,
  c_t = gamma_k - gamma_t, delta = sum_t s_t c_t and D = (gamma_opt - gamma_k) + delta >= 0,
  u = gamma_opt - D = y f and

      L - L* = sum_iq w_iq gap(gamma_opt, D),      dL/da_t = w loss'(u) s_t (delta - c_t);

* trained linear head (L* = 0): c_t = v^T x_t, cd_t = c_t - c_k, delta = sum_t s_t cd_t,
  f = c_k + delta, u = y f, lam = w loss'(u) y and

      dL/da_t = lam s_t (cd_t - delta),            dL/dv = sum_iq lam X_i^T s_iq;

* any other head: autograd of L with the anchored pooling U = x_k + sum_{t != k} s_t (x_t - x_k).

Scaled form. With s_t = exp(M) r_t off the anchor (:func:`~attnsvm.models.attention.softmax_terms`)
delta = exp(M) delta_r and every entry of row iq of dL/da is

      w loss'(u) exp(M) (s_t delta_r - r_t c_t)    [fixed head]
      lam exp(M) (r_t cd_t - s_t delta_r)          [trained head],

so the gradient is returned as :class:`~attnsvm.optim.Scaled`: O(1) tensors times
exp(log scale) with log scale = max_iq (log w + log(-loss'(u)) + M) [+ the chain rule's
max], computed in the log domain. Likewise log(L - L*) = logsumexp_iq (log w +
log gap(gamma_opt, D)) with log D = M + log delta_r once the anchor is the optimal token.
Nothing underflows: a run of 10^5 normalised steps keeps an exact direction.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from attnsvm.losses import log_gap, log_neg_deriv, log_value
from attnsvm.optim.base import Scaled

from .attention import SoftmaxTerms, pool_anchored

__all__ = ["Objective", "fixed_linear", "trained_linear", "autograd_head", "softmax_terms",
           "row_factors", "scaled_grads"]

NEG_INF = float("-inf")
_SMALL = 1 << 12  # a tensor of at most this many entries: ops cost their call, not their pass


def softmax_terms(a: torch.Tensor) -> SoftmaxTerms:
    """:func:`attention.softmax_terms` in fewer full-size ops and one exp per key: with the
    anchor k (first maximiser, logit a_k) and the runner-up a_j,

        r_t = exp(a_t - a_j) (t != k), e_j = exp(a_j - a_k), x = e_j sum_t r_t,
        M = (a_j - a_k) - log1p(x),  exp(M) = e_j / (1 + x),  s = exp(M) r, s_k = 1 / (1 + x)

    (the same quantities: log s_t - M = a_t - a_j exactly in real arithmetic). Where e_j
    underflows, exp(M) = 0 and s = 0 off the anchor while r and M stay exact. A row whose
    anchor is the only admissible key has M = -inf, r = 0, s = e_k. A row whose largest logit
    overflowed (+inf or NaN) gets M = NaN, so the trainer sees the overflow."""
    mx, k = (a.detach() if a.requires_grad else a).max(-1, keepdim=True)
    if a.requires_grad:
        mx = a.gather(-1, k)  # with autograd: the logit itself (the same value)
    off = a.scatter(-1, k, NEG_INF)
    aj = off.amax(-1, keepdim=True)
    dj = aj - mx
    # every a_j and a_k finite (the usual case): no wheres. The sum of dj <= 0 is finite iff
    # every dj is (a sum that overflowed only takes the general branch: the same values);
    # one reduction and one read (isfinite is four ops)
    if math.isfinite((dj if dj.numel() == 1 else dj.sum()).item()):
        r = torch.exp(off - aj)
        ej = torch.exp(dj)
        x = ej * r.sum(-1, keepdim=True)
        x1 = 1.0 + x
        eM = ej / x1
        M = dj - torch.log1p(x)
        s = _scatter_anchor(r * eM, k, x1.reciprocal())
        return SoftmaxTerms(k, s, M.squeeze(-1), eM.squeeze(-1), r)
    fin = torch.isfinite(aj)
    r = torch.exp(off - torch.where(fin, aj, 0.0))
    ej = torch.where(fin, torch.exp(dj), 0.0)
    x = ej * r.sum(-1, keepdim=True)
    x1 = 1.0 + x
    eM = ej / x1
    M = torch.where(fin, dj - torch.log1p(x), NEG_INF)
    M = torch.where(mx < float("inf"), M, float("nan"))  # mx NaN or +inf: M = NaN
    s = _scatter_anchor(r * eM, k, x1.reciprocal())
    return SoftmaxTerms(k, s, M.squeeze(-1), eM.squeeze(-1), r)


def _scatter_anchor(s, k, sk):
    """s with s_k = sk at the anchor: in s's own buffer (a fresh product) unless autograd
    records it (the same values)."""
    return s.scatter(-1, k, sk) if s.requires_grad else s.scatter_(-1, k, sk)


def scaled_grads(raw: dict, log_scale) -> Scaled:
    """:meth:`Scaled.of` (raw tensors times exp(log_scale) -> max|.| = 1 per trial) with the
    division in place (raw is ours) and one where per tensor fewer; max|t| = max(-min t,
    max t) from amin and amax, without a |t| temporary of the gradient's size (NaN
    propagates through both; a tensor of at most ``_SMALL`` entries: |t|, fewer ops)."""
    out, ls = {}, {}
    for k, t in raw.items():
        B = t.shape[0]
        dims = tuple(range(1, t.ndim))  # (a max is exact: the same m over any layout)
        if t.numel() <= _SMALL and t.ndim > 1:  # few entries: fewer ops (the same values)
            m = t.abs().amax(dims)
        else:  # (aminmax along a dim: ~4x slower on the CPU)
            F = t.reshape(B, -1)
            m = torch.maximum(F.amin(1).neg_(), F.amax(1))
        shape = (B, *([1] * (t.ndim - 1)))
        # (the usual case: no zero or NaN gradient, no wheres; amin propagates NaN)
        if B and (m if B == 1 else m.amin()).item() > 0:
            out[k] = t.div_(m.view(shape))
            ls[k] = torch.log(m) + log_scale
            continue
        pos = m > 0
        out[k] = t.div_(torch.where(pos, m, 1.0).view(shape))
        lm = torch.log(m)  # -inf where m = 0, NaN where m is
        ls[k] = torch.where(pos, lm + log_scale, lm)
    return Scaled(out, ls)


class Objective(NamedTuple):
    """Per-trial risk L (B,), gap L - L* (B,) (may underflow to 0), log(L - L*) (B,) or
    None, and the gradient (a :class:`Scaled`, or None when not asked for)."""

    loss: torch.Tensor
    gap: torch.Tensor
    log_gap: torch.Tensor | None
    grads: Scaled | None


def _logsum_rows(x, w):
    """logsumexp over the (n, Q) dims of a (B, n, Q) tensor -> (B,); rows of weight w = 0
    (padded query slots) and NaN rows (a loss <= 0 has no logarithm: the correlation loss
    past u = 0) are left out, as in the fused kernel. (An overflow is detected from the
    gradient's scale, not from here.)"""
    x = torch.where((w > 0) & ~torch.isnan(x), x, torch.full_like(x, float("-inf")))
    return torch.logsumexp(x.reshape(x.shape[0], -1), dim=1)


def _cached_log(data, w):
    """log(w) of the step-independent query weights w of ``data`` (:meth:`_consts`),
    computed once and cached in the data beside them (keyed by w itself)."""
    cache = data.setdefault("_cache", {})
    hit = cache.get("_logw")
    if hit is None or hit[0] is not w:
        hit = cache["_logw"] = (w, torch.log(w))
    return hit[1]


def row_factors(rho):
    """exp(rho - max rho) per trial and the max (B,): row weights of a scaled gradient.
    rho (B, n, Q) log scales (-inf: a zero row; NaN propagates to the trial's scale)."""
    top = rho.amax(tuple(range(1, rho.ndim))) if rho.ndim > 1 else rho.reshape(-1, 1).amax(1)
    topf = top.nan_to_num(0.0, 0.0, 0.0)  # top where finite, else 0
    return torch.exp(rho - topf.reshape(-1, 1, 1)), top


def _with_reg(model, params, grads: Scaled) -> Scaled:
    """grads + the ridge term's gradient; grads' tensors are the objective's own (fresh from
    :func:`scaled_grads`), and so are the ridge's unless they share the parameters' memory:
    the sum is then taken in place (memory; the same bits)."""
    extra = model._reg_grads(params)
    if not extra:
        return grads
    ptrs = {v.untyped_storage().data_ptr() for v in params.values()}
    own = all(e.untyped_storage().data_ptr() not in ptrs for e in extra.values())
    return grads.add(extra, inplace=own)


def _scaled_attention_grads(model, params, data, Ga, log_scale) -> Scaled:
    raw = model._grads_from_ga(params, data, Ga)  # a NaN (overflow) stays visible
    return scaled_grads(raw, log_scale)


def fixed_linear(model, params, data, lossf, grad=True, autograd=False, need_gap=True,
                 logits=None) -> Objective:
    """Fixed linear head v: (L, L - L*, log(L - L*), scaled dL/dparams); module docstring.
    ``logits``: model._logits(params, data) when the caller has them (not recomputed)."""
    if autograd and grad:
        return _fixed_linear_autograd(model, params, data, lossf)
    with torch.no_grad():
        a = model._logits(params, data) if logits is None else logits
        B, n, Q, T = a.shape
        gam0, gopt, w, _ = model._consts(data, Q)
        st = softmax_terms(a)
        gk = (gam0 if gam0.shape[0] == B else gam0.expand(B, n, Q, T)).gather(-1, st.k)  # (B, n, Q, 1)
        c = gk - gam0  # (B, n, Q, T), 0 at the anchor
        delta_r = torch.linalg.vecdot(st.r, c)  # delta = exp(M) delta_r
        gk = gk[..., 0]
        D = (gopt - gk) + st.eM * delta_r
        u = gopt - D
        L = gap = lg = grads = None
        logw = _cached_log(data, w)
        if need_gap or not grad:
            opt_anchor = gk >= gopt  # the anchor is an optimal token: D = delta exactly
            logD = torch.where(opt_anchor, st.M + torch.log(delta_r), torch.log(D))
            lg = _logsum_rows(logw + log_gap(lossf, gopt, logD, D), w)
            gap = torch.exp(lg)
            L = (w * lossf.value(gopt)).sum((1, 2)) + gap
        if grad:
            fac, top = row_factors(logw + log_neg_deriv(lossf, u) + st.M)
            # -fac (s delta_r - r c), in three full-size ops
            Ga = torch.addcmul(st.s * delta_r[..., None], st.r, c, value=-1.0)
            Ga.mul_(-fac[..., None])
            # the logits-sized terms let go before the gradient's products (the step's peak)
            del a, st, c, fac, logits
            grads = _with_reg(model, params, _scaled_attention_grads(model, params, data, Ga, top))
    return Objective(L, gap, lg, grads)


def _fixed_linear_autograd(model, params, data, lossf) -> Objective:
    """Reference path: torch.autograd of the stable gap (no scaling; underflows like any
    plain float64 computation far past saturation)."""
    params = {k: t.detach().requires_grad_(True) for k, t in params.items()}
    with torch.enable_grad():
        a = model._logits(params, data)
        B, n, Q, T = a.shape
        gam0, gopt, w, masked = model._consts(data, Q)
        s = torch.softmax(a, dim=-1)
        k = a.detach().argmax(-1, keepdim=True)
        gk = gam0.expand(B, n, Q, T).gather(-1, k)
        c = gk - gam0
        D = (gopt - gk[..., 0]) + (s * c).sum(-1)
        gap = (w * lossf.gap(gopt, D)).sum((1, 2))
        reg = model._reg(params)
        obj = gap.sum() + (reg.sum() if reg is not None else 0.0)
        g = torch.autograd.grad(obj, list(params.values()))
    gap = gap.detach()
    L = (w * lossf.value(gopt)).sum((1, 2)) + gap
    return Objective(L, gap, torch.log(gap), Scaled.of(dict(zip(params, g))))


def trained_linear(model, params, data, lossf, grad=True, autograd=False, need_gap=True,
                   logits=None) -> Objective:
    """Trained linear head (W-part and v-part scaled separately); module docstring.
    ``logits``: model._logits(params, data) when the caller has them (not recomputed)."""
    if autograd and grad:
        return autograd_head(model, params, data, lossf, grad=True)
    with torch.no_grad():
        a = model._logits(params, data) if logits is None else logits
        B, n, Q, T = a.shape
        st = softmax_terms(a)
        X, v = data["X"], params["v"]
        c = torch.matmul(X, v[:, None, :, None]).transpose(-1, -2)  # c_it = v^T x_it: (B, n, 1, T)
        ck = c.expand(B, n, Q, T).gather(-1, st.k)  # (B, n, Q, 1)
        cd = c - ck  # exactly 0 at the anchor
        m = model._key_mask(data)
        if m is not None:  # masked keys: s = r = 0 there; keep 0 * cd finite
            cd = cd.masked_fill(~m, 0.0)
        delta_r = torch.linalg.vecdot(st.r, cd)
        y = model._labels(data, Q)
        u = y * (ck[..., 0] + st.eM * delta_r)
        w = model._query_weights(data, Q)
        logw = torch.log(w)
        L = lg = grads = None
        if need_gap or not grad:
            L = (w * lossf.value(u)).sum((1, 2))
            lg = _logsum_rows(logw + log_value(lossf, u), w)
        if grad:
            rho_v = logw + log_neg_deriv(lossf, u)  # log |lam|, lam = w loss'(u) y = -|lam| y
            fv, top_v = row_factors(rho_v)
            fa, top_a = row_factors(rho_v + st.M)
            Ga = torch.addcmul(st.r * cd, st.s, delta_r[..., None], value=-1.0)
            Ga.mul_((-y * fa)[..., None])  # (-y fa) (r cd - s delta_r)
            grads = _scaled_attention_grads(model, params, data, Ga, top_a)
            r = ((-y * fv)[..., None] * st.s).sum(2)  # sum_q lam_iq s_iqt / e^{top_v}: (B, n, T)
            r = r.reshape(B, 1, n * T)
            gv = torch.matmul(r, X.reshape(X.shape[0], n * T, -1))[:, 0]  # sum_it r_it x_it
            vs = scaled_grads({"v": gv}, top_v)
            grads = _with_reg(model, params, Scaled({**grads.tensors, **vs.tensors},
                                                    {**grads.log_scale, **vs.log_scale}))
    return Objective(L, L, lg, grads)


def autograd_head(model, params, data, lossf, grad=True, logits=None) -> Objective:
    """Any head: L = sum w loss(y h(U)) by torch.autograd, with the anchored pooling U
    (L* = 0). The gradient is exact to float64 as long as it is representable.
    ``logits`` (model._logits(params, data), used only with grad=False: autograd needs
    its own)."""
    if grad:
        params = {k: t.detach().requires_grad_(True) for k, t in params.items()}
        logits = None
    with torch.set_grad_enabled(grad):
        a = model._logits(params, data) if logits is None else logits
        s = torch.softmax(a, dim=-1)
        f = model._headf(params, pool_anchored(a, s, data["X"]), data)
        u = model._labels(data, a.shape[2]) * f
        w = model._query_weights(data, a.shape[2])
        L = (w * lossf.value(u)).sum((1, 2))
        lg = _logsum_rows(torch.log(w) + log_value(lossf, u), w).detach()
        if not grad:
            return Objective(L.detach(), L.detach(), lg, None)
        reg = model._reg(params)
        obj = L.sum() + (reg.sum() if reg is not None else 0.0)
        g = torch.autograd.grad(obj, list(params.values()), allow_unused=True)
    grads = {k: (torch.zeros_like(p) if gi is None else gi) for (k, p), gi in zip(params.items(), g)}
    return Objective(L.detach(), L.detach(), lg, Scaled.of(grads))
