"""tfsvm-multitoken: verdict logic on hand-built tables; the padded batch trains exactly the
d-dimensional problem; one-token selections reduce W_eq to the ATT-SVM."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.data import TokenData
from attnsvm.experiments import tfsvm_multitoken as tm
from attnsvm.metrics import correlation
from attnsvm.models import WModel
from attnsvm.optim import ngd
from attnsvm.svm import att_svm
from attnsvm.train import train

CFG = tm.EXPERIMENT.config("tiny")


def _runs(eq=1e-3, dr=1e-2, one=1e-1, nsel=2.0):
    rows = [dict(d=d, trial=b, finite=False, ambiguous=False, feasible=True, n_selected=nsel,
                 gap_eq=eq, gap_dir=dr, gap_one=one) for d in (4, 6) for b in range(3)]
    return {"runs": pd.DataFrame(rows)}


def test_judge_passes_on_the_predicted_ordering():
    assert all(c.passed for c in tm.judge(_runs(), CFG))


@pytest.mark.parametrize("kw, failing", [
    (dict(eq=2e-2, one=1.0), [0]),   # W_eq worse than W_dir
    (dict(one=5e-3), [1]),           # one-token SVM nearly as good as W_eq
    (dict(nsel=1.0), [2]),           # only single tokens selected
])
def test_judge_fails_on_tables_built_to_fail(kw, failing):
    checks = tm.judge(_runs(**kw), CFG)
    assert [i for i, c in enumerate(checks) if not c.passed] == failing


def test_padded_batch_trains_the_unpadded_problem():
    cfg = dict(CFG, seeds=1, ds=[3, 5], steps=40)
    data, V, dd = tm.padded_data(cfg)
    D = data.d
    W0 = np.zeros((2, D, D))
    rng = np.random.default_rng(1)
    for b, d in enumerate(dd):
        W0[b, :d, :d] = rng.standard_normal((d, d))
    padded = train(WModel(D, head="relu", V=V), data, optimizer=ngd(0.1), steps=40,
                   init={"W": W0}).W
    for b, d in enumerate(dd):
        one = TokenData(X=data.X[b, :, :, :d], y=data.y[b], z=data.z[b, :, :d])
        Wd = train(WModel(d, head="relu", V=V[b, :d, :d]), one, optimizer=ngd(0.1), steps=40,
                   init={"W": W0[b, :d, :d]}).W[0]
        assert np.allclose(padded[b, :d, :d], Wd, atol=1e-10)
        assert np.all(padded[b, d:, :] == 0) and np.all(padded[b, :, d:] == 0)
    assert all((data.y[dd == d] == -1).any(1).all() for d in cfg["ds"])


def test_single_token_selection_reduces_to_the_att_svm():
    rng = np.random.default_rng(0)
    X, z = rng.standard_normal((3, 4, 4)), rng.standard_normal((3, 4))
    s = np.full((3, 4), 1e-8)
    s[:, 0] = 1.0
    W1 = att_svm(X, z, np.zeros(3, int)).W_
    Wd, We = tm.predictors(X, z, s, rng.standard_normal((4, 4)))
    np.testing.assert_allclose(Wd, W1, rtol=1e-5, atol=1e-7)  # W_fin = 0: W_dir is the ATT-SVM
    assert abs(correlation(We, W1)) > 1 - 1e-8  # W_eq = R W_dir
