"""Suite-wide test settings.

Tensors in these tests are tiny; on a 2-core machine shared with other jobs, torch's
intra-op thread pool costs far more than it gains (measured ~20x slower per step with
2 threads under load), so the suite runs torch single-threaded. For the same reason the
suite puts BLAS on one thread (the SVM solvers' small factorisations): the test process's
own choice, as a program's (the library never changes thread settings itself:
tests/test_threads.py).
"""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)

try:  # noqa: SIM105
    from threadpoolctl import threadpool_limits  # noqa: E402

    threadpool_limits(limits=1, user_api="blas")
except ImportError:  # pragma: no cover
    pass
