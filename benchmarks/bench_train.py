"""Benchmark: batched NGD training vs a naive one-trial-at-a-time baseline.

Setting of the papers' Monte-Carlo figure: n = 6, T = 8, d = 10 random unit-sphere
data, W model, logistic loss, NGD. Prints trial-iterations per second for

  * attnsvm.train: B trials (default 1000) x steps (default 1000) in one batched run;
  * naive baseline: one trial at a time, an nn.Module + torch.optim.SGD with the
    gradient normalised by hand (as in the papers' notebooks), timed on a few trials
    and extrapolated;

and their ratio. ``--quick`` runs a smaller version. Usage:
    python benchmarks/bench_train.py [--quick] [--B 1000] [--steps 1000]
"""

from __future__ import annotations

import argparse
import time

import torch

from attnsvm import data as D
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.train import train


class NaiveAttention(torch.nn.Module):
    """f_i = v^T X_i^T softmax(X_i W z_i) for one trial, as the papers' notebooks do."""

    def __init__(self, d):
        super().__init__()
        self.W = torch.nn.Parameter(torch.zeros(d, d, dtype=torch.float64))

    def forward(self, X, z, v):
        a = (X @ (self.W @ z.unsqueeze(-1))).squeeze(-1)  # (n, T)
        s = torch.softmax(a, dim=-1)
        return (s.unsqueeze(1) @ X).squeeze(1) @ v  # (n,)


def naive_run(data, steps, lr, W0):
    X, z, v, y = (torch.as_tensor(a) for a in (data.X, data.z, data.v, data.y))
    model = NaiveAttention(X.shape[-1])
    with torch.no_grad():
        model.W.copy_(W0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.log1p(torch.exp(-y * model(X, z, v))).mean()
        loss.backward()
        with torch.no_grad():
            model.W.grad /= model.W.grad.norm()
        opt.step()
    return model.W.detach()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B=200, steps=300, 2 baseline trials")
    ap.add_argument("--B", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--baseline-trials", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    if args.quick:
        args.B, args.steps, args.baseline_trials = 200, 300, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    B, steps, lr = args.B, args.steps, 0.1
    data = D.random_sphere(n=6, T=8, d=10, seed=0, batch=B)
    model = M.WModel(10)

    t0 = time.perf_counter()
    traj = train(model, data, optimizer=O.ngd(lr), steps=steps, seed=0, record_every=steps)
    t_fast = time.perf_counter() - t0
    fast = B * steps / t_fast

    nb = args.baseline_trials
    t0 = time.perf_counter()
    Ws = [naive_run(data.trial(b), steps, lr, traj.params["W"].new_zeros(10, 10)) for b in range(nb)]
    t_naive = time.perf_counter() - t0
    naive = nb * steps / t_naive

    # sanity: same math (zero init, same data) -> same iterates
    ref = train(model, data.trial(0), optimizer=O.ngd(lr), steps=steps, init="zero", record_every=steps)
    err = (ref.params["W"][0] - Ws[0]).abs().max().item()
    print(f"setting: n=6 T=8 d=10, NGD lr={lr}, {steps} steps, torch threads={torch.get_num_threads()}")
    print(f"attnsvm.train  B={B}: {t_fast:8.2f} s  -> {fast:12.0f} trial-iters/s")
    print(f"naive baseline ({nb} trials, extrapolated): {t_naive:8.2f} s -> {naive:12.0f} trial-iters/s")
    print(f"ratio: {fast / naive:.1f}x   (max |W_attnsvm - W_naive| on trial 0 = {err:.2e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
