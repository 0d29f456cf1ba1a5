"""Benchmark: Frobenius / nuclear ATT-SVM, naive cvxpy build vs attnsvm's solvers.

    python benchmarks/bench_svm.py [--quick] [--no-nuc] [--nuc-only] [--nuc-scs]
                                   [--no-norms] [--norms-only] [--no-peers] [--peers-only]
                                   [--prompt-only] [--rounds R]

Random feasible (planted) instances: z_i random unit vectors, tokens Gaussian, alpha_i =
argmax_t x_it^T W* z_i for a random W* (so W* separates, the SVM is feasible).
(a) naive: a Python loop adding one scalar cvxpy constraint per token, default solver
    (as in the papers' notebooks); skipped above (100, 16, 32).
(b) attnsvm.svm.att_svm (fast path).  Prints time ratio, agreement, peak memory.
Then: batched prompt SVMs (mmts-fig9 shape), the nuclear norm, and every norm of
attnsvm.norms (single solve vs the naive loop build; batched B problems vs one by one),
and the peers (:func:`peers_bench`): daqp, quadprog, scikit-learn LinearSVC, cvxpy+SCS,
each skipped with a note when not installed.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc
import warnings

import numpy as np


def planted(n, T, d, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    Ws = rng.standard_normal((d, d))
    alpha = np.argmax(((X @ Ws) * z[:, None, :]).sum(-1), axis=1)
    return X, z, alpha


def naive(X, z, alpha, norm="fro"):
    import cvxpy as cp

    from attnsvm.norms import get_norm

    n, T, d = X.shape
    W = cp.Variable((d, d))
    cons = []
    for i in range(n):
        for t in range(T):
            if t != alpha[i]:
                cons.append((X[i, alpha[i]] - X[i, t]) @ W @ z[i] >= 1)
    prob = cp.Problem(cp.Minimize(get_norm(norm).cvxpy(W)), cons)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prob.solve()
    return W.value, prob.solver_stats.solver_name


def feasible_norm(X, z, alpha, W, norm):
    """||W|| / min(1, min margin): the norm of W rescaled to be exactly feasible."""
    from attnsvm.norms import get_norm

    n, T, d = X.shape
    D = X[np.arange(n), alpha][:, None, :] - X
    m = ((D @ W) * z[:, None, :]).sum(-1)
    m[np.arange(n), alpha] = np.inf
    mm = m.min()
    nrm = float(get_norm(norm).value(W))
    return nrm / min(1.0, mm), max(0.0, 1 - mm)


def batch_bench(B):
    """Many small prompt SVMs (mmts-fig9 shape: n=6, T=8): batched vs one by one."""
    from attnsvm.svm import prompt_svm, prompt_svm_batch

    print(f"\nbatched prompt SVMs, B={B}, n=6, T=8 (random alpha; infeasible ones flagged)")
    rng = np.random.default_rng(0)
    for d in (2, 5, 10, 20):
        X = rng.standard_normal((B, 6, 8, d))
        alpha = rng.integers(0, 8, (B, 6))
        t0 = time.perf_counter()
        bs = prompt_svm_batch(X, None, alpha)
        t_b = time.perf_counter() - t0
        k = 30
        t0 = time.perf_counter()
        agree = 0
        for b in range(k):
            s = prompt_svm(X[b], None, alpha[b])
            agree += s.feasible_ == bs.feasible_[b] and (
                not s.feasible_ or np.allclose(s.W_, bs.W_[b], rtol=1e-7, atol=1e-10))
        t_1 = (time.perf_counter() - t0) / k
        print(f"  d={d:>2}: batched {1e3 * t_b / B:.3f} ms/problem, one-by-one {1e3 * t_1:.2f} "
              f"ms/problem, feasible {int(bs.feasible_.sum())}/{B}, fallbacks "
              f"{bs.extra['n_fallback']}, agree {agree}/{k}", flush=True)


def limit_blas(n: int) -> None:
    """Every BLAS this run uses on ``n`` threads. threadpoolctl reaches only the libraries
    loaded when it is called, so they are loaded first: ``scipy.linalg`` brings scipy's own
    OpenBLAS (numpy's is another copy), the peers theirs. Without that, scipy's Cholesky in
    the nuclear SDP kept 2 threads and, on the loaded 2-core machine, took 0.64 s of CPU per
    nuclear (20, 8, 10) solve instead of 0.03 s (2026-11-28)."""
    import importlib

    for mod in ("scipy.linalg", "cvxpy", "daqp", "quadprog", "sklearn.svm", "torch"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
    from threadpoolctl import threadpool_limits

    threadpool_limits(n, user_api="blas")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--no-nuc", action="store_true")
    ap.add_argument("--nuc-only", action="store_true", help="only the nuclear-norm comparison")
    ap.add_argument("--nuc-scs", action="store_true",
                    help="also time the previous cvxpy+SCS nuclear working set")
    ap.add_argument("--nuclear-fallback", action="store_true",
                    help="only the nuclear working-set fallback on a recorded study-heads "
                         "problem (add --nuc-scs for the previous SCS inner solver: ~40 min)")
    ap.add_argument("--no-norms", action="store_true", help="skip the every-norm section")
    ap.add_argument("--norms-only", action="store_true", help="only the every-norm section")
    ap.add_argument("--no-peers", action="store_true",
                    help="skip attnsvm vs daqp / quadprog / LinearSVC / cvxpy+SCS")
    ap.add_argument("--peers-only", action="store_true", help="only the peers section")
    ap.add_argument("--prompt-only", action="store_true",
                    help="only the batched prompt SVMs vs the daqp / quadprog loops")
    ap.add_argument("--rounds", type=int, default=3, help="peers, nuclear: rounds (median)")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="BLAS threads for every path (default 1, as the solvers ran inside "
                         "the library before they stopped setting it; 0: leave as is)")
    args = ap.parse_args(argv)
    if args.blas_threads:  # the benchmark's own process-wide choice, every path alike
        limit_blas(args.blas_threads)
    from attnsvm.svm import att_svm, lean

    lean.warmup()  # numba's compile / cache load: set-up, not timed
    if args.peers_only or args.prompt_only:
        peers_bench(args.quick, args.rounds, prompt_only=args.prompt_only)
        return

    if args.norms_only:
        norms_bench(*((10, 5, 4, 8) if args.quick else (20, 8, 10, 50)))
        return
    if args.nuclear_fallback:
        nuclear_fallback_bench(args.rounds, args.nuc_scs)
        return
    if args.nuc_only:
        nuclear_bench(*((20, 8, 10) if args.quick else (100, 16, 32)), args.nuc_scs,
                      args.rounds)
        return
    sizes = [(20, 8, 10), (50, 10, 20), (100, 16, 32), (400, 32, 32), (1000, 64, 32)]
    if args.quick:
        sizes = sizes[:2]
    print(f"{'(n,T,d)':>15} {'N':>6} {'naive s':>9} {'fast s':>8} {'ratio':>8} "
          f"{'rel.diff W':>10} {'norm naive':>11} {'norm fast':>10} {'viol naive':>10} "
          f"{'gap fast':>9} {'peak MiB':>9}")
    for n, T, d in sizes:
        X, z, alpha = planted(n, T, d)
        N = n * (T - 1)
        t0 = time.perf_counter()
        sol = att_svm(X, z, alpha)
        t_fast = time.perf_counter() - t0
        tracemalloc.start()  # second, traced run for the peak memory (tracing slows it)
        att_svm(X, z, alpha)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        t_naive = ratio = diff = nn = vn = float("nan")
        if (n, T, d) <= (100, 16, 32):
            t0 = time.perf_counter()
            Wn, _ = naive(X, z, alpha)
            t_naive = time.perf_counter() - t0
            ratio = t_naive / t_fast
            diff = np.linalg.norm(Wn - sol.W_) / np.linalg.norm(sol.W_)
            nn, vn = feasible_norm(X, z, alpha, Wn, "fro")
        print(f"{str((n, T, d)):>15} {N:>6} {t_naive:>9.2f} {t_fast:>8.3f} {ratio:>8.1f} "
              f"{diff:>10.1e} {nn:>11.8f} {sol.norm_:>10.8f} {vn:>10.1e} {sol.gap_:>9.1e} "
              f"{peak:>9.1f}", flush=True)
    print(f"max RSS of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")
    batch_bench(1000 if args.quick else 7000)
    if not args.no_nuc:
        n, T, d = (20, 8, 10) if args.quick else (100, 16, 32)
        nuclear_bench(n, T, d, args.nuc_scs, args.rounds)
    if not args.no_norms:
        norms_bench(*((10, 5, 4, 8) if args.quick else (20, 8, 10, 50)))
    if not args.no_peers:
        peers_bench(args.quick, args.rounds)


def norms_bench(n, T, d, B):
    """Every norm at (n, T, d): the naive loop build (cvxpy, the norm's expression, default
    solver) vs att_svm (certified), and B problems by att_svm_batch vs one by one."""
    from attnsvm.svm import att_svm, att_svm_batch

    naive(*planted(4, 3, 3, seed=1), "linf")  # imports and set-up not timed
    print(f"\nevery norm at {(n, T, d)} ({n * (T - 1)} constraints); batches of B={B}")
    print(f"  {'norm':<9} {'naive s':>8} {'attnsvm s':>10} {'ratio':>6} {'status':>19} "
          f"{'gap':>8} {'rel.diff value':>15} {'batch ms/pb':>12} {'1-by-1 ms/pb':>13}")
    X, z, alpha = planted(n, T, d)
    rng = np.random.default_rng(1)
    Xb = rng.standard_normal((B, n, T, d))
    zb = rng.standard_normal((B, n, d))
    Wb = rng.standard_normal((B, d, d))
    ab = np.argmax(((Xb @ Wb[:, None]) * zb[:, :, None, :]).sum(-1), axis=-1)
    for norm in ("fro", "nuc", "spectral", "l1", "linf", "l1.5", "l3"):
        t0 = time.perf_counter()
        Wn, _ = naive(X, z, alpha, norm)
        t_naive = time.perf_counter() - t0
        t0 = time.perf_counter()
        sol = att_svm(X, z, alpha, norm=norm)
        t_fast = time.perf_counter() - t0
        nn, _ = feasible_norm(X, z, alpha, Wn, norm)
        t0 = time.perf_counter()
        bs = att_svm_batch(Xb, zb, ab, norm=norm)
        t_b = time.perf_counter() - t0
        k = min(B, 10)
        t0 = time.perf_counter()
        for b in range(k):
            att_svm(Xb[b], zb[b], ab[b], norm=norm)
        t_1 = (time.perf_counter() - t0) / k
        print(f"  {norm:<9} {t_naive:>8.2f} {t_fast:>10.3f} {t_naive / t_fast:>6.1f} "
              f"{sol.status_:>19} {sol.gap_:>8.1e} {abs(nn - sol.norm_) / sol.norm_:>15.1e} "
              f"{1e3 * t_b / B:>12.2f} {1e3 * t_1:>13.2f}   (batch: "
              f"{int((bs.status_ == 'optimal').sum())}/{B} optimal, max gap "
              f"{np.nanmax(bs.gap_):.1e})", flush=True)


def nuclear_bench(n, T, d, with_scs_ws=False, rounds=3):
    """Nuclear-norm ATT-SVM: naive cvxpy build (default solver: SCS) vs attnsvm's default
    (primal-dual SDP IPM on a growing working set) and its dual barrier (solver="barrier");
    optionally also the cvxpy/SCS working set.  Median of ``rounds`` runs each, all in
    this process (ratio = naive time / method time)."""
    import cvxpy  # noqa: F401  (imports and first-call set-up are not timed, for both sides)

    from attnsvm.svm import att_svm

    att_svm(*planted(5, 4, 4, seed=1), norm="nuc")
    att_svm(*planted(5, 4, 4, seed=1), norm="nuc", solver="barrier")
    naive(*planted(5, 4, 4, seed=1), "nuc")
    X, z, alpha = planted(n, T, d)
    t_fast, sol = _median_time(lambda: att_svm(X, z, alpha, norm="nuc"), rounds)
    t_bar, bar = _median_time(lambda: att_svm(X, z, alpha, norm="nuc", solver="barrier"), rounds)
    t_naive, (Wn, name) = _median_time(lambda: naive(X, z, alpha, "nuc"), rounds)
    nn, vn = feasible_norm(X, z, alpha, Wn, "nuc")
    lb = sol.norm_ / (1 + sol.gap_)  # certified lower bound on the optimal nuclear norm
    print(f"\nnuclear norm at {(n, T, d)} ({n * (T - 1)} constraints), median of {rounds}")
    print(f"  {'method':<34} {'time s':>8} {'ratio':>7} {'violation':>10} {'feasible ||W||_*':>18} "
          f"{'rel. excess over lb':>20}")
    print(f"  {'naive cvxpy (' + name + ')':<34} {t_naive:>8.3f} {1.0:>7.1f} {vn:>10.1e} {nn:>18.10f} "
          f"{(nn - lb) / lb:>20.1e}")
    rows = [("attnsvm (" + bar.solver_ + ")", t_bar, bar)]
    if with_scs_ws:
        t_old, old = _median_time(
            lambda: att_svm(X, z, alpha, norm="nuc", solver="working_set"), rounds)
        rows.append(("attnsvm cvxpy+SCS working set", t_old, old))
    rows.append(("attnsvm (" + sol.solver_ + ")", t_fast, sol))
    for label, t, s in rows:
        print(f"  {label:<34} {t:>8.3f} {t_naive / t:>7.1f} {s.violation_:>10.1e} {s.norm_:>18.10f} "
              f"{(s.norm_ - lb) / lb:>20.1e}")
    print(f"  attnsvm certificate: min margin {sol.margin_:.12f}, relative duality gap "
          f"{sol.gap_:.1e}, kkt {sol.kkt_residual_:.1e}, rank {sol.rank(1e-6)}, "
          f"ratio {t_naive / t_fast:.1f}x (barrier: gap {bar.gap_:.1e}, {t_naive / t_bar:.1f}x)")

def nuclear_fallback_bench(rounds=3, with_scs=False):
    """The nuclear working-set fallback (``solver="working_set"``: cvxpy + Clarabel on a
    working set, the step after the IPM in the nuclear chain) on a problem that reaches it:
    a head of
    ``attnsvm study-heads --full`` (GPT-2, seed 0, AdamW) on its probe batch, X (512, 8, 8),
    z (512, 9), 1,792 constraints (``benchmarks/data/nuc_fallback_gpt2.npz``, the inputs
    of the recorded att_svm call), where the SDP IPM gives no answer.  Against cvxpy +
    Clarabel on the whole problem (the strongest peer a user would pick) and, with
    ``with_scs``, the previous inner solver (SCS, eps 1e-9: tens of thousands of
    iterations).  CPU time, median of ``rounds``; quality as the excess of each answer's
    feasible nuclear norm ||W||_* / min(1, min margin) over attnsvm's certified lower
    bound."""
    from pathlib import Path

    from attnsvm.norms import NUC
    from attnsvm.svm import att_svm
    from attnsvm.svm.conic import solve_cvxpy
    from attnsvm.svm.nuclear import conic_working_set
    from attnsvm.svm.problems import _constraints

    f = np.load(Path(__file__).with_name("data") / "nuc_fallback_gpt2.npz")
    X, z, alpha, mask = f["X"], f["z"], f["alpha"], f["mask"]
    cs = _constraints(X, z, alpha, mask)

    def cpu(fn, k):
        return _median_time(fn, k, clock=time.process_time)

    def excess(W, lb):
        m = cs.margins(W)[cs.valid].min()
        nn = np.linalg.svd(W, compute_uv=False).sum() / min(1.0, m)
        return m, nn, (nn - lb) / lb

    att_svm(X, z, alpha, norm="nuc", mask=mask, solver="working_set")  # imports, set-up
    t_ws, sol = cpu(lambda: att_svm(X, z, alpha, norm="nuc", mask=mask, solver="working_set"),
                    rounds)
    lb = sol.norm_ / (1 + sol.gap_)
    t_cl, (Wc, *_rest) = cpu(lambda: solve_cvxpy(cs, NUC, "CLARABEL"), rounds)
    print(f"\nnuclear working-set fallback on a study-heads head (512, 8, 8), "
          f"{cs.n_constraints} constraints, CPU s, median of {rounds}")
    print(f"  {'method':<46} {'CPU s':>8} {'min margin':>14} {'feasible ||W||_*':>18} "
          f"{'rel. excess over lb':>20}")
    rows = [("cvxpy + Clarabel, whole problem", t_cl, Wc)]
    if with_scs:
        t_scs, (Ws, *_rest) = cpu(lambda: conic_working_set(cs, solver="SCS"), 1)
        rows.append(("working set, SCS (previous)", t_scs, Ws))
    rows.append((f"attnsvm ({sol.solver_})", t_ws, np.asarray(sol.W_)))
    t_def, dft = cpu(lambda: att_svm(X, z, alpha, norm="nuc", mask=mask), 1)
    rows.append((f"attnsvm default chain ({dft.solver_})", t_def, np.asarray(dft.W_)))
    for label, t, W in rows:
        m, nn, ex = excess(W, lb)
        print(f"  {label:<46} {t:>8.2f} {m:>14.10f} {nn:>18.10f} {ex:>20.1e}")
    print(f"  attnsvm certificate: {sol.status_}, relative duality gap {sol.gap_:.1e}; "
          f"ratio to the whole-problem Clarabel {t_cl / t_ws:.2f}x")


# ------------------------------------------------------------------------ peers
PEER_SIZES = [(20, 8, 10), (100, 16, 32), (400, 16, 32), (1000, 64, 32)]
PEER_MAX_ENTRIES = 7e7  # dense constraint matrices above N * d e entries are not built
# per peer, above these N * d e the run is skipped (minutes per solve on 2 cores)
PEER_LIMIT = {"daqp": 7e7, "quadprog": 1e7, "LinearSVC": 1e7}


def _peer_available(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        print(f"  note: {mod} is not installed (pip install attnsvm[bench]): skipped")
        return False


def _median_time(fn, rounds, clock=time.perf_counter):
    """(median over ``rounds`` calls of fn's time on ``clock``, fn's last result)."""
    ts, out = [], None
    for _ in range(rounds):
        t0 = clock()
        out = fn()
        ts.append(clock() - t0)
    return float(np.median(ts)), out


def _on_one_thread(fn):
    """fn() with the batch kernels on one thread (torch.set_num_threads(1), which
    :func:`attnsvm._parallel.thread_pool` reads), the thread count restored afterwards."""
    import torch

    nt = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        return fn()
    finally:
        torch.set_num_threads(nt)


def _interleaved(fns, rounds):
    """Median time of each fn in ``fns`` (name -> fn) over ``rounds`` rounds, the fns run
    one after the other within each round; returns (times, last results) by name."""
    ts = {k: [] for k in fns}
    out = {}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            out[k] = fn()
            ts[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in ts.items()}, out


def _dense_rows(X, z, alpha):
    """M (N, d e): row k = vec(Delta_k z_k^T) (C order), the constraints M vec(W) >= 1."""
    n, T, d = X.shape
    keep = np.ones((n, T), bool)
    keep[np.arange(n), alpha] = False
    D = (X[np.arange(n), alpha][:, None, :] - X)[keep]
    Zk = np.repeat(z, T, axis=0)[keep.reshape(-1)]
    return np.einsum("kd,ke->kde", D, Zk).reshape(len(D), -1)


def _peer_qp(name, M):
    """min 1/2 ||w||^2 s.t. M w >= 1 by a dense QP peer; returns w or None (infeasible /
    failed)."""
    m = M.shape[1]
    if name == "daqp":
        import daqp

        w, _, flag, _ = daqp.solve(np.eye(m), np.zeros(m), M, np.full(len(M), 1e30),
                                   np.ones(len(M)), np.zeros(len(M), np.int32))
        return np.asarray(w) if flag == 1 else None
    if name == "quadprog":
        import quadprog

        try:
            return quadprog.solve_qp(np.eye(m), np.zeros(m), np.ascontiguousarray(M.T),
                                     np.ones(len(M)))[0]
        except ValueError:  # "constraints are inconsistent, no solution"
            return None
    if name == "LinearSVC":
        from sklearn.svm import LinearSVC

        # hard margin: hinge loss, C large, no intercept, each point and its mirror
        P = np.concatenate([M, -M])
        y = np.concatenate([np.ones(len(M)), -np.ones(len(M))])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = LinearSVC(C=1e6, loss="hinge", fit_intercept=False, tol=1e-8,
                            max_iter=200_000, dual=True).fit(P, y)
        return clf.coef_[0]
    raise ValueError(name)


def peers_bench(quick=False, rounds=3, prompt_only=False):
    """attnsvm vs daqp, quadprog (dense QP on vec(W), Hessian I) and scikit-learn
    LinearSVC (hard margin via C = 1e6 on the points vec(Delta_k z_k^T) and their mirror)
    for the Frobenius ATT-SVM; batched prompt SVMs vs a Python loop of daqp / quadprog
    (attnsvm with its default threads, and on one thread: the per-thread comparison);
    the nuclear norm vs cvxpy + SCS. Median of ``rounds`` runs each, all in this process;
    the peers get their dense constraint matrix prebuilt (not timed), attnsvm starts
    from the tokens. ratio = peer time / attnsvm time (> 1: attnsvm faster).
    Agreement: |norm_peer - norm_attnsvm| / norm_attnsvm with the peer's W rescaled to
    be feasible (W / min(1, min margin)), and the peer's raw min margin."""
    from attnsvm.svm import att_svm, lean, prompt_svm_batch

    lean.warmup()
    peers = [p for p, mod in (("daqp", "daqp"), ("quadprog", "quadprog"),
                              ("LinearSVC", "sklearn")) if _peer_available(mod)]
    rows = []
    hdr = (f"  {'problem':<30} {'peer':<10} {'peer s':>9} {'attnsvm s':>10} {'ratio':>7} "
           f"{'|d norm|/norm':>13} {'peer min m':>11}  note")
    print(f"\npeers ({rounds} rounds, median)\n{hdr}")

    def line(problem, peer, tp, ta, agree, mm, note=""):
        r = tp / ta if np.isfinite(tp) else float("nan")
        rows.append((problem, peer, tp, ta, r, agree, mm, note))
        print(f"  {problem:<30} {peer:<10} {tp:>9.4g} {ta:>10.4g} {r:>7.2f} {agree:>13.1e} "
              f"{mm:>11.8f}  {note}", flush=True)

    sizes = [] if prompt_only else PEER_SIZES[:2] if quick else PEER_SIZES
    att_svm(*planted(5, 4, 4, seed=1))
    for n, T, d in sizes:
        X, z, alpha = planted(n, T, d)
        ta, sol = _median_time(lambda X=X, z=z, alpha=alpha: att_svm(X, z, alpha), rounds)
        prob = f"fro {(n, T, d)} N={n * (T - 1)}"
        if n * (T - 1) * d * d > PEER_MAX_ENTRIES:
            for p in peers:
                line(prob, p, float("nan"), ta, float("nan"), float("nan"),
                     f"skipped: dense M has {n * (T - 1) * d * d:.1e} entries")
            continue
        M = _dense_rows(X, z, alpha)
        for p in peers:
            if M.size > PEER_LIMIT[p]:
                line(prob, p, float("nan"), ta, float("nan"), float("nan"),
                     f"skipped: N d e = {M.size:.1e} > {PEER_LIMIT[p]:.0e} (minutes per solve)")
                continue
            tp, w = _median_time(lambda p=p, M=M: _peer_qp(p, M), rounds)
            if w is None:
                line(prob, p, tp, ta, float("nan"), float("nan"), "peer: no solution")
                continue
            mm = float((M @ w).min())
            nrm = np.linalg.norm(w) / min(1.0, mm)
            line(prob, p, tp, ta, abs(nrm - sol.norm_) / sol.norm_, mm,
                 f"attnsvm {sol.solver_}, gap {sol.gap_:.0e}")
    # batched prompt SVMs: B problems of (6, 8, 10).  Each round is ~15 ms, so the
    # contenders run interleaved (attnsvm on its threads, attnsvm on one thread, each peer
    # loop, then again), at least 11 rounds: a machine that slows down for a while slows
    # every contender alike instead of the one that happened to run then.
    B, n, T, d = (300 if quick else 1000), 6, 8, 10
    rng = np.random.default_rng(0)
    X = rng.standard_normal((B, n, T, d))
    alpha = rng.integers(0, T, (B, n))
    prompt_svm_batch(X[:4], None, alpha[:4])
    Ms = [_dense_rows(X[b], np.ones((n, 1)), alpha[b]) for b in range(B)]
    loops = [p for p in peers if p != "LinearSVC"]
    fns = {"attnsvm": lambda: prompt_svm_batch(X, None, alpha),
           "attnsvm 1 thread": lambda: _on_one_thread(lambda: prompt_svm_batch(X, None, alpha))}
    for p in loops:
        fns[p] = (lambda p=p: [_peer_qp(p, M) for M in Ms])
    tm, res = _interleaved(fns, max(rounds, 11))
    bs, ta, ta1 = res["attnsvm"], tm["attnsvm"], tm["attnsvm 1 thread"]
    for p in loops:
        tp, ws = tm[p], res[p]
        feas = np.array([w is not None for w in ws])
        agree = int((feas == bs.feasible_).sum())
        both = np.nonzero(feas & bs.feasible_)[0]
        dn = max((abs(np.linalg.norm(ws[b]) / min(1.0, (Ms[b] @ ws[b]).min()) - bs.norm_[b])
                  / bs.norm_[b] for b in both), default=float("nan"))
        mm = min(((Ms[b] @ ws[b]).min() for b in both), default=float("nan"))
        line(f"prompt batch B={B} {(n, T, d)}", p + " loop", tp, ta, dn, mm,
             f"verdicts agree {agree}/{B} ({int(bs.feasible_.sum())} feasible); "
             f"{1e3 * ta / B:.4f} vs {1e3 * tp / B:.4f} ms/problem "
             f"(interleaved, median of {max(rounds, 11)})")
        line(f"prompt batch B={B} 1 thread", p + " loop", tp, ta1, dn, mm,
             f"attnsvm on 1 thread (torch.set_num_threads(1)): {1e3 * ta1 / B:.4f} vs "
             f"{1e3 * tp / B:.4f} ms/problem")
    # nuclear norm vs cvxpy + SCS
    if not prompt_only:
        n, T, d = (20, 8, 10) if quick else (100, 16, 32)
        X, z, alpha = planted(n, T, d)
        att_svm(*planted(5, 4, 4, seed=1), norm="nuc")
        naive(*planted(5, 4, 4, seed=1), "nuc")
        ta, sol = _median_time(lambda: att_svm(X, z, alpha, norm="nuc"), rounds)
        tp, (Wn, name) = _median_time(lambda: naive(X, z, alpha, "nuc"), rounds)
        nn, vn = feasible_norm(X, z, alpha, Wn, "nuc")
        mm = 1 - vn if vn > 0 else float("nan")
        line(f"nuc {(n, T, d)} N={n * (T - 1)}", f"cvxpy+{name}", tp, ta,
             abs(nn - sol.norm_) / sol.norm_, mm, f"attnsvm gap {sol.gap_:.0e}")
    behind = [r for r in rows if np.isfinite(r[4]) and r[4] < 1]
    print("  attnsvm behind: " + ("; ".join(f"{r[0]} vs {r[1]} ({r[4]:.2f}x)" for r in behind)
                                  if behind else "nowhere in this run"))
    return rows


if __name__ == "__main__":
    main()
