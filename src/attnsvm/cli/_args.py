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


SEED_MAX = 2 ** 63 - 1  # seeds are int64 in torch (train: trial b uses seed + b)


def seed_int(text: str) -> int:
    """A seed: an integer in [0, 2**63 - 1] (torch keeps seeds as int64)."""
    value = _number(text, int, "an integer in [0, 2**63 - 1]")
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63 - 1] (an int64 "
                                         f"seed); got {text!r}")
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


# ------------------------------------------------------------------------- help
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default: ``(default: VALUE)`` is appended unless
    the help already states it in words (for a default of None, which means
    something other than None: "the shipped corpus", "all cores"). Flags (store_true /
    store_false) have no value to default to and are left as written. Descriptions and
    epilogs keep their line breaks (the .npz format tables)."""

    def _get_help_string(self, action):
        text = action.help or ""
        flag = action.nargs == 0
        if (flag or not action.option_strings or action.default is argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)" if text else text


# ------------------------------------------------------------------ output paths
#: the one default output root of the commands: attnsvm-out/<command>/...
OUT_ROOT = "attnsvm-out"


def default_out(command: str, *parts: str) -> str:
    """The default output path of ``command``: ``attnsvm-out/<command>[/parts...]``."""
    return "/".join((OUT_ROOT, command, *parts))


def check_out_file(path: str | None, force: bool, suffixes: tuple[str, ...], what: str):
    """The ``--out`` file, checked before any work is done: its name ends in one of
    ``suffixes``, it is not a folder, its folder exists, and it does not exist unless
    ``force``. None stays None. Each problem is a ValueError naming ``--out PATH``."""
    from pathlib import Path

    if path is None:
        return None
    out = Path(path)
    if out.suffix not in suffixes:
        kinds = " or ".join(suffixes)
        raise ValueError(f"--out {path}: {what} is written as {kinds}; give a file name "
                         f"ending in {'one of them' if len(suffixes) > 1 else kinds}")
    if out.is_dir():
        raise ValueError(f"--out {path}: is a directory; give a file name")
    if not out.parent.is_dir():
        raise ValueError(f"--out {path}: the folder {out.parent} does not exist")
    if out.exists() and not force:
        raise ValueError(f"--out {path}: the file exists; pass --force to overwrite it, or "
                         f"give another name")
    why = unwritable(out.parent)
    if why:
        raise ValueError(f"--out {path}: cannot write into the folder {out.parent} ({why}); "
                         f"give a writable place")
    return out


def unwritable(folder) -> str | None:
    """Why no file can be created in ``folder`` (None: one can). Tried for real: a
    temporary file is created and removed, so read-only mounts, permissions and ACLs all
    count, as they will when the command writes."""
    import os
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".attnsvm-write-check-", dir=folder)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(name)
    return None


def check_out_dir(path, option: str = "--out"):
    """An output folder, checked before any work: not an existing file, and writable (if
    it does not exist yet: its nearest existing parent folder is, so it can be made).
    Returns it as a Path; each problem is a ValueError naming ``option PATH``."""
    from pathlib import Path

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{option} {path}: exists and is not a folder")
    base = out
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise ValueError(f"{option} {path}: {base} is not a folder, so {out} cannot be made")
    why = unwritable(base)
    if why:
        where = "the folder" if base == out else f"{base}, where it would be made,"
        raise ValueError(f"{option} {path}: cannot write into {where} ({why}); give a "
                         f"writable place")
    return out


def write_atomic(out, force: bool, write) -> None:
    """``write(tmp)`` to a temporary name next to ``out``, then rename it to ``out`` (never
    a torn file). Refuses if ``out`` appeared meanwhile and ``force`` is not set."""
    from attnsvm._files import atomic_write

    if out.exists() and not force:  # appeared while the command ran
        raise ValueError(f"--out {out}: the file appeared while the command ran; pass "
                         f"--force to overwrite it")
    atomic_write(out, write)


# --------------------------------------------------------------- the .npz format
NPZ_FORMAT = """\
The .npz data file (written by attnsvm.data.TokenData.save, or np.savez(path, X=..., y=...);
read without pickles):

  key   shape            meaning
  X     (n, T, d)        tokens: n sequences of T >= 2 tokens in R^d (rows x_it)
  y     (n,)             labels y_i in {-1, +1}, one per sequence
        (n, T)           seq-to-seq labels y_ik, one per query token k
  z     (n, d)           cross-attention query z_i of each sequence (optional)
  mask  (n, T) bool      True = valid token, False = padding (optional; >= 1 valid per row)
  v     (d,)             the fixed linear head v: scores gamma_it = y_i v^T x_it (optional)

Batched files hold B datasets, one per trial: X (B, n, T, d), y (B, n) or (B, n, T),
z (B, n, d), mask (B, n, T), v (B, d); an array shared by every trial may leave B out.
Labels may be any two distinct values (0 / 1, False / True, two strings): they are mapped
to -1 / +1 in sorted order, and the mapping is printed."""


# --------------------------------------------------------------- one progress flag
def add_progress(p: argparse.ArgumentParser, what: str, *, aliases: tuple[str, ...] = (),
                 bar: bool = False) -> None:
    """``--progress / --no-progress`` (every long command has it). Default: on; a bar
    (``bar=True``: tqdm on stderr) draws only where stderr is a terminal unless --progress
    asks for it. ``aliases``: older spellings of --no-progress (``--quiet``), kept hidden."""
    default = "on a terminal" if bar else "on"
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help=f"{what} (default: {default})")
    for alias in aliases:
        p.add_argument(alias, dest="progress", action="store_false", help=argparse.SUPPRESS)
    p.set_defaults(_progress_bar=bar)


def progress_on(args: argparse.Namespace) -> bool:
    """Whether the command shows its progress: ``--progress`` / ``--no-progress`` where
    given, else on (a bar: on where stderr is a terminal)."""
    import sys

    if getattr(args, "progress", None) is not None:
        return bool(args.progress)
    return sys.stderr.isatty() if getattr(args, "_progress_bar", False) else True


