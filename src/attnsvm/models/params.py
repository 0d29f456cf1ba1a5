"""The parameterisations of the key-query interaction (docs/theory.md §2), batched over trials.

    WModel       {"W": (B, d, d)}                       W
    KQModel      {"K": (B, d, m), "Q": (B, d, m)}       W = K Q^T (+ reg (|K|^2 + |Q|^2))
    DiagModel    {"k": (B, d), "q": (B, d)}             W = diag(k * q)
    PromptModel  {"p": (B, d)}, fixed W (d, d)          a_{it} = x_{it}^T W p

Each gives the effective W, the vectors W z_iq of the logits, and the closed-form
gradients of its parameters from dL/da (the chain rule through a = x^T W z).
"""

from __future__ import annotations

import numpy as np
import torch

from attnsvm.norms import FRO, NUC

from .base import AttentionModel, products_grad, products_logits, token_query_products

__all__ = ["WModel", "KQModel", "DiagModel", "PromptModel", "EPS"]

EPS = float(np.finfo(np.float64).eps)


def _gw(GX, Z):
    """G_W = sum_{iq} GX_iq z_iq^T: (B, d, d) from GX (B, n, Q, d), Z (Bx, n, Q, d)."""
    B, d = GX.shape[0], GX.shape[-1]
    return GX.reshape(B, -1, d).transpose(1, 2) @ Z.reshape(Z.shape[0], -1, d)


class WModel(AttentionModel):
    """Combined key-query matrix: a_{iqt} = x_{it}^T W z_{iq}, params {"W": (B, d, d)}.

    Closed-form gradient: G_W = sum_{iqt} (dL/da_iqt) x_it z_iq^T.
    """

    kernel_kind = "W"

    def _param_shapes(self):
        return {"W": (self.d, self.d)}

    def W(self, params):
        return params["W"]

    def _wz(self, params, Z):
        Bz, n, Q, d = Z.shape  # one (n Q x d) @ (d x d) product per trial
        out = Z.reshape(Bz, n * Q, d) @ params["W"].transpose(-1, -2)
        return out.reshape(out.shape[0], n, Q, d)

    def _products(self, data):
        """The token-query products of the data (:func:`~.base.token_query_products`,
        cached in the data), or None (also for a mini-batch: per-trial data at any B, so
        that a batched run equals separate runs bit for bit)."""
        if data.get("_per_trial"):
            return None
        cache = data.setdefault("_cache", {})
        key = ("W_products", self.query)
        if key not in cache:
            token_query_products(data["X"], self.queries(data), cache, key)
        return cache[key]

    def _logits(self, params, data):
        P = self._products(data)
        if P is None:
            return super()._logits(params, data)
        X = data["X"]
        B, n, T = params["W"].shape[0], X.shape[1], X.shape[2]
        cache, key = data["_cache"], ("W_products_t", self.query)
        Pt = cache.get(key)
        if Pt is None:  # the view P.t() made once
            Pt = cache[key] = P.t()
        a = products_logits(P, params["W"], Pt).reshape(B, n, -1, T)  # (B, n, Q, T)
        m = self._key_mask(data)
        return a if m is None else a.masked_fill(~m, float("-inf"))

    def _grads_from_ga(self, params, data, Ga):
        P = self._products(data)
        if P is not None:
            return {"W": products_grad(P, Ga).reshape(Ga.shape[0], self.d, self.d)}
        return {"W": _gw(self._gx(data, Ga), self.queries(data))}


class KQModel(AttentionModel):
    """Key/query factors: W = K Q^T with K, Q (B, d, m); objective + reg (|K|_F^2 + |Q|_F^2).

    Gradients: dL/dK = G_W Q + 2 reg K, dL/dQ = G_W^T K + 2 reg Q. ``reg`` defaults to
    float64 machine epsilon (keeps norms bounded, as in the literature).
    """

    kernel_kind = "KQ"
    geometry = "nuc"

    factorised = True

    def __init__(self, d: int, m: int | None = None, reg: float = EPS, **kw):
        super().__init__(d, **kw)
        if m is not None and (isinstance(m, bool) or int(m) != m or m < 1):
            raise ValueError(f"m must be a positive integer; got {m!r}")
        self.m = int(m or d)
        self.reg = float(reg)
        if not (np.isfinite(self.reg) and self.reg >= 0):
            raise ValueError(f"reg must be a finite number >= 0; got {reg!r}")

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
        out["norm_nuc"] = NUC.value(self.W(params))
        return out

    def _kernel_params(self):
        return {"m": self.m, "reg": self.reg}

    def _reg(self, params):
        if self.reg == 0:
            return None
        return self.reg * (params["K"].pow(2).sum((1, 2)) + params["Q"].pow(2).sum((1, 2)))

    def _reg_grads(self, params):
        if self.reg == 0:
            return {}
        return {"K": 2 * self.reg * params["K"], "Q": 2 * self.reg * params["Q"]}

    def _wz(self, params, Z):
        Bz, n, Q, d = Z.shape
        out = (Z.reshape(Bz, n * Q, d) @ params["Q"]) @ params["K"].transpose(-1, -2)
        return out.reshape(out.shape[0], n, Q, d)

    def _grads_from_ga(self, params, data, Ga):
        """Loss part only (the ridge term is added in scaled form by the objective)."""
        G = _gw(self._gx(data, Ga), self.queries(data))
        return {"K": G @ params["Q"], "Q": G.transpose(-1, -2) @ params["K"]}


class DiagModel(AttentionModel):
    """Diagonal factors: W = diag(k * q), k, q (B, d); a_{iqt} = sum_j x_{itj} k_j q_j z_{iqj}.

    Gradients: g_j = sum (dL/da) x_{itj} z_{iqj}; dL/dk = g * q, dL/dq = g * k.
    """

    kernel_kind = "Diag"
    geometry = "l1"
    diagonal = True

    factorised = True

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

    def _w_entries(self, params):
        # the diagonal k * q: W is finite iff it is (no (B, d, d) temporary in the checks)
        return params["k"] * params["q"]

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

    kernel_kind = "Prompt"

    has_query_data = False

    def __init__(self, d: int, W_fixed=None, **kw):
        kw.setdefault("query", "cross")
        if kw["query"] not in ("cross",):
            raise ValueError("PromptModel has one query (the prompt p); query must be 'cross'")
        super().__init__(d, **kw)
        W_fixed = np.eye(d) if W_fixed is None else np.asarray(W_fixed, dtype=np.float64)
        if W_fixed.shape != (d, d):
            raise ValueError(f"W_fixed must have shape (d, d) = ({d}, {d}); got {W_fixed.shape}")
        if not np.all(np.isfinite(W_fixed)):
            raise ValueError("W_fixed contains NaN or inf")
        self.W_fixed = W_fixed
        self._Wt = {}

    def _Wf(self, ref):
        key = (ref.device, ref.dtype)
        if key not in self._Wt:
            self._Wt[key] = torch.as_tensor(self.W_fixed, device=ref.device, dtype=ref.dtype)
        return self._Wt[key]

    def _param_shapes(self):
        return {"p": (self.d,)}

    @property
    def w_shape(self) -> tuple:
        """p's shape (d,): ``W(params)`` is the prompt p."""
        return (self.d,)

    def _kernel_params(self):
        return {"W_fixed": self.W_fixed}

    def W(self, params):
        return params["p"]

    def norms(self, params):
        out = {"norm": FRO.value(params["p"], vector=True)}
        if self._headf.param:
            h = params[self._headf.param]
            out["norm_head"] = FRO.value(h.reshape(h.shape[0], -1), vector=True)
        return out

    def queries(self, data):
        return None

    def _wz(self, params, Z):
        p = params["p"]
        return (p @ self._Wf(p).T)[:, None, None, :]  # (B, 1, 1, d)

    def _grads_from_ga(self, params, data, Ga):
        g = self._gx(data, Ga).sum((1, 2))  # (B, d)
        return {"p": g @ self._Wf(g)}
