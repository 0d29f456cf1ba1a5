"""benign-sakamoto: the verdict logic on hand-built tables (each check fed a violating
population), the closed form of the uniform-attention accuracy, and the certified
max-margin interpolator against an independent cvxpy solve."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest

from attnsvm.benign import sakamoto_sato
from attnsvm.experiments import benign_sakamoto as S

CFG = S.EXPERIMENT.config("tiny")
K = 20  # seeds per signal norm


def _tables(benign_at=(5.0,), delayed_at=(5.0,), status="optimal", corr=0.99, mm_gap=0.0,
            flips=4, uniform_shift=0.0):
    """Two signal norms (2, 5), K seeds each, three recorded steps (0, 50, 100): at a norm
    in ``benign_at`` every seed fits all labels at step 50 with test accuracy 0.95 at the
    end (0.90 at step 50 when the norm is in ``delayed_at``, else 0.95); elsewhere the
    flipped labels are never fitted."""
    rows, svm = [], []
    for s in (2.0, 5.0):
        t0 = S.uniform_accuracy(s, CFG["T"]) + uniform_shift
        for k in range(K):
            for step in (0, 50, 100):
                fit = s in benign_at and step >= 50
                test = t0 if step == 0 else (0.90 if (s in delayed_at and step == 50) else 0.95)
                rows.append(dict(signal_norm=s, trial=k, step=step, train_acc=1.0 if fit else 0.8,
                                 train_acc_flipped=1.0 if fit else 0.0, test_acc=test))
            svm.append(dict(signal_norm=s, trial=k, status=status, corr_final=corr,
                            run_test_acc=0.95, mm_test_acc=0.95 - mm_gap, flips=flips))
    cfg = {**CFG, "n_test": 10_000}
    return {"curves": pd.DataFrame(rows), "svm": pd.DataFrame(svm)}, cfg


def _verdicts(tables, cfg):
    return {next(k for k, c in S.CLAIMS.items() if c.text == ch.claim): ch.passed
            for ch in S.judge(tables, cfg)}


def test_a_benign_delayed_population_passes_every_check():
    v = _verdicts(*_tables(benign_at=(5.0,)))
    assert v == dict.fromkeys(S.CLAIMS, True)


def test_no_benign_setting_fails_the_benign_and_regime_claims():
    v = _verdicts(*_tables(benign_at=()))
    assert not v["benign"] and not v["regimes"] and not v["delayed"]


def test_benign_everywhere_fails_the_regime_claim_only():
    v = _verdicts(*_tables(benign_at=(2.0, 5.0)))
    assert v["benign"] and not v["regimes"]


def test_generalisation_present_at_the_fit_is_not_delayed():
    v = _verdicts(*_tables(delayed_at=()))
    assert v["benign"] and not v["delayed"]


@pytest.mark.parametrize("kw, key", [(dict(status="uncertified"), "svm_cert"), (dict(corr=0.5), "svm_dir"),
                                     (dict(mm_gap=0.2), "svm_acc"), (dict(flips=3), "flips"),
                                     (dict(uniform_shift=-0.1), "uniform")])
def test_each_finding_and_sanity_check_fails_on_a_violating_table(kw, key):
    v = _verdicts(*_tables(**kw))
    assert not v[key] and all(ok for k, ok in v.items() if k != key)


def test_uniform_accuracy_closed_form_against_monte_carlo():
    s, T = 3.0, 8
    data = sakamoto_sato(n=4, T=T, d=10, signal_norm=s, n_test=20_000, seed=9, batch=1)
    f = np.einsum("bmtd,bd->bmt", data.test.X, data.test.v).mean(-1)
    acc = (f * data.test.y > 0).mean()
    assert abs(acc - S.uniform_accuracy(s, T)) < 4 * np.sqrt(0.25 / 20_000)


def test_interpolator_matches_an_independent_svm():
    data = sakamoto_sato(n=6, T=4, d=30, signal_norm=3.0, rho=0.5, n_test=50, seed=1, batch=2)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 30))
    df, P = S.mm_interpolator(data, q)
    for b in range(2):
        X = data.train.X[b]
        a = X @ q[b]
        alpha = a.argmax(1)
        D = np.stack([X[i, alpha[i]] - X[i, t] for i in range(6) for t in range(4) if t != alpha[i]])
        w = cp.Variable(30)
        cp.Problem(cp.Minimize(cp.sum_squares(w)), [D @ w >= 1]).solve(solver=cp.CLARABEL)
        np.testing.assert_allclose(P[b], w.value, rtol=1e-4, atol=1e-6)
        sel = (data.test.X[b] @ w.value).argmax(1)
        f = np.einsum("md,d->m", data.test.X[b][np.arange(50), sel], data.test.v[b])
        assert df.mm_test_acc[b] == pytest.approx((f * data.test.y[b] > 0).mean())
        assert df.corr_final[b] == pytest.approx(
            w.value @ q[b] / np.linalg.norm(w.value) / np.linalg.norm(q[b]), rel=1e-4)
    assert (df.status == "optimal").all()


def test_phase_table_counts_regimes_per_cell():
    rows = []
    for n, ratio in [(10, 0.2), (20, 0.1)]:
        for k in range(20):  # n = 10: 12 benign, 8 harmful; n = 20: 5 benign, 15 not fitted
            benign = k < (12 if n == 10 else 5)
            fit = benign or n == 10
            rows.append(dict(n=n, noise_ratio=ratio, signal_norm=5.0, trial=k, step=100,
                             train_acc=1.0 if fit else 0.9, train_acc_flipped=1.0 if fit else 0.0,
                             test_acc=0.97 if benign else 0.7))
    t = S.phase_table(pd.DataFrame(rows)).set_index("n")
    assert t.benign[10] == pytest.approx(0.6) and t.harmful[10] == pytest.approx(0.4)
    assert t.regime[10] == "benign" and t.regime[20] == "not fitted"
    assert t.not_fitted[20] == pytest.approx(0.75)
    lo, hi = S.wilson(12, 20)
    assert (t.benign_lo[10], t.benign_hi[10]) == pytest.approx((lo, hi))
