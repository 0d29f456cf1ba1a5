"""The fused CUDA engine (attnsvm.fused.cuda) without a GPU: its kernel through numba-cuda's
simulator (NUMBA_ENABLE_CUDASIM=1, set in a subprocess only: the flag is process-wide),
held to the CPU fused engine (the same per-trial code: bit for bit) and to the torch
engine (1e-12, tests/test_fused.py's tolerance) on every rule of fused.PROGRAMS, the four
models, fixed and trained heads, three query kinds and a run far past saturation; the
real CUDA compile path to PTX (NVVM, no GPU needed; slow); the engine's selection and
the fallback reason on the Trajectory. On a GPU, tests/test_device.py runs it for real.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import fused
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.train import train

needs_numba_cuda = pytest.mark.skipif(
    importlib.util.find_spec("numba_cuda") is None, reason="numba-cuda not installed")

HERE = os.path.dirname(os.path.abspath(__file__))

SIM_SCRIPT = textwrap.dedent(r"""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from attnsvm import data as D, fused, models as M, optim as O
    from attnsvm.train import train
    from test_fused import IN_KERNEL, _models

    assert fused.unsupported is not None
    from attnsvm.fused import cuda as FC
    assert FC.SIM, "the simulator is not on"

    import attnsvm.train as T
    memory = []  # the memory check's engine (steppers.select_engine, before any work)
    check_memory = T._check_train_memory
    T._check_train_memory = lambda *a, **k: (memory.append(a[6]), check_memory(*a, **k))[1]

    def run(model, data, opt, steps, engine, **kw):
        on_cuda = engine == "cuda"
        fused._on_cuda = lambda tdata: on_cuda  # CPU tensors through the simulated kernel
        memory.clear()
        tr = train(model, data, optimizer=opt, steps=steps,
                   engine="torch" if engine == "torch" else "fused", **kw)
        assert memory == [tr.extra["engine"]], (memory, tr.extra)  # the engine that ran
        return tr

    def same(a, b, rtol, what):
        assert a.steps_run == b.steps_run, what
        np.testing.assert_array_equal(a.stop_step, b.stop_step, err_msg=what)
        np.testing.assert_array_equal(a.stop_reason, b.stop_reason, err_msg=what)
        for k in b.params:
            x, y = a.params[k].numpy(), b.params[k].numpy()
            if rtol == 0:
                np.testing.assert_array_equal(x, y, err_msg=what + k)
            else:
                np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max(),
                                           err_msg=what + k)
        for c in b.metrics.columns:
            x, y = a.metrics[c].to_numpy(), b.metrics[c].to_numpy()
            if x.dtype == bool or c in ("trial", "step"):
                np.testing.assert_array_equal(x, y, err_msg=what + c)
                continue
            if rtol == 0:  # the same parameters; the CPU engine takes its records inside
                # its kernel (its own order of sums), the CUDA run through the recorder
                np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-15, err_msg=what + c)
                continue
            atol = rtol if c.startswith("corr_") else (
                rtol * float(np.abs(y).max()) if c == "loss" else 0.0)
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=what + c)

    def check(model, data, opt, steps, what, torch=True, **kw):
        tc = run(model, data, opt, steps, "cuda", **kw)
        tf = run(model, data, opt, steps, "fused", **kw)
        assert tc.extra["engine"] == "fused-cuda" and tf.extra["engine"] == "fused", what
        same(tc, tf, 0, what + " cuda/cpu ")
        if torch:
            same(tc, run(model, data, opt, steps, "torch", **kw), 1e-12, what + " cuda/torch ")
        return tc

    d = 3
    models = _models(d)
    data = D.random_sphere(n=3, T=4, d=d, seed=11, batch=2)
    kw = dict(record_every=5, seed=3, scale=0.5)
    seen = set()
    for rname, make in IN_KERNEL.items():  # every compiled rule: W model, fixed head
        opt = make()
        seq = tuple(int(k.op) for k in opt.kernel)
        # torch for the first rule of each step loop; the others equal the CPU engine bit
        # for bit, which tests/test_fused.py holds to torch on every rule
        check(models["W"](False), data, opt, 10, f"W {rname}", torch=seq not in seen, **kw)
        seen.add(seq)
    assert seen == set(fused.PROGRAMS), "a step loop of fused.PROGRAMS is not covered"
    for mname, mk in models.items():  # every model, fixed and trained head
        dm = D.random_sphere(n=3, T=4, d=d, seed=11, batch=2, cross=mname != "Prompt")
        for trained, rname in ((False, "ngd"), (True, "polyak"), (True, "mirror3")):
            check(mk(trained), dm, IN_KERNEL[rname](), 10,
                  f"{mname} trained={trained} {rname}", **kw)
    dq = D.random_sphere(n=3, T=4, d=d, seed=11, batch=2, cross=False)
    for query in ("last", "causal"):  # other query kinds (Q > 1 rows for causal)
        check(M.WModel(d, query=query), dq, O.ngd(0.3), 10, f"query {query}", **kw)
    # far past saturation (tests/test_fused.py's setting: ||W|| grows to ~5000)
    dp = D.planted(n=3, T=3, d=4, seed=0, batch=2, score_gap=0.5)
    tc = check(M.WModel(4), dp, O.ngd(2.0), 2000, "saturation", record_every=1000, seed=0)
    assert float(tc.metrics.log10_gap.min()) < -300
    assert (tc.stop_reason == "").all()
    print("SIM-OK")
""")


@needs_numba_cuda
def test_cuda_kernel_in_simulator_equals_cpu_and_torch():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    out = subprocess.run([sys.executable, "-c", SIM_SCRIPT, HERE], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and "SIM-OK" in out.stdout, out.stderr[-4000:]


PTX_SCRIPT = textwrap.dedent(r"""
    import types
    import numba.cuda.dispatcher as Dp
    from numba import cuda
    from numba.cuda.cudadrv import nvrtc, nvvm
    try:  # the compilers: NVVM, and NVRTC (numba-cuda links its C helpers with it)
        nvvm.NVVM()
        nvrtc._get_nvrtc_version()
    except Exception as e:
        print("NO-NVVM", type(e).__name__, e)
        raise SystemExit(0)
    # compile for sm_90 without a device: device functions ask the current device for
    # its compute capability; this process has none
    Dp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from attnsvm.fused import cuda as FC
    a2 = "float64[:, :]"
    sig = (f"(int64[:], float64[:], {a2}, {a2}, {a2}, {a2}, {a2}, {a2}, uint8[:, :], {a2}, "
           f"{a2}, {a2}, {a2}, int64[:], {a2}, int64[:], int64, int64, uint8[:], int64[:], "
           f"int64[:], float64[:], int64, int64)")
    ptx, _ = cuda.compile_ptx(FC.segment.py_func, sig, cc=(9, 0))
    assert ".entry" in ptx and "sm_90" in ptx
    assert "_trial_run" in ptx or len(ptx) > 100000  # the step loop is in the kernel
    print("PTX-OK", len(ptx))
""")


@needs_numba_cuda
@pytest.mark.slow
def test_cuda_kernel_compiles_to_ptx():
    """The real CUDA compile path (numba-cuda -> NVVM -> PTX) of the kernel with the
    per-trial code inlined, off-GPU (skipped without NVVM; about 1-3 min)."""
    out = subprocess.run([sys.executable, "-c", PTX_SCRIPT], capture_output=True, text=True,
                         timeout=1200, env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    if "NO-NVVM" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert out.returncode == 0 and "PTX-OK" in out.stdout, out.stderr[-4000:]


# ------------------------------------------------------------------ selection
def _cuda_tdata():
    """A stand-in for CUDA data (only .device and .dtype are read by unsupported)."""
    return {"X": types.SimpleNamespace(device=torch.device("cuda"), dtype=torch.float64)}


def test_unsupported_on_cuda_names_why(monkeypatch):
    model, opt = M.WModel(3), O.ngd(0.1)
    from attnsvm.losses import logistic

    monkeypatch.setattr(fused, "_cuda_engine", lambda: (None, "numba-cuda sees no device"))
    assert fused.unsupported(model, logistic, opt, _cuda_tdata()) == "numba-cuda sees no device"
    monkeypatch.setattr(fused, "_cuda_engine", lambda: (object(), None))
    assert fused.unsupported(model, logistic, opt, _cuda_tdata()) is None
    why = fused.unsupported(model, logistic, O.adam(0.1), _cuda_tdata())
    assert why is not None and "adam" in why and "CUDA" in why  # stateful: torch engine
    cpu = {"X": torch.zeros(1, 2, 2, 3, dtype=torch.float64)}
    assert fused.unsupported(model, logistic, O.adam(0.1), cpu) is None  # fused-gradient
    mps = {"X": types.SimpleNamespace(device=torch.device("mps"), dtype=torch.float64)}
    assert "mps" in fused.unsupported(model, logistic, opt, mps)


def test_fallback_reason_on_trajectory():
    data = D.random_sphere(n=3, T=4, d=3, seed=1, batch=2)
    tr = train(M.WModel(3), data, optimizer=O.ngd(0.1), steps=4, autograd=True)
    assert tr.extra["engine"] == "torch"
    assert "autograd" in tr.extra["engine_reason"]
    tr = train(M.WModel(3), data, optimizer=O.ngd(0.1), steps=4)
    assert tr.extra["engine"] == "fused" and tr.extra["engine_reason"] is None
    tr = train(M.WModel(3), data, optimizer=O.ngd(0.1), steps=4, engine="torch")
    assert tr.extra["engine_reason"] == "engine='torch' was asked for"


@needs_numba_cuda
def test_workspace_rows_cover_the_scratch():
    """The workspace column holds kernels._scratch's arrays (same sizes, same order) and
    P, G, N: the CPU drivers' scratch is the layout's reference."""
    from attnsvm.fused import cuda as FC
    from attnsvm.fused import kernels as K

    ic = np.zeros(32, dtype=np.int64)
    from attnsvm.fused import codes as C

    for n, Qn, T, d, m, nP, sP in [(3, 1, 4, 5, 0, 1, 25), (2, 4, 4, 6, 3, 3, 37)]:
        ic[[C.IC_N, C.IC_Q, C.IC_T, C.IC_D, C.IC_M, C.IC_NP]] = n, Qn, T, d, m, nP
        ref = [a.size for a in K._scratch(ic[:C.IC_SIZE], sP)] + [max(sP, 1)] * 3
        assert np.diff(FC.workspace_rows(ic, sP)).tolist() == ref


def test_memory_check_engine_is_the_engine_that_runs(monkeypatch):
    """The memory check's engine (steppers.select_engine, before any work) is the engine
    that then runs (Trajectory.extra["engine"]) over models (every compiled kind, a model
    without a kernel, a non-linear head), rules (compiled, fused-gradient) and the options
    that move a run to torch; on CUDA (stand-in data: only the selection runs here, the
    simulator test runs the kernel and checks the same there) the rule gives fused-cuda,
    or torch with the reason."""
    import attnsvm.train as T
    from attnsvm.losses import logistic
    from attnsvm.ntp import NTPModel, ntp_random
    from attnsvm.steppers import select_engine
    from test_fused import _models

    seen = []
    real = T._check_train_memory
    monkeypatch.setattr(T, "_check_train_memory", lambda *a, **k: (seen.append(a[6]), real(*a, **k))[1])
    data = D.random_sphere(n=3, T=4, d=3, seed=1, batch=2)
    prompt = D.random_sphere(n=3, T=4, d=3, seed=1, batch=2, cross=False)
    cases = [(mk(trained), prompt if name == "Prompt" else data, dict(optimizer=opt))
             for name, mk in _models(3).items() for trained in (False, True)
             for opt in (O.ngd(0.1), O.polyak(0.2), O.adam(0.05))]
    cases += [(M.WModel(3), data, dict(optimizer=O.ngd(0.1), autograd=True)),
              (M.WModel(3), data, dict(optimizer=O.ngd(0.1), engine="torch")),
              (M.WModel(3), data, dict(optimizer=O.ngd(0.1), batch_size=2)),
              (M.WModel(3), data, dict(optimizer=O.ngd(0.1), engine="fused")),
              (M.WModel(3, head="relu", train_head=True), data, dict(optimizer=O.ngd(0.1))),
              (NTPModel(8), ntp_random(4, 6, 8, 8, seed=0), dict(optimizer="ngd"))]
    ran = set()
    for model, dat, kw in cases:
        seen.clear()
        tr = train(model, dat, steps=3, **kw)
        assert seen == [tr.extra["engine"]], (model, kw, seen, tr.extra)
        ran.add(tr.extra["engine"])
    assert ran == {"fused", "fused-gradient", "torch"}
    with pytest.raises(ValueError, match="engine='fused' does not support autograd"):
        train(M.WModel(3), data, optimizer=O.ngd(0.1), steps=3, engine="fused", autograd=True)
    monkeypatch.setattr(fused, "_cuda_engine", lambda: (object(), None))
    model = M.WModel(3)
    assert select_engine(model, _cuda_tdata(), logistic, O.ngd(0.1), "auto") == ("fused-cuda", None)
    runs, why = select_engine(model, _cuda_tdata(), logistic, O.adam(0.1), "auto")
    assert runs == "torch" and "CUDA" in why
