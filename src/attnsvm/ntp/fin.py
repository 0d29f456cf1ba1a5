"""Soft composition: W_fin, the subspace S_fin, and the decomposition W_t ~ R W_svm + W_fin.

Li, Huang, Ildiz, Rawat, Oymak (AISTATS 2024), docs/theory.md "Next-token prediction".
Gradient descent on the NTP loss splits into

    W_t = R_t W_svm / ||W_svm|| + W_fin + o(1),     R_t -> infinity,

hard retrieval (the Graph-SVM direction W_svm, :func:`attnsvm.svm.graph_svm`) and soft
composition W_fin, which lives in

    S_fin = span{ (e_a - e_b) e_k^T : a, b in one SCC of the priority graph G_k }

and minimises the *reduced* loss: each sample keeps only the positions whose token lies
in the SCC of its label (the tokens the hard part cannot separate from the label), the
"log-probability ratio" problem inside the SCCs.  At its minimiser the attention
probabilities inside every SCC satisfy the stationarity (log-ratio) equations of the
reduced loss, and W_fin is orthogonal to W_svm (the Graph-SVM's equalities say
<(e_a - e_b) e_k^T, W_svm> = 0 on every tie edge).

The public code obtains W_fin by training a second model from zero on the reduced data
(``train_utils.train_Wfin``) and measures ||P_Sfin(W_t) - W_fin|| and corr(W_t, W_svm)
along the run (``utils.project_subspace``, ``cal_Sfin``, ``R_solver``).  Here W_fin is the
minimiser itself, by Newton's method in an orthonormal basis of S_fin (exact Hessians by
torch.autograd, dim S_fin <= d^2), to a gradient norm of 1e-10 (relative to max(1,
loss)); near the minimiser, where the loss's decrease falls below its own rounding, Newton's
full step is taken without a line search (the gradient still resolves it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .data import NTPData
from .graph import GraphRows, graph_rows

__all__ = ["FinResult", "w_fin", "s_fin_basis", "decompose", "reduced_mask"]

EPS = float(np.finfo(np.float64).eps)


def reduced_mask(data: NTPData, scc) -> np.ndarray:
    """(n, T) bool: positions whose token is in the SCC of the sample's (first) label in
    G_{k_i}; a sample whose mask holds only label tokens contributes nothing.  ``scc``:
    the (K, K) table of :func:`~attnsvm.ntp.graph.scc_table`, or the
    :class:`~attnsvm.ntp.graph.GraphRows` of the data (read on the tokens that occur)."""
    k = data.query
    y0 = data.labels[:, 0]
    if isinstance(scc, GraphRows):
        return scc.scc_of(k[:, None], data.seqs) == scc.scc_of(k, y0)[:, None]
    return scc[k[:, None], data.seqs] == scc[k, y0][:, None]


def s_fin_basis(data: NTPData, rows=None, tol: float = 1e-10) -> np.ndarray:
    """Orthonormal basis (p, d, d) of S_fin (p = 0 when no tie exists), from the SVD of
    the vectorised tie rows (e_a - e_b) e_k^T (rank at ``tol`` relative).

    Example::

        >>> import numpy as np
        >>> from attnsvm.ntp import NTPData, s_fin_basis
        >>> B = s_fin_basis(NTPData(np.eye(3), [[0, 1, 2], [1, 0, 2]], [0, 1]))
        >>> B.shape, np.round(np.abs(B[0]) * np.sqrt(2), 6)[:, 2].tolist()   # +-(e_0 - e_1) e_2^T / sqrt(2)
        ((1, 3, 3), [1.0, 1.0, 0.0])
    """
    rows = graph_rows(data.seqs, data.y, data.K) if rows is None else rows
    m = rows.eq
    d = data.d
    if not m.any():
        return np.zeros((0, d, d))
    A = np.einsum("ra,rb->rab", data.E[rows.y[m]] - data.E[rows.j[m]], data.E[rows.k[m]])
    A = A.reshape(int(m.sum()), -1)
    _, s, Vt = np.linalg.svd(A, full_matrices=False)
    r = int((s > tol * s[0]).sum()) if s.size and s[0] > 0 else 0
    return Vt[:r].reshape(r, d, d)


@dataclass
class FinResult:
    """W_fin (d, d), the S_fin basis (p, d, d), the reduced mask (n, T), the reduced loss
    at W_fin, the final gradient norm, Newton iterations, and whether it converged.

    Example::

        >>> from attnsvm.ntp import ntp_random, w_fin
        >>> fin = w_fin(ntp_random(4, 6, 8, 8, graph="acyclic", seed=0))   # no tie: W_fin = 0
        >>> fin.W.shape, float(abs(fin.W).max()), fin.basis.shape[0]
        ((8, 8), 0.0, 0)
    """

    W: np.ndarray
    basis: np.ndarray
    mask: np.ndarray
    loss: float
    grad_norm: float
    n_iter: int
    converged: bool


def _reduced_loss(W, X, Z, ymask, rmask, E, yid, head):
    a = torch.einsum("ntd,de,ne->nt", X, W, Z)
    a = a.masked_fill(~rmask, float("-inf"))
    if head == "iden":
        lab = a.masked_fill(~ymask, float("-inf"))
        li = torch.logsumexp(a, -1) - torch.logsumexp(lab, -1)
    else:
        s = torch.softmax(a, -1)
        u = torch.einsum("nt,ntd->nd", s, X)
        o = u @ E.T
        li = torch.logsumexp(o, -1) - o.gather(-1, yid[:, None])[:, 0]
    return li.sum() / X.shape[0]


def w_fin(data: NTPData, head: str = "iden", tol: float = 1e-10, max_iter: int = 200, *,
          graph_labels=None, exclude=None) -> FinResult:
    """W_fin of ``data`` for the model head ("iden" or "gen", :class:`NTPModel`): the
    minimiser over S_fin of the reduced loss (module docstring), by damped Newton, of
    least norm (directions of S_fin that leave every reduced logit difference unchanged
    are left out, as GD from zero leaves them).  Converged: gradient norm <= tol
    (relative to max(1, loss)).

    ``graph_labels`` (n, L) / ``exclude`` (n, T): build the priority graphs (hence the
    SCCs, S_fin and the reduced positions) from these labels and exclusions instead of
    data.y, the loss keeping data.y (the public code's local W_fin: the graph of the
    tokens a run selected, the loss of the training labels).

    Example::

        >>> import numpy as np
        >>> from attnsvm.ntp import NTPData, w_fin
        >>> data = NTPData(np.eye(3), [[0, 1, 2], [1, 0, 2]], [0, 1])   # 0 and 1 tie under query 2
        >>> fin = w_fin(data)
        >>> fin.converged, fin.basis.shape, round(fin.loss, 6)
        (True, (1, 3, 3), 0.693147)
    """
    from .._validation import Interval, Options, validate_params
    from .graph import _check_ids

    if not isinstance(data, NTPData):
        raise ValueError(f"data must be an NTPData (e.g. NTPData(E, seqs, y)); got a "
                         f"{type(data).__name__}")
    validate_params({"head": [Options("iden", "gen")],
                     "tol": [Interval(float, 0.0, None, closed="neither")],
                     "max_iter": [Interval(int, 1, None)]}, locals(), "w_fin")
    gl = data.y if graph_labels is None else graph_labels
    try:
        _, _, exclude, _ = _check_ids(data.seqs, gl, data.K, exclude, "w_fin")
    except ValueError as exc:
        raise ValueError(str(exc).replace("w_fin: y", "w_fin: graph_labels")
                         if graph_labels is not None else str(exc)) from None
    rows = graph_rows(data.seqs, gl, data.K, exclude=exclude)
    Bs = s_fin_basis(data, rows)
    rmask = reduced_mask(data, rows)
    if exclude is not None:
        rmask &= ~exclude
    d = data.d
    Y = data.labels
    ymask = ((data.seqs[:, None, :] == Y[:, :, None]) & (Y[:, :, None] >= 0)).any(1)
    active = (rmask & ~ymask).any(1)  # samples with a tie: the others add a constant 0
    if Bs.shape[0] == 0 or not active.any():
        return FinResult(np.zeros((d, d)), Bs, rmask, 0.0, 0.0, 0, True)
    t = lambda a, **k: torch.as_tensor(a, **k)  # noqa: E731
    X = t(data.X[active], dtype=torch.float64)
    Z = X[:, -1]
    E = t(data.E, dtype=torch.float64)
    ym = t(ymask[active])
    rm = t(rmask[active])
    yid = t(Y[active, 0])
    # keep the directions of S_fin that move some reduced logit difference: along the
    # others the reduced loss is flat, and GD from zero (the public code's W_fin) never
    # moves there, so W_fin is the minimiser of least norm
    Xa, ra = data.X[active], rmask[active]
    A = np.einsum("ntd,pde,ne->ntp", Xa, Bs, Xa[:, -1])
    cnt = ra.sum(1, keepdims=True)
    A = np.where(ra[..., None], A - (A * ra[..., None]).sum(1, keepdims=True) / cnt[..., None], 0.0)
    _, sv, Vt = np.linalg.svd(A.reshape(-1, Bs.shape[0]), full_matrices=False)
    r = int((sv > 1e-10 * sv[0]).sum()) if sv.size and sv[0] > 0 else 0
    if r == 0:
        return FinResult(np.zeros((d, d)), Bs, rmask, 0.0, 0.0, 0, True)
    Bt = t(np.einsum("rp,pde->rde", Vt[:r], Bs), dtype=torch.float64)
    n_all = data.n

    def f(c):
        W = torch.einsum("p,pde->de", c, Bt)
        return _reduced_loss(W, X, Z, ym, rm, E, yid, head) * (X.shape[0] / n_all)

    c = torch.zeros(r, dtype=torch.float64)
    conv = False
    it = 0
    gn = np.inf
    while it < max_iter:
        it += 1
        cc = c.clone().requires_grad_(True)
        val = f(cc)
        g = torch.autograd.grad(val, cc)[0]
        gn = float(g.norm())
        if gn <= tol * max(1.0, float(val.detach())):
            conv = True
            break
        H = torch.autograd.functional.hessian(f, c)
        ev = torch.linalg.eigvalsh(H)
        shift = max(0.0, -float(ev.min())) + 1e-14 * max(1.0, float(ev.abs().max()))
        step = torch.linalg.solve(H + shift * torch.eye(len(c), dtype=H.dtype), g)
        lr, f0 = 1.0, float(val.detach())
        if float(g @ step) <= 64 * EPS * max(1.0, abs(f0)):
            # the predicted decrease is below the loss's own rounding: a line search on
            # loss values cannot see it (it would reject the step that, by the gradient,
            # is Newton's quadratic step), so the full step is taken (it is of the
            # gradient's size, ~1e-9) and the gradient test decides
            c = c - step
            continue
        while lr > 1e-12:
            cn = c - lr * step
            with torch.no_grad():
                fn = float(f(cn))
            if fn <= f0 - 1e-4 * lr * float(g @ step) or fn <= f0:
                break
            lr *= 0.5
        if lr <= 1e-12:  # no decrease left in float64: stationary to rounding
            conv = gn <= 1e3 * tol * max(1.0, float(val.detach()))
            break
        c = cn
    with torch.no_grad():
        W = torch.einsum("p,pde->de", c, Bt).numpy()
        loss = float(f(c))
    return FinResult(W, Bs, rmask, loss, gn, it, conv)


def decompose(W_t: np.ndarray, W_svm: np.ndarray, fin: FinResult) -> dict:
    """The paper's measures along a run, W_t (R, d, d) (or (d, d)):

    corr_svm   <W_t, W_svm> / (||W_t|| ||W_svm||)
    R          the least-squares R_t = <W_t - W_fin, D>, D = W_svm / ||W_svm||
    fin_diff   ||P_Sfin(W_t) - W_fin||  (the public code's "norm of difference")
    resid      ||W_t - R_t D - W_fin|| / ||W_t||  (relative residual of the decomposition)
    corr_dec   corr(W_t, R_T D + W_fin) with R_T fitted at the last step (the code's
               second correlation curve)
    (corr: :func:`attnsvm.metrics.correlation`, NaN where a side is 0: no direction.)
    Each an array of length R.  ValueError naming the argument for shapes that do not
    match fin.W (d, d), non-finite entries, or W_svm = 0.

    Example::

        >>> import numpy as np
        >>> from attnsvm.ntp import ntp_random, w_fin, decompose
        >>> from attnsvm.svm import graph_svm
        >>> data = ntp_random(4, 6, 8, 8, graph="cyclic", seed=0)
        >>> svm, fin = graph_svm(data.E, data.seqs, data.y), w_fin(data)
        >>> W_t = 5.0 * svm.W_ / svm.norm_ + fin.W              # a W of the form R D + W_fin
        >>> m = decompose(W_t, svm.W_, fin)
        >>> np.round(m["R"], 6), bool(m["resid"][0] < 1e-9)
        (array([5.]), True)
    """
    from .._validation import as_array
    from ..metrics import correlation

    if not isinstance(fin, FinResult):
        raise ValueError(f"fin must be a FinResult (from w_fin); got a {type(fin).__name__}")
    d = fin.W.shape
    Wt = as_array(W_t, "W_t", (2, 3), f"(R, {d[0]}, {d[1]}) or {d}")
    Wt = Wt[None] if Wt.ndim == 2 else Wt
    if Wt.shape[1:] != d or Wt.shape[0] < 1:
        raise ValueError(f"W_t must have shape (R, {d[0]}, {d[1]}) or {d} (fin.W's); got "
                         f"{np.shape(W_t)}")
    D = as_array(W_svm, "W_svm", (2,), str(d))
    if D.shape != d:
        raise ValueError(f"W_svm must have shape {d} (fin.W's); got {D.shape}")
    if not np.any(D):
        raise ValueError("W_svm must be non-zero (its direction W_svm / ||W_svm|| is used)")
    D = D / np.linalg.norm(D)
    Wf = fin.W
    Rt = np.einsum("rde,de->r", Wt - Wf, D)
    nt = np.linalg.norm(Wt.reshape(len(Wt), -1), axis=1)
    corr = correlation(Wt, D)  # (R,); NaN where W_t = 0 (no direction)
    if fin.basis.shape[0]:
        coef = np.einsum("rde,pde->rp", Wt, fin.basis)
        P = np.einsum("rp,pde->rde", coef, fin.basis)
    else:
        P = np.zeros_like(Wt)
    fin_diff = np.linalg.norm((P - Wf).reshape(len(Wt), -1), axis=1)
    res = np.linalg.norm((Wt - Rt[:, None, None] * D - Wf).reshape(len(Wt), -1), axis=1)
    ref = Rt[-1] * D + Wf
    corr_dec = correlation(Wt, ref)
    return {"corr_svm": corr, "R": Rt, "fin_diff": fin_diff,
            "resid": res / np.where(nt > 0, nt, 1.0), "corr_dec": corr_dec}
