"""Run every benchmark, one after the other, each in its own process (``make bench``).

    python benchmarks/run_all.py [--quick] [NAME ...]

NAME: train, svm, fig9, graph (the NTP Graph-SVM), tracker (the tracker's overhead per
training step), torch-engine (the torch engine's step against a plain autograd step, and
the peak memory of a run; these six are the default set), cuda (the CUDA engine against the CPU
engines; prints that there is no device and exits without one), fig9-scale (mmts-fig9 at 100,000 trials per d in
chunks of 10,000, then as a Dask sweep on 2 local workers: about an hour on a 2-core
machine, so only when named). Each benchmark measures its own baseline in the same run and
prints the ratio; ``--quick`` runs the small versions (a smoke test of the scripts, not
numbers to quote). Separate processes keep thread settings, imports and peak memory of one
benchmark out of the next one's numbers.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHMARKS = {  # name: (script, arguments, arguments with --quick)
    "train": ("bench_train.py", [], ["--quick"]),
    "svm": ("bench_svm.py", [], ["--quick"]),
    "fig9": ("bench_fig9.py", [], ["--trials", "50", "--steps", "200", "--baseline-trials", "1"]),
    "graph": ("bench_graph_svm.py", [], ["--quick"]),
    "tracker": ("bench_tracker.py", [], ["--quick"]),
    "torch-engine": ("bench_torch_engine.py", [], ["--quick"]),
    "cuda": ("bench_cuda.py", [], ["--B", "1000", "--d", "10", "--steps", "20"]),
    "fig9-scale": ("bench_fig9.py", ["--scale", "100000", "--chunk", "10000", "--threads", "2",
                                     "--dask", "2"],
                   ["--scale", "600", "--chunk", "300", "--steps", "200", "--dask", "2"]),
}
DEFAULT = ["train", "svm", "fig9", "graph", "tracker", "torch-engine"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"benchmarks to run: {', '.join(BENCHMARKS)} "
                         f"(default: {', '.join(DEFAULT)})")
    ap.add_argument("--quick", action="store_true", help="small versions of every benchmark")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    failed = []
    for name in args.names or DEFAULT:
        script, full, quick = BENCHMARKS[name]
        cmd = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        print(f"=== {name}: exit {rc}, {time.perf_counter() - t0:.1f} s wall", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
