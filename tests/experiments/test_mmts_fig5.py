"""mmts-fig5: verdict logic on tables built to pass and to fail; attention, logit gaps and the
population in closed form at the tiny scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import mmts_fig5 as fig5

CFG = fig5.EXPERIMENT.config("tiny")


KEYS = {c.text: k for k, c in fig5.CLAIMS.items()}


def _paths(corr=(0.0, 0.3, 1.2), logi=(0.0, -0.1, -2.0), pop_corr=None, pop_logi=None, support=True):
    """Dataset 0 is the paper's symmetric geometry (logit gap = 2 p_2); dataset 1 an
    asymmetric one whose C = 1 run already has a logit gap of 0.5."""
    rows = []
    for k, base in ((0, 0.0), (1, 0.5)):
        for loss, p2s in (("correlation", corr if k == 0 else (pop_corr or corr)),
                          ("logistic", logi if k == 0 else (pop_logi or logi))):
            for C, p2 in zip((1.0, 2.0, 10.0), p2s):
                for step in (0, CFG["transient_step"]):
                    rows.append(dict(loss=loss, dataset=k, C=C, step=step, p1=1.0, p2=p2 if step else 0.0,
                                     logit_gap=(base + 2 * p2) if step else 0.0))
    geo = pd.DataFrame(dict(dataset=[0, 1], both_support=[True, support]))
    return {"paths": pd.DataFrame(rows), "datasets": geo}


def _failing(checks) -> set:
    return {KEYS[c.claim] for c in checks if not c.passed}


def test_judge_passes_on_the_predicted_bias():
    checks = fig5.judge(_paths(), CFG)
    assert _failing(checks) == set() and [KEYS[c.claim] for c in checks] == list(fig5.CLAIMS)
    assert [KEYS[c.claim] for c in checks if c.sanity] == ["ctrl", "geo"]


CASES = {  # an input violating each declared verdict, and the verdicts it breaks
    "corr_sign": (dict(corr=(0.0, -0.3, 1.2)), {"corr_sign", "pop_corr_sign"}),  # favours low score
    "corr_grow": (dict(corr=(0.0, 1.2, 0.3)), {"corr_grow", "pop_corr_grow"}),   # bias shrinks with C
    "logi_sign": (dict(logi=(0.0, 0.1, -2.0)), {"logi_sign", "pop_logi_sign"}),  # favours high score
    "logi_grow": (dict(logi=(0.0, -2.0, -0.1)), {"logi_grow", "pop_logi_grow"}),
    "ctrl": (dict(corr=(0.1, 0.3, 1.2)), {"ctrl"}),              # C = 1 control of the symmetric geometry biased
    "geo": (dict(support=False), {"geo"}),                        # a geometry outside the paper's construction
    "pop_corr_sign": (dict(pop_corr=(0.0, -0.01, 0.4)), {"pop_corr_sign"}),  # one geometry the wrong way
    "pop_corr_grow": (dict(pop_corr=(0.0, 1.2, 0.3)), {"pop_corr_grow"}),
    "pop_logi_sign": (dict(pop_logi=(0.0, 0.01, -0.4)), {"pop_logi_sign"}),
    "pop_logi_grow": (dict(pop_logi=(0.0, -1.2, -0.3)), {"pop_logi_grow"}),
}


@pytest.mark.parametrize("key", list(CASES))
def test_every_check_fails_on_an_input_that_violates_it(key):
    kw, failing = CASES[key]
    assert _failing(fig5.judge(_paths(**kw), CFG)) == failing
    assert set(CASES) == set(fig5.CLAIMS)


def test_control_check_fails_without_a_c1_run():
    t = _paths()
    t["paths"] = t["paths"][t["paths"].C != 1.0]
    ctrl = next(c for c in fig5.judge(t, CFG) if KEYS[c.claim] == "ctrl")
    assert not ctrl.passed and ctrl.measured == "no C = 1 run"


@pytest.fixture(scope="module")
def tiny():
    return fig5.compute(CFG)


def test_attention_and_logit_gap_match_closed_form(tiny):
    paths = tiny["paths"]
    paper = paths[paths.dataset == 0]
    # keys (0, 0) and (1, +-1): s_opt = sigmoid(p_1 +- p_2), logit gap = 2 p_2
    sig = lambda u: 1.0 / (1.0 + np.exp(-u))  # noqa: E731
    np.testing.assert_allclose(paper.s_high, sig(paper.p1 + paper.p2), rtol=1e-12)
    np.testing.assert_allclose(paper.s_low, sig(paper.p1 - paper.p2), rtol=1e-12)
    np.testing.assert_allclose(paper.logit_gap, 2 * paper.p2, atol=1e-12)
    assert (paper[paper.C == 1].p2 == 0).all()
    last = paper[paper.step == paper.step.max()]
    np.testing.assert_allclose(last.corr_mm, last.p1 / np.hypot(last.p1, last.p2), rtol=1e-10)


def test_population_geometries_at_the_tiny_scale(tiny):
    geo = tiny["datasets"]
    assert len(geo) == CFG["datasets"] and geo.both_support.all()
    np.testing.assert_allclose(geo.loc[0, ["k_high1", "k_high2", "k_low1", "k_low2"]].to_numpy(float),
                               [1, 1, 1, -1])
    data = fig5.population(CFG)
    assert data.B == CFG["datasets"] * len(CFG["Cs"])
    np.testing.assert_array_equal(data.X[:, 0, 1, 2], np.tile(CFG["Cs"], CFG["datasets"]))
    np.testing.assert_array_equal(data.X[:, :, 0], 0.0)  # the non-optimal tokens stay at the origin
    at = fig5.transient(tiny["paths"], CFG)
    assert (at[at.C == 1].delta == 0).all()
    geo_check = next(c for c in fig5.judge(tiny, CFG) if KEYS[c.claim] == "geo")
    assert geo_check.passed and f"{CFG['datasets']} of {CFG['datasets']}" in geo_check.measured
