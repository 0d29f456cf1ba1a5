"""mmts-fig1: verdict logic on tables built to pass and to fail, SVM directions and the outcome
rule in closed form, and the populations at the tiny scale."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from attnsvm.data import jitter_keys, mmts_fig1, mmts_fig1_notebook
from attnsvm.experiments import mmts_fig1 as fig1

CFG = fig1.EXPERIMENT.config("tiny")


@pytest.fixture(scope="module")
def tiny():
    return fig1.compute(CFG)


def _good(tiny) -> dict:
    """The tiny tables with every outcome set to what the theory predicts."""
    t = {k: v.copy() for k, v in tiny.items()}
    oc = t["outcome"]
    oc["outcome"] = "GMM"
    oc.loc[(oc.panel == "b") & (oc.c < 0), "outcome"] = "LMM"
    runs = t["population"]
    runs["outcome"] = "GMM"
    lo1 = t["datasets"][(t["datasets"].panel == "b") & t["datasets"].token1_locally_optimal.astype(bool)].dataset
    cone = (runs.panel == "b") & (runs.kind == "cone") & runs.dataset.isin(lo1)
    runs.loc[cone, "outcome"] = "LMM"
    return t


KEYS = {c.text: k for k, c in fig1.CLAIMS.items()}


def _check(checks, key):
    hits = [c for c in checks if KEYS[c.claim] == key]
    assert len(hits) == 1, key
    return hits[0]


def _failing(checks) -> set:
    return {KEYS[c.claim] for c in checks if not c.passed}


def test_judge_passes_on_the_predicted_outcomes(tiny):
    checks = fig1.judge(_good(tiny), CFG)
    assert _failing(checks) == set()
    assert [KEYS[c.claim] for c in checks] == list(fig1.CLAIMS)
    assert [c.sanity for c in checks].count(True) == 3


def _set(table, panel, value, col="outcome", kind=None, first=True, **where):
    def go(t):
        tab = t[table]
        m = tab.panel == panel
        if kind is not None:
            m &= tab.kind == kind
        for k, v in where.items():
            m &= tab[k] == v
        idx = tab.index[m][:1] if first else tab.index[m]
        tab.loc[idx, col] = value
    return go


def _widest_cone_misses(t):
    runs = t["population"]
    big = (runs.panel == "b") & (runs.kind == "cone") & (runs.R == max(CFG["cone_norms"]))
    runs.loc[big, "outcome"] = "GMM"  # the widest start misses, the narrowest reaches: no growth


BREAK = {  # one input per declared verdict that violates it, and the verdicts it breaks
    "fig_a": (_set("outcome", "a", "other"), {"fig_a"}),
    "loc": (_set("svm", "a", True, col="locally_optimal", alpha=1), {"loc"}),
    "fig_b_any": (_set("outcome", "b", "other", c=1.0), {"fig_b_any"}),
    "fig_b_lmm": (_set("outcome", "b", "GMM", first=False), {"fig_b_lmm"}),
    "fig_c": (_set("outcome", "c", "LMM"), {"fig_c"}),
    "prem_a": (_set("datasets", "a", 1, col="other_lmms"), {"prem_a"}),
    "pop_a": (_set("population", "a", "other"), {"pop_a"}),
    "pop_b": (_set("population", "b", "other", kind="figure"), {"pop_b"}),
    "cone": (_widest_cone_misses, {"cone"}),
    "prem_c": (_set("datasets", "c", False, col="assumption_b"), {"prem_c"}),
    "pop_c": (_set("population", "c", "not the GMM"), {"pop_c"}),
}


@pytest.mark.parametrize("key", list(BREAK))
def test_every_check_fails_on_an_input_that_violates_it(tiny, key):
    t = _good(tiny)
    brk, failing = BREAK[key]
    brk(t)
    assert _failing(fig1.judge(t, CFG)) == failing
    assert set(BREAK) == set(fig1.CLAIMS)  # every declared verdict has a violating input


def test_theorem3_cone_check_reports_the_shares(tiny):
    t = _good(tiny)
    sets = t["datasets"]
    lo1 = sets[(sets.panel == "b") & sets.token1_locally_optimal.astype(bool)].dataset
    assert len(lo1), "the tiny population must contain a locally optimal token 1"
    _widest_cone_misses(t)
    check = _check(fig1.judge(t, CFG), "cone")
    assert not check.passed and "R=5: 0.00" in check.measured


def test_svm_directions_match_closed_form(tiny):
    svm = tiny["svm"].set_index(["panel", "alpha"])
    # (a) token 0 (key (-0.1, 1)): only the constraint against token 2 (key 0) is active
    p = svm.loc[("a", 0), ["p1", "p2", "p3"]].to_numpy(float)
    np.testing.assert_allclose(p, np.array([-0.1, 1.0, 0.0]) / 1.01, atol=1e-8)
    # (b) token 1 (key (1, 0)): p = (1, 0, 0), neighbour token 2 only -> locally optimal
    np.testing.assert_allclose(svm.loc[("b", 1), ["p1", "p2", "p3"]].to_numpy(float), [1, 0, 0],
                               atol=1e-8)
    assert svm.loc[("b", 1), "neighbours"] == "[2]" and svm.loc[("b", 1), "locally_optimal"]
    assert not svm.loc[("a", 1), "locally_optimal"]


def test_paths_start_at_the_given_starts(tiny):
    p = tiny["paths"]
    first = p[p.step == 0].sort_values(["panel", "start"])
    ab = first[first.panel != "c"]
    np.testing.assert_array_equal(ab.p2.to_numpy(), ab.c.to_numpy())
    np.testing.assert_array_equal(ab.p1.to_numpy(), 0.0)
    cc = first[first.panel == "c"]
    np.testing.assert_array_equal(cc.p1.to_numpy(), cc.c.to_numpy())


def test_outcome_rule_on_hand_made_prompts():
    data = mmts_fig1(0.0)
    P = np.array([[-5.0, 50.0, 0.0],   # along p_mm(token 0) ~ (-0.1, 1): GMM
                  [50.0, 0.0, 0.0],    # along p_mm(token 1) = (1, 0): LMM
                  [-1.0, -1.0, 0.0]])  # selects token 2 (score 0, not locally optimal): other
    oc = fig1.outcomes(SimpleNamespace(W=P), data)
    assert oc.outcome.tolist() == ["GMM", "LMM", "other"]
    assert oc.alpha.tolist() == ["0", "1", "2"]
    assert oc["corr"][1] == pytest.approx(1.0)


def test_populations_contain_the_figures_dataset_and_check_assumptions(tiny):
    pa = fig1.population("a", CFG)
    np.testing.assert_array_equal(pa.X[0], mmts_fig1(0.9).X)
    assert not np.array_equal(pa.X[1], pa.X[0])
    np.testing.assert_array_equal(pa.X[1, ..., 2], pa.X[0, ..., 2])  # scores kept, keys jittered
    np.testing.assert_array_equal(fig1.population("c", CFG).X[0], mmts_fig1_notebook([0]).X[0])
    sets = tiny["datasets"]
    a = sets[sets.panel == "a"]
    assert a.assumption_b.all() and (a.other_lmms == 0).all()   # Theorem 2's premises
    b = sets[sets.panel == "b"]
    assert not b.assumption_b.any()                              # scores (1, 0.9, 0)
    assert bool(b.token1_locally_optimal.iloc[0])                # the figure's (b)
    assert b.opt_margin_at_lmm.iloc[0] == pytest.approx(1.1)     # (k_1 - k_0) . (1, 0) = 1.1


def test_population_runs_at_the_tiny_scale(tiny):
    runs = tiny["population"]
    S = len(CFG["starts"])
    K = CFG["datasets"]
    for panel in "abc":
        r = runs[runs.panel == panel]
        extra = len(CFG["cone_norms"]) if panel == "b" else 0
        assert len(r) == K[panel] * (S + extra)
    assert set(runs[runs.kind == "cone"].R) == set(CFG["cone_norms"])
    checks = fig1.judge(tiny, CFG)
    assert f"({K['a']} datasets x {S} starts)" in _check(checks, "pop_a").measured


def test_lmm_census_finds_the_second_lmm_of_figure_8():
    from attnsvm.experiments.mmts_fig8 import fig8_data

    c = fig1.lmm_census(fig8_data().X[None])
    assert c.gmm_locally_optimal[0] and c.other_lmms[0] == 1
    pop = jitter_keys(mmts_fig1(0.9), 3)
    assert (fig1.lmm_census(pop.X).other_lmms == 0).all()
