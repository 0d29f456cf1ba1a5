"""TokenData validation, I/O and generators (docs/theory.md §1)."""

from __future__ import annotations

import numpy as np
import pytest

from attnsvm import data as D
from attnsvm.data import TokenData


def _ok(**kw):
    base = dict(X=np.zeros((2, 3, 4)), y=np.array([1.0, -1.0]))
    base.update(kw)
    return TokenData(**base)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(X=np.zeros((3, 4))), r"X must have shape \(n, T, d\) or \(B, n, T, d\); got \(3, 4\)"),
        (dict(X=np.zeros((2, 1, 4))), r"T >= 2 .* got T = 1"),
        (dict(X=np.zeros((0, 3, 4)), y=np.zeros(0)), r"X is empty"),
        (dict(X=np.full((2, 3, 4), np.nan)), r"X contains NaN or inf"),
        (dict(X=np.full((2, 3, 4), np.inf)), r"X contains NaN or inf"),
        (dict(y=np.array([1.0, 1.0, 1.0])), r"y must have shape \(n,\) = \(2,\); got \(3,\)"),
        (dict(y=np.array([2.0, 2.0])), r"y must contain labels in \{-1, \+1\} or any two "
                                        r"distinct values .*got one value: \[2.0\]"),
        (dict(y=np.array([1.0, np.nan])), r"y contains NaN or inf"),
        (dict(z=np.zeros((2, 3))), r"z must have shape \(n, d\) = \(2, 4\); got \(2, 3\)"),
        (dict(z=np.full((2, 4), np.inf)), r"z contains NaN or inf"),
        (dict(v=np.zeros(3)), r"v must have shape \(d,\) = \(4,\); got \(3,\)"),
        (dict(mask=np.ones((2, 4), bool)), r"mask must have shape \(n, T\) = \(2, 3\); got \(2, 4\)"),
        (dict(mask=np.zeros((2, 3), bool)), r"at least one valid token"),
        (dict(mask=np.full((2, 3), 2)), r"mask must be boolean"),
        (dict(X=np.zeros((2, 2, 3, 4)), y=np.ones((3, 2))), r"y must have shape \(B, n,\) = \(2, 2\)"),
        (dict(X="abc"), r"X holds strings"),
    ],
)
def test_bad_inputs_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        _ok(**kw)


def test_shapes_and_broadcast():
    X = np.random.default_rng(0).standard_normal((5, 2, 3, 4))
    d = TokenData(X=X, y=np.array([1.0, -1.0]), z=np.ones((2, 4)), v=np.ones(4))
    assert d.batched and d.B == 5 and (d.n, d.T, d.d) == (2, 3, 4)
    assert d.y.shape == (5, 2) and d.z.shape == (5, 2, 4) and d.v.shape == (5, 4)
    assert not _ok().batched and _ok().B is None


def test_frozen():
    d = _ok()
    with pytest.raises(AttributeError):
        d.X = np.ones((2, 3, 4))


def test_gamma_opt_against_loops():
    d = D.random_sphere(n=4, T=5, d=3, seed=2)
    g = np.array([[d.y[i] * d.v @ d.X[i, t] for t in range(5)] for i in range(4)])
    np.testing.assert_allclose(d.gamma, g, rtol=0, atol=1e-15)
    assert d.opt.tolist() == [int(np.argmax(r)) for r in g]
    with pytest.raises(ValueError, match="needs the fixed linear head v"):
        _ = _ok().gamma


def test_gamma_mask_and_seq2seq():
    X = np.random.default_rng(1).standard_normal((2, 3, 2))
    m = np.array([[True, True, False], [True, True, True]])
    d = TokenData(X=X, y=np.array([1.0, -1.0]), v=np.array([1.0, 0.0]), mask=m)
    assert np.isneginf(d.gamma[0, 2]) and d.opt[0] != 2
    y2 = np.array([[1.0, -1.0, 1.0], [-1.0, 1.0, 1.0]])
    s = TokenData(X=X, y=y2, v=np.array([1.0, 0.0]))
    assert s.seq2seq and s.gamma.shape == (2, 3, 3)
    np.testing.assert_allclose(s.gamma[1, 0, 2], y2[1, 0] * X[1, 2, 0])


def test_save_load_roundtrip(tmp_path):
    d = D.random_sphere(batch=3, seed=5)
    d2 = TokenData.load(d.save(tmp_path / "d.npz"))
    for f in ("X", "y", "z", "v"):
        np.testing.assert_array_equal(getattr(d, f), getattr(d2, f))
    assert d2.mask is None
    m = _ok(mask=np.array([[1, 1, 0], [1, 0, 1]], bool))
    assert np.array_equal(TokenData.load(m.save(tmp_path / "m.npz")).mask, m.mask)


def test_load_rejects_pickles_and_missing(tmp_path):
    np.savez(tmp_path / "obj.npz", X=np.array([object()], dtype=object), y=np.ones(1))
    with pytest.raises(ValueError, match="allow_pickle"):
        TokenData.load(tmp_path / "obj.npz")
    np.savez(tmp_path / "noy.npz", X=np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"missing required arrays \['y'\]"):
        TokenData.load(tmp_path / "noy.npz")


def test_stack_and_trial():
    items = [D.random_sphere(seed=s) for s in range(3)]
    b = D.stack(items)
    assert b.B == 3
    for i, it in enumerate(items):
        np.testing.assert_array_equal(b.trial(i).X, it.X)
    with pytest.raises(ValueError, match="non-empty"):
        D.stack([])
    with pytest.raises(ValueError, match="different shapes"):
        D.stack([D.random_sphere(n=2), D.random_sphere(n=3)])
    with pytest.raises(ValueError, match="None in some"):
        D.stack([D.random_sphere(), D.random_sphere(cross=False)])
    with pytest.raises(ValueError, match="needs batched"):
        items[0].trial(0)
    assert items[0].broadcast(4).B == 4


@pytest.mark.parametrize("gen", [D.random_sphere, D.planted, D.gaussian_mixture])
def test_generators_seeded_and_batched(gen):
    a, b, c = gen(seed=1), gen(seed=1), gen(seed=2)
    np.testing.assert_array_equal(a.X, b.X)
    assert not np.array_equal(a.X, c.X)
    bb = gen(seed=1, batch=4)
    assert bb.B == 4 and bb.X.shape[1:] == a.X.shape
    assert not np.array_equal(bb.X[0], bb.X[1])


def test_random_sphere_unit_norms():
    d = D.random_sphere(batch=2)
    for a in (d.X, d.z, d.v):
        np.testing.assert_allclose(np.linalg.norm(a, axis=-1), 1.0)
    assert set(np.unique(d.y)) <= {-1.0, 1.0} and (d.n, d.T, d.d) == (6, 8, 10)


def test_planted_opt_is_planted():
    d = D.planted(n=4, T=5, d=25, seed=0, opt=np.array([0, 1, 2, 3]))
    assert d.opt.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(d.gamma.max(-1), 1.0)
    gaps = np.sort(d.gamma, -1)
    assert (gaps[:, -1] - gaps[:, -2] >= 0.5 - 1e-12).all()
    bb = D.planted(batch=3, seed=0)
    np.testing.assert_allclose(bb.gamma.max(-1), 1.0)


def test_named_datasets():
    f1 = D.mmts_fig1(0.9)
    np.testing.assert_allclose(f1.gamma[0], [1.0, 0.9, 0.9])
    assert D.mmts_fig1(0).X[0, 2].tolist() == [0.0, 0.0, 0.0]
    assert D.MMTS_FIG1_W.tolist() == np.diag([1.0, 1.0, 0.0]).tolist()
    m = D.mmts_fig1_multi(0)
    assert m.X.shape == (3, 7, 3) and (m.opt == 0).all()
    np.testing.assert_array_equal(m.X[:, 1:, 2], 0.5)
    assert abs(m.X[:, 1:4, 0].mean() + 1) < 0.3 and abs(m.X[:, 4:, 1].mean() + 0.5) < 0.3
    fa, fb = D.mmts_fig3("a"), D.mmts_fig3("b")
    assert fa.X.shape == (3, 2, 2) and fa.X[2, 1].tolist() == [0.5, 1.0]
    assert fb.X[2, 1].tolist() == [0.5, 1.5] and fa.y.tolist() == [1, -1, 1]
    with pytest.raises(ValueError, match="variant must be"):
        D.mmts_fig3("c")
    t = D.mirror_joint_toy()
    np.testing.assert_array_equal(t.z, t.X[:, 0])
    assert t.X[0, 0].tolist() == [-2.7, 1.2] and t.y.tolist() == [1, -1]
    assert set(D.NAMED) == {"mmts_fig1", "mmts_fig1_multi", "mmts_fig3", "mirror_joint_toy"}


def test_to_torch():
    import torch

    t = D.random_sphere().to_torch()
    assert t["X"].dtype == torch.float64 and t["mask"] is None


def test_batched_labels_are_not_mistaken_for_seq2seq_when_B_equals_n_equals_T():
    rng = np.random.default_rng(0)
    B = n = T = 3
    y = rng.choice([-1.0, 1.0], size=(B, n))
    data = D.TokenData(X=rng.normal(size=(B, n, T, 2)), y=y)
    assert not data.seq2seq and data.y.shape == (B, n)
    np.testing.assert_array_equal(data.y, y)
    seq = D.TokenData(X=rng.normal(size=(B, n, T, 2)), y=np.ones((B, n, T)))
    assert seq.seq2seq
