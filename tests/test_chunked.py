"""train(chunk=c): the trials run c at a time and the result equals one unchunked run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm import data as D
from attnsvm import fused
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.train import train

ENGINES = ["torch"] + (["fused"] if fused.available() else [])


def assert_same_run(a, b, exact):
    """exact: the parameters bit for bit (the fused engine computes each trial alone); the
    metrics come from torch's batched ops, whose last bit may depend on the batch size."""
    assert a.extra["engine"] == b.extra["engine"]
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-12, atol=1e-14)
    assert a.steps_run == b.steps_run
    np.testing.assert_array_equal(a.record_steps, b.record_steps)
    np.testing.assert_array_equal(a.stop_step, b.stop_step)
    np.testing.assert_array_equal(a.stop_reason, b.stop_reason)
    for k in b.params:
        np.testing.assert_allclose(a.params[k].numpy(), b.params[k].numpy(), **tol)
    np.testing.assert_allclose(a.W, b.W, **tol)
    assert list(a.metrics.columns) == list(b.metrics.columns)
    pd.testing.assert_frame_equal(a.metrics, b.metrics, check_exact=False, rtol=1e-12)
    if b.param_history is not None:
        for k in b.param_history:
            np.testing.assert_allclose(a.param_history[k], b.param_history[k], **tol)
    if b.state:
        for k in b.state:
            np.testing.assert_allclose(a.state[k].numpy(), b.state[k].numpy(), **tol)


@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_equals_one_run(engine):
    data = D.random_sphere(n=4, T=5, d=3, seed=2, batch=7)
    model = M.KQModel(3, m=2)
    kw = dict(optimizer=O.ngd(0.2), steps=30, record_every=7, seed=4, engine=engine,
              references={"I": np.eye(3), "per": np.random.default_rng(0).normal(size=(7, 3, 3))},
              record_params=True)
    one = train(model, data, **kw)
    for chunk in (1, 3, 7, 100):
        part = train(model, data, chunk=chunk, **kw)
        assert part.extra.get("chunks", 1) == -(-7 // chunk)  # ceil(7 / chunk)
        assert_same_run(part, one, exact=engine == "fused")


@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_with_early_stops_and_state(engine):
    """Trials of one chunk all stop early (zero gradient: all tokens of a sequence equal),
    so that chunk ends before the others; the assembled table still has every record
    step, the frozen trials' rows and the run's stop flags."""
    data = D.random_sphere(n=3, T=4, d=3, seed=4, batch=6)
    X = data.X.copy()
    X[:2] = X[:2, :, :1, :]
    data = data.replace(X=X)
    model = M.WModel(3)
    for opt in (O.ngd(0.1), O.adam(0.05)):
        kw = dict(optimizer=opt, steps=25, record_every=4, engine=engine, scale=0.5)
        one = train(model, data, **kw)
        assert (one.stop_reason[:2] == "zero gradient").all() and one.steps_run == 25
        part = train(model, data, chunk=2, **kw)
        # adam: fused gradient, torch update (batched ops: the last bit may depend on B)
        assert_same_run(part, one, exact=part.extra["engine"] == "fused")


def test_chunked_sgd_keeps_each_trials_batches():
    data = D.random_sphere(n=6, T=4, d=3, seed=5, batch=5)
    kw = dict(optimizer=O.sgd(0.3, batch_size=2), steps=15, record_every=5, seed=9)
    one = train(M.WModel(3), data, **kw)
    part = train(M.WModel(3), data, chunk=2, **kw)
    assert_same_run(part, one, exact=False)


def test_chunk_validation():
    data = D.random_sphere(n=3, T=4, d=3, seed=4, batch=2)
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="chunk"):
            train(M.WModel(3), data, steps=2, chunk=bad)
    t = train(M.WModel(3), data, steps=2, chunk=5)  # chunk >= B: one run
    assert "chunks" not in t.extra
    assert torch.isfinite(t.params["W"]).all()


# ------------------------------------------------------------------ map_chunks
def test_map_chunks_concatenates_in_order():
    from attnsvm.chunks import chunk_bounds, map_chunks

    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(0, 4) == []
    data = D.random_sphere(n=3, T=4, d=3, seed=6, batch=10, cross=False)
    model = M.PromptModel(3)
    kw = dict(optimizer=O.ngd(1.0), steps=40, init="zero", record_every=40)

    def one(a, b):  # train trials [a, b) and tabulate them
        sub = D.TokenData(X=data.X[a:b], y=data.y[a:b], v=data.v[a:b])
        p = train(model, sub, **kw).params["p"].numpy()
        return {"p": pd.DataFrame({"trial": np.arange(a, b), "p0": p[:, 0], "p2": p[:, 2]}),
                "n": pd.DataFrame({"rows": [b - a]})}

    whole = one(0, 10)
    for chunk in (1, 3, 10, 25):
        out = map_chunks(one, 10, chunk)
        pd.testing.assert_frame_equal(out["p"], whole["p"], check_exact=False, rtol=1e-12)
        assert out["n"]["rows"].sum() == 10 and len(out["n"]) == len(chunk_bounds(10, chunk))
    single = map_chunks(lambda a, b: pd.DataFrame({"i": range(a, b)}), 7, 2)
    assert single["i"].tolist() == list(range(7))
    assert len(map_chunks(lambda a, b: pd.DataFrame({"i": range(a, b)}), 0, 2)) == 0


def test_map_chunks_refuses_inconsistent_chunks():
    from attnsvm.chunks import map_chunks

    with pytest.raises(ValueError, match="chunk"):
        map_chunks(lambda a, b: pd.DataFrame(), 5, 0)
    with pytest.raises(TypeError, match="DataFrame"):
        map_chunks(lambda a, b: [a, b], 5, 2)
    with pytest.raises(ValueError, match="tables"):
        map_chunks(lambda a, b: {"x" if a == 0 else "y": pd.DataFrame()}, 5, 2)
    with pytest.raises(TypeError, match="first chunk"):
        map_chunks(lambda a, b: pd.DataFrame() if a == 0 else {"x": pd.DataFrame()}, 5, 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_never_computes_on_all_trials(engine):
    """Memory bounded by the chunk: no logits (hence no per-step temporary) of more than
    `chunk` trials are ever formed."""
    data = D.random_sphere(n=3, T=4, d=3, seed=1, batch=9)
    model = M.WModel(3)
    seen = []
    orig = model._logits

    def logits(params, tdata):
        a = orig(params, tdata)
        seen.append(a.shape[0])
        return a

    model._logits = logits
    train(model, data, steps=6, chunk=4, engine=engine, record_every=3)
    assert seen and max(seen) <= 4
