"""Transformers as SVMs, local convergence: W- and (K, Q)-training reach the Frobenius /
nuclear SVM of the tokens they select, from random starts on random data (local convergence).

Setup (the paper's ``local_converge`` notebook): n = 6 sequences, T = 8 tokens, d = 10,
tokens x_it, queries z_i and head v uniform on the unit sphere, y_i uniform in {-1, +1}
(``attnsvm.data.random_sphere``), one dataset per seed, all seeds in one batch. Normalized
GD (lr 0.1, per-tensor norm, logistic loss, 2000 steps) on W and on (K, Q) with m = d
(plus eps (||K||^2 + ||Q||^2), eps = float64 machine epsilon), random start (each tensor of
Frobenius norm ``init_scale``). The tokens a run *reached* are alpha_i = argmax_t of its
final attention; the references are the Frobenius and nuclear ATT-SVM solutions for that
alpha (Frobenius: batched exact solver; nuclear: the SCS working-set path of attnsvm.svm,
one solve per distinct (seed, alpha), shared by the two models).

Claim: W_t / ||W_t|| -> W_fro(alpha) (Theorem 3: local convergence of GD on W), and
K_t Q_t^T / ||.|| -> W_nuc(alpha) (Theorem 2). Runs whose attention has not saturated
(mean max softmax probability < 0.99) or whose SVM is infeasible are excluded from the
correlation statistics and counted in the verdict's note.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.data import random_sphere
from attnsvm.experiments.base import Check, Experiment, check_at_least
from attnsvm.metrics import correlation, numerical_rank
from attnsvm.models import KQModel, WModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, band, label, save, subplots
from attnsvm.svm import att_svm, att_svm_batch
from attnsvm.train import train

CORR = 0.99  # directional convergence: median corr with the predicted SVM >= 0.99
SATURATED = 0.99  # attention saturated: mean max softmax probability >= 0.99 (THEORY §7)
WIN = 0.9  # the predicted SVM is the closer one in >= 90% of the included runs
PRED = {"W": "fro", "KQ": "nuc"}  # the prediction of the paper for each parameterisation
MODELS = {"W": "W", "KQ": "(K, Q)"}


def _train(name: str, data, cfg: dict):
    model = WModel(cfg["d"]) if name == "W" else KQModel(cfg["d"], m=cfg["d"])
    tr = train(model, data, optimizer=ngd(cfg["lr"]), steps=cfg["steps"], seed=cfg["seed"],
               init="random", scale=cfg["init_scale"], record_every=cfg["record_every"],
               record_params=True)
    H = tr.param_history
    Wt = H["W"] if name == "W" else H["K"] @ H["Q"].transpose(0, 1, 3, 2)  # (R, B, d, d)
    s = model.attention(tr.params, data).numpy()  # (B, n, T)
    return tr, Wt, s


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    data = random_sphere(cfg["n"], cfg["T"], cfg["d"], seed=cfg["seed"], batch=cfg["B"])
    B = cfg["B"]
    runs, curves, nuc_cache = [], [], {}
    for name in PRED:
        tr, Wt, s = _train(name, data, cfg)
        alpha = s.argmax(-1)
        fro = att_svm_batch(data.X, data.z, alpha)
        W_fro = np.where(fro.feasible_[:, None, None], np.nan_to_num(fro.W_), np.nan)
        W_nuc = np.full_like(W_fro, np.nan)
        for b in np.nonzero(fro.feasible_)[0]:  # feasibility does not depend on the norm
            key = (int(b), tuple(alpha[b]))
            if key not in nuc_cache:
                sol = att_svm(data.X[b], data.z[b], alpha[b], norm="nuc")
                nuc_cache[key] = sol.W_ if sol.feasible_ else np.full(W_fro.shape[1:], np.nan)
            W_nuc[b] = nuc_cache[key]
        c_fro, c_nuc = correlation(Wt, W_fro[None]), correlation(Wt, W_nuc[None])  # (R, B)
        pmax_t = tr.metrics.pivot(index="step", columns="trial", values="p_max").to_numpy()
        R = len(tr.record_steps)
        curves.append(pd.DataFrame({
            "model": name, "trial": np.tile(np.arange(B), R),
            "step": np.repeat(tr.record_steps, B), "p_max": pmax_t.ravel(),
            "corr_fro": c_fro.ravel(), "corr_nuc": c_nuc.ravel()}))
        p_max = s.max(-1).mean(-1)
        runs.append(pd.DataFrame({
            "model": name, "trial": np.arange(B), "alpha": [",".join(map(str, a)) for a in alpha],
            "p_max": p_max, "saturated": p_max >= SATURATED, "feasible": fro.feasible_,
            "corr_fro": c_fro[-1], "corr_nuc": c_nuc[-1],
            "rank_fro": np.where(fro.feasible_, numerical_rank(np.nan_to_num(W_fro), 1e-6), -1),
            "norm": np.linalg.norm(Wt[-1], axis=(-2, -1))}))
    return {"runs": pd.concat(runs, ignore_index=True),
            "curves": pd.concat(curves, ignore_index=True)}


def _included(runs: pd.DataFrame, model: str) -> tuple[pd.DataFrame, str]:
    r = runs[runs.model == model]
    ok = r[r.saturated & r.feasible & r.corr_nuc.notna()]
    note = (f"{len(ok)} of {len(r)} runs included; excluded: {int((~r.saturated).sum())} not "
            f"saturated (mean max prob < {SATURATED}), {int((~r.feasible).sum())} SVM infeasible")
    return ok, note


def judge(tables: dict, cfg: dict) -> list[Check]:
    runs = tables["runs"]
    checks = []
    for model, pred in PRED.items():
        other = "nuc" if pred == "fro" else "fro"
        ok, note = _included(runs, model)
        med = float(ok[f"corr_{pred}"].median()) if len(ok) else np.nan
        win = float((ok[f"corr_{pred}"] > ok[f"corr_{other}"]).mean()) if len(ok) else np.nan
        who = "W" if model == "W" else "K Q^T"
        checks += [
            check_at_least(f"{model}: training saturates the attention (>= 90% of runs reach mean "
                           f"max softmax probability >= {SATURATED})", "fraction saturated",
                           float(runs[runs.model == model].saturated.mean()), 0.9, note),
            check_at_least(f"{model}: {who} converges to the {pred} SVM of the tokens it selects "
                           f"(median corr >= {CORR})", f"median corr({who}, W_{pred})", med, CORR,
                           note + f"; median corr with W_{other} = "
                           f"{ok[f'corr_{other}'].median():.4f}" if len(ok) else note),
            check_at_least(f"{model}: {who} is closer to W_{pred} than to W_{other} in >= "
                           f"{WIN:.0%} of the included runs", f"fraction corr_{pred} > corr_{other}",
                           win, WIN, note),
        ]
    return checks


def plot(tables: dict, cfg: dict, out) -> list:
    runs, curves = tables["runs"], tables["curves"]
    fig, ax = subplots(3, 1, width=4.2, height=3.4)
    groups, labels = [], []
    for model in PRED:
        ok, _ = _included(runs, model)
        for ref in ("fro", "nuc"):
            groups.append(np.clip(1 - ok[f"corr_{ref}"].to_numpy(), 1e-12, None))
            labels.append(f"{'W' if model == 'W' else 'KQ^T'}\nvs W_{ref}")
    ax[0].boxplot(groups, showfliers=False)
    ax[0].set_xticks(range(1, len(labels) + 1), labels)
    rng = np.random.default_rng(0)
    for j, g in enumerate(groups):
        ax[0].scatter(j + 1 + 0.15 * rng.standard_normal(len(g)), g, s=6, alpha=0.5,
                      color=COLORS[0 if j % 2 == 0 else 1])
    ax[0].set_yscale("log")
    label(ax[0], "trained matrix vs SVM solution", "1 - correlation (final)",
          "(a) correlation with the SVMs of the reached tokens", legend=False)
    for j, model in enumerate(PRED):
        c = curves[curves.model == model]
        band(ax[1], c, "step", "p_max", label=MODELS[model], color=COLORS[2 + j])
        for ref, ls in (("fro", "-"), ("nuc", "--")):
            d = c.assign(gap=np.clip(1 - c[f"corr_{ref}"], 1e-12, None)).dropna()
            band(ax[2], d[d.step > 0], "step", "gap", label=f"{MODELS[model]} vs W_{ref}",
                 color=COLORS[2 + j], ls=ls)
    label(ax[1], "iteration t", "mean max softmax probability", "(b) attention saturates "
          "(median, 10-90% band)")
    for a in ax[1:]:
        a.set_xscale("log")
    ax[2].set_yscale("log")
    label(ax[2], "iteration t", "1 - correlation", "(c) convergence in direction")
    return [save(fig, out, "tfsvm_local")]


_BASE = dict(n=6, T=8, d=10, lr=0.1, init_scale=1.0, seed=0)
EXPERIMENT = Experiment(
    name="tfsvm-local",
    title="Local convergence of W to the Frobenius SVM and of (K, Q) to the nuclear SVM",
    claim="From random starts on random data, normalized GD on W converges in direction to the "
          "Frobenius-norm ATT-SVM of the tokens it selects, and on (K, Q) to the nuclear-norm "
          "ATT-SVM of its selected tokens.",
    configs={
        "tiny": dict(_BASE, B=2, steps=150, record_every=15),
        "quick": dict(_BASE, B=30, steps=2000, record_every=40),
        "full": dict(_BASE, B=100, steps=2000, record_every=20),
    },
    compute=compute, judge=judge, plot=plot,
)
