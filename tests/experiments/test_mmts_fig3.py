"""mmts-fig3: verdict logic on hand-built tables; SVMs and probabilities in closed form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.data import mmts_fig3
from attnsvm.experiments import mmts_fig3 as fig3

CFG = fig3.EXPERIMENT.config("tiny")


def _tables(a=None, b=None, sv_a="[0, 1, 2]", sv_b="[0, 1]"):
    good = dict(corr_p_att=0.999, corr_p_relaxed=0.999, corr_v_head=0.999, softmax_prob=0.999,
                logistic_prob=0.999, max_logit_gap=20.0)
    rows = [dict(good, variant="a", **(a or {})),
            dict(good, variant="b", corr_p_att=0.98, **(b or {}))]
    paths = pd.DataFrame([dict(r, step=s) for r in rows for s in (0, 10)])
    svm = pd.DataFrame([dict(variant="a", problem="head", support=sv_a),
                        dict(variant="b", problem="head", support=sv_b)])
    return {"paths": paths, "svm": svm}


def test_judge_passes_on_the_predicted_limits():
    assert all(c.passed for c in fig3.judge(_tables(), CFG))


@pytest.mark.parametrize("kw, failing", [
    (dict(sv_a="[0, 1]"), [0]),
    (dict(a=dict(corr_p_att=0.9)), [1]),
    (dict(a=dict(corr_v_head=0.5)), [2]),
    (dict(sv_b="[0, 1, 2]"), [3]),
    (dict(b=dict(corr_p_relaxed=0.97)), [4, 5]),   # p went to the ATT-SVM instead
    (dict(b=dict(corr_v_head=0.2)), [6]),
    (dict(a=dict(softmax_prob=0.6)), [7]),
    (dict(a=dict(logistic_prob=0.6)), [8]),
])
def test_judge_fails_when_a_prediction_fails(kw, failing):
    checks = fig3.judge(_tables(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


@pytest.fixture(scope="module")
def tiny():
    return fig3.compute(CFG)


def test_svm_solutions_match_closed_form(tiny):
    svm = tiny["svm"].set_index(["variant", "problem"])

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
        row = paths[(paths.variant == v) & (paths.step == 0)].iloc[0]
        assert row.softmax_prob == pytest.approx(s[:, 1].mean(), rel=1e-12)
        assert row.logistic_prob == pytest.approx((1 / (1 + np.exp(-y * f))).mean(), rel=1e-12)
