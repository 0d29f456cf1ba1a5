"""Atomic file writes: the one helper every writer of attnsvm uses (reports, sweep stores,
datasets, the CLI's ``--out`` files)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_text"]


def atomic_write(path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` to a temporary name next to ``path`` (same folder, so the rename stays
    on one file system), then rename it to ``path`` (:func:`os.replace`): readers see the old
    file or the new one, never a torn one; an exception in ``write`` leaves ``path`` as it
    was and removes the temporary file. The temporary name holds the process and thread, so
    concurrent writers never share one. Returns ``path`` as a Path.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> atomic_write(folder / "a.txt", lambda tmp: tmp.write_text("hello")).read_text()
    'hello'
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_text(path, text: str) -> Path:
    """:func:`atomic_write` of ``text`` (UTF-8)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
