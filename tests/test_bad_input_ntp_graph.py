"""A named error, before any work, for every bad input of the Graph-SVM and NTP graph
entry points of issue 31 §3: graph_svm, graph_svm_batch, graph_rows, scc_table,
priority_graph, w_fin, decompose, ntp_random."""

from __future__ import annotations

import numpy as np
import pytest

from attnsvm.ntp import (
    NTPData,
    decompose,
    graph_rows,
    ntp_random,
    priority_graph,
    scc_table,
    w_fin,
)
from attnsvm.svm import graph as G
from attnsvm.svm import graph_svm, graph_svm_batch


@pytest.fixture
def data():
    return ntp_random(4, 3, 8, 8, graph="any", seed=0)


@pytest.fixture
def no_solve(monkeypatch):
    """Any solve reached is a failure: the error must come first."""
    from dataclasses import replace

    from attnsvm.svm.strategy import STRATEGIES

    def fail(*a, **k):
        pytest.fail("work started")

    for N, st in list(STRATEGIES.items()):
        if st.graph is not None:  # the Graph-SVM solvers of the strategy table
            monkeypatch.setitem(STRATEGIES, N, replace(st, graph=fail))
    monkeypatch.setattr(G, "_farkas", fail)


@pytest.mark.parametrize("exclude, msg", [
    (np.full((4, 3), 0.5), r"exclude must be a boolean array .* got values \[0\.5\]"),
    (np.full((4, 3), np.nan), r"exclude must be a boolean array"),
    (np.zeros((4, 2), bool), r"exclude must be a boolean array of shape \(n, T\) = \(4, 3\).* "
                             r"got shape \(4, 2\)"),
    (np.full((4, 3), "x"), r"exclude must be a boolean array .* got dtype"),
])
def test_graph_svm_exclude(data, no_solve, exclude, msg):
    with pytest.raises(ValueError, match=msg):
        graph_svm(data.E, data.seqs, data.y, exclude=exclude)


def test_graph_svm_exclude_zero_one_numbers_are_read_as_booleans(data):
    ex = np.zeros((4, 3))
    ex[:, 0] = 1
    a = graph_svm(data.E, data.seqs, data.y, exclude=ex)
    b = graph_svm(data.E, data.seqs, data.y, exclude=ex.astype(bool))
    assert a.status_ == b.status_ and np.array_equal(a.W_, b.W_)


@pytest.mark.parametrize("tol", [-1, 0, float("nan"), float("inf"), "1e-6", True])
def test_graph_svm_tol(data, no_solve, tol):
    with pytest.raises(ValueError, match="tol must be a finite number > 0"):
        graph_svm(data.E, data.seqs, data.y, tol=tol)


def test_graph_svm_batch(data, no_solve):
    with pytest.raises(ValueError, match=r"problems must be a list .* got a NTPData .*pass \[data\]"):
        graph_svm_batch(data)
    with pytest.raises(ValueError, match="problems must be a list"):
        graph_svm_batch((data.E, data.seqs, data.y)[0])
    with pytest.raises(ValueError, match="tol must be a finite number > 0"):
        graph_svm_batch([data], tol=-1)
    with pytest.raises(ValueError, match=r"unknown keyword argument\(s\) \['bogus'\]"):
        graph_svm_batch([data], bogus=1)
    with pytest.raises(ValueError, match=r"problems\[0\]: exclude must be a boolean array"):
        graph_svm_batch([data], exclude=np.full((4, 3), 0.5))
    with pytest.raises(ValueError, match="norm must be 'fro' or 'nuc'"):
        graph_svm_batch([data], norm="l1")


def test_graph_rows_ids_beyond_K_are_refused_not_moved():
    # id 3 with K = 3: (q K + a) K + b would fold it into query 1's row
    with pytest.raises(ValueError, match=r"seqs\[0, 0\] = 3 is not a token id in \[0, K=3\)"):
        graph_rows([[3, 1, 0]], [3], 3)
    with pytest.raises(ValueError, match=r"y\[0\] = 5 is not a token id in \[0, K=4\)"):
        graph_rows([[1, 2, 0]], [5], 4)
    with pytest.raises(ValueError, match=r"y\[0, 1\] = -2 is not a token id .*-1 padding"):
        graph_rows([[1, 2, 0]], [[1, -2]], 4)
    with pytest.raises(ValueError, match="K must be an integer >= 1"):
        graph_rows([[1, 2, 0]], [1], 0)
    with pytest.raises(ValueError, match="K must be an integer >= 1"):
        graph_rows([[1, 2, 0]], [1], 4.0)
    with pytest.raises(ValueError, match="seqs must hold integer token"):
        graph_rows([[1.5, 2, 0]], [1], 4)
    with pytest.raises(ValueError, match=r"y must have one row per sequence \(n = 1\)"):
        graph_rows([[1, 2, 0]], [1, 2], 4)
    with pytest.raises(ValueError, match=r"scc must be the \(K, K\)"):
        graph_rows([[1, 2, 0]], [1], 4, scc=np.zeros((3, 3), int))


def test_scc_table_and_priority_graph_ids():
    with pytest.raises(ValueError, match=r"scc_table|seqs\[0, 0\] = 9 is not a token id in \[0, K=4\)"):
        scc_table([[9, 1, 0]], [1], 4)
    with pytest.raises(ValueError, match=r"seqs\[0, 0\] = -1 is not a token id"):
        scc_table([[-1, 1, 0]], [1], 4)
    with pytest.raises(ValueError, match=r"priority_graph: seqs\[0, 0\] = 9"):
        priority_graph([[9, 1, 0]], [1], 4, 0)


def test_scc_table_full_size_equals_the_local_one():
    """The (K, K) table written out from the tokens that occur: the same partition as the
    rows' local table, -1 on tokens never a query, unused tokens their own component."""
    seqs = [[1, 5, 0], [5, 1, 0], [1, 5, 7]]
    y = [1, 5, 1]
    scc = scc_table(seqs, y, 9)
    rows = graph_rows(seqs, y, 9)
    assert scc.shape == (9, 9) and (scc[[1, 2, 3, 4, 5, 6, 8]] == -1).all()
    assert scc[0, 1] == scc[0, 5] and len(set(scc[0])) == 8 and len(set(scc[7])) == 9
    assert not set(scc[0]) & set(scc[7])  # ids unique across rows
    for k in (0, 7):
        for a in rows.tokens:
            for b in rows.tokens:
                assert (scc[k, a] == scc[k, b]) == (rows.scc_of(k, a) == rows.scc_of(k, b))


def test_w_fin(monkeypatch):
    D = ntp_random(4, 6, 8, 8, graph="cyclic", seed=0)
    import attnsvm.ntp.fin as F

    monkeypatch.setattr(F, "s_fin_basis", lambda *a, **k: pytest.fail("work started"))
    for kw, msg in ((dict(tol=-1), "tol must be a finite number > 0"),
                    (dict(tol=float("nan")), "tol must be a finite number > 0"),
                    (dict(max_iter=-5), "max_iter must be an integer >= 1"),
                    (dict(max_iter=2.0), "max_iter must be an integer >= 1"),
                    (dict(head="bogus"), "head must be one of 'iden' or 'gen'"),
                    (dict(exclude=np.full((4, 6), 0.5)), "exclude must be a boolean array"),
                    (dict(graph_labels=[[1]]), r"w_fin: graph_labels must have one row per "
                                               r"sequence")):
        with pytest.raises(ValueError, match=msg):
            w_fin(D, **kw)
    with pytest.raises(ValueError, match=r"data must be an NTPData .*got a tuple"):
        w_fin((D.E, D.seqs, D.y))


def test_decompose():
    D = ntp_random(4, 6, 8, 8, graph="cyclic", seed=0)
    fin = w_fin(D)
    W = np.eye(8)
    for args, msg in (((np.eye(3), W, fin), r"W_t must have shape \(R, 8, 8\) or \(8, 8\)"),
                      ((np.ones((2, 2, 8, 8)), W, fin), r"W_t must have shape"),
                      ((W, np.eye(7), fin), r"W_svm must have shape \(8, 8\)"),
                      ((W, np.zeros((8, 8)), fin), "W_svm must be non-zero"),
                      ((W * np.nan, W, fin), "W_t contains NaN or inf"),
                      ((W, W, None), "fin must be a FinResult")):
        with pytest.raises(ValueError, match=msg):
            decompose(*args)
    out = decompose(np.stack([W, 2 * W]), W, fin)  # a valid call still reads the measures
    assert np.allclose(out["corr_svm"], 1.0)


def test_ntp_random_seed_and_max_tries():
    for kw, msg in ((dict(seed=-1), "seed must be an integer in"),
                    (dict(seed=1.5), "seed must be an integer in"),
                    (dict(seed=[1, -2]), "seed must be an integer in"),
                    (dict(max_tries=-1), "max_tries must be an integer >= 1"),
                    (dict(max_tries=0), "max_tries must be an integer >= 1")):
        with pytest.raises(ValueError, match=msg):
            ntp_random(4, 6, 8, 8, **kw)
    a, b = ntp_random(4, 6, 8, 8, seed=[11, 3]), ntp_random(4, 6, 8, 8, seed=[11, 3])
    assert np.array_equal(a.E, b.E)  # (a SeedSequence entropy list still works)
    assert isinstance(a, NTPData)
