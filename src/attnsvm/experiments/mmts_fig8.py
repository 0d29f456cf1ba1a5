"""Max-Margin Token Selection, Figure 8 (Appendix E): with n > 1, GD need not reach the GMM.

Theorem 2 (global convergence of GD to the GMM direction) assumes n = 1; Fig. 8 shows the
assumption is tight: with n = 2 sequences of T = 2 tokens (so Assumption B holds) and the
logistic loss, GD from one start converges to the GMM and from another to an LMM in which
one sequence selects its non-optimal token, a token with no SVM-neighbour (its margin
constraint is inactive), hence vacuously locally optimal.

The exact coordinates of the paper's figure were lost in extraction, so this module builds a
dataset with exactly those properties, in the layout of Fig. 1 (fixed W = diag(1, 1, 0),
v = e_3: coordinates 1-2 are the key, coordinate 3 the score), y = (1, 1):

    sequence 0: optimal key (1, 0), score 1;   non-optimal key (0, 0), score 0
    sequence 1: optimal key (0, 0), score 1;   non-optimal key (2, 1), score 0.5

GMM:  alpha = (0, 0), p_mm = (1, -3, 0), both constraints active.
LMM:  alpha = (0, 1), p_mm = (1, 0, 0); sequence 1's constraint (2, 1)^T p = 2 > 1 is
      inactive, so its selected (non-optimal) token has no SVM-neighbour.

Normalized GD (lr 0.1, 1000 iterations, as in all the paper's figures, Appendix E) from
unit-norm starts p_0 = (cos c, sin c, 0), c = 0, 60, ..., 300 degrees; outcomes are
classified as in ``mmts_fig1`` (direction: corr >= 0.99).

Population: the same starts on K copies of the dataset with N(0, 0.2^2) noise on every key
(``attnsvm.data.jitter_keys``; dataset 0 is the figure's). Every selection is enumerated
per dataset (table ``datasets``: is the GMM locally optimal, how many other LMMs). The
paper's claim is existential, so the population asks whether the failure of global
convergence survives perturbation (some jittered dataset with a second LMM where GD
reaches it) and whether every run still ends at a max-margin direction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.data import MMTS_FIG1_W, TokenData, jitter_keys
from attnsvm.experiments.base import Check, Claim, Experiment
from attnsvm.experiments.mmts_fig1 import (
    CORR,
    lmm_census,
    locally_optimal,
    outcomes,
    prompt_paths,
)
from attnsvm.models import PromptModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, arrow, label, save, subplots
from attnsvm.svm import prompt_svm
from attnsvm.train import train

CANDIDATES = {"GMM": (0, 0), "LMM": (0, 1)}


def fig8_data() -> TokenData:
    """The two-sequence counter-example (see the module docstring)."""
    X = np.array([[[1, 0, 1.0], [0, 0, 0]], [[0, 0, 1.0], [2, 1, 0.5]]])
    return TokenData(X=X, y=np.ones(2), v=np.array([0.0, 0.0, 1.0]))


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    data = fig8_data()
    svms, refs = [], {}
    for name, alpha in CANDIDATES.items():
        sol = prompt_svm(data.X, MMTS_FIG1_W, alpha=np.array(alpha))
        svms.append(dict(name=name, alpha=str(list(alpha)), p1=sol.W_[0], p2=sol.W_[1],
                         p3=sol.W_[2], norm=sol.norm_, locally_optimal=locally_optimal(sol, data.gamma),
                         neighbours_seq0=int(sol.support_[0].sum()),
                         neighbours_seq1=int(sol.support_[1].sum())))
        refs[name] = sol.W_
    cs = np.asarray(cfg["starts"], dtype=float)  # start angles in degrees
    p0 = np.stack([np.cos(np.radians(cs)), np.sin(np.radians(cs)), 0 * cs], axis=1)
    model, tr, paths = prompt_paths(data, p0, cfg, refs)
    oc = outcomes(tr, data).assign(start=np.arange(len(cs)), c=cs)
    toks = [dict(seq=i, token=t, k1=data.X[i, t, 0], k2=data.X[i, t, 1], score=data.gamma[i, t])
            for i in range(data.n) for t in range(data.T)]
    runs, sets = _population(cfg, p0)
    return {"paths": paths.assign(c=cs[paths.start]), "svm": pd.DataFrame(svms), "outcome": oc,
            "tokens": pd.DataFrame(toks), "population": runs, "datasets": sets}


def _population(cfg: dict, p0: np.ndarray):
    """The figure's starts on K jittered copies of the dataset (dataset 0 is the figure's)."""
    pop = jitter_keys(fig8_data(), cfg["datasets"], sigma=cfg["jitter"], seed=cfg["seed"])
    K, S = pop.B, len(p0)
    census = lmm_census(pop.X).assign(dataset=np.arange(K))
    data = TokenData(X=np.repeat(pop.X, S, axis=0), y=np.repeat(pop.y, S, axis=0),
                     v=np.repeat(pop.v, S, axis=0))
    tr = train(PromptModel(3, W_fixed=MMTS_FIG1_W), data, optimizer=ngd(cfg["lr"]), steps=cfg["steps"],
               init={"p": np.tile(p0, (K, 1))}, record_every=cfg["steps"])
    oc = outcomes(tr, data)
    runs = pd.DataFrame({"dataset": np.repeat(np.arange(K), S), "start": np.tile(np.arange(S), K)}).join(
        oc[["outcome", "alpha", "corr_gmm", "corr_lmm", "locally_optimal", "p_sel_mean"]])
    return runs, census


_Q = ("The arrows indicate the two trajectories originating from different initializations. This "
      "demonstrates that the gradient descent iterates on (ERM) with two different initializations "
      "converge to two different SVM solutions (GMM and LMM).")
_W = "App. E, Fig. 8 (tightness of Theorem 2's n = 1)"
CLAIMS = {
    "lmm_loc": Claim("the LMM candidate alpha = (0, 1) is locally optimal because its non-optimal "
                     "token has no SVM-neighbour (Definition 2)", kind="sanity"),
    "gmm": Claim(f"some start converges to the GMM direction (corr >= {CORR})", quote=_Q, where=_W),
    "lmm": Claim(f"another start converges to the LMM direction, not the GMM (corr >= {CORR}): "
                 "Theorem 2's global convergence needs n = 1", quote=_Q, where=_W),
    "every": Claim("every start converges to one of the two max-margin directions (the figure "
                   "draws two)", kind="finding"),
    "pop_lmm": Claim("population: the failure of global convergence is not an isolated construction: "
                     "on jittered datasets (other than the figure's) with a second LMM, GD reaches "
                     "that LMM from some of the figure's starts", kind="finding"),
    "pop_all": Claim(f"population: every start on every dataset converges to the GMM or to an LMM "
                     f"(corr >= {CORR})", kind="finding"),
}


def judge(tables: dict, cfg: dict) -> list[Check]:
    oc, svm = tables["outcome"], tables["svm"].set_index("name")
    per = "; ".join(f"start {r.c:g} deg: {r.outcome} (alpha {r.alpha}, corr {r.corr:.4f})"
                    for r in oc.itertuples())
    lmm = svm.loc["LMM"]
    runs, sets = tables["population"], tables["datasets"]
    two = sets[(sets.other_lmms > 0) & sets.gmm_locally_optimal & (sets.dataset > 0)].dataset
    by_set = runs.groupby("dataset").outcome
    both = by_set.apply(lambda o: bool((o == "GMM").any() and (o == "LMM").any()))
    some_lmm = by_set.apply(lambda o: bool((o == "LMM").any()))
    ok = runs.outcome.isin(["GMM", "LMM"])
    bad = runs[~ok]
    miss = "; ".join(f"dataset {r.dataset} start {r.start}: token {r.alpha}, corr_gmm {r.corr_gmm:.3f}, "
                     f"corr(p, p_mm(alpha)) {r.corr_lmm:.3f}" for r in bad.head(4).itertuples())
    C = CLAIMS
    return [
        C["lmm_loc"].check(f"locally optimal: {bool(lmm.locally_optimal)}, SVM-neighbours in "
                           f"sequence 1: {int(lmm.neighbours_seq1)}",
                           bool(lmm.locally_optimal) and int(lmm.neighbours_seq1) == 0),
        C["gmm"].at_least("starts reaching GMM", int((oc.outcome == "GMM").sum()), 1, per, fmt="d"),
        C["lmm"].at_least("starts reaching LMM", int((oc.outcome == "LMM").sum()), 1, per, fmt="d"),
        C["every"].at_least("starts reaching GMM or LMM", int(oc.outcome.isin(["GMM", "LMM"]).sum()),
                            len(oc), per, fmt="d"),
        C["pop_lmm"].at_least("jittered datasets", int(some_lmm.reindex(two).sum()), 1,
                              f"{len(two)} of {len(sets) - 1} jittered datasets keep a second LMM; on "
                              f"{int(some_lmm.reindex(two).sum())} of them some start reaches it and on "
                              f"{int(both.reindex(two).sum())} the starts split between GMM and LMM "
                              "(the paper's claim is existential: one such dataset suffices)", fmt="d"),
        C["pop_all"].at_least(f"runs ({len(sets)} datasets x {runs.start.nunique()} starts)",
                              int(ok.sum()), len(runs), ("" if not len(bad) else f"{len(bad)} miss: {miss}"),
                              fmt="d"),
    ]


def plot(tables: dict, cfg: dict, out) -> list:
    paths, svm, toks, oc = tables["paths"], tables["svm"], tables["tokens"], tables["outcome"]
    fig, ax = subplots(2, width=4.4, height=3.8)
    marks = {(0, 0): ("*", COLORS[2]), (0, 1): ("o", COLORS[2]), (1, 0): ("s", COLORS[4]),
             (1, 1): ("D", COLORS[4])}
    for r in toks.itertuples():
        m, col = marks[(r.seq, r.token)]
        ax[0].scatter(r.k1, r.k2, marker=m, s=260 if (r.seq, r.token) == (0, 1) else 90, color=col, edgecolor="k", lw=0.5, zorder=3,
                      label=f"seq {r.seq}, {'optimal' if r.score == 1 else 'non-optimal'} "
                            f"(score {r.score:g})")
    outc = oc.set_index("start").outcome
    for s, d in paths.groupby("start"):
        col = COLORS[1] if outc[s] == "GMM" else COLORS[0] if outc[s] == "LMM" else "gray"
        ax[0].plot(d.p1, d.p2, color=col, lw=1, alpha=0.8)
        ax[0].plot(d.p1.iloc[0], d.p2.iloc[0], "o", color=col, ms=3)
        ref = "corr_GMM" if outc[s] != "LMM" else "corr_LMM"
        d = d[d.step > 0]
        ax[1].plot(d.step, 1 - d[ref], color=col, label=f"start {d.c.iloc[0]:g} deg -> {outc[s]}")
    for r in svm.itertuples():
        arrow(ax[0], [r.p1, r.p2], color=COLORS[1] if r.name == "GMM" else COLORS[0], scale=6,
              label=f"{r.name} direction p_mm(alpha = {r.alpha})")
    ax[0].set_xlim(-1.5, 3.0)
    ax[0].set_ylim(-3.0, 1.8)
    label(ax[0], "p_1 (key coordinate 1)", "p_2 (key coordinate 2)",
          "NGD paths of p (red: to GMM, blue: to LMM)", legend=False)
    ax[0].legend(fontsize=6, loc="lower left", markerscale=0.6)
    ax[1].set_xscale("log")
    ax[1].set_yscale("log")
    label(ax[1], "iteration", "1 - corr(p, p_mm of the reached direction)", "directional convergence")
    return [save(fig, out, "mmts_fig8")]


_STARTS = [0.0, 60.0, 120.0, 180.0, 240.0, 300.0]
_B = dict(lr=0.1, seed=0, jitter=0.2)
EXPERIMENT = Experiment(
    name="mmts-fig8",
    title="Figure 8: with n = 2, GD reaches the GMM from one start and an LMM from another",
    claim="Global convergence of GD to the GMM (Theorem 2) needs n = 1: on a two-sequence "
          "dataset satisfying Assumption B, GD converges to the GMM from some starts and to an "
          "LMM from others.",
    configs={
        "tiny": dict(_B, starts=[0.0, 180.0], steps=60, record_every=2, datasets=3),
        "quick": dict(_B, starts=_STARTS, steps=1000, record_every=2, datasets=16),
        "full": dict(_B, starts=_STARTS, steps=1000, record_every=1, datasets=128),
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "The paper's coordinates for Fig. 8 were lost in extraction: the dataset is attnsvm's "
        "construction with the stated properties (n = 2, T = 2, a second LMM whose non-optimal "
        "token has no SVM-neighbour).",
        "The population (N(0, 0.2^2) noise on every key) is attnsvm's (its checks are findings); float64; convergence means "
        "corr(p, p_mm) >= 0.99, saturation reported, not required.",
    ),
)
