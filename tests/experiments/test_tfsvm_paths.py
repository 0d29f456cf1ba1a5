"""tfsvm-paths: verdict logic on hand-built tables; the recorded path against an independent
correlation; the dataset's documented properties."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import tfsvm_paths as tp
from attnsvm.metrics import correlation

CFG = tp.EXPERIMENT.config("tiny")


def _tables(w=(0.999, 0.90), kq=(0.90, 0.999), cfn=0.9):
    rows = [dict(model=m, step=s, corr_fro=c[0] if s else 0.0, corr_nuc=c[1] if s else 0.0,
                 p_sel_min=1.0) for m, c in (("W", w), ("KQ", kq)) for s in (0, 100)]
    svm = pd.DataFrame([dict(norm="fro", rank=2, corr_fro_nuc=cfn),
                        dict(norm="nuc", rank=1, corr_fro_nuc=cfn)])
    return {"path": pd.DataFrame(rows), "svm": svm}


def test_judge_passes_when_each_model_finds_its_svm():
    assert all(c.passed for c in tp.judge(_tables(), CFG))


@pytest.mark.parametrize("kw, failing", [
    (dict(cfn=0.99), 0),                  # the two SVMs coincide: the setup tells nothing
    (dict(w=(0.95, 0.90)), 1),            # W not converged to W_fro
    (dict(w=(0.991, 0.995)), 2),          # W closer to the nuclear SVM
    (dict(kq=(0.90, 0.95)), 3),           # KQ not converged to W_nuc
    (dict(kq=(0.999, 0.995)), 4),         # KQ closer to the Frobenius SVM
])
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tp.judge(_tables(**kw), CFG)
    assert not checks[failing].passed
    assert sum(not c.passed for c in checks) == 1


def test_dataset_is_the_documented_one():
    data = tp.paths_dataset(20)
    assert data.X.shape == (2, 3, 2) and np.all(data.y == 1)
    assert np.allclose(np.linalg.norm(data.z, axis=1), 1) and np.isclose(np.linalg.norm(data.v), 1)
    assert data.X[0, :, 0].mean() < 0 < data.X[1, :, 0].mean()  # clusters at (-1, 0) and (1, 0)


def test_recorded_path_matches_an_independent_correlation():
    t = tp.compute(CFG)
    svm = t["svm"].set_index("norm")
    assert svm["rank"]["fro"] == 2 and svm["rank"]["nuc"] == 1  # why this seed was chosen
    for nm in ("fro", "nuc"):
        R = svm.loc[nm, tp.ENTRIES].to_numpy(float).reshape(2, 2)
        d = t["path"][t["path"].norm > 0]
        W = d[tp.ENTRIES].to_numpy().reshape(-1, 2, 2)
        assert np.allclose(correlation(W, R[None]), d[f"corr_{nm}"], atol=1e-10)
