"""Write the reproduce report: Markdown with figures beside it, tidy tables as Parquet.

Layout of ``out/``::

    report.md                 one section per experiment: claim, figures, checks, numbers
    verdicts.csv              every check of every experiment (one row each)
    tables/<exp>__<name>.parquet
    <exp>/<figure>.png
    <exp>/result.json         the experiment's record: what its section is built from

No lost work: :func:`save_result` writes one experiment's tables and record as soon as
it finishes, and :func:`update_report` rebuilds ``report.md`` and ``verdicts.csv`` from
*every* record in the folder. ``attnsvm reproduce`` calls both after each experiment, so
a Ctrl-C or a kill loses at most the experiment that was running, and re-running some
experiments into a folder replaces their sections and keeps the others. Each section
names its scale; a folder holding records of several scales says so at the top. Every
file is written under a temporary name and renamed, so none is ever left half-written.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnsvm._files import atomic_write, atomic_write_text
from attnsvm.experiments.base import PAPERS, Check, Result

INLINE_ROWS = 24  # tables up to this many rows are shown in the report itself
RECORD = "result.json"
RECORD_FORMAT = 1

__all__ = ["markdown_table", "save_result", "load_records", "update_report", "write_report",
           "verdict_frame", "differences_section", "RECORD"]


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




# ----------------------------------------------------------------------- records
def _jsonable(v: Any) -> Any:
    """Config values as JSON: numpy -> Python, tuples -> lists, non-finite floats and
    anything else -> their repr (the record is for reading, not for re-running)."""
    if isinstance(v, (np.generic, np.ndarray)):
        v = v.tolist()
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v) if not isinstance(v, Path) else str(v)


def _rel(path: Path, out: Path) -> str:
    """``path`` relative to ``out`` (POSIX), or absolute when it lies elsewhere."""
    path = Path(path)
    try:
        return Path(os.path.relpath(path.resolve(), out.resolve())).as_posix()
    except ValueError:  # another drive (Windows)
        return str(path.resolve())


def _scale(res: Result) -> str:
    return str(res.config.get("scale", "?"))


def to_record(res: Result, out: Path, tables: dict[str, str] | None = None) -> dict:
    """The JSON record of ``res`` (figures and table files relative to ``out``)."""
    e = res.experiment
    return {
        "format": RECORD_FORMAT,
        "experiment": {"name": e.name, "title": e.title, "claim": e.claim, "paper": e.paper,
                       "deviations": list(e.deviations)},
        "scale": _scale(res),
        "config": _jsonable(dict(res.config)),
        "config_text": ", ".join(f"{k}={v}" for k, v in res.config.items()),
        "seconds": float(res.seconds),
        "error": res.error,
        "finished": _dt.datetime.now().isoformat(timespec="seconds"),
        "checks": [{"claim": c.claim, "measured": c.measured, "passed": bool(c.passed),
                    "note": c.note, "kind": c.kind, "quote": c.quote, "where": c.where} for c in res.checks],
        "figures": [_rel(Path(f), out) for f in res.figures],
        "tables": {name: {"path": (tables or {}).get(name), "rows": int(len(df))}
                   for name, df in res.tables.items()},
    }


def save_result(res: Result, out: Path | str) -> Path:
    """Write one experiment's tables (``tables/<exp>__<name>.parquet``) and its record
    (``<exp>/result.json``, written last) into ``out``; returns the record's path.

    Table files of the experiment that its new result no longer has are removed, so the
    folder never mixes an old run's tables into a new section.
    """
    out = Path(out)
    name = res.experiment.name
    tdir = out / "tables"
    tdir.mkdir(parents=True, exist_ok=True)
    files = {}
    for tname, df in res.tables.items():
        path = tdir / f"{name}__{tname}.parquet"
        atomic_write(path, lambda tmp, df=df: df.to_parquet(tmp, index=False))
        files[tname] = _rel(path, out)
    for old in tdir.glob(f"{name}__*.parquet"):
        if _rel(old, out) not in files.values():
            old.unlink()
    rec_dir = out / name
    rec_dir.mkdir(parents=True, exist_ok=True)
    path = rec_dir / RECORD
    atomic_write_text(path, json.dumps(to_record(res, out, files), indent=1))
    return path


def _paper_order(name: str) -> tuple:
    papers = list(PAPERS)
    prefix = name.split("-")[0]
    return (papers.index(prefix) if prefix in papers else len(papers), name)


def load_records(out: Path | str) -> tuple[list[dict], list[str]]:
    """Every ``<exp>/result.json`` in ``out``, in paper order; and one line per record
    that could not be read (named in the report instead of being dropped silently)."""
    out = Path(out)
    records, problems = {}, []
    for path in sorted(out.glob(f"*/{RECORD}")):
        try:
            rec = json.loads(path.read_text())
            name = rec["experiment"]["name"]
            if rec.get("format") != RECORD_FORMAT:
                raise ValueError(f"record format {rec.get('format')!r}, expected "
                                 f"{RECORD_FORMAT}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"`{_rel(path, out)}` could not be read ({type(exc).__name__}: "
                            f"{exc}); its experiment has no section")
            continue
        records[name] = rec
    return [records[k] for k in sorted(records, key=_paper_order)], problems


def _as_records(results: Sequence[Result | dict], out: Path) -> list[dict]:
    return [r if isinstance(r, dict) else to_record(r, out) for r in results]


def _checks(rec: dict) -> list[Check]:
    out = []
    for c in rec.get("checks", []):
        c = dict(c)
        if "sanity" in c:  # records written before checks had a kind
            c["kind"] = "sanity" if c.pop("sanity") else "claim"
        out.append(Check(**c))
    return out


def _passed(rec: dict) -> bool:
    return rec.get("error") is None and all(c.passed for c in _checks(rec))


def _last_line(error: str) -> str:
    lines = error.strip().splitlines()
    return lines[-1] if lines else "error"


# ------------------------------------------------------------------------ report
def verdict_frame(results: Sequence[Result | dict], out: Path | str = ".") -> pd.DataFrame:
    """One row per check of every experiment (and one per experiment that raised), with its
    kind (claim / sanity / finding), the paper's sentence (``quote``) and place (``where``)."""
    rows = []
    for rec in _as_records(results, Path(out)):
        name, scale = rec["experiment"]["name"], rec.get("scale")
        if rec.get("error") is not None:
            rows.append(dict(experiment=name, scale=scale, kind="error",
                             claim="(experiment raised an error)",
                             measured=_last_line(rec["error"]), verdict="error", note="",
                             where="", quote=""))
        for c in _checks(rec):
            rows.append(dict(experiment=name, scale=scale, kind=c.kind,
                             claim=c.claim, measured=c.measured, verdict=c.verdict, note=c.note,
                             where=c.where, quote=c.quote))
    return pd.DataFrame(rows, columns=["experiment", "scale", "kind", "claim", "measured",
                                       "verdict", "note", "where", "quote"])


def _count(checks: Sequence[Check]) -> str:
    return f"{sum(c.passed for c in checks)} of {len(checks)}"


def differences_section(results: Sequence[Result | dict], out: Path | str = ".") -> list[str]:
    """Markdown lines of "Where this reproduction differs from the papers", in three kinds
    kept apart: the papers' claims that do not hold at the paper's setting (with the numbers
    and the paper's sentence), attnsvm's own findings beyond the papers (every one, with its
    evidence: they are never a paper failing), the sanity checks of the set-up that fail;
    then every departure from the paper's setting the experiments declare."""
    claims, findings, sanity, setting = [], [], [], []
    for rec in _as_records(results, Path(out)):
        name = rec["experiment"]["name"]
        for c in _checks(rec):
            note = f" {c.note}" if c.note else ""
            if c.kind == "claim" and not c.passed:
                src = f" ({c.where}: \"{c.quote}\")" if c.quote else ""
                claims.append(f"- **{name}**: \"{c.claim}\"{src} does not hold: "
                              f"{c.measured}.{note}")
            elif c.kind == "finding":
                findings.append(f"- **{name}** ({c.verdict}): {c.claim}: {c.measured}.{note}")
            elif c.kind == "sanity" and not c.passed:
                sanity.append(f"- **{name}**: the sanity check \"{c.claim}\" fails "
                              f"({c.measured}); the experiment's claims are not tested as meant.")
        if rec.get("error"):
            sanity.append(f"- **{name}**: the experiment raised an error "
                          f"({_last_line(rec['error'])}).")
        setting += [f"- **{name}**: {dev}" for dev in rec["experiment"].get("deviations", [])]
    lines = ["## Where this reproduction differs from the papers", ""]
    parts = [
        ("### Paper claims that do not hold at the paper's setting", claims,
         "None: every paper claim holds."),
        ("### attnsvm's own findings, beyond the papers (never counted as a paper failing)",
         findings, "None recorded."),
        ("### Sanity checks of attnsvm's set-up that fail", sanity, "None."),
        ("### Departures from the papers' settings", setting, "None declared."),
    ]
    for head, items, empty in parts:
        lines += [head, ""] + (items if items else [empty]) + [""]
    return lines


def _scales_line(records: list[dict]) -> tuple[str, bool]:
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.get("scale", "?")] = counts.get(rec.get("scale", "?"), 0) + 1
    if len(counts) <= 1:
        return f"at scale `{next(iter(counts), '?')}`", False
    parts = ", ".join(f"`{s}` ({n})" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"at **mixed scales**: {parts}", True


def render(records: list[dict], out: Path | str, problems: Sequence[str] = ()) -> Path:
    """Write ``report.md`` and ``verdicts.csv`` of ``out`` from ``records``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    verdicts = verdict_frame(records, out)
    atomic_write(out / "verdicts.csv", lambda tmp: verdicts.to_csv(tmp, index=False))

    checks = {r["experiment"]["name"]: _checks(r) for r in records}
    n_ok = sum(_passed(r) for r in records)
    every = [c for cs in checks.values() for c in cs]
    claims = [c for c in every if c.kind == "claim"]
    findings = [c for c in every if c.kind == "finding"]
    sanity = [c for c in every if c.kind == "sanity"]
    scales, mixed = _scales_line(records)
    seconds = sum(float(r.get("seconds", 0.0)) for r in records)
    lines = [
        "# attnsvm reproduce report",
        "",
        f"Updated {_dt.datetime.now().isoformat(timespec='seconds')}: {len(records)} "
        f"experiments {scales}, {seconds:.1f} s of compute in all. **Paper claims at the "
        f"paper's setting: {_count(claims)} hold.** attnsvm's own findings beyond the papers: "
        f"{_count(findings)} hold (reported apart; a finding that does not hold is never a "
        f"paper failing). Sanity checks of the set-up: {_count(sanity)} hold. "
        f"{n_ok} of {len(records)} experiments: every check holds.",
        "Every verdict below is computed from the tables of the run that wrote its section "
        "(see `verdicts.csv`); each section is rewritten when its experiment is run again "
        "into this folder.",
        "",
    ]
    if mixed:
        lines += ["**This folder mixes scales**: each experiment's section and row below names "
                  "the scale its numbers come from; numbers of different scales are not "
                  "comparable. Re-run the experiments at one scale into this folder to unify it.",
                  ""]
    for p in problems:
        lines += [f"**Unreadable record**: {p}.", ""]
    lines += ["| experiment | figure | scale | paper claims holding | findings holding "
              "| sanity checks | time (s) |",
              "|---|---|---|---|---|---|---|"]
    for rec in records:
        e, cs = rec["experiment"], checks[rec["experiment"]["name"]]
        err = bool(rec.get("error"))

        def cell(kind, cs=cs, err=err):
            k = [c for c in cs if c.kind == kind]
            return "error" if err else f"{sum(c.passed for c in k)}/{len(k)}"

        lines.append(f"| [{e['name']}](#{e['name']}) | {e['title']} | {rec.get('scale')} "
                     f"| {cell('claim')} | {cell('finding')} | {cell('sanity')} "
                     f"| {float(rec.get('seconds', 0.0)):.1f} |")
    lines += [""] + differences_section(records, out)
    for rec in records:
        lines += _section(rec, checks[rec["experiment"]["name"]], out)
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def _section(rec: dict, checks: list[Check], out: Path) -> list[str]:
    e = rec["experiment"]
    lines = ["", f"## {e['name']}", "", f"**{e['title']}** — *{e['paper']}* — scale "
             f"`{rec.get('scale')}`", "", f"> {e['claim']}", ""]
    if e.get("deviations"):
        lines += ["Departures from the paper's setting:", ""]
        lines += [f"- {dev}" for dev in e["deviations"]] + [""]
    if rec.get("error"):
        lines += ["**The experiment raised an error** (other experiments are unaffected):",
                  "", "```", rec["error"].strip()[-3000:], "```"]
    for fig in rec.get("figures", []):
        lines += [f"![{e['name']}: {Path(fig).stem}]({fig})", ""]
    if checks:
        df = pd.DataFrame([dict(kind=c.kind, claim=c.claim,
                                paper=(f"{c.where}: \"{c.quote}\"" if c.quote else c.where),
                                measured=c.measured,
                                verdict="**holds**" if c.passed else "**does not hold**",
                                note=c.note) for c in checks])
        lines += [markdown_table(df), ""]
    for name, info in rec.get("tables", {}).items():
        rel, rows = info.get("path"), info.get("rows", 0)
        link = f"[parquet]({rel})" if rel else "not saved"
        df = None
        if rel and rows <= INLINE_ROWS:
            try:
                df = pd.read_parquet(out / rel)
            except (OSError, ValueError) as exc:
                lines += [f"Table `{name}`: {link} cannot be read ({type(exc).__name__}).", ""]
                continue
        if df is not None:
            lines += [f"Table `{name}` ({link}):", "", markdown_table(df), ""]
        else:
            lines += [f"Table `{name}`: {rows} rows, {link}.", ""]
    lines += [f"<sub>scale {rec.get('scale')}; config: {rec.get('config_text', '')}; "
              f"{float(rec.get('seconds', 0.0)):.1f} s; finished {rec.get('finished', '?')}"
              f"</sub>", ""]
    return lines


def update_report(out: Path | str) -> Path:
    """Rebuild ``report.md`` and ``verdicts.csv`` from every record in ``out``."""
    records, problems = load_records(out)
    return render(records, out, problems)


def write_report(results: Sequence[Result], out: Path | str, *, scale: str | None = None,
                 total_seconds: float | None = None) -> Path:
    """Save every result (tables + record) into ``out``, then rebuild ``report.md`` and
    ``verdicts.csv`` from all the records in ``out`` (those of earlier runs included);
    returns the report's path. ``scale`` and ``total_seconds`` are accepted for
    compatibility: each record carries its own scale and time."""
    del scale, total_seconds
    for res in results:
        save_result(res, out)
    return update_report(out)
