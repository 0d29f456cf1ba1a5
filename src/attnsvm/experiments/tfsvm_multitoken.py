"""Transformers as SVMs, nonlinear heads: W_eq = W_fin + R W_dir predicts the trained
attention better than W_dir, and W_dir better than the one-token ATT-SVM.

Setup (the paper's ``multi_token_converge`` notebook, re-drawn with numpy): cross-attention,
n = 3, T = 4, d in {4, 6, 8, 10}; tokens x_it and queries z_i uniform on the unit sphere,
labels uniform in {-1, +1} conditioned on a sequence with y = -1 (the notebook skips draws
without one), fixed head f = 1^T ReLU(V^T u) with V (d x d) Gaussian, ||V||_F = 1. W starts
at the notebook's ``nn.Linear`` initialisation (entries uniform in [-1/sqrt(d), 1/sqrt(d)])
and is trained by normalized GD (lr 0.1, logistic loss) for 2001 steps; the selected sets
come from the attention of the last forward pass (after 2000 steps), the correlations use
the final W, as in the notebook.

Selected sets O_i = {t : s_it >= 1e-3}. Predictors of the trained W (correlation over the
d x d matrix): W_dir (ATT-SVM': equal logits inside O_i, margin 1 against the rest), W_eq =
W_fin + R W_dir (W_fin reproduces the log-probability ratios inside O_i, R fitted to W) and
the one-token (Frobenius) ATT-SVM of alpha_i = argmax_t s_it.

The paper's population (the notebook's filter): a run is kept only if some token has
s <= 1e-6 (a run with none has a finite solution) and no token has s in (1e-6, 1e-3] (not
yet decided), and all three problems are feasible; the notebook draws until it has 500 kept
runs per d. Its figure reports 1 - mean corr at 2000 steps: W_eq .035/.017/.011/.0055 <
W_dir .07/.045/.015/.0085 < one-token ~.12-.16 for d = 4/6/8/10.

Here each d draws from one seeded stream in rounds until ``target`` runs are kept (the
first ``target`` kept runs in draw order form the population, so the quick run's kept runs
are the first of the full run's), and the three orderings are checked per d on that
population. The same orderings are also shown
for the runs the filter discards (all runs with a token below 1e-3, on a prefix of the
draws): a finding, not the paper's claim.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnsvm.data import TokenData
from attnsvm.experiments.base import Check, Claim, Experiment
from attnsvm.metrics import correlation
from attnsvm.models import WModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, label, save, subplots
from attnsvm.svm import att_svm_batch, multitoken_svm
from attnsvm.train import train

THR = 1e-3  # selected set O_i = {s >= 1e-3} (the notebook's THRED_H)
LOW = 1e-6  # suppressed: s <= 1e-6 (the notebook's THRED_L); (LOW, THR] is undecided
PRED = {"eq": "W_eq", "dir": "W_dir", "one": "one-token ATT-SVM"}
ORDERS = (("eq", "dir"), ("dir", "one"), ("eq", "one"))  # (better, worse) per the paper
# 1 - mean corr at 2000 steps, read off the paper's figure (multi_token_converge notebook)
PAPER = {"eq": {4: 0.035, 6: 0.017, 8: 0.011, 10: 0.0055},
         "dir": {4: 0.07, 6: 0.045, 8: 0.015, 10: 0.0085}}
PAPER_ONE = "0.12-0.16"
MIN_KEPT = 5  # a per-d verdict on fewer kept runs than this tests nothing


def draw(d: int, cfg: dict, c0: int, c1: int):
    """The notebook's data and initialisation for the runs of chunks c0..c1-1 of dimension d
    (``cfg["chunk"]`` runs each, chunk c drawn from rng([seed, d, c]): the k-th run of a d is
    the same at every scale).

    Returns TokenData (B, n, T, d) without v, V (B, d, d) with ||V||_F = 1, W0 (B, d, d)."""
    n, T, C = cfg["n"], cfg["T"], cfg["chunk"]
    parts = []
    for c in range(c0, c1):
        rng = np.random.default_rng([cfg["seed"], d, c])
        X = rng.standard_normal((C, n, T, d))
        z = rng.standard_normal((C, n, d))
        y = rng.choice([-1.0, 1.0], size=(C, n))
        while (bad := (y == 1).all(1)).any():  # the notebook skips draws without a y = -1
            y[bad] = rng.choice([-1.0, 1.0], size=(int(bad.sum()), n))
        V = rng.standard_normal((C, d, d))
        W0 = rng.uniform(-1.0, 1.0, size=(C, d, d)) / np.sqrt(d)  # torch nn.Linear default
        parts.append((X / np.linalg.norm(X, axis=-1, keepdims=True),
                      z / np.linalg.norm(z, axis=-1, keepdims=True), y,
                      V / np.linalg.norm(V, axis=(1, 2), keepdims=True), W0))
    X, z, y, V, W0 = (np.concatenate(a) for a in zip(*parts))
    return TokenData(X=X, y=y, z=z), V, W0


def predictors(X, z, s, W):
    """(W_dir, W_eq) of one run (None, None if the W_dir problem is infeasible)."""
    sol = multitoken_svm(X, z, s, threshold=THR, W_trained=W)
    return (sol.W_dir_, sol.W_eq_) if sol.feasible_ else (None, None)


def _gap(H, P):
    """1 - corr(H_r, P) for a history H (R, d, d) and a predictor P (d, d) or None."""
    return 1 - correlation(H, P[None]) if P is not None else np.full(len(H), np.nan)


def _round(d: int, cfg: dict, c0: int, c1: int):
    """Train the runs of chunks c0..c1-1 and solve the predictors of those the notebook keeps
    and of those in the all-runs prefix. Returns (rows, curves, per-run flags)."""
    data, V, W0 = draw(d, cfg, c0, c1)
    model = WModel(d, head="relu", V=V)
    tr = train(model, data, optimizer=ngd(cfg["lr"]), steps=cfg["steps"], init={"W": W0},
               record_every=cfg["record_every"], record_params=True)
    steps, H = np.asarray(tr.record_steps), tr.param_history["W"]  # H (R, B, d, d)
    last = int(np.nonzero(steps == cfg["steps"] - 1)[0][0])  # W of the last forward pass
    s = model.attention({"W": torch.as_tensor(H[last])}, data).numpy()  # (B, n, T)
    W = tr.W
    first = c0 * cfg["chunk"]  # index of the first run of this round within d
    idx = first + np.arange(len(s))
    suppressed = (s <= LOW).any((1, 2))
    undecided = ((s > LOW) & (s <= THR)).any((1, 2))
    below = (s < THR).any((1, 2))  # some token outside O: W_dir is defined
    kept = suppressed & ~undecided  # the notebook's filter (before feasibility)
    view = idx < cfg["all_view"]  # prefix on which every run is solved
    one = att_svm_batch(data.X, data.z, s.argmax(-1))
    rows, curves = [], []
    for b in np.nonzero(below & (kept | view))[0]:
        Wd, We = predictors(data.X[b], data.z[b], s[b], W[b])
        W1 = one.W_[b] if one.feasible_[b] else None
        P = {"eq": We, "dir": Wd, "one": W1}
        O = s[b] >= THR
        rows.append(dict(
            d=d, trial=int(idx[b]), kept=bool(kept[b]), view=bool(view[b]),
            undecided=bool(undecided[b]), feasible=Wd is not None and W1 is not None,
            n_selected=float(O.sum(-1).mean()), max_out=float(s[b][~O].max()),
            min_prob=float(s[b].min()), norm=float(np.linalg.norm(W[b])),
            **{f"gap_{k}": float(_gap(W[b][None], Pk)[0]) for k, Pk in P.items()}))
        curves.append(pd.DataFrame({"d": d, "trial": int(idx[b]), "step": steps,
                                    **{f"gap_{k}": _gap(H[:, b], Pk) for k, Pk in P.items()}}))
    flags = pd.DataFrame({"trial": idx, "finite": ~suppressed, "undecided": suppressed & undecided})
    return rows, curves, flags


def _run_d(d: int, cfg: dict):
    """Draw rounds of runs for dimension d until ``target`` runs pass the notebook's filter
    (and have feasible problems) or ``cap`` runs are drawn (the notebook: until 500 kept); the
    kept population is the first ``target`` kept runs in draw order. The next round's size
    is the expected number of draws still needed at the kept rate seen so far."""
    C = cfg["chunk"]
    rows, curves, flags = [], [], []
    c0, size = 0, -(-max(cfg["first"], cfg["all_view"]) // C)
    while True:
        size = min(size, cfg["cap"] // C - c0)
        r, c, f = _round(d, cfg, c0, c0 + size)
        rows += r
        curves += c
        flags.append(f)
        c0 += size
        ok = sum(x["kept"] and x["feasible"] for x in rows)
        if ok >= cfg["target"] or c0 * C >= cfg["cap"]:
            break
        rate = max(ok, 1) / (c0 * C)
        size = max(1, int(np.ceil((cfg["target"] - ok) / rate / C)))
    runs = pd.DataFrame(rows)
    flags = pd.concat(flags, ignore_index=True)
    ok = runs[runs.kept & runs.feasible].sort_values("trial") if len(runs) else runs
    last = int(ok.trial.iloc[cfg["target"] - 1]) if len(ok) >= cfg["target"] else c0 * C - 1
    if len(runs):  # the notebook stops at its target: later kept runs are not part of it
        runs.loc[runs.kept & (runs.trial > last), "kept"] = False
    used = flags[flags.trial <= last]
    counts = dict(d=d, drawn=c0 * C, used=int(last + 1), finite=int(used.finite.sum()),
                  undecided=int(used.undecided.sum()))
    return runs, curves, counts


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    cols = ["d", "trial", "kept", "view", "undecided", "feasible", "n_selected", "max_out",
            "min_prob", "norm", "gap_eq", "gap_dir", "gap_one"]
    runs, curves, counts = [], [], []
    for d in cfg["ds"]:
        r, c, k = _run_d(d, cfg)
        runs.append(r)
        curves += c
        counts.append(k)
    runs = pd.concat([r for r in runs if len(r)], ignore_index=True)[cols] if any(
        len(r) for r in runs) else pd.DataFrame(columns=cols)
    flags = ["kept", "view", "undecided", "feasible"]
    runs[flags] = runs[flags].astype(bool)
    cnt = pd.DataFrame(counts)
    ok = runs[runs.kept & runs.feasible].groupby("d").size()
    cnt["kept"] = cnt.d.map(ok).fillna(0).astype(int)
    cnt["target"] = cfg["target"]
    return {"runs": runs, "curves": pd.concat(curves, ignore_index=True) if curves else
            pd.DataFrame(columns=["d", "trial", "step", "gap_eq", "gap_dir", "gap_one"]),
            "counts": cnt}


def paper_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The notebook's population: kept by its filter, all three problems feasible."""
    return runs[runs.kept & runs.feasible]


def all_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run of the solved prefix with a token below 1e-3 and feasible problems."""
    return runs[runs.view & runs.feasible]


def means(runs: pd.DataFrame) -> pd.DataFrame:
    """Per d: 1 - mean corr (the paper's statistic; = mean of 1 - corr), median, runs."""
    g = runs.groupby("d")
    out = g[["gap_eq", "gap_dir", "gap_one"]].mean()
    out[["med_eq", "med_dir", "med_one"]] = g[["gap_eq", "gap_dir", "gap_one"]].median().to_numpy()
    out["runs"] = g.size()
    return out


def _ordering(m: pd.DataFrame, a: str, b: str) -> tuple[float, str]:
    """Share of d (rows of m; a d without runs fails) with mean gap_a < mean gap_b, and the
    per-d numbers."""
    if not len(m):
        return float("nan"), "no runs"
    held = m[f"gap_{a}"] < m[f"gap_{b}"]
    txt = "; ".join(f"d={d}: no runs FAILS" if not x.runs > 0 else
                    f"d={d}: {x[f'gap_{a}']:.3g} vs {x[f'gap_{b}']:.3g} ({int(x.runs)} runs)"
                    + ("" if h else " FAILS") for (d, x), h in zip(m.iterrows(), held))
    return float(held.mean()), txt


def _paper_txt(m: pd.DataFrame) -> str:
    return ("paper's figure (1 - mean corr): " + "; ".join(
        f"d={d}: eq {PAPER['eq'].get(d, np.nan):.3g}, dir {PAPER['dir'].get(d, np.nan):.3g}, "
        f"one {PAPER_ONE}" for d in m.index) + ". Medians here (1 - corr): " + "; ".join(
        f"d={d}: eq {x.med_eq:.2g}, dir {x.med_dir:.2g}, one {x.med_one:.2g}"
        for d, x in m.iterrows() if x.runs > 0) + ".")


# The paper's sentence: the abstract of arXiv:2308.16898v1 (the version CITATION.cff cites;
# stored in tests/data/paper_excerpts/tfsvm.txt and checked there).  It states no count of
# selected tokens, so "nonlinear heads select several tokens" is attnsvm's finding.
QUOTE = {
    "order": "(3) While our theory applies primarily to linear prediction heads, we propose a "
             "more general SVM equivalence that predicts the implicit bias with nonlinear heads.",
}
WHERE = ("abstract (arXiv:2308.16898v1), Section 6 (nonlinear heads, ATT-SVM' and W_eq = W_fin "
         "+ R W_dir) and its figure (multi_token_converge notebook: 1 - corr per d, on the runs "
         "its filter keeps)")


CLAIMS = {f"order_{a}_{b}": Claim(
    f"{PRED[a]} predicts the trained W better than {PRED[b]}: 1 - mean corr smaller at "
    f"every d (the paper's population: the notebook's filtered runs)",
    quote=QUOTE["order"], where=WHERE) for a, b in ORDERS}
CLAIMS.update(
    several=Claim("Nonlinear heads select several tokens: mean |O_i| > 1 over the kept runs "
                  "(the cited abstract states no count of selected tokens)", kind="finding"),
    unfiltered=Claim(
        "Without the notebook's filter (every run with a token below 1e-3, undecided tokens "
        "included) the ordering W_eq < W_dir < one-token still holds at every d (attnsvm's "
        "extension beyond the paper's population)", kind="finding"),
    kept=Claim(f"Every d has at least {MIN_KEPT} runs kept by the notebook's filter (else its "
               "per-d verdict tests nothing)", kind="sanity"),
)
"""The declared verdicts, in the order ``judge`` returns their checks."""


def judge(tables: dict, cfg: dict) -> list[Check]:
    runs, cnt = tables["runs"], tables["counts"]
    kept, allv = paper_runs(runs), all_runs(runs)
    ds = list(cfg["ds"])
    m, ma = means(kept).reindex(ds), means(allv).reindex(ds)
    filt = (", ".join(f"d={c.d}: {c.kept} kept of the first {c.used} draws ({c.finite} finite, "
                      f"{c.undecided} with a token in ({LOW:g}, {THR:g}]; {c.drawn} trained)"
                      for c in cnt.itertuples())
            + f"; target {cfg['target']} kept per d, the notebook's 500")
    checks = []
    for a, b in ORDERS:
        share, txt = _ordering(m, a, b)
        checks.append(CLAIMS[f"order_{a}_{b}"].at_least(
            f"fraction of d where {a} < {b}", share, 1.0,
            f"{txt}. {_paper_txt(m) if (a, b) != ('dir', 'one') else ''} Filter: {filt}".strip()))
    nsel = float(kept.n_selected.mean()) if len(kept) else np.nan
    checks.append(CLAIMS["several"].at_least(
        "mean |O_i|", nsel, 1.0 + 1e-9, "per d: " + ", ".join(
            f"d={d}: {g.n_selected.mean():.2f}" for d, g in kept.groupby("d"))))
    held = [(_ordering(ma, a, b)) for a, b in ORDERS]
    share = min(h[0] for h in held)
    checks.append(CLAIMS["unfiltered"].at_least(
        "min over the three orderings of the fraction of d where it holds", share, 1.0,
        f"{len(allv)} runs (the first {cfg['all_view']} draws per d with a token below {THR:g} "
        f"and feasible problems; {int(allv.undecided.sum())} have a token in ({LOW:g}, {THR:g}]). "
        + " | ".join(f"{a} < {b}: {h[1]}" for (a, b), h in zip(ORDERS, held))))
    few = [f"d={c.d}: {c.kept}" for c in cnt.itertuples() if c.kept < MIN_KEPT]
    checks.append(CLAIMS["kept"].at_least(
        "fewest kept runs over d", float(cnt.kept.min()) if len(cnt) else np.nan, MIN_KEPT,
        "kept per d: " + ", ".join(f"d={c.d}: {c.kept}" for c in cnt.itertuples())
        + (f"; short: {', '.join(few)}" if few else ""), fmt="g"))
    return checks


def plot(tables: dict, cfg: dict, out) -> list:
    runs, curves = tables["runs"], tables["curves"]
    ds = list(cfg["ds"])
    fig, ax = subplots(len(ds), 3, width=3.3, height=2.9)
    pops = (("paper's population (kept runs)", paper_runs(runs)),
            ("without the filter (all runs)", all_runs(runs)))
    styles = {"eq": ("-", "o"), "dir": (":", "s"), "one": ("--", "^")}
    for row, (title, pop) in enumerate(pops):
        for j, d in enumerate(ds):
            a = ax[row * len(ds) + j]
            keys = pop[pop.d == d].trial
            c = curves[(curves.d == d) & curves.trial.isin(keys)]
            for k, name in PRED.items():
                g = c.groupby("step")[f"gap_{k}"].mean()
                ls, mk = styles[k]
                a.plot(g.index, np.clip(g.values, 1e-6, None), ls=ls, marker=mk, ms=3,
                       color=COLORS[j], label=name)
            if row == 0:
                for k in ("eq", "dir"):
                    if d in PAPER[k]:
                        a.axhline(PAPER[k][d], color="0.4", ls=styles[k][0], lw=0.9,
                                  label=f"paper's figure: {PRED[k]}")
            a.set_yscale("log")
            label(a, "iteration", "1 - mean correlation",
                  f"d = {d}, {title}\n({len(keys)} runs)", legend=False)
            if j == 0:
                a.legend(fontsize=6, loc="upper right")
    for j, d in enumerate(ds):
        a = ax[2 * len(ds) + j]
        for pop, col, name in ((paper_runs(runs), COLORS[j], "kept runs"),
                               (all_runs(runs)[lambda x: x.undecided], "0.6",
                                "a token in (1e-6, 1e-3] (discarded)")):
            g = pop[pop.d == d]
            a.scatter(np.clip(g.max_out, 1e-18, None), np.clip(g.gap_eq, 1e-12, None), s=10,
                      color=col, alpha=0.7, label=name)
        a.set_xscale("log")
        a.set_yscale("log")
        a.axvline(LOW, color="k", lw=0.6, ls=":")
        label(a, "max s over tokens outside O_i (< 1e-18 at 1e-18)", "1 - corr(W, W_eq)",
              f"d = {d}: predictivity of W_eq per run", legend=False)
        if j == len(ds) - 1:
            a.legend(fontsize=6, loc="lower right")
    return [save(fig, out, "tfsvm_multitoken")]


_BASE = dict(n=3, T=4, ds=[4, 6, 8, 10], lr=0.1, steps=2001, record_every=100, chunk=25, seed=0)
EXPERIMENT = Experiment(
    name="tfsvm-multitoken",
    title="Nonlinear head: W_eq < W_dir < one-token ATT-SVM in predicting the trained W",
    claim="With a nonlinear head 1^T ReLU(V^T u), attention selects several tokens; on the runs "
          "the paper keeps, the trained W is predicted by W_eq = W_fin + R W_dir better than by "
          "W_dir, and by W_dir better than by the one-token ATT-SVM, at every d.",
    configs={
        "tiny": dict(_BASE, ds=[4, 6], target=1, first=6, cap=12, chunk=3, all_view=6,
                     steps=301, record_every=100),
        "quick": dict(_BASE, target=5, first=50, cap=400, all_view=25),
        "full": dict(_BASE, target=25, first=100, cap=1500, all_view=100),
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "tfsvm-multitoken: 25 kept runs per d at full scale (quick 5) instead of the "
        "notebook's 500: its filter keeps only ~2% of the runs at d = 10, so 500 kept runs "
        "would need ~25,000 training runs of 2001 steps at d = 10 alone (about 10 minutes "
        "here, the budget of the whole report). The draws per d are capped (full 1500, quick "
        "400); the kept and drawn counts are in the verdicts.",
        "tfsvm-multitoken: data drawn with numpy instead of torch's generator (same "
        "distributions; draws without a y = -1 label are redrawn where the notebook skips "
        "them, which gives the same conditional distribution); the NGD step has no +2.2e-16 "
        "in its denominator.",
        "tfsvm-multitoken: the runs the notebook discards are solved on a prefix of the draws "
        "only (quick 25, full 100 per d), to keep the report within its time budget; the "
        "orderings on them (the unfiltered set) are attnsvm's finding, not the paper's claim.",
    ),
)
