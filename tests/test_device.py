"""The CUDA path: the same batched run on a GPU equals the CPU run (skipped without CUDA).

Every parameterisation, a linear head and SGD mini-batches (drawn on the CPU generator, so
the same sequences are used on both devices)."""

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import models as M
from attnsvm.optim import ngd, polyak, sgd
from attnsvm.train import train

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@cuda
@pytest.mark.parametrize("model,opt", [
    (M.WModel(6), ngd(0.1)),
    (M.KQModel(6, m=3), ngd(0.1, norm="global")),
    (M.DiagModel(6), polyak()),
    (M.PromptModel(6), sgd(0.1, batch_size=2)),
    (M.WModel(6, query="causal"), ngd(0.1)),
])
def test_cuda_run_equals_cpu_run(model, opt):
    data = D.random_sphere(n=4, T=5, d=6, seed=1, batch=3)
    runs = [train(model, data, optimizer=opt, steps=100, seed=2, device=dev)
            for dev in ("cpu", "cuda")]
    assert all(v.device.type == "cuda" for v in runs[1].params.values())
    np.testing.assert_allclose(runs[1].W, runs[0].W, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(runs[1].metrics["loss"], runs[0].metrics["loss"], rtol=1e-9)
