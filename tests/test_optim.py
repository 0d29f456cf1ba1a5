"""Step rules (THEORY.md §6) and the mirror-map helpers of attnsvm.metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attnsvm import data as D
from attnsvm import metrics as MT
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.train import train


def _pg(seed=0, B=4):
    g = torch.Generator().manual_seed(seed)
    P = {"K": torch.randn(B, 3, 2, generator=g, dtype=torch.float64),
         "v": torch.randn(B, 3, generator=g, dtype=torch.float64)}
    G = {k: torch.randn(t.shape, generator=g, dtype=torch.float64) for k, t in P.items()}
    return P, G


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, (3, 4), elements=st.floats(-1e3, 1e3).filter(lambda x: x == 0 or abs(x) > 1e-30)),
       st.floats(1.1, 6.0))
def test_mirror_map_roundtrip(W, p):
    """Round trip in both directions (|W| >= 1e-30 so that |W|^{p-1} does not underflow)."""
    back = MT.inverse_mirror_map(MT.mirror_map(W, p), p)
    np.testing.assert_allclose(back, W, rtol=1e-10, atol=1e-300)
    U = MT.mirror_map(W, p)
    np.testing.assert_allclose(MT.mirror_map(MT.inverse_mirror_map(U, p), p), U, rtol=1e-10, atol=1e-300)


def test_mirror_map_is_gradient_of_psi():
    W = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    for p in (1.5, 2.0, 3.0):
        (g,) = torch.autograd.grad(MT.psi(W, p).sum(), W)
        torch.testing.assert_close(g, MT.mirror_map(W.detach(), p))


def test_bregman_properties():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((5, 3, 3)), rng.standard_normal((5, 3, 3))
    for p in (1.5, 2.0, 3.0):
        assert (MT.bregman(A, B, p) >= -1e-12).all()
        np.testing.assert_allclose(MT.bregman(A, A, p), 0, atol=1e-12)
    np.testing.assert_allclose(MT.bregman(A, B, 2.0), 0.5 * ((A - B) ** 2).sum((1, 2)))
    np.testing.assert_allclose(MT.directional_bregman(A, 3 * A, 1.7), 0, atol=1e-12)


def test_md_p2_equals_gd_bit_for_bit():
    P, G = _pg()
    a, b = O.gd(0.3).step(P, G), O.mirror(2.0, 0.3).step(P, G)
    assert all(torch.equal(a[k], b[k]) for k in P)
    a, b = O.ngd(0.3).step(P, G), O.mirror(2.0, 0.3, normalized=True).step(P, G)
    assert all(torch.equal(a[k], b[k]) for k in P)
    data = D.random_sphere(n=3, T=4, d=4, batch=3)
    t1 = train(M.WModel(4), data, optimizer=O.gd(0.5), steps=100, record_every=10)
    t2 = train(M.WModel(4), data, optimizer=O.mirror(2.0, 0.5), steps=100, record_every=10)
    assert torch.equal(t1.params["W"], t2.params["W"])


def test_mirror_update_rule_against_numpy():
    P, G = _pg(1)
    for p, normalized in ((3.0, False), (1.5, True)):
        out = O.mirror(p, 0.2, normalized).step(P, G)
        for k in P:
            W, g = P[k].numpy(), G[k].numpy()
            if normalized:
                q = p / (p - 1)
                g = g / (np.abs(g.reshape(len(g), -1)) ** q).sum(1).reshape(-1, *[1] * (g.ndim - 1)) ** (1 / q)
            U = np.sign(W) * np.abs(W) ** (p - 1) - 0.2 * g
            np.testing.assert_allclose(out[k].numpy(), np.sign(U) * np.abs(U) ** (1 / (p - 1)), rtol=1e-12)


def test_ngd_per_tensor_and_global():
    P, G = _pg(2)
    out = O.ngd(0.5).step(P, G)
    for k in P:
        step = (P[k] - out[k]).reshape(4, -1).norm(dim=1)
        torch.testing.assert_close(step, torch.full((4,), 0.5, dtype=torch.float64))
    out = O.ngd(0.5, norm="global").step(P, G)
    tot = torch.sqrt(sum((P[k] - out[k]).reshape(4, -1).pow(2).sum(1) for k in P))
    torch.testing.assert_close(tot, torch.full((4,), 0.5, dtype=torch.float64))
    Z = {k: torch.zeros_like(t) for k, t in G.items()}
    assert all(torch.equal(O.ngd(0.5).step(P, Z)[k], P[k]) for k in P)


def test_polyak_step_size():
    P, G = _pg(3)
    gap = torch.tensor([0.5, 1.0, 0.0, 2.0], dtype=torch.float64)
    out = O.polyak(0.7).step(P, G, gap)
    g2 = sum(G[k].reshape(4, -1).pow(2).sum(1) for k in G)
    eta = 0.7 * gap / g2
    for k in P:
        torch.testing.assert_close(out[k], P[k] - eta.reshape(-1, *[1] * (P[k].ndim - 1)) * G[k])
    Z = {k: torch.zeros_like(t) for k, t in G.items()}
    assert all(torch.isfinite(O.polyak(1.0).step(P, Z, gap)[k]).all() for k in P)


def test_sgd_minibatch_gradient_matches_subset():
    data = D.random_sphere(n=6, T=4, d=3, seed=0)
    model = M.WModel(3)
    traj = train(model, data, optimizer=O.sgd(0.2, batch_size=2), steps=1, seed=5, B=3,
                 record_params=True)
    W0 = torch.as_tensor(traj.param_history["W"][0])
    gen = torch.Generator().manual_seed(5 + 7919)
    idx = torch.rand(3, 6, generator=gen).argsort(1)[:, :2].numpy()
    for b in range(3):
        sub = D.TokenData(X=data.X[idx[b]], y=data.y[idx[b]], z=data.z[idx[b]], v=data.v)
        _, _, g = model.objective({"W": W0[b:b + 1]}, sub)
        torch.testing.assert_close(traj.params["W"][b], W0[b] - 0.2 * g["W"][0])


def test_joint_training_same_rule_on_both_tensors():
    data = D.mmts_fig3("a")
    model = M.PromptModel(2, train_head=True)
    init = model.init(2, seed=0, scale=0.5)
    t = train(model, data, optimizer=O.ngd(0.1), steps=1, init=init)
    _, _, g = model.objective(init, data)
    for k in ("p", "v"):
        n = g[k].norm(dim=1, keepdim=True)
        torch.testing.assert_close(t.params[k], init[k] - 0.1 * g[k] / n)
    t2 = train(model, data, optimizer=O.ngd(0.5), steps=300, init=init, record_every=50)
    assert t2.metrics.groupby("trial")["loss"].last().max() < t2.metrics["loss"].iloc[0]
    assert "norm_head" in t2.metrics


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: O.mirror(1.0), "p > 1"),
        (lambda: O.ngd(0.1, norm="spectral"), "norm must be"),
    ],
)
def test_optim_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_trial_norm_does_not_underflow_for_tiny_gradients():
    # |g|^(7/3) underflows to 0 in float64 for g ~ 1e-139; the norm must not.
    from attnsvm.optim import trial_norm

    g = torch.full((2, 3, 3), 1e-139, dtype=torch.float64)
    g[1] = 0.0
    q = 7.0 / 3.0
    expected = 1e-139 * 9 ** (1 / q)
    got = trial_norm(g, q)
    assert got[1] == 0.0
    assert abs(got[0].item() / expected - 1) < 1e-12
    big = torch.randn(4, 5, dtype=torch.float64)
    assert torch.allclose(trial_norm(big, q), torch.linalg.vector_norm(big, ord=q, dim=1))
