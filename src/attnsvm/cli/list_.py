"""``attnsvm list``: the registry of reproducible experiments."""

from __future__ import annotations

import argparse

HELP = "list the reproducible experiments (name, figure, claim)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--claims", action="store_true", help="also print each paper claim")


def run(args: argparse.Namespace) -> int:
    from attnsvm.experiments import registry

    reg = registry()
    paper = None
    for name, e in reg.items():
        if e.paper != paper:
            paper = e.paper
            print(f"\n{paper}")
        extra = "" if e.in_default else "  [not in the default run]"
        print(f"  {name:<22s} {e.title}{extra}")
        if args.claims:
            print(f"  {'':<22s} {e.claim}")
    print(f"\n{len(reg)} experiments. `attnsvm reproduce NAME...` runs some, "
          f"`attnsvm reproduce` all (quick), `--full` at the papers' scale.")
    return 0
