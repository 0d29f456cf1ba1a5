"""attnsvm.benign: the label-noise generators, the .npz round trip, the generalisation
metrics against a per-sample loop, and the two GD routines against torch.autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnsvm import benign as bn
from attnsvm.data import TokenData


def test_sakamoto_sato_matches_the_codes_construction():
    s, rho, n, T, d = 3.0, 0.5, 10, 5, 6
    data = bn.sakamoto_sato(n=n, T=T, d=d, signal_norm=s, rho=rho, noise_ratio=0.2, n_test=8,
                            seed=3, batch=4000)
    yc, fl = data.clean_y, data.flipped
    assert fl.sum(1).tolist() == [2] * 4000  # ceil(10 * 0.2) = 2, one per class
    assert ((fl & (yc > 0)).sum(1) == 1).all() and ((fl & (yc < 0)).sum(1) == 1).all()
    np.testing.assert_array_equal(data.train.y, np.where(fl, -yc, yc))
    np.testing.assert_array_equal(yc[0], [1.0] * 5 + [-1.0] * 5)  # balanced as the code
    nu = data.train.v[0]
    np.testing.assert_allclose(nu, np.r_[1, -1, 0, 0, 0, 0] / np.sqrt(2) / s, rtol=1e-15)
    # token means: x_0 = xi + mu_y, x_1 = xi + rho mu_y, x_2 = xi + rho mu_{-y}, rest xi
    X = data.train.X
    pos = yc > 0
    for t, (a, b) in enumerate([(s, 0), (rho * s, 0), (0, rho * s), (0, 0), (0, 0)]):
        m = X[pos][:, t, :2].mean(0)  # class +1: coordinates (e_1, e_2)
        np.testing.assert_allclose(m, [a, b], atol=5 / np.sqrt(pos.sum()))
        assert abs(X[pos][:, t, 2:].std() - 1) < 0.02
    assert data.roles.tolist() == [0, 1, 2, 3, 3]
    assert not data.test.y.shape != (4000, 8) and set(np.unique(data.test.y)) == {-1.0, 1.0}


def test_two_token_snr_and_flips():
    data = bn.two_token(n=50, d=400, snr=0.3, noise_ratio=0.1, n_test=10, seed=1, batch=3)
    X = data.train.X
    assert data.flipped.sum(1).tolist() == [5, 5, 5]
    np.testing.assert_allclose(np.linalg.norm(X[..., 0, :], axis=-1), 0.3 * np.sqrt(400))
    assert np.all(X[..., 1, :2] == 0) and np.all(X[..., 0, 2:] == 0)
    ratio = np.linalg.norm(X[..., 0, :], axis=-1) / np.linalg.norm(X[..., 1, :], axis=-1)
    assert abs(ratio.mean() - 0.3) < 0.02


def test_npz_round_trip_and_bad_files(tmp_path):
    data = bn.sakamoto_sato(n=6, T=4, d=5, n_test=7, seed=2, batch=2)
    path = data.save(tmp_path / "noisy.npz")
    back = bn.NoisyLabels.load(path)
    for a, b in [(data.train.X, back.train.X), (data.train.y, back.train.y), (data.clean_y, back.clean_y),
                 (data.flipped, back.flipped), (data.roles, back.roles), (data.test.X, back.test.X),
                 (data.test.y, back.test.y), (data.train.v, back.train.v)]:
        np.testing.assert_array_equal(a, b)
    assert back.meta["generator"] == "'sakamoto_sato'"
    with pytest.raises(ValueError, match="does not exist"):
        data.save(tmp_path / "nowhere" / "x.npz")
    np.savez(tmp_path / "bad.npz", X=data.train.X)
    with pytest.raises(ValueError, match="bad.npz"):
        bn.NoisyLabels.load(tmp_path / "bad.npz")


def test_inconsistent_flips_and_bad_arguments_are_named():
    data = bn.sakamoto_sato(n=6, T=4, d=5, n_test=7, seed=2, batch=2)
    with pytest.raises(ValueError, match="flipped samples negated"):
        bn.NoisyLabels(data.train, data.clean_y, ~data.flipped, data.roles, data.test)
    with pytest.raises(ValueError, match="roles"):
        bn.NoisyLabels(data.train, data.clean_y, data.flipped, data.roles[:2], data.test)
    for kw, name in [(dict(rho=0.0), "rho"), (dict(noise_ratio=0.5), "noise_ratio"),
                     (dict(signal_norm=-1.0), "signal_norm"), (dict(T=2), "T")]:
        with pytest.raises(ValueError, match=name):
            bn.sakamoto_sato(**kw)
    with pytest.raises(ValueError, match="snr"):
        bn.two_token(snr=0.0)
    with pytest.raises(ValueError, match=r"p must have shape \(R, B, d\)"):
        bn.generalisation(data, np.zeros((2, 3, 5)), [0, 1])


def test_generalisation_matches_a_per_sample_loop():
    rng = np.random.default_rng(0)
    data = bn.sakamoto_sato(n=8, T=5, d=6, signal_norm=2.0, rho=0.7, n_test=9, seed=4, batch=3)
    P = rng.standard_normal((2, 3, 6)) * 3
    df = bn.generalisation(data, P, [0, 7], chunk=4)
    for r in range(2):
        for b in range(3):
            row = df[(df.trial == b) & (df.step == [0, 7][r])].iloc[0]

            def out(X, y, r=r, b=b):
                a = X @ P[r, b]
                s = np.exp(a - a.max())
                s /= s.sum()
                return float(s @ (X @ data.train.v[b])), int(np.argmax(s)), y

            tr = [out(data.train.X[b, i], data.train.y[b, i]) for i in range(8)]
            te = [out(data.test.X[b, i], data.test.y[b, i]) for i in range(9)]
            fl = data.flipped[b]
            ok = np.array([f * y > 0 for f, _, y in tr])
            assert row.train_acc == pytest.approx(ok.mean())
            assert row.train_acc_flipped == pytest.approx(ok[fl].mean())
            assert row.train_acc_clean == pytest.approx(ok[~fl].mean())
            assert row.train_loss == pytest.approx(np.mean([np.log1p(np.exp(-f * y)) for f, _, y in tr]))
            assert row.test_acc == pytest.approx(np.mean([f * y > 0 for f, _, y in te]))
            assert row.test_loss == pytest.approx(np.mean([np.log1p(np.exp(-f * y)) for f, _, y in te]))
            roles = data.roles[[t for _, t, _ in tr]]
            for k, name in enumerate(bn.ROLES):
                assert row[f"att_{name}_clean"] == pytest.approx((roles[~fl] == k).mean())
                assert row[f"att_{name}_flipped"] == pytest.approx((roles[fl] == k).mean())
            assert row.test_att_signal == pytest.approx(np.mean([data.roles[t] == 0 for _, t, _ in te]))


def _autograd_joint(data, lr, steps):
    """GD on (W, p) by torch.autograd, W = I, p = 0 (the code's model); returns W^T p."""
    X = torch.as_tensor(data.X)
    y = torch.as_tensor(data.y)
    nu = torch.as_tensor(data.v)
    B, n, T, d = X.shape
    W = torch.eye(d, dtype=torch.float64).repeat(B, 1, 1).requires_grad_()
    p = torch.zeros(B, d, dtype=torch.float64, requires_grad=True)
    for _ in range(steps):
        q = torch.einsum("bij,bi->bj", W, p)  # W^T p: logits x^T W^T p
        s = torch.softmax(torch.einsum("bntd,bd->bnt", X, q), -1)
        f = (s * torch.einsum("bntd,bd->bnt", X, nu)).sum(-1)
        L = torch.nn.functional.softplus(-y * f).mean(1).sum()
        gW, gp = torch.autograd.grad(L, (W, p))
        with torch.no_grad():
            W -= lr * gW
            p -= lr * gp
    return torch.einsum("bij,bi->bj", W, p).detach().numpy()


@pytest.mark.parametrize("d", [5, 40])  # d <= nT (no reduction) and d > nT (span reduction)
def test_joint_gd_is_gd_on_w_and_p(d):
    data = bn.sakamoto_sato(n=4, T=3, d=d, signal_norm=2.0, rho=0.5, n_test=2, seed=5, batch=2).train
    steps, q, loss = bn.joint_gd(data, lr=2.0, steps=6, record_every=3)
    assert steps.tolist() == [0, 3, 6]
    np.testing.assert_allclose(q[-1], _autograd_joint(data, 2.0, 6), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(q[1], _autograd_joint(data, 2.0, 3), rtol=1e-9, atol=1e-12)
    assert np.all(q[0] == 0)
    f0 = np.einsum("bntd,bd->bnt", data.X, data.v).mean(-1)  # uniform attention at p = 0
    np.testing.assert_allclose(loss[0], np.logaddexp(0, -data.y * f0).mean(1), rtol=1e-12)


def test_two_step_gd_matches_autograd():
    data = bn.two_token(n=6, d=9, snr=0.5, noise_ratio=0.2, n_test=2, seed=2, batch=2).train
    steps, P, V = bn.two_step_gd(data, lr_v=0.3, lr_p=5.0, steps=3)
    X, y = torch.as_tensor(data.X), torch.as_tensor(data.y)
    p = torch.zeros(2, 9, dtype=torch.float64, requires_grad=True)
    v = torch.zeros(2, 9, dtype=torch.float64, requires_grad=True)
    assert np.all(P[1] == 0)  # v = 0: the first step does not move p
    for k in range(3):
        s = torch.softmax(torch.einsum("bntd,bd->bnt", X, p), -1)
        f = (s * torch.einsum("bntd,bd->bnt", X, v)).sum(-1)
        L = torch.nn.functional.softplus(-y * f).mean(1).sum()
        gp, gv = torch.autograd.grad(L, (p, v))
        with torch.no_grad():
            p -= 5.0 * gp
            v -= 0.3 * gv
        np.testing.assert_allclose(P[k + 1], p.detach().numpy(), rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(V[k + 1], v.detach().numpy(), rtol=1e-10, atol=1e-13)


def test_predict_with_fixed_w():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2, 3, 4, 5))
    p, v, W = rng.standard_normal((2, 5)), rng.standard_normal((2, 5)), rng.standard_normal((5, 5))
    f, s = bn.predict(X, p, v, W)
    a = np.einsum("bmtd,de,be->bmt", X, W, p)
    s_ref = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
    np.testing.assert_allclose(s, s_ref, rtol=1e-12)
    np.testing.assert_allclose(f, np.einsum("bmt,bmtd,bd->bm", s_ref, X, v), rtol=1e-12)


def test_joint_gd_refuses_unbatched_data():
    d = bn.sakamoto_sato(n=4, T=3, d=5, n_test=2, batch=1).train.trial(0)
    with pytest.raises(ValueError, match="batched"):
        bn.joint_gd(d)
    with pytest.raises(ValueError, match="lr"):
        bn.joint_gd(TokenData(X=np.ones((1, 2, 3, 2)), y=np.ones((1, 2)), v=np.ones((1, 2))), lr=0.0)


def test_predict_with_a_head_per_record_equals_one_record_at_a_time():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((3, 4, 2, 6))
    P, V = rng.standard_normal((5, 3, 6)), rng.standard_normal((5, 3, 6))
    f, s = bn.predict(X, P, V)
    for r in range(5):
        fr, sr = bn.predict(X, P[r], V[r])
        np.testing.assert_allclose(f[r], fr, rtol=1e-13)
        np.testing.assert_allclose(s[r], sr, rtol=1e-13)
