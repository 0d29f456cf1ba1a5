"""Max-Margin Token Selection, Figure 3: joint training of the head v and the prompt p.

Setup (Sec. 3 and the paper's ``joint_training`` notebook): prompt model with W = I,
trained linear head, logistic loss, n = 3, T = 2, d = 2, y = (1, -1, 1); every sequence is
[(0, 0), u_i] with u = (1, 1), (1, -1) and (0.5, 1) [variant a] or (0.5, 1.5) [variant b]
(``attnsvm.data.mmts_fig3``). Start p_0 = (0, -1), v_0 = (-1, 0); normalized GD on each
tensor (lr 0.1), 1000 iterations, as in the notebook. The selected tokens are the u_i.

Claims (Theorems 5 and 6, stated for the regularization path; the figure shows GD):
(a) when every selected token u_i is a support vector of the head SVM v_mm = argmin ||v||
    s.t. y_i v^T u_i >= 1, p -> the ATT-SVM direction p_mm and v -> v_mm;
(b) when some u_i is not a support vector, p -> the relaxed SVM (margin >= 1 only on the
    support sequences, >= 0 elsewhere), v -> v_mm;
(c) the softmax probability of the selected tokens and the logistic probability
    sigma(y_i f_i) both tend to 1 (the notebook plots iterations 0-200).

Populations (``attnsvm.data.mmts_fig3_population``; trial 0 is the paper's dataset):
(a) the u_i slide along the head SVM's margin lines (N(0, 0.2^2) noise on the first
coordinate), so Theorem 5's assumption holds by construction; (b) both coordinates of the
u_i get N(0, 0.2^2) noise (generic data). Per dataset the table ``datasets`` records the
head-SVM support and whether the theorem's case holds (all selected tokens support
vectors for (a), at least one not for (b)); the verdicts use the datasets in the case.
The support-vector checks are sanity checks: they hold by construction of the data.

Numerics: the engine trains the head with the anchored, saturation-safe gradient
(docs/theory.md §8), so the runs go far past the point where 1 - s rounds to 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnsvm.data import TokenData, mmts_fig3_population
from attnsvm.experiments.base import Check, Claim, Experiment
from attnsvm.metrics import correlation
from attnsvm.models import PromptModel
from attnsvm.optim import ngd
from attnsvm.plotting import COLORS, label, save, subplots
from attnsvm.svm import head_svm, prompt_svm, relaxed_svm
from attnsvm.train import train

CORR = 0.99  # convergence in direction (docs/theory.md §7)
PROB = 0.99  # "probability -> 1"


def solve(X: np.ndarray, y: np.ndarray) -> dict:
    """Head SVM, ATT-SVM and relaxed SVM of one dataset at the selected tokens u_i."""
    a = np.ones(len(y), dtype=int)
    R = X[np.arange(len(y)), a]
    head = head_svm(R, y)
    return {"att": prompt_svm(X, alpha=a), "relaxed": relaxed_svm(X, a, y), "head": head}


def run(data: TokenData, cfg: dict):
    """Joint NGD from the paper's start on a batch of datasets; (Trajectory, P, V, logits, f)."""
    model = PromptModel(2, train_head=True)
    tr = train(model, data, loss="logistic", optimizer=ngd(cfg["lr"]), steps=cfg["steps"],
               init={"p": np.array(cfg["p0"]), "v": np.array(cfg["v0"])}, B=data.B,
               alpha=np.ones((data.B, data.n), dtype=int), record_every=cfg["record_every"],
               record_params=True)
    P, V = tr.param_history["p"], tr.param_history["v"]  # (R, B, 2)
    Rn, B = P.shape[:2]
    hist = {"p": torch.as_tensor(P.reshape(Rn * B, 2)), "v": torch.as_tensor(V.reshape(Rn * B, 2))}
    rep = TokenData(X=np.tile(data.X, (Rn, 1, 1, 1)), y=np.tile(data.y, (Rn, 1)))
    logits = model.logits(hist, rep).numpy().reshape(Rn, B, data.n, data.T)
    f = model.forward(hist, rep).numpy().reshape(Rn, B, data.n)
    return tr, P, V, logits, f


def _directions(m: int) -> np.ndarray:
    """m unit vectors of R^2 at equally spaced angles, (m, 2)."""
    th = np.linspace(0.0, 2.0 * np.pi, m, endpoint=False)
    return np.stack([np.cos(th), np.sin(th)], -1)


def head_margin(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hard-margin SVM through the origin of the points a (..., n, 2) (a_i = y_i x_i):
    margin gamma = max_{||nu|| = 1} min_i nu^T a_i and the maximiser nu, both (...,).

    In the plane the point of conv{a_i} nearest the origin lies on a segment [a_i, a_j]
    (i <= j); nu is that point normalised, and gamma = min_i nu^T a_i (= its distance when
    the origin is outside the hull, <= 0 when it is inside: not separable).
    """
    i, j = np.triu_indices(a.shape[-2])
    ai, e = a[..., i, :], a[..., j, :] - a[..., i, :]
    ee = (e * e).sum(-1)
    t = np.clip(-(ai * e).sum(-1) / np.where(ee > 0, ee, 1.0), 0.0, 1.0)
    q = ai + t[..., None] * e
    k = np.linalg.norm(q, axis=-1).argmin(-1)
    q = np.take_along_axis(q, k[..., None, None], -2)[..., 0, :]
    nu = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-300)
    return (a * nu[..., None, :]).sum(-1).min(-1), nu


def regularization_path(X: np.ndarray, y: np.ndarray, radii, m: int = 8192):
    """The joint regularization path in p with the head's radius released first:
    p_R = argmax_{||p|| = R} gamma(p), gamma(p) = the head-SVM margin of the attention
    features y_i x_i(p), x_i(p) = X_i^T softmax(X_i p) (the limit r -> inf of
    argmin_{||p|| <= R, ||v|| <= r} L(v, p) for the logistic loss), and v_R = its head-SVM
    direction.  X (B, n, T, 2) with W = I, y (B, n); maximised over m directions (an arc of
    directions tied to rounding is replaced by its circular mean).  Returns
    P, V (len(radii), B, 2), unit vectors.  float64 resolves the margin differences
    ~exp(-R p.u_i) only while they exceed ~1e-15 relative: R up to ~32 on Fig. 3's data.
    """
    U = _directions(m)
    P, V = [], []
    for R in radii:
        lg = np.einsum("bntd,kd->bknt", X, R * U)
        s = np.exp(lg - lg.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        feats = y[:, None, :, None] * np.einsum("bknt,bntd->bknd", s, X)
        g, nu = head_margin(feats)
        # directions whose margin equals the maximum to rounding form an arc (float64 no longer
        # resolves exp(-R p.u_i) there): take its circular mean instead of its first point
        top = g >= g.max(1, keepdims=True) - 8 * np.finfo(float).eps * np.abs(g).max(1, keepdims=True)
        p = np.einsum("bk,kd->bd", top.astype(float), U)
        p /= np.linalg.norm(p, axis=1, keepdims=True)
        k = np.abs(np.einsum("bd,kd->bk", p, U) - 1).argmin(1)
        P.append(p)
        V.append(nu[np.arange(len(k)), k])
    return np.array(P), np.array(V)


def p_off(U_sel: np.ndarray, gamma_hat: np.ndarray, r: np.ndarray, m: int = 8192) -> np.ndarray:
    """p_off(r) = argmax_{||p|| = 1} min_i (r gamma_hat_i + p^T u_i), (B, 2) unit vectors.

    U_sel (B, n, 2): u_i = k_{i,opt} - k_{i,other} (T = 2); gamma_hat (B, n): the selected
    token's label margin y_i v^T x_{i,opt} / ||v||; r (B,): ||v|| / ||p||.  Joint training's
    leading excess loss is sum_i exp(-(||v|| gamma_hat_i + ||p|| p_hat^T u_i)) (the leak of
    attention to the other token), so its direction maximises the smallest exponent per
    unit ||p||.  r -> 0 gives the ATT-SVM direction; a large r gamma-excess of the
    non-support sequences drops their constraints, as in the relaxed SVM.
    """
    U = _directions(m)
    val = r[:, None, None] * gamma_hat[:, None, :] + np.einsum("bnd,kd->bkn", U_sel, U)
    return U[val.min(-1).argmax(1)]


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    paths, svms, sets, rps = [], [], [], []
    radii = list(cfg["radii"])
    for variant in ("a", "b"):
        data = mmts_fig3_population(variant, cfg["datasets"], sigma=cfg["jitter"], seed=cfg["seed"])
        tr, P, V, logits, f = run(data, cfg)
        y = data.y
        PR, VR = regularization_path(data.X, y.astype(float), radii, cfg["directions"])
        pT, vT = P[-1], V[-1]  # (B, 2)
        U_sel = data.X[:, :, 1] - data.X[:, :, 0]
        vhat = vT / np.linalg.norm(vT, axis=1, keepdims=True)
        ghat = y * np.einsum("bnd,bd->bn", data.X[:, :, 1], vhat)
        r_end = np.linalg.norm(vT, axis=1) / np.linalg.norm(pT, axis=1)
        POFF = p_off(U_sel, ghat, r_end, cfg["directions"])
        s = np.exp(logits - logits.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        for b in range(data.B):
            sol = solve(data.X[b], y[b])
            sup = sol["head"].support_[:, 0]
            sets.append(dict(variant=variant, dataset=b, head_support=str(np.nonzero(sup)[0].tolist()),
                             all_support=bool(sup.all()), att_feasible=bool(sol["att"].feasible_),
                             head_feasible=bool(sol["head"].feasible_),
                             relaxed_feasible=bool(sol["relaxed"].feasible_),
                             corr_att_relaxed=float(correlation(sol["att"].W_, sol["relaxed"].W_, vector=True)),
                             corr_p_off=float(correlation(pT[b], POFF[b], vector=True)),
                             corr_off_relaxed=float(correlation(POFF[b], sol["relaxed"].W_, vector=True)),
                             r_end=float(r_end[b]), norm_p_end=float(np.linalg.norm(pT[b])),
                             p_off1=POFF[b, 0], p_off2=POFF[b, 1]))
            rps.append(pd.DataFrame({
                "variant": variant, "dataset": b, "R": radii,
                "p1": PR[:, b, 0], "p2": PR[:, b, 1],
                "corr_p_att": correlation(PR[:, b], sol["att"].W_[None], vector=True),
                "corr_p_relaxed": correlation(PR[:, b], sol["relaxed"].W_[None], vector=True),
                "corr_v_head": correlation(VR[:, b], sol["head"].W_[None], vector=True)}))
            for name, so in sol.items():
                svms.append(dict(variant=variant, dataset=b, problem=name, x1=so.W_[0], x2=so.W_[1],
                                 norm=so.norm_, support=str(np.nonzero(so.support_[:, 0] if name == "head"
                                                                       else so.support_.any(1))[0].tolist())))
            paths.append(pd.DataFrame({
                "variant": variant, "dataset": b, "step": tr.record_steps,
                "p1": P[:, b, 0], "p2": P[:, b, 1], "v1": V[:, b, 0], "v2": V[:, b, 1],
                "corr_p_att": correlation(P[:, b], sol["att"].W_[None], vector=True),
                "corr_p_relaxed": correlation(P[:, b], sol["relaxed"].W_[None], vector=True),
                "corr_v_head": correlation(V[:, b], sol["head"].W_[None], vector=True),
                "softmax_prob": s[:, b, :, 1].mean(-1),
                "logistic_prob": (1.0 / (1.0 + np.exp(-y[b] * f[:, b]))).mean(-1),
                "max_logit_gap": np.abs(logits[:, b, :, 1] - logits[:, b, :, 0]).max(-1),
            }))
    return {"paths": pd.concat(paths, ignore_index=True), "svm": pd.DataFrame(svms),
            "datasets": pd.DataFrame(sets), "regpath": pd.concat(rps, ignore_index=True)}


def final(paths: pd.DataFrame) -> pd.DataFrame:
    """Last recorded row per (variant, dataset)."""
    return paths.loc[paths.groupby(["variant", "dataset"]).step.idxmax()].set_index(["variant", "dataset"])


def _share(ok: pd.Series) -> str:
    return f"{int(ok.sum())} of {len(ok)}"


def _worst(end: pd.DataFrame, col: str) -> str:
    return f"min {col} {end[col].min():.4f}" if len(end) else "no dataset in the case"


_PATH = "Sec. 3, Theorems 5 and 6 (joint regularization path)"
_PATH_Q = ("To this aim, we focus on regularization path analysis, which involves solving (ERM) "
           "under ridge constraints and examining the solution trajectory as the constraints are "
           "relaxed.")
CLAIMS = {
    "sv": Claim("figure: in (a) every selected token is a support vector of the head SVM "
                "(Assumption C); in (b) u_2 = (0.5, 1.5) is not", kind="sanity"),
    "case": Claim("populations: the SVMs exist on every dataset and the theorem's case holds: "
                  "(a) every u_i is a head-SVM support vector (by construction), (b) some u_i "
                  "is not", kind="sanity"),
    "thm5": Claim(
        f"Theorem 5 on the regularization path, population (a): p_R / R -> p_mm / ||p_mm|| "
        f"(ATT-SVM) and v_R -> v_mm (head SVM) on every dataset (corr >= {CORR} at the "
        "largest R)", quote=_PATH_Q + " [Theorem 5, all selected tokens support vectors of "
        "(SVM):] (1) We will first assume that, at the optimal tokens selected by [p], when "
        "solving (SVM) with [r_i = x_{i,opt_i}], all of these tokens become support vectors of "
        "(SVM).", where=_PATH),
    "thm6": Claim(
        f"Theorem 6 on the regularization path, population (b): p_R / R -> p_relaxed / "
        f"||p_relaxed|| (the relaxed SVM (10)) and v_R -> v_mm on every dataset (corr >= "
        f"{CORR} at the largest R)", quote="Building on this intuition, the following theorem "
        "captures the generalized behavior of the joint regularization path. [...] Then, "
        "[p_R/R -> p_relaxed/||p_relaxed||] and [v_r/r -> v_mm/||v_mm||], where [p_relaxed] is "
        "the solution of (10) with [opt_i] choices.", where="Sec. 3.2, Theorem 6"),
    "fig_a_p": Claim(
        f"figure (a), joint NGD on the paper's dataset: p converges to the ATT-SVM direction "
        f"(corr >= {CORR})", quote="As further discussion, consider Figure 3(a) [...] Because of "
        "this, [p] will separate optimal tokens from tokens at the [(0, 0)] coordinate via "
        "(ATT-SVM) and its direction is dictated by yellow and teal colored [u_i]s which are "
        "the support vectors.", where="Sec. 3.1, Fig. 3(a)"),
    "fig_a_v": Claim(
        f"figure (a), joint NGD on the paper's dataset: v converges to the head-SVM direction "
        f"(corr >= {CORR})", quote="The optimal tokens (denoted by [stars]) are all support "
        "vectors of the (SVM) since [v_mm = (0, 1)] is the optimal classifier direction "
        "(depicted by - - -).", where="Sec. 3.1, Fig. 3(a)"),
    "fig_b_p": Claim(
        f"figure (b), joint NGD on the paper's dataset: p converges to the relaxed SVM "
        f"direction (corr >= {CORR}) and is closer to it than to the plain ATT-SVM",
        quote="Thus, [p] solves the relaxed problem (10) which separates green and teal [u_i]'s "
        "by enforcing the max-margin constraint on [(SVM)] (which is the red direction). "
        "Instead, yellow only needs to achieve positive correlation with [p].",
        where="Sec. 3.2, Fig. 3(b)"),
    "fig_b_v": Claim(
        f"figure (b), joint NGD on the paper's dataset: v converges to the head-SVM direction "
        f"(corr >= {CORR})", quote="In Figures 3(a) and 3(b), [v_mm] (blue dashed) is solved "
        "using python package sklearn.svm via (SVM) based on the given label information",
        where="App. E, Fig. 3(a, b)"),
    "fig_c_s": Claim(
        f"figure (c), variant a: the softmax probability of the selected tokens -> 1 (>= {PROB} "
        "at the end)", quote="An achievement of [1] for this probability indicates that the "
        "attention mechanism successfully selects the optimal tokens.",
        where="Sec. 3.2, Fig. 3(c)"),
    "fig_c_l": Claim(
        f"figure (c), variant a: the logistic probability of the output -> 1 (>= {PROB} at the "
        "end)", quote="This probability also reaches a value of [1], suggesting that the inputs "
        "are correctly classified.", where="Sec. 3.2, Fig. 3(c)"),
    "pop_a": Claim(
        f"population (a), joint NGD: p -> p_mm (ATT-SVM) and v -> v_mm on every dataset "
        f"(corr >= {CORR}); the theorem is about the regularization path, GD's joint "
        "convergence is left open by the paper (Sec. 6)", kind="finding"),
    "p_off": Claim(
        f"populations (a) and (b), joint NGD: p converges to p_off(r) = argmax_{{||p|| = 1}} "
        f"min_i (r gamma_hat_i + p . u_i), r = ||v|| / ||p|| at the end, gamma_hat_i = y_i "
        f"v^T x_i,opt / ||v|| (the relaxed SVM with the head's margin weighted by the ratio of "
        f"the two norms), on every dataset (corr >= {CORR})", kind="finding"),
    "coincide": Claim(
        f"population (b), joint NGD: GD is as close to p_relaxed as p_off(r) is "
        f"(|corr(p, p_relaxed) - corr(p_off(r), p_relaxed)| <= {1 - CORR:.2g} on every "
        f"dataset), so GD reaches p_relaxed (corr >= {CORR}) only where p_off(r) coincides with "
        "it: GD's limit is p_relaxed only when the label-margin excess of the non-support "
        "sequences is large", kind="finding"),
    "probs": Claim(
        f"populations, joint NGD: softmax and logistic probabilities -> 1 (>= {PROB}) on every "
        "dataset", kind="finding"),
}


def judge(tables: dict, cfg: dict) -> list[Check]:
    end, sets = final(tables["paths"]), tables["datasets"].set_index(["variant", "dataset"])
    a, b = end.loc[("a", 0)], end.loc[("b", 0)]
    sa, sb = sets.loc["a"], sets.loc["b"]
    feas = sets.att_feasible & sets.head_feasible
    case_a = sa.all_support & sa.att_feasible & sa.head_feasible
    case_b = ~sb.all_support & sb.relaxed_feasible & sb.head_feasible
    ea, eb = end.loc["a"][case_a.to_numpy()], end.loc["b"][case_b.to_numpy()]
    conv_a = (ea.corr_p_att >= CORR) & (ea.corr_v_head >= CORR)
    probs = (end.softmax_prob >= PROB) & (end.logistic_prob >= PROB)
    rp = tables["regpath"]
    top = rp[rp.R == rp.R.max()].set_index(["variant", "dataset"])
    R_max = float(rp.R.max())
    mid = rp[rp.R == rp.R[rp.R <= R_max / 4].max()].set_index(["variant", "dataset"])
    ra, rb = top.loc["a"][case_a.to_numpy()], top.loc["b"][case_b.to_numpy()]
    path_a = (ra.corr_p_att >= CORR) & (ra.corr_v_head >= CORR)
    path_b = (rb.corr_p_relaxed >= CORR) & (rb.corr_v_head >= CORR)
    off = sets.corr_p_off
    # GD's and p_off's closeness to p_relaxed, compared as numbers: comparing the two
    # thresholded verdicts (corr >= CORR each) flipped on a dataset whose two correlations
    # straddle CORR by less than GD's own distance from p_off (0.98928 vs 0.99006)
    gd_rel = eb.corr_p_relaxed.to_numpy()
    off_rel_c = sb.corr_off_relaxed[case_b].to_numpy()
    gap_rel = np.abs(gd_rel - off_rel_c)
    reach_rel, off_rel = gd_rel >= CORR, off_rel_c >= CORR
    sides = np.flatnonzero(reach_rel != off_rel)

    def path_note(r, col, m):
        mm = m.loc[r.index]
        return (f"R = {R_max:g}: min corr(p_R, target) {r[col].min():.5f}, min corr(v_R, v_mm) "
                f"{r.corr_v_head.min():.5f}; at R = {float(mid.R.iloc[0]):g}: min corr(p_R, target) "
                f"{mm[col].min():.5f}") if len(r) else "no dataset in the case"

    C = CLAIMS
    return [
        C["sv"].check(f"head-SVM support: (a) {sa.head_support[0]}, (b) {sb.head_support[0]}",
                      sa.head_support[0] == "[0, 1, 2]" and "2" not in sb.head_support[0]),
        C["case"].check(f"(a) {_share(case_a)}, (b) {_share(case_b)}; ATT-SVM and head SVM "
                        f"feasible: {_share(feas)}", bool(case_a.all() and case_b.all())),
        C["thm5"].at_least("datasets", int(path_a.sum()), len(path_a),
                           path_note(ra, "corr_p_att", mid.loc["a"]), fmt="d"),
        C["thm6"].at_least("datasets", int(path_b.sum()), len(path_b),
                           path_note(rb, "corr_p_relaxed", mid.loc["b"]) + "; corr(p_mm, "
                           f"p_relaxed) median {sb.corr_att_relaxed[case_b].median():.3f} "
                           "(1 would make the two SVMs indistinguishable)", fmt="d"),
        C["fig_a_p"].at_least("corr(p, p_mm)", a.corr_p_att, CORR),
        C["fig_a_v"].at_least("corr(v, v_mm)", a.corr_v_head, CORR),
        C["fig_b_p"].check(f"corr(p, p_relaxed) = {b.corr_p_relaxed:.5f} (needs >= {CORR}), "
                           f"corr(p, p_mm) = {b.corr_p_att:.5f}",
                           bool(b.corr_p_relaxed >= CORR and b.corr_p_relaxed > b.corr_p_att)),
        C["fig_b_v"].at_least("corr(v, v_mm)", b.corr_v_head, CORR),
        C["fig_c_s"].at_least("mean s_opt at the end", a.softmax_prob, PROB),
        C["fig_c_l"].at_least("mean sigma(y f) at the end", a.logistic_prob, PROB),
        C["pop_a"].at_least("datasets", int(conv_a.sum()), len(conv_a),
                            f"{_worst(ea, 'corr_p_att')}, {_worst(ea, 'corr_v_head')}", fmt="d"),
        C["p_off"].at_least("datasets", int((off >= CORR).sum()), len(off),
                            f"min corr(p, p_off) {off.min():.5f}; r = ||v|| / ||p|| at the end "
                            f"{sets.r_end.min():.3f}-{sets.r_end.max():.3f}; ||p_T|| "
                            f"{sets.norm_p_end.min():.1f}-{sets.norm_p_end.max():.1f}", fmt="d"),
        C["coincide"].at_most(
            "largest |corr(p, p_relaxed) - corr(p_off, p_relaxed)|",
            float(gap_rel.max()) if len(gap_rel) else np.nan, 1 - CORR,
            f"GD reaches p_relaxed on {int(reach_rel.sum())} of {len(reach_rel)} datasets; "
            f"p_off(r) = p_relaxed on {int(off_rel.sum())}"
            + (f"; on opposite sides of {CORR} (within the tolerance): " + ", ".join(
                f"dataset {int(eb.index[i])} ({gd_rel[i]:.5f} vs {off_rel_c[i]:.5f})"
                for i in sides) if len(sides) else "")
            + f"; {_worst(eb, 'corr_p_relaxed')}", fmt=".3g"),
        C["probs"].at_least("datasets", int(probs.sum()), len(probs),
                            f"min softmax {end.softmax_prob.min():.4f}, min logistic "
                            f"{end.logistic_prob.min():.4f}", fmt="d"),
    ]


def plot(tables: dict, cfg: dict, out) -> list:
    paths, svm = tables["paths"], tables["svm"]
    paths, svm = paths[paths.dataset == 0], svm[svm.dataset == 0]
    show = cfg["show"]
    fig, ax = subplots(4, width=4.4, height=4.8)
    X = {v: np.array([(1, 1), (1, -1), (0.5, 1.0 if v == "a" else 1.5)]) for v in "ab"}
    ys = np.array([1, -1, 1])
    for j, v in enumerate("ab"):
        d, s = paths[(paths.variant == v) & (paths.step <= show)], svm[svm.variant == v].set_index("problem")
        for i, (u, y) in enumerate(zip(X[v], ys)):
            ax[j].scatter(*u, marker="*", s=160, color=COLORS[2 + i], edgecolor="k", lw=0.5,
                          zorder=3, label=f"seq {i}: u_{i} (y = {y:+d})")
        ax[j].scatter(0, 0, marker="o", s=60, color="gray", zorder=3, label="shared token (0, 0)")
        ax[j].plot(d.p1, d.p2, color=COLORS[1], lw=2, label=f"p, steps 0-{show}")
        ax[j].plot(d.v1, d.v2, color=COLORS[0], lw=2, label=f"v, steps 0-{show}")
        for name, col in (("p1", COLORS[1]), ("v1", COLORS[0])):
            ax[j].plot(d[name].iloc[0], d[name.replace("1", "2")].iloc[0], "o", color=col, ms=5)
        reach = float(np.hypot(d.p1, d.p2).max()) * 1.3
        for prob, col, ls, lab in (("head", COLORS[0], "--", "v_mm (head SVM)"),
                                   ("att", COLORS[1], ":", "p_mm (ATT-SVM)"),
                                   ("relaxed", COLORS[3], "--", "p_relaxed (relaxed SVM)")):
            if prob == "relaxed" and v == "a":
                continue
            u = s.loc[prob, ["x1", "x2"]].to_numpy(float)
            u = u / np.linalg.norm(u) * reach
            ax[j].plot([0, u[0]], [0, u[1]], ls=ls, color=col, lw=1.5, label=lab)
        ax[j].set_aspect("equal", adjustable="datalim")
        label(ax[j], "coordinate 1", "coordinate 2",
              f"({v}) u_2 = ({X[v][2][0]:g}, {X[v][2][1]:g}): transient and limit", legend=False)
        ax[j].legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    d = paths[(paths.variant == "a") & (paths.step <= cfg["show_prob"])]
    ax[2].plot(d.step, d.softmax_prob, color=COLORS[1], lw=2, label="softmax prob. of selected tokens")
    ax[2].plot(d.step, d.logistic_prob, color=COLORS[0], lw=2, label="logistic prob. sigma(y f)")
    ax[2].set_xlim(0, cfg["show_prob"])
    label(ax[2], "iterations", "probability (mean over i)", "(c) variant a", legend=False)
    ax[2].legend(fontsize=7, loc="lower right")
    rp = tables["regpath"]
    for v, col, tgt, lab in (("a", COLORS[1], "corr_p_att", "(a): p_R vs p_mm"),
                             ("b", COLORS[3], "corr_p_relaxed", "(b): p_R vs p_relaxed")):
        for k, (_, g) in enumerate(rp[rp.variant == v].groupby("dataset")):
            ax[3].plot(g.R, np.maximum(1 - g[tgt], 1e-12), "o-", color=col, lw=1, ms=3, alpha=0.6,
                       label=lab if k == 0 else None)
    ax[3].set_xscale("log")
    ax[3].set_yscale("log")
    ax[3].axhline(1 - CORR, color="gray", ls=":", lw=1, label=f"corr = {CORR}")
    label(ax[3], "R (||p|| <= R)", "1 - corr", "(d) regularization path, every dataset",
          legend=False)
    ax[3].legend(fontsize=7, loc="lower left")
    return [save(fig, out, "mmts_fig3")]


_BASE = dict(lr=0.1, p0=(0.0, -1.0), v0=(-1.0, 0.0), steps=1000, seed=0, jitter=0.2, show=80,
             show_prob=200, radii=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0), directions=8192)
EXPERIMENT = Experiment(
    name="mmts-fig3",
    title="Figure 3: joint (v, p) training: head SVM, ATT-SVM and the relaxed SVM",
    claim="On the joint regularization path, v aligns with the head SVM on the selected tokens "
          "and p with the ATT-SVM when every selected token is a support vector (Theorem 5), "
          "else with the relaxed SVM that only asks non-support tokens to be selected "
          "(Theorem 6); the figure shows joint normalized GD doing the same on its datasets.",
    configs={
        "tiny": dict(_BASE, steps=60, record_every=2, datasets=3, show=20, show_prob=60,
                     directions=2048),
        "quick": dict(_BASE, record_every=2, datasets=8),
        "full": dict(_BASE, record_every=1, datasets=64),
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "Theorems 5 and 6 are tested on the regularization path itself. The seeds text lost the "
        "theorems' formulas; attnsvm releases the head's radius first (r -> inf before R): "
        "p_R = argmax over ||p|| = R of the head-SVM margin of the attention features (the "
        "limit of the joint ridge-constrained minimiser of the logistic loss), on 8192 "
        "directions, R = 1..32 (beyond ~32 float64 no longer resolves the margin differences "
        "exp(-R p.u_i)).",
        "Joint NGD as the notebook (lr 0.1 on each tensor, 1000 iterations, its start) but "
        "without its epsilon: the notebook divides by ||grad|| + 1e-19 (p) and + 1e-9 (v) in "
        "float32, so its steps shrink once the gradients vanish and its ||p|| stops at ~23-75; "
        "attnsvm's NGD divides by ||grad|| in float64, so ||p|| keeps growing (~0.1 a step; the "
        "judge reports ||p_T||).",
        "Populations are attnsvm's addition (N(0, 0.2^2) noise on the paper's u_i, along the "
        "head-SVM margin for (a)); joint GD on them, and its limit p_off(r), are attnsvm "
        "findings: the paper proves the regularization path only and leaves GD's joint "
        "convergence open (Sec. 6).",
    ),
)
