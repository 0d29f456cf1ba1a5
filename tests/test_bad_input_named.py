"""A named error for every bad input of issue 25 §3 and the output-folder fault of §4.

Each case is called as a user would call it and asserts the error names the argument and
what was expected (the CLI: one line, the documented exit status 2, nothing computed), or,
where the input is data that can be read (a tensor that requires grad), that every entry
point reads it the same way. The validator of ``train`` (``TRAIN_CONSTRAINTS``) is checked
against ``train``'s signature, so an argument added without a constraint fails here.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import attnsvm.plotting  # noqa: F401 - matplotlib set up as root, before any seteuid below
from attnsvm import data as D
from attnsvm import models as M
from attnsvm._validation import (
    InstanceOf,
    Interval,
    Options,
    Satisfies,
    check_memory,
    check_param,
    validate_params,
)
from attnsvm.cli import main
from attnsvm.data import TokenData
from attnsvm.svm import att_svm, att_svm_batch, prompt_svm
from attnsvm.train import TRAIN_CONSTRAINTS, train


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, (rc, err)  # the documented status of a user error
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


def _data(**kw):
    return D.random_sphere(n=3, T=4, d=3, seed=4, batch=2, **kw)


# ------------------------------------------------------------- the validator itself
def test_constraints_accept_normalise_and_name_what_they_expect():
    assert check_param("k", np.int32(3), [Interval(int, 1, None)]) == 3
    assert type(check_param("k", np.int32(3), [Interval(int, 1, None)])) is int
    assert check_param("x", 2, [Interval(float, 0, None, closed="neither")]) == 2.0
    assert check_param("x", None, [None, Interval(int, 1, None)]) is None
    assert check_param("e", "b", [Options("a", "b")]) == "b"
    assert check_param("f", "7", [Satisfies(int, "digits")]) == 7
    cases = [
        ("k", 0, [Interval(int, 1, None)], "k must be an integer >= 1; got 0"),
        ("k", True, [Interval(int, 0, 5)], "k must be an integer in [0, 5]; got True"),
        ("k", 2.0, [Interval(int, 0, None)], "got the float 2.0 (floats are refused, not "
                                             "truncated)"),
        ("k", 2 ** 64, [Interval(int, 0, 2 ** 63 - 1)], "in [0, 2**63 - 1]; got 18446744073709551616"),
        ("x", float("nan"), [Interval(float, 0, None)], "x must be a finite number >= 0; got nan"),
        ("x", 0.0, [Interval(float, 0, 1, closed="neither")], "x must be a finite number in (0, 1)"),
        ("x", "1", [Interval(float, 0, None)], "got '1'"),
        ("e", "c", [Options("a", "b")], "e must be one of 'a' or 'b'; got 'c'"),
        ("e", 1, [Options(True, False)], "got 1"),  # 1 == True, but it is not a bool
        ("n", 0, [None, Interval(int, 1, None)], "n must be an integer >= 1 or None; got 0"),
        ("o", [1], [InstanceOf(dict)], "o must be a dict; got [1]"),
        ("f", "x", [Satisfies(int, "digits")], "invalid literal for int()"),  # fn's own message
    ]
    for name, value, cons, msg in cases:
        with pytest.raises(ValueError) as info:
            check_param(name, value, cons)
        assert msg in str(info.value), (msg, str(info.value))
    with pytest.raises(ValueError, match="b must be an integer >= 0; got -1"):
        validate_params({"a": [Interval(int, 0, None)], "b": [Interval(int, 0, None)]},
                        {"a": 1, "b": -1})
    with pytest.raises(TypeError, match="no argument 'c'"):
        validate_params({"c": [None]}, {})


def test_train_table_covers_every_argument_but_the_data():
    """Every argument of train() has a constraint, except those checked against the data
    (data itself, alpha); the table names no argument train() lacks."""
    args = set(inspect.signature(train).parameters)
    assert set(TRAIN_CONSTRAINTS) == args - {"data", "alpha"}


# ------------------------------------------------------------------ train(): issue 25
TRAIN_CASES = [
    (dict(seed=2 ** 64), "seed must be an integer in [0, 2**63 - 1]; got 18446744073709551616"),
    (dict(seed=2 ** 63 - 1), "seed must be an integer in [0, 2**63 - B] for B = 2 trials"),
    (dict(seed=-1), "seed must be an integer in [0, 2**63 - 1]; got -1"),
    (dict(dtype=torch.int64), "dtype must be a real floating dtype: torch.float16, "
                              "torch.float32 or torch.float64; got torch.int64"),
    (dict(dtype=torch.complex128), "dtype must be a real floating dtype"),
    (dict(dtype=torch.bfloat16), "got torch.bfloat16"),
    (dict(dtype="float64"), "dtype must be a real floating dtype"),
    (dict(device="meta"), "device 'meta': attnsvm trains on 'cpu', 'cuda' or 'mps'"),
    (dict(device="nowhere"), "device 'nowhere' is not a torch device"),
    (dict(steps=2.0), "steps must be an integer >= 0; got the float 2.0"),
    (dict(scale=float("inf")), "scale must be a finite number > 0 or None; got inf"),
    (dict(B=0), "B must be an integer >= 1 or None; got 0"),
    (dict(progress="yes"), "progress must be True or False; got 'yes'"),
    (dict(engine="numba"), "engine must be one of 'auto', 'torch' or 'fused'"),
    (dict(init=3), "init must be an init kind (a str) or a dict of arrays; got 3"),
    (dict(references=[1]), "references must be a dict or None"),
    (dict(optimizer="nope"), "unknown optimizer 'nope'"),
]


@pytest.mark.parametrize("kw, msg", TRAIN_CASES, ids=[str(c[0])[:40] for c in TRAIN_CASES])
def test_train_names_the_bad_argument(kw, msg):
    with pytest.raises(ValueError) as info:
        train(M.WModel(3), _data(), **{"steps": 2, **kw})
    assert msg in str(info.value), str(info.value)


def test_train_refuses_a_model_that_cannot_fit_before_allocating(monkeypatch):
    """WModel(110000) holds 1.21e10 parameters per trial (96.8 GB in float64): refused by
    the size check at once, naming the model and the sizes, before the first tensor."""
    import attnsvm._validation as V
    import attnsvm.train as T

    def no_draw(*a, **k):  # the initial draw is the first allocation of the parameters
        raise AssertionError("train allocated the parameters before the size check")

    need = 16.0 * 110000 ** 2 * 8  # the float64 draw of one trial and its rescaled copy
    avail = V.available_memory()
    if avail is None or avail > need:
        pytest.skip(f"this machine has {avail} bytes available: WModel(110000) would fit")
    monkeypatch.setattr(M.WModel, "init", no_draw)
    monkeypatch.setattr(T, "_init_params", no_draw)
    data = D.random_sphere(n=2, T=2, d=110000, seed=0)
    with pytest.raises(ValueError) as info:
        train(M.WModel(110000), data, steps=1, B=1)
    msg = str(info.value)
    assert "train(WModel(d=110000), B=1) with 12,100,000,000 parameters per trial" in msg
    assert "GiB available on this machine" in msg and "chunk=" in msg
    # the check counts the trials that run at once: a chunk needs less, never more
    with pytest.raises(ValueError, match="chunk=1"):
        train(M.WModel(110000), data, steps=1, B=2, chunk=1)


def test_check_memory_refuses_only_beyond_what_is_available(monkeypatch):
    import attnsvm._validation as V

    monkeypatch.setattr(V, "available_memory", lambda device=None: 2 ** 30)
    check_memory(2 ** 29, "x", "y")  # fits: nothing happens
    with pytest.raises(ValueError, match=r"job needs at least 2 GiB, more than the 1 GiB "
                                         r"available on this machine; use less"):
        check_memory(2 ** 31, "job", "use less")
    monkeypatch.setattr(V, "available_memory", lambda device=None: None)
    check_memory(1e30, "x", "y")  # unknown: no refusal


def test_train_still_takes_every_valid_spelling():
    d = _data()
    t = train(M.WModel(3), d, steps=2, seed=np.int64(3), B=np.int32(2), scale=1,
              device="cpu", dtype=torch.float32, progress=np.bool_(False))
    assert t.W.dtype == np.float32 and t.steps_run == 2


# ------------------------------------------------------- tensors that require grad
def test_tensors_requiring_grad_are_read_the_same_everywhere():
    """TokenData, att_svm and train read a requires_grad tensor as its values (detached),
    and get what the plain array gives."""
    rng = np.random.default_rng(0)
    X, z = rng.standard_normal((3, 4, 2)), rng.standard_normal((3, 2))
    y = np.array([1.0, -1.0, 1.0])
    Xt = torch.tensor(X, requires_grad=True)
    zt = torch.tensor(z, requires_grad=True)
    d_t = TokenData(X=Xt, y=torch.tensor(y), z=zt, v=torch.ones(2, requires_grad=True))
    d_n = TokenData(X=X, y=y, z=z, v=np.ones(2))
    for f in ("X", "y", "z", "v"):
        assert isinstance(getattr(d_t, f), np.ndarray)
        np.testing.assert_array_equal(getattr(d_t, f), getattr(d_n, f))
    s_t, s_n = att_svm(Xt, zt, torch.tensor([0, 1, 2])), att_svm(X, z, [0, 1, 2])
    assert s_t.status_ == s_n.status_
    if s_n.W_ is not None:
        np.testing.assert_array_equal(s_t.W_, s_n.W_)
    b = att_svm_batch(Xt[None], zt[None], torch.tensor([[0, 1, 2]]))
    assert b.status_[0] == s_n.status_
    a = train(M.WModel(2), d_t, steps=3, B=2, engine="torch")
    c = train(M.WModel(2), d_n, steps=3, B=2, engine="torch")
    assert torch.equal(a.params["W"], c.params["W"])
    assert not Xt.grad  # nothing was differentiated through the caller's tensor
    meta = torch.zeros(3, 4, 2, device="meta")  # no values to read: refused by name
    for make in (lambda: TokenData(X=meta, y=y), lambda: att_svm(meta, z, [0, 1, 2])):
        with pytest.raises(ValueError, match="X is a tensor on the meta device, which holds "
                                             "no values"):
            make()


# --------------------------------------------------------------- the SVM solvers
def test_alpha_beyond_int64_is_out_of_range_not_an_overflow():
    X = np.random.default_rng(1).standard_normal((4, 4, 2))
    z = np.random.default_rng(2).standard_normal((4, 2))
    for alpha in ([2 ** 70, 0, 0, 0], np.array([2 ** 64 - 1, 0, 0, 0], dtype=np.uint64)):
        with pytest.raises(ValueError, match=r"alpha out of range: token indices must lie in "
                                             r"\[0, 3\]; got \[1"):
            att_svm(X, z, alpha)
    with pytest.raises(ValueError, match="alpha out of range"):
        prompt_svm(X, None, [0, -2 ** 65, 0, 0])


@pytest.mark.parametrize("tol", [-1.0, float("nan"), 0.0, float("inf"), "1e-6", True])
def test_tol_must_be_a_finite_number_above_zero(tol):
    """A tol <= 0 or NaN would report no support vectors at an optimum (margins a rounding
    error above 1 are not <= 1 + tol)."""
    X = np.random.default_rng(1).standard_normal((4, 4, 2))
    z = np.random.default_rng(2).standard_normal((4, 2))
    for solve in (lambda: att_svm(X, z, [0, 1, 2, 3], tol=tol),
                  lambda: att_svm_batch(X[None], z[None], [[0, 1, 2, 3]], tol=tol),
                  lambda: prompt_svm(X, None, [0, 1, 2, 3], tol=tol)):
        with pytest.raises(ValueError, match="tol must be a finite number > 0; got"):
            solve()


# ----------------------------------------------------------------------- the CLI
@pytest.fixture
def npz(tmp_path):
    return D.random_sphere(n=4, T=3, d=3, seed=0).save(tmp_path / "d.npz")


def test_cli_seed_beyond_int64_is_one_line(capsys):
    rc, out, err = run_cli(capsys, "train", "--seed", "18446744073709551616", "--steps", "2")
    assert_one_line_error(rc, err, "argument --seed: expected an integer in [0, 2**63 - 1]")
    assert out == ""
    rc, out, err = run_cli(capsys, "train", "--seed", str(2 ** 63 - 1), "--trials", "2",
                           "--steps", "2")
    assert_one_line_error(rc, err, "seed must be an integer in [0, 2**63 - B] for B = 2")


def test_cli_alpha_beyond_int64_is_bad_input_not_infeasible(npz, capsys):
    rc, out, err = run_cli(capsys, "solve", npz, "--alpha", "0,99999999999999999999999,0,0")
    assert_one_line_error(rc, err, "alpha out of range: token indices must lie in [0, 2]",
                          "99999999999999999999999")
    assert out == ""


def test_cli_huge_problems_are_user_errors_not_bugs(tmp_path, capsys, monkeypatch):
    """d = 110000: train and solve refuse by size at once (exit 2, not 'internal error',
    and for solve not exit 1, which means 'infeasible'); any MemoryError is one line."""
    import attnsvm._validation as V

    avail = V.available_memory()
    if avail is None or avail > 16.0 * 110000 ** 2 * 8:
        pytest.skip("this machine could hold a 110000 x 110000 float64 matrix")
    big = D.random_sphere(n=2, T=2, d=110000, seed=0).save(tmp_path / "big.npz")
    rc, out, err = run_cli(capsys, "train", "--data", big, "--trials", "1", "--steps", "1")
    assert_one_line_error(rc, err, "train(WModel(d=110000), B=1)", "GiB available")
    rc, out, err = run_cli(capsys, "solve", big)
    assert_one_line_error(rc, err, "the solution W_mm (110000 x 110000, float64)",
                          "GiB available")
    import attnsvm.cli.list_ as list_cmd

    def too_big(args):
        raise MemoryError("Unable to allocate 90.2 GiB for an array")

    monkeypatch.setattr(list_cmd, "run", too_big)
    rc, out, err = run_cli(capsys, "list")
    assert_one_line_error(rc, err, "attnsvm list: error: out of memory (Unable to allocate "
                                   "90.2 GiB for an array); use smaller inputs")


@contextlib.contextmanager
def _unprivileged():
    """Run the block as an unprivileged user when this process is root (root writes into
    any folder whatever its mode): the effective uid only, given back afterwards."""
    if os.name != "posix" or os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)  # nobody
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def read_only():
    """A folder that exists but takes no new files (mode 0555, reached through a 0755
    parent so an unprivileged user can see it)."""
    root = Path(tempfile.mkdtemp(prefix="attnsvm-ro-"))
    root.chmod(0o755)
    ro = root / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    yield ro
    ro.chmod(0o755)
    import shutil

    shutil.rmtree(root, ignore_errors=True)


def test_out_into_a_read_only_folder_is_refused_before_the_work(npz, read_only, capsys,
                                                                monkeypatch):
    import attnsvm.experiments as E
    import attnsvm.svm as S
    import attnsvm.sweep as W
    import attnsvm.train as T

    def no_work(*a, **k):
        raise AssertionError("the command started its work before checking --out")

    monkeypatch.setattr(T, "train", no_work)
    monkeypatch.setattr(S, "att_svm", no_work)
    monkeypatch.setattr(E, "run_experiment", no_work)
    monkeypatch.setattr(W, "sweep", no_work)
    cases = [
        (["train", "--steps", "2", "--out", read_only / "m.csv"],
         f"--out {read_only / 'm.csv'}: cannot write into the folder {read_only}"),
        (["solve", npz, "--out", read_only / "w.npz"],
         f"--out {read_only / 'w.npz'}: cannot write into the folder {read_only}"),
        (["reproduce", "mmts-fig1", "--scale", "tiny", "--out", read_only / "rep"],
         f"--out {read_only / 'rep'}: cannot write into {read_only}, where it would be made"),
        (["reproduce", "mmts-fig1", "--scale", "tiny", "--out", read_only],
         f"--out {read_only}: cannot write into the folder"),
        (["sweep", "mmts-fig4", "--scale", "tiny", "--store", read_only / "s"],
         f"--store {read_only / 's'}: cannot write into {read_only}"),
    ]
    for argv, msg in cases:
        with _unprivileged():
            rc, out, err = run_cli(capsys, *argv)
        assert_one_line_error(rc, err, msg, "give a writable place")
        assert "done" not in out and "W_mm" not in out
    assert list(read_only.iterdir()) == []  # not even the write check's probe file is left
