"""l_p mirror descent on attention (Julistiono, Tarzanagh, Azizan 2024): the l_p ATT-SVM.

Mirror descent with potential psi(W) = (1/p)||W||_p^p (entrywise), normalised by the dual
norm of the gradient (``attnsvm.optim.mirror(p, lr, normalized=True)``), logistic loss,
W_0 = 0. The paper proves W_t / ||W_t||_p -> W_mm^p / ||W_mm^p||_p, the l_p ATT-SVM of the
tokens the run selects (THEORY §5, §9): the directional Bregman divergence
D_psi(W_mm^p / ||W_mm^p||_p, W_t / ||W_t||_p) -> 0, and not towards the l_q SVM, q != p.

``mirror-bregman``: n = 6, T = 8, d = 10 random unit tokens, queries and head
(``random_sphere``, one draw per trial, trials batched), W model with the fixed head v,
lr 0.1, p in {1.75, 2, 3}. "Tokens reached" = the final attention argmax per sequence.
Table: optimiser p (rows) against the l_q SVMs of the tokens it reached (columns): mean
final correlation <W, W_mm^q> / (|W| |W_mm^q|) and mean directional Bregman divergence in
the column's potential psi_q. Prediction: the diagonal wins (each row's highest
correlation is its own p, each column's smallest D_psi_q is the run with p = q).

``mirror-joint``: the paper's toy (``attnsvm.data.mirror_joint_toy``, z_i = x_i1,
y = (1, -1)), W and the head v trained jointly by l_p MD from (W, v) = (0, 0). Which
tokens each p selects; W -> the l_p ATT-SVM and v -> the l_p head SVM of those tokens.
Each run is read at its last iteration (``read_step``: the budget, or the step where the
logistic derivative underflows to 0 in float64 and the trainer stops the run, THEORY §8).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from matplotlib.ticker import NullFormatter

from attnsvm import plotting as P
from attnsvm.data import mirror_joint_toy, random_sphere
from attnsvm.experiments.base import Check, Experiment, check_at_least, check_at_most
from attnsvm.metrics import correlation, directional_bregman
from attnsvm.models import WModel
from attnsvm.optim import mirror
from attnsvm.svm import att_svm, head_svm
from attnsvm.train import train

SAT = 0.99        # saturated (THEORY §7): mean_i max_t s_it >= 0.99
CORR = 0.99       # "converged in direction" (THEORY §7)
DECAY = 0.1       # D_psi must fall by at least 10x from the first recorded iteration


def _fmt(p: float) -> str:
    return f"{p:g}"


# ------------------------------------------------------------------ mirror-bregman
def compute_bregman(cfg):
    ps = list(cfg["ps"])
    data = random_sphere(cfg["n"], cfg["T"], cfg["d"], seed=cfg["seed"], batch=cfg["B"])
    model = WModel(cfg["d"])
    cache: dict = {}

    def svm(b, alpha, q):  # l_q ATT-SVM of trial b's reached tokens (shared across rows)
        key = (b, tuple(alpha), q)
        if key not in cache:
            sol = att_svm(data.X[b], data.z[b], alpha, norm=q)
            cache[key] = sol.W_ if sol.feasible_ else np.full((cfg["d"],) * 2, np.nan)
        return cache[key]

    curves, final, runs = [], [], []
    for p in ps:
        tr = train(model, data, loss="logistic", optimizer=mirror(p, cfg["lr"], normalized=True),
                   steps=cfg["steps"], seed=cfg["seed"], init="zero", record_params=True,
                   record_every=cfg["record_every"])
        s = model.attention(tr.params, data).numpy()  # (B, n, T)
        alpha = s.argmax(-1)
        runs.append(pd.DataFrame({"p": p, "trial": np.arange(cfg["B"]),
                                  "p_max_mean": s.max(-1).mean(-1), "p_max_min": s.max(-1).min(-1),
                                  "alpha": [str(a.tolist()) for a in alpha]}))
        W = tr.W
        for q in ps:
            Wq = np.stack([svm(b, alpha[b], q) for b in range(cfg["B"])])
            final.append(pd.DataFrame({"p": p, "q": q, "trial": np.arange(cfg["B"]),
                                       "corr": correlation(W, Wq),
                                       "bregman": directional_bregman(Wq, W, q)}))
            if q == p:
                H = tr.param_history["W"][1:]  # (R, B, d, d); step 0 (W = 0) has no direction
                R = len(H)
                with np.errstate(invalid="ignore"):
                    curves.append(pd.DataFrame({
                        "p": p, "step": np.repeat(tr.record_steps[1:], cfg["B"]),
                        "trial": np.tile(np.arange(cfg["B"]), R),
                        "bregman": directional_bregman(Wq[None], H, p).reshape(-1),
                        "corr": correlation(H, Wq[None]).reshape(-1)}))
    final = pd.concat(final, ignore_index=True)
    table = (final.groupby(["p", "q"]).agg(corr=("corr", "mean"), bregman=("bregman", "mean"),
                                           n_feasible=("corr", "count"))
             .reset_index().assign(n_trials=cfg["B"]))
    return {"table": table, "final": final, "curves": pd.concat(curves, ignore_index=True),
            "runs": pd.concat(runs, ignore_index=True)}


def judge_bregman(tables, cfg):
    tab, curves, runs = tables["table"], tables["curves"], tables["runs"]
    ps = sorted(tab.p.unique())
    corr = tab.pivot(index="p", columns="q", values="corr")
    breg = tab.pivot(index="p", columns="q", values="bregman")
    sat = runs.assign(s=runs.p_max_mean >= SAT).groupby("p").s.mean()
    steps = int(curves.step.max())
    checks = []
    for p in ps:
        row = corr.loc[p]
        best = row.idxmax()
        checks.append(Check(
            f"MD with p = {_fmt(p)} aligns best with its own l_{_fmt(p)} SVM (row maximum of the "
            "mean correlation over the l_q SVMs)",
            "; ".join(f"corr with l_{_fmt(q)}: {row[q]:.4f}" for q in row.index),
            bool(best == p), "" if best == p else
            f"row maximum at q = {_fmt(best)}; {sat[p]:.0%} of runs saturated after {steps} steps"))
    col_best = {q: breg[q].idxmin() for q in breg.columns}
    checks.append(Check(
        "for each l_q SVM the run with p = q has the smallest mean directional Bregman "
        "divergence D_psi_q (column minimum on the diagonal)",
        "; ".join(f"column l_{_fmt(q)}: min at p = {_fmt(r)} ({breg.loc[r, q]:.2e})"
                  for q, r in col_best.items()),
        all(r == q for q, r in col_best.items())))
    med = curves.groupby(["p", "step"]).bregman.median()
    for p in ps:
        m = med.loc[p]
        checks.append(check_at_most(
            f"p = {_fmt(p)}: the directional Bregman divergence to the l_{_fmt(p)} SVM falls by "
            f">= {1 / DECAY:g}x from iteration {int(m.index[0])} to {int(m.index[-1])} (median)",
            "ratio last / first", float(m.iloc[-1] / m.iloc[0]), DECAY,
            note=f"{sat[p]:.0%} of runs saturated (mean_i max_t s_it >= {SAT})", fmt=".3g"))
    checks.append(check_at_least(
        f"the runs saturate (mean_i max_t s_it >= {SAT}, THEORY §7) in >= 90% of trials, so "
        "that the reached tokens are defined",
        "smallest fraction over p", float(sat.min()), 0.9,
        note="; ".join(f"p = {_fmt(p)}: {v:.0%}" for p, v in sat.items()), fmt=".2f"))
    return checks


def _heat(ax, piv, fmt, title, cmap):
    A = piv.to_numpy(dtype=float)
    ax.imshow(A, cmap=cmap, aspect="auto")
    dark = (A - np.nanmin(A)) / max(np.nanmax(A) - np.nanmin(A), 1e-300)
    dark = dark if not cmap.endswith("_r") else 1 - dark
    for i in range(piv.shape[0]):
        for j in range(piv.shape[1]):
            ax.text(j, i, format(A[i, j], fmt), ha="center", va="center", fontsize=8,
                    color="white" if dark[i, j] > 0.6 else "black")
    ax.set_xticks(range(piv.shape[1]), [f"l_{_fmt(q)}" for q in piv.columns])
    ax.set_yticks(range(piv.shape[0]), [f"p = {_fmt(p)}" for p in piv.index])
    ax.grid(False)
    P.label(ax, "SVM norm (column)", "mirror descent (row)", title, legend=False)


def plot_bregman(tables, cfg, out):
    tab, curves = tables["table"], tables["curves"]
    fig, ax = P.subplots(3, width=4.2, height=3.4)
    for i, (p, df) in enumerate(curves.groupby("p")):
        P.band(ax[0], df[df.bregman > 0], "step", "bregman", label=f"p = {_fmt(p)}",
               color=P.COLORS[i])
    ax[0].set_xscale("log")
    ax[0].set_yscale("log")
    P.label(ax[0], "iteration t", "D_psi(W_mm/|W_mm|_p, W_t/|W_t|_p)",
            f"Bregman div. to the l_p SVM ({cfg['B']} runs: median, 10-90%)")
    _heat(ax[1], tab.pivot(index="p", columns="q", values="corr"), ".4f",
          "mean final correlation (row max = diag.)", "Blues")
    _heat(ax[2], tab.pivot(index="p", columns="q", values="bregman"), ".1e",
          "mean final D_psi_q (column min = diag.)", "Reds_r")
    return [P.save(fig, out, "mirror_bregman")]


# ------------------------------------------------------------------ mirror-joint
def compute_joint(cfg):
    data = mirror_joint_toy()
    model = WModel(data.d, train_head=True)
    paths, summary = [], []
    for p in cfg["ps"]:
        tr = train(model, data, loss="logistic", optimizer=mirror(p, cfg["lr"], normalized=True),
                   steps=cfg["steps"], init="zero", record_every=cfg["record_every"],
                   record_params=True)
        H = {k: torch.as_tensor(v[:, 0]) for k, v in tr.param_history.items()}  # (R, ...)
        logits = model.logits(H, data).numpy()  # (R, n, T)
        top = np.sort(logits, -1)
        gap = (top[..., -1] - top[..., -2]).max(-1)  # max_i top-2 logit gap, (R,)
        r = len(gap) - 1  # last record: end of budget or the step the run stopped
        alpha = logits[r].argmax(-1)
        Wp = att_svm(data.X, data.z, alpha, norm=p)
        vp = head_svm(data.X[np.arange(data.n), alpha], data.y, p=p)
        W, v = H["W"].numpy(), H["v"].numpy()
        s = model.attention(H, data).numpy()  # (R, n, T)
        # W_0 = v_0 = 0 has no direction: correlation is nan there
        cw = correlation(W, Wp.W_[None]) if Wp.feasible_ else np.full(len(W), np.nan)
        cv = correlation(v, vp.W_[None], vector=True) if vp.feasible_ else np.full(len(v), np.nan)
        n, T, R = data.n, data.T, len(gap)
        paths.append(pd.DataFrame({
            "p": p, "step": np.repeat(tr.record_steps, n * T),
            "seq": np.tile(np.repeat(np.arange(n), T), R),
            "token": np.tile(np.arange(T), R * n),
            "attention": s.reshape(-1),
            "corr_W": np.repeat(cw, n * T), "corr_v": np.repeat(cv, n * T)}))
        summary.append(dict(
            p=p, alpha=str(alpha.tolist()), read_step=int(tr.record_steps[r]),
            logit_gap=float(gap[r]), p_max_min=float(s[r].max(-1).min()),
            svm_feasible=bool(Wp.feasible_ and vp.feasible_), corr_W=float(cw[r]),
            corr_v=float(cv[r]),
            bregman_W=float(directional_bregman(Wp.W_, W[r], p)) if Wp.feasible_ else np.nan,
            bregman_v=float(directional_bregman(vp.W_, v[r], p, vector=True))
            if vp.feasible_ else np.nan))
    return {"summary": pd.DataFrame(summary), "paths": pd.concat(paths, ignore_index=True)}


def judge_joint(tables, cfg):
    sm = tables["summary"]
    per_p = "; ".join(f"p = {_fmt(r.p)}: {r.alpha}" for r in sm.itertuples())
    worst = sm.loc[sm.corr_W.idxmin()] if sm.corr_W.notna().any() else sm.iloc[0]
    return [
        check_at_least(f"every p saturates on a token per sequence (min_i max_t s_it >= {SAT})", "smallest over p",
                       float(sm.p_max_min.min()), SAT, note=f"selected tokens: {per_p}"),
        Check("different p may select different tokens (the paper's observation)",
              f"{sm.alpha.nunique()} distinct selections: {per_p}", bool(sm.alpha.nunique() >= 2)),
        check_at_least(f"W -> the l_p ATT-SVM of the tokens p selects (corr >= {CORR} for every p)",
                       "min over p of corr(W, W_mm^p)", float(sm.corr_W.min()), CORR,
                       note=f"worst p = {_fmt(worst.p)}; infeasible SVMs: "
                            f"{int((~sm.svm_feasible).sum())}"),
        check_at_least(f"v -> the l_p head SVM of the selected tokens (corr >= {CORR} for every p)",
                       "min over p of corr(v, v_mm^p)", float(sm.corr_v.min()), CORR),
    ]


def plot_joint(tables, cfg, out):
    paths, sm = tables["paths"], tables["summary"].set_index("p")
    ps = list(sm.index)
    fig, ax = P.subplots(len(ps), 2, width=3.3, height=2.8)
    ax = ax.reshape(2, len(ps))
    for j, p in enumerate(ps):
        d = paths[(paths.p == p) & (paths.step > 0)]
        for (i, t), g in d.groupby(["seq", "token"]):
            ax[0, j].plot(g.step, g.attention, color=P.COLORS[t], ls=["-", "--", ":"][i % 3],
                          label=f"seq {i}, token {t}" + (" (= query)" if t == 0 else ""))
        P.label(ax[0, j], "iteration", "attention s_it",
                f"p = {_fmt(p)}: selects {sm.loc[p, 'alpha']}", legend=False)
        g = d.drop_duplicates("step")
        ax[1, j].plot(g.step, 1 - g.corr_W, color=P.COLORS[4], label="W vs l_p ATT-SVM")
        ax[1, j].plot(g.step, 1 - g.corr_v, color=P.COLORS[5], label="v vs l_p head SVM")
        ax[1, j].set_yscale("log")
        P.label(ax[1, j], "iteration", "1 - correlation",
                f"p = {_fmt(p)}: read at t = {sm.loc[p, 'read_step']}", legend=(j == 0))
        for a in ax[:, j]:
            a.set_xscale("log")
            a.xaxis.set_minor_formatter(NullFormatter())
    ax[0, 0].legend(fontsize=6, loc="center left")
    return [P.save(fig, out, "mirror_joint")]


EXPERIMENTS = [
    Experiment(
        name="mirror-bregman",
        title="l_p mirror descent: directional Bregman divergence and the p-vs-q SVM table",
        claim="l_p mirror descent on W converges in direction to the l_p ATT-SVM of the "
              "selected tokens (Bregman divergence -> 0), and is closer to it than to the "
              "l_q SVMs for q != p.",
        configs={
            "tiny": dict(n=4, T=4, d=5, B=3, steps=200, record_every=10, lr=0.1,
                         ps=(1.75, 2.0, 3.0), seed=0),
            "quick": dict(n=6, T=8, d=10, B=16, steps=2000, record_every=20, lr=0.1,
                          ps=(1.75, 2.0, 3.0), seed=0),
            "full": dict(n=6, T=8, d=10, B=100, steps=10000, record_every=50, lr=0.1,
                         ps=(1.75, 2.0, 3.0), seed=0),
        },
        compute=compute_bregman, judge=judge_bregman, plot=plot_bregman),
    Experiment(
        name="mirror-joint",
        title="Joint (W, v) l_p mirror descent on the paper's toy: selected tokens per p",
        claim="Trained jointly by l_p mirror descent, W converges to the l_p ATT-SVM and v to "
              "the l_p head SVM of the tokens it selects; different p can select different "
              "tokens.",
        configs={
            "tiny": dict(ps=(1.75, 3.0), steps=150, lr=0.1, record_every=2),
            "quick": dict(ps=(1.25, 1.75, 2.0, 3.0), steps=450, lr=0.1, record_every=2),
            "full": dict(ps=(1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0), steps=3000, lr=0.1,
                         record_every=1),
        },
        compute=compute_joint, judge=judge_joint, plot=plot_joint),
]
