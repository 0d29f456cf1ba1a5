"""Nuclear-norm ATT-SVM: the structured dual barrier + working set vs cvxpy (SCS)."""

import numpy as np
import pytest

from attnsvm.svm import att_svm
from attnsvm.svm.fast import nuclear_barrier
from attnsvm.svm.problems import _constraints, _solve_cvxpy


def planted(n, T, d, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    Ws = rng.standard_normal((d, d))
    alpha = np.argmax(((X @ Ws) * z[:, None, :]).sum(-1), axis=1)
    return X, z, alpha


def independent_certificate(X, z, alpha, sol):
    """Loop over constraints: feasibility of W and the dual bound sum(lam) / ||sum lam A||_op."""
    n, T, _ = X.shape
    S = np.zeros_like(sol.W_)
    lam_sum = 0.0
    min_margin = np.inf
    for i in range(n):
        for t in range(T):
            if t == alpha[i]:
                continue
            A = np.outer(X[i, alpha[i]] - X[i, t], z[i])
            min_margin = min(min_margin, float((A * sol.W_).sum()))
            S += sol.dual_[i, t] * A
            lam_sum += sol.dual_[i, t]
    lower = lam_sum / np.linalg.norm(S, 2)
    upper = np.linalg.svd(sol.W_, compute_uv=False).sum()
    return min_margin, lower, upper


@pytest.mark.parametrize("n,T,d,seed", [(6, 5, 4, 0), (12, 6, 5, 1), (3, 4, 10, 2), (40, 5, 6, 3)])
def test_nuclear_barrier_matches_cvxpy(n, T, d, seed):
    X, z, alpha = planted(n, T, d, seed)
    sol = att_svm(X, z, alpha, norm="nuc")
    assert sol.feasible_ and sol.solver_ == "barrier-working-set"
    min_margin, lower, upper = independent_certificate(X, z, alpha, sol)
    assert min_margin >= 1 - 1e-12 and abs(min_margin - 1) < 1e-9
    assert lower <= upper * (1 + 1e-12)
    assert (upper - lower) / lower < 1e-6 and sol.gap_ < 1e-6
    cs = _constraints(X, z, alpha, np.ones((n, T), bool))
    Wc, _, status, _, _ = _solve_cvxpy(cs, "nuc", "SCS", eps=1e-9)
    assert Wc is not None
    mc = cs.margins(Wc)[cs.valid].min()
    nuc_c = np.linalg.svd(Wc, compute_uv=False).sum() / min(1.0, mc)  # rescaled feasible
    assert lower <= nuc_c * (1 + 1e-9)  # the dual bound is valid for the cvxpy answer too
    assert abs(sol.norm_ - nuc_c) <= 1e-6 * nuc_c
    # nuclear-norm optimum has rank <= the Frobenius one, and no larger nuclear norm
    fro = att_svm(X, z, alpha)
    assert sol.norm_ <= np.linalg.svd(fro.W_, compute_uv=False).sum() * (1 + 1e-9)


def test_nuclear_dimension_reduction_subspace():
    # n < d: the solution lies in span(Delta) x span(z) (projection keeps constraints and
    # does not increase the nuclear norm)
    X, z, alpha = planted(2, 3, 12, 5)
    sol = att_svm(X, z, alpha, norm="nuc")
    D = (X[np.arange(2), alpha][:, None, :] - X).reshape(-1, 12)
    PU = np.linalg.pinv(D) @ D
    PV = np.linalg.pinv(z) @ z
    assert np.allclose(PU @ sol.W_ @ PV, sol.W_, atol=1e-10)
    assert sol.rank(1e-6) <= 2 and sol.gap_ < 1e-6


def test_nuclear_barrier_raw_central_path():
    # the raw barrier point (before any rescaling) is feasible and within its gap bound
    X, z, alpha = planted(8, 4, 5, 7)
    cs = _constraints(X, z, alpha, np.ones((8, 4), bool))
    ii, tt = np.nonzero(cs.valid)
    W, lam, status, _ = nuclear_barrier(cs.Delta[ii, tt], cs.Z[ii], cs.b[ii, tt], gap_tol=1e-8)
    assert status == "optimal" and (lam > 0).all()
    S = (cs.Delta[ii, tt] * lam[:, None]).T @ cs.Z[ii]
    assert np.linalg.norm(S, 2) <= 1 + 1e-12  # dual feasible
    m = cs.margins(W)[cs.valid]
    assert m.min() >= 1 - 1e-6
    nuc = np.linalg.svd(W, compute_uv=False).sum() / min(1.0, m.min())
    assert (nuc - lam.sum()) / lam.sum() < 1e-6


def test_nuclear_working_set_rounds_match_cvxpy():
    # N = 650 > 600 constraints: the working-set path (Frobenius seed, loose rounds, warm
    # accurate solve) runs; its answer must carry a valid certificate and match SCS.
    # Tolerance 1e-4 relative: recovering W = -2 G_12 / t from the dual barrier loses
    # digits as ||S||_op -> 1 (measured certified gaps 2e-6 .. 3e-5 at this shape)
    n, T, d = 130, 6, 6
    X, z, alpha = planted(n, T, d, 11)
    sol = att_svm(X, z, alpha, norm="nuc")
    assert sol.feasible_ and sol.solver_ == "barrier-working-set"
    min_margin, lower, upper = independent_certificate(X, z, alpha, sol)
    assert abs(min_margin - 1) < 1e-9 and lower <= upper * (1 + 1e-12)
    assert (upper - lower) / lower < 1e-4 and abs(sol.gap_ - (upper - lower) / lower) < 1e-8
    cs = _constraints(X, z, alpha, np.ones((n, T), bool))
    Wc, _, _, _, _ = _solve_cvxpy(cs, "nuc", "SCS", eps=1e-9)
    nuc_c = np.linalg.svd(Wc, compute_uv=False).sum() / min(1.0, cs.margins(Wc)[cs.valid].min())
    assert lower <= nuc_c * (1 + 1e-9) and abs(sol.norm_ - nuc_c) <= 1e-4 * nuc_c


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nuclear_warm_start_is_strictly_dual_feasible(seed):
    # multipliers of a centred working set, plus new constraints entering with the warm-start
    # values, keep ||sum_k lam_k Delta_k z_k^T||_op < 1 (so the barrier can resume)
    from attnsvm.svm.engine import _nuc_warm_start

    X, z, alpha = planted(30, 6, 5, seed)
    cs = _constraints(X, z, alpha, np.ones((30, 6), bool))
    rng = np.random.default_rng(seed)
    old = cs.valid & (rng.random(cs.valid.shape) < 0.4)
    ii, tt = np.nonzero(old)
    _, lam, status, _ = nuclear_barrier(cs.Delta[ii, tt], cs.Z[ii], cs.b[ii, tt], gap_tol=1e-3)
    assert status == "optimal"
    grid = np.zeros(cs.valid.shape)
    grid[ii, tt] = lam
    work = cs.valid.copy()
    lam0 = _nuc_warm_start(cs, grid, work)
    wi, wt = np.nonzero(work)
    S = (cs.Delta[wi, wt] * lam0[:, None]).T @ cs.Z[wi]
    assert (lam0 > 0).all() and np.linalg.norm(S, 2) < 1
    assert np.allclose(lam0[old[work]], lam)  # the old multipliers are kept
