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


def _farkas_cases(rng):
    """A batch of Farkas candidates of every kind the enclosure meets: prompt SVMs the
    compiled solver found infeasible (e = 1, supports d e + 1), pairs Delta, -Delta on the
    same z (e = 2, supports larger than d e + 1, padded), candidates perturbed so that no
    exact null vector is near (refused), with a negative or an equality entry, with too
    small a support, left out by ``which``, with data error (data_err) and b != 1."""
    from attnsvm.svm import lean
    from attnsvm.svm.constraints import ConstraintSet, scaled_keys

    B, n, T, d = 60, 6, 8, 5
    X = rng.standard_normal((B, n, T, d))
    a = rng.integers(0, T, (B, n))
    valid = np.ones((B, n, T), bool)
    Kx, eK = scaled_keys(X, None, valid)
    info, D, Zs, v, _, _, mu = lean._solve_batch(
        Kx, np.ones((B, n, 1)), a, valid, np.broadcast_to(np.asarray(eK, np.int64), (B,)).copy(),
        20 * n * T + 50)
    c = np.nonzero(info[:, 2] == 1)[0]
    lam = mu[c] / mu[c].sum((1, 2))[:, None, None]
    lam[1, lam[1] > 0] *= 1 + 1e-3 * rng.standard_normal((lam[1] > 0).sum())  # refused
    k = np.argmax(lam[2])
    lam[2].flat[k] = -lam[2].flat[k]  # a negative multiplier: not a candidate
    lam[3] = np.where(lam[3] == lam[3].max(), 0.0, lam[3])  # support p: too small
    b = v.astype(float)
    b[4] *= 2.0  # b != 1 (sum lam b, ||b_K|| change)
    cs1 = ConstraintSet(D[c], Zs[c], v[c], b[c])
    e, p = 2, 4
    Bp, nmax = 6, p + 2
    D2 = np.zeros((Bp, nmax, 3, 2))
    Z2 = np.zeros((Bp, nmax, e))
    v2 = np.zeros((Bp, nmax, 3), bool)
    l2 = np.zeros((Bp, nmax, 3))
    for j in range(Bp):
        P = p + j % 3
        x, z = rng.standard_normal((P, 2)), rng.standard_normal((P, e))
        w = rng.random(P) + 0.05
        D2[j, :P, 0], D2[j, :P, 2], Z2[j, :P] = x, -x, z
        D2[j, :P, 1] = rng.standard_normal((P, 2))
        v2[j, :P, 0] = v2[j, :P, 2] = True
        for t in (0, 2):
            l2[j, :P, t] = w * (1 + 1e-13 * rng.standard_normal(P))
    l2[0, 0, 0] *= 1.5  # far from any exact null vector
    eq = np.zeros_like(v2)
    eq[1, 0, 0] = True  # an equality in the support: not a candidate
    cs2 = ConstraintSet(D2, Z2, v2, v2.astype(float), eq=eq)
    cs3 = ConstraintSet(D2, Z2, v2, v2.astype(float), data_err=np.full(Bp, 1e-15))
    return [(cs1, lam, None), (cs1, lam, np.arange(len(c)) % 5 != 0), (cs2, l2, None),
            (cs3, l2, None)]


def test_farkas_enclosure_compiled_equals_plain():
    """The compiled twin of the Farkas enclosure proves what the plain reference proves,
    problem by problem (the same candidates, bounds and comparisons; sums in another
    order), on solver candidates and on candidates it must refuse; its lambda_min bound
    and delta agree with an independent float computation of the same formulas."""
    from attnsvm.svm import active
    from attnsvm.svm.certificate import farkas_enclosure, farkas_enclosure_compiled

    if not active.available():
        pytest.skip("numba not installed")
    K = active.kernels()
    rng = np.random.default_rng(11)
    n_ok = n_no = 0
    for cs, lam, which in _farkas_cases(rng):
        ref = farkas_enclosure(cs, lam, which)
        got, num = farkas_enclosure_compiled(K, cs, lam, which, numbers=True)
        assert np.array_equal(got, ref)
        n_ok += int(ref.sum())
        n_no += int((~ref).sum())
        # the numbers of the proven ones: lambda_min(G) bound below the true smallest
        # eigenvalue of G = M M^T, and delta from ||M lam|| (numpy, independently)
        for b in np.nonzero(got)[0][:5]:
            sel = cs.valid[b] & (lam[b] > 1e-9 * np.abs(lam[b]).max())
            M = np.einsum("kd,ke->dek", cs.Delta[b][sel], cs.Z[b][np.nonzero(sel)[0]])
            M = M.reshape(cs.d * cs.e, -1)
            ev = np.linalg.eigvalsh(M @ M.T).min()
            # (t = 1 / (2 trace G^-1) >= lambda_min / (2 p), less the rounding terms)
            assert 0 < num[b, 0] <= ev and num[b, 0] >= 0.45 * ev / len(M)
            assert num[b, 1] >= np.linalg.norm(M @ lam[b][sel]) / math.sqrt(ev) * 0.99
    assert n_ok >= 20 and n_no >= 10  # (both verdicts met)
