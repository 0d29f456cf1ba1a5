"""tools/benign_phase.py: the phase diagram's sweep survives SIGKILL and resumes from its
store (the cells finished before the kill are read back, not recomputed)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("benign_phase", ROOT / "tools" / "benign_phase.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_killed_phase_sweep_resumes_without_recomputing(tmp_path, capsys):
    store, out = tmp_path / "store", tmp_path / "out"
    args = ["--scale", "tiny", "--executor", "local", "--store", str(store), "--out", str(out),
            "--n", "10", "20", "40", "--ratios", "0.2", "--norms", "2"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "benign_phase.py"), *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cells = store / "_cells"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if cells.is_dir() and any(cells.glob("*.json")):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the sweep finished before it could be killed"
    done = sorted(cells.glob("*.json"))
    assert 1 <= len(done) < 3
    before = {p: p.stat().st_mtime_ns for p in store.glob("curves/*.parquet")}
    assert len(before) == len(done)
    assert _tool().main(args) == 0
    text = capsys.readouterr().out
    assert f"3 cells, 3 done ({len(done)} read back from the store)" in text
    assert {p: p.stat().st_mtime_ns for p in before} == before  # not written again
    table = pd.read_csv(out / "phase.csv")
    assert sorted(table.n) == [10, 20, 40] and (table.seeds == 3).all()
    assert (out / "benign_phase.png").stat().st_size > 0
