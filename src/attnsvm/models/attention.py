"""Queries, key masks and the softmax, in the form that stays exact past saturation.

Every dataset has Q query slots per sequence: Q = 1 for cross-attention (z_i given) and
self-attention with the first / last token as query; Q = T for seq-to-seq (every token a
query; "causal": keys t <= k only). Logits are a (B, n, Q, T).

Saturation (docs/theory.md §8). With the anchor k = argmax_t a_t, every non-anchor probability is
s_t = exp(M) r_t with M = max_{t != k} log s_t and r_t = exp(log s_t - M) in [0, 1]. Far
past saturation exp(M) underflows float64 while r is exact, so the objective works with
(M, r): every term of the gradient of a row carries the factor exp(M), which goes into
the gradient's log scale instead of being rounded to 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["QUERIES", "queries", "key_mask", "query_weights", "SoftmaxTerms", "softmax_terms",
           "pool_anchored"]

QUERIES = ("cross", "first", "last", "seq2seq", "causal")


def queries(query: str, data: dict) -> torch.Tensor:
    """Query vectors z_iq: (Bx, n, Q, d) for the query kind (cross: data z; first / last:
    the first / last valid token; seq2seq / causal: every token)."""
    X = data["X"]
    if query == "cross":
        if data.get("z") is None:
            raise ValueError("query='cross' needs data.z of shape (n, d); got None "
                             "(for self-attention use query='first' or 'last')")
        return data["z"][:, :, None, :]
    if query == "first":
        return X[:, :, :1, :]
    if query == "last":
        if data.get("mask") is None:
            return X[:, :, -1:, :]
        idx = data["mask"].long().cumsum(-1).argmax(-1)  # last valid token
        return X.gather(2, idx[:, :, None, None].expand(-1, -1, 1, X.shape[-1]))
    return X


def key_mask(query: str, data: dict) -> torch.Tensor | None:
    """Boolean (Bx, n, Q, T) or (T, T) mask of admissible keys (padding, causal), or None."""
    T = data["X"].shape[2]
    mask = data.get("mask")
    m = None if mask is None else mask[:, :, None, :]
    if query == "causal":
        tri = torch.ones(T, T, dtype=torch.bool, device=data["X"].device).tril()
        m = tri if m is None else (m & tri)
    return m


def query_weights(data: dict, Q: int) -> torch.Tensor:
    """Weights w_iq of the empirical risk L = sum_iq w_iq loss(u_iq), summing to 1 per
    trial: 1 / (n Q), or the valid queries of a masked seq-to-seq dataset. (Bx|1, n, Q)."""
    X = data["X"]
    n = X.shape[1]
    if Q > 1 and data.get("mask") is not None:
        w = data["mask"].to(X.dtype)
        return w / w.sum((1, 2), keepdim=True)
    return torch.full((1, n, Q), 1.0 / (n * Q), dtype=X.dtype, device=X.device)


class SoftmaxTerms(NamedTuple):
    """The softmax of logits a (B, n, Q, T) around its anchor (see the module docstring).

    k (B, n, Q, 1) anchor index; s (B, n, Q, T) softmax; M (B, n, Q) log of the largest
    non-anchor probability (-inf when the anchor is the only admissible key); eM = exp(M)
    (0 where it underflows); r (B, n, Q, T) = s_t / exp(M) off the anchor, 0 at the anchor
    and at masked keys."""

    k: torch.Tensor
    s: torch.Tensor
    M: torch.Tensor
    eM: torch.Tensor
    r: torch.Tensor


def softmax_terms(a: torch.Tensor) -> SoftmaxTerms:
    """Anchor, softmax and the scaled non-anchor probabilities of logits a (B, n, Q, T).

    A query slot without any admissible key (all logits -inf; its weight is 0) gets
    uniform logits instead of NaN; an overflowed logit (+inf or NaN) stays NaN, so that
    the trainer sees the overflow instead of a silently dropped row."""
    a = a.masked_fill(torch.isneginf(a).all(-1, keepdim=True), 0.0)
    ls = torch.log_softmax(a, dim=-1)
    k = a.detach().argmax(-1, keepdim=True)
    off = ls.scatter(-1, k, float("-inf"))
    M = off.amax(-1)  # (B, n, Q)
    Mf = torch.where(torch.isfinite(M), M, torch.zeros_like(M))
    r = torch.exp(off - Mf[..., None])
    return SoftmaxTerms(k, torch.exp(ls), M, torch.exp(M), r)


def pool_anchored(a, s, X):
    """U_iq = X_i^T s_iq computed around the anchor k = argmax_t a_iqt (docs/theory.md §8):

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
