"""tfsvm-local: verdict logic on hand-built population tables (including runs left out);
the population's starts and prefix property; the final curve point against the per-run
table at the tiny scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import tfsvm_local as tl

CFG = tl.EXPERIMENT.config("tiny")


def _runs(n=20, w=(0.999, 0.9), kq=(0.9, 0.999), pmax=1.0, feas=1.0, bad_w=0):
    rows = []
    for m, (cf, cn) in (("W", w), ("KQ", kq)):
        for b in range(n):
            f, c = (0.5, 0.5) if (m == "W" and b < bad_w) else (cf, cn)
            rows.append(dict(model=m, trial=b, p_max=pmax, saturated=pmax >= tl.SATURATED,
                             opt=True, feasible=b < feas * n, corr_fro=f, corr_nuc=c))
    return {"runs": pd.DataFrame(rows)}


def test_judge_passes_on_the_predicted_behaviour():
    checks = tl.judge(_runs(), CFG)
    assert all(c.passed for c in checks)
    assert [c.kind for c in checks] == ["claim", "claim", "finding"] * 2 + ["sanity"]
    assert all(c.quote and c.where for c in checks if c.kind == "claim")


FAILS = [  # (tables built to fail, the indices of the checks that fail)
    (dict(pmax=0.9), [0, 3]),                 # the attention does not saturate
    (dict(w=(0.95, 0.9)), [1]),               # W not aligned with W_fro
    (dict(w=(0.995, 0.998)), [2]),            # W closer to the nuclear SVM
    (dict(kq=(0.9, 0.95)), [4]),              # KQ not aligned with W_nuc
    (dict(kq=(0.999, 0.995)), [5]),           # KQ closer to the Frobenius SVM
    (dict(bad_w=1), [1]),                     # one run of 20 elsewhere: the mean drops below
    (dict(bad_w=3), [1, 2]),                  # three of 20: the 90% share fails too
    (dict(feas=0.75), [6]),                   # SVMs infeasible in some runs: sanity check
]


@pytest.mark.parametrize("kw, failing", FAILS)
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tl.judge(_runs(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_every_declared_verdict_is_judged_in_order_and_has_a_violating_input():
    checks = tl.judge(_runs(), CFG)
    assert [(c.kind, c.quote, c.where) for c in checks] == [
        (v.kind, v.quote, v.where) for v in tl.CLAIMS.values()]
    assert tl.EXPERIMENT.verdicts == tuple(tl.CLAIMS.values())
    assert set().union(*(failing for _, failing in FAILS)) == set(range(len(tl.CLAIMS)))


def test_left_out_runs_are_counted_in_the_note():
    checks = tl.judge(_runs(feas=0.75), CFG)
    assert "15 of 20 runs have a feasible SVM" in checks[1].note


def test_population_starts_and_prefix():
    cfg = dict(CFG, S=5, chunk=2)
    data, init = tl.population(cfg)
    small, init_s = tl.population(dict(cfg, S=3))
    assert np.array_equal(data.X[:3], small.X) and np.array_equal(init["K"][:3], init_s["K"])
    d = cfg["d"]
    for k in ("W", "K", "Q"):
        assert init[k].shape == (5, d, d) and (np.abs(init[k]) <= 1 / np.sqrt(d)).all()
    assert not np.allclose(init["K"], init["Q"])


def test_final_curve_point_is_the_reported_correlation():
    t = tl.compute(CFG)
    runs, curves = t["runs"], t["curves"]
    last = curves[curves.step == curves.step.max()].set_index(["model", "trial"])
    r = runs.set_index(["model", "trial"])
    for c in ("corr_fro", "corr_nuc"):
        assert np.allclose(last[c], r[c].reindex(last.index), equal_nan=True)
    assert set(runs.rank_fro[runs.feasible]) <= set(range(1, CFG["n"] + 1))  # rank <= min(n, d)
