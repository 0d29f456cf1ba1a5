"""Seed stability of the reproduce verdicts (issue 24): does any verdict hang on the shipped seed?

``attnsvm reproduce --seed K`` runs every experiment with K added to each of its seeds (new
populations of datasets and starts). This tool runs it for the shipped seeds (K = 0) and for
seeds never shipped, then compares each check's verdict on every other seed with its verdict
on the shipped one:

- the **agreement**: the share of (check, other seed) pairs whose verdict equals the shipped
  seed's, overall and per kind (paper claim / sanity / finding); an experiment that raises, or
  a check a seed does not produce, counts as a disagreement;
- **passes only on the shipped seed**: a check that holds on the shipped seed and does not
  hold on a majority of the other seeds (the done-means of issue 24 asks for none);
- **identical** checks: the same measured text on every seed (a figure's own dataset, a
  deterministic toy, or a share that is 1 on every seed): the agreement is also given
  without them (``share_varying``), the share among checks whose measurement moves.

Checks are matched by experiment, kind and claim text with its numbers masked (a claim may
quote numbers of its run), and by their order among checks of the same masked text.

Usage (from the repository root, with the package importable)::

    python tools/seed_stability.py run --seeds 0,1001,2002,3003,4004 [--scale quick|full]
        [--out attnsvm-out/seeds] [NAMES...]      # one `attnsvm reproduce` per seed (resumes)
    python tools/seed_stability.py compare --seeds 0,1001,2002,3003,4004 [--scale quick]
        [--out attnsvm-out/seeds] [--csv FILE] [--markdown FILE]
    python tools/seed_stability.py rejudge --seeds ... [--scale quick] NAMES...
        # after a change to a judge only: verdicts again from the stored tables

``run`` writes ``OUT/<scale>-<K>/`` (a normal reproduce folder) and skips experiments whose
record is already there; ``compare`` reads their ``verdicts.csv``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

KINDS = ("claim", "sanity", "finding")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?%?")


def mask(text: str) -> str:
    """``text`` with every number replaced by ``#`` (claims may quote their run's numbers)."""
    return _NUMBER.sub("#", str(text))


def keyed(verdicts: pd.DataFrame) -> pd.DataFrame:
    """One reproduce folder's ``verdicts.csv`` rows with a ``key`` that names the same check
    on another seed: ``experiment | kind | masked claim | occurrence``. An experiment that
    raised is one row of kind ``error``, keyed by the experiment alone."""
    v = verdicts.copy()
    v["masked"] = v.claim.map(mask)
    v["occ"] = v.groupby(["experiment", "kind", "masked"]).cumcount()
    v["key"] = v.experiment + " | " + v.kind + " | " + v.masked + " | " + v.occ.astype(str)
    err = v.kind == "error"
    v.loc[err, "key"] = v.experiment[err] + " | error"
    if v.key.duplicated().any():  # cannot happen: occ numbers the duplicates
        raise ValueError("duplicate check keys")
    return v


def compare(verdicts: Mapping[int, pd.DataFrame], shipped: int = 0) -> pd.DataFrame:
    """Per check of the shipped seed, its verdict on every seed and how they compare.

    ``verdicts``: seed -> that seed's verdicts table (columns experiment, kind, claim,
    measured, verdict: "holds" / "does not hold" / "error"). Returns one row per check of the
    shipped seed: experiment, kind, claim (shipped text), ``v_<seed>`` (the verdict, or
    "missing" / "error" when that seed has no such check or its experiment raised),
    ``m_<seed>`` (measured), ``equal`` (others with the shipped verdict), ``others``,
    ``passes_others`` (others where it holds), ``identical`` (same measured text on every seed),
    ``shipped_only`` (holds on the shipped seed, fails on a majority of the others).
    """
    if shipped not in verdicts:
        raise ValueError(f"the shipped seed {shipped} has no verdicts; have {sorted(verdicts)}")
    others = [s for s in verdicts if s != shipped]
    if not others:
        raise ValueError("need at least one seed besides the shipped one")
    base = keyed(verdicts[shipped])
    base = base[base.kind != "error"]
    out = base[["key", "experiment", "kind", "claim"]].reset_index(drop=True)
    for s in [shipped, *others]:
        k = keyed(verdicts[s]).set_index("key")
        errored = set(k.experiment[k.kind == "error"])
        v = out.key.map(k.verdict)
        v = v.where(v.notna(), out.experiment.map(lambda e, errored=errored:
                                                   "error" if e in errored else "missing"))
        out[f"v_{s}"] = v
        out[f"m_{s}"] = out.key.map(k.measured).fillna("")
    ship = out[f"v_{shipped}"]
    out["others"] = len(others)
    out["equal"] = sum((out[f"v_{s}"] == ship).astype(int) for s in others)
    out["passes_others"] = sum((out[f"v_{s}"] == "holds").astype(int) for s in others)
    out["identical"] = pd.concat([out[f"m_{s}"] for s in [shipped, *others]], axis=1).nunique(
        axis=1).eq(1)
    out["shipped_only"] = (ship == "holds") & (out.passes_others * 2 < len(others))
    return out


def agreement(table: pd.DataFrame) -> pd.DataFrame:
    """Agreement with the shipped seed per kind and overall: checks, comparisons (check x
    other seed), equal, share; and the same without the ``identical`` checks (``varying``)."""
    rows = []
    for kind in [*KINDS, "all"]:
        t = table if kind == "all" else table[table.kind == kind]
        m = t[~t.identical]
        rows.append(dict(kind=kind, checks=len(t), comparisons=int(t.others.sum()),
                         equal=int(t.equal.sum()),
                         share=t.equal.sum() / t.others.sum() if len(t) else float("nan"),
                         varying=len(m),
                         share_varying=(m.equal.sum() / m.others.sum() if len(m)
                                        else float("nan")),
                         unstable=int((t.equal < t.others).sum()),
                         shipped_only=int(t.shipped_only.sum())))
    return pd.DataFrame(rows)


def load(folder: Path) -> pd.DataFrame:
    """``folder/verdicts.csv`` (written by ``attnsvm reproduce``)."""
    path = Path(folder) / "verdicts.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no verdicts (run `seed_stability.py run` first)")
    return pd.read_csv(path, keep_default_na=False)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers; got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected distinct seeds >= 0; got {text!r}")
    return seeds


def _run(args) -> int:
    from attnsvm.cli.reproduce import select
    from attnsvm.experiments import registry

    names = [e.name for e in select(args.names, registry())]
    for seed in args.seeds:
        folder = Path(args.out) / f"{args.scale}-{seed}"
        todo = [n for n in names if not (folder / n / "result.json").exists()]
        if not todo:
            print(f"seed {seed}: {folder} holds every experiment", flush=True)
            continue
        cmd = [sys.executable, "-m", "attnsvm.cli", "reproduce", *todo, "--scale", args.scale,
               "--seed", str(seed), "--out", str(folder)]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc not in (0, 1):  # 1: an experiment raised (kept in its record)
            return rc
    return 0


def rejudge(folder: Path, names: Sequence[str], get=None) -> list[str]:
    """Judge again, from the tables on disk, experiments ``names`` of one reproduce folder
    (after a change to a ``judge`` only: the numbers are not recomputed), rewriting their
    records' checks and the folder's report; returns the names re-judged. ``get``: name ->
    Experiment (default: the registry's)."""
    import json

    from attnsvm.report import update_report

    if get is None:
        from attnsvm.experiments import get

    done = []
    for name in names:
        path = Path(folder) / name / "result.json"
        if not path.exists():
            continue
        rec = json.loads(path.read_text())
        if rec.get("error"):
            continue
        exp = get(name)
        cfg = exp.config(rec["scale"], **{k: v for k, v in rec["config"].items()
                                          if k in exp.configs[rec["scale"]]})
        for k, v in exp.configs[rec["scale"]].items():  # JSON turned tuples into lists
            if isinstance(v, tuple):
                cfg[k] = tuple(cfg[k])
        tables = {t: pd.read_parquet(Path(folder) / info["path"])
                  for t, info in rec["tables"].items()}
        rec["checks"] = [{"claim": c.claim, "measured": c.measured, "passed": bool(c.passed),
                          "note": c.note, "kind": c.kind, "quote": c.quote, "where": c.where}
                         for c in exp.judge(tables, cfg)]
        path.write_text(json.dumps(rec, indent=1))
        done.append(name)
    update_report(folder)
    return done


def _markdown(table: pd.DataFrame, summary: pd.DataFrame, seeds: Sequence[int],
              shipped: int) -> str:
    from attnsvm.report import markdown_table

    others = [s for s in seeds if s != shipped]
    lines = [f"Seeds compared with the shipped seed ({shipped}): {', '.join(map(str, others))}.",
             "", markdown_table(summary), ""]
    bad = table[table.equal < table.others]
    if len(bad):
        cols = ["experiment", "kind", "claim", f"v_{shipped}", "passes_others", "others",
                "shipped_only"]
        lines += ["Checks whose verdict differs on some seed:", "",
                  markdown_table(bad[cols]), ""]
    return "\n".join(lines)


def _compare(args) -> int:
    shipped = args.shipped
    seeds = args.seeds if shipped in args.seeds else [shipped, *args.seeds]
    verdicts = {s: load(Path(args.out) / f"{args.scale}-{s}") for s in seeds}
    table = compare(verdicts, shipped)
    summary = agreement(table)
    pd.set_option("display.width", 200)
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    bad = table[table.equal < table.others]
    for r in bad.itertuples():
        flag = "  PASSES ONLY ON THE SHIPPED SEED" if r.shipped_only else ""
        print(f"\n{r.experiment} [{r.kind}] {r.claim}{flag}")
        for s in seeds:
            print(f"  seed {s:>6}: {getattr(r, f'v_{s}'):<14} {getattr(r, f'm_{s}')}")
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.markdown:
        Path(args.markdown).write_text(_markdown(table, summary, seeds, shipped) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "compare", "rejudge"):
        q = sub.add_parser(name)
        q.add_argument("--seeds", type=_seeds, default=[0, 1001, 2002, 3003, 4004],
                       help="seed offsets (attnsvm reproduce --seed), the shipped one included")
        q.add_argument("--scale", choices=["tiny", "quick", "full"], default="quick")
        q.add_argument("--out", default="attnsvm-out/seeds", help="folder of the runs")
        if name == "run":
            q.add_argument("names", nargs="*", help="experiments (default: reproduce's)")
        elif name == "rejudge":
            q.add_argument("names", nargs="+", help="experiments whose judge changed")
        else:
            q.add_argument("--shipped", type=int, default=0, help="the shipped seed offset")
            q.add_argument("--csv", help="write the per-check table here")
            q.add_argument("--markdown", help="write the summary as Markdown here")
    args = p.parse_args(argv)
    if args.cmd == "rejudge":
        for seed in args.seeds:
            folder = Path(args.out) / f"{args.scale}-{seed}"
            print(f"{folder}: re-judged {', '.join(rejudge(folder, args.names)) or 'nothing'}")
        return 0
    return _run(args) if args.cmd == "run" else _compare(args)


if __name__ == "__main__":
    sys.exit(main())
