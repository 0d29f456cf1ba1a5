"""``attnsvm sweep NAME --grid d=2,4,8 --grid seed=0:10``: an experiment over a grid.

Examples::

    attnsvm sweep mmts-fig4 --grid d=2,4,8 --grid seed=0:10 --executor processes
    attnsvm sweep mmts-fig4 --grid lr=0.1,0.01 --scale full --executor dask \\
        --address tcp://scheduler:8786 --store /scratch/fig4
    attnsvm sweep mypkg.experiments:MINE --grid n=10,100 --dry-run

Running the same command again resumes: cells already in the store are not recomputed.
"""

from __future__ import annotations

import argparse
import sys

from attnsvm.cli._args import positive_int

HELP = "run an experiment over a grid of config overrides (local, processes or Dask), " \
       "stored as Parquet with resume"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME",
                   help="experiment name (`attnsvm list`), or module:ATTR of an Experiment")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=VALUES",
                   help="an axis of the grid: comma-separated values and/or ranges "
                        "a:b[:step] (b excluded), e.g. d=2,4,8 or seed=0:10; "
                        "ints, floats, true/false/none, else strings; repeat per axis")
    p.add_argument("--scale", choices=["tiny", "quick", "full"], default="quick",
                   help="base configuration the overrides apply to (default %(default)s)")
    p.add_argument("--store", default=None,
                   help="output folder (default sweeps/NAME); an existing one is resumed")
    p.add_argument("--executor", choices=["local", "processes", "dask"], default="local",
                   help="where cells run (default %(default)s)")
    p.add_argument("--address", default=None,
                   help="Dask scheduler address (tcp://host:8786); implies --executor dask; "
                        "default with dask: a LocalCluster on this machine")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="worker processes for processes / the Dask LocalCluster "
                        "(default: all cores)")
    p.add_argument("--no-retry-failed", dest="retry_failed", action="store_false",
                   help="leave the cells that failed in an earlier run alone")
    p.add_argument("--no-strict", dest="strict", action="store_false",
                   help="allow keys that the experiment's configuration does not have")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")
    p.add_argument("--dry-run", action="store_true",
                   help="print the cells and whether each is already stored; run nothing")


def parse_value(text: str) -> object:
    """``"3"`` -> 3, ``"0.5"``/``"1e-3"`` -> float, ``"true"``/``"none"`` -> True/None, else str.

    >>> [parse_value(t) for t in ["3", "-2", "0.5", "1e-3", "True", "none", "fro"]]
    [3, -2, 0.5, 0.001, True, None, 'fro']
    """
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return t


def parse_axis(spec: str) -> tuple[str, list]:
    """``"d=2,4,8"`` -> ("d", [2, 4, 8]); ``"seed=0:3"`` -> ("seed", [0, 1, 2]);
    ``"x=0:6:2,10"`` -> ("x", [0, 2, 4, 10]).

    >>> parse_axis("seed=0:3")
    ('seed', [0, 1, 2])
    >>> parse_axis("lr=0.1,1e-2")
    ('lr', [0.1, 0.01])
    """
    key, sep, values = spec.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise ValueError(f"--grid expects KEY=VALUES (e.g. d=2,4,8 or seed=0:10); got {spec!r}")
    out: list = []
    for item in values.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) in (2, 3) and all(_is_int(x) for x in parts):
            r = range(*(int(x) for x in parts))
            if len(r) == 0:
                raise ValueError(f"--grid {spec!r}: range {item!r} is empty")
            out.extend(r)
        elif len(parts) in (2, 3) and all(isinstance(parse_value(x), (int, float))
                                          for x in parts):
            raise ValueError(f"--grid {spec!r}: range {item!r} needs integers; "
                             f"list float values with commas")
        else:
            out.append(parse_value(item))
    if not out:
        raise ValueError(f"--grid {spec!r} has no values")
    return key, out


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from attnsvm.sweep import SweepTerminated, _Store, cell_key, grid, resolve_experiment, sweep

    axes = dict(parse_axis(s) for s in args.grid)  # a ValueError is one line (cli.main)
    try:
        exp = resolve_experiment(args.name)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    cells = grid(**axes)
    executor = "dask" if args.address else args.executor
    store = args.store or f"sweeps/{exp.name}"

    if args.dry_run:
        from pathlib import Path

        st = _Store(Path(store), exp.name, create=False) if Path(store).is_dir() else None
        for cell in cells:
            key = cell_key(cell, args.scale)
            state = (st.status(key) if st else None) or "todo"
            print(f"{key}  {state:<7s} {cell}")
        print(f"{len(cells)} cells of {exp.name} at scale {args.scale!r}; store {store}")
        return 0

    print(f"attnsvm sweep: {exp.name} over {len(cells)} cells "
          f"({' x '.join(f'{k}:{len(v)}' for k, v in axes.items()) or 'defaults'}) "
          f"at scale {args.scale!r}, executor {executor} -> {store}/", flush=True)
    try:
        res = sweep(exp, cells, scale=args.scale, store=store, executor=executor,
                    address=args.address, workers=args.workers, progress=args.progress,
                    retry_failed=args.retry_failed, strict=args.strict)
    except KeyboardInterrupt as exc:
        how = "terminated" if isinstance(exc, SweepTerminated) else "interrupted"
        print(f"\nattnsvm sweep: {how}; finished cells are in {store}/, "
              f"the same command resumes", file=sys.stderr)
        return 143 if isinstance(exc, SweepTerminated) else 130
    print(res.summary())
    return 0 if res.ok else 1
