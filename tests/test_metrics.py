"""attnsvm.metrics against independent computations: definitions written out with numpy
loops / SVDs / scipy, closed forms, and numpy == torch on the same input."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.stats import entropy as scipy_entropy

from attnsvm import metrics as M

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
wide = st.floats(-1e250, 1e250, allow_nan=False, allow_infinity=False)  # any scale


@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, (3, 4, 5), elements=wide), arrays(np.float64, (3, 4, 5), elements=wide))
def test_correlation_is_the_cosine_of_the_flattened_matrices(A, B):
    got = M.correlation(A, B)
    for b in range(3):  # exact rational arithmetic: no rounding, underflow or overflow
        a, c = [Fraction(x) for x in A[b].ravel()], [Fraction(x) for x in B[b].ravel()]
        num = sum(x * y for x, y in zip(a, c))
        saa, scc = sum(x * x for x in a), sum(y * y for y in c)
        if saa == 0 or scc == 0:
            assert np.isnan(got[b])
        else:
            expect = (1 if num >= 0 else -1) * math.sqrt(num * num / (saa * scc))
            assert got[b] == pytest.approx(expect, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(M.correlation(torch.tensor(A), torch.tensor(B)).numpy(), got,
                               rtol=1e-12, atol=1e-12, equal_nan=True)


def test_correlation_of_a_zero_matrix_is_nan_without_a_warning():
    A = np.zeros((2, 3, 3))
    A[1] = np.eye(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = M.correlation(A, np.eye(3)[None])
    assert np.isnan(c[0]) and c[1] == pytest.approx(1.0)


def test_vector_mode_and_broadcasting():
    rng = np.random.default_rng(0)
    P, r = rng.standard_normal((5, 4)), rng.standard_normal(4)
    expect = P @ r / (np.linalg.norm(P, axis=1) * np.linalg.norm(r))
    np.testing.assert_allclose(M.correlation(P, r[None], vector=True), expect, rtol=1e-12)
    D = M.directional_distance(P, r[None], vector=True)
    np.testing.assert_allclose(D, np.sqrt(2 - 2 * expect), rtol=1e-9)  # unit vectors


def test_norms_match_svd_and_numpy():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((4, 5, 3))
    sv = np.linalg.svd(W, compute_uv=False)
    np.testing.assert_allclose(M.nuclear_norm(W), sv.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(M.nuclear_norm(torch.tensor(W)).numpy(), sv.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(M.fro_norm(W), np.linalg.norm(W, axis=(1, 2)), rtol=1e-12)
    for p in (1.0, 1.5, 3.0):
        ref = (np.abs(W) ** p).sum((1, 2)) ** (1 / p)
        np.testing.assert_allclose(M.lp_norm(W, p), ref, rtol=1e-12)
        np.testing.assert_allclose(M.lp_norm(M.lp_normalize(W, p), p), 1.0, rtol=1e-12)


def test_numerical_rank_counts_planted_singular_values():
    rng = np.random.default_rng(2)
    U, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    V, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    s = np.array([3.0, 1.0, 1e-3, 1e-9, 0, 0])
    W = (U * s) @ V.T
    assert int(M.numerical_rank(W)) == 3  # 1e-9 / 3 < 1e-7
    assert int(M.numerical_rank(W, rtol=1e-12)) == 4
    assert int(M.numerical_rank(torch.tensor(W))) == 3


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (3, 3), elements=finite), arrays(np.float64, (3, 3), elements=finite),
       st.sampled_from([1.25, 1.75, 2.0, 3.0]))
def test_bregman_is_the_first_order_remainder_and_nonnegative(A, B, p):
    psi = (np.abs(A) ** p).sum() / p - (np.abs(B) ** p).sum() / p
    grad = np.sign(B) * np.abs(B) ** (p - 1)
    expect = psi - (grad * (A - B)).sum()
    got = float(M.bregman(A, B, p))
    assert got == pytest.approx(expect, rel=1e-9, abs=1e-9)
    assert got >= -1e-9 * max(1.0, (np.abs(A) ** p).sum())  # psi is convex
    np.testing.assert_allclose(M.inverse_mirror_map(M.mirror_map(A, p), p), A, rtol=1e-9,
                               atol=1e-12)


def test_directional_bregman_p2_is_half_the_squared_distance_of_unit_directions():
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((4, 3, 3)), rng.standard_normal((4, 3, 3))
    expect = 0.5 * M.directional_distance(A, B) ** 2
    np.testing.assert_allclose(M.directional_bregman(A, B, 2.0), expect, rtol=1e-10)
    assert np.allclose(M.directional_bregman(A, 7.0 * A, 1.5), 0.0, atol=1e-14)  # same direction


def test_soft_sparsity_and_entropy_closed_forms():
    T = 8
    uniform, onehot = np.full(T, 1 / T), np.eye(T)[2]
    two = np.array([0.5, 0.5] + [0.0] * (T - 2))
    np.testing.assert_allclose(M.soft_sparsity(np.stack([uniform, onehot, two])), [T, 1, 2])
    s = np.random.default_rng(4).dirichlet(np.ones(T), size=5)
    np.testing.assert_allclose(M.entropy(s), scipy_entropy(s, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(M.entropy(torch.tensor(s)).numpy(), scipy_entropy(s, axis=-1),
                               rtol=1e-12)
    assert M.entropy(onehot) == 0.0
