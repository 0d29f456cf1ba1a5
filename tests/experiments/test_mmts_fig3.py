"""mmts-fig3: verdict logic on tables built to pass and to fail; SVMs, probabilities and the
populations in closed form at the tiny scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.data import mmts_fig3, mmts_fig3_population
from attnsvm.experiments import mmts_fig3 as fig3

CFG = fig3.EXPERIMENT.config("tiny")
K = 3


def _tables(a=None, b=None, sv_a="[0, 1, 2]", sv_b="[0, 1]", pop_b=None, case_b=True):
    good = dict(corr_p_att=0.999, corr_p_relaxed=0.999, corr_v_head=0.999, softmax_prob=0.999,
                logistic_prob=0.999, max_logit_gap=20.0)
    rows, sets = [], []
    for k in range(K):
        ra = dict(good, variant="a", dataset=k, **((a or {}) if k == 0 else {}))
        rb = dict(good, variant="b", dataset=k, corr_p_att=0.98,
                  **((b or {}) if k == 0 else (pop_b or {}) if k == 1 else {}))
        rows += [ra, rb]
        sets += [dict(variant="a", dataset=k, head_support=sv_a if k == 0 else "[0, 1, 2]", all_support=True,
                      att_feasible=True, head_feasible=True, relaxed_feasible=True, corr_att_relaxed=1.0),
                 dict(variant="b", dataset=k, head_support=sv_b if k == 0 else "[0, 1]",
                      all_support=not case_b if k == 2 else False, att_feasible=True, head_feasible=True,
                      relaxed_feasible=True, corr_att_relaxed=0.98)]
    paths = pd.DataFrame([dict(r, step=s) for r in rows for s in (0, 5, 10)])
    return {"paths": paths, "datasets": pd.DataFrame(sets)}


def test_judge_passes_on_the_predicted_limits():
    checks = fig3.judge(_tables(), CFG)
    assert all(c.passed for c in checks), [c.claim for c in checks if not c.passed]
    assert [i for i, c in enumerate(checks) if c.sanity] == [0, 8]


@pytest.mark.parametrize("kw, failing", [
    (dict(sv_a="[0, 1]"), [0]),
    (dict(a=dict(corr_p_att=0.9)), [1, 9]),
    (dict(a=dict(corr_v_head=0.5)), [2, 9]),
    (dict(sv_b="[0, 1, 2]"), [0]),
    (dict(b=dict(corr_p_relaxed=0.97)), [3, 4, 10]),   # p went to the ATT-SVM instead
    (dict(b=dict(corr_v_head=0.2)), [5, 10]),
    (dict(a=dict(softmax_prob=0.6)), [6, 11]),
    (dict(a=dict(logistic_prob=0.6)), [7, 11]),
    (dict(pop_b=dict(corr_p_relaxed=0.98)), [10]),     # one population dataset misses
    (dict(pop_b=dict(logistic_prob=0.9)), [11]),
    (dict(case_b=False), [8]),                         # a (b) dataset outside Theorem 6's case
])
def test_judge_fails_when_a_prediction_fails(kw, failing):
    checks = fig3.judge(_tables(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


@pytest.fixture(scope="module")
def tiny():
    return fig3.compute(CFG)


def test_svm_solutions_match_closed_form(tiny):
    svm = tiny["svm"][tiny["svm"].dataset == 0].set_index(["variant", "problem"])

    def sol(v, p):
        return svm.loc[(v, p), ["x1", "x2"]].to_numpy(float)

    # head SVM: v = (0, 1) in both; (a) all three support vectors, (b) u_2 = (0.5, 1.5) is not
    for v in "ab":
        np.testing.assert_allclose(sol(v, "head"), [0, 1], atol=1e-7)
    assert svm.loc[("a", "head"), "support"] == "[0, 1, 2]"
    assert svm.loc[("b", "head"), "support"] == "[0, 1]"
    # ATT-SVM with constraints p.u_i >= 1: (a) active u_1, u_2 -> (4/3, 1/3); (b) (5/4, 1/4)
    np.testing.assert_allclose(sol("a", "att"), [4 / 3, 1 / 3], atol=1e-7)
    np.testing.assert_allclose(sol("b", "att"), [1.25, 0.25], atol=1e-7)
    # relaxed SVM in (b): u_2 only needs p.u_2 >= 0 -> p = (1, 0); in (a) it equals the ATT-SVM
    np.testing.assert_allclose(sol("b", "relaxed"), [1, 0], atol=1e-7)
    np.testing.assert_allclose(sol("a", "relaxed"), sol("a", "att"), atol=1e-7)


def test_probabilities_at_the_start_match_numpy(tiny):
    paths = tiny["paths"]
    for v in "ab":
        X, y = mmts_fig3(v).X, np.array([1.0, -1.0, 1.0])
        a = X @ np.array(CFG["p0"])
        s = np.exp(a) / np.exp(a).sum(1, keepdims=True)
        f = ((s[..., None] * X).sum(1)) @ np.array(CFG["v0"])
        row = paths[(paths.variant == v) & (paths.step == 0) & (paths.dataset == 0)].iloc[0]
        assert row.softmax_prob == pytest.approx(s[:, 1].mean(), rel=1e-12)
        assert row.logistic_prob == pytest.approx((1 / (1 + np.exp(-y * f))).mean(), rel=1e-12)


def test_populations_keep_the_papers_dataset_and_the_theorems_case(tiny):
    for v in "ab":
        pop = mmts_fig3_population(v, 4)
        np.testing.assert_array_equal(pop.X[0], mmts_fig3(v).X)
        np.testing.assert_array_equal(mmts_fig3_population(v, 2).X, pop.X[:2])  # prefix
    a = mmts_fig3_population("a", 4)
    # (a): every u_i stays on the head-SVM margin y_i e_2^T u_i = 1
    np.testing.assert_array_equal(a.y[:, :, None] * a.X[:, :, 1, 1:], np.ones((4, 3, 1)))
    sets = tiny["datasets"]
    assert len(sets) == 2 * CFG["datasets"]
    assert sets[sets.variant == "a"].all_support.all()
    assert not sets[sets.variant == "b"].all_support.any()
    checks = fig3.judge(tiny, CFG)
    assert checks[8].passed and f"(a) {CFG['datasets']} of {CFG['datasets']}" in checks[8].measured
