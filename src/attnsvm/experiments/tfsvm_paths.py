"""Transformers as SVMs, Figure 1: W-training finds the Frobenius SVM, (K, Q)-training the
nuclear one.

Setup (the paper's ``visualization`` notebook, re-drawn with numpy): cross-attention with
n = 2 sequences of T = 3 tokens in d = 2, linear head v, labels y = (+1, +1):
x_it = 0.3 N(0, I_2) + (-1, 0) for sequence 0 and + (+1, 0) for sequence 1, queries z_i and
head v uniform on the unit circle (``paths_dataset(seed)``). The seed is fixed to one where
the two max-margin directions differ clearly (corr(W_fro, W_nuc) ~ 0.9 and
rank(W_fro) = 2 > rank(W_nuc) = 1), so that "which one does GD find" has a visible answer.

Both parameterisations are trained by normalized GD (lr 0.1, per-tensor norm, logistic
loss, 2000 steps): W from W_0 = 0, (K, Q) (m = d) from the paper's unbalanced start
K_0 random (||K_0||_F = 0.1), Q_0 = 0, with the literature's eps(||K||^2 + ||Q||^2).
Both SVMs use the optimal tokens alpha = opt (y_i v^T x_it largest).

Claim (Theorem 2 / Sec. 3): W_t / ||W_t|| -> W_fro / ||W_fro|| (Frobenius-norm ATT-SVM),
K_t Q_t^T / ||.|| -> W_nuc / ||W_nuc|| (nuclear-norm ATT-SVM). The 2-d panels draw the
key direction each query induces, W z_i / ||W||_F (the logits are x^T (W z_i)).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.data import TokenData
from attnsvm.experiments.base import Check, Experiment, check_at_least, check_at_most
from attnsvm.metrics import correlation
from attnsvm.models import KQModel, WModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, label, save, subplots
from attnsvm.svm import att_svm
from attnsvm.train import train

CORR = 0.99  # directional convergence: corr(W_T, W_svm) >= 0.99 at the last step
DISTINCT = 0.95  # the setup is informative only if corr(W_fro, W_nuc) <= 0.95
MODELS = {"W": "W (combined)", "KQ": "(K, Q), W = K Q^T"}
ENTRIES = ["w11", "w12", "w21", "w22"]


def paths_dataset(seed: int = 20) -> TokenData:
    """n = 2, T = 3, d = 2: two clusters of tokens at (-1, 0) and (+1, 0) (noise 0.3), unit
    queries z_i and head v, y = (+1, +1) (the paper's recipe; numpy generator)."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(2)
    X = 0.3 * rng.standard_normal((2, 3, 2)) + np.array([[[-1.0, 0.0]], [[1.0, 0.0]]])
    z = rng.standard_normal((2, 2))
    return TokenData(X=X, y=np.ones(2), z=z / np.linalg.norm(z, axis=1, keepdims=True),
                     v=v / np.linalg.norm(v))


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    data = paths_dataset(cfg["seed"])
    sols = {nm: att_svm(data.X, data.z, y=data.y, v=data.v, norm=nm) for nm in ("fro", "nuc")}
    refs = {nm: s.W_ for nm, s in sols.items()}
    runs = {
        "W": (WModel(2), dict(init="zero")),
        "KQ": (KQModel(2), dict(init="unbalanced", scale=0.1, seed=cfg["seed"])),
    }
    paths = []
    for name, (model, kw) in runs.items():
        tr = train(model, data, optimizer=ngd(cfg["lr"]), steps=cfg["steps"], references=refs,
                   record_every=cfg["record_every"], record_params=True, **kw)
        H = tr.param_history
        W = H["W"][:, 0] if name == "W" else H["K"][:, 0] @ H["Q"][:, 0].transpose(0, 2, 1)
        df = tr.metrics.drop(columns="trial").assign(model=name)
        df[ENTRIES] = W.reshape(len(W), 4)
        paths.append(df)
    toks = [dict(seq=i, token=t, x1=data.X[i, t, 0], x2=data.X[i, t, 1], z1=data.z[i, 0],
                 z2=data.z[i, 1], opt=bool(t == data.opt[i]), score=data.gamma[i, t])
            for i in range(data.n) for t in range(data.T)]
    svm = pd.DataFrame([dict(norm=nm, feasible=s.feasible_, norm_value=s.norm_, rank=s.rank(1e-6),
                             margin=s.margin_, solver=s.solver_, **dict(zip(ENTRIES, s.W_.ravel())))
                        for nm, s in sols.items()])
    svm["corr_fro_nuc"] = float(correlation(refs["fro"], refs["nuc"]))
    return {"path": pd.concat(paths, ignore_index=True), "svm": svm, "tokens": pd.DataFrame(toks)}


def _final(path: pd.DataFrame, model: str) -> pd.Series:
    d = path[path.model == model]
    return d.loc[d.step.idxmax()]


def judge(tables: dict, cfg: dict) -> list[Check]:
    path, svm = tables["path"], tables["svm"]
    w, kq = _final(path, "W"), _final(path, "KQ")
    sat = f"min selected-token probability: W {w.p_sel_min:.6f}, KQ {kq.p_sel_min:.6f} " \
          f"after {int(w.step)} steps"
    cfn = float(svm.corr_fro_nuc.iloc[0])
    return [
        check_at_most(f"The setup separates the two predictions: corr(W_fro, W_nuc) <= {DISTINCT}",
                      "corr(W_fro, W_nuc)", cfn, DISTINCT,
                      "ranks: " + ", ".join(f"{r.norm} {r.rank}" for r in svm.itertuples())),
        check_at_least(f"W-training converges to the Frobenius SVM: corr(W_T, W_fro) >= {CORR}",
                       "corr(W_T, W_fro)", w.corr_fro, CORR, sat),
        check_at_least("W_T is closer to W_fro than to W_nuc", "corr(W_T, W_fro) - corr(W_T, W_nuc)",
                       w.corr_fro - w.corr_nuc, 0.0, f"corr with W_nuc = {w.corr_nuc:.4f}"),
        check_at_least(f"(K, Q)-training converges to the nuclear SVM: corr(K_T Q_T^T, W_nuc) >= "
                       f"{CORR}", "corr(KQ^T, W_nuc)", kq.corr_nuc, CORR, sat),
        check_at_least("K_T Q_T^T is closer to W_nuc than to W_fro",
                       "corr(KQ^T, W_nuc) - corr(KQ^T, W_fro)", kq.corr_nuc - kq.corr_fro, 0.0,
                       f"corr with W_fro = {kq.corr_fro:.4f}"),
    ]


def _keydir(W: np.ndarray, z: np.ndarray, scale: float) -> np.ndarray:
    """scale * W z / ||W||_F for W (..., 2, 2), z (2,)."""
    nrm = np.linalg.norm(W, axis=(-2, -1), keepdims=True)[..., 0]
    return scale * (W @ z) / np.where(nrm > 0, nrm, 1.0)


def plot(tables: dict, cfg: dict, out) -> list:
    path, svm, toks = tables["path"], tables["svm"], tables["tokens"]
    fig, ax = subplots(3, 1, width=4.0, height=3.7)
    Wsvm = {r.norm: np.array([[r.w11, r.w12], [r.w21, r.w22]]) for r in svm.itertuples()}
    seq_col = [COLORS[0], COLORS[1]]
    L = 1.6  # length scale of the drawn directions
    for j, (m, title) in enumerate(MODELS.items()):
        a = ax[j]
        for r in toks.itertuples():
            a.scatter(r.x1, r.x2, s=110 if r.opt else 35, marker="*" if r.opt else "o",
                      color=seq_col[r.seq], edgecolor="k", lw=0.5, zorder=3,
                      label=(f"tokens of X_{r.seq + 1} (star: optimal)" if r.token == 0 else None))
        d = path[(path.model == m) & (path.norm > 0)].sort_values("step")
        Wt = d[ENTRIES].to_numpy().reshape(-1, 2, 2)
        for i, g in toks.groupby("seq"):
            z = g[["z1", "z2"]].to_numpy()[0]
            for nm, ls in (("fro", "-"), ("nuc", ":")):
                e = _keydir(Wsvm[nm], z, L)
                a.plot([0, e[0]], [0, e[1]], ls, color=seq_col[i], lw=2,
                       label="W_fro z_i (Frobenius SVM)" if (i == 0 and nm == "fro") else
                       "W_nuc z_i (nuclear SVM)" if (i == 0 and nm == "nuc") else None)
            p = _keydir(Wt, z, L)
            a.plot(p[:, 0], p[:, 1], color=seq_col[i], lw=1, alpha=0.6,
                   label="path W_t z_i / ||W_t|| (o: start)" if i == 0 else None)
            a.plot(*p[0], "o", ms=4, mfc="white", color=seq_col[i])
            a.annotate("", xy=p[-1], xytext=p[max(0, len(p) - 4)],
                       arrowprops=dict(arrowstyle="->", color=seq_col[i], lw=1.2))
        a.set_aspect("equal", adjustable="datalim")
        label(a, "coordinate 1", "coordinate 2", f"({'ab'[j]}) {title}")
    c = ax[2]
    for j, m in enumerate(MODELS):
        d = path[(path.model == m) & (path.step > 0)]
        for nm, ls in (("fro", "-"), ("nuc", "--")):
            c.plot(d.step, np.clip(1 - d[f"corr_{nm}"], 1e-16, None), ls, color=COLORS[2 + j],
                   label=f"{m}: 1 - corr(., W_{nm})")
    c.set_xscale("log")
    c.set_yscale("log")
    label(c, "iteration t", "1 - correlation", "(c) convergence in direction")
    return [save(fig, out, "tfsvm_paths")]


EXPERIMENT = Experiment(
    name="tfsvm-paths",
    title="Figure 1: W converges to the Frobenius SVM, (K, Q) to the nuclear-norm SVM",
    claim="Gradient descent on the combined W converges in direction to the Frobenius-norm "
          "ATT-SVM solution, while gradient descent on (K, Q) converges to the nuclear-norm "
          "ATT-SVM solution (a lower-rank direction).",
    configs={
        "tiny": dict(seed=20, lr=0.1, steps=100, record_every=5),
        "quick": dict(seed=20, lr=0.1, steps=2000, record_every=10),
        "full": dict(seed=20, lr=0.1, steps=2000, record_every=1),
    },
    compute=compute, judge=judge, plot=plot,
)
