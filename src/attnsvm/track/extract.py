"""Extractors: what a self-attention module computes, in the library's convention.

An extractor is a function ``extract(module, args, kwargs) -> AttentionCall`` called in a
forward pre-hook of an attention module with the arguments of that call. It returns the
hidden states entering the attention and the head's query/key maps:

    q_h(x) = W_q[h] x + b_q[h],   k_h(x) = W_k[h] x + b_k[h]          (W_q[h], W_k[h]: (d_h, d))
    logit of query token k for key token t:  scale * q_h(x_k) . k_h(x_t)   (scale = 1/sqrt(d_h))

Dropping the terms that do not depend on the key t (they cancel in the softmax), in the
keys-on-the-left convention of docs/theory.md §2 (a_{kt} = x_t^T W z with z = x_k):

    a_{kt} = x_t^T W_h x_k + u_h^T x_t + const(k),
    W_h = scale * W_k[h]^T W_q[h]   (d x d, rank <= d_h),   u_h = scale * W_k[h]^T b_q[h].

(b_k never matters.) Built in: ``torch.nn.MultiheadAttention`` (self-attention calls),
Hugging Face BERT / RoBERTa / DistilBERT (``nn.Linear`` q/k, rows = output features),
GPT-2 (``Conv1D`` c_attn: ``x @ weight + bias``, weight (d, 3d), so W_q = weight[:, :d]^T;
causal) and ViT. :func:`register_extractor` adds a class; a ``Tracker`` also accepts
extractors per module name.
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
]

# additive masks: entries <= this are "masked" (HF uses finfo.min, older code -10000)
MASKED_BELOW = -1.0e4

Extractor = Callable[[torch.nn.Module, tuple, dict], "AttentionCall"]


@dataclass
class AttentionCall:
    """One call of a self-attention module (tensors detached; any dtype / device).

    hidden:  (N, T, d) tokens entering the attention (queries = keys = hidden).
    W_q, W_k: (H, d_h, d) per-head query / key maps (q_h = W_q[h] x + b_q[h]).
    b_q, b_k: (H, d_h) or None.
    scale:   logits = scale * q . k; None means 1 / sqrt(d_h).
    causal:  query k sees keys t <= k only.
    allowed: (N, T, T) bool [query, key] (padding etc.) or None (all); ``causal`` is applied
             on top. A query is valid iff it may attend to itself (padded queries may not).
    attn:    (N, H, T, T) the probabilities the module itself returned, if any (filled by the
             tracker from the module's output; used only to check the recomputation).
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

    def detached(self) -> AttentionCall:
        """A copy whose tensors are detached from autograd (what the tracker stores)."""
        from dataclasses import replace

        def det(t):
            return t.detach() if torch.is_tensor(t) else t

        return replace(self, **{f: det(getattr(self, f)) for f in
                                ("hidden", "W_q", "W_k", "b_q", "b_k", "allowed", "attn")})

    def validate(self, where: str = "extractor") -> AttentionCall:
        """Check shapes (clear errors for user-written extractors); returns self."""
        x = self.hidden
        if not torch.is_tensor(x) or x.dim() != 3:
            raise ValueError(f"{where}: hidden must be a (N, T, d) tensor; got "
                             f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
        N, T, d = x.shape
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
        if self.allowed is not None and tuple(self.allowed.shape) != (N, T, T):
            raise ValueError(f"{where}: allowed must have shape ({N}, {T}, {T}); got "
                             f"{tuple(self.allowed.shape)}")
        return self


# ------------------------------------------------------------------------------ helpers
def split_heads(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(H d_h, d) output-major weight (``nn.Linear.weight`` rows) -> (H, d_h, d)."""
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


def allowed_from_mask(mask, N: int, T: int, *, true_means_masked: bool = False) -> torch.Tensor:
    """(N, T, T) bool [query, key] from a Hugging Face / PyTorch attention mask.

    Accepted: None (all allowed); bool (True = attend, or True = masked when
    ``true_means_masked``, PyTorch's convention); additive float masks (0 = attend,
    <= MASKED_BELOW = masked; any other value is a position bias the SVM cannot represent:
    ValueError); shapes (N, T) key padding (HF 2-D masks: nonzero = attend), (T, T),
    (N, T, T), (N, 1 or H, T, T) (heads must agree).
    """
    if mask is None:
        return None
    m = mask
    if m.dtype == torch.bool:
        a = ~m if true_means_masked else m
    elif m.dim() == 2 and m.shape == (N, T) and not m.is_floating_point():
        a = m != 0  # HF-style 2-D key-padding mask of 0 / 1
    else:
        mf = m.to(torch.float64)
        a = mf > MASKED_BELOW
        bad = a & (mf != 0)
        if bool(bad.any()):
            raise ValueError("additive attention bias other than a 0 / -inf mask (e.g. ALiBi or "
                             "relative positions) is not supported: the logits are not "
                             "x_t^T W x_k + u^T x_t")
    if a.dim() == 2 and a.shape == (N, T):
        a = a[:, None, :].expand(N, T, T)
    elif a.dim() == 2:
        a = a[None].expand(N, T, T)
    elif a.dim() == 4:
        if a.shape[1] > 1 and not bool((a == a[:, :1]).all()):
            raise ValueError("attention masks that differ between heads are not supported")
        a = a[:, 0]
    a = a.expand(N, T, T) if a.shape[0] == 1 else a
    if tuple(a.shape) != (N, T, T):
        raise ValueError(f"attention mask of shape {tuple(mask.shape)} does not fit N={N}, T={T}")
    return a


def _n_heads(module) -> int:
    for name in ("num_attention_heads", "num_heads", "n_heads", "n_head"):
        if isinstance(getattr(module, name, None), int):
            return getattr(module, name)
    raise ValueError(f"{type(module).__name__}: no head count attribute (num_attention_heads / "
                     "num_heads / n_heads)")


def _no_cross(kwargs, module):
    if kwargs.get("encoder_hidden_states") is not None or getattr(module, "is_cross_attention", False):
        raise ValueError(f"{type(module).__name__}: cross-attention calls are not supported "
                         "(the tracker follows self-attention)")


# ---------------------------------------------------------------------------- built-ins
def hf_linear(q_name: str, k_name: str) -> Extractor:
    """Hugging Face attention with ``nn.Linear`` query / key projections named ``q_name``,
    ``k_name`` (rows = output features = heads x d_h): BERT, RoBERTa, DistilBERT, ViT."""

    def extract(module, args, kwargs) -> AttentionCall:
        _no_cross(kwargs, module)
        x = _hidden(args, kwargs)
        N, T, _ = x.shape
        H = _n_heads(module)
        q, k = getattr(module, q_name), getattr(module, k_name)
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        dh = q.weight.shape[0] // H
        return AttentionCall(
            hidden=x, W_q=split_heads(q.weight, H), W_k=split_heads(k.weight, H),
            b_q=_bias(q.bias, H), b_k=_bias(k.bias, H),
            scale=float(getattr(module, "scaling", 1.0 / math.sqrt(dh))),
            causal=bool(getattr(module, "is_causal", False)),
            allowed=allowed_from_mask(mask if torch.is_tensor(mask) else None, N, T))

    return extract


def hf_gpt2(module, args, kwargs) -> AttentionCall:
    """GPT-2 ``GPT2Attention``: c_attn is a ``Conv1D`` computing ``x @ weight + bias`` with
    weight (d, 3d) = [W_q^T | W_k^T | W_v^T]; causal."""
    _no_cross(kwargs, module)
    x = _hidden(args, kwargs)
    N, T, d = x.shape
    H = _n_heads(module)
    w, b = module.c_attn.weight, module.c_attn.bias
    dh = d // H
    if hasattr(module, "scaling"):
        scale = float(module.scaling)
    else:  # older transformers
        scale = 1.0 / math.sqrt(dh) if getattr(module, "scale_attn_weights", True) else 1.0
        if getattr(module, "scale_attn_by_inverse_layer_idx", False):
            scale /= float(module.layer_idx + 1)
    mask = kwargs.get("attention_mask")
    return AttentionCall(
        hidden=x, W_q=split_heads(w[:, :d].T, H), W_k=split_heads(w[:, d:2 * d].T, H),
        b_q=_bias(b[:d], H), b_k=_bias(b[d:2 * d], H), scale=scale, causal=True,
        allowed=allowed_from_mask(mask if torch.is_tensor(mask) else None, N, T))


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


# class name -> (required attributes, extractor); a class matches when it has the attributes
_BUILTIN: dict[str, tuple[tuple[str, ...], Extractor]] = {
    "BertSelfAttention": (("query", "key"), hf_linear("query", "key")),
    "RobertaSelfAttention": (("query", "key"), hf_linear("query", "key")),
    "ViTSelfAttention": (("query", "key"), hf_linear("query", "key")),  # transformers < 5
    "ViTAttention": (("q_proj", "k_proj"), hf_linear("q_proj", "k_proj")),
    "DistilBertSelfAttention": (("q_lin", "k_lin"), hf_linear("q_lin", "k_lin")),
    "GPT2Attention": (("c_attn",), hf_gpt2),
}
_USER: dict[type, Extractor] = {}

SUPPORTED = ("torch.nn.MultiheadAttention", "transformers BERT (BertSelfAttention)",
             "RoBERTa (RobertaSelfAttention)", "DistilBERT (DistilBertSelfAttention)",
             "GPT-2 (GPT2Attention, causal)", "ViT (ViTAttention / ViTSelfAttention)")


def register_extractor(cls: type, extract: Extractor) -> None:
    """Use ``extract(module, args, kwargs) -> AttentionCall`` for every module of ``cls``
    (and subclasses) in every tracker."""
    if not isinstance(cls, type) or not callable(extract):
        raise ValueError("register_extractor(cls, extract): a class and a callable")
    _USER[cls] = extract


def builtin_extractor(module) -> Extractor | None:
    """The registered or built-in extractor for ``module``, or None."""
    for cls in type(module).__mro__:
        if cls in _USER:
            return _USER[cls]
    if isinstance(module, torch.nn.MultiheadAttention):
        return torch_mha
    entry = _BUILTIN.get(type(module).__name__)
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
    """
    extractors = dict(extractors or {})
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
        raise ValueError(
            f"no supported attention module in {type(model).__name__}{hint}. Supported: "
            f"{', '.join(SUPPORTED)}; for another module pass extractors={{'name': fn}} or "
            "register_extractor(cls, fn) (docs/tracking.md)")
    return found
