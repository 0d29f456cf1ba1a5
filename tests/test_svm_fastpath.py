"""The engine's fast paths against its general ones, on random feasible, degenerate and
infeasible instances, single and batched:

* the Frobenius certificate's one-pass numbers (``certificate._fro_sums`` -> ``fro_sums``) and the
  compiled margins of the feasibility rescaling (``engine._margins``) against the numpy
  certificate (the same solver answers, certified both ways): identical statuses,
  feasibility, supports and conflicts; margins, norms and multipliers to 1e-12 relative;
  violation, KKT residual and gap (rounding-level numbers) to 1e-12 absolute;
* an independent check of every returned certificate from the caller's W_ and dual_:
  margins recomputed from the raw tokens, ||W_||_F, stationarity W = sum lam_k A_k;
* the one-pass normalisation (``constraints.absmax``) against the masked-copy formula, bit
  for bit;
* the kernel's lazily formed Gram matrix against the full one (``mnp_one`` given G), bit
  for bit, and the full one against numpy's (D D^T) o (Z Z^T) to rounding.
"""

import numpy as np
import pytest

pytest.importorskip("numba")

from attnsvm.svm import (  # noqa: E402
    active,
    att_svm,
    att_svm_batch,
    certificate,
    engine,
    prompt_svm,
    prompt_svm_batch,
    solution,
)

FIELDS_REL = ("W_", "norm_", "margin_", "dual_", "margins_")
FIELDS_ABS = ("violation_", "kkt_residual_", "gap_")
FIELDS_EQ = ("feasible_", "status_", "support_", "conflict_", "solver_")


def _general(monkeypatch):
    """Force the numpy certificate and margins (the general path)."""
    monkeypatch.setattr(certificate, "_fro_sums", lambda cs, Wz, lam: None)
    monkeypatch.setattr(engine, "_margins", lambda cs, W: cs.margins(W))


def _same(a, b):
    for f in FIELDS_EQ:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None and np.array_equal(np.asarray(x), np.asarray(y)), f
        else:
            assert x == y, f
    for f in FIELDS_REL + FIELDS_ABS:
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            assert x is None and y is None, f
            continue
        x, y = np.asarray(x, float), np.asarray(y, float)
        assert x.shape == y.shape, f
        fin = np.isfinite(x)
        assert np.array_equal(fin, np.isfinite(y)), f
        if f in FIELDS_ABS:
            tol = 1e-12
        else:
            tol = 1e-12 * max(1.0, float(np.abs(x[fin]).max()) if fin.any() else 1.0)
        np.testing.assert_allclose(y[fin], x[fin], rtol=1e-12, atol=tol, err_msg=f)


def _instances(seed):
    """(name, X, z, alpha, mask) single problems: feasible, degenerate (duplicated and
    rank-one tokens), infeasible (random alpha on low d), tiny and huge scales."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(9):
        n, T, d = int(rng.integers(2, 9)), int(rng.integers(2, 9)), int(rng.integers(1, 7))
        X = rng.standard_normal((n, T, d)) * 10.0 ** int(rng.integers(-6, 6))
        z = rng.standard_normal((n, d))
        if k % 3 == 1:  # degenerate: a duplicated token, rank-one tokens
            X[:, 1] = X[:, 0]
            X[..., 1:] = 0.0
        if k % 3 == 2:  # feasible by construction (planted W*)
            Ws = rng.standard_normal((d, d))
            alpha = np.argmax(((X @ Ws) * z[:, None, :]).sum(-1), axis=1)
        else:
            alpha = rng.integers(0, T, n)
        mask = rng.random((n, T)) > 0.25
        mask[np.arange(n), alpha] = True
        out.append((k, X, z, alpha, mask))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_single_fast_equals_general(seed, monkeypatch):
    fast = []
    for _, X, z, alpha, mask in _instances(seed):
        fast.append([att_svm(X, z, alpha), att_svm(X, z, alpha, mask=mask),
                     prompt_svm(X, None, alpha)])
    _general(monkeypatch)
    kinds = set()
    for (_, X, z, alpha, mask), f in zip(_instances(seed), fast):
        g = [att_svm(X, z, alpha), att_svm(X, z, alpha, mask=mask), prompt_svm(X, None, alpha)]
        for a, b in zip(g, f):
            _same(a, b)
            kinds.add(a.status_)
    assert {"optimal", "infeasible"} <= kinds


def _batches(seed):
    rng = np.random.default_rng(seed)
    for B, n, T, d in ((200, 6, 8, 10), (64, 4, 5, 2), (70, 3, 4, 3)):
        X = rng.standard_normal((B, n, T, d))
        X[::5, :, 2] = X[::5, :, 1]  # degenerate problems
        alpha = rng.integers(0, T, (B, n))
        mask = rng.random((B, n, T)) > 0.2
        mask[np.arange(B)[:, None], np.arange(n)[None], alpha] = True
        z = rng.standard_normal((B, n, d))
        yield X, z, alpha, mask, rng.standard_normal((d, 3))


@pytest.mark.parametrize("seed", [0, 1])
def test_batch_fast_equals_general(seed, monkeypatch):
    def run():
        out = []
        for X, z, alpha, mask, Wk in _batches(seed):
            out += [prompt_svm_batch(X, None, alpha), prompt_svm_batch(X, None, alpha, mask=mask),
                    prompt_svm_batch(X, Wk, alpha), att_svm_batch(X, z, alpha)]
        return out

    fast = run()
    _general(monkeypatch)
    general = run()
    statuses = set()
    for a, b in zip(general, fast):
        _same(a, b)
        statuses |= set(a.status_)
    assert {"optimal", "infeasible"} <= statuses


def test_batch_certificate_independent():
    """Every feasible answer of the batch re-checked from the caller's W_ and dual_ and
    the raw tokens; every infeasible one has a verified conflict."""
    rng = np.random.default_rng(5)
    B, n, T, d = 300, 6, 8, 10
    X = rng.standard_normal((B, n, T, d)) * 3.0
    alpha = rng.integers(0, T, (B, n))
    sol = prompt_svm_batch(X, None, alpha)
    sel = X[np.arange(B)[:, None], np.arange(n)[None], alpha]
    D = sel[:, :, None, :] - X  # (B, n, T, d)
    keep = np.ones((B, n, T), bool)
    keep[np.arange(B)[:, None], np.arange(n)[None], alpha] = False
    f = sol.feasible_
    assert f.any() and (~f).any()
    m = np.einsum("bntd,bd->bnt", D[f], sol.W_[f])
    assert np.all(np.where(keep[f], m, np.inf).min((1, 2)) >= 1 - 1e-9)
    np.testing.assert_allclose(np.linalg.norm(sol.W_[f], axis=1), sol.norm_[f], rtol=1e-12)
    np.testing.assert_allclose(m[keep[f]], sol.margins_[f][keep[f]], rtol=1e-10,
                               atol=1e-10 * np.abs(m).max())
    S = np.einsum("bnt,bntd->bd", np.where(keep[f], sol.dual_[f], 0.0), D[f])
    assert np.all(np.linalg.norm(S - sol.W_[f], axis=1) <= 1e-9 * sol.norm_[f])
    assert np.all(sol.gap_[f] <= solution.GAP_OPTIMAL)
    assert np.all(sol.status_[~f] == "infeasible")
    assert all(len(sol.conflict_[b]) > 0 for b in np.nonzero(~f)[0])


def test_absmax_matches_masked_copy():
    rng = np.random.default_rng(2)
    for shape, axes in (((7, 3, 4, 5), (1, 2, 3)), ((7, 3, 4), (1, 2)), ((3, 4, 5), (-2, -1)),
                        ((4, 5, 6), (0, 2)), ((0, 3, 2), (1, 2))):
        A = rng.standard_normal(shape) * 10.0 ** rng.integers(-300, 300, shape)
        where = rng.random(shape) > 0.3
        for w in (None, where, np.ones(shape, bool)):
            absA = np.abs(A) if w is None else np.where(w, np.abs(A), 0.0)
            ref = absA.max(axes) if A.size else np.zeros(A.shape[: A.ndim - len(axes)])
            got = engine.absmax(A, axes, w)
            assert np.array_equal(ref, got)
            if axes != (0, 2):  # normalise scales over trailing axes
                assert np.array_equal(engine.normalise(A, axes, w)[1], solution.exp2(ref))


def test_lazy_gram_equals_full_gram():
    from attnsvm.svm import _active_kernels as K

    rng = np.random.default_rng(4)
    for N, d, e in ((48, 10, 1), (30, 4, 3), (60, 12, 12)):
        for _ in range(20):
            D = rng.standard_normal((N, d))
            Z = rng.standard_normal((N, e))
            D[3] = 0.0
            D[5] = D[4]
            V = rng.random(N) > 0.1
            vi = np.flatnonzero(V)
            G = np.empty((len(vi), len(vi)))
            K._gram(D, Z, vi, len(vi), G)
            Gref = ((D @ D.T) * (Z @ Z.T))[np.ix_(vi, vi)]  # the plain reference (BLAS)
            np.testing.assert_allclose(G, Gref, rtol=1e-13, atol=1e-13 * np.abs(Gref).max())
            a = [np.zeros(N), np.zeros(N), np.zeros((d, e))]
            b = [np.zeros(N), np.zeros(N), np.zeros((d, e))]
            ra = K.mnp_one(D, Z, V, 1e-12, 1e-13, 20 * N + 50, *a, np.empty((0, 0)))
            rb = K.mnp_one(D, Z, V, 1e-12, 1e-13, 20 * N + 50, *b, G)
            assert ra == rb
            for x, y in zip(a, b):
                assert np.array_equal(x, y)
    assert active.available()
