"""Max-Margin Token Selection, Figure 5: the loss function shapes the transient path.

Setup (the paper's ``diff_loss_function`` notebook): prompt model with fixed
W = diag(1, 1, 0), head v = e_3, n = 2, T = 2, d = 3, y = (1, 1):

    X_1 = [(0, 0, 0), (1,  1, C)]     optimal token key (1,  1), score C
    X_2 = [(0, 0, 0), (1, -1, 1)]     optimal token key (1, -1), score 1

for C in {1, ..., 10, 100}; p_0 = 0, normalized GD (lr 0.1), correlation loss -u and
logistic loss log(1 + e^{-u}). Both optimal tokens are support vectors of the GMM
direction p_mm = (1, 0, 0), so p_2 = 0 is the unbiased path.

Claim (Sec. 4): during the transient the correlation loss favours the token with the
high score (p_2 > 0: the path bends towards key (1, 1)), the logistic loss the one with
the low score (p_2 < 0), and the bias grows with C. Reason: per sequence the gradient
is ~ -l'(gamma_i) gamma_i; l' = -1 (correlation) rewards large gamma, l' ~ -e^{-gamma}
(logistic) small ones. Since s_{1,opt} - s_{2,opt} has the sign of p_2, p_2 at the
transient step T_tr (200, the horizon of the paper's plot) is the measured quantity.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnsvm.data import MMTS_FIG1_W, TokenData, stack
from attnsvm.experiments.base import Check, Experiment
from attnsvm.models import PromptModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, label, save, subplots
from attnsvm.svm import prompt_svm
from attnsvm.train import train

LOSSES = ("correlation", "logistic")
ZERO = 1e-9  # |p_2| below this is "no bias" (float64 round-off of a symmetric run)


def fig5_data(C: float) -> TokenData:
    """The two-sequence dataset of Fig. 5 with score ratio C (see module docstring)."""
    X = np.array([[[0, 0, 0], [1, 1, C]], [[0, 0, 0], [1, -1, 1.0]]], dtype=float)
    return TokenData(X=X, y=np.ones(2), v=np.array([0.0, 0.0, 1.0]))


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    Cs = [float(c) for c in cfg["Cs"]]
    data = stack([fig5_data(C) for C in Cs])  # one trial per C
    model = PromptModel(3, W_fixed=MMTS_FIG1_W)
    p_mm = prompt_svm(data.X[0], MMTS_FIG1_W, alpha=[1, 1]).W_  # (1, 0, 0) for every C
    rows = []
    for loss in LOSSES:
        tr = train(model, data, loss=loss, optimizer=ngd(cfg["lr"]), steps=cfg["steps"],
                   init="zero", record_every=cfg["record_every"], record_params=True,
                   references={"mm": p_mm})
        P = tr.param_history["p"]  # (R, B, d)
        R, B = P.shape[:2]
        hist = TokenData(X=np.tile(data.X, (R, 1, 1, 1)), y=np.tile(data.y, (R, 1)),
                         v=np.tile(data.v, (R, 1)))
        s = model.attention({"p": torch.as_tensor(P.reshape(R * B, -1))}, hist).numpy().reshape(R, B, 2, 2)
        df = pd.DataFrame({
            "loss": loss,
            "C": np.tile(Cs, R),
            "step": np.repeat(tr.record_steps, B),
            "p1": P[..., 0].ravel(), "p2": P[..., 1].ravel(),
            "s_high": s[:, :, 0, 1].ravel(),  # sequence 1: optimal token with score C
            "s_low": s[:, :, 1, 1].ravel(),  # sequence 2: optimal token with score 1
        })
        corr = tr.metrics[["trial", "step", "corr_mm"]].assign(C=lambda d: np.asarray(Cs)[d.trial])
        rows.append(df.merge(corr.drop(columns="trial"), on=["C", "step"]))
    return {"paths": pd.concat(rows, ignore_index=True)}


def transient(paths: pd.DataFrame, cfg: dict) -> pd.DataFrame:
    """Rows at the transient step T_tr (the last recorded step <= T_tr)."""
    step = paths.step[paths.step <= cfg["transient_step"]].max()
    return paths[paths.step == step].sort_values(["loss", "C"])


def judge(tables: dict, cfg: dict) -> list[Check]:
    at = transient(tables["paths"], cfg)
    step = int(at.step.iloc[0])
    checks = []
    expect = {"correlation": (1.0, "high-score token (p_2 > 0)"),
              "logistic": (-1.0, "low-score token (p_2 < 0)")}
    for loss, (sign, what) in expect.items():
        d = at[(at.loss == loss) & (at.C > 1)]
        ok = bool(len(d)) and bool((sign * d.p2 > ZERO).all())
        wrong = d.C[~(sign * d.p2 > ZERO)].tolist()
        checks.append(Check(
            f"{loss} loss: for every C > 1 the transient path favours the {what} at step {step}",
            "p_2 by C: " + ", ".join(f"C={c:g}: {p:+.3g}" for c, p in zip(d.C, d.p2)),
            ok, "" if ok else f"wrong sign (or |p_2| <= {ZERO:g}) for C = {wrong}"))
        grows = bool(len(d) > 1) and bool(np.all(np.diff(np.abs(d.p2.to_numpy())) >= 0))
        checks.append(Check(
            f"{loss} loss: the bias |p_2| at step {step} grows with C",
            "|p_2| = " + ", ".join(f"{abs(p):.3g}" for p in d.p2), grows,
            "" if grows else "|p_2| is not non-decreasing in C"))
    ctrl = at[at.C == 1]
    if len(ctrl):
        m = float(ctrl.p2.abs().max())
        checks.append(Check(
            f"control C = 1 (equal scores): no bias, |p_2| <= {ZERO:g} for both losses",
            f"max |p_2| = {m:.2g}", m <= ZERO))
    return checks


def plot(tables: dict, cfg: dict, out) -> list:
    paths = tables["paths"]
    Cs = sorted(paths.C.unique())
    fig, ax = subplots(3, width=4.2, height=3.6)
    early = paths[paths.step <= cfg["transient_step"]]
    for k, loss in enumerate(LOSSES):
        for j, C in enumerate(Cs):
            d = early[(early.loss == loss) & (early.C == C)]
            lab = f"{loss}" if j == len(Cs) - 1 else None
            a = 0.25 + 0.75 * (j + 1) / len(Cs)
            ax[0].plot(d.p1, d.p2, color=COLORS[k], alpha=a, lw=1.5, label=lab)
            d = paths[(paths.loss == loss) & (paths.C == C) & (paths.step > 0)]
            ax[1].plot(d.step, d.s_high - d.s_low, color=COLORS[k], alpha=a, lw=1.2, label=lab)
        at = transient(paths, cfg)
        d = at[at.loss == loss]
        ax[2].plot(d.C, d.p2, "o-", color=COLORS[k], label=loss)
    ax[0].scatter([1, 1], [1, -1], marker="*", s=120, c=["g", "c"], zorder=3,
                  label="optimal keys (1,1): score C; (1,-1): score 1")
    ax[0].axhline(0, color="gray", ls="--", lw=1, label="p_mm direction (1, 0)")
    label(ax[0], "p_1", "p_2", f"(a) paths of p, steps 0-{cfg['transient_step']} "
          "(darker = larger C)")
    ax[1].set_xscale("log")
    ax[1].axhline(0, color="gray", lw=0.8)
    label(ax[1], "iteration", "s(score-C token) - s(score-1 token)", "(b) attention bias over time")
    ax[2].set_xscale("log")
    ax[2].axhline(0, color="gray", lw=0.8)
    label(ax[2], "score ratio C", f"p_2 at step {int(transient(paths, cfg).step.iloc[0])}",
          "(c) transient bias vs C")
    return [save(fig, out, "mmts_fig5")]


_C = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100]
EXPERIMENT = Experiment(
    name="mmts-fig5",
    title="Figure 5: correlation vs logistic loss, transient token bias",
    claim="In the transient, correlation loss tilts p towards the optimal token with the high "
          "score and logistic loss towards the one with the low score, more so as the score "
          "ratio C grows.",
    configs={
        "tiny": dict(Cs=[1, 2, 10], steps=40, lr=0.1, record_every=2, transient_step=40),
        "quick": dict(Cs=_C, steps=200, lr=0.1, record_every=2, transient_step=200),
        "full": dict(Cs=_C, steps=1000, lr=0.1, record_every=1, transient_step=200),
    },
    compute=compute, judge=judge, plot=plot,
)
