"""Cells: grids of config overrides and their stable hash keys."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["grid", "cell_key"]


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
