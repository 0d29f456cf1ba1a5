"""The package as a user gets it (issue 23): a built wheel installed into a fresh virtual
environment trains with the compiled (fused) engine and solves SVMs with the compiled
active-set path, imported from the installed copy, not from this checkout.

``make dist`` builds the wheel and runs this file with ``ATTNSVM_WHEEL=dist/<wheel>``
(CI does, through .ci/run); without it the test is skipped. The environment shares the
dependencies already installed here (a .pth file adds this interpreter's site-packages),
and the wheel is installed with ``--no-deps``: seconds to install. Most of the time is
numba compiling the two kernels the run uses, as on a user's first run.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.installed

WHEEL = os.environ.get("ATTNSVM_WHEEL", "")

SCRIPT = r"""
import json, sys, warnings
import attnsvm
from attnsvm._optional import CompiledPathsWarning
warnings.simplefilter("error", CompiledPathsWarning)  # a missing compiled path fails the run
from importlib import resources
from attnsvm.data import random_sphere
from attnsvm.models import WModel
from attnsvm.svm import att_svm_batch
from attnsvm.train import train
import attnsvm.fused as fused, attnsvm.svm.active as active

d = random_sphere(n=3, T=3, d=3, seed=0, batch=2)
traj = train(WModel(3), d, steps=3, optimizer="gd")
sol = att_svm_batch(d.X, d.z, d.opt)
print(json.dumps({
    "file": attnsvm.__file__,
    "py_typed": resources.files("attnsvm").joinpath("py.typed").is_file(),
    "engine": traj.extra["engine"],
    "fused_kernels": fused._kernels().__file__,
    "svm_solver": sorted(set(map(str, sol.solver_))),
    "svm_status": sorted(set(map(str, sol.status_))),
    "svm_kernels": active.kernels().__file__,
    "outcome": traj.outcome_line(),
}))
"""


@pytest.mark.skipif(not WHEEL, reason="set ATTNSVM_WHEEL to a built wheel (make dist does)")
def test_installed_wheel_uses_the_compiled_engine_and_svm_path(tmp_path):
    wheel = Path(WHEEL).resolve()
    assert wheel.is_file() and wheel.suffix == ".whl", wheel
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    # share this environment's installed dependencies (torch, numba, ...), after the venv's own
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # the wheel first, into the empty environment (pip would otherwise see the attnsvm of
    # the shared environment and skip it), then the shared dependencies behind it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_DISABLE_JIT")}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "--no-index", "--force-reinstall", "--quiet", str(wheel)], check=True,
                   env=env, cwd=tmp_path)
    here = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_paths()["purelib"]]
    Path(purelib, "_shared_deps.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in here))
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), OMP_NUM_THREADS="1")
    res = subprocess.run([str(py), "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    installed = Path(purelib).resolve()
    for key in ("file", "fused_kernels", "svm_kernels"):  # the installed copy, not the checkout
        assert Path(got[key]).resolve().is_relative_to(installed), (key, got[key])
    assert got["py_typed"]
    assert got["engine"] == "fused"
    assert got["svm_status"] == ["optimal"] and all("active" in s for s in got["svm_solver"])
    assert got["outcome"].startswith("outcome (fro SVM): ")
    # the console script of the wheel runs
    cli = subprocess.run([str(env_dir / "bin" / "attnsvm"), "--help"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and "reproduce" in cli.stdout
    # its version, and the tutorial scripts shipped as package data (nothing fetched)
    cli = subprocess.run([str(env_dir / "bin" / "attnsvm"), "--version"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and cli.stdout.startswith("attnsvm ")
    cli = subprocess.run([str(env_dir / "bin" / "attnsvm"), "examples", "--copy", "ex"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and (tmp_path / "ex" / "quick_tour.py").is_file(), cli.stderr
