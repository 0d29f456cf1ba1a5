"""Gradient flow on separate key and query weights (Sheen et al. 2024): nuclear / l_1 bias.

Setup: one attention layer with the fixed linear head v of the data, cross-attention
queries z_i, exponential loss, gradient flow from a small initialisation. The paper
proves that when the loss is driven to its infimum, W = K Q^T converges in direction to
the nuclear-norm ATT-SVM (not the Frobenius one that training W directly gives), and that
for diagonal weights W = diag(k * q) the limit is the l_1 SVM over diagonal matrices,
min ||w||_1 s.t. sum_j (x_{i,opt_i} - x_it)_j w_j z_ij >= 1 (THEORY §5, §9).

Gradient-flow proxy: gradient flow and normalized GD with one global norm over all
factors trace the same curve (a change of time), so the runs use NGD (``ngd(norm=
"global")``) with a step rel * ||theta|| per trial (rel = 1%: every step moves the
parameters by 1% of their norm, whatever their scale), re-set every ``stage`` steps.
Small steps at the small start, large ones once the loss is small; halving rel does not
change the results (checked when the experiment was written).
TODO(engine): a relative-step rule in attnsvm.optim would replace the stage loop.

``kqflow-diag``: random_sphere(n=3, T=3, d=8, seed=6), chosen because its l_1 and l_2
diagonal SVMs differ clearly (correlation 0.67; the l_1 one has 3 nonzeros of 8). Starts
k = a, q = 0 with a = alpha * 1 (every coordinate alike) for several alpha, plus random-shape
a (alpha * sqrt(d) * unit Gaussian): coordinates with small |a_j| start late (w_j grows like
a_j^2 t), and such runs may reach the float64 limit of the exponential loss (the gradient
underflows to exactly 0 and the run stops) before aligning with the l_1 SVM.

``kqflow-nuclear``: random_sphere(n=6, T=2, d=6, seed=7): rank(W_nuc) = 1, rank(W_fro) = 6,
correlation 0.65. (K, Q) with m = d from a small balanced start K = Q, with the float64-eps
ridge of the literature (KQModel's default): the flow then settles at the minimiser of
L + eps(|K|^2 + |Q|^2), a nuclear-norm-regularised solution (exactly low rank, direction
within ~1e-4 of W_nuc). Numerical rank: singular values > RANK_RTOL * the largest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnsvm import plotting as P
from attnsvm.data import random_sphere
from attnsvm.experiments.base import Check, Experiment, check_at_least, check_at_most
from attnsvm.metrics import correlation, numerical_rank
from attnsvm.models import DiagModel, KQModel
from attnsvm.optim import ngd
from attnsvm.svm import att_svm
from attnsvm.train import train

CORR = 0.99         # "converged in direction" (THEORY §7)
SAT = 0.99          # every sequence selects its optimal token: min_i s_{i,opt_i} >= 0.99
DISTINCT = 0.8      # the two candidate SVMs must differ: corr(W_a, W_b) <= 0.8
RANK_RTOL = 1e-2    # ~ the runs' directional accuracy (1 - corr ~ 1e-4, distance ~ 1e-2)


def gradient_flow(model, data, init: dict, cfg: dict, refs: dict, record_params=False):
    """Relative-step NGD in stages (module docstring). Returns (metrics, params, W history)."""
    params, frames, hist, offset = init, [], [], 0
    for k in range(cfg["stages"]):
        first = next(iter(params.values()))
        nrm = torch.sqrt(sum(t.reshape(len(t), -1).pow(2).sum(1) for t in params.values()))
        lr = cfg["rel"] * nrm.reshape(-1, *([1] * (first.ndim - 1)))
        tr = train(model, data, loss="exponential", optimizer=ngd(lr, norm="global"),
                   steps=cfg["stage"], init=params, references=refs, record_params=record_params,
                   record_every=cfg["stage"] // cfg["records_per_stage"])
        m = tr.metrics if k == 0 else tr.metrics[tr.metrics.step > 0]
        frames.append(m.assign(step=m.step + offset))
        if record_params:
            flat = {n: torch.as_tensor(v.reshape(-1, *v.shape[2:]))  # (R * B, ...)
                    for n, v in tr.param_history.items()}
            W = model.W(flat).numpy().reshape(len(tr.record_steps), -1, model.d, model.d)
            hist.append((tr.record_steps[(k > 0):] + offset, W[(k > 0):]))
        params, offset = tr.params, offset + tr.steps_run
        if tr.stopped.all():
            break
    return pd.concat(frames, ignore_index=True), params, hist


def _diag_svm(data, norm):
    """min ||w|| over diagonal W = diag(w): tokens x_it * z_i, query 1 (e = 1)."""
    sol = att_svm(data.X * data.z[:, None, :], np.ones((data.n, 1)), data.opt, norm=norm)
    return sol.W_[:, 0]


# ------------------------------------------------------------------ kqflow-diag
def compute_diag(cfg):
    data = random_sphere(cfg["n"], cfg["T"], cfg["d"], seed=cfg["seed"])
    w1, w2 = _diag_svm(data, "l1"), _diag_svm(data, "fro")
    d, alphas, nr = cfg["d"], np.asarray(cfg["alphas"], float), cfg["n_random"]
    rng = np.random.default_rng(cfg["seed"])
    a_rand = rng.standard_normal((nr, d))
    a_rand *= cfg["alpha_random"] * np.sqrt(d) / np.linalg.norm(a_rand, axis=1, keepdims=True)
    k0 = np.concatenate([alphas[:, None] * np.ones((len(alphas), d)), a_rand])
    runs = pd.DataFrame({"trial": np.arange(len(k0)),
                         "init": ["uniform"] * len(alphas) + ["random shape"] * nr,
                         "alpha": np.concatenate([alphas, np.full(nr, cfg["alpha_random"])])})
    init = {"k": torch.as_tensor(k0), "q": torch.zeros(len(k0), d, dtype=torch.float64)}
    m, params, _ = gradient_flow(DiagModel(d), data, init, cfg,
                                 {"l1": np.diag(w1), "l2": np.diag(w2)})
    curves = m.merge(runs, on="trial")
    last = curves.loc[curves.groupby("trial").step.idxmax()]
    w = (params["k"] * params["q"]).numpy()
    coords = pd.DataFrame({"trial": np.repeat(runs.trial, d), "j": np.tile(np.arange(d), len(w)),
                           "w": w.reshape(-1)})
    svm = pd.DataFrame({"j": np.arange(d), "w_l1": w1, "w_l2": w2})
    final = last[["trial", "init", "alpha", "step", "norm", "corr_l1", "corr_l2", "p_sel_min",
                  "loss_gap", "stopped"]].reset_index(drop=True)
    return {"final": final, "curves": curves, "coords": coords, "svm": svm}


def judge_diag(tables, cfg):
    f, svm = tables["final"], tables["svm"]
    c12 = float(correlation(svm.w_l1.to_numpy(), svm.w_l2.to_numpy()))
    uni, rnd = f[f.init == "uniform"], f[f.init == "random shape"]
    small = uni[uni.alpha <= cfg["small_alpha"]]
    checks = [
        check_at_most(f"the setting separates the predictions: corr(w_l1, w_l2) <= {DISTINCT}",
                      "corr(w_l1, w_l2)", c12, DISTINCT,
                      note=f"nonzeros: l_1 {int((svm.w_l1.abs() > 1e-6 * svm.w_l1.abs().max()).sum())}"
                           f", l_2 {int((svm.w_l2.abs() > 1e-6 * svm.w_l2.abs().max()).sum())}"),
        check_at_least(f"every run selects the optimal tokens (min_i s_opt >= {SAT})",
                       "min over runs", float(f.p_sel_min.min()), SAT),
        check_at_least(f"small uniform starts (alpha <= {cfg['small_alpha']:g}): W = diag(k*q) -> "
                       f"the l_1 SVM (corr >= {CORR})", "min corr(W, W_l1)",
                       float(small.corr_l1.min()), CORR,
                       note="; ".join(f"alpha = {r.alpha:g}: {r.corr_l1:.4f} (l_2: {r.corr_l2:.4f})"
                                      for r in uni.itertuples())),
        Check("every uniform start ends closer to the l_1 SVM than to the l_2 SVM",
              f"corr(W, W_l1) - corr(W, W_l2) >= {float((uni.corr_l1 - uni.corr_l2).min()):.4f}",
              bool((uni.corr_l1 > uni.corr_l2).all())),
    ]
    if len(rnd):
        checks.append(Check(
            "random-shape small starts: the median run is closer to the l_1 SVM than to the l_2 one",
            f"median corr with l_1: {rnd.corr_l1.median():.4f}, with l_2: {rnd.corr_l2.median():.4f}",
            bool(rnd.corr_l1.median() > rnd.corr_l2.median()),
            note=f"{int((rnd.corr_l1 >= CORR).sum())} of {len(rnd)} reach corr >= {CORR} before "
                 "the loss underflows (coordinates with small |a_j| start late)"))
    return checks


def _plot_diag(tables, cfg, out):
    c, f, svm, co = tables["curves"], tables["final"], tables["svm"], tables["coords"]
    fig, ax = P.subplots(3, width=4.2, height=3.3)
    for i, (_, g) in enumerate(c[c.init == "uniform"].groupby("trial")):
        g = g[g.norm > 0]
        col = P.COLORS[i % len(P.COLORS)]
        ax[0].plot(g.norm, g.corr_l1, color=col, label=f"alpha = {g.alpha.iat[0]:g}")
        ax[0].plot(g.norm, g.corr_l2, color=col, ls=":")
    for _, g in c[c.init == "random shape"].groupby("trial"):
        g = g[g.norm > 0]
        ax[1].plot(g.norm, g.corr_l1, color=P.COLORS[0], alpha=0.6, lw=1)
        ax[1].plot(g.norm, g.corr_l2, color=P.COLORS[1], alpha=0.6, lw=1, ls=":")
    ax[1].plot([], [], color=P.COLORS[0], label="corr with l_1 SVM")
    ax[1].plot([], [], color=P.COLORS[1], ls=":", label="corr with l_2 SVM")
    ax[0].plot([], [], color="k", ls=":", label="(dotted: corr with l_2 SVM)")
    for a, t in zip(ax[:2], ["uniform start k = alpha 1, q = 0 (solid: l_1)",
                             "random-shape starts |a| = alpha sqrt(d)"]):
        a.set_xscale("log")
        P.label(a, "||W||_F (flow time, reparametrised)", "correlation", t)
    best = f[f.init == "uniform"].sort_values("alpha").trial.iat[0]
    w = co[co.trial == best].w.to_numpy()
    x = np.arange(len(svm))
    for k, (vec, name) in enumerate([(svm.w_l1, "l_1 SVM"), (svm.w_l2, "l_2 SVM"),
                                     (w, "trained diag(k*q), smallest alpha")]):
        v = np.asarray(vec, float)
        ax[2].bar(x + (k - 1) * 0.27, v / np.abs(v).max(), width=0.27, color=P.COLORS[k], label=name)
    ax[2].set_ylim(-1.1, 1.75)
    P.label(ax[2], "coordinate j", "w_j / max_j |w_j|", "diagonal of W: trained vs SVMs",
            legend=False)
    ax[2].legend(loc="upper right")
    return [P.save(fig, out, "kqflow_diag")]


# ------------------------------------------------------------------ kqflow-nuclear
def compute_nuclear(cfg):
    data = random_sphere(cfg["n"], cfg["T"], cfg["d"], seed=cfg["seed"])
    sols = {nm: att_svm(data.X, data.z, data.opt, norm=nm) for nm in ("nuc", "fro")}
    model = KQModel(cfg["d"], m=cfg["d"])
    init = model.init(cfg["B"], seed=cfg["seed"], scale=cfg["init_scale"], kind="balanced")
    m, params, hist = gradient_flow(model, data, init, cfg,
                                    {nm: s.W_ for nm, s in sols.items()}, record_params=True)
    steps = np.concatenate([h[0] for h in hist])
    W = np.concatenate([h[1] for h in hist])  # (R, B, d, d)
    sv = np.linalg.svd(W, compute_uv=False)
    sv = sv / np.maximum(sv[..., :1], 1e-300)
    R, B, d = sv.shape
    spectrum = pd.DataFrame({"step": np.repeat(steps, B * d), "trial": np.tile(np.repeat(
        np.arange(B), d), R), "k": np.tile(np.arange(d), R * B), "sv_rel": sv.reshape(-1)})
    Wf = model.W(params).numpy()
    final = m.loc[m.groupby("trial").step.idxmax(), ["trial", "step", "norm", "norm_nuc",
                                                     "corr_nuc", "corr_fro", "p_sel_min"]]
    final = final.assign(rank=numerical_rank(Wf, RANK_RTOL)).reset_index(drop=True)
    svm = pd.DataFrame([dict(norm=nm, rank=int(numerical_rank(s.W_, RANK_RTOL)),
                             norm_value=s.norm_, corr_nuc_fro=float(correlation(
                                 sols["nuc"].W_, sols["fro"].W_)), **{f"sv{k}": v for k, v in
                             enumerate(np.linalg.svd(s.W_, compute_uv=False) /
                                       np.linalg.svd(s.W_, compute_uv=False)[0])})
                        for nm, s in sols.items()])
    return {"final": final, "curves": m, "spectrum": spectrum, "svm": svm}


def judge_nuclear(tables, cfg):
    f, svm = tables["final"], tables["svm"].set_index("norm")
    r_nuc, r_fro = int(svm.loc["nuc", "rank"]), int(svm.loc["fro", "rank"])
    c = float(svm.loc["nuc", "corr_nuc_fro"])
    ranks = sorted(f["rank"].unique().tolist())
    return [
        Check(f"the setting separates the predictions: rank(W_nuc) < rank(W_fro) and "
              f"corr(W_nuc, W_fro) <= {DISTINCT}",
              f"ranks {r_nuc} and {r_fro} (rtol {RANK_RTOL:g}); corr {c:.3f}",
              bool(r_nuc < r_fro and c <= DISTINCT)),
        check_at_least(f"every run selects the optimal tokens (min_i s_opt >= {SAT})",
                       "min over runs", float(f.p_sel_min.min()), SAT),
        check_at_least(f"K Q^T -> the nuclear-norm SVM (corr >= {CORR}, every run)",
                       "min corr(KQ^T, W_nuc)", float(f.corr_nuc.min()), CORR),
        Check("K Q^T is closer to W_nuc than to W_fro in every run",
              f"max corr(KQ^T, W_fro) = {f.corr_fro.max():.4f} < min corr(KQ^T, W_nuc) = "
              f"{f.corr_nuc.min():.4f}" if (f.corr_nuc > f.corr_fro).all()
              else f"{int((f.corr_nuc <= f.corr_fro).sum())} runs closer to W_fro",
              bool((f.corr_nuc > f.corr_fro).all())),
        Check(f"numerical rank of K Q^T (rtol {RANK_RTOL:g}) equals rank(W_nuc) and is <= "
              "rank(W_fro) in every run",
              f"ranks of K Q^T: {ranks}; W_nuc: {r_nuc}; W_fro: {r_fro}",
              bool((f["rank"] == r_nuc).all() and (f["rank"] <= r_fro).all()),
              note=f"after {int(f.step.max())} steps"),
    ]


def _plot_nuclear(tables, cfg, out):
    c, sp, svm = tables["curves"], tables["spectrum"], tables["svm"].set_index("norm")
    fig, ax = P.subplots(3, width=4.2, height=3.3)
    for trial, g in c.groupby("trial"):
        g = g[g.step > 0]
        ax[0].plot(g.step, g.corr_nuc, color=P.COLORS[0], lw=1,
                   label="corr with W_nuc" if trial == 0 else None)
        ax[0].plot(g.step, g.corr_fro, color=P.COLORS[1], lw=1, ls=":",
                   label="corr with W_fro" if trial == 0 else None)
    ax[0].set_xscale("log")
    P.label(ax[0], "iteration (relative-step NGD)", "correlation", "K Q^T against the two SVMs")
    g = sp[(sp.trial == 0) & (sp.step > 0)]
    for k, gk in g.groupby("k"):
        if k > 0:
            ax[1].plot(gk.step, gk.sv_rel, color=P.COLORS[k % len(P.COLORS)], label=f"sigma_{k + 1}")
    ax[1].axhline(RANK_RTOL, color="k", ls="--", lw=1, label=f"rank tolerance {RANK_RTOL:g}")
    ax[1].set_xscale("log")
    ax[1].set_yscale("log")
    P.label(ax[1], "iteration", "sigma_k / sigma_1 of K Q^T", "spectrum over training (run 0)")
    last = sp[sp.step == sp.step.max()]
    d = int(sp.k.max()) + 1
    x = np.arange(1, d + 1)
    for i, nm in enumerate(("nuc", "fro")):
        ax[2].semilogy(x, np.maximum([svm.loc[nm, f"sv{k}"] for k in range(d)], 1e-17), "o-",
                       color=P.COLORS[i], label=f"W_{nm} (rank {svm.loc[nm, 'rank']})")
    for trial, g in last.groupby("trial"):
        ax[2].semilogy(x, np.maximum(g.sv_rel, 1e-17), "x", color=P.COLORS[2],
                       label="trained K Q^T" if trial == 0 else None)
    ax[2].axhline(RANK_RTOL, color="k", ls="--", lw=1)
    P.label(ax[2], "k", "sigma_k / sigma_1", "final singular values")
    return [P.save(fig, out, "kqflow_nuclear")]


_FLOW = dict(rel=0.01, records_per_stage=5)
EXPERIMENTS = [
    Experiment(
        name="kqflow-diag",
        title="Diagonal (k, q) gradient flow: W = diag(k*q) -> the l_1 SVM, not the l_2 one",
        claim="Gradient flow on diagonal key/query weights from a small unbalanced start "
              "(k = a, q = 0) converges in direction to the l_1-norm ATT-SVM over diagonal "
              "matrices, not to the l_2 one.",
        configs={
            "tiny": dict(n=3, T=3, d=8, seed=6, alphas=(0.01,), n_random=1, alpha_random=0.01,
                         small_alpha=0.01, stages=8, stage=25, **_FLOW),
            "quick": dict(n=3, T=3, d=8, seed=6, alphas=(0.001, 0.01, 0.1, 1.0), n_random=6,
                          alpha_random=0.01, small_alpha=0.01, stages=60, stage=50, **_FLOW),
            "full": dict(n=3, T=3, d=8, seed=6, alphas=(1e-4, 1e-3, 0.01, 0.1, 1.0), n_random=32,
                         alpha_random=0.01, small_alpha=0.01, stages=150, stage=100,
                         **dict(_FLOW, rel=0.005)),
        },
        compute=compute_diag, judge=judge_diag, plot=_plot_diag),
    Experiment(
        name="kqflow-nuclear",
        title="(K, Q) gradient flow: K Q^T -> the nuclear-norm SVM, of lower rank than W_fro",
        claim="Gradient flow on separate key and query matrices from a small balanced start "
              "converges in direction to the nuclear-norm ATT-SVM, a lower-rank solution than "
              "the Frobenius one that training W directly gives.",
        configs={
            "tiny": dict(n=6, T=2, d=6, seed=7, B=1, init_scale=0.01, stages=6, stage=25, **_FLOW),
            "quick": dict(n=6, T=2, d=6, seed=7, B=4, init_scale=0.01, stages=40, stage=50, **_FLOW),
            "full": dict(n=6, T=2, d=6, seed=7, B=16, init_scale=0.01, stages=120, stage=100,
                         **dict(_FLOW, rel=0.005)),
        },
        compute=compute_nuclear, judge=judge_nuclear, plot=_plot_nuclear),
]
