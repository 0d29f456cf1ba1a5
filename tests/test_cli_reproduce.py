"""No lost work in ``attnsvm reproduce`` (issue 11 §3).

Two small experiments defined in a module written by the test: ``demo-a`` (a table, a
figure, a claim and a sanity check) and ``demo-b``, which blocks when ``DEMO_BLOCK`` is
set after writing that file (so the test knows demo-a has finished). A reproduce run in
a subprocess is killed (SIGINT, SIGKILL) while demo-b runs: demo-a's section, figure,
tables and verdicts must be on disk. Re-running demo-b, then demo-a at another scale,
into the folder must keep the other section and say that the scales differ.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from attnsvm.cli import main

DEMO = textwrap.dedent('''
    import os
    import time
    from pathlib import Path

    import pandas as pd

    from attnsvm.experiments import Check, Experiment

    CONFIGS = {"tiny": {"k": 1.0}, "quick": {"k": 2.0}, "full": {"k": 3.0}}


    def compute_a(cfg):
        return {"curve": pd.DataFrame({"x": range(5), "y": [cfg["k"] * v for v in range(5)]})}


    def compute_b(cfg):
        block = os.environ.get("DEMO_BLOCK")
        if block:
            Path(block).write_text(str(os.getpid()))
            time.sleep(300)
        return {"steps": pd.DataFrame({"t": [0, 1, 2], "loss": [3.0, 2.0, 1.0]})}


    def judge_a(t, cfg):
        last = float(t["curve"].y.iloc[-1])
        return [Check("y grows with x", f"y(4) = {last:g}", last > 0, quote="y grows.",
                      where="Fig. 1"),
                Check("the curve has 5 rows", f"{len(t['curve'])} rows", len(t["curve"]) == 5,
                      kind="sanity"),
                Check("y stays below 1 on a bigger grid", f"y(4) = {last:g}", last < 1,
                      kind="finding")]


    def judge_b(t, cfg):
        return [Check("the loss decreases", "3 -> 1", True)]


    def plot(t, cfg, out):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(3, 2))
        df = next(iter(t.values()))
        ax.plot(df.iloc[:, 0], df.iloc[:, 1])
        path = Path(out) / "curve.png"
        fig.savefig(path)
        plt.close(fig)
        return [path]


    A = Experiment("demo-a", "Demo A", "y grows with x", CONFIGS, compute_a, judge_a, plot,
                   in_default=False, deviations=("k = 1 instead of the paper's 2 (a demo)",))
    B = Experiment("demo-b", "Demo B", "the loss decreases", CONFIGS, compute_b, judge_b, plot,
                   in_default=False)
    C = Experiment("demo-c", "Demo C", "needs a package", CONFIGS, compute_b, judge_b, plot,
                   requires=(("attnsvm_no_such_module", "probe"),))
''')


def section(report: str, name: str) -> str:
    """The Markdown section of experiment ``name`` (up to the next section)."""
    return report.split(f"\n## {name}\n")[1].split("\n## ")[0]


@pytest.fixture
def demo(tmp_path, monkeypatch):
    mod = "reproduce_demo_mod"
    (tmp_path / f"{mod}.py").write_text(DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, mod, raising=False)
    return mod


def _start(demo: str, tmp_path: Path, out: Path) -> tuple[subprocess.Popen, Path]:
    flag = tmp_path / "b-started"
    env = dict(os.environ, DEMO_BLOCK=str(flag), MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from attnsvm.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "reproduce", f"{demo}:A", f"{demo}:B",
                             "--scale", "tiny", "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not flag.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out_, err_ = proc.communicate()
            pytest.fail(f"demo-b never started (rc {proc.returncode}):\n{out_}\n{err_}")
        time.sleep(0.1)
    return proc, flag


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_killed_reproduce_keeps_finished_experiments(demo, tmp_path, capsys, sig):
    out = tmp_path / "report"
    proc, _ = _start(demo, tmp_path, out)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, stderr
        assert "interrupted during demo-b" in stderr and "Traceback" not in stderr
    else:
        assert proc.returncode == -signal.SIGKILL

    # demo-a is on disk: record, section, figure, tables, verdicts; demo-b is not
    report = (out / "report.md").read_text()
    a = section(report, "demo-a")
    assert "y grows with x" in a and "y(4) = 4" in a and "**holds**" in a
    assert "![demo-a: curve](demo-a/curve.png)" in a and "scale `tiny`" in a
    assert "k = 1 instead of the paper's 2" in report.split("## demo-a")[0]  # differences
    assert "## demo-b" not in report
    assert (out / "demo-a" / "curve.png").stat().st_size > 1000
    table = pd.read_parquet(out / "tables" / "demo-a__curve.parquet")
    assert table.y.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    verdicts = pd.read_csv(out / "verdicts.csv")
    assert verdicts[["experiment", "kind", "verdict"]].values.tolist() == [
        ["demo-a", "claim", "holds"], ["demo-a", "sanity", "holds"],
        ["demo-a", "finding", "does not hold"]]
    # the failing finding is reported apart and never counted as the paper failing
    assert "**Paper claims at the paper's setting: 1 of 1 hold.**" in report
    assert "findings beyond the papers: 0 of 1 hold" in report
    assert "paper claims 1/1 hold, findings 0/1, sanity 1/1" in stdout
    record = json.loads((out / "demo-a" / "result.json").read_text())
    assert record["scale"] == "tiny" and record["tables"]["curve"]["rows"] == 5
    assert not (out / "demo-b" / "result.json").exists()
    assert not list(out.rglob(".*.tmp"))  # nothing half-written left behind

    # re-run demo-b alone into the folder: its section is added, demo-a's is kept as is
    a_record = (out / "demo-a" / "result.json").read_bytes()
    assert main(["reproduce", f"{demo}:B", "--scale", "tiny", "--out", str(out)]) == 0
    report2 = (out / "report.md").read_text()
    assert section(report2, "demo-a") == a
    assert "the loss decreases" in section(report2, "demo-b")
    assert (out / "demo-a" / "result.json").read_bytes() == a_record
    assert sorted(set(pd.read_csv(out / "verdicts.csv").experiment)) == ["demo-a", "demo-b"]
    assert "mixed scales" not in report2

    # demo-a again at another scale: the report says the folder mixes scales
    assert main(["reproduce", f"{demo}:A", "--scale", "quick", "--out", str(out)]) == 0
    report3 = (out / "report.md").read_text()
    assert "**mixed scales**: `quick` (1), `tiny` (1)" in report3 or \
        "**mixed scales**: `tiny` (1), `quick` (1)" in report3
    assert "This folder mixes scales" in report3
    assert "y(4) = 8" in section(report3, "demo-a") and "scale `quick`" in section(report3, "demo-a")
    assert "scale `tiny`" in section(report3, "demo-b")
    v = pd.read_csv(out / "verdicts.csv")
    assert dict(zip(v.experiment, v.scale)) == {"demo-a": "quick", "demo-b": "tiny"}
    capsys.readouterr()


def test_unreadable_record_is_named_not_dropped_silently(demo, tmp_path, capsys):
    out = tmp_path / "report"
    env_block = os.environ.pop("DEMO_BLOCK", None)
    try:
        assert main(["reproduce", f"{demo}:A", f"{demo}:B", "--scale", "tiny",
                     "--out", str(out)]) == 0
    finally:
        if env_block is not None:
            os.environ["DEMO_BLOCK"] = env_block
    (out / "demo-b" / "result.json").write_text("{ torn")
    assert main(["reproduce", f"{demo}:A", "--scale", "tiny", "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "## demo-a" in report and "## demo-b" not in report
    assert "**Unreadable record**: `demo-b/result.json` could not be read" in report
    capsys.readouterr()


def test_an_experiment_whose_package_is_missing_is_refused_by_name_and_skipped_by_default(
        demo, tmp_path, monkeypatch, capsys):
    """Asked for by name: one line naming the module and the pip extra, exit 2, nothing run
    or written. In the default run: skipped with that line; the others run, exit 0."""
    import dataclasses
    import importlib

    mod = importlib.import_module(demo)
    out = tmp_path / "out"
    assert mod.C.missing() == ("demo-c needs attnsvm_no_such_module "
                               "(pip install 'attnsvm[probe]')")
    assert mod.A.missing() is None
    assert main(["reproduce", f"{demo}:C", "--scale", "tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "attnsvm_no_such_module" in err and "attnsvm[probe]" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()

    import attnsvm.experiments as E

    default = {"demo-a": dataclasses.replace(mod.A, in_default=True), "demo-c": mod.C}
    monkeypatch.setattr(E, "registry", lambda: default)
    assert main(["reproduce", "--scale", "tiny", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert "skipping demo-c needs attnsvm_no_such_module" in cap.err
    assert (out / "demo-a").exists() and not (out / "demo-c").exists()
