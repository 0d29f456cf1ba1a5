"""Bad input and extreme scales for attnsvm.svm and tokens.outcome (issue 11 §1).

Each case asserts that the error names the problem, or verifies the answer independently:
margins and Farkas sums recomputed by explicit loops over the constraints, the scaling
identity W_mm(c X, c' z) = W_mm(X, z) / (c c'), or a second solver.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnsvm.svm import (
    NotRepresentableError,
    att_svm,
    att_svm_batch,
    head_svm,
    multitoken_svm,
    prompt_svm,
    prompt_svm_batch,
    relaxed_svm,
    seq2seq_svm,
)
from attnsvm.tokens import outcome


def planted(n, T, d, seed=0, e=None):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, e or d))
    Ws = rng.standard_normal((d, e or d))
    alpha = np.argmax(((X @ Ws) * z[:, None, :]).sum(-1), axis=1)
    return X, z, alpha


def loop_margins(X, z, alpha, W, mask=None):
    """min over constraints of (x_{i,alpha_i} - x_it)^T W z_i, by explicit loops."""
    n, T, _ = X.shape
    out = []
    for i in range(n):
        for t in range(T):
            if t == alpha[i] or (mask is not None and not mask[i, t]):
                continue
            out.append(float((X[i, alpha[i]] - X[i, t]) @ W @ z[i]))
    return np.array(out)


def loop_farkas(X, z, alpha, lam):
    """(sum lam_k b_k, ||sum lam_k A_k||_F, sum lam_k ||A_k||_F, min lam) by loops."""
    n, T, d = X.shape
    S = np.zeros((d, z.shape[1]))
    lb = tot = 0.0
    lmin = np.inf
    for i in range(n):
        for t in range(T):
            if t == alpha[i]:
                continue
            A = np.outer(X[i, alpha[i]] - X[i, t], z[i])
            S += lam[i, t] * A
            lb += lam[i, t]
            tot += lam[i, t] * np.linalg.norm(A)
            lmin = min(lmin, lam[i, t])
    return lb, np.linalg.norm(S), tot, lmin


def assert_verified_infeasible(X, z, alpha, sol):
    assert not sol.feasible_ and sol.status_ == "infeasible" and sol.W_ is None
    assert len(sol.conflict_) >= 1
    lam = sol.extra["farkas_multipliers"]
    # the Farkas condition is scale-free: check it on X / max|X|, z / max|z| (no overflow)
    Xs = X / max(np.abs(X).max(), 1e-300)
    zs = z / max(np.abs(z).max(), 1e-300)
    lb, s, tot, lmin = loop_farkas(Xs, zs, alpha, lam)
    assert lmin >= 0 and lb > 0
    assert s <= 1e-9 * max(tot, lb)
    # the conflict is where the certificate lives
    assert set(sol.conflict_) == {int(i) for i in np.nonzero((lam > 0).any(1))[0]}


# ----------------------------------------------------------- degenerate data (issue 11)
def test_zero_tokens_are_infeasible_not_optimal():
    r = np.random.default_rng(0)
    X, z, a = np.zeros((10, 8, 2)), r.standard_normal((10, 2)), np.zeros(10, int)
    sol = att_svm(X, z, a)
    assert_verified_infeasible(X, z, a, sol)
    assert "A_k = 0" in sol.summary() and "INFEASIBLE" in repr(sol)
    assert len(sol.extra["zero_constraints"]) == 70


def test_prompt_with_zero_key_matrix_is_infeasible():
    r = np.random.default_rng(0)
    X = r.standard_normal((4, 5, 6))
    sol = prompt_svm(X, np.zeros((6, 6)), np.zeros(4, int))
    assert not sol.feasible_ and sol.status_ == "infeasible" and sol.conflict_
    bs = prompt_svm_batch(X[None], np.zeros((6, 6)), np.zeros((1, 4), int))
    assert bs.status_[0] == "infeasible" and not bs.feasible_[0]


def test_zero_queries_are_infeasible():
    X, z, a = planted(3, 4, 3, 1)
    z[1] = 0.0
    sol = att_svm(X, z, a)
    assert_verified_infeasible(X, z, a, sol)
    assert sol.conflict_ == (1,)


def test_duplicate_of_selected_token_names_its_sequence():
    X, z, a = planted(4, 5, 3, 2)
    X[2, (a[2] + 1) % 5] = X[2, a[2]]
    for norm in ("fro", "nuc", "linf"):
        sol = att_svm(X, z, a, norm=norm)
        assert_verified_infeasible(X, z, a, sol)
        assert sol.conflict_ == (2,)


def test_collinear_conflict_across_sequences_in_every_norm():
    rng = np.random.default_rng(0)
    p, q = rng.standard_normal(3), rng.standard_normal(3)
    X = np.stack([np.stack([p, q, rng.standard_normal(3)]), np.stack([2 * p, 2 * q, rng.standard_normal(3)]),
                  rng.standard_normal((3, 3))])
    z = np.tile(rng.standard_normal(3), (3, 1))
    a = np.array([0, 1, 2])  # seq 0 prefers p over q, seq 1 (collinear copy) q over p
    for norm in ("fro", "nuc", "spectral", "l1", "linf", 3.0):
        sol = att_svm(X, z, a, norm=norm)
        assert_verified_infeasible(X, z, a, sol)
        assert sol.conflict_ == (0, 1), norm


def test_zero_tokens_in_one_batch_problem_only():
    X, z, a = planted(3, 4, 3, 3)
    Xb = np.stack([X, np.zeros_like(X), X])
    bs = att_svm_batch(Xb, np.stack([z] * 3), np.stack([a] * 3))
    assert bs.feasible_.tolist() == [True, False, True]
    assert bs.status_[1] == "infeasible" and bs.conflict_[1]
    assert np.allclose(bs.W_[0], att_svm(X, z, a).W_, rtol=1e-8)


def test_near_duplicate_tokens_are_feasible_with_large_norm():
    # one sequence's tokens differ by 1e-9: feasible, ||W|| ~ 1e9; certified by loops
    X, z, a = planted(3, 3, 3, 4)
    X[0] = X[0, a[0]] + 1e-9 * np.random.default_rng(1).standard_normal((3, 3))
    sol = att_svm(X, z, a)
    assert sol.feasible_ and sol.status_ == "optimal" and sol.norm_ > 1e7
    m = loop_margins(X, z, a, sol.W_)
    assert m.min() >= 1 - 1e-6 and abs(m.min() - 1) < 1e-6


def test_single_token_sequences_need_no_margin():
    X = np.random.default_rng(0).standard_normal((3, 1, 4))
    sol = att_svm(X, np.ones((3, 4)), np.zeros(3, int))
    assert sol.feasible_ and sol.status_ == "optimal" and np.all(sol.W_ == 0)
    mask = np.array([[True, False], [True, False]])
    s2 = att_svm(np.random.default_rng(1).standard_normal((2, 2, 3)), np.ones((2, 3)), [0, 0],
                 mask=mask)
    assert s2.feasible_ and np.all(s2.W_ == 0) and s2.extra["n_constraints"] == 0


# --------------------------------------------------------------------- extreme scale
@pytest.mark.parametrize("c,cz", [(1e200, 1.0), (1e-200, 1.0), (1e150, 1e-120), (3.7e-170, 2e100)])
@pytest.mark.parametrize("norm", ["fro", "nuc", "linf"])
def test_rescaling_identity(c, cz, norm):
    X, z, a = planted(5, 4, 3, 5)
    ref = att_svm(X, z, a, norm=norm)
    sol = att_svm(X * c, z * cz, a, norm=norm)
    assert sol.feasible_ and sol.status_ == ref.status_ == "optimal"
    scale = c * cz
    if norm == "fro":  # unique solution: the map W -> W / (c c') is exact up to rounding
        assert np.allclose(sol.W_ * c * cz, ref.W_, rtol=1e-9, atol=1e-12 * np.abs(ref.W_).max())
    assert np.isclose(sol.norm_ * scale, ref.norm_, rtol=1e-6)
    m = loop_margins(X * c, z * cz, a, sol.W_)  # products of huge and tiny: no overflow
    assert m.min() >= 1 - 1e-9


def test_power_of_two_scaling_is_bit_exact():
    X, z, a = planted(6, 5, 4, 6)
    ref = att_svm(X, z, a)
    sol = att_svm(X * 2.0**600, z * 2.0**-300, a)
    assert np.array_equal(sol.W_ * 2.0**300, ref.W_)


def test_overflowing_solution_raises_with_the_scaled_answer_attached():
    X, z, a = planted(4, 3, 3, 7)
    with pytest.raises(NotRepresentableError, match="overflows float64") as ei:
        att_svm(X * 1e-300, z * 1e-300, a)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, OverflowError)
    s = ei.value.solution
    ref = att_svm(X, z, a)
    assert s.feasible_ and s.status_ == "optimal"
    # the attached answer is W * 2^scale_exp: its norm maps to the true one by c^2 = 1e-600
    assert np.isclose(np.log2(s.norm_) - ei.value.scale_exp,
                      np.log2(ref.norm_) + 600 * np.log2(10), rtol=1e-9)


def test_underflowing_solution_raises():
    X, z, a = planted(4, 3, 3, 7)
    with pytest.raises(NotRepresentableError, match="underflows float64"):
        att_svm(X * 1e300, z * 1e300, a)


def test_batch_marks_the_unrepresentable_problem_only():
    X, z, a = planted(4, 3, 3, 8)
    Xb = np.stack([X, X * 1e-300])
    bs = att_svm_batch(Xb, np.stack([z, z * 1e-300]), np.stack([a, a]))
    assert bs.feasible_.tolist() == [True, False]
    assert bs.status_[1] == "not_representable" and bs.conflict_[1] == ()
    assert np.allclose(bs.W_[0], att_svm(X, z, a).W_, rtol=1e-8)


def test_prompt_keys_at_extreme_scale():
    X, _, _ = planted(5, 4, 3, 9)
    rng = np.random.default_rng(0)
    Wk, p = rng.standard_normal((3, 3)), rng.standard_normal(3)
    a = np.argmax(X @ Wk @ p, axis=1)  # p separates: feasible
    ref = prompt_svm(X, Wk, a)
    sol = prompt_svm(X * 1e200, Wk * 1e100, a)  # keys would be ~1e300
    assert sol.feasible_ and np.allclose(sol.W_ * 1e300, ref.W_, rtol=1e-9)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 4), T=st.integers(2, 4), d=st.integers(1, 3), seed=st.integers(0, 10**6),
       exp=st.integers(-250, 250))
def test_verdict_is_always_verified(n, T, d, seed, exp):
    # random alpha (often infeasible at small d): an 'infeasible' verdict carries a Farkas
    # certificate that holds by loops; a feasible one satisfies every constraint by loops
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d)) * 10.0**exp
    z = rng.standard_normal((n, d))
    a = rng.integers(0, T, n)
    sol = att_svm(X, z, a)
    if sol.feasible_:
        m = loop_margins(X, z, a, sol.W_)
        assert m.min() >= 1 - 1e-9 and sol.gap_ <= 1e-6
    else:
        assert_verified_infeasible(X, z, a, sol)
    bs = att_svm_batch(X[None], z[None], a[None])
    assert bs.feasible_[0] == sol.feasible_ and bs.status_[0] == sol.status_


# ------------------------------------------------------------------ token indices
def test_float_alpha_is_refused_not_truncated():
    X, z, a = planted(3, 4, 3)
    with pytest.raises(ValueError, match="floats are refused"):
        att_svm(X, z, a.astype(float))
    with pytest.raises(ValueError, match="floats are refused"):
        att_svm(X, z, [0.7, 1.2, 2.0])
    with pytest.raises(ValueError, match="floats are refused"):
        att_svm_batch(X[None], z[None], a[None].astype(float))
    with pytest.raises(ValueError, match="floats are refused"):
        seq2seq_svm(X, np.zeros((3, 4)))


def test_bool_alpha_is_refused():
    X, z, _ = planted(3, 4, 3)
    with pytest.raises(ValueError, match="booleans"):
        att_svm(X, z, np.array([True, False, True]))


@pytest.mark.parametrize("alpha,msg", [([0, 1, -1], "out of range"), ([0, 1, 4], "out of range"),
                                       ([0, 1], "shape"), ([[0, 1, 2]], "shape"),
                                       ("first", "token indices or 'opt'")])
def test_alpha_shape_and_range(alpha, msg):
    X, z, _ = planted(3, 4, 3)
    with pytest.raises(ValueError, match=msg):
        att_svm(X, z, alpha)


def test_alpha_selecting_a_masked_token():
    X, z, _ = planted(3, 4, 3)
    mask = np.ones((3, 4), bool)
    mask[2, 1] = False
    with pytest.raises(ValueError, match=r"masked tokens in sequences \[2\]"):
        att_svm(X, z, [0, 0, 1], mask=mask)
    with pytest.raises(ValueError, match=r"masked tokens in problems \[1\]"):
        att_svm_batch(np.stack([X, X]), np.stack([z, z]), np.array([[0, 0, 0], [0, 0, 1]]), mask=mask)


def test_alpha_opt_needs_labels_and_head():
    X, z, _ = planted(3, 4, 3)
    with pytest.raises(ValueError, match="alpha is required"):
        att_svm(X, z, "opt", y=np.ones(3))
    with pytest.raises(ValueError, match="labels in"):
        att_svm(X, z, y=np.array([1.0, 0.0, 1.0]), v=np.ones(3))
    with pytest.raises(ValueError, match="v must have shape"):
        att_svm(X, z, y=np.ones(3), v=np.ones(4))


def test_opt_at_extreme_scale_matches_unit_scale():
    X, z, _ = planted(5, 4, 3, 10)
    rng = np.random.default_rng(0)
    y, v = np.sign(rng.standard_normal(5)), rng.standard_normal(3)
    s1 = att_svm(X, z, y=y, v=v)
    s2 = att_svm(X * 1e200, z, y=y, v=v * 1e200)  # scores would overflow to inf
    assert np.array_equal(s1.alpha_, s2.alpha_)


# ------------------------------------------------------------------- other arguments
def test_masks_must_be_boolean():
    X, z, a = planted(3, 4, 3)
    with pytest.raises(ValueError, match="boolean"):
        att_svm(X, z, a, mask=np.full((3, 4), 0.5))
    with pytest.raises(ValueError, match="boolean"):
        att_svm(X, z, a, mask=np.full((3, 4), "yes"))
    with pytest.raises(ValueError, match=r"mask must have shape \(3, 4\)"):
        att_svm(X, z, a, mask=np.ones((3, 5), bool))
    sol = att_svm(X, z, a, mask=np.ones((3, 4), int))  # 0 / 1 numbers are read as booleans
    assert sol.feasible_


def test_non_finite_and_non_real_arrays():
    X, z, a = planted(3, 4, 3)
    zn = z.copy()
    zn[1, 1] = np.inf
    with pytest.raises(ValueError, match="z contains NaN or inf"):
        att_svm(X, zn, a)
    with pytest.raises(ValueError, match="real numeric"):
        att_svm(X.astype(complex), z, a)
    with pytest.raises(ValueError, match="W contains NaN"):
        prompt_svm(X, np.full((3, 3), np.nan), a)
    with pytest.raises(ValueError, match="n, T, d >= 1"):
        att_svm(np.zeros((3, 0, 3)), z, a)


def test_support_indices_and_labels():
    X, _, a = planted(4, 3, 3, 11)
    with pytest.raises(ValueError, match="support indices out of range"):
        relaxed_svm(X, a, support=[0, 5])
    with pytest.raises(ValueError, match="floats are refused"):
        relaxed_svm(X, a, support=[0.0, 1.0])
    with pytest.raises(ValueError, match="needs alpha"):
        relaxed_svm(X, None, support=[0])
    with pytest.raises(ValueError, match="labels in"):
        head_svm(X[:, 0], np.array([0, 1, 1, 0]))
    with pytest.raises(ValueError, match="alpha out of range"):
        head_svm(X, np.ones(4), alpha=[0, 1, 2, 3])


def test_norm_solver_and_rank_arguments():
    X, z, a = planted(3, 4, 3)
    with pytest.raises(ValueError, match="unknown norm"):
        att_svm(X, z, a, norm="bogus")
    with pytest.raises(ValueError, match="p >= 1"):
        att_svm(X, z, a, norm=0.5)
    with pytest.raises(ValueError, match="unknown solver"):
        att_svm(X, z, a, solver="gurobi-ish")
    with pytest.raises(ValueError, match="applies to the 'fro' norm only"):
        att_svm(X, z, a, norm="nuc", solver="ipm")
    with pytest.raises(ValueError, match="applies to the 'nuc' norm only"):
        att_svm(X, z, a, solver="barrier")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="rank must be a positive integer"):
            att_svm(X, z, a, norm="nuc", rank=bad)


def test_multitoken_arguments():
    X, z, _ = planted(3, 4, 3)
    s = np.full((3, 4), 1e-6)
    s[:2, 0] = 1.0
    with pytest.raises(ValueError, match=r"needs a selected token .* sequences \[2\]"):
        multitoken_svm(X, z, s)
    with pytest.raises(ValueError, match="threshold"):
        multitoken_svm(X, z, np.ones((3, 4)) / 4, threshold=0.0)
    with pytest.raises(ValueError, match="W_trained must have shape"):
        multitoken_svm(X, z, np.ones((3, 4)) / 4, W_trained=np.ones((2, 2)))


def test_outcome_refuses_non_finite_W():
    X, z, a = planted(3, 4, 3)
    W = np.ones((2, 3, 3))
    W[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="W contains NaN"):
        outcome(W, X, np.ones(3), np.ones(3), z)
    with pytest.raises(ValueError, match="unknown norm"):
        outcome(np.ones((2, 3, 3)), X, np.ones(3), np.ones(3), z, norm="nucc")
