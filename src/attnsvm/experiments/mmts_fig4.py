"""Max-Margin Token Selection, Figure 4: normalized GD vs GD on the prompt p.

Setup (the paper's ``multi_input_converge`` notebook, which draws Fig. 4): prompt model
a_it = x_it^T W p with fixed W = diag(1, 1, 0), head v = e_3, logistic loss, the Fig. 1(c)
dataset (n = 3 sequences of T = 7 tokens in d = 3, ``attnsvm.data.mmts_fig1_notebook``,
torch seed 0), p_0 = 0, 1000 iterations; each method at the notebook's own step size:
NGD p <- p - 0.1 G / ||G||, GD p <- p - 1 * G.  The figure plots iterations 0-200 on a
linear axis.  Population view: the same run on the notebook generator's seeds 0..K-1
(seed 0 is the figure's dataset).

Claim (Sec. 4): NGD drives the softmax probability to 1 (one token selected per input)
quicker than GD, which suffers from vanishing gradients: GD's ||p_t|| levels off.
The probability is the paper's "largest softmax probability" (1/n) sum_i max_t s_it
(column ``p_max``); the notebook plots the probability of token 0 (``p_sel_mean``),
which is the same here once attention has settled on the optimal tokens.

"Quicker" is measured as the first step with p_max >= 0.99 (the paper's saturation level,
App. E); the paper gives no factor, so the verdict is "NGD first" and the speed-up is
reported as measured.  "Levels off" is operationalised as: the increment of ||p|| over
[T/2, T] is at most 1.3x the increment over [T/4, T/2] (logarithmic growth gives 1,
linear growth 2), T = 1000.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm import plotting as P
from attnsvm.data import MMTS_FIG1_W, mmts_fig1_notebook
from attnsvm.experiments.base import Claim, Experiment
from attnsvm.models import PromptModel
from attnsvm.optim import gd, ngd
from attnsvm.train import train

PROB = 0.99     # "selects a single token per input" (the paper's saturation level)
LEVEL = 1.3     # GD's ||p|| "levels off": increment ratio <= 1.3 (log: 1, linear: 2)
LINEAR = 1.8    # NGD's ||p|| grows like eta t: increment ratio >= 1.8
COLOR = {"NGD": P.COLORS[1], "GD": P.COLORS[0]}


def compute(cfg):
    seed = cfg.get("seed", 0)
    data = mmts_fig1_notebook(range(seed, seed + cfg["datasets"]))
    frames = []
    for name, opt in (("NGD", ngd(cfg["lr_ngd"])), ("GD", gd(cfg["lr_gd"]))):
        tr = train(PromptModel(3, W_fixed=MMTS_FIG1_W), data, optimizer=opt, steps=cfg["steps"],
                   init="zero", record_every=cfg["record_every"])
        m = tr.metrics[["trial", "step", "p_max", "p_sel_mean", "norm", "loss"]]
        # a trial whose gradient is exactly 0 stops: carry its last row forward so every
        # trial has a value at every recorded step
        steps = np.arange(0, cfg["steps"] + 1, cfg["record_every"])
        full = pd.MultiIndex.from_product([np.unique(m.trial), steps], names=["trial", "step"])
        m = m.set_index(["trial", "step"]).reindex(full).groupby(level="trial").ffill().reset_index()
        frames.append(m.rename(columns={"trial": "dataset"}).assign(optimizer=name))
    return {"metrics": pd.concat(frames, ignore_index=True)}


def first_hits(m: pd.DataFrame) -> pd.DataFrame:
    """Per dataset: first step with p_max >= PROB for each optimizer (inf: never)."""
    hit = m[m.p_max >= PROB].groupby(["dataset", "optimizer"]).step.min().unstack()
    idx = np.unique(m.dataset)
    hit = hit.reindex(index=idx, columns=["NGD", "GD"]).astype(float).fillna(np.inf)
    return hit.assign(speedup=hit.GD / hit.NGD.clip(lower=1))


def growth(m: pd.DataFrame, name: str) -> pd.Series:
    """Per dataset: (||p_T|| - ||p_{T/2}||) / (||p_{T/2}|| - ||p_{T/4}||) for one optimizer."""
    d = m[m.optimizer == name]
    T = int(d.step.max())
    steps = np.asarray(sorted(d.step.unique()))
    at = {k: steps[np.abs(steps - k).argmin()] for k in (T // 4, T // 2, T)}
    w = d[d.step.isin(at.values())].pivot(index="dataset", columns="step", values="norm")
    a, b, c = (w[at[k]] for k in (T // 4, T // 2, T))
    return (c - b) / (b - a).where((b - a) > 0)


def _fmt(x: float) -> str:
    return "never" if not np.isfinite(x) else f"{x:.0f}"


CLAIMS = {
    "fig": Claim(
        f"the figure's dataset, p_0 = 0: NGD (eta 0.1) reaches the average largest softmax "
        f"probability {PROB} before GD (eta 1), each at the notebook's step size",
        quote="Observe that the normalized gradient method achieves a softmax probability of [1] "
              "quicker as vanilla GD suffers from vanishing gradients.", where="Sec. 4, Fig. 4(a)"),
    "level": Claim(
        f"the figure's dataset: GD's ||p_t|| levels off (vanishing gradients): its increment over "
        f"[T/2, T] is <= {LEVEL}x that over [T/4, T/2] (logarithmic growth: 1, linear: 2)",
        quote="This is visible in Figure 4(b) where blue norm curve levels off.",
        where="Sec. 4, Fig. 4(b)"),
    "pop": Claim(f"population (notebook generator, other seeds, p_0 = 0): NGD reaches {PROB} before "
                 "GD on every dataset", kind="finding"),
    "pop_level": Claim(f"population: GD's ||p_t|| levels off (increment ratio <= {LEVEL}) on every "
                       "dataset", kind="finding"),
    "ngd_lin": Claim(f"NGD's ||p_t|| grows like eta t (increment ratio >= {LINEAR} on every dataset; "
                     "NGD steps have length eta, so this checks that the direction settles)",
                     kind="sanity"),
}


def judge(tables, cfg):
    m = tables["metrics"]
    T = int(m.step.max())
    hit = first_hits(m)
    first_ds = hit.index[0]
    fig = hit.loc[first_ds]
    pop = hit.speedup
    fin = pop[np.isfinite(pop)]
    first = (hit.NGD < hit.GD)
    never = int(np.isinf(hit.GD).sum())
    g_gd, g_ngd = growth(m, "GD"), growth(m, "NGD")
    pop_note = (f"speed-up GD/NGD over {len(hit)} datasets: median {pop.median():.1f}x, min {pop.min():.1f}x"
                + (f", largest finite {fin.max():.1f}x" if len(fin) else "") + (f"; GD never reached {PROB} within {T} steps in {never} "
                                           f"(counted as inf)" if never else ""))
    norms = (f"||p_T||: GD {m[(m.optimizer == 'GD') & (m.step == T)].norm.median():.3g}, NGD "
             f"{m[(m.optimizer == 'NGD') & (m.step == T)].norm.median():.3g} (medians), T = {T}")
    C = CLAIMS
    return [
        C["fig"].check(f"first step >= {PROB}: NGD {_fmt(fig.NGD)}, GD {_fmt(fig.GD)} "
                       f"(speed-up {fig.speedup:.1f}x)", bool(fig.NGD < fig.GD),
                       "the paper says 'quicker' without a factor; the speed-up is reported, not "
                       "tested against a threshold"),
        C["level"].at_most("increment ratio GD", float(g_gd.loc[first_ds]), LEVEL, norms),
        C["pop"].at_least("datasets with NGD first", int(first.sum()), len(hit), pop_note, fmt="d"),
        C["pop_level"].at_most("largest increment ratio GD", float(g_gd.max()), LEVEL,
                               f"median {g_gd.median():.3f}"),
        C["ngd_lin"].at_least("smallest increment ratio NGD", float(g_ngd.min()), LINEAR),
    ]


def plot(tables, cfg, out):
    m = tables["metrics"]
    show = m[m.step <= cfg["show"]]
    fig, ax = P.subplots(3, width=4.0, height=3.2)
    lr = {"NGD": cfg["lr_ngd"], "GD": cfg["lr_gd"]}
    for name in ("NGD", "GD"):
        d = show[show.optimizer == name]
        P.band(ax[0], d, "step", "p_max", color=COLOR[name], lw=0.8, alpha=0.6,
               label=f"{name}, {cfg['datasets']} datasets (median, 10-90%)")
        P.band(ax[1], d, "step", "norm", color=COLOR[name], lw=0.8, alpha=0.6)
        f = d[d.dataset == 0]
        ax[0].plot(f.step, f.p_max, color=COLOR[name], lw=2.5,
                   label=f"{'Normalized GD' if name == 'NGD' else 'GD'} (eta = {lr[name]:g}), figure's dataset")
        ax[1].plot(f.step, f.norm, color=COLOR[name], lw=2.5, label=f"{name}, figure's dataset")
    ax[0].axhline(PROB, color="gray", ls=":", lw=0.8)
    for a in ax[:2]:
        a.set_xlim(0, cfg["show"])
    P.label(ax[0], "iterations", "(1/n) sum_i max_t s_it", "(a) largest softmax probability", legend=False)
    ax[0].legend(fontsize=6.5, loc="lower right")
    P.label(ax[1], "iterations", "||p||", "(b) attention weight norm", legend=False)
    ax[1].legend(fontsize=7, loc="upper left")
    hit = first_hits(m)
    gd_hit = hit.GD.replace(np.inf, cfg["steps"] * 1.05)
    fin = np.isfinite(hit.GD)
    ax[2].scatter(hit.NGD[fin], gd_hit[fin], s=14, color="k", label="one dataset")
    if (~fin).any():
        ax[2].scatter(hit.NGD[~fin], gd_hit[~fin], s=24, marker="^", color="k",
                      label=f"GD never within {cfg['steps']} steps")
    ax[2].scatter(hit.NGD.iloc[:1], gd_hit.iloc[:1], s=60, color=P.COLORS[3], zorder=3,
                  label=f"figure's dataset (seed {cfg.get('seed', 0)})")
    lim = [0, max(float(gd_hit.max()), float(hit.NGD.max())) * 1.05]
    ax[2].plot(lim, lim, color="gray", ls="--", lw=1, label="equal speed")
    ax[2].plot(lim, [10 * x for x in lim], color="gray", ls=":", lw=1, label="GD 10x slower")
    ax[2].set_xlim(0, float(hit.NGD.max()) * 1.3)
    ax[2].set_ylim(0, lim[1])
    P.label(ax[2], f"NGD: first step with prob >= {PROB}", f"GD: first step with prob >= {PROB}",
            "(c) population: steps to select one token", legend=False)
    ax[2].legend(fontsize=7, loc="lower right")
    return [P.save(fig, out, "mmts_fig4")]


_C = dict(lr_ngd=0.1, lr_gd=1.0, steps=1000, show=200, record_every=1, seed=0)
EXPERIMENT = Experiment(
    name="mmts-fig4", title="Figure 4: normalized GD vs GD (softmax probability and ||p||)",
    claim="NGD selects one token per input (softmax probability -> 1) quicker than GD, whose "
          "gradients vanish: under GD ||p_t|| levels off.",
    configs={"tiny": {**_C, "datasets": 2, "steps": 200, "show": 100},
             "quick": {**_C, "datasets": 8},
             "full": {**_C, "datasets": 64}},
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "float64 instead of the notebook's float32; the population view (notebook generator "
        "seeds seed..seed+K-1; the first is the figure's dataset, torch seed 0 by default) is "
        "attnsvm's addition to the paper's single dataset: its checks are findings.",
        "'GD's norm levels off' is tested as an increment ratio <= 1.3 over [T/4, T/2, T] "
        "(attnsvm's operationalisation; the paper shows the curve).",
    ),
)
