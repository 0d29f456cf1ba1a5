"""The runnable examples in src/attnsvm/examples/ (package data; `attnsvm examples`) run as a user would run them (a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "src" / "attnsvm" / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    if path.stem == "own_model_tracking":
        pytest.importorskip("transformers")
    env = {**os.environ, "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip()
