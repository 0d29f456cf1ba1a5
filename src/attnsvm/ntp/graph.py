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
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["priority_graph", "scc_table", "graph_rows", "GraphRows", "fin_pairs"]


def _check_ids(seqs, y, K, exclude=None, where: str = "graph_rows"):
    """Validated (seqs (n, T) int64, Y (n, L) int64 labels, exclude (n, T) bool or None, K):
    K a positive integer; seqs (n, T) integer token ids in [0, K); y (n,) ids in [0, K)
    or (n, L) ids with -1 padding; exclude None or a boolean (or 0/1) array of shape
    (n, T).  A ValueError naming the argument, before any work (an id beyond K is never
    folded into another token's id)."""
    from .._validation import Interval, as_int_array, check_param

    K = check_param("K", K, [Interval(int, 1, None)])
    seqs = as_int_array(seqs, "seqs")
    if seqs.ndim != 2 or seqs.shape[0] < 1 or seqs.shape[1] < 1:
        raise ValueError(f"{where}: seqs must be (n, T) token ids with n, T >= 1; got shape "
                         f"{seqs.shape}")
    n, T = seqs.shape
    bad = (seqs < 0) | (seqs >= K)
    if bad.any():
        i, t = np.argwhere(bad)[0]
        raise ValueError(f"{where}: seqs[{i}, {t}] = {seqs[i, t]} is not a token id in [0, K={K})")
    y = as_int_array(y, "y")
    if y.ndim not in (1, 2):
        raise ValueError(f"{where}: y must be (n,) ids or (n, L) label sets; got shape {y.shape}")
    if y.shape[0] != n:
        raise ValueError(f"{where}: y must have one row per sequence (n = {n}); got shape {y.shape}")
    Y = y[:, None] if y.ndim == 1 else y
    ok = (Y >= 0) & (Y < K) if y.ndim == 1 else ((Y >= -1) & (Y < K))
    if not ok.all():
        i, j = np.argwhere(~ok)[0]
        raise ValueError(f"{where}: y[{i}{'' if y.ndim == 1 else f', {j}'}] = {Y[i, j]} is not a "
                         f"token id in [0, K={K})" + ("" if y.ndim == 1 else " (or -1 padding)"))
    ex = None if exclude is None else _as_exclude(exclude, n, T)
    return seqs, Y, ex, K


def _as_exclude(exclude, n: int, T: int) -> np.ndarray:
    """exclude as an (n, T) bool array: bool or 0/1 numbers (0.5, NaN, strings refused,
    never cast)."""
    from .._validation import as_numpy

    want = f"a boolean array of shape (n, T) = {(n, T)} (True = position left out)"
    try:
        m = np.asarray(as_numpy(exclude, "exclude"))
    except Exception:  # noqa: BLE001 - ragged lists and the like
        raise ValueError(f"exclude must be {want}") from None
    if m.dtype != np.bool_:
        if m.dtype == object or m.dtype.kind not in "iuf":
            raise ValueError(f"exclude must be {want}; got dtype {m.dtype}")
        if not np.all((m == 0) | (m == 1)):
            bad = np.unique(m[~((m == 0) | (m == 1))])[:5].tolist()
            raise ValueError(f"exclude must be {want}; got values {bad} (not 0 / 1)")
    if m.shape != (n, T):
        raise ValueError(f"exclude must be {want}; got shape {m.shape}")
    return m.astype(bool)


def _edges(seqs, y, exclude=None):
    """Edge list over all samples: (sample i, query k_i, label y, token j) for every label
    y of sample i (padding -1 skipped) and position t with j = s_it != y, not excluded
    (seqs (n, T), y (n, L), exclude (n, T) bool or None: validated by :func:`_check_ids`)."""
    ok = (y[:, :, None] >= 0) & (seqs[:, None, :] != y[:, :, None])  # (n, L, T)
    if exclude is not None:
        ok &= ~exclude[:, None, :]
    ii, ll, tt = np.nonzero(ok)
    return ii, seqs[ii, -1], y[ii, ll], seqs[ii, tt]


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
    seqs, y, exclude, K = _check_ids(seqs, y, K, exclude, "priority_graph")
    i, q, a, b = _edges(seqs, y, exclude)
    sel = q == k
    A = csr_matrix((np.ones(int(sel.sum()), np.int8), (a[sel], b[sel])), shape=(K, K))
    A.data[:] = 1  # duplicates summed: back to 0/1
    return A


def scc_table(seqs, y, K: int, exclude=None) -> np.ndarray:
    """(K, K) int: scc[k, j] = the id of the SCC of token j in G_k, -1 in every column for
    a token k that is never a query.  Tokens without an edge are their own component.
    Ids are unique across rows (equal ids within a row = one SCC).  Computed on the
    tokens that occur (:func:`graph_rows`), then written out at full size (K^2 entries:
    refused up front, naming the memory, where that cannot fit).

    Example::

        >>> from attnsvm.ntp import scc_table
        >>> t = scc_table([[0, 1, 2], [1, 0, 2]], [0, 1], K=3)
        >>> bool(t[2, 0] == t[2, 1]), bool(t[2, 0] == t[2, 2]), bool((t[:2] == -1).all())
        (True, False, True)
    """
    return graph_rows(seqs, y, K, exclude).scc


def _scc_of_keys(keys: np.ndarray, Ku: int, queries: np.ndarray) -> np.ndarray:
    """The SCC table (Ku, Ku) of the tokens that occur (local ids 0..Ku-1) from the sorted
    distinct edge keys (k Ku + y) Ku + j of the union graph (node k Ku + y -> node
    k Ku + j), one call of scipy's strong connected_components on the disjoint union of the
    graphs G_k.  The keys are sorted by source node, so the CSR adjacency is built
    directly (indptr by searchsorted; no COO -> CSR conversion), in float64, the dtype
    csgraph works in.  Rows of tokens that are never a query (``queries``: local ids) -1."""
    src, j = np.divmod(keys, Ku)
    dst = (src // Ku) * Ku + j
    indptr = np.searchsorted(src, np.arange(Ku * Ku + 1))
    # (int32 indices where they fit, as scipy would make them: no conversion in the check)
    it = np.int32 if Ku * Ku < 2 ** 31 else np.int64
    A = csr_matrix((np.ones(len(keys)), dst.astype(it), indptr.astype(it)),
                   shape=(Ku * Ku, Ku * Ku))
    _, lab = connected_components(A, directed=True, connection="strong")
    out = lab.reshape(Ku, Ku).astype(np.int64)
    isq = np.zeros(Ku, bool)
    isq[queries] = True
    out[~isq] = -1
    return out


@dataclass(frozen=True)
class GraphRows:
    """The distinct Graph-SVM constraints (e_y - e_j)^T W e_k  (= 0 | >= 1).

    k, y, j (N,) token ids; eq (N,) bool (y, j in the same SCC of G_k); ``samples`` (a
    list of N arrays): the samples that produce each row.  The SCCs are kept on the
    tokens that occur: ``tokens`` (K',) their sorted ids, ``scc_local`` (K', K') the table
    over them (:meth:`scc_of` reads it by token id); ``scc`` is the full (K, K) table of
    :func:`scc_table`, written out on first use.

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
    row_of_edge: np.ndarray
    sample_of_edge: np.ndarray
    tokens: np.ndarray
    scc_local: np.ndarray
    K: int

    def __len__(self) -> int:
        return len(self.k)

    def local(self, ids) -> np.ndarray:
        """Positions in ``tokens`` of token ids that occur (int array of ids' shape)."""
        return np.searchsorted(self.tokens, np.asarray(ids, dtype=np.int64))

    def scc_of(self, k, j) -> np.ndarray:
        """scc[k, j] for token ids k, j that occur (broadcast), without the (K, K) table."""
        return self.scc_local[self.local(k), self.local(j)]

    @cached_property
    def scc(self) -> np.ndarray:
        """The (K, K) table of :func:`scc_table` (tokens that do not occur: their own
        component in the rows of queries, -1 elsewhere)."""
        from .._validation import check_memory

        K, Ku, t = self.K, len(self.tokens), self.tokens
        check_memory(8.0 * K * K, f"the (K, K) SCC table at K = {K}",
                     "read it on the tokens that occur (GraphRows.scc_local, scc_of)")
        out = np.full((K, K), -1, dtype=np.int64)
        q = np.nonzero(self.scc_local[:, 0] >= 0)[0] if Ku else np.zeros(0, int)
        base = int(self.scc_local.max(initial=-1)) + 1  # past every id of the table
        out[t[q]] = base + np.arange(len(q))[:, None] * K + np.arange(K)  # own components
        out[t[q][:, None], t[None, :]] = self.scc_local[q]
        return out

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
    :func:`scc_table` (K, K)).  Works on the K' tokens that occur in seqs and y: time and
    memory grow with K'^2, not K^2.  Arguments are validated first (ValueError naming
    the argument: ids outside [0, K), a non-boolean or mis-shaped ``exclude``).

    Example::

        >>> from attnsvm.ntp import graph_rows
        >>> rows = graph_rows([[0, 1, 2], [1, 0, 2]], [0, 1], K=3)
        >>> len(rows), rows.y.tolist(), rows.j.tolist(), rows.eq.tolist()
        (4, [0, 0, 1, 1], [1, 2, 0, 2], [True, False, True, False])
    """
    seqs, Y, exclude, K = _check_ids(seqs, y, K, exclude)
    return _graph_rows(seqs, Y, exclude, K, scc)


def _graph_rows(seqs, Y, exclude, K: int, scc=None) -> GraphRows:
    """:func:`graph_rows` on validated arguments (seqs (n, T) int64 ids in [0, K), Y (n, L)
    int64 labels with -1 padding, exclude (n, T) bool or None)."""
    tokens = np.unique(np.concatenate([seqs.ravel(), Y[Y >= 0]]))
    Ku = len(tokens)
    ls = np.searchsorted(tokens, seqs)
    lY = np.where(Y >= 0, np.searchsorted(tokens, np.maximum(Y, 0)), -1)
    i, q, a, b = _edges(ls, lY, exclude)
    uk, inv = np.unique((q * Ku + a) * Ku + b, return_inverse=True)
    k_u, rest = np.divmod(uk, Ku * Ku)
    a_u, b_u = np.divmod(rest, Ku)
    if scc is None:
        scc_l = _scc_of_keys(uk, Ku, ls[:, -1])
    else:
        scc = np.asarray(scc)
        if scc.shape != (K, K) or not np.issubdtype(scc.dtype, np.integer):
            raise ValueError(f"scc must be the (K, K) = {(K, K)} integer table of scc_table; "
                             f"got {scc.dtype} of shape {scc.shape}")
        scc_l = scc[np.ix_(tokens, tokens)]
    eq = scc_l[k_u, a_u] == scc_l[k_u, b_u]
    return GraphRows(tokens[k_u], tokens[a_u], tokens[b_u], eq, inv.reshape(-1), i,
                     tokens, scc_l, K)


def fin_pairs(rows: GraphRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The equality rows (k, y, j): the pairs whose differences span S_fin,
    span{(e_y - e_j) e_k^T : y, j in one SCC of G_k, joined by an edge}."""
    m = rows.eq
    return rows.k[m], rows.y[m], rows.j[m]
