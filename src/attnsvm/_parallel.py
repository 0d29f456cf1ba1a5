"""The thread pool shared by the compiled kernels of both engines (training:
:mod:`attnsvm.fused`; SVM: :mod:`attnsvm.svm`): neither owns it.

    thread_pool(kernel, B, *args)      # kernel(*args, b0, b1) on slices of range(B)

The kernels are numba functions compiled with ``nogil=True`` that loop over a slice of
independent problems [b0, b1); slices run in a plain ``ThreadPoolExecutor`` (no OpenMP
runtime, whose spinning threads would slow torch down between calls), as many threads
as ``torch.get_num_threads()`` (so a worker limited to one thread stays on one). The
result does not depend on the number of threads: each problem is computed by one thread,
in a fixed order.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

__all__ = ["thread_pool"]

_POOL: ThreadPoolExecutor | None = None


def thread_pool(fn, B: int, *args, per_thread: int = 1) -> None:
    """Run ``fn(*args, b0, b1)`` on contiguous slices [b0, b1) covering range(B),
    ``per_thread`` slices per thread (``torch.get_num_threads()`` threads, at most B);
    more than one slice per thread balances the load where problems (or cores) differ in
    speed. One thread: a single call ``fn(*args, 0, B)`` in the caller's thread. Returns
    when every slice is done; an exception in a slice is raised here."""
    global _POOL
    nt = max(1, min(torch.get_num_threads(), B))
    if nt == 1:
        fn(*args, 0, B)
        return
    if _POOL is None or _POOL._max_workers < nt:
        _POOL = ThreadPoolExecutor(max_workers=nt, thread_name_prefix="attnsvm-kernels")
    k = max(1, min(nt * per_thread, B))
    cuts = np.linspace(0, B, k + 1).astype(np.int64)
    futs = [_POOL.submit(fn, *args, int(cuts[i]), int(cuts[i + 1])) for i in range(k)]
    for f in futs:
        f.result()
