"""Bad input gets one clear line (issue 11 §4): files, TokenData fields, CLI commands.

Every case asserts that the error names the problem (and the file, for files); the CLI
cases run ``attnsvm.cli.main`` in-process and check the exit status, that stderr is one
line, and that no Python traceback is shown.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm import data as D
from attnsvm.cli import main
from attnsvm.data import TokenData


# ------------------------------------------------------------------------ helpers
def _good(seed: int = 0, **kw) -> TokenData:
    return D.random_sphere(n=4, T=3, d=3, seed=seed, **kw)


@pytest.fixture
def files(tmp_path):
    """A folder of good and broken .npz files, by name."""
    good = _good().save(tmp_path / "good.npz")
    raw = good.read_bytes()
    paths = {"good": good}

    def put(name: str, content: bytes) -> None:
        paths[name] = tmp_path / name
        paths[name].write_bytes(content)

    put("text.npz", b"X,y\n1,2\nhello world\n")
    put("empty.npz", b"")
    put("truncated.npz", raw[: len(raw) // 2])
    flipped = bytearray(raw)
    flipped[200] ^= 0xFF  # inside X.npy's compressed/stored bytes: CRC mismatch
    put("crc.npz", bytes(flipped))
    np.save(tmp_path / "plain.npy", np.zeros((2, 3, 4)))
    paths["plain.npy"] = tmp_path / "plain.npy"
    put("npy_named.npz", paths["plain.npy"].read_bytes())
    put("pickle.npz", pickle.dumps({"X": np.zeros((2, 3, 4))}))
    put("binary.npz", bytes(range(256)))
    (tmp_path / "folder.npz").mkdir()
    paths["folder.npz"] = tmp_path / "folder.npz"
    paths["missing.npz"] = tmp_path / "missing.npz"
    np.savez(tmp_path / "no_y.npz", X=np.zeros((2, 3, 4)))
    np.savez(tmp_path / "no_x.npz", y=np.ones(2))
    np.savez(tmp_path / "z_none.npz", X=np.zeros((2, 3, 4)), y=np.ones(2), z=None)
    np.savez(tmp_path / "complex.npz", X=np.zeros((2, 3, 4)) + 1j, y=np.ones(2))
    np.savez(tmp_path / "strings.npz", X=np.full((2, 3, 4), "a"), y=np.ones(2))
    np.savez(tmp_path / "nan.npz", X=np.full((2, 3, 4), np.nan), y=np.ones(2))
    np.savez(tmp_path / "labels.npz", X=np.zeros((3, 3, 4)), y=np.array([1.0, 0.0, 2.0]))
    np.savez(tmp_path / "empty_T.npz", X=np.zeros((2, 0, 4)), y=np.ones(2))
    with zipfile.ZipFile(tmp_path / "member.npz", "w") as zf:
        zf.writestr("X.npy", b"not an npy array")
        zf.writestr("y.npy", (tmp_path / "plain.npy").read_bytes())
    zipfile.ZipFile(tmp_path / "empty_zip.npz", "w").close()
    no_z = _good()
    no_z.replace(z=None).save(tmp_path / "no_z.npz")
    _good(batch=2).save(tmp_path / "batched.npz")
    for name in ("no_y.npz", "no_x.npz", "z_none.npz", "complex.npz", "strings.npz", "nan.npz",
                 "labels.npz", "empty_T.npz", "member.npz", "empty_zip.npz", "no_z.npz",
                 "batched.npz"):
        paths[name] = tmp_path / name
    return paths


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    """Non-zero exit, exactly one line on stderr, no traceback, every needle in it."""
    assert rc != 0
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


# ----------------------------------------------------------- files: TokenData.load
FILE_CASES = [
    ("missing.npz", "no such file"),
    ("folder.npz", "is a directory"),
    ("text.npz", "a text file (it starts with 'X,y"),
    ("empty.npz", "the file is empty (0 bytes)"),
    ("truncated.npz", "truncated or corrupt"),
    ("crc.npz", "array 'X' is truncated or corrupt (Bad CRC-32"),
    ("plain.npy", "a plain .npy array, not an .npz archive"),
    ("npy_named.npz", "a plain .npy array, not an .npz archive"),
    ("pickle.npz", "a Python pickle"),
    ("binary.npz", "not an .npz archive (it starts with b'\\x00"),
    ("no_y.npz", "missing required arrays ['y']; the file has ['X']"),
    ("no_x.npz", "missing required arrays ['X']"),
    ("empty_zip.npz", "missing required arrays ['X', 'y']; the file has []"),
    ("z_none.npz", "array 'z' holds Python objects (a pickled object array)"),
    ("member.npz", "member 'X' of the archive is not a .npy array"),
    ("complex.npz", "X is complex"),
    ("strings.npz", "X holds strings"),
    ("nan.npz", "X contains NaN or inf"),
    ("labels.npz", "y must contain labels in {-1, +1} or any two distinct values"),
    ("empty_T.npz", "X has no tokens (T = 0"),
]


@pytest.mark.parametrize("name, problem", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_load_names_the_file_and_the_problem(files, name, problem):
    with pytest.raises(ValueError) as info:
        TokenData.load(files[name])
    msg = str(info.value)
    assert msg.startswith(str(files[name])), msg
    assert problem in msg, msg
    if name == "text.npz":  # numpy's own message would claim pickled data
        assert "pickle" not in msg


def test_load_reads_what_save_wrote(files, tmp_path):
    d = TokenData.load(files["good"])
    ref = _good()
    for f in ("X", "y", "z", "v"):
        np.testing.assert_array_equal(getattr(d, f), getattr(ref, f))
    # save writes under a temporary name and renames: no temporary file is left behind
    assert sorted(p.name for p in tmp_path.glob(".*")) == []


# -------------------------------------------------------------- TokenData fields
X0, Y0 = np.zeros((2, 3, 4)), np.array([1.0, -1.0])
FIELD_CASES = [
    (dict(X=None, y=Y0), "X is None; TokenData needs tokens X of shape (n, T, d)"),
    (dict(X=X0, y=None), "y is None; TokenData needs labels y"),
    (dict(X=np.zeros((2, 0, 4)), y=Y0), "X has no tokens (T = 0 tokens per sequence)"),
    (dict(X=np.zeros((2, 3, 0)), y=Y0), "X has empty tokens (d = 0 features per token)"),
    (dict(X=np.zeros((0, 3, 4)), y=np.zeros(0)), "X is empty (n = 0 sequences)"),
    (dict(X=np.zeros((0, 2, 3, 4)), y=Y0), "X has an empty batch (B = 0)"),
    (dict(X=X0 + 0j, y=Y0), "X is complex (complex128)"),
    (dict(X=X0, y=Y0 + 0j), "y is complex"),
    (dict(X=X0, y=Y0, z=np.zeros((2, 4)) + 1j), "z is complex"),
    (dict(X=np.full((2, 3, 4), "1.0"), y=Y0), "X holds strings"),
    (dict(X=X0.astype(object), y=Y0), "X is an object array"),
    (dict(X=X0, y=Y0, v=np.array([1, None, 2, 3], dtype=object)), "v is an object array"),
    (dict(X=[[[1.0, 2.0], [3.0]]], y=[1.0]), "X must be a numeric array; got a ragged list"),
    (dict(X=X0, y=Y0, mask=np.full((2, 3), "yes")), "mask must be boolean (True = valid token); got dtype <U3"),
    (dict(X=X0, y=Y0, mask=np.full((2, 3), 0.5)), "mask must be boolean"),
]


@pytest.mark.parametrize("kw, problem", FIELD_CASES, ids=[c[1][:28] for c in FIELD_CASES])
def test_tokendata_names_the_field_and_the_problem(kw, problem):
    with pytest.raises(ValueError) as info:
        TokenData(**kw)
    assert problem in str(info.value), str(info.value)


def test_save_refuses_a_folder_and_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        _good().save(tmp_path)
    with pytest.raises(ValueError, match="the folder .*nowhere does not exist"):
        _good().save(tmp_path / "nowhere" / "d.npz")


# ------------------------------------------------------------------ CLI: solve
SOLVE_FILE_CASES = ["missing.npz", "folder.npz", "text.npz", "empty.npz", "truncated.npz",
                    "plain.npy", "z_none.npz", "complex.npz", "labels.npz", "nan.npz"]


@pytest.mark.parametrize("name", SOLVE_FILE_CASES)
def test_solve_bad_file_is_one_line(files, capsys, name):
    rc, out, err = run_cli(capsys, "solve", files[name])
    problem = dict(FILE_CASES)[name]
    assert_one_line_error(rc, err, "attnsvm solve: error:", str(files[name]), problem)
    assert out == ""


SOLVE_ARG_CASES = [
    (["--alpha", "a,b"], "--alpha expects 'opt' or comma-separated integer token indices"),
    (["--alpha", "1.5,0,0,0"], "--alpha expects 'opt' or comma-separated integer"),
    (["--alpha", "0,1"], "--alpha gives 2 token indices, but the data has n = 4 sequences"),
    (["--alpha", "0,1,2,7"], "alpha out of range"),
    (["--solver", "foo"], "unknown --solver 'foo' for --norm fro: use one of fast, active, ipm, mnp"),
    (["--solver", "barrier"], "--solver 'barrier' for --norm fro"),
    (["--norm", "nuc", "--solver", "mnp"], "--solver 'mnp' for --norm nuc"),
    (["--norm", "l1", "--solver", "ipm"], "--solver 'ipm' for --norm l1: use one of clarabel, scs"),
    (["--rank", "2"], "--rank applies to the nuclear norm only (--norm nuc); got --norm fro"),
    (["--norm", "l1", "--rank", "1"], "--rank applies to the nuclear norm only"),
    (["--rank", "0"], "argument --rank: expected an integer >= 1; got '0'"),
    (["--norm", "0.5"], "--norm 0.5: an entrywise norm needs p >= 1"),
    (["--norm", "banana"], "--norm banana: unknown norm 'banana'"),
    (["--problem", "prompt", "--norm", "nuc"], "does not apply to the prompt SVM, which is Frobenius only"),
]


@pytest.mark.parametrize("args, problem", SOLVE_ARG_CASES, ids=[" ".join(c[0]) for c in SOLVE_ARG_CASES])
def test_solve_bad_arguments_are_one_line(files, capsys, args, problem):
    rc, out, err = run_cli(capsys, "solve", files["good"], *args)
    assert_one_line_error(rc, err, problem)
    assert out == ""  # refused before solving


def test_solve_refuses_norm_and_rank_the_prompt_problem_would_ignore(files, capsys):
    rc, _, err = run_cli(capsys, "solve", files["no_z.npz"], "--norm", "nuc")
    assert_one_line_error(rc, err, "--norm nuc does not apply to the prompt SVM",
                          "--problem auto chose prompt")
    rc, _, err = run_cli(capsys, "solve", files["no_z.npz"], "--norm", "nuc", "--rank", "1")
    assert_one_line_error(rc, err, "does not apply to the prompt SVM")
    rc, _, err = run_cli(capsys, "solve", files["no_z.npz"], "--problem", "att")
    assert_one_line_error(rc, err, "--problem att needs cross-attention queries z",
                          "use --query first|last|seq2seq|causal (self-attention) or --problem "
                          "prompt")
    rc, _, err = run_cli(capsys, "solve", files["batched.npz"])
    assert_one_line_error(rc, err, "holds B = 2 datasets", "solve takes one")
    rc, _, err = run_cli(capsys, "solve", files["no_y.npz"])
    assert_one_line_error(rc, err, "--alpha opt", "needs labels y and the head v",
                          "has no y or v")


def test_solve_valid_arguments_still_solve(files, capsys):
    """The refusals above are not a blanket refusal: the same file solves, and the
    certificate printed is the solver's (W feasible, margin 1)."""
    rc, out, err = run_cli(capsys, "solve", files["good"], "--norm", "nuc", "--rank", "3",
                           "--solver", "barrier")
    assert err == "" and "min margin            1" in out
    assert rc in (0, 1) and ("status optimal" in out) == (rc == 0)


# ------------------------------------------------------------------ CLI: train
TRAIN_ARG_CASES = [
    (["--lr", "nan"], "argument --lr: expected a finite number > 0; got 'nan'"),
    (["--lr", "inf"], "argument --lr: expected a finite number > 0; got 'inf'"),
    (["--lr", "-0.1"], "argument --lr: expected a finite number > 0; got '-0.1'"),
    (["--lr", "0"], "argument --lr: expected a finite number > 0"),
    (["--trials", "0"], "argument --trials: expected an integer >= 1"),
    (["--steps", "-1"], "argument --steps: expected an integer >= 0"),
    (["--scale", "nan"], "argument --scale: expected a finite number >= 0"),
    (["--record-every", "0"], "argument --record-every: expected an integer >= 1"),
    (["--p", "3"], "--p applies to --optimizer mirror only"),
    (["--optimizer", "mirror", "--p", "1"], "--p must be a finite number > 1"),
    (["--model", "Prompt", "--query", "last"], "--query last does not apply to --model Prompt"),
    (["--device", "no-such-device"], "--device 'no-such-device' is not a torch device"),
    (["--device", "meta"], "--device meta: attnsvm runs on cpu, cuda or mps"),
    (["--out", "metrics.txt"], "--out metrics.txt: the metrics table is written as .parquet or .csv"),
    (["--out", "nowhere/metrics.csv"], "the folder nowhere does not exist"),
]


@pytest.mark.parametrize("args, problem", TRAIN_ARG_CASES, ids=[" ".join(c[0]) for c in TRAIN_ARG_CASES])
def test_train_bad_arguments_are_one_line(capsys, args, problem, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, "train", "--steps", "2", "--trials", "2", *args)
    assert_one_line_error(rc, err, problem)
    assert out == ""  # refused before training


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_train_cuda_without_cuda_is_one_line(capsys):
    rc, out, err = run_cli(capsys, "train", "--device", "cuda", "--steps", "2", "--trials", "2")
    assert_one_line_error(rc, err, "--device cuda: CUDA is not available", "use --device cpu")


def test_train_bad_data_files_are_one_line(files, capsys):
    for name in ("text.npz", "truncated.npz", "plain.npy", "missing.npz"):
        rc, out, err = run_cli(capsys, "train", "--data", files[name], "--steps", "2")
        assert_one_line_error(rc, err, "attnsvm train: error:", str(files[name]),
                              dict(FILE_CASES)[name])
    rc, _, err = run_cli(capsys, "train", "--data", files["no_z.npz"], "--steps", "2")
    assert_one_line_error(rc, err, "--query cross needs cross-attention queries z",
                          "use --query first|last")
    rc, _, err = run_cli(capsys, "train", "--data", files["batched.npz"], "--trials", "5",
                         "--steps", "2")
    assert_one_line_error(rc, err, "holds B = 2 datasets", "--trials 5 disagrees")


def test_train_seq2seq_labels_with_one_query_is_one_line(tmp_path, capsys):
    d = _good()
    y = np.where(np.arange(12).reshape(4, 3) % 2 == 0, 1.0, -1.0)
    path = TokenData(X=d.X, y=y, v=d.v).save(tmp_path / "s2s.npz")
    rc, _, err = run_cli(capsys, "train", "--data", path, "--query", "first", "--steps", "2")
    assert_one_line_error(rc, err, "holds seq-to-seq labels y of shape (n, T)",
                          "use --query seq2seq|causal")


def test_train_out_is_not_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "metrics.csv"
    out.write_text("precious\n")
    argv = ["train", "--steps", "3", "--trials", "2", "--out", out]
    rc, stdout, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, "the file exists; pass --force to overwrite it")
    assert out.read_text() == "precious\n" and stdout == ""
    rc, stdout, err = run_cli(capsys, *argv, "--force")
    assert rc == 0 and err == ""
    table = pd.read_csv(out)
    assert set(table.trial) == {0, 1} and table.step.max() == 3
    assert f"metrics ({len(table)} rows) -> {out}" in stdout
    assert not list(tmp_path.glob(".*.tmp"))  # written under a temporary name, renamed


# ------------------------------------------------------- CLI: sweep, reproduce, all
def test_sweep_and_reproduce_bad_arguments_are_one_line(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "sweep", "mmts-fig4", "--grid", "d=", "--scale", "tiny")
    assert_one_line_error(rc, err, "--grid expects KEY=VALUES")
    rc, _, err = run_cli(capsys, "sweep", "no-such-experiment")
    assert_one_line_error(rc, err, "unknown experiment 'no-such-experiment'")
    rc, _, err = run_cli(capsys, "sweep", "no_such_module_xyz:EXP")
    assert_one_line_error(rc, err, "cannot import module 'no_such_module_xyz'")
    rc, _, err = run_cli(capsys, "sweep", "attnsvm.data:TokenData")
    assert_one_line_error(rc, err, "is a type, not an Experiment")
    rc, _, err = run_cli(capsys, "sweep", "mmts-fig4", "--workers", "0")
    assert_one_line_error(rc, err, "argument --workers: expected an integer >= 1")
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{ not json")
    rc, _, err = run_cli(capsys, "sweep", "mmts-fig4", "--store", store, "--scale", "tiny",
                         "--dry-run")
    assert_one_line_error(rc, err, "manifest.json is corrupt", "refusing to merge")
    afile = tmp_path / "a-file"
    afile.write_text("x")
    rc, _, err = run_cli(capsys, "reproduce", "mmts-fig1", "--out", afile, "--scale", "tiny")
    assert_one_line_error(rc, err, f"--out {afile}: exists and is not a folder")
    rc, _, err = run_cli(capsys, "reproduce", "--threads", "0")
    assert_one_line_error(rc, err, "argument --threads: expected an integer >= 1")


def test_usage_errors_are_one_line(capsys):
    rc, _, err = run_cli(capsys, "train", "--model", "Nope")
    assert_one_line_error(rc, err, "argument --model: invalid choice: 'Nope'")
    rc, _, err = run_cli(capsys, "solve")
    assert_one_line_error(rc, err, "the following arguments are required: DATA.npz")
    assert run_cli(capsys, "--help")[0] == 0


def test_debug_shows_the_traceback_and_bugs_say_so(files, capsys, monkeypatch):
    with pytest.raises(ValueError, match="no such file"):
        main(["solve", str(files["missing.npz"]), "--debug"])
    with pytest.raises(ValueError, match="no such file"):
        main(["--debug", "solve", str(files["missing.npz"])])
    import attnsvm.cli.list_ as list_cmd

    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(list_cmd, "run", broken)
    rc, _, err = run_cli(capsys, "list")
    assert rc == 1
    assert_one_line_error(rc, err, "attnsvm list: internal error (RuntimeError): boom; second "
                                   "line", "--debug")


def test_console_exit_status_and_stderr(tmp_path):
    """The installed command itself: ``attnsvm train --lr nan`` exits non-zero with one
    line on stderr (the in-process tests above check main's return value)."""
    proc = subprocess.run([sys.executable, "-m", "attnsvm.cli", "train", "--lr", "nan"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "--lr: expected a finite number > 0" in proc.stderr


def test_train_cli_takes_every_registered_rule(capsys):
    from attnsvm.cli import main

    assert main(["train", "--optimizer", "adam", "--opt-arg", "eps=0", "--steps", "5",
                 "--trials", "2"]) == 0
    assert "adam(lr=0.1, b1=0.9, b2=0.999, eps=0.0)" in capsys.readouterr().out
    for argv, msg in [(["--optimizer", "adamx"], "unknown optimizer 'adamx'"),
                      (["--optimizer", "muon", "--opt-arg", "foo=1"], "unexpected keyword argument 'foo'"),
                      (["--optimizer", "adam", "--opt-arg", "eps"], "expected KEY=VALUE")]:
        assert main(["train", "--steps", "1", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err
