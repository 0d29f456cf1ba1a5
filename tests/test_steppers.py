"""The step loop of train() (attnsvm.steppers): the segment driver, both engines through the
one Stepper interface, the recorder, and the shared thread pool (attnsvm._parallel)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import fused
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm._parallel import thread_pool
from attnsvm.losses import get_loss
from attnsvm.models import prepare
from attnsvm.recorder import Recorder
from attnsvm.steppers import FusedStepper, Stepper, Stops, TorchStepper, make_stepper, run_segments


class Countdown(Stepper):
    """Trial b stops on a zero gradient at step stop_at[b] (None: never): what the driver
    must make of it, without any model."""

    engine = "count"

    def __init__(self, stop_at):
        self.stop_at = stop_at
        self.seen = []

    def init(self, params):
        self.params = params

    def step(self, t0, t1, record, stops):
        for t in range(t0, t1):
            if t == t0:
                record(t)
            self.seen.append(t)
            mask = torch.tensor([s is not None and s == t for s in self.stop_at])
            stops.stop(mask, t, "zero gradient")
            if not stops.running():
                return t
        return None

    def result(self):
        return self.params, {}


@pytest.mark.parametrize("steps, every, stop_at, run, records", [
    (10, 3, [None, None], 10, [0, 3, 6, 9]),
    (10, 3, [4, None], 10, [0, 3, 6, 9]),
    (10, 3, [4, 7], 7, [0, 3, 6]),
    (10, 5, [0, 0], 0, [0]),
    (0, 1, [None], 0, []),
])
def test_run_segments_records_at_segment_starts_and_ends_when_all_stop(steps, every, stop_at,
                                                                        run, records):
    st = Countdown(stop_at)
    st.init({})
    stops = Stops(len(stop_at), "cpu")
    rec = []
    assert run_segments(st, steps, every, rec.append, stops) == run
    assert rec == records
    assert st.seen == list(range(run + (run < steps)))  # the step a run ends at is visited
    want = [-1 if s is None or s >= steps else s for s in stop_at]
    assert stops.stop_step.tolist() == want


def _setup(opt, engine, B=3, steps=40, every=7):
    model = M.WModel(3)
    tdata = prepare(D.random_sphere(n=3, T=4, d=3, seed=2, batch=B))
    lossf = get_loss("logistic")
    params = model.init(B, seed=1, scale=0.5)
    first = model.evaluate(params, tdata, lossf, grad=True)
    st = make_stepper(model, tdata, lossf, opt, engine, first=first, Q=1, B=B, copy=True)
    rec = Recorder(model, tdata, lossf, None, {}, 1)
    stops = Stops(B, "cpu")
    st.init(params)
    n = run_segments(st, steps, every, lambda t: rec.record(t, st.params, stops.active), stops)
    p, _ = st.result()
    rec.close(n, p, stops.active)
    return st, n, p, rec.metrics()


@pytest.mark.skipif(not fused.available(), reason="numba is not installed")
def test_both_engines_through_one_interface():
    """make_stepper picks the engine; both run through run_segments and the Recorder and
    agree (tests/test_fused.py: every configuration)."""
    for opt in (O.ngd(0.3), O.polyak(0.2, max_lr=2.0)):
        sf, nf, pf, mf = _setup(opt, "fused")
        st, nt, pt, mt = _setup(opt, "torch")
        assert isinstance(sf, FusedStepper) and isinstance(st, TorchStepper)
        assert nf == nt == 40
        np.testing.assert_allclose(pf["W"].numpy(), pt["W"].numpy(), rtol=1e-12)
        assert list(mf["step"].unique()) == [0, 7, 14, 21, 28, 35, 40]
        np.testing.assert_allclose(mf["loss"], mt["loss"], rtol=1e-12)
    sa, *_ = _setup(O.adam(0.05), "fused")  # a stateful rule: the kernel's gradient, torch update
    assert isinstance(sa, TorchStepper) and sa.engine == "fused-gradient"


def _count(out, threads, lock, b0, b1):
    with lock:
        out[b0:b1] += 1
        threads.add(threading.get_ident())


def test_thread_pool_covers_every_problem_once_and_raises():
    nt = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for B, per in ((1, 1), (7, 1), (50, 3)):
            hits = np.zeros(B, dtype=int)
            threads: set = set()
            thread_pool(_count, B, hits, threads, threading.Lock(), per_thread=per)
            np.testing.assert_array_equal(hits, 1)
            if B == 1:  # one problem: one call in the caller's thread
                assert threads == {threading.get_ident()}

        def boom(b0, b1):
            raise RuntimeError(f"slice {b0}:{b1}")

        with pytest.raises(RuntimeError, match="slice"):
            thread_pool(boom, 4)
    finally:
        torch.set_num_threads(nt)
