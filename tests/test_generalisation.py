"""attnsvm.generalisation: the generalisation metrics in the trainer's records (issue 35),
held equal to a plain numpy forward pass per trial and record, and their checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm import benign as bn
from attnsvm.data import TokenData
from attnsvm.generalisation import ROLES, Generalisation
from attnsvm.models import PromptModel, WModel
from attnsvm.train import train


def _reference(X, y, Wz, v, flipped, roles, Xt, yt, Wzt, loss):
    """One trial at one record, in loops: outputs f_i = v^T X_i^T softmax(X_i w_i) with
    w_i = W z_i (the query of sample i)."""
    def fwd(X, Wz):
        f, top = [], []
        for i in range(X.shape[0]):
            a = X[i] @ Wz[i]
            s = np.exp(a - a.max())
            s /= s.sum()
            f.append(v @ (X[i].T @ s))
            top.append(int(np.argmax(s)))
        return np.array(f), np.array(top)

    f, top = fwd(X, Wz)
    ft, tt = fwd(Xt, Wzt)
    ok = f * y > 0
    out = {"train_acc": ok.mean(), "train_loss": loss(f * y).mean(),
           "train_acc_clean": ok[~flipped].mean(), "train_acc_flipped": ok[flipped].mean()}
    for k, name in enumerate(ROLES):
        out[f"att_{name}_clean"] = np.mean(roles[top[~flipped]] == k)
        out[f"att_{name}_flipped"] = np.mean(roles[top[flipped]] == k)
    out.update(test_acc=np.mean(ft * yt > 0), test_loss=loss(ft * yt).mean(),
               test_att_signal=np.mean(roles[tt] == 0))
    return out


def test_prompt_run_equals_a_numpy_forward_per_trial():
    data = bn.sakamoto_sato(n=10, T=5, d=12, signal_norm=3.0, noise_ratio=0.2, n_test=30,
                            seed=1, batch=3)
    tr = train(PromptModel(12), data.train, steps=40, B=3, record_every=20, engine="torch",
               record_params=True, metrics=[Generalisation.of(data)])
    P = tr.param_history["p"]  # (R, 3, d)
    m = tr.metrics.set_index(["trial", "step"])
    logistic = lambda u: np.logaddexp(0.0, -u)  # noqa: E731
    n, m_test = 10, 30
    for r, step in enumerate(tr.record_steps):
        for b in range(3):
            ref = _reference(data.train.X[b], data.train.y[b], np.tile(P[r, b], (n, 1)),
                             data.train.v[b], data.flipped[b], data.roles, data.test.X[b],
                             data.test.y[b], np.tile(P[r, b], (m_test, 1)), logistic)
            row = m.loc[(b, step)]
            for k, val in ref.items():
                assert row[k] == pytest.approx(val, rel=1e-12, abs=1e-14), (k, step, b)
    # the post-hoc function of recorded prompts (another trainer's) is the same computation
    post = bn.generalisation(data, P, tr.record_steps).set_index(["trial", "step"])
    pd.testing.assert_frame_equal(post, m[post.columns], rtol=1e-12, check_names=False)
    assert m.loc[(0, 0), "train_loss"] == pytest.approx(m.loc[(0, 0), "loss"], rel=1e-12)


def test_w_model_shared_data_exponential_loss_and_chunks():
    rng = np.random.default_rng(3)
    n, T, d, m = 8, 4, 5, 11
    X, Xt = rng.standard_normal((n, T, d)), rng.standard_normal((m, T, d))
    z, zt = rng.standard_normal((n, d)), rng.standard_normal((m, d))
    v = rng.standard_normal(d)
    y, yt = np.sign(rng.standard_normal(n)), np.sign(rng.standard_normal(m))
    flipped = np.zeros((2, n), bool)
    flipped[0, [1, 4]] = flipped[1, [0]] = True
    roles = np.array(["signal", "noise", "weak_same", "noise"])
    metric = Generalisation(test=TokenData(X=Xt, y=yt, z=zt), flipped=flipped, roles=roles)
    train_data = TokenData(X=X, y=y, z=z, v=v)
    kw = dict(loss="exponential", steps=30, B=2, record_every=10, engine="torch",
              metrics=[metric])
    tr = train(WModel(d), train_data, **kw)
    W = tr.W  # (2, d, d)
    codes = np.array([0, 3, 1, 3])
    expo = lambda u: np.exp(-u)  # noqa: E731
    last = tr.metrics[tr.metrics.step == tr.steps_run].set_index("trial")
    for b in range(2):
        ref = _reference(X, y, z @ W[b].T, v, flipped[b], codes, Xt, yt, zt @ W[b].T, expo)
        for k, val in ref.items():
            assert last.loc[b, k] == pytest.approx(val, rel=1e-12, abs=1e-14), k
    chunked = train(WModel(d), train_data, chunk=1, **kw)
    pd.testing.assert_frame_equal(chunked.metrics, tr.metrics, rtol=1e-12)


def test_without_flips_or_test_set():
    data = bn.sakamoto_sato(n=6, T=4, d=8, noise_ratio=0.0, n_test=4, seed=0, batch=2)
    tr = train(PromptModel(8), data.train, steps=5, B=2, engine="torch",
               metrics=[Generalisation(roles=data.roles)])
    cols = [c for c in tr.metrics.columns if c.startswith(("att_", "test_", "train_acc"))]
    assert cols == ["train_acc", *[f"att_{r}" for r in ROLES]]
    shares = tr.metrics[[f"att_{r}" for r in ROLES]].sum(axis=1)
    assert np.allclose(shares, 1.0)


@pytest.mark.parametrize("kw, match", [
    (dict(), "at least one of test, flipped, roles"),
    (dict(test=np.zeros((3, 4, 8))), "test must be a TokenData"),
    (dict(flipped=np.zeros(6)), "flipped must be a .* bool array"),
    (dict(roles=[0, 1, 2, 7]), "roles must be integer codes"),
    (dict(roles=["signal", "nois", "noise", "noise"]), r"unknown role names \['nois'\]"),
])
def test_bad_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        Generalisation(**kw)


@pytest.mark.parametrize("metric, match", [
    (lambda dt: Generalisation(flipped=np.zeros(5, bool)), r"flipped must have shape \(n,\)"),
    (lambda dt: Generalisation(roles=[0, 3, 3]), r"roles must have shape \(T,\) = \(4,\)"),
    (lambda dt: Generalisation(test=TokenData(X=np.zeros((3, 4, 7)), y=np.ones(3))),
     "test must have T = 4, d = 8"),
    (lambda dt: Generalisation(test=TokenData(X=np.zeros((3, 3, 4, 8)), y=np.ones((3, 3)),
                                              v=np.ones((3, 8)))), "test must .*1 or B = 2 datasets; got X \\(3, 3"),
])
def test_checked_against_the_run_before_any_work(metric, match):
    data = bn.sakamoto_sato(n=6, T=4, d=8, n_test=4, seed=0, batch=2)
    with pytest.raises(ValueError, match="metrics: " + match):
        train(PromptModel(8), data.train, steps=5, B=2, engine="torch", metrics=[metric(data)])


def test_train_refuses_non_metrics_and_per_token_labels():
    data = bn.sakamoto_sato(n=6, T=4, d=8, n_test=4, seed=0, batch=2)
    with pytest.raises(ValueError, match="metrics must be a list of metrics"):
        train(PromptModel(8), data.train, steps=5, B=2, metrics=Generalisation.of(data))
    with pytest.raises(ValueError, match="metrics must be a list of metrics"):
        train(PromptModel(8), data.train, steps=5, B=2, metrics=["test_acc"])
    X = np.random.default_rng(0).standard_normal((3, 4, 5))
    seq = TokenData(X=X, y=np.ones((3, 4)), v=np.ones(5))
    with pytest.raises(ValueError, match="one query and one label per sequence"):
        train(WModel(5, query="seq2seq"), seq, steps=3, metrics=[Generalisation(roles=[0, 3, 3, 3])])


def test_records_follow_the_device_dtype():
    data = bn.sakamoto_sato(n=6, T=4, d=8, n_test=4, seed=0, batch=2)
    tr = train(PromptModel(8), data.train, steps=5, B=2, engine="torch", dtype=torch.float32,
               metrics=[Generalisation.of(data)])
    assert np.isfinite(tr.metrics.test_loss).all()


def test_fused_engine_records_the_same_columns():
    pytest.importorskip("numba")
    data = bn.sakamoto_sato(n=10, T=5, d=12, signal_norm=3.0, noise_ratio=0.2, n_test=30,
                            seed=1, batch=3)
    kw = dict(steps=40, B=3, record_every=20, metrics=[Generalisation.of(data)])
    fused = train(PromptModel(12), data.train, engine="fused", **kw)
    ref = train(PromptModel(12), data.train, engine="torch", **kw)
    assert fused.extra["engine"] == "fused"
    pd.testing.assert_frame_equal(fused.metrics, ref.metrics, rtol=1e-9)
