"""Batched one-layer attention models (THEORY.md §2) and their stable objective (§8).

Logits a_{iqt} = x_{it}^T W z_{iq}, attention s_{iq} = softmax_t(a_{iq}), output
f_{iq} = h(X_i^T s_{iq}). Internally every dataset has Q query slots per sequence:
Q = 1 for cross-attention (z_i given) and self-attention with query = first/last
token, Q = T for seq-to-seq (every token a query; ``causal``: keys t <= k only).

Parameterisations (``params`` is a dict of tensors with a leading trial dim B):

    WModel       {"W": (B, d, d)}                       W
    KQModel      {"K": (B, d, m), "Q": (B, d, m)}       W = K Q^T (+ reg (|K|^2 + |Q|^2))
    DiagModel    {"k": (B, d), "q": (B, d)}             W = diag(k * q)
    PromptModel  {"p": (B, d)}, fixed W (d, d)          a_{it} = x_{it}^T W p

Heads: "linear" (f = v^T u; v fixed from the data, or trained: params["v"] (B, d)),
"relu" (f = 1^T ReLU(V^T u), V (d, m) fixed or trained: params["V"] (B, d, m)), or any
torch callable u (..., d) -> f (...) (its own parameters are not trained here).

Data: a ``TokenData`` or the dict of ``prepare``: X (Bx, n, T, d) with Bx = 1 (shared)
or B (one dataset per trial); y (Bx, n) or (Bx, n, T); z (Bx, n, d); mask; v (Bx, d).
"""

from __future__ import annotations

import numpy as np
import torch

from .data import TokenData
from .losses import get_loss

__all__ = [
    "prepare",
    "AttentionModel",
    "WModel",
    "KQModel",
    "DiagModel",
    "PromptModel",
    "W",
    "KQ",
    "Diag",
    "Prompt",
    "INIT_KINDS",
]

INIT_KINDS = ("random", "zero", "balanced", "unbalanced")
QUERIES = ("cross", "first", "last", "seq2seq", "causal")
EPS = float(np.finfo(np.float64).eps)


def prepare(data, device=None, dtype=torch.float64) -> dict:
    """TokenData (or a dict of arrays) -> dict of tensors with a leading data-batch dim Bx.

    Adds Bx = 1 to unbatched data; keys X, y, z, mask, v (None when absent).
    """
    if isinstance(data, dict) and isinstance(data.get("X"), torch.Tensor) and data["X"].ndim == 4:
        return data
    if isinstance(data, dict):
        data = TokenData(**{k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
                            for k, v in data.items()})
    if not isinstance(data, TokenData):
        raise ValueError(f"data must be a TokenData; got {type(data).__name__}")
    out = data.to_torch(device=device, dtype=dtype)
    if not data.batched:
        out = {k: (None if t is None else t[None]) for k, t in out.items()}
    return out


def _to_tensor(a, device, dtype):
    return None if a is None else torch.as_tensor(a, device=device, dtype=dtype)


def _pad_trials(t: torch.Tensor, B: int) -> torch.Tensor:
    return t.expand(B, *t.shape[1:]) if t.shape[0] == 1 and B != 1 else t


class AttentionModel:
    """Base class: queries, masks, heads, forward pass and the stable objective.

    Subclasses define ``_param_shapes`` and ``_wz`` (the vectors W z_{iq}) and
    ``_grads_from_gx`` (closed-form parameter gradients from dL/da).
    """

    has_query_data = True

    def __init__(self, d: int, query: str = "cross", head="linear", train_head: bool = False,
                 head_width: int | None = None, V=None):
        if query not in QUERIES:
            raise ValueError(f"query must be one of {QUERIES}; got {query!r}")
        self.d = int(d)
        self.query = query
        self.train_head = bool(train_head)
        self.V_fixed = None
        if isinstance(head, str):
            if head not in ("linear", "relu"):
                raise ValueError(f"head must be 'linear', 'relu' or a callable; got {head!r}")
            if head == "relu" and not train_head:
                if V is None:
                    raise ValueError("a fixed relu head needs V of shape (d, m) or (B, d, m)")
                self.V_fixed = np.asarray(V, dtype=np.float64)
                if self.V_fixed.shape[-2] != d or self.V_fixed.ndim not in (2, 3):
                    raise ValueError(f"V must have shape (d, m) = ({d}, m) or (B, d, m); got {self.V_fixed.shape}")
                head_width = self.V_fixed.shape[-1]
            self.head_width = int(head_width or d)
        elif callable(head):
            if train_head:
                raise ValueError("train_head=True is only for 'linear' and 'relu' heads")
            self.head_width = None
        else:
            raise ValueError(f"head must be 'linear', 'relu' or a callable; got {type(head).__name__}")
        self.head = head

    # ------------------------------------------------------------ parameters
    def _param_shapes(self) -> dict:
        raise NotImplementedError

    def param_shapes(self) -> dict:
        """Per-trial shapes of the trained tensors (without the leading B)."""
        shapes = dict(self._param_shapes())
        if self.train_head:
            shapes["v" if self.head == "linear" else "V"] = (
                (self.d,) if self.head == "linear" else (self.d, self.head_width))
        return shapes

    def _init_pair(self, kind, draws):
        return draws

    def init(self, B: int = 1, seed: int = 0, scale: float = 0.1, kind: str = "random",
             device=None, dtype=torch.float64) -> dict:
        """Initial parameters for B independent trials.

        kind: "random" (i.i.d. N(0,1) entries, each tensor rescaled to Frobenius norm
        ``scale`` per trial), "zero" (all 0), "balanced" (K = Q, k = q; random otherwise),
        "unbalanced" (K = a random, Q = 0; k = a, q = 0). Seeded via torch.Generator
        (CPU, then moved to ``device``): the same seed gives bit-identical tensors.
        """
        if kind not in INIT_KINDS:
            raise ValueError(f"init kind must be one of {INIT_KINDS}; got {kind!r}")
        gen = torch.Generator().manual_seed(int(seed))
        out = {}
        for name, shape in self.param_shapes().items():
            a = torch.randn((B, *shape), generator=gen, dtype=torch.float64)
            nrm = a.reshape(B, -1).norm(dim=1).reshape(B, *([1] * len(shape)))
            out[name] = scale * a / nrm if kind != "zero" else torch.zeros_like(a)
        out = self._shape_init(out, kind)
        return {k: t.to(device=device, dtype=dtype) for k, t in out.items()}

    def _shape_init(self, params, kind):
        if kind in ("balanced", "unbalanced"):
            raise ValueError(f"init kind {kind!r} applies to KQModel and DiagModel only")
        return params

    def W(self, params) -> torch.Tensor:
        """Effective key-query matrix (B, d, d)."""
        raise NotImplementedError

    def norms(self, params) -> dict:
        """Per-trial norms for the metrics table: {"norm": ||W||_F (B,), ...}."""
        W = self.W(params)
        out = {"norm": W.reshape(W.shape[0], -1).norm(dim=1)}
        if self.train_head:
            h = params["v" if self.head == "linear" else "V"]
            out["norm_head"] = h.reshape(h.shape[0], -1).norm(dim=1)
        return out

    def _reg(self, params):
        return None

    # ------------------------------------------------------------- geometry
    def queries(self, data: dict) -> torch.Tensor:
        """Query vectors z_{iq}: (Bx, n, Q, d)."""
        X = data["X"]
        if self.query == "cross":
            if data.get("z") is None:
                raise ValueError("query='cross' needs data.z of shape (n, d); got None")
            return data["z"][:, :, None, :]
        if self.query == "first":
            return X[:, :, :1, :]
        if self.query == "last":
            if data.get("mask") is None:
                return X[:, :, -1:, :]
            idx = (data["mask"].long().cumsum(-1).argmax(-1))  # last valid token
            return X.gather(2, idx[:, :, None, None].expand(-1, -1, 1, X.shape[-1]))
        return X

    def _key_mask(self, data) -> torch.Tensor | None:
        """Boolean (Bx, n, Q, T) or (Q, T) mask of admissible keys, or None."""
        T = data["X"].shape[2]
        mask = data.get("mask")
        m = None if mask is None else mask[:, :, None, :]
        if self.query == "causal":
            tri = torch.ones(T, T, dtype=torch.bool, device=data["X"].device).tril()
            m = tri if m is None else (m & tri)
        return m

    def _query_weights(self, data, Q: int) -> torch.Tensor:
        """Weights w_{iq} summing to 1 per trial: (Bx, n, Q). Loss = sum w loss(u)."""
        X = data["X"]
        n = X.shape[1]
        if Q > 1 and data.get("mask") is not None:
            w = data["mask"].to(X.dtype)
            return w / w.sum((1, 2), keepdim=True)
        return torch.full((1, n, Q), 1.0 / (n * Q), dtype=X.dtype, device=X.device)

    def _wz(self, params, Z) -> torch.Tensor:
        """(W z_{iq}) for all queries: (B, n, Q, d) (or broadcastable)."""
        raise NotImplementedError

    def logits(self, params, data) -> torch.Tensor:
        """a_{iqt} = x_{it}^T W z_{iq}: (B, n, T) [one query] or (B, n, T, T) [seq2seq]."""
        data = prepare(data)
        a = self._logits(params, data)
        return a[:, :, 0] if self._single(data) else a

    def _single(self, data) -> bool:
        return self.query in ("cross", "first", "last") or not self.has_query_data

    def _logits(self, params, data) -> torch.Tensor:
        X = data["X"]
        WZ = self._wz(params, self.queries(data) if self.has_query_data else None)
        if WZ.shape[2] == 1:  # one query: elementwise beats many tiny batched matmuls
            a = (X * WZ).sum(-1)[:, :, None, :]  # (B, n, 1, T)
        else:
            a = WZ @ X.transpose(-1, -2)  # (B, n, Q, T)
        m = self._key_mask(data)
        if m is not None:
            a = a.masked_fill(~m, float("-inf"))
        return a

    def attention(self, params, data) -> torch.Tensor:
        """s = softmax over keys: (B, n, T) or (B, n, T, T) (seq2seq: [query k, key t])."""
        return torch.softmax(self.logits(params, data), dim=-1)

    def _head(self, params, U, data) -> torch.Tensor:
        if self.head == "linear":
            v = params["v"] if self.train_head else data.get("v")
            if v is None:
                raise ValueError("a fixed linear head needs data.v of shape (d,); got None")
            return (U @ v[:, None, :, None])[..., 0]
        if self.head == "relu":
            V = params["V"] if self.train_head else _to_tensor(self.V_fixed, U.device, U.dtype)
            if V.ndim == 2:
                V = V[None]
            return torch.relu(U @ V[:, None]).sum(-1)
        f = self.head(U)
        if tuple(f.shape) != tuple(U.shape[:-1]):
            raise ValueError(f"head must map u of shape (..., d) to f of shape (...); got "
                             f"{tuple(U.shape)} -> {tuple(f.shape)}")
        return f

    def _forward(self, params, data):
        a = self._logits(params, data)
        s = torch.softmax(a, dim=-1)
        U = _pool_anchored(a, s, data["X"])  # (B, n, Q, d)
        return self._head(params, U, data), a, s

    def forward(self, params, data) -> torch.Tensor:
        """f_{iq} = h(X_i^T s_{iq}): (B, n) or (B, n, T) (seq2seq)."""
        data = prepare(data)
        f = self._forward(params, data)[0]
        return f[:, :, 0] if self._single(data) else f

    __call__ = forward

    # ------------------------------------------------------------- objective
    @property
    def fixed_linear(self) -> bool:
        return self.head == "linear" and not self.train_head

    def _labels(self, data, Q):
        y = data["y"]
        return y[:, :, None] if y.ndim == 2 else y  # (Bx, n, Q)

    def _gamma(self, data, Q):
        """gamma_{iqt} = y_{iq} v^T x_{it} (Bx, n, Q, T) with inadmissible keys -inf."""
        vx = (data["X"] @ data["v"][:, None, :, None])[..., 0]  # (Bx, n, T)
        g = self._labels(data, Q)[..., None] * vx[:, :, None, :]
        m = self._key_mask(data)
        if m is not None:
            g = g.masked_fill(~m, float("-inf"))
        return g

    def objective(self, params, data, loss="logistic", grad: bool = True, autograd: bool = False,
                  need_gap: bool = True):
        """Risk, gap and gradients per trial (THEORY §3-4, stable form of §8).

        Returns (L (B,), L - L* (B,), grads dict or None). Fixed linear head:
        with k_iq = argmax_t a_iqt (anchor), c_t = gamma_k - gamma_t,
        delta = sum_t s_t c_t, D = (gamma_opt - gamma_k) + delta >= 0, u = gamma_opt - D:
            L - L* = sum_iq w_iq gap(gamma_opt, D),   L* = sum_iq w_iq loss(gamma_opt),
            dL/da_iqt = w_iq loss'(u) s_t (delta - c_t)        (closed form),
        then parameter gradients by the chain rule (``autograd=True``: torch.autograd
        of the same stable objective instead). Trained linear head (L* = 0, L - L* = L):
        with c_it = v^T x_it, k = argmax_t a_iqt, cd_t = c_t - c_k (0 at the anchor),
        delta = sum_t s_t cd_t, f = c_k + delta, u = y f:
            L = sum_iq w_iq loss(u),
            dL/da_iqt = w_iq loss'(u) y s_t (cd_t - delta)   (= ... s_t (c_t - f), accurate
                                                              for every t, anchor included),
            dL/dv = sum_iq w_iq loss'(u) y X_i^T s_iq           (closed form),
        so the attention gradient stays resolved far past saturation (no 1 - s_k).
        Nonlinear heads: L* = 0, L = sum w loss(y h(U)) by autograd with the pooled token
        U = x_k + sum_{t != k} s_t (x_t - x_k) (same stabilisation of the softmax backward).
        ``need_gap=False`` (closed form only) skips computing L and L - L* (returned as
        None): a leaner step for rules that ignore them.
        """
        lossf = get_loss(loss)
        data = prepare(data)
        if self.fixed_linear:
            if data.get("v") is None:
                raise ValueError("a fixed linear head needs data.v of shape (d,); got None")
            return self._objective_fixed(params, data, lossf, grad, autograd, need_gap)
        if self.head == "linear":  # trained v
            return self._objective_linear(params, data, lossf, grad, autograd, need_gap)
        return self._objective_autograd(params, data, lossf, grad)

    def _consts(self, data, Q):
        """Step-independent terms of the fixed-head objective, cached in ``data``:
        gamma with masked keys -> 0 (Bx, n, Q, T), gamma_opt (Bx, n, Q), query weights
        w (Bx|1, n, Q), whether any key is masked."""
        key = ("_consts", type(self).__name__, self.query, Q)
        cache = data.setdefault("_cache", {})
        if key not in cache:
            gam = self._gamma(data, Q)
            gopt = gam.max(-1).values
            cache[key] = (torch.nan_to_num(gam, neginf=0.0), gopt,
                          self._query_weights(data, Q), bool(torch.isinf(gam).any()))
        return cache[key]

    def _stable_terms(self, a, s, data):
        gam0, gopt, w, masked = self._consts(data, a.shape[2])
        B = a.shape[0]
        k = a.detach().argmax(-1, keepdim=True)
        gk = _pad_trials(gam0, B).gather(-1, k)  # (B, n, Q, 1)
        c = gk - gam0
        delta = (s * c).sum(-1)
        D = (gopt - gk[..., 0]) + delta
        return gopt, D, delta, c, w, masked

    def _objective_fixed(self, params, data, lossf, grad, autograd, need_gap=True):
        if autograd and grad:
            params = {k: t.detach().requires_grad_(True) for k, t in params.items()}
        with torch.set_grad_enabled(bool(autograd and grad)):
            a = self._logits(params, data)
            s = torch.softmax(a, dim=-1)
            gopt, D, delta, c, w, masked = self._stable_terms(a, s, data)
            if not (need_gap or autograd or not grad):
                Ga = (w * lossf.deriv(gopt - D))[..., None] * s * (delta[..., None] - c)
                if masked:
                    Ga = torch.nan_to_num(Ga)
                return None, None, self._grads_from_ga(params, data, Ga)
            gap = (w * lossf.gap(gopt, D)).sum((1, 2))
            Lstar = (w * lossf.value(gopt)).sum((1, 2))
            if not grad:
                return (Lstar + gap).detach(), gap.detach(), None
            if autograd:
                reg = self._reg(params)
                obj = gap.sum() + (reg.sum() if reg is not None else 0.0)
                g = torch.autograd.grad(obj, list(params.values()))
                grads = dict(zip(params.keys(), g))
                gap = gap.detach()
            else:
                Ga = (w * lossf.deriv(gopt - D))[..., None] * s * (delta[..., None] - c)
                if masked:
                    Ga = torch.nan_to_num(Ga)  # 0 * inf at masked keys is 0
                grads = self._grads_from_ga(params, data, Ga)
        return (Lstar + gap).detach(), gap, grads

    def _objective_linear(self, params, data, lossf, grad, autograd, need_gap=True):
        """Trained linear head, stable form (see ``objective``): (L, L, grads)."""
        if autograd and grad:
            params = {k: t.detach().requires_grad_(True) for k, t in params.items()}
        with torch.set_grad_enabled(bool(autograd and grad)):
            a = self._logits(params, data)
            s = torch.softmax(a, dim=-1)  # exp(a_t - logsumexp): small s_t keep full relative accuracy
            X, v = data["X"], params["v"]
            B, n, Q, T = a.shape
            c = (X * v[:, None, None, :]).sum(-1)[:, :, None, :]  # c_it = v^T x_it: (B, n, 1, T)
            k = a.detach().argmax(-1, keepdim=True)  # anchor: most-attended key (B, n, Q, 1)
            ck = c.expand(B, n, Q, T).gather(-1, k)  # (B, n, Q, 1)
            cd = c - ck  # exactly 0 at the anchor
            m = self._key_mask(data)
            if m is not None:  # padded keys: s = 0 there; keep 0 * cd finite
                cd = cd.masked_fill(~m, 0.0)
            delta = (s * cd).sum(-1)  # f - c_k = sum_{t != k} s_t (c_t - c_k)
            y = self._labels(data, Q)
            u = y * (ck[..., 0] + delta)
            w = self._query_weights(data, Q)
            L = None
            if need_gap or autograd or not grad:
                L = (w * lossf.value(u)).sum((1, 2))
            if not grad:
                return L.detach(), L.detach(), None
            if autograd:
                reg = self._reg(params)
                obj = L.sum() + (reg.sum() if reg is not None else 0.0)
                g = torch.autograd.grad(obj, list(params.values()))
                grads = dict(zip(params.keys(), g))
                L = L.detach()
                return L, L, grads
            lam = w * lossf.deriv(u) * y  # (B, n, Q)
            Ga = lam[..., None] * s * (cd - delta[..., None])
            r = (lam[..., None] * s).sum(2)  # sum_q lam_iq s_iqt: (B, n, T)
            if m is not None:
                Ga, r = torch.nan_to_num(Ga), torch.nan_to_num(r)
            grads = self._grads_from_ga(params, data, Ga)
            grads["v"] = (r[..., None] * X).sum((1, 2))
        return L, L, grads

    def _objective_autograd(self, params, data, lossf, grad):
        if grad:
            params = {k: t.detach().requires_grad_(True) for k, t in params.items()}
        with torch.set_grad_enabled(grad):
            f, a, _ = self._forward(params, data)
            u = self._labels(data, a.shape[2]) * f
            w = self._query_weights(data, a.shape[2])
            L = (w * lossf.value(u)).sum((1, 2))
            if not grad:
                return L, L, None
            reg = self._reg(params)
            obj = L.sum() + (reg.sum() if reg is not None else 0.0)
            g = torch.autograd.grad(obj, list(params.values()), allow_unused=True)
        grads = {k: (torch.zeros_like(p) if gi is None else gi) for (k, p), gi in zip(params.items(), g)}
        return L.detach(), L.detach(), grads

    def _gx(self, data, Ga):
        """GX_{iq} = sum_t (dL/da_iqt) x_it: (B, n, Q, d)."""
        if Ga.shape[2] == 1:
            return (Ga[:, :, 0, :, None] * data["X"]).sum(2)[:, :, None, :]
        return Ga @ data["X"]

    def _grads_from_ga(self, params, data, Ga) -> dict:
        raise NotImplementedError


def _pool_anchored(a, s, X):
    """U_iq = X_i^T s_iq computed around the anchor k = argmax_t a_iqt (THEORY §8):

        U = x_k + (sum_{t != k} s_t x_t - (sum_{t != k} s_t) x_k),

    equal to X^T s in exact arithmetic, but its derivative w.r.t. s_k is 0, so the softmax
    backward s_t (g_t - sum_t' s_t' g_t') only sees g_t = dL/dU . (x_t - x_k) and stays
    accurate after saturation (no 1 - s_k).  a, s (B, n, Q, T), X (Bx, n, T, d) -> (B, n, Q, d).
    """
    B, n, Q, T = s.shape
    d = X.shape[-1]
    k = a.detach().argmax(-1, keepdim=True)  # (B, n, Q, 1)
    Xk = X.expand(B, n, T, d).gather(2, k.expand(B, n, Q, d))  # (B, n, Q, d)
    s_off = s * torch.ones_like(s).scatter(-1, k, 0.0)
    return Xk + (s_off @ X - s_off.sum(-1, keepdim=True) * Xk)


def _gw(GX, Z):
    """G_W = sum_{iq} GX_iq z_iq^T: (B, d, d) from GX (B, n, Q, d), Z (Bx, n, Q, d)."""
    B, d = GX.shape[0], GX.shape[-1]
    return GX.reshape(B, -1, d).transpose(1, 2) @ Z.reshape(Z.shape[0], -1, d)


class WModel(AttentionModel):
    """Combined key-query matrix: a_{iqt} = x_{it}^T W z_{iq}, params {"W": (B, d, d)}.

    Closed-form gradient: G_W = sum_{iqt} (dL/da_iqt) x_it z_iq^T.
    """

    def _param_shapes(self):
        return {"W": (self.d, self.d)}

    def W(self, params):
        return params["W"]

    def _wz(self, params, Z):
        Bz, n, Q, d = Z.shape  # one (n Q x d) @ (d x d) product per trial
        out = Z.reshape(Bz, n * Q, d) @ params["W"].transpose(-1, -2)
        return out.reshape(out.shape[0], n, Q, d)

    def _grads_from_ga(self, params, data, Ga):
        out = {"W": _gw(self._gx(data, Ga), self.queries(data))}
        return out


class KQModel(AttentionModel):
    """Key/query factors: W = K Q^T with K, Q (B, d, m); objective + reg (|K|_F^2 + |Q|_F^2).

    Gradients: dL/dK = G_W Q + 2 reg K, dL/dQ = G_W^T K + 2 reg Q. ``reg`` defaults to
    float64 machine epsilon (keeps norms bounded, as in the literature).
    """

    def __init__(self, d: int, m: int | None = None, reg: float = EPS, **kw):
        super().__init__(d, **kw)
        self.m = int(m or d)
        self.reg = float(reg)

    def _param_shapes(self):
        return {"K": (self.d, self.m), "Q": (self.d, self.m)}

    def _shape_init(self, params, kind):
        if kind == "balanced":
            params["Q"] = params["K"].clone()
        elif kind == "unbalanced":
            params["Q"] = torch.zeros_like(params["K"])
        return params

    def W(self, params):
        return params["K"] @ params["Q"].transpose(-1, -2)

    def norms(self, params):
        out = super().norms(params)
        out["norm_nuc"] = torch.linalg.svdvals(self.W(params)).sum(-1)
        return out

    def _reg(self, params):
        if self.reg == 0:
            return None
        return self.reg * (params["K"].pow(2).sum((1, 2)) + params["Q"].pow(2).sum((1, 2)))

    def _wz(self, params, Z):
        Bz, n, Q, d = Z.shape
        out = (Z.reshape(Bz, n * Q, d) @ params["Q"]) @ params["K"].transpose(-1, -2)
        return out.reshape(out.shape[0], n, Q, d)

    def _grads_from_ga(self, params, data, Ga):
        G = _gw(self._gx(data, Ga), self.queries(data))
        K, Qm = params["K"], params["Q"]
        gK = G @ Qm + 2 * self.reg * K
        gQ = G.transpose(-1, -2) @ K + 2 * self.reg * Qm
        return {"K": gK, "Q": gQ}


class DiagModel(AttentionModel):
    """Diagonal factors: W = diag(k * q), k, q (B, d); a_{iqt} = sum_j x_{itj} k_j q_j z_{iqj}.

    Gradients: g_j = sum (dL/da) x_{itj} z_{iqj}; dL/dk = g * q, dL/dq = g * k.
    """

    def _param_shapes(self):
        return {"k": (self.d,), "q": (self.d,)}

    def _shape_init(self, params, kind):
        if kind == "balanced":
            params["q"] = params["k"].clone()
        elif kind == "unbalanced":
            params["q"] = torch.zeros_like(params["k"])
        return params

    def W(self, params):
        return torch.diag_embed(params["k"] * params["q"])

    def _wz(self, params, Z):
        return Z * (params["k"] * params["q"])[:, None, None, :]

    def _grads_from_ga(self, params, data, Ga):
        g = (self._gx(data, Ga) * self.queries(data)).sum((1, 2))
        return {"k": g * params["q"], "q": g * params["k"]}


class PromptModel(AttentionModel):
    """Prompt (query) vector with fixed W: a_{it} = x_{it}^T W p, params {"p": (B, d)}.

    ``W_fixed`` (d, d) defaults to the identity (keys k_it = W^T x_it, so a_i = X_i W p).
    Closed-form gradient: dL/dp = W^T sum_{it} (dL/da_it) x_it. ``model.W(params)``
    returns p (B, d): the object whose direction converges (§5 prompt SVM).
    """

    has_query_data = False

    def __init__(self, d: int, W_fixed=None, **kw):
        kw.setdefault("query", "cross")
        if kw["query"] not in ("cross",):
            raise ValueError("PromptModel has one query (the prompt p); query must be 'cross'")
        super().__init__(d, **kw)
        W_fixed = np.eye(d) if W_fixed is None else np.asarray(W_fixed, dtype=np.float64)
        if W_fixed.shape != (d, d):
            raise ValueError(f"W_fixed must have shape (d, d) = ({d}, {d}); got {W_fixed.shape}")
        self.W_fixed = W_fixed
        self._Wt = {}

    def _Wf(self, ref):
        key = (ref.device, ref.dtype)
        if key not in self._Wt:
            self._Wt[key] = torch.as_tensor(self.W_fixed, device=ref.device, dtype=ref.dtype)
        return self._Wt[key]

    def _param_shapes(self):
        return {"p": (self.d,)}

    def W(self, params):
        return params["p"]

    def norms(self, params):
        out = {"norm": params["p"].norm(dim=1)}
        if self.train_head:
            h = params["v" if self.head == "linear" else "V"]
            out["norm_head"] = h.reshape(h.shape[0], -1).norm(dim=1)
        return out

    def queries(self, data):
        return None

    def _wz(self, params, Z):
        p = params["p"]
        return (p @ self._Wf(p).T)[:, None, None, :]  # (B, 1, 1, d)

    def _grads_from_ga(self, params, data, Ga):
        g = self._gx(data, Ga).sum((1, 2))  # (B, d)
        return {"p": g @ self._Wf(g)}


# Short aliases used in the docs: attnsvm.models.W(d), KQ(d, m), Diag(d), Prompt(d, W_fixed)
W = WModel
KQ = KQModel
Diag = DiagModel
Prompt = PromptModel
