"""Next-token prediction: GD on one self-attention layer converges to the Graph-SVM
direction plus the finite soft-composition part (global and local convergence).

Li, Huang, Ildiz, Rawat, Oymak, "Mechanics of Next Token Prediction with Self-Attention"
(AISTATS 2024; public code: github.com/yixiao-huang/next-token-prediction, notebooks
``mc_next_single_layer_global_converge*.ipynb`` and ``..._local_converge.ipynb``).

ntp-global (the global notebooks): random datasets (``attnsvm.ntp.ntp_random``, the code's
``next_data`` with token_choice='random': unit-norm embeddings, distinct tokens per
sequence, realizable labels) at the published sizes n4T6K8d8, n6T4K6d8, n10T6K8d8, with a
cyclic priority graph (the code's check_asyc=False, which rejects draws without a cycle)
and with an acyclic one (``..._acyc.ipynb``).  The model: W, identity head (the attention
mass on each token id, ``cls_choice='iden'``), loss -log p(y) (``loss_type='nll'``), normalized
GD (``norm_grad=True``) from the nn.Linear default initialisation
(entries uniform in [-1/sqrt(d), 1/sqrt(d)]); lr 0.01 and 4000 steps as the acyclic
notebook at n4T6K8d8 (the cyclic notebook's stored run, n3T3K5, takes 1000).  Along the run: corr(W_t, W_svm), corr(W_t,
R W_svm + W_fin) (R fitted at the last step, the code's ``R_solver``) and the code's "norm
of difference" ||P_Sfin(W_t) - W_fin||; W_svm the certified Frobenius Graph-SVM, W_fin
the minimiser of the reduced loss (the code trains it from zero; here Newton to a
gradient of 1e-12).

ntp-local (the local notebook): n6T4K6d8, cyclic graphs, general head (logits E X^T s,
``cls_choice='gen'``), cross-entropy, normalized GD lr 0.1, 2000 steps.  After training,
the tokens a run selected (attention mass > 1e-2, ``C_thres``) become the labels of the
local Graph-SVM, tokens with mass in (9e-3, 1e-2] (``E_thres``) are left out, and the
local W_fin comes from the local graph.

Verdicts (per cell, over the population of seeds; the notebooks' own criterion): the
code raises "Correlation is too low" when max(corr(W_T, W_svm), corr(W_T, R W_svm +
W_fin)) < 0.95 at the last iteration (global notebooks: the global Graph-SVM; local
notebook: the local one), so the claim holds in a cell when every seed reaches 0.95.
The soft-composition claim (cyclic cells): ||P_Sfin(W_t) - W_fin|| decreases from
initialisation for every seed, or ends within lr of W_fin: a normalised step has length
lr, so NGD cannot resolve W_fin closer than about lr / 2 (the measure oscillates there),
and a start that is already that close cannot "decrease" (seen once in 20 quick seeds:
0.0024 at step 0, 0.0047 at the end).  Findings (attnsvm's, not the paper's): the relative
residual ||W_T - R W_svm/||W_svm|| - W_fin|| / ||W_T|| is at most 0.1 at the last step;
in ntp-local some runs converge to a local Graph-SVM that is not the global one; in ntp-kq
K Q^T ends nearer the nuclear Graph-SVM than the Frobenius one in >= 90% of seeds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.experiments.base import Check, Claim, Experiment
from attnsvm.ntp import PUBLISHED_SIZES, NTPData, NTPModel, decompose, ntp_random, w_fin
from attnsvm.ntp.model import ntp_tensors
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, label, save, subplots
from attnsvm.svm import graph_svm
from attnsvm.train import train

CORR = 0.95  # the notebooks' threshold ("Correlation is too low" below it)
C_THRES, E_THRES = 1e-2, 1e-2 - 1e-3  # the local notebook's selected / excluded masses

Q_GLOBAL = ("We prove that gradient descent implicitly discovers the strongly-connected "
            "components (SCC) of this graph and self-attention learns to retrieve the tokens "
            "that belong to the highest-priority SCC available in the context window.")
Q_DECOMP = ("Our theory relies on decomposing the model weights into a directional component "
            "and a finite component that correspond to hard retrieval and soft composition "
            "steps respectively.")
Q_SUPER = ("We empirically and theoretically demonstrate that superposition of these "
           "components can accurately predict the implicit bias of gradient descent in "
           "next-token prediction.")

WHERE = "Li, Huang, Ildiz, Rawat, Oymak (AISTATS 2024), abstract"
_CERT = Claim("every Graph-SVM is certified optimal (proven gap <= 1e-9)", kind="sanity")
CLAIMS_GLOBAL = {
    "global": Claim(
        f"every seed reaches max(corr(W_T, W_svm), corr(W_T, R W_svm + W_fin)) >= {CORR} at "
        "the last step (the public notebooks raise 'Correlation is too low' otherwise)",
        quote=Q_GLOBAL, where=WHERE + "; the global-convergence notebooks' test"),
    "decomp": Claim(
        "cyclic graphs: the notebooks' norm of difference ||P_Sfin(W_t) - W_fin|| decreases "
        "from initialisation, or ends within one normalised step (lr) of W_fin, in every seed",
        quote=Q_DECOMP, where=WHERE + "; the notebooks' 'norm of difference'"),
    "resid": Claim(
        "the superposition explains the trained W: median relative residual "
        "||W_T - R_T W_svm/||W_svm|| - W_fin|| / ||W_T|| <= 0.1 at the last step",
        kind="finding"),
    "cert": _CERT,
    "fin": Claim("every W_fin converged (reduced-loss gradient <= 1e-10)", kind="sanity"),
    "ties": Claim("cyclic datasets have tie (equality) rows, acyclic ones none", kind="sanity"),
}
CLAIMS_LOCAL = {
    "local": Claim(
        f"local convergence, measured as the public local notebook does: every seed reaches "
        f"max(corr(W_T, W_svm^loc), corr(W_T, R W_svm^loc + W_fin^loc)) >= {CORR}, W_svm^loc "
        "the Graph-SVM of the tokens the run selected (mass > 1e-2)",
        quote=Q_SUPER, where=WHERE + "; the local-convergence notebook's test"),
    "not_global": Claim(
        f"from random starts some runs converge to a local Graph-SVM that is not the global "
        f"one (share of seeds with global corr >= {CORR} below 1)", kind="finding"),
    "cert": Claim("every local Graph-SVM is certified optimal", kind="sanity"),
    "labels": Claim("the local labels are the selected tokens (at most T)", kind="sanity"),
}
CLAIMS_KQ = {
    "nuc": Claim(
        "(K, Q) training of the NTP layer: K Q^T ends closer to the nuclear Graph-SVM than to "
        "the Frobenius one in >= 90% of seeds (as (K, Q) reaches the nuclear ATT-SVM in "
        "classification)", kind="finding"),
    "cert": Claim("both Graph-SVMs of every dataset certified optimal", kind="sanity"),
    "differ": Claim("the two Graph-SVMs differ (median corr(W_fro, W_nuc) <= 0.9999; else the "
                    "question is void)", kind="sanity"),
}


def _init(d: int, S: int, seed) -> np.ndarray:
    """nn.Linear's default init: entries uniform in [-1/sqrt(d), 1/sqrt(d)], (S, d, d)."""
    b = 1.0 / np.sqrt(d)
    return np.random.default_rng(seed).uniform(-b, b, (S, d, d))


def _datasets(size, graph, S, seed, cell):
    n, T, K, d = size
    return [ntp_random(n, T, K, d, graph=graph, seed=[seed, cell, s]) for s in range(S)]


def _rows(cell, size_name, graph, s, steps, dec, loss, extra=None):
    out = pd.DataFrame({"cell": cell, "size": size_name, "graph": graph, "seed": s,
                        "step": steps, "loss": loss, **dec})
    for k, v in (extra or {}).items():
        out[k] = v
    return out


def compute_global(cfg: dict) -> dict[str, pd.DataFrame]:
    runs, sols = [], []
    cells = [(nm, g) for nm in cfg["sizes"] for g in cfg["graphs"]]
    for c, (nm, graph) in enumerate(cells):
        size = PUBLISHED_SIZES[nm]
        d = size[3]
        Ds = _datasets(size, graph, cfg["S"], cfg["seed"], c)
        svm = [graph_svm(D.E, D.seqs, D.y) for D in Ds]
        fins = [w_fin(D, head="iden") for D in Ds]
        tr = train(NTPModel(d, "W", "iden"), Ds, optimizer=ngd(cfg["lr"]), steps=cfg["steps"],
                       init={"W": _init(d, cfg["S"], [cfg["seed"], c, 99])},
                       record_every=cfg["record_every"], record_params=True)
        Wh = tr.param_history["W"]
        m = tr.metrics
        for s, (sol, fin) in enumerate(zip(svm, fins)):
            sols.append({"cell": c, "size": nm, "graph": graph, "seed": s, "status": sol.status_,
                         "gap": sol.gap_, "n_eq": sol.extra["n_equalities"],
                         "fin_converged": fin.converged, "fin_norm": float(np.linalg.norm(fin.W)),
                         "svm_norm": sol.norm_})
            if not sol.feasible_:
                continue
            dec = decompose(Wh[:, s], sol.W_, fin)
            runs.append(_rows(c, nm, graph, s, tr.record_steps, dec,
                              m.loc[m.trial == s, "loss"].to_numpy()))
    return {"runs": pd.concat(runs, ignore_index=True), "solutions": pd.DataFrame(sols)}


def _selected(model, W, D):
    """The local notebook's C_lst / E_lst: per sample the token ids with attention mass
    > C_THRES (labels of the local Graph-SVM) and the positions whose token has mass in
    (E_THRES, C_THRES] (left out)."""
    import torch

    t = ntp_tensors(D)
    s = model.attention({"W": torch.as_tensor(W)[None]}, t)[0].numpy()  # (n, T)
    K = D.K
    mass = np.zeros((D.n, K))
    np.add.at(mass, (np.repeat(np.arange(D.n), D.T), D.seqs.ravel()), s.ravel())
    sel = mass > C_THRES
    excl_tok = (mass > E_THRES) & ~sel
    L = int(sel.sum(1).max())
    Y = np.full((D.n, max(L, 1)), -1)
    for i in range(D.n):
        ids = np.nonzero(sel[i])[0]
        Y[i, :len(ids)] = ids
    exclude = excl_tok[np.arange(D.n)[:, None], D.seqs]
    return Y, exclude


def compute_local(cfg: dict) -> dict[str, pd.DataFrame]:
    nm = cfg["size"]
    size = PUBLISHED_SIZES[nm]
    d = size[3]
    S = cfg["S"]
    Ds = _datasets(size, "cyclic", S, cfg["seed"], 0)
    model = NTPModel(d, "W", "gen")
    tr = train(model, Ds, optimizer=ngd(cfg["lr"]), steps=cfg["steps"],
                   init={"W": _init(d, S, [cfg["seed"], 0, 99])},
                   record_every=cfg["record_every"], record_params=True)
    Wh = tr.param_history["W"]
    m = tr.metrics
    runs, sols = [], []
    for s, D in enumerate(Ds):
        Y, ex = _selected(model, Wh[-1, s], D)
        glob = graph_svm(D.E, D.seqs, D.y)
        loc = graph_svm(D.E, D.seqs, Y, exclude=ex)
        fin_g = w_fin(D, head="gen")
        fin_l = w_fin(D, head="gen", graph_labels=Y, exclude=ex)
        local_is_global = bool(np.array_equal(np.sort(Y, 1)[:, -1:], D.y[:, None])
                               and (Y >= 0).sum(1).max() == 1)
        sols.append({"seed": s, "status_global": glob.status_, "status_local": loc.status_,
                     "gap_local": loc.gap_, "fin_converged": fin_g.converged and fin_l.converged,
                     "n_selected_max": int((Y >= 0).sum(1).max()),
                     "selected_is_label": local_is_global})
        if not (glob.feasible_ and loc.feasible_):
            continue
        dg = decompose(Wh[:, s], glob.W_, fin_g)
        dl = decompose(Wh[:, s], loc.W_, fin_l)
        dec = {**{f"{k}_global": v for k, v in dg.items()}, **{f"{k}_local": v for k, v in dl.items()}}
        runs.append(_rows(0, nm, "cyclic", s, tr.record_steps, dec,
                          m.loc[m.trial == s, "loss"].to_numpy()))
    return {"runs": pd.concat(runs, ignore_index=True), "solutions": pd.DataFrame(sols)}


def compute_kq(cfg: dict) -> dict[str, pd.DataFrame]:
    """(K, Q) training (W = K Q^T, m = d, the iden head, normalized GD) on the global
    setting's datasets; per seed, corr(K Q^T, W) with the nuclear and the Frobenius
    Graph-SVMs along the run."""
    import torch

    rows, sols = [], []
    cells = [(nm, g) for nm in cfg["sizes"] for g in cfg["graphs"]]
    for c, (nm, graph) in enumerate(cells):
        size = PUBLISHED_SIZES[nm]
        d, S = size[3], cfg["S"]
        Ds = _datasets(size, graph, S, cfg["seed"], c)
        fro = [graph_svm(D.E, D.seqs, D.y, "fro") for D in Ds]
        nuc = [graph_svm(D.E, D.seqs, D.y, "nuc") for D in Ds]
        init = {"K": torch.as_tensor(_init(d, S, [cfg["seed"], c, 98])),
                "Q": torch.as_tensor(_init(d, S, [cfg["seed"], c, 97]))}
        tr = train(NTPModel(d, "KQ", "iden"), Ds, optimizer=ngd(cfg["lr"]), steps=cfg["steps"], init=init,
                       record_every=cfg["record_every"],
                       references={"fro": np.stack([f.W_ for f in fro]),
                                   "nuc": np.stack([u.W_ for u in nuc])})
        m = tr.metrics.assign(cell=c, size=nm, graph=graph).rename(columns={"trial": "seed"})
        rows.append(m)
        sols += [{"cell": c, "seed": s, "status_fro": f.status_, "status_nuc": u.status_,
                  "corr_fro_nuc": float(np.sum(f.direction_ * u.direction_))}
                 for s, (f, u) in enumerate(zip(fro, nuc))]
    return {"runs": pd.concat(rows, ignore_index=True), "solutions": pd.DataFrame(sols)}


def judge_kq(tables: dict, cfg: dict) -> list[Check]:
    runs, sols = tables["runs"], tables["solutions"]
    last = runs[runs.step == runs.step.max()]
    checks = []
    for (nm, graph), g in last.groupby(["size", "graph"]):
        checks.append(CLAIMS_KQ["nuc"].at_least(
            "share of seeds closer to W_svm^nuc", float((g.corr_nuc > g.corr_fro).mean()), 0.9,
            note=f"median corr nuc {g.corr_nuc.median():.4f}, fro {g.corr_fro.median():.4f}",
            claim=f"[{nm}, {graph}] {CLAIMS_KQ['nuc'].text}"))
    ok = float((sols.status_fro.eq("optimal") & sols.status_nuc.eq("optimal")).mean())
    checks.append(CLAIMS_KQ["cert"].at_least("fraction", ok, 1.0))
    checks.append(CLAIMS_KQ["differ"].at_most("median corr(W_fro, W_nuc)",
                                              float(sols.corr_fro_nuc.median()), 0.9999))
    return checks


def plot_kq(tables: dict, cfg: dict, out) -> list:
    runs = tables["runs"]
    fig, ax = subplots(1, 1, width=4.4, height=3.2)
    for i, ((nm, graph), g) in enumerate(runs.groupby(["size", "graph"])):
        q = g.groupby("step")[["corr_nuc", "corr_fro"]].median()
        ax[0].plot(q.index, q.corr_nuc, color=COLORS[i % len(COLORS)], label=f"{nm} {graph}")
        ax[0].plot(q.index, q.corr_fro, color=COLORS[i % len(COLORS)], ls="--")
    label(ax[0], "step", "median corr(K Q^T, W_svm)", "nuclear (solid) vs Frobenius (dashed)")
    return [save(fig, out, "ntp_kq")]


# ---------------------------------------------------------------------------- judge
def _last(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs.step == runs.groupby(["cell", "seed"]).step.transform("max")]


def _first(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs.step == runs.groupby(["cell", "seed"]).step.transform("min")]


def judge_global(tables: dict, cfg: dict) -> list[Check]:
    runs, sols = tables["runs"], tables["solutions"]
    checks = []
    last, first = _last(runs), _first(runs)
    for (c, nm, graph), g in last.groupby(["cell", "size", "graph"]):
        best = np.maximum(g.corr_svm.to_numpy(), g.corr_dec.to_numpy())
        frac = float((best >= CORR).mean()) if len(best) else float("nan")
        checks.append(CLAIMS_GLOBAL["global"].at_least(
            "fraction of seeds", frac, 1.0,
            note=f"{len(g)} seeds; min {best.min():.4f}, median {np.median(best):.4f}",
            claim=f"[{nm}, {graph}] {CLAIMS_GLOBAL['global'].text}"))
        if graph == "cyclic":
            f0 = first[(first.cell == c)].set_index("seed").fin_diff
            fT = g.set_index("seed").fin_diff
            ok = (fT < f0.reindex(fT.index)) | (fT <= cfg["lr"])
            checks.append(CLAIMS_GLOBAL["decomp"].at_least(
                "fraction of seeds", float(ok.mean()), 1.0,
                note=f"median ||P_Sfin W_T - W_fin|| = {fT.median():.3g} (from {f0.median():.3g}), "
                     f"max {fT.max():.3g}",
                claim=f"[{nm}, cyclic] {CLAIMS_GLOBAL['decomp'].text}"))
    for (nm, graph), g in last.groupby(["size", "graph"]):
        checks.append(CLAIMS_GLOBAL["resid"].at_most(
            "median relative residual", float(g.resid.median()), 0.1,
            note=f"max {g.resid.max():.3g}; median corr(W_T, W_svm) {g.corr_svm.median():.4f}",
            claim=f"[{nm}, {graph}] {CLAIMS_GLOBAL['resid'].text}"))
    ok = sols.status.eq("optimal")
    checks.append(CLAIMS_GLOBAL["cert"].at_least("fraction", float(ok.mean()), 1.0))
    checks.append(CLAIMS_GLOBAL["fin"].at_least("fraction", float(sols.fin_converged.mean()), 1.0))
    cyc = sols[sols.graph == "cyclic"]
    acy = sols[sols.graph == "acyclic"]
    checks.append(CLAIMS_GLOBAL["ties"].at_least(
        "fraction", float(np.mean(list(cyc.n_eq > 0) + list(acy.n_eq == 0))), 1.0))
    return checks


def judge_local(tables: dict, cfg: dict) -> list[Check]:
    runs, sols = tables["runs"], tables["solutions"]
    last = _last(runs)
    best = np.maximum(last.corr_svm_local.to_numpy(), last.corr_dec_local.to_numpy())
    bestg = np.maximum(last.corr_svm_global.to_numpy(), last.corr_dec_global.to_numpy())
    return [
        CLAIMS_LOCAL["local"].at_least(
            "fraction of seeds", float((best >= CORR).mean()), 1.0,
            note=f"{len(last)} seeds; min {best.min():.4f}, median {np.median(best):.4f}",
            claim=f"[{cfg['size']}, cyclic] {CLAIMS_LOCAL['local'].text}"),
        CLAIMS_LOCAL["not_global"].check(
            f"{float((bestg >= CORR).mean()):.2f} of seeds also reach the global Graph-SVM; "
            f"median global corr {np.median(bestg):.4f}", bool((bestg >= CORR).mean() < 1.0),
            note="the notebook prints 'Global Correlation is too low' for the others"),
        CLAIMS_LOCAL["cert"].at_least("fraction", float(sols.status_local.eq("optimal").mean()),
                                      1.0),
        CLAIMS_LOCAL["labels"].at_most("max selected per sample", float(sols.n_selected_max.max()),
                                       float(PUBLISHED_SIZES[cfg["size"]][1]), fmt=".0f"),
    ]


def _band(ax, g, col, color, lab):
    q = g.groupby("step")[col].quantile([0.1, 0.5, 0.9]).unstack()
    ax.plot(q.index, q[0.5], color=color, label=lab)
    ax.fill_between(q.index, q[0.1], q[0.9], color=color, alpha=0.2)


def plot_global(tables: dict, cfg: dict, out) -> list:
    runs = tables["runs"]
    fig, ax = subplots(2, 1, width=4.4, height=3.2)
    for i, ((nm, graph), g) in enumerate(runs.groupby(["size", "graph"])):
        _band(ax[0], g, "corr_svm", COLORS[i % len(COLORS)], f"{nm} {graph}")
        if graph == "cyclic":
            _band(ax[1], g, "fin_diff", COLORS[i % len(COLORS)], f"{nm}")
    ax[0].axhline(CORR, color="k", lw=0.8, ls="--")
    label(ax[0], "step", "corr(W_t, W_svm)", "hard retrieval")
    ax[1].set_yscale("log")
    label(ax[1], "step", "||P_Sfin W_t - W_fin||", "soft composition (cyclic)")
    return [save(fig, out, "ntp_global")]


def plot_local(tables: dict, cfg: dict, out) -> list:
    runs = tables["runs"]
    fig, ax = subplots(1, 1, width=4.4, height=3.2)
    _band(ax[0], runs, "corr_svm_local", COLORS[0], "local Graph-SVM")
    _band(ax[0], runs, "corr_svm_global", COLORS[1], "global Graph-SVM")
    ax[0].axhline(CORR, color="k", lw=0.8, ls="--")
    label(ax[0], "step", "corr(W_t, W_svm)", cfg["size"])
    return [save(fig, out, "ntp_local")]


_G = dict(sizes=tuple(PUBLISHED_SIZES), graphs=("cyclic", "acyclic"), lr=0.01, seed=0)
_L = dict(size="n6T4K6d8", lr=0.1, seed=0)
EXPERIMENTS = [
    Experiment(
        name="ntp-global",
        title="NTP global convergence: W_t ~ R W_svm + W_fin (cyclic and acyclic graphs)",
        claim="Normalized GD on one self-attention layer trained by next-token prediction "
              "converges in direction to the Graph-SVM of the token-priority graphs' SCCs, "
              "plus a finite soft-composition part W_fin inside the SCCs.",
        configs={
            "tiny": dict(_G, sizes=("n4T6K8d8",), S=2, steps=60, record_every=20),
            "quick": dict(_G, S=20, steps=4000, record_every=200),
            "full": dict(_G, S=100, steps=4000, record_every=20),
        },
        compute=compute_global, judge=judge_global, plot=plot_global,
        verdicts=tuple(CLAIMS_GLOBAL.values()),
        deviations=(
            "ntp-global: datasets and initialisations drawn with numpy (the code's "
            "distributions; its torch draws are not reproduced); populations of 20 (quick) / "
            "100 (full) datasets per cell instead of the notebooks' handful.",
            "ntp-global: 4000 steps at lr 0.01 in every cell (the acyclic notebook's setting at "
            "n4T6K8d8; the cyclic notebook's stored run is n3T3K5 with 1000 steps).",
            "ntp-global: W_fin is the exact minimiser of the reduced loss (Newton) instead of "
            "the notebook's W_fin trained by NGD alongside (same limit).",
        ),
    ),
    Experiment(
        name="ntp-local",
        title="NTP local convergence: W_t follows the Graph-SVM of the tokens it selects",
        claim="From random starts, normalized GD converges in direction to the Graph-SVM built "
              "from the tokens it selects (the local Graph-SVM), not always to the global one.",
        configs={
            "tiny": dict(_L, S=2, steps=60, record_every=20),
            "quick": dict(_L, S=20, steps=2000, record_every=40),
            "full": dict(_L, S=100, steps=2000, record_every=20),
        },
        compute=compute_local, judge=judge_local, plot=plot_local,
        verdicts=tuple(CLAIMS_LOCAL.values()),
        deviations=(
            "ntp-local: 20 (quick) / 100 (full) datasets instead of the notebook's 10 epochs; "
            "numpy draws.",
        ),
    ),
    Experiment(
        name="ntp-kq",
        title="NTP with (K, Q): which Graph-SVM norm does K Q^T reach? (attnsvm's question)",
        claim="attnsvm's own question, not the paper's: (K, Q) training of the NTP layer "
              "converges in direction to the nuclear-norm Graph-SVM rather than the Frobenius one.",
        configs={
            "tiny": dict(_G, sizes=("n4T6K8d8",), graphs=("acyclic",), S=2, steps=60, record_every=20),
            "quick": dict(_G, sizes=("n4T6K8d8",), S=20, steps=4000, record_every=200),
            "full": dict(_G, S=100, steps=4000, record_every=40),
        },
        compute=compute_kq, judge=judge_kq, plot=plot_kq, in_default=False,
        verdicts=tuple(CLAIMS_KQ.values()),
        deviations=("ntp-kq: no counterpart in the paper (its notebooks' factorize_w=False); "
                    "K and Q start from the nn.Linear default as W does.",),
    ),
]

__all__ = ["EXPERIMENTS", "compute_global", "judge_global", "compute_local", "judge_local",
           "NTPData"]
