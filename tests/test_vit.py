"""Digits ViT (attnsvm.realdata.vit) and the nn.Module step rules (attnsvm.realdata.optim)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnsvm.realdata.optim import SNGD, MirrorDescent, make_optimizer
from attnsvm.realdata.vit import (
    DigitsViT,
    ViTConfig,
    accuracy_table,
    digits_tokens,
    run_vit,
    soft_sparsity,
)


def test_digits_patches_rebuild_the_image():
    X_tr, y_tr, X_te, y_te, img_te = digits_tokens()
    assert X_tr.shape[1:] == (16, 4) and len(X_tr) + len(X_te) == 1797
    # patch j = 4 r + c holds pixels [2r:2r+2, 2c:2c+2] row-major
    for j in (0, 5, 15):
        r, c = divmod(j, 4)
        np.testing.assert_array_equal(X_te[3, j], img_te[3, 2 * r : 2 * r + 2, 2 * c : 2 * c + 2].ravel())
    assert set(np.unique(y_tr)) == set(range(10))


def test_tiny_vit_trains_above_chance(tmp_path):
    cfg = ViTConfig(optimizers=("sngd",), seeds=(0,), epochs=3, dim=16, heads=2, mlp=32,
                    map_images=2)
    res = run_vit(cfg, out=tmp_path)
    hist = res.history.set_index("epoch")
    assert hist.loc[3, "test_acc"] > 0.3  # chance = 0.1
    # the [CLS] attention concentrates as it trains: near uniform over the 17 tokens at the
    # start (soft sparsity 17 = uniform), markedly sparser after 3 epochs (measured 15.2 -> 7.4)
    assert hist.loc[0, "soft_sparsity"] > 12.0
    assert hist.loc[3, "soft_sparsity"] < 0.75 * hist.loc[0, "soft_sparsity"]
    # the history's number is the per-head table's last layer averaged over heads
    lay = res.layers[res.layers.layer == res.layers.layer.max()]
    np.testing.assert_allclose(lay.groupby("epoch").soft_sparsity.mean().to_numpy(),
                               hist.soft_sparsity.to_numpy(), rtol=1e-5)  # float32
    assert (tmp_path / "vit_curves.png").is_file() and (tmp_path / "vit_attention_maps.png").is_file()
    assert set(res.layers.columns) >= {"layer", "head", "soft_sparsity", "wqk_norm"}
    assert len(res.summary) >= 2 and res.table.loc[0, "optimizer"] == "sngd"


def test_soft_sparsity_independent():
    rng = np.random.default_rng(0)
    s = rng.dirichlet(np.ones(17), size=(5, 3))
    got = soft_sparsity(torch.as_tensor(s)).numpy()
    want = np.array([[1.0 / sum(x * x for x in row) for row in rows] for rows in s])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert float(soft_sparsity(torch.eye(4)[0])) == 1.0
    assert math.isclose(float(soft_sparsity(torch.full((17,), 1 / 17, dtype=torch.float64))), 17.0)


def test_wqk_reproduces_attention_logits():
    torch.manual_seed(0)
    model = DigitsViT(dim=8, heads=2, layers=1, mlp=8).double()
    X = torch.rand(3, 16, 4, dtype=torch.float64)
    _, atts = model(X)
    blk = model.blocks[0]
    x = model.embed(X)
    x = torch.cat([model.cls.expand(3, -1, -1), x], 1) + model.pos
    u = blk.ln1(x)
    W = model.W_QK()[0]  # (H, dim, dim)
    logits = torch.einsum("bkd,hde,bte->bhkt", u, W, u)
    torch.testing.assert_close(torch.softmax(logits, -1), atts[0], rtol=1e-12, atol=1e-12)


def _pair(seed=0):
    torch.manual_seed(seed)
    a = DigitsViT(dim=8, heads=2, layers=1, mlp=8).double()
    b = DigitsViT(dim=8, heads=2, layers=1, mlp=8).double()
    b.load_state_dict(a.state_dict())
    return a, b


def _step(model, opt, X, y):
    logits, _ = model(X)
    loss = torch.nn.functional.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_mirror_descent_p2_equals_sgd():
    a, b = _pair()
    X, y = torch.rand(10, 16, 4, dtype=torch.float64), torch.arange(10)
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.3), MirrorDescent(b.parameters(), lr=0.3, p=2)
    for _ in range(3):
        _step(a, oa, X, y)
        _step(b, ob, X, y)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=1e-15)


@pytest.mark.parametrize("p", [1.1, 3.0])
def test_mirror_descent_step_formula(p):
    w = torch.nn.Parameter(torch.tensor([0.5, -0.2, 0.0, 1.3], dtype=torch.float64))
    g = torch.tensor([0.1, 0.3, -0.2, 0.05], dtype=torch.float64)
    w.grad = g.clone()
    w0 = w.detach().clone().numpy()
    MirrorDescent([w], lr=0.1, p=p).step()
    # independent: scalar formula, math module
    want = []
    for wi, gi in zip(w0, g.numpy()):
        u = math.copysign(abs(wi) ** (p - 1), wi) - 0.1 * gi
        want.append(math.copysign(abs(u) ** (1 / (p - 1)), u))
    np.testing.assert_allclose(w.detach().numpy(), want, rtol=1e-12, atol=1e-300)


def test_sngd_is_per_tensor_normalised():
    a, _ = _pair()
    X, y = torch.rand(6, 16, 4, dtype=torch.float64), torch.arange(6)
    before = [p.detach().clone() for p in a.parameters()]
    logits, _ = a(X)
    torch.nn.functional.cross_entropy(logits, y).backward()
    grads = [p.grad.clone() for p in a.parameters()]
    SNGD(a.parameters(), lr=0.05).step()
    for w0, g, w in zip(before, grads, a.parameters()):
        if g.norm() > 0:
            torch.testing.assert_close(w - w0, -0.05 * g / g.norm(), rtol=1e-10, atol=1e-14)
            assert math.isclose(float((w.detach() - w0).norm()), 0.05, rel_tol=1e-10)


def test_make_optimizer_names():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(make_optimizer("md1.1", params, 0.1), MirrorDescent)
    assert isinstance(make_optimizer("sngd", params, 0.1), SNGD)
    assert make_optimizer("adam", params, 0.1, eps=0.0).rule.hyper["eps"] == 0.0
    assert make_optimizer("muon", params, 0.1).rule.name == "muon"
    with pytest.raises(ValueError, match="unknown optimizer 'nope'"):
        make_optimizer("nope", params, 0.1)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        make_optimizer("sgd", params, float("nan"))
    with pytest.raises(ValueError, match="needs p > 1"):
        make_optimizer("md1", params, 0.1)


def test_accuracy_table_mean_std():
    import pandas as pd

    h = pd.DataFrame(dict(optimizer=["a"] * 4, lr=0.1, seed=[0, 0, 1, 1], epoch=[0, 1, 0, 1],
                          train_acc=[0.1, 0.8, 0.1, 0.6], test_acc=[0.1, 0.7, 0.1, 0.5],
                          soft_sparsity=2.0, wqk_norm=1.0))
    t = accuracy_table(h)
    assert math.isclose(t.test_acc_mean[0], 0.6) and math.isclose(t.test_acc_std[0], np.std([0.7, 0.5], ddof=1))
