"""mmts-fig4: verdict logic on hand-built tables, the notebook's dataset, and the compute table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.data import mmts_fig1_notebook
from attnsvm.experiments import mmts_fig4 as F

KEYS = {c.text: k for k, c in F.CLAIMS.items()}


def _tables(ngd_fast: bool = True, gd_levels: bool = True, datasets: int = 3, T: int = 1000,
            linear_gd_on=None) -> dict:
    """NGD: ||p|| = 0.1 t, fast saturation; GD: log-growth of ||p||, slow saturation.
    ``gd_levels=False``: GD's norm grows linearly on every dataset; ``linear_gd_on``: only on
    that dataset."""
    t = np.arange(0, T + 1)
    rows = []
    for opt in ("NGD", "GD"):
        for k in range(datasets):
            if opt == "NGD" and ngd_fast:
                norm, prob = 0.1 * t, 1 - 0.8 * np.exp(-t / (10 + k))
            else:
                lin = (not gd_levels or linear_gd_on == k) and opt == "GD"
                norm = 0.01 * t if lin else np.log1p(t)
                prob = 1 - 0.8 * np.exp(-t / (200 + k))  # reaches 0.99 near t = 880
            rows.append(pd.DataFrame({"optimizer": opt, "dataset": k, "step": t, "norm": norm,
                                      "p_max": prob}))
    return {"metrics": pd.concat(rows, ignore_index=True)}


def _failing(checks) -> set:
    return {KEYS[c.claim] for c in checks if not c.passed}


def test_judge_passes_on_predicted_behaviour():
    checks = F.judge(_tables(), {})
    assert _failing(checks) == set() and [KEYS[c.claim] for c in checks] == list(F.CLAIMS)
    assert "speed-up" in checks[0].measured
    assert {c.kind for c in checks if KEYS[c.claim] in ("fig", "level")} == {"claim"}


def _ngd_slow_on(k):
    def go(t):
        m = t["metrics"]
        m.loc[(m.optimizer == "NGD") & (m.dataset == k), "p_max"] = 0.5  # never selects
    return go


def _ngd_norm_logarithmic(t):
    m = t["metrics"]
    ngd = m.optimizer == "NGD"
    m.loc[ngd, "norm"] = np.log1p(m.loc[ngd, "step"])


CASES = {  # an input violating each declared verdict, and the verdicts it breaks
    "fig": (_ngd_slow_on(0), {"fig", "pop"}),
    "level": (lambda t: t.update(_tables(gd_levels=False)), {"level", "pop_level"}),
    "pop": (_ngd_slow_on(2), {"pop"}),
    "pop_level": (lambda t: t.update(_tables(linear_gd_on=1)), {"pop_level"}),
    "ngd_lin": (_ngd_norm_logarithmic, {"ngd_lin"}),
}


@pytest.mark.parametrize("key", list(CASES))
def test_every_check_fails_on_an_input_that_violates_it(key):
    t = _tables()
    brk, failing = CASES[key]
    brk(t)
    assert _failing(F.judge(t, {})) == failing
    assert set(CASES) == set(F.CLAIMS)


def test_population_note_names_the_speedups():
    t = _tables()
    _ngd_slow_on(2)(t)
    pop = next(c for c in F.judge(t, {}) if KEYS[c.claim] == "pop")
    assert "GD never" not in pop.note and "median" in pop.note


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
