"""Each formula of attnsvm.svm once: the plain routine against an independent computation,
and each compiled twin (kept in its kernel module) held equal to the plain one on data.

* the scale-safe Frobenius norm ``certificate.fro_norm`` against the exact sum of squares
  (Python fractions) within its stated bound gamma_{size + 4}, at scales where the plain
  sum of squares over- or underflows;
* the Cholesky factorisation ``certificate._cholesky`` against LAPACK and the compiled
  ``_nuc_kernels._chol`` against it; both refuse a matrix that is not positive definite.
"""

import math
from fractions import Fraction

import numpy as np
import pytest

from attnsvm.svm.certificate import _cholesky, fro_norm, gamma


def _exact_fro(A: np.ndarray) -> float:
    """sqrt(sum a^2) from the exact sum (Python fractions), to one rounding."""
    s = sum(Fraction(float(a)) ** 2 for a in A.ravel())
    if not s:
        return 0.0
    k = max(0, (240 - (s.numerator.bit_length() - s.denominator.bit_length())) // 2)
    return math.ldexp(float(math.isqrt(s.numerator * 4 ** k // s.denominator)), -k)


@pytest.mark.parametrize("scale", [1.0, 1e-200, 1e200, 1e-310])
def test_fro_norm_against_exact_sum_of_squares(scale):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((4, 5, 3)) * scale
    got = fro_norm(A)
    assert got.shape == (4,)
    for b in range(4):
        ref = _exact_fro(A[b])
        assert np.isfinite(got[b]) and ref > 0
        assert abs(got[b] - ref) <= gamma(A[b].size + 4) * ref + 2.0 ** -1073
    assert np.array_equal(fro_norm(np.zeros((2, 3, 3))), np.zeros(2))
    assert fro_norm(np.zeros((0, 3, 3))).shape == (0,)


def test_fro_norm_catches_a_wrong_norm():
    """The comparison above can fail: the plain sum of squares underflows at 1e-200."""
    A = np.full((2, 2), 1e-200)
    assert float(np.sqrt((A * A).sum())) == 0.0
    assert abs(float(fro_norm(A)) - _exact_fro(A)) <= 1e-15 * _exact_fro(A)


def _spd(rng, B, p):
    M = rng.standard_normal((B, p, p + 2))
    return M @ np.swapaxes(M, 1, 2)


def test_cholesky_against_lapack():
    rng = np.random.default_rng(5)
    A = _spd(rng, 6, 5)
    L, ok = _cholesky(A)
    assert ok.all()
    assert np.allclose(L, np.linalg.cholesky(A), rtol=0, atol=1e-12 * np.abs(A).max())
    assert np.allclose(L @ np.swapaxes(L, 1, 2), A, rtol=0, atol=1e-12 * np.abs(A).max())
    bad = A.copy()
    bad[2] = -bad[2]  # negative definite: the first pivot fails
    _, ok = _cholesky(bad)
    assert ok.tolist() == [True, True, False, True, True, True]


def test_compiled_cholesky_is_the_plain_one():
    pytest.importorskip("numba")
    from attnsvm.svm import _nuc_kernels as NK

    rng = np.random.default_rng(6)
    A = _spd(rng, 5, 6)
    L, ok = _cholesky(A)
    for b in range(5):
        Lc = np.full((6, 6), np.nan)
        assert NK._chol(A[b], Lc)
        assert np.allclose(Lc, L[b], rtol=0, atol=1e-13 * np.abs(A[b]).max())
    A0 = A[0].copy()
    A0[3, 3] = -1.0  # not positive definite
    assert not NK._chol(A0, np.zeros((6, 6)))
    assert not _cholesky(A0[None])[1][0]


def test_margins_are_one_formula():
    """ConstraintSet.margins and the Graph-SVM's rows are row_margins; the compiled
    margins_batch (the engine's fast path) equals it to rounding (|error| <= gamma_{d+e}
    |D|^T |W| |z|, checked against the exact margins in fractions)."""
    from attnsvm.svm.constraints import ConstraintSet, row_margins

    rng = np.random.default_rng(7)
    B, n, T, d, e = 3, 4, 5, 3, 2
    D, Z, W = rng.standard_normal((B, n, T, d)), rng.standard_normal((B, n, e)), \
        rng.standard_normal((B, d, e))
    valid = rng.random((B, n, T)) < 0.8
    cs = ConstraintSet(D, Z, valid, np.ones((B, n, T)))
    m = cs.margins(W)
    exact = np.array([[[float(sum(Fraction(float(D[b, i, t, c])) * Fraction(float(W[b, c, f]))
                                   * Fraction(float(Z[b, i, f])) for c in range(d) for f in range(e)))
                        for t in range(T)] for i in range(n)] for b in range(B)])
    size = np.einsum("bitc,bcf,bif->bit", np.abs(D), np.abs(W), np.abs(Z))
    assert np.all(np.abs(m - np.where(valid, exact, 0.0)) <= gamma(d + e) * size)
    assert np.array_equal(np.where(valid[0, 0], row_margins(D[0, 0], Z[0, 0], W[0]), 0.0), m[0, 0])
    pytest.importorskip("numba")
    from attnsvm.svm import active

    mc = np.empty((B, n, T))
    active.kernels().margins_batch(D, Z, valid, W, mc)
    assert np.all(np.abs(mc - np.where(valid, exact, 0.0)) <= gamma(d + e) * size)
    assert np.all(mc[~valid] == 0) and np.all(m[~valid] == 0)
