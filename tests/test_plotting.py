"""Notebook-friendly plotting: figures returned, saved only when asked, no global state."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from attnsvm import plotting as P
from attnsvm.experiments import get


def test_experiment_plot_returns_figures_without_saving(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = get("mmts-fig4")
    cfg = exp.config("tiny")
    figs = exp.plot(exp.compute(cfg), cfg, None)
    assert figs and all(isinstance(f, Figure) for f in figs)
    assert list(tmp_path.iterdir()) == []  # nothing written
    assert all(len(f.axes) >= 2 for f in figs)


def test_save_writes_each_format_and_the_style_stays_local(tmp_path):
    before = dict(matplotlib.rcParams)
    with P.style():
        fig, ax = P.subplots(1)
        ax[0].plot([0, 1], [1, 0])
        assert matplotlib.rcParams["axes.spines.top"] is False
        path = P.save(fig, tmp_path, "demo", formats=("png", "pdf", "svg"))
    assert path == tmp_path / "demo.png"
    assert (tmp_path / "demo.pdf").read_bytes()[:4] == b"%PDF"
    assert b"<svg" in (tmp_path / "demo.svg").read_bytes()[:400]
    assert dict(matplotlib.rcParams) == before  # importing / styling leaves rcParams alone
    with pytest.raises(ValueError, match="figure format must be png, pdf or svg"):
        P.save(P.subplots(1)[0], tmp_path, "x", formats=("jpg",))


def test_metric_draws_on_a_given_axis_or_a_new_figure():
    df = pd.DataFrame({"trial": np.repeat([0, 1], 3), "step": np.tile([0, 1, 2], 2),
                       "loss": [3.0, 2.0, 1.0, 5.0, 4.0, 3.0], "optimizer": "ngd"})
    fig = P.metric(df, "loss")
    assert isinstance(fig, Figure)
    line = fig.axes[0].lines[0]
    np.testing.assert_allclose(line.get_ydata(), [4.0, 3.0, 2.0])  # the median over trials
    fig2, axes = P.subplots(2)
    assert P.metric(df, "loss", ax=axes[1], by="optimizer") is fig2
    with pytest.raises(ValueError, match="metric 'nope' is not a column"):
        P.metric(df, "nope")
