"""Shared plotting: one style, trial bands, saving. Experiments draw from tidy tables.

Importing this module changes nothing global: it selects no matplotlib backend (in a
notebook figures show inline as usual; ``attnsvm.cli.main`` selects Agg for the commands)
and it does not touch ``plt.rcParams`` (the house style applies inside :func:`style`, which
``run_experiment`` uses).

Every plotting function returns its Figure and saves only when asked: ``save(fig, out,
name)`` writes ``out/name.<fmt>`` for each format of ``formats`` (default :data:`FORMATS`,
PNG; "pdf" / "svg" for papers) and returns the first path, or, with ``out=None``, returns
the open Figure unsaved. So ``exp.plot(tables, cfg, None)`` gives an experiment's Figures
in a notebook. The helpers that draw one panel (:func:`band`, :func:`metric`) take an
``ax`` (a new Figure when omitted).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]

#: formats ``save`` writes when none are given (``attnsvm reproduce --formats png,pdf`` sets it)
FORMATS: tuple[str, ...] = ("png",)

#: the house style, applied inside :func:`style` only
STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
}


def style():
    """Context manager: the house style (``STYLE``) for the figures drawn inside it."""
    return plt.rc_context(STYLE)


def subplots(ncols: int = 1, nrows: int = 1, width: float = 3.8, height: float = 3.0,
             **kwargs):
    """``plt.subplots`` sized per panel; always returns a flat array of axes."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False, **kwargs)
    return fig, axes.ravel()


def band(ax, df: pd.DataFrame, x: str, y: str, *, label: str | None = None,
         color: str | None = None, q: tuple[float, float] = (0.1, 0.9), center: str = "median",
         **line_kw):
    """Plot the median (or mean) of ``y`` over trials against ``x`` with a quantile band.

    ``df`` is tidy: one row per (trial, x). Returns the line.
    """
    g = df.groupby(x)[y]
    mid = g.median() if center == "median" else g.mean()
    lo, hi = g.quantile(q[0]), g.quantile(q[1])
    (line,) = ax.plot(mid.index, mid.values, label=label, color=color, **line_kw)
    ax.fill_between(mid.index, lo.values, hi.values, color=line.get_color(), alpha=0.2, lw=0)
    return line


def label(ax, xlabel: str, ylabel: str, title: str | None = None, legend: bool = True):
    """Set the axis labels and the title of ``ax``; add a legend when ``legend`` and some artist
    has a label."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend()


def arrow(ax, vec: Sequence[float], *, color: str, label: str | None = None, scale: float = 1.0,
          ls: str = "--"):
    """Draw a direction through the origin as a dashed ray (2-d parameter plots)."""
    v = np.asarray(vec, dtype=float)[:2]
    n = np.linalg.norm(v)
    if n == 0:
        return
    v = v / n * scale
    ax.plot([0, v[0]], [0, v[1]], ls=ls, color=color, lw=1.5, label=label)


def save(fig, out: Path | str | None, name: str, formats: Sequence[str] | None = None):
    """Save ``fig`` as ``out/name.<fmt>`` for each format (default :data:`FORMATS`), close it
    and return the first path; with ``out=None`` return the Figure itself, unsaved and open
    (for a notebook)."""
    fig.tight_layout()
    if out is None:
        return fig
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats or FORMATS:
        fmt = fmt.lower().lstrip(".")
        if fmt not in ("png", "pdf", "svg"):
            raise ValueError(f"figure format must be png, pdf or svg; got {fmt!r}")
        paths.append(out / f"{name}.{fmt}")
        fig.savefig(paths[-1])
    plt.close(fig)
    return paths[0]


def metric(metrics: pd.DataFrame, y: str, x: str = "step", *, ax=None, by: str | None = None,
           logy: bool = False, **kw):
    """Median (band: 10-90% quantiles over trials) of a metric of ``train``'s tidy table
    against ``x``; ``by``: one curve per value of that column (e.g. "optimizer").
    Returns the Figure (a new one when ``ax`` is None; in a notebook it is displayed once,
    as the returned value: see :func:`_display_once`)."""
    if y not in metrics:
        raise ValueError(f"metric {y!r} is not a column of the table; have {list(metrics.columns)}")
    new = ax is None
    if new:
        fig, axes = subplots(1)
        ax = axes[0]
    groups = [(None, metrics)] if by is None else list(metrics.groupby(by, sort=False))
    for i, (key, g) in enumerate(groups):
        band(ax, g, x, y, label=None if key is None else str(key), color=COLORS[i % len(COLORS)], **kw)
    if logy:
        ax.set_yscale("log")
    label(ax, x, y)
    if new:
        _display_once(ax.figure)
    return ax.figure


def _inline_backend() -> bool:
    """Whether pyplot draws into a notebook's output (the inline backend)."""
    import matplotlib

    return "inline" in str(matplotlib.get_backend()).lower()


def _display_once(fig) -> None:
    """Under Jupyter's inline backend, take a new Figure out of pyplot's registry: the
    notebook then shows it once, as the returned value, instead of once more when the
    cell's open pyplot figures are flushed. Elsewhere it stays open (``plt.show()``)."""
    if _inline_backend():
        plt.close(fig)
