"""Extractors: what an attention module computes, in the library's convention.

An extractor is a function ``extract(module, args, kwargs) -> AttentionCall`` called in a
forward pre-hook of an attention module with the arguments of that call. It reads the
projections from the module's weights and returns the hidden states entering the attention,
the per-head query / key maps and the position terms, so that the head's logits are

    q_h(x) = W_q[h] x + b_q[h],   k_h(y) = W_k[h] y + b_k[h]          (W_q[h], W_k[h]: (d_h, d))
    logit of query k for key t:  scale * (R_k q_h(x_k)) . (R_t k_h(y_t)) + b_h(k, t)

with y = x (self-attention) or the encoder outputs (cross-attention), R_p the rotary
rotation of position p (identity without RoPE), b_h an additive position bias (T5) and
scale = 1/sqrt(d_h) unless the module says otherwise. Grouped-query attention: the key head
of query head h is h // (H / H_kv); ``W_k`` is returned expanded to H heads. Nothing here needs
the attention matrix, so extraction works under SDPA / flash attention; the tracker checks
every extraction against the model's own eager attention (:func:`attnsvm.track.heads.analyse_call`).

Without rotation or bias, dropping the terms that do not depend on the key t (they cancel in
the softmax), in the keys-on-the-left convention of docs/theory.md §2 (a_{kt} = x_t^T W z):

    a_{kt} = x_t^T W_h x_k + u_h^T x_t + const(k),
    W_h = scale * W_k[h]^T W_q[h]   (d x d, rank <= d_h),   u_h = scale * W_k[h]^T b_q[h].

Built in (``SUPPORTED_MODEL_TYPES``, verified by tests/test_track_architectures.py):
``torch.nn.MultiheadAttention``; Hugging Face GPT-2, BERT, RoBERTa, DistilBERT, ViT, Llama,
Qwen2, Mistral, Gemma, Phi, GPT-NeoX, OPT, BART and T5 (self-, causal and cross-attention);
TransformerLens ``HookedTransformer`` attention (:func:`tl_attention`). Built-ins are keyed by
their classes (matched through the module's MRO), never by class names.
:func:`register_extractor` adds a class; a ``Tracker`` also accepts extractors per module
name. :func:`check_config` refuses an unsupported Hugging Face config before any weight is
loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "AttentionCall",
    "Extractor",
    "register_extractor",
    "builtin_extractor",
    "find_attention",
    "split_heads",
    "allowed_from_mask",
    "MASKED_BELOW",
    "SUPPORTED",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "check_config",
    "rotary_matrices",
    "tl_attention",
]

# additive masks: entries <= this are "masked" (HF uses finfo.min, older code -10000)
MASKED_BELOW = -1.0e4

Extractor = Callable[[torch.nn.Module, tuple, dict], "AttentionCall"]


@dataclass
class AttentionCall:
    """One call of an attention module (tensors detached; any dtype / device).

    hidden:  (N, T, d) tokens entering the attention (the queries; also the keys unless
             ``keys`` is given).
    W_q, W_k: (H, d_h, d) per-head query / key maps (q_h = W_q[h] x + b_q[h]); for
             grouped-query attention W_k[h] is the key head shared by query head h.
    b_q, b_k: (H, d_h) or None.
    scale:   logits = scale * q . k; None means 1 / sqrt(d_h).
    causal:  query k sees keys t <= k only.
    allowed: (N, T, S) bool [query, key] (padding etc.) or None (all); ``causal`` is applied
             on top. A self-attention query is valid iff it may attend to itself (padded
             queries may not); a cross-attention query iff it may attend to some key.
    attn:    (N, H, T, S) the probabilities the module itself returned, if any (filled by the
             tracker from the module's eager output; used only to check the recomputation).
    keys:    (N, S, d) key tokens of a cross-attention call (encoder outputs), None for
             self-attention.
    rotary:  (N, T, d_h, d_h) rotation R_p of each position (rotary embeddings): the head
             compares R_k q_h(x_k) with R_t k_h(x_t); None = no rotation.
    pos_bias: (N or 1, H, T, S) additive position bias b_h(k, t) (T5), or None.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import AttentionCall
    >>> call = AttentionCall(hidden=torch.zeros(2, 5, 8), W_q=torch.zeros(4, 2, 8), W_k=torch.zeros(4, 2, 8),
    ...                      causal=True)
    >>> call.n_heads, call.d_head, call.kind, round(call.scale_, 4)
    (4, 2, 'causal', 0.7071)

    ```
    """

    hidden: torch.Tensor
    W_q: torch.Tensor
    W_k: torch.Tensor
    b_q: torch.Tensor | None = None
    b_k: torch.Tensor | None = None
    scale: float | None = None
    causal: bool = False
    allowed: torch.Tensor | None = None
    attn: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    rotary: torch.Tensor | None = None
    pos_bias: torch.Tensor | None = None

    @classmethod
    def random(cls, N: int = 2, T: int = 5, d: int = 4, heads: int = 2, d_head: int = 2,
               seed: int = 0, **fields) -> AttentionCall:
        """A random self-attention call in float64, for examples and tests: hidden (N, T, d)
        and one map W (heads, d_head, d), i.i.d. N(0, 1) in that order from
        ``torch.Generator().manual_seed(seed)``, with W_q = W_k = W; ``fields`` set the
        others (``causal=True``, ``attn=...``).

        ```pycon
        >>> from attnsvm.track import AttentionCall
        >>> call = AttentionCall.random(causal=True)
        >>> tuple(call.hidden.shape), tuple(call.W_q.shape), call.kind, call.W_k is call.W_q
        ((2, 5, 4), (2, 2, 4), 'causal', True)

        ```
        """
        g = torch.Generator().manual_seed(int(seed))
        x = torch.randn(N, T, d, generator=g, dtype=torch.float64)
        W = torch.randn(heads, d_head, d, generator=g, dtype=torch.float64)
        return cls(hidden=x, W_q=W, W_k=W, **fields)

    @property
    def n_heads(self) -> int:
        """Number of heads H (W_q is (H, d_head, d))."""
        return int(self.W_q.shape[0])

    @property
    def d_head(self) -> int:
        """Per-head dimension d_head."""
        return int(self.W_q.shape[1])

    @property
    def scale_(self) -> float:
        """The logit scale: ``scale`` when given, else 1 / sqrt(d_head)."""
        return float(self.scale) if self.scale is not None else 1.0 / math.sqrt(self.d_head)

    @property
    def kind(self) -> str:
        """'cross', 'causal' or 'self'."""
        return "cross" if self.keys is not None else ("causal" if self.causal else "self")

    @property
    def key_tokens(self) -> torch.Tensor:
        """(N, S, d): ``keys`` for cross-attention, else ``hidden``."""
        return self.hidden if self.keys is None else self.keys

    def detached(self) -> AttentionCall:
        """A copy whose tensors are detached from autograd (what the tracker stores)."""
        from dataclasses import replace

        def det(t):
            return t.detach() if torch.is_tensor(t) else t

        return replace(self, **{f: det(getattr(self, f)) for f in
                                ("hidden", "W_q", "W_k", "b_q", "b_k", "allowed", "attn", "keys",
                                 "rotary", "pos_bias")})

    def validate(self, where: str = "extractor") -> AttentionCall:
        """Check shapes (clear errors for user-written extractors); returns self."""
        x = self.hidden
        if not torch.is_tensor(x) or x.dim() != 3:
            raise ValueError(f"{where}: hidden must be a (N, T, d) tensor; got "
                             f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
        N, T, d = x.shape
        S = T
        if self.keys is not None:
            if not torch.is_tensor(self.keys) or self.keys.dim() != 3 or \
                    self.keys.shape[0] != N or self.keys.shape[2] != d:
                raise ValueError(f"{where}: keys must have shape ({N}, S, {d}); got "
                                 f"{tuple(getattr(self.keys, 'shape', ()))}")
            S = self.keys.shape[1]
        for name in ("W_q", "W_k"):
            w = getattr(self, name)
            if not torch.is_tensor(w) or w.dim() != 3 or w.shape[2] != d:
                raise ValueError(f"{where}: {name} must have shape (H, d_h, {d}); got "
                                 f"{tuple(w.shape) if torch.is_tensor(w) else type(w).__name__}")
        if self.W_q.shape != self.W_k.shape:
            raise ValueError(f"{where}: W_q {tuple(self.W_q.shape)} and W_k "
                             f"{tuple(self.W_k.shape)} must have the same shape (H, d_h, d)")
        H, dh = self.W_q.shape[:2]
        for name in ("b_q", "b_k"):
            b = getattr(self, name)
            if b is not None and tuple(b.shape) != (H, dh):
                raise ValueError(f"{where}: {name} must have shape ({H}, {dh}); got {tuple(b.shape)}")
        if self.allowed is not None and tuple(self.allowed.shape) != (N, T, S):
            raise ValueError(f"{where}: allowed must have shape ({N}, {T}, {S}); got "
                             f"{tuple(self.allowed.shape)}")
        if self.rotary is not None:
            if self.keys is not None:
                raise ValueError(f"{where}: rotary embeddings in cross-attention are not supported")
            if tuple(self.rotary.shape) != (N, T, dh, dh):
                raise ValueError(f"{where}: rotary must have shape ({N}, {T}, {dh}, {dh}); got "
                                 f"{tuple(self.rotary.shape)}")
        if self.pos_bias is not None and (self.pos_bias.dim() != 4 or self.pos_bias.shape[0] not in (1, N)
                                          or tuple(self.pos_bias.shape[1:]) != (H, T, S)):
            raise ValueError(f"{where}: pos_bias must have shape (1 or {N}, {H}, {T}, {S}); got "
                             f"{tuple(self.pos_bias.shape)}")
        return self


# ------------------------------------------------------------------------------ helpers
def split_heads(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(H d_h, d) output-major weight (``nn.Linear.weight`` rows) -> (H, d_h, d).

    ```pycon
    >>> import torch
    >>> from attnsvm.track import split_heads
    >>> w = torch.arange(12.).reshape(6, 2)          # 3 heads of d_h = 2 on d = 2
    >>> split_heads(w, 3)[1].tolist()
    [[4.0, 5.0], [6.0, 7.0]]

    ```
    """
    out, d = weight.shape
    if out % n_heads:
        raise ValueError(f"{out} output features are not divisible by {n_heads} heads")
    return weight.reshape(n_heads, out // n_heads, d)


def _bias(b, n_heads):
    return None if b is None else b.reshape(n_heads, -1)


def _hidden(args, kwargs, names=("hidden_states", "x", "query")):
    if args and torch.is_tensor(args[0]):
        return args[0]
    for n in names:
        if torch.is_tensor(kwargs.get(n)):
            return kwargs[n]
    raise ValueError("could not find the hidden states (first argument) of the attention call")


def allowed_from_mask(mask, N: int, T: int, *, true_means_masked: bool = False,
                      S: int | None = None) -> torch.Tensor:
    """(N, T, S) bool [query, key] from a Hugging Face / PyTorch attention mask (S = T unless
    given: cross-attention).

    Accepted: None (all allowed); bool (True = attend, or True = masked when
    ``true_means_masked``, PyTorch's convention); additive float masks (0 = attend,
    <= MASKED_BELOW = masked; any other value is a position bias the SVM cannot represent:
    ValueError); shapes (N, T) key padding (HF 2-D masks: nonzero = attend), (T, T),
    (N, T, T), (N, 1 or H, T, T) (heads must agree).

    ```pycon
    >>> import torch
    >>> from attnsvm.track import allowed_from_mask
    >>> allowed_from_mask(torch.tensor([[1, 1, 0]]), 1, 3)[0].int().tolist()   # last token padded
    [[1, 1, 0], [1, 1, 0], [1, 1, 0]]

    ```
    """
    if mask is None:
        return None
    S = T if S is None else S
    m = mask
    if m.dtype == torch.bool:
        a = ~m if true_means_masked else m
    elif m.dim() == 2 and m.shape == (N, S) and not m.is_floating_point():
        a = m != 0  # HF-style 2-D key-padding mask of 0 / 1
    else:
        mf = m.to(torch.float64)
        a = mf > MASKED_BELOW
        bad = a & (mf != 0)
        if bool(bad.any()):
            raise ValueError("additive attention bias other than a 0 / -inf mask (e.g. ALiBi) "
                             "is not supported: the logits are not x_t^T W x_k + u^T x_t")
    if a.dim() == 2 and a.shape == (N, S):
        a = a[:, None, :].expand(N, T, S)
    elif a.dim() == 2:
        a = a[None].expand(N, T, S)
    elif a.dim() == 4:
        if a.shape[1] > 1 and not bool((a == a[:, :1]).all()):
            raise ValueError("attention masks that differ between heads are not supported")
        a = a[:, 0]
    if a.dim() == 3 and a.shape[1] == 1:  # (N, 1, S) key padding broadcast over queries
        a = a.expand(a.shape[0], T, S)
    a = a.expand(N, T, S) if a.shape[0] == 1 else a
    if tuple(a.shape) != (N, T, S):
        raise ValueError(f"attention mask of shape {tuple(mask.shape)} does not fit N={N}, T={T}, S={S}")
    return a


def _n_heads(module) -> int:
    for name in ("num_attention_heads", "num_heads", "n_heads", "n_head"):
        if isinstance(getattr(module, name, None), int):
            return getattr(module, name)
    cfg = getattr(module, "config", None)
    for name in ("num_attention_heads", "num_heads", "n_head"):
        if isinstance(getattr(cfg, name, None), int):
            return getattr(cfg, name)
    raise ValueError(f"{type(module).__name__}: no head count attribute (num_attention_heads / "
                     "num_heads / n_heads)")


def _bound(module, args, kwargs) -> dict:
    """The call's arguments by name (positional ones bound to the forward's signature)."""
    import inspect

    try:
        ba = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    except TypeError:
        return dict(kwargs)
    out = dict(ba.arguments)
    out.update(out.pop("kwargs", {}) or {})
    return out


def _no_cross(kwargs, module):
    if kwargs.get("encoder_hidden_states") is not None or getattr(module, "is_cross_attention", False):
        raise ValueError(f"{type(module).__name__}: cross-attention calls are not supported "
                         "for this module (the tracker follows its self-attention)")


def rotary_matrices(module, cos: torch.Tensor, sin: torch.Tensor, d_head: int) -> torch.Tensor:
    """(N, T, d_h, d_h) rotation R_p of every position, obtained by applying the module's own
    ``apply_rotary_pos_emb`` (from the module's source file, so its convention: rotate-half or
    interleaved pairs) to the identity. cos, sin: (N or 1, T, D), D = rotated dimensions; with
    D < d_h (partial rotary: Phi, GPT-NeoX) the first D coordinates are rotated, the rest kept.

    ```pycon
    >>> import torch
    >>> from attnsvm.track.extract import rotary_matrices
    >>> from attnsvm.track.verify import tiny_model
    >>> m = tiny_model("llama")                                      # d_h = 8
    >>> cos, sin = m.rotary_emb(torch.zeros(1, 6, 32, dtype=torch.float64), torch.arange(6)[None])
    >>> R = rotary_matrices(m.layers[0].self_attn, cos, sin, 8)
    >>> tuple(R.shape), bool(torch.allclose(R[0, 0], torch.eye(8, dtype=R.dtype)))
    ((1, 6, 8, 8), True)

    ```
    """
    import sys

    apply = getattr(sys.modules.get(type(module).__module__), "apply_rotary_pos_emb", None)
    if apply is None:
        raise ValueError(f"{type(module).__name__}: rotary embeddings but no apply_rotary_pos_emb "
                         "in its module")
    n, T, D = cos.shape
    eye = torch.eye(D, dtype=cos.dtype, device=cos.device)
    basis = eye[None, :, None, :].expand(n, D, T, D).contiguous()  # "heads" = basis vectors
    rot, _ = apply(basis, basis, cos, sin)  # rot[n, j, p] = R_p e_j
    R = rot.permute(0, 2, 3, 1)  # (n, T, D, D): column j = R_p e_j
    if D < d_head:
        full = torch.eye(d_head, dtype=R.dtype, device=R.device).repeat(n, T, 1, 1)
        full[..., :D, :D] = R
        R = full
    elif D != d_head:
        raise ValueError(f"{type(module).__name__}: rotary dimension {D} > head dimension {d_head}")
    return R


def _expand_kv(w, H):
    """(H_kv, ...) -> (H, ...): query head h uses key head h // (H / H_kv) (grouped-query)."""
    if w is None or w.shape[0] == H:
        return w
    if H % w.shape[0]:
        raise ValueError(f"{H} query heads are not a multiple of {w.shape[0]} key heads")
    return w.repeat_interleave(H // w.shape[0], dim=0)


def _lin(lin):
    return lin.weight, lin.bias


def _hf_call(module, kw, Wq, bq, Wk, bk, *, mask_name="attention_mask", cross_name=None,
             causal=None, rotary=True, scale=None) -> AttentionCall:
    """An AttentionCall from output-major projection weights Wq (H d_h, d), Wk (H_kv d_h, d)."""
    x = kw.get("hidden_states", kw.get("x"))
    if not torch.is_tensor(x):
        x = next((v for v in kw.values() if torch.is_tensor(v) and v.dim() == 3), None)
    if x is None:
        raise ValueError("could not find the hidden states of the attention call")
    keys = kw.get(cross_name) if cross_name else None
    keys = keys if torch.is_tensor(keys) else None
    N, T, _ = x.shape
    S = T if keys is None else keys.shape[1]
    H = _n_heads(module)
    dh = Wq.shape[0] // H
    W_q, W_k = split_heads(Wq, H), _expand_kv(split_heads(Wk, Wk.shape[0] // dh), H)
    b_q = _bias(bq, H)
    b_k = _expand_kv(None if bk is None else bk.reshape(-1, dh), H)
    R = None
    pe = kw.get("position_embeddings")
    if rotary and isinstance(pe, (tuple, list)) and len(pe) == 2 and torch.is_tensor(pe[0]):
        R = rotary_matrices(module, pe[0], pe[1], dh)
        R = R.expand(N, *R.shape[1:]) if R.shape[0] == 1 else R
    mask = kw.get(mask_name)
    is_causal = bool(getattr(module, "is_causal", False)) if causal is None else causal
    return AttentionCall(
        hidden=x, W_q=W_q, W_k=W_k, b_q=b_q, b_k=b_k,
        scale=float(getattr(module, "scaling", 1.0 / math.sqrt(dh))) if scale is None else scale,
        causal=is_causal and keys is None, keys=keys, rotary=R,
        allowed=allowed_from_mask(mask if torch.is_tensor(mask) else None, N, T, S=S))


# ---------------------------------------------------------------------------- built-ins
def hf_linear(q_name: str, k_name: str) -> Extractor:
    """Hugging Face attention with ``nn.Linear`` query / key projections named ``q_name``,
    ``k_name`` (rows = output features = heads x d_h): BERT, RoBERTa, DistilBERT, ViT."""

    def extract(module, args, kwargs) -> AttentionCall:
        _no_cross(kwargs, module)
        kw = _bound(module, args, kwargs)
        q, k = getattr(module, q_name), getattr(module, k_name)
        return _hf_call(module, kw, *_lin(q), *_lin(k), rotary=False)

    return extract


def hf_decoder(module, args, kwargs) -> AttentionCall:
    """Llama, Qwen2, Mistral, Gemma, Phi, OPT (``q_proj`` / ``k_proj``; grouped-query key
    heads expanded; rotary rotations from the call's ``position_embeddings`` (cos, sin) through
    the module's own apply_rotary_pos_emb; OPT scales q, bias included, by ``scaling``, which is
    the same logit)."""
    for norm in ("q_layernorm", "q_norm", "k_layernorm", "k_norm"):
        if isinstance(getattr(module, norm, None), torch.nn.Module):
            raise ValueError(f"{type(module).__name__}: a normalisation of q / k ({norm}) makes the "
                             "logit non-bilinear in the tokens: not supported")
    kw = _bound(module, args, kwargs)
    return _hf_call(module, kw, *_lin(module.q_proj), *_lin(module.k_proj))


def hf_bart(module, args, kwargs) -> AttentionCall:
    """BART attention: encoder self-attention, causal decoder self-attention, and decoder
    cross-attention (``key_value_states`` = the encoder outputs: the papers' cross-attention)."""
    kw = _bound(module, args, kwargs)
    return _hf_call(module, kw, *_lin(module.q_proj), *_lin(module.k_proj),
                    cross_name="key_value_states", rotary=False)


def hf_t5(module, args, kwargs) -> AttentionCall:
    """T5 attention: no 1/sqrt(d_h) (scaling 1), no q / k bias, a learned relative position
    bias b_h(t - k) (bucketed) added to the logits: taken from the call's ``position_bias``
    (layers after the first reuse the first one's) or computed by the module; encoder
    self-attention, causal decoder self-attention and cross-attention (``key_value_states``)."""
    kw = _bound(module, args, kwargs)
    call = _hf_call(module, kw, module.q.weight, None, module.k.weight, None, mask_name="mask",
                    cross_name="key_value_states", rotary=False,
                    causal=bool(getattr(module, "is_decoder", False)),
                    scale=float(getattr(module, "scaling", 1.0)))
    N, T, _ = call.hidden.shape
    S = call.key_tokens.shape[1]
    pb = kw.get("position_bias")
    if not torch.is_tensor(pb):
        if getattr(module, "has_relative_attention_bias", False):
            pb = module.compute_bias(T, S, device=call.hidden.device)
        else:
            pb = None
    if pb is not None:
        pb = pb[..., -T:, :S]
        call.pos_bias = pb
    return call


def hf_gpt2(module, args, kwargs) -> AttentionCall:
    """GPT-2 ``GPT2Attention``: c_attn is a ``Conv1D`` computing ``x @ weight + bias`` with
    weight (d, 3d) = [W_q^T | W_k^T | W_v^T]; causal."""
    _no_cross(kwargs, module)
    kw = _bound(module, args, kwargs)
    x = kw.get("hidden_states")
    x = x if torch.is_tensor(x) else args[0]
    d = x.shape[-1]
    w, b = module.c_attn.weight, module.c_attn.bias
    if hasattr(module, "scaling"):
        scale = float(module.scaling)
    else:  # older transformers
        scale = 1.0 / math.sqrt(d // _n_heads(module)) if getattr(module, "scale_attn_weights", True) else 1.0
        if getattr(module, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(module.layer_idx + 1)
    kw["hidden_states"] = x
    return _hf_call(module, kw, w[:, :d].T, b[:d], w[:, d:2 * d].T, b[d:2 * d], causal=True,
                    rotary=False, scale=scale)


def hf_neox(module, args, kwargs) -> AttentionCall:
    """GPT-NeoX: fused ``query_key_value`` whose output is per head [q_h | k_h | v_h] (3 d_h
    rows each); partial rotary embeddings (the first rotary_ndims coordinates)."""
    kw = _bound(module, args, kwargs)
    H = _n_heads(module)
    w = module.query_key_value.weight
    b = module.query_key_value.bias
    dh = w.shape[0] // (3 * H)
    w3 = w.reshape(H, 3, dh, -1)
    b3 = None if b is None else b.reshape(H, 3, dh)
    return _hf_call(module, kw, w3[:, 0].reshape(H * dh, -1), None if b3 is None else b3[:, 0].reshape(-1),
                    w3[:, 1].reshape(H * dh, -1), None if b3 is None else b3[:, 1].reshape(-1))


_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
             "average_attn_weights", "is_causal")


def torch_mha(module, args, kwargs) -> AttentionCall:
    """``torch.nn.MultiheadAttention`` called as self-attention (query is key): in_proj
    rows [W_q; W_k; W_v] (or q_proj_weight / k_proj_weight), scale 1/sqrt(d_h);
    key_padding_mask / attn_mask in PyTorch's convention (bool True = masked)."""
    call = dict(zip(_MHA_ARGS, args))
    call.update(kwargs)
    q, k = call["query"], call["key"]
    if not (q is k or (q.shape == k.shape and torch.equal(q, k))):
        raise ValueError("nn.MultiheadAttention: cross-attention calls (query is not key) are "
                         "not supported (the tracker follows self-attention)")
    if module.bias_k is not None:
        raise ValueError("nn.MultiheadAttention with add_bias_kv=True is not supported")
    if q.dim() == 2:  # unbatched (T, E)
        x = q[None]
    else:
        x = q if module.batch_first else q.transpose(0, 1)
    N, T, E = x.shape
    H = module.num_heads
    if module._qkv_same_embed_dim:
        Wq, Wk = module.in_proj_weight[:E], module.in_proj_weight[E:2 * E]
    else:
        Wq, Wk = module.q_proj_weight, module.k_proj_weight
    b = module.in_proj_bias
    allowed = None
    kpm, am = call.get("key_padding_mask"), call.get("attn_mask")
    if torch.is_tensor(kpm):
        allowed = allowed_from_mask(kpm.reshape(N, T) if kpm.dtype == torch.bool else kpm.reshape(N, T).float(),
                                    N, T, true_means_masked=True)
    if torch.is_tensor(am):
        a2 = am.reshape(N, H, T, T) if am.dim() == 3 and am.shape[0] == N * H else am
        a2 = allowed_from_mask(a2, N, T, true_means_masked=True)
        allowed = a2 if allowed is None else allowed & a2
    return AttentionCall(
        hidden=x, W_q=split_heads(Wq, H), W_k=split_heads(Wk, H),
        b_q=None if b is None else _bias(b[:E], H), b_k=None if b is None else _bias(b[E:2 * E], H),
        scale=1.0 / math.sqrt(E // H), causal=bool(call.get("is_causal") or False), allowed=allowed)


def _mha_weights_kwargs(module, args, kwargs):
    """Pre-hook rewrite for nn.MultiheadAttention: ask for per-head weights (need_weights=True,
    average_attn_weights=False) so that the extraction can be checked against them."""
    kwargs = dict(kwargs)
    names = _MHA_ARGS[:len(args)]
    for i, n in enumerate(names):
        if n in ("need_weights", "average_attn_weights"):
            args = args[:i]
            break
    kwargs.update(need_weights=True, average_attn_weights=False)
    return args, kwargs


def tl_attention(module, args, kwargs) -> AttentionCall:
    """TransformerLens ``HookedTransformer`` attention (``transformer_lens.components``
    ``Attention`` and ``GroupedQueryAttention``, the 3.x line): W_Q (H, d, d_h) and W_K (key
    heads expanded), b_Q, b_K, logits q . k / attn_scale, causal when the model's
    ``attention_dir`` is "causal", padding from the call's ``attention_mask`` (causal) or
    ``additive_attention_mask``, rotary rotations from the module's own ``apply_rotary``
    applied to the identity. Checked against the module's ``hook_pattern`` (its
    probabilities): ``pattern_from``. Refused by name: ALiBi, relative position bias, soft-capped
    scores, attention sinks, log-n scaling, q / k normalisation or clipping, split q / k / v
    inputs, a key-value cache. TransformerLens 4.x has neither ``HookedTransformer`` nor
    ``transformer_lens.components`` (its ``TransformerBridge`` wraps a Hugging Face model:
    track ``bridge.original_model``), so this extractor matches nothing there.

    ```pycon
    >>> from attnsvm.track import tl_attention
    >>> tl_attention.pattern_from        # the submodule whose output the check compares with
    'hook_pattern'

    ```
    """
    cfg = module.cfg
    kw = _bound(module, args, kwargs)
    why = None
    pet = getattr(cfg, "positional_embedding_type", "standard")
    if pet not in ("standard", "rotary", "shortformer"):
        why = f"positional_embedding_type={pet!r} (a position bias the SVM cannot represent)"
    elif getattr(cfg, "attn_scores_soft_cap", -1) and getattr(cfg, "attn_scores_soft_cap", -1) > 0:
        why = "attn_scores_soft_cap (soft-capped logits are not bilinear in the tokens)"
    elif getattr(cfg, "use_attention_sinks", False):
        why = "use_attention_sinks"
    elif getattr(cfg, "use_logn_attn", False):
        why = "use_logn_attn"
    elif getattr(module, "q_norm", None) is not None or getattr(cfg, "clip_qkv", None) is not None:
        why = "a normalisation or clipping of q / k (not bilinear in the tokens)"
    elif kw.get("past_kv_cache_entry") is not None:
        why = "a key-value cache (track a full forward pass)"
    if why:
        raise ValueError(f"TransformerLens {type(module).__name__}: {why}: not supported")
    x, y = kw.get("query_input"), kw.get("key_input")
    if not torch.is_tensor(x) or x.dim() != 3:
        raise ValueError(f"TransformerLens {type(module).__name__}: per-head q / k / v inputs "
                         "(use_split_qkv_input / use_attn_in) are not supported")
    if y is not None and y is not x and not (y.shape == x.shape and torch.equal(y, x)):
        raise ValueError(f"TransformerLens {type(module).__name__}: keys from another input than "
                         "the queries (cross-attention) are not supported")
    N, T, _ = x.shape
    W_q = module.W_Q.permute(0, 2, 1)  # (H, d, d_h) -> (H, d_h, d)
    W_k = module.W_K.permute(0, 2, 1)
    causal = (getattr(module, "_attention_dir_override", None) or cfg.attention_dir) == "causal"
    pad = kw.get("attention_mask")
    allowed = (allowed_from_mask(pad, N, T) if causal and torch.is_tensor(pad) else None)
    add = kw.get("additive_attention_mask")
    if torch.is_tensor(add):
        a2 = allowed_from_mask(add, N, T)
        allowed = a2 if allowed is None else allowed & a2
    R = None
    if pet == "rotary":
        dh = W_q.shape[1]
        basis = torch.eye(dh, dtype=x.dtype, device=x.device).expand(N, T, dh, dh)
        rot = module.apply_rotary(basis, 0, pad if torch.is_tensor(pad) else None)  # [n, t, j] = R_t e_j
        R = rot.transpose(-1, -2)
    return AttentionCall(hidden=x, W_q=W_q, W_k=W_k, b_q=module.b_Q, b_k=module.b_K,
                         scale=1.0 / float(module.attn_scale), causal=causal, allowed=allowed,
                         rotary=R)


tl_attention.pattern_from = "hook_pattern"

# (module, class name, required attributes, extractor): a module matches when a class of its
# MRO *is* that class (resolved from the already imported module: nothing is imported here;
# a user's class of the same name never matches) and it has the attributes
_BUILTIN_SPECS: tuple[tuple[str, str, tuple[str, ...], Extractor], ...] = (
    ("transformers.models.bert.modeling_bert", "BertSelfAttention", ("query", "key"),
     hf_linear("query", "key")),
    ("transformers.models.roberta.modeling_roberta", "RobertaSelfAttention", ("query", "key"),
     hf_linear("query", "key")),
    ("transformers.models.vit.modeling_vit", "ViTSelfAttention", ("query", "key"),
     hf_linear("query", "key")),  # transformers < 5
    ("transformers.models.vit.modeling_vit", "ViTAttention", ("q_proj", "k_proj"),
     hf_linear("q_proj", "k_proj")),
    ("transformers.models.distilbert.modeling_distilbert", "DistilBertSelfAttention",
     ("q_lin", "k_lin"), hf_linear("q_lin", "k_lin")),
    ("transformers.models.gpt2.modeling_gpt2", "GPT2Attention", ("c_attn",), hf_gpt2),
    ("transformers.models.llama.modeling_llama", "LlamaAttention", ("q_proj", "k_proj"), hf_decoder),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2Attention", ("q_proj", "k_proj"), hf_decoder),
    ("transformers.models.mistral.modeling_mistral", "MistralAttention", ("q_proj", "k_proj"), hf_decoder),
    ("transformers.models.gemma.modeling_gemma", "GemmaAttention", ("q_proj", "k_proj"), hf_decoder),
    ("transformers.models.phi.modeling_phi", "PhiAttention", ("q_proj", "k_proj"), hf_decoder),
    ("transformers.models.opt.modeling_opt", "OPTAttention", ("q_proj", "k_proj"), hf_decoder),
    ("transformers.models.gpt_neox.modeling_gpt_neox", "GPTNeoXAttention", ("query_key_value",), hf_neox),
    ("transformers.models.bart.modeling_bart", "BartAttention", ("q_proj", "k_proj"), hf_bart),
    ("transformers.models.t5.modeling_t5", "T5Attention", ("q", "k"), hf_t5),
    ("transformer_lens.components.abstract_attention", "AbstractAttention",
     ("W_Q", "W_K", "hook_pattern", "cfg"), tl_attention),
)


def _builtin_classes() -> dict[type, tuple[tuple[str, ...], Extractor]]:
    """{class: (required attributes, extractor)} of the built-ins whose module is imported."""
    import sys

    out = {}
    for mod, name, attrs, ext in _BUILTIN_SPECS:
        cls = getattr(sys.modules.get(mod), name, None)
        if isinstance(cls, type):
            out[cls] = (attrs, ext)
    return out


_USER: dict[type, Extractor] = {}

# Hugging Face model_type -> family name (what tests/test_track_architectures.py verifies)
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "gpt2": "GPT-2", "bert": "BERT", "roberta": "RoBERTa", "distilbert": "DistilBERT",
    "vit": "ViT", "llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "gemma": "Gemma",
    "phi": "Phi", "gpt_neox": "GPT-NeoX", "opt": "OPT", "bart": "BART", "t5": "T5",
}

SUPPORTED = ("torch.nn.MultiheadAttention",
             *(f"{v} ({k})" for k, v in SUPPORTED_MODEL_TYPES.items()),
             "TransformerLens HookedTransformer")


class UnsupportedModelError(ValueError):
    """A model whose attention the tracker cannot express exactly (named before loading).

    ```pycon
    >>> from attnsvm.track import UnsupportedModelError, check_config
    >>> try:
    ...     check_config({"model_type": "mamba"})
    ... except UnsupportedModelError as e:
    ...     print(str(e)[:38])
    model type 'mamba' is not supported by

    ```
    """


def _families() -> str:
    return ", ".join(f"{v} ({k})" for k, v in SUPPORTED_MODEL_TYPES.items())


def check_config(config) -> str:
    """Refuse an unsupported Hugging Face config (a ``PretrainedConfig`` or its dict) before any
    weight is loaded; returns the family name. Raises :class:`UnsupportedModelError` naming
    the model type, what is wrong and the supported families.

    ```pycon
    >>> from attnsvm.track import check_config
    >>> check_config({"model_type": "llama"})
    'Llama'

    ```
    """
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    mt = get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model type {mt!r} is not supported by attnsvm's attention extractors; supported "
            f"families: {_families()} (or register an extractor, docs/tracking.md)")
    pet = get("position_embedding_type", "absolute")
    if mt in ("bert", "roberta") and pet not in (None, "absolute"):
        raise UnsupportedModelError(
            f"{mt} with position_embedding_type={pet!r}: relative-key logits are not bilinear "
            "in the tokens; only 'absolute' is supported")
    if mt == "phi" and get("qk_layernorm", False):
        raise UnsupportedModelError("phi with qk_layernorm=True: normalised q / k make the logit "
                                    "non-bilinear in the tokens; not supported")
    return SUPPORTED_MODEL_TYPES[mt]


def register_extractor(cls: type, extract: Extractor) -> None:
    """Use ``extract(module, args, kwargs) -> AttentionCall`` for every module of ``cls``
    (and subclasses) in every tracker. The tracker checks the extraction against the
    probabilities the module returns (a tuple output holding an (N, H, T, S) tensor) or, when
    ``extract.pattern_from`` names a submodule, against that submodule's output; otherwise
    every row says ``recompute_check = "not checked: ..."``.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import AttentionCall, register_extractor, builtin_extractor, split_heads
    >>> class Mine(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__(); self.qk = torch.nn.Linear(4, 8)
    >>> def extract(module, args, kwargs):
    ...     W = module.qk.weight
    ...     return AttentionCall(hidden=args[0], W_q=split_heads(W[:4], 2), W_k=split_heads(W[4:], 2))
    >>> register_extractor(Mine, extract)
    >>> builtin_extractor(Mine()) is extract
    True
    >>> from attnsvm.track import extract as _ex; del _ex._USER[Mine]   # (the example's clean-up)

    ```
    """
    if not isinstance(cls, type) or not callable(extract):
        raise ValueError("register_extractor(cls, extract): a class and a callable")
    _USER[cls] = extract


def builtin_extractor(module) -> Extractor | None:
    """The registered or built-in extractor for ``module``, or None: the first class of its
    MRO that :func:`register_extractor` registered, else that a built-in is keyed by (the
    class itself, not its name).

    ```pycon
    >>> import torch
    >>> from attnsvm.track import builtin_extractor
    >>> builtin_extractor(torch.nn.MultiheadAttention(8, 2)).__name__
    'torch_mha'
    >>> class LlamaAttention(torch.nn.Module):   # same name as transformers' class: no match
    ...     pass
    >>> builtin_extractor(LlamaAttention()) is None
    True

    ```
    """
    for cls in type(module).__mro__:
        if cls in _USER:
            return _USER[cls]
    if isinstance(module, torch.nn.MultiheadAttention):
        return torch_mha
    table = _builtin_classes()
    for cls in type(module).__mro__:
        entry = table.get(cls)
        if entry and all(hasattr(module, a) for a in entry[0]):
            return entry[1]
    return None


def _looks_like_attention(name: str, module) -> bool:
    s = (name.rsplit(".", 1)[-1] + " " + type(module).__name__).lower()
    return "attn" in s or "attention" in s
def find_attention(model: torch.nn.Module, modules=None, extractors=None) -> list[tuple[str, torch.nn.Module, Extractor]]:
    """[(name, module, extractor)] of the self-attention modules to track, in model order.

    modules: optional list of module names to track (default: every supported module).
    extractors: optional {module name or class: extractor} taking precedence.
    Raises ValueError naming the module(s) when a requested module, or the whole model, has
    no extractor.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import find_attention
    >>> layer = torch.nn.TransformerEncoderLayer(8, 2, batch_first=True)
    >>> [(name, type(m).__name__, ext.__name__) for name, m, ext in find_attention(layer)]
    [('self_attn', 'MultiheadAttention', 'torch_mha')]

    ```
    """
    extractors = dict(extractors or {})
    cfg = getattr(model, "config", None)
    if not extractors and modules is None and getattr(cfg, "model_type", None) in SUPPORTED_MODEL_TYPES:
        check_config(cfg)  # family-specific options the extractors cannot express
    by_name = {k: v for k, v in extractors.items() if isinstance(k, str)}
    by_cls = {k: v for k, v in extractors.items() if isinstance(k, type)}
    named = dict(model.named_modules())
    unknown = [n for n in list(by_name) + list(modules or []) if n not in named]
    if unknown:
        raise ValueError(f"{type(model).__name__} has no module named {unknown[0]!r}")

    def pick(name, mod):
        if name in by_name:
            return by_name[name]
        for cls in type(mod).__mro__:
            if cls in by_cls:
                return by_cls[cls]
        return builtin_extractor(mod)

    found = []
    if modules is not None:
        for name in modules:
            ext = pick(name, named[name])
            if ext is None:
                raise ValueError(
                    f"module {name!r} ({type(named[name]).__name__}) has no extractor; supported: "
                    f"{', '.join(SUPPORTED)}; or pass extractors={{{name!r}: fn}} (see docs/tracking.md)")
            found.append((name, named[name], ext))
        return found
    inside: list[str] = []
    for name, mod in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        ext = pick(name, mod)
        if ext is not None:
            found.append((name, mod, ext))
            inside.append(name)
    if not found:
        cands = [f"{n} ({type(m).__name__})" for n, m in model.named_modules()
                 if n and _looks_like_attention(n, m)]
        hint = (f"; modules that look like attention: {', '.join(cands[:6])}"
                + (" ..." if len(cands) > 6 else "")) if cands else ""
        mt = getattr(cfg, "model_type", None)
        raise UnsupportedModelError(
            f"no supported attention module in {type(model).__name__}"
            f"{f' (model type {mt!r})' if mt else ''}{hint}. Supported: "
            f"{', '.join(SUPPORTED)}; for another module pass extractors={{'name': fn}} or "
            "register_extractor(cls, fn) (docs/tracking.md)")
    return found
