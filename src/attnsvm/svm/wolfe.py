"""Wolfe's minimum-norm-point algorithm in plain numpy: the reference of the compiled
active-set solver (:mod:`attnsvm.svm.active`, :mod:`attnsvm.svm._active_kernels`).

    mu, rho2, status, n_iter, trace = min_norm_point(G)

For points a_1, ..., a_N with Gram matrix G_kl = <a_k, a_l>,

    rho^2 = min_{mu >= 0, 1^T mu = 1} || sum_k mu_k a_k ||^2 = min mu^T G mu.

P. Wolfe (1976), Finding the nearest point in a polytope, Math. Programming 11, 128-149:

0. S = {the point of smallest norm}, x = 1 (the weights of S; p = sum_S x_q a_q);
1. major cycle: j = argmin_k <a_k, p> (the first, in a tie); stop if
   <a_j, p> >= |p|^2 (1 - tol) (p is the nearest point to tolerance) or |p|^2 <= small
   (the origin is in the hull); else S <- S + {j} with weight 0;
2. minor cycle: v = the affine minimiser of S, v = M^{-1} 1 / 1^T M^{-1} 1 with
   M = G_SS + 1 1^T (positive definite exactly when the points of S are affinely
   independent); if v > 0, x = v and back to 1;
3. else x moves towards v as far as the simplex allows, x + theta (v - x),
   theta = min {x_q / (x_q - v_q) : v_q <= 0}; the points whose weight reached 0 leave S;
   back to 2.

This is that algorithm step by step, with the compiled kernel's choices where the paper
leaves one open (units: G / max_k G_kk; ties: the first index; a point leaves where its
weight is <= 1e-15 of the largest; an entering point whose pivot M_jj - |L^{-1} M_Sj|^2 is
<= 1e-14 M_jj is affinely dependent: stop), so that both visit the same working sets
(tests/test_svm_active.py).  Linear algebra by numpy (a Cholesky factor recomputed per
step, np.linalg.solve), no incremental updates and no refinement: the kernel's speed and
its exact multipliers are its own; the sequence of working sets and the nearest point are
what the two share.
"""

from __future__ import annotations

import numpy as np

__all__ = ["min_norm_point", "OPTIMAL", "SMALL_RHO", "FAILED"]

OPTIMAL, SMALL_RHO, FAILED = 0, 1, 2  # as attnsvm.svm.active


def _affine_minimiser(M: np.ndarray) -> np.ndarray:
    """v = M^{-1} 1 / 1^T M^{-1} 1 (step 2)."""
    u = np.linalg.solve(M, np.ones(len(M)))
    return u / u.sum()


def _enters(G: np.ndarray, S: list, j: int) -> bool:
    """Whether point j is affinely independent of S to rounding: the last pivot of the
    Cholesky factor of M = G_{S+j, S+j} + 1 1^T exceeds 1e-14 M_jj."""
    M = G[np.ix_(S, S)] + 1.0
    L = np.linalg.cholesky(M)
    r = np.linalg.solve(L, G[S, j] + 1.0)
    return G[j, j] + 1.0 - r @ r > 1e-14 * (G[j, j] + 1.0)


def _minor_cycles(G: np.ndarray, S: list, x: np.ndarray, j: int):
    """Steps 2-3 after j entered S; returns (S, x)."""
    while True:
        v = _affine_minimiser(G[np.ix_(S, S)] + 1.0)
        if np.all(v > 0):
            return S, v
        block = (v <= 0) & (x - v > 0)
        theta = min(1.0, float((x[block] / (x[block] - v[block])).min(initial=np.inf)))
        x = (1.0 - theta) * x + theta * v
        drop = [q for q in range(len(S)) if x[q] <= 1e-15 * x.max()]
        keep = [q for q in range(len(S)) if q not in drop]
        if len(keep) == 0:  # at least one point stays (the first, as the kernel's loop)
            keep, drop = [0], drop[1:]
        if not drop:
            return S, x
        S = [S[q] for q in keep]
        x = np.maximum(x[keep], 0.0)
        x = x / x.sum()
        if j not in S:  # the new point left at once: no progress
            return S, x


def min_norm_point(G: np.ndarray, *, tol: float = 1e-12, small: float = 1e-13,
                   max_iter: int | None = None):
    """Wolfe's algorithm on the Gram matrix G (N, N) (see the module).

    Returns (mu (N,) the weights of the nearest point, rho2 = |p|^2, status OPTIMAL |
    SMALL_RHO | FAILED, the number of major cycles, trace): trace lists, per major cycle
    that added a point, (the point, |S| after the minor cycles), as
    :func:`attnsvm.svm._active_kernels.mnp_trace` records it."""
    G = np.asarray(G, dtype=float)
    N = len(G)
    max_iter = 20 * N + 50 if max_iter is None else int(max_iter)
    mu = np.zeros(N)
    gmax = float(np.diagonal(G).max(initial=0.0))
    if N == 0:
        return mu, 0.0, FAILED, 0, []
    if gmax <= 0:
        mu[0] = 1.0
        return mu, 0.0, SMALL_RHO, 0, []
    G = G / gmax
    S = [int(np.argmin(np.diagonal(G)))]
    x = np.ones(1)
    status, it, trace, rho2 = FAILED, 0, [], float(G[S[0], S[0]])
    while it < max_iter:
        it += 1
        Gp = G[:, S] @ x
        rho2 = float(x @ Gp[S])
        out = np.where(np.isin(np.arange(N), S), np.inf, Gp)
        j = int(np.argmin(out)) if len(S) < N else -1
        if rho2 <= small:
            status = SMALL_RHO
            break
        if j < 0 or Gp[j] >= rho2 * (1.0 - tol):
            status = OPTIMAL
            break
        if not _enters(G, S, j):
            break
        S, x = _minor_cycles(G, S + [j], np.append(x, 0.0), j)
        trace.append((j, len(S)))
        if j not in S:
            break
    mu[S] = x
    return mu, rho2 * gmax, status, it, trace
