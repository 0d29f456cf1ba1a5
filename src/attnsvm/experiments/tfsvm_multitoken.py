"""Transformers as SVMs, nonlinear heads: W_eq = W_fin + R W_dir predicts the trained
attention, the one-token ATT-SVM does not.

Setup (the paper's ``multi_token_converge`` notebook): cross-attention, n = 3, T = 4,
d in {4, 6, 8, 10}; tokens x_it and queries z_i uniform on the unit sphere, labels uniform
in {-1, +1} (redrawn until a sequence has y = -1), fixed head f = 1^T ReLU(V^T u) with V
(d x d) Gaussian, ||V||_F = 1. W is trained by normalized GD (lr 0.1, logistic loss, 2000
steps) from a random start (||W_0||_F = ``init_scale``). All d are trained in ONE batch:
tokens, queries and V are zero-padded to d_max, W_0 is zero outside the d x d block, and the
padded entries of the gradient are exactly 0, so each trial is the d-dimensional problem.

Selected sets O_i = {t : s_it >= 1e-3} (THEORY §5). Predictors of the final W (corr over
the d x d block): W_dir (ATT-SVM': equal logits inside O_i, margin 1 against the rest),
W_eq = W_fin + R W_dir (W_fin reproduces the log-probability ratios inside O_i, R fitted
to W), and the one-token ATT-SVM for alpha_i = argmax_t s_it.

Runs: "finite" runs (no token below 1e-3: W_dir = 0 is meaningless) and infeasible SVMs
are excluded; runs with a token in (1e-6, 1e-3] (still being suppressed; the paper's
notebook discards them) are kept but counted in the note: at 2000 steps they are the
majority here. Claim (THEORY §9): 1 - corr(W, W_eq) < 1 - corr(W, W_dir) << 1 - corr(W, W_1tok).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.data import TokenData, random_sphere
from attnsvm.experiments.base import Check, Experiment, check_at_least
from attnsvm.metrics import correlation
from attnsvm.models import WModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, label, save, subplots
from attnsvm.svm import att_svm_batch, multitoken_svm
from attnsvm.train import train

THR = 1e-3  # selected-set threshold (THEORY §5)
LOW = 1e-6  # below: clearly suppressed; (LOW, THR] is the paper's "ambiguous" window
MUCH = 10.0  # "much better": median 1 - corr at least 10x smaller than the one-token SVM's
PRED = {"eq": "W_eq", "dir": "W_dir", "one": "one-token ATT-SVM"}


def padded_data(cfg: dict):
    """All d stacked in one batch, zero-padded to d_max: TokenData, V (B, D, D), d per trial."""
    D, S, n, T = max(cfg["ds"]), cfg["seeds"], cfg["n"], cfg["T"]
    Xs, zs, ys, Vs, dd = [], [], [], [], []
    for d in cfg["ds"]:
        rng = np.random.default_rng(cfg["seed"] * 1000 + d)
        data = random_sphere(n, T, d, seed=cfg["seed"] * 1000 + d, batch=S)
        y = data.y.copy()
        while (bad := (y == 1).all(1)).any():  # the paper needs a y = -1 sequence
            y[bad] = rng.choice([-1.0, 1.0], size=(int(bad.sum()), n))
        V = rng.standard_normal((S, d, d))
        pad = [(0, 0)] * 3
        Xs.append(np.pad(data.X, [(0, 0)] * 3 + [(0, D - d)]))
        zs.append(np.pad(data.z, pad[:2] + [(0, D - d)]))
        Vs.append(np.pad(V / np.linalg.norm(V, axis=(1, 2), keepdims=True), [(0, 0)] + [(0, D - d)] * 2))
        ys.append(y)
        dd += [d] * S
    data = TokenData(X=np.concatenate(Xs), y=np.concatenate(ys), z=np.concatenate(zs))
    return data, np.concatenate(Vs), np.asarray(dd)


def predictors(X, z, s, W):
    """(W_dir, W_eq) of one run (None, None if the W_dir problem is infeasible)."""
    sol = multitoken_svm(X, z, s, threshold=THR, W_trained=W)
    return (sol.W_dir_, sol.W_eq_) if sol.feasible_ else (None, None)


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    data, V, dd = padded_data(cfg)
    B, D = len(dd), data.d
    W0 = np.random.default_rng(cfg["seed"]).standard_normal((B, D, D))
    W0 *= (np.arange(D)[:, None] < dd[:, None, None]) & (np.arange(D)[None, :] < dd[:, None, None])
    W0 *= cfg["init_scale"] / np.linalg.norm(W0, axis=(1, 2), keepdims=True)
    model = WModel(D, head="relu", V=V)
    tr = train(model, data, optimizer=ngd(cfg["lr"]), steps=cfg["steps"], init={"W": W0},
               record_every=cfg["steps"])
    s = model.attention(tr.params, data).numpy()  # (B, n, T)
    one = att_svm_batch(data.X, data.z, s.argmax(-1))  # padding leaves the min-norm W unchanged
    rows = []
    for b in range(B):
        d = int(dd[b])
        X, z, W = data.X[b, :, :, :d], data.z[b, :, :d], tr.W[b, :d, :d]
        finite = not (s[b] < THR).any()
        W1 = one.W_[b, :d, :d] if one.feasible_[b] else None
        Wd, We = (None, None) if finite or W1 is None else predictors(X, z, s[b], W)
        corr = {"dir": Wd, "eq": We, "one": W1}
        rows.append(dict(
            d=d, trial=b, finite=finite, ambiguous=bool(((s[b] > LOW) & (s[b] <= THR)).any()),
            feasible=Wd is not None and one.feasible_[b], n_selected=float((s[b] >= THR).sum(-1).mean()),
            norm=float(np.linalg.norm(W)),
            **{f"gap_{k}": (1 - float(correlation(W, P)) if P is not None else np.nan)
               for k, P in corr.items()}))
    return {"runs": pd.DataFrame(rows)}


def judge(tables: dict, cfg: dict) -> list[Check]:
    r = tables["runs"]
    ok = r[~r.finite & r.feasible]
    med = ok.groupby("d")[["gap_eq", "gap_dir", "gap_one"]].median()
    note = (f"{len(ok)} of {len(r)} runs used; excluded {int(r.finite.sum())} finite (no token "
            f"below {THR:g}), {int((~r.finite & ~r.feasible).sum())} infeasible; "
            f"{int(ok.ambiguous.sum())} used runs have a token in ({LOW:g}, {THR:g}] "
            f"(the paper's notebook discards those). Medians of 1 - corr per d: " +
            "; ".join(f"d={d}: eq {m.gap_eq:.2e}, dir {m.gap_dir:.2e}, one {m.gap_one:.2e}"
                      for d, m in med.iterrows()))
    un = ok[~ok.ambiguous][["gap_eq", "gap_dir", "gap_one"]].median()
    note += (f". Unambiguous runs only ({int((~ok.ambiguous).sum())}, pooled over d): eq "
             f"{un.gap_eq:.2e}, dir {un.gap_dir:.2e}, one {un.gap_one:.2e}")
    eq_dir = float((med.gap_eq < med.gap_dir).mean()) if len(med) else np.nan
    pooled = ok[["gap_eq", "gap_one"]].median()
    ratio = float(pooled.gap_one / pooled.gap_eq) if len(ok) else np.nan
    per_d = ", ".join(f"d={d}: {m.gap_one / m.gap_eq:.1f}x" for d, m in med.iterrows())
    return [
        check_at_least("W_eq predicts the trained W better than W_dir: median 1 - corr(W, W_eq) < "
                       "median 1 - corr(W, W_dir) for every d", "fraction of d where W_eq wins",
                       eq_dir, 1.0, note),
        # pooled over d: a per-d minimum of medians over ~25 runs each moves by ~2x between
        # seeds (measured 8.7x-16.7x at quick), the pooled median by far less
        check_at_least(f"W_eq predicts much better than the one-token ATT-SVM: median "
                       f"1 - corr at least {MUCH:g}x smaller (all used runs)",
                       "median 1 - corr: one-token / W_eq", ratio, MUCH,
                       f"per d: {per_d}; W_eq better in "
                       f"{float((ok.gap_eq < ok.gap_one).mean()):.0%} of the used runs"),
        check_at_least("Nonlinear heads select several tokens: mean |O_i| > 1 in the used runs",
                       "mean |O_i|", float(ok.n_selected.mean()) if len(ok) else np.nan, 1.0 + 1e-9,
                       f"threshold {THR:g}"),
    ]


def plot(tables: dict, cfg: dict, out) -> list:
    r = tables["runs"]
    ok = r[~r.finite & r.feasible]
    fig, ax = subplots(2, 1, width=4.4, height=3.4)
    ds = sorted(r.d.unique())
    for j, (k, name) in enumerate(PRED.items()):
        g = ok.groupby("d")[f"gap_{k}"]
        x = np.arange(len(ds)) + (j - 1) * 0.25
        med = g.median().reindex(ds)
        lo, hi = g.quantile(0.25).reindex(ds), g.quantile(0.75).reindex(ds)
        ax[0].bar(x, med, width=0.25, color=COLORS[j], label=name,
                  yerr=[med - lo, hi - med], capsize=2)
    ax[0].set_xticks(np.arange(len(ds)), [str(d) for d in ds])
    ax[0].set_yscale("log")
    for j, (k, _) in enumerate(PRED.items()):
        strict = ok[~ok.ambiguous].groupby("d")[f"gap_{k}"].median().reindex(ds)
        ax[0].plot(np.arange(len(ds)) + (j - 1) * 0.25, strict, "kx", ms=6,
                   label="median over unambiguous runs" if j == 0 else None)
    if len(ok):  # room below the bars for the legend
        low = max(float(np.nanmin(ok[["gap_eq", "gap_dir", "gap_one"]].to_numpy())), 1e-12)
        ax[0].set_ylim(bottom=low / 30)
    label(ax[0], "embedding dimension d", "1 - corr(W, predictor) (median, IQR)",
          "(a) predicting the trained W", legend=False)
    ax[0].legend(loc="lower center", ncol=2, fontsize=7)
    rng = np.random.default_rng(0)
    for amb, col, name in ((False, COLORS[2], "no token in (1e-6, 1e-3]"),
                           (True, COLORS[3], "a token in (1e-6, 1e-3] (ambiguous)")):
        g = ok[ok.ambiguous == amb]
        ax[1].scatter(g.d + 0.3 * rng.standard_normal(len(g)), g.n_selected, s=12, alpha=0.7,
                      color=col, label=name)
    ax[1].set_xticks(ds)
    label(ax[1], "embedding dimension d", "mean selected-set size |O_i| (s >= 1e-3)",
          "(b) nonlinear heads select several tokens")
    return [save(fig, out, "tfsvm_multitoken")]


_BASE = dict(n=3, T=4, ds=[4, 6, 8, 10], lr=0.1, init_scale=1.0, seed=0)
EXPERIMENT = Experiment(
    name="tfsvm-multitoken",
    title="Nonlinear head: W_eq predicts the trained W, the one-token SVM does not",
    claim="With a nonlinear head 1^T ReLU(V^T u), attention selects several tokens; the trained W "
          "is predicted by W_eq = W_fin + R W_dir better than by W_dir and much better than by the "
          "one-token ATT-SVM.",
    configs={
        "tiny": dict(_BASE, ds=[4, 6], seeds=3, steps=300),
        "quick": dict(_BASE, seeds=25, steps=2000),
        "full": dict(_BASE, seeds=100, steps=2000),
    },
    compute=compute, judge=judge, plot=plot,
)
