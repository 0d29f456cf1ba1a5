"""Chunked runs: train and post-process many trials a fixed number at a time, so that memory
is bounded by the chunk, not by the number of trials, and concatenate the tidy tables.

    def one(start, stop):              # trials [start, stop)
        data = random_sphere(..., seed=seed + start, batch=stop - start)
        p = train(PromptModel(d), data, ...).params["p"].numpy()
        return {"trials": outcomes(p, data.X, data.y, data.v).assign(trial=range(start, stop))}

    tables = map_chunks(one, total=100_000, chunk=10_000)     # {"trials": 100000 rows}

``train(..., chunk=c)`` is the same idea inside the trainer (one dataset, one Trajectory);
``map_chunks`` is for pipelines whose data are generated per chunk too (the Monte-Carlo
experiments: ``benchmarks/bench_fig9.py``). Each chunk's tables are kept, the chunk's
arrays are released before the next one starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

__all__ = ["chunk_bounds", "map_chunks"]


def chunk_bounds(total: int, chunk: int) -> list[tuple[int, int]]:
    """[(start, stop), ...] covering range(total) in pieces of at most ``chunk``."""
    for name, v in (("total", total), ("chunk", chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "total" else 1):
            raise ValueError(f"{name} must be an integer >= {0 if name == 'total' else 1}; "
                             f"got {v!r}")
    return [(a, min(total, a + chunk)) for a in range(0, total, chunk)]


def map_chunks(fn: Callable[[int, int], pd.DataFrame | Mapping[str, pd.DataFrame]],
               total: int, chunk: int, progress: bool = False):
    """Call ``fn(start, stop)`` for consecutive chunks of range(total) and concatenate what
    it returns: a DataFrame, or a dict of DataFrames (concatenated per key; every chunk
    must return the same keys). Rows keep the chunks' order; the index is reset."""
    bounds = chunk_bounds(total, chunk)
    it = bounds
    if progress:
        from .progress import progress_bar

        it = progress_bar(bounds, desc="chunks", unit="chunk")
    parts: list = []
    for a, b in it:
        out = fn(a, b)
        if not isinstance(out, (pd.DataFrame, Mapping)):
            raise TypeError(f"fn({a}, {b}) returned {type(out).__name__}; expected a DataFrame "
                            f"or a dict of DataFrames")
        if parts and isinstance(out, Mapping) != isinstance(parts[0], Mapping):
            raise TypeError(f"fn({a}, {b}) returned a {type(out).__name__}, the first chunk a "
                            f"{type(parts[0]).__name__}")
        if isinstance(out, Mapping) and parts and set(out) != set(parts[0]):
            raise ValueError(f"fn({a}, {b}) returned tables {sorted(out)}, the first chunk "
                             f"{sorted(parts[0])}")
        parts.append(out)
    if not parts:
        return pd.DataFrame()
    if isinstance(parts[0], Mapping):
        return {k: pd.concat([p[k] for p in parts], ignore_index=True) for k in parts[0]}
    return pd.concat(parts, ignore_index=True)
