"""Importing attnsvm leaves the user's matplotlib backend alone (issue 13 §4): a notebook
keeps its inline plots. Only the command line selects Agg, and its figures still render.

One fresh interpreter (the backend is process state): the user's backend is set to svg
through MPLBACKEND (as a notebook or a user's matplotlibrc would set theirs), every
module of attnsvm is imported, the backend must still be svg; then ``attnsvm.cli.main``
runs ``reproduce`` on a demo experiment that draws a figure with attnsvm.plotting, and
the backend is Agg and the PNG is on disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    import matplotlib
    import attnsvm

    names = sorted(m.name for m in pkgutil.walk_packages(attnsvm.__path__, "attnsvm.")
                   if not m.name.endswith("__main__"))
    after = {}
    for name in names:
        importlib.import_module(name)
        after[name] = matplotlib.get_backend()
    from attnsvm.experiments import registry
    registry()  # imports every experiment module and its plotting
    after["registry()"] = matplotlib.get_backend()

    from attnsvm.cli import main
    rc = main(["reproduce", "backend_demo:EXP", "--scale", "tiny", "--out", sys.argv[1]])
    print(json.dumps({"after": after, "rc": rc, "cli": matplotlib.get_backend()}))
""")

DEMO = textwrap.dedent("""
    import pandas as pd
    from attnsvm import plotting as P
    from attnsvm.experiments import Experiment

    def plot(tables, cfg, out):
        fig, (ax,) = P.subplots()
        P.band(ax, tables["t"], "x", "y", label="y")
        P.label(ax, "x", "y", "demo")
        return [P.save(fig, out, "band")]

    EXP = Experiment("demo-backend", "-", "-", {"tiny": {"n": 5}},
                     lambda cfg: {"t": pd.DataFrame({"x": list(range(cfg["n"])) * 2,
                                                     "y": [float(i) for i in range(10)]})},
                     lambda t, c: [], plot, in_default=False)
""")


def test_import_keeps_the_backend_and_the_cli_renders_headless(tmp_path):
    (tmp_path / "backend_demo.py").write_text(DEMO)
    env = dict(os.environ, MPLBACKEND="svg",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    env.pop("DISPLAY", None)
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    changed = {name: b for name, b in res["after"].items() if b.lower() != "svg"}
    assert not changed, f"importing these switched the backend: {changed}"
    assert {"attnsvm.plotting", "attnsvm.experiments", "attnsvm.cli"} <= set(res["after"])
    assert res["rc"] == 0 and res["cli"].lower() == "agg"
    png = out / "demo-backend" / "band.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
