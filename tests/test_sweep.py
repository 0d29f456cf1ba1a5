"""Sweeps: grids, the Parquet store, resume, failures, and the executors agree.

The experiment here is built in the test (nothing is registered globally): its
compute is a closed form, value_t = a t^2 + seed for t = 0..n-1, whose sum is
a (n-1) n (2n-1) / 6 + seed n, and every call appends a line to a log file so the
tests can count how often compute ran, in any process.
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

import numpy as np
import pandas as pd
import pytest

from attnsvm.experiments import Experiment
from attnsvm.sweep import cell_key, grid, load, sweep


def _compute(cfg: dict) -> dict[str, pd.DataFrame]:
    with open(cfg["log"], "a") as f:
        f.write(json.dumps({"a": cfg["a"], "seed": cfg["seed"]}) + "\n")
    if cfg["a"] == 0:
        raise ValueError("a must be nonzero")
    if cfg["seed"] == cfg["stop_at"] and os.path.exists(cfg["stop_file"]):
        raise KeyboardInterrupt  # what Ctrl-C during this cell looks like
    n, a, seed = cfg["n"], cfg["a"], cfg["seed"]
    t = np.arange(n, dtype=np.float64)
    curve = pd.DataFrame({"step": np.arange(n), "value": a * t**2 + seed})
    summary = pd.DataFrame({"total": [curve.value.sum()],
                            "closed_form": [a * (n - 1) * n * (2 * n - 1) / 6 + seed * n]})
    return {"curve": curve, "summary": summary}


def make_experiment(tmp_path: Path) -> Experiment:
    base = {"n": 4, "a": 1.0, "seed": 0, "stop_at": -1,
            "log": str(tmp_path / "calls.log"), "stop_file": str(tmp_path / "STOP")}
    return Experiment(
        name="demo-closedform", title="closed form", claim="sum of a t^2 + seed",
        configs={"tiny": dict(base), "quick": dict(base, n=6), "full": dict(base, n=100)},
        compute=_compute, judge=lambda tables, cfg: [], plot=lambda tables, cfg, out: [],
        in_default=False)


def calls(tmp_path: Path) -> list[dict]:
    log = tmp_path / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def expected(exp: Experiment, cells: list[dict], table: str, scale: str = "tiny") -> pd.DataFrame:
    """The tables computed directly, cell by cell, with the cell's parameters as columns."""
    frames = []
    for cell in cells:
        cfg = dict(exp.config(scale, **cell), log=os.devnull)  # not counted as a sweep call
        df = exp.compute(cfg)[table]
        for k, v in cell.items():
            df[k] = v
        df["cell"] = cell_key(cell, scale)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def test_grid_is_the_cartesian_product():
    cells = grid(d=[10, 20, 40], seed=range(10))
    assert len(cells) == 30
    assert cells[0] == {"d": 10, "seed": 0} and cells[-1] == {"d": 40, "seed": 9}
    assert {(c["d"], c["seed"]) for c in cells} == {(d, s) for d in (10, 20, 40)
                                                    for s in range(10)}
    assert grid(norm="fro", p=np.array([1.5, 2.0])) == [{"norm": "fro", "p": 1.5},
                                                        {"norm": "fro", "p": 2.0}]
    assert type(grid(p=np.array([1, 2]))[0]["p"]) is int
    assert grid() == [{}]
    with pytest.raises(ValueError, match="axis 'd' has no values"):
        grid(d=[])


def test_cell_key_is_stable():
    assert cell_key({"a": 1, "b": [1, 2]}) == cell_key({"b": (1, 2), "a": np.int64(1)})
    assert cell_key({"a": 1}) != cell_key({"a": 2})
    assert cell_key({"a": 1}, "tiny") != cell_key({"a": 1}, "full")
    assert len(cell_key({})) == 16 and cell_key({}) == "fb32b70a4f7709e2"  # never changes


def test_sweep_equals_compute_per_cell(tmp_path):
    exp = make_experiment(tmp_path)
    cells = grid(a=[0.5, 2.0], seed=range(3))
    res = sweep(exp, cells, scale="tiny", store=tmp_path / "store", progress=False)
    assert res.ok and set(res.tables) == {"curve", "summary"}
    for table in ("curve", "summary"):
        pd.testing.assert_frame_equal(res[table], expected(exp, cells, table),
                                      check_dtype=False)
    s = res["summary"]
    np.testing.assert_allclose(s.total, s.closed_form, rtol=1e-12)
    # the store holds one file per (table, cell), and load() reads the same rows back
    assert len(list((tmp_path / "store" / "curve").glob("cell=*.parquet"))) == 6
    back = load(tmp_path / "store")
    for table in ("curve", "summary"):
        pd.testing.assert_frame_equal(back[table], res[table])
    manifest = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert manifest["experiment"] == exp.name
    assert [c["status"] for c in manifest["cells"].values()] == ["done"] * 6
    assert list(res.cells.status) == ["done"] * 6 and not res.cells.resumed.any()


def test_resume_does_not_recompute(tmp_path):
    exp = make_experiment(tmp_path)
    store = tmp_path / "store"
    first = grid(a=[1.0, 2.0], seed=range(2))
    sweep(exp, first, scale="tiny", store=store, progress=False)
    assert len(calls(tmp_path)) == 4
    mtimes = {p: p.stat().st_mtime_ns for p in store.rglob("*.parquet")}
    more = grid(a=[1.0, 2.0, 3.0], seed=range(2))
    res = sweep(exp, more, scale="tiny", store=store, progress=False)
    assert len(calls(tmp_path)) == 6 and {c["a"] for c in calls(tmp_path)[4:]} == {3.0}
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items())
    assert list(res.cells.resumed) == [True] * 4 + [False] * 2
    pd.testing.assert_frame_equal(res["curve"], expected(exp, more, "curve"), check_dtype=False)
    # another scale is another cell; duplicates run once
    sweep(exp, [{"a": 1.0, "seed": 0}] * 3, scale="quick", store=store, progress=False)
    assert len(calls(tmp_path)) == 7
    assert len(load(store, scale="quick")["curve"]) == 6  # quick has n = 6 steps


def test_interrupted_sweep_keeps_finished_cells_and_resumes(tmp_path):
    exp = make_experiment(tmp_path)
    store = tmp_path / "store"
    cells = grid(seed=range(4), stop_at=2)
    (tmp_path / "STOP").touch()
    with pytest.raises(KeyboardInterrupt):
        sweep(exp, cells, scale="tiny", store=store, progress=False)
    assert sorted(load(store)["summary"].seed) == [0, 1]  # finished before the interrupt
    (tmp_path / "STOP").unlink()
    res = sweep(exp, cells, scale="tiny", store=store, progress=False)
    assert [c["seed"] for c in calls(tmp_path)] == [0, 1, 2, 2, 3]
    assert res.ok and list(res["summary"].seed) == [0, 1, 2, 3]


def test_failing_cell_is_recorded_and_others_survive(tmp_path):
    exp = make_experiment(tmp_path)
    store = tmp_path / "store"
    cells = grid(a=[1.0, 0.0, 3.0], seed=[5])
    res = sweep(exp, cells, scale="tiny", store=store, progress=False)
    assert not res.ok and list(res.cells.status) == ["done", "failed", "done"]
    assert len(res.failed) == 1 and res.failed.a.iloc[0] == 0.0
    assert "ValueError: a must be nonzero" in res.failed.error.iloc[0]
    assert list(res["summary"].a) == [1.0, 3.0]
    pd.testing.assert_frame_equal(res["curve"], expected(exp, [cells[0], cells[2]], "curve"),
                                  check_dtype=False)
    manifest = json.loads((store / "manifest.json").read_text())
    bad = manifest["cells"][cell_key(cells[1], "tiny")]
    assert bad["status"] == "failed" and "a must be nonzero" in bad["error"]
    assert bad["params"] == {"a": 0.0, "seed": 5}
    assert "FAILED" in res.summary()
    failed = load(store, failed=True)["_failed"]
    assert list(failed.a) == [0.0] and "a must be nonzero" in failed.error.iloc[0]
    # a rerun retries only the failed cell (by default), or nothing at all
    sweep(exp, cells, scale="tiny", store=store, progress=False)
    sweep(exp, cells, scale="tiny", store=store, progress=False, retry_failed=False)
    assert [c["a"] for c in calls(tmp_path)] == [1.0, 0.0, 3.0, 0.0]


def test_bad_cells_and_stores_are_refused(tmp_path):
    exp = make_experiment(tmp_path)
    with pytest.raises(ValueError, match=r"sets \['sed'\]"):
        sweep(exp, grid(sed=[1]), scale="tiny", store=tmp_path / "s", progress=False)
    with pytest.raises(ValueError, match="executor"):
        sweep(exp, grid(seed=[1]), scale="tiny", store=tmp_path / "s", executor="gpu")
    sweep(exp, grid(seed=[1]), scale="tiny", store=tmp_path / "s", progress=False)
    other = Experiment("demo-other", "-", "-", exp.configs, _compute, exp.judge, exp.plot)
    with pytest.raises(ValueError, match="holds a sweep of 'demo-closedform'"):
        sweep(other, grid(seed=[1]), scale="tiny", store=tmp_path / "s", progress=False)


def test_dask_local_cluster_equals_local_run(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    exp = make_experiment(tmp_path)
    cells = grid(a=[0.0, 1.0, 2.0], seed=range(2))
    local = sweep(exp, cells, scale="tiny", store=tmp_path / "local", progress=False)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        remote = sweep(exp, cells, scale="tiny", store=tmp_path / "dask", executor=client,
                       progress=False)
        assert client.status == "running"  # a client we were given is left open
    for table in ("curve", "summary"):
        pd.testing.assert_frame_equal(remote[table], local[table])
    assert list(remote.cells.status) == list(local.cells.status)
    assert remote.failed.cell.tolist() == local.failed.cell.tolist()


def test_process_pool_equals_local_run(tmp_path):
    exp = make_experiment(tmp_path)
    cells = grid(a=[1.0, 0.0], seed=range(2))
    local = sweep(exp, cells, scale="tiny", store=tmp_path / "local", progress=False)
    procs = sweep(exp, cells, scale="tiny", store=tmp_path / "procs", executor="processes",
                  workers=2, progress=False)
    for table in ("curve", "summary"):
        pd.testing.assert_frame_equal(procs[table], local[table])
    assert list(procs.cells.status) == ["done", "done", "failed", "failed"]
    assert len({c["a"] for c in calls(tmp_path)}) == 2 and len(calls(tmp_path)) == 8


def test_cli_parses_grids_and_runs(tmp_path, monkeypatch, capsys):
    from attnsvm.cli import main
    from attnsvm.cli.sweep import parse_axis, parse_value

    assert parse_axis("seed=0:3") == ("seed", [0, 1, 2])
    assert parse_axis("d=2,4,8") == ("d", [2, 4, 8])
    assert parse_axis("x=0:6:2,10") == ("x", [0, 2, 4, 10])
    assert parse_axis("lr=0.1,1e-2") == ("lr", [0.1, 0.01])
    assert parse_axis("norm=fro,nuc") == ("norm", ["fro", "nuc"])
    assert [parse_value(v) for v in ("true", "None", "-3")] == [True, None, -3]
    for bad in ("d", "d=", "seed=3:3", "lr=0.1:0.5"):
        with pytest.raises(ValueError):
            parse_axis(bad)

    (tmp_path / "sweep_cli_demo.py").write_text(textwrap.dedent("""
        import pandas as pd
        from attnsvm.experiments import Experiment

        def compute(cfg):
            if cfg["d"] == 8:
                raise RuntimeError("d = 8 is broken")
            return {"t": pd.DataFrame({"y": [cfg["d"] * 10 + cfg["seed"]]})}

        EXP = Experiment("demo-cli", "-", "-", {"tiny": {"d": 1, "seed": 0}}, compute,
                         lambda t, c: [], lambda t, c, o: [], in_default=False)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    store = tmp_path / "cli-store"
    argv = ["sweep", "sweep_cli_demo:EXP", "--grid", "d=2,4,8", "--grid", "seed=0:2",
            "--scale", "tiny", "--store", str(store), "--no-progress"]
    assert main(argv) == 1  # one axis value fails
    out = capsys.readouterr().out
    assert "6 cells" in out and "4 done" in out and "2 failed" in out and "d = 8 is broken" in out
    assert sorted(load(store)["t"].y) == [20, 21, 40, 41]
    assert main(argv + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count(" done ") == 4 and out.count(" failed ") == 2
    assert main(["sweep", "sweep_cli_demo:EXP", "--grid", "d"]) == 2
    err = capsys.readouterr().err
    assert "--grid expects KEY=VALUES" in err and err.count("\n") == 1


def test_corrupt_or_foreign_stores_are_refused_not_merged(tmp_path):
    exp = make_experiment(tmp_path)
    cells = grid(seed=[1, 2])
    store = tmp_path / "s"
    sweep(exp, cells, scale="tiny", store=store, progress=False)
    n_calls = len(calls(tmp_path))
    manifest = store / "manifest.json"
    good = manifest.read_text()
    bad_manifests = {
        "{ torn": "manifest.json is corrupt",
        "[1, 2]": "is not a sweep manifest",
        '{"cells": {}}': "is not a sweep manifest",
        '{"experiment": 3}': "is not a sweep manifest",
    }
    for text, problem in bad_manifests.items():
        manifest.write_text(text)
        with pytest.raises(ValueError, match=problem):
            sweep(exp, cells, scale="tiny", store=store, progress=False)
        with pytest.raises(ValueError, match=problem):
            load(store)
        assert manifest.read_text() == text  # refused: not rewritten, not merged
    assert len(calls(tmp_path)) == n_calls
    manifest.write_text(good.replace('"demo-closedform"', '"demo-other"'))
    with pytest.raises(ValueError, match="holds a sweep of 'demo-other'"):
        sweep(exp, cells, scale="tiny", store=store, progress=False)
    # a deleted manifest is rebuilt from this experiment's cell records (nothing recomputed)
    manifest.unlink()
    res = sweep(exp, cells, scale="tiny", store=store, progress=False)
    assert res.ok and list(res.cells.resumed) == [True, True]
    assert json.loads(manifest.read_text())["experiment"] == exp.name
    assert len(calls(tmp_path)) == n_calls
    # ... but not from another experiment's records
    manifest.unlink()
    other = Experiment("demo-other", "-", "-", exp.configs, _compute, exp.judge, exp.plot)
    with pytest.raises(ValueError, match="holds cells of 'demo-closedform'"):
        sweep(other, cells, scale="tiny", store=store, progress=False)
    # a folder that is not a store, and a file, are refused
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "thesis.tex").write_text("precious")
    with pytest.raises(ValueError, match="non-empty folder without a sweep manifest.json"):
        sweep(exp, cells, scale="tiny", store=junk, progress=False)
    assert sorted(p.name for p in junk.iterdir()) == ["thesis.tex"]
    with pytest.raises(ValueError, match="exists and is not a folder"):
        sweep(exp, cells, scale="tiny", store=junk / "thesis.tex", progress=False)
    # a new store claims its folder at once (a sweep killed before its first cell)
    fresh = tmp_path / "fresh"
    from attnsvm.sweep import _Store

    _Store(fresh, exp.name)
    assert json.loads((fresh / "manifest.json").read_text())["experiment"] == exp.name


SLOW_EXPERIMENT = textwrap.dedent("""
    import os
    import time

    import pandas as pd

    from attnsvm.experiments import Experiment


    def compute(cfg):
        with open(os.path.join(cfg["dir"], f"worker-{os.getpid()}"), "w") as f:
            f.write(str(os.getppid()))
        time.sleep(cfg["sleep"])
        return {"t": pd.DataFrame({"x": [cfg["seed"]]})}


    EXP = Experiment("demo-slow", "-", "-", {"tiny": {"seed": 0, "sleep": 300.0, "dir": "."}},
                     compute, lambda t, c: [], lambda t, c, o: [], in_default=False)
""")


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone: it holds no memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_process_sweep_leaves_no_worker_behind(tmp_path, sig):
    (tmp_path / "slow_sweep_demo.py").write_text(SLOW_EXPERIMENT)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    store = tmp_path / "store"
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:  # a file, not a pipe: a surviving worker would hold a pipe open
        proc = subprocess.Popen(
            [sys.executable, "-m", "attnsvm.cli", "sweep", "slow_sweep_demo:EXP", "--grid",
             "seed=0:4", "--grid", f"dir={tmp_path}", "--scale", "tiny", "--executor",
             "processes", "--workers", "2", "--store", str(store), "--no-progress"],
            env=env, stdout=subprocess.DEVNULL, stderr=err)
    workers: list[int] = []
    children: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2:  # both workers are inside a 300 s cell
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the workers never started a cell"
            time.sleep(0.1)
            workers = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
        children = _children(proc.pid)
        assert set(workers) <= set(children)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        stderr = log.read_text()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in children if _alive(p)] == [], "processes outlived the sweep"
        if sig == signal.SIGTERM:  # handled: workers stopped, the store's manifest written
            assert proc.returncode == 143 and "terminated" in stderr, stderr
            assert json.loads((store / "manifest.json").read_text())["experiment"] == "demo-slow"
        else:
            assert proc.returncode == -signal.SIGKILL
    finally:
        for p in [proc.pid, *children]:  # never leave this test's processes behind
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()


LIST_DEMO = """
import pandas as pd
from attnsvm.experiments import Experiment

def compute(cfg):
    return {"t": pd.DataFrame({"total": [sum(cfg["ds"]) * cfg["k"]], "n_ds": [len(cfg["ds"])]})}

EXP = Experiment("demo-lists", "-", "-", {"tiny": {"ds": [2, 4], "k": 1, "norm": "fro"}},
                 compute, lambda t, c: [], lambda t, c, o: [], in_default=False)
"""


def test_cli_grid_takes_list_values(tmp_path, monkeypatch, capsys):
    from attnsvm.cli import main
    from attnsvm.cli.sweep import parse_axis

    assert parse_axis("ds=[2,4,8]") == ("ds", [[2, 4, 8]])
    assert parse_axis("ds=[2,4],[8, 16]") == ("ds", [[2, 4], [8, 16]])
    assert parse_axis("ds=[0:3],[[1],[]]") == ("ds", [[0, 1, 2], [[1], []]])
    assert parse_axis('norm=["fro", "nuc"],"a,b"') == ("norm", [["fro", "nuc"], "a,b"])
    assert parse_axis('lr={"sgd": 0.1}') == ("lr", [{"sgd": 0.1}])
    for bad, msg in [("ds=[2,4", "unbalanced brackets"), ("ds=2,4]", "unbalanced brackets"),
                     ("ds=[2]x", "must end with ']'"), ('s="abc', "unbalanced quotes"),
                     ("lr={sgd: 1}", "is not a JSON object")]:
        with pytest.raises(ValueError, match=msg):
            parse_axis(bad)

    (tmp_path / "sweep_list_demo.py").write_text(LIST_DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = tmp_path / "lists"
    base = ["sweep", "sweep_list_demo:EXP", "--scale", "tiny", "--store", str(store),
            "--no-progress"]
    # --dry-run checks the grid and prints the cells, list values included; runs nothing
    assert main(base + ["--grid", "ds=[1,2,3],[10]", "--grid", "k=1,2", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("4 cells of demo-lists at scale 'tiny'")
    assert [line.split(maxsplit=2)[2] for line in out[:-1]] == [
        "{'ds': [1, 2, 3], 'k': 1}", "{'ds': [1, 2, 3], 'k': 2}",
        "{'ds': [10], 'k': 1}", "{'ds': [10], 'k': 2}"]
    assert not store.exists()
    # the run hands compute the lists
    assert main(base + ["--grid", "ds=[1,2,3],[10]", "--grid", "k=1,2"]) == 0
    capsys.readouterr()
    t = load(store)["t"].sort_values(["k", "total"])
    assert t[["total", "n_ds", "k"]].values.tolist() == [[6, 3, 1], [10, 1, 1], [12, 3, 2],
                                                         [20, 1, 2]]

    # keys and value shapes are checked against the config before anything runs
    cases = [
        (["--grid", "sed=1"], "--grid sed: demo-lists has no config key 'sed' at scale 'tiny'; "
                              "its keys: ds, k, norm"),
        (["--grid", "ds=2,4"], "--grid ds=2: ds is a list in demo-lists's config ([2, 4]); "
                               "a list value goes in brackets"),
        (["--grid", "k=[1,2]"], "k is a single number in demo-lists's config (1); for one "
                                "cell per value write k=1,2"),
        (["--grid", "k=1", "--grid", "k=2"], "--grid k is given twice"),
        (["--scale", "full", "--grid", "k=1"], "demo-lists has no scale 'full'; it has tiny"),
    ]
    for extra, msg in cases:
        for dry in ([], ["--dry-run"]):
            assert main(base + extra + dry) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and msg in err, (extra, err)
    assert main(base + ["--grid", "sed=1", "--no-strict", "--dry-run"]) == 0  # let through
    capsys.readouterr()


def test_cli_grid_refuses_a_value_that_is_not_a_number(tmp_path, monkeypatch, capsys):
    """issue 25: ``--grid seed=0:a`` ran and stored failed cells; a number key takes numbers."""
    from attnsvm.cli import main

    (tmp_path / "sweep_list_demo.py").write_text(LIST_DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = tmp_path / "s"
    base = ["sweep", "sweep_list_demo:EXP", "--scale", "tiny", "--store", str(store),
            "--no-progress"]
    for grid_arg, msg in [("k=0:a", "--grid k=0:a: k is a number in demo-lists's config (1); "
                                    "expected numbers, got '0:a' (a range is a:b[:step] with "
                                    "integers)"),
                          ("k=1,x", "expected numbers, got 'x'"),
                          ("k=true", "expected numbers, got True"),
                          ("k=none", "expected numbers, got None")]:
        for dry in ([], ["--dry-run"]):
            assert main(base + ["--grid", grid_arg] + dry) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and msg in err, (grid_arg, err)
    assert not store.exists()  # refused before the store was made
    assert main(base + ["--grid", "norm=fro,2", "--dry-run"]) == 0  # a string key takes any


def _corrupt(path: Path) -> None:
    """Overwrite a Parquet file's middle: its footer still reads, its data do not."""
    raw = bytearray(path.read_bytes())
    raw[4:len(raw) - 12] = b"\x00" * (len(raw) - 16)
    path.write_bytes(bytes(raw))


def test_corrupt_cell_is_skipped_by_load_and_quarantined_and_rerun_by_sweep(tmp_path):
    import warnings

    from attnsvm.sweep import StoreWarning

    exp = make_experiment(tmp_path)
    cells = grid(seed=[1, 2, 3])
    store = tmp_path / "s"
    first = sweep(exp, cells, scale="tiny", store=store, progress=False)
    n_calls = len(calls(tmp_path))
    bad = store / "curve" / f"cell={cell_key({'seed': 2}, 'tiny')}.parquet"
    _corrupt(bad)
    damaged = bad.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - what pyarrow raises: the file is damaged
        pd.read_parquet(bad)

    # load: the cell is left out (both its tables: a cell is whole or absent), named in a
    # warning; the store is not changed
    with pytest.warns(StoreWarning, match=rf"{bad} cannot be read .*; its rows are left out"):
        tables = load(store)
    assert sorted(tables["curve"].seed.unique()) == [1, 3]
    assert sorted(tables["summary"].seed) == [1, 3]
    assert bad.read_bytes() == damaged and not (store / "_quarantine").exists()

    # sweep: moved aside, named in a warning, the cell computed again (only that one)
    with pytest.warns(StoreWarning) as caught:
        res = sweep(exp, cells, scale="tiny", store=store, progress=False)
    msg = str(caught[0].message)
    moved = list((store / "_quarantine" / "curve").iterdir())
    assert len(moved) == 1 and moved[0].read_bytes() == damaged
    assert str(bad) in msg and f"moved to {moved[0]}" in msg and "runs again" in msg
    assert len(calls(tmp_path)) == n_calls + 1 and calls(tmp_path)[-1]["seed"] == 2
    assert list(res.cells.resumed) == [True, False, True]
    for table in ("curve", "summary"):
        pd.testing.assert_frame_equal(res[table], first[table])
        pd.testing.assert_frame_equal(res[table], expected(exp, cells, table))
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreWarning)  # the store is whole again
        pd.testing.assert_frame_equal(load(store)["curve"], first["curve"])


def test_cli_resume_over_a_corrupt_cell_warns_in_one_line_and_succeeds(tmp_path, monkeypatch,
                                                                     capsys):
    from attnsvm.cli import main

    (tmp_path / "sweep_list_demo.py").write_text(LIST_DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = tmp_path / "s"
    argv = ["sweep", "sweep_list_demo:EXP", "--scale", "tiny", "--store", str(store),
            "--no-progress", "--grid", "k=1,2"]
    assert main(argv) == 0
    capsys.readouterr()
    bad = store / "t" / f"cell={cell_key({'k': 2}, 'tiny')}.parquet"
    _corrupt(bad)
    assert main(argv) == 0  # was: exit 2 with pyarrow's ArrowInvalid, the cell never re-run
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnsvm sweep: warning: sweep store")
    assert str(bad) in lines[0] and "runs again" in lines[0]
    assert "2 done (1 read back from the store)" in out
    assert sorted(load(store)["t"].k) == [1, 2]


class _Stop:
    """Cells of the SIGTERM test: seed 1 sends SIGTERM to this process, then waits (as a
    long cell would) until the test releases it."""

    release = None


def _terminating_compute(cfg: dict) -> dict[str, pd.DataFrame]:
    import signal as sg

    if cfg["seed"] == 1:
        os.kill(os.getpid(), sg.SIGTERM)
        _Stop.release.wait(30)
    return {"t": pd.DataFrame({"x": [cfg["seed"]]})}


def test_sigterm_of_a_dask_sweep_stops_it_and_resumes(tmp_path):
    """issue 25: SIGTERM of a Dask sweep exited -15 with no message. Now it raises
    SweepTerminated in the sweep (as the process pool does): the finished cells are
    recorded, the manifest written, a client we were given is left open, and the same
    sweep resumes the rest."""
    import threading

    distributed = pytest.importorskip("dask.distributed")
    from attnsvm.sweep import SweepTerminated

    exp = Experiment("demo-sigterm", "-", "-", {"tiny": {"seed": 0}}, _terminating_compute,
                     lambda t, c: [], lambda t, c, o: [], in_default=False)
    store = tmp_path / "s"
    _Stop.release = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        # seed 0 is done in an earlier run; seeds 1 and 2 run now, and 1 is terminated
        sweep(exp, [{"seed": 0}], scale="tiny", store=store, executor=client, progress=False)
        try:
            with pytest.raises(SweepTerminated, match="terminated by signal 15"):
                sweep(exp, grid(seed=[0, 1, 2]), scale="tiny", store=store, executor=client,
                      progress=False)
        finally:
            _Stop.release.set()
        assert client.status == "running"
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is given back
    manifest = json.loads((store / "manifest.json").read_text())
    done = {c["params"]["seed"] for c in manifest["cells"].values() if c["status"] == "done"}
    assert 0 in done and 1 not in done
    res = sweep(exp, grid(seed=[0, 2]), scale="tiny", store=store, progress=False)
    assert res.ok and sorted(res["t"].x) == [0, 2] and bool(res.cells.resumed.iloc[0])


def test_cli_says_what_a_terminated_sweep_keeps_and_resumes(tmp_path, monkeypatch, capsys):
    import attnsvm.sweep as W
    from attnsvm.cli import main
    from attnsvm.sweep import SweepTerminated

    (tmp_path / "sweep_list_demo.py").write_text(LIST_DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    store = tmp_path / "s"
    argv = ["sweep", "sweep_list_demo:EXP", "--scale", "tiny", "--store", str(store),
            "--no-progress", "--grid", "k=1,2,3"]
    real = W.sweep

    def terminated_after_one(exp, cells, **kw):  # as a Dask sweep SIGTERMed after one cell
        assert kw["executor"] == "dask"
        real(exp, cells[:1], **dict(kw, executor="local"))
        raise SweepTerminated("terminated by signal 15")

    monkeypatch.setattr(W, "sweep", terminated_after_one)
    assert main(argv + ["--executor", "dask"]) == 143
    err = capsys.readouterr().err.strip()
    assert err == (f"attnsvm sweep: terminated (SIGTERM); 1 of 3 cells are finished and "
                   f"stored in {store}/; running the same command again resumes the other 2")
    monkeypatch.setattr(W, "sweep", real)
    assert main(argv) == 0
    assert "3 done (1 read back from the store)" in capsys.readouterr().out
