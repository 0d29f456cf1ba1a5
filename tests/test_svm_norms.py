"""ATT-SVMs in every norm (issue 12 §3): independent solves, batched == single, and the
certificate against a loop over constraints with numpy's own norms."""

import numpy as np
import pytest

from attnsvm.svm import att_svm, att_svm_batch, prompt_svm, prompt_svm_batch

NORMS = ["fro", "nuc", "spectral", "l1", "linf", 1.5, 3.0]


def planted(n, T, d, seed, e=None):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, e or d))
    Ws = rng.standard_normal((d, e or d))
    alpha = np.argmax(((X @ Ws) * z[:, None, :]).sum(-1), axis=1)
    return X, z, alpha


def np_norm(W, norm):
    """||W|| by numpy alone (not attnsvm.norms)."""
    if norm == "fro":
        return np.linalg.norm(W)
    if norm == "nuc":
        return np.linalg.svd(W, compute_uv=False).sum()
    if norm == "spectral":
        return np.linalg.svd(W, compute_uv=False).max()
    p = {"l1": 1.0, "linf": np.inf}.get(norm, norm)
    return np.linalg.norm(W.ravel(), p)


def np_dual(norm):
    return {"fro": "fro", "nuc": "spectral", "spectral": "nuc", "l1": "linf", "linf": "l1"}.get(
        norm, None) or 1.0 / (1.0 - 1.0 / norm)


def loop_certificate(X, z, alpha, W, lam, norm):
    """(margin, violation, lower bound, gap, kkt) by explicit loops over the constraints."""
    n, T, _ = X.shape
    S = np.zeros_like(W)
    m_all, comp, lb_num = [], 0.0, 0.0
    for i in range(n):
        for t in range(T):
            if t == alpha[i]:
                continue
            A = np.outer(X[i, alpha[i]] - X[i, t], z[i])
            m = float((A * W).sum())
            m_all.append(m)
            S += lam[i, t] * A
            lb_num += lam[i, t]
            comp = max(comp, abs(lam[i, t] * (m - 1.0)))
    m_all = np.array(m_all)
    nrm = np_norm(W, norm)
    dn = np_norm(S, np_dual(norm))
    lower = lb_num / dn
    gap = (nrm / min(1.0, m_all.min()) - lower) / lower
    if norm == "fro":
        stat = np.linalg.norm(W - S) / nrm
    else:
        stat = max(abs(dn / nrm - 1), abs((S * W).sum() / nrm**2 - 1))
    return m_all.min(), max(0.0, 1 - m_all.min()), lower, gap, max(stat, comp / nrm**2)


@pytest.mark.parametrize("norm", NORMS)
def test_certificate_matches_loop(norm):
    X, z, alpha = planted(5, 4, 3, 1)
    sol = att_svm(X, z, alpha, norm=norm)
    assert sol.feasible_ and sol.status_ == "optimal"
    margin, viol, lower, gap, kkt = loop_certificate(X, z, alpha, sol.W_, sol.dual_, norm)
    assert np.isclose(sol.norm_, np_norm(sol.W_, norm), rtol=1e-12)
    assert np.isclose(sol.margin_, margin, rtol=1e-12) and abs(sol.violation_ - viol) <= 1e-15
    assert np.isclose(sol.extra["lower_bound"], lower, rtol=1e-9)
    assert abs(sol.gap_ - gap) <= 1e-9 * max(1.0, gap) and gap <= 1e-6
    assert abs(sol.kkt_residual_ - kkt) <= 1e-8
    # the batched certificate is the same computation
    bs = att_svm_batch(X[None], z[None], alpha[None], norm=norm)
    b0 = bs[0]
    assert bs.feasible_[0] and b0.status_ == sol.status_
    assert abs(b0.gap_ - loop_certificate(X, z, alpha, b0.W_, b0.dual_, norm)[3]) <= 1e-9


@pytest.mark.parametrize("norm", NORMS)
def test_batched_equals_single(norm):
    rng = np.random.default_rng(5)
    B, n, T, d = 5, 4, 4, 3
    X = rng.standard_normal((B, n, T, d))
    z = rng.standard_normal((B, n, d))
    alpha = rng.integers(0, T, (B, n))
    alpha[:3] = [planted(n, T, d, 10 + b)[2] for b in range(3)]
    X[:3] = [planted(n, T, d, 10 + b)[0] for b in range(3)]
    z[:3] = [planted(n, T, d, 10 + b)[1] for b in range(3)]
    bs = att_svm_batch(X, z, alpha, norm=norm)
    ps = prompt_svm_batch(X, None, alpha, norm=norm)
    assert bs.feasible_[:3].all()
    for b in range(B):
        s = att_svm(X[b], z[b], alpha[b], norm=norm)
        assert s.feasible_ == bs.feasible_[b] and s.status_ == bs.status_[b]
        if s.feasible_:
            assert np.isclose(s.norm_, bs.norm_[b], rtol=1e-7)
            if norm in ("fro", "nuc", "spectral", 1.5, 3.0) or np.allclose(s.W_, bs.W_[b]):
                assert np.allclose(s.W_, bs.W_[b], rtol=1e-6, atol=1e-7 * np.abs(s.W_).max())
        else:
            assert s.conflict_ and set(bs.conflict_[b]) >= set(s.conflict_)
        p = prompt_svm(X[b], None, alpha[b], norm=norm)
        assert p.feasible_ == ps.feasible_[b]
        if p.feasible_:
            assert np.isclose(p.norm_, ps.norm_[b], rtol=1e-7)


def test_linf_matches_an_independent_cvxpy_lp():
    import cvxpy as cp

    for seed in range(3):
        X, z, alpha = planted(6, 4, 3, seed)
        sol = att_svm(X, z, alpha, norm="linf")
        d = X.shape[2]
        # written differently: epigraph variable t, |W_ab| <= t entrywise, scalar constraints
        W, t = cp.Variable((d, d)), cp.Variable()
        cons = [W <= t, -W <= t]
        for i in range(6):
            for k in range(4):
                if k != alpha[i]:
                    cons.append((X[i, alpha[i]] - X[i, k]) @ W @ z[i] >= 1)
        cp.Problem(cp.Minimize(t), cons).solve(solver="HIGHS" if "HIGHS" in cp.installed_solvers()
                                                 else "CLARABEL")
        assert sol.feasible_ and sol.status_ == "optimal"
        assert abs(sol.norm_ - t.value) <= 1e-6 * t.value
        assert np.abs(sol.W_).max() == pytest.approx(sol.norm_, rel=1e-12)


def test_spectral_matches_an_independent_cvxpy_sdp():
    import cvxpy as cp

    for seed in range(2):
        X, z, alpha = planted(5, 3, 3, seed)
        sol = att_svm(X, z, alpha, norm="spectral")
        d = X.shape[2]
        # written differently: [[t I, W], [W^T, t I]] PSD, scalar constraints in a loop
        W, t = cp.Variable((d, d)), cp.Variable()
        cons = [cp.bmat([[t * np.eye(d), W], [W.T, t * np.eye(d)]]) >> 0]
        for i in range(5):
            for k in range(3):
                if k != alpha[i]:
                    cons.append((X[i, alpha[i]] - X[i, k]) @ W @ z[i] >= 1)
        cp.Problem(cp.Minimize(t), cons).solve(solver="CLARABEL")
        ref = np.linalg.svd(W.value, compute_uv=False).max()
        mref = min(1.0, min(float((X[i, alpha[i]] - X[i, k]) @ W.value @ z[i])
                            for i in range(5) for k in range(3) if k != alpha[i]))
        assert sol.feasible_ and sol.gap_ <= 1e-6
        assert abs(sol.norm_ - ref / mref) <= 1e-6 * sol.norm_
        assert sol.extra["lower_bound"] <= ref / mref * (1 + 1e-9)  # valid lower bound


def test_vector_problems_in_spectral_norms_are_l2():
    X, _, alpha = planted(5, 4, 3, 2)
    alpha = np.argmax(X @ np.array([1.0, -0.5, 0.3]), axis=1)
    fro = prompt_svm(X, None, alpha)
    for norm in ("nuc", "spectral"):
        s = prompt_svm(X, None, alpha, norm=norm)
        assert np.allclose(s.W_, fro.W_, rtol=1e-6) and s.gap_ <= 1e-6


def test_norm_geometry_orders_the_optimal_values():
    # each SVM is optimal in its own norm: its value there is <= that of every other SVM
    X, z, alpha = planted(6, 4, 3, 4)
    sols = {nm: att_svm(X, z, alpha, norm=nm) for nm in NORMS}
    for nm, s in sols.items():
        for other in sols.values():
            assert s.norm_ <= np_norm(other.W_, nm) * (1 + 1e-6)


def test_only_the_frobenius_norm_is_euclidean():
    """Norm.euclidean (certify's numpy fast path, no dispatch by name) holds exactly for
    the norms with ||A||^2 = <A, A> and self-duality: the Frobenius norm, no other."""
    from attnsvm.norms import get_norm

    A = np.random.default_rng(0).standard_normal((3, 4))
    for name in ("fro", "nuc", "spectral", "l1", "linf", "l3"):
        N = get_norm(name)
        holds = bool(np.isclose(float(N.value(A)) ** 2, float((A * A).sum()))) and N.dual == N
        assert N.euclidean == holds, name
