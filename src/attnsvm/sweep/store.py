"""The Parquet store of a sweep: one file per (table, cell), a JSON record per cell,
written atomically (see the package docstring for the layout)."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .._files import atomic_write, atomic_write_text
from .cells import _canonical

__all__ = ["load", "StoreWarning"]

MANIFEST = "manifest.json"
RECORDS = "_cells"
QUARANTINE = "_quarantine"  # unreadable cell files, moved aside (never deleted)
CELL_COLUMN = "cell"
_MANIFEST_EVERY_S = 2.0


class StoreWarning(UserWarning):
    """A sweep store holds a file that cannot be read (a corrupt Parquet cell): the warning
    names it, and what was done about it (skipped; quarantined and re-run by a sweep)."""


def _unreadable_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged Parquet file raises: OSError, ValueError (pyarrow's
    ArrowInvalid is one) and pyarrow's other errors."""
    try:
        from pyarrow.lib import ArrowException
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        return (OSError, ValueError)
    return (OSError, ValueError, ArrowException)


def _read_parquet(path: Path) -> pd.DataFrame | BaseException:
    """The table at ``path``, or the exception that reading it raised (a damaged file)."""
    try:
        return pd.read_parquet(path)
    except _unreadable_errors() as exc:
        return exc


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


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


def _manifest_experiment(root: Path) -> str | None:
    """The experiment named by ``root/manifest.json`` (None: no manifest). A manifest
    that cannot be read, is not JSON, or names no experiment is a ValueError: such a store
    is refused, never merged into."""
    manifest = root / MANIFEST
    if not manifest.exists():
        return None
    fix = (f"delete {manifest} to rebuild it from the cell records in {root / RECORDS}, "
           f"or pass another store")
    try:
        doc = json.loads(manifest.read_text())
    except OSError as exc:
        raise ValueError(f"store {root}: cannot read {MANIFEST} ({exc.strerror or exc}); "
                         f"refusing to use the store") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"store {root}: {MANIFEST} is corrupt ({exc}); refusing to merge "
                         f"into it: {fix}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("experiment"), str):
        raise ValueError(f"store {root}: {MANIFEST} is not a sweep manifest (it names no "
                         f"experiment); refusing to merge into it: {fix}")
    return doc["experiment"]


class _Store:
    """The folder a sweep writes; only the sweep's own process touches it.

    A store belongs to one experiment (named in its manifest, and in every cell record):
    a store of another experiment, a corrupt manifest, or a non-empty folder that is not
    a sweep store is refused with a ValueError. A new store's manifest is written at once.
    """

    def __init__(self, root: Path, experiment: str | None, create: bool = True):
        self.root = Path(root)
        self.experiment = experiment
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"store {self.root} exists and is not a folder")
        stored = _manifest_experiment(self.root)
        if experiment is not None and stored not in (None, experiment):
            raise ValueError(f"store {self.root} holds a sweep of {stored!r}, "
                             f"not {experiment!r}; pass another store")
        if self.experiment is None:
            self.experiment = stored
        self.records: dict[str, dict] = {}
        rec_dir = self.root / RECORDS
        if rec_dir.is_dir():
            for p in rec_dir.glob("*.json"):
                try:
                    rec = json.loads(p.read_text())
                except (OSError, ValueError):  # a damaged record: the cell runs again
                    continue
                if isinstance(rec, dict):
                    self.records[p.stem] = rec
        if experiment is not None and stored is None:
            self._check_adoptable()
        self._last_manifest = 0.0
        if create:
            rec_dir.mkdir(parents=True, exist_ok=True)
            if stored is None:
                self.write_manifest()  # claim the folder for this experiment now

    def _check_adoptable(self) -> None:
        """No manifest: the folder must be new or empty, or hold cell records of this
        experiment only (a store whose manifest was deleted to rebuild it)."""
        others = sorted({r["experiment"] for r in self.records.values()
                         if isinstance(r.get("experiment"), str)} - {self.experiment})
        if others:
            raise ValueError(f"store {self.root} holds cells of {others[0]!r}, not "
                             f"{self.experiment!r}; pass another store")
        if self.records or not self.root.is_dir():
            return
        stray = sorted(p.name for p in self.root.iterdir()
                       if not p.name.startswith(".") and p.name != RECORDS)
        if stray:
            raise ValueError(f"store {self.root} is a non-empty folder without a sweep "
                             f"{MANIFEST} (it holds {', '.join(stray[:3])}"
                             f"{', ...' if len(stray) > 3 else ''}); refusing to write into "
                             f"it: pass a new or empty folder")

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
            table = _with_params(df, cell, key)
            atomic_write(path, lambda tmp, t=table: t.to_parquet(tmp, index=False))
        return list(tables)

    def record(self, key: str, rec: dict) -> None:
        rec = dict(rec, experiment=self.experiment)
        self.records[key] = rec
        atomic_write_text(self.root / RECORDS / f"{key}.json", json.dumps(rec, indent=1))
        if time.monotonic() - self._last_manifest > _MANIFEST_EVERY_S:
            self.write_manifest()

    def write_manifest(self) -> None:
        cells = dict(sorted(self.records.items(), key=lambda kv: (kv[1].get("index", 0), kv[0])))
        doc = {"experiment": self.experiment, "updated": _now(), "cells": cells}
        atomic_write_text(self.root / MANIFEST, json.dumps(doc, indent=1))
        self._last_manifest = time.monotonic()

    def read_cell(self, key: str, quarantine: bool = False) -> dict[str, pd.DataFrame] | None:
        """The tables of a done cell; None when one of its files cannot be read. Such a file
        is named in a :class:`StoreWarning`, and with ``quarantine`` moved aside to
        ``_quarantine/`` (the cell is then no longer done: a sweep runs it again)."""
        out = {}
        for table in self.records[key].get("tables", []):
            path = self.table_path(table, key)
            df = _read_parquet(path)
            if isinstance(df, BaseException):
                params = self.records[key].get("params")
                if quarantine:
                    dest = self.quarantine(path, table)
                    what = f"moved to {dest}; the cell runs again"
                else:
                    what = "its rows are left out"
                warnings.warn(f"sweep store {self.root}: cell {key} {params}: {path} cannot be "
                              f"read ({_why(df)}); {what}", StoreWarning, stacklevel=3)
                return None
            out[table] = df
        return out

    def quarantine(self, path: Path, table: str) -> Path:
        """Move an unreadable cell file to ``_quarantine/<table>/`` (a new name each time)."""
        dest_dir = self.root / QUARANTINE / table
        dest_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        dest = dest_dir / f"{path.stem}.{stamp}.{os.getpid()}{path.suffix}"
        os.replace(path, dest)
        return dest

    def read(self, keys: Iterable[str], cached: Mapping[str, dict] | None = None,
             skip_unreadable: bool = False) -> dict[str, pd.DataFrame]:
        """Tables of the given (done) cells, concatenated in the order of ``keys``;
        ``cached``: tables already read, by cell. A file that cannot be read raises, or
        with ``skip_unreadable`` is left out with a :class:`StoreWarning`."""
        parts: dict[str, list[pd.DataFrame]] = {}
        for key in keys:
            tables = (cached or {}).get(key)
            if tables is None and skip_unreadable:
                tables = self.read_cell(key)
                if tables is None:  # read_cell warned: the cell is left out
                    continue
            elif tables is None:
                tables = {t: pd.read_parquet(self.table_path(t, key))
                          for t in self.records[key].get("tables", [])}
            for table, df in tables.items():
                parts.setdefault(table, []).append(df)
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
    A cell whose file cannot be read (a damaged Parquet file) is left out, named in a
    :class:`StoreWarning`; the store is not changed (the next sweep quarantines and
    re-runs it).

    >>> tables = load("attnsvm-out/sweep/mmts-fig4")       # doctest: +SKIP
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
        tables = st.read(keys, skip_unreadable=True)
    else:  # bare Parquet files (e.g. copied without their records)
        if scale is not None:
            raise ValueError(f"store {root} has no cell records; cannot select scale {scale!r}")
        tables = {}
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name[0] not in "._"):
            frames = []
            for f in sorted(sub.glob(f"{CELL_COLUMN}=*.parquet")):
                df = _read_parquet(f)
                if isinstance(df, BaseException):
                    warnings.warn(f"sweep store {root}: {f} cannot be read ({_why(df)}); its "
                                  f"rows are left out", StoreWarning, stacklevel=2)
                    continue
                frames.append(df)
            if frames:
                tables[sub.name] = _concat(frames)
    if failed:
        tables["_failed"] = _cells_frame(
            [(k, r) for k, r in st.records.items()
             if r.get("status") == "failed" and (scale is None or r.get("scale") == scale)],
            with_error=True)
    return tables


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
