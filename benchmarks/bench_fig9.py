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

Scale (``--scale TOTAL``): the same pipeline (data, NGD training, outcomes with their SVMs)
at TOTAL trials per d, ``--chunk`` trials at a time (``attnsvm.chunks.map_chunks``), with the
time of training and of outcomes and the memory (peak RSS, and the RSS after every chunk:
flat when the memory is bounded by the chunk). Chunk j of dimension d draws its data with
seed j * chunk + d, exactly as the cell {trials: chunk, population: chunk, seed: j * chunk} of
``attnsvm sweep mmts-fig9 --scale full`` does, so ``--dask W`` then runs that sweep on a
Dask LocalCluster of W workers, times it and checks that its outcome counts equal the
chunked run's:

    python benchmarks/bench_fig9.py --scale 100000 --chunk 10000 --dask 2
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import cvxpy as cp
import numpy as np
import pandas as pd
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


def _rss_mb() -> float:
    """Resident memory of this process now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def run_scaled(total: int, chunk: int, steps: int) -> pd.DataFrame:
    """The fig9 pipeline at `total` trials per d, `chunk` trials at a time."""
    from attnsvm.chunks import map_chunks
    from attnsvm.data import random_sphere

    cfg = F.EXPERIMENT.config("full", trials=chunk, steps=steps)
    timing = {"train": 0.0, "outcomes": 0.0, "data": 0.0}
    rss = []

    def one(d):
        def run(a, b):
            t = time.perf_counter()
            dat = random_sphere(n=cfg["n"], T=cfg["T"], d=d, seed=a + d, batch=b - a, cross=False)
            t1 = time.perf_counter()
            p = F.train_prompts(dat, cfg, np.full(b - a, d))
            t2 = time.perf_counter()
            df = F.outcomes(p, dat.X, dat.y, dat.v)
            t3 = time.perf_counter()
            timing["data"] += t1 - t
            timing["train"] += t2 - t1
            timing["outcomes"] += t3 - t2
            df.insert(0, "norm", np.linalg.norm(p, axis=1))
            df.insert(0, "trial", np.arange(a, b))
            df.insert(0, "d", d)
            del dat, p
            rss.append(_rss_mb())
            return df
        return run

    t0 = time.perf_counter()
    parts = []
    n_chunks = (total + chunk - 1) // chunk
    for d in cfg["ds"]:
        td = time.perf_counter()
        parts.append(map_chunks(one(d), total, chunk))
        print(f"  d = {d:>2d}: {time.perf_counter() - td:7.1f} s  (RSS after each chunk, MB: "
              f"{', '.join(f'{x:.0f}' for x in rss[-n_chunks:])})", flush=True)
    wall = time.perf_counter() - t0
    df = pd.concat(parts, ignore_index=True)
    n = len(df)
    print(f"attnsvm, {total} trials per d x {len(cfg['ds'])} d = {n} trials, chunks of {chunk}, "
          f"{steps} NGD steps, torch threads {torch.get_num_threads()}:")
    print(f"  wall {wall:8.1f} s = data {timing['data']:.1f} s + training {timing['train']:.1f} s "
          f"({n * steps / timing['train'] / 1e6:.2f} M trial-steps/s) + outcomes with SVMs "
          f"{timing['outcomes']:.1f} s ({timing['outcomes'] / n * 1e3:.3f} ms per trial)")
    print(f"  memory: peak RSS {_peak_mb():.0f} MB; RSS after the chunks {min(rss):.0f}-{max(rss):.0f} MB "
          f"(the data of one chunk: {chunk * 6 * 8 * max(cfg['ds']) * 8 / 2 ** 20:.0f} MB at d = "
          f"{max(cfg['ds'])}; all trials of one d at once would hold "
          f"{total * 6 * 8 * max(cfg['ds']) * 8 / 2 ** 20:.0f} MB)")
    print("  outcome shares per d:")
    print(F.shares(df).round(4).to_string())
    return df


def run_dask(total: int, chunk: int, steps: int, workers: int, ref: pd.DataFrame) -> None:
    """The same trials as a Dask sweep of mmts-fig9 cells {trials: chunk, population: chunk,
    seed: j chunk} (population = chunk: each cell draws exactly its chunk, as the chunked run)."""
    from attnsvm.sweep import grid, sweep

    seeds = list(range(0, total, chunk))
    cells = grid(trials=chunk, population=chunk, seed=seeds, steps=steps)
    cmd = (f"attnsvm sweep mmts-fig9 --scale full --grid trials={chunk} --grid population={chunk} --grid "
           f"seed=0:{total}:{chunk} --grid steps={steps} --executor dask --workers {workers}")
    with tempfile.TemporaryDirectory() as store:
        t = time.perf_counter()
        res = sweep("mmts-fig9", cells, scale="full", store=store, executor="dask",
                    workers=workers, progress=False)
        wall = time.perf_counter() - t
    print(f"\nDask sweep ({workers} local workers, {len(cells)} cells of {chunk} trials x 7 d):")
    print(f"  command: {cmd}")
    print(f"  wall {wall:.1f} s; {res.summary().splitlines()[0]}")
    if not res.ok:
        print(res.summary())
        return
    tr = res["trials"]
    a = pd.crosstab(tr.d, tr.outcome)
    b = pd.crosstab(ref.d, ref.outcome).reindex(index=a.index, columns=a.columns, fill_value=0)
    same = a.equals(b)
    print(f"  outcome counts per d equal to the chunked run's: {same}")
    if not same:
        print("  sweep:\n" + a.to_string() + "\n  chunked:\n" + b.to_string())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000, help="trials per d (full: 1000)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--baseline-trials", type=int, default=2, help="baseline trials per d (0: skip the baseline)")
    ap.add_argument("--pad", action="store_true", help="one padded batch for all d")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--scale", type=int, default=None, metavar="TOTAL",
                    help="run the pipeline at TOTAL trials per d in chunks (no baseline)")
    ap.add_argument("--chunk", type=int, default=10000, help="trials per chunk with --scale")
    ap.add_argument("--dask", type=int, default=0, metavar="W",
                    help="with --scale: also run it as a Dask sweep on W local workers")
    ap.add_argument("--save", default=None, metavar="PATH",
                    help="with --scale: write the trials table to PATH (Parquet)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.scale:
        ref = run_scaled(args.scale, args.chunk, args.steps)
        if args.save:
            ref.to_parquet(args.save)
        if args.dask:
            run_dask(args.scale, args.chunk, args.steps, args.dask, ref)
        return
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
