"""``attnsvm list [NAME...]``: the registry of reproducible experiments, or one experiment's
claim, its declared verdicts (kind, the paper's sentence and place), its departures from the
paper and its configuration at each scale."""

from __future__ import annotations

import argparse

from attnsvm._words import plural

HELP = ("list the reproducible experiments, or show one (claim, verdicts with the paper's "
        "sentence, departures, config per scale)")

EPILOG = """\
Without NAME: every registered experiment, by paper. With NAME (an exact name, a paper
prefix such as mmts, or module:ATTR): its claim; each verdict it declares, with its kind
(paper claim: the paper's sentence and its section or figure, run at the paper's setting;
sanity check of attnsvm's set-up; attnsvm finding beyond the paper, never counted as the
paper failing); every departure from the paper's setting; and each config key with its value at the scales tiny (tests), quick (the default of
`attnsvm reproduce`) and full (the papers' scale). The keys are what `attnsvm sweep NAME
--grid KEY=VALUES` overrides.

Examples:
  attnsvm list
  attnsvm list mmts-fig9
  attnsvm list --claims"""

SCALES = ("tiny", "quick", "full")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="experiments to show in full (default: list them all)")
    p.add_argument("--claims", action="store_true",
                   help="also print each paper claim in the list")


def fmt(value) -> str:
    """A config value as written on the command line (lists in brackets, no quotes on
    plain strings): ``[2, 4, 8]``, ``0.1``, ``(0.0, -1.0)`` -> ``[0.0, -1.0]``.

    >>> fmt({"ds": (2, 4), "lr": 1.0, "norm": "fro"})
    '{ds: [2, 4], lr: 1.0, norm: fro}'
    """
    if isinstance(value, (list, tuple, range)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def describe(exp) -> str:
    """The page ``attnsvm list NAME`` prints for one experiment."""
    import textwrap

    def wrap(text: str, first: str, rest: str) -> list[str]:
        return textwrap.wrap(text, 88, initial_indent=first, subsequent_indent=rest) or [first]

    lines = [f"{exp.name}: {exp.title}"]
    if exp.paper:
        lines += wrap(exp.paper, "  paper:  ", " " * 10)
    lines += wrap(exp.claim, "  claim:  ", " " * 10)
    lines.append(f"  in the default `attnsvm reproduce` run: {'yes' if exp.in_default else 'no'}")
    lines += verdict_lines(exp, wrap)
    if exp.deviations:
        lines.append("  departures from the paper:")
        for d in exp.deviations:
            lines += wrap(d, "    - ", " " * 6)
    else:
        lines.append("  departures from the paper: none recorded")
    scales = [s for s in SCALES if s in exp.configs] + sorted(set(exp.configs) - set(SCALES))
    keys: list[str] = []
    for s in scales:
        keys += [k for k in exp.configs[s] if k not in keys]
    lines.append(f"  config ({' / '.join(scales)}):")
    width = max((len(k) for k in keys), default=0)
    swidth = max(len(s) for s in scales) if scales else 0
    for k in keys:
        vals = {s: (fmt(exp.configs[s][k]) if k in exp.configs[s] else "(not set)")
                for s in scales}
        if len(set(vals.values())) == 1:
            lines.append(f"    {k:<{width}}  {vals[scales[0]]}   (every scale)")
            continue
        for j, s in enumerate(scales):
            lines.append(f"    {k if j == 0 else '':<{width}}  {s:<{swidth}}  {vals[s]}")
    return "\n".join(lines)


KIND_LABEL = {"claim": "paper claim", "sanity": "sanity check", "finding": "attnsvm finding"}


def verdict_lines(exp, wrap) -> list[str]:
    """The declared verdicts of ``exp``, grouped by kind: statement, and for a paper claim
    its place and the paper's sentence."""
    if not exp.verdicts:
        return ["  verdicts: declared in its judge (run it: `attnsvm reproduce NAME --scale tiny`)"]
    counts = {k: sum(v.kind == k for v in exp.verdicts) for k in KIND_LABEL}
    lines = ["  verdicts: " + ", ".join(f"{n} {KIND_LABEL[k]}{'s' if n != 1 else ''}"
                                        for k, n in counts.items() if n)]
    for kind, lab in KIND_LABEL.items():
        for v in (v for v in exp.verdicts if v.kind == kind):
            lines += wrap(v.text, f"    [{lab}] ", " " * 6)
            if v.where:
                lines += wrap(f"{v.where}: \"{v.quote}\"" if v.quote else v.where,
                              " " * 6 + "paper: ", " " * 13)
    return lines


def run(args: argparse.Namespace) -> int:
    from attnsvm.cli.reproduce import select
    from attnsvm.experiments import registry

    reg = registry()
    if args.names:
        if args.claims:
            raise ValueError("--claims applies to the list of all experiments; NAME already "
                             "shows the claim")
        exps = select(args.names, reg)
        print("\n\n".join(describe(e) for e in exps))
        return 0
    paper = None
    for name, e in reg.items():
        if e.paper != paper:
            paper = e.paper
            print(f"\n{paper}")
        extra = "" if e.in_default else "  [not in the default run]"
        if e.verdicts:
            n = {k: sum(v.kind == k for v in e.verdicts) for k in KIND_LABEL}
            extra += "  [" + ", ".join(f"{n[k]} {KIND_LABEL[k]}{'s' if n[k] != 1 else ''}"
                                       for k in KIND_LABEL) + "]"
        print(f"  {name:<22s} {e.title}{extra}")
        if args.claims:
            print(f"  {'':<22s} {e.claim}")
    print(f"\n{plural(len(reg), 'experiment')}. `attnsvm list NAME` shows one (claim, config at each "
          f"scale); `attnsvm reproduce NAME...` runs some, `attnsvm reproduce` all (quick), "
          f"`--full` at the papers' scale.")
    return 0
