"""The NTP model (attnsvm.ntp.model): gradient against autograd, the scaled form against
mpmath far past saturation, and the trainer (every step rule; train() routing)."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
import torch

from attnsvm.ntp import NTPModel, ntp_random, ntp_tensors
from attnsvm.optim import RULES
from attnsvm.svm import graph_svm
from attnsvm.train import train


@pytest.fixture(scope="module")
def data():
    return ntp_random(6, 4, 6, 8, graph="cyclic", seed=0)


@pytest.mark.parametrize("head", ["iden", "gen"])
@pytest.mark.parametrize("param", ["W", "KQ"])
def test_gradient_matches_autograd(data, head, param):
    t = ntp_tensors(data)
    m = NTPModel(8, param, head)
    p = m.init(3, seed=1, scale=2.0)
    ev = m.evaluate(p, t)
    pg = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    L = m.loss_plain(pg, t)
    g = torch.autograd.grad(L.sum(), list(pg.values()))
    assert torch.allclose(ev.loss, L.detach(), rtol=1e-13, atol=0)
    for k, gi in zip(pg, g):
        assert torch.allclose(ev.grads.value()[k], gi, rtol=1e-10, atol=1e-14 * float(gi.abs().max()))


def _mp_grad(data, W, head, dps=120):
    """dL/dW at W in mpmath (dps digits), from the definition."""
    mp.mp.dps = dps
    E = [[mp.mpf(float(v)) for v in row] for row in data.E]
    Wm = [[mp.mpf(float(v)) for v in row] for row in W]
    d, K = data.d, data.K
    G = [[mp.mpf(0)] * d for _ in range(d)]
    for i in range(data.n):
        X = [E[s] for s in data.seqs[i]]
        z = X[-1]
        Wz = [mp.fsum(Wm[a][b] * z[b] for b in range(d)) for a in range(d)]
        a = [mp.fsum(x[c] * Wz[c] for c in range(d)) for x in X]
        mx = max(a)
        ex = [mp.exp(v - mx) for v in a]
        s = [v / mp.fsum(ex) for v in ex]
        if head == "iden":
            lab = [int(tok == data.y[i]) for tok in data.seqs[i]]
            py = mp.fsum(sv for sv, lb in zip(s, lab) if lb)
            g = [s[t] - (s[t] / py if lab[t] else 0) for t in range(len(s))]
        else:
            u = [mp.fsum(s[t] * X[t][c] for t in range(len(s))) for c in range(d)]
            o = [mp.fsum(E[v][c] * u[c] for c in range(d)) for v in range(K)]
            mo = max(o)
            eo = [mp.exp(v - mo) for v in o]
            p = [v / mp.fsum(eo) for v in eo]
            p[int(data.y[i])] -= 1
            h = [mp.fsum(E[v][c] * p[v] for v in range(K)) for c in range(d)]
            g = [s[t] * mp.fsum((X[t][c] - u[c]) * h[c] for c in range(d)) for t in range(len(s))]
        for t in range(len(s)):
            for r in range(d):
                for c in range(d):
                    G[r][c] += g[t] * X[t][r] * z[c] / data.n
    return G


@pytest.mark.parametrize("head", ["iden", "gen"])
def test_scaled_gradient_exact_past_saturation(head):
    """Acyclic data (every preference strict): at ||W|| = 30, 300, 3000 along the
    Graph-SVM direction the gradient is exp(-O(||W||)) (plain float64 cancels, then
    underflows to 0); the scaled direction and log-scale equal mpmath's."""
    data = ntp_random(6, 4, 6, 8, graph="acyclic", seed=1)
    Wd = graph_svm(data.E, data.seqs, data.y).direction_
    t = ntp_tensors(data)
    m = NTPModel(8, "W", head)
    for R in (30.0, 300.0, 3000.0):
        W = Wd * R
        ev = m.evaluate({"W": torch.as_tensor(W)[None]}, t)
        G = ev.grads.tensors["W"][0].numpy()
        Gm = _mp_grad(data, W, head, dps=60 + int(0.25 * R))  # 1 - p_y ~ e^-(margin R)
        nrm = mp.sqrt(mp.fsum(v * v for row in Gm for v in row))
        ref = np.array([[float(v / nrm) for v in row] for row in Gm])
        got = G / np.linalg.norm(G)
        assert np.abs(got - ref).max() < 1e-12, (R, np.abs(got - ref).max())
        ls = float(ev.grads.log_scale["W"][0])
        mp_ls = float(mp.log(max(abs(v) for row in Gm for v in row)))
        assert abs(ls - mp_ls) < 1e-9 * max(1.0, abs(mp_ls)), (ls, mp_ls)
        assert np.isfinite(float(ev.log_gap[0]))
    # at ||W|| = 10^4 the plain gradient is exactly 0; the scaled one keeps its direction
    W = Wd * 1e4
    pg = torch.as_tensor(W)[None].clone().requires_grad_(True)
    g0 = torch.autograd.grad(m.loss_plain({"W": pg}, t).sum(), pg)[0]
    assert float(g0.abs().max()) == 0.0
    ev = m.evaluate({"W": torch.as_tensor(W)[None]}, t)
    assert bool(ev.grads.nonzero()[0]) and np.isfinite(float(ev.grads.log_scale["W"][0]))
    assert float(ev.grads.tensors["W"].abs().max()) == 1.0


def test_cyclic_gradient_off_equilibrium_matches_mpmath(data):
    """Cyclic data, W = R W_svm/||W_svm|| + W0 (W0 in S_fin, not W_fin): the tie samples
    keep an O(1) gradient; both heads equal mpmath's to 1e-10 at R = 300."""
    from attnsvm.ntp import s_fin_basis

    Wd = graph_svm(data.E, data.seqs, data.y).direction_
    Bs = s_fin_basis(data)
    W = 300.0 * Wd + np.einsum("p,pde->de", np.linspace(0.5, 1.5, len(Bs)), Bs)
    t = ntp_tensors(data)
    for head in ("iden", "gen"):
        ev = NTPModel(8, "W", head).evaluate({"W": torch.as_tensor(W)[None]}, t)
        G = ev.grads.value()["W"][0].numpy()
        ref = np.array([[float(v) for v in row] for row in _mp_grad(data, W, head)])
        assert np.abs(G - ref).max() < 1e-10 * np.abs(ref).max()


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_step_rule_trains(data, rule):
    opt = RULES[rule]
    try:
        o = opt() if callable(opt) else opt
    except TypeError:
        pytest.skip(f"{rule} needs arguments")
    if getattr(o, "batch_size", None) is not None:
        with pytest.raises(ValueError, match="full-batch"):
            train(NTPModel(8), data, optimizer=o, steps=2)
        return
    tr = train(NTPModel(8, "KQ"), [data, data], optimizer=o, steps=5, record_every=1)
    assert tr.W.shape == (2, 8, 8) and np.all(np.isfinite(tr.W))
    assert len(tr.metrics) == 2 * 6


def test_train_routes_ntp_and_direction_converges(data):
    Ws = graph_svm(data.E, data.seqs, data.y).W_
    tr = train(NTPModel(8), data, optimizer="ngd", steps=400, B=2, references={"svm": Ws})
    assert tr.extra["engine"] == "torch" and "NTPModel" in tr.extra["engine_reason"]
    c = tr.metrics.groupby("trial")["corr_svm"].last()
    assert (c > 0.9).all()
    with pytest.raises(ValueError, match="engine='fused': NTPModel has no compiled kernel"):
        train(NTPModel(8), data, engine="fused")
    with pytest.raises(ValueError, match="has d = 4"):
        train(NTPModel(4), data)
