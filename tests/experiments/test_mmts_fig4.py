"""mmts-fig4: verdict logic on hand-built tables, the notebook's dataset, and the compute table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.data import mmts_fig1_notebook
from attnsvm.experiments import mmts_fig4 as F


def _tables(ngd_fast: bool = True, gd_levels: bool = True, datasets: int = 3, T: int = 1000) -> dict:
    t = np.arange(0, T + 1)
    rows = []
    for opt in ("NGD", "GD"):
        for k in range(datasets):
            if opt == "NGD" and ngd_fast:
                norm, prob = 0.1 * t, 1 - 0.8 * np.exp(-t / (10 + k))
            else:
                norm = np.log1p(t) if gd_levels or opt == "NGD" else 0.01 * t
                prob = 1 - 0.8 * np.exp(-t / (200 + k))  # reaches 0.99 near t = 880
            rows.append(pd.DataFrame({"optimizer": opt, "dataset": k, "step": t, "norm": norm,
                                      "p_max": prob}))
    return {"metrics": pd.concat(rows, ignore_index=True)}


def test_judge_passes_on_predicted_behaviour():
    checks = F.judge(_tables(), {})
    assert len(checks) == 4 and all(c.passed for c in checks), [c.measured for c in checks]
    assert "speed-up" in checks[0].measured and checks[3].sanity


def test_judge_fails_when_ngd_is_not_quicker():
    checks = F.judge(_tables(ngd_fast=False), {})
    assert not checks[0].passed and not checks[1].passed  # figure's dataset and population
    assert not checks[3].passed                            # NGD norm not linear either


def test_judge_fails_when_gd_does_not_level_off():
    checks = F.judge(_tables(gd_levels=False), {})
    assert [c.passed for c in checks] == [True, True, False, True]


def test_population_check_fails_on_one_slow_dataset():
    m = _tables()["metrics"]
    slow = (m.optimizer == "NGD") & (m.dataset == 2)
    m.loc[slow, "p_max"] = 0.5  # NGD never selects a token on dataset 2
    checks = F.judge({"metrics": m}, {})
    assert checks[0].passed and not checks[1].passed
    assert "GD never" not in checks[1].note and "median" in checks[1].note


def test_notebook_dataset_is_the_papers_draw():
    X = mmts_fig1_notebook([0]).X[0]
    # torch.Generator().manual_seed(0); 0.2 * randn(3, 7, 3) + shifts: first entries
    assert X.shape == (3, 7, 3)
    np.testing.assert_allclose(X[0, 0, :2], [0.77483201, -0.23047204], atol=1e-7)
    assert (X[:, 0, 2] == 1).all() and (X[:, 1:, 2] == 0.5).all()
    np.testing.assert_array_equal(mmts_fig1_notebook([0, 1]).X[0], X)  # populations contain it


def test_compute_fills_every_step_and_ngd_moves_by_eta():
    cfg = F.EXPERIMENT.config("tiny")
    m = F.compute(cfg)["metrics"]
    steps = np.arange(0, cfg["steps"] + 1, cfg["record_every"])
    assert len(m) == 2 * cfg["datasets"] * len(steps)
    assert not m[["p_max", "norm"]].isna().any().any()
    ngd = m[m.optimizer == "NGD"].pivot(index="step", columns="dataset", values="norm")
    assert (ngd.diff().dropna() <= cfg["lr_ngd"] * cfg["record_every"] + 1e-12).all().all()
    assert (m[m.step == 0].norm == 0).all()  # p_0 = 0, the paper's start
    assert (m.p_max <= 1 + 1e-12).all() and (m.p_max >= 1 / 7 - 1e-12).all()
