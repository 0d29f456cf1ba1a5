"""Two source trees of attnsvm, batched prompt SVMs against the daqp loop, in one run.

    python benchmarks/ab_prompt.py BASE_SRC BRANCH_SRC [--B 1000] [--rounds 41]

e.g. ``python benchmarks/ab_prompt.py /path/to/main/src src``.  One persistent worker
process per tree (its ``src`` first on the path, BLAS on one thread: the benchmark's own
choice, as bench_svm.py), each with the problems of ``bench_svm.py --prompt-only`` (B
problems of (6, 8, 10), seed 0) and its own daqp loop over their dense constraint
matrices (prebuilt, not timed).  Each round runs, in both workers (their order
alternating from round to round): prompt_svm_batch on one thread
(``kernel_threads(1)``; CPU time), the daqp loop (CPU time), prompt_svm_batch on two
threads (wall time).  Printed: the medians, the per-round ratios daqp / attnsvm within
each worker (median and quartiles: the machine's load slows a round's two contenders
alike) and their quotient branch / base, and whether the two trees give the same answers
(statuses, W, norms, gaps of the last run).  A machine under load gives ratios, not
times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

_WORKER = r"""
import json, sys, time
src, B, here = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, src)
sys.path.insert(0, here)
import numpy as np
from bench_svm import _dense_rows, _peer_qp, limit_blas
limit_blas(1)
import attnsvm
from attnsvm._parallel import kernel_threads
from attnsvm.svm import lean, prompt_svm_batch
lean.warmup()
n, T, d = 6, 8, 10
rng = np.random.default_rng(0)
X = rng.standard_normal((B, n, T, d))
alpha = rng.integers(0, T, (B, n))
Ms = [_dense_rows(X[b], np.ones((n, 1)), alpha[b]) for b in range(B)]
def run(k):
    with kernel_threads(k):
        return prompt_svm_batch(X, None, alpha)
fns = {"one": lambda: run(1), "two": lambda: run(2),
       "daqp": lambda: [_peer_qp("daqp", M) for M in Ms]}
for f in fns.values():
    f()
print(json.dumps({"ready": attnsvm.__file__}), flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "answers":
        s = run(1)
        print(json.dumps({"status": s.status_.astype(str).tolist(),
                          "W": np.nan_to_num(s.W_, nan=1e300).tolist(),
                          "norm": np.nan_to_num(s.norm_, posinf=1e300).tolist(),
                          "gap": np.nan_to_num(s.gap_, nan=1e300).tolist()}), flush=True)
        continue
    c0, w0 = time.process_time(), time.perf_counter()
    fns[cmd]()
    print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}),
          flush=True)
"""


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("base", help="the base tree's src directory")
    ap.add_argument("branch", help="the branch's src directory")
    ap.add_argument("--B", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=41)
    args = ap.parse_args(argv)
    import daqp  # noqa: F401  (the peer: pip install attnsvm[bench])

    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    procs = {}
    for name, src in (("base", args.base), ("branch", args.branch)):
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", _WORKER, os.path.abspath(src), str(args.B), here],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for name, p in procs.items():
        print(f"{name}: {json.loads(p.stdout.readline())['ready']}", flush=True)

    def ask(name, cmd):
        procs[name].stdin.write(cmd + "\n")
        procs[name].stdin.flush()
        return json.loads(procs[name].stdout.readline())

    res = {(k, c): [] for k in procs for c in ("one", "daqp", "two")}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for name in (("base", "branch") if r % 2 == 0 else ("branch", "base")):
            for c in ("one", "daqp", "two"):
                res[name, c].append(ask(name, c))
    ans = {k: ask(k, "answers") for k in procs}
    for p in procs.values():
        p.stdin.close()
        p.wait()
    B = args.B

    def arr(k, c, f):
        return np.array([x[f] for x in res[k, c]])

    q = {}
    print(f"B = {B}, {args.rounds} interleaved rounds ({time.perf_counter() - t0:.0f} s), "
          f"load {os.getloadavg()[0]:.1f}")
    for k in procs:
        one, dq, two = arr(k, "one", "cpu"), arr(k, "daqp", "cpu"), arr(k, "two", "wall")
        q[k] = dq / one
        print(f"  {k:<6} attnsvm 1 thread {1e3 * np.median(one) / B:.4f} ms/problem (CPU), "
              f"daqp loop {1e3 * np.median(dq) / B:.4f}, 2 threads {1e3 * np.median(two) / B:.4f}"
              f" (wall); daqp / attnsvm per round: median {np.median(q[k]):.2f}x, quartiles "
              f"{np.percentile(q[k], 25):.2f}-{np.percentile(q[k], 75):.2f}")
    rel = q["branch"] / q["base"]
    two = arr("base", "two", "wall") / arr("branch", "two", "wall")
    print(f"  branch / base, per round: 1 thread {np.median(rel):.2f} (quartiles "
          f"{np.percentile(rel, 25):.2f}-{np.percentile(rel, 75):.2f}), 2 threads (wall) "
          f"{np.median(two):.2f}")
    a, b = ans["base"], ans["branch"]
    dW = np.abs(np.array(a["W"]) - np.array(b["W"])).max()
    print(f"  answers: {sum(x != y for x, y in zip(a['status'], b['status']))} status "
          f"differences, max |W difference| {dW:.1e}, norms equal {a['norm'] == b['norm']}, "
          f"gaps equal {a['gap'] == b['gap']}")


if __name__ == "__main__":
    main()
