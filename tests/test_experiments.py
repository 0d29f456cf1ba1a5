"""Every registered experiment runs in its tiny configuration, and the report is written.

The verdict logic of each experiment is tested against tables built to fail in
``tests/experiments/``.
"""

from __future__ import annotations

import pandas as pd
import pytest

from attnsvm.experiments import Check, Experiment, registry, run_experiment
from attnsvm.report import markdown_table, write_report

REGISTRY = registry()


@pytest.mark.parametrize("name", list(REGISTRY))
def test_experiment_runs_tiny(name, tmp_path):
    exp = REGISTRY[name]
    assert {"tiny", "quick", "full"} <= set(exp.configs), "every experiment has three scales"
    res = run_experiment(exp, "tiny", tmp_path / name)
    assert res.error is None, res.error
    assert res.tables and all(isinstance(t, pd.DataFrame) and len(t) for t in res.tables.values())
    assert res.checks and all(isinstance(c, Check) for c in res.checks)
    assert res.figures and all(p.exists() and p.stat().st_size > 1000 for p in res.figures)


def _broken_compute(cfg):
    raise RuntimeError("boom")


def test_report_keeps_results_when_one_experiment_fails(tmp_path):
    good = Experiment(
        name="mmts-demo", title="demo", claim="x is at least 1",
        configs={"tiny": {}, "quick": {}, "full": {}},
        compute=lambda cfg: {"t": pd.DataFrame({"x": [2.0]})},
        judge=lambda t, cfg: [Check("x >= 1", f"x = {t['t'].x[0]}", bool(t["t"].x[0] >= 1))],
        plot=lambda t, cfg, out: [],
    )
    bad = Experiment(name="mmts-broken", title="broken", claim="-", configs=good.configs,
                     compute=_broken_compute, judge=good.judge, plot=good.plot)
    results = [run_experiment(good, "tiny", tmp_path / "a"), run_experiment(bad, "tiny", tmp_path)]
    assert results[0].passed and results[1].error and "boom" in results[1].error
    path = write_report(results, tmp_path, scale="tiny", total_seconds=1.0)
    text = path.read_text()
    assert "mmts-demo" in text and "raised an error" in text and "**holds**" in text
    verdicts = pd.read_csv(tmp_path / "verdicts.csv")
    assert list(verdicts.verdict) == ["holds", "error"]
    assert (tmp_path / "tables" / "mmts-demo__t.parquet").exists()


def test_markdown_table_escapes_pipes():
    md = markdown_table(pd.DataFrame({"a": ["x|y"], "b": [0.123456789]}))
    assert "x\\|y" in md and "0.1235" in md


def test_cli_list_and_unknown_name(capsys):
    from attnsvm.cli import main

    assert main(["list"]) == 0
    assert "experiments" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown experiment"):
        main(["reproduce", "no-such-experiment", "--scale", "tiny"])
