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
    >>> load("attnsvm-out/sweep/mmts-fig4")["metrics"]      # the same rows, from disk  # doctest: +SKIP

Executors
---------
``"local"``      one cell after the other, in this process (debugging, tiny sweeps).
``"processes"``  a ``concurrent.futures.ProcessPoolExecutor`` (spawned workers, one
                 cell per worker at a time, torch limited to one thread per worker).
                 No worker outlives the sweep: Ctrl-C and SIGTERM stop the pool (the
                 store's manifest is written, :class:`SweepTerminated` is raised for
                 SIGTERM), and a worker whose parent dies, by SIGKILL too, exits at once
                 (``PR_SET_PDEATHSIG`` on Linux, a parent-pid watchdog everywhere).
``"dask"``       ``dask.distributed``: ``Client(address)`` for a running cluster
                 (``dask scheduler`` / ``dask worker`` / dask-jobqueue ...), else a
                 ``LocalCluster`` with ``workers`` single-threaded worker processes.
a ``Client``     an existing ``dask.distributed.Client``; it is used, not closed.

SIGTERM of a sweep running ``"processes"`` or ``"dask"`` (in the main thread) raises
:class:`SweepTerminated`: pending cells are cancelled, workers (and a LocalCluster the sweep
started) are stopped, the manifest is written; the CLI says how many cells finished and
that the same command resumes the rest (exit status 143).

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
store: two concurrent sweeps on the same store may compute a cell twice. A cell file
damaged afterwards (a disk error, a bad copy) is moved to ``store/_quarantine/<table>/``
by the next sweep, named in a :class:`StoreWarning`, and its cell runs again;
:func:`load` leaves such a cell out, with the same warning, and changes nothing.

A store belongs to one experiment, named in its manifest (written when the store is
created) and in every cell record. A store of another experiment, a manifest that is
corrupt or names no experiment, and a non-empty folder that is not a store are refused
with a ValueError, never merged into; deleting a damaged manifest rebuilds it from the
cell records of the same experiment.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from attnsvm._words import plural
from attnsvm.experiments.base import Experiment

from .cells import _canonical, _unbox, cell_key, grid
from .executors import (
    EXECUTORS,
    SweepTerminated,
    _run_dask,
    _run_local,
    _run_processes,
    resolve_experiment,
)
from .store import CELL_COLUMN, MANIFEST, StoreWarning, _cells_frame, _now, _Store, load

#: where a sweep is stored when no ``store`` is given: DEFAULT_ROOT / <experiment name>
DEFAULT_ROOT = Path("attnsvm-out") / "sweep"

__all__ = ["grid", "sweep", "load", "cell_key", "resolve_experiment", "SweepResult",
           "SweepTerminated", "StoreWarning", "EXECUTORS"]


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
        """True when no cell failed."""
        return len(self.failed) == 0

    def summary(self) -> str:
        """A few lines: cells done / resumed / failed, tables and their row counts."""
        c = self.cells
        n_done = int((c.status == "done").sum()) if len(c) else 0
        n_res = int(c.resumed.sum()) if len(c) else 0
        lines = [f"sweep {self.experiment} ({self.scale}): {plural(len(c), 'cell')}, {n_done} done "
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
    store:      output folder (default ``attnsvm-out/sweep/<experiment name>``, the CLI's
                default too); resumed if present.
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
    st = _Store(Path(store) if store is not None else DEFAULT_ROOT / exp.name, exp.name)
    # cells done earlier are read back now: one whose file is damaged is quarantined (moved
    # to STORE/_quarantine/, named in a StoreWarning) and runs again
    cached = {k: t for k in order if st.is_done(k)
              and (t := st.read_cell(k, quarantine=True)) is not None}
    resumed = set(cached)
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

    from attnsvm.progress import progress_bar

    bar = progress_bar(total=len(order), initial=len(order) - len(jobs), desc=f"sweep {exp.name}",
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
    return SweepResult(exp.name, scale, st.root, st.read(done, cached), cells_df, failed)
