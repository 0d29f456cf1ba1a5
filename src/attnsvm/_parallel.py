"""One thread pool for the compiled batch kernels of both engines (training and SVM).

    thread_pool(fn, B, *args, per_thread=1)      # fn(*args, b0, b1) on slices of range(B)

The kernels (numba, ``nogil=True``) release the GIL, so Python threads run them in
parallel.  The number of threads (:func:`n_threads`), first that applies:

1. ``with kernel_threads(n): ...``: n threads for the calls made in this block by this
   thread (a context variable: other threads, and the process, are not affected);
2. the environment variable ``NUMBA_NUM_THREADS`` (a positive integer), read at each call;
3. the CPUs this process may run on (``len(os.sched_getaffinity(0))``, else
   ``os.cpu_count()``), capped by ``torch.get_num_threads()``, so that a process limited
   to one thread (``torch.set_num_threads(1)``, as the sweep's process workers, the
   benchmarks and pytest-xdist workers do) stays on one.

So by default the pool uses every CPU the process may run on: torch's default intra-op
count is the machine's core count (2 = 2 CPUs on the development machine; a run of the
fused engine on 2 threads does the same work, CPU time within a few percent of 1 thread:
``python benchmarks/bench_train.py --extras-only``).

torch's OpenMP workers spin-wait after each parallel op. The fused engine issues no torch
op per step (its records are taken inside the kernel: :class:`attnsvm.fused.Records`), so
nothing spins while it runs. The torch engine's small per-step ops do: measured on the
shared 2-core machine under load (load average 15), 200 torch-engine steps at B = 1 took
17.9 s wall / 3.1 s CPU on 2 torch threads against 2.6 s / 0.37 s on 1 (B = 1000:
130-200 s against 10-15 s). torch offers no per-call way to keep an op on one thread
(``torch.set_num_threads`` sets OpenMP's and MKL's counts for the process), so the
library leaves it; the opt-in is the program's: ``OMP_WAIT_POLICY=PASSIVE`` in the
environment before torch starts (the same B = 1 run: 1.3-3.3 s wall / 0.38-0.55 s CPU on
2 threads) or ``torch.set_num_threads(1)``.

The library never changes torch's (or BLAS's) thread count itself.  Problems are independent and every slice writes its own rows, so results do not
depend on the number of threads.  The pool is created on first use and grown, never
shrunk; it belongs to neither engine (:mod:`attnsvm.fused`, :mod:`attnsvm.svm.active`).

No library call changes the process's thread settings (BLAS, torch): callers may call the
solvers and the trainer from threads. :func:`single_thread` is the opt-in for a process
that wants BLAS on one thread (the SVM solvers' many small factorisations gain nothing from
BLAS threads and lose badly to oversubscription on a loaded machine: measured 0.7 s
against 23 s on a loaded 2-core box); it is process-wide, so use it around a whole program
or a block no other thread depends on, never inside a library.
"""

from __future__ import annotations

import contextvars
import os
import threading
from contextlib import contextmanager

import numpy as np

__all__ = ["thread_pool", "n_threads", "kernel_threads", "single_thread"]

_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "attnsvm_kernel_threads", default=None)
_POOL = None
_LOCK = threading.Lock()


@contextmanager
def single_thread():
    """``with attnsvm.single_thread(): ...``: every BLAS library on one thread inside the
    block, the previous counts restored after (threadpoolctl; nothing without it).

    PROCESS-WIDE: while the block runs, every thread of the process sees BLAS on one
    thread. An opt-in for programs (the CLI's ``reproduce`` runs its experiments so), never
    called by the library itself (module docstring)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scipy / scikit-learn
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@contextmanager
def kernel_threads(n: int):
    """``with kernel_threads(n): ...``: the batch kernels called from this thread (or task)
    inside the block use ``n`` threads (a context variable: not process-wide; other
    threads keep their own setting). n: a positive int."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"kernel_threads: n must be a positive int, got {n!r}")
    tok = _THREADS.set(int(n))
    try:
        yield
    finally:
        _THREADS.reset(tok)


def cpu_count() -> int:
    """The CPUs this process may run on: len(os.sched_getaffinity(0)) where the platform
    has it, else os.cpu_count() (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def n_threads() -> int:
    """The number of threads the batch kernels may use (module docstring): the
    :func:`kernel_threads` setting of this context, else ``NUMBA_NUM_THREADS``, else
    min(:func:`cpu_count`, torch.get_num_threads())."""
    nt = _THREADS.get()
    if nt is not None:
        return nt
    env = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if env:
        try:
            v = int(env)
        except ValueError:
            v = 0
        if v < 1:
            raise ValueError(f"NUMBA_NUM_THREADS must be a positive integer, got {env!r}")
        return v
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return cpu_count()
    return max(1, min(cpu_count(), int(torch.get_num_threads())))


def _pool(nt: int):
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL._max_workers < nt:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(max_workers=nt, thread_name_prefix="attnsvm-kernels")
        return _POOL


def thread_pool(fn, B: int, *args, per_thread: int = 1) -> None:
    """Run ``fn(*args, b0, b1)`` on contiguous slices [b0, b1) of range(B), ``per_thread``
    slices per thread (:func:`n_threads` threads; one thread: a single call fn(*args, 0, B)).
    More than one slice per thread balances the load where problems (or cores) differ in
    speed: a thread that is slowed down leaves its later slices to the others.  Slice k is
    [cuts_k, cuts_{k+1}) with cuts = linspace(0, B, k_total + 1) rounded down,
    k_total = min(threads * per_thread, B).  Exceptions of ``fn`` are re-raised."""
    nt = min(n_threads(), B)
    if nt <= 1:
        fn(*args, 0, B)
        return
    pool = _pool(nt)
    k = max(1, min(nt * per_thread, B))
    cuts = np.linspace(0, B, k + 1).astype(np.int64)
    futs = [pool.submit(fn, *args, int(cuts[i]), int(cuts[i + 1])) for i in range(k)]
    for f in futs:
        f.result()
