"""Step rules (docs/theory.md §6) and the mirror-map helpers of attnsvm.metrics."""

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
from attnsvm.optim import kernel_ops
from attnsvm.train import train


def _step(opt, P, G, gap=None):
    """One update from a fresh state (log_gap from a plain gap)."""
    lg = None if gap is None else torch.log(gap)
    return opt.update(G, opt.init(P), P, lg)[0]


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
    a, b = _step(O.gd(0.3), P, G), _step(O.mirror(2.0, 0.3), P, G)
    assert all(torch.equal(a[k], b[k]) for k in P)
    a, b = _step(O.ngd(0.3), P, G), _step(O.mirror(2.0, 0.3, normalized=True), P, G)
    assert all(torch.equal(a[k], b[k]) for k in P)
    data = D.random_sphere(n=3, T=4, d=4, batch=3)
    t1 = train(M.WModel(4), data, optimizer=O.gd(0.5), steps=100, record_every=10)
    t2 = train(M.WModel(4), data, optimizer=O.mirror(2.0, 0.5), steps=100, record_every=10)
    assert torch.equal(t1.params["W"], t2.params["W"])


def test_mirror_update_rule_against_numpy():
    P, G = _pg(1)
    for p, normalized in ((3.0, False), (1.5, True)):
        out = _step(O.mirror(p, 0.2, normalized), P, G)
        for k in P:
            W, g = P[k].numpy(), G[k].numpy()
            if normalized:
                q = p / (p - 1)
                g = g / (np.abs(g.reshape(len(g), -1)) ** q).sum(1).reshape(-1, *[1] * (g.ndim - 1)) ** (1 / q)
            U = np.sign(W) * np.abs(W) ** (p - 1) - 0.2 * g
            np.testing.assert_allclose(out[k].numpy(), np.sign(U) * np.abs(U) ** (1 / (p - 1)), rtol=1e-12)


def test_ngd_per_tensor_and_global():
    P, G = _pg(2)
    out = _step(O.ngd(0.5), P, G)
    for k in P:
        step = (P[k] - out[k]).reshape(4, -1).norm(dim=1)
        torch.testing.assert_close(step, torch.full((4,), 0.5, dtype=torch.float64))
    out = _step(O.ngd(0.5, norm="global"), P, G)
    tot = torch.sqrt(sum((P[k] - out[k]).reshape(4, -1).pow(2).sum(1) for k in P))
    torch.testing.assert_close(tot, torch.full((4,), 0.5, dtype=torch.float64))
    for k in P:  # the global step is parallel to G
        torch.testing.assert_close(out[k], P[k] - 0.5 * G[k] / torch.sqrt(
            sum(G[j].reshape(4, -1).pow(2).sum(1) for j in G)).reshape(-1, *[1] * (G[k].ndim - 1)))
    Z = {k: torch.zeros_like(t) for k, t in G.items()}
    assert all(torch.equal(_step(O.ngd(0.5), P, Z)[k], P[k]) for k in P)


def test_relative_step_moves_params_by_lr_times_their_norm():
    P, G = _pg(7)
    out = _step(O.ngd(0.01, norm="global", relative=True), P, G)
    pn = torch.sqrt(sum(P[k].reshape(4, -1).pow(2).sum(1) for k in P))
    tot = torch.sqrt(sum((P[k] - out[k]).reshape(4, -1).pow(2).sum(1) for k in P))
    torch.testing.assert_close(tot, 0.01 * pn)


def test_polyak_step_size():
    P, G = _pg(3)
    gap = torch.tensor([0.5, 1.0, 0.0, 2.0], dtype=torch.float64)
    out = _step(O.polyak(0.7), P, G, gap)
    g2 = sum(G[k].reshape(4, -1).pow(2).sum(1) for k in G)
    eta = 0.7 * gap / g2
    for k in P:
        torch.testing.assert_close(out[k], P[k] - eta.reshape(-1, *[1] * (P[k].ndim - 1)) * G[k])
    Z = {k: torch.zeros_like(t) for k, t in G.items()}
    assert all(torch.isfinite(_step(O.polyak(1.0), P, Z, gap)[k]).all() for k in P)
    capped = _step(O.polyak(0.7, max_lr=1e-3), P, G, gap)
    eta_c = torch.minimum(eta, torch.full_like(eta, 1e-3))
    for k in P:
        torch.testing.assert_close(capped[k], P[k] - eta_c.reshape(-1, *[1] * (P[k].ndim - 1)) * G[k])


@pytest.mark.parametrize("name", ["ngd", "sign", "spectral", "coordinate", "polyak",
                                  "mirror_norm", "adam0", "signum", "muon"])
def test_normalised_rules_are_exact_for_underflowed_gradients(name):
    """A gradient 1e-300 times smaller (its squares underflow float64) gives the same step
    when handed over in scaled form: the direction is computed from G / max|G|."""
    rules = {"ngd": O.ngd(0.1), "sign": O.sign_descent(0.1), "spectral": O.spectral_descent(0.1),
             "coordinate": O.coordinate_descent(0.1), "polyak": O.polyak(0.5),
             "mirror_norm": O.mirror(3.0, 0.1, normalized=True), "adam0": O.adam(0.1, eps=0.0),
             "signum": O.signum(0.1), "muon": O.muon(0.1)}
    opt = rules[name]
    P, G = _pg(4)
    lg = torch.log(torch.tensor([0.5, 1.0, 0.3, 2.0], dtype=torch.float64))
    ref, st = opt.update(G, opt.init(P), P, lg)
    tiny = O.Scaled.of(G, {k: torch.full((4,), -700.0, dtype=torch.float64) for k in G})
    # the same direction, its scale 1e-304 below; Polyak's gap is shifted alike (ratio kept)
    got, _ = opt.update(tiny, opt.init(P), P, lg - 700.0)
    assert min(float(t.abs().max()) for t in tiny.value().values()) < 1e-300
    for k in P:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-12, atol=1e-13)


def test_sign_and_coordinate_descent_by_hand():
    P = {"W": torch.tensor([[[1.0, 2.0], [3.0, 4.0]]], dtype=torch.float64)}
    G = {"W": torch.tensor([[[-0.5, 0.0], [2.0, -3.0]]], dtype=torch.float64)}
    np.testing.assert_array_equal(_step(O.sign_descent(0.1), P, G)["W"][0].numpy(),
                                  [[1.1, 2.0], [2.9, 4.1]])
    np.testing.assert_array_equal(_step(O.coordinate_descent(0.5), P, G)["W"][0].numpy(),
                                  [[1.0, 2.0], [3.0, 4.5]])
    m = {"W": torch.zeros(1, 2, 2, dtype=torch.float64)}
    opt = O.signum(0.1, beta=0.5)
    st = opt.init(P)
    out, st = opt.update(G, st, P, None)  # m = 0.5 G
    out, st = opt.update({"W": -G["W"] * 0.2}, st, out, None)  # m = 0.25 G - 0.1 G = 0.15 G
    np.testing.assert_allclose(out["W"][0].numpy(), P["W"][0].numpy() - 0.2 * np.sign(G["W"][0].numpy()))
    assert m["W"].sum() == 0


def test_muon_update_is_the_polar_factor_of_nesterov_momentum():
    rng = np.random.default_rng(0)
    P = {"W": torch.as_tensor(rng.standard_normal((3, 4, 5))), "v": torch.as_tensor(rng.standard_normal((3, 4)))}
    Gs = [{k: torch.as_tensor(rng.standard_normal(t.shape)) for k, t in P.items()} for _ in range(3)]
    opt = O.muon(0.05, beta=0.9, nesterov=True)
    st, cur = opt.init(P), P
    m = {k: np.zeros(t.shape) for k, t in P.items()}
    ref = {k: t.numpy().copy() for k, t in P.items()}
    for G in Gs:
        cur, st = opt.update(G, st, cur, None)
        for k in P:
            g = G[k].numpy()
            m[k] = 0.9 * m[k] + g
            A = g + 0.9 * m[k]
            if A.ndim == 3:
                U, S, Vt = np.linalg.svd(A, full_matrices=False)
                D = U @ Vt
            else:
                D = A / np.linalg.norm(A, axis=1, keepdims=True)
            ref[k] = ref[k] - 0.05 * D
    for k in P:
        np.testing.assert_allclose(cur[k].numpy(), ref[k], rtol=1e-11, atol=1e-12)
    # Newton-Schulz: an approximate polar factor (singular values within [0.6, 1.25])
    A = torch.as_tensor(rng.standard_normal((2, 6, 4)))
    sv = torch.linalg.svdvals(O.newton_schulz(A, 5))
    assert float(sv.min()) > 0.6 and float(sv.max()) < 1.25


@pytest.mark.parametrize("wd", [0.0, 0.05])
@pytest.mark.parametrize("eps", [1e-8, 1e-3])
def test_adam_matches_torch_adam_step_by_step(eps, wd):
    rng = np.random.default_rng(1)
    W0 = rng.standard_normal((4, 3))
    w = torch.nn.Parameter(torch.as_tensor(W0.copy()))
    ref = (torch.optim.AdamW([w], lr=0.01, betas=(0.8, 0.99), eps=eps, weight_decay=wd) if wd else
           torch.optim.Adam([w], lr=0.01, betas=(0.8, 0.99), eps=eps))
    opt = (O.adamw(0.01, b1=0.8, b2=0.99, eps=eps, weight_decay=wd) if wd else
           O.adam(0.01, b1=0.8, b2=0.99, eps=eps))
    P = {"W": torch.as_tensor(W0.copy())[None]}
    st = opt.init(P)
    for t in range(25):
        g = torch.as_tensor(rng.standard_normal((4, 3)) * 10.0 ** (-t % 5))
        g[0, 0] = 0.0 if t % 3 == 0 else g[0, 0]  # some exactly-zero entries
        w.grad = g.clone()
        ref.step()
        P, st = opt.update({"W": g[None]}, st, P, None)
        torch.testing.assert_close(P["W"][0], w.detach(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adam_schedule_matches_torch_lambdalr(wd):
    """Adam / AdamW with eta_t = lr (t + 2)^(-1/2) against torch.optim with LambdaLR (which
    multiplies the base lr by the lambda of the number of steps taken), over trials that
    start at different step counts: each trial's schedule follows its own count."""
    rng = np.random.default_rng(3)
    sched = O.InversePower(0.05, power=0.5)
    W0 = rng.standard_normal((4, 3))
    w = torch.nn.Parameter(torch.as_tensor(W0.copy()))
    base = (torch.optim.AdamW([w], lr=0.05, betas=(0.8, 0.99), eps=1e-8, weight_decay=wd) if wd
            else torch.optim.Adam([w], lr=0.05, betas=(0.8, 0.99), eps=1e-8))
    ref = torch.optim.lr_scheduler.LambdaLR(base, lambda t: (t + 2.0) ** -0.5)
    opt = (O.adamw(sched, b1=0.8, b2=0.99, eps=1e-8, weight_decay=wd) if wd
           else O.adam(sched, b1=0.8, b2=0.99, eps=1e-8))
    P = {"W": torch.as_tensor(W0.copy())[None]}
    st = opt.init(P)
    for t in range(30):
        g = torch.as_tensor(rng.standard_normal((4, 3)) * 10.0 ** (-t % 4))
        w.grad = g.clone()
        base.step()
        ref.step()
        P, st = opt.update({"W": g[None]}, st, P, None)
        torch.testing.assert_close(P["W"][0], w.detach(), rtol=1e-12, atol=1e-13)
    # a constant schedule is plain Adam, and the schedule's step sizes are lr (t + 2)^-1/2
    c = O.adam(O.InversePower(0.01, power=0.0), eps=0.0)
    a = O.adam(0.01, eps=0.0)
    G = {"W": torch.as_tensor(rng.standard_normal((2, 3, 3)))}
    P2 = {"W": torch.zeros(2, 3, 3, dtype=torch.float64)}
    torch.testing.assert_close(c.update(G, c.init(P2), P2)[0]["W"], a.update(G, a.init(P2), P2)[0]["W"],
                               rtol=0, atol=0)
    np.testing.assert_allclose(sched(torch.tensor([0.0, 7.0])).numpy(), [0.05 / 2 ** 0.5, 0.05 / 3])
    with pytest.raises(ValueError, match="power must be"):
        O.InversePower(0.1, power=-1.0)
    with pytest.raises(ValueError, match="lr must be"):
        O.InversePower(0.0)


def test_adam_eps0_is_sign_like_and_finite():
    P = {"W": torch.zeros(1, 2, 2, dtype=torch.float64)}
    G = {"W": torch.tensor([[[1e-200, -3.0], [0.0, 5.0]]], dtype=torch.float64)}
    out = _step(O.adam(0.1, eps=0.0), P, G)
    # first step: m_hat / sqrt(v_hat) = sign(G) entrywise (0 where G = 0)
    np.testing.assert_allclose(out["W"][0].numpy(), [[-0.1, 0.1], [0.0, -0.1]], rtol=1e-13)


def test_momentum_matches_torch_sgd():
    for nesterov in (False, True):
        rng = np.random.default_rng(2)
        W0 = rng.standard_normal((3, 3))
        w = torch.nn.Parameter(torch.as_tensor(W0.copy()))
        ref = torch.optim.SGD([w], lr=0.1, momentum=0.8, nesterov=nesterov)
        opt = O.momentum(0.1, beta=0.8, nesterov=nesterov)
        P = {"W": torch.as_tensor(W0.copy())[None]}
        st = opt.init(P)
        for _ in range(10):
            g = torch.as_tensor(rng.standard_normal((3, 3)))
            w.grad = g.clone()
            ref.step()
            P, st = opt.update({"W": g[None]}, st, P, None)
        torch.testing.assert_close(P["W"][0], w.detach(), rtol=1e-13, atol=1e-14)


def test_registry_lists_every_rule_and_each_runs():
    P, G = _pg(5)
    lg = torch.zeros(4, dtype=torch.float64)
    assert {"gd", "ngd", "polyak", "mirror", "sgd", "sngd", "nsd", "sign", "spectral",
            "coordinate", "momentum", "adam", "adamw", "signum", "muon"} <= set(O.RULES)
    for name in O.RULES:
        opt = O.get(name)
        out, st = opt.update(G, opt.init(P), P, lg)
        assert all(torch.isfinite(out[k]).all() and not torch.equal(out[k], P[k]) for k in P), name
        assert all(v.shape[0] == 4 for v in st.values()), name  # state carries the trial dim
    assert O.get("md1.5").hyper["p"] == 1.5 and O.get("sign_descent").name == "sign"
    assert O.get("nsd", norm="spectral").hyper["norm"] == "spectral"


def test_torch_adapter_equals_the_batched_rule():
    from attnsvm.optim import torch_optimizer

    rng = np.random.default_rng(3)
    lin = torch.nn.Linear(4, 3).double()
    W0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    opt = torch_optimizer("muon", lin.parameters(), lr=0.05)
    rule = O.muon(0.05)
    P = {"0": W0[None].clone(), "1": b0[None].clone()}
    st = rule.init(P)
    for _ in range(3):
        x = torch.as_tensor(rng.standard_normal((5, 4)))
        opt.zero_grad()
        lin(x).pow(2).sum().backward()
        G = {"0": lin.weight.grad[None].clone(), "1": lin.bias.grad[None].clone()}
        opt.step()
        P, st = rule.update(G, st, P, None)
    torch.testing.assert_close(lin.weight.detach(), P["0"][0])
    torch.testing.assert_close(lin.bias.detach(), P["1"][0])


def test_sgd_minibatches_depend_only_on_each_trials_seed():
    """A batched SNGD run of B trials equals B separate runs with seeds seed + b."""
    data = D.random_sphere(n=6, T=4, d=3, seed=0)
    model = M.WModel(3)
    init = model.init(3, seed=1)
    batched = train(model, data, optimizer=O.sngd(0.2, batch_size=2), steps=30, seed=5, init=init)
    for b in range(3):
        one = train(model, data, optimizer=O.sngd(0.2, batch_size=2), steps=30, seed=5 + b,
                    init={"W": init["W"][b:b + 1]})
        assert torch.equal(batched.params["W"][b], one.params["W"][0]), b


def test_sgd_minibatch_gradient_matches_subset():
    from attnsvm.train import minibatch

    data = D.random_sphere(n=6, T=4, d=3, seed=0)
    model = M.WModel(3)
    traj = train(model, data, optimizer=O.sgd(0.2, batch_size=2), steps=1, seed=5, B=3,
                 record_params=True)
    W0 = torch.as_tensor(traj.param_history["W"][0])
    full = M.prepare(data)
    sub = minibatch(full, 2, torch.arange(3) + 5, 0)
    for b in range(3):
        idx = [int(np.nonzero((data.X == sub["X"][b, j].numpy()).all((1, 2)))[0][0]) for j in range(2)]
        assert len(set(idx)) == 2
        one = D.TokenData(X=data.X[idx], y=data.y[idx], z=data.z[idx], v=data.v)
        _, _, g = model.objective({"W": W0[b:b + 1]}, one)
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
        (lambda: O.ngd(0.1, norm="spectral"), "scope must be"),
        (lambda: O.ngd(float("nan")), "lr must be a finite number > 0"),
        (lambda: O.gd(-1.0), "lr must be a finite number > 0"),
        (lambda: O.gd("fast"), "lr must be a finite number > 0"),
        (lambda: O.adam(0.1, b2=1.0), "b2 must be a number in"),
        (lambda: O.adam(0.1, eps=-1.0), "eps must be a finite number >= 0"),
        (lambda: O.momentum(0.1, beta=1.5), "beta must be a number in"),
        (lambda: O.sgd(0.1, batch_size=0), "batch_size must be an integer >= 1"),
        (lambda: O.muon(0.1, ns_steps=0), "ns_steps must be a positive integer"),
        (lambda: O.get("adamx"), "unknown optimizer 'adamx'"),
        (lambda: O.get("adam", beta=0.3), "optimizer 'adam'"),
        (lambda: O.get("mdx"), "needs a number p"),
        (lambda: O.nsd("foo"), "unknown norm 'foo'"),
    ],
)
def test_optim_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_stopped_trials_keep_their_optimiser_state():
    """Trial 1's data has identical tokens (gradient exactly 0): it stops at step 0 and its
    parameters and Adam state stay frozen while trial 0 keeps training."""
    good = D.random_sphere(n=3, T=4, d=3, seed=0)
    X = good.X.copy()
    X2 = np.repeat(X[:, :1], 4, axis=1)  # every token the same: attention has no gradient
    data = D.TokenData(X=np.stack([X, X2]), y=np.stack([good.y, good.y]),
                       z=np.stack([good.z, good.z]), v=np.stack([good.v, good.v]))
    t = train(M.WModel(3), data, optimizer=O.adam(0.05), steps=20, record_every=5)
    assert list(t.stop_step) == [-1, 0] and list(t.stop_reason) == ["", "zero gradient"]
    assert float(t.state["t"][0]) == 20 and float(t.state["t"][1]) == 0
    assert bool((t.state["m:W"][1] == 0).all()) and not bool((t.state["m:W"][0] == 0).all())


# ------------------------------------------------------------ composable transforms
def test_adagrad_is_one_line_and_matches_torch_adagrad():
    """Adagrad chained from two transforms equals torch.optim.Adagrad step by step (the
    registered rule and the same chain written in one line)."""
    one_line = O.rule("my_adagrad", {"lr": 0.05}, O.scale_by_rss(eps=1e-10),
                      O.scale_by_learning_rate(0.05))
    rng = np.random.default_rng(2)
    W0 = rng.standard_normal((4, 3))
    w = torch.nn.Parameter(torch.as_tensor(W0.copy()))
    ref = torch.optim.Adagrad([w], lr=0.05, eps=1e-10)
    for opt in (O.get("adagrad", lr=0.05), one_line):
        assert opt.stateful and opt.kernel is None  # scale_by_rss has no compiled counterpart
    P1 = P2 = {"W": torch.as_tensor(W0.copy())[None]}
    s1, s2 = O.get("adagrad", lr=0.05).init(P1), one_line.init(P2)
    for t in range(20):
        g = torch.as_tensor(rng.standard_normal((4, 3)) * 10.0 ** (-t % 4))
        g[1, 2] = 0.0 if t % 2 else g[1, 2]
        w.grad = g.clone()
        ref.step()
        P1, s1 = O.get("adagrad", lr=0.05).update({"W": g[None]}, s1, P1, None)
        P2, s2 = one_line.update({"W": g[None]}, s2, P2, None)
        torch.testing.assert_close(P1["W"][0], w.detach(), rtol=1e-12, atol=1e-14)
        assert torch.equal(P1["W"], P2["W"])


def test_adagrad_direction_is_exact_for_underflowed_gradients():
    """The sum of squares is kept as log v: a gradient of size 1e-200 (its square
    underflows) gives the same first step as one of size 1 (Adagrad is scale-free at t=1)."""
    P, G = _pg(4)
    opt = O.adagrad(0.1, eps=0.0)
    tiny = O.Scaled.of(G, {k: torch.full((4,), -460.0, dtype=torch.float64) for k in G})
    a, b = _step(opt, P, G), _step(opt, P, tiny)
    for k in P:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=0)
        torch.testing.assert_close(a[k], P[k] - 0.1 * torch.sign(G[k]), rtol=1e-12, atol=1e-15)


def test_rules_carry_their_compiled_counterpart_as_data():
    """Optimizer.kernel is the tuple of the transforms' opcodes (None when a part has no
    counterpart); statefulness is a field, not a key of the hyper-parameters."""
    ops = lambda o: None if o.kernel is None else tuple(int(k.op) for k in o.kernel)  # noqa: E731
    assert ops(O.gd(0.1)) == (O.Op.LEARNING_RATE, O.Op.DESCEND)
    assert ops(O.ngd(0.1, norm="global", relative=True)) == (
        O.Op.STEEPEST, O.Op.PARAM_NORM, O.Op.LEARNING_RATE, O.Op.DESCEND)
    assert ops(O.polyak()) == (O.Op.POLYAK, O.Op.DESCEND)
    assert ops(O.mirror(1.5, lr=0.1, normalized=True)) == (
        O.Op.NORMALIZE, O.Op.LEARNING_RATE, O.Op.MIRROR)
    assert O.get("sign").kernel[0].args["lp"] == kernel_ops.LP_INF
    assert O.nsd("l3").kernel[0].args["q"] == pytest.approx(1.5)
    for name in ("spectral", "momentum", "adam", "muon", "signum", "adagrad"):
        assert O.get(name).kernel is None or O.get(name).stateful, name
    assert not O.get("ngd").stateful and O.get("adam").stateful and O.get("momentum").stateful
    assert not any(k.startswith("_") for name in O.RULES for k in O.get(name).hyper)
    # a per-trial tensor step size has no compiled counterpart (the kernel reads a number)
    assert O.gd(torch.full((4, 1, 1), 0.1, dtype=torch.float64)).kernel is None


def test_chain_states_compose_and_clashes_are_named():
    P, G = _pg(6)
    opt = O.rule("heavy_sign", {"lr": 0.1}, O.trace(0.9), O.scale_by_sign(),
                 O.scale_by_learning_rate(0.1))
    st = opt.init(P)
    assert set(st) == {"m:K", "m:v"} and opt.stateful and opt.kernel is None
    out, st = opt.update(G, st, P, None)
    for k in P:  # first step: m = G, so the step is lr sign(G)
        torch.testing.assert_close(out[k], P[k] - 0.1 * torch.sign(G[k]), rtol=0, atol=0)
        assert torch.equal(st[f"m:{k}"], G[k])
    with pytest.raises(ValueError, match="state under"):
        O.chain(O.trace(0.9), O.trace(0.5)).init(P)
    with pytest.raises(ValueError, match="Transforms"):
        O.chain()


def test_polyak_range_cap_is_finite_recorded_and_relative():
    """A gradient of size e^-1e4 with an O(1) gap: Polyak's length c gap / ||G|| = e^1e4
    leaves float64; the step takes the relative length cap ||params|| instead, along the
    exact direction, and the count is recorded. In range, the step is Polyak's own."""
    P, G = _pg(7)
    opt = O.polyak(1.0, cap=2.0 ** -6)
    lg = torch.tensor([0.0, -1.0, 0.0, -3.0], dtype=torch.float64)  # log(L - L*)
    far = O.Scaled.of(G, {k: torch.tensor([-1e4, 0.0, -1e4, 0.0], dtype=torch.float64) for k in G})
    st = opt.init(P)
    out, st = opt.update(far, st, P, lg)
    assert st["polyak_capped"].tolist() == [1.0, 0.0, 1.0, 0.0]
    gn = sum(G[k].reshape(4, -1).pow(2).sum(1) for k in G).sqrt()  # G e^-1e4: same direction
    pn = sum(P[k].reshape(4, -1).pow(2).sum(1) for k in P).sqrt()
    step = sum((P[k] - out[k]).reshape(4, -1).pow(2).sum(1) for k in P).sqrt()
    for b in (0, 2):  # capped: length cap max(||P||, 1), direction G / ||G||
        assert float(step[b]) == pytest.approx(2.0 ** -6 * max(float(pn[b]), 1.0), rel=1e-12)
        for k in P:
            d = (P[k][b] - out[k][b]) / step[b]
            torch.testing.assert_close(d, G[k][b] / gn[b], rtol=1e-10, atol=1e-14)
    for b in (1, 3):  # in range: eta = c gap / ||G||^2 with the plain gradient
        Gp = {k: G[k][b] for k in G}
        g2 = sum(Gp[k].pow(2).sum() for k in G)
        for k in P:
            torch.testing.assert_close(out[k][b], P[k][b] - torch.exp(lg[b]) / g2 * Gp[k],
                                       rtol=1e-12, atol=1e-15)
    # a step that ends past PARAM_MAX is scaled back onto it
    big = {k: v * (kernel_ops.PARAM_MAX / float(pn.max())) for k, v in P.items()}
    out, _ = opt.update(far, opt.init(big), big, lg)
    nb = sum(out[k].reshape(4, -1).pow(2).sum(1) for k in out).sqrt()
    assert float(nb[0]) == pytest.approx(kernel_ops.PARAM_MAX, rel=1e-12)
    assert torch.isfinite(nb).all()


def test_extending_md_optimiser_samples_run():
    """The code samples of docs/extending.md's optimiser section run and do what they say."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    section = text[text.index("## An optimiser"):text.index("## A norm")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    ns: dict = {}
    try:
        for b in blocks:
            exec(compile(b, "extending.md", "exec"), ns)
        P, G = _pg(8)
        a = _step(ns["adagrad"], P, G)
        b = _step(O.adagrad(0.1), P, G)
        assert all(torch.equal(a[k], b[k]) for k in P)
        assert O.get("my_adagrad", lr=0.1).name == "my_adagrad"
        out = _step(ns["clipped_gd"], P, G)
        gn = sum(G[k].reshape(4, -1).pow(2).sum(1) for k in G).sqrt()
        f = torch.clamp(1.0 / gn, max=1.0)
        for k in P:
            torch.testing.assert_close(out[k], P[k] - 0.1 * f.reshape(-1, *[1] * (G[k].ndim - 1)) * G[k])
    finally:
        O.RULES.pop("my_adagrad", None)


def test_steepest_unit_equals_steepest_bit_for_bit_and_writes_only_when_owned():
    """Norm.steepest_unit (NGD's direction from a Scaled gradient's tensors, max |T| = 1)
    equals Norm.steepest on the same tensors bit for bit, including a zero trial and a
    NaN trial (both set to 0); ngd's update leaves a Scaled gradient untouched unless it
    is marked owned, and gives the same new parameters either way."""
    from attnsvm.norms import get_norm
    from attnsvm.optim import Scaled, ngd

    g = torch.Generator().manual_seed(3)
    G0 = torch.randn(5, 4, 3, generator=g, dtype=torch.float64)
    G0[1] = 0.0
    G0[2, 0, 0] = float("nan")
    G = G0 * 1e-250  # its squares underflow: only the scaled form has a direction
    S = Scaled.of({"W": G})
    T = S.tensors["W"]
    for name in ("fro", "linf", "l1", "spectral", 3.0):
        N = get_norm(name)
        Tn = T if name == "fro" else T[[0, 1, 3, 4]]  # (an SVD refuses a NaN)
        ref = N.steepest(Tn)
        got = N.steepest_unit(Tn.clone(), inplace=True)
        assert torch.equal(torch.nan_to_num(ref, nan=7.0), torch.nan_to_num(got, nan=7.0)), name
        assert torch.all(ref[1] == 0) and (name != "fro" or torch.all(ref[2] == 0))
    P = {"W": torch.randn(5, 4, 3, generator=g, dtype=torch.float64)}
    before = T.clone()
    new, _ = ngd(0.1).update(S, {}, P)
    assert torch.equal(torch.nan_to_num(T, nan=7.0), torch.nan_to_num(before, nan=7.0))
    new_owned, _ = ngd(0.1).update(S._replace(tensors={"W": T.clone()}, owned=True), {}, P)
    assert torch.equal(new["W"], new_owned["W"])
    # the reference formula: W - lr G / ||G||_F per trial, 0 for the zero and NaN trials
    Gf = G0 / G0.flatten(1).norm(dim=1)[:, None, None]
    want = P["W"] - 0.1 * torch.nan_to_num(Gf, nan=0.0)
    want[2] = P["W"][2]
    assert torch.allclose(new["W"], want, rtol=1e-14, atol=0)
