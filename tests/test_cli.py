"""The command line is complete and discoverable (issue 13 §5): every option has help and
shows its default, the .npz format is in --help, ``solve`` handles every query kind that
``train`` does and saves W_mm, ``list NAME`` shows an experiment's config at each scale,
and every command writes under one default root, attnsvm-out/<command>/.

Commands run in-process (``attnsvm.cli.main``); a solution is checked against the solver
called directly, with the selected tokens computed here by explicit loops.
"""

from __future__ import annotations

import argparse
import textwrap

import numpy as np
import pytest

from attnsvm import data as D
from attnsvm.cli import build_parser, main
from attnsvm.cli._args import HelpFormatter
from attnsvm.data import TokenData
from attnsvm.svm import att_svm, prompt_svm, seq2seq_svm


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


# ---------------------------------------------------------------------- help
def test_every_option_has_help_and_shows_its_default():
    fmt = HelpFormatter("attnsvm")
    seen = 0
    for name, p in subparsers().items():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            opt = action.option_strings[-1]
            assert action.help and action.help.strip(), f"{name} {opt} has no help"
            if action.nargs == 0:  # a flag: no value, nothing to default to
                continue
            text = fmt._expand_help(action)
            assert "default" in text.lower(), f"{name} {opt}: {text!r}"
            assert "default: None" not in text and "default None" not in text, (name, opt, text)
            seen += 1
    assert seen > 40  # every command was looked at


def test_help_of_every_command_renders_and_shows_defaults(capsys):
    for name in subparsers():
        rc, out, err = run_cli(capsys, name, "--help")
        assert rc == 0 and err == "" and out.startswith(f"usage: attnsvm {name}")
    rc, out, _ = run_cli(capsys, "train", "--help")
    out = " ".join(out.split())
    assert "(default: 500)" in out and "(default: ngd)" in out and "(default: logistic)" in out
    rc, out, _ = run_cli(capsys, "sweep", "--help")
    out = " ".join(out.split())
    assert "(default: quick)" in out and "default attnsvm-out/sweep/NAME" in out


@pytest.mark.parametrize("command", ["train", "solve"])
def test_npz_format_is_in_the_help_of_the_commands_that_read_one(capsys, command):
    rc, out, _ = run_cli(capsys, command, "--help")
    assert rc == 0
    table = out[out.index("  key   shape"):]
    rows = {}
    for row in (line.split() for line in table.splitlines()[1:7]):
        rows.setdefault(row[0], " ".join(row[1:]))
    assert rows["X"].startswith("(n, T, d)") and rows["y"].startswith("(n,)")
    assert rows["z"].startswith("(n, d)") and rows["mask"].startswith("(n, T) bool")
    assert rows["v"].startswith("(d,)")
    assert "(n, T)           seq-to-seq labels" in out
    assert "X (B, n, T, d)" in out  # the batched variant
    assert f"What {command} reads:" in out


def test_vit_help_states_the_run_s_real_defaults(capsys):
    """The vit defaults are written out in the help (so that `--help` stays instant); they
    must be the ones attnsvm.realdata.vit actually uses."""
    from attnsvm.realdata.vit import DEFAULT_LR, FULL, QUICK

    rc, out, _ = run_cli(capsys, "vit", "--help")
    flat = " ".join(out.split())
    assert "(default " + " ".join(map(str, QUICK.seeds)) + "; --full: " + \
        " ".join(map(str, FULL.seeds)) + ")" in flat
    assert f"(default {QUICK.epochs}; --full: {FULL.epochs})" in flat
    assert f"(default {QUICK.layers}; --full: {FULL.layers})" in flat
    assert f"(default {QUICK.dtype};" in flat and f"(default {QUICK.threads})" in flat
    assert "(default: " + " ".join(f"{k}={v:g}" for k, v in DEFAULT_LR.items()) + ")" in flat
    assert " ".join(QUICK.optimizers) in flat and "(default: all five)" in flat
    assert len(QUICK.optimizers) == 5


# ------------------------------------------------------------- output root
def test_one_default_output_root(tmp_path, monkeypatch, capsys):
    from attnsvm.sweep import DEFAULT_ROOT

    p = subparsers()
    assert p["reproduce"].parse_args([]).out == "attnsvm-out/reproduce"
    assert p["vit"].parse_args([]).out == "attnsvm-out/vit"
    assert p["probe"].parse_args([]).out == "attnsvm-out/probe"
    assert DEFAULT_ROOT.as_posix() == "attnsvm-out/sweep"

    (tmp_path / "cli_root_demo.py").write_text(textwrap.dedent("""
        import pandas as pd
        from attnsvm import plotting as P
        from attnsvm.experiments import Experiment

        def plot(tables, cfg, out):
            fig, (ax,) = P.subplots()
            ax.plot(tables["t"].y)
            return [P.save(fig, out, "curve")]

        EXP = Experiment("demo-root", "-", "-", {"tiny": {"x": 2}},
                         lambda cfg: {"t": pd.DataFrame({"y": [cfg["x"] ** 2]})},
                         lambda t, c: [], plot, in_default=False)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "cli_root_demo:EXP", "--scale", "tiny"]) == 0
    assert main(["sweep", "cli_root_demo:EXP", "--grid", "x=3,4", "--scale", "tiny",
                 "--no-progress"]) == 0
    capsys.readouterr()
    out = tmp_path / "attnsvm-out"
    assert (out / "reproduce" / "report.md").is_file()
    assert (out / "reproduce" / "demo-root" / "curve.png").stat().st_size > 1000
    assert (out / "sweep" / "demo-root" / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attnsvm-out", "cli_root_demo.py"]


# ---------------------------------------------------------------------- list
LIST_DEMO = """
import pandas as pd
from attnsvm.experiments import Experiment

EXP = Experiment(
    "demo-list", "Figure 0: a demo", "y grows with x.",
    {"tiny": {"x": 1, "xs": [1, 2], "lr": 0.5},
     "quick": {"x": 1, "xs": [1, 2, 3], "lr": 0.5},
     "full": {"x": 2, "xs": (1, 2, 3, 4), "lr": 0.5, "extra": "fro"}},
    lambda cfg: {}, lambda t, c: [], lambda t, c, o: [], in_default=False,
    deviations=("k = 1 instead of the paper's 2, to keep the demo small.",))
"""


def test_list_name_shows_claim_deviations_and_config_per_scale(tmp_path, monkeypatch, capsys):
    (tmp_path / "cli_list_demo.py").write_text(LIST_DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, out, err = run_cli(capsys, "list", "cli_list_demo:EXP")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "demo-list: Figure 0: a demo"
    assert "  claim:  y grows with x." in lines
    assert "  in the default `attnsvm reproduce` run: no" in lines
    assert "    - k = 1 instead of the paper's 2, to keep the demo small." in lines
    assert "  config (tiny / quick / full):" in lines
    cfg = [line.split() for line in lines[lines.index("  config (tiny / quick / full):") + 1:]]
    assert cfg == [
        ["x", "tiny", "1"], ["quick", "1"], ["full", "2"],
        ["xs", "tiny", "[1,", "2]"], ["quick", "[1,", "2,", "3]"], ["full", "[1,", "2,", "3,", "4]"],
        ["lr", "0.5", "(every", "scale)"],
        ["extra", "tiny", "(not", "set)"], ["quick", "(not", "set)"], ["full", "fro"],
    ]


def test_list_name_of_a_registered_experiment(capsys):
    from attnsvm.experiments import get

    exp = get("mmts-fig9")
    rc, out, _ = run_cli(capsys, "list", "mmts-fig9")
    assert rc == 0 and out.startswith(f"mmts-fig9: {exp.title}")
    for key in exp.configs["quick"]:
        assert any(line.split()[:1] == [key] for line in out.splitlines()), key
    tiny_ds = "[" + ", ".join(map(str, exp.configs["tiny"]["ds"])) + "]"
    assert any(line.split()[:2] == ["ds", "tiny"] and line.endswith(tiny_ds)
               for line in out.splitlines())


def test_list_bad_names_are_one_line(capsys):
    rc, _, err = run_cli(capsys, "list", "no-such-experiment")
    assert_one_line_error(rc, err, "unknown experiment 'no-such-experiment'", "mmts-fig9")
    rc, _, err = run_cli(capsys, "list", "mmts-fig9", "--claims")
    assert_one_line_error(rc, err, "--claims applies to the list of all experiments")


# --------------------------------------------------------------------- solve
def _save(tmp_path, name, **arrays) -> str:
    path = tmp_path / name
    TokenData(**arrays).save(path)
    return str(path)


def _load(path) -> dict:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _opt_loops(X, y, v, mask=None, causal=False, seq=False) -> np.ndarray:
    """alpha by explicit loops: argmax over the admissible keys of y v^T x_t (ties: first)."""
    n, T, _ = X.shape
    valid = np.ones((n, T), bool) if mask is None else mask
    if not seq:
        return np.array([max((t for t in range(T) if valid[i, t]),
                             key=lambda t: (y[i] * (v @ X[i, t]), -t)) for i in range(n)])
    alpha = np.zeros((n, T), int)
    for i in range(n):
        for k in range(T):
            label = y[i, k] if y.ndim == 2 else y[i]
            keys = [t for t in range(T) if valid[i, t] and (not causal or t <= k)]
            alpha[i, k] = max(keys, key=lambda t: (label * (v @ X[i, t]), -t))
    return alpha


CERT = [("norm_value", "norm_"), ("margin", "margin_"), ("violation", "violation_"),
        ("kkt_residual", "kkt_residual_"), ("gap", "gap_")]


def _same_solution(saved: dict, sol, query: str) -> None:
    np.testing.assert_allclose(saved["W_mm"], sol.W_, rtol=1e-9, atol=1e-12)
    for key, attr in CERT:
        assert np.isclose(saved[key], getattr(sol, attr), rtol=1e-6, atol=1e-12), key
    assert bool(saved["feasible"]) and str(saved["status"]) == sol.status_
    assert str(saved["problem"]) == sol.problem and str(saved["query"]) == query
    assert int(saved["rank"]) == sol.rank()
    np.testing.assert_array_equal(saved["support"], sol.support_)
    np.testing.assert_allclose(saved["margins"], sol.margins_, atol=1e-12)


def test_solve_out_round_trip_against_att_svm(tmp_path, capsys):
    d = D.random_sphere(n=5, T=4, d=6, seed=3)
    path = _save(tmp_path, "cross.npz", X=d.X, y=d.y, z=d.z, v=d.v)
    out = tmp_path / "wmm.npz"
    rc, stdout, err = run_cli(capsys, "solve", path, "--out", out)
    assert rc == 0 and err == "" and f"W_mm and certificate -> {out}" in stdout
    saved = _load(out)
    alpha = _opt_loops(d.X, d.y, d.v)
    np.testing.assert_array_equal(saved["alpha"], alpha)
    sol = att_svm(d.X, d.z, alpha)
    _same_solution(saved, sol, "cross")
    assert str(saved["norm_name"]) == "fro"
    # the margins of W_mm, recomputed here: every constraint >= 1, the support at 1
    sel = d.X[np.arange(5), alpha]
    m = np.einsum("itd,de,ie->it", sel[:, None] - d.X, saved["W_mm"], d.z)
    m[np.arange(5), alpha] = np.inf
    assert m.min() > 1 - 1e-7 and np.isclose(m.min(), 1.0)

    # an existing file is kept without --force, replaced with it
    before = out.read_bytes()
    rc, stdout, err = run_cli(capsys, "solve", path, "--norm", "nuc", "--out", out)
    assert_one_line_error(rc, err, f"--out {out}: the file exists; pass --force")
    assert out.read_bytes() == before and stdout == ""
    rc, _, err = run_cli(capsys, "solve", path, "--norm", "nuc", "--out", out, "--force")
    assert rc == 0 and err == ""
    saved = _load(out)
    assert str(saved["norm_name"]) == "nuc"
    _same_solution(saved, att_svm(d.X, d.z, alpha, norm="nuc"), "cross")
    assert not list(tmp_path.glob(".*.tmp"))


def test_solve_prompt_and_self_attention_queries(tmp_path, capsys):
    d = D.random_sphere(n=4, T=5, d=6, seed=1, cross=False)
    mask = np.ones((4, 5), bool)
    mask[1, 3:] = False  # sequence 1 has 3 valid tokens: its last valid token is 2
    mask[2, 4] = False
    path = _save(tmp_path, "self.npz", X=d.X, y=d.y, v=d.v, mask=mask)
    alpha = _opt_loops(d.X, d.y, d.v, mask)
    last = np.array([4, 2, 3, 4])
    for query, Z in (("first", d.X[:, 0]), ("last", d.X[np.arange(4), last])):
        out = tmp_path / f"{query}.npz"
        rc, stdout, err = run_cli(capsys, "solve", path, "--query", query, "--out", out)
        assert rc == 0 and err == "", err
        assert "self-attention" in stdout.splitlines()[0]
        saved = _load(out)
        np.testing.assert_array_equal(saved["alpha"], alpha)
        _same_solution(saved, att_svm(d.X, Z, alpha, mask=mask), query)
    # no z and no --query: the prompt problem, W_mm is the vector p_mm
    rc, _, err = run_cli(capsys, "solve", path, "--out", tmp_path / "p.npz", "--alpha",
                         ",".join(map(str, alpha)))
    assert rc == 0 and err == ""
    saved = _load(tmp_path / "p.npz")
    assert saved["W_mm"].shape == (6,)
    _same_solution(saved, prompt_svm(d.X, None, alpha, mask=mask), "prompt")


@pytest.mark.parametrize("causal", [False, True], ids=["seq2seq", "causal"])
@pytest.mark.parametrize("labels", ["per-token", "per-sequence"])
def test_solve_seq2seq_against_seq2seq_svm(tmp_path, capsys, causal, labels):
    d = D.random_sphere(n=3, T=4, d=8, seed=5, cross=False)
    rng = np.random.default_rng(0)
    y = rng.choice([-1.0, 1.0], size=(3, 4)) if labels == "per-token" else d.y
    mask = np.ones((3, 4), bool)
    mask[0, 3] = False
    path = _save(tmp_path, "s2s.npz", X=d.X, y=y, v=d.v, mask=mask)
    query = "causal" if causal else "seq2seq"
    out = tmp_path / "s2s_wmm.npz"
    rc, stdout, err = run_cli(capsys, "solve", path, "--query", query, "--out", out)
    assert rc == 0 and err == "", err
    saved = _load(out)
    alpha = _opt_loops(d.X, y, d.v, mask, causal=causal, seq=True)
    np.testing.assert_array_equal(saved["alpha"], alpha)
    sol = seq2seq_svm(d.X, alpha, causal=causal, mask=mask)
    _same_solution(saved, sol, query)
    assert saved["margins"].shape == (3, 4, 4)
    if causal:  # no constraint on a future key
        assert not saved["support"][:, np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]].any()
    shown = "; ".join(",".join(map(str, r)) for r in alpha.tolist())
    assert f"alpha = {shown}" in stdout

    # --alpha given as rows: the same problem as seq2seq_svm with those tokens
    rows = np.zeros((3, 4), int)  # token 0 for every query (admissible in causal mode too)
    rc, _, err = run_cli(capsys, "solve", path, "--query", query, "--alpha",
                         "0,0,0,0;0,0,0,0;0,0,0,0", "--out", out, "--force")
    saved = _load(out)
    sol = seq2seq_svm(d.X, rows, causal=causal, mask=mask)
    assert rc == (0 if sol.feasible_ else 1) and err == ""
    if sol.feasible_:
        _same_solution(saved, sol, query)


SOLVE_COMBINATIONS = [
    ("s2s", [], "holds seq-to-seq labels y of shape (n, T)", "use --query seq2seq|causal"),
    ("s2s", ["--query", "first"], "which --query first cannot use", "use --query seq2seq|causal"),
    ("s2s", ["--problem", "prompt"], "which the prompt problem cannot use", ""),
    ("self", ["--problem", "prompt", "--query", "last"],
     "--query last does not apply to --problem prompt", "leave --query out"),
    ("self", ["--query", "cross"], "--query cross needs cross-attention queries z", "first|last"),
    ("self", ["--problem", "att"], "--problem att needs cross-attention queries z",
     "--query first|last|seq2seq|causal (self-attention) or --problem prompt"),
    ("self", ["--query", "seq2seq", "--norm", "nuc", "--rank", "1"],
     "--rank applies to one query per sequence", "--query seq2seq"),
    ("self", ["--query", "causal", "--alpha", "0,0,0,0"], "--alpha gives 1 rows",
     "one row of T = 4 indices each"),
    ("self", ["--query", "seq2seq", "--alpha", "0,0;0,0;0,0"], "--alpha row 0 gives 2 token",
     "T = 4"),
    ("self", ["--query", "causal", "--alpha", "3,0,0,0;0,0,0,0;0,0,0,0"],
     "alpha selects a future token", ""),
    ("self", ["--query", "last", "--alpha", "0,1;2"], "rows separated by ';' are for --query "
     "seq2seq or causal", ""),
    ("nov", ["--query", "seq2seq"], "--alpha opt", "has no v"),
    ("cross", ["--out", "wmm.txt"], "--out wmm.txt: the solution is written as .npz", ""),
    ("cross", ["--out", "nowhere/wmm.npz"], "the folder nowhere does not exist", ""),
]


@pytest.mark.parametrize("data, args, problem, fix", SOLVE_COMBINATIONS,
                         ids=[f"{c[0]} " + " ".join(c[1]) for c in SOLVE_COMBINATIONS])
def test_solve_combinations_that_do_not_apply_are_one_line(tmp_path, monkeypatch, capsys,
                                                           data, args, problem, fix):
    d = D.random_sphere(n=3, T=4, d=5, seed=2)
    arrays = {"cross": dict(X=d.X, y=d.y, z=d.z, v=d.v),
              "self": dict(X=d.X, y=d.y, v=d.v),
              "nov": dict(X=d.X, y=d.y),
              "s2s": dict(X=d.X, y=np.where(np.arange(12).reshape(3, 4) % 3, 1.0, -1.0),
                          v=d.v)}[data]
    path = _save(tmp_path, f"{data}.npz", **arrays)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, "solve", path, *args)
    assert_one_line_error(rc, err, "attnsvm solve: error:", problem, fix)
    assert out == ""  # refused before solving


def test_solve_cli_solvers_are_the_strategy_table():
    """`attnsvm solve --solver` accepts, per norm, exactly the library's own solvers (the
    rows of attnsvm.svm.strategy.STRATEGIES, "auto" aside): the CLI's copy of the names
    (kept there so that building the CLI imports no solver) is held equal to the table."""
    from attnsvm.cli.solve import NATIVE_SOLVERS
    from attnsvm.svm.strategy import SOLVERS

    table = {N.name: tuple(s for s in solvers if s != "auto") for N, solvers in SOLVERS.items()}
    assert NATIVE_SOLVERS == table


# --------------------------------------------------- train: --lr and --opt-arg lr=
def test_train_opt_arg_step_size_is_not_overwritten_by_the_lr_default():
    """--opt-arg lr=0.01 (no --lr) gives the rule lr 0.01, as --lr 0.01 does; neither
    given: 0.1; Polyak's step size is its c."""
    from attnsvm.cli.train import make_optimizer

    assert make_optimizer("ngd", None, None, ["lr=0.01"]).hyper["lr"] == 0.01
    assert make_optimizer("ngd", 0.01, None, []).hyper["lr"] == 0.01
    assert make_optimizer("ngd", 0.01, None, ["lr=0.01"]).hyper["lr"] == 0.01
    assert make_optimizer("ngd", None, None, []).hyper["lr"] == 0.1
    assert make_optimizer("polyak", None, None, ["c=0.5"]).hyper["c"] == 0.5
    assert make_optimizer("polyak", 0.25, None, []).hyper["c"] == 0.25


def test_train_opt_arg_step_size_wins_end_to_end(capsys):
    common = ["train", "--trials", "2", "--steps", "30", "--optimizer", "gd"]
    rc, a, _ = run_cli(capsys, *common, "--opt-arg", "lr=0.01")
    assert rc == 0
    rc, b, _ = run_cli(capsys, *common, "--lr", "0.01")
    rc2, c, _ = run_cli(capsys, *common)
    assert rc == rc2 == 0
    norm = [line for line in a.splitlines() if "norm ||W||" in line]
    assert norm == [line for line in b.splitlines() if "norm ||W||" in line]
    assert norm != [line for line in c.splitlines() if "norm ||W||" in line]


@pytest.mark.parametrize("rule, pair", [("ngd", "lr=0.01"), ("polyak", "c=0.5")])
def test_train_lr_and_opt_arg_conflict_is_an_error_naming_both(capsys, rule, pair):
    rc, _, err = run_cli(capsys, "train", "--trials", "2", "--steps", "3", "--optimizer", rule,
                         "--lr", "0.2", "--opt-arg", pair)
    assert_one_line_error(rc, err, "--lr 0.2", f"--opt-arg {pair}")
