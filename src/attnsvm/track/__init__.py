"""Track the SVM alignment of the attention heads of any transformer while it trains.

    from attnsvm.track import Tracker, TrackConfig
    tr = Tracker(model, probe_batch, every=100, tags={"optimizer": "adamw"})  # tags: columns
    for step in range(steps):
        ...train...
        tr.step(step)                      # records at steps 0, 100, 200, ...
    tr.table                               # one row per (step, layer, head)
    tr.save("runs/adamw")                  # track.parquet, selections.parquet
    tr.plot()                              # per layer / head against the step (log axis)
    tr.to_tensorboard(SummaryWriter("runs/tb"))

    trainer = Trainer(..., callbacks=[tr.callback()])   # Hugging Face: summaries in its logs
    pl.Trainer(..., callbacks=[tr.lightning_callback()])  # Lightning: to its loggers

Verified families (tests/test_track_architectures.py, ``python -m attnsvm.track.verify``):
GPT-2, BERT, RoBERTa, DistilBERT, ViT, Llama, Qwen2, Mistral, Gemma, Phi, GPT-NeoX, OPT, BART,
T5 (rotary, grouped-query, cross-attention, relative position bias), under SDPA, and
TransformerLens's HookedTransformer; every record checks the extraction against the model's own
attention probabilities within their rounding-error bound (RecomputeError otherwise), or says
in ``recompute_check`` that it could not.

Per head: attention soft-sparsity, W = scale W_k^T W_q (scale = 1/sqrt(d_h)) and its norm,
the selected tokens, the seq-to-seq ATT-SVM of that selection in the head's subspace (causal
for decoders) with its certificate, corr(W, W_mm), the margin ratio and the nulls
(random selection, random rotation). See :mod:`attnsvm.track.heads` for the formulas,
:mod:`attnsvm.track.extract` for the convention and extractors, docs/tracking.md for a guide.
"""

from .extract import (
    SUPPORTED,
    SUPPORTED_MODEL_TYPES,
    AttentionCall,
    UnsupportedModelError,
    allowed_from_mask,
    builtin_extractor,
    check_config,
    find_attention,
    register_extractor,
    split_heads,
    tl_attention,
)
from .heads import (
    RecomputeError,
    TrackConfig,
    analyse_call,
    attention_stats,
    graph_problem,
    head_subspace,
    mask_unused,
    recompute_attention,
    recompute_bound,
    rotation_null,
    selection_problem,
    solve_selection,
    subspace_tokens,
)
from .tracker import Tracker, log_steps, track

__all__ = [
    "Tracker",
    "track",
    "TrackConfig",
    "AttentionCall",
    "register_extractor",
    "find_attention",
    "builtin_extractor",
    "split_heads",
    "allowed_from_mask",
    "analyse_call",
    "attention_stats",
    "head_subspace",
    "recompute_attention",
    "recompute_bound",
    "mask_unused",
    "tl_attention",
    "rotation_null",
    "selection_problem",
    "solve_selection",
    "subspace_tokens",
    "log_steps",
    "graph_problem",
    "SUPPORTED",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "RecomputeError",
    "check_config",
]
