"""Max-Margin Token Selection, Figure 1: GD on the prompt p converges to max-margin directions.

Setup (the paper's Sec. 2 and its ``single_input_converge`` / ``multi_input_converge``
notebooks): prompt model a_t = x_t^T W p with fixed W = W_K^T W_Q = diag(1, 1, 0) and head
v = e_3, so the first two coordinates of a token are its key and the third its score.
Tokens are numbered from 0 (the paper's "token 1" is token 0 here). Normalized GD (lr 0.1,
logistic loss, 1000 iterations, as in the notebooks).

The figure's instances (the paper's data):
(a) s = 0.9, one sequence X = [(-0.1, 1, 1), (1, 0, 0.9), (0, 0, s)]: scores (1, 0.9, 0.9).
    n = 1 and Assumption B (equal non-optimal scores) hold, so Theorem 2 predicts that
    every start converges to the GMM direction p_mm(token 0).
(b) s = 0: token 1 (score 0.9) is locally optimal (its only SVM-neighbour, token 2, has
    score 0), so GD started in its cone converges to the LMM direction p_mm(token 1)
    (Theorem 3), while other starts reach the GMM.
(c) n = 3, T = 7: the notebook's dataset (``attnsvm.data.mmts_fig1_notebook``, torch seed
    0; token 0 optimal in every sequence): every start converges to p_mm.
Starts p_0 = (0, c, 0) [(a), (b)] or (c, 0, 0) [(c)], c in {1, .5, 0, -.5, -1, -1.5}.

Populations (so that no verdict rests on one instance): (a) and (b) each over K datasets
whose keys are the figure's keys plus N(0, 0.2^2) noise (``attnsvm.data.jitter_keys``;
0.2 is the noise of the paper's own multi-input generator; dataset 0 is the figure's),
scores unchanged; (c) over the notebook generator's seeds 0..K-1. The assumptions each
claim needs are checked per dataset (table ``datasets``): Assumption B and the GMM being
the only LMM (enumerating every selection alpha) for (a) and (c), token 1 being locally
optimal for the Theorem 3 claims of (b).  For Theorem 3, whose cone radius R is
data-dependent and not given, GD also starts on the LMM direction, p_0 = R p_mm / ||p_mm||
with R in ``cone_norms``: the theorem predicts that the share reaching the LMM grows
with R.

A run "converges to" a direction when corr(p_T, p_mm) >= 0.99 (docs/theory.md §7); Fig. 1 is a
statement about direction, so saturation of the softmax is reported, not required.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from attnsvm import tokens
from attnsvm._words import plural
from attnsvm.data import MMTS_FIG1_W, TokenData, jitter_keys, mmts_fig1, mmts_fig1_notebook
from attnsvm.experiments.base import Check, Claim, Experiment
from attnsvm.models import PromptModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, arrow, label, save, subplots
from attnsvm.svm import prompt_svm, prompt_svm_batch
from attnsvm.train import train

CORR = 0.99  # convergence in direction: corr(p, p_mm) >= 0.99 (docs/theory.md §7)
PANELS = {"a": dict(s=0.9, axis=1), "b": dict(s=0.0, axis=1), "c": dict(s=None, axis=0)}


def panel_data(panel: str, cfg: dict) -> TokenData:
    """The figure's dataset of a panel (unbatched)."""
    s = PANELS[panel]["s"]
    return mmts_fig1_notebook([cfg["seed"]]).trial(0) if s is None else mmts_fig1(s)


def population(panel: str, cfg: dict) -> TokenData:
    """The panel's population (batched, K = cfg['datasets'][panel]); trial 0 is the figure's."""
    K = cfg["datasets"][panel]
    if PANELS[panel]["s"] is None:
        return mmts_fig1_notebook(range(cfg["seed"], cfg["seed"] + K))
    return jitter_keys(panel_data(panel, cfg), K, sigma=cfg["jitter"], seed=cfg["seed"])


def prompt_paths(data, p0: np.ndarray, cfg: dict, refs: dict, W=MMTS_FIG1_W, loss="logistic"):
    """NGD on p from each row of ``p0``; returns (model, Trajectory, tidy path table)."""
    model = PromptModel(data.d, W_fixed=W)
    tr = train(model, data, loss=loss, optimizer=ngd(cfg["lr"]), steps=cfg["steps"], B=len(p0),
               init={"p": p0}, references=refs, record_every=cfg["record_every"],
               record_params=True)
    P = tr.param_history["p"]  # (R, B, d)
    df = pd.DataFrame({"start": np.tile(np.arange(len(p0)), len(tr.record_steps)),
                       "step": np.repeat(tr.record_steps, len(p0))})
    for j in range(P.shape[-1]):
        df[f"p{j + 1}"] = P[..., j].ravel()
    df = df.merge(tr.metrics.rename(columns={"trial": "start"}), on=["start", "step"])
    return model, tr, df


def locally_optimal(sol, gamma: np.ndarray) -> bool:
    """alpha of ``sol`` is locally optimal: each SVM-neighbour scores below alpha_i."""
    return bool(sol.feasible_) and bool(
        tokens.is_locally_optimal(gamma, sol.alpha_, tokens.svm_neighbours(sol)))


def outcomes(tr, data, W=MMTS_FIG1_W) -> pd.DataFrame:
    """Per trial (``attnsvm.tokens.outcome``, docs/theory.md §7, direction only: saturation is
    reported in p_sel_mean, not required): selected tokens alpha, verdict GMM / LMM /
    other, and corr = corr(p, p_mm(alpha))."""
    oc = tokens.outcome(tr.W, data.X, data.y, data.v, W_key=W, saturation=0.0, threshold=CORR)
    alpha = tokens.selected_tokens(tokens.attention_probs(data.X, tr.W, W_key=W))
    return oc.assign(alpha=[",".join(map(str, a)) for a in alpha], corr=oc.corr_lmm)


def lmm_census(X: np.ndarray, W=MMTS_FIG1_W) -> pd.DataFrame:
    """Per dataset of X (K, n, T, d): every selection alpha in T^n is solved (batched prompt
    SVM); counts of feasible selections and of locally optimal ones besides the GMM."""
    K, n, T, _ = X.shape
    gam = X[..., 2]  # Fig. 1 layout: y = +1, v = e_3
    A = np.array(list(itertools.product(range(T), repeat=n)))  # (T^n, n)
    XX = np.repeat(X, len(A), axis=0)
    AA = np.tile(A, (K, 1))
    sol = prompt_svm_batch(XX, W, AA)
    loc = (tokens.is_locally_optimal(np.repeat(gam, len(A), axis=0), AA, sol.support_)
           & sol.feasible_).reshape(K, -1)
    opt = np.argmax(gam, -1)  # (K, n)
    is_opt = (A[None] == opt[:, None]).all(-1)  # (K, T^n)
    return pd.DataFrame({"gmm_feasible": (sol.feasible_.reshape(K, -1) & is_opt).any(1),
                         "gmm_locally_optimal": (loc & is_opt).any(1),
                         "other_lmms": (loc & ~is_opt).sum(1),
                         "assumption_b": _assumption_b(gam)})


def _assumption_b(gam: np.ndarray) -> np.ndarray:
    """Assumption B per dataset: within each sequence all non-optimal scores are equal."""
    top = gam.max(-1, keepdims=True)
    non = np.where(gam < top, gam, np.nan)
    spread = np.nanmax(non, -1) - np.nanmin(non, -1)
    return np.all(np.nan_to_num(spread) == 0, -1)


def _figure(cfg: dict):
    cs = np.asarray(cfg["starts"], dtype=float)
    paths, svms, outs, toks = [], [], [], []
    for panel, spec in PANELS.items():
        data = panel_data(panel, cfg)
        gam = data.gamma
        for i, t in np.ndindex(gam.shape):
            k = data.X[i, t] @ MMTS_FIG1_W
            toks.append(dict(panel=panel, seq=i, token=t, k1=k[0], k2=k[1], score=gam[i, t]))
        refs = {}  # candidate directions: alpha = the same token index t in every sequence
        for t in range(data.T if spec["s"] is not None else 1):
            sol = prompt_svm(data.X, MMTS_FIG1_W, alpha=np.full(data.n, t))
            svms.append(dict(panel=panel, alpha=t, feasible=sol.feasible_,
                             locally_optimal=locally_optimal(sol, gam), neighbours=_neighbours(sol),
                             norm=sol.norm_,
                             **{f"p{j + 1}": (sol.W_[j] if sol.feasible_ else np.nan) for j in range(3)}))
            if sol.feasible_:
                refs[f"tok{t}"] = sol.W_
        p0 = np.zeros((len(cs), 3))
        p0[:, spec["axis"]] = cs
        model, tr, df = prompt_paths(data, p0, cfg, refs)
        paths.append(df.assign(panel=panel, c=cs[df.start]))
        outs.append(pd.concat([pd.DataFrame(dict(panel=panel, start=np.arange(len(cs)), c=cs)),
                               outcomes(tr, data)], axis=1))
    return (pd.concat(paths, ignore_index=True), pd.DataFrame(svms),
            pd.concat(outs, ignore_index=True), pd.DataFrame(toks))


def _population(cfg: dict):
    """Runs and per-dataset assumption checks of the three populations."""
    cs = np.asarray(cfg["starts"], dtype=float)
    runs, sets = [], []
    for panel, spec in PANELS.items():
        pop = population(panel, cfg)
        K = pop.B
        census = lmm_census(pop.X).assign(panel=panel, dataset=np.arange(K))
        p0 = np.zeros((K, len(cs), 3))
        p0[..., spec["axis"]] = cs
        kind = ["figure"] * len(cs)
        R = list(np.abs(cs))
        if panel == "b":  # starts on the LMM direction p_mm(token 1), norms R
            lmm = prompt_svm_batch(pop.X, MMTS_FIG1_W, np.ones((K, 1), int))
            u = np.nan_to_num(lmm.W_)
            u = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-300)
            cone = np.stack([r * u for r in cfg["cone_norms"]], axis=1)
            p0 = np.concatenate([p0, cone], axis=1)
            kind += ["cone"] * len(cfg["cone_norms"])
            R += list(cfg["cone_norms"])
            gam = pop.gamma
            census["token1_locally_optimal"] = (tokens.is_locally_optimal(gam, np.ones((K, 1), int), lmm.support_)
                                                & lmm.feasible_)
            # margin of the optimal token's (inactive) constraint at p_mm(token 1): its
            # distance from being an SVM-neighbour; Theorem 3's cone shrinks as it -> 1
            k = pop.X[..., :2]
            census["opt_margin_at_lmm"] = np.where(
                lmm.feasible_, ((k[:, 0, 1] - k[:, 0, 0]) * np.nan_to_num(lmm.W_)[:, :2]).sum(-1), np.nan)
        S = p0.shape[1]
        data = TokenData(X=np.repeat(pop.X, S, axis=0), y=np.repeat(pop.y, S, axis=0),
                         v=np.repeat(pop.v, S, axis=0))
        refs = {}
        if panel == "b":  # corr with p_mm(token 1) along the way (a run may pass by the LMM)
            refs["tok1"] = np.repeat(np.nan_to_num(lmm.W_), S, axis=0)
        tr = train(PromptModel(3, W_fixed=MMTS_FIG1_W), data, optimizer=ngd(cfg["lr"]),
                   steps=cfg["steps"], init={"p": p0.reshape(-1, 3)}, references=refs,
                   record_every=max(1, cfg["steps"] // 8))
        oc = outcomes(tr, data)
        df = pd.DataFrame({"panel": panel, "dataset": np.repeat(np.arange(K), S),
                           "start": np.tile(np.arange(S), K), "kind": np.tile(kind, K),
                           "R": np.tile(R, K)}).join(
            oc[["outcome", "alpha", "corr_gmm", "corr_lmm", "locally_optimal", "p_sel_mean"]])
        if refs:
            peak = tr.metrics.loc[tr.metrics.groupby("trial").corr_tok1.idxmax()]
            df["peak_corr_tok1"] = peak.corr_tok1.to_numpy()
            df["peak_step_tok1"] = peak.step.to_numpy()
        runs.append(df)
        sets.append(census)
    return pd.concat(runs, ignore_index=True), pd.concat(sets, ignore_index=True)


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    paths, svm, out, toks = _figure(cfg)
    runs, sets = _population(cfg)
    return {"paths": paths, "svm": svm, "outcome": out, "tokens": toks, "population": runs,
            "datasets": sets}


def _neighbours(sol) -> str:
    """SVM-neighbours as token indices (n = 1) or (sequence, token) pairs."""
    if not sol.feasible_:
        return ""
    idx = np.argwhere(sol.support_)
    return str(idx[:, 1].tolist() if sol.support_.shape[0] == 1 else [tuple(r) for r in idx.tolist()])


def _per_start(d: pd.DataFrame) -> str:
    return "; ".join(f"c={r.c:+g}: {r.outcome} (token {r.alpha}, corr {r.corr:.4f})"
                     for r in d.itertuples())


def _misses(d: pd.DataFrame, ok: pd.Series, n: int = 4) -> str:
    bad = d[~np.asarray(ok, bool)]
    if not len(bad):
        return ""

    def peak(r):
        v = getattr(r, "peak_corr_tok1", np.nan)
        return "" if not np.isfinite(v) else (
            f", earlier corr with p_mm(token 1) up to {v:.5f} (step {int(r.peak_step_tok1)})"
            + ("" if not np.isfinite(getattr(r, "opt_margin_at_lmm", np.nan)) else
               f"; there token 1 is {'' if r.token1_locally_optimal else 'not '}locally optimal and the "
               f"optimal token's margin at p_mm(token 1) is {r.opt_margin_at_lmm:.3f}"))
    return (f"{plural(len(bad), 'run misses', 'runs miss')}: " + "; ".join(
        f"dataset {r.dataset} start {r.start}: token {r.alpha}, corr_gmm {r.corr_gmm:.3f}, "
        f"corr(p, p_mm(alpha)) {r.corr_lmm:.3f}, p_sel {r.p_sel_mean:.3f}{peak(r)}"
        for r in bad.head(n).itertuples()) + ("; ..." if len(bad) > n else "")
        + ". A run with the optimal token selected and an earlier corr near 1 with p_mm(token 1) "
          "approached the LMM and is leaving it for the GMM at the last step.")


def cone_shares(runs: pd.DataFrame, sets: pd.DataFrame) -> pd.Series:
    """(b): share of datasets with a locally optimal token 1 whose cone start of norm R
    reaches the LMM, by R."""
    ok = sets[(sets.panel == "b") & sets.token1_locally_optimal.astype(bool)].dataset
    c = runs[(runs.panel == "b") & (runs.kind == "cone") & runs.dataset.isin(ok)]
    return (c.outcome == "LMM").groupby(c.R).mean()


CLAIMS = {
    "fig_a": Claim(
        f"figure (a) s = 0.9: every start converges to the GMM direction p_mm(token 0) (corr >= {CORR})",
        quote="In Figure 1(a), the gray paths represent gradient descent trajectories from different "
              "initializations. [...] Notably, gradient descent iterates with various starting points "
              "converge towards the direction of the max-margin solution [p_mm] (depicted by - - -).",
        where="Sec. 2.1, Fig. 1(a) (Theorem 2)"),
    "loc": Claim("figure: token 1 is not locally optimal at s = 0.9 (SVM-neighbour token 2 has an "
                 "equal score) and is locally optimal at s = 0 (its neighbour has score 0)",
                 kind="sanity"),
    "fig_b_any": Claim(
        f"figure (b) s = 0: every start converges to the max-margin direction of the token it "
        f"selects, GMM or LMM (corr >= {CORR}); Theorem 3 is local and only predicts this for "
        "starts in a cone", kind="finding"),
    "fig_b_lmm": Claim(
        "figure (b) s = 0: GD started in the cone of token 1 converges to its LMM direction "
        "p_mm(token 1) (Theorem 3): some figure start reaches it",
        quote="By observing the figure, we can see that gradient descent, when properly "
              "initialized, converges towards the direction of [p_mm(token 1)] (depicted by - - -).",
        where="Sec. 2.2, Fig. 1(b) (Theorem 3)"),
    "fig_c": Claim(
        f"figure (c) n = 3, T = 7 (notebook dataset): every start converges to p_mm of the "
        f"optimal tokens (corr >= {CORR})",
        quote="Figure 1(c) also depicts the directional convergence of gradient descent from "
              "various initializations on multiple inputs, with the gray dotted line representing "
              "the separating hyperplane.", where="Sec. 2.1, Fig. 1(c)"),
    "prem_a": Claim("population (a): every dataset has n = 1, Assumption B and the GMM as its only "
                    "LMM (the premises of Theorem 2)", kind="sanity"),
    "pop_a": Claim(
        f"Theorem 2 on population (a) (datasets that meet its premises): every start on every "
        f"dataset converges to the GMM (corr >= {CORR})",
        quote="Theorem 2 shows that gradient descent will diverge in norm, and when [n = 1], the "
              "normalized predictor converges towards [p_mm], the separator of the globally "
              "optimal token.", where="Sec. 2.1, Theorem 2"),
    "pop_b": Claim(
        f"population (b): every run from the figure's starts converges to the GMM or to an LMM "
        f"within the paper's iterations (corr >= {CORR})", kind="finding"),
    "cone": Claim(
        "population (b), Theorem 3's cone: on the datasets where token 1 is locally optimal, the "
        "share of starts on its LMM direction (norm R) that converge to the LMM does not decrease "
        "with R (the theorem's cone radius is data-dependent and not given)", kind="finding"),
    "prem_c": Claim("population (c): every notebook dataset satisfies Assumption B with a feasible "
                    "GMM", kind="sanity"),
    "pop_c": Claim(
        f"population (c): on every notebook dataset whose only LMM is the GMM, every start "
        f"converges to the GMM (corr >= {CORR}); n = 3, so beyond Theorem 2", kind="finding"),
}


def judge(tables: dict, cfg: dict) -> list[Check]:
    oc, svm, runs, sets = tables["outcome"], tables["svm"], tables["population"], tables["datasets"]
    a, b, c = (oc[oc.panel == p] for p in "abc")
    loc = svm.set_index(["panel", "alpha"]).locally_optimal
    pa, pb, pc = (runs[runs.panel == p] for p in "abc")
    sa, sb, sc = (sets[sets.panel == p] for p in "abc")
    pbf = pb[pb.kind == "figure"].merge(sb[["dataset", "token1_locally_optimal", "opt_margin_at_lmm"]],
                                        on="dataset", how="left")
    ok_b = pbf.outcome.isin(["GMM", "LMM"]).to_numpy()
    lo1 = sb[sb.token1_locally_optimal.astype(bool)]
    shares = cone_shares(runs, sets)
    drops = int((np.diff(shares.to_numpy()) < 0).sum())
    last = shares.index.max() if len(shares) else np.nan
    cone_last = pb[(pb.kind == "cone") & (pb.R == last) & pb.dataset.isin(lo1.dataset)]
    missed = lo1[lo1.dataset.isin(cone_last.dataset[cone_last.outcome != "LMM"])]
    clean_c = sc[sc.other_lmms == 0].dataset
    pcc = pc[pc.dataset.isin(clean_c)]
    prem_a = sa.assumption_b & sa.gmm_locally_optimal & (sa.other_lmms == 0)
    C = CLAIMS
    return [
        C["fig_a"].at_least("starts reaching GMM", int((a.outcome == "GMM").sum()), len(a),
                            _per_start(a), fmt="d"),
        C["loc"].check(f"locally optimal: (a) {bool(loc.get(('a', 1), False))}, "
                       f"(b) {bool(loc.get(('b', 1), False))}",
                       (not loc.get(("a", 1), True)) and bool(loc.get(("b", 1), False))),
        C["fig_b_any"].at_least("starts reaching GMM or LMM", int(b.outcome.isin(["GMM", "LMM"]).sum()),
                                len(b), _per_start(b), fmt="d"),
        C["fig_b_lmm"].at_least("starts reaching the LMM", int((b.outcome == "LMM").sum()), 1,
                                "starts reaching the LMM: c = " + str(b.c[b.outcome == "LMM"].tolist()),
                                fmt="d"),
        C["fig_c"].at_least("starts reaching GMM", int((c.outcome == "GMM").sum()), len(c),
                            _per_start(c), fmt="d"),
        C["prem_a"].check(f"{int(prem_a.sum())} of {len(sa)}", bool(len(sa)) and bool(prem_a.all())),
        C["pop_a"].at_least(f"runs reaching GMM ({len(sa)} datasets x {len(cfg['starts'])} starts)",
                            int((pa.outcome == "GMM").sum()), len(pa),
                            f"min corr_gmm {pa.corr_gmm.min():.4f}; softmax saturated (p_sel >= 0.99) in "
                            f"{(pa.p_sel_mean >= 0.99).mean():.0%} of runs. " + _misses(pa, pa.outcome == "GMM"),
                            fmt="d"),
        C["pop_b"].at_least(f"runs reaching GMM or LMM ({len(sb)} datasets x {len(cfg['starts'])} "
                            f"starts, {cfg['steps']} iterations)", int(ok_b.sum()), len(pbf),
                            _misses(pbf, ok_b), fmt="d"),
        C["cone"].check(
            f"{len(lo1)} of {len(sb)} datasets have a locally optimal token 1; share reaching the LMM by R: "
            + ", ".join(f"R={r:g}: {v:.2f}" for r, v in shares.items())
            + f"; from some figure start: {pbf[pbf.dataset.isin(lo1.dataset)].groupby('dataset').outcome.apply(lambda s: (s == 'LMM').any()).mean():.2f}",
            bool(len(shares)) and drops == 0,
            ("" if not len(missed) else
             f"at R = {last:g}, {len(missed)} datasets still go to the GMM; their optimal token's margin at "
             f"p_mm(token 1) is {', '.join(f'{m:.3f}' for m in missed.opt_margin_at_lmm)} (1 = an SVM-"
             "neighbour: the nearer 1, the narrower the cone); not a contradiction of Theorem 3, whose R "
             "is only 'sufficiently large'")),
        C["prem_c"].check(f"{int((sc.assumption_b & sc.gmm_feasible).sum())} of {len(sc)}",
                          bool(len(sc)) and bool((sc.assumption_b & sc.gmm_feasible).all())),
        C["pop_c"].at_least(f"runs reaching GMM ({len(clean_c)} of {len(sc)} datasets x "
                            f"{len(cfg['starts'])} starts)", int((pcc.outcome == "GMM").sum()), len(pcc),
                            f"datasets with another LMM (excluded): {len(sc) - len(clean_c)}; on them "
                            f"{int((pc[~pc.dataset.isin(clean_c)].outcome == 'GMM').sum())} of "
                            f"{int((~pc.dataset.isin(clean_c)).sum())} runs reach the GMM. "
                            + _misses(pcc, pcc.outcome == "GMM"), fmt="d"),
    ]


def plot(tables: dict, cfg: dict, out) -> list:
    paths, svm, toks, oc = tables["paths"], tables["svm"], tables["tokens"], tables["outcome"]
    fig, ax = subplots(3, 2, width=4.0, height=3.6)
    titles = {"a": "(a) s = 0.9: global convergence", "b": "(b) s = 0: local convergence",
              "c": "(c) n = 3 sequences, T = 7"}
    for j, panel in enumerate("abc"):
        top, bot = ax[j], ax[j + 3]
        tk = toks[toks.panel == panel]
        for t, g in tk.groupby("token"):
            grp = t if panel != "c" else min(t, 1) + (t > 3)  # (c): token 0 | 1-3 | 4-6
            top.scatter(g.k1, g.k2, s=90 if t == 0 else 50, color=COLORS[(2, 1, 4)[grp]],
                        marker="*" if t == 0 else "o", zorder=3, edgecolor="k", lw=0.5,
                        label=(f"token {t} (score {g.score.iloc[0]:g})" if panel != "c" else
                               "optimal token 0 (score 1)" if t == 0 else
                               "non-optimal tokens (score 0.5)" if t == 1 else None))
        for _, d in paths[paths.panel == panel].groupby("start"):
            top.plot(d.p1, d.p2, color="gray", lw=1, alpha=0.8)
            top.plot(d.p1.iloc[0], d.p2.iloc[0], "o", color="gray", ms=3)
        for r in svm[(svm.panel == panel) & svm.feasible & (svm.alpha < 2)].itertuples():
            arrow(top, [r.p1, r.p2], color=COLORS[0] if r.alpha == 0 else COLORS[3], scale=6,
                  label=f"p_mm(token {r.alpha})" + ("" if r.locally_optimal else ", not LMM"))
        if panel == "c":
            _hyperplane(top, svm[svm.panel == "c"].iloc[0], tk)
        top.set_xlim(-2.2, 3.0)
        top.set_ylim(-2.2, 2.2)
        label(top, "p_1 (key coordinate 1)", "p_2 (key coordinate 2)", titles[panel], legend=False)
        top.legend(fontsize=6.5, loc="lower right")
        for s, d in paths[paths.panel == panel].groupby("start"):
            r = oc[(oc.panel == panel) & (oc.start == s)].iloc[0]
            col = f"corr_tok{r.alpha.split(',')[0]}"
            d = d[d.step > 0]
            bot.plot(d.step, 1 - d[col], label=f"c = {r.c:+g} -> {r.outcome}")
        bot.set_xscale("log")
        bot.set_yscale("log")
        label(bot, "iteration", "1 - corr(p, p_mm(selected))", "directional convergence", legend=False)
        bot.legend(fontsize=6.5, loc="lower left")
    return [save(fig, out, "mmts_fig1")]


def _hyperplane(ax, sol, tk):
    """Dotted line p_mm^T k = midpoint of the closest (optimal, non-optimal) key pair."""
    p = np.array([sol.p1, sol.p2])
    kk = tk[["k1", "k2"]].to_numpy() @ p
    opt = tk.token.to_numpy() == 0
    c = 0.5 * (kk[opt].min() + kk[~opt].max())
    u = np.array([-p[1], p[0]]) / np.linalg.norm(p)
    base = c * p / (p @ p)
    seg = np.array([base - 5 * u, base + 5 * u])
    ax.plot(seg[:, 0], seg[:, 1], ":", color="gray", lw=1.5, label="separating hyperplane")


_STARTS = [1.0, 0.5, 0.0, -0.5, -1.0, -1.5]
_BASE = dict(starts=_STARTS, steps=1000, lr=0.1, seed=0, jitter=0.2, cone_norms=(1.5, 5.0, 15.0))
EXPERIMENT = Experiment(
    name="mmts-fig1",
    title="Figure 1: GD on p converges to the GMM (a, c) or to an LMM (b)",
    claim="Normalized GD on the prompt p converges in direction to the max-margin (ATT-SVM) "
          "separator of the tokens it selects: globally to the GMM when n = 1 and no other token "
          "is locally optimal (Theorem 2), and to an LMM from starts in that token's cone (Theorem 3).",
    configs={
        "tiny": dict(_BASE, starts=[1.0, -1.0], steps=60, record_every=2,
                     datasets=dict(a=2, b=3, c=2), cone_norms=(1.5, 5.0)),
        "quick": dict(_BASE, record_every=2, datasets=dict(a=8, b=16, c=8)),
        "full": dict(_BASE, record_every=1, datasets=dict(a=64, b=128, c=64)),
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "Populations are attnsvm's addition: (a), (b) jitter the figure's keys with N(0, 0.2^2) "
        "(the noise level of the paper's multi-input generator), (c) uses the notebook generator's "
        "seeds; the figure shows one instance each. Population (a) meets Theorem 2's premises "
        "(checked per dataset), so it tests the theorem; (b), (c) and the cone starts go beyond "
        "the theorems and are attnsvm findings.",
        "Theorem 3's cone radius is not given: starts on the LMM direction at norms R = 1.5, 5, 15 "
        "(the figure's start scale up to the distance NGD travels in 1000 steps of 0.1) stand in for it.",
        "float64 instead of the notebooks' float32; convergence means corr(p, p_mm) >= 0.99.",
    ),
)
