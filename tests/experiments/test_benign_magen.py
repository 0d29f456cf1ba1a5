"""benign-magen: the verdict logic on hand-built tables (each check fed a violating
population), and the certified max-margin interpolator against an independent cvxpy solve."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest

from attnsvm.benign import two_token
from attnsvm.experiments import benign_magen as M

CFG = M.EXPERIMENT.config("tiny")
K = 20  # seeds per point
NS, SNRS = (10, 40), (0.1, 0.3, 0.6)


def _points(benign=lambda n, s: s >= (0.6 if n == 10 else 0.3), mm_benign=None, status="optimal",
            flips_off=0, p1=0.0, v1_err=0.0, mm_train=1.0, att=1.0, corr=0.95, mm_gap=0.0,
            unfit=()):
    """K seeds per (n, SNR) of NS x SNRS. Where ``benign(n, s)``: two GD steps fit every label
    with test accuracy 0.99; elsewhere they fit every label with test accuracy 0.6 (harmful),
    or fit none of the flipped labels at the points in ``unfit``. Seed 0's interpolator has
    train accuracy ``mm_train``. The interpolator's test
    accuracy is 0.99 where ``mm_benign`` (default ``benign``) says so, else 0.6 + ``mm_gap``."""
    mm_benign = benign if mm_benign is None else mm_benign
    rows = []
    for n in NS:
        for s in SNRS:
            good, mgood = benign(n, s), mm_benign(n, s)
            fit = (n, s) not in unfit
            gd_test = 0.99 if good else 0.6
            for k in range(K):
                rows.append(dict(
                    n=n, snr=s, trial=k, flips=round(n * CFG["noise_ratio"]) + flips_off,
                    p1_max=p1, v1_err=v1_err, p_status=status, v_status="optimal",
                    certified=status == "optimal",
                    mm_train_acc=(mm_train if k == 0 else 1.0) if status == "optimal" else np.nan,
                    mm_test_acc=(0.99 if mgood else 0.6 + mm_gap) if status == "optimal" else 0.99,
                    gd_train_acc=1.0 if fit else 0.9, gd_train_acc_flipped=1.0 if fit else 0.0,
                    gd_test_acc=gd_test, att_signal_clean=att if good else 0.0,
                    att_noise_flipped=1.0, corr_mm=corr))
    return {"points": pd.DataFrame(rows)}


def _verdicts(tables, cfg=CFG):
    return {next(k for k, c in M.CLAIMS.items() if c.text == ch.claim): ch.passed
            for ch in M.judge(tables, cfg)}


def test_a_benign_population_above_the_threshold_passes_every_check():
    assert _verdicts(_points()) == dict.fromkeys(M.CLAIMS, True)


def test_no_benign_gd_run_fails_the_two_step_claim():
    v = _verdicts(_points(benign=lambda n, s: False, mm_benign=_points.__defaults__[0]))
    assert not v["two_steps"] and v["max_margin"] and v["snr"]


def test_a_harmful_interpolator_fails_the_max_margin_and_snr_claims():
    v = _verdicts(_points(mm_benign=lambda n, s: False))
    assert not v["max_margin"] and not v["snr"] and v["two_steps"]


def test_benign_at_the_smallest_snr_fails_the_necessity_claim():
    v = _verdicts(_points(benign=lambda n, s: True))
    assert not v["snr"] and v["two_steps"] and v["max_margin"]


def test_uncertified_interpolators_are_never_judged():
    """Uncertified seeds with a high test accuracy: no benign interpolator is counted."""
    v = _verdicts(_points(status="uncertified"))
    assert not v["max_margin"] and not v["svm_cert"] and not v["snr"]


@pytest.mark.parametrize("kw, key", [
    (dict(flips_off=1), "flips"), (dict(p1=1e-3), "first_step"), (dict(v1_err=1e-6), "first_step"),
    (dict(mm_train=0.95), "mm_fits"), (dict(att=0.5), "attention"), (dict(corr=0.5), "svm_dir"),
    (dict(benign=lambda n, s: s >= 0.3), "threshold"), (dict(unfit=((40, 0.6),)), "gd_window"),
    (dict(mm_gap=0.2), "svm_acc")])
def test_each_sanity_check_and_finding_fails_on_a_violating_table(kw, key):
    v = _verdicts(_points(**kw))
    assert not v[key] and all(ok for k, ok in v.items() if k != key), v


def test_regime_names_the_majority():
    pp = M.per_point(_points(unfit=((10, 0.1),))["points"], CFG["noise_ratio"]).set_index(["n", "snr"])
    assert M.regime(pp.loc[(40, 0.6)]) == "B" and M.regime(pp.loc[(40, 0.1)]) == "H"
    assert M.regime(pp.loc[(10, 0.1)]) == "N"


def test_interpolator_matches_an_independent_svm():
    data = two_token(n=8, d=30, snr=0.4, noise_ratio=0.25, n_test=50, seed=3, batch=2)
    alpha = np.where(data.flipped, 1, 0)
    df, P = M.interpolator(data, alpha)
    assert df.certified.all()
    for b in range(2):
        X, y = data.train.X[b], data.train.y[b]
        D = np.stack([X[i, alpha[b, i]] - X[i, 1 - alpha[b, i]] for i in range(8)])
        w = cp.Variable(30)
        cp.Problem(cp.Minimize(cp.sum_squares(w)), [D @ w >= 1]).solve(solver=cp.CLARABEL)
        np.testing.assert_allclose(P[b], w.value, rtol=1e-4, atol=1e-6)
        R = X[np.arange(8), alpha[b]]
        u = cp.Variable(30)
        cp.Problem(cp.Minimize(cp.sum_squares(u)), [cp.multiply(y, R @ u) >= 1]).solve(solver=cp.CLARABEL)
        Xt = data.test.X[b]
        sel = (Xt @ w.value).argmax(1)
        f = Xt[np.arange(50), sel] @ u.value
        assert df.mm_test_acc[b] == pytest.approx((f * data.test.y[b] > 0).mean())
        assert df.mm_test_att_signal[b] == pytest.approx((sel == 0).mean())
    assert (df.mm_train_acc == 1).all()


def test_step_sizes_and_tiny_run_shapes():
    assert M.step_sizes(20, 500) == (1 / 500, 50 * 400 / 500)
    t = M.compute(CFG)
    pts, path = t["points"], t["path"]
    assert len(pts) == CFG["seeds"] * len(CFG["ns"]) * len(CFG["snrs"])
    assert set(path.step) == {0, 1, 2} and path[path.step < 2].corr_mm.isna().all()
    assert (pts.p1_max == 0).all() and (pts.v1_err <= 1e-10).all()
