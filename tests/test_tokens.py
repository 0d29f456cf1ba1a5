"""Tests of attnsvm.tokens (scores, optimality, outcome of a run)."""

import numpy as np

from attnsvm.svm import att_svm, prompt_svm
from attnsvm.tokens import (
    attention_probs,
    is_locally_optimal,
    min_score_gap,
    opt_tokens,
    outcome,
    scores,
    selected_sets,
    selected_tokens,
    svm_neighbours,
)


def test_scores_opt_and_sets():
    X = np.array([[[1.0, 0.0], [0.0, 2.0], [0.0, 2.0]]])
    g = scores(X, np.array([-1.0]), np.array([0.0, 1.0]))
    assert np.allclose(g, [[-0.0, -2.0, -2.0]])
    assert opt_tokens(np.array([[0.0, 3.0, 3.0]])).tolist() == [1]  # ties: lowest index
    s = np.array([[0.7, 0.2999, 1e-4]])
    assert selected_tokens(s).tolist() == [0]
    assert selected_sets(s).tolist() == [[True, True, False]]


def test_local_optimality_and_gap_by_hand():
    gamma = np.array([[3.0, 1.0, 2.5], [0.0, 1.0, -1.0]])
    alpha = np.array([0, 1])
    nb = np.array([[False, True, True], [True, False, False]])
    assert bool(is_locally_optimal(gamma, alpha, nb))
    assert np.isclose(min_score_gap(gamma, alpha, nb), 0.5)
    nb2 = nb.copy()
    nb2[1, 0] = False
    nb2[0, 2] = False
    assert np.isclose(min_score_gap(gamma, alpha, nb2), 2.0)
    gamma[0, 2] = 4.0
    assert not bool(is_locally_optimal(gamma, alpha, nb))


def test_neighbours_follow_margins():
    rng = np.random.default_rng(0)
    X, z = rng.standard_normal((4, 5, 8)), rng.standard_normal((4, 8))
    sol = att_svm(X, z, [0, 1, 2, 3])
    nb = svm_neighbours(sol)
    m = sol.margins_
    assert np.array_equal(nb, sol.support_)
    assert np.allclose(m[nb], 1.0) and (m[~nb & (sol.dual_ == 0) & (m != 0)] > 1 + 1e-6).all()
    assert np.array_equal(svm_neighbours(sol, tol=1e-6), nb)


def test_outcome_categories():
    rng = np.random.default_rng(1)
    n, T, d = 3, 4, 6
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    y = np.ones(n)
    v = rng.standard_normal(d)
    gamma = scores(X, y, v)
    opt = gamma.argmax(1)
    Wg = att_svm(X, z, opt).W_
    other = (opt + 1) % T
    Wo = att_svm(X, z, other).W_
    # trial 0: far along W_mm(opt) -> GMM; trial 1: small norm -> not saturated;
    # trial 2: far along W_mm(other) -> LMM if locally optimal, else "other"
    Wb = np.stack([50 * Wg / np.linalg.norm(Wg), 1e-3 * Wg, 50 * Wo / np.linalg.norm(Wo)])
    df = outcome(Wb, X, y, v, z)
    assert list(df.columns[:2]) == ["trial", "outcome"]
    assert df.outcome[0] == "GMM" and df.alpha_is_opt[0] and df.corr_gmm[0] > 0.999
    assert df.outcome[1] == "not saturated"
    sol_o = att_svm(X, z, other)
    loc = bool(is_locally_optimal(gamma, other, sol_o.support_))
    assert df.locally_optimal[2] == loc
    assert df.outcome[2] == ("LMM" if loc else "other")
    assert np.isclose(df.corr_lmm[2], 1.0)
    # probabilities given explicitly give the same verdicts
    probs = attention_probs(X, Wb, z)
    assert (outcome(Wb, X, y, v, z, probs=probs).outcome == df.outcome).all()


def test_outcome_prompt_model():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((4, 3, 5))
    y, v = np.ones(4), rng.standard_normal(5)
    opt = scores(X, y, v).argmax(1)
    p = prompt_svm(X, None, opt).W_
    df = outcome(np.stack([30 * p / np.linalg.norm(p), 0 * p]), X, y, v)
    assert df.outcome.tolist() == ["GMM", "not saturated"]


def test_outcome_in_the_runs_own_geometry():
    # a run that converged in direction to the nuclear-norm SVM (as GD on (K, Q) does) is
    # GMM when judged with norm="nuc", and not when judged against the Frobenius SVM
    rng = np.random.default_rng(4)
    n, T, d = 4, 5, 5
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    y, v = np.ones(n), rng.standard_normal(d)
    opt = scores(X, y, v).argmax(1)
    nuc = att_svm(X, z, opt, norm="nuc")
    fro = att_svm(X, z, opt)
    Wb = np.stack([40 * nuc.W_ / np.linalg.norm(nuc.W_), 40 * fro.W_ / np.linalg.norm(fro.W_)])
    c_nf = (nuc.W_ * fro.W_).sum() / np.linalg.norm(nuc.W_) / np.linalg.norm(fro.W_)
    assert c_nf < 0.99  # the two geometries are distinguishable on this instance
    dn = outcome(Wb, X, y, v, z, norm="nuc")
    df = outcome(Wb, X, y, v, z)
    assert dn.outcome[0] == "GMM" and np.isclose(dn.corr_gmm[0], 1.0, atol=1e-8)
    assert np.isclose(dn.corr_gmm[1], c_nf, atol=1e-8) and dn.outcome[1] != "GMM"
    assert df.outcome[1] == "GMM" and np.isclose(df.corr_gmm[0], c_nf, atol=1e-8)
    assert (dn.gmm_status == "optimal").all()
