"""mmts-fig8: verdict logic on hand-built tables; the GMM / LMM directions in closed form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import mmts_fig8 as fig8

CFG = fig8.EXPERIMENT.config("tiny")


def _tables(outs=("LMM", "LMM", "GMM", "GMM"), loc=True, nb1=0):
    oc = pd.DataFrame([dict(start=i, c=60.0 * i, alpha="0,1" if o == "LMM" else "0,0", corr=0.999,
                            outcome=o) for i, o in enumerate(outs)])
    svm = pd.DataFrame([dict(name="GMM", locally_optimal=True, neighbours_seq1=1),
                        dict(name="LMM", locally_optimal=loc, neighbours_seq1=nb1)])
    return {"outcome": oc, "svm": svm}


def test_judge_passes_on_the_predicted_outcomes():
    assert all(c.passed for c in fig8.judge(_tables(), CFG))


@pytest.mark.parametrize("kw, failing", [
    (dict(loc=False), [0]),
    (dict(nb1=1), [0]),
    (dict(outs=("LMM",) * 4), [1]),                           # GMM never reached
    (dict(outs=("GMM",) * 4), [2]),                           # LMM never reached: global convergence
    (dict(outs=("LMM", "other", "GMM", "not saturated")), [3]),
])
def test_judge_fails_when_a_prediction_fails(kw, failing):
    checks = fig8.judge(_tables(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_the_two_directions_match_closed_form():
    svm = fig8.compute(CFG)["svm"].set_index("name")
    # GMM: p1 >= 1 (seq 0) and -(2, 1).p >= 1 (seq 1), both active -> (1, -3)
    np.testing.assert_allclose(svm.loc["GMM", ["p1", "p2", "p3"]].to_numpy(float), [1, -3, 0],
                               atol=1e-7)
    # LMM: only p1 >= 1 active; (2, 1).p = 2 > 1 leaves sequence 1 without SVM-neighbours
    np.testing.assert_allclose(svm.loc["LMM", ["p1", "p2", "p3"]].to_numpy(float), [1, 0, 0],
                               atol=1e-7)
    assert svm.loc["LMM", "neighbours_seq1"] == 0 and svm.loc["LMM", "locally_optimal"]
    data = fig8.fig8_data()
    assert data.opt.tolist() == [0, 0] and data.gamma[1, 1] < data.gamma[1, 0]
