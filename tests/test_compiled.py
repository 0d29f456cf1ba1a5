"""Compile visibly, once (issue 34): :mod:`attnsvm.compiled` reads numba's own cache index
to tell an empty cache from a filled one (calibrated on a real kernel compiled here), a
library call that meets an empty cache logs ``compiling kernels (once, about N min)`` and
compiles before its timer starts (a certificate's ``time_`` never holds the compile), and
``warmup`` reports every group."""

from __future__ import annotations

import logging
import sys
import textwrap
import time

import numpy as np
import pytest

from attnsvm import compiled
from attnsvm._optional import OptionalImport

pytest.importorskip("numba")

KERNEL = """
from numba import njit


@njit(cache=True)
def plus_one(x):
    return x + 1.0
"""


@pytest.fixture
def demo_group(tmp_path, monkeypatch):
    """A kernel group 'demo' of one real numba kernel in a fresh module (an empty cache)."""
    name = f"attnsvm_demo_kernel_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(KERNEL))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    groups = {**compiled.GROUPS, "demo": (name, "the demo kernel", 1)}
    monkeypatch.setattr(compiled, "GROUPS", groups)
    monkeypatch.setattr(compiled, "_BY_MODULE", {**compiled._BY_MODULE, name: "demo"})
    monkeypatch.setattr(compiled, "_done", set())
    monkeypatch.setattr(compiled, "_ready", set())
    warm = compiled._warm

    def _warm(group):
        if group != "demo":
            return warm(group)
        mod = __import__(name)
        return mod.plus_one(1.0) == 2.0

    monkeypatch.setattr(compiled, "_warm", _warm)
    yield name
    sys.modules.pop(name, None)


def test_is_cached_reads_numba_s_index(demo_group):
    assert compiled.is_cached("demo") is False  # nothing compiled yet
    assert __import__(demo_group).plus_one(2.0) == 3.0  # numba compiles and writes its cache
    assert compiled.is_cached("demo") is True


def test_is_cached_refuses_an_unknown_group():
    with pytest.raises(ValueError, match="group must be one of"):
        compiled.is_cached("no-such-group")


def test_an_empty_cache_is_compiled_once_and_said(demo_group, caplog):
    with caplog.at_level(logging.INFO, logger="attnsvm"):
        compiled.ensure(demo_group)
    notes = [r.getMessage() for r in caplog.records if r.name == "attnsvm.compiled"]
    assert any("compiling kernels (once, about 1 min)" in m and "demo kernel" in m
               for m in notes), notes
    assert compiled.is_cached("demo") is True  # compiled by ensure, before it returned
    caplog.clear()
    compiled.ensure(demo_group)  # once per process: nothing more
    assert not caplog.records


def test_a_filled_cache_is_not_announced(demo_group, caplog):
    __import__(demo_group).plus_one(1.0)
    compiled._done.clear()
    compiled._ready.clear()
    with caplog.at_level(logging.INFO, logger="attnsvm"):
        compiled.ensure(demo_group)
    assert not caplog.records


def test_warmup_reports_every_group_with_a_line_each(capsys):
    import io

    out = io.StringIO()
    assert set(compiled.WARMUPS) == set(compiled.GROUPS)  # every group has its warm-up
    times = compiled.warmup(progress=True, stream=out)
    assert set(times) == set(compiled.GROUPS)
    assert all(t is not None and t >= 0 for t in times.values())
    lines = out.getvalue().splitlines()
    for _, what, _ in compiled.GROUPS.values():
        assert any(what in line and (" in " in line) for line in lines), (what, lines)
    assert all(compiled.is_cached(g) for g in compiled.GROUPS)


# ------------------------------------------- a certificate's time holds no compile
SLOW = 1.0  # seconds the stand-in compile takes


@pytest.fixture
def cold(monkeypatch):
    """Every group looks uncompiled to a fresh OptionalImport; 'compiling' takes SLOW s."""
    warm = compiled._warm
    calls = []

    def slow_warm(group):
        calls.append(group)
        time.sleep(SLOW)
        return warm(group)

    monkeypatch.setattr(compiled, "_done", set())
    monkeypatch.setattr(compiled, "_ready", set())
    monkeypatch.setattr(compiled, "is_cached", lambda group: False)
    monkeypatch.setattr(compiled, "_warm", slow_warm)
    return calls


def test_att_svm_time_excludes_the_compile(cold, monkeypatch, caplog):
    from attnsvm.svm import active, att_svm

    monkeypatch.setattr(active, "kernels", OptionalImport("._active_kernels", "attnsvm.svm"))
    X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [-1.0, 0.0]]])
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="attnsvm"):
        sol = att_svm(X, np.eye(2), alpha=[0, 0])
    assert time.perf_counter() - t0 >= SLOW and cold == ["active"]
    assert sol.status_ == "optimal" and sol.time_ < SLOW / 2, sol.time_
    assert any("compiling kernels (once" in r.getMessage() for r in caplog.records)


def test_graph_svm_time_excludes_the_compile(cold, monkeypatch):
    from attnsvm.svm import active, graph_svm, sdp

    monkeypatch.setattr(active, "kernels", OptionalImport("._active_kernels", "attnsvm.svm"))
    monkeypatch.setattr(sdp, "_nuc_kernels", OptionalImport("._nuc_kernels", "attnsvm.svm"))
    t0 = time.perf_counter()
    sol = graph_svm(np.eye(3), [[0, 1, 2]], [0], "nuc")
    assert time.perf_counter() - t0 >= 2 * SLOW and sorted(cold) == ["active", "nuclear"]
    assert sol.status_ == "optimal" and sol.time_ < SLOW / 2, sol.time_


def test_a_second_thread_waits_for_the_compile(cold, monkeypatch):
    """While one thread compiles a group, another that needs it waits instead of running
    (and timing) a kernel mid-compile."""
    import threading

    from attnsvm.svm import active

    monkeypatch.setattr(active, "kernels", OptionalImport("._active_kernels", "attnsvm.svm"))
    ends = {}

    def first():
        active.kernels()
        ends["first"] = time.perf_counter()

    t = threading.Thread(target=first)
    t.start()
    time.sleep(SLOW / 4)  # the first thread is inside the stand-in compile
    compiled.ensure("attnsvm.svm._active_kernels")
    ends["second"] = time.perf_counter()
    t.join()
    assert cold == ["active"] and ends["second"] >= ends["first"] - 0.05
