"""graph_svm (attnsvm.svm.graph) against an independent formulation, its proof, and its
infeasible verdicts."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from attnsvm.ntp import graph_rows, ntp_random
from attnsvm.svm import graph_svm, graph_svm_batch
from attnsvm.svm.graph import GAP_GRAPH, prove


def reference(E, seqs, y, norm):
    """The Graph-SVM written from its definition, one scalar constraint per (i, j),
    SCCs by transitive closure, solved by cvxpy + Clarabel (independent of attnsvm's path)."""
    E, seqs, y = np.asarray(E), np.asarray(seqs), np.asarray(y)
    K, d = E.shape
    comp = {}
    for k in np.unique(seqs[:, -1]):
        A = np.eye(K, dtype=bool)
        for i in np.nonzero(seqs[:, -1] == k)[0]:
            for j in seqs[i]:
                A[y[i], j] = True
        for m in range(K):  # Warshall
            A |= A[:, m:m + 1] & A[m:m + 1, :]
        mutual = A & A.T
        for v in range(K):
            comp[(int(k), v)] = int(np.argmax(mutual[v]))  # smallest member of v's SCC
    W = cp.Variable((d, d))
    cons = []
    for i in range(len(seqs)):
        k = int(seqs[i, -1])
        for j in seqs[i]:
            if j == y[i]:
                continue
            m = (E[y[i]] - E[j]) @ W @ E[k]
            cons.append(m == 0 if comp[(k, int(y[i]))] == comp[(k, int(j))] else m >= 1)
    obj = cp.norm(W, "fro") if norm == "fro" else cp.normNuc(W)
    prob = cp.Problem(cp.Minimize(obj), cons)
    prob.solve(solver="CLARABEL")
    return prob.value


@pytest.mark.parametrize("norm", ["fro", "nuc"])
@pytest.mark.parametrize("size, graph, seed", [((4, 6, 8, 8), "cyclic", 0), ((6, 4, 6, 8), "cyclic", 1),
                                               ((10, 6, 8, 8), "acyclic", 2), ((5, 4, 6, 3), "any", 3)])
def test_matches_reference_and_is_proven(norm, size, graph, seed):
    D = ntp_random(*size, graph=graph, seed=seed)
    sol = graph_svm(D.E, D.seqs, D.y, norm=norm)
    ref = reference(D.E, D.seqs, D.y, norm)
    if ref is None or not np.isfinite(ref):
        assert sol.status_ == "infeasible"
        return
    assert sol.status_ == "optimal", sol
    assert sol.gap_ <= GAP_GRAPH and sol.violation_ <= 1e-9
    assert abs(sol.norm_ - ref) <= 1e-6 * ref
    # the constraints, recomputed from the definition
    rows = sol.extra["rows"]
    m = np.einsum("rd,de,re->r", D.E[rows.y] - D.E[rows.j], sol.W_, D.E[rows.k])
    assert np.all(m[~rows.eq] >= 1 - 1e-9) and np.all(np.abs(m[rows.eq]) <= 1e-9)


def test_cyclic_has_equalities_and_w_svm_is_orthogonal_to_ties():
    D = ntp_random(10, 6, 8, 8, graph="cyclic", seed=5)
    sol = graph_svm(D.E, D.seqs, D.y)
    rows = sol.extra["rows"]
    assert rows.eq.any() and sol.extra["n_equalities"] == int(rows.eq.sum())
    assert np.abs(sol.margins_[rows.eq]).max() < 1e-12


def test_proof_fails_on_a_perturbed_answer():
    D = ntp_random(6, 4, 6, 8, graph="cyclic", seed=0)
    sol = graph_svm(D.E, D.seqs, D.y)
    rows = sol.extra["rows"]
    lam = sol.dual_[:, 0]
    ok = prove(D.E, rows, sol.W_, lam, "fro")
    assert ok["violation_hi"] <= 1e-9 and ok["gap_hi"] <= GAP_GRAPH
    bad = prove(D.E, rows, sol.W_ * (1 - 1e-6), lam, "fro")  # margins 1 - 1e-6
    assert bad["violation_hi"] > 1e-9
    far = prove(D.E, rows, sol.W_ * 1.01, lam, "fro")  # feasible, 1% too long
    assert far["violation_hi"] <= 1e-9 and 0.009 < far["gap_hi"] < 0.011
    tie = sol.W_ + 1e-6 * np.outer(D.E[rows.y[rows.eq][0]], D.E[rows.k[rows.eq][0]])
    assert prove(D.E, rows, tie, lam, "fro")["violation_hi"] > 1e-9  # an equality broken
    weak = prove(D.E, rows, sol.W_, lam * np.where(rows.eq, 1.0, 0.5), "fro")  # poor multipliers
    assert weak["gap_hi"] > 1e-3


def test_infeasible_names_the_conflicting_samples():
    # d = 1: token k has the scalar embedding k + 1, W a scalar w.  Query 2 (value 3).
    # Sample 0 ties 0 and 1 with sample 1 ((1 - 2) 3 w = 0, so w = 0) while sample 1
    # needs (2 - 3) 3 w >= 1: infeasible.  Sample 2 (all tokens its label) adds nothing.
    E = np.array([[1.0], [2.0], [3.0]])
    seqs = [[0, 1, 2], [1, 0, 2], [0, 0, 0]]
    y = [0, 1, 0]
    sol = graph_svm(E, seqs, y)
    assert sol.status_ == "infeasible" and not sol.feasible_ and sol.W_ is None
    assert set(sol.conflict_) == {0, 1}
    assert graph_svm(E, seqs, y, "nuc").status_ == "infeasible"


def test_all_ties_give_zero():
    E = np.eye(3)
    sol = graph_svm(E, [[0, 1, 2], [1, 0, 2], [2, 0, 2]], [0, 1, 2])  # one SCC {0, 1, 2}
    assert sol.status_ == "optimal" and sol.norm_ == 0.0 and np.all(sol.W_ == 0)


def test_multi_label_and_exclude():
    D = ntp_random(6, 4, 6, 8, graph="acyclic", seed=3)
    Y = np.stack([D.y, np.where(D.seqs[:, 0] != D.y, D.seqs[:, 0], -1)], 1)
    sol = graph_svm(D.E, D.seqs, Y)
    assert sol.status_ == "optimal"
    rows = graph_rows(D.seqs, Y, D.K)
    # two labels of one sample are preferred to each other both ways: a tie
    i = int(np.nonzero(Y[:, 1] >= 0)[0][0])
    k, a, b = D.query[i], Y[i, 0], Y[i, 1]
    assert rows.scc[k, a] == rows.scc[k, b]
    ex = np.zeros(D.seqs.shape, bool)
    ex[:, 0] = True
    sol2 = graph_svm(D.E, D.seqs, D.y, exclude=ex)
    assert sol2.status_ == "optimal" and sol2.extra["n_constraints"] < graph_rows(D.seqs, D.y, D.K).k.size
    with pytest.raises(ValueError, match="exclude must be a bool array"):
        graph_svm(D.E, D.seqs, D.y, exclude=ex[:, :2])


def test_bad_input_and_batch():
    D = ntp_random(4, 6, 8, 8, seed=0)
    with pytest.raises(ValueError, match="norm must be 'fro' or 'nuc'"):
        graph_svm(D.E, D.seqs, D.y, norm="l1")
    bad = D.y.copy()
    bad[0] = next(v for v in range(D.K) if v not in D.seqs[0])
    with pytest.raises(ValueError, match=r"label y\[0\] = \d+ does not occur in its sequence"):
        graph_svm(D.E, D.seqs, bad)
    sols = graph_svm_batch([D, (D.E, D.seqs, D.y)])
    assert len(sols) == 2 and np.allclose(sols[0].W_, sols[1].W_)
    with pytest.raises(ValueError, match=r"problems\[1\]"):
        graph_svm_batch([D, (D.E, D.seqs)])
