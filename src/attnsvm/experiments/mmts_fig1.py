"""Max-Margin Token Selection, Figure 1: GD on the prompt p converges to max-margin directions.

Setup (the paper's Sec. 2 and its ``single_input_converge`` / ``multi_input_converge``
notebooks): prompt model a_t = x_t^T W p with fixed W = W_K^T W_Q = diag(1, 1, 0) and head
v = e_3, so the first two coordinates of a token are its key and the third its score.
Tokens are numbered from 0 (the paper's "token 1" is token 0 here).

(a) s = 0.9, one sequence X = [(-0.1, 1, 1), (1, 0, 0.9), (0, 0, s)]: scores (1, 0.9, 0.9).
    Token 0 is optimal; token 1 is not locally optimal (its SVM-neighbour token 2 has the
    same score), so every start must converge to the GMM direction p_mm(token 0).
(b) s = 0: token 1 (score 0.9) is locally optimal (its only SVM-neighbour, token 2, has
    score 0), so GD started in its cone converges to the LMM direction p_mm(token 1)
    (Theorem 3), while other starts still reach the GMM.
(c) n = 3, T = 7 (``attnsvm.data.mmts_fig1_multi``, token 0 optimal in every sequence):
    every start converges to p_mm; the dotted line is its separating hyperplane.

Normalized GD (lr 0.1, logistic loss) from p_0 = (0, c, 0) [(a), (b)] or (c, 0, 0) [(c)],
c in {1, .5, 0, -.5, -1, -1.5}. A run "converges to" a direction when attention
saturates on one token per sequence (mean max probability >= 0.99) and corr(p, p_mm(alpha))
>= 0.99 for the selected tokens alpha (the outcome rule of THEORY §7 / Fig. 9).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm import tokens
from attnsvm.data import MMTS_FIG1_W, mmts_fig1, mmts_fig1_multi
from attnsvm.experiments.base import Check, Experiment, check_at_least
from attnsvm.models import PromptModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, arrow, label, save, subplots
from attnsvm.svm import prompt_svm
from attnsvm.train import train

CORR = 0.99  # convergence in direction: corr(p, p_mm) >= 0.99 (THEORY §7)
SATURATED = 0.99  # attention saturated: mean max softmax probability >= 0.99
PANELS = {"a": dict(s=0.9, axis=1), "b": dict(s=0.0, axis=1), "c": dict(s=None, axis=0)}


def panel_data(panel: str, cfg: dict):
    s = PANELS[panel]["s"]
    return mmts_fig1_multi(seed=cfg["seed"]) if s is None else mmts_fig1(s)


def prompt_paths(data, p0: np.ndarray, cfg: dict, refs: dict, W=MMTS_FIG1_W, loss="logistic"):
    """NGD on p from each row of ``p0``; returns (Trajectory, tidy path table)."""
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
    """Per trial (``attnsvm.tokens.outcome``, THEORY §7): selected tokens alpha, verdict
    not saturated / GMM / LMM / other, and corr = corr(p, p_mm(alpha))."""
    oc = tokens.outcome(tr.W, data.X, data.y, data.v, W_key=W, saturation=SATURATED,
                        threshold=CORR)
    alpha = tokens.selected_tokens(tokens.attention_probs(data.X, tr.W, W_key=W))
    return oc.assign(alpha=[",".join(map(str, a)) for a in alpha], corr=oc.corr_lmm)


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    cs = np.asarray(cfg["starts"], dtype=float)
    paths, svms, outs, toks = [], [], [], []
    for panel, spec in PANELS.items():
        data = panel_data(panel, cfg)
        gam = data.gamma
        for i, t in np.ndindex(gam.shape):
            k = data.X[i, t] @ MMTS_FIG1_W
            toks.append(dict(panel=panel, seq=i, token=t, k1=k[0], k2=k[1], score=gam[i, t]))
        # candidate directions: alpha = the same token index t in every sequence
        refs = {}
        for t in range(data.T if spec["s"] is not None else 1):
            sol = prompt_svm(data.X, MMTS_FIG1_W, alpha=np.full(data.n, t))
            loc = locally_optimal(sol, gam)
            svms.append(dict(panel=panel, alpha=t, feasible=sol.feasible_, locally_optimal=loc,
                             neighbours=_neighbours(sol), norm=sol.norm_,
                             **{f"p{j + 1}": (sol.W_[j] if sol.feasible_ else np.nan) for j in range(3)}))
            if sol.feasible_:
                refs[f"tok{t}"] = sol.W_
        p0 = np.zeros((len(cs), 3))
        p0[:, spec["axis"]] = cs
        model, tr, df = prompt_paths(data, p0, cfg, refs)
        paths.append(df.assign(panel=panel, c=cs[df.start]))
        oc = outcomes(tr, data)
        outs.append(pd.concat([pd.DataFrame(dict(panel=panel, start=np.arange(len(cs)), c=cs)),
                               oc], axis=1))
    return {"paths": pd.concat(paths, ignore_index=True), "svm": pd.DataFrame(svms),
            "outcome": pd.concat(outs, ignore_index=True), "tokens": pd.DataFrame(toks)}


def _neighbours(sol) -> str:
    """SVM-neighbours as token indices (n = 1) or (sequence, token) pairs."""
    if not sol.feasible_:
        return ""
    idx = np.argwhere(sol.support_)
    return str(idx[:, 1].tolist() if sol.support_.shape[0] == 1 else [tuple(r) for r in idx.tolist()])


def _per_start(d: pd.DataFrame) -> str:
    return "; ".join(f"c={r.c:+g}: {r.outcome} (token {r.alpha}, corr {r.corr:.4f})"
                     for r in d.itertuples())


def judge(tables: dict, cfg: dict) -> list[Check]:
    oc, svm = tables["outcome"], tables["svm"]
    a, b, c = (oc[oc.panel == p] for p in "abc")
    loc = svm.set_index(["panel", "alpha"]).locally_optimal
    checks = [
        check_at_least(f"(a) s = 0.9: every start converges to the GMM direction p_mm(token 0) "
                       f"(corr >= {CORR})", "starts reaching GMM",
                       int((a.outcome == "GMM").sum()), len(a), _per_start(a), fmt="d"),
        Check("(a) s = 0.9: token 1 is not locally optimal (SVM-neighbour token 2 has an equal "
              "score); (b) s = 0: token 1 is locally optimal (its neighbour has score 0)",
              f"locally optimal: (a) {bool(loc.get(('a', 1), False))}, "
              f"(b) {bool(loc.get(('b', 1), False))}",
              (not loc.get(("a", 1), True)) and bool(loc.get(("b", 1), False))),
        check_at_least(f"(b) s = 0: every start converges to the max-margin direction of the token "
                       f"it selects, GMM or LMM (corr >= {CORR})", "starts reaching GMM or LMM",
                       int(b.outcome.isin(["GMM", "LMM"]).sum()), len(b), _per_start(b), fmt="d"),
        check_at_least("(b) s = 0: GD started in the cone of token 1 converges to its LMM "
                       "direction p_mm(token 1) (Theorem 3)", "starts reaching the LMM",
                       int((b.outcome == "LMM").sum()), 1,
                       "starts reaching the LMM: c = " + str(b.c[b.outcome == "LMM"].tolist()),
                       fmt="d"),
        check_at_least(f"(c) n = 3, T = 7: every start converges to p_mm of the optimal tokens "
                       f"(corr >= {CORR})", "starts reaching GMM",
                       int((c.outcome == "GMM").sum()), len(c), _per_start(c), fmt="d"),
    ]
    return checks


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
        label(top, "p_1 (key coordinate 1)", "p_2 (key coordinate 2)", titles[panel])
        for s, d in paths[paths.panel == panel].groupby("start"):
            r = oc[(oc.panel == panel) & (oc.start == s)].iloc[0]
            col = f"corr_tok{r.alpha.split(',')[0]}"
            d = d[d.step > 0]
            bot.plot(d.step, 1 - d[col], label=f"c = {r.c:+g} -> {r.outcome}")
        bot.set_xscale("log")
        bot.set_yscale("log")
        label(bot, "iteration", "1 - corr(p, p_mm(selected))", "directional convergence")
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
EXPERIMENT = Experiment(
    name="mmts-fig1",
    title="Figure 1: GD on p converges to the GMM (a, c) or to an LMM (b)",
    claim="Normalized GD on the prompt p converges in direction to the max-margin (ATT-SVM) "
          "separator of the tokens it selects: globally to the GMM when no other token is "
          "locally optimal, and to an LMM from starts in that token's cone.",
    configs={
        "tiny": dict(starts=[1.0, -1.0], steps=60, lr=0.1, record_every=2, seed=0),
        "quick": dict(starts=_STARTS, steps=500, lr=0.1, record_every=2, seed=0),
        "full": dict(starts=_STARTS, steps=1000, lr=0.1, record_every=1, seed=0),
    },
    compute=compute, judge=judge, plot=plot,
)
