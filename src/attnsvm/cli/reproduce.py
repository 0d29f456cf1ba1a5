"""``attnsvm reproduce [NAMES...] [--full] [--seed K] [--out DIR]``: run the papers' experiments.

Each experiment's tables, figures, verdicts and report section are on disk as soon as it
finishes (``DIR/<name>/result.json``, and ``report.md`` / ``verdicts.csv`` rebuilt from
every record in ``DIR``): an interrupt loses at most the experiment that was running, and
re-running some experiments into ``DIR`` replaces their sections and keeps the others.

``--seed K`` adds K to every seed of every experiment's config (``seed`` and ``*_seed``,
see :func:`attnsvm.experiments.base.offset_seeds`): the same experiments on populations of
datasets and starts never shipped, to see whether a verdict depends on the shipped seed
(``tools/seed_stability.py`` compares the verdicts of several K).
"""

from __future__ import annotations

import argparse
import sys

from attnsvm._words import plural
from attnsvm.cli._args import (
    add_progress,
    check_out_dir,
    default_out,
    nonnegative_int,
    positive_int,
    progress_on,
)

HELP = "run the papers' experiments (all, or NAMES) and write a report with figures and verdicts"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="experiments to run (default: all; `attnsvm list` shows them); "
                        "a prefix such as `mmts` selects a whole paper; module:ATTR names an "
                        "Experiment outside the registry")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--full", dest="scale", action="store_const", const="full",
                       help="the papers' scale (slow) instead of the quick default "
                            "(= --scale full)")
    scale.add_argument("--scale", choices=["tiny", "quick", "full"], default="quick",
                       help="configuration size: tiny (smoke tests), quick, full (the papers'); "
                            "`attnsvm list NAME` shows each")
    p.add_argument("--out", default=default_out("reproduce"),
                   help="output folder: report.md, verdicts.csv, NAME/ per experiment; "
                        "sections of experiments not run now are kept")
    p.add_argument("--seed", type=nonnegative_int, default=0, metavar="K",
                   help="add K to every seed of every experiment (its `seed` and `*_seed` "
                        "config keys): populations of datasets and starts other than the "
                        "shipped ones (default 0: the shipped seeds); experiments without a "
                        "seed are deterministic and run as shipped")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch intra-op threads (default 1: the experiments' tensors are small, "
                        "and extra threads cost more than they gain on a shared machine)")
    p.add_argument("--formats", default="png",
                   help="figure formats, comma-separated from png, pdf, svg (the report links "
                        "the first)")
    add_progress(p, "the header and a line per experiment as it finishes (the summary "
                    "and errors are printed either way)")
    p.set_defaults(scale="quick")


def select(names: list[str], registry: dict) -> list:
    """Experiments matching exact names, paper prefixes or ``module:ATTR``; default: those
    ``in_default``. An unknown name is a ValueError listing the known ones."""
    if not names:
        return [e for e in registry.values() if e.in_default]
    from attnsvm.experiments import resolve

    chosen = []
    for n in names:
        if ":" in n:
            hits = [resolve(n)]
        else:
            hits = [e for k, e in registry.items() if k == n or k.startswith(n + "-")]
        if not hits:
            raise ValueError(f"unknown experiment {n!r}; known: {', '.join(registry)}")
        chosen += [e for e in hits if e not in chosen]
    return chosen


def _kinds(checks) -> str:
    """'paper claims 3/4 hold, findings 1/2, sanity 2/2': the three kinds kept apart."""
    def n(kind):
        k = [c for c in checks if c.kind == kind]
        return f"{sum(c.passed for c in k)}/{len(k)}"
    return f"paper claims {n('claim')} hold, findings {n('finding')}, sanity {n('sanity')}"


def run(args: argparse.Namespace) -> int:
    from attnsvm.progress import Ticker

    live = progress_on(args) and sys.stdout.isatty()  # a terminal: no silent start either
    with Ticker("attnsvm reproduce: loading the experiments", sys.stdout if live else None,
                live=live) as tick:
        try:
            return _run(args, tick)
        finally:
            tick.clear()


def _run(args: argparse.Namespace, loading) -> int:
    import time

    from attnsvm import plotting
    from attnsvm.compiled import ensure_all
    from attnsvm.experiments import registry, run_experiment
    from attnsvm.experiments.base import offset_seeds
    from attnsvm.progress import Ticker
    from attnsvm.report import save_result, update_report

    formats = tuple(f.strip().lower() for f in args.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        raise ValueError(f"--formats {args.formats}: use png, pdf or svg (comma-separated)")
    plotting.FORMATS = formats
    exps = select(args.names, registry())
    missing = {e.name: why for e in exps if (why := e.missing())}
    if missing and args.names:  # asked for by name: refused before any work
        raise ValueError("; ".join(missing.values()))
    for why in missing.values():  # the default run: skipped, saying what to install
        print(f"attnsvm reproduce: skipping {why}", file=sys.stderr)
    exps = [e for e in exps if e.name not in missing]
    out = check_out_dir(args.out)
    seeds = {}
    for exp in exps:  # an experiment without this scale: refused before any run
        seeds[exp.name] = offset_seeds(exp.config(args.scale), getattr(args, "seed", 0))
    out.mkdir(parents=True, exist_ok=True)
    loading.clear()  # the loading line (a terminal), erased
    ensure_all()  # an empty numba cache: compiled now, said, and in no experiment's seconds
    results = []
    t0 = time.perf_counter()
    shift = f", seeds + {args.seed}" if getattr(args, "seed", 0) else ""
    show = progress_on(args)
    if show:
        print(f"attnsvm reproduce: {plural(len(exps), 'experiment')} at scale {args.scale!r}"
              f"{shift} -> {out}/", flush=True)
    path = out / "report.md"
    live = show and sys.stdout.isatty()  # a terminal: the running experiment's seconds tick
    for i, exp in enumerate(exps, 1):
        head = f"[{i}/{len(exps)}] {exp.name:<22s}"
        if show and not live:
            print(head, end=" ", flush=True)
        tick = Ticker(head, sys.stdout if live else None, live=live)
        try:
            with tick:
                res = run_experiment(exp, args.scale, out / exp.name, threads=args.threads,
                                     **seeds[exp.name])
            if live:
                print(f"\r{head}\033[K", end=" ", flush=True)  # the ticking line, cleared
        except KeyboardInterrupt:
            done = ", ".join(r.experiment.name for r in results) or "none"
            print(f"\nattnsvm reproduce: interrupted during {exp.name}; finished in this run "
                  f"(in {path}): {done}", file=sys.stderr)
            return 130
        save_result(res, out)
        path = update_report(out)  # the report is current after every experiment
        results.append(res)
        if res.error:
            if not show:
                print(f"{exp.name}:", end=" ")
            print(f"ERROR after {res.seconds:.1f} s: {res.error.strip().splitlines()[-1]}")
        elif show:
            print(f"{res.seconds:6.1f} s  {_kinds(res.checks)}", flush=True)
    total = time.perf_counter() - t0
    if results:
        print(f"all: {_kinds([c for r in results for c in r.checks])}")
    n_err = sum(r.error is not None for r in results)
    n_fail = sum((r.error is None) and not r.passed for r in results)
    print(f"done in {total:.1f} s: report {path}  ({n_fail} with a failing check, "
          f"{plural(n_err, 'error')})")
    return 1 if n_err else 0
