"""Max-Margin Token Selection, Figures 9-10: over-parameterisation Monte-Carlo.

Setup: prompt model a_it = x_it^T p with W = I, tokens x_it and head v uniform on the unit
sphere S^{d-1}, labels y_i uniform in {-1, +1}, n = 6 sequences of T = 8 tokens,
d in {2, 4, 6, 8, 10, 15, 20}; p_0 = 0 and normalized GD with learning rate 1 for 1000
iterations, 1000 random problems per d.  Each run ends in one of the outcomes of
docs/theory.md §7: not saturated (mean selected probability < 0.99), GMM (correlation > 0.99
with the SVM direction of the optimal tokens), LMM (the selected tokens alpha are
locally optimal and corr(p, p_mm(alpha)) > 0.99), or other.  Minimal score gap:
min over i and SVM-neighbours t of gamma_{i,alpha_i} - gamma_it.

Claims (App. E, Figs. 9-10; ``CLAIMS``): as d grows, more runs saturate and more converge to
the GMM (tested over the whole d grid with a one-sided Cochran-Armitage trend test: the paper
states the growth without a test); per d, saturated runs almost always converge to an LMM
(a claim at d >= 6, the quote's "for larger d"; at d = 2, 4 a finding)
(judged on the runs whose minimal score gap is >= 0: a negative gap rules an LMM out by
definition, so such a run is counted once, by the next claim); per d, saturated runs with a
negative minimal score gap, which "happens less than 1% of the problems", counted over all
problems of that d.  Fig. 10's pooled reading over the saturated runs is reported as a finding.

The extracted paper text lost its symbols: n = 6, T = 8, the d grid and the saturation
threshold are not in it (see the deviations); lr 1, 1000 iterations, p_0 = 0 and 1000
trials per d are.  The quick scale runs the first 150 problems of each d's population of 1000.

All trials of one d train as one batch; with ``pad=True`` every d is zero-padded to
d_max and all 7000 trials form a single batch (with W = I and p_0 = 0 the padded
coordinates of p stay exactly 0, see the tests).  Outcomes come from
``attnsvm.tokens.outcome`` (batched SVM fast path), for the saturated runs only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm import plotting as P
from attnsvm.data import TokenData, random_sphere
from attnsvm.experiments.base import Claim, Experiment
from attnsvm.models import PromptModel
from attnsvm.optim import ngd
from attnsvm.tokens import attention_probs, outcome
from attnsvm.train import train

OUTCOMES = ["not saturated", "other", "LMM", "GMM"]
OCOLOR = {"not saturated": "#d62728", "other": "#7f7f7f", "LMM": "#1f77b4", "GMM": "#2ca02c"}
SAT, CORR = 0.99, 0.99


def _pad(a: np.ndarray, d_max: int) -> np.ndarray:
    return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, d_max - a.shape[-1])])


def datasets(cfg) -> TokenData:
    """All trials of all d, zero-padded to d_max, in one batched TokenData (d order).

    Each d draws the whole population (``population`` problems, the paper's 1000) and
    keeps the first ``trials``: a smaller scale is an exact prefix of the full one."""
    dm = max(cfg["ds"])
    m, k = cfg.get("population", cfg["trials"]), cfg["trials"]
    if k > m:
        raise ValueError(f"trials = {k} exceeds the population of {m} problems per d "
                         f"(set population >= trials too; in a sweep: --grid population={k})")
    parts = [random_sphere(n=cfg["n"], T=cfg["T"], d=d, seed=cfg["seed"] + d, batch=m, cross=False)
             for d in cfg["ds"]]
    return TokenData(X=np.concatenate([_pad(p.X[:k], dm) for p in parts]),
                     y=np.concatenate([p.y[:k] for p in parts]),
                     v=np.concatenate([_pad(p.v[:k], dm) for p in parts]))


def train_prompts(data: TokenData, cfg, dims: np.ndarray) -> np.ndarray:
    """Final p (B, d_max): one batch (``pad``) or one batch per d (padded coordinates 0)."""
    kw = dict(optimizer=ngd(cfg["lr"]), steps=cfg["steps"], init="zero", record_every=cfg["steps"])
    dm = data.d
    if cfg.get("pad", False):
        return train(PromptModel(dm), data, **kw).params["p"].numpy()
    p = np.zeros((data.B, dm))
    for d in np.unique(dims):
        ix = np.nonzero(dims == d)[0]
        sub = TokenData(X=data.X[ix][..., :d], y=data.y[ix], v=data.v[ix][:, :d])
        p[ix, :d] = train(PromptModel(int(d)), sub, **kw).params["p"].numpy()
    return p


def outcomes(p, X, y, v) -> pd.DataFrame:
    """Per trial: mean selected probability, saturation and, for the saturated runs, the
    outcome of ``attnsvm.tokens.outcome`` (corr with p_mm(alpha) and p_mm(opt), local
    optimality, minimal score gap over the SVM-neighbours; docs/theory.md §5, §7).  The SVMs
    (batched fast path) are solved only for saturated runs: a run that did not saturate
    is "not saturated" whatever its SVMs."""
    probs = attention_probs(X, p)
    p_sel = probs.max(-1).mean(-1)
    sat = p_sel >= SAT
    df = pd.DataFrame({"p_sel": p_sel, "saturated": sat, "outcome": "not saturated",
                       "corr_lmm": np.nan, "corr_gmm": np.nan, "alpha_is_opt": False,
                       "locally_optimal": False, "min_score_gap": np.nan, "svm_feasible": False})
    if sat.any():
        o = outcome(p[sat], X[sat], y[sat], v[sat], probs=probs[sat], saturation=SAT, threshold=CORR)
        cols = ["outcome", "corr_lmm", "corr_gmm", "alpha_is_opt", "locally_optimal", "min_score_gap"]
        for c in cols:
            df.loc[sat, c] = o[c].to_numpy()
        df.loc[sat, "svm_feasible"] = o["lmm_feasible"].to_numpy()
    return df


def compute(cfg):
    data = datasets(cfg)
    dims = np.repeat(np.asarray(cfg["ds"]), cfg["trials"])
    p = train_prompts(data, cfg, dims)
    df = outcomes(p, data.X, data.y, data.v)
    df.insert(0, "norm", np.linalg.norm(p, axis=1))
    df.insert(0, "trial", np.tile(np.arange(cfg["trials"]), len(cfg["ds"])))
    df.insert(0, "d", dims)
    return {"trials": df, "by_d": per_d(df)}


def shares(df: pd.DataFrame) -> pd.DataFrame:
    """Outcome shares per d (rows d, columns OUTCOMES)."""
    return pd.crosstab(df.d, df.outcome, normalize="index").reindex(columns=OUTCOMES, fill_value=0.0)


def trend_test(d: pd.Series, hit: pd.Series) -> tuple[float, float]:
    """Cochran-Armitage test for an increasing trend of a proportion over ordered groups.

    Groups are the values of ``d`` (scores s_g = d), x_g hits out of n_g trials, pooled
    share pbar = sum x / sum n:  z = sum_g s_g (x_g - n_g pbar) /
    sqrt(pbar (1 - pbar) [sum n_g s_g^2 - (sum n_g s_g)^2 / N]).  Returns (z, one-sided
    p-value P(Z >= z)); z = 0, p = 0.5 when every trial (or none) is a hit.
    """
    from scipy.stats import norm

    g = pd.DataFrame({"d": np.asarray(d, float), "x": np.asarray(hit, float)}).groupby("d").x
    s, n, x = g.sum().index.to_numpy(float), g.size().to_numpy(float), g.sum().to_numpy(float)
    N, pbar = n.sum(), x.sum() / n.sum()
    var = pbar * (1 - pbar) * ((n * s**2).sum() - (n * s).sum() ** 2 / N)
    if var <= 0:
        return 0.0, 0.5
    z = float((s * (x - n * pbar)).sum() / np.sqrt(var))
    return z, float(norm.sf(z))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson 95% interval of a binomial share k / n."""
    if n == 0:
        return np.nan, np.nan
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(c - h), float(c + h)


def per_d(df: pd.DataFrame) -> pd.DataFrame:
    """Per d: trials, saturated, GMM, LMM-or-GMM among saturated, negative gaps."""
    sat = df.saturated.astype(bool)
    neg = sat & (df.min_score_gap < 0)
    g = pd.DataFrame({"d": df.d, "sat": sat, "gmm": df.outcome == "GMM",
                      "conv": df.outcome.isin(["LMM", "GMM"]), "neg": neg}).groupby("d")
    out = pd.DataFrame({"trials": g.size(), "saturated": g.sat.sum(), "gmm": g.gmm.sum(),
                        "lmm_or_gmm": g.conv.sum(), "negative_gap": g.neg.sum()})
    out["share_saturated"] = out.saturated / out.trials
    out["share_gmm"] = out.gmm / out.trials
    out["share_negative_of_saturated"] = out.negative_gap / out.saturated.where(out.saturated > 0)
    return out.reset_index()


ALPHA = 0.05     # one-sided significance level of the trend tests
NEG_MAX = 0.01   # paper: a negative minimal score gap in "less than 1% of the problems"
CONV_MIN = 0.99  # paper: saturated runs "almost always" converge to an LMM (exceptions < 1%)
LARGE_D = 6      # the paper's "for larger d" (against "small d (e.g., d = 2)"): d >= 6 of the grid
_W9 = "App. E, Fig. 9(a)"
CLAIMS = {
    "trend_sat": Claim(
        f"over-parameterisation: the saturated share grows with d over the whole grid "
        f"(Cochran-Armitage trend test, one-sided p < {ALPHA})",
        quote="For small [d] (e.g., [d = 2]), problem has small degrees of freedom to separate "
              "optimal tokens from the rest [...] This results in a tall red bar capturing the "
              "finite-norm solutions. However, for larger [d], we observe that softmax saturates",
        where=_W9),
    "trend_gmm": Claim(
        f"over-parameterisation: the GMM share grows with d over the whole grid "
        f"(Cochran-Armitage trend test, one-sided p < {ALPHA})",
        quote="GMM is a strict subset of LMM however as [d] increases, we observe that the "
              "probability of GMM convergence increases as well.", where=_W9),
    "lmm": Claim(
        f"at each d, saturated runs whose selected tokens have a non-negative minimal score gap converge to "
        f"an LMM (GMM included, corr > {CORR}) 'almost always': share >= {CONV_MIN}, unless its "
        f"95% Wilson interval lies below {CONV_MIN} (runs with a "
        "negative gap are not LMMs by definition and are judged by the < 1% claim only)",
        quote="However, for larger [d], we observe that softmax saturates [...] and we observe "
              "that the selected tokens almost always converges to an LMM direction (blue bar) - "
              "this is in line with Theorems 3 & 4.", where=_W9 + f"; judged at d >= {LARGE_D}, "
              "the quote's 'larger d' (d = 2, 4 are findings)"),
    "lmm_small": Claim(
        f"at each d, below the quote's 'larger d' (d < {LARGE_D}): saturated runs whose selected "
        f"tokens have a non-negative minimal score gap converge to an LMM (GMM included, corr > "
        f"{CORR}) 'almost always': share >= {CONV_MIN}, unless its 95% Wilson interval lies below "
        f"{CONV_MIN}", kind="finding"),
    "neg": Claim(
        f"at each d, saturated runs with a negative minimal score gap (that converge to no LMM) are < 1% of "
        f"the problems (share of all trials <= {NEG_MAX}, unless its 95% Wilson interval lies above "
        f"{NEG_MAX})",
        quote="Furthermore, we found that there exist problem instances, with saturated softmax "
              "and [a negative minimal score gap], that do not converge to either LMM or GMM. [...] "
              "Specifically, we found this happens less than 1% of the problems",
        where="App. E, Fig. 9(b)"),
    "neg_cdf": Claim(
        f"Fig. 10's reading, pooled over d: a negative minimal score gap in < 1% of the saturated "
        f"runs (where the gap is defined; share <= {NEG_MAX})", kind="finding"),
    "neg_corr": Claim(
        f"in the saturated runs with a negative gap, GD still aligns with the SVM of the tokens it "
        f"selects (median corr(p, p_mm(alpha)) >= {CORR}; the paper says 'correlated [...] in "
        "average', its number is lost in the seeds text)", kind="finding"),
    "feasible": Claim("every saturated run has a feasible SVM for its selected tokens (attention can "
                      "only saturate along a separating direction)", kind="sanity"),
}
PER_D = ("lmm", "lmm_small", "neg")


def per_d_claim(key: str, d: int) -> str:
    """The statement of the per-d check ``key`` at dimension d."""
    return CLAIMS[key].text.replace("at each d", f"at d = {d}", 1)


def _note_negative(sat: pd.DataFrame) -> str:
    """What the saturated runs with a negative minimal score gap look like."""
    neg = sat[sat.min_score_gap < 0]
    if not len(neg):
        return ""
    return (f"{len(neg)} runs: median gap {neg.min_score_gap.median():.3f}, "
            f"{(neg.min_score_gap > -0.1).mean():.0%} within 0.1 of a tie; median corr(p, p_mm(alpha)) = "
            f"{neg.corr_lmm.median():.4f} (the paper attributes such runs to near-tied scores and a "
            "finite number of iterations)")


def judge(tables, cfg):
    df = tables["trials"]
    sat = df[df.saturated.astype(bool)]
    tab = per_d(df)
    checks = []
    for key, what, hit, col in (("trend_sat", "saturated", df.saturated.astype(bool), "share_saturated"),
                                ("trend_gmm", "GMM", df.outcome == "GMM", "share_gmm")):
        z, pval = trend_test(df.d, hit)
        sh = tab[col].to_numpy()
        drops = int((np.diff(sh) < 0).sum())
        checks.append(CLAIMS[key].check(
            f"{what} shares by d = {tab.d.tolist()}: {', '.join(f'{v:.3f}' for v in sh)}; z = {z:.3g}, "
            + (f"p = {pval:.2g}" if pval > 0 else "p < 1e-300"),
            bool(pval < ALPHA), f"{drops} of {len(sh) - 1} steps in d decrease the share"
                                + ("" if drops == 0 else " (the trend is not monotone)")))
    for d in tab.d:
        all_d, s_d = df[df.d == d], sat[sat.d == d]
        judged = s_d[~(s_d.min_score_gap < 0)]
        k_conv = int(judged.outcome.isin(["LMM", "GMM"]).sum())
        other = judged[~judged.outcome.isin(["LMM", "GMM"])]
        lo, hi = wilson(k_conv, len(judged))
        key = "lmm" if d >= LARGE_D else "lmm_small"
        checks.append(CLAIMS[key].check(
            f"{k_conv} of {len(judged)} saturated runs with gap >= 0 = "
            + (f"{k_conv / len(judged):.4f} (95% CI {lo:.4f}-{hi:.4f}; fails when the whole "
               f"interval is below {CONV_MIN})" if len(judged) else "nan"),
            bool(len(judged)) and hi >= CONV_MIN,
            (f"{len(other)} miss: {int((~other.svm_feasible.astype(bool)).sum())} with an infeasible SVM, "
             f"median corr with p_mm(alpha) {other.corr_lmm.median():.3f}" if len(other) else "")
            + ("" if len(judged) else "no saturated run with a non-negative gap at this d"),
            claim=per_d_claim(key, int(d))))
        k = int((s_d.min_score_gap < 0).sum())
        lo, hi = wilson(k, len(all_d))
        checks.append(CLAIMS["neg"].check(
            f"{k} of {len(all_d)} problems = "
            + (f"{k / len(all_d):.4f} (95% CI {lo:.4f}-{hi:.4f}; fails when the whole interval "
               f"is above {NEG_MAX})" if len(all_d) else "nan"),
            bool(len(all_d)) and lo <= NEG_MAX,
            f"{len(s_d)} of {len(all_d)} saturated; of the saturated {k / max(len(s_d), 1):.2%}",
            claim=per_d_claim("neg", int(d))))
    k_neg = int((sat.min_score_gap < 0).sum())
    lo, hi = wilson(k_neg, len(sat))
    neg_d = ", ".join(f"d={r.d}: {r.negative_gap}/{r.saturated} = {r.share_negative_of_saturated:.2%}"
                      for r in tab.itertuples() if r.saturated)
    checks.append(CLAIMS["neg_cdf"].at_most(
        f"share of {len(sat)} saturated runs (95% CI {lo:.2%}-{hi:.2%})",
        k_neg / len(sat) if len(sat) else np.nan, NEG_MAX,
        f"By d: {neg_d}. Over all {len(df)} problems: {k_neg / len(df):.2%}.", fmt=".4f"))
    neg = sat[sat.min_score_gap < 0]
    checks.append(CLAIMS["neg_corr"].at_least(
        f"median corr over {len(neg)} runs", float(neg.corr_lmm.median()) if len(neg) else np.nan,
        CORR, _note_negative(sat) or "no saturated run with a negative gap"))
    checks.append(CLAIMS["feasible"].check(
        f"{int(sat.svm_feasible.sum())} of {len(sat)} feasible", bool(sat.svm_feasible.all()),
        "" if sat.svm_feasible.all() else "infeasible selections are counted as 'other'"))
    return checks


def plot(tables, cfg, out):
    df = tables["trials"]
    sh = shares(df)
    fig, ax = P.subplots(4, width=3.8, height=3.5)
    x = np.arange(len(sh))
    bottom = np.zeros(len(sh))
    for o in OUTCOMES:
        ax[0].bar(x, sh[o].values, bottom=bottom, color=OCOLOR[o], width=0.7,
                  label="LMM (not GMM)" if o == "LMM" else o)
        bottom += sh[o].values
    ax[0].set_xticks(x, [str(d) for d in sh.index])
    ax[0].set_ylim(0, 1)
    P.label(ax[0], "dimension d", "share of trials", f"(a) outcomes, {cfg['trials']} trials per d")
    ax[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    g = df.min_score_gap[df.saturated].dropna().values
    bins = np.arange(np.floor(g.min() / 0.05) * 0.05, g.max() + 0.05, 0.05) if len(g) else 10
    ax[1].hist(g, bins=bins, color=P.COLORS[0], edgecolor="white")
    ax[1].axvline(0, color="gray", ls="--", lw=1)
    ax[1].set_yscale("log")
    P.label(ax[1], "minimal score gap (bin width 0.05)", "count (saturated runs)", "(b) histogram")
    gs = np.sort(g)
    ax[2].plot(gs, np.arange(1, len(gs) + 1) / max(len(gs), 1), color=P.COLORS[0])
    ax[2].axvline(0, color="gray", ls="--", lw=1, label="gap = 0")
    ax[2].axhline(NEG_MAX, color=P.COLORS[1], ls=":", lw=1, label="paper: < 1% below 0")
    P.label(ax[2], "minimal score gap", "cumulative probability", "(c) CDF (Figure 10)")
    tab = per_d(df)
    x = np.arange(len(tab))
    ax[3].bar(x, 100 * tab.share_negative_of_saturated.fillna(0).to_numpy(), width=0.7, color=P.COLORS[0])
    ax[3].axhline(100 * NEG_MAX, color=P.COLORS[1], ls=":", lw=1.5, label="paper: < 1%")
    ax[3].set_xticks(x, [str(d) for d in tab.d])
    P.label(ax[3], "dimension d", "% of saturated runs", "(d) negative minimal score gap by d")
    return [P.save(fig, out, "mmts_fig9")]


_C = dict(ds=[2, 4, 6, 8, 10, 15, 20], n=6, T=8, lr=1.0, seed=0, pad=False, population=1000)
EXPERIMENT = Experiment(
    name="mmts-fig9", title="Figures 9-10: over-parameterisation Monte-Carlo (outcomes, score gaps)",
    claim="As d grows more NGD runs saturate and converge to the GMM; saturated runs converge "
          "to an LMM (corr > 0.99) almost always; saturated runs with a negative minimal score "
          "gap are rare (< 1% of the problems).",
    configs={"tiny": {**_C, "ds": [2, 10, 20], "trials": 6, "steps": 100},
             "quick": {**_C, "trials": 150, "steps": 1000},
             "full": {**_C, "trials": 1000, "steps": 1000}},
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()),
    deviations=(
        "n = 6, T = 8, the d grid and the saturation threshold are not in the text: App. E reads "
        "'using [ ], [ ], and conducted 1,000 random trials for varying [ ]' and 'at least [ ]' in "
        "the seeds text (the symbols were lost in extraction). n = 6, T = 8 and d in {2, 4, 6, 8, "
        "10, 15, 20} are read from the paper's Figure 9, not from its text; 0.99 is THEORY.md's "
        "saturation and convergence level. lr 1, 1000 iterations, 1000 trials per d, tokens and "
        "head uniform on the sphere, random labels and W = I are in the text.",
        "The LMM and negative-gap claims are judged per d (Fig. 9(b) shows the gaps for each d). "
        "'Less than 1% of the problems' is counted over all problems at that d (the sentence's "
        "denominator); Fig. 10's reading over the saturated runs, pooled over d, is a finding.",
        "'Almost always converges to an LMM' is judged on the saturated runs with a non-negative "
        "minimal score gap: a run with a negative gap is not an LMM by definition and is counted "
        "once, by the < 1% claim.",
        "Per d the samples are small (150 problems at the quick scale, 1000 at full), so a per-d "
        "share is judged with its 95% Wilson interval: 'below 1%' fails when the whole interval "
        "is above 1%, 'almost always' (>= 0.99) when the whole interval is below 0.99 (the "
        "paper's thresholds; the point estimates are reported). Pooled shares (the finding) use "
        "the point estimate.",
        "The paper states that the saturated and GMM shares grow with d without a test; attnsvm "
        "tests the trend over the whole d grid with a one-sided Cochran-Armitage test at level 0.05.",
    ),
)
