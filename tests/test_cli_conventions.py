"""One command-line convention (issue 34): ``--progress / --no-progress`` on every long
command (older spellings kept as hidden aliases), ``attnsvm --version``, counted nouns in
the singular for one, the example scripts reachable from an installed package
(``attnsvm examples``), library messages through ``logging`` printed by the CLI, and a zero
step of a sweep's grid range named (issue 31)."""

from __future__ import annotations

import argparse
import logging
import textwrap

import pytest

from attnsvm.cli import build_parser, main
from attnsvm.cli._args import progress_on

LONG = ("train", "vit", "probe", "sweep", "reproduce", "warmup")


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def subparsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _args(command, *argv):
    extra = {"sweep": ["mmts-fig1"]}.get(command, [])
    return subparsers()[command].parse_args([*extra, *argv])


@pytest.mark.parametrize("command", LONG)
def test_every_long_command_takes_progress_and_no_progress(command):
    assert progress_on(_args(command, "--progress")) is True
    assert progress_on(_args(command, "--no-progress")) is False
    default = progress_on(_args(command))
    bar = command in ("train", "sweep")  # bars: on a terminal only (pytest's stderr is not)
    assert default is (not bar)


@pytest.mark.parametrize("command", ["vit", "probe"])
def test_the_old_quiet_flag_is_a_hidden_alias_of_no_progress(command, capsys):
    assert progress_on(_args(command, "--quiet")) is False
    rc, out, _ = run_cli(capsys, command, "--help")
    assert rc == 0 and "--quiet" not in out and "--no-progress" in out


def test_version(capsys):
    from attnsvm import __version__

    rc, out, err = run_cli(capsys, "--version")
    assert rc == 0 and out.strip() == f"attnsvm {__version__}" and err == ""


def test_plural():
    from attnsvm._words import plural

    assert plural(1, "experiment") == "1 experiment"
    assert plural(0, "experiment") == "0 experiments"
    assert plural(1, "run misses", "runs miss") == "1 run misses"
    assert plural(3, "run misses", "runs miss") == "3 runs miss"


DEMO = """
import pandas as pd
from attnsvm.experiments import Experiment

EXP = Experiment("demo-conv", "-", "-", {"tiny": {"x": 2}},
                 lambda cfg: {"t": pd.DataFrame({"y": [cfg["x"] ** 2]})},
                 lambda t, c: [], lambda t, c, o: [], in_default=False)
"""


def test_reproduce_counts_in_the_singular_and_no_progress_keeps_the_summary(
        tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_conv_demo.py").write_text(textwrap.dedent(DEMO))
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, out, _ = run_cli(capsys, "reproduce", "cli_conv_demo:EXP", "--scale", "tiny",
                         "--out", tmp_path / "a")
    assert rc == 0 and "1 experiment at scale" in out and "1 experiments" not in out
    assert "[1/1] demo-conv" in out and "0 errors" in out
    rc, out, _ = run_cli(capsys, "reproduce", "cli_conv_demo:EXP", "--scale", "tiny",
                         "--out", tmp_path / "b", "--no-progress")
    assert rc == 0 and "[1/1]" not in out and "experiment at scale" not in out
    assert out.startswith("all: ") and "done in" in out


def test_sweep_zero_step_is_named(capsys):
    rc, _, err = run_cli(capsys, "sweep", "mmts-fig1", "--grid", "seed=0:10:0", "--dry-run")
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "'0:10:0' has step 0" in err and "range() arg" not in err


# ------------------------------------------------------------------ examples
def test_examples_are_package_data_listed_printed_and_copied(tmp_path, capsys):
    from attnsvm.cli.examples import scripts

    found = scripts()
    assert {"quick_tour", "own_data_svm", "own_model_tracking"} <= set(found)
    rc, out, _ = run_cli(capsys, "examples")
    assert rc == 0 and all(name in out for name in found)
    rc, out, _ = run_cli(capsys, "examples", "quick_tour")
    assert rc == 0 and out == found["quick_tour"].read_text()
    rc, out, _ = run_cli(capsys, "examples", "--copy", tmp_path / "ex")
    assert rc == 0
    assert sorted(p.stem for p in (tmp_path / "ex").glob("*.py")) == sorted(found)
    rc, _, err = run_cli(capsys, "examples", "--copy", tmp_path / "ex")  # no overwrite
    assert rc == 2 and "--force" in err
    rc, _, err = run_cli(capsys, "examples", "no_such")
    assert rc == 2 and "unknown example 'no_such'" in err and "quick_tour" in err


# ------------------------------------------------------------------- logging
def test_library_log_records_are_printed_by_the_cli_and_the_logger_restored(
        monkeypatch, capsys):
    from attnsvm.cli import examples

    log = logging.getLogger("attnsvm")
    before = (log.level, log.propagate, list(log.handlers))

    def noisy(args):
        logging.getLogger("attnsvm.demo").warning("compiling kernels (once, about 2 min)")
        logging.getLogger("attnsvm.demo").debug("not shown")
        return 0

    monkeypatch.setattr(examples, "run", noisy)
    rc, out, err = run_cli(capsys, "examples")
    assert rc == 0 and out == ""
    assert err == "attnsvm: compiling kernels (once, about 2 min)\n"
    assert (log.level, log.propagate, list(log.handlers)) == before


def test_a_command_configures_its_own_options_only():
    """``attnsvm reproduce`` does not pay for train's option choices (they import torch)."""
    sub = {a.dest: a for a in build_parser("reproduce")._actions
           if isinstance(a, argparse._SubParsersAction)}["command"].choices
    assert any(a.dest == "scale" for a in sub["reproduce"]._actions)
    assert not any(a.dest == "loss" for a in sub["train"]._actions)
    assert any(a.dest == "loss" for a in subparsers()["train"]._actions)  # all, by default
