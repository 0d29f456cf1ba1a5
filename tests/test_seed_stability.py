"""``attnsvm reproduce --seed K`` and the verdict comparison of ``tools/seed_stability.py``
(issue 24: on seeds never shipped, verdicts must equal the shipped seed's, and no check may
pass only on the shipped seed)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from attnsvm.cli import main
from attnsvm.experiments.base import offset_seeds, seed_keys

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("seed_stability",
                                                  ROOT / "tools" / "seed_stability.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------- --seed offsets
def test_offset_seeds_moves_every_seed_and_nothing_else():
    cfg = {"seed": 3, "init_seed": 7, "seeds": 2, "n": 5, "use_seed": True, "name_seed": "x"}
    assert seed_keys(cfg) == ["seed", "init_seed"]  # a count, a flag, a string are not seeds
    assert offset_seeds(cfg, 1001) == {"seed": 1004, "init_seed": 1008}
    assert offset_seeds(cfg, 0) == {"seed": 3, "init_seed": 7}
    assert offset_seeds({"n": 5}, 9) == {}
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seed offset"):
            offset_seeds(cfg, bad)


DEMO = textwrap.dedent('''
    import numpy as np
    import pandas as pd
    from attnsvm.experiments import Check, Experiment

    def compute(cfg):
        x = np.random.default_rng(cfg["seed"]).standard_normal(4)
        return {"draw": pd.DataFrame({"x": x, "seed": cfg["seed"]})}

    def judge(t, cfg):
        return [Check("the draw has 4 rows", f"{len(t['draw'])} rows", len(t["draw"]) == 4,
                      kind="sanity")]

    CONFIGS = {s: {"seed": 2, "n": 4} for s in ("tiny", "quick", "full")}
    SEEDED = Experiment("demo-seeded", "Demo", "draws", CONFIGS, compute, judge,
                        lambda t, cfg, out: [], in_default=False)

    def compute_fixed(cfg):
        return {"draw": pd.DataFrame({"x": [1.0]})}

    FIXED = Experiment("demo-fixed", "Demo", "no seed", {"tiny": {"n": 4}}, compute_fixed,
                       lambda t, cfg: [], lambda t, cfg, out: [], in_default=False)
''')


def test_reproduce_seed_offsets_every_experiments_seed(tmp_path, monkeypatch, capsys):
    (tmp_path / "seed_demo_mod.py").write_text(DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "seed_demo_mod", raising=False)
    out = tmp_path / "r"
    assert main(["reproduce", "seed_demo_mod:SEEDED", "seed_demo_mod:FIXED", "--scale", "tiny",
                 "--seed", "1001", "--out", str(out)]) == 0
    assert "seeds + 1001" in capsys.readouterr().out
    rec = json.loads((out / "demo-seeded" / "result.json").read_text())
    assert rec["config"]["seed"] == 1003 and rec["config"]["n"] == 4
    draw = pd.read_parquet(out / rec["tables"]["draw"]["path"])
    assert set(draw.seed) == {1003}
    assert "seed" not in json.loads((out / "demo-fixed" / "result.json").read_text())["config"]
    # a negative offset is refused at parse time, before any run
    assert main(["reproduce", "seed_demo_mod:SEEDED", "--seed", "-1", "--out",
                 str(tmp_path / "x")]) == 2
    assert "--seed: expected an integer >= 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_rejudge_rewrites_the_verdicts_from_the_stored_tables(tmp_path, monkeypatch):
    (tmp_path / "seed_demo_mod.py").write_text(DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "seed_demo_mod", raising=False)
    out = tmp_path / "r"
    assert main(["reproduce", "seed_demo_mod:SEEDED", "--scale", "tiny", "--out", str(out)]) == 0
    import dataclasses

    import seed_demo_mod

    def strict(t, cfg):  # a new judge: fails on the same tables
        return [seed_demo_mod.Check("the draw has 5 rows", f"{len(t['draw'])} rows",
                                    len(t["draw"]) == 5, kind="sanity")]

    exp = dataclasses.replace(seed_demo_mod.SEEDED, judge=strict)
    assert _tool().rejudge(out, ["demo-seeded", "absent"], get={"demo-seeded": exp}.get) == [
        "demo-seeded"]
    v = pd.read_csv(out / "verdicts.csv")
    assert list(v.claim) == ["the draw has 5 rows"] and list(v.verdict) == ["does not hold"]
    assert "the draw has 5 rows" in (out / "report.md").read_text()


# --------------------------------------------------------------- the comparison logic
def _v(rows):
    return pd.DataFrame(rows, columns=["experiment", "kind", "claim", "measured", "verdict"])


def test_compare_counts_agreement_and_flags_a_check_passing_only_on_the_shipped_seed():
    tool = _tool()
    H, F = "holds", "does not hold"

    def seed(lucky, flip, corr, err=False):
        rows = [("e1", "claim", f"corr >= 0.99 (median {corr})", f"corr = {corr}", lucky),
                ("e1", "claim", "per d: holds at d = 2", "x = 1", H),
                ("e1", "claim", "per d: holds at d = 4", "x = 2", flip),
                ("e1", "sanity", "solver converged", "ok", H),
                ("e2", "finding", "toy figure", "same text", H)]
        if err:
            rows = [r for r in rows if r[0] != "e1"] + [
                ("e1", "error", "(experiment raised an error)", "boom", "error")]
        return _v(rows)

    verdicts = {0: seed(H, H, 0.995), 1: seed(F, H, 0.97), 2: seed(F, F, 0.98),
                3: seed(H, H, 0.991), 4: seed(F, H, 0.9, err=True)}
    t = tool.compare(verdicts, shipped=0)
    assert len(t) == 5 and set(t.others) == {4}
    by = t.set_index(t.claim)
    # numbers in a claim's text do not split it; per-d checks stay apart
    lucky = by.loc["corr >= 0.99 (median 0.995)"]
    assert (lucky.equal, lucky.passes_others, lucky.shipped_only) == (1, 1, True)
    assert lucky.v_4 == "error"  # an experiment that raised disagrees
    flip = by.loc["per d: holds at d = 4"]
    assert (flip.equal, flip.passes_others, flip.shipped_only) == (2, 2, False)  # not a majority
    assert by.loc["toy figure"].identical and not by.loc["per d: holds at d = 2"].identical
    s = tool.agreement(t).set_index("kind")
    assert s.loc["all", "comparisons"] == 20
    # e1: lucky 1 + d2 3 (error on seed 4) + d4 2 + sanity 3 = 9, e2: 4 -> 13 of 20
    assert s.loc["all", "equal"] == 13 and s.loc["all", "share"] == pytest.approx(13 / 20)
    assert s.loc["claim", "equal"] == 6 and s.loc["claim", "comparisons"] == 12
    assert s.loc["finding", "varying"] == 0  # its only check measures the same on every seed
    assert s.loc["claim", "varying"] == 3 and s.loc["claim", "share_varying"] == pytest.approx(6 / 12)
    assert s.loc["all", "shipped_only"] == 1 and s.loc["all", "unstable"] == 4


def test_compare_names_a_missing_check_and_needs_the_shipped_seed():
    tool = _tool()
    a = _v([("e", "claim", "c", "m", "holds"), ("e", "claim", "c", "m", "holds")])
    b = _v([("e", "claim", "c", "m", "holds")])
    t = tool.compare({0: a, 7: b})
    assert list(t.v_7) == ["holds", "missing"] and list(t.equal) == [1, 0]
    with pytest.raises(ValueError, match="shipped seed 0"):
        tool.compare({7: b, 8: b})
    with pytest.raises(ValueError, match="at least one seed"):
        tool.compare({0: a})
