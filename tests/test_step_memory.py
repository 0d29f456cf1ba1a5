"""The torch engine's memory-lean step (issue 33, item 5) gives the same run as the
plain one (bit for bit at the benchmarked sizes; to 1e-12 where a chunk's batched op
rounds otherwise): the objective and the checks in row chunks of trials (attnsvm.steppers.
evaluate_rows: the gradient written into the previous parameters' buffers once each
chunk's undo check has read them), the ridge term added in place (Scaled.add(inplace=)),
the Frobenius direction's sum of squares in row blocks (Frobenius.steepest_unit)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import models as M
from attnsvm import steppers
from attnsvm.norms import FRO
from attnsvm.optim import adam, ngd
from attnsvm.optim.base import Scaled, normalize, scaled_sum
from attnsvm.train import train, train_memory


def _run(model, data, opt, **kw):
    return train(model, data, optimizer=opt, steps=7, engine="torch", record_every=3, **kw)


def _same(a, b):
    """The same run: stops exactly, parameters and metrics to 1e-12 (a batched reduction
    or product of a chunk of trials may round its last bit otherwise than the whole
    batch's, as chunk= runs: tests/test_chunked.py)."""
    for k in a.params:
        np.testing.assert_allclose(a.params[k], b.params[k], rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(a.metrics.to_numpy(float), b.metrics.to_numpy(float),
                               rtol=1e-12, atol=1e-300)
    np.testing.assert_array_equal(a.stop_step, b.stop_step)
    assert list(a.stop_reason) == list(b.stop_reason)
    assert a.steps_run == b.steps_run


def _big_lr(B, every=5, ndim=2):
    lr = torch.full((B,) + (1,) * ndim, 0.1, dtype=torch.float64)
    lr[::every] = 1e300  # W ~ 1e300: the next logits overflow (x ~ 1e10): undone
    return lr


CASES = {
    "W": lambda d: M.WModel(d),
    "KQ": lambda d: M.KQModel(d),  # the ridge term (in place)
    "Diag": lambda d: M.DiagModel(d),
    "W trained head": lambda d: M.WModel(d, train_head=True),
    "Prompt": lambda d: M.PromptModel(d),
}


@pytest.mark.parametrize("name", list(CASES))
def test_row_chunks_give_the_bits_of_one_batch(name, monkeypatch):
    """train() with the step in row chunks (CHUNK_MIN_BYTES lowered: 3 chunks of a small
    B) equals the one-batch step (:func:`_same`): parameters, metrics, stops; with NGD and
    Adam (state), and with overflowing steps undone in some chunks (not the trained head:
    its per-trial lr tensor would not fit v)."""
    d, B = 6, 23
    dat = D.random_sphere(n=5, T=4, d=d, seed=3, batch=B)
    big = dataclasses.replace(dat, X=dat.X * 1e10)
    shapes = CASES[name](d).param_shapes()
    per = 8 * int(sum(np.prod(s) for s in shapes.values()))  # bytes of a trial
    runs = [(dat, ngd(0.1)), (dat, adam(0.05))]
    if name != "W trained head":
        runs.append((big, ngd(_big_lr(B, ndim=len(next(iter(shapes.values())))))))
    for data, opt in runs:
        one = _run(CASES[name](d), data, opt)
        with monkeypatch.context() as mp:
            mp.setattr(steppers, "CHUNK_MIN_BYTES", 2 * per)  # 8 chunks of 3 trials
            model = CASES[name](d)
            P = {"p": torch.empty((B, per // 8), dtype=torch.float64)}
            assert len(steppers.row_chunks(P)) >= 3  # the chunked path runs
            rows = _run(model, data, opt)
        _same(one, rows)
        if data is big:
            assert "non-finite step" in set(rows.stop_reason)  # the undo ran


def test_undo_in_a_chunk_restores_the_parameters_before_the_step(monkeypatch):
    """The chunked undo: a trial whose step overflows the logits stops at t - 1 with its
    parameters of that step (a run of one step fewer), the others run on."""
    d, B = 5, 12
    dat = D.random_sphere(n=4, T=3, d=d, seed=0, batch=B)
    big = dataclasses.replace(dat, X=dat.X * 1e10)
    monkeypatch.setattr(steppers, "CHUNK_MIN_BYTES", 8 * d * d * 2)
    lr = _big_lr(B, every=4)
    full = train(M.WModel(d), big, optimizer=ngd(lr), steps=3, engine="torch", init="random")
    one = train(M.WModel(d), big, optimizer=ngd(lr), steps=1, engine="torch", init="random")
    bad = np.arange(B) % 4 == 0
    assert (full.stop_reason[bad] == "non-finite step").all() and (full.stop_step[bad] == 0).all()
    assert (full.stop_reason[~bad] == "").all()
    W0 = M.WModel(d).init(B, seed=0)["W"]
    np.testing.assert_array_equal(full.W[bad], W0[bad].numpy())  # step 0 undone
    assert not np.array_equal(full.W[~bad], one.W[~bad])  # the others moved on


def test_scaled_add_in_place_equals_the_plain_sum():
    """Scaled.add(inplace=True) (the ridge term): the same bits as out of place, zero and
    NaN trials included; normalize and scaled_sum likewise."""
    g = torch.randn(6, 4, 3, dtype=torch.float64)
    g[1] = 0.0
    g[2, 0, 0] = float("nan")
    e = 1e-16 * torch.randn(6, 4, 3, dtype=torch.float64)
    e[3] = 0.0
    ls = torch.tensor([0.0, -3.0, 1.0, -1e3, 5.0, -700.0], dtype=torch.float64)
    t, lt = normalize(g, ls)
    G = Scaled({"K": t}, {"K": lt})
    out = G.add({"K": e})
    G2 = Scaled({"K": t.clone()}, {"K": lt.clone()})
    inp = G2.add({"K": e.clone()}, inplace=True)
    assert torch.equal(torch.nan_to_num(out.tensors["K"], nan=7.0),
                       torch.nan_to_num(inp.tensors["K"], nan=7.0))
    assert torch.equal(torch.nan_to_num(out.log_scale["K"], nan=7.0),
                       torch.nan_to_num(inp.log_scale["K"], nan=7.0))
    a, b = scaled_sum(t, lt, 1.0, e, ls, 2.0), scaled_sum(t.clone(), lt, 1.0, e.clone(), ls, 2.0,
                                                          inplace=True)
    for x, y in zip(a, b):
        assert torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(y, nan=7.0))


def test_ridge_gradient_sharing_the_parameters_is_not_overwritten():
    """A model whose ridge gradient is a parameter tensor itself: the in-place sum is not
    taken (the parameters are left as they were) and the gradient is the plain sum's."""

    class Shared(M.KQModel):
        def _reg_grads(self, params):
            return {"K": params["K"]}

    class Fresh(M.KQModel):
        def _reg_grads(self, params):
            return {"K": params["K"].clone()}

    d = 4
    dat = D.random_sphere(n=3, T=3, d=d, seed=1)
    p = Shared(d).init(2, seed=0)
    K0 = p["K"].clone()
    ev = Shared(d).evaluate(p, Shared(d).prepare(dat))
    assert torch.equal(p["K"], K0)  # not written
    ref = Fresh(d).evaluate(p, Fresh(d).prepare(dat))  # the in-place sum of a fresh copy
    for k in ("K", "Q"):
        assert torch.equal(ev.grads.tensors[k], ref.grads.tensors[k])
        assert torch.equal(ev.grads.log_scale[k], ref.grads.log_scale[k])


def test_frobenius_direction_in_row_blocks_is_the_same():
    """steepest_unit's sum of squares in row blocks (a batch above 4 MiB of items): the
    bits of the one-pass sum (G / ||G||_F against the plain formula)."""
    G = torch.randn(2100, 16, 16, dtype=torch.float64)  # 4.3 MB: two blocks
    G /= G.abs().amax((1, 2), keepdim=True)
    G[5] = 0.0
    n = G.pow(2).sum((1, 2), keepdim=True).sqrt()  # the one-pass formula
    ref = (G / torch.where(n > 0, n, 1.0)).masked_fill_(~(n > 0), 0.0)
    out = FRO.steepest_unit(G.clone(), inplace=True)
    assert torch.equal(out, ref)


def test_memory_model_takes_the_row_chunks_when_they_run():
    """train_memory: the row-chunked copies for a large full-batch closed-form run, the
    one-batch copies for a small one or when rows=False (autograd, mini-batches)."""
    d = 32
    model = M.WModel(d)
    t = model.prepare(D.random_sphere(n=6, T=8, d=d, seed=0))
    big, small = 20000, 50
    per = lambda B, **kw: train_memory(model, t, B, **kw) / B  # noqa: E731
    assert per(big) < per(small)
    assert per(big, rows=False) == pytest.approx(per(small))


@pytest.mark.parametrize("name", ["W", "KQ"])
def test_stall_check_in_row_chunks_stops_the_unchanged_trials(name, monkeypatch):
    """The full stall check a row chunk at a time (no parameter-sized bool temporary):
    trials whose step is below float64's resolution (lr 1e-300 against entries ~0.1)
    stop at step 0 with "no change in float64", exactly those, in the chunked run as in
    the one-batch run (W: the quick sums send the step to the full checks; KQ: a
    factorised model always takes them)."""
    d, B = 5, 23
    dat = D.random_sphere(n=4, T=3, d=d, seed=2, batch=B)
    lr = torch.full((B, 1, 1), 0.1, dtype=torch.float64)
    lr[1::4] = 1e-300
    one = _run(CASES[name](d), dat, ngd(lr))
    with monkeypatch.context() as mp:
        per = 8 * sum(int(np.prod(s)) for s in CASES[name](d).param_shapes().values())
        mp.setattr(steppers, "CHUNK_MIN_BYTES", 2 * per)
        assert len(steppers.row_chunks({"p": torch.empty((B, per // 8))})) >= 3
        rows = _run(CASES[name](d), dat, ngd(lr))
    _same(one, rows)
    stalled = np.arange(B) % 4 == 1
    assert (rows.stop_reason[stalled] == "no change in float64").all()
    assert (rows.stop_step[stalled] == 0).all() and (rows.stop_reason[~stalled] == "").all()


def test_diag_finite_checks_w_by_its_diagonal():
    """DiagModel.finite checks k, q and W's diagonal k q, not a (B, d, d) W: the answer of
    the plain check on k, q and W = diag(k q) itself, with overflowing products (k q =
    inf), NaN ones (inf * 0) and NaN / inf factors planted."""
    model = M.DiagModel(4)
    p = model.init(8, seed=0)
    k, q = p["k"], p["q"]
    k[1, 0], q[1, 0] = 1e200, 1e200  # k q overflows, k and q finite
    k[2, 1], q[2, 1] = float("inf"), 0.0  # inf * 0: NaN in W
    k[3, 2] = float("nan")
    q[4, 3] = -float("inf")
    k[5, 0], q[5, 0] = 1e150, 1e150  # large, finite
    W = torch.diag_embed(k * q)
    plain = torch.stack([torch.isfinite(t.reshape(8, -1)).all(1) for t in (k, q, W)]).all(0)
    got = model.finite(p)
    assert torch.equal(got, plain)
    assert got.tolist() == [True, False, False, False, False, True, True, True]
