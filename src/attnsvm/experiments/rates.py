"""Fast convergence rates (Vasudeva, Deora, Thrampoulidis 2024): GD vs NGD vs Polyak.

Setup: a self-attention layer with a linear decoder, logits a_it = x_it^T W x_i1 (the
first token is the query), logistic loss, on planted data (``attnsvm.data.planted``:
one planted optimal token per sequence, near-orthogonal noise tokens, d = nT + 1),
trials batched over seeds, W_0 = 0.  The paper proves that W_t / ||W_t|| -> W_mm / ||W_mm||
(the ATT-SVM of the optimal tokens) globally here, with finite-time rates: under NGD
||W_t|| grows like eta t and the direction converges much faster than under GD (whose
norm grows like log t); Polyak's step is faster still; once aligned,
1 - s_opt and L - L* decay like exp(-||W_t|| / ||W_mm||).

``rates-joint``: the decoder v is trained jointly with W (NGD, each tensor by its own
norm): v_t -> the head SVM direction v_mm of the selected tokens, W_t -> the ATT-SVM of
those tokens (docs/theory.md §9); attnsvm's findings, since the cited abstract states no
joint-training result.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm import plotting as P
from attnsvm.data import planted
from attnsvm.experiments.base import Claim, Experiment
from attnsvm.metrics import correlation
from attnsvm.models import WModel
from attnsvm.optim import gd, ngd, polyak
from attnsvm.svm import att_svm_batch, head_svm
from attnsvm.train import train

OPTIMIZERS = {"GD": lambda c: gd(c["lr_gd"]), "NGD": lambda c: ngd(c["lr_ngd"]),
              "Polyak": lambda c: polyak(c["polyak_c"])}
COLOR = {"GD": P.COLORS[0], "NGD": P.COLORS[1], "Polyak": P.COLORS[2]}
CORR = 0.99        # "converged in direction"
SPEEDUP = 5.0      # "far fewer iterations": at least 5x
SLOPE_TOL = 0.2    # relative tolerance on the exp(-||W|| / ||W_mm||) rate


def _data(cfg):
    return planted(n=cfg["n"], T=cfg["T"], seed=cfg["seed"], batch=cfg["B"], cross=False)


def first_hit(df: pd.DataFrame, col: str, thr: float, by=("optimizer", "trial")) -> pd.DataFrame:
    """First recorded step with ``col >= thr`` per group (NaN if never reached)."""
    hit = df[df[col] >= thr].groupby(list(by))["step"].min()
    return hit.reindex(df.groupby(list(by)).size().index).rename("step").reset_index()


# ------------------------------------------------------------------ rates-planted
def freeze_steps(m: pd.DataFrame, stops: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (optimizer, trial): the recorded step from which ||W_t|| never changes again.

    A trial the trainer stopped (``stopped``) is frozen by design; one that is *not* stopped
    but whose norm stays bit-identical over the last records made zero steps although its
    gradient is not 0: the step rule underflowed. (Before the scale-free steps of
    ``attnsvm.optim``, Polyak did so at step ~380-760 on this data: ||G||_F^2 computed as a
    sum of squares underflowed to 0 at |G| ~ 1e-163; this guard keeps such a freeze from
    passing unnoticed.) Columns: optimizer, trial, freeze_step (NaN: moving at the end),
    stop_step (first step the trainer marked the trial stopped, NaN if never), reason (with
    the trainer's own reason when ``stops``, ``Trajectory.stops`` plus ``optimizer``, is given).
    """
    why = {} if stops is None else {(r.optimizer, r.trial): r.stop_reason
                                    for r in stops.itertuples() if r.stop_reason}
    rows = []
    for (opt, trial), g in m.sort_values("step").groupby(["optimizer", "trial"]):
        nrm, steps = g["norm"].to_numpy(), g["step"].to_numpy()
        changed = np.flatnonzero(nrm[1:] != nrm[:-1])
        last = changed[-1] + 1 if len(changed) else 0  # index of the last record that moved
        frozen = last < len(nrm) - 1
        stop = g.loc[g.stopped.astype(bool), "step"]
        stop_step = float(stop.min()) if len(stop) else np.nan
        reason = ("moving at the end" if not frozen else
                  f"stopped by the trainer: {why.get((opt, trial), 'gradient exactly 0')}"
                  if np.isfinite(stop_step) else
                  "frozen, not marked stopped: zero steps although the gradient is not 0 "
                  "(the step rule underflowed)")
        rows.append(dict(optimizer=opt, trial=trial, freeze_step=float(steps[last]) if frozen
                         else np.nan, stop_step=stop_step, reason=reason))
    return pd.DataFrame(rows)


def _mark_frozen(m: pd.DataFrame, fr: pd.DataFrame) -> pd.DataFrame:
    """Add ``frozen``: True on the records after a trial's freeze step (its parameters no
    longer change there, whether or not the trainer marked it stopped)."""
    f = m.merge(fr[["optimizer", "trial", "freeze_step"]], on=["optimizer", "trial"], how="left")
    return f.assign(frozen=f.step > f.freeze_step.fillna(np.inf)).drop(columns="freeze_step")


def compute_planted(cfg):
    data = _data(cfg)
    z = data.X[:, :, 0, :]
    sol = att_svm_batch(data.X, z, data.opt)
    frames, stops = [], []
    for name, make in OPTIMIZERS.items():
        tr = train(WModel(data.d, query="first"), data, optimizer=make(cfg), steps=cfg["steps"],
                   init="zero", references={"mm": np.nan_to_num(sol.W_)},
                   record_every=cfg["record_every"])
        frames.append(tr.metrics.assign(optimizer=name))
        stops.append(tr.stops.assign(optimizer=name))
    m = pd.concat(frames, ignore_index=True)
    m["one_minus_s_opt"] = 1.0 - m["p_sel_mean"]
    fr = freeze_steps(m, pd.concat(stops, ignore_index=True))
    m = _mark_frozen(m, fr)
    svm = pd.DataFrame({"trial": np.arange(cfg["B"]), "norm_mm": sol.norm_,
                        "feasible": sol.feasible_})
    return {"metrics": m, "svm": svm, "data": planted_properties(data, cfg),
            "frozen": fr}


def planted_properties(data, cfg) -> pd.DataFrame:
    """What the planted data model promises, measured per trial (B, one row each):
    the optimal token is unique with score gap >= ``score_gap`` (gamma_opt - max_other),
    the noise components of distinct tokens are nearly orthogonal (max |cos|), and the
    model is over-parameterised (d >= n T)."""
    gam = data.gamma  # (B, n, T)
    top = np.sort(gam, -1)
    G = data.X.copy()
    G[..., 0] = 0.0  # the score coordinate (head v = e_1) removed: the noise parts
    G = G.reshape(G.shape[0], -1, G.shape[-1])
    G = G / np.linalg.norm(G, axis=-1, keepdims=True)
    C = np.abs(G @ G.transpose(0, 2, 1))
    C[:, np.arange(C.shape[1]), np.arange(C.shape[1])] = 0.0
    return pd.DataFrame({"trial": np.arange(gam.shape[0]),
                         "score_gap": (top[..., -1] - top[..., -2]).min(-1),
                         "max_abs_cos_noise": C.max((1, 2)),
                         "d": data.d, "nT": data.n * data.T})


def rate_slopes(m: pd.DataFrame, svm: pd.DataFrame, optimizer: str = "NGD") -> pd.DataFrame:
    """Per trial: least-squares slope of log(L - L*) against ||W|| over the aligned rows
    (corr >= 0.99, 0 < L - L* < 1e-3, parameters still moving: records after a trial froze
    repeat one point), and the prediction -1/||W_mm||."""
    m = m.assign(ln_gap=m.log10_gap * np.log(10.0) if "log10_gap" in m else
                 np.log(m.loss_gap.where(m.loss_gap > 0)))  # log10_gap: exact below 1e-308
    d = m[(m.optimizer == optimizer) & (m.corr_mm >= CORR) & np.isfinite(m.ln_gap)
          & (m.ln_gap < np.log(1e-3))]
    if "frozen" in d:
        d = d[~d.frozen.astype(bool)]
    rows = []
    for trial, g in d.groupby("trial"):
        if len(g) < 3:
            continue
        slope = np.polyfit(g["norm"], g["ln_gap"], 1)[0]
        pred = -1.0 / float(svm.set_index("trial").loc[trial, "norm_mm"])
        rows.append({"trial": trial, "slope": slope, "predicted": pred})
    return pd.DataFrame(rows, columns=["trial", "slope", "predicted"])


def growth_ratio(m: pd.DataFrame, optimizer: str, T: int) -> float:
    """Median over trials of (||W_T|| - ||W_T/2||) / (||W_T/2|| - ||W_T/4||):
    2 for linear growth (eta t), 1 for logarithmic growth.  T is cut to the last step
    before any trial stopped or froze (``stopped``: gradient exactly 0 in float64;
    ``frozen``: parameters no longer change, see :func:`freeze_steps`)."""
    d = m[m.optimizer == optimizer]
    for col in ("stopped", "frozen"):
        if col in d and d[col].astype(bool).any():
            T = min(T, int(d[d[col].astype(bool)].step.min()) - 1)
    g = d.pivot(index="step", columns="trial", values="norm").loc[:T].dropna()
    at = [g.index[np.abs(g.index - s).argmin()] for s in (T // 4, T // 2, T)]
    return float(((g.loc[at[2]] - g.loc[at[1]]) / (g.loc[at[1]] - g.loc[at[0]])).median())


def _frozen_note(fr: pd.DataFrame | None, name: str) -> str:
    """'k of B trials ...' for the trials of ``name`` that stopped moving before the end."""
    if fr is None:
        return ""
    f = fr[(fr.optimizer == name) & fr.freeze_step.notna()]
    parts = []
    for reason, g in f.groupby("reason"):
        parts.append(f"{len(g)} of {int((fr.optimizer == name).sum())} {name} trials {reason} "
                     f"from step {g.freeze_step.min():.0f}-{g.freeze_step.max():.0f}")
    return "; ".join(parts)


def censored_median(steps: pd.Series, budget: float) -> tuple[float, bool]:
    """Median time to an event observed up to ``budget`` (NaN = not reached by then: a time
    censored at the budget, known only to exceed it). With one censoring time for all trials
    the Kaplan-Meier median is the median of min(time, budget); it is itself censored (only a
    lower bound, ``> budget``) when half or more of the trials are censored. Returns (median,
    censored)."""
    t = np.minimum(steps.fillna(np.inf).to_numpy(float), budget)
    if not len(t):
        return float("nan"), False
    med = float(np.median(t))
    return med, bool(np.isnan(steps).mean() >= 0.5)


QUOTE = {
    "fast": "These findings not only show that these strategies can accelerate parameter "
            "convergence over standard GD in a non-convex setting but also deepen the "
            "understanding of the implicit bias in self-attention, linking it more closely to "
            "the phenomena observed in linear logistic regression despite its intricate "
            "non-convex nature.",
    "rates": "We then analyze two adaptive step-size strategies: normalized GD and Polyak "
             "step-size, demonstrating \\emph{finite-time} convergence rates for $W_t$ to "
             "$W_{mm}$, and quantifying the sparsification rate of the attention map.",
    "gd": "recent findings demonstrate that the key-query matrix $W_t$ from gradient-descent "
          "(GD) converges in direction towards $W_{mm}$, which maximizes the margin between "
          "optimal and non-optimal tokens across sequences. However, this convergence is "
          "local, dependent on initial conditions, only holds asymptotically as the number of "
          "iterations increases",
}
WHERE = "abstract (seed text 000: the abstract only; the rates are restated in docs/theory.md §9)"


CLAIMS_PLANTED = {
    "feasible": Claim("ATT-SVM of the planted optimal tokens feasible on every instance",
                      kind="sanity"),
    "unique": Claim("every sequence has a unique optimal token (planted score gap)", kind="sanity"),
    **{f"fast_{name}": Claim(
        f"{name} reaches corr(W_t, W_mm) >= {CORR} in at least {SPEEDUP:g}x fewer iterations "
        f"than GD (median time to it, censored at the budget)", quote=QUOTE["fast"], where=WHERE)
       for name in ("NGD", "Polyak")},
    "ngd_linear": Claim(
        "NGD: ||W_t|| grows linearly (~ eta t): norm increment over [T/2, T] is ~2x that over [T/4, T/2] (>= 1.8)",
        quote=QUOTE["rates"], where=WHERE),
    "gd_log": Claim(
        "GD: ||W_t|| grows logarithmically: equal increments per doubling of t (ratio <= 1.3, linear would be 2)",
        quote=QUOTE["gd"], where=WHERE),
    "slope": Claim(
        f"NGD, once aligned: log(L - L*) falls with slope -1/||W_mm|| in ||W_t|| (median relative error <= {SLOPE_TOL:g})",
        quote=QUOTE["rates"], where=WHERE),
}
"""rates-planted's declared verdicts, in the order ``judge_planted`` returns their checks
("unique" only when the tables carry the planted data)."""


def judge_planted(tables, cfg):
    m, svm = tables["metrics"], tables["svm"]
    fr = tables.get("frozen")
    T = int(m.step.max())
    hits = first_hit(m, "corr_mm", CORR)
    med, cens = {}, {}
    for name, g in hits.groupby("optimizer"):
        med[name], cens[name] = censored_median(g.step, T)
    nf = int((~svm.feasible.astype(bool)).sum())
    C = CLAIMS_PLANTED
    checks = [C["feasible"].check(f"{nf} of {len(svm)} infeasible", nf == 0,
                                  "true by construction when d >= nT (generic tokens)")]
    if "data" in tables:
        gap = float(tables["data"].score_gap.min())
        checks.append(C["unique"].at_least(
            "min over trials and sequences of gamma_opt - max_other gamma", gap,
            0.5 * cfg.get("score_gap", 0.5),
            note="the planted generator draws the other scores below 1 - score_gap"))
    def reached(name):
        g = hits[hits.optimizer == name]
        return f"{name} reached it in {int(g.step.notna().sum())} of {len(g)} trials"

    for name in ("NGD", "Polyak"):
        ratio = med["GD"] / max(med[name], 1) if not cens[name] else np.nan
        lt = ">= " if cens["GD"] else ""
        note = (f"time to corr {CORR} censored at the budget T = {T} for a trial that has not "
                f"reached it (Kaplan-Meier median = median of min(time, T)); {reached('GD')}, "
                f"{reached(name)}")
        if cens["GD"]:
            note += (f"; GD's median is censored (> {T} steps), so the ratio is a lower bound: "
                     f"the claim holds if even that bound reaches {SPEEDUP:g}x")
        if cens[name]:
            note += f"; {name}'s median is censored: the ratio is not determined"
        fz = _frozen_note(fr, name)
        if fz:
            note = "; ".join(filter(None, [note, fz + " (after the first hit: it decides "
                                                 "nothing here)"]))
        checks.append(C[f"fast_{name}"].at_least(
            f"median steps GD / {name} ({lt}{med['GD']:.0f} / {med[name]:.0f})", ratio, SPEEDUP,
            note))
    r_ngd, r_gd = growth_ratio(m, "NGD", T), growth_ratio(m, "GD", T)
    checks.append(C["ngd_linear"].at_least(
        "increment ratio NGD", r_ngd, 1.8,
        note=(_frozen_note(fr, "NGD") + "; T cut before the first") if _frozen_note(fr, "NGD")
        else ""))
    checks.append(C["gd_log"].at_most("increment ratio GD", r_gd, 1.3))
    sl = rate_slopes(m, svm)
    rel = float(np.median(np.abs(sl.slope / sl.predicted - 1))) if len(sl) else np.nan
    checks.append(C["slope"].at_most(
        f"median |slope / (-1/||W_mm||) - 1| over {len(sl)} trials", rel, SLOPE_TOL,
        "" if len(sl) else "no trial aligned with 0 < L - L* < 1e-3"))
    return checks


def plot_planted(tables, cfg, out):
    m, svm = tables["metrics"], tables["svm"]
    m = m[m.step > 0]
    if "frozen" in m:  # a frozen trial repeats its last point: each band ends where the first
        # trial of its optimiser froze (the median then stays over all trials), markers show all
        first = m[m.frozen.astype(bool)].groupby("optimizer").step.min()
        m = m[m.step < m.optimizer.map(first).fillna(np.inf)]
    fig, ax = P.subplots(4, width=3.6, height=3.0)
    gap = ("log10_gap", "log10(L - L*)", False) if "log10_gap" in m else ("loss_gap", "L - L*", True)
    panels = [("corr_mm", "corr(W_t, W_mm)", False), gap,
              ("one_minus_s_opt", "1 - s_opt (mean over i)", True), ("norm", "||W_t||_F", True)]
    for a, (col, lab, logy) in zip(ax, panels):
        for name in OPTIMIZERS:
            d = m[m.optimizer == name]
            if logy:  # cut where a trial leaves the resolved range (1 - p is rounding below ~eps)
                floor = 1e-14 if col == "one_minus_s_opt" else 0.0
                low = d[d[col] <= floor].step
                d = d[d.step < (low.min() if len(low) else np.inf)]
            P.band(a, d, "step", col, label=name, color=COLOR[name])
        a.set_xscale("log")
        if logy:
            a.set_yscale("log")
        P.label(a, "iteration t", lab)
    if "frozen" in tables["metrics"]:
        for name in OPTIMIZERS:
            fz = tables.get("frozen")
            if fz is None:
                break
            f = fz[(fz.optimizer == name) & fz.freeze_step.notna()]
            if not len(f):
                continue
            full = tables["metrics"]
            at = full[full.optimizer == name].set_index(["trial", "step"]).norm
            pts = [(s_, at.get((t_, s_), np.nan)) for t_, s_ in zip(f.trial, f.freeze_step)]
            x, y = np.array(pts).T
            marker = "x" if f.stop_step.isna().all() else "o"
            ax[3].scatter(x, y, marker=marker, s=18, color=COLOR[name], zorder=3,
                          label=f"{name}: {'step = 0 (underflow)' if marker == 'x' else 'stopped'} "
                                "from here")
    t = np.unique(m.step)
    ax[3].plot(t, cfg["lr_ngd"] * t, "k:", lw=1, label="eta t (NGD prediction)")
    g = m[(m.optimizer == "GD")].groupby("step")["norm"].median()
    t0 = g.index[len(g) // 4]
    ax[3].plot(t[t >= t0], g.loc[t0] + np.log(t[t >= t0] / t0), "k--", lw=1, label="+log t (GD)")
    ax[3].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))  # outside: no data hidden
    ax[0].axhline(CORR, color="gray", lw=0.8, ls=":")
    paths = [P.save(fig, out, "rates_planted_curves")]
    fig, ax = P.subplots(2, width=4.0, height=3.2)
    d = m[(m.optimizer == "NGD") & (m.loss_gap > 0)]
    for i, (trial, g) in enumerate(d.groupby("trial")):
        ax[0].plot(g["norm"], g["loss_gap"], color=P.COLORS[i % 8], lw=1,
                   label="NGD trials" if i == 0 else None)
        nm = float(svm.set_index("trial").loc[trial, "norm_mm"])
        x0, y0 = g["norm"].iloc[-1], g["loss_gap"].iloc[-1]
        xs = np.linspace(g["norm"].min(), x0, 20)
        with np.errstate(over="ignore"):  # beyond float64 range: not drawn
            ys = y0 * np.exp(-(xs - x0) / nm)
        ax[0].plot(xs, ys, "k:", lw=0.8,
                   label="exp(-||W|| / ||W_mm||)" if i == 0 else None)
    ax[0].set_yscale("log")
    P.label(ax[0], "||W_t||_F", "L - L* (log scale)", "loss gap against the norm (NGD)")
    sl = rate_slopes(tables["metrics"], svm)
    ax[1].scatter(-sl.predicted, -sl.slope, color=P.COLORS[1], label="trials")
    lim = [0, 1.1 * max(1e-9, float(np.nanmax(np.r_[-sl.predicted, -sl.slope, 1e-9])))]
    ax[1].plot(lim, lim, "k--", lw=1, label="measured = predicted")
    P.label(ax[1], "predicted rate 1/||W_mm|| (per unit norm)", "fitted -slope of log(L - L*)",
            "decay rate in ||W||")
    paths.append(P.save(fig, out, "rates_planted_slope"))
    return paths


# ------------------------------------------------------------------ rates-joint
def compute_joint(cfg):
    data = _data(cfg)
    planted_opt = data.opt
    data = data.replace(v=None)
    tr = train(WModel(data.d, query="first", train_head=True), data, optimizer=ngd(cfg["lr_ngd"]),
               steps=cfg["steps"], init="random", scale=cfg["init_scale"], seed=cfg["seed"],
               record_every=cfg["record_every"], record_params=True)
    X, y, n = data.X, data.y, data.n
    z = X[:, :, 0, :]
    W = tr.params["W"].numpy()
    alpha = np.einsum("bntd,bde,bne->bnt", X, W, z).argmax(-1)  # tokens selected at the end
    att = att_svm_batch(X, z, alpha)
    v_mm = np.stack([head_svm(X[b, np.arange(n), alpha[b]], y[b]).W_ for b in range(cfg["B"])])
    Wh, vh = tr.param_history["W"], tr.param_history["v"]  # (R, B, ...)
    rows = pd.DataFrame({
        "step": np.repeat(tr.record_steps, cfg["B"]),
        "trial": np.tile(np.arange(cfg["B"]), len(tr.record_steps)),
        "corr_v": correlation(vh, v_mm[None], vector=True).ravel(),
        "corr_W": correlation(Wh, np.nan_to_num(att.W_)[None]).ravel(),
    })
    m = tr.metrics.merge(rows, on=["trial", "step"])
    info = pd.DataFrame({"trial": np.arange(cfg["B"]), "att_feasible": att.feasible_,
                         "planted_selected": (alpha == planted_opt).mean(1)})
    return {"metrics": m, "svm": info}


# The cited version's paper text stored (the arXiv abstract, v2, seed text 000; in
# tests/data/paper_excerpts/rates.txt) states no result on training the decoder jointly (its
# opening sentence names the setting only), so these are attnsvm's findings, after the
# paper's joint-training section as docs/theory.md §9 restates it (v -> the head SVM, W ->
# the ATT-SVM of the selected tokens).


CLAIMS_JOINT = {
    "v": Claim(f"v_t -> head-SVM direction: median final corr(v_t, v_mm) >= {CORR}",
               kind="finding"),
    "W": Claim(f"W_t -> ATT-SVM of the selected tokens: median final corr(W_t, W_mm) >= {CORR}",
               kind="finding"),
}
"""rates-joint's declared verdicts, in the order ``judge_joint`` returns their checks."""


def judge_joint(tables, cfg):
    m, info = tables["metrics"], tables["svm"]
    feas = info.att_feasible.astype(bool)
    m = m[m.trial.isin(info.trial[feas])]
    T = int(m.step.max())
    last = m[m.step == T]
    med = m.groupby("step").corr_W.median()
    note = f"ATT-SVM infeasible for {int((~feas).sum())} trials (excluded)" if (~feas).any() else ""
    if med.iloc[-1] < CORR:
        note = "; ".join(filter(None, [note, f"median corr peaked at {med.max():.4f} (t = {med.idxmax()}) "
                                             f"and is {med.iloc[-1]:.4f} at T = {T}"]))
    def share(col):  # the population view beside the median
        return (f"{(last[col] >= CORR).mean():.0%} of {len(last)} trials reach {CORR} at "
                f"T = {T} (worst {last[col].min():.4f})")

    sel = ""
    if "planted_selected" in info:
        sel = (f"; the selected tokens are the planted optimal ones in "
               f"{info.planted_selected[feas].mean():.0%} of the sequences")
    return [
        CLAIMS_JOINT["v"].at_least("median corr(v_T, v_mm)", float(last.corr_v.median()), CORR,
                                   share("corr_v")),
        CLAIMS_JOINT["W"].at_least("median corr(W_T, W_mm)", float(last.corr_W.median()), CORR,
                                   "; ".join(filter(None, [note, share("corr_W")])) + sel),
    ]


def plot_joint(tables, cfg, out):
    m = tables["metrics"]
    m = m[m.step > 0]
    fig, ax = P.subplots(2, width=4.0, height=3.0)
    P.band(ax[0], m, "step", "corr_v", label="corr(v_t, v_mm) (head SVM)", color=P.COLORS[0])
    P.band(ax[0], m, "step", "corr_W", label="corr(W_t, W_mm) (ATT-SVM)", color=P.COLORS[1])
    ax[0].set_xscale("log")
    P.label(ax[0], "iteration t", "correlation", "joint NGD on (W, v)")
    P.band(ax[1], m, "step", "norm", label="||W_t||_F", color=P.COLORS[1])
    P.band(ax[1], m, "step", "norm_head", label="||v_t||", color=P.COLORS[0])
    t = np.unique(m.step)
    ax[1].plot(t, cfg["lr_ngd"] * t, "k:", lw=1, label="eta t")
    ax[1].set_xscale("log")
    ax[1].set_yscale("log")
    P.label(ax[1], "iteration t", "norm", "parameter norms")
    return [P.save(fig, out, "rates_joint")]


_COMMON = dict(n=4, T=4, seed=0, lr_gd=1.0, lr_ngd=0.1, polyak_c=1.0)
EXPERIMENTS = [
    Experiment(
        name="rates-planted", title="GD vs NGD vs Polyak on planted data (rates of convergence)",
        claim="NGD and Polyak align W_t with W_mm much faster than GD; ||W_t|| grows like eta t "
              "under NGD and like log t under GD; once aligned L - L* ~ exp(-||W_t|| / ||W_mm||).",
        configs={"tiny": {**_COMMON, "B": 2, "steps": 150, "record_every": 10},
                 "quick": {**_COMMON, "B": 8, "steps": 1600, "record_every": 8},
                 "full": {**_COMMON, "B": 32, "steps": 10000, "record_every": 20}},
        compute=compute_planted, judge=judge_planted, plot=plot_planted,
        verdicts=tuple(CLAIMS_PLANTED.values()),
        deviations=(
            "The paper's experimental setting (data, n, T, d, step sizes, iterations) was not "
            "available to this reproduction (the seed text is the abstract; no public code of "
            "the paper in the stored code index): data = attnsvm's planted model (d = nT + 1, "
            "unique optimal token with score gap 0.5, its properties measured per dataset in "
            "the `data` table), W_0 = 0, GD lr 1, NGD lr 0.1, Polyak c = 1, over B datasets.",
            "Thresholds (corr 0.99, 5x fewer iterations, growth ratio 1.8 / 1.3, slope error "
            "0.2) are attnsvm's: the paper states rates, not numbers.",
            "The time to corr 0.99 of a trial that has not reached it within the budget is "
            "censored at the budget (known only to exceed it), not counted as a failure: the "
            "median is the Kaplan-Meier median (= median of min(time, budget)), a lower bound "
            "when half or more trials are censored; the speed-up claim holds when even that "
            "bound reaches 5x.",
        )),
    Experiment(
        name="rates-joint", title="Joint training of the decoder v and W (NGD)",
        claim="Trained jointly with NGD, the decoder v_t converges in direction to the head SVM "
              "of the selected tokens and W_t to their ATT-SVM.",
        configs={"tiny": {**_COMMON, "B": 2, "steps": 150, "record_every": 10, "init_scale": 0.1},
                 "quick": {**_COMMON, "B": 8, "steps": 1000, "record_every": 10, "init_scale": 0.1},
                 "full": {**_COMMON, "B": 32, "steps": 4000, "record_every": 20, "init_scale": 0.1}},
        compute=compute_joint, judge=judge_joint, plot=plot_joint,
        verdicts=tuple(CLAIMS_JOINT.values()),
        deviations=(
            "The paper's experimental setting was not available to this reproduction (see "
            "rates-planted): planted data without the head, (W, v) from a random start of norm "
            "0.1 per tensor, NGD lr 0.1 with each tensor normalised by its own norm; the 0.99 "
            "thresholds on the median trial are attnsvm's.",
            "The paper text stored is the abstract only (arXiv v2), which states no "
            "joint-training result: the verdicts are attnsvm's findings after docs/theory.md "
            "§9's restatement (v -> the head SVM, W -> the ATT-SVM of the selected tokens), "
            "not paper claims.",
        )),
]
