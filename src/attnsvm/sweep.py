"""Sweeps: run an experiment over a grid of config overrides, at any scale, anywhere.

A *cell* is a dict of config overrides. Every cell runs as one task,

    tables = experiment.compute(experiment.config(scale, **cell))

and each returned table is written to a Parquet store as soon as the task finishes,
with the cell's parameters added as columns. A sweep that is interrupted (Ctrl-C, a
killed job, a lost cluster) is resumed by running the same call again: cells already
in the store are read back, not recomputed. A cell that raises is recorded with its
traceback and does not cost the other cells their results.

    >>> from attnsvm.sweep import grid, sweep, load
    >>> cells = grid(d=[10, 20, 40], seed=range(10))       # 30 cells
    >>> res = sweep("mmts-fig4", cells, executor="processes")  # doctest: +SKIP
    >>> res["metrics"].groupby("d")["loss"].mean()          # doctest: +SKIP
    >>> load("sweeps/mmts-fig4")["metrics"]                 # the same rows, from disk  # doctest: +SKIP

Executors
---------
``"local"``      one cell after the other, in this process (debugging, tiny sweeps).
``"processes"``  a ``concurrent.futures.ProcessPoolExecutor`` (spawned workers, one
                 cell per worker at a time, torch limited to one thread per worker).
``"dask"``       ``dask.distributed``: ``Client(address)`` for a running cluster
                 (``dask scheduler`` / ``dask worker`` / dask-jobqueue ...), else a
                 ``LocalCluster`` with ``workers`` single-threaded worker processes.
a ``Client``     an existing ``dask.distributed.Client``; it is used, not closed.

Tasks go to the workers at once (``client.map``) and their results come back in the
order they finish (``as_completed``); only this process writes the store, so the
workers of a remote cluster need no shared file system (they need ``attnsvm`` and
the experiment's code importable).

Store layout
------------
::

    store/
      manifest.json              experiment, and for every cell: params, scale, status,
                                 tables, seconds, error (the traceback of a failed cell)
      _cells/<cell>.json         the same record, one file per cell (what resume reads)
      <table>/cell=<cell>.parquet   one file per (table, cell); columns: the table's,
                                 the cell's parameters, and ``cell`` (the hash)

``<cell>`` is :func:`cell_key`, a stable hash of the scale and the cell's parameters
(so ``grid(d=[2])`` and ``[{"d": 2}]`` are the same cell, and the ``quick`` and
``full`` runs of one cell are two cells). Files are written to a temporary name and
renamed, so a killed sweep never leaves half a file behind. One sweep at a time per
store: two concurrent sweeps on the same store may compute a cell twice.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import math
import os
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from attnsvm.experiments.base import Experiment

__all__ = ["grid", "sweep", "load", "cell_key", "resolve_experiment", "SweepResult",
           "EXECUTORS"]

EXECUTORS = ("local", "processes", "dask")
MANIFEST = "manifest.json"
RECORDS = "_cells"
CELL_COLUMN = "cell"
_MANIFEST_EVERY_S = 2.0


# --------------------------------------------------------------------------- grids

def grid(**axes: Any) -> list[dict]:
    """The cartesian product of the axes, as a list of cells (the last axis varies fastest).

    An axis is an iterable of values (a list, ``range``, numpy array); a string or any
    other non-iterable is a single value.

    >>> grid(d=[10, 20], seed=range(2))
    [{'d': 10, 'seed': 0}, {'d': 10, 'seed': 1}, {'d': 20, 'seed': 0}, {'d': 20, 'seed': 1}]
    >>> grid(lr=0.1, norm=["fro", "nuc"])
    [{'lr': 0.1, 'norm': 'fro'}, {'lr': 0.1, 'norm': 'nuc'}]
    >>> grid()
    [{}]

    Grids add up: ``grid(d=[2, 4], T=8) + grid(d=[64], T=2)``.
    """
    names, values = [], []
    for name, axis in axes.items():
        if isinstance(axis, (str, bytes)) or not isinstance(axis, Iterable):
            vals = [axis]
        else:
            vals = [_unbox(v) for v in axis]
        if not vals:
            raise ValueError(f"grid axis {name!r} has no values")
        names.append(name)
        values.append(vals)
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def _unbox(v: Any) -> Any:
    """numpy scalars -> Python scalars (so cells print, hash and serialise plainly)."""
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "ndim", None) == 0:
        return item()
    return v


def _canonical(v: Any, where: str) -> Any:
    v = _unbox(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return repr(v)
        return v
    if isinstance(v, (list, tuple, range)):
        return [_canonical(x, where) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _canonical(x, where) for k, x in v.items()}
    if isinstance(v, Path):
        return str(v)
    if hasattr(v, "tolist"):  # numpy arrays
        return _canonical(v.tolist(), where)
    raise TypeError(f"cell value {where}={v!r} of type {type(v).__name__} cannot be stored; "
                    f"use numbers, strings, booleans, None, lists or dicts of them")


def cell_key(cell: Mapping[str, Any], scale: str = "quick") -> str:
    """Stable 16-hex-digit hash of (scale, cell); independent of key order and numpy types.

    >>> cell_key({"d": 2, "seed": 0}) == cell_key({"seed": 0, "d": 2})
    True
    >>> cell_key({"d": 2}) == cell_key({"d": 2}, scale="full")
    False
    """
    params = {str(k): _canonical(v, str(k)) for k, v in cell.items()}
    text = json.dumps({"scale": scale, "cell": params}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- experiments

def resolve_experiment(experiment: Experiment | str) -> Experiment:
    """An :class:`Experiment`, a registered name (``"mmts-fig4"``), or ``"module:ATTR"``.

    ``"module:ATTR"`` imports ``module`` and takes its attribute ``ATTR``, so experiments
    outside the registry (your own, a notebook's module) can be swept from the CLI too.
    """
    if isinstance(experiment, Experiment):
        return experiment
    if not isinstance(experiment, str):
        raise TypeError(f"experiment must be an Experiment or a name; got {type(experiment)}")
    if ":" in experiment:
        module, _, attr = experiment.partition(":")
        obj = getattr(importlib.import_module(module), attr)
        if not isinstance(obj, Experiment):
            raise TypeError(f"{experiment} is a {type(obj).__name__}, not an Experiment")
        return obj
    from attnsvm.experiments import get

    return get(experiment)


# --------------------------------------------------------------------------- one task

_THREADS_LIMITED = False


def _limit_threads() -> None:
    """One BLAS/OpenMP/torch thread per worker: parallel workers must not oversubscribe."""
    global _THREADS_LIMITED
    if _THREADS_LIMITED:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"  # read by torch / numpy when they are imported later
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    _THREADS_LIMITED = True


def _origin() -> tuple[str, int]:
    return socket.gethostname(), os.getpid()


def _execute(experiment: Any, cfg: dict, origin: tuple[str, int] | None = None
             ) -> tuple[str, Any, float]:
    """Run one cell; never raises (except KeyboardInterrupt and friends).

    Returns ``("done", tables, seconds)`` or ``("failed", traceback_text, seconds)``.
    ``experiment`` is an Experiment, its name, or cloudpickled bytes. Threads are
    limited to one when the task runs in another process than the sweep (``origin``).
    """
    if origin is not None and origin != _origin():
        _limit_threads()
    t0 = time.perf_counter()
    try:
        if isinstance(experiment, bytes):
            import cloudpickle

            experiment = cloudpickle.loads(experiment)
        exp = resolve_experiment(experiment)
        tables = exp.compute(dict(cfg))
        if not isinstance(tables, Mapping):
            raise TypeError(f"{exp.name}.compute returned {type(tables).__name__}, "
                            f"expected a dict of table name -> pandas.DataFrame")
        tables = dict(tables)
        for name, df in tables.items():
            _check_table(name, df)
        return "done", tables, time.perf_counter() - t0
    except Exception:  # noqa: BLE001 - one failing cell must not stop the sweep
        return "failed", traceback.format_exc(), time.perf_counter() - t0


def _check_table(name: Any, df: Any) -> None:
    if (not isinstance(name, str) or not name or name.startswith((".", "_"))
            or any(c in name for c in '/\\:*?"<>|')):
        raise ValueError(f"table name {name!r} cannot be a folder of the store "
                         f"(non-empty, no path characters, not starting with '.' or '_')")
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"table {name!r} is a {type(df).__name__}, expected pandas.DataFrame")
    if CELL_COLUMN in df.columns:
        raise ValueError(f"table {name!r} has a column {CELL_COLUMN!r}, which a sweep "
                         f"reserves for the cell hash")


def _with_params(df: pd.DataFrame, cell: Mapping[str, Any], key: str) -> pd.DataFrame:
    """The table with the cell's parameters as constant columns, and the cell hash.

    A parameter whose name is already a column of the table is left alone when the
    column holds that value throughout; otherwise it is added as ``cell_<name>``.
    Non-scalar values (lists, dicts) are stored as JSON text.
    """
    out = df.reset_index(drop=True).copy()
    for name, value in cell.items():
        value = _canonical(value, name)
        if isinstance(value, (list, dict)):
            value = json.dumps(value, sort_keys=True)
        col = name
        if col in out.columns:
            if len(out) == 0 or bool((out[col] == value).all()):
                continue
            col = f"cell_{name}"
        out[col] = value
    out[CELL_COLUMN] = key
    return out


# --------------------------------------------------------------------------- the store

def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _Store:
    """The folder a sweep writes; only the sweep's own process touches it."""

    def __init__(self, root: Path, experiment: str | None, create: bool = True):
        self.root = Path(root)
        self.experiment = experiment
        manifest = self.root / MANIFEST
        if manifest.exists():
            try:
                stored = json.loads(manifest.read_text()).get("experiment")
            except (OSError, ValueError):
                stored = None
            if experiment is not None and stored not in (None, experiment):
                raise ValueError(f"store {self.root} holds a sweep of {stored!r}, "
                                 f"not {experiment!r}; pass another store")
            if self.experiment is None:
                self.experiment = stored
        if create:
            (self.root / RECORDS).mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict] = {}
        rec_dir = self.root / RECORDS
        if rec_dir.is_dir():
            for p in rec_dir.glob("*.json"):
                try:
                    self.records[p.stem] = json.loads(p.read_text())
                except (OSError, ValueError):  # a torn record: the cell runs again
                    continue
        self._last_manifest = 0.0

    def table_path(self, table: str, key: str) -> Path:
        return self.root / table / f"{CELL_COLUMN}={key}.parquet"

    def is_done(self, key: str) -> bool:
        rec = self.records.get(key)
        return bool(rec and rec.get("status") == "done"
                    and all(self.table_path(t, key).exists() for t in rec.get("tables", [])))

    def status(self, key: str) -> str | None:
        rec = self.records.get(key)
        return rec.get("status") if rec else None

    def write_tables(self, key: str, cell: Mapping[str, Any], tables: Mapping[str, pd.DataFrame]
                     ) -> list[str]:
        for name, df in tables.items():
            path = self.table_path(name, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            _with_params(df, cell, key).to_parquet(tmp, index=False)
            os.replace(tmp, path)
        return list(tables)

    def record(self, key: str, rec: dict) -> None:
        self.records[key] = rec
        _atomic_write_text(self.root / RECORDS / f"{key}.json", json.dumps(rec, indent=1))
        if time.monotonic() - self._last_manifest > _MANIFEST_EVERY_S:
            self.write_manifest()

    def write_manifest(self) -> None:
        cells = dict(sorted(self.records.items(), key=lambda kv: (kv[1].get("index", 0), kv[0])))
        doc = {"experiment": self.experiment, "updated": _now(), "cells": cells}
        _atomic_write_text(self.root / MANIFEST, json.dumps(doc, indent=1))
        self._last_manifest = time.monotonic()

    def read(self, keys: Iterable[str]) -> dict[str, pd.DataFrame]:
        """Tables of the given (done) cells, concatenated in the order of ``keys``."""
        parts: dict[str, list[pd.DataFrame]] = {}
        for key in keys:
            for table in self.records[key].get("tables", []):
                parts.setdefault(table, []).append(pd.read_parquet(self.table_path(table, key)))
        return {t: _concat(frames) for t, frames in parts.items()}


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    nonempty = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(nonempty, ignore_index=True) if len(nonempty) > 1 else nonempty[0]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load(store: str | Path, *, scale: str | None = None, failed: bool = False
         ) -> dict[str, pd.DataFrame]:
    """Read a sweep's store back: table name -> all completed cells' rows.

    Rows are ordered by cell (in the order the cells were first swept), each table
    carrying the cell's parameters and the ``cell`` hash. ``scale`` keeps the cells
    of one scale only. With ``failed=True`` the result has one more table,
    ``"_failed"``: the failed cells' parameters and tracebacks (column ``error``).

    >>> tables = load("sweeps/mmts-fig4")       # doctest: +SKIP
    >>> tables["metrics"].groupby("d").size()   # doctest: +SKIP
    """
    root = Path(store)
    if not root.is_dir():
        raise FileNotFoundError(f"no sweep store at {root}")
    st = _Store(root, None, create=False)
    if st.records:
        keys = [k for k, r in sorted(st.records.items(),
                                     key=lambda kv: (kv[1].get("index", 0), kv[0]))
                if st.is_done(k) and (scale is None or r.get("scale") == scale)]
        tables = st.read(keys)
    else:  # bare Parquet files (e.g. copied without their records)
        if scale is not None:
            raise ValueError(f"store {root} has no cell records; cannot select scale {scale!r}")
        tables = {}
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name[0] not in "._"):
            files = sorted(sub.glob(f"{CELL_COLUMN}=*.parquet"))
            if files:
                tables[sub.name] = _concat([pd.read_parquet(f) for f in files])
    if failed:
        tables["_failed"] = _cells_frame(
            [(k, r) for k, r in st.records.items()
             if r.get("status") == "failed" and (scale is None or r.get("scale") == scale)],
            with_error=True)
    return tables


# --------------------------------------------------------------------------- executors

def _pack(exp: Experiment) -> Any:
    """What a spawned worker receives: cloudpickle bytes when available (closures and
    notebook-defined functions travel too), else the object for plain pickling."""
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - cloudpickle ships with dask
        return exp
    return cloudpickle.dumps(exp)


def _run_local(exp: Experiment, jobs: list[tuple[str, dict]]) -> Iterator[tuple[str, tuple]]:
    for key, cfg in jobs:
        yield key, _execute(exp, cfg)


def _run_processes(exp: Experiment, jobs: list[tuple[str, dict]], workers: int | None
                   ) -> Iterator[tuple[str, tuple]]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    payload = _pack(exp)
    pool = ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1,
                               mp_context=multiprocessing.get_context("spawn"),
                               initializer=_limit_threads)
    clean = False
    try:
        futures = {pool.submit(_execute, payload, cfg, None): key for key, cfg in jobs}
        for fut in as_completed(futures):
            yield futures[fut], _future_outcome(fut)
        clean = True
    finally:
        if not clean:  # interrupted: do not wait for long cells that nobody will record
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=clean, cancel_futures=True)


def _future_outcome(fut: Any) -> tuple:
    try:
        return fut.result()
    except Exception:  # noqa: BLE001 - a dead worker fails its cell, not the sweep
        return "failed", "the worker running this cell died:\n" + traceback.format_exc(), 0.0


def _run_dask(exp: Experiment, jobs: list[tuple[str, dict]], executor: Any,
              address: str | None, workers: int | None) -> Iterator[tuple[str, tuple]]:
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None
    if isinstance(executor, Client):
        client, own = executor, False
    elif address:
        client, own = Client(address), True
    else:
        cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None)
        client, own = Client(cluster), True
    token = uuid.uuid4().hex[:8]  # fresh task keys: never reuse results held by the cluster
    names = {f"attnsvm-sweep-{exp.name}-{key}-{token}": key for key, _ in jobs}
    futures = []
    try:
        futures = client.map(_execute, [exp] * len(jobs), [cfg for _, cfg in jobs],
                             [_origin()] * len(jobs), key=list(names))
        for fut in as_completed(futures):
            outcome = _future_outcome(fut)
            fut.release()
            yield names[fut.key], outcome
    finally:
        pending = [f for f in futures if not f.done()]
        if pending:
            client.cancel(pending)
        if own:
            client.close()
        if cluster is not None:
            cluster.close()


# --------------------------------------------------------------------------- sweep

@dataclass
class SweepResult:
    """What :func:`sweep` returns.

    ``tables``: table name -> rows of every completed cell (computed now or read back);
    ``cells``: one row per requested cell (``cell``, ``status`` "done"/"failed",
    ``resumed``, ``seconds``, and the parameters); ``failed``: the failed cells with
    their tracebacks (column ``error``). ``res["metrics"]`` is ``res.tables["metrics"]``.
    """

    experiment: str
    scale: str
    store: Path
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    cells: pd.DataFrame = field(default_factory=pd.DataFrame)
    failed: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __getitem__(self, table: str) -> pd.DataFrame:
        return self.tables[table]

    def __iter__(self):
        return iter(self.tables)

    @property
    def ok(self) -> bool:
        return len(self.failed) == 0

    def summary(self) -> str:
        """A few lines: cells done / resumed / failed, tables and their row counts."""
        c = self.cells
        n_done = int((c.status == "done").sum()) if len(c) else 0
        n_res = int(c.resumed.sum()) if len(c) else 0
        lines = [f"sweep {self.experiment} ({self.scale}): {len(c)} cells, {n_done} done "
                 f"({n_res} read back from the store), {len(self.failed)} failed -> {self.store}"]
        for name, df in self.tables.items():
            lines.append(f"  table {name:<20s} {len(df):>8d} rows x {df.shape[1]} columns")
        for _, row in self.failed.head(5).iterrows():
            last = str(row["error"]).strip().splitlines()[-1] if row["error"] else "?"
            lines.append(f"  FAILED cell {row[CELL_COLUMN]} {row['params']}: {last}")
        if len(self.failed) > 5:
            lines.append(f"  ... and {len(self.failed) - 5} more failures "
                         f"(tracebacks in {self.store / MANIFEST})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<SweepResult {self.summary().splitlines()[0]}>"


def _cells_frame(items: list[tuple[str, dict]], with_error: bool = False,
                 resumed: set[str] | None = None) -> pd.DataFrame:
    rows = []
    for key, rec in items:
        params = rec.get("params", {})
        row = {CELL_COLUMN: key, "status": rec.get("status"), "seconds": rec.get("seconds"),
               "params": json.dumps(params, sort_keys=True)}
        if resumed is not None:
            row["resumed"] = key in resumed
        if with_error:
            row["error"] = rec.get("error")
        for k, v in params.items():
            row.setdefault(k, json.dumps(v) if isinstance(v, (list, dict)) else v)
        rows.append(row)
    cols = [CELL_COLUMN, "status", "seconds", "params"] + (["resumed"] if resumed is not None
                                                           else []) + (["error"] if with_error
                                                                       else [])
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=cols)


def sweep(experiment: Experiment | str, cells: Iterable[Mapping[str, Any]], *,
          scale: str = "quick", store: str | Path | None = None, executor: Any = "local",
          address: str | None = None, workers: int | None = None, progress: bool = True,
          retry_failed: bool = True, strict: bool = True) -> SweepResult:
    """Run ``experiment.compute(experiment.config(scale, **cell))`` for every cell.

    Parameters
    ----------
    experiment: an :class:`Experiment`, a registered name, or ``"module:ATTR"``.
    cells:      config overrides, one dict per task, e.g. ``grid(d=[2, 4], seed=range(5))``;
                duplicates run once.
    scale:      the base configuration (``"tiny"``, ``"quick"``, ``"full"``).
    store:      output folder (default ``sweeps/<experiment name>``); resumed if present.
    executor:   ``"local"``, ``"processes"``, ``"dask"`` or a ``dask.distributed.Client``.
    address:    scheduler address for ``"dask"`` (``"tcp://host:8786"``); default: a
                ``LocalCluster`` started and stopped by this call.
    workers:    processes for ``"processes"`` / the LocalCluster (default: all cores).
    progress:   a tqdm bar of cells.
    retry_failed: run again the cells that failed in an earlier sweep of the store
                (cells done earlier are never recomputed; delete their files to force it).
    strict:     refuse override keys that are not in the scale's configuration (a typo
                such as ``sed=`` would otherwise sweep the default seed many times).

    Returns a :class:`SweepResult`; its tables hold the rows of all the requested cells
    that are done (computed now or in an earlier run), in the order of ``cells``.

    >>> from attnsvm.experiments import Experiment
    >>> import pandas as pd
    >>> square = Experiment("demo-square", "x^2", "-", {"quick": {"x": 1}},
    ...     compute=lambda cfg: {"t": pd.DataFrame({"y": [cfg["x"] ** 2]})},
    ...     judge=None, plot=None)
    >>> import tempfile
    >>> res = sweep(square, grid(x=[1, 2, 3]), store=tempfile.mkdtemp(), progress=False)
    >>> res["t"][["x", "y"]].values.tolist()
    [[1, 1], [2, 4], [3, 9]]
    """
    exp = resolve_experiment(experiment)
    if scale not in exp.configs:
        raise ValueError(f"{exp.name}: unknown scale {scale!r}; have {sorted(exp.configs)}")
    if isinstance(executor, str) and executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS} or a dask Client; "
                         f"got {executor!r}")
    known = set(exp.configs[scale])
    order: dict[str, tuple[dict, dict]] = {}
    for i, cell in enumerate(cells):
        if not isinstance(cell, Mapping):
            raise TypeError(f"cell {i} must be a dict of config overrides; got {cell!r}")
        cell = {str(k): _unbox(v) for k, v in cell.items()}
        unknown = sorted(set(cell) - known)
        if strict and unknown:
            raise ValueError(f"{exp.name}: cell {cell} sets {unknown}, which the {scale!r} "
                             f"configuration does not have (known: {sorted(known)}); "
                             f"pass strict=False if compute reads them anyway")
        key = cell_key(cell, scale)
        if key not in order:
            order[key] = (cell, exp.config(scale, **cell))
    st = _Store(Path(store) if store is not None else Path("sweeps") / exp.name, exp.name)
    resumed = {k for k in order if st.is_done(k)}
    jobs = [(k, cfg) for k, (_, cfg) in order.items() if k not in resumed
            and (retry_failed or st.status(k) != "failed")]
    index = {k: i for i, k in enumerate(order)}
    for k in order:  # positions for the manifest's order, for cells new to the store
        index[k] = st.records.get(k, {}).get("index", index[k])

    if executor == "local":
        stream = _run_local(exp, jobs)
    elif executor == "processes":
        stream = _run_processes(exp, jobs, workers)
    else:
        stream = _run_dask(exp, jobs, executor, address, workers)

    from tqdm.auto import tqdm

    bar = tqdm(total=len(order), initial=len(order) - len(jobs), desc=f"sweep {exp.name}",
               unit="cell", disable=not progress or not jobs, dynamic_ncols=True)
    n_failed = 0
    try:
        for key, (status, payload, seconds) in stream:
            cell = order[key][0]
            rec = {"params": {k: _canonical(v, k) for k, v in cell.items()}, "scale": scale,
                   "index": index[key], "status": status, "tables": [], "seconds": seconds,
                   "error": None, "finished": _now()}
            if status == "done":
                try:
                    rec["tables"] = st.write_tables(key, cell, payload)
                except Exception:  # noqa: BLE001 - e.g. a column Parquet cannot hold
                    rec.update(status="failed", tables=[], error=traceback.format_exc())
            else:
                rec["error"] = payload
            n_failed += rec["status"] == "failed"
            st.record(key, rec)
            bar.update(1)
            if n_failed:
                bar.set_postfix(failed=n_failed, refresh=False)
    finally:
        bar.close()
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        st.write_manifest()

    done = [k for k in order if st.is_done(k)]
    items = [(k, st.records.get(k, {"params": order[k][0], "status": "skipped"}))
             for k in order]
    cells_df = _cells_frame(items, resumed=resumed)
    failed = _cells_frame([(k, r) for k, r in items if r.get("status") == "failed"],
                          with_error=True)
    return SweepResult(exp.name, scale, st.root, st.read(done), cells_df, failed)
