"""Infeasibility: Farkas certificates, found, polished and named.

    lam = farkas_lp(cs1)                      # an LP vertex (HiGHS dual simplex), or None
    lam = farkas_polish(cs, lam0)             # refined on its support (batched)
    seqs = farkas_conflict(cs)                # an irreducible conflicting set of sequences

A certificate lam (lam >= 0 on inequalities, sum_k lam_k A_k = 0, sum_k lam_k b_k > 0)
proves that no W satisfies the constraints (Farkas' lemma); every candidate found here
is proven by :func:`farkas_verify` before any "infeasible".
"""

from __future__ import annotations

import functools

import numpy as np

from attnsvm._optional import OptionalImport

from .certificate import farkas_prove
from .constraints import ConstraintSet

# the compiled Farkas screen (numba), or None; the proof itself is plain (certificate.py)
_kernels = OptionalImport("._active_kernels", __package__)

__all__ = ["farkas_verify", "FARKAS_BOUND", "farkas_lp", "farkas_polish", "farkas_conflict", "conflict", "conflicts",
           "conflict_tuples"]

# Farkas SCREEN (not a proof): candidates lam >= 0 with sum lam_k b_k = 1 whose residual
# ||sum lam_k A_k||_F exceeds 1 / FARKAS_BOUND (data normalised to max |entry| in
# [1/2, 1)) are not examined by the exact check (certificate.farkas_exact), which alone
# decides "infeasible"
FARKAS_BOUND = 1e9


def farkas_verify(cs: ConstraintSet, lam: np.ndarray):
    """Verify Farkas certificates of infeasibility, vectorised over the batch: a proof.

    ``lam`` (B, n, T) candidate multipliers.  A verified certificate is lam with
    lam_k >= 0 on inequalities (any sign on equalities), sum_k lam_k b_k = 1 and
    sum_k lam_k A_k = 0 EXACTLY on the exact constraint data
    (:func:`attnsvm.svm.certificate.farkas_prove`: the existence of such a lam next to the
    candidate proven by rigorous error bounds where its support spans the space, else in
    rational arithmetic: the candidate as given, or the exact null vector of the A_k on
    its support nearest to it).  Then no W is feasible:
    0 = <sum lam_k A_k, W> = sum lam_k m_k(W) >= sum lam_k b_k = 1.  A residual that is
    merely small proves nothing (docs/theory.md, "Certificates").

    First a floating-point screen (candidates whose residual ||sum lam_k A_k||_F exceeds
    sum lam_k b_k / FARKAS_BOUND are not examined further; with numba one compiled pass,
    :func:`attnsvm.svm._active_kernels.farkas_batch`, else numpy), then the exact check of
    the screened ones.

    Returns (ok (B,) bool: proven, bound (B,): inf where proven, else the screen's weak
    lower bound sum lam b / ||S||_F on the Frobenius norm of any feasible W (normalised
    units; 0 where lam is not usable), lam (B, n, T): the proven exact multipliers (rounded
    to float) where ok, else the candidate normalised to sum lam b = 1).
    """
    K = _kernels()
    if K is not None:
        screen, bound, lam_n = _farkas_compiled(K, cs, lam)
    else:
        screen, bound, lam_n = _farkas_numpy(cs, lam)
    if not cs.batch_shape:  # one unbatched problem
        ok, lam_x = farkas_prove(cs.batched(), np.asarray(lam_n)[None],
                                 which=np.asarray(screen)[None])
        ok, lam_x = ok[0], lam_x[0]
    else:  # (B,) batches (the engine's layout)
        ok, lam_x = farkas_prove(cs, np.asarray(lam_n), which=screen, kernels=K)
    bound = np.where(ok, np.inf, bound)
    lam_out = np.where(ok[..., None, None], lam_x, lam_n)
    return ok, bound, lam_out


def _farkas_numpy(cs: ConstraintSet, lam):
    """:func:`farkas_verify` in numpy (no numba)."""
    lam = np.nan_to_num(np.asarray(lam, dtype=float))
    ineq = cs.ineq
    lam = np.where(cs.valid, lam, 0.0)
    sign_ok = np.where(ineq, lam >= 0, True).all((-2, -1))
    with np.errstate(invalid="ignore", over="ignore"):  # (lambda^T b overflowing: not good)
        lb = (lam * cs.b).sum((-2, -1))
        good = sign_ok & (lb > 0) & np.isfinite(lb)
        lam = lam / np.where(good, lb, 1.0)[..., None, None]
        S = cs.combine(lam)
        r = np.linalg.norm(S.reshape(*S.shape[:-2], -1), axis=-1)
    good &= np.isfinite(r)
    bound = np.where(good, np.where(r > 0, 1.0 / np.where(r > 0, r, 1.0), np.inf), 0.0)
    ok = good & (bound >= FARKAS_BOUND)
    return ok, bound, lam


def _farkas_compiled(K, cs: ConstraintSet, lam):
    """:func:`farkas_verify` by the compiled kernel (any leading batch shape)."""
    n, T = cs.shape
    bs = cs.batch_shape
    B = int(np.prod(bs, dtype=np.int64))
    c = np.ascontiguousarray

    def flat(a, tail, dtype=float):
        return c(np.broadcast_to(np.asarray(a, dtype), (*bs, *tail)).reshape(B, *tail))

    lamf = flat(lam, (n, T))
    lout = np.empty((B, n, T))
    ok = np.empty(B, bool)
    bound = np.empty(B)
    K.farkas_batch(flat(cs.Delta, (n, T, cs.d)), flat(cs.Z, (n, cs.e)),
                   flat(cs.valid, (n, T), bool), flat(cs.ineq, (n, T), bool),
                   flat(cs.b, (n, T)), lamf, lout, ok, bound, FARKAS_BOUND)
    return ok.reshape(bs), bound.reshape(bs), lout.reshape(*bs, n, T)


def farkas_lp(cs: ConstraintSet, max_entries: int = 20_000_000) -> np.ndarray | None:
    """A Farkas vertex: lam with lam >= 0 on inequalities, sum lam_k A_k = 0,
    sum lam_k b_k = 1, by the dual simplex (HiGHS) on one (unbatched) problem.

    By Gleeson & Ryan (1990) the supports of these vertices are the irreducible
    infeasible subsystems of M vec(W) >= b.  Returns lam (n, T), or None if the LP finds
    none (or the problem is too large: N d e > max_entries)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, vstack

    ii, tt = np.nonzero(cs.valid)
    if len(ii) == 0 or len(ii) * cs.d * cs.e > max_entries:
        return None
    M = cs.dense()
    scale = np.linalg.norm(M, axis=1)
    scale[scale == 0] = 1.0
    Ms = M / scale[:, None]  # lambda' = lambda * scale keeps the LP well conditioned
    bs = cs.b[ii, tt] / scale
    free = cs.eqmask[ii, tt]
    A_eq = vstack([csr_matrix(Ms.T), csr_matrix(bs[None, :])]).tocsc()
    b_eq = np.zeros(A_eq.shape[0])
    b_eq[-1] = 1.0
    bounds = [(None, None) if f else (0, None) for f in free]
    c = np.where(free, 0.0, 1.0)
    with np.errstate(all="ignore"):  # per thread: the warnings filters are left alone
        res = linprog(c, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs-ds")
    if res.status != 0 or res.x is None:
        return None
    lam = np.zeros(cs.valid.shape)
    lam[ii, tt] = res.x / scale
    return lam


def farkas_polish(cs: ConstraintSet, lam0: np.ndarray, iters: int = 3) -> np.ndarray:
    """Refine candidate Farkas multipliers on their support, vectorised over the batch.

    On the support K of ``lam0`` (B, n, T), solve C lam = r with C = [M_K^T; b_K^T],
    r = [0; 1] for the correction of least norm (iterative refinement: the residual
    C lam - r is recomputed from sum lam_k A_k each round, so the Gram-based solve
    (C^T C = G_KK + b b^T, pseudo-inverse by eigh) loses no digits in the result).
    An interior-point min-norm point or an LP vertex has residual ~1e-7; this brings it
    to ~1e-16 where the support carries a certificate.  Returns lam (B, n, T)."""
    lam0 = np.where(cs.valid, np.nan_to_num(np.asarray(lam0, float)), 0.0)
    B = lam0.shape[0]
    n, T = cs.shape
    mx = np.abs(lam0).max((1, 2), keepdims=True)
    supp = cs.valid & (np.abs(lam0) > 1e-9 * mx) & (mx > 0)
    flat = supp.reshape(B, -1)
    K = int(flat.sum(1).max()) if B else 0
    if K == 0:
        return lam0
    order = np.argsort(~flat, axis=1, kind="stable")[:, :K]
    km = np.take_along_axis(flat, order, 1)
    kf = km.astype(float)
    ii, tt = order // T, order % T
    bi = np.arange(B)[:, None]
    Dk = cs.Delta[bi, ii, tt] * kf[..., None]
    Zk = cs.Z[bi, ii] * kf[..., None]
    bk = cs.b[bi, ii, tt] * kf
    lam = lam0[bi, ii, tt] * kf
    lb = (lam * bk).sum(1)
    lam = lam / np.where(lb > 0, lb, 1.0)[:, None]
    G = np.matmul(Dk, Dk.transpose(0, 2, 1)) * np.matmul(Zk, Zk.transpose(0, 2, 1))
    H = G + bk[:, :, None] * bk[:, None, :]
    idx = np.arange(K)
    H[:, idx, idx] += 1.0 - kf
    ev, U = np.linalg.eigh(H)
    keep = ev > 1e-13 * np.maximum(ev.max(1, keepdims=True), 1e-300)
    inv = np.where(keep, 1.0 / np.where(keep, ev, 1.0), 0.0)
    for _ in range(iters):
        S = np.swapaxes(Dk * lam[..., None], 1, 2) @ Zk  # (B, d, e)
        g = ((Dk @ S) * Zk).sum(-1) + bk * ((lam * bk).sum(1) - 1.0)[:, None]
        delta = -(U @ (inv * (np.swapaxes(U, 1, 2) @ g[..., None])[..., 0])[..., None])[..., 0]
        lam = (lam + delta) * kf
    out = np.zeros((B, n, T))
    out[bi, ii, tt] = np.where(km, lam, 0.0)
    out = np.where(cs.valid, out, 0.0)
    # entries that came out of the refinement a rounding error below 0 are 0
    tiny = 1e-12 * np.abs(out).max((1, 2), keepdims=True)
    return np.where(cs.ineq & (out < 0) & (out > -tiny), 0.0, out)


def conflict(lam: np.ndarray) -> tuple:
    """Sequences i in the support of a verified certificate lam (n, T)."""
    a = np.abs(lam)
    mx = a.max() if a.size else 0.0
    if mx <= 0:
        return ()
    return tuple(sorted({int(i) for i in np.nonzero((a > 1e-9 * mx).any(-1))[0]}))


def conflicts(lam: np.ndarray, ok: np.ndarray) -> list:
    """[conflict(lam[b]) if ok[b] else ()] for a batch lam (B, n, T), vectorised: the
    sequences i with |lam_it| > 1e-9 max |lam_b| for some t (:func:`conflict_tuples`)."""
    B = len(lam)
    ok = np.asarray(ok, bool)
    if not ok.any():
        return [()] * B
    a = np.abs(lam)
    mx = a.max((1, 2), keepdims=True) if a.size else np.zeros((B, 1, 1))
    return conflict_tuples((a > 1e-9 * mx).any(-1) & (mx[..., 0] > 0), ok)


def conflict_tuples(hit: np.ndarray, ok: np.ndarray) -> list:
    """conflict_ of a batch from hit (B, n) bool: the tuple of the sequences i with
    hit[b, i] for each problem b with ok[b], () elsewhere.  Up to 12 sequences a row's
    bits index a table of the 2^n tuples (one lookup per problem); beyond, one nonzero
    pass over the hits, the B tuples cut from one list."""
    B, n = hit.shape
    hit = hit & np.asarray(ok, bool)[:, None]
    if n <= 12:
        tab = _subsets(n)
        return [tab[c] for c in (hit.astype(np.int64) << np.arange(n)).sum(1).tolist()]
    rows, cols = np.nonzero(hit)
    cl = cols.tolist()
    off = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=B))]).tolist()
    return [tuple(cl[off[b]:off[b + 1]]) for b in range(B)]


@functools.cache
def _subsets(n: int) -> tuple:
    """The 2^n tuples (i for i < n with bit i of c set), indexed by c."""
    return tuple(tuple(i for i in range(n) if c >> i & 1) for c in range(1 << n))


def farkas_conflict(cs: ConstraintSet, max_entries: int = 20_000_000) -> tuple[int, ...]:
    """Sequences of an irreducible infeasible subsystem of one problem (LP vertex of the
    Farkas system, polished and verified); () when no certificate is verified.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import ConstraintSet, farkas_conflict
        >>> cs = ConstraintSet(Delta=np.array([[[1.0]], [[-1.0]]]), Z=np.ones((2, 1)),
        ...                    valid=np.ones((2, 1), bool), b=np.ones((2, 1)))
        >>> farkas_conflict(cs)
        (0, 1)
    """
    cs1 = cs.batched()
    lam = farkas_lp(cs1.take(0), max_entries)
    if lam is None:
        return ()
    lam = farkas_polish(cs1, lam[None])
    ok, _, lam = farkas_verify(cs1, lam)
    return conflict(lam[0]) if ok[0] else ()

