"""The atlas's NTP column: which Graph-SVM norm does each optimiser reach on next-token
prediction?

attnsvm's own question (issue 21, item 4), beyond the paper: Li, Huang, Ildiz, Rawat, Oymak
(AISTATS 2024) prove that GD on one self-attention layer trained by next-token prediction
converges in direction to the Graph-SVM (docs/theory.md, "Next-token prediction"), in the
Frobenius norm for the combined W; (K, Q) training reaches the nuclear-norm ATT-SVM in
classification (Sheen et al. 2024; ``ntp-kq`` asks it of the Graph-SVM). Which of the two
Graph-SVMs do sign descent, Adam and Muon reach, on W and on (K, Q)?

Setting: a population of the paper's random datasets (``attnsvm.ntp.ntp_random``, acyclic
priority graphs, so the trained direction has no finite soft-composition part W_fin to
hide behind) at the published sizes, the identity head and NTP loss of the global
notebooks (``NTPModel(d, param, "iden")``), one dataset and one random start per trial,
every optimiser (row) of :mod:`attnsvm.optim` run by :func:`attnsvm.train.train` on the
same datasets. After training, the tokens each run selects (attention mass > 1e-2 per
token id, the local notebook's ``C_thres``; mass in (9e-3, 1e-2] left out) are the labels
of the run's own Graph-SVM, solved and certified by ``graph_svm(E, seqs, Y, norm=...)`` in
the two norms (columns) "fro" and "nuc". Cells: corr(W, W_svm) with W = the trained W or
K Q^T (the atlas's yardstick), the distance ||W/||W|| - W_svm/||W_svm|| || in the column's
norm, and which column is nearer.

Verdicts (attnsvm's findings and sanity checks; no paper's claim is judged here, see
``ntp-global`` for the paper's), per row on its saturated runs (every sample's attention
mass on its selected tokens >= 0.99):

- a row predicted "fro" (GD, NGD on W: the paper's theorem) or "nuc" (the (K, Q) flow: the
  classification analogue): the predicted Graph-SVM is the nearer in >= 90% of the runs and
  the median corr with it is >= 0.99 (the atlas's thresholds);
- a row predicted "neither" (sign descent, Adam, Muon on W): the median corr with each of
  the two Graph-SVMs is < 0.99. Their linear-classifier analogues converge to the l_inf
  (sign, Adam) and spectral (Muon) max margins, which are neither Graph-SVM here;
- (K, Q) rows of sign descent, Adam and Muon carry no prediction: their cells are reported
  (the answer to the question), only the saturation check is judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attnsvm.experiments.atlas import CORR, NEAREST, SAT, atlas_table, heatmap, row_seed
from attnsvm.experiments.base import Claim, Experiment
from attnsvm.experiments.ntp import _selected
from attnsvm.metrics import correlation
from attnsvm.norms import get_norm
from attnsvm.ntp import PUBLISHED_SIZES, NTPModel, ntp_random, ntp_tensors
from attnsvm.optim import adam, gd, muon, ngd, sign_descent
from attnsvm.svm import graph_svm
from attnsvm.train import train

COLUMNS = ("fro", "nuc")
LABEL = {"fro": "Frobenius Graph-SVM", "nuc": "nuclear Graph-SVM"}
NEITHER = "neither"


@dataclass(frozen=True)
class Row:
    """An optimiser of the NTP column: label, parameterisation ("W" | "KQ"), rule (from the
    config), prediction ("fro" | "nuc" | "neither" | None) and its source."""

    name: str
    param: str
    rule: Callable[[dict], object]
    predicted: str | None
    source: str
    steps_factor: float = 1.0


ROWS = (
    Row("GD", "W", lambda c: gd(c["lr_gd"]), "fro",
        "Li et al. 2024: GD -> the Graph-SVM (Frobenius, for W)", 2.0),
    Row("NGD", "W", lambda c: ngd(c["lr"]), "fro",
        "Li et al. 2024 (their notebooks train with normalised GD)"),
    Row("sign descent", "W", lambda c: sign_descent(c["lr_sign"]), NEITHER,
        "linear analogue: steepest descent w.r.t. l_inf -> the l_inf max margin"),
    Row("Adam (eps=0)", "W", lambda c: adam(c["lr_adam"], eps=0.0), NEITHER,
        "linear analogue: Adam -> l_inf max margin (Zhang, Zou, Cao 2024)"),
    Row("Muon", "W", lambda c: muon(c["lr_spec"]), NEITHER,
        "linear analogue: Muon -> spectral-norm max margin (Fan, Schmidt, Thrampoulidis 2025)"),
    Row("GD flow on (K, Q)", "KQ", lambda c: ngd(c["rel"], norm="global", relative=True), "nuc",
        "classification analogue: (K, Q) flow -> nuclear ATT-SVM (Sheen et al. 2024)"),
    Row("sign descent on (K, Q)", "KQ", lambda c: sign_descent(c["lr_sign"]), None, ""),
    Row("Adam (eps=0) on (K, Q)", "KQ", lambda c: adam(c["lr_adam"], eps=0.0), None, ""),
    Row("Muon on (K, Q)", "KQ", lambda c: muon(c["lr_spec"]), None, ""),
)


def population(size: str, graph: str, seed: int, S: int) -> list:
    """S datasets of a published size, dataset s drawn by ``ntp_random(seed=[seed, s])``:
    the quick population is a prefix of the full one."""
    n, T, K, d = PUBLISHED_SIZES[size]
    return [ntp_random(n, T, K, d, graph=graph, seed=[seed, s]) for s in range(S)]


def selection(W: np.ndarray, D) -> tuple[np.ndarray, np.ndarray, float]:
    """The tokens a trained W selects on dataset D, by ntp-local's rule
    (:func:`attnsvm.experiments.ntp._selected`, the local notebook's thresholds): labels Y
    (n, L) (token ids with attention mass > 1e-2 at the query; -1 padding), exclude (n, T)
    (positions whose token has mass in (9e-3, 1e-2]); and p_sel = min_i (attention mass on
    sample i's selected ids), set to 0 when some sample selects every token it has (nothing
    left out: its Graph-SVM has no inequality)."""
    model = NTPModel(D.d, "W", "iden")
    Y, exclude = _selected(model, W, D)
    s = model.attention({"W": torch.as_tensor(W)[None]}, ntp_tensors(D))[0].numpy()  # (n, T)
    on = (D.seqs[:, :, None] == Y[:, None, :]).any(-1)  # (n, T): position's token selected
    strict = bool((~on).any(1).all())
    return Y, exclude, float(np.where(on, s, 0.0).sum(1).min()) if strict else 0.0


def _nearest(corr: dict) -> str:
    ok = {c: v for c, v in corr.items() if np.isfinite(v)}
    if not ok:
        return ""
    top = max(ok.values())
    return "|".join(c for c, v in ok.items() if v >= top - 1e-9)


def compute(cfg):
    rows = [r for r in ROWS if r.name in cfg.get("rows", [r.name for r in ROWS])]
    cache: dict = {}
    runs, cells = [], []
    for size in cfg["sizes"]:
        Ds = population(size, cfg["graph"], cfg["seed"], cfg["S"])
        d = Ds[0].d
        for row in rows:
            steps = int(cfg["steps"] * row.steps_factor)
            tr = train(NTPModel(d, row.param, "iden"), Ds, optimizer=row.rule(cfg), steps=steps,
                           seed=cfg["seed"] + row_seed(row.name), scale=cfg["init_scale"],
                           record_every=steps)
            norms = tr.metrics[tr.metrics.step == tr.metrics.step.max()].norm.to_numpy()
            for s, D in enumerate(Ds):
                W = tr.W[s]
                ok_run = bool(np.isfinite(W).all())
                Y, ex, psel = selection(W, D) if ok_run else (None, None, 0.0)
                corr, sv, stat = {}, {}, {}
                for col in COLUMNS:
                    if not ok_run:
                        corr[col], stat[col] = np.nan, "not run"
                        continue
                    key = (size, s, Y.tobytes(), Y.shape, ex.tobytes(), col)
                    if key not in cache:
                        cache[key] = graph_svm(D.E, D.seqs, Y, col, exclude=ex)
                    sol = cache[key]
                    stat[col] = str(sol.status_)
                    if not sol.feasible_ or not np.any(sol.W_):
                        corr[col] = np.nan
                        continue
                    N = get_norm(col)
                    sv[col] = np.asarray(sol.W_)
                    corr[col] = float(correlation(W, sv[col]))
                    dist = float(N.value(W / N.value(W) - sv[col] / N.value(sv[col])))
                    cells.append(dict(optimizer=row.name, size=size, run=s, column=col,
                                      corr=corr[col], dist=dist))
                near = _nearest(corr)
                runs.append(dict(
                    optimizer=row.name, param=row.param, size=size, run=s,
                    predicted=row.predicted or "", steps=steps,
                    saturated=ok_run and psel >= SAT and tr.stop_reason[s] != "non-finite step",
                    p_sel_min=psel, stop_reason=str(tr.stop_reason[s]), norm=float(norms[s]),
                    selected_is_label=bool(ok_run and (Y >= 0).sum(1).max() == 1
                                           and np.array_equal(Y[:, 0], D.y)),
                    corr_fro=corr["fro"], corr_nuc=corr["nuc"], nearest=near,
                    status_fro=stat["fro"], status_nuc=stat["nuc"],
                    fro_vs_nuc=(float(correlation(sv["fro"], sv["nuc"]))
                                if len(sv) == 2 else np.nan)))
    runs = pd.DataFrame(runs)
    cells = pd.DataFrame(cells).merge(runs[["optimizer", "size", "run", "saturated", "nearest"]],
                                      on=["optimizer", "size", "run"])
    return {"runs": runs, "cells": cells, "atlas": atlas_table(runs, cells, ROWS, COLUMNS)}


def _saturate_text(name):
    return (f"{name}: the runs saturate (in every sample, attention mass >= {SAT} on the selected "
            "tokens, and some token left out) in >= 90% of runs")


def _certified_text(name):
    return f"{name}: every Graph-SVM of the runs' selections is certified optimal"


def _differs_text(name):
    return (f"{name}: the two Graph-SVMs differ (median corr(W_fro, W_nuc) < {CORR}; else the "
            "column cannot tell them apart)")


def _nearest_text(name, svm):
    return f"{name}: the {svm} is the nearer of the two in >= {NEAREST:.0%} of the saturated runs"


def _converges_text(name, svm):
    return f"{name}: converges in direction to the {svm} (median corr >= {CORR})"


def _neither_text(name):
    return (f"{name}: converges to neither Graph-SVM (median corr with the Frobenius and with "
            f"the nuclear one both < {CORR})")


_R = "each optimiser"
CLAIMS = {
    "saturate": Claim(_saturate_text(_R), kind="sanity"),
    "certified": Claim(_certified_text(_R), kind="sanity"),
    "differs": Claim(_differs_text(_R), kind="sanity"),
    "nearest": Claim(_nearest_text(_R, "predicted Graph-SVM"), kind="finding"),
    "converges": Claim(_converges_text(_R, "predicted Graph-SVM"), kind="finding"),
    "neither": Claim(_neither_text(_R), kind="finding"),
}
"""Declared verdicts: per optimiser "saturate", "certified", "differs"; a row predicted fro
or nuc adds "nearest" and "converges", a row predicted "neither" adds "neither"."""


def judge(tables, cfg):
    runs, atlas = tables["runs"], tables["atlas"]
    checks = []
    for name, r in runs.groupby("optimizer", sort=False):
        share = float(r.saturated.mean())
        pred = r.predicted.iloc[0]
        a = atlas[atlas.optimizer == name].set_index("column")
        sat = r[r.saturated]
        med = {c: float(a.loc[c, "corr_median"]) if c in a.index else np.nan for c in COLUMNS}
        measured = ("Median corr: " + ", ".join(f"{c} {med[c]:.4f}" for c in COLUMNS)
                    + f"; Frobenius nearer in {float((sat.nearest == 'fro').mean()):.0%} of "
                      f"{len(sat)} saturated runs")
        checks.append(CLAIMS["saturate"].check(
            f"{share:.0%} of {len(r)} runs saturated after {int(r.steps.iloc[0])} steps",
            bool(share >= 0.9), claim=_saturate_text(name),
            note="a run that has not saturated has no converged direction; it is left out below"
                 + ("" if pred else f". No prediction for this row; measured: {measured}")))
        st = pd.concat([r.status_fro, r.status_nuc])
        okc = float(st.eq("optimal").mean())
        checks.append(CLAIMS["certified"].check(
            f"{okc:.0%} of {len(st)} Graph-SVMs optimal", bool(okc >= 1.0), claim=_certified_text(name),
            note=", ".join(f"{k}: {v}" for k, v in st.value_counts().items())))
        sep = float(r.fro_vs_nuc.median())
        checks.append(CLAIMS["differs"].check(f"median corr(W_fro, W_nuc) {sep:.4f}", bool(sep < CORR),
                                              claim=_differs_text(name)))
        if not pred:
            continue
        note = f"{next(x.source for x in ROWS if x.name == name)}. {measured}"
        if pred == NEITHER:
            top = max(med.values()) if len(sat) else np.nan
            checks.append(CLAIMS["neither"].check(
                f"largest median corr {top:.4f}" if len(sat) else "no saturated run",
                bool(np.isfinite(top) and top < CORR),
                note=note, claim=_neither_text(name)))
            continue
        if pred not in a.index:
            checks.append(CLAIMS["nearest"].check("no saturated run", False,
                                                  claim=_nearest_text(name, LABEL[pred])))
            checks.append(CLAIMS["converges"].check("no saturated run", False,
                                                    claim=_converges_text(name, LABEL[pred])))
            continue
        share_near = float(a.loc[pred, "share_nearest"])
        checks.append(CLAIMS["nearest"].check(
            f"{share_near:.0%} of {int(a.loc[pred, 'n_saturated'])} saturated runs",
            bool(share_near >= NEAREST), note=note, claim=_nearest_text(name, LABEL[pred])))
        checks.append(CLAIMS["converges"].check(
            f"median corr {med[pred]:.5f} (quartiles {a.loc[pred, 'corr_q25']:.4f}-"
            f"{a.loc[pred, 'corr_q75']:.4f})", bool(med[pred] >= CORR),
            claim=_converges_text(name, LABEL[pred])))
    return checks


def plot(tables, cfg, out):
    return [heatmap(tables["atlas"], ROWS, COLUMNS, {"fro": "Frobenius", "nuc": "nuclear"}, out,
                    "atlas_ntp", "W_svm")]


_C = dict(graph="acyclic", lr=0.1, lr_gd=10.0, lr_sign=0.01, lr_adam=0.1, lr_spec=0.05, rel=0.01,
          init_scale=0.1, seed=0)
EXPERIMENT = Experiment(
    name="atlas-ntp",
    title="The atlas's NTP column: which Graph-SVM norm each optimiser reaches (next-token prediction)",
    claim="attnsvm's own question: on one self-attention layer trained by next-token prediction, "
          "GD / NGD on W converge in direction to the Frobenius Graph-SVM of the tokens they "
          "select, the (K, Q) flow to the nuclear one, and sign descent, Adam and Muon (whose "
          "linear analogues reach the l_inf / spectral max margins) to neither.",
    configs={
        "tiny": {**_C, "sizes": ("n4T6K8d8",), "S": 2, "steps": 300,
                 "rows": ["NGD", "sign descent", "GD flow on (K, Q)"]},
        "quick": {**_C, "sizes": ("n4T6K8d8",), "S": 20, "steps": 2000},
        "full": {**_C, "sizes": tuple(PUBLISHED_SIZES), "S": 50, "steps": 4000},
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "attnsvm's own question: every verdict is a finding or a sanity check, none is the "
        "paper's claim (ntp-global judges those).",
        "Acyclic priority graphs only, so that the trained direction has no finite W_fin part "
        "(on cyclic graphs W_t ~ R W_svm + W_fin and the correlation approaches 1 only as R "
        "grows).",
        "Each run is compared with the Graph-SVM of the tokens it selects (mass > 1e-2, the "
        "local notebook's threshold), not the dataset's labels; selected_is_label in the runs "
        "table says where they coincide.",
        "Steps and step sizes are the atlas's (GD lr 10 for twice the steps, NGD 0.1, sign "
        "0.01, Adam 0.1 with eps = 0, Muon 0.05, the (K, Q) flow as NGD with a step of 1% of "
        "the parameters' norm); starts random with Frobenius norm 0.1 per tensor.",
    ),
)
