"""Gradient flow on separate key and query weights (Sheen et al. 2024): nuclear / l_1 bias.

Setup: one attention layer with the fixed linear head v of the data, cross-attention
queries z_i, exponential loss, gradient flow from a small initialisation, no regulariser.
The paper proves that *when gradient flow achieves the minimal loss value*, W = K Q^T
converges in direction to the nuclear-norm ATT-SVM (not the Frobenius one that training W
directly gives), and that for diagonal weights W = diag(k * q) the limit is the l_1 SVM over
diagonal matrices, min ||w||_1 s.t. sum_j (x_{i,opt_i} - x_it)_j w_j z_ij >= 1 (docs/theory.md §5, §9).

Gradient-flow proxy: gradient flow and normalised GD with one global norm over all factors
trace the same curve (a change of time); the runs use ``ngd(rel, norm="global",
relative=True)``: every step moves the parameters by ``rel`` times their norm, small at the
small start, large once the loss is small. The steps are computed scale-free (the trainer
hands the gradient over in scaled form), so the flow goes on far past the float64 underflow
of the loss (L - L* ~ 10^(-10^20)) and the direction reached is the flow's, not the point
where a loss or a gradient norm underflowed. (Before the scale-free steps, the same runs
froze at L - L* ~ 1e-164 because sqrt(sum G^2) underflowed to 0: dataset seed 4 of
``kqflow-diag`` then read corr 0.52 with the l_1 SVM; it reaches 0.9995 now.)

Both experiments state the claim over a population of datasets (``random_sphere``, dataset
seeds 0..N-1, one draw each; quick runs the same population as full: the time goes into
the steps, not the datasets, and a smaller sample passed a check the full one fails): the
paper's theorem
applies to every dataset whose flow reaches the minimal loss (the optimal tokens are
selected, min_i s_{i,opt_i} -> 1), so the verdict asks for every such run (share 100%) and
lists the others.

``kqflow-diag``: n = 3, T = 3, d = 8; starts k = alpha 1, q = 0 for alpha in ``alphas``
(the claim is about the small ones, alpha <= ``small_alpha``). Diagnosis of a run that does
not reach the l_1 SVM: the l_1 SVM restricted to the support the run kept (coordinates with
|w_j| > 1e-3 max |w|) and its l_1 norm against the unrestricted one.

``kqflow-nuclear``: n = 6, T = 2, d = 6; (K, Q) with m = d, no ridge (the paper's flow).
The claim runs the theorem's own setting, singular spaces aligned with the data at the start
(``aligned_population``: attnsvm's construction, where the alignment provably persists and
is checked; there W_nuc = W_fro). Findings, beyond the theorem's assumption: a small random
balanced start K = Q (scale 0.01) on random_sphere data. Numerical rank: singular values >
RANK_RTOL * the largest. Diagnosis: for a run of lower rank than W_nuc, the nuclear SVM
restricted to that rank (``att_svm(norm="nuc", rank=r)``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnsvm import plotting as P
from attnsvm.data import TokenData, random_sphere, stack
from attnsvm.experiments.base import Claim, Experiment
from attnsvm.metrics import correlation, numerical_rank
from attnsvm.models import DiagModel, KQModel
from attnsvm.optim import ngd
from attnsvm.svm import att_svm
from attnsvm.train import train

CORR = 0.99         # "converged in direction" (docs/theory.md §7)
SAT = 0.99          # the flow reached the minimal loss: min_i s_{i,opt_i} >= 0.99
DISTINCT = 0.8      # the two candidate SVMs differ on a dataset: corr(W_a, W_b) <= 0.8
RANK_RTOL = 1e-2    # numerical rank: singular values > 1e-2 sigma_1
SUPPORT_RTOL = 1e-3  # support of a diagonal w: |w_j| > 1e-3 max |w|


def flow(model, data, init: dict, cfg: dict, refs: dict, record_params: bool = False):
    """Relative-step NGD (module docstring) for ``cfg["steps"]`` steps, ``cfg["records"]``
    records. Returns the ``Trajectory``."""
    return train(model, data, loss="exponential",
                 optimizer=ngd(cfg["rel"], norm="global", relative=True), steps=cfg["steps"],
                 init=init, references=refs, record_params=record_params,
                 record_every=max(1, cfg["steps"] // cfg["records"]))


def _datasets(cfg):
    """Dataset seeds seed * 1000 + (0..N-1), one ``random_sphere`` draw each (seed 0: 0..N-1)."""
    base = 1000 * int(cfg.get("seed", 0))
    return [random_sphere(cfg["n"], cfg["T"], cfg["d"], seed=base + s)
            for s in range(cfg["datasets"])]


def aligned_population(cfg):
    """Datasets whose features are aligned with orthonormal frames U, V, and the aligned start.

    The setting of the paper's general-(K, Q) result (weights' singular spaces aligned with
    the data features at initialisation), built so that the alignment provably persists along
    the flow: sequence i uses one coordinate pair j(i) = i mod ``groups``: its query is
    z_i = V e_j and its tokens x_it = U (m_i + a_it e_j) (m_i ~ N(0, I / d) with m_ij = 0,
    a_it ~ N(0, 1)), labels y = +1 and a unit head v, the column u_j signed so that
    v . u_j > 0. Then every token difference is along U e_j, so the gradient of the loss in
    W is U diag(g) V^T whenever W = U diag(w) V^T, and from K_0 = a U, Q_0 = a V (balanced,
    a = ``init_scale``) the flow keeps K = U diag(k), Q = V diag(k): it is the diagonal flow
    of w = k^2 in those frames. (There the nuclear and Frobenius SVMs coincide, U diag(c) V^T
    with c_j = max_i 1 / (a_i,opt - a_it) over the group's sequences: the aligned setting
    tests convergence to the nuclear SVM, not its contrast with the Frobenius one.)

    Returns (list of TokenData, U (N, d, d), V (N, d, d), init {"K", "Q"} (N, d, d))."""
    n, T, d, N, r = cfg["n"], cfg["T"], cfg["d"], cfg["datasets"], cfg["groups"]
    datas, Us, Vs = [], [], []
    for s in range(N):
        rng = np.random.default_rng([int(cfg.get("seed", 0)), s, 2024])
        U = np.linalg.qr(rng.standard_normal((d, d)))[0]
        V = np.linalg.qr(rng.standard_normal((d, d)))[0]
        v = rng.standard_normal(d)
        v /= np.linalg.norm(v)
        U = U * np.where(v @ U < 0, -1.0, 1.0)  # v . u_j > 0: the SVM asks w_j > 0
        j = np.arange(n) % r
        m = rng.standard_normal((n, d)) / np.sqrt(d)
        m[np.arange(n), j] = 0.0
        coef = m[:, None, :] + rng.standard_normal((n, T))[..., None] * np.eye(d)[j][:, None, :]
        datas.append(TokenData(X=coef @ U.T, y=np.ones(n), z=np.eye(d)[j] @ V.T, v=v))
        Us.append(U)
        Vs.append(V)
    U, V = np.stack(Us), np.stack(Vs)
    a = cfg["init_scale"]
    return datas, U, V, {"K": torch.as_tensor(a * U), "Q": torch.as_tensor(a * V)}


def offdiag_share(W, U, V):
    """||offdiag(U^T W V)||_F / ||W||_F per trial: 0 while the flow stays aligned."""
    W = W / np.maximum(np.abs(W).max((-2, -1), keepdims=True), 1e-300)  # ||W|| can pass 1e154
    D = np.swapaxes(U, -1, -2) @ W @ V
    off = D - D * np.eye(D.shape[-1])
    return np.linalg.norm(off, axis=(-2, -1)) / np.maximum(np.linalg.norm(W, axis=(-2, -1)), 1e-300)


def _diag_svm(data, norm, keep=None):
    """min ||w|| over diagonal W = diag(w): tokens x_it * z_i, query 1 (e = 1); ``keep``: a
    boolean mask of the coordinates allowed to be nonzero (the others fixed at 0). -> (d,),
    NaN if infeasible."""
    A = data.X * data.z[:, None, :]
    keep = np.ones(data.d, bool) if keep is None else np.asarray(keep, bool)
    sol = att_svm(A[..., keep], np.ones((data.n, 1)), data.opt, norm=norm)
    w = np.full(data.d, np.nan)
    if sol.feasible_:
        w[:] = 0.0
        w[keep] = sol.W_[:, 0]
    return w


def _corr(a, b) -> float:
    return float(correlation(np.asarray(a, float), np.asarray(b, float), vector=True))


# ------------------------------------------------------------------ kqflow-diag
def compute_diag(cfg):
    datas = _datasets(cfg)
    N, d, alphas = len(datas), cfg["d"], np.asarray(cfg["alphas"], float)
    w1 = np.stack([_diag_svm(x, "l1") for x in datas])
    w2 = np.stack([_diag_svm(x, "fro") for x in datas])
    runs = pd.DataFrame({"trial": np.arange(N * len(alphas)), "seed": np.tile(np.arange(N), len(alphas)),
                         "alpha": np.repeat(alphas, N)})
    data = stack(datas * len(alphas))  # trial = alpha index * N + dataset seed
    init = {"k": torch.as_tensor(np.repeat(alphas, N)[:, None] * np.ones((len(runs), d))),
            "q": torch.zeros(len(runs), d, dtype=torch.float64)}
    refs = {"l1": np.stack([np.diag(w) for w in np.nan_to_num(w1)] * len(alphas)),
            "l2": np.stack([np.diag(w) for w in np.nan_to_num(w2)] * len(alphas))}
    tr = flow(DiagModel(d), data, init, cfg, refs)
    curves = tr.metrics.merge(runs, on="trial")
    w = (tr.params["k"] * tr.params["q"]).numpy()
    rows = []
    for r in runs.itertuples():
        x, wl1, wr = datas[r.seed], w1[r.seed], w[r.trial]
        keep = np.abs(wr) > SUPPORT_RTOL * np.abs(wr).max()
        ws = _diag_svm(x, "l1", keep)
        rows.append(dict(trial=r.trial, support=int(keep.sum()),
                         support_l1=int((np.abs(wl1) > 1e-6 * np.abs(wl1).max()).sum()),
                         corr_support_l1=_corr(wr, ws),
                         support_l1_excess=float(np.abs(ws).sum() / np.abs(wl1).sum() - 1)))
    last = curves.loc[curves.groupby("trial").step.idxmax()]
    final = (last[["trial", "seed", "alpha", "step", "norm", "log10_gap", "corr_l1", "corr_l2",
                   "p_sel_min"]]
             .merge(pd.DataFrame(rows), on="trial")
             .assign(stop_reason=tr.stop_reason[last.trial.to_numpy()]).reset_index(drop=True))
    svm = pd.DataFrame({"seed": np.arange(N), "feasible": ~np.isnan(w1).any(1) & ~np.isnan(w2).any(1),
                        "corr_l1_l2": [_corr(a, b) for a, b in zip(w1, w2)],
                        "nnz_l1": (np.abs(w1) > 1e-6 * np.nanmax(np.abs(w1), 1, keepdims=True)).sum(1)})
    final = final.merge(svm[["seed", "corr_l1_l2"]], on="seed")
    return {"final": final, "curves": curves, "svm": svm}


def _list(df, cols, fmt=".3f", limit=8) -> str:
    items = [f"seed {int(r.seed)}: " + ", ".join(f"{c} {getattr(r, c):{fmt}}" for c in cols)
             for r in df.head(limit).itertuples()]
    return "; ".join(items) + (f"; ... ({len(df) - limit} more)" if len(df) > limit else "")


def _diag_l1_text(small_alpha: str) -> str:
    return (f"small starts (alpha <= {small_alpha}) that reach the minimal loss: "
            f"W = diag(k*q) -> the l_1 SVM (corr >= {CORR}) in every run")


def judge_diag(tables, cfg):
    f, svm = tables["final"], tables["svm"]
    small = f[f.alpha <= cfg["small_alpha"]]
    reach = small[small.p_sel_min >= SAT]
    missed = small[small.p_sel_min < SAT]
    cond = (f"{len(reach)} of {len(small)} small-start runs reach the minimal loss (the "
            f"theorem's condition)" + (f"; the others select non-optimal tokens: "
                                       f"{_list(missed, ['p_sel_min'])}" if len(missed) else ""))
    bad = reach[reach.corr_l1 < CORR]
    restricted = bad[(bad.corr_support_l1 >= CORR) & (bad.support_l1_excess > 1e-6)]
    diag = "" if not len(bad) else (
        f"; not at the l_1 SVM: {_list(bad, ['corr_l1', 'corr_l2', 'corr_support_l1'])}"
        + (f"; {len(restricted)} of them converge to the l_1 SVM restricted to the support "
           f"the run kept (a KKT point of the factorised problem that is not the global l_1 "
           f"SVM; l_1 norm {restricted.support_l1_excess.min():.1%}-"
           f"{restricted.support_l1_excess.max():.1%} above it)" if len(restricted) else ""))
    disc = reach[reach.corr_l1_l2 <= DISTINCT]
    closer = (disc.corr_l1 > disc.corr_l2)
    C = CLAIMS_DIAG
    return [
        C["feasible"].at_least("share of datasets", float(svm.feasible.mean()), 1.0, fmt=".2f",
                               note=f"{len(svm)} datasets; the l_1 and l_2 SVMs differ (corr <= "
                            f"{DISTINCT}) on {int((svm.corr_l1_l2 <= DISTINCT).sum())}"),
        C["l1"].at_least(
            "share of those runs", float((reach.corr_l1 >= CORR).mean()) if len(reach) else np.nan,
            1.0, fmt=".3f", note=cond + diag + f"; corr {CORR} is attnsvm's threshold",
            claim=_diag_l1_text(f"{cfg['small_alpha']:g}")),
        C["closer"].at_least(
            "share of those runs",
            float(closer.mean()) if len(disc) else np.nan, 1.0, fmt=".3f",
            note=f"{len(disc)} runs" + ("" if closer.all() else "; closer to l_2: " + _list(
                disc[~closer], ["corr_l1", "corr_l2"]))),
    ]


def _plot_diag(tables, cfg, out):
    c, f = tables["curves"], tables["final"]
    fig, ax = P.subplots(2, width=4.4, height=3.4)
    small = c[(c.alpha <= cfg["small_alpha"]) & (c.norm > 0)]
    reached = set(f[(f.alpha <= cfg["small_alpha"]) & (f.p_sel_min >= SAT)].trial)
    for trial, g in small.groupby("trial"):
        ok = trial in reached
        ax[0].plot(np.log10(g.norm), g.corr_l1, lw=1, alpha=0.7,
                   color=P.COLORS[0] if ok else P.COLORS[7], ls="-" if ok else ":")
    ax[0].plot([], [], color=P.COLORS[0], label="reaches the minimal loss")
    ax[0].plot([], [], color=P.COLORS[7], ls=":", label="selects other tokens")
    ax[0].axhline(CORR, color="k", lw=0.8, ls="--")
    P.label(ax[0], "log10 ||W||_F (flow time, reparametrised)", "corr(W, W_l1)",
            f"small starts alpha = {cfg['small_alpha']:g} ({len(reached)} of "
            f"{small.trial.nunique()} reach L*)")
    ax[0].legend(loc="lower right", fontsize=8)
    for i, (a, g) in enumerate(f.groupby("alpha")):
        ok = g.p_sel_min >= SAT
        ax[1].scatter(g.corr_l2[ok], g.corr_l1[ok], s=18, color=P.COLORS[i],
                      label=f"alpha = {a:g}")
        ax[1].scatter(g.corr_l2[~ok], g.corr_l1[~ok], s=18, facecolors="none",
                      edgecolors=P.COLORS[i], label=f"alpha = {a:g}, other tokens" if (~ok).any()
                      else None)
    lim = [min(0, float(f[["corr_l1", "corr_l2"]].min().min())), 1.0]
    ax[1].plot(lim, lim, "k--", lw=0.8, label="equal")
    P.label(ax[1], "final corr(W, W_l2)", "final corr(W, W_l1)",
            f"{f.seed.nunique()} datasets: l_1 vs l_2 SVM")
    ax[1].legend(loc="lower right", fontsize=7)
    return [P.save(fig, out, "kqflow_diag")]


# ------------------------------------------------------------------ kqflow-nuclear
def compute_nuclear(cfg):
    datas = _datasets(cfg)
    N, d = len(datas), cfg["d"]
    sols = {nm: [att_svm(x.X, x.z, x.opt, norm=nm) for x in datas] for nm in ("nuc", "fro")}
    model = KQModel(d, m=d, reg=cfg["reg"])
    init = model.init(N, seed=cfg["init_seed"] + 1000 * int(cfg.get("seed", 0)),
                      scale=cfg["init_scale"], kind="balanced")
    refs = {nm: np.stack([np.nan_to_num(s.W_) for s in v]) for nm, v in sols.items()}
    tr = flow(model, stack(datas), init, cfg, refs, record_params=True)
    steps = tr.record_steps
    flat = {k: torch.as_tensor(v.reshape(-1, *v.shape[2:])) for k, v in tr.param_history.items()}
    W = model.W(flat).numpy().reshape(len(steps), N, d, d)
    sv = np.linalg.svd(W / np.maximum(np.abs(W).max((2, 3), keepdims=True), 1e-300),
                       compute_uv=False)
    sv = sv / np.maximum(sv[..., :1], 1e-300)
    spectrum = pd.DataFrame({"step": np.repeat(steps, N * d),
                             "trial": np.tile(np.repeat(np.arange(N), d), len(steps)),
                             "k": np.tile(np.arange(d), len(steps) * N), "sv_rel": sv.reshape(-1)})
    m = tr.metrics.rename(columns={"trial": "seed"})
    Wf = tr.W
    rank = numerical_rank(Wf, RANK_RTOL)
    rows = []
    for s, x in enumerate(datas):
        r_nuc = int(numerical_rank(sols["nuc"][s].W_, RANK_RTOL))
        low = np.nan
        if rank[s] < r_nuc:  # diagnosis: the nuclear SVM restricted to the run's rank
            low = _corr(Wf[s].ravel(), att_svm(x.X, x.z, x.opt, norm="nuc", rank=int(rank[s])).W_.ravel())
        rows.append(dict(seed=s, rank=int(rank[s]), rank_nuc=r_nuc,
                         rank_fro=int(numerical_rank(sols["fro"][s].W_, RANK_RTOL)),
                         corr_nuc_fro=_corr(sols["nuc"][s].W_.ravel(), sols["fro"][s].W_.ravel()),
                         corr_rank_restricted=low,
                         feasible=bool(sols["nuc"][s].feasible_ and sols["fro"][s].feasible_)))
    last = m.loc[m.groupby("seed").step.idxmax(), ["seed", "step", "norm", "norm_nuc", "log10_gap",
                                                   "corr_nuc", "corr_fro", "p_sel_min"]]
    final = last.merge(pd.DataFrame(rows), on="seed").assign(stop_reason=tr.stop_reason)
    return {"final": final.reset_index(drop=True), "curves": m, "spectrum": spectrum,
            "aligned": compute_aligned(cfg)}


def compute_aligned(cfg):
    """The paper's general-(K, Q) setting (``aligned_population``): the flow from the aligned
    start, against the nuclear and Frobenius SVMs of the optimal tokens. One row per dataset."""
    datas, U, V, init = aligned_population(cfg)
    sols = {nm: [att_svm(x.X, x.z, x.opt, norm=nm) for x in datas] for nm in ("nuc", "fro")}
    refs = {nm: np.stack([np.nan_to_num(s.W_) for s in v]) for nm, v in sols.items()}
    model = KQModel(cfg["d"], m=cfg["d"], reg=cfg["reg"])
    tr = flow(model, stack(datas), init, cfg, refs)
    m = tr.metrics
    last = m.loc[m.groupby("trial").step.idxmax(), ["trial", "step", "norm", "log10_gap",
                                                    "corr_nuc", "corr_fro", "p_sel_min"]]
    Wf = tr.W
    return last.rename(columns={"trial": "seed"}).reset_index(drop=True).assign(
        offdiag=offdiag_share(Wf, U, V), rank=numerical_rank(Wf, RANK_RTOL),
        rank_nuc=[int(numerical_rank(s.W_, RANK_RTOL)) if s.feasible_ else -1 for s in sols["nuc"]],
        corr_nuc_fro=[_corr(a.W_.ravel(), b.W_.ravel()) if a.feasible_ and b.feasible_ else np.nan
                      for a, b in zip(sols["nuc"], sols["fro"])],
        feasible=[bool(a.feasible_ and b.feasible_) for a, b in zip(sols["nuc"], sols["fro"])],
        stop_reason=tr.stop_reason)


QUOTE = {
    "nuc": "Under a separability assumption on the data, we show that when gradient flow "
           "achieves the minimal loss value, it further implicitly minimizes the nuclear norm of "
           "the product of the key and query weight matrices.",
    "aligned": "Moreover, the results are extended to general weights configurations given "
               "proper alignment of the weight matrices' singular spaces with the data features "
               "at initialization.",
    "diag": "For diagonal key and query matrices, our analysis builds upon the "
            "reparameterization technique and exploits approximate KKT conditions of the SVM "
            "associated with the classification data.",
}
WHERE = {"aligned": "the general-weights theorem (abstract; seed text 004), in its setting: "
                    "singular spaces aligned with the data at initialisation",
         "diag": "the diagonal-weights theorem (abstract; seed text 004): W = diag(k * q) -> "
                 "the l_1-norm ATT-SVM over diagonal matrices"}


CLAIMS_DIAG = {
    "feasible": Claim("the diagonal ATT-SVM is feasible on every dataset (the separability "
                      "assumption)", kind="sanity"),
    "l1": Claim(_diag_l1_text("small_alpha"), quote=QUOTE["diag"], where=WHERE["diag"]),
    "closer": Claim(f"... and ends closer to the l_1 SVM than to the l_2 one, on every dataset "
                    f"where the two differ (corr(w_l1, w_l2) <= {DISTINCT})",
                    quote=QUOTE["nuc"] + " [...] " + QUOTE["diag"], where=WHERE["diag"]),
}
"""kqflow-diag's declared verdicts, in the order ``judge_diag`` returns their checks."""

_BEYOND = " (random balanced start K = Q on random data: beyond the theorem's alignment)"
CLAIMS_NUCLEAR = {
    "aligned_feasible": Claim("aligned setting: the nuclear ATT-SVM is feasible on every dataset",
                              kind="sanity"),
    "aligned_stays": Claim("aligned setting: the flow stays aligned (||offdiag(U^T K Q^T V)|| / "
                           "||K Q^T|| <= 1e-8 in every run), as the theorem's assumption implies",
                           kind="sanity"),
    "aligned_nuc": Claim(f"aligned setting: runs that reach the minimal loss: K Q^T -> the "
                         f"nuclear-norm SVM (corr >= {CORR}) in every run",
                         quote=QUOTE["aligned"], where=WHERE["aligned"]),
    "random_feasible": Claim("random data: both ATT-SVMs (nuclear, Frobenius) are feasible on "
                             "every dataset", kind="sanity"),
    "random_nuc": Claim(f"random starts that reach the minimal loss: K Q^T -> the nuclear-norm "
                        f"SVM (corr >= {CORR}) in every run" + _BEYOND, kind="finding"),
    "random_closer": Claim(f"random starts: K Q^T ends closer to W_nuc than to W_fro on every "
                           f"dataset where the two differ (corr(W_nuc, W_fro) <= {DISTINCT})",
                           kind="finding"),
    "random_rank": Claim(f"random starts: numerical rank of K Q^T (rtol {RANK_RTOL:g}) equals "
                         "rank(W_nuc) in every run that reaches the minimal loss", kind="finding"),
    "random_lower": Claim("random starts: K Q^T has lower rank than W_fro in every run that "
                          "reaches the minimal loss", kind="finding"),
}
"""kqflow-nuclear's declared verdicts, in the order ``judge_nuclear`` returns their checks."""


def judge_nuclear(tables, cfg):
    """Claim (the theorem's own setting, ``aligned``): the aligned flow that reaches the
    minimal loss ends at the nuclear SVM (corr >= CORR) in every run; sanity: the SVMs are
    feasible and the flow stays aligned. Findings (``final``: random balanced starts on
    random data, beyond the theorem's alignment assumption): the same convergence, closer to
    W_nuc than to W_fro, the rank of W_nuc, a lower rank than W_fro."""
    al, f = tables["aligned"], tables["final"]
    a_reach = al[al.p_sel_min >= SAT]
    a_miss = al[al.p_sel_min < SAT]
    a_bad = a_reach[a_reach.corr_nuc < CORR]
    C = CLAIMS_NUCLEAR
    checks = [
        C["aligned_feasible"].at_least(
            "share of datasets", float(al.feasible.mean()), 1.0, fmt=".2f",
            note=f"{len(al)} datasets; there W_nuc = W_fro (smallest corr "
                 f"{al.corr_nuc_fro.min():.6f}): the aligned setting tests convergence to "
                 "the nuclear SVM, not its contrast with the Frobenius one"),
        C["aligned_stays"].at_most(
            "largest off-diagonal share", float(al.offdiag.max()), 1e-8, fmt=".2g",
            note="otherwise the run does not test the theorem's setting"),
        C["aligned_nuc"].at_least(
            "share of those runs",
            float((a_reach.corr_nuc >= CORR).mean()) if len(a_reach) else np.nan, 1.0,
            fmt=".3f", note=f"{len(a_reach)} of {len(al)} runs reach the minimal loss (the "
            f"theorem's condition)" + (f"; the others: {_list(a_miss, ['p_sel_min'])}"
                                       if len(a_miss) else "")
            + f"; min corr {a_reach.corr_nuc.min():.5f}" + (
                f"; not at W_nuc: {_list(a_bad, ['corr_nuc'])}" if len(a_bad) else "")
            + "; corr 0.99 is attnsvm's threshold"),
    ]
    reach = f[f.p_sel_min >= SAT]
    missed = f[f.p_sel_min < SAT]
    cond = (f"random starts: {len(reach)} of {len(f)} runs reach the minimal loss"
            + (f"; the others: {_list(missed, ['p_sel_min'])}" if len(missed) else ""))
    bad = reach[reach.corr_nuc < CORR]
    lowr = bad[bad["rank"] < bad.rank_nuc]
    diag = "" if not len(bad) else (
        f"; not at W_nuc: {_list(bad, ['corr_nuc', 'corr_fro'])}"
        + (f"; of lower rank than W_nuc (rank {sorted(set(lowr['rank']))} vs "
           f"{sorted(set(lowr.rank_nuc))}): {_list(lowr, ['corr_rank_restricted'])} "
           "(corr with the nuclear SVM restricted to that rank)" if len(lowr) else ""))
    disc = reach[reach.corr_nuc_fro <= DISTINCT]
    closer = disc.corr_nuc > disc.corr_fro
    same_rank = reach["rank"] == reach.rank_nuc
    lower = reach["rank"] < reach.rank_fro
    return checks + [
        C["random_feasible"].at_least(
            "share of datasets", float(f.feasible.mean()), 1.0, fmt=".2f",
            note=f"rank(W_nuc) < rank(W_fro) on {int((f.rank_nuc < f.rank_fro).sum())}"
                 f" of {len(f)} datasets; corr(W_nuc, W_fro) <= {DISTINCT} on "
                 f"{int((f.corr_nuc_fro <= DISTINCT).sum())}"),
        C["random_nuc"].at_least(
            "share of those runs",
            float((reach.corr_nuc >= CORR).mean()) if len(reach) else np.nan, 1.0,
            fmt=".3f", note=cond + diag),
        C["random_closer"].at_least(
            "share of those runs", float(closer.mean()) if len(disc) else np.nan, 1.0,
            fmt=".3f", note=f"{len(disc)} runs" + ("" if closer.all() else "; closer to W_fro: "
                                                   + _list(disc[~closer], ["corr_nuc", "corr_fro"]))),
        C["random_rank"].at_least(
            "share of those runs", float(same_rank.mean()) if len(reach) else np.nan, 1.0,
            fmt=".3f", note="" if same_rank.all() else "rank differs: " + _list(
                reach[~same_rank], ["rank", "rank_nuc"], fmt="d")),
        C["random_lower"].at_least(
            "share of those runs", float(lower.mean()) if len(reach) else np.nan, 1.0,
            fmt=".3f", note=f"ranks of K Q^T: {sorted(set(reach['rank']))}; W_fro: "
                            f"{sorted(set(reach.rank_fro))}"),
    ]


def _plot_nuclear(tables, cfg, out):
    c, f, sp = tables["curves"], tables["final"], tables["spectrum"]
    fig, ax = P.subplots(3, width=4.2, height=3.4)
    for s, g in c[c.norm > 0].groupby("seed"):
        ax[0].plot(np.log10(g.norm), g.corr_nuc, color=P.COLORS[0], lw=1, alpha=0.7,
                   label="corr with W_nuc" if s == 0 else None)
        ax[0].plot(np.log10(g.norm), g.corr_fro, color=P.COLORS[1], lw=1, ls=":", alpha=0.7,
                   label="corr with W_fro" if s == 0 else None)
    ax[0].axhline(CORR, color="k", lw=0.8, ls="--")
    P.label(ax[0], "log10 ||K Q^T||_F (flow time, reparametrised)", "correlation",
            f"{len(f)} datasets: K Q^T against the two SVMs")
    ax[0].legend(loc="lower right", fontsize=8)
    ax[1].scatter(f.corr_fro, f.corr_nuc, s=18, color=P.COLORS[0])
    ax[1].plot([0, 1], [0, 1], "k--", lw=0.8, label="equal")
    P.label(ax[1], "final corr(K Q^T, W_fro)", "final corr(K Q^T, W_nuc)", "end of the flow")
    last = sp[sp.step == sp.step.max()]
    x = np.arange(1, int(sp.k.max()) + 2)
    for s, g in last.groupby("trial"):
        ax[2].semilogy(x, np.maximum(g.sv_rel, 1e-17), "-", color=P.COLORS[2], lw=0.8, alpha=0.6,
                       label="trained K Q^T" if s == 0 else None)
    ax[2].axhline(RANK_RTOL, color="k", ls="--", lw=1, label=f"rank tolerance {RANK_RTOL:g}")
    ranks = f[["rank", "rank_nuc", "rank_fro"]].mean()
    P.label(ax[2], "k", "sigma_k / sigma_1", f"final spectra (mean rank: K Q^T {ranks['rank']:.2f}, "
            f"W_nuc {ranks.rank_nuc:.2f}, W_fro {ranks.rank_fro:.2f})")
    ax[2].title.set_fontsize(8)
    return [P.save(fig, out, "kqflow_nuclear")]


_FLOW = dict(rel=0.02, records=100)
_DIAG = dict(n=3, T=3, d=8, alphas=(0.01, 1.0), small_alpha=0.01, steps=3000, seed=0, **_FLOW)
_NUC = dict(n=6, T=2, d=6, init_scale=0.01, init_seed=0, reg=0.0, steps=9000, groups=3, seed=0, **_FLOW)
_GF = ("Gradient flow is simulated by NGD with a relative step rel = 0.02 of the parameter "
       "norm (one global norm; a change of time along the flow); the flow is run to a fixed "
       "length in log-norm, far past the float64 range of the loss, not to t = infinity.")
EXPERIMENTS = [
    Experiment(
        name="kqflow-diag",
        title="Diagonal (k, q) gradient flow: W = diag(k*q) -> the l_1 SVM, not the l_2 one",
        claim="Gradient flow on diagonal key/query weights from a small start (k = a, q = 0) "
              "that reaches the minimal loss converges in direction to the l_1-norm ATT-SVM "
              "over diagonal matrices, not to the l_2 one.",
        configs={
            "tiny": dict(_DIAG, datasets=2, alphas=(0.01,), steps=400, records=40, rel=0.1),
            "quick": dict(_DIAG, datasets=96),  # the cost is per step, not per dataset
            "full": dict(_DIAG, datasets=96),
        },
        compute=compute_diag, judge=judge_diag, plot=_plot_diag,
        verdicts=tuple(CLAIMS_DIAG.values()),
        deviations=(
            "Population of datasets instead of one chosen instance (the earlier version used "
            "dataset seed 6 only): random_sphere(n = 3, T = 3, d = 8) seeds 1000 seed + 0..N-1; the paper's "
            "own data and start are not in the seed text (abstract only) nor in the stored "
            "public code; the start k = alpha 1, q = 0 (w = k * q = 0, the 'u^2 - v^2' "
            "reparameterisation that lets w take either sign) is attnsvm's choice, kept from "
            "the earlier version; the runs with alpha = 1 are shown, not judged. Smaller "
            "starts do not close the gap (full population, measured 2026-11-25): alpha = 1e-4 "
            "reaches the l_1 SVM in 17 of 24 loss-minimising runs (3000 steps) and 20 of 25 "
            "(6000 steps), alpha = 1e-6 in 18 of 24 (6000 steps).",
            "96 datasets (32 before 2026-11-26): about 15% of the small-start runs that reach "
            "the minimal loss miss the l_1 SVM (20 of 133 over five seed offsets of the 32), so "
            "32 datasets found no miss at one offset (1001) of five and the verdict hung on "
            "the seed (docs/seed-stability.md).",
            _GF,
        )),
    Experiment(
        name="kqflow-nuclear",
        title="(K, Q) gradient flow from an aligned start: K Q^T -> the nuclear-norm SVM "
              "(random starts and the rank contrast with W_fro: findings)",
        claim="Gradient flow on separate key and query matrices whose initial singular spaces "
              "are aligned with the data features, once it reaches the minimal loss, converges "
              "in direction to the nuclear-norm ATT-SVM (findings: from random balanced starts "
              "too, and to a lower rank than the Frobenius SVM).",
        configs={
            "tiny": dict(_NUC, datasets=2, steps=400, records=40, rel=0.1),
            "quick": dict(_NUC, datasets=48),  # the cost is per step, not per dataset
            "full": dict(_NUC, datasets=48),
        },
        compute=compute_nuclear, judge=judge_nuclear, plot=_plot_nuclear,
        verdicts=tuple(CLAIMS_NUCLEAR.values()),
        deviations=(
            "Population of datasets (random_sphere(n = 6, T = 2, d = 6) seeds 1000 seed + "
            "0..N-1) instead of the one chosen instance (seed 7) of the earlier version; 48 "
            "datasets (16 before 2026-11-26, where only 5-6 per seed offset had W_nuc and W_fro "
            "apart and the random-start findings flipped with the seed: docs/seed-stability.md).",
            "No ridge: the paper's flow is unregularised. The earlier version added the "
            "float64-eps ridge of the TF-as-SVM literature, which stops the flow at the "
            "minimiser of L + eps ||(K, Q)||^2 (a point of the regularisation path, ||W|| ~ 1e2) "
            "instead of following it to the limit; measured with that ridge (and the earlier "
            "trainer) 15 of 16 datasets read corr >= 0.99 with W_nuc at ||W|| ~ 1e2 (seed 3: "
            "0.81). Without it, halving the step twice (rel 0.01, 0.005) moved the final corr "
            "by < 1e-3 on seeds 1, 3, 7 (0.988, 0.978, 0.958): the shortfall is the flow's.",
            "The paper's general (K, Q) result assumes the initial singular spaces aligned with "
            "the data features; its exact data and start are not in the seed text (abstract "
            "only). The claim runs attnsvm's construction of that setting (aligned_population: "
            "each sequence's query and token differences along one pair of columns of "
            "orthonormal frames U, V; start K_0 = 0.01 U, Q_0 = 0.01 V, balanced; N datasets), "
            "where the alignment provably persists (checked) and the nuclear and Frobenius SVMs "
            "coincide. The random balanced start K = Q on random_sphere data (the earlier "
            "population) does not satisfy the assumption: its verdicts are findings.",
            _GF,
        )),
]
