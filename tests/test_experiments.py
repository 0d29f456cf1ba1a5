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
    assert dict(zip(verdicts.experiment, verdicts.verdict)) == {"mmts-demo": "holds",
                                                                "mmts-broken": "error"}
    assert (tmp_path / "tables" / "mmts-demo__t.parquet").exists()


def test_markdown_table_escapes_pipes():
    md = markdown_table(pd.DataFrame({"a": ["x|y"], "b": [0.123456789]}))
    assert "x\\|y" in md and "0.1235" in md


def test_cli_list_and_unknown_name(capsys):
    from attnsvm.cli import main

    assert main(["list"]) == 0
    assert "experiments" in capsys.readouterr().out
    assert main(["reproduce", "no-such-experiment", "--scale", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnsvm reproduce: error: unknown experiment 'no-such-experiment'")
    assert err.count("\n") == 1


def test_report_separates_sanity_checks_and_lists_findings(tmp_path):
    exp = Experiment(
        name="mmts-demo", title="demo", claim="x is at least 1",
        configs={"tiny": {}, "quick": {}, "full": {}},
        compute=lambda cfg: {"t": pd.DataFrame({"x": [0.5]})},
        judge=lambda t, cfg: [Check("x >= 1", "x = 0.5", False, note="seen on 3 of 3 seeds"),
                              Check("the data has 1 row", "1 row", True, kind="sanity")],
        plot=lambda t, cfg, out: [],
        deviations=("eta = 1 instead of the paper's 0.5 (stability)",),
    )
    res = run_experiment(exp, "tiny", tmp_path / "a")
    assert [c.sanity for c in res.checks] == [False, True]
    assert len(res.claims) == 1 and len(res.sanity_checks) == 1 and not res.passed
    text = write_report([res], tmp_path, scale="tiny", total_seconds=1.0).read_text()
    assert "Claims: 0 of 1 hold; sanity checks of the set-up: 1 of 1 hold" in text
    diff = text.split("## Where this reproduction differs from the papers")[1].split("\n## ")[0]
    assert "x >= 1" in diff and "seen on 3 of 3 seeds" in diff and "eta = 1 instead" in diff
    assert "the data has 1 row" not in diff  # a passing sanity check is not a difference
    verdicts = pd.read_csv(tmp_path / "verdicts.csv")
    assert list(verdicts.kind) == ["claim", "sanity"]
