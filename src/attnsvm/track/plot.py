"""The tracker's figure: per-layer and per-head statistics of a tracker table against the step.

One panel per metric (default corr(W, W_mm), soft sparsity, ||W_h||_F); in each, every layer
has one colour, its heads drawn thin and their median over heads thick; the step axis is
logarithmic (symlog, so that step 0, the initialisation, is drawn) and the legend names each
layer and its module. :meth:`attnsvm.track.Tracker.plot` draws it from ``tracker.table``;
``attnsvm probe`` writes it for its single record (the pretrained model and its random
initialisations: the step axis is then replaced by the layer axis, heads as points).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["plot_table", "METRIC_LABELS"]

METRIC_LABELS = {
    "corr_mm": "corr(W, W_mm)",
    "soft_sparsity": "soft sparsity 1/||s||²",
    "wqk_norm": "||W_h||_F",
    "margin_ratio": "margin ratio",
    "max_attn": "max attention",
}


def _figure(**kw):
    """A Figure outside pyplot: no backend is selected or changed (notebook-safe)."""
    from matplotlib.figure import Figure

    return Figure(**kw, layout="constrained")


def plot_table(table: pd.DataFrame, metrics=("corr_mm", "soft_sparsity", "wqk_norm"),
               path=None, title: str = "", by: str | None = None):
    """Figure of a tracker table (columns step, layer, module, head and the metrics).

    With several steps: per metric a panel, x = step (symlog axis), per layer its heads (thin
    lines) and their median over heads (thick line, marked), legend "layer (module)". With a
    single step (a probe): x = layer, each head a point, the median a line; ``by`` (e.g.
    ``"model"`` for the probe's pretrained vs random-init) draws one series per value.
    ``path``: also saved (PNG, 130 dpi). Returns the matplotlib Figure.

    ```pycon
    >>> import pandas as pd
    >>> from attnsvm.track.plot import plot_table
    >>> t = pd.DataFrame(dict(step=[0, 0, 9, 9], layer=0, module="blk", head=[0, 1, 0, 1],
    ...                       corr_mm=[0.1, 0.2, 0.8, 0.9]))
    >>> ax = plot_table(t, ["corr_mm"]).axes[0]
    >>> ax.get_xscale(), [t.get_text() for t in ax.get_legend().get_texts()]
    ('symlog', ['layer 0 (blk)'])

    ```
    """
    if isinstance(metrics, str):
        metrics = [metrics]
    metrics = list(metrics)
    need = {"layer", "head", *metrics}
    missing = sorted(need - set(table.columns))
    if missing:
        raise ValueError(f"plot_table: the table has no column {missing[0]!r}; have {list(table.columns)}")
    if not metrics:
        raise ValueError("plot_table: give at least one metric")
    from attnsvm.plotting import COLORS

    steps = sorted(table["step"].unique()) if "step" in table else [0]
    fig = _figure(figsize=(4.2 * len(metrics), 3.4))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    mods = (table.drop_duplicates("layer").set_index("layer")["module"]
            if "module" in table else pd.Series(dtype=object))

    def name(layer):
        m = mods.get(layer, "")
        return f"layer {int(layer)}" + (f" ({m})" if m else "")

    for ax, col in zip(axes, metrics):
        vals = table.assign(_v=pd.to_numeric(table[col], errors="coerce"))
        if len(steps) > 1:
            for i, (layer, g) in enumerate(vals.groupby("layer", sort=True)):
                c = COLORS[i % len(COLORS)]
                for _, h in g.groupby("head"):
                    h = h.sort_values("step")
                    ax.plot(h.step, h._v, color=c, lw=0.6, alpha=0.35)
                med = g.groupby("step")._v.median()
                ax.plot(med.index, med.to_numpy(), color=c, lw=2.0, marker="o", ms=3, label=name(layer))
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlabel("step (log)")
        else:
            series = [(None, vals)] if by is None or by not in vals else list(vals.groupby(by, sort=False))
            for j, (key, g) in enumerate(series):
                c = COLORS[j % len(COLORS)]
                ax.scatter(g.layer + 0.08 * (j - (len(series) - 1) / 2), g._v, s=9, color=c, alpha=0.5)
                med = g.groupby("layer")._v.median()
                ax.plot(med.index, med.to_numpy(), color=c, lw=2.0, marker="o", ms=3,
                        label="median over heads" if key is None else str(key))
            layers = sorted(vals.layer.unique())
            ax.set_xticks(layers)
            ax.set_xticklabels([name(la) for la in layers], rotation=60, ha="right", fontsize=6)
            ax.set_xlabel("layer")
        ax.set_ylabel(METRIC_LABELS.get(col, col))
        ax.grid(alpha=0.3)
        if np.isfinite(vals._v).any():
            ax.legend(title="layer (module)" if len(steps) > 1 else (by or None), fontsize=6,
                      title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=130)
    return fig
