"""mmts-fig8: verdict logic on hand-built tables; the GMM / LMM directions in closed form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import mmts_fig8 as fig8

CFG = fig8.EXPERIMENT.config("tiny")


def _tables(outs=("LMM", "LMM", "GMM", "GMM"), loc=True, nb1=0, pop=None, second=True):
    oc = pd.DataFrame([dict(start=i, c=60.0 * i, alpha="0,1" if o == "LMM" else "0,0", corr=0.999,
                            outcome=o) for i, o in enumerate(outs)])
    svm = pd.DataFrame([dict(name="GMM", locally_optimal=True, neighbours_seq1=1),
                        dict(name="LMM", locally_optimal=loc, neighbours_seq1=nb1)])
    pop = pop or {1: ("GMM", "LMM"), 2: ("GMM", "GMM")}
    runs = pd.DataFrame([dict(dataset=k, start=j, outcome=o, alpha="0,0", corr_gmm=0.999, corr_lmm=0.999)
                         for k, outs_k in {0: ("GMM", "LMM"), **pop}.items() for j, o in enumerate(outs_k)])
    sets = pd.DataFrame(dict(dataset=[0, 1, 2], gmm_locally_optimal=True, other_lmms=[1, int(second), 1]))
    return {"outcome": oc, "svm": svm, "population": runs, "datasets": sets}


KEYS = {c.text: k for k, c in fig8.CLAIMS.items()}


def _failing(checks) -> set:
    return {KEYS[c.claim] for c in checks if not c.passed}


def test_judge_passes_on_the_predicted_outcomes():
    checks = fig8.judge(_tables(), CFG)
    assert _failing(checks) == set() and [KEYS[c.claim] for c in checks] == list(fig8.CLAIMS)
    assert [c.kind for c in checks] == ["sanity", "claim", "claim", "finding", "finding", "finding"]


CASES = [  # (input violating a verdict, the verdicts it breaks)
    (dict(loc=False), {"lmm_loc"}),
    (dict(nb1=1), {"lmm_loc"}),
    (dict(outs=("LMM",) * 4), {"gmm"}),                                   # GMM never reached
    (dict(outs=("GMM",) * 4), {"lmm"}),                                   # global convergence after all
    (dict(outs=("LMM", "other", "GMM", "not saturated")), {"every"}),
    (dict(pop={1: ("GMM", "GMM"), 2: ("GMM", "GMM")}), {"pop_lmm"}),      # no jittered dataset reaches its LMM
    (dict(second=False, pop={1: ("GMM", "LMM"), 2: ("GMM", "GMM")}), {"pop_lmm"}),  # ... where a 2nd LMM exists
    (dict(pop={1: ("GMM", "LMM"), 2: ("GMM", "other")}), {"pop_all"}),   # a population run misses
]


@pytest.mark.parametrize("kw, failing", CASES)
def test_every_check_fails_on_an_input_that_violates_it(kw, failing):
    assert _failing(fig8.judge(_tables(**kw), CFG)) == failing


def test_every_declared_verdict_has_a_violating_input():
    assert set().union(*(f for _, f in CASES)) == set(fig8.CLAIMS)


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


def test_population_at_the_tiny_scale():
    t = fig8.compute(CFG)
    runs, sets = t["population"], t["datasets"]
    assert len(sets) == CFG["datasets"] and len(runs) == CFG["datasets"] * len(CFG["starts"])
    assert sets.gmm_locally_optimal[0] and sets.other_lmms[0] == 1  # the figure's dataset
    pop_all = next(c for c in fig8.judge(t, CFG) if KEYS[c.claim] == "pop_all")
    assert f"({CFG['datasets']} datasets x {len(CFG['starts'])} starts)" in pop_all.measured
