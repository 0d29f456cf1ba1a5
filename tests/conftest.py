"""Suite-wide test settings.

Tensors in these tests are tiny; on a 2-core machine shared with other jobs, torch's
intra-op thread pool costs far more than it gains (measured ~20x slower per step with
2 threads under load), so the suite runs torch single-threaded.
"""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

torch.set_num_threads(1)
