"""Issue 23: what a new user meets first. Labels in any two values (mapped to -1 / +1 with
the mapping reported), the outcome of a run at the end of ``attnsvm train`` and in
``Trajectory``'s repr (held equal to :func:`attnsvm.tokens.outcome` called by hand), one
warning when the compiled paths cannot load, a text progress bar without ipywidgets, one
display per figure in a notebook, and the licence / citation files."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from attnsvm import data as D
from attnsvm.cli import main
from attnsvm.data import TokenData
from attnsvm.models import KQModel, WModel
from attnsvm.optim import get as get_rule
from attnsvm.tokens import outcome, outcome_line, run_geometry
from attnsvm.train import train

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- labels
@pytest.mark.parametrize("y, neg, pos", [
    ([0, 1, 1, 0], 0, 1),
    ([0.0, 1.0, 1.0, 0.0], 0.0, 1.0),
    ([3, 7, 7, 3], 3, 7),
    ([False, True, True, False], False, True),
    (["ham", "spam", "spam", "ham"], "ham", "spam"),
    ([-1, 0, 0, -1], -1, 0),
])
def test_two_distinct_labels_map_to_minus_and_plus_one_in_sorted_order(y, neg, pos):
    X = np.random.default_rng(0).standard_normal((4, 3, 2))
    t = TokenData(X=X, y=y)
    expect = np.array([1.0 if v == pos else -1.0 for v in y])
    np.testing.assert_array_equal(t.y, expect)
    assert t.label_map == {neg: -1, pos: 1}
    assert "labels" in repr(t) and "-> -1" in t.label_note() and "-> +1" in t.label_note()


def test_plus_minus_one_labels_have_no_mapping():
    t = TokenData(X=np.zeros((3, 2, 2)), y=[1, -1, 1])
    assert t.label_map is None and t.label_note() == "" and "labels" not in repr(t)


@pytest.mark.parametrize("y, match", [
    ([2, 2, 2], r"got one value: \[2\]"),
    ([0, 1, 2], r"got 3 values: \[0, 1, 2\]"),
    (["a", "a", "a"], r"two distinct labels .* got 1"),
    (["a", "b", "c"], r"two distinct labels .* got 3"),
])
def test_labels_that_are_not_two_values_are_refused(y, match):
    with pytest.raises(ValueError, match=match):
        TokenData(X=np.zeros((3, 2, 2)), y=y)


def test_label_mapping_survives_save_load_trial_and_replace(tmp_path):
    X = np.random.default_rng(1).standard_normal((2, 4, 3, 2))
    t = TokenData(X=X, y=np.array([[0, 1, 1, 0], [1, 1, 0, 0]]))
    assert t.label_map == {0: -1, 1: 1}
    u = TokenData.load(t.save(tmp_path / "d.npz"))
    np.testing.assert_array_equal(u.y, t.y)
    assert u.label_map == {0: -1, 1: 1}
    assert t.trial(1).label_map == {0: -1, 1: 1}
    assert t.replace(X=2 * X).label_map == {0: -1, 1: 1}
    assert t.replace(y=np.ones((2, 4))).label_map is None


def test_cli_train_and_solve_report_the_label_mapping(tmp_path, capsys):
    d = D.random_sphere(n=4, T=3, d=3, seed=0)
    y01 = ((d.y + 1) / 2).astype(int)  # -1 -> 0, +1 -> 1
    np.savez(tmp_path / "d01.npz", X=d.X, y=y01, z=d.z, v=d.v)
    rc = main(["train", "--data", str(tmp_path / "d01.npz"), "--trials", "3", "--steps", "5"])
    out = capsys.readouterr().out
    assert rc == 0 and "labels 0 -> -1, 1 -> +1" in out
    rc = main(["solve", str(tmp_path / "d01.npz")])
    out = capsys.readouterr().out
    assert rc in (0, 1) and "labels 0 -> -1, 1 -> +1" in out
    # the same data with +-1 labels: the same SVM (the mapping is the identity on them)
    np.savez(tmp_path / "dpm.npz", X=d.X, y=d.y, z=d.z, v=d.v)
    main(["solve", str(tmp_path / "d01.npz"), "--out", str(tmp_path / "a.npz")])
    main(["solve", str(tmp_path / "dpm.npz"), "--out", str(tmp_path / "b.npz")])
    capsys.readouterr()
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert sorted(a.files) == sorted(b.files) and "W_mm" in a.files
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])


# ---------------------------------------------------------------------------- outcome
def _direct(traj, data, z, norm):
    """tokens.outcome called by hand on the final W, with the queries given explicitly."""
    return outcome(traj.W, data.X, data.y, data.v, z, norm=norm)


@pytest.mark.parametrize("query", ["cross", "first", "last"])
def test_trajectory_outcome_equals_outcome_called_by_hand(query):
    data = D.random_sphere(n=3, T=4, d=5, seed=3, batch=6)
    traj = train(WModel(5, query=query), data, optimizer="ngd", steps=400, seed=1)
    z = {"cross": data.z, "first": data.X[:, :, 0], "last": data.X[:, :, -1]}[query]
    want = _direct(traj, data, z, "fro")
    got = traj.outcome()
    assert list(got.outcome) == list(want.outcome)
    np.testing.assert_allclose(got.corr_lmm.to_numpy(), want.corr_lmm.to_numpy(), equal_nan=True)
    np.testing.assert_allclose(got.corr_gmm.to_numpy(), want.corr_gmm.to_numpy(), equal_nan=True)
    line = outcome_line(want, "fro")
    assert line in repr(traj)
    counts = dict(re.findall(r"(GMM|LMM|other|not saturated) (\d+)", line))
    assert sum(map(int, counts.values())) == 6


def test_outcome_line_counts_and_the_correlation_with_the_reached_svm():
    import pandas as pd

    df = pd.DataFrame({"outcome": ["GMM", "GMM", "LMM", "not saturated"],
                       "corr_lmm": [0.999, 0.998, 0.9991, 0.2]})
    line = outcome_line(df, "nuc")
    assert line.startswith("outcome (nuc SVM): GMM 2, LMM 1, not saturated 1 of 4")
    assert "median 0.9990, min 0.9980" in line  # the unsaturated run's 0.2 is left out


def test_kq_runs_are_judged_in_the_nuclear_norm_and_seq2seq_runs_say_why_not():
    data = D.random_sphere(n=3, T=4, d=4, seed=0, batch=2)
    traj = train(KQModel(4), data, steps=20)
    assert "outcome (nuc SVM)" in repr(traj)
    s2s = train(WModel(4, query="causal"), D.random_sphere(n=3, T=4, d=4, seed=0), steps=3, B=2)
    assert "outcome: not judged (query 'causal'" in repr(s2s)
    with pytest.raises(ValueError, match="causal"):
        s2s.outcome()
    from attnsvm.models import DiagModel

    diag = train(DiagModel(4), data, steps=3)
    assert "outcome: not judged (diagonal (k, q)" in repr(diag)


def test_run_geometry_follows_the_optimiser_on_W():
    W = WModel(3)
    assert run_geometry(W, get_rule("ngd")) == "fro"
    assert run_geometry(W, get_rule("sign")) == "linf"
    assert run_geometry(W, get_rule("spectral")) == "spectral"
    assert run_geometry(W, get_rule("mirror", p=3.0)) == "l3"
    assert run_geometry(KQModel(3), get_rule("sign")) == "nuc"


def test_cli_train_ends_with_the_outcome_of_its_runs(capsys):
    rc = main(["train", "--trials", "4", "--steps", "300", "--seed", "2"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and out[-1].startswith("  outcome (fro SVM): ")
    data = D.random_sphere(seed=2, batch=4)
    traj = train(WModel(10), data, optimizer=get_rule("ngd", lr=0.1), steps=300, seed=2, B=4)
    assert out[-1].strip() == outcome_line(_direct(traj, data, data.z, "fro"), "fro")


# ------------------------------------------------------------------ compiled paths
def test_one_warning_when_the_compiled_paths_cannot_load(monkeypatch):
    from attnsvm import _optional

    monkeypatch.setattr(_optional, "_warned", [])
    a = _optional.OptionalImport("._no_such_kernels", "attnsvm")
    b = _optional.OptionalImport("._no_such_kernels_either", "attnsvm")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert a() is None and b() is None and a() is None
    hits = [w for w in rec if issubclass(w.category, _optional.CompiledPathsWarning)]
    assert len(hits) == 1
    msg = str(hits[0].message)
    assert "numba" in msg and "slower" in msg and "pip install" in msg


def test_a_working_kernel_import_warns_nothing(monkeypatch):
    from attnsvm import _optional

    monkeypatch.setattr(_optional, "_warned", [])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert _optional.OptionalImport(".norms", "attnsvm")() is not None
    assert not [w for w in rec if issubclass(w.category, _optional.CompiledPathsWarning)]


# --------------------------------------------------------------------------- notebook
def test_progress_bar_is_a_text_bar_without_ipywidgets(monkeypatch):
    import sys

    import tqdm.std

    from attnsvm.progress import progress_bar

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        bar = progress_bar(total=2, disable=True)
        bar.close()
    assert type(bar) is tqdm.std.tqdm
    assert not [w for w in rec if "IProgress" in str(w.message)]


@pytest.mark.parametrize("inline", [True, False])
def test_metric_figure_is_displayed_once(monkeypatch, inline):
    import matplotlib.pyplot as plt

    from attnsvm import plotting

    monkeypatch.setattr(plotting, "_inline_backend", lambda: inline)
    traj = train(WModel(4), D.random_sphere(n=2, T=3, d=4, seed=0), steps=4, B=2)
    fig = traj.plot("loss")
    # inline (Jupyter): only the returned Figure is shown, so pyplot no longer holds it;
    # elsewhere it stays open for plt.show()
    assert (fig.number in plt.get_fignums()) is (not inline)
    plt.close(fig)


# ---------------------------------------------------------------- licence, citation
def test_license_citation_changelog_and_py_typed():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT" and "numba>=0.59" in meta["dependencies"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    cff = (ROOT / "CITATION.cff").read_text()
    assert cff.startswith("cff-version: 1.2.0") and "\nlicense: MIT\n" in cff
    assert f"\nversion: {meta['version']}\n" in cff
    refs = re.split(r"^  - type: ", cff.split("\nreferences:\n")[1], flags=re.M)[1:]
    ids = [re.search(r'value: "(arXiv:[0-9.]+)"', r).group(1) for r in refs]
    assert sorted(ids) == sorted(["arXiv:2306.13596", "arXiv:2308.16898", "arXiv:2402.05738",
                                  "arXiv:2410.14581", "arXiv:2403.08699", "arXiv:2403.08081",
                                  "arXiv:2409.17625", "arXiv:2410.07746"])
    assert all("title: " in r and "family-names: " in r and "year: " in r for r in refs)
    assert f"## [{meta['version']}]" in (ROOT / "CHANGELOG.md").read_text()
    assert (ROOT / "src" / "attnsvm" / "py.typed").is_file()


# ------------------------------------------------------------- registries and the CLI
def _help(capsys, *argv) -> str:
    assert main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_cli_choices_come_from_the_registries(capsys, monkeypatch):
    from attnsvm import norms
    from attnsvm.losses import LOSSES
    from attnsvm.models import INIT_KINDS, MODELS, QUERIES

    class Twice(norms.Spectral):
        name = "twice"

    monkeypatch.setattr(norms, "NORMS", dict(norms.NORMS))
    monkeypatch.setattr(norms, "_ALIASES", dict(norms._ALIASES))
    norms.register_norm(Twice(), "x2")
    solve = _help(capsys, "solve")
    assert all(f" {name} |" in solve or f"| {name} " in solve for name in norms.NORMS)
    assert "twice" in solve and "{" + ",".join(QUERIES) + "}" in solve
    train_help = _help(capsys, "train")
    for reg in (MODELS, LOSSES, INIT_KINDS, QUERIES):
        assert "{" + ",".join(reg) + "}" in train_help


def test_register_norm_refuses_a_taken_name(monkeypatch):
    from attnsvm import norms

    monkeypatch.setattr(norms, "NORMS", dict(norms.NORMS))
    monkeypatch.setattr(norms, "_ALIASES", dict(norms._ALIASES))

    class Other(norms.Spectral):
        name = "other"

    with pytest.raises(ValueError, match="'nuclear' is taken by Norm\\('nuc'\\)"):
        norms.register_norm(Other(), "nuclear")
    with pytest.raises(ValueError, match="needs a Norm instance"):
        norms.register_norm("fro")
    assert norms.register_norm(Other(), "oth") is norms.get_norm("OTH")
