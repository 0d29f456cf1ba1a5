"""The phase diagram of benign / harmful overfitting (issue 35): a resumable sweep of
``benign-sakamoto`` over (n, noise ratio), each cell over several signal norms, drawn with
:func:`attnsvm.experiments.benign_sakamoto.phase_plot`.

Usage (from the repository root, with the package importable)::

    python tools/benign_phase.py [--scale quick] [--store attnsvm-out/sweep/benign-phase]
        [--executor dask] [--workers 2] [--out docs/benign] [--n 10 20 40]
        [--ratios 0.1 0.2 0.3] [--norms 2 3.5 5 10]

Running it again resumes the sweep (cells already in the store are read back, not
recomputed; a killed run keeps every cell it finished: tests/test_benign_phase.py kills
one with SIGKILL and resumes it).
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
    ap.add_argument("--n", type=int, nargs="+", default=list(NS), help="training set sizes")
    ap.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS), help="noise ratios")
    ap.add_argument("--norms", type=float, nargs="+", default=list(NORMS), help="signal norms")
    a = ap.parse_args(argv)
    norms = tuple(a.norms)
    cells = grid(n=list(a.n), noise_ratio=list(a.ratios), signal_norms=[norms],
                 curve_norms=[(norms[0], norms[-1])])
    res = sweep(S.EXPERIMENT, cells, scale=a.scale, store=a.store, executor=a.executor,
                workers=a.workers)
    print(res.summary())
    table = S.phase_table(res["curves"])
    Path(a.out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(a.out) / "phase.csv", index=False)
    print(table.to_string(index=False))
    print(S.phase_plot(table, a.out, "benign_phase"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
