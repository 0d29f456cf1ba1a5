"""Two source trees of attnsvm, the same batched Frobenius answers bit for bit.

    python benchmarks/same_answers.py BASE_SRC BRANCH_SRC [--batches 240] [--seed 0]
                                      [--plant]

e.g. ``python benchmarks/same_answers.py /path/to/main/src src`` after a change meant to
leave every answer as it was (a faster kernel, fewer numpy passes).  Each tree runs in
its own process (its ``src`` first on the path, BLAS on one thread) on the same cases:
the batch of ``bench_svm.py --prompt-only`` (B = 1000 problems of (6, 8, 10), seed 0),
then ``--batches`` random batches of ``prompt_svm_batch`` and ``att_svm_batch`` (every
other one): shapes B in [2, 40], n in [1, 7], T in [2, 9], d in [1, 12] (e in {1, 2, 3},
e = 2 in every third ATT batch), tokens scaled by 2^s with s in [-300, 300], and in
turn plain Gaussian, tied (copied) tokens, rounded tokens (small integers: exact ties),
rank-1 tokens (multiples of one vector: mostly infeasible), zero sequences, masks, a
projection W (prompt batches), magnitudes spread over 2^-1060 .. 2^60 in one problem
(subnormal scaled data, constraints near underflow: the compiled path's hand-overs).  Every field of each result is compared as raw bytes
(dtype, shape, bits: NaN positions and signs included; ``time_`` excluded), ``extra``
and ``conflict_`` too; an error must be the same error.  ``--plant``: the branch's
worker changes one entry of W_ of one batch by one ulp, which the comparison must
report (the check is calibrated).  Exit status 0 where every answer is the same.
"""

from __future__ import annotations

import argparse
import ast
import os
import pickle
import subprocess
import sys
import tempfile
from collections import Counter

import numpy as np

_WORKER = r"""
import pickle, sys
src, out, n_batches, seed, plant, here = sys.argv[1:7]
sys.path.insert(0, src)
sys.path.insert(0, here)
from bench_svm import limit_blas
limit_blas(1)
import numpy as np
import attnsvm
from attnsvm.svm import att_svm_batch, prompt_svm_batch
from same_answers import cases, fields
res = []
for k, (kind, kw) in enumerate(cases(int(n_batches), int(seed))):
    f = prompt_svm_batch if kind == "prompt" else att_svm_batch
    try:
        r = fields(f(**kw))
    except Exception as exc:  # (the same error expected of both trees)
        r = {"error": (type(exc).__name__, str(exc))}
    if plant == "1" and k == 3 and "W_" in r:
        dt, shape, raw = r["W_"]
        W = np.frombuffer(raw, dt).copy()
        W[0] = np.nextafter(W[0], np.inf)
        r["W_"] = (dt, shape, W.tobytes())
    res.append((kind, r))
with open(out, "wb") as fh:
    pickle.dump({"file": attnsvm.__file__, "res": res}, fh)
"""


def cases(n_batches: int, seed: int):
    """[(kind, kwargs)]: the benchmark's prompt batch, then ``n_batches`` random ones
    (module docstring); the same list in every process (numpy's seeded generator)."""
    out = []
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 6, 8, 10))
    out.append(("prompt", dict(X=X, W=None, alpha=rng.integers(0, 8, (1000, 6)))))
    variants = ("plain", "tied", "rounded", "rank1", "zero", "mask", "proj", "spread")
    for k in range(n_batches):
        rng = np.random.default_rng([seed, k])
        kind = "prompt" if k % 2 == 0 else "att"
        var = variants[(k // 2) % len(variants)]
        B = int(rng.integers(2, 41))
        n, T, d = int(rng.integers(1, 8)), int(rng.integers(2, 10)), int(rng.integers(1, 13))
        X = rng.standard_normal((B, n, T, d))
        if var == "tied":  # some tokens copies of others
            src_t = rng.integers(0, T, (B, n, T))
            X = np.where(rng.random((B, n, T, 1)) < 0.4,
                         np.take_along_axis(X, src_t[..., None], 2), X)
        elif var == "rounded":
            X = np.round(X * 2.0)
        elif var == "rank1":
            X = rng.standard_normal((B, n, T, 1)) * rng.standard_normal((B, 1, 1, d))
        elif var == "zero":
            X[rng.random((B, n)) < 0.3] = 0.0
        elif var == "spread":  # magnitudes 2^-1060 .. 2^60 in one problem, some tokens tied:
            # subnormal scaled data, rows near underflow, zero rows (the hand-overs)
            X = X * 2.0 ** rng.integers(-1000, 61, (B, n, T, 1)) * 2.0 ** rng.integers(
                -60, 1, (B, n, T, d))
            src_t = rng.integers(0, T, (B, n, T))
            X = np.where(rng.random((B, n, T, 1)) < 0.2,
                         np.take_along_axis(X, src_t[..., None], 2), X)
        if var != "spread":
            X = X * 2.0 ** int(rng.integers(-300, 301))
        alpha = rng.integers(0, T, (B, n))
        kw = dict(X=X, alpha=alpha)
        if var == "mask":
            m = rng.random((B, n, T)) < 0.7
            m[np.arange(B)[:, None], np.arange(n)[None, :], alpha] = True
            kw["mask"] = m
        if kind == "prompt":
            kw["W"] = (rng.standard_normal((d, int(rng.integers(1, 6)))) if var == "proj"
                       else None)
        else:
            e = 2 if k % 3 == 1 else int(rng.integers(1, 4))
            kw["z"] = rng.standard_normal((B, n, e)) * 2.0 ** int(rng.integers(-200, 201))
        out.append((kind, kw))
    return out


def _raw(a):
    a = np.asarray(a)
    if a.dtype == object:
        return ("object", a.shape, repr(a.tolist()))
    return (a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())


def fields(bs) -> dict:
    """Every field of a BatchSolution (``time_`` excluded) as comparable raw values."""
    out = {}
    for f in ("W_", "norm_", "margin_", "violation_", "kkt_residual_", "gap_", "dual_",
              "support_", "margins_", "feasible_", "status_", "solver_", "alpha_"):
        out[f] = _raw(getattr(bs, f))
    out["conflict_"] = repr([tuple(c) for c in bs.conflict_])
    for f in ("norm", "problem", "tol_active"):
        out[f] = repr(getattr(bs, f))
    for k, v in sorted(bs.extra.items()):
        out["extra." + k] = _raw(v) if isinstance(v, np.ndarray) else repr(v)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("base", help="the base tree's src directory")
    ap.add_argument("branch", help="the branch's src directory")
    ap.add_argument("--batches", type=int, default=240)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plant", action="store_true",
                    help="the branch's worker changes one W_ entry by one ulp (must be caught)")
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in (("base", args.base), ("branch", args.branch)):
            out = os.path.join(tmp, name + ".pkl")
            plant = "1" if args.plant and name == "branch" else "0"
            subprocess.run([sys.executable, "-c", _WORKER, os.path.abspath(src), out,
                            str(args.batches), str(args.seed), plant, here],
                           check=True, env=env)
            with open(out, "rb") as fh:
                got[name] = pickle.load(fh)
    a, b = got["base"]["res"], got["branch"]["res"]
    print(f"base: {got['base']['file']}\nbranch: {got['branch']['file']}")
    bad = []
    for k, ((kind, ra), (_, rb)) in enumerate(zip(a, b)):
        diff = sorted(f for f in set(ra) | set(rb) if ra.get(f) != rb.get(f))
        if diff:
            bad.append((k, kind, diff))
    n_err = sum("error" in r for _, r in a)
    n_prob = sum(int(np.prod(r["feasible_"][1])) for _, r in a if "feasible_" in r)
    print(f"{len(a)} batches ({n_prob} problems, {n_err} batches raising the same error in "
          f"both), {len(bad)} with a difference")
    seen = Counter()
    for _, r in a:
        if "status_" in r:
            seen.update(zip(ast.literal_eval(r["status_"][2]), ast.literal_eval(r["solver_"][2])))
    print("  base's (status, solver) counts: " + ", ".join(f"{s} / {v}: {c}" for (s, v), c
                                                          in sorted(seen.items())))
    for k, kind, diff in bad[:20]:
        print(f"  batch {k} ({kind}): {', '.join(diff)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
