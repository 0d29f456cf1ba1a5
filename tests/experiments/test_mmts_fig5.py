"""mmts-fig5: verdict logic on hand-built tables; attention probabilities in closed form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import mmts_fig5 as fig5

CFG = fig5.EXPERIMENT.config("tiny")


def _paths(corr=(0.0, 0.3, 1.2), logi=(0.0, -0.1, -2.0)):
    rows = []
    for loss, p2s in (("correlation", corr), ("logistic", logi)):
        for C, p2 in zip((1.0, 2.0, 10.0), p2s):
            for step in (0, CFG["transient_step"]):
                rows.append(dict(loss=loss, C=C, step=step, p1=1.0, p2=p2 if step else 0.0))
    return {"paths": pd.DataFrame(rows)}


def test_judge_passes_on_the_predicted_bias():
    assert all(c.passed for c in fig5.judge(_paths(), CFG))


@pytest.mark.parametrize("kw, failing", [
    (dict(corr=(0.0, -0.3, 1.2)), [0]),        # correlation loss favours the low-score token
    (dict(logi=(0.0, 0.1, -2.0)), [2]),        # logistic loss favours the high-score token
    (dict(logi=(0.0, -2.0, -0.1)), [3]),       # bias shrinks with C
    (dict(corr=(0.1, 0.3, 1.2)), [4]),         # C = 1 control is biased
])
def test_judge_fails_when_a_prediction_fails(kw, failing):
    checks = fig5.judge(_paths(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_attention_matches_closed_form():
    paths = fig5.compute(CFG)["paths"]
    # keys (0, 0) and (1, +-1): s_opt = sigmoid(p_1 +- p_2)
    sig = lambda u: 1.0 / (1.0 + np.exp(-u))  # noqa: E731
    np.testing.assert_allclose(paths.s_high, sig(paths.p1 + paths.p2), rtol=1e-12)
    np.testing.assert_allclose(paths.s_low, sig(paths.p1 - paths.p2), rtol=1e-12)
    assert (paths[paths.C == 1].p2 == 0).all()
    # the direction is measured against p_mm = (1, 0, 0)
    last = paths[paths.step == paths.step.max()]
    np.testing.assert_allclose(last.corr_mm, last.p1 / np.hypot(last.p1, last.p2), rtol=1e-10)
