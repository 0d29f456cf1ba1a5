"""Per-head statistics of one self-attention call: sparsity, the head's key-query matrix, the
seq-to-seq ATT-SVM of the tokens it selects (with certificate) and its nulls.

Convention (docs/theory.md §2, keys on the left; see :mod:`attnsvm.track.extract`): head h's logit of
query token k for key token t is, up to a per-query constant,

    a_{kt} = x_t^T W x_k + u^T x_t,   W = scale W_k^T W_q (d x d, rank <= d_h),
                                      u = scale W_k^T b_q,   scale = 1/sqrt(d_h) by default.

Head subspace. W maps into span(W_k^T) and reads only the query's component in span(W_q^T);
with orthonormal bases U_Q, U_K (d x r) of these spaces, W = U_K M U_Q^T with
M = U_K^T W U_Q (r x r), and u = U_K (U_K^T u). With ``bias="augment"`` (default) queries get a
constant 1 coordinate, z' = [U_Q^T x_k; 1], keys are x'_t = U_K^T x_t and the head's matrix is
M' = [M, U_K^T u] (r x (r + 1)): x'_t^T M' z'_k reproduces the head's logits exactly up to a
per-query constant, so the head realises its own argmax selection. ``bias="ignore"`` drops u.

Selection and SVM. alpha_{ik} = argmax_t s_{ikt} over the keys query k may see (causal: t <= k,
padding excluded), for the valid queries whose max attention >= ``min_attention`` (at most
``max_queries`` (sentence, query) pairs, seeded sample). The seq-to-seq SAtt-SVM (docs/theory.md §5)
written as one cross-attention sequence per pair (keys x'_{it}, query z'_{ik}; the flattening
:func:`attnsvm.svm.seq2seq_svm` does, with separate key / query coordinates), solved by the core
solver :func:`attnsvm.svm.att_svm` (Frobenius norm):

    W_mm = argmin ||W||_F  s.t.  (x'_{i,alpha_ik} - x'_{it})^T W z'_{ik} >= 1,  t != alpha_ik allowed.

Reported: corr(M', W_mm), the margin ratio (M''s normalised margin) * ||W_mm||_F (1 iff the head
is exactly the max-margin direction; with the bias augmented it lies in (0, 1]), the certificate
of W_mm, and two nulls:

- random selection: the same statistic for uniformly random selections among the same allowed
  keys (``null_draws`` SVMs; infeasible draws counted);
- rotation: corr(R_K M R_Q^T | R_K U_K^T u), W_mm) for Haar-random rotations R_K, R_Q of the
  head's key / query coordinates (``rot_draws``, no solve). It keeps the selection, W_mm, the
  subspace and the singular values (norm, rank, bias norm) of the head and breaks only the
  orientation of the trained matrix relative to the tokens; by symmetry its mean is 0.

Neither null separates training from architecture: any matrix is positively correlated with
the SVM of the selection it makes itself. That needs a control (the same architecture with
random weights, or the same model at initialisation), which the probe and the tracker's step 0
provide.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from attnsvm.metrics import correlation, soft_sparsity

from .extract import AttentionCall

__all__ = [
    "TrackConfig",
    "RecomputeError",
    "RECOMPUTE_TOL",
    "head_logits",
    "recompute_attention",
    "recompute_error",
    "recompute_bound",
    "check_recompute",
    "mask_unused",
    "rotary_basis",
    "rotary_subspace",
    "attention_stats",
    "head_subspace",
    "subspace_tokens",
    "selection_problem",
    "margins",
    "solve_selection",
    "rotation_null",
    "analyse_call",
    "graph_problem",
    "GRAPH_LOGIT_TOL",
]


@dataclass(frozen=True)
class TrackConfig:
    """What is computed per head at each recorded step.

    min_attention: queries enter the SVM if their max attention >= this (0: every valid query).
    max_queries:   at most this many (sentence, query) pairs per head SVM (seeded sample).
    null_draws:    random-selection SVMs per head (the random-selection null).
    rot_draws:     Haar rotations per head (the rotation null; no solve).
    bias:          "augment" (exact logits, constant-1 query coordinate) or "ignore".
    svm:           False skips the SVM and the nulls (sparsity and norms only).
    seed:          seeds the query sample and the nulls (with step, layer and head).
    check:         raise RecomputeError when the recomputed attention differs from the model's
                   own (eager) attention by more than its rounding-error bound in the dtype the
                   model ran in (:func:`recompute_bound`), or by more than ``recompute_tol``
                   (an absolute tolerance on the probabilities) when that is given.
    max_unknowns:  a head SVM with more unknowns (entries of its matrix; rotary heads: the
                   lifted L r_k x r_q matrix) is skipped with a status instead of solved.
    graph:         also solve the Graph-SVM of the head's own tokens at the last query of each
                   sequence (next-token prediction; :mod:`attnsvm.track.graph`): graph_* columns.
    graph_norms:   the Graph-SVM norms, ("fro",) by default (add "nuc" for (K, Q)'s geometry).
    graph_mass:    None: each sequence's label is the token id of largest attention mass at its
                   last query; a float: every id with mass > graph_mass (ntp-local's rule).

    ```pycon
    >>> from attnsvm.track import TrackConfig
    >>> TrackConfig(max_queries=8, null_draws=0).max_queries
    8
    >>> TrackConfig(bias="both")
    Traceback (most recent call last):
    ...
    ValueError: bias must be 'augment' or 'ignore'; got 'both'

    ```
    """

    min_attention: float = 0.0
    max_queries: int = 32
    null_draws: int = 2
    rot_draws: int = 32
    bias: str = "augment"
    svm: bool = True
    seed: int = 0
    check: bool = True
    recompute_tol: float | None = None
    max_unknowns: int = 250_000
    graph: bool = False
    graph_norms: tuple = ("fro",)
    graph_mass: float | None = None

    def __post_init__(self):
        for name in ("max_queries", "null_draws", "rot_draws", "seed", "max_unknowns"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name} must be an integer; got {v!r}")
        for name in ("svm", "check", "graph"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")
        for name in ("min_attention", "recompute_tol", "graph_mass"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.floating))
                                  or not math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number{' or None' if name != 'min_attention' else ''}; "
                                 f"got {v!r}")
        if self.seed < 0 or self.max_unknowns < 1:
            raise ValueError(f"seed must be >= 0 and max_unknowns >= 1; got {self.seed}, {self.max_unknowns}")
        norms = (self.graph_norms,) if isinstance(self.graph_norms, str) else tuple(self.graph_norms)
        if not norms or any(n not in ("fro", "nuc") for n in norms) or len(set(norms)) < len(norms):
            raise ValueError(f"graph_norms must be distinct names among 'fro', 'nuc'; got {self.graph_norms!r}")
        object.__setattr__(self, "graph_norms", norms)
        if self.graph_mass is not None and not 0 < self.graph_mass < 1:
            raise ValueError(f"graph_mass must be None or in (0, 1); got {self.graph_mass}")
        if self.bias not in ("augment", "ignore"):
            raise ValueError(f"bias must be 'augment' or 'ignore'; got {self.bias!r}")
        if not 0 <= self.min_attention <= 1:
            raise ValueError(f"min_attention must be in [0, 1]; got {self.min_attention}")
        if self.max_queries < 1 or self.null_draws < 0 or self.rot_draws < 0:
            raise ValueError("max_queries must be >= 1, null_draws and rot_draws >= 0")
        if self.recompute_tol is not None and not self.recompute_tol > 0:
            raise ValueError(f"recompute_tol must be > 0 or None; got {self.recompute_tol}")


# ------------------------------------------------------------------------ attention
class RecomputeError(ValueError):
    """The extracted head does not reproduce the model's own (eager) attention: a wrong or
    unsupported extractor. Raised instead of returning statistics of the wrong matrix.

    ```pycon
    >>> from attnsvm.track import AttentionCall, RecomputeError, analyse_call, recompute_attention
    >>> call = AttentionCall.random()
    >>> attn = recompute_attention(call)[0]                 # "the model's" probabilities
    >>> try:
    ...     analyse_call(AttentionCall(hidden=call.hidden, W_q=1.1 * call.W_q, W_k=call.W_k,
    ...                                attn=attn))          # a query map 10% off
    ... except RecomputeError:
    ...     print("refused")
    refused

    ```
    """


# the Graph-SVM tokens reproduce the head's logits to this (relative to max(1, |logit|))
GRAPH_LOGIT_TOL = 1e-8
# kept for reference (the tolerances before the rounding-error bound of recompute_bound):
# absolute tolerances on the probabilities by dtype; no longer the default of the check
RECOMPUTE_TOL = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 3e-2}
# recompute_bound: lambda of the probabilistic rounding-error model (Higham & Mary 2019:
# |error of an n-term dot product| <= lambda sqrt(n) u sum |a_i b_i| with probability at least
# 1 - 2 exp(-lambda^2 / 2); 2e-22 for lambda = 10)
ROUNDING_LAMBDA = 10.0


def _allowed(call: AttentionCall) -> torch.Tensor:
    N, T, _ = call.hidden.shape
    S = call.key_tokens.shape[1]
    dev = call.hidden.device
    a = (call.allowed.to(dev).bool() if call.allowed is not None
         else torch.ones(N, T, S, dtype=torch.bool, device=dev))
    if call.causal:
        a = a & torch.ones(T, S, dtype=torch.bool, device=dev).tril(S - T)
    return a


def _query_valid(call: AttentionCall, allowed: torch.Tensor) -> torch.Tensor:
    if call.keys is None:
        return allowed.diagonal(dim1=-2, dim2=-1)
    return allowed.any(-1)


@torch.no_grad()
def head_logits(call: AttentionCall) -> torch.Tensor:
    """(N, H, T, S) float64 logits [query, key] of every head, before masking:
    scale (R_k (W_q x_k + b_q)) . (R_t (W_k y_t + b_k)) + b_h(k, t) (y = keys for cross-attention;
    R = identity without rotary embeddings, b = 0 without a position bias).

    ```pycon
    >>> from attnsvm.track import AttentionCall
    >>> from attnsvm.track.heads import head_logits
    >>> call = AttentionCall.random(causal=True)
    >>> tuple(head_logits(call).shape)
    (2, 2, 5, 5)

    ```
    """
    x = call.hidden.detach().to(torch.float64)
    y = call.key_tokens.detach().to(x.device, torch.float64)
    Wq = call.W_q.detach().to(x.device, torch.float64)
    Wk = call.W_k.detach().to(x.device, torch.float64)
    q = torch.einsum("ntd,hrd->nhtr", x, Wq)
    k = torch.einsum("ntd,hrd->nhtr", y, Wk)
    if call.b_q is not None:
        q = q + call.b_q.detach().to(x.device, torch.float64)[None, :, None, :]
    if call.b_k is not None:
        k = k + call.b_k.detach().to(x.device, torch.float64)[None, :, None, :]
    if call.rotary is not None:
        R = call.rotary.detach().to(x.device, torch.float64)
        q = torch.einsum("ntab,nhtb->nhta", R, q)
        k = torch.einsum("ntab,nhtb->nhta", R, k)
    logits = call.scale_ * q @ k.transpose(-1, -2)
    if call.pos_bias is not None:
        logits = logits + call.pos_bias.detach().to(x.device, torch.float64)
    return logits


@torch.no_grad()
def recompute_attention(call: AttentionCall):
    """(s, allowed, query_valid) in float64 on the call's device.

    s (N, H, T, S) [query, key] = softmax_t of :func:`head_logits` over the allowed keys (0 on
    rows of invalid queries); allowed (N, T, S) with causality applied; query_valid (N, T) =
    allowed[n, k, k] for self-attention (a query is valid iff it may attend to itself), any
    allowed key for cross-attention.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import AttentionCall, recompute_attention
    >>> x = torch.randn(1, 4, 3, dtype=torch.float64)
    >>> W = torch.randn(2, 2, 3, dtype=torch.float64)
    >>> s, allowed, qv = recompute_attention(AttentionCall(hidden=x, W_q=W, W_k=W, causal=True))
    >>> tuple(s.shape), s[0, 0, 0].tolist(), bool(torch.allclose(s.sum(-1), torch.ones(1, 2, 4, dtype=s.dtype)))
    ((1, 2, 4, 4), [1.0, 0.0, 0.0, 0.0], True)

    ```
    """
    allowed = _allowed(call)
    logits = head_logits(call).masked_fill(~allowed[:, None], float("-inf"))
    qv = _query_valid(call, allowed)
    s = torch.softmax(logits, -1)
    s = torch.where(qv[:, None, :, None], s, torch.zeros((), dtype=s.dtype, device=s.device))
    return s, allowed, qv


def _unit_roundoff(*dtypes) -> float:
    """Largest unit roundoff u = eps / 2 among the floating dtypes given."""
    return max(float(torch.finfo(dt).eps) / 2 for dt in dtypes if dt is not None and dt.is_floating_point)


def _matmul_roundoff(dtype, device) -> float:
    """Unit roundoff of a matrix product in ``dtype`` as torch runs it: float32 products may
    run in TF32 (``torch.get_float32_matmul_precision() == "high"``, or CUDA's
    ``allow_tf32``: u = 2^-11) or in bfloat16 ("medium": u = 2^-8)."""
    u = _unit_roundoff(dtype)
    if dtype == torch.float32:
        prec = torch.get_float32_matmul_precision()
        if prec == "medium":
            u = max(u, 2.0 ** -8)
        elif prec == "high" or (torch.device(device).type == "cuda"
                                and torch.backends.cuda.matmul.allow_tf32):
            u = max(u, 2.0 ** -11)
    return u


def mask_unused(call: AttentionCall) -> AttentionCall:
    """The call with the token vectors that no valid query uses (neither a valid query nor a key
    some valid query may see: padding, positions outside every sliding window) set to 0 where
    they are not finite; the statistics never read them. Hugging Face's eager attention in
    float64 returns NaN rows for fully masked (padded) queries, which reach the next layer's
    input at those positions only. Returns ``call`` itself when there is nothing to mask.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import AttentionCall, mask_unused
    >>> x = torch.ones(1, 3, 2, dtype=torch.float64); x[0, 0] = float("nan")   # a padded token
    >>> allowed = torch.tensor([[[0, 0, 0], [0, 1, 1], [0, 1, 1]]], dtype=torch.bool)
    >>> W = torch.eye(2, dtype=torch.float64)[None]
    >>> mask_unused(AttentionCall(hidden=x, W_q=W, W_k=W, allowed=allowed)).hidden[0, 0].tolist()
    [0.0, 0.0]

    ```
    """
    from dataclasses import replace

    allowed = _allowed(call)
    qv = _query_valid(call, allowed)
    key_used = (allowed & qv[..., None]).any(1)  # (N, S)
    if call.keys is None:
        used = qv | key_used
        bad = ~torch.isfinite(call.hidden).all(-1) & ~used.to(call.hidden.device)
        if not bool(bad.any()):
            return call
        return replace(call, hidden=call.hidden.masked_fill(bad[..., None], 0))
    out = {}
    bad_q = ~torch.isfinite(call.hidden).all(-1) & ~qv.to(call.hidden.device)
    if bool(bad_q.any()):
        out["hidden"] = call.hidden.masked_fill(bad_q[..., None], 0)
    bad_k = ~torch.isfinite(call.keys).all(-1) & ~key_used.to(call.keys.device)
    if bool(bad_k.any()):
        out["keys"] = call.keys.masked_fill(bad_k[..., None], 0)
    return replace(call, **out) if out else call


@torch.no_grad()
def recompute_bound(call: AttentionCall, s) -> np.ndarray:
    """(N, H, T, S) bound on |s_model - s| entry by entry: how far the model's own attention,
    computed in its dtype, may lie from the exact (float64) recomputation ``s`` by rounding.

    With u the unit roundoff of the model's dtype (the largest of the tokens', weights' and
    returned probabilities' dtypes, and of TF32 / bfloat16 where torch runs float32 matrix
    products in them: ``torch.get_float32_matmul_precision()``, CUDA's ``allow_tf32``), u_s = max(u, 2^-24) that of its softmax (Hugging Face
    runs it in float32 at least), n = d + d_h + 8 (the projection, the dot product, rotation,
    scaling and bias) and |q|, |k| the entrywise magnitudes |W_q| |x| + |b_q| (rotated by |R|),
    each logit is off by at most

        delta(k, t) = lambda sqrt(n) u scale sum_r |q_r(k)| |k_r(t)| + 2 u |b_h(k, t)|

    (the probabilistic rounding model of Higham & Mary 2019, lambda = ``ROUNDING_LAMBDA``);
    the softmax turns logit errors of at most delta_k = max_t delta(k, t) into a relative
    error of at most exp(2 delta_k) - 1 on every probability, and adds its own
    lambda sqrt(S + 4) u_s plus the rounding of the result to the model's dtype (2 u), above
    an absolute floor of the dtype's smallest normal number:

        |s_model - s| <= s (expm1(2 delta_k) + lambda sqrt(S + 4) u_s + 2 u) + tiny.

    The bound scales with the head's own logits, so an extractor off by 10% in scale is
    caught in float32 (and far below) while a faithful one passes in any precision.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import AttentionCall, recompute_attention, recompute_bound
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(2, 6, 16, generator=g) * 0.1            # a float32 head, computed in float32
    >>> Wq, Wk = torch.randn(2, 8, 16, generator=g) * 0.3, torch.randn(2, 8, 16, generator=g) * 0.3
    >>> q, k = torch.einsum("ntd,hrd->nhtr", x, Wq), torch.einsum("ntd,hrd->nhtr", x, Wk)
    >>> attn = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1)
    >>> for f in (1.0, 1.1):
    ...     call = AttentionCall(hidden=x, W_q=f * Wq, W_k=Wk, attn=attn)
    ...     s = recompute_attention(call)[0].numpy()
    ...     print(f, bool((abs(s - attn.double().numpy()) <= recompute_bound(call, s)).all()))
    1.0 True
    1.1 False

    ```
    """
    dts = [call.hidden.dtype, call.W_q.dtype, None if call.attn is None else call.attn.dtype]
    u = max(_unit_roundoff(*dts), _matmul_roundoff(call.hidden.dtype, call.hidden.device))
    u_s = max(u, 2.0 ** -24)
    tiny = float(torch.finfo(call.attn.dtype if call.attn is not None else call.hidden.dtype).tiny)
    x = call.hidden.detach().to(torch.float64).abs()
    y = call.key_tokens.detach().to(x.device, torch.float64).abs()
    qa = torch.einsum("ntd,hrd->nhtr", x, call.W_q.detach().to(x.device, torch.float64).abs())
    ka = torch.einsum("ntd,hrd->nhtr", y, call.W_k.detach().to(x.device, torch.float64).abs())
    if call.b_q is not None:
        qa = qa + call.b_q.detach().to(x.device, torch.float64).abs()[None, :, None, :]
    if call.b_k is not None:
        ka = ka + call.b_k.detach().to(x.device, torch.float64).abs()[None, :, None, :]
    if call.rotary is not None:
        Ra = call.rotary.detach().to(x.device, torch.float64).abs()
        qa = torch.einsum("ntab,nhtb->nhta", Ra, qa)
        ka = torch.einsum("ntab,nhtb->nhta", Ra, ka)
    n = x.shape[-1] + call.d_head + 8
    delta = ROUNDING_LAMBDA * math.sqrt(n) * u * abs(call.scale_) * (qa @ ka.transpose(-1, -2))
    if call.pos_bias is not None:
        delta = delta + 2 * u * call.pos_bias.detach().to(x.device, torch.float64).abs()
    allowed = _allowed(call).to(x.device)
    dk = torch.where(allowed[:, None], delta, torch.zeros((), dtype=delta.dtype, device=x.device)).amax(-1)
    S = allowed.shape[-1]
    rel = torch.expm1(2 * dk) + ROUNDING_LAMBDA * math.sqrt(S + 4) * u_s + 2 * u  # (N, H, T)
    s = torch.as_tensor(np.asarray(s), dtype=torch.float64, device=x.device)
    return (s * rel[..., None] + tiny).cpu().numpy()


def recompute_error(call: AttentionCall, s: np.ndarray, allowed: np.ndarray, qv: np.ndarray,
                    bound: np.ndarray | None = None):
    """max |s_recomputed - s_model| over valid queries and allowed keys (probabilities, so
    absolute = relative to the row's mass 1); NaN when the model returned no attention.
    With ``bound`` (:func:`recompute_bound`) returns (error, ratio): ratio = the largest
    |s_recomputed - s_model| / bound (the check passes iff ratio <= 1).

    ```pycon
    >>> import torch
    >>> from attnsvm.track import AttentionCall, recompute_attention
    >>> from attnsvm.track.heads import recompute_error
    >>> call = AttentionCall.random(causal=True)
    >>> s, allowed, qv = (t.numpy() for t in recompute_attention(call))
    >>> call.attn = torch.as_tensor(s) * 1.01          # "the model's" probabilities, 1% off
    >>> round(float(recompute_error(call, s, allowed, qv) / s.max()), 6)
    0.01

    ```
    """
    if call.attn is None or tuple(call.attn.shape) != s.shape:
        return float("nan") if bound is None else (float("nan"), float("nan"))
    ref = call.attn.detach().to(torch.float64).cpu().numpy()
    both = qv[:, None, :, None] & allowed[:, None]
    diff = np.abs(np.where(both, s - ref, 0.0))
    err = float(diff.max()) if both.any() else 0.0
    if bound is None:
        return err
    return err, (float((diff / bound).max()) if both.any() else 0.0)


def check_recompute(call: AttentionCall, err: float, tol: float | None = None, where: str = "",
                    ratio: float | None = None) -> None:
    """Raise :class:`RecomputeError` when the recomputation disagrees with the model: ``err``
    above the absolute ``tol`` when given, else ``ratio`` (error over the rounding-error bound
    of :func:`recompute_bound`, entry by entry) above 1. A non-finite ``err`` where the model
    returned probabilities (NaN on a valid query or allowed key) also raises.

    ```pycon
    >>> import torch
    >>> from attnsvm.track import AttentionCall
    >>> from attnsvm.track.heads import check_recompute, RecomputeError
    >>> call = AttentionCall.random(causal=True)
    >>> call.attn = torch.zeros(2, 2, 5, 5, dtype=torch.float64)
    >>> check_recompute(call, 1e-9, tol=1e-6)             # within an absolute tolerance: silent
    >>> try:
    ...     check_recompute(call, 0.2, ratio=50.0)         # 50 times the rounding-error bound
    ... except RecomputeError:
    ...     print("refused")
    refused

    ```
    """
    if call.attn is None:
        return
    if not np.isfinite(err):
        raise RecomputeError(f"{where or 'attention module'}: the model's own attention or its "
                             "recomputation is not finite on valid queries and allowed keys")
    if tol is not None:
        if err > tol:
            raise RecomputeError(
                f"{where or 'attention module'}: the extracted heads do not reproduce the model's "
                f"own attention (max |recomputed - model| = {err:.3g} > tolerance {tol:g}): wrong "
                "or unsupported extractor; no statistics were computed from it")
        return
    if ratio is not None and not ratio <= 1:
        raise RecomputeError(
            f"{where or 'attention module'}: the extracted heads do not reproduce the model's own "
            f"attention (max |recomputed - model| = {err:.3g}, {ratio:.3g} times its rounding-error "
            f"bound in {str(call.attn.dtype).replace('torch.', '')}): wrong or unsupported "
            "extractor; no statistics were computed from it")


def attention_stats(attn, allowed, query_valid=None) -> dict:
    """Per-head attention statistics over valid queries.

    attn: (N, H, T, T) probabilities [query, key]; allowed: (N, T, T) bool [query, key], or
    (N, T) valid tokens (key padding); query_valid: (N, T) (default: allowed diagonal, or the
    (N, T) mask). Returns dict of (H,) arrays: soft_sparsity (mean of 1/||s||_2^2),
    frac_max_05, frac_max_09 (share of queries with max attention >= 0.5 / 0.9), max_attn
    (mean), frac_to_first (argmax on the first key the query may see, e.g. [CLS] or the first
    token of a causal model), frac_to_special (argmax on the first or last valid token of the
    sequence, e.g. [CLS] / [SEP]).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import attention_stats
    >>> st = attention_stats(np.full((1, 1, 2, 2), 0.5), np.ones((1, 2, 2), bool))
    >>> st["soft_sparsity"].tolist(), st["frac_max_05"].tolist()
    ([2.0], [1.0])

    ```
    """
    attn = np.asarray(attn, dtype=np.float64)
    N, H, T, S = attn.shape
    allowed, qv = _allowed_queries(allowed, query_valid, T, S)
    with np.errstate(divide="ignore"):
        ss = soft_sparsity(attn)  # (N, H, T)
    mx = attn.max(-1)
    am = attn.argmax(-1)
    first_key = allowed.argmax(-1)  # (N, T) first allowed key of each query
    kv = qv if allowed.shape[1] == allowed.shape[2] else allowed.any(1)  # valid keys (cross: S)
    first_tok = kv.argmax(-1)
    last_tok = kv.shape[-1] - 1 - kv[:, ::-1].argmax(-1)
    special = (am == first_tok[:, None, None]) | (am == last_tok[:, None, None])
    q = np.broadcast_to(qv[:, None, :], ss.shape)
    nq = np.maximum(q.sum((0, 2)), 1)

    def avg(a):
        return np.where(q, a, 0.0).sum((0, 2)) / nq

    return dict(
        soft_sparsity=avg(np.where(q, ss, 0.0)), frac_max_05=avg(mx >= 0.5),
        frac_max_09=avg(mx >= 0.9), max_attn=avg(mx),
        frac_to_first=avg(am == first_key[:, None, :]), frac_to_special=avg(special),
    )


# ----------------------------------------------------------------------- head algebra
def _orth(A, rtol=1e-10):
    """Orthonormal basis of the column space of A (SVD, numerical rank)."""
    U, s, _ = np.linalg.svd(A, full_matrices=False)
    return U[:, s > rtol * max(s.max(), 1e-300)]


def _allowed_queries(allowed, query_valid, T: int, S: int):
    """(allowed (N, T, S) bool, qv (N, T) bool): a (N, S) key mask is the same for every
    query (then the queries valid are ``query_valid``, default the mask itself), a (N, T, S)
    one is kept; a self-attention query is valid by default iff it may attend to itself."""
    allowed = np.asarray(allowed, dtype=bool)
    if allowed.ndim == 2:
        qv = allowed if query_valid is None else np.asarray(query_valid, bool)
        return np.broadcast_to(allowed[:, None, :], (allowed.shape[0], T, S)), qv
    qv = (np.diagonal(allowed, axis1=1, axis2=2) if query_valid is None
          else np.asarray(query_valid, bool))
    return allowed, qv


def _head_matrix(W_q, W_k, b_q, scale):
    """(W_q, W_k, b_q (zeros when None), scale, W, u) of one head in float64: the head's
    matrix W = scale W_k^T W_q (d, d) and key term u = scale W_k^T b_q (d,), scale
    defaulting to 1/sqrt(d_h)."""
    Wq = np.asarray(W_q, np.float64)
    Wk = np.asarray(W_k, np.float64)
    dh = Wq.shape[0]
    scale = 1.0 / math.sqrt(dh) if scale is None else float(scale)
    bq = np.zeros(dh) if b_q is None else np.asarray(b_q, np.float64)
    return Wq, Wk, bq, scale, scale * Wk.T @ Wq, scale * Wk.T @ bq


def head_subspace(W_q, W_k, b_q=None, scale=None, bias: str = "augment") -> dict:
    """One head's key-query algebra (float64 numpy).

    W_q, W_k: (d_h, d); b_q: (d_h,) or None; scale: default 1/sqrt(d_h).
    Returns W (d, d) = scale W_k^T W_q, u (d,) = scale W_k^T b_q, U_Q, U_K (d, r) orthonormal
    bases of span(W_q^T), span(W_k^T), and M: (r, r + 1) = [U_K^T W U_Q, U_K^T u] with
    bias="augment", else (r, r) = U_K^T W U_Q. (r = rank, d_h for a generic head.)

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import head_subspace
    >>> sub = head_subspace(np.eye(2)[:1], np.eye(2)[:1], b_q=np.ones(1), scale=1.0)
    >>> sub["W"].tolist(), sub["u"].tolist(), sub["M"].tolist()
    ([[1.0, 0.0], [0.0, 0.0]], [1.0, 0.0], [[1.0, 1.0]])

    ```
    """
    Wq, Wk, bq, scale, W, u = _head_matrix(W_q, W_k, b_q, scale)
    dh = Wq.shape[0]
    U_Q, U_K = _orth(Wq.T), _orth(Wk.T)
    M = U_K.T @ W @ U_Q
    if bias == "augment":
        M = np.concatenate([M, (U_K.T @ u)[:, None]], axis=1)
    return dict(W=W, u=u, U_Q=U_Q, U_K=U_K, M=M, d_head=dh)


def subspace_tokens(hidden, U_Q, U_K, bias: str = "augment"):
    """Keys x' = U_K^T x (..., T, r) and queries z' = U_Q^T x (..., T, r), with a constant
    1 appended to the queries when bias="augment" (..., T, r + 1).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import head_subspace, subspace_tokens
    >>> sub = head_subspace(np.eye(3)[:2], np.eye(3)[:2])
    >>> keys, queries = subspace_tokens(np.ones((4, 3)), sub["U_Q"], sub["U_K"])
    >>> keys.shape, queries.shape, queries[0, -1]
    ((4, 2), (4, 3), np.float64(1.0))

    ```
    """
    keys = hidden @ U_K
    queries = hidden @ U_Q
    if bias == "augment":
        queries = np.concatenate([queries, np.ones(queries.shape[:-1] + (1,))], -1)
    return keys, queries


def rotary_basis(R, rtol: float = 1e-10):
    """Lift of rotary embeddings into fixed matrices (docs/theory.md, "today's attention").

    R: (N, T, d_h, d_h) rotation of each position. The head compares R_k q with R_t k, i.e.
    q^T G(k, t) k with G(k, t) = R_k^T R_t. All G lie in a fixed L-dimensional space of
    d_h x d_h matrices (RoPE: the 2x2 blocks' identities and rotation generators, L = d_h for
    full rotary; + 1 identity block for partial rotary); with an orthonormal (Frobenius) basis
    B_l of it, G(k, t) = sum_l g_l(k, t) B_l. Returns B (L, d_h, d_h) (from the SVD of the
    first sequence's G) and g (N, T, T, L) = <R_k B_l, R_t>_F for every sequence.

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track.heads import rotary_basis
    >>> from attnsvm.track.rope import rope_rotations
    >>> R, _ = rope_rotations(5, 4)                        # RoPE, 5 positions, d_h = 4
    >>> B, g = rotary_basis(R[None])
    >>> B.shape, g.shape                                   # L = d_h = 4 basis matrices
    ((4, 4, 4), (1, 5, 5, 4))
    >>> G = np.einsum("l,lij->ij", g[0, 3, 1], B)          # G(3, 1) = R_3^T R_1, exactly
    >>> bool(np.allclose(G, R[3].T @ R[1]))
    True

    ```
    """
    R = np.asarray(R, np.float64)
    N, T, dh, _ = R.shape
    # the span is found from the pairs (0, t) and (k, 0) of the first sequence (RoPE: every
    # offset -(T-1)..T-1); analyse_call checks the lifted logits of every SVM pair
    rows = np.concatenate([np.matmul(R[0, :1].transpose(0, 2, 1), R[0]),
                           np.matmul(R[0].transpose(0, 2, 1), R[0, :1])]).reshape(2 * T, dh * dh)
    _, sv, Vt = np.linalg.svd(rows, full_matrices=False)
    B = Vt[sv > rtol * sv.max()].reshape(-1, dh, dh)
    L = len(B)
    P = np.matmul(R[:, :, None], B[None, None])  # (N, T, L, dh, dh): R_k B_l
    g = np.matmul(P.reshape(N, T * L, dh * dh), R.reshape(N, T, dh * dh).transpose(0, 2, 1))
    return B, g.reshape(N, T, L, T).transpose(0, 1, 3, 2)


def rotary_subspace(W_q, W_k, b_q, b_k, scale, B, bias: str = "augment") -> dict:
    """One rotary head's lifted key-query algebra (float64 numpy).

    With homogeneous tokens x^ = [x; 1] (bias="augment") or x^ = x ("ignore"), projections
    Wq^ = [W_q | b_q], Wk^ = [W_k | b_k] (d_h, d + 1) and orthonormal bases U_Q, U_K of
    span(Wq^T), span(Wk^T), the head's logit of query k for key t is exactly

        sum_l g_l(k, t) (U_K^T x^_t)^T M_l (U_Q^T x^_k),   M_l = U_K^T (scale Wk^T B_l^T Wq^) U_Q,

    i.e. x~_t^T M z with the lifted key x~_t = [g_l(k, t) U_K^T x^_t]_l (L r_k) and the stacked
    matrix M = [M_1; ...; M_L] (L r_k x r_q): the papers' ATT-SVM in the lifted key space.
    Also returns W = scale W_k^T W_q and u = scale W_k^T b_q (the offset-0 content matrix).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track.heads import rotary_basis, rotary_subspace
    >>> from attnsvm.track.rope import rope_rotations
    >>> B, _ = rotary_basis(rope_rotations(5, 4)[0][None])
    >>> Wq = Wk = np.random.default_rng(0).standard_normal((4, 3))      # d_h = 4, d = 3
    >>> sub = rotary_subspace(Wq, Wk, None, None, None, B)
    >>> sub["L"], sub["M"].shape                          # M = [M_1; ...; M_L]: (L r_k, r_q)
    (4, (12, 3))

    ```
    """
    Wq, Wk, bq, scale, W, u = _head_matrix(W_q, W_k, b_q, scale)
    dh = Wq.shape[0]
    bk = np.zeros(dh) if b_k is None else np.asarray(b_k, np.float64)
    if bias == "augment":
        Wq, Wk = np.concatenate([Wq, bq[:, None]], 1), np.concatenate([Wk, bk[:, None]], 1)
    U_Q, U_K = _orth(Wq.T), _orth(Wk.T)
    Kt, Qt = U_K.T @ Wk.T, Wq @ U_Q  # (r_k, d_h), (d_h, r_q)
    Ms = scale * np.matmul(np.matmul(Kt[None], np.asarray(B, np.float64).transpose(0, 2, 1)), Qt[None])
    return dict(W=W, u=u, U_Q=U_Q, U_K=U_K, M=Ms.reshape(-1, Ms.shape[-1]), d_head=dh, L=len(Ms),
                homogeneous=bias == "augment", rotary=True)


def _pairs(allowed, attn_h, qv, min_attention, max_queries, rng):
    a = np.where(allowed, np.asarray(attn_h, np.float64), -1.0)
    mx, am = a.max(-1), a.argmax(-1)
    pairs = np.argwhere(qv & (mx >= min_attention))  # (n, 2): sentence, query
    n_elig = len(pairs)
    if max_queries is not None and len(pairs) > max_queries:
        rng = rng if rng is not None else np.random.default_rng(0)
        pairs = pairs[np.sort(rng.choice(len(pairs), max_queries, replace=False))]
    return pairs, n_elig, mx, am


def selection_problem(hidden, allowed, attn_h, sub, bias="augment", min_attention=0.0,
                      max_queries=None, rng=None, query_valid=None, keys_hidden=None,
                      lift=None) -> dict:
    """The head's selections as a cross-attention ATT-SVM instance in its subspace.

    hidden: (N, T, d) input of the attention (queries); keys_hidden: (N, S, d) key tokens of a
    cross-attention call (default: hidden); allowed: (N, T, S) bool [query, key] (or (N, T)
    key padding); attn_h: (N, T, S) the head's attention [query, key]; sub:
    :func:`head_subspace`, or :func:`rotary_subspace` with ``lift`` = g (N, T, T, L) from
    :func:`rotary_basis` (keys lifted per query: x~_t = [g_l(k, t) U_K^T x^_t]_l).
    Returns dict X (n, S, r) keys, z (n, r or r + 1) queries, alpha (n,) selected keys,
    mask (n, S) keys each query may see (keys identical to the selected one in the head's key
    space excluded: no W separates them), pairs (n, 2) = (sentence, query), n_eligible (queries
    passing the threshold before subsampling), sel_prob (n,) attention on alpha and n_tied
    (excluded identical keys).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import head_subspace, selection_problem
    >>> x = np.array([[[1., 0.], [0., 1.], [1., 1.]]])            # one sequence of 3 tokens, d = 2
    >>> attn = np.array([[[.8, .1, .1], [.1, .8, .1], [.1, .1, .8]]])   # query k selects key k
    >>> prob = selection_problem(x, np.ones((1, 3, 3), bool), attn, head_subspace(np.eye(2), np.eye(2)))
    >>> prob["alpha"].tolist(), prob["X"].shape, prob["z"].shape
    ([0, 1, 2], (3, 3, 2), (3, 3))

    ```
    """
    x = np.asarray(hidden, np.float64)
    y = x if keys_hidden is None else np.asarray(keys_hidden, np.float64)
    if sub.get("homogeneous"):
        def hom(a):
            return np.concatenate([a, np.ones(a.shape[:-1] + (1,))], -1)

        keys, queries = hom(y) @ sub["U_K"], hom(x) @ sub["U_Q"]
    elif sub.get("rotary"):
        keys, queries = y @ sub["U_K"], x @ sub["U_Q"]
    else:
        keys, _ = subspace_tokens(y, sub["U_Q"], sub["U_K"], bias)
        _, queries = subspace_tokens(x, sub["U_Q"], sub["U_K"], bias)
    N, T = np.shape(allowed)[:2]
    allowed, qv = _allowed_queries(allowed, query_valid, T, T)
    pairs, n_elig, mx, am = _pairs(allowed, attn_h, qv, min_attention, max_queries, rng)
    i, k = pairs[:, 0], pairs[:, 1]
    X, alpha, mask = keys[i], am[i, k], allowed[i, k]
    if lift is not None:  # rotary: (n, S, L, r) -> (n, S, L r)
        X = (np.asarray(lift)[i, k][..., None] * X[:, :, None, :]).reshape(len(i), X.shape[1], -1)
    # keys equal to the selected one in the head's key space (a repeated token without position
    # information) get the same logit from every W: they are not constraints
    n = len(alpha)
    sel = X[np.arange(n), alpha]
    tied = (np.linalg.norm(X - sel[:, None], axis=-1)
            <= 1e-12 * np.maximum(np.linalg.norm(sel, axis=-1), 1e-300)[:, None])
    tied[np.arange(n), alpha] = False
    return dict(X=X, z=queries[i, k], alpha=alpha, mask=mask & ~tied, pairs=pairs,
                n_eligible=n_elig, sel_prob=mx[i, k], n_tied=int((tied & mask).sum()))


def margins(M, X, z, alpha, mask):
    """Min over (i, t != alpha_i, allowed) of (x_{i,alpha_i} - x_{it})^T M z_i (inf if none).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track.heads import margins
    >>> X = np.array([[[1., 0.], [0., 1.]]]); z = np.array([[2., 0.]])   # key 0 selected
    >>> float(margins(np.eye(2), X, z, np.array([0]), np.ones((1, 2), bool)))
    2.0

    ```
    """
    logits = np.einsum("ntd,de,ne->nt", X, M, z)
    sel = logits[np.arange(len(alpha)), alpha]
    gap = sel[:, None] - logits
    gap = np.where(mask, gap, np.inf)
    gap[np.arange(len(alpha)), alpha] = np.inf
    return float(gap.min()) if gap.size else float("inf")


def solve_selection(X, z, alpha, mask):
    """The core Frobenius ATT-SVM :func:`attnsvm.svm.att_svm` of one selection (its fast path:
    dual minimum-norm point when constraints <= unknowns, the structured primal IPM otherwise).
    One problem at a time: att_svm_batch was measured 7x slower here (N ~ 1000 constraints:
    its batched eigh polish dominates).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import head_subspace, selection_problem, solve_selection
    >>> x = np.array([[[1., 0.], [0., 1.], [1., 1.]]])
    >>> attn = np.array([[[.8, .1, .1], [.1, .8, .1], [.1, .1, .8]]])
    >>> prob = selection_problem(x, np.ones((1, 3, 3), bool), attn, head_subspace(np.eye(2), np.eye(2)))
    >>> sol = solve_selection(prob["X"], prob["z"], prob["alpha"], prob["mask"])
    >>> sol.status_, round(float(sol.norm_), 6)
    ('optimal', 3.0)

    ```
    """
    from attnsvm.svm import att_svm

    return att_svm(X, z, alpha, norm="fro", mask=mask, irreducible=False)


def _ratio(M, prob, Wmm):
    m = margins(M, prob["X"], prob["z"], prob["alpha"], prob["mask"])
    if not np.isfinite(m):
        return np.nan
    return float(m / np.linalg.norm(M) * np.linalg.norm(Wmm))


def _haar(rng, D, r):
    """D Haar-distributed r x r orthogonal matrices (QR of Gaussians, signs fixed)."""
    Q, R = np.linalg.qr(rng.standard_normal((D, r, r)))
    return Q * np.sign(np.diagonal(R, axis1=1, axis2=2))[:, None, :]


def rotation_null(M, W_mm, draws: int, rng, bias: str = "augment", blocks: int = 1) -> np.ndarray:
    """corr(R_K M R_Q^T (bias column R_K b), W_mm) for ``draws`` Haar rotations: (draws,).
    ``blocks`` > 1 (rotary lift, M = [M_1; ...; M_L]): the same R_K rotates every block's key
    coordinates, R_K M_l R_Q^T.

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import rotation_null
    >>> M = np.random.default_rng(0).standard_normal((3, 4))       # bias column augmented: (r, r + 1)
    >>> c = rotation_null(M, M, 100, np.random.default_rng(1))
    >>> c.shape, bool(np.all(np.abs(c) <= 1 + 1e-12)), bool(abs(c.mean()) < 0.3)
    ((100,), True, True)

    ```
    """
    r = M.shape[0] // blocks
    rq = M.shape[1] - (1 if bias == "augment" else 0)
    RK, RQ = _haar(rng, draws, r), _haar(rng, draws, rq)
    Mb = M.reshape(blocks, r, M.shape[1])
    rot = np.einsum("dab,lbc->dlac", RK, Mb[:, :, :rq]) @ RQ.transpose(0, 2, 1)[:, None]
    if bias == "augment":
        rot = np.concatenate([rot, np.einsum("dab,lbc->dlac", RK, Mb[:, :, rq:])], axis=3)
    rot = rot.reshape(draws, blocks * r, M.shape[1])
    return np.asarray(correlation(rot, W_mm[None]), np.float64)


_SVM_EMPTY = dict(feasible=False, status="", corr_mm=np.nan, margin_ratio=np.nan,
                  svm_norm=np.nan, svm_margin=np.nan, svm_violation=np.nan, svm_gap=np.nan,
                  svm_kkt=np.nan, n_support=0, svm_solver="", corr_null_mean=np.nan,
                  corr_null_max=np.nan, margin_ratio_null=np.nan, null_feasible=0,
                  corr_rot_mean=np.nan, corr_rot_std=np.nan, corr_rot_q95=np.nan,
                  corr_rot_max=np.nan, svm_seconds=0.0)


def _svm_row(M, prob, cfg: TrackConfig, rng, bias=None, blocks=1):
    """SVM of the head's selection, its certificate, and both nulls."""
    t0 = time.perf_counter()
    row = dict(_SVM_EMPTY)
    sol = solve_selection(prob["X"], prob["z"], prob["alpha"], prob["mask"])
    row.update(feasible=bool(sol.feasible_), status=str(sol.status_), svm_solver=str(sol.solver_))
    if sol.feasible_:
        Wmm = np.asarray(sol.W_, np.float64)
        row.update(
            corr_mm=float(correlation(M, Wmm)), margin_ratio=_ratio(M, prob, Wmm),
            svm_norm=float(sol.norm_), svm_margin=float(sol.margin_),
            svm_violation=float(sol.violation_), svm_gap=float(sol.gap_),
            svm_kkt=float(sol.kkt_residual_), n_support=int(np.sum(sol.support_)))
        if cfg.rot_draws:
            rc = rotation_null(M, Wmm, cfg.rot_draws, rng, cfg.bias if bias is None else bias, blocks)
            row.update(corr_rot_mean=float(rc.mean()), corr_rot_std=float(rc.std()),
                       corr_rot_q95=float(np.quantile(rc, 0.95)), corr_rot_max=float(rc.max()))
    nc, nr = [], []
    valid = prob["mask"]
    for _ in range(cfg.null_draws):
        rand = dict(prob, alpha=(rng.random(valid.shape) * valid).argmax(1))
        s = solve_selection(rand["X"], rand["z"], rand["alpha"], rand["mask"])
        if s.feasible_:
            W = np.asarray(s.W_, np.float64)
            nc.append(float(correlation(M, W)))
            nr.append(_ratio(M, rand, W))
    if nc:
        row.update(corr_null_mean=float(np.mean(nc)), corr_null_max=float(np.max(nc)),
                   margin_ratio_null=float(np.nanmean(nr)))
    row.update(null_feasible=len(nc), svm_seconds=time.perf_counter() - t0)
    return row, sol


def graph_problem(call: AttentionCall, head: int, config: TrackConfig | None = None) -> dict:
    """The Graph-SVM data of head ``head`` of an attention call, at the last query of each
    sequence (next-token prediction; the formulas in :mod:`attnsvm.track.graph`).

    call: an :class:`~attnsvm.track.extract.AttentionCall` (self-attention, no rotary
    embedding or position bias); config: a :class:`TrackConfig` (``bias``, ``graph_mass``,
    ``max_queries``, ``seed``). Returns dict: E (K', p') the distinct token vectors in the
    head's space, seqs (N, T') token ids (query last), y (N, L) labels (-1 padding), exclude
    (N, T') bool, W (p', p') the head's matrix in these coordinates (e_t^T W e_k = the head's
    logit up to a per-query constant), basis U (d, p), sequences (N,) and query (N,) the probe
    positions used; ``graph_svm(E, seqs, y, norm, exclude=exclude)`` is the head's Graph-SVM.
    Raises ValueError naming the reason for a call without one.

    ```pycon
    >>> from attnsvm.track import AttentionCall, graph_problem
    >>> prob = graph_problem(AttentionCall.random(causal=True), head=0)
    >>> prob["seqs"].shape, prob["y"].shape, prob["E"].shape[1] == prob["W"].shape[0]
    ((2, 5), (2, 1), True)

    ```
    """
    from .graph import graph_data, unsupported

    cfg = config or TrackConfig()
    why = unsupported(call)
    if why:
        raise ValueError(f"no Graph-SVM for this call: {why}")
    if isinstance(head, bool) or not 0 <= int(head) < call.n_heads:
        raise ValueError(f"head must be an integer in [0, {call.n_heads}); got {head!r}")
    s, allowed, qv = (t.cpu().numpy() for t in recompute_attention(call))
    x = call.hidden.detach().double().cpu().numpy()
    bq = None if call.b_q is None else call.b_q[head].detach().double().cpu().numpy()
    sub = head_subspace(call.W_q[head].detach().double().cpu().numpy(),
                        call.W_k[head].detach().double().cpu().numpy(), bq, call.scale_, cfg.bias)
    rng = np.random.default_rng((cfg.seed, int(head)))
    prob, why = graph_data(x, s[:, head], allowed, qv, sub, cfg.bias, cfg.graph_mass, cfg.max_queries, rng)
    if prob is None:
        raise ValueError(f"no Graph-SVM for this call: {why}")
    return prob


def analyse_call(call: AttentionCall, cfg: TrackConfig | None = None, *, key=(0,),
                 selections: bool = True, matrices: bool = False, where: str = ""):
    """All per-head statistics of one attention call.

    key: integers seeding this call's sample and nulls (with cfg.seed), e.g. (step, layer).
    The recomputed attention is first checked against the probabilities the model returned
    (``call.attn``): past its rounding-error bound (:func:`recompute_bound`) or the absolute
    ``cfg.recompute_tol`` when given, a :class:`RecomputeError` is raised (``where`` names the
    module); every row says in ``recompute_check`` whether the check ran ("checked") or why
    not ("not checked: ..."). Token vectors no valid query uses are masked first
    (:func:`mask_unused`).
    Returns (rows, selections, matrices): rows a list of dicts, one per head (columns in
    docs/tracking.md); selections a DataFrame (head, seq, query, key, prob, in_svm) of every
    valid query's argmax key or None; matrices {head: {W, u, W_mm, u_mm}} (full d-space, W_mm
    mapped back: U_K W_mm U_Q^T; rotary heads: the lifted M and W_mm instead) or None.

    ```pycon
    >>> from attnsvm.track import AttentionCall, analyse_call
    >>> rows, sel, _ = analyse_call(AttentionCall.random(causal=True))
    >>> [(r["head"], r["status"], r["recompute_check"][:11]) for r in rows], len(sel)
    ([(0, 'optimal', 'not checked'), (1, 'optimal', 'not checked')], 20)

    ```
    """
    import pandas as pd

    cfg = cfg or TrackConfig()
    call = mask_unused(call)  # padded positions: never read, may be NaN in an eager float64 pass
    finite = all(bool(torch.isfinite(t).all()) for t in (call.hidden, call.keys, call.W_q,
                                                          call.W_k, call.b_q, call.b_k)
                 if t is not None)
    if not finite:  # a diverged run: say so in every row instead of failing inside an SVD
        rows = [dict(head=h, causal=bool(call.causal), kind=call.kind,
                     status="non-finite inputs or weights", feasible=False)
                for h in range(call.n_heads)]
        return rows, None, ({} if matrices else None)
    s_t, allowed_t, qv_t = recompute_attention(call)
    s = s_t.cpu().numpy()
    allowed = allowed_t.cpu().numpy()
    qv = qv_t.cpu().numpy()
    if call.attn is not None and tuple(call.attn.shape) == s.shape:
        err, ratio = recompute_error(call, s, allowed, qv, recompute_bound(call, s))
        checked = "checked" if cfg.check else "not checked: TrackConfig(check=False)"
        if cfg.check:
            check_recompute(call, err, cfg.recompute_tol, where, ratio)
    else:
        err = ratio = float("nan")
        checked = ("not checked: TrackConfig(check=False)" if not cfg.check else
                   "not checked: the module returned no attention probabilities to compare with")
    x = call.hidden.detach().to(torch.float64).cpu().numpy()
    y = None if call.keys is None else call.keys.detach().to(torch.float64).cpu().numpy()
    st = attention_stats(s, allowed, qv)
    Wq = call.W_q.detach().to(torch.float64).cpu().numpy()
    Wk = call.W_k.detach().to(torch.float64).cpu().numpy()
    bq = None if call.b_q is None else call.b_q.detach().to(torch.float64).cpu().numpy()
    bk = None if call.b_k is None else call.b_k.detach().to(torch.float64).cpu().numpy()
    lift = B = logits_all = None
    if call.rotary is not None:
        B, lift = rotary_basis(call.rotary.detach().to(torch.float64).cpu().numpy())
    if call.rotary is not None or cfg.graph:
        logits_all = head_logits(call).cpu().numpy()
    H = call.n_heads
    rows, mats = [], {}
    in_svm = np.zeros((x.shape[0], H, x.shape[1]), bool)
    for h in range(H):
        rng = np.random.default_rng((cfg.seed, *[int(k) for k in key], h))
        if lift is None:
            sub = head_subspace(Wq[h], Wk[h], None if bq is None else bq[h], call.scale_, cfg.bias)
        else:
            sub = rotary_subspace(Wq[h], Wk[h], None if bq is None else bq[h],
                                  None if bk is None else bk[h], call.scale_, B, cfg.bias)
        M, r = sub["M"], sub["U_K"].shape[1]
        ub = np.linalg.norm(sub["U_K"].T @ sub["u"]) if lift is None else np.linalg.norm(sub["u"])
        row = dict(head=h, causal=bool(call.causal), kind=call.kind, n_queries=int(qv.sum()),
                   **{k: float(v[h]) for k, v in st.items()},
                   wqk_norm=float(np.linalg.norm(sub["W"])),
                   bias_share=float(ub / math.hypot(np.linalg.norm(sub["W"]), ub)) if ub > 0 else 0.0,
                   rank=int(r), lift_dim=int(sub.get("L", 1)), lifted_norm=float(np.linalg.norm(M)),
                   recompute_err=err, recompute_ratio=ratio, recompute_check=checked)
        if cfg.svm:
            prob = selection_problem(x, allowed, s[:, h], sub, cfg.bias, cfg.min_attention,
                                     cfg.max_queries, rng, qv, keys_hidden=y, lift=lift)
            n = len(prob["alpha"])
            in_svm[prob["pairs"][:, 0], h, prob["pairs"][:, 1]] = True
            row.update(n_eligible=int(prob["n_eligible"]), n_svm=n, n_tied=prob["n_tied"],
                       sel_prob=float(prob["sel_prob"].mean()) if n else np.nan)
            if lift is not None and n:  # the lift reproduces the head's logits (self-check)
                lg = np.einsum("nsd,de,ne->ns", prob["X"], M, prob["z"])
                ref = logits_all[prob["pairs"][:, 0], h, prob["pairs"][:, 1]]
                ia = np.arange(n)
                d = (lg - lg[ia, prob["alpha"]][:, None]) - (ref - ref[ia, prob["alpha"]][:, None])
                bad = np.abs(np.where(allowed[prob["pairs"][:, 0], prob["pairs"][:, 1]], d, 0)).max()
                if bad > 1e-8 * max(1.0, np.abs(ref).max()):
                    raise RecomputeError(f"{where or 'attention module'}: the rotary lift does not "
                                         f"reproduce head {h}'s logits (error {bad:.3g})")
            unknowns = M.size
            if n >= 1 and unknowns > cfg.max_unknowns:
                svm, sol = dict(_SVM_EMPTY, status=f"SVM too large ({unknowns} unknowns > "
                                f"max_unknowns={cfg.max_unknowns})"), None
            elif n >= 1:
                svm, sol = _svm_row(M, prob, cfg, rng, None if lift is None else "ignore",
                                    1 if lift is None else sub["L"])
            else:
                svm, sol = dict(_SVM_EMPTY, status="no query passes min_attention"), None
            row.update(svm, null_draws=cfg.null_draws, rot_draws=cfg.rot_draws)
            if matrices:
                mats[h] = dict(W=sub["W"], u=sub["u"])
                if lift is not None:
                    mats[h]["M"] = M
                    if sol is not None and sol.feasible_:
                        mats[h]["W_mm_lifted"] = np.asarray(sol.W_)
                elif sol is not None and sol.feasible_:
                    Wmm = np.asarray(sol.W_)
                    mats[h]["W_mm"] = sub["U_K"] @ Wmm[:, :sub["U_Q"].shape[1]] @ sub["U_Q"].T
                    if cfg.bias == "augment":
                        mats[h]["u_mm"] = sub["U_K"] @ Wmm[:, -1]
        elif matrices:
            mats[h] = dict(W=sub["W"], u=sub["u"])
        if cfg.graph:
            from .graph import graph_head

            check = cfg.bias == "augment" or not np.any(sub["u"])  # "ignore" drops u: no check
            row.update(graph_head(x, s[:, h], allowed, qv, sub, cfg,
                                  np.random.default_rng((cfg.seed, *[int(k) for k in key], h, 1)),
                                  call, logits_all[:, h] if check else None))
            if row["graph_logit_err"] > GRAPH_LOGIT_TOL:
                raise RecomputeError(
                    f"{where or 'attention module'}: head {h}'s Graph-SVM tokens do not reproduce "
                    f"its logits at the last query (error {row['graph_logit_err']:.3g} > "
                    f"{GRAPH_LOGIT_TOL:g}): equal token vectors merged wrongly")
        rows.append(row)
    sel = None
    if selections:
        n_i, h_i, k_i = np.nonzero(np.broadcast_to(qv[:, None, :], in_svm.shape))
        a = np.where(allowed[:, None], s, -1.0)
        sel = pd.DataFrame(dict(head=h_i, seq=n_i, query=k_i, key=a.argmax(-1)[n_i, h_i, k_i],
                                prob=a.max(-1)[n_i, h_i, k_i], in_svm=in_svm[n_i, h_i, k_i]))
    return rows, sel, (mats if matrices else None)
