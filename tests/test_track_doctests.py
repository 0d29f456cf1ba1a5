"""The examples in the docstrings of attnsvm.track run (issue 34: every public function and
class of attnsvm.track has a runnable example, checked in CI) and every public function and
class of the package and its modules has one."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

import attnsvm.track

MODULES = ["attnsvm.track", "attnsvm.track.tracker", "attnsvm.track.extract",
           "attnsvm.track.heads", "attnsvm.track.plot", "attnsvm.track.graph",
           "attnsvm.track.rope", "attnsvm.track.verify"]


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_run(name):
    pytest.importorskip("transformers")
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                          verbose=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} examples of {name} failed"


def _public(mod) -> list[str]:
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [k for k, v in vars(mod).items() if not k.startswith("_")
                 and (inspect.isfunction(v) or inspect.isclass(v)) and v.__module__ == mod.__name__]
    return list(names)


def _lacking() -> list[str]:
    out = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for n in _public(mod):
            obj = getattr(mod, n)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # constants: SUPPORTED, SUPPORTED_MODEL_TYPES, TINY_CONFIGS
            if ">>>" not in (obj.__doc__ or "") and n not in out:
                out.append(n)
    for n in attnsvm.track.__all__:
        obj = getattr(attnsvm.track, n)
        if obj is attnsvm.track.Tracker:
            out += [f"Tracker.{a}" for a in ("step", "due", "record", "capture", "summary",
                                             "to_tensorboard", "plot", "callback",
                                             "lightning_callback")
                    if ">>>" not in (getattr(obj, a).__doc__ or "")]
    return out


def test_every_public_name_has_an_example():
    assert not _lacking()


def test_the_check_sees_a_missing_example(monkeypatch):
    def bare():
        """No example."""

    monkeypatch.setattr(attnsvm.track, "bare", bare, raising=False)
    monkeypatch.setattr(attnsvm.track, "__all__", [*attnsvm.track.__all__, "bare"])
    assert _lacking() == ["bare"]
