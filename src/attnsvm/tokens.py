"""Token diagnostics: scores, optimal / selected tokens, SVM-neighbours, local optimality
and the outcome of a training run (docs/theory.md §4, §5, §7).

All functions take plain numpy arrays and broadcast over leading (trial) dimensions.
"""

from __future__ import annotations

import numpy as np

from .metrics import correlation
from .scores import opt_tokens, scores

__all__ = [
    "scores",
    "opt_tokens",
    "attention_probs",
    "selected_tokens",
    "selected_sets",
    "svm_neighbours",
    "is_locally_optimal",
    "min_score_gap",
    "outcome",
    "run_outcome",
    "run_geometry",
    "outcome_line",
]


def attention_probs(X, W, z=None, *, W_key=None, mask=None) -> np.ndarray:
    """Softmax attention s_i = softmax(a_i), (..., n, T).

    W-model: a_it = x_it^T W z_i with W (..., d, e), z (..., n, e).
    Prompt model (z None): W is p (..., d'), keys k_it = W_key^T x_it (W_key default I),
    a_it = k_it^T p.  Masked tokens get probability 0.
    """
    X = np.asarray(X, float)
    W = np.asarray(W, float)
    if z is None:
        K = X if W_key is None else X @ np.asarray(W_key, float)
        a = (K @ W[..., None, :, None])[..., 0]
    else:
        z = np.asarray(z, float)
        a = ((X @ W[..., None, :, :]) * z[..., :, None, :]).sum(-1)
    if mask is not None:
        a = np.where(np.asarray(mask, bool), a, -np.inf)
    a = a - a.max(-1, keepdims=True)
    s = np.exp(a)
    return s / s.sum(-1, keepdims=True)


def selected_tokens(probs) -> np.ndarray:
    """Tokens a trained model selects: argmax_t s_it (ties: lowest index), (..., n)."""
    return np.argmax(np.asarray(probs), axis=-1)


def selected_sets(probs, threshold: float = 1e-3) -> np.ndarray:
    """Selected sets O_i = {t : s_it >= threshold} as a bool array (..., n, T)."""
    return np.asarray(probs, float) >= threshold


def svm_neighbours(solution, tol: float | None = None) -> np.ndarray:
    """SVM-neighbours: constraints active at the solution, m_it <= 1 + tol, (n, T) bool
    (or (B, n, T) for a BatchSolution).  ``tol=None`` keeps the solution's ``support_``."""
    if tol is None:
        return np.asarray(solution.support_)
    m = np.asarray(solution.margins_, float)
    valid = np.asarray(solution.dual_) >= 0  # dual_ is 0 (not negative) on every entry
    cand = np.isfinite(m) & (m > 0) if solution.dual_ is None else valid & np.isfinite(m)
    return cand & (m <= 1 + tol) & (m != 0)


def _take(gamma, alpha):
    return np.take_along_axis(gamma, np.asarray(alpha)[..., None], -1)[..., 0]


def is_locally_optimal(gamma, alpha, neighbours) -> np.ndarray:
    """alpha locally optimal: gamma_{i,alpha_i} > gamma_it for every i and SVM-neighbour t.

    gamma (..., n, T), alpha (..., n), neighbours (..., n, T) bool -> bool (...)."""
    gamma = np.asarray(gamma, float)
    ga = _take(gamma, alpha)[..., None]
    nb = np.asarray(neighbours, bool)
    return np.where(nb, ga > gamma, True).all((-2, -1))


def min_score_gap(gamma, alpha, neighbours) -> np.ndarray:
    """min over i and SVM-neighbours t of gamma_{i,alpha_i} - gamma_it (+inf if none)."""
    gamma = np.asarray(gamma, float)
    ga = _take(gamma, alpha)[..., None]
    nb = np.asarray(neighbours, bool)
    return np.where(nb, ga - gamma, np.inf).min((-2, -1))


def _corr(A, B):
    """Per-trial correlation of (B, ...) arrays (matrices W or prompt vectors p)."""
    return correlation(A.reshape(A.shape[0], -1), B.reshape(B.shape[0], -1), vector=True)


def outcome(W, X, y, v, z=None, *, probs=None, W_key=None, mask=None, saturation=0.99,
            threshold=0.99, norm="fro"):
    """Per-trial verdict of a run (docs/theory.md §7), batched over trials.

    Parameters: final W (B, d, e) with queries z ((n, e) or (B, n, e)), or, with z=None,
    the prompt p (B, d') with keys W_key^T x (W_key default I); data X (n, T, d) or
    (B, n, T, d), y (n,) / (B, n), v (d,) / (B, d); probs (B, n, T) final attention
    (computed by softmax when None).  ``norm``: the geometry the run is judged in (any
    norm of :func:`attnsvm.norms.get_norm`): "fro" for GD / NGD on W, "nuc" for GD on
    (K, Q) (W = K Q^T), "l1" for diagonal (k, q), "linf" for sign descent, ...

    alpha = argmax_t s_it (reached tokens), opt = argmax_t gamma_it.
      "not saturated" if mean_i s_{i,alpha_i} < saturation;
      "GMM" if corr(W, W_mm(opt)) > threshold;
      "LMM" if alpha is locally optimal and corr(W, W_mm(alpha)) > threshold;
      "other" otherwise.
    W_mm are the max-margin solutions in ``norm``, solved and certified by the batched
    engine (att_svm_batch / prompt_svm_batch); SVM-neighbours are their active
    constraints.  Returns a pandas DataFrame, one row per trial: trial, outcome, corr_gmm,
    corr_lmm, alpha_is_opt, locally_optimal, min_score_gap, p_sel_mean, gmm_feasible,
    lmm_feasible, gmm_status, lmm_status.
    """
    import pandas as pd

    from .svm.batch import att_svm_batch, prompt_svm_batch
    from .svm.validate import as_array, as_mask, as_norm

    N = as_norm(norm)
    W = as_array(W, "W", (2, 3), "(B, d, e) or prompt p (B, d)")
    prompt = z is None
    B = W.shape[0]
    X = as_array(X, "X", (3, 4), "(n, T, d) or (B, n, T, d)")
    if X.ndim == 3:
        X = np.broadcast_to(X, (B, *X.shape))
    if X.shape[0] != B:
        raise ValueError(f"X must have shape (n, T, d) or ({B}, n, T, d); got {X.shape}")
    _, n, T, d = X.shape
    y = as_array(y, "y", (1, 2), "(n,) or (B, n)")
    v = as_array(v, "v", (1, 2), "(d,) or (B, d)")
    try:
        y = np.broadcast_to(y, (B, n))
        v = np.broadcast_to(v, (B, d))
    except ValueError:
        raise ValueError(f"y must have shape ({n},) or ({B}, {n}) and v ({d},) or ({B}, {d}); "
                         f"got {y.shape} and {v.shape}") from None
    if mask is not None:
        mask = as_mask(mask, (B, n, T))
    if prompt and W.ndim != 2:
        raise ValueError(f"prompt model: p must have shape (B, d'); got {W.shape}")
    if not prompt:
        if W.ndim != 3 or W.shape[1] != d:
            raise ValueError(f"W must have shape ({B}, {d}, e); got {W.shape}")
        z = as_array(z, "z", (2, 3), "(n, e) or (B, n, e)")
        try:
            z = np.broadcast_to(z, (B, n, W.shape[-1]))
        except ValueError:
            raise ValueError(f"z must have shape ({n}, {W.shape[-1]}) or ({B}, {n}, "
                             f"{W.shape[-1]}); got {z.shape}") from None
    if probs is None:
        probs = attention_probs(X, W, z, W_key=W_key, mask=mask)
    probs = as_array(probs, "probs", (3,), "(B, n, T)")
    if probs.shape != (B, n, T):
        raise ValueError(f"probs must have shape ({B}, {n}, {T}); got {probs.shape}")
    gamma = scores(X, y, v, mask)
    opt = opt_tokens(gamma)
    alpha = selected_tokens(probs)
    p_sel = _take(probs, alpha).mean(-1)
    if prompt:
        gmm = prompt_svm_batch(X, W_key, opt, mask=mask, norm=N)
        lmm = prompt_svm_batch(X, W_key, alpha, mask=mask, norm=N)
    else:
        gmm = att_svm_batch(X, z, opt, mask=mask, norm=N)
        lmm = att_svm_batch(X, z, alpha, mask=mask, norm=N)
    corr_gmm = np.where(gmm.feasible_, _corr(W, np.nan_to_num(gmm.W_)), np.nan)
    corr_lmm = np.where(lmm.feasible_, _corr(W, np.nan_to_num(lmm.W_)), np.nan)
    alpha_is_opt = (_take(gamma, alpha) == _take(gamma, opt)).all(-1)
    nb = lmm.support_
    loc = is_locally_optimal(gamma, alpha, nb) & lmm.feasible_
    gap = np.where(lmm.feasible_, min_score_gap(gamma, alpha, nb), np.nan)
    out = np.where(p_sel < saturation, "not saturated",
                   np.where(corr_gmm > threshold, "GMM",
                            np.where(loc & (corr_lmm > threshold), "LMM", "other")))
    return pd.DataFrame({
        "trial": np.arange(B), "outcome": out, "corr_gmm": corr_gmm, "corr_lmm": corr_lmm,
        "alpha_is_opt": alpha_is_opt, "locally_optimal": loc, "min_score_gap": gap,
        "p_sel_mean": p_sel, "gmm_feasible": gmm.feasible_, "lmm_feasible": lmm.feasible_,
        "gmm_status": gmm.status_.astype(str), "lmm_status": lmm.status_.astype(str),
    })


# --------------------------------------------------------- the outcome of a training run
_RULE_NORM = {"sign": "linf", "signum": "linf", "adam": "linf", "adamw": "linf",
              "spectral": "spectral", "muon": "spectral", "coordinate": "l1"}


def run_geometry(model, optimizer=None) -> str:
    """The norm a run of ``model`` trained by ``optimizer`` is judged in (a name of
    :func:`attnsvm.norms.get_norm`): the optimiser's own geometry for W (steepest descent in
    a norm -> that norm, l_p mirror descent -> l_p, sign / Signum / Adam -> l_inf, Muon /
    spectral descent -> spectral; the predictions of the README's atlas), else the model's:
    W -> "fro", (K, Q) -> "nuc", diagonal (k, q) -> "l1" (over diagonal W), prompt p ->
    "fro" (l_2)."""
    norm = getattr(model, "geometry", "fro")  # the model's own (docs/theory.md §5, §9)
    if getattr(model, "kernel_kind", None) != "W" or optimizer is None:
        return norm
    h = dict(getattr(optimizer, "hyper", {}) or {})
    name = str(getattr(optimizer, "name", ""))
    if isinstance(h.get("norm"), str):
        return h["norm"]
    if name == "mirror" and h.get("p") is not None:
        return f"l{float(h['p']):g}" if float(h["p"]) != 2 else "fro"
    return _RULE_NORM.get(name, norm)


def run_outcome(model, data, W, *, optimizer=None, norm=None):
    """:func:`outcome` of a finished run: ``model`` (an attnsvm AttentionModel), ``data`` (its
    TokenData or the prepared tensors of :func:`attnsvm.models.prepare`), ``W`` the final
    model.W(params) (B, d, e) (prompt: p (B, d)); ``norm`` defaults to
    :func:`run_geometry` (model, optimizer).

    Returns (DataFrame of :func:`outcome`, norm name), or raises ValueError saying why the
    run cannot be judged: seq-to-seq / causal queries (one SVM per query token), diagonal
    (k, q) (an SVM over diagonal W), a trained or nonlinear head, or data without the head
    v."""
    from .models import prepare
    from .norms import get_norm

    if getattr(model, "query", "cross") in ("seq2seq", "causal") and model.has_query_data:
        raise ValueError(f"query {model.query!r}: one SVM per query token (judge with "
                         f"attnsvm.svm.seq2seq_svm)")
    if getattr(model, "ntp", False):
        raise ValueError("next-token prediction: its max-margin problem is the Graph-SVM "
                         "(judge with attnsvm.svm.graph_svm)")
    if getattr(model, "diagonal", False):
        raise ValueError("diagonal (k, q): its SVM is over diagonal W, an l_1 problem in the "
                         "tokens x * z (the kqflow-diag experiment solves it)")
    if getattr(model, "train_head", False) or getattr(model, "head", "linear") != "linear":
        raise ValueError("a trained or nonlinear head (outcome() judges a fixed linear head v)")
    t = prepare(data)
    if t.get("v") is None:
        raise ValueError("the data have no head v (the token scores gamma = y v^T x need it)")
    N = get_norm(norm if norm is not None else run_geometry(model, optimizer)).name
    W = np.asarray(W, dtype=np.float64)
    B = W.shape[0]

    def arr(x):
        a = x.detach().cpu().double().numpy()
        return a[0] if a.shape[0] == 1 else a  # shared data: unbatched arrays

    X, y, v = arr(t["X"]), arr(t["y"]), arr(t["v"])
    mask = None if t.get("mask") is None else arr(t["mask"])
    if model.has_query_data:
        z = arr(model.queries(t)[:, :, 0])  # the one query of each sequence
        probs = attention_probs(X, W, z, mask=mask)
        df = outcome(W, X, y, v, z, probs=probs, mask=mask, norm=N)
    else:
        Wk = getattr(model, "W_fixed", None)
        Wk = np.eye(W.shape[-1]) if Wk is None else np.asarray(Wk, dtype=np.float64)
        probs = attention_probs(X, W, W_key=Wk, mask=mask)
        df = outcome(W, X, y, v, probs=probs, W_key=Wk, mask=mask, norm=N)
    assert len(df) == B
    return df, N


def outcome_line(df, norm: str = "fro") -> str:
    """One line summarising an :func:`outcome` table: counts of GMM / LMM / other / not
    saturated, and the correlation of the saturated runs with the SVM of the tokens they
    reached (``corr_lmm``, median and min), e.g.
    ``outcome (fro SVM): GMM 180, LMM 15, other 3, not saturated 2 of 200; corr with the SVM
    of the reached tokens: median 0.9998, min 0.9531``."""
    B = len(df)
    counts = df["outcome"].value_counts()
    parts = [f"{k} {int(counts[k])}" for k in ("GMM", "LMM", "other", "not saturated")
             if k in counts]
    line = f"outcome ({norm} SVM): {', '.join(parts)} of {B}"
    sat = df[df["outcome"] != "not saturated"]["corr_lmm"].to_numpy(dtype=float)
    sat = sat[np.isfinite(sat)]
    if sat.size:
        line += (f"; corr with the SVM of the reached tokens: median {np.median(sat):.4f}, "
                 f"min {sat.min():.4f}")
    elif len(df) and not (df["outcome"] == "not saturated").all():
        line += "; the SVM of the reached tokens is infeasible in every saturated run"
    return line
