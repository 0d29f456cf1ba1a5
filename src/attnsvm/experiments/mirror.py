"""l_p mirror descent on attention (Julistiono, Tarzanagh, Azizan 2024): the l_p ATT-SVM.

Mirror descent with potential psi(W) = (1/p)||W||_p^p (entrywise), normalised by the dual
norm of the gradient (``attnsvm.optim.mirror(p, lr, normalized=True)``), logistic loss.
The paper proves W_t / ||W_t||_p -> W_mm^p / ||W_mm^p||_p, the l_p ATT-SVM of the tokens
the run selects (docs/theory.md §5, §9): the directional Bregman divergence
D_psi(W_mm^p / ||W_mm^p||_p, W_t / ||W_t||_p) -> 0, and not towards the l_q SVM, q != p.

``mirror-bregman`` follows the paper's public code (github.com/aaronk2002/AttentionMD,
``synthetic-data``: ``run-local-{p}.sh``, ``correlation_calculation.py``,
``tools/bregman_div.py``, ``plotter.ipynb``): 100 datasets of n = 6, T = 8, d = 10 unit
tokens, queries and head with random labels (``random_sphere``), W model with the fixed
head v, W_0 with i.i.d. N(0, 1) entries, lr 0.1, p in {1.75, 2, 3} run for 1500 / 2000 /
20000 iterations. "Tokens reached" = the attention argmax per sequence at the last
iteration; each run's l_p SVM is solved at its own tokens. The paper's figure (one panel per
optimiser p, e.g. p = 3) plots, along the p-run, the mean over runs of
D_psi_p(W_mm^q / ||W_mm^q||_p, W_t / ||W_t||_p) -- in the *optimiser's* potential psi_p, to
the l_q SVM that the *q-run* of the same dataset produced (its own tokens) -- for every q.
Tables (means at the last iteration): that definition (``bregman_paper``); the same with
every l_q SVM solved at the p-run's own tokens (``bregman_same``: the implicit bias without
token mismatch between runs); and D_psi_q at those tokens (``bregman_col``, the column's
potential, for the column check). Prediction: each row's minimum on the diagonal.

``mirror-joint``: the paper's toy (``attnsvm.data.mirror_joint_toy``, z_i = x_i1,
y = (1, -1)), W and the head v trained jointly by l_p MD from (W, v) = (0, 0) (the paper's
``joint_training.py``: p in {1.75, 2, 3}, 1500 / 2000 / 20000 iterations, lr 0.1). Which
tokens each p selects; W -> the l_p ATT-SVM and v -> the l_p head SVM of those tokens.
Each run is read at its last iteration (``read_step``: the budget, or the step where the
logistic derivative underflows to 0 in float64 and the trainer stops the run, docs/theory.md §8).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from matplotlib.ticker import NullFormatter

from attnsvm import plotting as P
from attnsvm.data import mirror_joint_toy, random_sphere
from attnsvm.experiments.base import Claim, Experiment
from attnsvm.metrics import correlation, directional_bregman
from attnsvm.models import WModel
from attnsvm.optim import mirror
from attnsvm.svm import att_svm, head_svm
from attnsvm.train import train

SAT = 0.99        # saturated (docs/theory.md §7): mean_i max_t s_it >= 0.99
CORR = 0.99       # "converged in direction" (docs/theory.md §7)
DECAY = 0.1       # D_psi must fall by at least 10x from the first recorded iteration


_PAPER_COLOR = {1.75: "r", 2.0: "g", 3.0: "b"}  # the paper's plotter.ipynb


def _fmt(p: float) -> str:
    return f"{p:g}"


# ------------------------------------------------------------------ mirror-bregman
def _w0(cfg) -> torch.Tensor:
    """The paper's start: W_0 with i.i.d. N(0, init_std^2) entries, one draw per trial (B, d, d),
    shared by every optimiser p (seeded)."""
    gen = torch.Generator().manual_seed(int(cfg["seed"]))
    d = cfg["d"]
    return cfg["init_std"] * torch.randn((cfg["B"], d, d), generator=gen, dtype=torch.float64)


def compute_bregman(cfg):
    """Train l_p MD for every (p, steps) in ``cfg["runs"]`` from the same W_0 per trial, read
    each run's tokens at its last iteration and solve the l_q SVMs (q over the same ps).

    Tables: ``final`` one row per (p, q, trial) with
      bregman_paper  the paper's definition: D_psi_p(W_mm^q(alpha_q), W_p) (directional, both
                     normalised in l_p), the divergence in the optimiser's potential psi_p to
                     the l_q SVM solved at the tokens alpha_q the *q-run* reached;
      bregman_same   D_psi_p to the l_q SVM solved at the p-run's own tokens alpha_p;
      bregman_col    D_psi_q (the column's potential) to the same SVM as bregman_same;
      corr_same      corr(W_p, W_mm^q(alpha_p)); tokens_match: alpha_p == alpha_q (all i).
    ``curves``: D_psi_p(W_mm^q(alpha_q), W_t) along every p-run (the paper's figure).
    ``runs``: per (p, trial) the steps run, saturation and tokens. ``table``: means per (p, q).
    """
    runs = [(float(p), int(s)) for p, s in cfg["runs"]]
    ps = [p for p, _ in runs]
    B, d = cfg["B"], cfg["d"]
    data = random_sphere(cfg["n"], cfg["T"], d, seed=cfg["seed"], batch=B)
    model = WModel(d)
    W0 = _w0(cfg)
    cache: dict = {}

    def svm(b, alpha, q):  # l_q ATT-SVM of trial b at tokens alpha (solved once)
        key = (b, tuple(alpha.tolist()), q)
        if key not in cache:
            sol = att_svm(data.X[b], data.z[b], alpha, norm=q)
            cache[key] = sol.W_ if sol.feasible_ else np.full((d, d), np.nan)
        return cache[key]

    alpha, W, hist, rows = {}, {}, {}, []
    for p, steps in runs:
        tr = train(model, data, loss="logistic", optimizer=mirror(p, cfg["lr"], normalized=True),
                   steps=steps, init={"W": W0}, record_params=True,
                   record_every=max(1, steps // cfg["records"]))
        s = model.attention(tr.params, data).numpy()  # (B, n, T)
        alpha[p], W[p] = s.argmax(-1), tr.W
        hist[p] = (tr.record_steps, tr.param_history["W"])
        rows.append(pd.DataFrame({
            "p": p, "trial": np.arange(B), "steps": steps,
            "stop_step": tr.stop_step, "p_max_mean": s.max(-1).mean(-1),
            "p_max_min": s.max(-1).min(-1), "alpha": [str(a.tolist()) for a in alpha[p]]}))
    own = {q: np.stack([svm(b, alpha[q][b], q) for b in range(B)]) for q in ps}
    final, curves = [], []
    for p in ps:
        for q in ps:
            same = np.stack([svm(b, alpha[p][b], q) for b in range(B)])
            final.append(pd.DataFrame({
                "p": p, "q": q, "trial": np.arange(B),
                "bregman_paper": directional_bregman(own[q], W[p], p),
                "bregman_same": directional_bregman(same, W[p], p),
                "bregman_col": directional_bregman(same, W[p], q),
                "corr_same": correlation(W[p], same),
                "tokens_match": (alpha[p] == alpha[q]).all(-1)}))
            steps, H = hist[p]
            with np.errstate(invalid="ignore", divide="ignore"):  # W_t = 0 has no direction
                D = directional_bregman(own[q][None], H, p)
            curves.append(pd.DataFrame({
                "p": p, "q": q, "step": np.repeat(steps, B),
                "trial": np.tile(np.arange(B), len(steps)), "bregman": D.reshape(-1)}))
    final = pd.concat(final, ignore_index=True)
    return {"table": bregman_table(final), "final": final,
            "curves": pd.concat(curves, ignore_index=True),
            "runs": pd.concat(rows, ignore_index=True)}


def bregman_table(final: pd.DataFrame) -> pd.DataFrame:
    """Means over trials per (optimiser p, SVM norm q): the paper's divergence, the same-tokens
    one, the column-potential one, and the paper's divergence split by whether the q-run
    reached the p-run's tokens (matched) or not (mismatched)."""
    g = final.groupby(["p", "q"])
    tab = g.agg(bregman_paper=("bregman_paper", "mean"), bregman_paper_std=("bregman_paper", "std"),
                bregman_same=("bregman_same", "mean"), bregman_col=("bregman_col", "mean"),
                corr_same=("corr_same", "mean"), share_match=("tokens_match", "mean"),
                n_feasible=("bregman_paper", "count"), n_trials=("trial", "count"))
    split = final.assign(m=final.tokens_match.map({True: "matched", False: "mismatched"}))
    split = split.pivot_table(index=["p", "q"], columns="m", values="bregman_paper", aggfunc="mean")
    for c in ("matched", "mismatched"):
        tab[f"bregman_paper_{c}"] = split[c] if c in split else np.nan
    return tab.reset_index()


def _own_min_share(final: pd.DataFrame, col: str) -> pd.Series:
    """Per optimiser p: the share of trials whose smallest divergence (``col``) over q is at q = p."""
    f = final.dropna(subset=[col])
    best = f.loc[f.groupby(["p", "trial"])[col].idxmin()]
    return (best.q == best.p).groupby(best.p).mean()


QUOTE = ("Specifically, we show that these algorithms converge in direction to a generalized "
         "hard-margin SVM with an $\\ell_p$-norm objective when applied to a classification "
         "problem using a softmax attention model.")
WHERE = ("main theorem (l_p MD -> the l_p ATT-SVM) and its synthetic-data figure (directional "
         "Bregman divergence per optimiser p to each l_q SVM; the paper's plotter.ipynb); the "
         "abstract of arXiv:2410.14581 (seed text 002)")
QUOTE_JOINT = ("Additionally, we delve into the joint optimization dynamics of the key-query "
               "matrix and the decoder, establishing conditions under which this complex joint "
               "optimization converges to their respective hard-margin SVM solutions.")
WHERE_JOINT = ("joint (W, v) theorem and the toy of joint_training.py; the abstract of "
               "arXiv:2410.14581 (seed text 002)")


_ROWS = {"bregman_paper": "the paper's definition: D_psi_p, each l_q SVM at the tokens its own "
                          "q-run reached",
         "bregman_same": "same tokens: every l_q SVM at the tokens the p-run reached"}


def _row_text(p: str, col: str) -> str:
    return (f"MD with p = {p} ends closer to the l_{p} SVM than to the other l_q "
            f"SVMs (row minimum of the mean final divergence; {_ROWS[col]})")


def _decay_text(p: str, last: str) -> str:
    return (f"p = {p}: the mean directional Bregman divergence to the l_{p} SVM falls "
            f"by >= {1 / DECAY:g}x from iteration 0 to {last}")


CLAIMS_BREGMAN = {
    "row_paper": Claim(_row_text("p", "bregman_paper").replace("p = p", "each p"), quote=QUOTE,
                       where=WHERE),
    "row_same": Claim(_row_text("p", "bregman_same").replace("p = p", "each p"), kind="finding"),
    "column": Claim(
        "for each l_q SVM (at the row run's tokens) the run with p = q has the smallest mean "
        "divergence D_psi_q (column minimum; attnsvm's check, a consequence of the theorem, not a "
        "table of the paper)", kind="finding"),
    "decay": Claim(_decay_text("p", "the last recorded one").replace("p = p", "each p"),
                   quote=QUOTE, where=WHERE),
    "saturated": Claim(
        f"the runs saturate (mean_i max_t s_it >= {SAT}, docs/theory.md §7) in >= 90% of trials, so "
        "that the reached tokens are defined", kind="sanity"),
}
"""mirror-bregman's declared verdicts; ``judge_bregman`` returns them in this order, the
per-p ones once for each p (its text then names the p)."""


def judge_bregman(tables, cfg):
    tab, final, curves, runs = tables["table"], tables["final"], tables["curves"], tables["runs"]
    ps = sorted(tab.p.unique())
    T = tab.set_index(["p", "q"])
    sat = runs.assign(s=runs.p_max_mean >= SAT).groupby("p").s.mean()
    share = {c: _own_min_share(final, c) for c in ("bregman_paper", "bregman_same")}
    checks = []
    for col, key in (("bregman_paper", "row_paper"), ("bregman_same", "row_same")):
        for p in ps:
            row = T.loc[p][col]
            best = row.idxmin()
            note = (f"{share[col].get(p, np.nan):.0%} of trials have their own minimum at q = p; "
                    f"{sat[p]:.0%} of runs saturated")
            if col == "bregman_paper":  # where the off-diagonal divergence comes from
                r = T.loc[p]
                note += "; off the diagonal, by whether the q-run reached the p-run's tokens: " + \
                    ", ".join(f"l_{_fmt(q)}: same tokens in {r.share_match[q]:.0%} of trials "
                              f"(mean {r.bregman_paper_matched[q]:.3g}), other tokens "
                              f"(mean {r.bregman_paper_mismatched[q]:.3g})"
                              for q in row.index if q != p)
            checks.append(CLAIMS_BREGMAN[key].check(
                "; ".join(f"l_{_fmt(q)}: {row[q]:.3g}" for q in row.index), bool(best == p), note,
                claim=_row_text(_fmt(p), col)))
    col_best = {q: T.xs(q, level="q").bregman_col.idxmin() for q in ps}
    checks.append(CLAIMS_BREGMAN["column"].check(
        "; ".join(f"column l_{_fmt(q)}: min at p = {_fmt(r)} ({T.loc[(r, q), 'bregman_col']:.2e})"
                  for q, r in col_best.items()),
        all(r == q for q, r in col_best.items()),
        note="the runs have different lengths (the paper's budgets): " + ", ".join(
            f"p = {_fmt(p)}: {int(runs[runs.p == p].steps.iat[0])}" for p in ps)))
    own = curves[curves.p == curves.q].groupby(["p", "step"]).bregman.mean()
    for p in ps:
        m = own.loc[p]
        checks.append(CLAIMS_BREGMAN["decay"].at_most(
            "ratio last / first", float(m.iloc[-1] / m.iloc[0]), DECAY,
            note=f"from {m.iloc[0]:.3g} to {m.iloc[-1]:.3g}; the paper shows the curve, "
                 f"not a threshold ({1 / DECAY:g}x is attnsvm's)", fmt=".3g",
            claim=_decay_text(_fmt(p), str(int(m.index[-1])))))
    checks.append(CLAIMS_BREGMAN["saturated"].at_least(
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
    ps = sorted(tab.p.unique())[::-1]  # the paper's panel (p = 3) first
    fig, ax = P.subplots(len(ps), width=4.2, height=3.4)
    for a, p in zip(ax, ps):
        for j, q in enumerate(sorted(tab.q.unique())):
            g = curves[(curves.p == p) & (curves.q == q)].groupby("step").bregman
            mean, std = g.mean(), g.std()
            col = _PAPER_COLOR.get(q, P.COLORS[j])
            a.plot(mean.index, mean, color=col, lw=2, label=f"l_{_fmt(q)} SVM")
            if q == p:  # the paper shades +-1 std of the run's own curve
                a.fill_between(mean.index, mean - std, mean + std, color=col, alpha=0.15, lw=0)
        P.label(a, "iteration", "dir. Bregman divergence D_psi_p",
                f"l_{_fmt(p)} mirror descent ({cfg['B']} runs: mean; band: +-1 std)")
        a.set_ylim(bottom=0)
    paths = [P.save(fig, out, "mirror_bregman")]
    fig, ax = P.subplots(3, width=3.8, height=3.2)
    _heat(ax[0], tab.pivot(index="p", columns="q", values="bregman_paper"), ".3g",
          "paper: D_psi_p, q-run's tokens", "Reds")
    _heat(ax[1], tab.pivot(index="p", columns="q", values="bregman_same"), ".3g",
          "same tokens: D_psi_p, p-run's tokens", "Reds")
    _heat(ax[2], tab.pivot(index="p", columns="q", values="share_match"), ".0%",
          "q-run reached the p-run's tokens", "Blues")
    paths.append(P.save(fig, out, "mirror_bregman_tables"))
    return paths


# ------------------------------------------------------------------ mirror-joint
def compute_joint(cfg):
    data = mirror_joint_toy()
    model = WModel(data.d, train_head=True)
    paths, summary = [], []
    for p, steps in cfg["runs"]:
        tr = train(model, data, loss="logistic", optimizer=mirror(p, cfg["lr"], normalized=True),
                   steps=steps, init="zero", record_every=max(1, steps // cfg["records"]),
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
        # records where W changed by more than rounding (with a zero gradient the mirror-map
        # round trip sign|W|^(p-1) -> W still moves the last bits)
        dW = np.abs(W[1:] - W[:-1]).max((1, 2))
        moved = np.flatnonzero(dW > 1e-12 * np.abs(W[1:]).max((1, 2)))
        w_frozen = int(tr.record_steps[moved[-1] + 1]) if len(moved) and moved[-1] + 1 < r else -1
        paths.append(pd.DataFrame({
            "p": p, "step": np.repeat(tr.record_steps, n * T),
            "seq": np.tile(np.repeat(np.arange(n), T), R),
            "token": np.tile(np.arange(T), R * n),
            "attention": s.reshape(-1),
            "corr_W": np.repeat(cw, n * T), "corr_v": np.repeat(cv, n * T)}))
        summary.append(dict(
            p=p, alpha=str(alpha.tolist()), steps=steps, read_step=int(tr.record_steps[r]),
            w_frozen_step=w_frozen, logit_gap=float(gap[r]), p_max_min=float(s[r].max(-1).min()),
            svm_feasible=bool(Wp.feasible_ and vp.feasible_), corr_W=float(cw[r]),
            corr_v=float(cv[r]),
            bregman_W=float(directional_bregman(Wp.W_, W[r], p)) if Wp.feasible_ else np.nan,
            bregman_v=float(directional_bregman(vp.W_, v[r], p, vector=True))
            if vp.feasible_ else np.nan))
    return {"summary": pd.DataFrame(summary), "paths": pd.concat(paths, ignore_index=True)}


def _w_frozen_note(sm: pd.DataFrame) -> str:
    """Runs whose W stopped changing before the read step: its gradient underflowed to exactly
    0 in float64 (the W-gradient carries the factor s_it (1 - s_it) ~ exp(-logit gap) times
    the logistic derivative) while v still moved; W is read where it froze."""
    if "w_frozen_step" not in sm:
        return ""
    f = sm[sm.w_frozen_step >= 0]
    return "".join(f"; p = {_fmt(r.p)}: W frozen from step {r.w_frozen_step} of {r.read_step} "
                   "(its gradient underflowed to 0 in float64; v still moved)"
                   for r in f.itertuples())


CLAIMS_JOINT = {
    "saturated": Claim(f"every p saturates on a token per sequence (min_i max_t s_it >= {SAT})",
                       kind="sanity"),
    "distinct": Claim("different p select different tokens on the paper's toy (attnsvm's reading "
                      "of the toy's figure; no sentence of the seed text states it)",
                      kind="finding"),
    "W": Claim(f"W -> the l_p ATT-SVM of the tokens p selects (corr >= {CORR} for every p)",
               quote=QUOTE_JOINT, where=WHERE_JOINT),
    "v": Claim(f"v -> the l_p head SVM of the selected tokens (corr >= {CORR} for every p)",
               quote=QUOTE_JOINT, where=WHERE_JOINT),
}
"""mirror-joint's declared verdicts, in the order ``judge_joint`` returns their checks."""


def judge_joint(tables, cfg):
    sm = tables["summary"]
    per_p = "; ".join(f"p = {_fmt(r.p)}: {r.alpha}" for r in sm.itertuples())
    worst = sm.loc[sm.corr_W.idxmin()] if sm.corr_W.notna().any() else sm.iloc[0]
    return [
        CLAIMS_JOINT["saturated"].at_least(
            "smallest over p", float(sm.p_max_min.min()), SAT, note=f"selected tokens: {per_p}; "
            "the selected tokens (and so the SVMs below) are defined only then"),
        CLAIMS_JOINT["distinct"].check(f"{sm.alpha.nunique()} distinct selections: {per_p}",
                                       bool(sm.alpha.nunique() >= 2)),
        CLAIMS_JOINT["W"].at_least("min over p of corr(W, W_mm^p)", float(sm.corr_W.min()), CORR,
                                   note=f"worst p = {_fmt(worst.p)}; infeasible SVMs: "
                                        f"{int((~sm.svm_feasible).sum())}" + _w_frozen_note(sm)),
        CLAIMS_JOINT["v"].at_least("min over p of corr(v, v_mm^p)", float(sm.corr_v.min()), CORR),
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
    ax[0, 0].legend(fontsize=6, loc="center right")  # y 0.1-0.9 is empty once saturated
    return [P.save(fig, out, "mirror_joint")]


EXPERIMENTS = [
    Experiment(
        name="mirror-bregman",
        title="l_p mirror descent: directional Bregman divergence and the p-vs-q SVM table",
        claim="l_p mirror descent on W converges in direction to the l_p ATT-SVM of the "
              "selected tokens (Bregman divergence -> 0), and is closer to it than to the "
              "l_q SVMs for q != p.",
        configs={
            "tiny": dict(n=4, T=4, d=5, B=3, runs=((1.75, 60), (2.0, 80), (3.0, 200)),
                         records=20, lr=0.1, init_std=1.0, seed=0),
            "quick": dict(n=6, T=8, d=10, B=16, runs=((1.75, 1500), (2.0, 2000), (3.0, 5000)),
                          records=100, lr=0.1, init_std=1.0, seed=0),
            "full": dict(n=6, T=8, d=10, B=100, runs=((1.75, 1500), (2.0, 2000), (3.0, 20000)),
                         records=200, lr=0.1, init_std=1.0, seed=0),
        },
        compute=compute_bregman, judge=judge_bregman, plot=plot_bregman,
        verdicts=tuple(CLAIMS_BREGMAN.values()),
        deviations=(
            "W_0: the paper's code draws W_0 with N(0, 1) entries from torch's default generator "
            "without a seed, so every dataset and every p start from one and the same matrix; "
            "attnsvm draws one W_0 per dataset (seeded), shared by the three p: the verdict is "
            "over a population of starts as well as of datasets.",
            "quick scale: 16 datasets and p = 3 stopped at 5000 iterations (the paper: 100 "
            "datasets, 20000 iterations) to fit the time budget; full is the paper's setting.",
            "An earlier version of this experiment measured the divergence in the column's "
            "potential psi_q at the row run's tokens; the paper's figure uses the optimiser's "
            "psi_p and each q-run's own tokens. Both the paper's table and the same-tokens table "
            "(psi_p, every SVM at the p-run's tokens) are shown; their off-diagonal difference "
            "is the token mismatch between runs (the check notes split it by matched / "
            "mismatched trials). The psi_q table stays as attnsvm's column check.",
"The same-tokens table (every l_q SVM at the p-run's tokens) and the column check "
            "(psi_q) are attnsvm's findings beside the paper's table, not the paper's claim.",
                        "Thresholds: the paper plots the curves and states no number; the 10x decay and the "
            "row / column minimum are attnsvm's reading of 'converges to the l_p SVM and not to "
            "the l_q one'.",
        )),
    Experiment(
        name="mirror-joint",
        title="Joint (W, v) l_p mirror descent on the paper's toy: selected tokens per p",
        claim="Trained jointly by l_p mirror descent, W converges to the l_p ATT-SVM and v to "
              "the l_p head SVM of the tokens it selects; different p can select different "
              "tokens.",
        configs={
            "tiny": dict(runs=((1.75, 150), (3.0, 150)), lr=0.1, records=75),
            "quick": dict(runs=((1.75, 1500), (2.0, 2000), (3.0, 5000)), lr=0.1, records=500),
            "full": dict(runs=((1.75, 1500), (2.0, 2000), (3.0, 20000)), lr=0.1, records=2000),
        },
        compute=compute_joint, judge=judge_joint, plot=plot_joint,
        verdicts=tuple(CLAIMS_JOINT.values()),
        deviations=(
            "quick scale: p = 3 stopped at 5000 iterations (the paper's joint_training.py: "
            "20000); full is the paper's setting (p in {1.75, 2, 3}, 1500 / 2000 / 20000 "
            "iterations, lr 0.1, (W, v) = 0).",
            "The 0.99 correlation threshold is attnsvm's (the paper shows the iterates' "
            "direction against the SVMs in a figure).",
            "'Different p select different tokens' is attnsvm's reading of the toy's figure "
            "(no sentence of the seed text states it): a finding, not the paper's claim.",
        )),
]
