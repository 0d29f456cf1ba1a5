"""tfsvm-local: verdict logic on hand-built tables (including excluded runs) and the
consistency of the final curve point with the per-run table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import tfsvm_local as tl

CFG = tl.EXPERIMENT.config("tiny")


def _runs(n=20, w=(0.999, 0.9), kq=(0.9, 0.999), sat=1.0, feas=1.0):
    rows = []
    for m, (cf, cn) in (("W", w), ("KQ", kq)):
        for b in range(n):
            rows.append(dict(model=m, trial=b, p_max=1.0, saturated=b < sat * n,
                             feasible=b < feas * n, corr_fro=cf, corr_nuc=cn))
    return {"runs": pd.DataFrame(rows)}


def test_judge_passes_on_the_predicted_behaviour():
    assert all(c.passed for c in tl.judge(_runs(), CFG))


@pytest.mark.parametrize("kw, failing", [
    (dict(sat=0.5), [0, 3]),                  # half the runs do not saturate
    (dict(w=(0.95, 0.9)), [1]),               # W not aligned with W_fro
    (dict(w=(0.995, 0.998)), [2]),            # W closer to the nuclear SVM
    (dict(kq=(0.9, 0.95)), [4]),              # KQ not aligned with W_nuc
    (dict(kq=(0.999, 0.995)), [5]),           # KQ closer to the Frobenius SVM
])
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tl.judge(_runs(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_excluded_runs_are_counted_in_the_note():
    checks = tl.judge(_runs(feas=0.75), CFG)
    assert "15 of 20 runs included" in checks[1].note and "5 SVM infeasible" in checks[1].note


def test_final_curve_point_is_the_reported_correlation():
    t = tl.compute(CFG)
    runs, curves = t["runs"], t["curves"]
    last = curves[curves.step == curves.step.max()].set_index(["model", "trial"])
    r = runs.set_index(["model", "trial"])
    for c in ("corr_fro", "corr_nuc"):
        assert np.allclose(last[c], r[c].reindex(last.index), equal_nan=True)
    assert set(runs.rank_fro[runs.feasible]) <= set(range(1, CFG["n"] + 1))  # rank <= min(n, d)
