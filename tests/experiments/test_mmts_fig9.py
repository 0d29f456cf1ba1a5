"""mmts-fig9: zero-padding invariance, outcomes against an independent cvxpy computation,
and the verdict logic on hand-built tables."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import mmts_fig9 as F

CFG = {**F.EXPERIMENT.config("tiny"), "ds": [2, 5, 8, 12], "trials": 4, "steps": 100}


def test_zero_padding_keeps_padded_coordinates_exactly_zero():
    data = F.datasets(CFG)
    dims = np.repeat(CFG["ds"], CFG["trials"])
    p_pad = F.train_prompts(data, {**CFG, "pad": True}, dims)
    p_sep = F.train_prompts(data, {**CFG, "pad": False}, dims)
    for b, d in enumerate(dims):
        assert np.all(p_pad[b, d:] == 0.0)  # exactly, not approximately
    np.testing.assert_allclose(p_pad, p_sep, rtol=1e-9, atol=1e-12)


def _cvxpy_reference(X, y, v, p, alpha):
    """min ||q|| s.t. (x_{i,alpha_i} - x_it)^T q >= 1, solved by cvxpy; neighbours, gap, corr."""
    n, T, d = X.shape
    q = cp.Variable(d)
    D = np.stack([X[i, alpha[i]] - X[i, t] for i in range(n) for t in range(T) if t != alpha[i]])
    idx = [(i, t) for i in range(n) for t in range(T) if t != alpha[i]]
    prob = cp.Problem(cp.Minimize(cp.sum_squares(q)), [D @ q >= 1])
    prob.solve(solver=cp.CLARABEL)
    if prob.status not in ("optimal", "optimal_inaccurate"):
        return None
    qv = q.value
    gam = y[:, None] * (X @ v)
    act = [k for k, m in enumerate(D @ qv) if m <= 1 + 1e-5]
    gap = min(gam[idx[k][0], alpha[idx[k][0]]] - gam[idx[k]] for k in act)
    return gap, qv @ p / (np.linalg.norm(qv) * np.linalg.norm(p))


def test_outcomes_match_independent_svm():
    data = F.datasets(CFG)
    dims = np.repeat(CFG["ds"], CFG["trials"])
    p = F.train_prompts(data, CFG, dims)
    X, y, v = data.X, data.y, data.v
    alpha = np.einsum("bntd,bd->bnt", X, p).argmax(-1)
    out = F.outcomes(p, X, y, v)
    checked = 0
    for b, d in enumerate(dims):
        s = np.exp(X[b] @ p[b] - (X[b] @ p[b]).max(1, keepdims=True))
        s /= s.sum(1, keepdims=True)
        assert out.p_sel[b] == pytest.approx(s.max(1).mean(), rel=1e-12)
        assert out.saturated[b] == (s.max(1).mean() >= 0.99)
        if not out.saturated[b]:
            assert out.outcome[b] == "not saturated"
            continue
        ref = _cvxpy_reference(X[b, ..., :d], y[b], v[b, :d], p[b, :d], alpha[b])
        assert ref is not None and out.svm_feasible[b]  # a saturated selection is separable
        assert out.min_score_gap[b] == pytest.approx(ref[0], abs=1e-6)
        assert out.corr_lmm[b] == pytest.approx(ref[1], abs=1e-5)
        checked += 1
    assert checked >= 4


def test_growth_z():
    z, lo, hi = F.growth_z(pd.Series([False] * 80 + [True] * 20), pd.Series([True] * 80 + [False] * 20))
    assert (lo, hi) == (0.2, 0.8) and z > 8
    assert F.growth_z(pd.Series([True, False]), pd.Series([True, False]))[0] == 0.0


def _tables(good: bool, trials: int = 200) -> dict:
    rng = np.random.default_rng(0)
    rows = []
    for d in [2, 4, 6, 8, 10, 15, 20]:
        frac = min(1.0, d / 8) if good else 0.5
        gmm = 0.05 + 0.02 * d if good else 0.1
        for t in range(trials):
            sat = rng.random() < frac
            u = rng.random()
            out = "not saturated" if not sat else ("GMM" if u < gmm else ("LMM" if u < 0.99 or not good else "other"))
            if not good and sat and u > 0.8:
                out = "other"
            gap = rng.uniform(0.01, 0.5) if out in ("GMM", "LMM") else rng.uniform(-0.2, 0.0)
            rows.append({"d": d, "trial": t, "saturated": sat, "outcome": out,
                         "min_score_gap": gap, "svm_feasible": True, "corr_lmm": 0.995})
    return {"trials": pd.DataFrame(rows)}


def test_judge_passes_and_fails():
    good = F.judge(_tables(True), {})
    assert all(c.passed for c in good), [c.measured for c in good if not c.passed]
    bad = F.judge(_tables(False), {})
    assert [c.passed for c in bad[:4]] == [False, False, False, False]
    assert "negative score gap" in bad[2].note
