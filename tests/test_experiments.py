"""Every registered experiment runs in its tiny configuration, and the report is written.

The verdict logic of each experiment is tested against tables built to fail in
``tests/experiments/``.
"""

from __future__ import annotations

import pandas as pd
import pytest

from attnsvm.experiments import KINDS, Check, Claim, Experiment, registry, run_experiment
from attnsvm.report import markdown_table, write_report

REGISTRY = registry()

@pytest.mark.parametrize("name", list(REGISTRY))
def test_experiment_runs_tiny(name, tmp_path):
    """Every experiment runs at the tiny scale; every paper claim its judge produces quotes the
    paper's sentence and names its place, and every check it produces is one it declares."""
    exp = REGISTRY[name]
    assert {"tiny", "quick", "full"} <= set(exp.configs), "every experiment has three scales"
    res = run_experiment(exp, "tiny", tmp_path / name)
    assert res.error is None, res.error
    assert res.tables and all(isinstance(t, pd.DataFrame) and len(t) for t in res.tables.values())
    assert res.checks and all(isinstance(c, Check) and c.kind in KINDS for c in res.checks)
    assert res.figures and all(p.exists() and p.stat().st_size > 1000 for p in res.figures)
    if exp.verdicts:  # declared verdicts: each check carries its declaration's kind and place
        declared = {(v.kind, v.quote, v.where) for v in exp.verdicts}
        assert {(c.kind, c.quote, c.where) for c in res.checks} <= declared
    unquoted = [c.claim for c in res.claims if not (c.quote.strip() and c.where.strip())]
    assert not unquoted, f"paper claims without the paper's sentence or place: {unquoted}"


def test_a_paper_claim_cannot_be_declared_without_its_sentence():
    with pytest.raises(ValueError, match="quote="):
        Claim("p -> p_mm", where="Theorem 3")
    with pytest.raises(ValueError, match="kind"):
        Claim("p -> p_mm", kind="opinion")
    c = Claim("x >= 1", quote="x is at least one.", where="Sec. 2").at_least("x", 0.5, 1.0)
    assert (c.kind, c.where, c.passed) == ("claim", "Sec. 2", False)
    assert Claim("a new prediction", kind="finding").check("seen", True).kind == "finding"


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
        judge=lambda t, cfg: [Check("x >= 1", "x = 0.5", False, note="seen on 3 of 3 seeds",
                                    quote="x is at least one.", where="Sec. 9"),
                              Check("the data has 1 row", "1 row", True, kind="sanity"),
                              Check("x < 0.6 on a bigger population", "x = 0.7", False,
                                    note="evidence: 12 of 12 runs", kind="finding"),
                              Check("y >= 0", "y = 1", True, quote="y is positive.",
                                    where="Fig. 2")],
        plot=lambda t, cfg, out: [],
        deviations=("eta = 1 instead of the paper's 0.5 (stability)",),
    )
    res = run_experiment(exp, "tiny", tmp_path / "a")
    assert [c.kind for c in res.checks] == ["claim", "sanity", "finding", "claim"]
    assert len(res.claims) == 2 and len(res.sanity_checks) == 1 and len(res.findings) == 1
    text = write_report([res], tmp_path, scale="tiny", total_seconds=1.0).read_text()
    # the headline counts paper claims only; the failing finding is counted apart
    assert "**Paper claims at the paper's setting: 1 of 2 hold.**" in text
    assert "own findings beyond the papers: 0 of 1 hold" in text
    assert "Sanity checks of the set-up: 1 of 1 hold" in text
    assert "| [mmts-demo](#mmts-demo) | demo | tiny | 1/2 | 0/1 | 1/1 |" in text
    diff = text.split("## Where this reproduction differs from the papers")[1].split("\n## ")[0]
    claims, rest = diff.split("### attnsvm's own findings")
    findings, rest = rest.split("### Sanity checks")
    sanity, setting = rest.split("### Departures")
    assert "x >= 1" in claims and "Sec. 9" in claims and "x is at least one." in claims
    assert "seen on 3 of 3 seeds" in claims and "y >= 0" not in claims  # holds: not listed
    assert "x < 0.6 on a bigger population" in findings and "12 of 12 runs" in findings
    assert "x < 0.6" not in claims  # a finding is never listed as a paper failing
    assert "the data has 1 row" not in sanity  # a passing sanity check is not a difference
    assert "eta = 1 instead" in setting
    section = text.split("\n## mmts-demo")[1]
    assert 'Sec. 9: "x is at least one."' in section  # the per-experiment table quotes it
    verdicts = pd.read_csv(tmp_path / "verdicts.csv")
    assert list(verdicts.kind) == ["claim", "sanity", "finding", "claim"]
    assert list(verdicts["where"].fillna("")) == ["Sec. 9", "", "", "Fig. 2"]


def test_cli_list_name_shows_declared_verdicts_and_departures(capsys):
    from attnsvm.cli import main

    assert main(["list", "mmts-fig3"]) == 0
    out = capsys.readouterr().out
    exp = REGISTRY["mmts-fig3"]
    assert "[paper claim] Theorem 6 on the regularization path" in out
    assert "paper: Sec. 3.2, Theorem 6:" in out and "[attnsvm finding]" in out
    assert "[sanity check]" in out and "departures from the paper:" in out
    for dev in exp.deviations:
        assert dev.split()[0] in out
    n = {k: sum(v.kind == k for v in exp.verdicts) for k in KINDS}
    assert f"{n['claim']} paper claims" in out and f"{n['finding']} attnsvm findings" in out


def test_paper_titles_match_citation_cff():
    """The titles the reports print (experiments.base.PAPERS) are the papers' own titles,
    as CITATION.cff lists them (one source for a title: the citation file)."""
    import re
    from pathlib import Path

    from attnsvm.experiments.base import PAPERS

    cff = (Path(__file__).resolve().parents[1] / "CITATION.cff").read_text()
    titles = re.findall(r'title: "([^"]+)"', cff)
    for key in ("mmts", "tfsvm", "rates", "mirror", "kqflow", "ntp"):
        title = PAPERS[key].rsplit(" (", 1)[0]
        assert title.lower() in (t.lower() for t in titles), (key, title)
