"""Benchmark: `mmts-fig9 --full` (batched) vs the papers' one-trial-at-a-time code.

The full Monte-Carlo of Max-Margin Token Selection, Figure 9: d in {2,4,6,8,10,15,20},
1000 trials per d, NGD (lr 1) for 1000 iterations on the prompt p, then one SVM and one
outcome per trial.  Prints

  * attnsvm: ``mmts-fig9`` compute() at the full configuration (all trials of a d in one
    batched ``train``, all SVMs in one batched fast-path call), split into training and
    SVM + outcome time;
  * baseline (measured in the same run): the papers' approach -- a Python loop over
    trials, an ``nn.Module`` with the prompt as a parameter, SGD on the hand-normalised
    gradient, then a cvxpy SVM per trial -- timed on a few trials per d and extrapolated
    to 7 x 1000 trials;

and their ratio.  Usage:
    python benchmarks/bench_fig9.py [--trials 1000] [--baseline-trials 2] [--pad]
"""

from __future__ import annotations

import argparse
import time

import cvxpy as cp
import torch

from attnsvm.data import random_sphere
from attnsvm.experiments import mmts_fig9 as F


class PromptAttention(torch.nn.Module):
    """f_i = v^T X_i^T softmax(X_i p) for one problem, as in the papers' notebooks."""

    def __init__(self, d):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))

    def forward(self, X, v):
        s = torch.softmax(X @ self.p, dim=-1)  # (n, T)
        return (s.unsqueeze(1) @ X).squeeze(1) @ v


def baseline_trial(X, y, v, steps, lr):
    """One trial: NGD by hand with torch.optim.SGD, then the prompt SVM with cvxpy."""
    Xt, yt, vt = (torch.as_tensor(a) for a in (X, y, v))
    model = PromptAttention(X.shape[-1])
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-yt * model(Xt, vt)).mean()
        loss.backward()
        with torch.no_grad():
            g = model.p.grad.norm()
            if g > 0:
                model.p.grad /= g
        opt.step()
    p = model.p.detach().numpy()
    alpha = (X @ p).argmax(-1)
    n, T, d = X.shape
    q = cp.Variable(d)
    cons = [(X[i, alpha[i]] - X[i, t]) @ q >= 1 for i in range(n) for t in range(T) if t != alpha[i]]
    prob = cp.Problem(cp.Minimize(cp.sum_squares(q)), cons)
    try:
        prob.solve(solver=cp.CLARABEL)
    except cp.SolverError:
        pass
    return p, prob.status


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000, help="trials per d (full: 1000)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--baseline-trials", type=int, default=2, help="baseline trials per d (0: skip the baseline)")
    ap.add_argument("--pad", action="store_true", help="one padded batch for all d")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = F.EXPERIMENT.config("full", trials=args.trials, steps=args.steps, pad=args.pad)
    print(f"mmts-fig9: d in {cfg['ds']}, {args.trials} trials per d, {args.steps} NGD steps, "
          f"torch threads {torch.get_num_threads()}, pad={args.pad}")

    timing = {}
    train_prompts = F.train_prompts

    def timed_train(*a, **kw):  # time the training phase inside compute()
        t, c = time.perf_counter(), time.process_time()
        out = train_prompts(*a, **kw)
        timing["train"] = time.perf_counter() - t
        timing["train_cpu"] = time.process_time() - c
        return out

    F.train_prompts = timed_train
    t1, c1 = time.perf_counter(), time.process_time()
    tables = F.compute(cfg)  # the whole experiment: data, training, SVMs, outcomes
    t_all, c_all = time.perf_counter() - t1, time.process_time() - c1
    F.train_prompts = train_prompts
    n_trials = len(tables["trials"])
    print(f"attnsvm  compute():      {t_all:8.1f} s  ({n_trials} trials; training "
          f"{timing['train']:.1f} s, data + SVMs + outcomes {t_all - timing['train']:.1f} s)")
    print(f"         CPU time:        {c_all:8.1f} s  (training {timing['train_cpu']:.1f} s; with one "
          f"thread this is the wall time on an otherwise idle machine)")

    k = args.baseline_trials
    if k < 1:
        return
    t2, c2 = time.perf_counter(), time.process_time()
    for d in cfg["ds"]:
        dd = random_sphere(n=cfg["n"], T=cfg["T"], d=d, seed=cfg["seed"] + d, batch=k, cross=False)
        for b in range(k):
            baseline_trial(dd.X[b], dd.y[b], dd.v[b], args.steps, cfg["lr"])
    per = n_trials / (k * len(cfg["ds"]))
    t_base, c_base = (time.perf_counter() - t2) * per, (time.process_time() - c2) * per
    print(f"baseline (one at a time, {k * len(cfg['ds'])} trials timed, extrapolated): "
          f"{t_base:8.1f} s wall, {c_base:.1f} s CPU")
    print(f"speed-up: {t_base / t_all:.0f}x wall, {c_base / c_all:.0f}x CPU   "
          f"(target: full run < 60 s; measured {t_all:.1f} s wall, {c_all:.1f} s CPU)")


if __name__ == "__main__":
    main()
