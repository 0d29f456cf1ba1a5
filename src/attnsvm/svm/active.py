"""Exact active-set minimum-norm-point solver for Frobenius max-margin problems (numba).

For B problems with N constraints A_k = Delta_k z_k^T each (Delta (B, N, d), z (B, N, e)),

    rho^2 = min_{mu >= 0, 1^T mu = 1} || sum_k mu_k A_k ||_F^2 = min mu^T G mu,
    G_kl = (Delta_k . Delta_l)(z_k . z_l)                        (N x N, per problem),

is solved by Wolfe's (1976) minimum-norm-point algorithm: a working set S of affinely
independent points, the affine minimiser v of S from the Cholesky factor of
M = G_SS + 1 1^T (M u = 1, v = u / 1^T u; M is positive definite exactly when the points
of S are affinely independent, even where G_SS is singular, i.e. rho -> 0), updated by
one bordered row when a point enters and by Givens rotations when one leaves; a major
cycle adds argmin_j (G mu)_j while (G mu)_j < rho^2 (1 - tol), a minor cycle moves to
the affine minimiser or, where it leaves the simplex, to the boundary, dropping points.
It terminates in finitely many steps with an exact solution (no interior-point
tolerance), which for rho > 0 gives the hard-margin SVM

    W = sum_k mu_k A_k / rho^2,   lam = mu / rho^2,   ||W||_F = 1 / rho,

min ||W||_F s.t. <A_k, W> >= 1; the multipliers on S then solve G_SS lam_S = 1 and are
refined twice with residuals 1 - <A_k, W> computed from W itself (not from G).  rho ~ 0
(the origin in the convex hull) leaves mu as a Farkas candidate, sum mu_k A_k ~ 0,
which the engine verifies (:func:`attnsvm.svm.farkas.farkas_verify`) before any
"infeasible".  The kernel's own verdict only chooses between answers: the engine
certifies every W / lam it returns.

Each problem runs in one compiled loop with its (N x N) Gram matrix in cache, formed
lazily: the diagonal, then row j when point j first enters S (the algorithm reads nothing
else; the same bits as the full G), O(N (d + e)) per row against O(N^2 (d + e)) for all of
G, plus O(N |S|) per major cycle. Batches run in slices (PER_THREAD per thread) on
torch.get_num_threads() threads (the kernel releases the GIL;
:func:`attnsvm._parallel.thread_pool`).  Without numba
:func:`available` is False and the engine uses the interior-point path
(:func:`attnsvm.svm.fast.batched_mnp`), as the fused training engine does.
"""

from __future__ import annotations

import numpy as np

from attnsvm._optional import OptionalImport
from attnsvm._parallel import thread_pool

__all__ = ["available", "kernels", "mnp_active", "OPTIMAL", "SMALL_RHO", "FAILED"]

OPTIMAL, SMALL_RHO, FAILED = 0, 1, 2
GRAM_BLAS_N = 300  # single problems with N >= this get G = (D D^T) o (Z Z^T) from BLAS
PARALLEL_B = 64  # batches from this size run in threads (problems are independent: the
# results do not depend on the number of threads)
PER_THREAD = 4  # slices per thread: a thread that is slowed down (a busy core) or gets the
# harder problems leaves its later slices to the others

#: the numba kernels (:mod:`attnsvm.svm._active_kernels`) or None: ``kernels()``
kernels = OptionalImport("._active_kernels", __package__)


def available() -> bool:
    """Whether numba is importable (the active-set solver can run)."""
    return kernels() is not None


def mnp_active(Delta: np.ndarray, Z: np.ndarray, valid: np.ndarray, *, tol: float = 1e-12,
               small: float = 1e-13, max_iter: int | None = None):
    """Minimum-norm points of B problems by Wolfe's active-set method (see the module).

    Delta (B, N, d) constraint differences, Z (B, N, e) their queries, valid (B, N) bool
    (invalid constraints take no part). ``tol``: relative optimality, stop when
    min_j (G mu)_j >= rho^2 (1 - tol) (every margin of W >= 1 - tol); ``small``: rho^2
    below small * max_k G_kk counts as 0; ``max_iter``: major cycles (default 20 N + 50).

    Returns (mu (B, N), lam (B, N), W (B, d, e), rho2 (B,), status (B,) int8, n_iter (B,)):
    status OPTIMAL (W, lam verified by the kernel: lam >= 0, every margin >= 1 - 1e-10,
    margins on the support 1 to 1e-9), SMALL_RHO (origin ~ in the hull: mu is a Farkas
    candidate; W, lam = mu-based as for any rho > 0, NaN W where rho = 0) or FAILED
    (iteration cap or rounding stall: use another solver; mu is the last iterate).
    """
    K = kernels()
    if K is None:
        raise RuntimeError(f"numba is not importable ({kernels.error}); install attnsvm[fast]")
    D = np.ascontiguousarray(Delta, dtype=np.float64)
    Zc = np.ascontiguousarray(Z, dtype=np.float64)
    V = np.ascontiguousarray(valid, dtype=np.bool_)
    B, N, d = D.shape
    e = Zc.shape[2]
    mi = int(max_iter) if max_iter is not None else 20 * N + 50
    mu = np.zeros((B, N))
    lam = np.zeros((B, N))
    W = np.zeros((B, d, e))
    status = np.zeros(B, np.int8)
    rho2 = np.zeros(B)
    iters = np.zeros(B, np.int64)
    if B == 1 and N >= GRAM_BLAS_N:  # one large problem: G by BLAS, not by the kernel's loops
        Dv, Zv = D[0][V[0]], Zc[0][V[0]]
        G = np.ascontiguousarray((Dv @ Dv.T) * (Zv @ Zv.T))
        st, r2, it = K.mnp_one(D[0], Zc[0], V[0], float(tol), float(small), mi, mu[0], lam[0],
                               W[0], G)
        status[0], rho2[0], iters[0] = st, r2, it
    else:
        args = (D, Zc, V, float(tol), float(small), mi, mu, lam, W, status, rho2, iters)
        if B >= PARALLEL_B:  # slices in torch.get_num_threads() threads (the shared pool)
            thread_pool(K.mnp_batch, B, *args, per_thread=PER_THREAD)
        else:
            K.mnp_batch(*args, 0, B)
    sm = status == SMALL_RHO
    if sm.any():  # as the IPM path: W = sum mu_k A_k / rho^2 wherever rho > 0
        r = np.where(rho2[sm] > 0, rho2[sm], np.nan)
        # rho^2 near underflow (subnormal): lam inf and W not finite, quietly (uncertified)
        with np.errstate(over="ignore", invalid="ignore"):
            lam[sm] = np.where(rho2[sm, None] > 0, mu[sm] / r[:, None], 0.0)
            W[sm] = np.swapaxes(D[sm], 1, 2) @ (lam[sm][..., None] * Zc[sm])  # sum_k lam_k D_k z_k^T
        W[sm] = np.where((rho2[sm] > 0)[:, None, None], W[sm], np.nan)
    return mu, lam, W, rho2, status, iters
