"""The compiled active-set minimum-norm-point solver (attnsvm.svm.active) against
cvxpy + Clarabel, the KKT conditions checked term by term, Farkas certificates of
infeasible instances (verified by the engine), batched == one by one, and the IPM
fallback (numba absent, stalled problems)."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from attnsvm.norms import FRO  # noqa: E402
from attnsvm.svm import (  # noqa: E402
    active,
    att_svm,
    att_svm_batch,
    prompt_svm,
    prompt_svm_batch,
    strategy,
)


def constraints(X, z, alpha):
    """Delta (N, d), Zk (N, e) of min ||W||_F s.t. Delta_k^T W z_k >= 1 (one problem)."""
    n, T, d = X.shape
    rows, zs = [], []
    for i in range(n):
        for t in range(T):
            if t != alpha[i]:
                rows.append(X[i, alpha[i]] - X[i, t])
                zs.append(z[i])
    return np.array(rows), np.array(zs)


def clarabel(D, Zk):
    import cvxpy as cp

    d, e = D.shape[1], Zk.shape[1]
    W = cp.Variable((d, e))
    M = np.einsum("kd,ke->kde", D, Zk).reshape(len(D), d * e)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(W)), [M @ cp.vec(W, order="C") >= 1])
    try:
        prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12,
                   tol_ktratio=1e-10, max_iter=400)
    except cp.error.SolverError:  # the peer broke down (seen on degenerate data): no answer
        return None, "solver_error"
    return (W.value, prob.status) if W.value is not None else (None, prob.status)


def kkt(D, Zk, W, lam, tol=1e-9):
    """lam >= 0, margins >= 1, lam_k (m_k - 1) = 0, W = sum_k lam_k Delta_k z_k^T."""
    m = np.einsum("kd,de,ke->k", D, W, Zk)
    assert lam.min() >= 0.0
    assert m.min() >= 1 - tol
    assert np.abs(lam * (m - 1)).max() <= tol * max(lam.max(), 1.0)
    Ws = np.einsum("k,kd,ke->de", lam, D, Zk)
    assert np.linalg.norm(Ws - W) <= 1e-10 * np.linalg.norm(W)
    assert lam.sum() == pytest.approx(np.linalg.norm(W) ** 2, rel=1e-9)  # strong duality


def planted(n, T, d, e, rng, degenerate):
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, e))
    Ws = rng.standard_normal((d, e))
    if degenerate == 1 and T > 2:  # duplicate tokens: identical (repeated) constraints
        X[:, 1] = X[:, 2]
    if degenerate == 2 and n > 1:  # ties: a repeated sequence
        X[1], z[1] = X[0], z[0]
    if degenerate == 3:  # tokens on a low-dimensional subspace
        X = X[..., :1] * rng.standard_normal(d)
    alpha = np.argmax(((X @ Ws) * z[:, None, :]).sum(-1), axis=1)
    return X, z, alpha


def solve_one(D, Zk):
    mu, lam, W, rho2, status, it = active.mnp_active(D[None], Zk[None],
                                                     np.ones((1, len(D)), bool))
    return mu[0], lam[0], W[0], rho2[0], status[0]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), T=st.integers(2, 6), d=st.integers(1, 6), e=st.integers(1, 4),
       degenerate=st.integers(0, 3), seed=st.integers(0, 10**6))
def test_active_matches_clarabel_and_kkt(n, T, d, e, degenerate, seed):
    rng = np.random.default_rng(seed)
    X, z, alpha = planted(n, T, d, e, rng, degenerate)
    D, Zk = constraints(X, z, alpha)
    if np.abs(np.einsum("kd,ke->kde", D, Zk)).max(axis=(1, 2)).min() < 1e-12:
        return  # a zero constraint: infeasible by construction (tested below)
    mu, lam, W, rho2, status = solve_one(D, Zk)
    Wc, cstat = clarabel(D, Zk)
    if status == active.SMALL_RHO:
        assert Wc is None or "infeasible" in cstat
        return
    assert status == active.OPTIMAL
    kkt(D, Zk, W, lam)
    assert np.linalg.norm(W) ** 2 == pytest.approx(1.0 / rho2, rel=1e-9)
    if cstat == "solver_error":
        return  # Clarabel failed on this instance; the KKT conditions above prove W optimal
    assert Wc is not None and cstat == "optimal"
    assert np.linalg.norm(W - Wc) <= 1e-7 * np.linalg.norm(Wc)
    # W is optimal: no feasible point of smaller norm, Clarabel's rescaled included
    mc = np.einsum("kd,de,ke->k", D, Wc, Zk).min()
    assert np.linalg.norm(W) <= np.linalg.norm(Wc) / min(1.0, mc) * (1 + 1e-12)


def test_two_token_closed_form():
    # one constraint: W = Delta z^T / (||Delta||^2 ||z||^2)
    D = np.array([[3.0, 4.0]])
    Zk = np.array([[2.0]])
    mu, lam, W, rho2, status = solve_one(D, Zk)
    assert status == active.OPTIMAL
    assert np.allclose(W, D.T * 2.0 / 100.0, rtol=1e-15)
    assert lam[0] == pytest.approx(1 / 100.0, rel=1e-15)


def conflicting(rng, n=5, T=4, d=3):
    """Sequences 0 and 1 hold the same two tokens and select different ones (same z):
    (a - b)^T W z >= 1 and (b - a)^T W z >= 1 cannot both hold."""
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    X[1, :2] = X[0, :2]
    z[1] = z[0]
    alpha = rng.integers(0, T, n)
    alpha[0], alpha[1] = 0, 1
    return X, z, alpha


@pytest.mark.parametrize("seed", range(4))
def test_infeasible_farkas_verified(seed):
    rng = np.random.default_rng(seed)
    X, z, alpha = conflicting(rng)
    D, Zk = constraints(X, z, alpha)
    mu, lam, W, rho2, status = solve_one(D, Zk)
    assert status == active.SMALL_RHO
    assert mu.min() >= 0 and mu.sum() == pytest.approx(1.0)
    S = np.einsum("k,kd,ke->de", mu, D, Zk)  # the min-norm point: ~ 0
    assert np.linalg.norm(S) <= 1e-6 * np.abs(D).max() * np.abs(Zk).max()
    for sol in (att_svm(X, z, alpha), att_svm_batch(np.stack([X, X]), np.stack([z, z]),
                                                    np.stack([alpha, alpha]))[1]):
        assert sol.status_ == "infeasible" and not sol.feasible_
        assert {0, 1} <= set(sol.conflict_)
    bs = att_svm_batch(np.stack([X, X]), np.stack([z, z]), np.stack([alpha, alpha]))
    assert np.all(bs.solver_ == "batch-mnp-active")
    # the proven bound (inf where sum mu_k A_k cancels to exactly 0: a perfect certificate)
    assert np.all(bs.extra["farkas_bound"] >= 1e9)


def test_batched_equals_one_by_one():
    rng = np.random.default_rng(5)
    B, n, T, d, e = 30, 5, 6, 4, 3
    X = rng.standard_normal((B, n, T, d))
    z = rng.standard_normal((B, n, e))
    Ws = rng.standard_normal((B, d, e))
    alpha = np.argmax(np.einsum("bntd,bde,bne->bnt", X, Ws, z), axis=-1)
    X[:10, 1, :2] = X[:10, 0, :2]  # some infeasible ones (see conflicting)
    z[:10, 1] = z[:10, 0]
    alpha[:10, 0], alpha[:10, 1] = 0, 1
    Ds, Zs = zip(*(constraints(X[b], z[b], alpha[b]) for b in range(B)))
    mu, lam, W, rho2, status, it = active.mnp_active(np.array(Ds), np.array(Zs),
                                                     np.ones((B, len(Ds[0])), bool))
    for b in range(B):  # the same kernel: the same bits
        m1, l1, W1, r1, s1 = solve_one(Ds[b], Zs[b])
        assert s1 == status[b] and r1 == rho2[b]
        assert np.array_equal(W1, W[b], equal_nan=True) and np.array_equal(l1, lam[b])
        assert np.array_equal(m1, mu[b])
    bs = att_svm_batch(X, z, alpha)
    ps = prompt_svm_batch(X, None, alpha)
    assert bs.feasible_.any() and (~bs.feasible_).any()
    for b in range(B):
        s = att_svm(X[b], z[b], alpha[b])
        assert s.status_ == bs.status_[b]
        if s.feasible_:
            assert np.allclose(s.W_, bs.W_[b], rtol=1e-9, atol=1e-12)
            assert s.gap_ <= 1e-12 and bs.gap_[b] <= 1e-12
        p = prompt_svm(X[b], None, alpha[b])
        assert p.status_ == ps.status_[b]
        if p.feasible_:
            assert np.allclose(p.W_, ps.W_[b], rtol=1e-9, atol=1e-12)


def test_ipm_fallback_without_numba(monkeypatch):
    rng = np.random.default_rng(7)
    B, n, T, d = 20, 4, 5, 3
    X = rng.standard_normal((B, n, T, d))
    alpha = rng.integers(0, T, (B, n))
    fast = prompt_svm_batch(X, None, alpha)
    assert set(fast.solver_) <= {"batch-mnp-active"}
    monkeypatch.setattr(active.kernels, "module", None)
    monkeypatch.setattr(active.kernels, "error", ImportError("no numba (test)"))
    assert not active.available()
    slow = prompt_svm_batch(X, None, alpha)
    assert not any("active" in s for s in slow.solver_)
    assert np.array_equal(fast.status_, slow.status_)
    f = fast.feasible_
    assert np.allclose(fast.W_[f], slow.W_[f], rtol=1e-8, atol=1e-12)
    one = prompt_svm(X[0], None, alpha[0])
    assert "active" not in one.solver_
    with pytest.raises(ValueError, match="numba"):
        prompt_svm(X[0], None, alpha[0], solver="active")


def test_stalled_problems_fall_back(monkeypatch):
    rng = np.random.default_rng(8)
    B, n, T, d = 12, 4, 5, 3
    X = rng.standard_normal((B, n, T, d))
    z = rng.standard_normal((B, n, d))
    alpha = rng.integers(0, T, (B, n))
    ref = att_svm_batch(X, z, alpha)
    real = active.mnp_active

    def stalled(*a, **k):  # an iteration cap of 1 major cycle
        out = real(*a, **{**k, "max_iter": 1})
        assert (out[4] == active.FAILED).any()
        return out

    monkeypatch.setattr(active, "mnp_active", stalled)
    # the engine's path (the compiled per-problem batch path, the Frobenius row's
    # fast_batch, hands its stalled problems to it: tests/test_svm_lean.py)
    from dataclasses import replace

    monkeypatch.setitem(strategy.STRATEGIES, FRO,
                        replace(strategy.STRATEGIES[FRO], fast_batch=None))
    got = att_svm_batch(X, z, alpha)
    assert np.array_equal(got.status_, ref.status_)
    assert any("stalled" in s for s in got.solver_)
    f = ref.feasible_
    assert np.allclose(got.W_[f], ref.W_[f], rtol=1e-8, atol=1e-12)


def test_solver_choice_single():
    X, z, alpha = planted(20, 8, 10, 10, np.random.default_rng(3), 0)
    a = att_svm(X, z, alpha, solver="ipm")
    b = att_svm(X, z, alpha, solver="active")
    c = att_svm(X, z, alpha, solver="mnp")
    assert b.solver_ == "mnp-active" and "mnp-ipm" in c.solver_
    assert a.status_ == b.status_ == c.status_ == "optimal"
    for s in (a, c):
        assert np.linalg.norm(s.W_ - b.W_) <= 1e-9 * np.linalg.norm(b.W_)
    assert att_svm(X, z, alpha).solver_ == "mnp-active"  # N = 140 <= 3 d e: the default
    Xl, zl, al = planted(400, 16, 2, 2, np.random.default_rng(4), 0)  # N = 6000 > 3 d e
    assert att_svm(Xl, zl, al).solver_.startswith("ipm")
    assert "active" in strategy.STRATEGIES[FRO].solvers


def _farkas_loop(cs, lam):
    """farkas_verify by explicit loops over one problem (no numpy reductions): lam cleaned
    as np.nan_to_num, S = sum_k lam_k A_k / sum_k lam_k b_k, bound = 1 / ||S||_F."""
    n, T = cs.shape
    lam = np.nan_to_num(np.where(cs.valid, lam, 0.0))
    if any(cs.ineq[i, t] and lam[i, t] < 0 for i in range(n) for t in range(T)):
        return False, 0.0
    lb = sum(lam[i, t] * cs.b[i, t] for i in range(n) for t in range(T))
    if not (lb > 0 and np.isfinite(lb)):
        return False, 0.0
    S = sum(lam[i, t] / lb * np.outer(cs.Delta[i, t], cs.Z[i]) for i in range(n)
            for t in range(T))
    r = float(np.sqrt((S * S).sum()))
    bound = 1.0 / r if r > 0 else np.inf
    return bool(bound >= 1e9), bound


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.booleans(), st.booleans())
def test_farkas_verify_compiled_equals_numpy_and_loops(seed, with_eq, certificate):
    """The compiled Farkas check (farkas_batch: engine and batched path) against the numpy
    one and explicit loops: the same verdicts, bounds to 1e-12, the same multipliers."""
    from attnsvm.svm.constraints import ConstraintSet
    from attnsvm.svm.farkas import _farkas_numpy, farkas_verify

    rng = np.random.default_rng(seed)
    B, n, T, d, e = 7, 3, 4, 3, 2
    Delta = rng.standard_normal((B, n, T, d))
    Z = rng.standard_normal((B, n, e))
    valid = rng.random((B, n, T)) > 0.2
    b = np.where(valid, rng.uniform(0.5, 2.0, (B, n, T)), 0.0)
    eq = (rng.random((B, n, T)) > 0.7) if with_eq else None
    lam = np.abs(rng.standard_normal((B, n, T)))
    if certificate:  # problem 0: constraints A and -A (each b > 0): lam = (1, 1) proves it
        Delta[0] = 0.0
        valid[0] = False
        Delta[0, 0, 0], Delta[0, 1, 0] = rng.standard_normal(d), 0.0
        Delta[0, 1, 0] = -Delta[0, 0, 0]
        Z[0, 1] = Z[0, 0]
        valid[0, 0, 0] = valid[0, 1, 0] = True
        b[0] = np.where(valid[0], 1.0, 0.0)
        lam[0] = np.where(valid[0], 1.0, 0.0)
    lam[1, 0, 0] = -0.5  # a negative multiplier (an inequality unless eq says otherwise)
    valid[1, 0, 0] = True
    lam[2, 1, 1] = np.nan  # NaN -> 0, +inf -> max float (np.nan_to_num)
    lam[3, 0, 1] = np.inf
    cs = ConstraintSet(Delta, Z, valid, b, eq, 0)
    ok, bound, lv = farkas_verify(cs, lam)
    ok2, bound2, lv2 = _farkas_numpy(cs, lam)
    assert np.array_equal(ok, ok2)
    # ||S|| = 1 / bound to rounding (a certificate's S cancels to ~1e-16 in any order)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(1 / bound, 1 / bound2, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(lv, lv2, rtol=1e-15)
        for k in range(B):
            okl, bl = _farkas_loop(cs.take(k), lam[k])
            assert ok[k] == okl
            np.testing.assert_allclose(1 / bound[k], 1 / np.float64(bl), rtol=1e-12, atol=1e-14)
    if certificate:
        assert ok[0] and bound[0] == np.inf
    # a certificate whose S overflows is not one (numpy: NaN S had given bound inf)
    big = ConstraintSet(Delta[:1] * 1e300, Z[:1] * 1e300, valid[:1], b[:1], None, 0)
    assert not farkas_verify(big, np.where(valid[:1], 1e-3, 0.0))[0][0]
    assert not _farkas_numpy(big, np.where(valid[:1], 1e-3, 0.0))[0][0]


# ------------------------------------------------ the kernel against its plain references
def _gram(D, Zk):
    return (D @ D.T) * (Zk @ Zk.T)


@pytest.mark.parametrize("N,d,e,seed", [(50, 4, 4, 8), (30, 4, 3, 1), (40, 2, 2, 2), (25, 6, 1, 3),
                                        (60, 3, 3, 4), (18, 5, 4, 5)])
def test_kernel_visits_the_working_sets_of_plain_wolfe(N, d, e, seed):
    """Step by step: the compiled solver (mnp_trace) and Wolfe's algorithm in plain numpy
    (attnsvm.svm.wolfe) add the same point in every major cycle and keep working sets of
    the same size after the minor cycles; same status, same number of cycles, the same
    nearest point.  Random points (N > d e: points leave S in the minor cycles) on both
    sides of feasibility."""
    from attnsvm.svm import _active_kernels as K
    from attnsvm.svm import wolfe

    rng = np.random.default_rng(seed)
    D = rng.standard_normal((N, d)) + (1.5 if seed % 2 == 0 else 0.0)
    Zk = rng.standard_normal((N, e))
    if seed % 2 == 0:  # every A_k near the direction 1 1^T: feasible (rho > 0)
        Zk = np.abs(Zk) + 0.5
    mu = np.zeros(N)
    lam = np.zeros(N)
    W = np.zeros((d, e))
    trace = np.empty((20 * N + 50, 2), np.int64)
    st, rho2, it = K.mnp_trace(D, Zk, np.ones(N, bool), 1e-12, 1e-13, 20 * N + 50, mu, lam, W,
                               trace)
    mu_ref, rho2_ref, st_ref, it_ref, tr_ref = wolfe.min_norm_point(_gram(D, Zk))
    if st_ref == wolfe.OPTIMAL:
        assert st == active.OPTIMAL
    else:
        assert st == active.SMALL_RHO and st_ref == wolfe.SMALL_RHO
    assert it == it_ref
    got = [tuple(r) for r in trace[:it] if r[0] >= 0]
    assert got == [(int(j), int(k)) for j, k in tr_ref]
    assert len(got) >= 3  # (a run that exercises the cycles)
    if st == active.OPTIMAL:
        np.testing.assert_allclose(mu, mu_ref, rtol=0, atol=1e-10)
        assert rho2 == pytest.approx(rho2_ref, rel=1e-10)


def test_plain_wolfe_trace_tells_different_runs_apart():
    """The step-by-step comparison can fail: the same points listed in another order give
    the same run relabelled, and so a trace that differs label by label from the
    original's (as a kernel that entered other points would)."""
    from attnsvm.svm import wolfe

    rng = np.random.default_rng(7)
    D = rng.standard_normal((10, 3)) + 1.0
    Zk = np.abs(rng.standard_normal((10, 2))) + 0.5
    G = _gram(D, Zk)
    order = np.arange(10)[::-1]  # the same points, listed backwards
    tr = wolfe.min_norm_point(G)[4]
    tr_rev = wolfe.min_norm_point(G[np.ix_(order, order)])[4]
    assert len(tr) >= 2
    assert [(order[j], k) for j, k in tr_rev] == tr  # the same run, relabelled
    assert tr_rev != tr


@pytest.mark.parametrize("seed", range(4))
def test_min_norm_point_is_the_simplex_qp_solution(seed):
    """The kernel's min-norm point against the QP min |sum_k mu_k a_k|^2 over the simplex
    (cvxpy + Clarabel): the same distance rho^2 and the same nearest point p (unique,
    though mu need not be); rho = 0 (the origin in the hull) where the QP finds 0."""
    import cvxpy as cp

    rng = np.random.default_rng(100 + seed)
    N, d, e = 15, 3, 2
    D = rng.standard_normal((N, d)) + (1.0 if seed < 2 else 0.0)
    Zk = rng.standard_normal((N, e))
    if seed < 2:  # every A_k near the direction 1 1^T: feasible (rho > 0)
        Zk = np.abs(Zk) + 0.5
    A = np.einsum("kd,ke->kde", D, Zk).reshape(N, d * e)
    m = cp.Variable(N)
    prob = cp.Problem(cp.Minimize(cp.sum_squares(A.T @ m)), [m >= 0, cp.sum(m) == 1])
    prob.solve(solver="CLARABEL", tol_gap_abs=1e-13, tol_gap_rel=1e-13, tol_feas=1e-13)
    p_ref = A.T @ m.value
    mu, lam, W, rho2, status = solve_one(D, Zk)
    p = A.T @ mu
    if status == active.SMALL_RHO:
        assert prob.value <= 1e-9 * np.abs(A).max() ** 2
        assert np.linalg.norm(p) <= 1e-6 * np.abs(A).max()
        return
    assert status == active.OPTIMAL
    assert rho2 == pytest.approx(prob.value, rel=1e-7)
    assert np.linalg.norm(p - p_ref) <= 1e-6 * np.linalg.norm(p_ref)
    np.testing.assert_allclose(W.reshape(-1), p / rho2, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_qr_refine_is_the_least_norm_solution(seed):
    """The kernel's Householder-QR solve (_qr_refine) against numpy: W the least-norm
    solution of <A_k, W> = 1 on S (np.linalg.lstsq), lamS = gmax G_SS^{-1} 1 (W = sum
    lam_k A_k); False for a rank-deficient S (a repeated point)."""
    from attnsvm.svm import _active_kernels as K

    rng = np.random.default_rng(seed)
    d, e = 4, 3
    N = 10
    D = rng.standard_normal((N, d))
    Zk = rng.standard_normal((N, e))
    ks = int(rng.integers(1, 8))
    Sk = rng.permutation(N)[:ks].astype(np.int64)
    W = np.zeros((d, e))
    lamS = np.zeros(ks)
    gmax = 2.5
    assert K._qr_refine(D, Zk, Sk, ks, W, lamS, gmax, np.zeros(d * (e + 1)))
    A = np.einsum("kd,ke->kde", D[Sk], Zk[Sk]).reshape(ks, d * e)
    w_ref = np.linalg.lstsq(A, np.ones(ks), rcond=None)[0]
    np.testing.assert_allclose(W.reshape(-1), w_ref, rtol=1e-12, atol=1e-13)
    lam_ref = gmax * np.linalg.solve(A @ A.T, np.ones(ks))
    np.testing.assert_allclose(lamS, lam_ref, rtol=1e-9, atol=1e-12 * np.abs(lam_ref).max())
    if ks >= 2:  # S with a repeated point: R is singular, nothing written
        Sk2 = Sk.copy()
        Sk2[1] = Sk2[0]
        W2 = np.full((d, e), 7.0)
        assert not K._qr_refine(D, Zk, Sk2, ks, W2, np.zeros(ks), gmax, np.zeros(d * (e + 1)))
        assert np.all(W2 == 7.0)


def test_small_rho_near_underflow_is_quiet():
    """The origin almost in the hull of two constraints (D_1 = s (1, 0), D_2 = s (-1, 1e-7)):
    rho^2 = (1e-7 s / 2)^2 ~ 9e-310 is subnormal but > 0 at s = 6e-148, so lam = mu / rho^2
    overflows. The problem is SMALL_RHO with W not finite (uncertified downstream), and the
    library call raises no floating-point RuntimeWarning (the caller's filters say error)."""
    s = 6e-148
    D = np.repeat(np.array([[[1.0, 0.0], [-1.0, 1e-7]]]) * s, 2, 0)
    Z, V = np.ones((2, 2, 1)), np.ones((2, 2), bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mu, lam, W, rho2, status, it = active.mnp_active(D, Z, V)
    assert np.all(status == active.SMALL_RHO)
    assert np.all((rho2 > 0) & (rho2 < np.finfo(float).tiny))  # the planted regime
    assert np.all(np.isinf(lam)) and not np.isfinite(W).any()
    assert np.allclose(mu, 0.5, atol=1e-6)  # the min-norm point's weights (1/2, 1/2)
