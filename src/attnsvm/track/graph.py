"""The Graph-SVM of an attention head's own tokens at the last query (next-token prediction).

Li, Huang, Ildiz, Rawat, Oymak (AISTATS 2024), docs/theory.md "Next-token prediction": a
causal self-attention layer trained by next-token prediction converges in direction to the
Graph-SVM of its tokens, the query being the last token. For one head of any tracked
model this module builds that problem from the head's own selections and compares it with
the head's key-query matrix.

Per sequence n of the probe batch (at most ``max_queries``, seeded sample) the query is
its last valid position k_n, the keys the positions t it may see (causal: t <= k_n, padding
excluded; the query is one of them). In the head's space (:func:`attnsvm.track.heads.head_subspace`:
W = scale W_k^T W_q, u = scale W_k^T b_q, U an orthonormal basis (d, p) of span(W_q^T) +
span(W_k^T)) the tokens are

    e_t = [U^T x_t ; 1]   (p + 1; bias="augment")   or   U^T x_t   (p; bias="ignore")
    W_head = [[U^T W U, U^T u], [0, 0]]             or   U^T W U

so that e_t^T W_head e_k = x_t^T W x_k + u^T x_t: the head's logits up to a per-query
constant (checked against the head's recomputed logits on every pair; past 1e-8 relative
:func:`attnsvm.track.heads.analyse_call` raises its ``RecomputeError``). Equal token vectors (to 1e-10 of the largest
entry) are one vocabulary token: E (K, p') the distinct vectors, seqs (N, T') the ids of
each sequence's keys with its query last (shorter sequences padded at the front with the
query's id, those positions excluded).

Selections (the labels of the Graph-SVM): the attention mass of each token id at the query,
m_nv = sum_{t: seq_nt = v} s_{n k_n t}; ``mass=None`` takes the id of largest mass (the
tracker's argmax selection), a float takes every id with m_nv > mass and leaves out the
positions of ids with mass in (0.9 mass, mass] (the ntp-local notebook's C_thres / E_thres
rule). Then ``graph_svm(E, seqs, Y, norm, exclude=...)`` (certified) and
corr(W_head, W_svm) = <W_head, W_svm> / (||W_head||_F ||W_svm||_F).

Heads with rotary embeddings or a position bias (their logits are not a bilinear form of
fixed token vectors) and cross-attention calls (the query is not one of the keys) get a
status instead of a solve.
"""

from __future__ import annotations

import numpy as np

from attnsvm.metrics import correlation

__all__ = ["graph_data", "graph_head", "unsupported", "GRAPH_EMPTY"]

GRAPH_EMPTY = dict(graph_status="", graph_logit_err=np.nan, graph_corr=np.nan, graph_norm=np.nan,
                   graph_gap=np.nan, graph_tokens=0, graph_rows=0, graph_ties=0, graph_labels=0)


def _basis(sub: dict) -> np.ndarray:
    """Orthonormal basis (d, p) of span(U_Q) + span(U_K) (SVD, numerical rank)."""
    A = np.concatenate([sub["U_Q"], sub["U_K"]], axis=1)
    U, s, _ = np.linalg.svd(A, full_matrices=False)
    return U[:, s > 1e-10 * max(s.max(), 1e-300)]


def graph_data(x, s_h, allowed, qv, sub, bias, mass, max_queries, rng):
    """The Graph-SVM data of one head (module docstring): x (N, T, d) the tokens entering the
    attention, s_h (N, T, T) the head's attention [query, key], allowed (N, T, T), qv (N, T)
    valid queries, sub :func:`attnsvm.track.heads.head_subspace`'s dict. Returns (dict, "")
    with E (K', p'), seqs (N', T'), y (N', L), exclude (N', T'), W (p', p'), basis (d, p),
    sequences, query, keys, logits (N', T') and mass (N', K'), or (None, reason).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import AttentionCall, head_subspace, recompute_attention
    >>> from attnsvm.track.graph import graph_data
    >>> call = AttentionCall.random(causal=True)
    >>> s, allowed, qv = (t.numpy() for t in recompute_attention(call))
    >>> W0 = call.W_q[0].numpy()
    >>> prob, why = graph_data(call.hidden.numpy(), s[:, 0], allowed, qv, head_subspace(W0, W0),
    ...                        "augment", None, 8, np.random.default_rng(0))
    >>> prob["seqs"].shape, why
    ((2, 5), '')

    ```
    """
    U = _basis(sub)
    W_head = U.T @ sub["W"] @ U
    e = x @ U  # (N, T, p)
    if bias == "augment":
        p = W_head.shape[0]
        W_head = np.block([[W_head, (U.T @ sub["u"])[:, None]], [np.zeros((1, p + 1))]])
        e = np.concatenate([e, np.ones(e.shape[:-1] + (1,))], -1)
    seq_ok = np.nonzero(qv.any(1))[0]
    if not len(seq_ok):
        return None, "no valid query"
    if len(seq_ok) > max_queries:
        seq_ok = np.sort(rng.choice(seq_ok, max_queries, replace=False))
    qpos = np.array([np.nonzero(qv[n])[0][-1] for n in seq_ok], dtype=int)
    keys = [np.nonzero(allowed[n, k])[0] for n, k in zip(seq_ok, qpos)]
    if any(k not in kk for k, kk in zip(qpos, keys)):
        return None, "the query may not attend to itself (not a next-token query)"
    # keys in order, the query moved last (causal: it already is)
    keys = [np.concatenate([kk[kk != k], [k]]) for k, kk in zip(qpos, keys)]
    vecs = np.concatenate([e[n, kk] for n, kk in zip(seq_ok, keys)])  # (sum T_n, p')
    scale = max(float(np.abs(vecs).max()), 1e-300)
    _, first, ids = np.unique(np.round(vecs / scale, 10), axis=0, return_index=True, return_inverse=True)
    E = vecs[first]
    Tm = max(len(kk) for kk in keys)
    N = len(seq_ok)
    seqs = np.zeros((N, Tm), dtype=np.int64)
    pad = np.zeros((N, Tm), bool)
    sel_mass = np.zeros((N, len(E)))
    o = 0
    for i, (n, k, kk) in enumerate(zip(seq_ok, qpos, keys)):
        idx = ids.reshape(-1)[o:o + len(kk)]
        o += len(kk)
        seqs[i, Tm - len(kk):] = idx
        seqs[i, :Tm - len(kk)] = idx[-1]
        pad[i, :Tm - len(kk)] = True
        np.add.at(sel_mass[i], idx, s_h[n, k, kk])
    if mass is None:
        Y = sel_mass.argmax(1)[:, None]
        exclude = pad
    else:
        sel = sel_mass > mass
        sel[np.arange(N), sel_mass.argmax(1)] = True  # every sample selects its top id
        Y = np.full((N, int(sel.sum(1).max())), -1)
        for i in range(N):
            v = np.nonzero(sel[i])[0]
            Y[i, :len(v)] = v
        band = (sel_mass > 0.9 * mass) & ~sel
        exclude = pad | band[np.arange(N)[:, None], seqs]
    # self-check: the tokens and W_head reproduce the head's logits up to a per-query constant
    lg = np.einsum("ntp,pq,nq->nt", E[seqs], W_head, E[seqs[:, -1]])
    return dict(E=E, seqs=seqs, y=Y, exclude=exclude, W=W_head, basis=U, sequences=seq_ok,
                query=qpos, keys=keys, logits=lg, mass=sel_mass), ""


def unsupported(call) -> str:
    """Why a call has no Graph-SVM ("" when it has one).

    ```pycon
    >>> from attnsvm.track import AttentionCall
    >>> from attnsvm.track.graph import unsupported
    >>> call = AttentionCall.random(causal=True)
    >>> unsupported(call), unsupported(AttentionCall.random(keys=call.hidden))[:15]
    ('', 'cross-attention')

    ```
    """
    if call.keys is not None:
        return "cross-attention (the query is not one of the keys)"
    if call.rotary is not None:
        return "rotary embeddings (the logits are not a bilinear form of fixed token vectors)"
    if call.pos_bias is not None:
        return "a position bias (the logits are not a bilinear form of the tokens)"
    return ""


def graph_head(x, s_h, allowed, qv, sub, cfg, rng, call=None, ref_logits=None) -> dict:
    """The graph_* columns of one head (docs/tracking.md): for each norm of
    ``cfg.graph_norms``, graph_corr[_<norm>] = corr(W_head, W_svm) (Frobenius first: no
    suffix), graph_status[_<norm>], graph_norm[_<norm>] (||W_svm||), graph_gap[_<norm>]
    (proven relative gap), and graph_tokens (K'), graph_rows (distinct constraints),
    graph_ties (equality rows: ties inside an SCC), graph_labels (mean labels per sample).
    ``ref_logits`` (N, T, T) the head's logits [query, key]: the self-check.

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track import AttentionCall, TrackConfig, head_subspace, recompute_attention
    >>> from attnsvm.track.graph import graph_head
    >>> call = AttentionCall.random(causal=True)
    >>> s, allowed, qv = (t.numpy() for t in recompute_attention(call))
    >>> W0 = call.W_q[0].numpy()
    >>> row = graph_head(call.hidden.numpy(), s[:, 0], allowed, qv, head_subspace(W0, W0),
    ...                  TrackConfig(graph=True), np.random.default_rng(0))
    >>> row["graph_status"], bool(-1 <= row["graph_corr"] <= 1)
    ('optimal', True)

    ```
    """
    from attnsvm.svm import graph_svm

    norms = tuple(cfg.graph_norms)

    def empty(why):  # every column of every norm, with the reason as the status
        out = dict(GRAPH_EMPTY)
        for i, nm in enumerate(norms):
            sfx = "" if i == 0 else f"_{nm}"
            out.update({f"graph_corr{sfx}": np.nan, f"graph_norm{sfx}": np.nan,
                        f"graph_gap{sfx}": np.nan, f"graph_status{sfx}": f"no Graph-SVM: {why}"})
        return out

    why = unsupported(call) if call is not None else ""
    if why:
        return empty(why)
    prob, why = graph_data(x, s_h, allowed, qv, sub, cfg.bias, cfg.graph_mass, cfg.max_queries, rng)
    if prob is None:
        return empty(why)
    err = 0.0
    if ref_logits is not None:  # the tokens reproduce the head's logits (up to a constant per query)
        for i, (n, k, kk) in enumerate(zip(prob["sequences"], prob["query"], prob["keys"])):
            a = prob["logits"][i, -len(kk):]
            b = ref_logits[n, k, kk]
            err = max(err, float(np.abs((a - a[-1]) - (b - b[-1])).max() / max(1.0, np.abs(b).max())))
    out = dict(GRAPH_EMPTY, graph_logit_err=err, graph_tokens=len(prob["E"]),
               graph_labels=float((prob["y"] >= 0).sum(1).mean()))
    for i, nm in enumerate(norms):
        sfx = "" if i == 0 else f"_{nm}"
        sol = graph_svm(prob["E"], prob["seqs"], prob["y"], nm, exclude=prob["exclude"])
        out[f"graph_status{sfx}"] = str(sol.status_)
        out[f"graph_norm{sfx}"] = float(sol.norm_) if sol.feasible_ else np.nan
        out[f"graph_gap{sfx}"] = float(sol.gap_) if sol.feasible_ else np.nan
        ok = sol.feasible_ and np.any(sol.W_)
        out[f"graph_corr{sfx}"] = float(correlation(prob["W"], sol.W_)) if ok else np.nan
        if i == 0:
            out["graph_rows"] = int(sol.extra.get("n_constraints", 0))
            out["graph_ties"] = int(sol.extra.get("n_equalities", 0))
    return out
