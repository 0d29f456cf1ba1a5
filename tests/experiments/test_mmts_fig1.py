"""mmts-fig1: verdict logic on hand-built tables, SVM directions and outcome rule in closed form."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from attnsvm.data import mmts_fig1
from attnsvm.experiments import mmts_fig1 as fig1

CFG = fig1.EXPERIMENT.config("tiny")


def _tables(a=("GMM",) * 6, b=("GMM",) * 4 + ("LMM",) * 2, c=("GMM",) * 6, loc_a=False, loc_b=True):
    rows = []
    for panel, outs in zip("abc", (a, b, c)):
        for s, o in enumerate(outs):
            rows.append(dict(panel=panel, start=s, c=float(s), alpha="1" if o == "LMM" else "0",
                             p_max=1.0, corr=0.999, locally_optimal=True, outcome=o))
    svm = pd.DataFrame([dict(panel="a", alpha=1, locally_optimal=loc_a),
                        dict(panel="b", alpha=1, locally_optimal=loc_b)])
    return {"outcome": pd.DataFrame(rows), "svm": svm}


def test_judge_passes_on_the_predicted_outcomes():
    assert all(c.passed for c in fig1.judge(_tables(), CFG))


@pytest.mark.parametrize("kw, failing", [
    (dict(a=("GMM",) * 5 + ("other",)), 0),          # one start of (a) misses the GMM
    (dict(loc_a=True), 1),                            # token 1 wrongly locally optimal at s = 0.9
    (dict(b=("GMM", "GMM", "LMM", "LMM", "not saturated")), 2),  # a start of (b) does not converge
    (dict(b=("GMM",) * 6), 3),                        # no start reaches the LMM
    (dict(c=("LMM",) + ("GMM",) * 5), 4),             # multi-input run misses p_mm
])
def test_judge_fails_when_a_prediction_fails(kw, failing):
    checks = fig1.judge(_tables(**kw), CFG)
    assert not checks[failing].passed
    assert sum(not c.passed for c in checks) == 1


@pytest.fixture(scope="module")
def tiny():
    return fig1.compute(CFG)


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
                  [0.01, 0.0, 0.0]])   # near 0: attention not saturated
    tr = SimpleNamespace(W=P)
    oc = fig1.outcomes(tr, data)
    assert oc.outcome.tolist() == ["GMM", "LMM", "not saturated"]
    assert oc.alpha.tolist()[:2] == ["0", "1"]
    assert oc["corr"][1] == pytest.approx(1.0)
