"""train()'s fixed per-call work (the start check, the metric records) reuses what it has
computed once per parameter value, and the norms sum in cache-sized chunks of trials;
none of it may change a bit. The logits and sum_t (dL/da_t) x_t are one batched product
each (models.base._token_product): equal to the plain (X * Wz).sum(-1) to rounding,
within the bound of a sum of d (or T) products. Every check here recomputes
independently: norms trial by trial, each record's metrics from the recorded
parameters, the torch engine's final parameters by a hand-written step loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import models as M
from attnsvm import norms
from attnsvm.losses import get_loss
from attnsvm.metrics import correlation
from attnsvm.optim import gd, ngd
from attnsvm.scores import scores
from attnsvm.train import LN10, train


@pytest.fixture(params=["default", "tiny"])
def chunks(request, monkeypatch):
    """The default chunk sizes of the norms, and chunks of a few trials (many chunks, a
    ragged last)."""
    if request.param == "tiny":
        monkeypatch.setattr(norms, "_CHUNK", 50)
    return request.param


def plain_logits(model, params, tdata):
    """The logits as the plain sum of the products x_itj (W z_iq)_j, and the bound on the
    rounding error of any order of that sum, gamma_d sum_j |x_itj| |(W z_iq)_j| (twice:
    both sums are rounded)."""
    X = tdata["X"]
    WZ = model._wz(params, model.queries(tdata) if model.has_query_data else None)
    a = (X[:, :, None] * WZ[:, :, :, None]).sum(-1)  # (B, n, Q, T)
    d = X.shape[-1]
    bound = 2 * d * EPS / (1 - d * EPS) * (X.abs()[:, :, None] * WZ.abs()[:, :, :, None]).sum(-1)
    m = model._key_mask(tdata)
    return (a, bound) if m is None else (a.masked_fill(~m, float("-inf")), bound)


EPS = float(np.finfo(np.float64).eps)


def within(got, want, bound) -> bool:
    """got == want where want is infinite (masked keys), |got - want| <= bound elsewhere."""
    inf = torch.isinf(want)
    return bool(torch.equal(got[inf], want[inf])
                and ((got - want).abs()[~inf] <= bound.expand_as(want)[~inf]).all())


def equal(a, b) -> bool:
    """Bit for bit (floats: the same bits, so -0.0 != 0.0 and NaNs match in sign)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == np.float64:
        a, b = a.view(np.uint64), b.view(np.uint64)
    return np.array_equal(a, b)


MODELS = {
    "W": lambda d: M.WModel(d),
    "W-last": lambda d: M.WModel(d, query="last"),
    "KQ": lambda d: M.KQModel(d, m=3),
    "diag": lambda d: M.DiagModel(d),
    "prompt": lambda d: M.PromptModel(d),
    "W-head": lambda d: M.WModel(d, train_head=True),
}


MODELS_Q = {**MODELS, "W-seq2seq": lambda d: M.WModel(d, query="seq2seq"),
            "W-causal": lambda d: M.WModel(d, query="causal")}


@pytest.mark.parametrize("name", sorted(MODELS_Q))
@pytest.mark.parametrize("batched", [False, True])
def test_logits_are_the_sum_of_the_products(name, batched):
    """One batched product, shared tokens included (no B copies of X): within the rounding
    bound of the plain sum; the same values under autograd (with a graph) and without."""
    B, d = 130, 9
    data = D.random_sphere(n=5, T=6, d=d, seed=1, batch=B if batched else None)
    model = MODELS_Q[name](d)
    td = M.prepare(data)
    params = model.init(B, seed=2, scale=3.0)
    a = model._logits(params, td)
    want, bound = plain_logits(model, params, td)
    assert a.shape == want.shape and within(a, want, bound)
    assert not within(a + 4 * bound, want, bound)  # the check fails on a violating result
    pg = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    ag = model._logits(pg, td)  # under autograd: the same product, with its graph
    assert ag.requires_grad and torch.equal(ag.detach(), a)
    g = torch.autograd.grad(ag[torch.isfinite(ag)].sum(), list(pg.values()), allow_unused=True)
    assert all(bool(torch.isfinite(t).all()) for t in g if t is not None)


@pytest.mark.parametrize("Q", [1, 6])
@pytest.mark.parametrize("batched", [False, True])
def test_gx_is_the_sum_of_the_products(batched, Q):
    B, d = 130, 9
    td = M.prepare(D.random_sphere(n=5, T=6, d=d, seed=1, batch=B if batched else None))
    Ga = torch.as_tensor(np.random.default_rng(0).standard_normal((B, 5, Q, 6)))
    X = td["X"][:, :, None]  # (Bx, n, 1, T, d)
    plain = (Ga[..., None] * X).sum(3)
    bound = 2 * 6 * EPS / (1 - 6 * EPS) * (Ga.abs()[..., None] * X.abs()).sum(3)
    got = M.WModel(d)._gx(td, Ga)
    assert got.shape == (B, 5, Q, d) and within(got, plain, bound)


@pytest.mark.parametrize("norm", ["fro", "l1", "linf", 3.0, "nuc"])
def test_norm_values_bit_identical_unchunked(norm, chunks):
    N = norms.get_norm(norm)
    rng = np.random.default_rng(0)
    A = torch.as_tensor(rng.standard_normal((300, 7, 9)) * 10.0 ** rng.integers(-200, 200, (300, 1, 1)))
    A[3, 1, 2], A[5, 0, 0], A[5, 6, 8], A[8, 2, 2] = float("nan"), float("inf"), -float("inf"), 0.0
    A[11] = 0.0
    got = N.value(A)
    assert equal(got, N._value_of(A, (-2, -1)))  # in one go
    assert bool(got[3].isnan()) and bool(got[5].isinf()) and float(got[11]) == 0.0
    assert equal(N.value(A.numpy()), got.numpy())  # numpy in, numpy out
    V = A.reshape(300, -1)
    assert equal(N.value(V, vector=True), N._value_of(V, (-1,)))
    if N._exact_ops:  # and trial by trial (a general power x^p may differ there, chunks or not)
        assert equal(got, torch.stack([N.value(A[b]) for b in range(len(A))]))
        assert equal(N.value(V, vector=True), torch.stack([N.value(V[b]) for b in range(300)]))


@pytest.mark.parametrize("name", ["W", "KQ", "diag"])
def test_finite_per_trial(name):
    model = MODELS[name](4)
    params = model.init(6, seed=0)
    for v in params.values():
        v[1].view(-1)[0] = float("nan")
        v[2].view(-1)[-1] = float("inf")
        v[3].view(-1)[1] = -float("inf")
    if name != "W":  # the factors are finite, their product W overflows
        k0, k1 = model.param_shapes()
        params[k0][4].fill_(1e200)
        params[k1][4].fill_(1e200)
    want = torch.stack([torch.isfinite(v.reshape(6, -1)).all(1) for v in params.values()]).all(0)
    if model.factorised:
        want &= torch.isfinite(model.W(params).reshape(6, -1)).all(1)
    assert torch.equal(model.finite(params), want)
    assert want.tolist() == [True, False, False, False, name == "W", True]


def expected_metrics(model, params, td, lossf, alpha, refs):
    """The metrics of a record, recomputed from its parameters (fresh logits)."""
    a = model._logits(params, td)
    ev = model.evaluate(params, td, lossf, grad=False, logits=a)
    s = torch.softmax(a, -1)
    B = s.shape[0]
    W = model.W(params)
    vec = W.ndim == 2
    cols = {"loss": ev.loss, "loss_gap": ev.gap, "log10_gap": ev.log_gap / LN10,
            "norm": torch.stack([norms.FRO.value(W[b], vector=vec) for b in range(B)])}
    if model.train_head:
        cols["norm_head"] = torch.stack([norms.FRO.value(params["v"][b], vector=True)
                                         for b in range(B)])
    if isinstance(model, M.KQModel):
        cols["norm_nuc"] = norms.NUC.value(W)  # never chunked (a general SVD)
    if alpha is not None:
        psel = s.gather(-1, alpha.expand(B, *alpha.shape[1:])[..., None])[..., 0].reshape(B, -1)
        cols["p_sel_mean"], cols["p_sel_min"] = psel.mean(1), psel.min(1).values
    flat = s.reshape(B, -1, s.shape[-1])
    cols["p_max"] = flat.max(-1).values.mean(1)
    cols["soft_sparsity"] = (1.0 / flat.pow(2).sum(-1)).mean(1)
    for nm, R in refs.items():
        cols[f"corr_{nm}"] = correlation(W, torch.as_tensor(R), vector=vec)
    return cols


def zero_gradient_data(d):
    """Every sequence's tokens equal: the logits, hence every gradient, are exactly 0."""
    rng = np.random.default_rng(4)
    return D.TokenData(X=np.repeat(rng.standard_normal((5, 1, d)), 6, axis=1), y=np.ones(5),
                       z=rng.standard_normal((5, d)), v=rng.standard_normal(d))


CASES = {  # model, data, optimizer, steps, record_every
    "W": ("W", "sphere", ngd(0.3), 23, 5),
    "KQ": ("KQ", "sphere", ngd(0.3), 23, 5),
    "prompt": ("prompt", "sphere", gd(0.7), 23, 5),
    "W-head": ("W-head", "sphere", ngd(0.3), 12, 4),
    "overflow": ("KQ", "sphere", ngd(1e200), 12, 4),  # every trial: non-finite step
    "zero-gradient": ("W", "zero", ngd(0.3), 12, 4),  # every trial stops at step 0
}


@pytest.mark.parametrize("engine", ["fused", "torch"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_train_records_are_the_plain_recomputation(case, engine, chunks):
    name, dname, opt, steps, k = CASES[case]
    d, B = 7, 150
    model = MODELS[name](d)
    data = (D.random_sphere(n=5, T=6, d=d, seed=3) if dname == "sphere"
            else zero_gradient_data(d))
    refs = {"r": np.random.default_rng(1).standard_normal((d,) if name == "prompt" else (d, d))}
    if engine == "fused" and name == "W-head":
        pytest.importorskip("numba")
    tr = train(model, data, optimizer=opt, steps=steps, B=B, record_every=k, engine=engine,
               record_params=True, references=refs)
    td = M.prepare(data)
    lossf = get_loss("logistic")
    alpha = None if data.v is None else scores(td["X"], td["y"], td["v"])[:, :, None].argmax(-1)
    m = tr.metrics
    for r, t in enumerate(tr.record_steps):
        params = {kk: torch.from_numpy(h[r]) for kk, h in tr.param_history.items()}
        want = expected_metrics(model, params, td, lossf, alpha, refs)
        got = m[m.step == t].sort_values("trial")
        assert list(got.columns) == ["trial", "step", *want, "stopped"]
        for col, v in want.items():
            assert equal(got[col].to_numpy(), v.numpy()), (case, t, col)
        stopped = (tr.stop_step >= 0) & ((tr.stop_step < t) | (t == tr.steps_run))
        assert equal(got["stopped"].to_numpy(), stopped)
    for kk, v in tr.params.items():  # the last record is at the final parameters
        assert equal(v.numpy(), tr.param_history[kk][-1])
    if case == "zero-gradient":
        assert tr.steps_run == 0 and set(tr.stop_reason) == {"zero gradient"}
        assert (tr.stop_step == 0).all() and tr.record_steps.tolist() == [0]
    if case == "overflow":
        assert set(tr.stop_reason) == {"non-finite step"}
    other = train(model, data, optimizer=opt, steps=steps, B=B, record_every=k,
                  engine="torch" if engine == "fused" else "fused")
    assert equal(tr.stop_step, other.stop_step) and equal(tr.stop_reason, other.stop_reason)
    if engine == "torch" and case in ("W", "KQ", "prompt", "W-head"):  # no trial stops
        params, state = model.init(B, seed=0), None
        state = opt.init(params)
        for _ in range(steps):  # the step loop by hand, on fresh logits
            ev = model.evaluate(params, td, lossf, need_gap=opt.needs_gap)
            params, state = opt.update(ev.grads, state, params, ev.log_gap)
        for kk, v in tr.params.items():
            assert equal(v.numpy(), params[kk].numpy()), kk



@pytest.mark.parametrize("engine", ["fused", "torch"])
@pytest.mark.parametrize("steps", [0, 3])
@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_dict_init_is_never_shared_with_the_result(engine, steps, kind):
    if engine == "fused":
        pytest.importorskip("numba")
    data = D.random_sphere(n=4, T=5, d=3, seed=0)
    W0 = np.random.default_rng(0).standard_normal((4, 3, 3))
    init = W0.copy() if kind == "numpy" else torch.as_tensor(W0.copy())
    tr = train(M.WModel(3), data, optimizer=ngd(0.1), steps=steps, init={"W": init}, engine=engine)
    tr.params["W"].add_(1.0)
    tr.params["W"][:] = 7.0
    assert equal(np.asarray(init), W0)
    assert not np.shares_memory(tr.W, np.asarray(init))
