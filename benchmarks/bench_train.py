"""Benchmark: one NGD training step of softmax attention, attnsvm against the peers a
competent user would write instead, near the machine's limits.

Setting (the papers' Monte-Carlo): W model, cross-attention, fixed linear head, logistic
loss, NGD (lr 0.1), random unit-sphere data with (n, T) = (6, 8); B trials of dimension d.
Contenders, measured in the same run, 3 rounds, throughput in trial-iterations per second:

  attnsvm          ``train(...)`` with the default engine ("auto": fused when numba is
                   installed), end to end (setup, two metric records, the steps);
  attnsvm-torch    ``train(..., engine="torch")``: the batched tensor program;
  torch-stable     a hand-written batched torch step (anchored closed-form gradient,
                   ~15 aten ops; no attnsvm code in the timed loop);
  torch-autograd   the naive batched step: softmax, autograd, NGD;
  numba-plain      a plain fused numba kernel (each trial's steps in one loop, natural
                   layout, anchored closed form, no scaled form, no stop checks).

A contender counts only if its gradient at a saturated point (a planted problem after 600
NGD steps) matches a 50-digit mpmath reference in direction (max |unit(G) - unit(G_ref)|
< 1e-10): naive autograd fails there (the softmax backward cancels). The same check after
3000 steps is printed too: there the plain float64 gradient has underflowed and only the
scaled form (attnsvm) keeps a direction. The machine's float64 peak (a large matmul) and memory bandwidth (a large copy)
are measured in the same run, and each contender's throughput is reported as a fraction
of both: flops of the step (4 n d^2 + 4 n T d + 5 d^2 per trial) and the bytes a batched
step must stream at least (X, z, scores, W read and written: 8 (n T d + n d + n T + 2 d^2)).

Then (``--extras``, on by default; ``--no-extras`` skips them), at 1 thread unless said:

  records          a default ``train()`` of 100 steps (``record_every`` None: the default
                   schedule, records inside the fused kernel) against the same run with two
                   records (0 and 100) and with a record every step: time ratios;
  threads          the fused engine's scaling: the same run on 1 and 2 kernel threads
                   (``attnsvm.kernel_threads``), wall and process CPU time, and the load
                   average around it (a shared machine: CPU time / wall says how much of the
                   second core the run got);
  jax              JAX ``jit(vmap(step))`` inside ``lax.fori_loop`` (float64, plain softmax
                   and autodiff, NGD, the same problem) against the fused engine, 1 thread
                   each (XLA's CPU threads limited by ``XLA_FLAGS`` before jax is imported),
                   cost per step = the difference of two run lengths in process CPU time
                   (set-up and compilation excluded), B in --jax-B, d in --d. Skipped without jax.

    python benchmarks/bench_train.py [--quick] [--B 1000 10000] [--d 10 32 64] [--rounds 3]
                                     [--no-extras] [--jax-B 1000 10000]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

try:
    from numba import njit
except ImportError:  # the numba peer is skipped
    njit = None

N_SEQ, T_TOK, LR = 6, 8, 0.1


# ------------------------------------------------------------------ the machine
def machine_peak(threads: int) -> tuple[float, float]:
    """(float64 GFLOP/s of a 2048^3 matmul, GB/s of a 256 MiB copy), best of 3 each."""
    torch.set_num_threads(threads)
    n = 2048
    A = torch.randn(n, n, dtype=torch.float64)
    Bm = torch.randn(n, n, dtype=torch.float64)
    C = torch.empty(n, n, dtype=torch.float64)
    torch.mm(A, Bm, out=C)
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        torch.mm(A, Bm, out=C)
        best = min(best, time.perf_counter() - t)
    flops = 2 * n ** 3 / best / 1e9
    a = np.ones(32 * 2 ** 20)  # 256 MiB
    b = np.empty_like(a)
    np.copyto(b, a)
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return flops, 2 * a.nbytes / best / 1e9


def step_flops(d: int) -> float:
    n, T = N_SEQ, T_TOK
    return 4 * n * d * d + 4 * n * T * d + 5 * d * d


def step_bytes(d: int) -> float:
    n, T = N_SEQ, T_TOK
    return 8 * (n * T * d + n * d + n * T + 2 * d * d)


# --------------------------------------------------------------------- the peers
def stable_grad(W, X, z, gam):
    """Hand-written batched gradient of L = mean_i log(1 + exp(-y_i f_i)), anchored:
    with k = argmax a, c_t = gamma_k - gamma_t, delta = sum s c, u = gamma_k - delta,
    dL/da_t = loss'(u) / n * s_t (delta - c_t) (no cancellation at the anchor)."""
    n = X.shape[1]
    wz = torch.bmm(z, W.transpose(1, 2))  # (B, n, d): W z_i
    a = (X * wz[:, :, None, :]).sum(-1)  # (B, n, T)
    k = a.argmax(-1, keepdim=True)
    s = torch.softmax(a, -1)
    gk = gam.gather(-1, k)
    c = gk - gam
    delta = (s * c).sum(-1, keepdim=True)
    lp = -torch.sigmoid(delta - gk) / n  # loss'(u) / n, u = gk - delta
    Ga = lp * s * (delta - c)
    GX = (Ga[..., None] * X).sum(2)  # (B, n, d)
    return torch.bmm(GX.transpose(1, 2), z)  # (B, d, d)


def stable_run(W, X, z, gam, steps):
    for _ in range(steps):
        G = stable_grad(W, X, z, gam)
        W = W - LR * G / G.norm(dim=(1, 2), keepdim=True)
    return W


def autograd_grad(W, X, z, y, v):
    """The naive batched step: forward with torch.softmax, torch.autograd backward."""
    W = W.detach().requires_grad_(True)
    with torch.enable_grad():
        wz = torch.bmm(z, W.transpose(1, 2))
        s = torch.softmax((X * wz[:, :, None, :]).sum(-1), -1)
        f = ((s[..., None] * X).sum(2) * v[:, None, :]).sum(-1)
        loss = F.softplus(-y * f).mean(1).sum()
        (g,) = torch.autograd.grad(loss, W)
    return g


def autograd_run(W, X, z, y, v, steps):
    for _ in range(steps):
        G = autograd_grad(W, X, z, y, v)
        W = W - LR * G / G.norm(dim=(1, 2), keepdim=True)
    return W


if njit is not None:
    @njit(nogil=True, cache=True, error_model="numpy")
    def _plain_grad(Wb, Xb, zb, gb, G, wz, a, s, GX):
        """One trial's gradient, plain loops in the arrays' own layout."""
        n, T, d = Xb.shape
        for j in range(d):
            for l in range(d):
                G[j, l] = 0.0
        for i in range(n):
            for j in range(d):
                acc = 0.0
                for l in range(d):
                    acc += Wb[j, l] * zb[i, l]
                wz[j] = acc
            k = 0
            for t in range(T):
                acc = 0.0
                for j in range(d):
                    acc += Xb[i, t, j] * wz[j]
                a[t] = acc
                if acc > a[k]:
                    k = t
            tot = 0.0
            for t in range(T):
                s[t] = math.exp(a[t] - a[k])
                tot += s[t]
            delta = 0.0
            for t in range(T):
                s[t] /= tot
                delta += s[t] * (gb[i, k] - gb[i, t])
            lp = -1.0 / (1.0 + math.exp(gb[i, k] - delta)) / n
            for j in range(d):
                GX[j] = 0.0
            for t in range(T):
                g = lp * s[t] * (delta - (gb[i, k] - gb[i, t]))
                for j in range(d):
                    GX[j] += g * Xb[i, t, j]
            for j in range(d):
                for l in range(d):
                    G[j, l] += GX[j] * zb[i, l]

    @njit(nogil=True, cache=True, error_model="numpy")
    def plain_kernel(W, X, z, gam, lr, steps, b0, b1):
        """NGD steps for trials b0 .. b1-1, each trial's loop with its data in cache."""
        d, T = X.shape[3], X.shape[2]
        G = np.empty((d, d))
        wz, a, s, GX = np.empty(d), np.empty(T), np.empty(T), np.empty(d)
        for b in range(b0, b1):
            for _ in range(steps):
                _plain_grad(W[b], X[b], z[b], gam[b], G, wz, a, s, GX)
                nrm = 0.0
                for j in range(d):
                    for l in range(d):
                        nrm += G[j, l] * G[j, l]
                f = lr / math.sqrt(nrm)
                for j in range(d):
                    for l in range(d):
                        W[b, j, l] -= f * G[j, l]

    @njit(nogil=True, cache=True, error_model="numpy")
    def plain_grad_batch(W, X, z, gam, out):
        d, T = X.shape[3], X.shape[2]
        wz, a, s, GX = np.empty(d), np.empty(T), np.empty(T), np.empty(d)
        for b in range(W.shape[0]):
            _plain_grad(W[b], X[b], z[b], gam[b], out[b], wz, a, s, GX)


def plain_run(W, X, z, gam, steps, threads, pool):
    B = W.shape[0]
    if threads == 1:
        plain_kernel(W, X, z, gam, LR, steps, 0, B)
        return W
    cuts = np.linspace(0, B, threads + 1).astype(int)
    futs = [pool.submit(plain_kernel, W, X, z, gam, LR, steps, int(cuts[i]), int(cuts[i + 1]))
            for i in range(threads)]
    for f in futs:
        f.result()
    return W


# ----------------------------------------------------- the 50-digit correctness check
def saturated_point(steps):
    """A planted problem (n, T, d) = (6, 8, 10) after `steps` NGD steps of lr 0.5 (the
    point itself need not be exact), its data, the gradient direction in mpmath at 50
    digits (the anchored identity c_t - f = (c_t - c_k) - sum s (c - c_k), so that no digit
    is lost where f and c_k agree) and the least attention 1 - p_max over sequences."""
    import mpmath as mp

    from attnsvm import data as D
    from attnsvm import models as M
    from attnsvm.optim import ngd
    from attnsvm.train import train

    dat = D.planted(n=N_SEQ, T=T_TOK, d=10, seed=3, score_gap=0.5)
    tr = train(M.WModel(10), dat, optimizer=ngd(0.5), steps=steps, seed=0, record_every=steps)
    W = tr.params["W"][0].numpy()
    mp.mp.dps = 50
    X, z, y, v = dat.X, dat.z, dat.y, dat.v
    n, T, d = X.shape
    G = [[mp.mpf(0)] * d for _ in range(d)]
    one_minus_p = 1.0
    for i in range(n):
        wz = [mp.fsum(mp.mpf(W[j, l]) * mp.mpf(z[i, l]) for l in range(d)) for j in range(d)]
        a = [mp.fsum(mp.mpf(X[i, t, j]) * wz[j] for j in range(d)) for t in range(T)]
        mx = max(a)
        k = a.index(mx)
        e = [mp.exp(at - mx) for at in a]
        s = [et / mp.fsum(e) for et in e]
        one_minus_p = min(one_minus_p, float(mp.fsum(s[u] for u in range(T) if u != k)))
        c = [mp.mpf(y[i]) * mp.fsum(mp.mpf(v[j]) * mp.mpf(X[i, t, j]) for j in range(d))
             for t in range(T)]
        dev = mp.fsum(s[u] * (c[u] - c[k]) for u in range(T))
        lp = -1 / (1 + mp.exp(c[k] + dev)) / n
        for t in range(T):
            ga = lp * s[t] * ((c[t] - c[k]) - dev)
            for j in range(d):
                for l in range(d):
                    G[j][l] += ga * mp.mpf(X[i, t, j]) * mp.mpf(z[i, l])
    nrm = mp.sqrt(mp.fsum(G[j][l] ** 2 for j in range(d) for l in range(d)))
    ref = np.array([[float(G[j][l] / nrm) for l in range(d)] for j in range(d)])
    return dat, W, ref, one_minus_p


def direction_error(G, ref):
    G = np.asarray(G, dtype=np.float64)
    nrm = np.linalg.norm(G)
    if not np.isfinite(nrm) or nrm == 0:
        return math.inf
    return float(np.abs(G / nrm - ref).max())


def check_peers(has_numba, steps):
    """{contender: direction error at the point after `steps` steps}, 1 - p_max."""
    from attnsvm import fused
    from attnsvm import models as M
    from attnsvm.losses import logistic
    from attnsvm.optim import ngd

    dat, W, ref, one_minus_p = saturated_point(steps)
    model = M.WModel(10)
    td = M.prepare(dat)
    Wt = torch.as_tensor(W)[None]
    ev = model.evaluate({"W": Wt}, td)
    errs = {"attnsvm-torch": direction_error(ev.grads.tensors["W"][0], ref)}
    if fused.available():
        plan = fused.Plan(model, td, logistic, ngd(0.1), 1, 1, check_stall=True)
        errs["attnsvm"] = direction_error(plan.evaluate({"W": Wt}, False).grads.tensors["W"][0], ref)
    else:
        errs["attnsvm"] = errs["attnsvm-torch"]
    X, z = td["X"], td["z"]
    gam = dat.y[:, None] * (dat.X @ dat.v)
    gam_t = torch.as_tensor(gam)[None]
    errs["torch-stable"] = direction_error(stable_grad(Wt, X, z, gam_t)[0], ref)
    errs["torch-autograd"] = direction_error(
        autograd_grad(Wt, X, z, td["y"], td["v"].expand(1, -1))[0], ref)
    if has_numba:
        out = np.empty((1, 10, 10))
        plain_grad_batch(W[None].copy(), dat.X[None], dat.z[None], gam[None], out)
        errs["numba-plain"] = direction_error(out[0], ref)
    return errs, one_minus_p


# ---------------------------------------------------------------------- the timing
def make_problem(B, d, seed=0):
    from attnsvm import data as D

    dat = D.random_sphere(n=N_SEQ, T=T_TOK, d=d, seed=seed, batch=B)
    gam = dat.y[..., None] * np.einsum("bntd,bd->bnt", dat.X, dat.v)
    return dat, gam


def run_contender(name, dat, gam, W0, steps, threads, pool):
    """Seconds for `steps` NGD steps of every trial (attnsvm: the whole train call)."""
    from attnsvm import models as M
    from attnsvm.optim import ngd
    from attnsvm.train import train

    d = W0.shape[1]
    if name.startswith("attnsvm"):
        eng = "torch" if name == "attnsvm-torch" else "auto"
        t = time.perf_counter()
        tr = train(M.WModel(d), dat, optimizer=ngd(LR), steps=steps, init={"W": W0},
                   record_every=steps, engine=eng)
        dt = time.perf_counter() - t
        return dt, tr.extra.get("engine")
    X = torch.as_tensor(dat.X)
    z = torch.as_tensor(dat.z)
    W = torch.as_tensor(W0).clone()
    if name == "torch-stable":
        g = torch.as_tensor(gam)
        t = time.perf_counter()
        stable_run(W, X, z, g, steps)
        return time.perf_counter() - t, None
    if name == "torch-autograd":
        y, v = torch.as_tensor(dat.y), torch.as_tensor(dat.v)
        t = time.perf_counter()
        autograd_run(W, X, z, y, v, steps)
        return time.perf_counter() - t, None
    Wn = np.ascontiguousarray(W0)
    t = time.perf_counter()
    plain_run(Wn, dat.X, dat.z, np.ascontiguousarray(gam), steps, threads, pool)
    return time.perf_counter() - t, None


# ------------------------------------------------------------------------ extras
def _timed(fn):
    """(wall seconds, process CPU seconds) of fn()."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _fused_train(dat, W0, steps, record_every, threads=1):
    from attnsvm import kernel_threads
    from attnsvm import models as M
    from attnsvm.optim import ngd
    from attnsvm.train import train

    with kernel_threads(threads):
        return train(M.WModel(W0.shape[1]), dat, optimizer=ngd(LR), steps=steps,
                     init={"W": W0}, record_every=record_every)


def bench_records(B, d, rounds):
    """A default train() of 100 steps against two records and a record every step."""
    dat, _ = make_problem(B, d)
    W0 = 0.1 * np.random.default_rng(1).standard_normal((B, d, d)) / d
    _fused_train(dat, W0, 2, None)  # warm-up (compiled kernels from the disk cache)
    cases = {"default": None, "two records": 100, "every step": 1}
    times = {k: [] for k in cases}
    walls = {k: [] for k in cases}
    for _ in range(rounds):
        for k, ev in cases.items():
            w, c = _timed(lambda ev=ev: _fused_train(dat, W0, 100, ev))
            times[k].append(c)
            walls[k].append(w)
    med = {k: statistics.median(v) for k, v in times.items()}
    tr = _fused_train(dat, W0, 100, None)
    print(f"\nrecords, B = {B}, d = {d}, 100 NGD steps, fused, 1 thread, process CPU time "
          f"({len(tr.record_steps)} default records, {tr.extra.get('records')}):")
    for k in cases:
        print(f"  {k:<12s} {med[k]:7.3f} s CPU ({med[k] / med['two records']:.2f}x two records; "
              f"rounds {', '.join(f'{x:.3f}' for x in times[k])}; wall "
              f"{', '.join(f'{x:.3f}' for x in walls[k])})")
    r = med["default"] / med["two records"]
    print(f"  default / two records: {r:.2f}x CPU time [{'met' if r <= 1.3 else 'MISSED'}: <= 1.3x]")
    return r


def bench_threads(B, d, steps, rounds):
    """The fused engine on 1 and 2 kernel threads: wall, CPU time, load."""
    dat, _ = make_problem(B, d)
    W0 = 0.1 * np.random.default_rng(1).standard_normal((B, d, d)) / d
    _fused_train(dat, W0, 2, 2, threads=2)
    res = {1: [], 2: []}
    load0 = os.getloadavg()[0]
    for _ in range(rounds):
        for nt in (1, 2):
            res[nt].append(_timed(lambda nt=nt: _fused_train(dat, W0, steps, steps, nt)))
    load1 = os.getloadavg()[0]
    w = {nt: statistics.median(x[0] for x in v) for nt, v in res.items()}
    c = {nt: statistics.median(x[1] for x in v) for nt, v in res.items()}
    sp = w[1] / w[2]
    print(f"\nthreads, B = {B}, d = {d}, {steps} NGD steps, fused, two records "
          f"(load average {load0:.2f} before, {load1:.2f} after; {os.cpu_count()} CPUs):")
    for nt in (1, 2):
        print(f"  {nt} thread(s): wall {w[nt]:.3f} s, CPU {c[nt]:.3f} s "
              f"({c[nt] / w[nt]:.2f} cores busy), {B * steps / w[nt] / 1e6:.3f} M trial-steps/s "
              f"[rounds {', '.join(f'{x[0]:.3f}' for x in res[nt])}]")
    print(f"  2 threads / 1 thread: {sp:.2f}x wall (target >= 1.7x on an idle machine; "
          f"{'both cores were ours' if c[2] / w[2] >= 1.8 else 'NOT idle: the second core was shared'}; "
          f"judged by the cores the 2-thread run got, since the load average counts this "
          f"benchmark's own earlier sections)")
    return sp


def _jax_runner(d):
    """The peer (benchmarks/jax_peer.py): its jitted run and jax.numpy."""
    import jax.numpy as jnp

    from jax_peer import jax_program

    return jax_program(LR)[0], jnp


def bench_jax(Bs, ds, rounds):
    """Fused (two records) against JAX jit(vmap(step)) in fori_loop, 1 thread each."""
    if "jax" not in __import__("sys").modules:  # XLA's CPU threads: one (before import)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false"
                                   " intra_op_parallelism_threads=1").strip()
    try:
        import jax  # noqa: F401
    except ImportError:
        print("\njax: not installed (skipped)")
        return []
    print(f"\nJAX {jax.__version__} (jit(vmap(step)) in lax.fori_loop, float64) against the "
          "fused engine, 1 thread each; cost per step = difference of two run lengths")
    out = []
    for d in ds:
        run, jnp = _jax_runner(d)
        for B in Bs:
            dat, _ = make_problem(B, d)
            W0 = 0.1 * np.random.default_rng(1).standard_normal((B, d, d)) / d
            args = [jnp.asarray(a) for a in (dat.X, dat.z, dat.y.astype(np.float64), dat.v)]
            Wj = jnp.asarray(W0)
            run(Wj, *args, 1).block_until_ready()  # compile
            s1 = max(10, int(2e6 / (B * d * d / 10)))  # ~1-2 s at the slower contender
            s1 = min(s1, 2000)

            def jx(n, run=run, Wj=Wj, args=args):
                return _timed(lambda: run(Wj, *args, n).block_until_ready())

            def fu(n, dat=dat, W0=W0):
                return _timed(lambda: _fused_train(dat, W0, n, n))

            fu(2)
            rj, rf = [], []
            for _ in range(rounds):
                a1, a2 = jx(s1), jx(2 * s1)
                b1, b2 = fu(s1), fu(2 * s1)
                rj.append(B * s1 / max(a2[1] - a1[1], 1e-9))  # CPU time: a shared machine
                rf.append(B * s1 / max(b2[1] - b1[1], 1e-9))
            mj, mf = statistics.median(rj), statistics.median(rf)
            print(f"  B = {B:>6d}, d = {d:>3d}: fused {mf / 1e6:.3f} M/s, jax {mj / 1e6:.3f} M/s, "
                  f"fused / jax {mf / mj:.2f}x [{'met' if mf >= mj else 'MISSED'}: >= 1x] "
                  f"(rounds fused {', '.join(f'{x / 1e6:.3f}' for x in rf)}; "
                  f"jax {', '.join(f'{x / 1e6:.3f}' for x in rj)}; {s1} and {2 * s1} steps)")
            out.append((B, d, mf / mj))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B=200, d=10, 1 round (a smoke test)")
    ap.add_argument("--B", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--d", type=int, nargs="+", default=[10, 32, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0,
                    help="target seconds per contender and round (steps are sized to it)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for every contender and the peak (default 1: on this shared "
                         "2-core machine two torch threads ran up to 7x slower under load)")
    ap.add_argument("--no-extras", dest="extras", action="store_false",
                    help="skip the records, thread-scaling and JAX comparisons")
    ap.add_argument("--extras-only", action="store_true",
                    help="only the records, thread-scaling and JAX comparisons")
    ap.add_argument("--jax-B", type=int, nargs="+", default=[1000, 10000])
    args = ap.parse_args(argv)
    if args.quick:
        args.B, args.d, args.rounds, args.seconds = [200], [10], 1, 0.3
        args.jax_B = [200]
    if args.extras_only:
        torch.set_num_threads(1)
        return extras(args)
    torch.set_num_threads(args.threads)
    pool = ThreadPoolExecutor(args.threads) if args.threads > 1 else None
    has_numba = njit is not None

    peak, bw = machine_peak(args.threads)
    print(f"machine ({args.threads} thread(s)): float64 matmul {peak:.1f} GFLOP/s, "
          f"copy {bw:.1f} GB/s")
    errs, omp = check_peers(has_numba, 600)
    deep, omp_deep = check_peers(has_numba, 3000)
    print("gradient direction against a 50-digit mpmath reference, max |unit(G) - unit(G_ref)|, "
          "planted (6, 8, 10) after NGD (lr 0.5):")
    print(f"  {'':<16s} {'600 steps':>10s} {'3000 steps':>11s}   (least 1 - p_max: {omp:.1e}, "
          f"{omp_deep:.1e})")
    valid = {}
    for k, e in errs.items():
        valid[k] = e < 1e-10
        print(f"  {k:<16s} {e:10.2e} {deep[k]:11.2e}   "
              f"{'counts' if valid[k] else 'WRONG at 600 steps: not counted'}"
              f"{'' if deep[k] < 1e-10 else '; at 3000 steps its gradient is wrong or 0'}")

    names = ["attnsvm", "attnsvm-torch", "torch-stable", "torch-autograd"]
    if has_numba:
        names.append("numba-plain")
    print(f"\nNGD step, (n, T) = ({N_SEQ}, {T_TOK}), W model, logistic; trial-iterations/s "
          f"(median of {args.rounds} rounds); % of peak flops / of bandwidth")
    summary = []
    for B in args.B:
        for d in args.d:
            dat, gam = make_problem(B, d)
            W0 = 0.1 * np.random.default_rng(1).standard_normal((B, d, d)) / d
            # size each contender's step count from the marginal cost of a step, so that the
            # steps take >= `seconds` and >= 4x the fixed cost of a call (attnsvm's setup and
            # two metric records), which is still counted
            steps = {}
            for nm in names:
                run_contender(nm, dat, gam, W0, 1, args.threads, pool)  # warm up (JIT caches)
                t2, _ = run_contender(nm, dat, gam, W0, 2, args.threads, pool)
                extra = 4  # double the extra steps until they take >= 0.3 s (noise)
                while True:
                    tx, _ = run_contender(nm, dat, gam, W0, 2 + extra, args.threads, pool)
                    if tx - t2 >= 0.3 or extra >= 4096:
                        break
                    extra *= 2
                per = max((tx - t2) / extra, 1e-9)
                fixed = max(t2 - 2 * per, 0.0)
                steps[nm] = int(min(20000, max(3, args.seconds / per, 4 * fixed / per)))
            rates = {nm: [] for nm in names}
            engine = None
            for _ in range(args.rounds):
                for nm in names:
                    dt, eng = run_contender(nm, dat, gam, W0, steps[nm], args.threads, pool)
                    engine = eng if nm == "attnsvm" else engine
                    rates[nm].append(B * steps[nm] / dt)
            med = {nm: statistics.median(r) for nm, r in rates.items()}
            print(f"\nB = {B}, d = {d}  (attnsvm engine: {engine})")
            for nm in names:
                r = med[nm]
                fl = 100 * r * step_flops(d) / (peak * 1e9)
                by = 100 * r * step_bytes(d) / (bw * 1e9)
                tag = "" if valid[nm] else "   (wrong gradient: not counted)"
                print(f"  {nm:<16s} {r / 1e6:9.4f} M/s  {fl:6.2f}% peak  {by:7.1f}% bw  "
                      f"[{steps[nm]} steps, rounds {', '.join(f'{x / 1e6:.3f}' for x in rates[nm])}]{tag}")
            ratio_st = [a / b for a, b in zip(rates["attnsvm"], rates["torch-stable"])]
            line = (f"  attnsvm / torch-stable: {statistics.median(ratio_st):.1f}x "
                    f"(per round {', '.join(f'{x:.1f}' for x in ratio_st)}; target >= 2)")
            row = {"B": B, "d": d, "vs_stable": statistics.median(ratio_st)}
            if has_numba:
                ratio_nb = [a / b for a, b in zip(rates["attnsvm"], rates["numba-plain"])]
                line += (f"\n  attnsvm / numba-plain:  {statistics.median(ratio_nb):.2f}x "
                         f"(per round {', '.join(f'{x:.2f}' for x in ratio_nb)}; target >= 0.5)")
                row["vs_numba"] = statistics.median(ratio_nb)
            print(line)
            summary.append(row)
    print("\nsummary (median ratios):")
    for row in summary:
        s = f"  B={row['B']:>6d} d={row['d']:>3d}: vs torch-stable {row['vs_stable']:6.1f}x " \
            f"[{'met' if row['vs_stable'] >= 2 else 'MISSED'}]"
        if "vs_numba" in row:
            s += f", vs numba-plain {row['vs_numba']:.2f}x " \
                 f"[{'met' if row['vs_numba'] >= 0.5 else 'MISSED'}]"
        print(s)
    if args.extras:
        extras(args)
    return 0


def extras(args) -> int:
    """The records ratio, the thread scaling and the JAX comparison (module docstring)."""
    Bx = 200 if args.quick else 10000
    bench_records(Bx, 10, args.rounds)
    bench_threads(Bx, 10, 20 if args.quick else 200, args.rounds)
    bench_jax(args.jax_B, [d for d in args.d if d <= 32] or [10], args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
