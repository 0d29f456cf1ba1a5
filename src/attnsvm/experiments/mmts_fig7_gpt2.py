"""Figure 7 on real text: a small GPT-2-style causal transformer trained from scratch on the
Python documentation, tracked head by head against the attention SVM.

Max-Margin Token Selection (Fig. 7) trains a ViT from scratch and reports that attention
becomes sparser (soft-sparsity 1/||s||_2^2 falls) as the Frobenius norm of the combined
key-query matrix grows, "which converge[s] directionally" (to the max-margin SVM of the
selected tokens; Transformers as SVMs states it for seq-to-seq and causal self-attention).
Here the same questions are asked of a GPT-2 (Hugging Face ``GPT2LMHeadModel``, built from a
config, random init) trained on next-character prediction over the text of the standard
library's ``pydoc_data.topics`` (the Python reference documentation, ~465k characters; ships
with CPython, so nothing is downloaded), with each optimiser of the config key ``optimizers``
and several initialisation seeds. :class:`attnsvm.track.Tracker` records every head at
log-spaced steps on a fixed held-out probe batch: soft-sparsity, ||W|| (W = W_k^T W_q /
sqrt(d_h)), corr(W_head, W_mm) with the causal seq-to-seq ATT-SVM of the head's argmax
selection in its subspace (certified), the margin ratio, and the nulls (random selections,
random rotations of the head matrix). Step 0 is the random-initialisation control: the same
architecture, the same text, untrained weights.

Optimisers are data: ``{"name", "rule", **hyper-parameters}``, ``rule`` a dotted path to a
``torch.optim.Optimizer`` class, or the name of a registered ``attnsvm.optim`` rule (run
through :class:`attnsvm.optim.RuleOptimizer`): adding sign descent or Muon is one entry.
"""

from __future__ import annotations

import dataclasses
import importlib
import time

import numpy as np
import pandas as pd
import torch

from attnsvm import plotting as P
from attnsvm.experiments.base import Check, Claim, Experiment, check_at_least, check_at_most

P_SIGN = 0.01        # one-sided sign-test level for "increases over training"
CONVERGED = 0.99     # corr with W_mm of a run that converged in direction (docs/theory.md §7 outcome)
NORM_GROWTH = 2.0    # "||W|| grows": median final / initial ratio
SPARSER = 0.5        # "attention sparsifies": median final / initial soft-sparsity
RHO = -0.5           # "sparsity is associated with ||W||": Spearman over heads and steps
LEARNS = 1.0         # sanity: held-out loss falls by at least 1 nat (uniform: log V ~ 4.6)

COLUMNS = ["optimizer", "seed", "step", "layer", "head", "soft_sparsity", "frac_max_05",
           "max_attn", "wqk_norm", "corr_mm", "margin_ratio", "corr_null_mean", "corr_null_max",
           "corr_rot_mean", "corr_rot_q95", "corr_rot_max", "feasible", "status", "svm_violation",
           "svm_gap", "recompute_err", "n_svm", "sel_prob"]


# ------------------------------------------------------------------------------ data
def corpus() -> tuple[np.ndarray, list[str]]:
    """Character ids of the Python documentation in ``pydoc_data.topics`` (topics sorted by
    name, joined by newlines) and the vocabulary (sorted distinct characters)."""
    import pydoc_data.topics as pt

    text = "\n".join(pt.topics[k] for k in sorted(pt.topics))
    chars = sorted(set(text))
    lut = {c: i for i, c in enumerate(chars)}
    return np.fromiter((lut[c] for c in text), dtype=np.int64, count=len(text)), chars


def windows(ids: torch.Tensor, n: int, T: int, generator) -> torch.Tensor:
    """n random windows of T consecutive ids: (n, T)."""
    start = torch.randint(0, len(ids) - T, (n,), generator=generator).to(ids.device)
    return ids[start[:, None] + torch.arange(T, device=ids.device)]


def make_optimizer(spec: dict, params) -> torch.optim.Optimizer:
    """``spec = {"name": ..., "rule": "torch.optim.AdamW" | "muon" | "attnsvm.optim.ngd" | ...,
    **hyper}``. A ``torch.optim.Optimizer`` class is built as ``cls(params, **hyper)``; a name
    without a dot is a registered ``attnsvm.optim`` rule (``attnsvm.optim.get``); any other
    callable must return an ``attnsvm.optim.Optimizer`` rule. Rules run through
    :class:`attnsvm.optim.RuleOptimizer`."""
    from attnsvm import optim as core

    hyper = {k: v for k, v in spec.items() if k not in ("name", "rule")}
    if "." not in spec["rule"]:
        return core.RuleOptimizer(params, core.get(spec["rule"], **hyper))
    mod, _, attr = spec["rule"].rpartition(".")
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"optimizer {spec.get('name')!r}: cannot import rule {spec['rule']!r}") from None
    if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer):
        return obj(params, **hyper)
    rule = obj(**hyper)
    if not isinstance(rule, core.Optimizer):
        raise ValueError(f"optimizer {spec.get('name')!r}: {spec['rule']} is neither a "
                         "torch.optim.Optimizer nor an attnsvm.optim rule factory")
    return core.RuleOptimizer(params, rule)


def _model(cfg, vocab: int, seed: int):
    import transformers as tf

    conf = tf.GPT2Config(vocab_size=vocab, n_positions=cfg["context"], n_embd=cfg["n_embd"],
                         n_layer=cfg["n_layer"], n_head=cfg["n_head"], resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                         attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = tf.GPT2LMHeadModel(conf)
    return model.to(device=cfg.get("device", "cpu"), dtype=getattr(torch, cfg["dtype"]))


def train_run(cfg, spec: dict, seed: int, data):
    """Train one model with one optimiser from init seed ``seed``; returns (track rows, losses).

    data: dict train / val id tensors, probe (P, T) batch, val_batch (V, T), vocab size."""
    from attnsvm.track import TrackConfig, Tracker, log_steps

    model = _model(cfg, data["vocab"], seed)
    opt = make_optimizer(spec, model.parameters())
    tcfg = TrackConfig(max_queries=cfg["max_queries"], null_draws=cfg["null_draws"],
                       rot_draws=cfg["rot_draws"], seed=seed)
    tr = Tracker(model, dict(input_ids=data["probe"], output_attentions=True),
                 steps=log_steps(cfg["steps"], cfg["records"]), config=tcfg, selections=False,
                 tags={"optimizer": spec["name"], "seed": seed})
    gen = torch.Generator().manual_seed(10_000 + seed)
    losses, run_loss, n_loss = [], 0.0, 0
    t0 = time.perf_counter()
    for step in range(cfg["steps"] + 1):
        if tr.due(step):
            tr.record(step)
            with torch.no_grad():
                model.eval()
                vl = float(model(input_ids=data["val_batch"], labels=data["val_batch"]).loss)
                model.train()
            losses.append(dict(optimizer=spec["name"], seed=seed, step=step, val_loss=vl,
                               train_loss=run_loss / n_loss if n_loss else np.nan,
                               seconds=time.perf_counter() - t0))
            run_loss, n_loss = 0.0, 0
        if step == cfg["steps"]:
            break
        x = windows(data["train"], cfg["batch"], cfg["context"], gen)
        loss = model(input_ids=x, labels=x).loss
        if not torch.isfinite(loss):
            losses.append(dict(optimizer=spec["name"], seed=seed, step=step, val_loss=np.nan,
                               train_loss=np.nan, seconds=time.perf_counter() - t0))
            break  # diverged: the rows so far are kept, the judge sees the missing end
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        run_loss, n_loss = run_loss + loss.item(), n_loss + 1
    tab = tr.table
    return tab[[c for c in COLUMNS if c in tab]], pd.DataFrame(losses)


def compute(cfg):
    ids, chars = corpus()
    ids = torch.as_tensor(ids)
    cut = int(0.9 * len(ids))
    g = torch.Generator().manual_seed(12345)
    val = ids[cut:]
    dev = cfg.get("device", "cpu")
    data = dict(train=ids[:cut].to(dev), vocab=len(chars),
                probe=windows(val, cfg["probe_seqs"], cfg["context"], g).to(dev),
                val_batch=windows(val, cfg["val_seqs"], cfg["context"], g).to(dev))
    tracks, losses = [], []
    for spec in cfg["optimizers"]:
        first = int(cfg.get("seed", 0))  # initialisation seeds first .. first + seeds - 1
        for seed in range(first, first + cfg["seeds"]):
            t, loss = train_run(cfg, dict(spec), seed, data)
            tracks.append(t)
            losses.append(loss)
    track = pd.concat(tracks, ignore_index=True)
    loss = pd.concat(losses, ignore_index=True)
    return {"track": track, "loss": loss, "summary": summary_table(track, loss)}


# ------------------------------------------------------------------------------ judge
def ends(track: pd.DataFrame) -> pd.DataFrame:
    """One row per (optimizer, seed, layer, head): step-0 and final values (suffixes _0, _T)."""
    key = ["optimizer", "seed", "layer", "head"]
    last = track.groupby(["optimizer", "seed"]).step.transform("max")
    return track[track.step == 0].merge(track[track.step == last], on=key, suffixes=("_0", "_T"))


def summary_table(track: pd.DataFrame, loss: pd.DataFrame) -> pd.DataFrame:
    """Medians over (seed, layer, head) at step 0 (random init) and at the last step."""
    last = track.groupby(["optimizer", "seed"]).step.transform("max")
    rows = []
    for (opt, when), g in pd.concat([track[track.step == 0].assign(when="init (step 0)"),
                                     track[track.step == last].assign(when="final")]
                                    ).groupby(["optimizer", "when"], sort=False):
        lo = loss.merge(g[["seed", "step"]].drop_duplicates(), on=["seed", "step"])
        lo = lo[lo.optimizer == opt]
        rows.append(dict(
            optimizer=opt, when=when, step=int(g.step.max()), heads=len(g),
            val_loss=float(lo.val_loss.median()), soft_sparsity=g.soft_sparsity.median(),
            wqk_norm=g.wqk_norm.median(), corr_mm=g.corr_mm.median(),
            corr_rot_q95=g.corr_rot_q95.median(), corr_null_mean=g.corr_null_mean.median(),
            margin_ratio=g.margin_ratio.median(), feasible=float(g.feasible.mean())))
    return pd.DataFrame(rows)


def sign_test(diff) -> tuple[float, float]:
    """(share of positive differences, one-sided binomial p-value for 'positive more often
    than not'); zeros are dropped."""
    from scipy.stats import binomtest

    d = np.asarray(diff, float)
    d = d[np.isfinite(d) & (d != 0)]
    if not len(d):
        return np.nan, np.nan
    k = int((d > 0).sum())
    return k / len(d), float(binomtest(k, len(d), 0.5, alternative="greater").pvalue)


_W7 = ("Sec. 4, Fig. 7 (ViT-base on CIFAR-10 there; a GPT-2 on text here, so a finding) and "
       "Transformers as SVMs (heads converge to the SVM of their selection)")
CLAIMS = {
    "learns": Claim(f"set-up: the model learns (held-out loss falls by >= {LEARNS:g} nat, median "
                    "over seeds)", kind="sanity"),
    "recompute": Claim("set-up: recomputed attention equals the model's (float32 model)",
                       kind="sanity"),
    "certificate": Claim("set-up: every SVM carries a certificate (violation <= 1e-6, relative "
                         "duality gap <= 1e-6)", kind="sanity"),
    "norm": Claim(f"Fig. 7 on text: ||W|| grows over training (median ||W_T|| / ||W_0|| >= "
                  f"{NORM_GROWTH:g})", kind="finding", where=_W7),
    "sparser": Claim(f"Fig. 7 on text: attention becomes sparser (median soft-sparsity ratio "
                     f"final / init <= {SPARSER:g})", kind="finding", where=_W7),
    "rho": Claim(f"Fig. 7 on text: sparsity goes with the growth of ||W|| (Spearman <= {RHO:g})",
                 kind="finding", where=_W7),
    "align": Claim("SVM alignment grows with training beyond the random-init control (one-sided "
                   f"sign test p < {P_SIGN:g})", kind="finding", where=_W7),
    "converge": Claim(f"heads converge in direction to the SVM of their selection (median final "
                      f"corr >= {CONVERGED:g})", kind="finding", where=_W7),
    "margin": Claim(f"the margin ratio grows with training (one-sided sign test p < {P_SIGN:g})",
                    kind="finding", where=_W7),
    "nulls": Claim("final heads beat both nulls in >= 95% of heads", kind="finding", where=_W7),
}
_ORDER = ["learns", "recompute", "certificate", "norm", "sparser", "rho", "align", "converge",
          "margin", "nulls"]


def judge(tables, cfg):
    """The checks of :func:`_judge`, each with the kind and place of its declaration in
    ``CLAIMS`` (one run per optimiser: the same ten verdicts, in ``_ORDER``)."""
    checks = _judge(tables, cfg)
    per = len(_ORDER)
    if [c.sanity for c in checks] != [CLAIMS[_ORDER[i % per]].kind == "sanity"
                                      for i in range(len(checks))]:
        raise RuntimeError("mmts-fig7-gpt2: the checks of _judge and _ORDER disagree")
    return [dataclasses.replace(c, kind=CLAIMS[_ORDER[i % per]].kind,
                                where=CLAIMS[_ORDER[i % per]].where)
            for i, c in enumerate(checks)]


def _judge(tables, cfg):
    track, loss = tables["track"], tables["loss"]
    E = ends(track)
    checks: list[Check] = []
    for spec in cfg["optimizers"]:
        o = spec["name"]
        t, e, lo = track[track.optimizer == o], E[E.optimizer == o], loss[loss.optimizer == o]
        T = int(t.step.max()) if len(t) else 0
        diverged = int(lo.val_loss.isna().sum())
        l0 = lo[lo.step == 0].val_loss.median()
        lT = lo[lo.step == lo.groupby("seed").step.transform("max")].val_loss.median()
        feas = t[t.feasible.astype(bool)]
        checks += [
            check_at_least(f"[{o}] set-up: the model learns (held-out loss falls by >= {LEARNS:g} "
                           "nat, median over seeds)", "val loss drop", l0 - lT, LEARNS, fmt=".3f",
                           note=f"{diverged} run(s) diverged" if diverged else "", kind="sanity"),
            check_at_most(f"[{o}] set-up: recomputed attention equals the model's (float32 model)",
                          "max |s_recomputed - s_model|", t.recompute_err.max(), 1e-5, fmt=".2g",
                          kind="sanity"),
            Check(f"[{o}] set-up: every SVM carries a certificate (violation <= 1e-6, relative "
                  "duality gap <= 1e-6)",
                  f"max violation {feas.svm_violation.max():.1e}, max gap {feas.svm_gap.max():.1e}; "
                  f"feasible {len(feas)}/{len(t)}",
                  bool(len(feas) and feas.svm_violation.max() <= 1e-6 and feas.svm_gap.max() <= 1e-6),
                  kind="sanity"),
        ]
        grow = (e.wqk_norm_T / e.wqk_norm_0).median()
        checks.append(check_at_least(
            f"[{o}] Fig. 7: ||W|| grows over training (median ||W_T|| / ||W_0|| over heads and "
            f"seeds >= {NORM_GROWTH:g})", "median norm ratio", grow, NORM_GROWTH, fmt=".3g",
            note=f"T = {T} steps"))
        spars = (e.soft_sparsity_T / e.soft_sparsity_0).median()
        checks.append(check_at_most(
            f"[{o}] Fig. 7: attention becomes sparser (median soft-sparsity ratio final / init "
            f"<= {SPARSER:g})", "median sparsity ratio", spars, SPARSER, fmt=".3g",
            note=f"soft-sparsity median {e.soft_sparsity_0.median():.2f} -> {e.soft_sparsity_T.median():.2f}"
                 f" (uniform over a causal window of {cfg['context']}: ~{(cfg['context'] + 1) / 2:.0f})"))
        rho = t[["wqk_norm", "soft_sparsity"]].corr(method="spearman").iloc[0, 1]
        checks.append(check_at_most(
            f"[{o}] Fig. 7: sparsity goes with the growth of ||W|| (Spearman(||W||, "
            f"soft-sparsity) over heads and steps <= {RHO:g})", "Spearman rho", rho, RHO, fmt=".3f"))
        share, p = sign_test(e.corr_mm_T - e.corr_mm_0)
        dmed = (e.corr_mm_T - e.corr_mm_0).median()
        checks.append(Check(
            f"[{o}] SVM alignment grows with training beyond the random-init control: "
            f"corr(W_head, W_mm) final > at step 0 in most heads (one-sided sign test p < {P_SIGN:g})",
            f"median corr {e.corr_mm_0.median():.3f} -> {e.corr_mm_T.median():.3f} (median change "
            f"{dmed:+.3f}); {share:.0%} of {len(e)} heads increase, p = {p:.2g}",
            bool(p < P_SIGN and dmed > 0)))
        checks.append(check_at_least(
            f"[{o}] heads converge in direction to the SVM of their selection (median final "
            f"corr >= {CONVERGED:g}, the converged level of docs/theory.md §7)", "median final corr",
            e.corr_mm_T.median(), CONVERGED, fmt=".3f"))
        share, p = sign_test(e.margin_ratio_T - e.margin_ratio_0)
        checks.append(Check(
            f"[{o}] the margin ratio (1 = max-margin) grows with training (one-sided sign test "
            f"p < {P_SIGN:g})",
            f"median {e.margin_ratio_0.median():.4f} -> {e.margin_ratio_T.median():.4f}; "
            f"{share:.0%} of heads increase, p = {p:.2g}",
            bool(p < P_SIGN and e.margin_ratio_T.median() > e.margin_ratio_0.median())))
        beat_T = (e.corr_mm_T > np.fmax(e.corr_rot_max_T, e.corr_null_max_T)).mean()
        beat_0 = (e.corr_mm_0 > np.fmax(e.corr_rot_max_0, e.corr_null_max_0)).mean()
        checks.append(check_at_least(
            f"[{o}] final heads beat both nulls (corr above the largest rotation and "
            "random-selection draw) in >= 95% of heads", "share of heads", beat_T, 0.95,
            fmt=".2f", note=f"at random init (step 0) the share is {beat_0:.2f}: the nulls do not "
                            "separate training from architecture, the step-0 control does"))
    return checks


# ------------------------------------------------------------------------------ plot
def plot(tables, cfg, out):
    track, loss = tables["track"], tables["loss"]
    opts = [s["name"] for s in cfg["optimizers"]]
    color = {o: P.COLORS[i % len(P.COLORS)] for i, o in enumerate(opts)}
    fig, ax = P.subplots(2, 2, width=4.4, height=3.3)
    for o in opts:
        t = track[track.optimizer == o]
        if not len(t):
            continue
        P.band(ax[0], t, "step", "corr_mm", label=f"{o}: corr(W, W_mm)", color=color[o])
        for col, ls, lab in (("corr_rot_q95", "--", "rotation null 95%"),
                             ("corr_null_mean", ":", "random-selection null")):
            med = t.groupby("step")[col].median()
            ax[0].plot(med.index, med.values, ls=ls, color=color[o], lw=1, label=f"{o}: {lab}")
        P.band(ax[1], t, "step", "margin_ratio", label=o, color=color[o])
        runs = t.groupby(["seed", "layer", "head"])
        for j, (_, g) in enumerate(runs):
            g = g.sort_values("step")
            ax[2].plot(g.wqk_norm, g.soft_sparsity, color=color[o], alpha=0.35, lw=0.8,
                       label=o if j == 0 else None)
            ax[2].scatter(g.wqk_norm.iloc[-1:], g.soft_sparsity.iloc[-1:], color=color[o], s=8)
        lo = loss[(loss.optimizer == o) & loss.val_loss.notna()]
        P.band(ax[3], lo, "step", "val_loss", label=o, color=color[o])
    for a in (ax[0], ax[1], ax[3]):
        a.set_xscale("symlog", linthresh=1)
    ax[1].set_yscale("log")
    ax[2].set_xscale("log")
    ax[0].set_ylim(-0.1, 1.1)  # correlations on their [0, 1] scale; the legend sits above the data
    P.label(ax[0], "step", "corr(W_head, W_mm)", "(a) alignment with the SVM (median, 10-90%)",
            legend=False)
    ax[0].legend(fontsize=6, ncol=2, loc="upper center")
    P.label(ax[1], "step", "margin ratio", "(b) margin ratio (1 = max-margin)")
    P.label(ax[2], "||W|| (W = W_k^T W_q / sqrt(d_h))", "soft-sparsity 1/||s||^2",
            "(c) sparsity against ||W|| (one line per head)")
    P.label(ax[3], "step", "held-out loss (nats/char)", "(d) next-character loss")
    return [P.save(fig, out, "mmts_fig7_gpt2")]


# ------------------------------------------------------------------------------ registry
OPTIMIZERS = (
    {"name": "AdamW", "rule": "torch.optim.AdamW", "lr": 3e-3, "weight_decay": 0.0},
    {"name": "SGD", "rule": "torch.optim.SGD", "lr": 0.5},
)
_C = dict(optimizers=OPTIMIZERS, n_layer=2, n_head=4, n_embd=64, context=64, batch=32,
          probe_seqs=8, val_seqs=64, max_queries=32, null_draws=1, rot_draws=32, dtype="float32",
          device="cpu", seed=0)
EXPERIMENT = Experiment(
    name="mmts-fig7-gpt2",
    title="Figure 7 on text: a GPT-2 trained from scratch on the Python docs (AdamW, SGD), "
          "sparsity against ||W|| and per-head alignment with the attention SVM",
    claim="Training a transformer from scratch makes its attention sparser as the key-query "
          "norm grows (Max-Margin Token Selection, Fig. 7), and each head's W converges in "
          "direction to the max-margin SVM of the tokens it selects (Transformers as SVMs).",
    configs={"tiny": {**_C, "n_embd": 16, "context": 16, "batch": 8, "probe_seqs": 2, "val_seqs": 4,
                      "max_queries": 6, "rot_draws": 4, "seeds": 1, "steps": 6, "records": 3},
             "quick": {**_C, "seeds": 2, "steps": 300, "records": 7},
             "full": {**_C, "seeds": 3, "steps": 3000, "records": 12}},
    compute=compute, judge=judge, plot=plot, in_default=False,
    requires=(("transformers", "probe"),),
    verdicts=tuple(CLAIMS[k] for k in _ORDER),
    deviations=(
        "Not the paper's setting, so every verdict is an attnsvm finding (none is counted as a "
        "paper claim): a 2-layer, 4-head character-level GPT-2 (d = 64, context 64) on the Python "
        "documentation text of pydoc_data (ships with CPython) instead of ViT-base on CIFAR-10: "
        "nothing may be downloaded, and the run must fit a CPU budget.",
        "Optimisers AdamW (lr 3e-3) and plain SGD (lr 0.5, the largest stable of 0.3 / 0.5 / 1.0 "
        "in a 600-step trial; 1.0 diverged) instead of the paper's SGD schedule; few steps "
        "(quick 300, full 3000), not 400 epochs.",
        "||W|| and sparsity of every head of every layer (the paper shows the last layer's "
        "combined matrix); the SVM is the causal seq-to-seq ATT-SVM of each head's argmax "
        "selection in its subspace, with the query bias as a constant-1 coordinate (32 queries "
        "of a fixed held-out batch).",
    ),
)
