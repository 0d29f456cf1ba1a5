"""The pre-run memory check's model (attnsvm.train.train_memory) against a measured peak:
the resident memory of a train() call above its data, in a fresh process (torch's
allocator does not count CPU tensors; Linux /proc/self/clear_refs resets the peak)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnsvm import fused

CHILD = r"""
import json, math, sys, torch
torch.set_num_threads(1)
from attnsvm import data as D, models as M
from attnsvm.optim import ngd
from attnsvm.train import train, train_memory
B, d, engine, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
model = getattr(M, name + "Model")(d)
small = D.random_sphere(n=6, T=8, d=d, seed=1)
train(model, small, steps=2, B=2, engine=engine)  # imports and kernels before the peak
dat = D.random_sphere(n=6, T=8, d=d, seed=0, batch=B)
pred = train_memory(model, model.prepare(dat), B, engine=engine)
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
tr = train(model, dat, optimizer=ngd(0.1), steps=3, engine=engine, record_every=3)
P = B * sum(math.prod(s) for s in model.param_shapes().values()) * 8
print(json.dumps({"peak": status("VmHWM") - base, "pred": pred, "P": P,
                  "engine": tr.extra["engine"]}))
"""


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/status").exists() or not _clear_refs_works(),
                    reason="needs Linux /proc/self/clear_refs to measure a peak")
@pytest.mark.parametrize("engine, name", [("torch", nm) for nm in ("W", "KQ", "Diag", "Prompt")]
                         + ([("fused", nm) for nm in ("W", "KQ", "Diag", "Prompt")]
                            if fused.available() else []))
def test_memory_model_bounds_the_measured_peak(engine, name):
    """Measured peak <= prediction (the check never lets through a run it should refuse,
    at this size) and prediction <= 2.5 x the peak (its copies are measured, not a loose
    guess): B = 5000, d = 32 (W: the parameters 41 MB, the tokens 61 MB; KQ: 82 MB of
    parameters). The torch engine's step runs in row chunks here (the parameters above
    2 CHUNK_MIN_BYTES): its peak is the parameters, the gradient and a chunk. The fused
    engine's: the parameters (its slots), the start's logits, the vectors W z_iq they
    are formed from (Prompt: its p broadcast over the sequences, n = 6 times the
    parameters) and a row chunk's temporaries, gamma's copy of v broadcast over the
    sequences (n d per trial: scores.scores' product) and the returned W (a new (B, d, d)
    for KQ and Diag, whose parameters are 2 d per trial). Not here: B = 2e4, where the
    copies (31 MB, below glibc's 32 MiB cap of the mmap threshold) may stay in the heap
    and the fused Prompt's peak is 7.6-13.6 P by the process's history (this child: 7.6;
    benchmarks/bench_torch_engine.py's memory(): 13.5-13.6, 18 predicted)."""
    out = subprocess.run([sys.executable, "-c", CHILD, "5000", "32", engine, name],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["engine"] == engine
    assert m["peak"] > m["P"]  # the measurement sees the parameters
    assert m["peak"] <= m["pred"] <= 2.5 * m["peak"], (m["peak"] / m["P"], m["pred"] / m["P"])
