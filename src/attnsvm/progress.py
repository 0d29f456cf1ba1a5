"""Progress bars: tqdm's notebook bar where it can draw, its text bar everywhere else.

``tqdm.auto`` picks the notebook widget inside Jupyter, which needs ipywidgets; without it
tqdm warns ``IProgress not found`` and draws nothing useful. :func:`progress_bar` takes the
notebook bar only where ipywidgets imports, and the plain text bar otherwise (a terminal,
a log file, a notebook without ipywidgets), with no warning.
"""

from __future__ import annotations

import threading
import time

__all__ = ["progress_bar", "Ticker"]


def progress_bar(*args, **kwargs):
    """A tqdm bar: ``tqdm.auto.tqdm(*args, **kwargs)`` where ipywidgets is importable, else
    ``tqdm.std.tqdm(*args, **kwargs)`` (text). Same arguments as ``tqdm.tqdm``."""
    try:
        import ipywidgets  # noqa: F401  (the notebook bar's widgets)
    except ImportError:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm(*args, **kwargs)


class Ticker:
    """A line that says a long step is still running: ``TEXT ...`` on ``stream``, then, on a
    terminal (``live``), ``TEXT ... 12 s`` rewritten in place every ``every`` seconds by a
    daemon thread until the block ends; :meth:`end` finishes the line (``TEXT: RESULT``).
    ``stream=None``: silent. Without ``live`` the start line is printed whole and
    :meth:`end` prints the result on a line of its own.

    >>> import io
    >>> out = io.StringIO()
    >>> with Ticker("compiling", out, live=False) as t:
    ...     t.end("done")
    >>> out.getvalue()
    'compiling ...\\ncompiling: done\\n'
    """

    def __init__(self, text: str, stream=None, live: bool = False, every: float = 1.0):
        self.text, self.stream, self.every = text, stream, every
        self.live = bool(live) and stream is not None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True) if self.live else None

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text)
            self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._write(f"\r{self.text} ... {time.perf_counter() - self._t0:.0f} s")

    def __enter__(self):
        self._t0 = time.perf_counter()
        if self.stream is not None:
            self._write(f"{self.text} ..." + ("" if self.live else "\n"))
        if self._thread is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop rewriting the line (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    def __exit__(self, *exc):
        self.stop()
        return False

    def clear(self) -> None:
        """Stop, and erase the line where it was drawn live (idempotent): the next output
        starts on a clean line."""
        self.stop()
        if self.live and not getattr(self, "_cleared", False):
            self._cleared = True
            self._write("\r\033[K")

    def end(self, result: str) -> None:
        """Finish the line with ``result``."""
        self.stop()
        if self.stream is not None:
            self._write(("\r" if self.live else "") + f"{self.text}: {result}\n")
