"""Declarative argument validation, in one place (the shape of scikit-learn's
``_parameter_constraints`` / ``validate_parameter_constraints``).

A function states what each argument may be as a table, argument -> list of constraints,

    CONSTRAINTS = {
        "steps": [Interval(int, 0, None)],
        "B": [None, Interval(int, 1, None)],
        "engine": [Options("auto", "torch", "fused")],
        "device": [None, Satisfies(check_device, "a torch device")],
    }

and calls ``values = validate_params(CONSTRAINTS, locals(), "train")`` before any work. An
argument is valid when it meets ANY of its constraints (``None`` in a list admits the value
None); the value returned is the one the first constraint it meets normalises it to
(``Interval(int, ...)`` gives a Python int, :class:`Satisfies` whatever its function
returns). A value meeting none raises one ``ValueError`` that names the argument, what was
expected and what was given, e.g.::

    seed must be an integer in [0, 2**63 - 1]; got 18446744073709551616

(a :class:`Satisfies` whose function raised a ValueError: that message, which is more
specific). Checks that relate two arguments, or an argument and the data, stay with the
function that needs them.

Also here, shared by the data, NTP and SVM entry points: :func:`as_numpy` (a torch
tensor, one that requires grad or lives on a GPU included, as a numpy array),
:func:`as_array` (a finite real array of the documented rank), :func:`as_int_array`
(integer indices, never truncated or wrapped) and the memory check :func:`check_memory`
(refuse, before allocating, what cannot fit).
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Interval", "Options", "InstanceOf", "Satisfies", "validate_params", "check_param",
           "as_numpy", "as_array", "as_int_array", "available_memory", "check_memory",
           "INT64_MAX"]

INT64_MAX = 2 ** 63 - 1


def _show(value: Any) -> str:
    """A short description of a value for an error message."""
    if value is None or isinstance(value, (bool, numbers.Number, str, bytes)):
        text = repr(value)
    elif "torch" in sys.modules and isinstance(value, sys.modules["torch"].dtype):
        text = str(value)
    elif isinstance(value, (list, tuple)) and len(value) <= 8:
        text = repr(value)
    else:
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def _bound(x) -> str:
    if isinstance(x, int) and x == INT64_MAX:
        return "2**63 - 1"
    return repr(x) if isinstance(x, float) and not x.is_integer() else str(int(x))


class Interval:
    """Numbers of a kind in an interval: ``Interval(int, 0, None)`` (integers >= 0),
    ``Interval(float, 0, None, closed="neither")`` (finite reals > 0).

    ``int``: Python or numpy integers (never bool; a float, even 3.0, is refused rather
    than truncated). ``float``: any real number (ints included, bool excluded), finite;
    NaN and inf are never in an interval. ``closed``: "both" (default), "left", "right",
    "neither": which of the finite bounds belong to the interval."""

    def __init__(self, kind: type, lo, hi, closed: str = "both"):
        if kind not in (int, float) or closed not in ("both", "left", "right", "neither"):
            raise ValueError("Interval(kind in (int, float), lo, hi, closed in both|left|right|"
                             "neither)")
        self.kind, self.lo, self.hi, self.closed = kind, lo, hi, closed

    def accepts(self, v) -> bool:
        if isinstance(v, (bool, np.bool_)):
            return False
        if self.kind is int:
            if not isinstance(v, (numbers.Integral, np.integer)):
                return False
        else:
            if not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
                return False
        lo_ok = self.closed in ("both", "left")
        hi_ok = self.closed in ("both", "right")
        if self.lo is not None and (v < self.lo or (v == self.lo and not lo_ok)):
            return False
        return not (self.hi is not None and (v > self.hi or (v == self.hi and not hi_ok)))

    def convert(self, v):
        return int(v) if self.kind is int else float(v)

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        lo_in = self.closed in ("both", "left")
        hi_in = self.closed in ("both", "right")
        if self.lo is not None and self.hi is not None:
            return (f"{what} in {'[' if lo_in else '('}{_bound(self.lo)}, {_bound(self.hi)}"
                    f"{']' if hi_in else ')'}")
        if self.lo is not None:
            return f"{what} {'>=' if lo_in else '>'} {_bound(self.lo)}"
        if self.hi is not None:
            return f"{what} {'<=' if hi_in else '<'} {_bound(self.hi)}"
        return what


class Options:
    """One of the given values (compared with ==; strings, dtypes, booleans ...)."""

    def __init__(self, *values, what: str | None = None):
        self.values = values
        self.what = what

    def accepts(self, v) -> bool:
        try:
            return any((type(v) is type(o) or isinstance(o, str) and isinstance(v, str))
                       and v == o for o in self.values)
        except Exception:  # noqa: BLE001 - an array's == and the like: not one of them
            return False

    def convert(self, v):
        return v

    def describe(self) -> str:
        if self.what:
            return self.what
        shown = [_show(o) for o in self.values]
        if len(shown) == 1:
            return shown[0]
        return "one of " + ", ".join(shown[:-1]) + " or " + shown[-1]


class InstanceOf:
    """An instance of a type (or of one of several)."""

    def __init__(self, types: type | tuple[type, ...], what: str | None = None):
        self.types = types if isinstance(types, tuple) else (types,)
        self.what = what

    def accepts(self, v) -> bool:
        return isinstance(v, self.types)

    def convert(self, v):
        return v

    def describe(self) -> str:
        if self.what:
            return self.what
        return " or ".join(f"a {t.__name__}" for t in self.types)


class Satisfies:
    """Whatever ``fn`` accepts: ``fn(value)`` returns the normalised value or raises a
    ValueError (whose message is then the error: it knows best what was wrong);
    ``what`` describes the accepted values for the combined message."""

    def __init__(self, fn: Callable[[Any], Any], what: str):
        self.fn, self.what = fn, what

    def describe(self) -> str:
        return self.what


Constraint = Interval | Options | InstanceOf | Satisfies | None


def check_param(name: str, value, constraints: Sequence[Constraint]):
    """``value`` normalised by the first constraint it meets; a ValueError naming ``name``
    and what was expected when it meets none."""
    specific = None
    for c in constraints:
        if c is None:
            if value is None:
                return None
        elif isinstance(c, Satisfies):
            try:
                return c.fn(value)
            except (ValueError, TypeError) as exc:
                specific = specific or str(exc)
        elif c.accepts(value):
            return c.convert(value)
    if specific is not None:
        raise ValueError(specific)
    expected = [c.describe() for c in constraints if c is not None]
    expected += ["None"] * any(c is None for c in constraints)
    text = expected[0] if len(expected) == 1 else ", ".join(expected[:-1]) + " or " + expected[-1]
    shown = _show(value)
    if isinstance(value, (float, np.floating)) and any(
            isinstance(c, Interval) and c.kind is int for c in constraints) \
            and math.isfinite(value) and float(value).is_integer():
        shown = f"the float {shown} (floats are refused, not truncated)"
    raise ValueError(f"{name} must be {text}; got {shown}")


def validate_params(constraints: Mapping[str, Sequence[Constraint]], values: Mapping[str, Any],
                    caller: str | None = None) -> dict[str, Any]:
    """Every argument of ``constraints`` checked in the table's order (the first bad one
    raises); returns {name: normalised value}. ``values``: e.g. the caller's ``locals()``.
    A table that names an argument ``values`` lacks is a bug of ``caller``."""
    out = {}
    for name, cons in constraints.items():
        if name not in values:
            raise TypeError(f"{caller or 'validate_params'}: no argument {name!r} to validate")
        out[name] = check_param(name, values[name], cons)
    return out


# ----------------------------------------------------------------- arrays and tensors
def as_numpy(a, name: str = "the array"):
    """``a`` as numpy when it is a torch tensor (detached from autograd, copied from the GPU;
    bfloat16, which numpy lacks, widened to float32 exactly); anything else unchanged.

    Arrays are data here: a tensor that requires grad is read, not refused, by every entry
    point (``TokenData``, the SVM solvers, ``train``). A tensor on the meta device holds no
    values: a ValueError naming ``name``."""
    if type(a).__module__.startswith("torch") and hasattr(a, "detach"):
        import torch

        t = a.detach()
        if t.device.type == "meta":
            raise ValueError(f"{name} is a tensor on the meta device, which holds no values")
        if t.is_sparse:
            t = t.to_dense()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
        return t.cpu().numpy()
    return a


def as_array(x, name: str, ndim: tuple[int, ...], shape_doc: str) -> np.ndarray:
    """``x`` as a finite float64 array with ndim in ``ndim``; ValueError naming ``name``."""
    if type(x) is np.ndarray and x.dtype == np.float64:  # (the common case: as is)
        a = x
    else:
        if x is None:
            raise ValueError(f"{name} is required: an array of shape {shape_doc}")
        x = as_numpy(x, name)  # torch tensors: detached (requires_grad), from the GPU
        try:
            a = np.asarray(x)
        except Exception:  # ragged lists and the like
            raise ValueError(f"{name} must be a numeric array of shape {shape_doc}") from None
        if a.dtype == object or a.dtype.kind in "USVMm" or np.iscomplexobj(a):
            raise ValueError(f"{name} must be a real numeric array of shape {shape_doc}; "
                             f"got dtype {a.dtype}")
        a = a.astype(float, copy=False)
    if a.ndim not in ndim:
        raise ValueError(f"{name} must have shape {shape_doc}; got {a.shape}")
    if not np.logical_and.reduce(np.isfinite(a), None):  # (a.all(): the same, less overhead)
        bad = int((~np.isfinite(a)).sum())
        raise ValueError(f"{name} contains NaN or inf ({bad} entries)")
    return a


def as_int_array(a, name: str, what: str = "token", hi: int | None = None) -> np.ndarray:
    """Integer array (floats / bools / strings refused, never truncated; integers beyond
    int64 refused as out of range [0, hi], never wrapped)."""
    if type(a) is np.ndarray and a.dtype == np.int64:  # (the common case: as is)
        return a
    span = f"[0, {hi}]" if hi is not None else "[0, 2**63 - 1]"
    a = as_numpy(a, name)
    try:
        arr = np.asarray(a)
    except Exception:
        raise ValueError(f"{name} must be an integer array of {what} indices") from None
    if arr.dtype == np.bool_:
        raise ValueError(f"{name} must hold integer {what} indices; got booleans")
    if arr.dtype == object and arr.size and all(isinstance(v, numbers.Integral)
                                                 and not isinstance(v, bool) for v in arr.flat):
        big = [int(v) for v in arr.flat if not -2 ** 63 <= v < 2 ** 63]
        if big:  # Python ints beyond int64 (numpy would raise OverflowError)
            raise ValueError(f"{name} out of range: {what} indices must lie in {span}; "
                             f"got {big[:5]}")
        arr = arr.astype(np.int64)
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 2 ** 63:
        raise ValueError(f"{name} out of range: {what} indices must lie in {span}; "
                         f"got {[int(v) for v in arr[arr >= 2 ** 63][:5]]}")
    if not np.issubdtype(arr.dtype, np.integer):
        if arr.size == 0 and arr.dtype == np.float64:  # np.asarray([]) is float
            return arr.astype(np.int64)
        raise ValueError(f"{name} must hold integer {what} indices; got dtype {arr.dtype} "
                         f"(floats are refused, not truncated: pass e.g. {name}.astype(int))")
    return arr.astype(np.int64, copy=False)


# ---------------------------------------------------------------------- memory
def available_memory(device=None) -> int | None:
    """Bytes that new allocations can still get on ``device`` (None: unknown).

    CPU: the kernel's MemAvailable plus free swap (psutil if installed, else
    /proc/meminfo); CUDA: torch.cuda.mem_get_info's free bytes."""
    dev_type = getattr(device, "type", None) or (str(device).split(":")[0] if device else "cpu")
    if dev_type == "cuda":
        try:
            import torch

            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:  # noqa: BLE001 - no CUDA or no answer: no check
            return None
    if dev_type != "cpu":
        return None
    try:
        import psutil

        return int(psutil.virtual_memory().available + psutil.swap_memory().free)
    except Exception:  # noqa: BLE001 - not installed, or no answer on this platform
        pass
    try:
        info = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.3g} GiB" if n >= 2 ** 27 else f"{n / 2 ** 20:.3g} MiB"


def check_memory(nbytes: float, what: str, fix: str, device=None) -> None:
    """Refuse with a ValueError, before anything is allocated, a computation that needs
    ``nbytes`` when the device has fewer available (:func:`available_memory`; nothing
    is refused when that is unknown). ``what`` says what needs the memory and ``fix`` how
    to need less."""
    avail = available_memory(device)
    if avail is not None and nbytes > avail:
        where = "this machine" if device is None or getattr(device, "type", "cpu") == "cpu" \
            else f"device {device}"
        raise ValueError(f"{what} needs at least {_gib(nbytes)}, more than the {_gib(avail)} "
                         f"available on {where}; {fix}")
