"""Benchmark: the batched training engine on a CUDA device against the CPU engines of the
same machine, measured in the same run.

Setting: the README's training row (W model, cross-attention, fixed linear head, logistic
loss, NGD lr 0.1, random unit-sphere data, (n, T) = (6, 8)), B trials of dimension d,
200 steps, best of 2 timed runs after one warm-up; throughput in trial-iterations per
second. Contenders: ``train(..., device="cuda")`` (the torch engine, the only one on CUDA),
``train(..., engine="torch")`` on the CPU and ``train(...)`` (the fused compiled engine) on
the CPU. Without a CUDA device it says so and exits 0.

    python benchmarks/bench_cuda.py [--B 1000 10000] [--d 10 32 64] [--steps 200]
"""

from __future__ import annotations

import argparse
import time

import torch

from attnsvm import data as D
from attnsvm import models as M
from attnsvm.optim import ngd
from attnsvm.train import train


def best_time(fn, reps: int = 2) -> float:
    """Best wall time of ``reps`` calls of ``fn`` after one warm-up (CUDA synchronised)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--d", type=int, nargs="+", default=[10, 32, 64])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare")
        return
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"{torch.get_num_threads()} CPU threads")
    contenders = {"cuda": dict(device="cuda", engine="torch"),
                  "cpu-torch": dict(engine="torch"), "cpu-fused": dict(engine="auto")}
    for B in args.B:
        for d in args.d:
            data = D.random_sphere(n=6, T=8, d=d, seed=1, batch=B)
            row = []
            for name, kw in contenders.items():
                t = best_time(lambda kw=kw, d=d, data=data: train(
                    M.WModel(d), data, optimizer=ngd(0.1),
                    steps=args.steps, seed=2, **kw))
                row.append(f"{name} {B * args.steps / t / 1e6:.3f} M/s")
            print(f"B={B} d={d}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
