"""kqflow-diag / kqflow-nuclear: verdict logic on hand-built tables; the diagonal SVMs and
the relative-step gradient-flow proxy against independent computations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linprog, minimize

from attnsvm.data import random_sphere
from attnsvm.experiments.kqflow import _diag_svm, gradient_flow, judge_diag, judge_nuclear
from attnsvm.models import DiagModel

CFG = {"small_alpha": 0.01}


def _diag_tables(c1=(0.9999, 0.9999, 0.98), c2=(0.67, 0.68, 0.79), w_l2=None, psel=1.0):
    alphas = (0.001, 0.01, 1.0)
    final = pd.DataFrame([dict(trial=i, init="uniform", alpha=a, step=100, norm=1e3, corr_l1=x,
                               corr_l2=y, p_sel_min=psel, loss_gap=0.0, stopped=True)
                          for i, (a, x, y) in enumerate(zip(alphas, c1, c2))]
                         + [dict(trial=3 + i, init="random shape", alpha=0.01, step=100,
                                 norm=1e3, corr_l1=x, corr_l2=0.7, p_sel_min=psel, loss_gap=0.0,
                                 stopped=True) for i, x in enumerate((0.999, 0.5, 0.99))])
    w_l1 = np.array([0, 0, 1.0, 0, -0.1, 0, 0, -0.5])
    w_l2 = np.array([-0.7, -0.1, 1, -0.5, -0.8, -0.3, -0.5, -0.5]) if w_l2 is None else w_l2
    return {"final": final, "svm": pd.DataFrame({"j": range(8), "w_l1": w_l1, "w_l2": w_l2})}


def test_diag_judge_pass_and_fail():
    assert all(c.passed for c in judge_diag(_diag_tables(), CFG))
    bad = judge_diag(_diag_tables(c1=(0.7, 0.95, 0.6), c2=(0.9, 0.6, 0.8), psel=0.5), CFG)
    failed = [c.claim for c in bad if not c.passed]
    assert any("l_1 SVM (corr" in c for c in failed)
    assert any("closer to the l_1 SVM than to the l_2" in c for c in failed)
    assert any("optimal tokens" in c for c in failed)
    # a setting whose two SVMs nearly agree cannot discriminate the predictions
    same = judge_diag(_diag_tables(w_l2=np.array([0, 0, 1.0, 0, -0.1, 0, 0.01, -0.5])), CFG)
    assert not same[0].passed and "separates" in same[0].claim


def _nuc_tables(corr_nuc=0.9997, corr_fro=0.65, rank=1, r_nuc=1, r_fro=6):
    final = pd.DataFrame([dict(trial=b, step=2000, norm=100.0, norm_nuc=100.0, corr_nuc=corr_nuc,
                               corr_fro=corr_fro, p_sel_min=1.0, rank=rank) for b in range(3)])
    svm = pd.DataFrame([dict(norm="nuc", rank=r_nuc, norm_value=1.0, corr_nuc_fro=0.65),
                        dict(norm="fro", rank=r_fro, norm_value=1.0, corr_nuc_fro=0.65)])
    return {"final": final, "svm": svm}


def test_nuclear_judge_pass_and_fail():
    assert all(c.passed for c in judge_nuclear(_nuc_tables(), {}))
    bad = judge_nuclear(_nuc_tables(corr_nuc=0.7, corr_fro=0.99, rank=4), {})
    assert [c.passed for c in bad] == [True, True, False, False, False]
    assert not judge_nuclear(_nuc_tables(r_nuc=6), {})[0].passed  # ranks equal: no contrast


def test_diag_svms_match_independent_solvers():
    """l_1 diagonal SVM = an LP (w = u - v, u, v >= 0); l_2 one = SLSQP on the same constraints."""
    data = random_sphere(3, 3, 8, seed=6)
    n, T, d = data.X.shape
    A = [(data.X[i, data.opt[i]] - data.X[i, t]) * data.z[i]
         for i in range(n) for t in range(T) if t != data.opt[i]]
    A = np.array(A)
    lp = linprog(np.ones(2 * d), A_ub=-np.hstack([A, -A]), b_ub=-np.ones(len(A)),
                 bounds=(0, None), method="highs")
    w_lp = lp.x[:d] - lp.x[d:]
    w1 = _diag_svm(data, "l1")
    assert abs(np.abs(w1).sum() - np.abs(w_lp).sum()) < 1e-6 * np.abs(w_lp).sum()
    assert (A @ w1 >= 1 - 1e-6).all()
    qp = minimize(lambda w: 0.5 * w @ w, np.ones(d) * 5, jac=lambda w: w, method="SLSQP",
                  constraints=[{"type": "ineq", "fun": lambda w: A @ w - 1, "jac": lambda w: A}],
                  options={"ftol": 1e-14, "maxiter": 500})
    np.testing.assert_allclose(_diag_svm(data, "fro"), qp.x, atol=1e-5)


def test_gradient_flow_steps_are_relative_and_the_path_is_step_independent():
    data = random_sphere(3, 3, 8, seed=6)
    model = DiagModel(8)
    k0 = torch.full((2, 8), 0.01, dtype=torch.float64)
    k0[1] *= 10.0
    init = {"k": k0, "q": torch.zeros(2, 8, dtype=torch.float64)}
    one = dict(rel=0.01, stage=1, stages=1, records_per_stage=1)
    _, p1, _ = gradient_flow(model, data, init, one, {})
    step = torch.sqrt(sum((p1[k] - init[k]).pow(2).sum(1) for k in init))
    norm0 = torch.sqrt(sum(init[k].pow(2).sum(1) for k in init))
    torch.testing.assert_close(step, 0.01 * norm0)  # each trial moves by rel * its own norm
    refs = {"l1": np.diag(_diag_svm(data, "l1"))}
    init = {k: v[1:] for k, v in init.items()}  # alpha = 0.1: reaches the float64 limit soonest
    ends = []
    for rel, stage in ((0.02, 25), (0.01, 50)):
        m, _, _ = gradient_flow(model, data, init, dict(rel=rel, stage=stage, stages=30,
                                                        records_per_stage=1), refs)
        ends.append(m.loc[m.groupby("trial").step.idxmax()].corr_l1.to_numpy())
    np.testing.assert_allclose(ends[0], ends[1], atol=2e-3)  # halving the step: same limit
