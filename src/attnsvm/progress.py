"""Progress bars: tqdm's notebook bar where it can draw, its text bar everywhere else.

``tqdm.auto`` picks the notebook widget inside Jupyter, which needs ipywidgets; without it
tqdm warns ``IProgress not found`` and draws nothing useful. :func:`progress_bar` takes the
notebook bar only where ipywidgets imports, and the plain text bar otherwise (a terminal,
a log file, a notebook without ipywidgets), with no warning.
"""

from __future__ import annotations

__all__ = ["progress_bar"]


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
