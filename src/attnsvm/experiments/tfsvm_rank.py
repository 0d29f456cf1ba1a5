"""Transformers as SVMs, rank of the SVM solutions: the nuclear-norm ATT-SVM has lower rank
than the Frobenius one, and how to count that rank.

Setup (the paper's ``svm_rank`` notebook, re-drawn with numpy): tokens x_it, queries z_i and
head v uniform on the unit sphere, y_i uniform in {-1, +1} (``attnsvm.data.random_sphere``),
alpha = opt (argmax_t y_i v^T x_it). Grid: d in {1, 2, 3, 4, 5, 10, 15, 20} with n in
{5, 10, 15} (T = 5) and T in {5, 10, 15} (n = 5). The notebook takes 100 draws per cell and
counts ``numpy.linalg.matrix_rank(W, tol=1e-7)``: singular values above an ABSOLUTE 1e-7,
on cvxpy's default solution (SCS, eps 1e-5), and an infeasible draw (cvxpy returns None)
as rank 1. Here each cell takes its first ``N`` draws (chunks of rng([seed, cell, chunk]),
so quick is a prefix of full); infeasible draws are counted and left out.

Two rank counts of the same nuclear solution (attnsvm's certified working-set path):

- the paper's: #{sigma_k > 1e-7} (absolute);
- attnsvm's: #{sigma_k > 1e-4 sigma_1} (relative).

Which is right is decided by the solver's dual certificate, not by a tolerance. At an
optimum of min ||W||_* s.t. m_it(W) >= 1 the multipliers give S = sum lambda_it (x_i,alpha_i -
x_it) z_i^T in the subdifferential of ||.||_* at W (scaled so ||S||_op = 1): S = U V^T + N
with U, V the singular vectors of W and ||N||_op <= 1, N orthogonal to them. So every optimal
W has rank <= the multiplicity of the top singular value of S: the certified rank
(``dual_rank``, a metric of this module) is #{sigma_k(S) >= (1 - 1e-5) sigma_1(S)}, on the
solutions whose certified relative duality gap is <= 1e-6 (the others are counted apart).
A count above it counts singular values no optimal solution has: solver noise. The paper's
count on its own solver is measured on a sub-sample (``scs`` feasible draws per cell,
cvxpy's default solver, the notebook's problem).

Claims: rank(W_fro) <= min(n, d) (KKT: W_fro = sum_i (sum_t lambda_it (x_i,alpha_i - x_it))
z_i^T; a sanity check of the solver); the nuclear-norm solution (the limit of (K, Q)-
training) has lower rank than the Frobenius one in every cell (the figure's dashed curves
below the solid ones; a finding: the cited abstract states no rank comparison), judged where
most draws are feasible (elsewhere the paper's curves
show its rank-1 rule for infeasible draws, not solutions).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.data import TokenData, random_sphere
from attnsvm.experiments.base import Check, Claim, Experiment
from attnsvm.plotting import COLORS, label, save, subplots
from attnsvm.svm import att_svm, att_svm_batch

ABS = 1e-7  # the notebook's count: numpy matrix_rank(W, tol=1e-7), an absolute tolerance
RTOL = {"fro": 1e-7, "nuc": 1e-4}  # attnsvm's counts: sigma_k > rtol * sigma_1
NUC_ALT = (1e-3, 1e-6)  # the relative count must not change between these tolerances
DELTA = 1e-5  # certified rank: singular values of S within a factor 1 - 1e-5 of the top one
GAP = 1e-6  # a nuclear solution is certified if its relative duality gap is <= 1e-6
AGREE = 0.95  # "the paper's count measures the rank": equal to the certified rank on >= 95%


def cells(cfg: dict) -> list[tuple[int, int, int]]:
    nT = [(n, 5) for n in cfg["ns"]] + [(5, T) for T in cfg["Ts"] if T != 5]
    return [(n, T, d) for n, T in nT for d in cfg["ds"]]


def cell_draws(n: int, T: int, d: int, c: int, cfg: dict) -> TokenData:
    """The first ``N`` draws of cell c, in chunks from rng([seed, c, chunk index])."""
    C = cfg["chunk"]
    parts = [random_sphere(n, T, d, seed=[cfg["seed"], c, k], batch=C)
             for k in range(-(-cfg["N"] // C))]
    return TokenData(**{f: np.concatenate([getattr(p, f) for p in parts])[: cfg["N"]]
                        for f in ("X", "y", "z", "v")})


def margins(X, z, alpha, W) -> np.ndarray:
    """m_it(W) = (x_i,alpha_i - x_it)^T W z_i for W (..., d, d): (..., n, T); +inf at alpha."""
    D = np.take_along_axis(X, alpha[:, None, None], 1) - X  # (n, T, d)
    m = np.einsum("ntd,...de,ne->...nt", D, W, z)
    return np.where(np.arange(X.shape[1]) == alpha[:, None], np.inf, m)


def dual_rank(X, z, alpha, lam, delta: float = DELTA) -> int:
    """Multiplicity of the top singular value of the dual matrix S = sum_it lambda_it
    (x_i,alpha_i - x_it) z_i^T: #{sigma_k(S) >= (1 - delta) sigma_1(S)}, an upper bound on the
    rank of every optimal nuclear-norm solution (complementary slackness). lam (n, T) >= 0."""
    D = np.take_along_axis(X, alpha[:, None, None], 1) - X
    s = np.linalg.svd(np.einsum("nt,ntd,ne->de", lam, D, z), compute_uv=False)
    return int((s >= (1 - delta) * s[0]).sum()) if s[0] > 0 else 0


def lower_bound(sol) -> float:
    """The certified lower bound on the optimum of a Solution: lb with gap = (ub - lb) / lb,
    ub = ||W|| / min(1, margin) (attnsvm.svm.certificate.certify)."""
    ub = sol.norm_ / min(1.0, sol.margin_)
    return ub / (1.0 + sol.gap_)


def notebook_nuclear(X, z, alpha) -> tuple[np.ndarray | None, str]:
    """The notebook's nuclear problem with cvxpy's default solver: min ||W||_* s.t.
    (x_it - x_i,alpha_i)^T W z_i <= -1 (t != alpha_i). Returns (W or None, cvxpy status)."""
    import cvxpy as cp

    from attnsvm.svm.conic import solve_quietly

    n, T, d = X.shape
    D = X - np.take_along_axis(X, alpha[:, None, None], 1)
    keep = np.arange(T) != alpha[:, None]
    A = np.einsum("ntd,ne->ntde", D, z)[keep].reshape(-1, d * d)
    W = cp.Variable((d, d))
    prob = cp.Problem(cp.Minimize(cp.normNuc(W)), [A @ cp.vec(W, order="C") <= -1])
    solve_quietly(prob, None, False, {})  # "may be inaccurate": kept as the status instead
    return (None if W.value is None else np.asarray(W.value)), str(prob.status)


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    rows, spec, cell_rows = [], [], []
    for c, (n, T, d) in enumerate(cells(cfg)):
        data = cell_draws(n, T, d, c, cfg)
        fro = att_svm_batch(data.X, data.z, data.opt, irreducible=False)
        idx = np.nonzero(fro.feasible_)[0]
        for k, b in enumerate(idx):
            X, z, a = data.X[b], data.z[b], data.opt[b]
            nuc = att_svm(X, z, a, norm="nuc", irreducible=False)
            row = dict(n=n, T=T, d=d, draw=int(b), feasible_nuc=nuc.feasible_, nuc_gap=nuc.gap_,
                       nuc_margin=nuc.margin_, nuc_seconds=nuc.time_)
            if not nuc.feasible_:
                rows.append(row)
                continue
            row["certified"] = bool(nuc.gap_ <= GAP and nuc.margin_ >= 1 - 1e-9)
            for nm, W in (("fro", fro.W_[b]), ("nuc", nuc.W_)):
                sv = np.linalg.svd(W, compute_uv=False)
                row[f"rank_{nm}"] = int((sv > RTOL[nm] * sv[0]).sum())
                row[f"rank_{nm}_abs"] = int((sv > ABS).sum())
                spec += [dict(n=n, T=T, d=d, draw=int(b), norm=nm, k=j + 1, sv=v, sv_ratio=v / sv[0])
                         for j, v in enumerate(sv)]
            for rt in NUC_ALT:
                row[f"rank_nuc_{rt:g}"] = int((sv > rt * sv[0]).sum())
            row["rank_nuc_cert"] = dual_rank(X, z, a, nuc.dual_)
            if k < cfg["scs"]:  # the notebook's solver and count on a sub-sample
                Wp, status = notebook_nuclear(X, z, a)
                row["scs_status"] = status
                if Wp is not None:
                    sp = np.linalg.svd(Wp, compute_uv=False)
                    mu = margins(X, z, a, Wp).min()
                    row.update(rank_scs_abs=int((sp > ABS).sum()),
                               rank_scs_rel=int((sp > RTOL["nuc"] * sp[0]).sum()),
                               scs_excess=sp.sum() / mu / lower_bound(nuc) - 1 if mu > 0 else np.inf)
                    spec += [dict(n=n, T=T, d=d, draw=int(b), norm="scs", k=j + 1, sv=v,
                                  sv_ratio=v / sp[0]) for j, v in enumerate(sp)]
            rows.append(row)
        cell_rows.append(dict(n=n, T=T, d=d, drawn=len(fro.feasible_), feasible=len(idx)))
    return {"ranks": pd.DataFrame(rows), "spectra": pd.DataFrame(spec),
            "cells": pd.DataFrame(cell_rows)}


def certified(r: pd.DataFrame) -> pd.DataFrame:
    """Instances whose nuclear solution is feasible and certified (gap <= GAP)."""
    return r[r.feasible_nuc & r.certified.fillna(False).astype(bool)] if len(r) else r


def cell_means(r: pd.DataFrame, cl: pd.DataFrame) -> pd.DataFrame:
    """Per cell, over the certified instances: mean ranks (attnsvm's counts, the certified
    rank, the absolute counts), their number, and an estimate of the paper's curve: the
    notebook averages over all its draws, with the absolute count of its solver's solution on
    the feasible ones (mean over this run's sub-sample) and rank 1 for each infeasible draw."""
    ok = certified(r)
    cols = [c for c in ("rank_fro", "rank_nuc", "rank_nuc_cert", "rank_fro_abs",
                        "rank_nuc_abs", "rank_scs_abs") if c in ok]
    out = cl.set_index(["n", "T", "d"])
    if len(ok):
        g = ok.groupby(["n", "T", "d"])
        out = out.join(g[cols].mean()).join(g.size().rename("certified"))
    out["certified"] = out.get("certified", pd.Series(0, index=out.index)).fillna(0).astype(int)
    share = out.feasible / out.drawn
    for nm, col in (("nuc", "rank_scs_abs"), ("fro", "rank_fro_abs")):
        v = out[col] if col in out else np.nan
        out[f"paper_curve_{nm}"] = np.where(out.feasible > 0, v * share + (1 - share), 1.0)
    return out


# The cited version (arXiv:2308.16898v1; its abstract is the paper text stored, in
# tests/data/paper_excerpts/tfsvm.txt) says the (K, Q) limit minimises the nuclear norm but
# states no rank comparison, so "lower rank" is attnsvm's finding (the notebook's figure).


CLAIMS = {
    "kkt": Claim("rank(W_fro) <= min(n, d) on every instance (KKT, docs/theory.md §5)",
                 kind="sanity"),
    "lower": Claim("The nuclear-norm solution has lower rank than the Frobenius one: mean "
                   "certified rank(W_nuc) < mean rank(W_fro) in every cell with min(n, d) >= 2 "
                   "where most draws are feasible (the svm_rank notebook's figure; the cited "
                   "abstract states no rank comparison)", kind="finding"),
    "count": Claim(f"attnsvm's count (sigma_k > {RTOL['nuc']:g} sigma_1) equals the rank "
                   f"certified by the dual (multiplicity of the top singular value of S, "
                   f"within {DELTA:g}) on every certified instance", kind="finding"),
    "paper_count": Claim(f"The paper's count (sigma_k > {ABS:g} absolute, cvxpy's default solver, "
                         f"the notebook's problem) gives the certified rank on >= {AGREE:.0%} of "
                         f"the instances", kind="finding"),
}
"""The declared verdicts, in the order ``judge`` returns their checks."""


def judge(tables: dict, cfg: dict) -> list[Check]:
    raw, cl = tables["ranks"], tables["cells"]
    feas = raw[raw.feasible_nuc] if len(raw) else raw
    r = certified(raw)
    short = cl[cl.feasible < cl.drawn]
    note = (f"{len(feas)} feasible instances in {len(cl)} cells of {cfg['N']} draws; infeasible "
            "draws (d too small for n(T-1) constraints) left out: " +
            ", ".join(f"(n={s.n},T={s.T},d={s.d}): {s.drawn - s.feasible}/{s.drawn}"
                      for s in short.itertuples()))
    unc = feas[~feas.index.isin(r.index)]
    unc_txt = (f"{len(unc)} of {len(feas)} nuclear solutions are not certified (relative gap "
               f"> {GAP:g}: " + ", ".join(f"(n={u.n},T={u.T},d={u.d}) {u.nuc_gap:.1e}"
                                          for u in unc.itertuples()) + ") and are left out")
    excess = (feas.rank_fro - np.minimum(feas.n, feas.d)).max() if len(feas) else np.nan
    m = cell_means(raw, cl)
    small = np.minimum(m.index.get_level_values("n"), m.index.get_level_values("d")) >= 2
    shown = 2 * m.feasible > m.drawn  # the paper's curve shows solutions, not its rank-1 rule
    room = m[small & shown & (m.certified > 0)]
    rest = m[small & ~shown & (m.certified > 0)]
    lower = (room.rank_nuc_cert < room.rank_fro) if len(room) else pd.Series(dtype=bool)
    cell_txt = "; ".join(f"(n={n},T={T},d={d}): fro {x.rank_fro:.2f}, nuc {x.rank_nuc_cert:.2f}"
                         f" ({x.certified})" + ("" if ok else " FAILS")
                         for (n, T, d), x, ok in zip(room.index, room.itertuples(), lower))
    same = r.rank_nuc == r.rank_nuc_cert
    alt = (r.rank_nuc == r[f"rank_nuc_{NUC_ALT[0]:g}"]) & (r.rank_nuc == r[f"rank_nuc_{NUC_ALT[1]:g}"])
    sub = r.dropna(subset=["rank_scs_abs"]) if "rank_scs_abs" in r else r.iloc[:0]
    scs_same = sub.rank_scs_abs == sub.rank_nuc_cert
    return [
        CLAIMS["kkt"].at_most("max rank(W_fro) - min(n, d)", float(excess), 0.0, note, fmt="g"),
        CLAIMS["lower"].at_least(
            "fraction of cells", float(lower.mean()) if len(lower) else np.nan, 1.0,
            f"per cell (certified instances): {cell_txt}. Cells where most draws are "
            f"infeasible are not judged (the paper's curve there is its rank-1 rule "
            f"for infeasible draws): " + ("; ".join(
                f"(n={n},T={T},d={d}): fro {x.rank_fro:.2f}, nuc {x.rank_nuc_cert:.2f} "
                f"({x.feasible} feasible, {x.certified} certified, of {x.drawn} draws)"
                for (n, T, d), x in
                zip(rest.index, rest.itertuples())) or "none") + f". {unc_txt}"),
        CLAIMS["count"].at_least(
            "fraction of instances",
            float(same.mean()) if len(r) else np.nan, 1.0,
            f"{len(r)} certified instances (largest gap {r.nuc_gap.max():.1e}); the "
            f"count is the same at rtol {NUC_ALT[0]:g} and {NUC_ALT[1]:g} on "
            f"{alt.mean():.1%}. {unc_txt}"),
        CLAIMS["paper_count"].at_least(
            "fraction of instances (sub-sample)",
            float(scs_same.mean()) if len(sub) else np.nan, AGREE,
            f"{len(sub)} instances solved with cvxpy's default (SCS; status "
            f"{', '.join(f'{k} {v}' for k, v in sub.scs_status.value_counts().items())}"
            f"): mean paper "
            f"count {sub.rank_scs_abs.mean():.2f} vs certified "
            f"{sub.rank_nuc_cert.mean():.2f}, above it on "
            f"{(sub.rank_scs_abs > sub.rank_nuc_cert).mean():.0%}, below on "
            f"{(sub.rank_scs_abs < sub.rank_nuc_cert).mean():.0%}; SCS's solution is "
            f"{sub.scs_excess.median():.1e} (median relative) above the certified "
            f"optimum, and its relative count (> {RTOL['nuc']:g} sigma_1) gives the "
            f"certified rank on {(sub.rank_scs_rel == sub.rank_nuc_cert).mean():.0%}. "
            f"The absolute count on attnsvm's own solutions (gap ~1e-7) gives it on "
            f"{(r.rank_nuc_abs == r.rank_nuc_cert).mean():.0%} of all certified "
            f"instances: an absolute 1e-7 counts solver noise"),
    ]


def plot(tables: dict, cfg: dict, out) -> list:
    from matplotlib.lines import Line2D

    r, sp = tables["ranks"], tables["spectra"]
    m = cell_means(r, tables["cells"]).reset_index()
    fig, ax = subplots(3, 1, width=4.2, height=3.6)
    styles = (("rank_fro", "-", "o", "Frobenius"), ("rank_nuc_cert", "--", "s", "nuclear (certified rank)"),
              ("paper_curve_nuc", ":", "x", "nuclear, paper's count (cvxpy, > 1e-7)"))
    for a, (key, fixed, vals), loc in zip(ax, (("n", ("T", 5), cfg["ns"]), ("T", ("n", 5), cfg["Ts"])),
                                          ("upper left", "lower right")):
        for j, val in enumerate(vals):
            g = m[(m[key] == val) & (m[fixed[0]] == fixed[1])].sort_values("d")
            for col, ls, mk, _ in styles:
                if col in g:
                    a.plot(g.d, g[col], ls, marker=mk, ms=4, color=COLORS[j])
        label(a, "embedding dimension d", "mean rank of the SVM solution",
              f"({'ab'[key == 'T']}) {key} varies, {fixed[0]} = {fixed[1]}", legend=False)
        a.set_xticks(cfg["ds"])
        h1 = [Line2D([], [], color="k", ls=ls, marker=mk, ms=4, label=name) for _, ls, mk, name in styles]
        h2 = [Line2D([], [], color=COLORS[j], lw=3, label=f"{key} = {v}") for j, v in enumerate(vals)]
        a.add_artist(a.legend(handles=h1, fontsize=6, loc=loc))
        a.legend(handles=h2, fontsize=6, loc="center left" if loc == "upper left" else "upper left")
    for nm, col, name in (("fro", COLORS[0], "Frobenius (attnsvm)"),
                          ("nuc", COLORS[1], "nuclear (attnsvm)"),
                          ("scs", COLORS[2], "nuclear (cvxpy default, sub-sample)")):
        x = np.log10(np.clip(sp[sp.norm == nm].sv_ratio, 1e-17, None)) if len(sp) else []
        ax[2].hist(x, bins=np.linspace(-17, 0, 69), alpha=0.5, color=col, label=name)
    ax[2].axvline(np.log10(RTOL["nuc"]), color="k", ls="--", label=f"attnsvm: {RTOL['nuc']:g} sigma_1")
    ax[2].set_yscale("log")
    label(ax[2], "log10(sigma_k / sigma_1)", "count",
          "(c) singular values: solution vs solver noise", legend=False)
    ax[2].legend(fontsize=6, loc="upper left")
    return [save(fig, out, "tfsvm_rank")]


_GRID = dict(ns=[5, 10, 15], Ts=[5, 10, 15], ds=[1, 2, 3, 4, 5, 10, 15, 20], seed=0, chunk=5)
EXPERIMENT = Experiment(
    name="tfsvm-rank",
    title="Rank of the Frobenius vs the nuclear-norm ATT-SVM solution",
    claim="The Frobenius-norm ATT-SVM solution has rank at most min(n, d), and the nuclear-norm "
          "solution (the implicit bias of (K, Q)-training) has a lower rank.",
    configs={
        "tiny": dict(_GRID, ns=[5], Ts=[5], ds=[2, 5], N=2, chunk=2, scs=1),
        "quick": dict(_GRID, N=10, scs=1),
        "full": dict(_GRID, N=25, scs=3),
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "tfsvm-rank: 25 draws per cell at full scale (quick 10: with 5, cells of rank <= 2 "
        "such as d = 2 tied by chance on some seeds) instead of the notebook's 100, "
        "to keep the report within its time budget; the nuclear solutions come from attnsvm's "
        "certified solver, the notebook's solver (cvxpy default, SCS eps 1e-5 in cvxpy 1.9) runs "
        "on a sub-sample of 3 (quick 1) feasible draws per cell.",
        "tfsvm-rank: infeasible draws are left out and counted (the notebook counts them as "
        "rank 1: numpy's matrix_rank of cvxpy's None); the figure's 'paper's count' curve "
        "reproduces that rule.",
        "tfsvm-rank: the claim compares the rank certified by the nuclear SVM's dual (the "
        "rank of every optimal solution), not the notebook's count (singular values above an "
        "absolute 1e-7 of cvxpy's SCS solution): how often that count gives the certified "
        "rank, and how often attnsvm's relative count (sigma_k > 1e-4 sigma_1) does, are "
        "attnsvm's findings, never the paper failing.",
    ),
)
