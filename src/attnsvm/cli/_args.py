"""Argument types shared by the commands: each refuses a bad value at parse time, so the
user sees one line ``attnsvm CMD: error: argument --lr: ...`` before anything runs."""

from __future__ import annotations

import argparse
import math


def _number(text: str, cast, what: str):
    try:
        value = cast(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")
    return value


def finite_float(text: str) -> float:
    return _number(text, float, "a finite number")


def positive_float(text: str) -> float:
    value = _number(text, float, "a finite number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0; got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    value = _number(text, float, "a finite number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0; got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0; got {text!r}")
    return value


def torch_device(text: str | None):
    """``text`` as a torch device that exists on this machine (None: leave the default).

    Raises ValueError naming the device: not a device string, CUDA without a CUDA build or
    GPU, a CUDA index beyond the visible GPUs, MPS where it is not available, or a device
    type attnsvm does not run on.
    """
    if text is None:
        return None
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {text!r} is not a torch device; use cpu, cuda or "
                         f"cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise ValueError(f"--device {text}: CUDA is not available ({why}; torch "
                             f"{torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"--device {text}: only {count} CUDA device(s) visible "
                             f"(cuda:0..cuda:{count - 1})")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"--device {text}: MPS is not available on this machine; "
                             f"use --device cpu")
    elif dev.type != "cpu":
        raise ValueError(f"--device {text}: attnsvm runs on cpu, cuda or mps; got a "
                         f"{dev.type!r} device")
    return dev
