"""``attnsvm sweep NAME --grid d=2,4,8 --grid seed=0:10``: an experiment over a grid.

Examples::

    attnsvm sweep mmts-fig4 --grid seed=0:10 --grid lr=0.1,0.01 --executor processes
    attnsvm sweep mmts-fig9 --grid 'ds=[2,4],[8,16]' --grid seed=0:3 --dry-run
    attnsvm sweep mmts-fig4 --grid lr=0.1,0.01 --scale full --executor dask \\
        --address tcp://scheduler:8786 --store /scratch/fig4
    attnsvm sweep mypkg.experiments:MINE --grid n=10,100 --dry-run

Running the same command again resumes: cells already in the store are not recomputed.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from attnsvm._words import plural
from attnsvm.cli._args import (
    add_progress,
    check_out_dir,
    default_out,
    positive_int,
    progress_on,
)

HELP = "run an experiment over a grid of config overrides (local, processes or Dask), " \
       "stored as Parquet with resume"

EPILOG = """\
Grid values (--grid KEY=VALUES, one axis per --grid; the cells are the product):
  d=2,4,8          three cells, d = 2, 4 and 8
  seed=0:10        a range a:b[:step], b excluded: seed = 0 .. 9
  lr=0.1,1e-2      numbers; true/false/none; anything else is a string (norm=fro,nuc)
  ds=[2,4,8]       ONE cell whose value is the list [2, 4, 8] (brackets make a list)
  ds=[2,4],[8,16]  two cells, ds = [2, 4] and ds = [8, 16]; lists nest, may hold ranges
                   ([0:4] is [0, 1, 2, 3]) and JSON values (["fro", "nuc"])
Quote a value with brackets in the shell: --grid 'ds=[2,4,8]'.

The keys are the experiment's config keys (`attnsvm list NAME` shows them at every
scale). A key the config does not have, or a single value where the config holds a list
(and the reverse), is refused before anything runs; --no-strict lets unknown keys
through. --dry-run checks the grid and prints the cells and their state in the store.

The store: STORE/manifest.json, STORE/<table>/cell=<hash>.parquet; attnsvm.sweep.load(STORE)
reads every table back with the cell's parameters as columns."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME",
                   help="experiment name (`attnsvm list`), or module:ATTR of an Experiment")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=VALUES",
                   help="an axis of the grid: comma-separated values, ranges a:b[:step] "
                        "(b excluded) and [lists], e.g. d=2,4,8, seed=0:10, ds=[2,4,8]; "
                        "repeat per axis (default: one cell, the scale's config)")
    p.add_argument("--scale", choices=["tiny", "quick", "full"], default="quick",
                   help="base configuration the overrides apply to")
    p.add_argument("--store", default=None,
                   help=f"output folder; an existing one is resumed (default "
                        f"{default_out('sweep', 'NAME')})")
    p.add_argument("--executor", choices=["local", "processes", "dask"], default="local",
                   help="where cells run")
    p.add_argument("--address", default=None,
                   help="Dask scheduler address (tcp://host:8786); implies --executor dask "
                        "(default with dask: a LocalCluster on this machine)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="worker processes for processes / the Dask LocalCluster "
                        "(default: all cores)")
    p.add_argument("--no-retry-failed", dest="retry_failed", action="store_false",
                   help="leave the cells that failed in an earlier run alone")
    p.add_argument("--no-strict", dest="strict", action="store_false",
                   help="allow keys that the experiment's configuration does not have")
    add_progress(p, "a progress bar of the cells on stderr", bar=True)
    p.add_argument("--dry-run", action="store_true",
                   help="check the grid, print the cells and whether each is already stored; "
                        "run nothing")


def parse_value(text: str) -> object:
    """``"3"`` -> 3, ``"0.5"``/``"1e-3"`` -> float, ``"true"``/``"none"`` -> True/None,
    ``'"x"'`` -> "x" (JSON string), else the text as a string.

    >>> [parse_value(t) for t in ["3", "-2", "0.5", "1e-3", "True", "none", "fro", '"a,b"']]
    [3, -2, 0.5, 0.001, True, None, 'fro', 'a,b']
    """
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if len(t) >= 2 and t[0] == t[-1] == '"':
        try:
            return json.loads(t)
        except json.JSONDecodeError:
            pass
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return t


def _split(text: str, spec: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes."""
    items, depth, quote, start = [], 0, False, 0
    for j, ch in enumerate(text):
        if ch == '"':
            quote = not quote
        elif quote:
            continue
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"--grid {spec!r}: unbalanced brackets (a ']' without its '[')")
        elif ch == "," and depth == 0:
            items.append(text[start:j])
            start = j + 1
    if depth or quote:
        raise ValueError(f"--grid {spec!r}: unbalanced " + ("quotes" if quote else "brackets")
                         + " (a '[' without its ']')" * (not quote))
    items.append(text[start:])
    return items


def _items(text: str, spec: str) -> list:
    """The values of a comma-separated list: ranges expand, [..] is one list value."""
    out: list = []
    for item in _split(text, spec):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):
            if not item.endswith("]"):
                raise ValueError(f"--grid {spec!r}: {item!r} must end with ']'; separate "
                                 f"values with commas")
            out.append(_items(item[1:-1], spec))
            continue
        if item.startswith("{"):
            try:
                out.append(json.loads(item))
            except json.JSONDecodeError as exc:
                raise ValueError(f"--grid {spec!r}: {item!r} is not a JSON object ({exc.msg})") \
                    from None
            continue
        parts = item.split(":")
        if len(parts) in (2, 3) and all(_is_int(x) for x in parts):
            if len(parts) == 3 and int(parts[2]) == 0:
                raise ValueError(f"--grid {spec!r}: range {item!r} has step 0; give a non-zero step "
                                 f"(START:STOP:STEP), or leave it out (step 1)")
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
    return out


def parse_axis(spec: str) -> tuple[str, list]:
    """``"d=2,4,8"`` -> ("d", [2, 4, 8]); ``"seed=0:3"`` -> ("seed", [0, 1, 2]);
    ``"x=0:6:2,10"`` -> ("x", [0, 2, 4, 10]); ``"ds=[2,4],[8]"`` -> ("ds", [[2, 4], [8]]).

    >>> parse_axis("seed=0:3")
    ('seed', [0, 1, 2])
    >>> parse_axis("lr=0.1,1e-2")
    ('lr', [0.1, 0.01])
    >>> parse_axis("ds=[2,4,8]")
    ('ds', [[2, 4, 8]])
    >>> parse_axis('ds=[2,4],[0:3],["a", "b"]')
    ('ds', [[2, 4], [0, 1, 2], ['a', 'b']])
    """
    key, sep, values = spec.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise ValueError(f"--grid expects KEY=VALUES (e.g. d=2,4,8, seed=0:10 or "
                         f"ds=[2,4,8]); got {spec!r}")
    out = _items(values, spec)
    if not out:
        raise ValueError(f"--grid {spec!r} has no values")
    return key, out


def check_axes(exp, scale: str, axes: dict, strict: bool = True) -> None:
    """Refuse, with one line naming the problem, a grid that cannot mean what it says: a
    scale the experiment lacks, a key its config does not have (``strict``), a single value
    where the config holds a list, a list where it holds a number, or a value that is not a
    number (a string, true/false, none) where it holds a number."""
    from attnsvm.cli.list_ import fmt

    if scale not in exp.configs:
        raise ValueError(f"{exp.name} has no scale {scale!r}; it has {', '.join(exp.configs)}")
    config = exp.configs[scale]
    unknown = [k for k in axes if k not in config]
    if strict and unknown:
        raise ValueError(f"--grid {unknown[0]}: {exp.name} has no config key {unknown[0]!r} at "
                         f"scale {scale!r}; its keys: {', '.join(config)} (--no-strict passes "
                         f"keys the config does not have)")
    for key, values in axes.items():
        if key not in config:
            continue
        base = config[key]
        for v in values:
            if isinstance(base, (list, tuple)) and not isinstance(v, (list, tuple)):
                raise ValueError(
                    f"--grid {key}={fmt(v)}: {key} is a list in {exp.name}'s config "
                    f"({fmt(base)}); a list value goes in brackets: --grid '{key}=[{fmt(v)}]' "
                    f"is one cell, '{key}=[2,4],[8]' two")
            number = isinstance(base, (int, float)) and not isinstance(base, bool)
            if number and (v is None or isinstance(v, (str, bool))):
                hint = (" (a range is a:b[:step] with integers)" if isinstance(v, str)
                        and ":" in v else "")
                raise ValueError(
                    f"--grid {key}={fmt(v)}: {key} is a number in {exp.name}'s config "
                    f"({fmt(base)}); expected numbers, got {v!r}{hint}")
            if number and isinstance(v, (list, tuple)):
                raise ValueError(
                    f"--grid {key}={fmt(v)}: {key} is a single number in {exp.name}'s config "
                    f"({fmt(base)}); for one cell per value write {key}="
                    f"{','.join(fmt(x) for x in v)}")


def _count_done(store, keys: list[str]) -> int:
    """How many of the cells ``keys`` the store holds as done (0 if it cannot be read)."""
    from pathlib import Path

    from attnsvm.sweep import _Store

    try:
        st = _Store(Path(store), None, create=False)
    except (OSError, ValueError):
        return 0
    return sum(st.is_done(k) for k in keys)


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from attnsvm.sweep import (
        StoreWarning,
        SweepTerminated,
        _Store,
        cell_key,
        grid,
        resolve_experiment,
        sweep,
    )

    axes = {}
    for spec in args.grid:  # a ValueError is one line (cli.main)
        key, values = parse_axis(spec)
        if key in axes:
            raise ValueError(f"--grid {key} is given twice; put every value of an axis in one "
                             f"--grid {key}=... (e.g. {key}=1,2,3)")
        axes[key] = values
    try:
        exp = resolve_experiment(args.name)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    check_axes(exp, args.scale, axes, args.strict)
    cells = grid(**axes)
    executor = "dask" if args.address else args.executor
    store = args.store or default_out("sweep", exp.name)

    if args.dry_run:
        from pathlib import Path

        st = _Store(Path(store), exp.name, create=False) if Path(store).is_dir() else None
        for cell in cells:
            key = cell_key(cell, args.scale)
            state = (st.status(key) if st else None) or "todo"
            print(f"{key}  {state:<7s} {cell}")
        print(f"{plural(len(cells), 'cell')} of {exp.name} at scale {args.scale!r}; store {store}")
        return 0

    check_out_dir(store, "--store")  # writable, before any cell runs
    print(f"attnsvm sweep: {exp.name} over {plural(len(cells), 'cell')} "
          f"({' x '.join(f'{k}:{len(v)}' for k, v in axes.items()) or 'defaults'}) "
          f"at scale {args.scale!r}, executor {executor} -> {store}/", flush=True)
    from attnsvm.compiled import ensure_all

    ensure_all()  # an empty numba cache: compiled once here (said), not in every worker
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", StoreWarning)
            shown = warnings.showwarning

            def one_line(message, category, *rest, **kw):  # a damaged cell: one line each
                if issubclass(category, StoreWarning):
                    print(f"attnsvm sweep: warning: {message}", file=sys.stderr, flush=True)
                else:
                    shown(message, category, *rest, **kw)

            warnings.showwarning = one_line
            res = sweep(exp, cells, scale=args.scale, store=store, executor=executor,
                        address=args.address, workers=args.workers, progress=progress_on(args),
                        retry_failed=args.retry_failed, strict=args.strict)
    except KeyboardInterrupt as exc:
        how = ("terminated (SIGTERM)" if isinstance(exc, SweepTerminated)
               else "interrupted")
        done = _count_done(store, [cell_key(c, args.scale) for c in cells])
        print(f"\nattnsvm sweep: {how}; {done} of {plural(len(cells), 'cell')} are finished and "
              f"stored in {store}/; running the same command again resumes the other "
              f"{len(cells) - done}", file=sys.stderr)
        return 143 if isinstance(exc, SweepTerminated) else 130
    print(res.summary())
    return 0 if res.ok else 1
