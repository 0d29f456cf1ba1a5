"""The optimiser-geometry atlas: which max-margin problem does each optimiser's attention solve?

The five papers pin one optimiser to one norm: GD / NGD / Polyak on W -> the Frobenius
ATT-SVM (Tarzanagh et al. 2023; Vasudeva et al. 2024), l_p mirror descent -> the l_p SVM
(Julistiono et al. 2024), gradient flow on (K, Q) -> the nuclear-norm SVM and on diagonal
(k, q) -> the l_1 SVM (Sheen et al. 2024). For linear classifiers the general rule is known:
normalised steepest descent w.r.t. a norm converges to the max-margin solution in that norm
(sign descent and Adam -> l_inf, spectral descent / Muon -> the spectral norm; e.g. Fan,
Schmidt, Thrampoulidis 2025). For softmax attention it had not been measured.

Setting: a population of random datasets (``random_sphere``: tokens, queries z and head v on
the unit sphere, labels +-1; n sequences of T tokens in d dims, fixed linear head, logistic
loss, cross-attention), one dataset and one random start per trial, every optimiser (row) run
on the same datasets. Each run's direction is compared with the ATT-SVM of the tokens it
selected (alpha_i = argmax_t s_it at the end), in seven norms (columns): Frobenius, l_1.5,
l_3, l_inf (entrywise max), spectral, nuclear and l_1 (all certified by ``att_svm``). For the
diagonal model the SVMs are over diagonal matrices W = diag(w) (where the nuclear norm is
||w||_1 and the spectral norm ||w||_inf).

Cells: corr(W, W_mm) (the common yardstick), the distance || W/||W|| - W_mm/||W_mm|| || in the
column's own norm, and which column is the nearest (highest correlation) for each run (columns
whose SVMs coincide, e.g. nuclear and l_1 for diagonal W, are nearest together).
Verdicts (attnsvm's findings: this is attnsvm's own question, no paper's claim is judged
here; the set-up checks are sanity checks), per row with a prediction, on the saturated runs
(min_i s_{i,alpha_i} >= 0.99):
the predicted SVM is the nearest of the seven in >= 90% of them, and the median correlation
with it is >= 0.99 (docs/theory.md §7's "converged in direction"). A row whose prediction fails is a
finding, reported with its numbers.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attnsvm import plotting as P
from attnsvm.data import random_sphere, stack
from attnsvm.experiments.base import Claim, Experiment
from attnsvm.metrics import correlation
from attnsvm.models import DiagModel, KQModel, WModel
from attnsvm.norms import get_norm
from attnsvm.optim import (
    InversePower,
    adam,
    gd,
    mirror,
    muon,
    ngd,
    polyak,
    sign_descent,
    signum,
    spectral_descent,
)
from attnsvm.svm import att_svm
from attnsvm.train import train

COLUMNS = ("fro", "l1.5", "l3", "linf", "spectral", "nuc", "l1")
LABEL = {"fro": "Frobenius", "l1.5": "l_1.5", "l3": "l_3", "linf": "l_inf", "spectral": "spectral",
         "nuc": "nuclear", "l1": "l_1"}
#: the norm of w in W = diag(w) that each column's matrix norm becomes for diagonal matrices
DIAG_NORM = {"fro": "fro", "l1.5": "l1.5", "l3": "l3", "linf": "linf", "spectral": "linf",
             "nuc": "l1", "l1": "l1"}
#: columns whose SVMs coincide by construction (diagonal W: nuclear = l_1, spectral = l_inf)
SAME = {"Diag": {"l1": {"nuc"}, "nuc": {"l1"}, "linf": {"spectral"}, "spectral": {"linf"}}}
SAT = 0.99      # saturated: min_i s_{i, alpha_i} >= 0.99
CORR = 0.99     # converged in direction (docs/theory.md §7)
NEAREST = 0.9   # the predicted SVM is the nearest in >= 90% of the saturated runs


@dataclass(frozen=True)
class Row:
    """An optimiser of the atlas: its label, model, rule (from the config), start and the
    column the theory (or its linear-classifier analogue) predicts, with the source."""

    name: str
    model: str  # "W" | "KQ" | "Diag"
    rule: Callable[[dict], object]
    init: str
    predicted: str | None
    source: str
    steps_factor: float = 1.0


ROWS = (
    Row("GD", "W", lambda c: gd(c["lr_gd"]), "random", "fro", "Tarzanagh et al. 2023", 2.0),
    Row("NGD", "W", lambda c: ngd(c["lr"]), "random", "fro", "Tarzanagh et al. 2023; Vasudeva et al. 2024"),
    Row("Polyak", "W", lambda c: polyak(1.0), "random", "fro", "Vasudeva et al. 2024"),
    Row("MD l_1.5", "W", lambda c: mirror(1.5, c["lr"], normalized=True), "random", "l1.5",
        "Julistiono et al. 2024"),
    Row("MD l_3", "W", lambda c: mirror(3.0, c["lr"], normalized=True), "random", "l3",
        "Julistiono et al. 2024"),
    Row("sign descent", "W", lambda c: sign_descent(c["lr_sign"]), "random", "linf",
        "linear analogue: steepest descent w.r.t. l_inf"),
    Row("Signum (b=0.9)", "W", lambda c: signum(c["lr_sign"], beta=0.9), "random", "linf",
        "linear analogue (momentum sign descent)"),
    Row("Adam (eps=0)", "W", lambda c: adam(c["lr_adam"], eps=0.0), "random", "linf",
        "linear analogue: Adam -> l_inf max margin (Zhang et al. 2024)"),
    Row("Adam (eps=1e-8)", "W", lambda c: adam(c["lr_adam"], eps=1e-8), "random", "linf",
        "linear analogue, with torch's default eps"),
    Row("Adam (b1=0, eps=0)", "W", lambda c: adam(c["lr_adam"], b1=0.0, eps=0.0), "random", "linf",
        "linear analogue, without momentum (RMSProp)"),
    Row("Adam (eta_t ~ t^-1/2, eps=0)", "W",
        lambda c: adam(InversePower(c["lr_adam_decay"], power=0.5), eps=0.0), "random", "linf",
        "Zhang, Zou, Cao 2024 (linear): Adam with eta_t = lr (t + 2)^(-a), a in (0, 1]"),
    Row("spectral descent", "W", lambda c: spectral_descent(c["lr_spec"]), "random", "spectral",
        "linear analogue: steepest descent w.r.t. the spectral norm"),
    Row("Muon", "W", lambda c: muon(c["lr_spec"]), "random", "spectral",
        "Fan, Schmidt, Thrampoulidis 2025 (linear)"),
    Row("GD flow on (K, Q)", "KQ", lambda c: ngd(c["rel"], norm="global", relative=True),
        "balanced", "nuc", "Sheen et al. 2024"),
    Row("GD flow on diag (k, q)", "Diag", lambda c: ngd(c["rel"], norm="global", relative=True),
        "unbalanced", "l1", "Sheen et al. 2024"),
)


def _model(kind: str, d: int):
    """The row's model; (K, Q) without the float64-eps ridge (the unregularised flow, whose
    limit the theorem describes; with the ridge the flow settles at a regularised point)."""
    if kind == "KQ":
        return KQModel(d, reg=0.0)
    return {"W": WModel, "Diag": DiagModel}[kind](d)


def _svm(data, b: int, alpha: np.ndarray, col: str, diag: bool) -> np.ndarray | None:
    """W_mm of dataset b at tokens alpha in the column's norm (diagonal: over diag(w))."""
    X, z = data.X[b], data.z[b]
    if diag:
        sol = att_svm(X * z[:, None, :], np.ones((X.shape[0], 1)), alpha,
                      norm=DIAG_NORM[col])
        return np.diag(sol.W_[:, 0]) if sol.feasible_ else None
    sol = att_svm(X, z, alpha, norm=col)
    return sol.W_ if sol.feasible_ else None


def population(n: int, T: int, d: int, seed: int, B: int):
    """B datasets, dataset b drawn by ``random_sphere(seed=seed + b)``: a smaller population
    (the quick scale) is a prefix of a larger one (the full scale)."""
    return stack([random_sphere(n=n, T=T, d=d, seed=seed + b) for b in range(B)])


def _nearest(corr: dict) -> str:
    """The column(s) of highest correlation, "|"-joined: SVMs that coincide (for diagonal W the
    nuclear and l_1 SVMs, the spectral and l_inf ones) tie and are all nearest."""
    if not corr:
        return ""
    top = max(corr.values())
    return "|".join(c for c, v in corr.items() if v >= top - 1e-9)


def row_seed(name: str) -> int:
    """A row's start seed offset from its name (CRC-32), so that adding, removing or
    selecting rows (``cfg["rows"]``) leaves every other row's starts unchanged."""
    return zlib.crc32(name.encode()) % 100_003


def compute(cfg):
    n, T, d, B = cfg["n"], cfg["T"], cfg["d"], cfg["B"]
    data = population(n, T, d, cfg["seed"], B)
    rows = [r for r in ROWS if r.name in cfg.get("rows", [r.name for r in ROWS])]
    cache: dict = {}
    runs, cells, curves = [], [], []
    for row in rows:
        model = _model(row.model, d)
        steps = int(cfg["steps"] * row.steps_factor)
        records = int(cfg.get("records", 2))  # even: the middle record is at half-time
        tr = train(model, data, loss="logistic", optimizer=row.rule(cfg), steps=steps,
                   seed=cfg["seed"] + row_seed(row.name), init=row.init, scale=cfg["init_scale"],
                   record_every=max(1, steps // records), record_params=True)
        W = tr.W
        hist = [model.W({kk: torch.as_tensor(v[j]) for kk, v in tr.param_history.items()}).numpy()
                for j in range(len(tr.record_steps))]  # W at every record (B, d, d)
        jh = len(tr.record_steps) // 2
        W_half = hist[jh]  # W at half-time: is the direction still moving?
        s = model.attention(tr.params, data).numpy()  # (B, n, T)
        alpha = s.argmax(-1)
        psel = np.take_along_axis(s, alpha[..., None], -1)[..., 0].min(1)
        norms = tr.metrics.pivot(index="trial", columns="step", values="norm").to_numpy()
        for b in range(B):
            corr, dist, sv = {}, {}, {}
            for col in COLUMNS:
                key = (row.model == "Diag", b, tuple(alpha[b]), col)
                if key not in cache:
                    cache[key] = _svm(data, b, alpha[b], col, row.model == "Diag")
                Wmm = cache[key]
                if Wmm is None:
                    corr[col] = dist[col] = np.nan
                    continue
                N = get_norm(col)
                sv[col] = Wmm
                corr[col] = float(correlation(W[b], Wmm))
                dist[col] = float(N.value(W[b] / N.value(W[b]) - Wmm / N.value(Wmm)))
                cells.append(dict(optimizer=row.name, run=b, column=col, corr=corr[col],
                                  dist=dist[col]))
            ok = {c: v for c, v in corr.items() if np.isfinite(v)}
            distinct = np.nan  # max corr of the predicted SVM with another column's SVM
            half = np.nan  # corr with the predicted SVM (of the final tokens) at half-time
            if row.predicted in sv:
                half = float(correlation(W_half[b], sv[row.predicted]))
                for j, st in enumerate(tr.record_steps):
                    curves.append(dict(optimizer=row.name, run=b, step=int(st), norm=float(norms[b, j]),
                                       corr_pred=float(correlation(hist[j][b], sv[row.predicted])),
                                       saturated=bool(psel[b] >= SAT)))
                same = SAME.get(row.model, {}).get(row.predicted, set())
                others = [float(correlation(sv[row.predicted], sv[c])) for c in sv
                          if c != row.predicted and c not in same]
                distinct = max(others) if others else np.nan
            runs.append(dict(optimizer=row.name, run=b, predicted=row.predicted or "",
                             saturated=bool(psel[b] >= SAT) and tr.stop_reason[b] != "non-finite step",
                             p_sel_min=float(psel[b]),
                             alpha_is_opt=bool((alpha[b] == data.opt[b]).all()),
                             norm=float(norms[b, -1]), norm_half=float(norms[b, jh]),
                             stop_reason=str(tr.stop_reason[b]), steps=steps,
                             pred_vs_others=distinct, corr_pred_half=half,
                             nearest=_nearest(ok)))
    runs = pd.DataFrame(runs)
    cells = pd.DataFrame(cells).merge(runs[["optimizer", "run", "saturated", "nearest"]],
                                      on=["optimizer", "run"])
    return {"runs": runs, "cells": cells, "atlas": atlas_table(runs, cells),
            "curves": pd.DataFrame(curves)}


def atlas_table(runs: pd.DataFrame, cells: pd.DataFrame, rows=ROWS, columns=COLUMNS) -> pd.DataFrame:
    """Per (optimiser, column) over the saturated runs: median / quartiles of corr, median
    distance in the column's norm, share of runs where the column is the nearest (ordered
    by ``rows`` and ``columns``: the atlas's, or another atlas's such as atlas-ntp's)."""
    sat = cells[cells.saturated].assign(
        is_nearest=lambda c: [col in near.split("|") for col, near in zip(c.column, c.nearest)])
    g = sat.groupby(["optimizer", "column"])
    out = g["corr"].median().rename("corr_median").to_frame()
    out["corr_q25"] = g["corr"].quantile(0.25)
    out["corr_q75"] = g["corr"].quantile(0.75)
    out["dist_median"] = g["dist"].median()
    out["share_nearest"] = g["is_nearest"].mean()
    out["n_saturated"] = g.size()
    out = out.reset_index()
    pred = runs.groupby("optimizer").predicted.first()
    out["predicted"] = out.column == out.optimizer.map(pred)
    order = {r.name: i for i, r in enumerate(rows)}
    out["_o"] = out.optimizer.map(order)
    out["_c"] = out.column.map({c: i for i, c in enumerate(columns)})
    return out.sort_values(["_o", "_c"]).drop(columns=["_o", "_c"]).reset_index(drop=True)


def _saturate_text(name: str) -> str:
    return f"{name}: the runs saturate (min_i s_(i,alpha_i) >= {SAT}) in >= 90% of runs"


def _differs_text(name: str, svm: str) -> str:
    return (f"{name}: the {svm} SVM differs from the other columns' SVMs (median over "
            f"datasets of its largest corr with another column < {CORR})")


def _nearest_text(name: str, svm: str) -> str:
    return (f"{name}: the {svm} SVM is the nearest of the seven in >= {NEAREST:.0%} of "
            f"the saturated runs")


def _converges_text(name: str, svm: str) -> str:
    return f"{name}: converges in direction to the {svm} SVM (median corr >= {CORR})"


_ROW, _SVM = "each optimiser", "predicted"
CLAIMS = {
    "saturate": Claim(_saturate_text(_ROW), kind="sanity"),
    "differs": Claim(_differs_text(_ROW, _SVM), kind="sanity"),
    "nearest": Claim(_nearest_text(_ROW, _SVM), kind="finding"),
    "converges": Claim(_converges_text(_ROW, _SVM), kind="finding"),
}
"""The declared verdicts (atlas-geometry and atlas-adam): ``judge`` returns them for each
optimiser in this order, its text naming the optimiser and its predicted SVM (an optimiser
without a prediction gets only "saturate")."""


def judge(tables, cfg):
    runs, atlas = tables["runs"], tables["atlas"]
    checks = []
    for name, r in runs.groupby("optimizer", sort=False):
        share_sat = float(r.saturated.mean())
        n_over = int((r.stop_reason == "non-finite step").sum())
        checks.append(CLAIMS["saturate"].check(
            f"{share_sat:.0%} of {len(r)} runs saturated after {int(r.steps.iloc[0])} steps"
            + (f"; {n_over} stopped on an overflowing step" if n_over else ""),
            bool(share_sat >= 0.9),
            note="a run that has not saturated (or whose step overflowed float64) has no "
                 "converged direction to compare; it is left out of the verdicts below"
                 + ("; Polyak's step c (L - L*) / ||G||^2 diverges when a run settles on "
                    "non-optimal tokens (L - L* stays bounded away from 0 while G -> 0)"
                    if n_over and name == "Polyak" else ""),
            claim=_saturate_text(name)))
        pred = r.predicted.iloc[0]
        if not pred:
            continue
        sep = float(r.pred_vs_others.median())
        checks.append(CLAIMS["differs"].check(
            f"median largest corr {sep:.4f}", bool(sep < CORR),
            note="if the SVMs coincide the row cannot tell the geometries apart",
            claim=_differs_text(name, LABEL[pred])))
        a = atlas[(atlas.optimizer == name)].set_index("column")
        if pred not in a.index:
            checks.append(CLAIMS["nearest"].check("no saturated run", False,
                                                  claim=_nearest_text(name, LABEL[pred])))
            continue
        row = next(x for x in ROWS if x.name == name)
        best = a.corr_median.idxmax()
        share = float(a.loc[pred, "share_nearest"])
        med = float(a.loc[pred, "corr_median"])
        growth = float((r.norm / r.norm_half.where(r.norm_half > 0)).median())
        half = float(r[r.saturated].corr_pred_half.median())
        note = (f"{row.source}. Median corr with each SVM: "
                + ", ".join(f"{LABEL[c]} {a.loc[c, 'corr_median']:.4f}" for c in COLUMNS if c in a.index)
                + f"; nearest overall: {LABEL[best]}; median ||W|| at the end / at half-time "
                  f"{growth:.3g}; median corr with the {LABEL[pred]} SVM at half-time {half:.4f}")
        checks.append(CLAIMS["nearest"].check(
            f"{share:.0%} of {int(a.loc[pred, 'n_saturated'])} saturated runs", bool(share >= NEAREST),
            note=note, claim=_nearest_text(name, LABEL[pred])))
        checks.append(CLAIMS["converges"].check(
            f"median corr {med:.5f} (quartiles {a.loc[pred, 'corr_q25']:.4f}-"
            f"{a.loc[pred, 'corr_q75']:.4f})", bool(med >= CORR),
            claim=_converges_text(name, LABEL[pred])))
    return checks


def plot(tables, cfg, out):
    return [heatmap(tables["atlas"], ROWS, COLUMNS, LABEL, out, "atlas", "W_mm")]


def heatmap(atlas: pd.DataFrame, rows, columns, labels: dict, out, name: str, svm: str = "W_mm"):
    """The atlas figure: median corr (log10(1 - corr)) and the share of runs where each
    column is the nearest, per (optimiser, column); a red box on the predicted column."""
    import matplotlib.colors as mcolors

    COLUMNS, LABEL = tuple(columns), labels
    names = [r.name for r in rows if r.name in set(atlas.optimizer)]
    corr = atlas.pivot(index="optimizer", columns="column", values="corr_median").reindex(
        index=names, columns=list(COLUMNS))
    share = atlas.pivot(index="optimizer", columns="column", values="share_nearest").reindex(
        index=names, columns=list(COLUMNS))
    pred = atlas[atlas.predicted].set_index("optimizer").column
    fig, ax = P.subplots(2, width=max(4.2, 0.55 * len(COLUMNS) + 2.6), height=0.42 * len(names) + 1.6)
    gap = np.clip(1 - corr.to_numpy(), 1e-6, 1)
    im = ax[0].imshow(np.log10(gap), cmap="viridis_r", vmin=-6, vmax=0, aspect="auto")
    fig.colorbar(im, ax=ax[0], shrink=0.8, label="log10(1 - median corr)")
    im2 = ax[1].imshow(share.to_numpy(), cmap="Blues", norm=mcolors.Normalize(0, 1), aspect="auto")
    fig.colorbar(im2, ax=ax[1], shrink=0.8, label="share of runs where nearest")
    for a, vals, fmt in ((ax[0], corr.to_numpy(), "{:.3f}"), (ax[1], share.to_numpy(), "{:.0%}")):
        for i in range(len(names)):
            for j in range(len(COLUMNS)):
                v = vals[i, j]
                if np.isfinite(v):
                    a.text(j, i, fmt.format(v), ha="center", va="center", fontsize=6.5,
                           color="w" if (a is ax[0] and v > 0.99) or (a is ax[1] and v > 0.6) else "k")
            if names[i] in pred.index:
                j = COLUMNS.index(pred[names[i]])
                a.add_patch(P.plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="#d62728", lw=1.6))
        a.set_xticks(range(len(COLUMNS)), [LABEL[c] for c in COLUMNS], rotation=35, ha="right")
        a.set_yticks(range(len(names)), names)
        a.grid(False)
    wide = len(COLUMNS) > 3
    ax[0].set_title(f"median corr(W, {svm}) of the saturated runs\n(red box: the predicted SVM)"
                    if wide else f"median corr(W, {svm}),\nsaturated runs (red: predicted)")
    ax[1].set_title("share of runs where the column is the nearest SVM" if wide
                    else "share of runs where\nthe column is the nearest")
    ax[1].set_yticks(range(len(names)), [""] * len(names))
    return P.save(fig, out, name)


_C = dict(lr=0.1, lr_gd=10.0, lr_sign=0.01, lr_adam=0.1, lr_adam_decay=0.1414, lr_spec=0.05, rel=0.01, init_scale=0.01)
EXPERIMENT = Experiment(
    name="atlas-geometry",
    title="Optimiser-geometry atlas: the max-margin problem each optimiser's attention solves",
    claim="Each optimiser's attention converges in direction to the max-margin SVM of its own "
          "geometry: GD / NGD / Polyak -> Frobenius, l_p mirror descent -> l_p, sign descent and "
          "Adam -> l_inf, spectral descent and Muon -> spectral, (K, Q) flow -> nuclear, "
          "diagonal (k, q) flow -> l_1 (the papers' results and their linear-classifier analogues).",
    configs={
        "tiny": {**_C, "n": 3, "T": 3, "d": 5, "B": 2, "steps": 200, "seed": 0},
        # quick: 3500 steps (2500 left 2 of the 16 GD and Adam runs unsaturated: the
        # sanity check "the runs saturate in >= 90%" failed at 88%; measured 2026-11-26)
        "quick": {**_C, "n": 3, "T": 3, "d": 8, "B": 16, "steps": 3500, "seed": 0},
        "full": {**_C, "n": 3, "T": 3, "d": 8, "B": 32, "steps": 5000, "seed": 0},
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "Sign descent, Adam, Signum, spectral descent and Muon have no attention result in the "
        "papers: their column is predicted from the linear-classifier analogue (steepest descent "
        "w.r.t. a norm -> that norm's max margin); a failure is a finding about attention.",
        "Gradient flow on (K, Q) and diagonal (k, q) is run as normalised GD with a step of 1% of "
        "the parameters' norm (a change of time of the flow), without the ridge, from a small "
        "start: balanced K = Q, and k random with q = 0 for the diagonal model (a balanced "
        "k = q keeps W = diag(k^2) >= 0 forever and cannot reach an SVM with a negative entry).",
        "Mirror descent is the normalised variant (as in mirror-bregman); GD runs at lr 10 for "
        "twice as many steps as the other rows (its norm grows like log t: at lr 1 no run "
        "saturated in 5000 steps); Adam runs at lr 0.1 (at lr 0.01, 3 of 8 runs saturated in "
        "2500 steps); the linear Adam -> l_inf result (Zhang, Zou, Cao 2024) assumes decaying "
        "steps eta_t = (t + 2)^(-a): one Adam row runs eta_t = 0.1414 (t + 2)^(-1/2) (first step "
        "0.1), the others a constant step, as Adam is used in practice.",
        "Steps are finite: slowly converging rules (GD, l_3 mirror descent) may be nearest to "
        "their SVM without reaching corr 0.99 yet; the table shows the norm growth of each row.",
        "Quick scale: 16 datasets (full 32): with 8, the diagonal row's median (its runs split "
        "between the l_1 SVM and KKT points of smaller support) flipped with the seed.",
        "attnsvm's own question: every verdict here is a finding (or a sanity check of the "
        "set-up), none is a paper's claim.",
    ),
)


# ------------------------------------------------------------- Adam's step schedule
ADAM_ROWS = ["Adam (eps=0)", "Adam (eta_t ~ t^-1/2, eps=0)", "sign descent"]


def adam_plot(tables, cfg, out):
    """corr(W_t, W_mm) with the l_inf SVM (of the final tokens) against the step, median and
    quartiles over the saturated runs of each row."""
    cur = tables["curves"]
    cur = cur[cur.saturated & (cur.step > 0)]
    fig, (ax,) = P.subplots(1, width=5.6, height=3.6)
    for name, g in cur.groupby("optimizer", sort=False):
        P.band(ax, g, "step", "corr_pred", label=name, q=(0.25, 0.75))
    ax.set_xscale("log")
    ax.axhline(CORR, color="0.5", lw=0.8, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel("corr(W_t, W_mm) with the l_inf SVM")
    ax.set_title("Adam: constant vs decaying steps (median, quartiles)")
    ax.legend(fontsize=8)
    return [P.save(fig, out, "atlas_adam")]


def adam_judge(tables, cfg):
    """The atlas verdicts of the three rows, with the l_inf correlation along the run in the
    notes (median over the saturated runs at a few steps)."""
    checks = judge(tables, cfg)
    cur = tables["curves"]
    steps = np.sort(cur.step.unique())
    marks = sorted({int(steps[len(steps) * k // 8]) for k in range(1, 8)} | {int(steps[-1])})
    out = []
    for c in checks:
        if not c.sanity and "converges in direction" in c.claim:
            name = c.claim.split(": converges")[0]
            g = cur[(cur.optimizer == name) & cur.saturated]
            med = g.groupby("step")["corr_pred"].median()
            c = dataclasses.replace(c, note="median corr with the l_inf SVM along the run: " + ", ".join(
                f"step {m}: {med.loc[m]:.4f}" for m in marks if m in med.index))
        out.append(c)
    return out


EXPERIMENTS = [Experiment(
    name="atlas-adam",
    title="Adam's implicit bias on attention: constant vs decaying steps, long runs",
    claim="Adam converges in direction to the l_inf max-margin SVM of the selected tokens (the "
          "linear result of Zhang, Zou, Cao 2024 assumes decaying steps eta_t = (t + 2)^(-a)); "
          "sign descent is the control.",
    configs={
        "tiny": {**_C, "n": 3, "T": 3, "d": 5, "B": 2, "steps": 400, "records": 4, "seed": 0,
                 "rows": ADAM_ROWS},
        "quick": {**_C, "n": 3, "T": 3, "d": 8, "B": 8, "steps": 50_000, "records": 20, "seed": 0,
                  "rows": ADAM_ROWS},
        "full": {**_C, "n": 3, "T": 3, "d": 8, "B": 32, "steps": 400_000, "records": 40, "seed": 0,
                 "rows": ADAM_ROWS},
    },
    compute=compute, judge=adam_judge, plot=adam_plot, in_default=False,
    verdicts=tuple(CLAIMS.values()),
    deviations=(
        "The atlas's datasets, starts and step sizes (Adam lr 0.1; decaying eta_t = 0.1414 "
        "(t + 2)^(-1/2), first step 0.1) with 80x the atlas's steps at full scale (400,000; "
        "quick 50,000 on 8 datasets); not in the default run (full: about 6 minutes here, quick 40 s).",
        "Zhang, Zou, Cao 2024 prove Adam -> l_inf for linear classifiers; attention has no "
        "such result: a failure is a finding about attention or about the step schedule.",
    ),
)]
