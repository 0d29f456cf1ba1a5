"""Token-priority graphs, their strongly connected components, and the Graph-SVM rows.

Li, Huang, Ildiz, Rawat, Oymak (AISTATS 2024), docs/theory.md "Next-token prediction".

For a query token k, the priority graph G_k has the K token ids as nodes and an edge
y -> j for every sample i with query k_i = s_iT = k, every label y of sample i and every
token j != y of the sample (j = s_it, t = 1..T; positions in ``exclude`` are left out, as
the paper's local-convergence code leaves out tokens of small but non-negligible
probability).  "y -> j": the sample asks token y to be preferred to token j.

Its strongly connected components (SCCs; scipy.sparse.csgraph.connected_components with
connection='strong', Tarjan / Pearce) order the tokens: an edge between two SCCs is a
strict preference (a Graph-SVM inequality, margin >= 1), an edge inside one SCC a tie
(an equality: the soft-composition part W_fin mixes these tokens).

    scc_table(seqs, y, K)             (K, K) component id of token j in G_k (-1 rows: k is
                                      never a query)
    priority_graph(seqs, y, K, k)     G_k as a scipy CSR adjacency matrix (K, K)
    graph_rows(seqs, y, K)            the distinct rows (k, y, j, eq) of the Graph-SVM and
                                      the samples that produce each
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["priority_graph", "scc_table", "graph_rows", "GraphRows", "fin_pairs"]


def _labels2d(y) -> np.ndarray:
    y = np.asarray(y, dtype=np.int64)
    return y[:, None] if y.ndim == 1 else y


def _edges(seqs, y, exclude=None):
    """Edge list over all samples: (sample i, query k_i, label y, token j) for every label
    y of sample i (padding -1 skipped) and position t with j = s_it != y, not excluded."""
    seqs = np.asarray(seqs, dtype=np.int64)
    Y = _labels2d(y)
    n, T = seqs.shape
    ok = (Y[:, :, None] >= 0) & (seqs[:, None, :] != Y[:, :, None])  # (n, L, T)
    if exclude is not None:
        ex = np.asarray(exclude, bool)
        if ex.shape != (n, T):
            raise ValueError(f"exclude must be a bool array of shape (n, T) = {(n, T)}; got {ex.shape}")
        ok &= ~ex[:, None, :]
    ii, ll, tt = np.nonzero(ok)
    return ii, seqs[ii, -1], Y[ii, ll], seqs[ii, tt]


def priority_graph(seqs, y, K: int, k: int, exclude=None) -> csr_matrix:
    """The adjacency matrix (K, K) of G_k: entry (a, b) = 1 iff some sample with query k
    has label a and token b != a (a CSR matrix of 0/1 ints).

    Example::

        >>> from attnsvm.ntp import priority_graph
        >>> seqs, y = [[0, 1, 2], [1, 0, 2]], [0, 1]
        >>> priority_graph(seqs, y, K=3, k=2).toarray()   # G_2: 0 -> 1, 0 -> 2, 1 -> 0, 1 -> 2
        array([[0, 1, 1],
               [1, 0, 1],
               [0, 0, 0]], dtype=int8)
    """
    i, q, a, b = _edges(seqs, y, exclude)
    sel = q == k
    A = csr_matrix((np.ones(int(sel.sum()), np.int8), (a[sel], b[sel])), shape=(K, K))
    A.data[:] = 1  # duplicates summed: back to 0/1
    return A


def scc_table(seqs, y, K: int, exclude=None) -> np.ndarray:
    """(K, K) int: scc[k, j] = the id of the SCC of token j in G_k, -1 in every column for
    a token k that is never a query.  Tokens without an edge are their own component.
    Ids are unique across rows (equal ids within a row = one SCC).  One call of scipy's
    strong connected_components on the disjoint union of the graphs G_k (node k K + j).

    Example::

        >>> from attnsvm.ntp import scc_table
        >>> t = scc_table([[0, 1, 2], [1, 0, 2]], [0, 1], K=3)
        >>> bool(t[2, 0] == t[2, 1]), bool(t[2, 0] == t[2, 2]), bool((t[:2] == -1).all())
        (True, False, True)
    """
    _, q, a, b = _edges(seqs, y, exclude)
    return _scc_of_keys(np.unique((q * K + a) * K + b), K, seqs)


def _scc_of_keys(keys: np.ndarray, K: int, seqs) -> np.ndarray:
    """:func:`scc_table` from the sorted distinct edge keys (k K + y) K + j of the union
    graph (node k K + y -> node k K + j).  The keys are sorted by source node, so the CSR
    adjacency is built directly (indptr by searchsorted; no COO -> CSR conversion), in
    float64, the dtype csgraph works in."""
    src, j = np.divmod(keys, K)
    dst = (src // K) * K + j
    indptr = np.searchsorted(src, np.arange(K * K + 1))
    # (int32 indices where they fit, as scipy would make them: no conversion in the check)
    it = np.int32 if K * K < 2 ** 31 else np.int64
    A = csr_matrix((np.ones(len(keys)), dst.astype(it), indptr.astype(it)), shape=(K * K, K * K))
    _, lab = connected_components(A, directed=True, connection="strong")
    out = lab.reshape(K, K).astype(np.int64)
    isq = np.zeros(K, bool)
    isq[np.asarray(seqs)[:, -1]] = True
    out[~isq] = -1
    return out


@dataclass(frozen=True)
class GraphRows:
    """The distinct Graph-SVM constraints (e_y - e_j)^T W e_k  (= 0 | >= 1).

    k, y, j (N,) token ids; eq (N,) bool (y, j in the same SCC of G_k); scc the (K, K)
    table; ``samples`` (a list of N arrays): the samples that produce each row.

    Example::

        >>> from attnsvm.ntp import graph_rows
        >>> rows = graph_rows([[0, 1, 2], [1, 0, 2], [0, 1, 2]], [0, 1, 0], K=3)
        >>> [s.tolist() for s in rows.samples]        # samples 0 and 2 give the same rows
        [[0, 2], [0, 2], [1], [1]]
    """

    k: np.ndarray
    y: np.ndarray
    j: np.ndarray
    eq: np.ndarray
    scc: np.ndarray
    row_of_edge: np.ndarray
    sample_of_edge: np.ndarray

    def __len__(self) -> int:
        return len(self.k)

    @property
    def samples(self) -> list:
        """For each distinct row, the array of sample indices that produce it."""
        order = np.argsort(self.row_of_edge, kind="stable")
        r = self.row_of_edge[order]
        bounds = np.searchsorted(r, np.arange(len(self.k) + 1))
        s = self.sample_of_edge[order]
        return [np.unique(s[bounds[t]:bounds[t + 1]]) for t in range(len(self.k))]

    def samples_of(self, rows) -> np.ndarray:
        """The samples producing any of ``rows`` (indices or a bool mask)."""
        sel = np.zeros(len(self.k), bool)
        sel[rows] = True
        return np.unique(self.sample_of_edge[sel[self.row_of_edge]])


def graph_rows(seqs, y, K: int, exclude=None, scc: np.ndarray | None = None) -> GraphRows:
    """The Graph-SVM rows of a dataset (duplicates merged; ``scc``: a precomputed
    :func:`scc_table`).

    Example::

        >>> from attnsvm.ntp import graph_rows
        >>> rows = graph_rows([[0, 1, 2], [1, 0, 2]], [0, 1], K=3)
        >>> len(rows), rows.y.tolist(), rows.j.tolist(), rows.eq.tolist()
        (4, [0, 0, 1, 1], [1, 2, 0, 2], [True, False, True, False])
    """
    i, q, a, b = _edges(seqs, y, exclude)
    uk, inv = np.unique((q * K + a) * K + b, return_inverse=True)
    if scc is None:
        scc = _scc_of_keys(uk, K, seqs)
    k_u, rest = np.divmod(uk, K * K)
    a_u, b_u = np.divmod(rest, K)
    eq = scc[k_u, a_u] == scc[k_u, b_u]
    return GraphRows(k_u, a_u, b_u, eq, scc, inv.reshape(-1), i)


def fin_pairs(rows: GraphRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The equality rows (k, y, j): the pairs whose differences span S_fin,
    span{(e_y - e_j) e_k^T : y, j in one SCC of G_k, joined by an edge}."""
    m = rows.eq
    return rows.k[m], rows.y[m], rows.j[m]
