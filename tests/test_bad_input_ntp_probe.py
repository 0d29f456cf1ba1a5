"""Bad input named at the door (issue 31): NTPData (ragged seqs, string or complex E,
string labels), load_ntp (a truncated archive, a .npy, a text file, an object array: the
file and what was expected named), and ``attnsvm probe`` on a damaged model.safetensors
or with --max-tokens beyond the model's positions (one line, exit 2, not 'internal
error')."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attnsvm.ntp import NTPData, load_ntp

E = np.eye(3)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(E=E, seqs=[[0, 1, 2], [1, 2]], y=[0, 1]), "seqs must be an array of integer token ids"),
    (dict(E=[["a", "b"], ["c", "d"]], seqs=[[0, 1]], y=[0]), "E must be a (K, d) array of finite real numbers; got strings"),
    (dict(E=[["1", "2"], ["3", "4"]], seqs=[[0, 1]], y=[0]), "got strings"),
    (dict(E=E + 1j, seqs=[[0, 1]], y=[0]), "complex numbers (the imaginary part would be dropped"),
    (dict(E=E + 0j, seqs=[[0, 1]], y=[0]), "complex numbers"),
    (dict(E=[[1.0, 2.0], [3.0]], seqs=[[0, 1]], y=[0]), "E must be a (K, d) array of token embeddings; got a ragged list"),
    (dict(E=E, seqs=[[0, 1], [1, 2]], y=[["a", "b"], ["c"]]), "y[0] must hold integer token ids"),
    (dict(E=E, seqs=[[0, 1], [1, 2]], y=["a", "b"]), "y must hold integer token ids"),
])
def test_ntpdata_names_what_is_wrong(kwargs, needle):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning: refused, never cast
        with pytest.raises(ValueError) as exc:
            NTPData(**kwargs)
    assert needle in str(exc.value)


def test_ntpdata_still_takes_what_it_took():
    d = NTPData(np.eye(3).astype(np.float32), np.array([[0, 1], [1, 2]], np.int32), [[0, 1], [2]])
    assert d.E.dtype == np.float64 and d.y.tolist() == [[0, 1], [2, -1]]
    assert NTPData(np.arange(6).reshape(3, 2), [[0, 1]], [1.0]).y.tolist() == [1]


def _files(tmp_path):
    good = NTPData(E, [[0, 1], [1, 2]], [0, 2]).save(tmp_path / "good.npz")
    (tmp_path / "trunc.npz").write_bytes(good.read_bytes()[:100])
    np.save(tmp_path / "plain.npy", E)
    (tmp_path / "text.npz").write_text("E, seqs, y\n1, 2, 3\n")
    np.savez(tmp_path / "objects.npz", E=np.array([object()], dtype=object),
             seqs=np.zeros((1, 2)), y=np.zeros(1))
    np.savez(tmp_path / "nolabels.npz", E=E, seqs=[[0, 1]])
    np.savez(tmp_path / "badid.npz", E=E, seqs=[[0, 5]], y=[0])
    return good


@pytest.mark.parametrize("name, needle", [
    ("trunc.npz", "truncated or corrupt"),
    ("plain.npy", "plain .npy array"),
    ("text.npz", "text file"),
    ("objects.npz", "holds Python objects"),
    ("nolabels.npz", "missing required arrays ['y']"),
    ("badid.npz", "seqs[0, 1] = 5 is not a token id"),
])
def test_load_ntp_names_the_file_and_what_was_expected(tmp_path, name, needle):
    _files(tmp_path)
    with pytest.raises(ValueError) as exc:
        load_ntp(tmp_path / name)
    msg = str(exc.value)
    assert needle in msg and name in msg and "NTP data file (.npz with arrays E, seqs, y" in msg


def test_load_ntp_round_trip_and_missing_file(tmp_path):
    good = _files(tmp_path)
    d = load_ntp(good)
    assert d.y.tolist() == [0, 2] and np.array_equal(d.E, E)
    with pytest.raises(FileNotFoundError, match="no NTP data file"):
        load_ntp(tmp_path / "absent.npz")
    assert sorted(p.name for p in tmp_path.glob(".*tmp")) == []  # the atomic save left nothing


# ------------------------------------------------------------------- probe
transformers = pytest.importorskip("transformers")


@pytest.fixture
def tiny_model(tmp_path):
    from test_probe import tiny_distilbert_dir  # max_position_embeddings = 32

    return tiny_distilbert_dir(tmp_path)


def _probe(capsys, model, out, *extra):
    from attnsvm.cli import main

    rc = main(["probe", "--model", str(model), "--out", str(out), "--no-progress",
               "--max-sentences", "2", "--control-seeds", "0", "--null-draws", "0", *extra])
    return rc, capsys.readouterr().err


def test_probe_on_a_truncated_safetensors_is_a_user_error(tiny_model, tmp_path, capsys):
    st = tiny_model / "model.safetensors"
    st.write_bytes(st.read_bytes()[:200])
    rc, err = _probe(capsys, tiny_model, tmp_path / "out")
    assert rc == 2 and err.count("\n") == 1, err
    assert "internal error" not in err and "could not be loaded" in err and str(tiny_model) in err


def test_probe_max_tokens_beyond_the_positions_is_named(tiny_model, tmp_path, capsys):
    rc, err = _probe(capsys, tiny_model, tmp_path / "out", "--max-tokens", "33")
    assert rc == 2 and err.count("\n") == 1, err
    assert "--max-tokens 33 is beyond the 32 positions" in err and "use at most 32" in err
    rc, err = _probe(capsys, tiny_model, tmp_path / "out2", "--max-tokens", "32")
    assert rc == 0, err


def test_run_probe_names_config_max_tokens(tiny_model):
    from attnsvm.realdata.probe import ProbeConfig, run_probe

    with pytest.raises(ValueError, match=r"config.max_tokens 40 is beyond the 32 positions"):
        run_probe(tiny_model, config=ProbeConfig(max_tokens=40))


def test_library_errors_hold_no_command_line_words():
    from attnsvm.realdata.probe import ModelNotFoundError, resolve_model_path

    with pytest.raises(ModelNotFoundError) as exc:
        resolve_model_path("/no/such/model/dir-xyz")
    assert "--model" not in str(exc.value) and "local Hugging Face model directory" in str(exc.value)
