"""tfsvm-paths: verdict logic on hand-built population tables; the population's recipe and
prefix property; the recorded paths against an independent correlation at the tiny scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import tfsvm_paths as tp
from attnsvm.metrics import correlation

CFG = tp.EXPERIMENT.config("tiny")


def _tables(w=(0.999, 0.90), kq=(0.90, 0.999), cfn=0.9, S=10, bad_w=0, bad_kq=0, informative=10):
    fin = []
    for m, (cf, cn), bad in (("W", w, bad_w), ("KQ", kq, bad_kq)):
        for b in range(S):
            f, n = (0.3, 0.3) if b < bad else (cf, cn)
            fin.append(dict(model=m, dataset=b, corr_fro=f, corr_nuc=n, reached_opt=b >= bad,
                            p_sel_min=1.0))
    svm = pd.DataFrame(dict(dataset=np.arange(S), feasible=True, rank_fro=2, rank_nuc=1,
                            corr_fro_nuc=np.where(np.arange(S) < informative, cfn, 0.99)))
    return {"final": pd.DataFrame(fin), "svm": svm}


def test_judge_passes_when_each_model_finds_its_svm():
    checks = tp.judge(_tables(), CFG)
    assert all(c.passed for c in checks)
    assert [c.sanity for c in checks] == [False] * 4 + [True]


@pytest.mark.parametrize("kw, failing", [
    (dict(w=(0.95, 0.90)), [0]),                # W not converged to W_fro
    (dict(w=(0.991, 0.995)), [1]),              # W closer to the nuclear SVM
    (dict(kq=(0.90, 0.95)), [2]),               # KQ not converged to W_nuc
    (dict(kq=(0.999, 0.995)), [3]),             # KQ closer to the Frobenius SVM
    (dict(bad_w=1), [0]),                       # one dataset of ten elsewhere: mean < 0.99
    (dict(bad_kq=2), [2, 3]),                   # two of ten: mean and the 90% share fail
    (dict(informative=4), [4]),                 # too few datasets whose SVMs differ
])
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tp.judge(_tables(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_uninformative_datasets_do_not_count_for_the_comparison():
    t = _tables(informative=6)
    f = t["final"]
    f.loc[(f.model == "W") & (f.dataset >= 6), ["corr_fro", "corr_nuc"]] = (0.995, 0.999)
    checks = tp.judge(t, CFG)
    assert checks[1].passed and "6 informative datasets" in checks[1].note


def test_population_is_the_recipe_and_a_prefix():
    data, K0 = tp.paths_population(6, seed=0, chunk=4)
    small, K0s = tp.paths_population(3, seed=0, chunk=4)
    assert np.array_equal(data.X[:3], small.X) and np.array_equal(K0[:3], K0s)
    assert data.X.shape == (6, 2, 3, 2) and np.all(data.y == 1)
    assert np.allclose(np.linalg.norm(data.z, axis=-1), 1) and np.allclose(np.linalg.norm(data.v, axis=-1), 1)
    assert (data.X[:, 0, :, 0].mean(-1) < data.X[:, 1, :, 0].mean(-1)).all()  # (-1, 0) vs (1, 0)


def test_tiny_population_paths_match_an_independent_correlation():
    t = tp.compute(CFG)
    svm, path, fin = t["svm"], t["path"], t["final"]
    assert len(svm) == CFG["S"] and set(fin.model) == {"W", "KQ"}
    for nm in ("fro", "nuc"):
        R = svm[[f"{nm}_{e}" for e in tp.ENTRIES]].to_numpy(float).reshape(-1, 2, 2)
        for m in ("W", "KQ"):
            d = path[(path.model == m) & (path.norm > 0)]
            W = d[tp.ENTRIES].to_numpy().reshape(-1, 2, 2)
            assert np.allclose(correlation(W, R[d.dataset.to_numpy()]), d[f"corr_{nm}"], atol=1e-10)
            last = d[d.step == d.step.max()].set_index("dataset")[f"corr_{nm}"]
            f = fin[fin.model == m].set_index("dataset")[f"corr_{nm}"]
            assert np.allclose(last.reindex(f.index), f)
    assert tp.shown_dataset(svm) in set(svm.dataset)
