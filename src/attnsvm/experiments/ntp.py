"""Next-token prediction: GD on one self-attention layer converges to the Graph-SVM
direction plus the finite soft-composition part (global and local convergence).

Li, Huang, Ildiz, Rawat, Oymak, "Mechanics of Next Token Prediction with Self-Attention"
(AISTATS 2024, PMLR 238; public code: github.com/yixiao-huang/next-token-prediction, the
notebooks ``mc_next_single_layer_global_converge*.ipynb`` and ``..._local_converge.ipynb``,
the plotting of ``visualizer.py::show_corr`` / ``show_norm_diff`` and the published
figures ``figures/Papers/*`` of commit 0d105ef).  The paper states an asymptotic theorem;
its figures show the mean over a handful of trials of corr(W_t, W_svm) (``show_corr``:
mean +- std over the runs) along the iterations.  So a paper claim here is judged as those
figures present it, at the cells they were drawn at: the mean over seeds at the figure's
last step, with the spread (std) reported.

ntp-global: random datasets (``attnsvm.ntp.ntp_random``, the code's ``next_data`` with
token_choice='random': unit-norm embeddings, distinct tokens per sequence, realizable
labels) with a cyclic priority graph (check_asyc=False, draws without a cycle rejected) or
an acyclic one (``..._acyc.ipynb``).  The model: W, identity head (the attention mass on
each token id, ``cls_choice='iden'``), loss -log p(y) (``loss_type='nll'``), normalized GD
(``norm_grad=True``) from the nn.Linear default initialisation (entries uniform in
[-1/sqrt(d), 1/sqrt(d)]).  The published correlation figures (``PUBLISHED``): acyclic
n4T6K8d8 (lr 0.01, 4,000 iterations), acyclic n6T4K6d8 (lr 0.1, 2,000: the figure
``corr_asyc_log_n6T4K6d8_pos_0.1``), cyclic n6T4K6d8 and cyclic n10T6K8d8 (lr 0.01,
4,000); the norm-of-difference figures: cyclic n6T4K6d8 and n10T6K8d8.  Cells without a
published figure (acyclic n10T6K8d8, cyclic n4T6K8d8: ``UNPUBLISHED``) give findings only.
Along the run: corr(W_t, W_svm), corr(W_t, R W_svm + W_fin) (R fitted at the last step,
the code's ``R_solver``) and the code's "norm of difference" ||P_Sfin(W_t) - W_fin||; W_svm
the certified Frobenius Graph-SVM, W_fin the minimiser of the reduced loss (the code trains
it from zero; here Newton to a gradient of 1e-12).

ntp-local: the published local figures (``local_corr_cyc_{ce,ls}_0.1_n4T6K8d8_pos``):
n4T6K8d8, cyclic graphs, general head (logits E X^T s, ``cls_choice='gen'``), normalized GD
lr 0.1, 2,000 iterations, cross-entropy (the ``ce`` figure; the notebook at the
repository's HEAD uses ``lsq2``, whose figure is not reproduced: declared).  After
training, the tokens a run selected (attention mass > 1e-2, ``C_thres``) become the labels
of the local Graph-SVM and the local W_fin; tokens with mass in (9e-3, 1e-2] (``E_thres``)
are left out of the SVM rows (declared: the public code leaves them out of the Tarjan
graph only).

Verdicts.  Paper claims (published cells): hard retrieval, the mean over seeds of
corr(W_T, W_svm) at the figure's last step >= 0.95 (``TAU``); soft composition (cyclic,
the norm-of-difference figures): the mean over seeds of ||P_Sfin(W_t) - W_fin|| falls to
at most a tenth of its value at initialisation by the last step (the published curves fall
by about 25x).  TAU = 0.95: every published mean curve ends above it (about 0.99, 0.99 and
0.975 for the acyclic n4T6K8d8, cyclic n6T4K6d8 and cyclic n10T6K8d8 figures); the paper
states no finite threshold (its theorem is asymptotic).  Each claim quotes the abstract of
the cited version (AISTATS 2024); it states no local-convergence result, so ntp-local's
verdicts are findings: at the local figure's cell, the mean over seeds of corr(W_T,
W_svm^loc) >= 0.95.  Findings (attnsvm's, not the paper's): the public code's per-run guard
applied to every seed (the global notebook at HEAD raises "Correlation is too low" when
max(corr(W_T, W_svm), corr(W_T, R W_svm + W_fin)) < 0.9 (``GUARD_GLOBAL``); at commit
0d105ef the acyclic notebook only prints at 0.9 (its raise commented out) and the one-run
cyclic notebook (n3T3K5) raised at 0.95; the local notebook raises below 0.95
(``GUARD_LOCAL``)); the
same statistics at the unpublished cells; the seeds below TAU continued (NGD has no state,
so the continuation is exact) to the step at which they cross it; the finite part
recovered on the draws whose W_fin is not zero (||P_Sfin(W_T) - W_fin|| / ||W_fin||); in
ntp-local, runs that converge to a local Graph-SVM that is not the global one; in ntp-kq,
K Q^T nearer the nuclear Graph-SVM than the Frobenius one in >= 90% of seeds.
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

TAU = 0.95  # the mean correlation the published figures reach (module docstring)
GUARD_GLOBAL = 0.9  # the global notebook at HEAD raises "Correlation is too low" below it
GUARD_LOCAL = 0.95  # the local notebook raises "Correlation is too low" below it
FALL = 0.1  # the norm-of-difference figures: the mean falls to at most this fraction
FIN_ZERO = 1e-9  # ||W_fin|| at or below it: W_fin = 0 (no cyclic SCC with a finite part)
C_THRES, E_THRES = 1e-2, 1e-2 - 1e-3  # the local notebook's selected / excluded masses

# (size, graph, lr, steps, published figure of github.com/yixiao-huang/next-token-prediction
# at commit 0d105ef, figures/Papers/)
PUBLISHED = (
    ("n4T6K8d8", "acyclic", 0.01, 4000, "corr_asyc_log_n4T6K8d8_pos"),
    ("n6T4K6d8", "acyclic", 0.1, 2000, "corr_asyc_log_n6T4K6d8_pos_0.1"),
    ("n6T4K6d8", "cyclic", 0.01, 4000, "corr_cyc_log_n6T4K6d8_pos, norm_diff_cyc_log_n6T4K6d8"),
    ("n10T6K8d8", "cyclic", 0.01, 4000, "corr_cyc_log_n10T6K8d8_pos, norm_diff_cyc_log_n10T6K8d8"),
)
UNPUBLISHED = (
    ("n10T6K8d8", "acyclic", 0.01, 4000, ""),
    ("n4T6K8d8", "cyclic", 0.01, 4000, ""),
)

# The paper's sentences (AISTATS 2024 / PMLR 238 abstract, the version CITATION.cff cites;
# stored in tests/data/paper_excerpts/ntp.txt and checked there).
Q_GLOBAL = ("We prove that gradient descent implicitly discovers the strongly-connected "
            "components (SCC) of this graph and self-attention learns to retrieve the tokens "
            "that belong to the highest-priority SCC available in the context window.")
Q_DECOMP = ("(2) Soft composition: It then creates a convex combination of the high-priority "
            "tokens from which the next token can be sampled. [...] Our theory relies on "
            "decomposing the model weights into a directional component and a finite component "
            "that correspond to hard retrieval and soft composition steps respectively.")
WHERE = "Li, Huang, Ildiz, Rawat, Oymak (AISTATS 2024), abstract"
_CERT = Claim("every Graph-SVM is certified optimal (proven gap <= 1e-9)", kind="sanity")
CLAIMS_GLOBAL = {
    "global": Claim(
        f"published cells: the mean over seeds of corr(W_T, W_svm) at the figure's last step "
        f">= {TAU} (the published mean curves end at 0.975-0.99; std reported)",
        quote=Q_GLOBAL, where=WHERE + "; the correlation figures figures/Papers/corr_* of the "
        "public code (show_corr: mean +- std over runs)"),
    "decomp": Claim(
        f"published cyclic cells: the mean over seeds of the norm of difference "
        f"||P_Sfin(W_t) - W_fin|| falls to <= {FALL} x its mean at initialisation by the "
        "figure's last step",
        quote=Q_DECOMP, where=WHERE + "; the norm-of-difference figures figures/Papers/"
        "norm_diff_cyc_log_n6T4K6d8, norm_diff_cyc_log_n10T6K8d8 (show_norm_diff: mean over "
        "runs)"),
    "guard": Claim(
        f"the public global notebook's per-run guard, on every seed: max(corr(W_T, W_svm), "
        f"corr(W_T, R W_svm + W_fin)) >= {GUARD_GLOBAL} (it raises 'Correlation is too low' "
        "below; the paper shows means over a handful of runs)", kind="finding"),
    "unpublished": Claim(
        f"cells without a published figure: the mean over seeds of corr(W_T, W_svm) at the "
        f"last step >= {TAU}, as at the published cells", kind="finding"),
    "slow": Claim(
        f"the seeds below {TAU} at the last step are slow, not wrong: continued (NGD, same lr), "
        f"each reaches corr(W_t, W_svm) >= {TAU} within the continuation budget", kind="finding"),
    "fin_rel": Claim(
        "cyclic cells, only the draws whose W_fin is not zero (their count reported): the "
        "finite part is recovered, median ||P_Sfin(W_T) - W_fin|| / ||W_fin|| <= 0.1 at the "
        "last step", kind="finding"),
    "cert": _CERT,
    "fin": Claim("every W_fin converged (reduced-loss gradient <= 1e-10)", kind="sanity"),
    "ties": Claim("cyclic datasets have tie (equality) rows, acyclic ones none", kind="sanity"),
}
CLAIMS_LOCAL = {
    "local": Claim(
        f"the public code's local figure (figures/Papers/local_corr_cyc_ce_0.1_n4T6K8d8_pos, "
        f"show_corr: mean +- std over runs), at its cell: the mean over seeds of corr(W_T, "
        f"W_svm^loc) at the last step >= {TAU}, W_svm^loc the Graph-SVM of the tokens the run "
        "selected (mass > 1e-2); std reported (a finding: the abstract of the cited version, "
        "the paper text stored, states no local-convergence result)", kind="finding"),
    "guard": Claim(
        f"the public local notebook's per-run guard, on every seed: max(corr(W_T, W_svm^loc), "
        f"corr(W_T, R W_svm^loc + W_fin^loc)) >= {GUARD_LOCAL} (it raises 'Correlation is too "
        "low' below)", kind="finding"),
    "unpublished": Claim(
        f"sizes without a published local figure (the notebook's own n6T4K6d8): the mean over "
        f"seeds of corr(W_T, W_svm^loc) >= {TAU}", kind="finding"),
    "not_global": Claim(
        f"from random starts some runs converge to a local Graph-SVM that is not the global "
        f"one (share of seeds with global corr >= {GUARD_LOCAL} below 1)", kind="finding"),
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


_SIZES = ("n4T6K8d8", "n6T4K6d8", "n10T6K8d8")
_GRAPHS = ("cyclic", "acyclic")


def _cell_id(size: str, graph: str) -> int:
    """The seed index of a (size, graph) cell: its place in sizes x graphs (fixed, so a
    cell draws the same datasets whichever cells a config runs)."""
    return 2 * _SIZES.index(size) + _GRAPHS.index(graph)


def _cells(cfg: dict) -> list[tuple]:
    """The config's cells as (size, graph, lr, steps, figure, published)."""
    return ([(*c, True) for c in cfg["published"]]
            + [(*c, False) for c in cfg["unpublished"]])


def _continue_slow(model, Ds, W_last, sols, fins, slow, lr, steps, budget, every):
    """Continue the seeds ``slow`` (NGD is stateless, so this is the same run), ``steps`` at
    a time, until each has crossed TAU or ``budget`` more steps are spent; per seed the first
    recorded step (counted from 0 of the original run, every ``every`` steps) with
    corr(W_t, W_svm) >= TAU (NaN: none within the budget), its corr at the end and the steps
    it ran."""
    out = {}
    todo, W, done = list(slow), {s: W_last[s] for s in slow}, 0
    while todo and done < budget:
        chunk = min(steps, budget - done)
        tr = train(model, [Ds[s] for s in todo], optimizer=ngd(lr), steps=chunk,
                       init={"W": np.stack([W[s] for s in todo])}, record_every=every,
                       record_params=True)
        Wh = tr.param_history["W"]
        for j, s in enumerate(todo):
            c = decompose(Wh[:, j], sols[s].W_, fins[s])["corr_svm"]
            hit = np.nonzero(c >= TAU)[0]
            W[s] = Wh[-1, j]
            out[s] = {"seed": s, "cross_step": float(steps + done + tr.record_steps[hit[0]])
                      if len(hit) else float("nan"), "corr_end": float(c[-1]),
                      "steps_run": float(steps + done + tr.record_steps[-1])}
        done += chunk
        todo = [s for s in todo if np.isnan(out[s]["cross_step"])]
    return [out[s] for s in slow if s in out]


def compute_global(cfg: dict) -> dict[str, pd.DataFrame]:
    runs, sols_t, slow_t = [], [], []
    for nm, graph, lr, steps, fig, pub in _cells(cfg):
        c = _cell_id(nm, graph)
        size = PUBLISHED_SIZES[nm]
        d = size[3]
        Ds = _datasets(size, graph, cfg["S"], cfg["seed"], c)
        svm = [graph_svm(D.E, D.seqs, D.y) for D in Ds]
        fins = [w_fin(D, head="iden") for D in Ds]
        model = NTPModel(d, "W", "iden")
        tr = train(model, Ds, optimizer=ngd(lr), steps=steps,
                       init={"W": _init(d, cfg["S"], [cfg["seed"], c, 99])},
                       record_every=cfg["record_every"], record_params=True)
        Wh = tr.param_history["W"]
        m = tr.metrics
        info = {"published": pub, "lr": lr, "steps": steps, "figure": fig}
        best = {}
        for s, (sol, fin) in enumerate(zip(svm, fins)):
            sols_t.append({"cell": c, "size": nm, "graph": graph, "seed": s, "status": sol.status_,
                           "gap": sol.gap_, "n_eq": sol.extra["n_equalities"],
                           "fin_converged": fin.converged, "fin_norm": float(np.linalg.norm(fin.W)),
                           "svm_norm": sol.norm_, **info})
            if not sol.feasible_:
                continue
            dec = decompose(Wh[:, s], sol.W_, fin)
            best[s] = dec["corr_svm"][-1]
            runs.append(_rows(c, nm, graph, s, tr.record_steps, dec,
                              m.loc[m.trial == s, "loss"].to_numpy(), extra=info))
        slow = [s for s, v in best.items() if v < TAU]
        for r in _continue_slow(model, Ds, Wh[-1], svm, fins, slow, lr, steps,
                                cfg["slow_factor"] * steps - steps, cfg["slow_every"]):
            slow_t.append({"cell": c, "size": nm, "graph": graph, **info, **r})
    slow_df = pd.DataFrame(slow_t, columns=["cell", "size", "graph", "published", "lr", "steps",
                                            "figure", "seed", "cross_step", "corr_end",
                                            "steps_run"])
    return {"runs": pd.concat(runs, ignore_index=True), "solutions": pd.DataFrame(sols_t),
            "slow": slow_df}


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
    runs, sols = [], []
    cells = [(cfg["size"], True)] + [(nm, False) for nm in cfg["extra_sizes"]]
    for c, (nm, pub) in enumerate(cells):
        size = PUBLISHED_SIZES[nm]
        d = size[3]
        S = cfg["S"]
        Ds = _datasets(size, "cyclic", S, cfg["seed"], c)
        model = NTPModel(d, "W", "gen")
        tr = train(model, Ds, optimizer=ngd(cfg["lr"]), steps=cfg["steps"],
                       init={"W": _init(d, S, [cfg["seed"], c, 99])},
                       record_every=cfg["record_every"], record_params=True)
        Wh = tr.param_history["W"]
        m = tr.metrics
        for s, D in enumerate(Ds):
            Y, ex = _selected(model, Wh[-1, s], D)
            glob = graph_svm(D.E, D.seqs, D.y)
            loc = graph_svm(D.E, D.seqs, Y, exclude=ex)
            fin_g = w_fin(D, head="gen")
            fin_l = w_fin(D, head="gen", graph_labels=Y, exclude=ex)
            local_is_global = bool(np.array_equal(np.sort(Y, 1)[:, -1:], D.y[:, None])
                                   and (Y >= 0).sum(1).max() == 1)
            sols.append({"cell": c, "size": nm, "published": pub, "seed": s,
                         "status_global": glob.status_, "status_local": loc.status_,
                         "gap_local": loc.gap_, "fin_converged": fin_g.converged and fin_l.converged,
                         "n_selected_max": int((Y >= 0).sum(1).max()),
                         "selected_is_label": local_is_global})
            if not (glob.feasible_ and loc.feasible_):
                continue
            dg = decompose(Wh[:, s], glob.W_, fin_g)
            dl = decompose(Wh[:, s], loc.W_, fin_l)
            dec = {**{f"{k}_global": v for k, v in dg.items()},
                   **{f"{k}_local": v for k, v in dl.items()}}
            runs.append(_rows(c, nm, "cyclic", s, tr.record_steps, dec,
                              m.loc[m.trial == s, "loss"].to_numpy(), extra={"published": pub}))
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


def _spread(x) -> str:
    x = np.asarray(x, float)
    return f"{len(x)} seeds; std {x.std():.4f}, min {x.min():.4f}, median {np.median(x):.4f}"


def _cell_name(nm, graph, lr, steps) -> str:
    return f"[{nm}, {graph}, lr {lr:g}, {int(steps)} steps]"


def judge_global(tables: dict, cfg: dict) -> list[Check]:
    runs, sols = tables["runs"], tables["solutions"]
    slow = tables.get("slow", pd.DataFrame(columns=["cell", "cross_step"]))
    checks = []
    last, first = _last(runs), _first(runs)
    fin_norm = sols.set_index(["cell", "seed"]).fin_norm
    fin_rel, fin_parts = [], []
    order = last.drop_duplicates("cell").sort_values(["published", "cell"], ascending=[False, True])
    for row in order.itertuples():
        c, nm, graph, lr, steps, pub = row.cell, row.size, row.graph, row.lr, row.steps, row.published
        g = last[last.cell == c]
        where = _cell_name(nm, graph, lr, steps)
        cs = g.corr_svm.to_numpy()
        best = np.maximum(cs, g.corr_dec.to_numpy())
        decl = CLAIMS_GLOBAL["global" if pub else "unpublished"]
        checks.append(decl.at_least(
            "mean corr(W_T, W_svm)", float(cs.mean()), TAU,
            note=f"{_spread(cs)}; mean corr(W_T, R W_svm + W_fin) {g.corr_dec.mean():.4f}"
                 + (f"; figure {row.figure}" if pub else "; no published figure"),
            claim=f"{where} {decl.text}"))
        checks.append(CLAIMS_GLOBAL["guard"].at_least(
            "fraction of seeds", float((best >= GUARD_GLOBAL).mean()), 1.0,
            note=f"{int((best < GUARD_GLOBAL).sum())} of {len(best)} seeds below {GUARD_GLOBAL} "
                 f"(min {best.min():.4f}); the paper's figures average a handful of runs",
            claim=f"{where} {CLAIMS_GLOBAL['guard'].text}"))
        if graph == "cyclic":
            f0 = first[first.cell == c].fin_diff.to_numpy()
            fT = g.fin_diff.to_numpy()
            if pub:
                checks.append(CLAIMS_GLOBAL["decomp"].at_most(
                    "mean at the last step / mean at initialisation",
                    float(fT.mean() / f0.mean()) if f0.mean() > 0 else float("nan"), FALL,
                    note=f"mean {f0.mean():.3g} (std {f0.std():.3g}) -> {fT.mean():.3g} "
                         f"(std {fT.std():.3g}, max {fT.max():.3g}); {len(fT)} seeds",
                    claim=f"{where} {CLAIMS_GLOBAL['decomp'].text}"))
            fn = fin_norm.reindex(list(zip(g.cell, g.seed))).to_numpy()
            nz = fn > FIN_ZERO
            rel = fT[nz] / fn[nz]
            fin_rel.append(rel)
            fin_parts.append(f"{nm}: {int(nz.sum())} of {len(nz)} draws"
                             + (f", median {np.median(rel):.3g}, max {rel.max():.3g}" if nz.any()
                                else ""))
    rel = np.concatenate(fin_rel) if fin_rel else np.array([])
    if fin_parts:  # some cyclic cell was run
        checks.append(CLAIMS_GLOBAL["fin_rel"].at_most(
            "median ||P_Sfin W_T - W_fin|| / ||W_fin||", float(np.median(rel)) if len(rel) else
            float("nan"), 0.1,
            note=f"over the {len(rel)} draws with W_fin != 0 of the cyclic cells ("
                 + "; ".join(fin_parts) + "); where W_fin = 0 the residual is the corr test "
                 "again" if len(rel) else "no cyclic draw with W_fin != 0: nothing to judge"))
    crossed = slow.cross_step.notna()
    parts = []
    for (nm, graph), h in slow.groupby(["size", "graph"], sort=False):
        steps = ", ".join("never" if np.isnan(v) else f"{int(v)}" for v in h.cross_step)
        parts.append(f"{nm} {graph}: {len(h)} below at {int(h.steps.iloc[0])}, cross at {steps} "
                     f"(continued to {int(h.steps_run.max())})")
    checks.append(CLAIMS_GLOBAL["slow"].at_least(
        "fraction of the slow seeds that cross", float(crossed.mean()) if len(slow) else 1.0, 1.0,
        note="; ".join(parts) if parts else f"no seed below {TAU} at the last step"))
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
    checks = []
    order = last.drop_duplicates("cell").sort_values(["published", "cell"], ascending=[False, True])
    for row in order.itertuples():
        g = last[last.cell == row.cell]
        where = _cell_name(row.size, "cyclic", cfg["lr"], cfg["steps"])
        cl = g.corr_svm_local.to_numpy()
        best = np.maximum(cl, g.corr_dec_local.to_numpy())
        decl = CLAIMS_LOCAL["local" if row.published else "unpublished"]
        checks.append(decl.at_least(
            "mean corr(W_T, W_svm^loc)", float(cl.mean()), TAU,
            note=f"{_spread(cl)}; mean corr(W_T, W_svm) (global) {g.corr_svm_global.mean():.4f}",
            claim=f"{where} {decl.text}"))
        checks.append(CLAIMS_LOCAL["guard"].at_least(
            "fraction of seeds", float((best >= GUARD_LOCAL).mean()), 1.0,
            note=f"{int((best < GUARD_LOCAL).sum())} of {len(best)} seeds below {GUARD_LOCAL} "
                 f"(min {best.min():.4f})",
            claim=f"{where} {CLAIMS_LOCAL['guard'].text}"))
        if row.published:
            bestg = np.maximum(g.corr_svm_global.to_numpy(), g.corr_dec_global.to_numpy())
            share = float((bestg >= GUARD_LOCAL).mean())
            checks.append(CLAIMS_LOCAL["not_global"].check(
                f"{share:.2f} of seeds also reach the global Graph-SVM; median global corr "
                f"{np.median(bestg):.4f}", bool(share < 1.0),
                note="the notebook prints 'Global Correlation is too low' for the others",
                claim=f"{where} {CLAIMS_LOCAL['not_global'].text}"))
    checks.append(CLAIMS_LOCAL["cert"].at_least(
        "fraction", float(sols.status_local.eq("optimal").mean()), 1.0))
    T = sols["size"].map(lambda nm: PUBLISHED_SIZES[nm][1])
    checks.append(CLAIMS_LOCAL["labels"].at_most(
        "max over seeds of (selected per sample - T)", float((sols.n_selected_max - T).max()), 0.0,
        fmt=".0f"))
    return checks


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
    ax[0].axhline(TAU, color="k", lw=0.8, ls="--")
    label(ax[0], "step", "corr(W_t, W_svm)", "hard retrieval")
    ax[1].set_yscale("log")
    label(ax[1], "step", "||P_Sfin W_t - W_fin||", "soft composition (cyclic)")
    return [save(fig, out, "ntp_global")]


def plot_local(tables: dict, cfg: dict, out) -> list:
    runs = tables["runs"]
    runs = runs[runs.published.astype(bool)]
    fig, ax = subplots(1, 1, width=4.4, height=3.2)
    _band(ax[0], runs, "corr_svm_local", COLORS[0], "local Graph-SVM")
    _band(ax[0], runs, "corr_svm_global", COLORS[1], "global Graph-SVM")
    ax[0].axhline(TAU, color="k", lw=0.8, ls="--")
    label(ax[0], "step", "corr(W_t, W_svm)", cfg["size"])
    return [save(fig, out, "ntp_local")]


_G = dict(published=PUBLISHED, unpublished=UNPUBLISHED, seed=0, slow_factor=8, slow_every=200)
_TINY_CELL = (("n4T6K8d8", "acyclic", 0.01, 60, "corr_asyc_log_n4T6K8d8_pos"),)
_L = dict(size="n4T6K8d8", extra_sizes=("n6T4K6d8",), lr=0.1, steps=2000, seed=0)
_KQ = dict(sizes=tuple(PUBLISHED_SIZES), graphs=("cyclic", "acyclic"), lr=0.01, seed=0)
EXPERIMENTS = [
    Experiment(
        name="ntp-global",
        title="NTP global convergence: W_t ~ R W_svm + W_fin (cyclic and acyclic graphs)",
        claim="Normalized GD on one self-attention layer trained by next-token prediction "
              "converges in direction to the Graph-SVM of the token-priority graphs' SCCs, "
              "plus a finite soft-composition part W_fin inside the SCCs.",
        configs={
            "tiny": dict(_G, published=_TINY_CELL, unpublished=(), S=2, record_every=20,
                         slow_factor=2, slow_every=20),
            "quick": dict(_G, S=20, record_every=200),
            "full": dict(_G, S=100, record_every=20),
        },
        compute=compute_global, judge=judge_global, plot=plot_global,
        verdicts=tuple(CLAIMS_GLOBAL.values()),
        deviations=(
            "ntp-global: datasets and initialisations drawn with numpy (the code's "
            "distributions; its torch draws are not reproduced); populations of 20 (quick) / "
            "100 (full) datasets per cell instead of the notebooks' handful (10 at HEAD).",
            "ntp-global: the claims are judged at the cells of the published figures, each at "
            "its own lr and length: acyclic n4T6K8d8, cyclic n6T4K6d8 and n10T6K8d8 at lr 0.01 "
            "for 4,000 iterations, acyclic n6T4K6d8 at lr 0.1 for 2,000 (the figure "
            "corr_asyc_log_n6T4K6d8_pos_0.1); acyclic n10T6K8d8 and cyclic n4T6K8d8 have no "
            "published figure and give findings only.",
            "ntp-global: judged by the mean over seeds at the figure's last step against 0.95 "
            "(the paper's theorem is asymptotic and states no threshold; every published mean "
            "curve ends above 0.95); the public code's per-run guard (0.9 in the global "
            "notebook at HEAD) on every seed is a finding.",
            "ntp-global: W_fin is the exact minimiser of the reduced loss (Newton) instead of "
            "the notebook's W_fin trained by NGD alongside (same limit).",
            "ntp-global: the seeds below 0.95 at the last step are continued (up to 8x the "
            "figure's iterations) to report when they cross it; the notebooks stop at the "
            "figure's last iteration.",
        ),
    ),
    Experiment(
        name="ntp-local",
        title="NTP local convergence: W_t follows the Graph-SVM of the tokens it selects",
        claim="From random starts, normalized GD converges in direction to the Graph-SVM built "
              "from the tokens it selects (the local Graph-SVM), not always to the global one "
              "(the public code's local figure; attnsvm's findings: the paper text stored, the "
              "AISTATS abstract, states no local-convergence result).",
        configs={
            "tiny": dict(_L, extra_sizes=(), S=2, steps=60, record_every=20),
            "quick": dict(_L, S=20, record_every=40),
            "full": dict(_L, S=100, record_every=20),
        },
        compute=compute_local, judge=judge_local, plot=plot_local,
        verdicts=tuple(CLAIMS_LOCAL.values()),
        deviations=(
            "ntp-local: 20 (quick) / 100 (full) datasets instead of the notebook's 10 epochs; "
            "numpy draws.",
            "ntp-local: the local convergence is judged at the published local figure's "
            "cell, n4T6K8d8 (local_corr_cyc_*_0.1_n4T6K8d8_pos), as attnsvm's finding (the "
            "cited abstract states no local result); the notebook's stored n6T4K6d8 is a "
            "second finding.",
            "ntp-local: the loss is cross-entropy (loss_type='ce': the published figure "
            "local_corr_cyc_ce_0.1_n4T6K8d8_pos and the notebook at commit 0d105ef); the "
            "notebook at the repository's HEAD uses 'lsq2' ((1 - p_y)^2), which attnsvm's NTP "
            "model does not implement, so the figure local_corr_cyc_ls_0.1_n4T6K8d8_pos is not "
            "reproduced.",
            "ntp-local: tokens with attention mass in (9e-3, 1e-2] (E_thres) are left out of the "
            "local Graph-SVM's rows and of W_fin's reduced problem; the public code leaves them "
            "out of the Tarjan graph only.",
            "ntp-local: judged by the mean over seeds at the last step against 0.95 (the "
            "figure's statistic); the notebook's per-run guard (0.95) on every seed is a "
            "finding.",
        ),
    ),
    Experiment(
        name="ntp-kq",
        title="NTP with (K, Q): which Graph-SVM norm does K Q^T reach? (attnsvm's question)",
        claim="attnsvm's own question, not the paper's: (K, Q) training of the NTP layer "
              "converges in direction to the nuclear-norm Graph-SVM rather than the Frobenius one.",
        configs={
            "tiny": dict(_KQ, sizes=("n4T6K8d8",), graphs=("acyclic",), S=2, steps=60,
                         record_every=20),
            "quick": dict(_KQ, sizes=("n4T6K8d8",), S=20, steps=4000, record_every=200),
            "full": dict(_KQ, S=100, steps=4000, record_every=40),
        },
        compute=compute_kq, judge=judge_kq, plot=plot_kq, in_default=False,
        verdicts=tuple(CLAIMS_KQ.values()),
        deviations=("ntp-kq: no counterpart in the paper (its notebooks' factorize_w=False); "
                    "K and Q start from the nn.Linear default as W does.",),
    ),
]

__all__ = ["EXPERIMENTS", "compute_global", "judge_global", "compute_local", "judge_local",
           "NTPData"]
