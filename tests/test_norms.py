"""Norm objects: values against numpy / closed forms, duality of the steepest directions,
scale safety, cvxpy expressions, parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnsvm.norms import NORMS, get_norm, l_p, polar

ALL = ["fro", "nuc", "spectral", "l1", "linf", 1.5, 3.0, 1.1]


def _np_norm(A, name):
    if name == "fro":
        return np.linalg.norm(A, "fro")
    if name == "nuc":
        return np.linalg.norm(A, "nuc")
    if name == "spectral":
        return np.linalg.norm(A, 2)
    if name == "l1":
        return np.abs(A).sum()
    if name == "linf":
        return np.abs(A).max()
    return (np.abs(A) ** name).sum() ** (1 / name)


@pytest.mark.parametrize("spec", ALL)
def test_value_matches_numpy_batched(spec):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4, 5, 3))
    N = get_norm(spec)
    got = N.value(A)
    assert isinstance(got, np.ndarray) and got.shape == (4,)
    want = [_np_norm(a, spec) for a in A]
    np.testing.assert_allclose(got, want, rtol=1e-13)
    # torch in -> torch out, same numbers
    gt = N.value(torch.from_numpy(A))
    assert isinstance(gt, torch.Tensor)
    np.testing.assert_allclose(gt.numpy(), want, rtol=1e-13)


@pytest.mark.parametrize("spec", ALL)
@pytest.mark.parametrize("scale", [1e-200, 1e200, 1e-305])
def test_value_and_direction_are_scale_safe(spec, scale):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((3, 4))
    N = get_norm(spec)
    v = N.value(A * scale)
    assert np.isfinite(v) and v > 0
    np.testing.assert_allclose(v / scale, N.value(A), rtol=1e-12)
    np.testing.assert_allclose(N.steepest(A * scale), N.steepest(A), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("spec", ALL)
def test_steepest_direction_is_unit_and_attains_the_dual_norm(spec):
    rng = np.random.default_rng(2)
    G = rng.standard_normal((6, 4, 5))
    N = get_norm(spec)
    D = N.steepest(G)
    np.testing.assert_allclose(N.value(D), 1.0, rtol=1e-10)
    np.testing.assert_allclose((G * D).sum((-2, -1)), N.dual.value(G), rtol=1e-10)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ALL), st.integers(0, 10_000))
def test_no_unit_direction_beats_the_steepest_one(spec, seed):
    """<G, D> <= ||G||_* for any D with ||D|| <= 1 (the definition of the dual norm)."""
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((3, 4))
    N = get_norm(spec)
    Ds = rng.standard_normal((200, 3, 4))
    Ds = Ds / N.value(Ds)[:, None, None]
    best = float((G * N.steepest(G)).sum())
    assert ((Ds * G).sum((-2, -1)) <= best * (1 + 1e-12)).all()


def test_named_steepest_directions_closed_forms():
    G = np.array([[3.0, -1.0], [0.0, 2.0]])
    np.testing.assert_array_equal(get_norm("linf").steepest(G), np.sign(G))  # sign descent
    np.testing.assert_array_equal(get_norm("l1").steepest(G), [[1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(get_norm("fro").steepest(G), G / np.linalg.norm(G))
    U, _, Vh = np.linalg.svd(G)
    np.testing.assert_allclose(get_norm("spectral").steepest(G), U @ Vh, atol=1e-15)
    np.testing.assert_allclose(get_norm("nuc").steepest(G), np.outer(U[:, 0], Vh[0]), atol=1e-15)
    # ties of the coordinate rule are split evenly
    np.testing.assert_allclose(get_norm("l1").steepest(np.array([[2.0, -2.0]])), [[0.5, -0.5]])


def test_polar_keeps_only_the_range_of_a_rank_deficient_gradient():
    u = np.array([1.0, 2.0, 2.0]) / 3
    v = np.array([0.6, 0.8])
    G = torch.from_numpy(5.0 * np.outer(u, v))
    np.testing.assert_allclose(polar(G).numpy(), np.outer(u, v), atol=1e-14)


def test_zero_has_zero_direction_and_zero_norm():
    for N in NORMS.values():
        assert N.value(np.zeros((2, 3, 3))).tolist() == [0.0, 0.0]
        assert not np.any(N.steepest(np.zeros((3, 3))))


def test_vectors_use_the_l2_norm_for_spectral_norms():
    x = np.array([3.0, -4.0])
    for spec in ("nuc", "spectral", "fro"):
        assert get_norm(spec).value(x) == pytest.approx(5.0)
        np.testing.assert_allclose(get_norm(spec).steepest(x), x / 5)
    assert get_norm("l1").value(x) == 7.0 and get_norm("linf").value(x) == 4.0
    np.testing.assert_allclose(get_norm("nuc").value(np.ones((2, 3)), vector=True), [3**0.5] * 2)


@pytest.mark.parametrize("spec", ALL)
def test_cvxpy_expression_evaluates_to_the_value(spec):
    import cvxpy as cp

    rng = np.random.default_rng(3)
    A = rng.standard_normal((4, 3))
    N = get_norm(spec)
    assert float(N.cvxpy(cp.Constant(A)).value) == pytest.approx(N.value(A), rel=1e-9)
    x = rng.standard_normal(5)
    assert float(N.cvxpy(cp.Constant(x)).value) == pytest.approx(N.value(x), rel=1e-9)


def test_duals_and_parsing():
    assert get_norm("nuc").dual == get_norm("spectral") and get_norm("spectral").dual.name == "nuc"
    assert get_norm("l1").dual.name == "linf" and get_norm("linf").dual.name == "l1"
    assert get_norm(3).dual.name == "l1.5" and get_norm("l1.5").dual.name == "l3"
    assert get_norm("fro").dual is get_norm("fro")
    for spec, name in [(2, "fro"), ("l2", "fro"), ("Frobenius", "fro"), (math.inf, "linf"),
                       ("max", "linf"), ("trace", "nuc"), ("op", "spectral"), ("l_3", "l3"),
                       (1, "l1"), ("1.75", "l1.75"), (np.float64(3.0), "l3")]:
        assert get_norm(spec).name == name, spec
    assert l_p(2) is get_norm("fro")
    N = get_norm("nuc")
    assert get_norm(N) is N and hash(get_norm("l3")) == hash(get_norm(3.0))
    for bad, msg in [("foo", "unknown norm 'foo'"), (0.5, "p >= 1"), ("l0.3", "needs p >= 1"),
                     (True, "name or a number"), (None, "name or a number")]:
        with pytest.raises(ValueError, match=msg):
            get_norm(bad)


def test_a_new_norm_is_one_class_and_works_everywhere():
    """Adding a norm is one Norm subclass: the group norm ||W||_{2,1} = sum_i ||W_i.||_2 (dual:
    max_i ||G_i.||_2) then runs in the SVM engine (certified against its own cvxpy form) and as
    a normalised steepest-descent rule, without editing any other module."""
    import cvxpy as cp

    from attnsvm import optim
    from attnsvm.norms import Norm
    from attnsvm.svm import att_svm

    class L2Inf(Norm):
        name, entrywise, solver = "l2inf", False, "CLARABEL"

        @property
        def dual(self):
            return L21()

        def _value(self, A1, dims):
            return A1.pow(2).sum(-1).sqrt().amax(-1)

        def _steepest(self, G1, dims):  # each row to unit length
            n = G1.pow(2).sum(-1, keepdim=True).sqrt()
            return G1 / torch.where(n > 0, n, torch.ones_like(n))

        def cvxpy(self, expr):
            return cp.max(cp.norm(expr, 2, axis=1))

    class L21(Norm):
        name, entrywise, solver = "l21", False, "CLARABEL"

        @property
        def dual(self):
            return L2Inf()

        def _value(self, A1, dims):
            return A1.pow(2).sum(-1).sqrt().sum(-1)

        def _steepest(self, G1, dims):  # all mass on the largest row
            n = G1.pow(2).sum(-1, keepdim=True).sqrt()
            top = (n == n.amax(-2, keepdim=True)).to(G1.dtype)
            return top * G1 / torch.where(n > 0, n, torch.ones_like(n)) / top.sum(-2, keepdim=True)

        def cvxpy(self, expr):
            return cp.sum(cp.norm(expr, 2, axis=1))

    rng = np.random.default_rng(0)
    X, z = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 5))
    alpha = np.zeros(4, dtype=int)
    sol = att_svm(X, z, alpha, norm=L21())
    assert sol.feasible_ and sol.status_ == "optimal" and sol.violation_ <= 1e-9
    W = cp.Variable((5, 5))  # independent statement of the same problem
    cons = [(X[i, 0] - X[i, t]) @ W @ z[i] >= 1 for i in range(4) for t in (1, 2)]
    ref = cp.Problem(cp.Minimize(cp.sum(cp.norm(W, 2, axis=1))), cons).solve(solver="CLARABEL")
    assert sol.norm_ == pytest.approx(ref, rel=1e-6)
    G = torch.as_tensor(rng.standard_normal((3, 5, 5)))
    D = L21().steepest(G)
    np.testing.assert_allclose(L21().value(D), 1.0)
    np.testing.assert_allclose((G * D).sum((-2, -1)), L2Inf().value(G), rtol=1e-12)
    P = {"W": torch.zeros(3, 5, 5, dtype=torch.float64)}
    out, _ = optim.nsd(L21(), lr=0.5).update({"W": G}, {}, P, None)
    np.testing.assert_allclose(L21().value(out["W"]), 0.5)


def test_non_finite_items_give_inf_or_nan_not_an_error():
    A = np.ones((3, 2, 2))
    A[1, 0, 0] = np.inf
    A[2, 1, 1] = np.nan
    for spec in ALL:
        v = get_norm(spec).value(A)
        assert np.isfinite(v[0]) and v[1] == np.inf and np.isnan(v[2]), spec
