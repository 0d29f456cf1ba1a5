"""mmts-fig4: verdict logic on hand-built tables, and the compute table's shape."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.experiments import mmts_fig4 as F


def _tables(good: bool, T: int = 1000) -> dict:
    t = np.arange(0, T + 1, 10)
    rows = []
    for opt in ("NGD", "GD"):
        for trial in range(3):
            if opt == "NGD" and good:
                norm, prob = 0.1 * t + 0.1, 1 - 0.8 * np.exp(-t / 10)
            else:
                norm, prob = 0.1 + np.log1p(t), 1 - 0.8 / (1 + t / 100)
            rows.append(pd.DataFrame({"optimizer": opt, "trial": trial, "step": t, "norm": norm,
                                      "p_max": prob}))
    return {"metrics": pd.concat(rows, ignore_index=True)}


def test_judge_passes_on_predicted_behaviour():
    checks = F.judge(_tables(True), {})
    assert len(checks) == 4 and all(c.passed for c in checks), [c.measured for c in checks]


def test_judge_fails_when_ngd_behaves_like_gd():
    checks = F.judge(_tables(False), {})
    assert not checks[0].passed  # no speed-up
    assert not checks[1].passed  # same final probability
    assert not checks[2].passed  # NGD norm not linear
    assert checks[3].passed      # GD itself still levels off


def test_compute_fills_every_step_for_every_trial():
    cfg = F.EXPERIMENT.config("tiny")
    m = F.compute(cfg)["metrics"]
    steps = np.arange(0, cfg["steps"] + 1, cfg["record_every"])
    assert len(m) == 2 * cfg["seeds"] * len(steps)
    assert not m[["p_max", "norm"]].isna().any().any()
    # NGD from any start moves by exactly eta per step while the gradient is non-zero
    ngd = m[m.optimizer == "NGD"].pivot(index="step", columns="trial", values="norm")
    assert (ngd.diff().dropna() <= cfg["lr"] * cfg["record_every"] + 1e-12).all().all()
    assert (m.p_max <= 1 + 1e-12).all() and (m.p_max >= 1 / 7 - 1e-12).all()
