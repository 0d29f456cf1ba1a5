"""rates-planted / rates-joint: verdict logic on hand-built tables, and compute properties."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import rates as R

NORM_MM = {0: 1.25, 1: 0.8}


def _planted_tables(good: bool, T: int = 800) -> dict:
    t = np.arange(0, T + 1, 10)
    rows = []
    for opt in ("GD", "NGD", "Polyak"):
        for trial, nm in NORM_MM.items():
            if opt == "GD" or not good:
                norm = np.log1p(t)
                corr = 0.9 - 0.5 / (1 + t)
            else:
                norm = (0.1 if opt == "NGD" else 0.5) * t
                corr = 1 - 0.5 / (1 + t / (0.5 if opt == "Polyak" else 4))
            scale = nm if good else 3 * nm  # wrong decay rate when built to fail
            gap = np.exp(-norm / scale)
            rows.append(pd.DataFrame({"optimizer": opt, "trial": trial, "step": t, "norm": norm,
                                      "corr_mm": corr, "loss_gap": gap,
                                      "one_minus_s_opt": gap, "p_sel_mean": 1 - gap}))
    svm = pd.DataFrame({"trial": list(NORM_MM), "norm_mm": list(NORM_MM.values()),
                        "feasible": [True, True]})
    return {"metrics": pd.concat(rows, ignore_index=True), "svm": svm}


def test_judge_planted_passes_on_predicted_behaviour():
    checks = R.judge_planted(_planted_tables(True), {})
    assert checks and all(c.passed for c in checks), [c.measured for c in checks if not c.passed]


def test_judge_planted_fails_when_built_to_fail():
    checks = R.judge_planted(_planted_tables(False), {})
    failed = {c.claim.split(":")[0].split(" ")[0] for c in checks if not c.passed}
    assert {"NGD", "Polyak"} <= failed
    assert not checks[-1].passed  # the slope check: decay rate 3x too slow


def test_growth_ratio_linear_vs_log_and_first_hit():
    t = np.arange(0, 1001, 10)
    m = pd.concat([pd.DataFrame({"optimizer": "lin", "trial": 0, "step": t, "norm": 0.1 * t}),
                   pd.DataFrame({"optimizer": "log", "trial": 0, "step": t, "norm": np.log(1 + t)})])
    assert R.growth_ratio(m, "lin", 1000) == pytest.approx(2.0)
    assert R.growth_ratio(m, "log", 1000) == pytest.approx(1.0, abs=0.05)
    m["c"] = m.step / 1000
    hits = R.first_hit(m, "c", 0.5, by=("optimizer", "trial"))
    assert list(hits.step) == [500, 500]
    assert R.first_hit(m, "c", 2.0).step.isna().all()


def test_rate_slopes_recovers_exact_exponential():
    sl = R.rate_slopes(_planted_tables(True)["metrics"], _planted_tables(True)["svm"])
    assert np.allclose(sl.slope, sl.predicted, rtol=1e-9)


def test_judge_joint_pass_and_fail():
    t = np.arange(0, 101, 10)
    info = pd.DataFrame({"trial": [0], "att_feasible": [True], "planted_selected": [1.0]})
    good = pd.DataFrame({"trial": 0, "step": t, "corr_v": 0.999, "corr_W": 0.995})
    assert all(c.passed for c in R.judge_joint({"metrics": good, "svm": info}, {}))
    bad = good.assign(corr_W=np.where(t < 60, 0.995, 0.5))
    checks = R.judge_joint({"metrics": bad, "svm": info}, {})
    assert checks[0].passed and not checks[1].passed and "peaked at 0.9950" in checks[1].note


def test_planted_compute_norms_and_svm_reference():
    cfg = R.EXPERIMENTS[0].config("tiny")
    m = R.compute_planted(cfg)["metrics"]
    ngd = m[m.optimizer == "NGD"]
    # NGD from W_0 = 0: ||W_t|| <= eta t (triangle inequality), close to it once aligned
    assert (ngd.norm <= cfg["lr_ngd"] * ngd.step + 1e-9).all()
    last = ngd[ngd.step == ngd.step.max()]
    assert (last.norm >= 0.95 * cfg["lr_ngd"] * last.step).all()


def test_joint_head_reference_matches_cvxpy():
    """corr(v_T, v_mm) of compute_joint against a head SVM solved independently by cvxpy."""
    import cvxpy as cp

    from attnsvm.models import WModel
    from attnsvm.train import train

    cfg = R.EXPERIMENTS[1].config("tiny")
    m = R.compute_joint(cfg)["metrics"]
    data = R._data(cfg).replace(v=None)
    tr = train(WModel(data.d, query="first", train_head=True), data, optimizer=R.ngd(cfg["lr_ngd"]),
               steps=cfg["steps"], init="random", scale=cfg["init_scale"], seed=cfg["seed"],
               record_every=cfg["record_every"])
    X, y = data.X, data.y
    W, v = tr.params["W"].numpy(), tr.params["v"].numpy()
    alpha = np.einsum("bntd,bde,bne->bnt", X, W, X[:, :, 0, :]).argmax(-1)
    last = m[m.step == m.step.max()].sort_values("trial")
    for b in range(cfg["B"]):
        R_ = X[b, np.arange(data.n), alpha[b]]
        u = cp.Variable(data.d)
        cp.Problem(cp.Minimize(cp.sum_squares(u)), [cp.multiply(y[b], R_ @ u) >= 1]).solve(
            solver=cp.CLARABEL)
        ref = v[b] @ u.value / (np.linalg.norm(v[b]) * np.linalg.norm(u.value))
        assert last.corr_v.iloc[b] == pytest.approx(ref, abs=1e-6)


def _freeze_frame():
    """Three trials of one optimiser: moving, stopped by the trainer at 400, frozen (norm
    constant from 300 on without being marked stopped)."""
    t = np.arange(0, 1001, 10)
    rows = [pd.DataFrame({"optimizer": "X", "trial": 0, "step": t, "norm": 0.1 * t,
                          "stopped": False}),
            pd.DataFrame({"optimizer": "X", "trial": 1, "step": t,
                          "norm": 0.1 * np.minimum(t, 400), "stopped": t >= 400}),
            pd.DataFrame({"optimizer": "X", "trial": 2, "step": t,
                          "norm": 0.1 * np.minimum(t, 300), "stopped": False})]
    return pd.concat(rows, ignore_index=True)


def test_freeze_steps_tells_stopped_from_frozen():
    fr = R.freeze_steps(_freeze_frame()).set_index("trial")
    assert np.isnan(fr.loc[0, "freeze_step"]) and fr.loc[0, "reason"] == "moving at the end"
    assert fr.loc[1, "freeze_step"] == 400 and fr.loc[1, "stop_step"] == 400
    assert "stopped by the trainer" in fr.loc[1, "reason"]
    assert fr.loc[2, "freeze_step"] == 300 and np.isnan(fr.loc[2, "stop_step"])
    assert "not marked stopped" in fr.loc[2, "reason"]
    m = R._mark_frozen(_freeze_frame(), R.freeze_steps(_freeze_frame()))
    assert m[m.trial == 2].query("step > 300").frozen.all()
    assert not m[m.trial == 2].query("step <= 300").frozen.any()
    assert not m[m.trial == 0].frozen.any()


def test_growth_ratio_and_slopes_stop_at_a_freeze():
    m = R._mark_frozen(_freeze_frame(), R.freeze_steps(_freeze_frame()))
    m = m[m.trial != 1].assign(stopped=False)
    # linear growth until the freeze at 300: cut there, both trials are linear (~2); over the
    # whole run the frozen trial would read 0 and the median 1
    assert R.growth_ratio(m, "X", 1000) == pytest.approx(2.0, abs=0.3)
    assert R.growth_ratio(m.drop(columns="frozen"), "X", 1000) == pytest.approx(1.0)
    m = m.assign(optimizer="NGD", corr_mm=1.0, loss_gap=np.exp(-m.norm / 0.5) * 1e-3)
    sl = R.rate_slopes(m, pd.DataFrame({"trial": [0, 2], "norm_mm": [0.5, 0.5]}))
    # trial 2 has only its moving records (0..300) in the fit: exact slope, no repeated point
    assert np.allclose(sl.slope, -2.0)


def test_judge_planted_reports_frozen_trials():
    t = _planted_tables(True)
    t["frozen"] = pd.DataFrame([dict(optimizer="Polyak", trial=b, freeze_step=380.0,
                                     stop_step=np.nan, reason="frozen, not marked stopped: x")
                                for b in NORM_MM])
    checks = R.judge_planted(t, {})
    poly = next(c for c in checks if c.claim.startswith("Polyak"))
    assert poly.passed and "2 of 2 Polyak trials frozen" in poly.note


def test_planted_properties_table():
    cfg = R.EXPERIMENTS[0].config("tiny")
    data = R._data(cfg)
    props = R.planted_properties(data, cfg)
    assert len(props) == cfg["B"] and (props.score_gap >= 0.5 - 1e-12).all()
    assert (props.d >= props.nT).all() and (props.max_abs_cos_noise < 1).all()


def test_rate_slopes_read_log10_gap_below_float64():
    """With ``log10_gap`` (the trainer's exact log of L - L*) the fit goes on where the
    float64 value L - L* is 0."""
    t = np.arange(0, 8001, 100)
    norm = 0.1 * t
    m = pd.DataFrame({"optimizer": "NGD", "trial": 0, "step": t, "norm": norm, "corr_mm": 1.0,
                      "loss_gap": np.exp(-norm / 0.5), "log10_gap": -norm / 0.5 / np.log(10)})
    sl = R.rate_slopes(m, pd.DataFrame({"trial": [0], "norm_mm": [0.5]}))
    assert sl.slope.iat[0] == pytest.approx(-2.0)
    assert (m.loss_gap == 0).sum() > 30  # most of those points are 0 in float64
