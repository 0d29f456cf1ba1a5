"""The verified-architectures table: tiny random models of every supported family, built from
Hugging Face configs (nothing is downloaded), run under their default attention (SDPA), and
each extraction checked against the model's own eager attention.

    python -m attnsvm.track.verify            # prints the table of docs/tracking.md

For every family, :func:`verify` builds ``tiny_model(model_type)`` (2 layers, hidden 32, 4
heads of d_h = 8; grouped-query families with fewer key heads), records one
:class:`~attnsvm.track.Tracker` step on a padded probe batch and reports the largest
recompute error max |s_recomputed - s_model| over all heads (probabilities) with the kinds of
attention found (self / causal / cross) and the rotary lift dimension L.
"""

from __future__ import annotations

import time

import torch

from .extract import SUPPORTED_MODEL_TYPES

__all__ = ["TINY_CONFIGS", "tiny_config", "tiny_model", "probe_inputs", "verify"]

# model_type -> (config class name, keyword arguments of a tiny config)
TINY_CONFIGS: dict[str, tuple[str, dict]] = {
    "gpt2": ("GPT2Config", dict(n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                bos_token_id=0, eos_token_id=0)),
    "bert": ("BertConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64)),
    "roberta": ("RobertaConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=72)),
    "distilbert": ("DistilBertConfig", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                            max_position_embeddings=64)),
    "vit": ("ViTConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, image_size=8, patch_size=4)),
    "llama": ("LlamaConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)),
    "qwen2": ("Qwen2Config", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)),
    "mistral": ("MistralConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64,
                                      max_position_embeddings=64)),
    "gemma": ("GemmaConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=1, head_dim=8, intermediate_size=64,
                                  max_position_embeddings=64)),
    "phi": ("PhiConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=64)),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, max_position_embeddings=64)),
    "opt": ("OPTConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32,
                              pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    "bart": ("BartConfig", dict(d_model=32, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4,
                                encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                                pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                decoder_start_token_id=2, forced_eos_token_id=None)),
    "t5": ("T5Config", dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                            num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)),
}


def tiny_config(model_type: str, vocab_size: int = 64, **over):
    """A tiny random-init config of ``model_type`` (one of TINY_CONFIGS); ``over`` overrides.

    ```pycon
    >>> from attnsvm.track.verify import tiny_config
    >>> cfg = tiny_config("gpt2", n_layer=1)
    >>> type(cfg).__name__, cfg.n_layer, cfg.n_embd
    ('GPT2Config', 1, 32)

    ```
    """
    import transformers

    if model_type not in TINY_CONFIGS:
        raise ValueError(f"no tiny config for model type {model_type!r}; known: "
                         f"{', '.join(TINY_CONFIGS)}")
    cls_name, kw = TINY_CONFIGS[model_type]
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        raise ValueError(f"the installed transformers has no {cls_name}")
    kw = dict(kw, **over)
    if model_type != "vit":
        kw["vocab_size"] = vocab_size
    return cls(**kw)


def tiny_model(model_type: str, vocab_size: int = 64, seed: int = 0, dtype=torch.float64, **over):
    """``AutoModel.from_config(tiny_config(...))`` with seeded random weights, in eval mode,
    under the library's default attention implementation (SDPA where supported).

    ```pycon
    >>> from attnsvm.track.verify import tiny_model
    >>> m = tiny_model("llama")
    >>> type(m).__name__, next(m.parameters()).dtype, m.training
    ('LlamaModel', torch.float64, False)

    ```
    """
    from transformers import AutoModel

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModel.from_config(tiny_config(model_type, vocab_size, **over))
    return model.to(dtype).eval()


def probe_inputs(model, N: int = 3, T: int = 9, seed: int = 0) -> dict:
    """A padded batch for ``model``: token ids (sequence 1 padded after 2/3 of T) with their
    mask, decoder ids / mask (shifted by one) for encoder-decoders, or random pixels (ViT).

    ```pycon
    >>> from attnsvm.track.verify import probe_inputs, tiny_model
    >>> inp = probe_inputs(tiny_model("gpt2"))
    >>> sorted(inp), tuple(inp["input_ids"].shape), inp["attention_mask"][1].tolist()
    (['attention_mask', 'input_ids'], (3, 9), [1, 1, 1, 1, 1, 1, 0, 0, 0])

    ```
    """
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    if cfg.model_type == "vit":
        dt = next(model.parameters()).dtype
        return dict(pixel_values=torch.randn(N, cfg.num_channels, cfg.image_size, cfg.image_size,
                                             generator=g).to(dt))
    ids = torch.randint(3, cfg.vocab_size, (N, T), generator=g)
    mask = torch.ones(N, T, dtype=torch.long)
    mask[min(1, N - 1), (2 * T) // 3:] = 0
    out = dict(input_ids=ids, attention_mask=mask)
    if getattr(cfg, "is_encoder_decoder", False):
        out.update(decoder_inputs(cfg, ids, mask))
    return out


def decoder_inputs(cfg, ids, mask) -> dict:
    """decoder_input_ids / decoder_attention_mask for an encoder-decoder probe: the same tokens
    shifted right by one behind the decoder start token (teacher forcing on the input)."""
    start = getattr(cfg, "decoder_start_token_id", None)
    if start is None:
        start = getattr(cfg, "pad_token_id", None) or 0
    dec = torch.cat([torch.full_like(ids[:, :1], start), ids[:, :-1]], 1)
    dmask = torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], 1)
    return dict(decoder_input_ids=dec, decoder_attention_mask=dmask)


def verify(model_types=None, dtype=torch.float64, config=None):
    """One row per family: model_type, family, attention implementation the model runs under,
    modules and heads tracked, kinds, rotary lift dimension L, max recompute error, seconds.
    Raises (RecomputeError) if an extraction is wrong.

    ```pycon
    >>> from attnsvm.track.verify import verify
    >>> v = verify(["gpt2"])
    >>> v[["model_type", "runs_under", "heads", "kinds"]].values.tolist(), bool(v.recompute_err.max() < 1e-6)
    ([['gpt2', 'sdpa', 8, 'causal']], True)

    ```
    """
    import pandas as pd
    import transformers

    from .heads import TrackConfig
    from .tracker import Tracker

    config = config or TrackConfig(max_queries=6, null_draws=0, rot_draws=2)
    rows = []
    for mt in model_types or TINY_CONFIGS:
        if getattr(transformers, TINY_CONFIGS[mt][0], None) is None:
            continue  # e.g. Gemma in an older transformers
        t0 = time.perf_counter()
        model = tiny_model(mt, dtype=dtype)
        impl = model.config._attn_implementation
        tab = Tracker(model, probe_inputs(model), config=config).record(0)
        rows.append(dict(model_type=mt, family=SUPPORTED_MODEL_TYPES[mt], runs_under=impl,
                         modules=int(tab.layer.nunique()), heads=len(tab),
                         kinds="/".join(sorted(set(tab.kind))), rotary_L=int(tab.lift_dim.max()),
                         recompute_err=float(tab.recompute_err.max()),
                         svm_feasible=f"{int(tab.feasible.sum())}/{len(tab)}",
                         seconds=time.perf_counter() - t0))
    return pd.DataFrame(rows)


if __name__ == "__main__":  # pragma: no cover
    print(verify().to_markdown(index=False, floatfmt=".1e"))
