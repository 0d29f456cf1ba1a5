"""Counted nouns in messages: ``'1 experiment'``, ``'2 experiments'``."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word`` in the singular for 1, else the plural (``many``: an irregular
    plural; default ``word + 's'``).

    >>> plural(1, "experiment"), plural(2, "run"), plural(1, "run misses", "runs miss")
    ('1 experiment', '2 runs', '1 run misses')
    """
    return f"{n} {word if n == 1 else (many or word + 's')}"
