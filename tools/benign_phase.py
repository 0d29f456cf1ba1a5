"""The phase diagram of benign / harmful overfitting (issue 35): a resumable sweep of
``benign-sakamoto`` over (n, noise ratio), each cell over several signal norms, drawn with
:func:`attnsvm.experiments.benign_sakamoto.phase_plot`.

Usage (from the repository root, with the package importable)::

    python tools/benign_phase.py [--scale quick] [--store attnsvm-out/sweep/benign-phase]
        [--executor dask] [--workers 2] [--out docs/benign]

Running it again resumes the sweep (cells already in the store are read back).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnsvm.experiments import benign_sakamoto as S
from attnsvm.sweep import grid, sweep

NS = (10, 20, 40)
RATIOS = (0.1, 0.2, 0.3)
NORMS = (2.0, 3.5, 5.0, 10.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="quick")
    ap.add_argument("--store", default="attnsvm-out/sweep/benign-phase")
    ap.add_argument("--executor", default="dask")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="docs/benign")
    a = ap.parse_args(argv)
    cells = grid(n=list(NS), noise_ratio=list(RATIOS), signal_norms=[NORMS], curve_norms=[NORMS[::3]])
    res = sweep(S.EXPERIMENT, cells, scale=a.scale, store=a.store, executor=a.executor,
                workers=a.workers)
    table = S.phase_table(res["curves"])
    Path(a.out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(a.out) / "phase.csv", index=False)
    print(table.to_string(index=False))
    print(S.phase_plot(table, a.out, "benign_phase"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
