"""Benchmark: training on a CUDA device, attnsvm's fused CUDA engine against the JAX program
a researcher would write instead, on the same card in the same run.

Setting (the README's training row): W model, cross-attention, fixed linear head,
logistic loss, NGD lr 0.1, random unit-sphere data (n, T) = (6, 8), B trials of
dimension d, float64. attnsvm: ``train(..., device="cuda", record_every=steps)`` (the
engine "auto" picks the fused CUDA engine; ``Trajectory.extra`` says which ran). JAX:
``jit(fori_loop(vmap(step)))`` with plain softmax and autodiff (:func:`jax_program`).
Cost per step = the difference of two run lengths (set-up, compilation and the two
records excluded), as trial-steps per second. The bandwidth bound: a step that re-reads
each trial's tokens (n T d 8 bytes per trial-step) at the card's device-to-device copy
bandwidth (measured here: 2 x bytes / time of a 4 GiB ``copy_``).

The saturation row: the same run started from W0 scaled by ``--sat-scale`` (the softmax
saturates in float64): the trials whose JAX gradient is exactly 0 (its NGD step is then
0 / 0: NaN), against attnsvm's trials whose W moved (its gradient is taken in the
scaled, log-domain form of docs/theory.md §8).

Each contender runs in its own process (JAX and torch keep separate device memory; JAX
without preallocation). Without a CUDA device it says so and exits 0.

    python benchmarks/bench_cuda.py [--B 10000 100000 1000000] [--d 10 64]
        [--time 1.0] [--sat-scale 1e6] [--timeout 400]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

N, T, LR = 6, 8, 0.1


# ------------------------------------------------------------------- the data
def make_data(B: int, d: int, seed: int = 1):
    """Unit-sphere tokens, queries and heads, labels +-1, as float64 torch tensors on the
    GPU (attnsvm's prepared-data dict: X (B, n, T, d), y (B, n), z (B, n, d), v (B, d))."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def unit(*shape):
        x = torch.randn(*shape, generator=g, device="cuda", dtype=torch.float64)
        return x / x.norm(dim=-1, keepdim=True)

    X, z, v = unit(B, N, T, d), unit(B, N, d), unit(B, d)
    y = torch.randint(0, 2, (B, N), generator=g, device="cuda").to(torch.float64) * 2 - 1
    W0 = torch.randn(B, d, d, generator=g, device="cuda", dtype=torch.float64) / d
    return {"X": X, "y": y, "z": z, "mask": None, "v": v}, W0


def fits(B: int, d: int, copies: int) -> bool:
    """Whether X and ``copies`` copies of the parameters (B, d, d) fit in 85% of the GPU."""
    import torch

    need = B * 8 * (2 * N * T * d + copies * d * d)
    return need < 0.85 * torch.cuda.get_device_properties(0).total_memory


def steps_for(cost: float, budget: float) -> tuple[int, int]:
    """Two run lengths whose difference takes about ``budget`` seconds at ``cost`` s/step."""
    k = int(min(5000, max(4, math.ceil(budget / max(cost, 1e-9)))))
    return 2, 2 + k


# ------------------------------------------------------------------- attnsvm
def worker_attnsvm(Bs, ds, budget, sat_scale):
    import torch

    from attnsvm import models as M
    from attnsvm.optim import ngd
    from attnsvm.train import train

    def run(data, W0, S):
        """S steps from W0 (a dict init), or from the model's random init (W0 = None)."""
        torch.cuda.synchronize()
        t = time.perf_counter()
        init = "random" if W0 is None else {"W": W0}
        d, B = data["X"].shape[-1], data["X"].shape[0]
        tr = train(M.WModel(d), data, optimizer=ngd(LR), steps=S, record_every=S,
                   device="cuda", init=init, B=B, seed=2)
        torch.cuda.synchronize()
        return time.perf_counter() - t, tr

    for d in ds:
        for B in Bs:
            if not fits(B, d, 9):
                print(json.dumps(dict(who="attnsvm", B=B, d=d, error="skipped: memory")))
                continue
            try:
                data, W0 = make_data(B, d)
                W0 = None  # the model's own random init on the device (no host copy)
                run(data, W0, 2)  # compile / load the kernel, warm the allocator
                ta, _ = run(data, W0, 2)
                tb, _ = run(data, W0, 6)
                S1, S2 = steps_for((tb - ta) / 4, budget)
                t1, _ = run(data, W0, S1)
                t2, tr = run(data, W0, S2)
                rate = B * (S2 - S1) / (t2 - t1)
                print(json.dumps(dict(who="attnsvm", B=B, d=d, rate=rate, steps=[S1, S2],
                                      engine=tr.extra.get("engine"),
                                      fallback=tr.extra.get("engine_reason"))), flush=True)
            except Exception as e:  # noqa: BLE001 (out of memory: the row says so)
                print(json.dumps(dict(who="attnsvm", B=B, d=d, error=repr(e)[:200])), flush=True)
            data = W0 = None
            torch.cuda.empty_cache()
    # saturation: W0 scaled up, 100 steps
    B, d = 10000, 10
    data, W0 = make_data(B, d)
    W0 = W0 * sat_scale
    _, tr = run(data, W0, 100)
    W = torch.as_tensor(tr.W, device="cuda")
    moved = (W - W0).flatten(1).abs().amax(1) > 0
    zero = [str(r) == "zero gradient" for r in tr.stop_reason]
    print(json.dumps(dict(who="attnsvm", sat=True, B=B, d=d, scale=sat_scale,
                          moved=float(moved.double().mean()), zero_grad=sum(zero) / B,
                          engine=tr.extra.get("engine"))), flush=True)


# ----------------------------------------------------------------------- JAX
def jax_program():
    """The peer (benchmarks/jax_peer.py): (run, grad_zero) at this benchmark's step size."""
    from jax_peer import jax_program as peer

    return peer(LR)


def worker_jax(Bs, ds, budget, sat_scale):
    import jax
    import jax.numpy as jnp
    import numpy as np

    run, grad_zero = jax_program()

    def data(B, d, seed=1):
        k = jax.random.split(jax.random.PRNGKey(seed), 5)

        def unit(key, shape):
            x = jax.random.normal(key, shape, dtype=jnp.float64)
            return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

        X, z, v = unit(k[0], (B, N, T, d)), unit(k[1], (B, N, d)), unit(k[2], (B, d))
        y = jax.random.choice(k[3], jnp.array([-1.0, 1.0]), (B, N))
        W0 = jax.random.normal(k[4], (B, d, d), dtype=jnp.float64) / d
        return W0, X, z, y, v

    def _fits_jax(B, d):  # as fits(), from JAX's own account of the device
        stats = jax.devices()[0].memory_stats() or {}
        total = stats.get("bytes_limit", float("inf"))
        return B * 8 * (2 * N * T * d + 6 * d * d) < 0.85 * total

    def timed(args, S):
        t = time.perf_counter()
        run(*args, S).block_until_ready()
        return time.perf_counter() - t

    for d in ds:
        for B in Bs:
            if not _fits_jax(B, d):
                print(json.dumps(dict(who="jax", B=B, d=d, error="skipped: memory")))
                continue
            try:
                args = data(B, d)
                jax.block_until_ready(args)
                timed(args, 2)  # compile
                ta, tb = timed(args, 2), timed(args, 6)
                S1, S2 = steps_for((tb - ta) / 4, budget)
                t1, t2 = timed(args, S1), timed(args, S2)
                rate = B * (S2 - S1) / (t2 - t1)
                print(json.dumps(dict(who="jax", B=B, d=d, rate=rate, steps=[S1, S2])),
                      flush=True)
            except Exception as e:  # noqa: BLE001 (out of memory: the row says so)
                print(json.dumps(dict(who="jax", B=B, d=d, error=repr(e)[:200])), flush=True)
            args = None
    B, d = 10000, 10
    W0, X, z, y, v = data(B, d)
    W0 = W0 * sat_scale
    zero = np.asarray(grad_zero(W0, X, z, y, v))
    W = np.asarray(run(W0, X, z, y, v, 100))
    print(json.dumps(dict(who="jax", sat=True, B=B, d=d, scale=sat_scale,
                          zero_grad=float(zero.mean()),
                          nan=float(np.isnan(W).any(axis=(1, 2)).mean()))), flush=True)


# ----------------------------------------------------------------------- main
def bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes/s, read + write) of a 4 GiB copy_."""
    import torch

    a = torch.empty(1 << 29, dtype=torch.float64, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * a.numel() * 8 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, nargs="+", default=[10000, 100000, 1000000])
    ap.add_argument("--d", type=int, nargs="+", default=[10, 64])
    ap.add_argument("--time", type=float, default=1.0, help="seconds per timed difference")
    ap.add_argument("--sat-scale", type=float, default=1e6)
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per contender")
    ap.add_argument("--only", choices=["attnsvm", "jax"], nargs="+",
                    default=["attnsvm", "jax"])
    ap.add_argument("--worker", choices=["attnsvm", "jax"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        fn = worker_attnsvm if args.worker == "attnsvm" else worker_jax
        fn(args.B, args.d, args.time, args.sat_scale)
        return
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to compare")
        return
    bw = bandwidth()
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, copy bandwidth "
          f"{bw / 1e12:.2f} TB/s; {time.strftime('%Y-%m-%d', time.gmtime())}", flush=True)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    rows: dict = {}
    for who in args.only:
        cmd = [sys.executable, __file__, "--worker", who, "--time", str(args.time),
               "--sat-scale", str(args.sat_scale), "--B", *map(str, args.B),
               "--d", *map(str, args.d)]
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                 timeout=args.timeout)
            text, err = out.stdout, out.stderr
        except subprocess.TimeoutExpired as e:
            text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = f"timed out after {args.timeout:.0f} s"
        for line in text.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                rows[(r["who"], r.get("sat", False), r["B"], r["d"])] = r
                print(line, flush=True)
        if err.strip():
            print(f"[{who} stderr tail] " + err.strip()[-1500:], flush=True)
    print("\n| B | d | attnsvm fused-cuda (M trial-steps/s) | JAX (M/s) | attnsvm / JAX "
          "| attnsvm, % of bandwidth bound | JAX, % of bound |")
    print("|---|---|---|---|---|---|---|")
    for d in args.d:
        for B in args.B:
            a = rows.get(("attnsvm", False, B, d), {})
            j = rows.get(("jax", False, B, d), {})
            bound = bw / (N * T * d * 8)
            ra, rj = a.get("rate"), j.get("rate")
            cell = (lambda r: f"{r / 1e6:.1f}" if r else "n/a")
            ratio = f"{ra / rj:.2f}x" if ra and rj else "n/a"
            pa = f"{100 * ra / bound:.1f}%" if ra else "n/a"
            pj = f"{100 * rj / bound:.1f}%" if rj else "n/a"
            print(f"| {B:,} | {d} | {cell(ra)} | {cell(rj)} | {ratio} | {pa} | {pj} |")
    a = rows.get(("attnsvm", True, 10000, 10), {})
    j = rows.get(("jax", True, 10000, 10), {})
    print(f"\nsaturation (B = 10,000, d = 10, W0 x {args.sat_scale:g}, 100 steps): JAX gradient "
          f"exactly 0 in {100 * j.get('zero_grad', float('nan')):.1f}% of trials (NaN W in "
          f"{100 * j.get('nan', float('nan')):.1f}%); attnsvm: W moved in "
          f"{100 * a.get('moved', float('nan')):.1f}%, zero-gradient stops "
          f"{100 * a.get('zero_grad', float('nan')):.1f}%")


if __name__ == "__main__":
    main()
