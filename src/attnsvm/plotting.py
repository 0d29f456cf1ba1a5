"""Shared plotting: one style, trial bands, saving. Experiments draw from tidy tables.

Importing this module does not select a matplotlib backend: in a notebook the figures
show inline as usual. The command line (``attnsvm.cli.main``) selects the
non-interactive Agg backend before it runs a command, so the commands render figures on
a headless machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]

plt.rcParams.update({
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
})


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


def save(fig, out: Path | str, name: str) -> Path:
    """Save ``fig`` as ``out/name.png`` and close it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
