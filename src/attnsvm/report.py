"""Write the reproduce report: Markdown with figures beside it, tidy tables as Parquet.

Layout of ``out/``::

    report.md                 one section per experiment: claim, figures, checks, numbers
    verdicts.csv              every check of every experiment (one row each)
    tables/<exp>__<name>.parquet
    <exp>/<figure>.png
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from attnsvm.experiments.base import Result

INLINE_ROWS = 24  # tables up to this many rows are shown in the report itself


def markdown_table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured Markdown table (no extra dependency)."""

    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return format(float(v), floatfmt)
        return str(v).replace("|", "\\|").replace("\n", " ")

    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def write_tables(results: Sequence[Result], out: Path) -> dict[tuple[str, str], Path]:
    tdir = out / "tables"
    tdir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for r in results:
        for name, df in r.tables.items():
            p = tdir / f"{r.experiment.name}__{name}.parquet"
            df.to_parquet(p, index=False)
            paths[(r.experiment.name, name)] = p
    return paths


def verdict_frame(results: Sequence[Result]) -> pd.DataFrame:
    rows = []
    for r in results:
        if r.error is not None:
            rows.append(dict(experiment=r.experiment.name, claim="(experiment raised an error)",
                             measured=r.error.strip().splitlines()[-1], verdict="error", note=""))
        for c in r.checks:
            rows.append(dict(experiment=r.experiment.name, kind="sanity" if c.sanity else "claim",
                             claim=c.claim, measured=c.measured, verdict=c.verdict, note=c.note))
    return pd.DataFrame(rows, columns=["experiment", "kind", "claim", "measured", "verdict", "note"])


def differences_section(results: Sequence[Result]) -> list[str]:
    """Markdown lines of "Where this reproduction differs from the papers": every claim
    that does not hold (with its numbers and note: a finding, not a bug), every failing
    sanity check, and every departure from the paper's setting the experiments declare."""
    lines = ["## Where this reproduction differs from the papers", ""]
    items = []
    for r in results:
        name = r.experiment.name
        for c in r.claims:
            if not c.passed:
                items.append(f"- **{name}** (finding): the claim \"{c.claim}\" does not hold here: "
                             f"{c.measured}." + (f" {c.note}" if c.note else ""))
        for c in r.sanity_checks:
            if not c.passed:
                items.append(f"- **{name}** (set-up): the sanity check \"{c.claim}\" fails "
                             f"({c.measured}); the experiment's claims are not tested as meant.")
        if r.error:
            items.append(f"- **{name}**: the experiment raised an error "
                         f"({r.error.strip().splitlines()[-1]}).")
        for dev in r.experiment.deviations:
            items.append(f"- **{name}** (setting): {dev}")
    lines += items if items else ["Nothing: every claim holds at the paper's setting."]
    return lines + [""]


def write_report(results: Sequence[Result], out: Path | str, *, scale: str,
                 total_seconds: float) -> Path:
    """Write ``report.md``, ``verdicts.csv`` and the tables; returns the report's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table_paths = write_tables(results, out)
    verdicts = verdict_frame(results)
    verdicts.to_csv(out / "verdicts.csv", index=False)

    n_ok = sum(r.passed for r in results)
    n_claims = sum(len(r.claims) for r in results)
    ok_claims = sum(c.passed for r in results for c in r.claims)
    n_san = sum(len(r.sanity_checks) for r in results)
    ok_san = sum(c.passed for r in results for c in r.sanity_checks)
    lines = [
        "# attnsvm reproduce report",
        "",
        f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} at scale `{scale}` "
        f"in {total_seconds:.1f} s. {n_ok} of {len(results)} experiments: every check holds. "
        f"Claims: {ok_claims} of {n_claims} hold; sanity checks of the set-up: {ok_san} of "
        f"{n_san} hold.",
        "Every verdict below is computed from this run's tables (see `verdicts.csv`).",
        "",
        "| experiment | figure | claims holding | sanity checks | time (s) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        cl, sa = r.claims, r.sanity_checks
        status = "error" if r.error else f"{sum(c.passed for c in cl)}/{len(cl)}"
        san = "" if r.error else f"{sum(c.passed for c in sa)}/{len(sa)}"
        lines.append(f"| [{r.experiment.name}](#{r.experiment.name}) | {r.experiment.title} "
                     f"| {status} | {san} | {r.seconds:.1f} |")
    lines += [""] + differences_section(results)
    for r in results:
        e = r.experiment
        lines += ["", f"## {e.name}", "", f"**{e.title}** — *{e.paper}*", "",
                  f"> {e.claim}", ""]
        if e.deviations:
            lines += ["Departures from the paper's setting:", ""]
            lines += [f"- {dev}" for dev in e.deviations] + [""]
        if r.error:
            lines += ["**The experiment raised an error** (other experiments are unaffected):",
                      "", "```", r.error.strip()[-3000:], "```"]
        for fig in r.figures:
            rel = os.path.relpath(fig, out)
            lines += [f"![{e.name}: {Path(fig).stem}]({rel})", ""]
        if r.checks:
            df = pd.DataFrame([dict(kind="sanity" if c.sanity else "claim", claim=c.claim,
                                    measured=c.measured,
                                    verdict="**holds**" if c.passed else "**does not hold**",
                                    note=c.note) for c in r.checks])
            lines += [markdown_table(df), ""]
        for name, df in r.tables.items():
            rel = os.path.relpath(table_paths[(e.name, name)], out)
            if len(df) <= INLINE_ROWS:
                lines += [f"Table `{name}` ([parquet]({rel})):", "", markdown_table(df), ""]
            else:
                lines += [f"Table `{name}`: {len(df)} rows, [parquet]({rel}).", ""]
        cfg = ", ".join(f"{k}={v}" for k, v in r.config.items())
        lines += [f"<sub>config: {cfg}; {r.seconds:.1f} s</sub>", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
