"""Tests of attnsvm.svm against independent computations (closed forms, KKT, cvxpy)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnsvm.svm import (
    att_svm,
    att_svm_batch,
    head_svm,
    multitoken_svm,
    prompt_svm,
    prompt_svm_batch,
    relaxed_svm,
    seq2seq_svm,
)
from attnsvm.svm.problems import _constraints, _solve_cvxpy


def rand(n, T, d, seed=0, e=None):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, T, d)), rng.standard_normal((n, e or d)),
            rng.integers(0, T, n))


def kkt_check(X, z, alpha, sol, tol=1e-8):
    """Independent KKT check by explicit loops over constraints."""
    n, T, d = X.shape
    W = sol.W_
    Wsum = np.zeros_like(W)
    for i in range(n):
        for t in range(T):
            if t == alpha[i]:
                assert sol.dual_[i, t] == 0
                continue
            A = np.outer(X[i, alpha[i]] - X[i, t], z[i])
            m = float((A * W).sum())
            lam = sol.dual_[i, t]
            assert m >= 1 - tol  # primal feasibility
            assert lam >= 0  # dual feasibility
            assert lam * (m - 1) <= tol * max(1.0, np.linalg.norm(W) ** 2)  # compl. slackness
            if lam > 1e-9:
                assert sol.support_[i, t]
            Wsum += lam * A
    assert np.allclose(W, Wsum, atol=tol * max(1.0, np.abs(W).max()))  # stationarity
    assert abs(sol.margin_ - 1) <= tol


def test_closed_form_two_tokens():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((1, 2, 4))
    z = rng.standard_normal((1, 4))
    dx = X[0, 0] - X[0, 1]
    expect = np.outer(dx, z[0]) / (dx @ dx * (z[0] @ z[0]))
    for solver in (None, "ipm", "clarabel"):
        sol = att_svm(X, z, [0], solver=solver)
        assert np.allclose(sol.W_, expect, rtol=1e-9, atol=1e-12), solver
        assert sol.feasible_ and abs(sol.margin_ - 1) < 1e-12
    p = prompt_svm(X, None, [1])
    assert np.allclose(p.W_, -dx / (dx @ dx))


@pytest.mark.parametrize("seed", [0, 1])
def test_kkt_random(seed):
    X, z, alpha = rand(6, 5, 8, seed)
    sol = att_svm(X, z, alpha)
    kkt_check(X, z, alpha, sol)
    assert sol.gap_ < 1e-9 and sol.kkt_residual_ < 1e-9
    # rank(W_mm) <= min(n, d)
    X, z, alpha = rand(2, 6, 7, seed)
    sol = att_svm(X, z, alpha)
    assert sol.rank() <= 2


def test_primal_ipm_path_kkt():
    X, z, alpha = rand(30, 8, 16, 5)
    sol = att_svm(X, z, alpha, solver="ipm")
    assert sol.feasible_ and sol.solver_.startswith("ipm")
    kkt_check(X, z, alpha, sol)


def test_figure1_prompt_directions():
    # Tarzanagh et al. Fig. 1: prompt model, W = diag(1, 1, 0); keys k = W^T x drop the 3rd coord.
    W = np.diag([1.0, 1.0, 0.0])
    for s in (0.0, 0.5, 2.0):
        X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, s]]])
        # select token 0: only k0 - k2 = (-0.1, 1, 0) active -> p = (-0.1, 1, 0) / 1.01
        # ((k0 - k1) . p = 1.11 / 1.01 > 1 inactive)
        p0 = prompt_svm(X, W, [0])
        assert np.allclose(p0.W_, np.array([-0.1, 1.0, 0.0]) / 1.01, atol=1e-10)
        assert p0.support_[0].tolist() == [False, False, True]
        # select token 1: k1 - k2 = (1, 0, 0) active -> p = (1, 0, 0); (k1 - k0) . p = 1.1 > 1
        p1 = prompt_svm(X, W, [1])
        assert np.allclose(p1.W_, [1.0, 0.0, 0.0], atol=1e-10)


def test_prompt_equals_w_svm_with_common_query():
    # With z_i = z for all i: Delta^T W z >= 1 only involves q = W z; min ||W||_F with
    # W z = q is q z^T / ||z||^2 (norm ||q|| / ||z||), so W_mm = p_mm z^T / ||z||^2, W_mm z = p_mm.
    X, _, alpha = rand(5, 4, 6, 7)
    zc = np.random.default_rng(1).standard_normal(6)
    Wm = att_svm(X, np.tile(zc, (5, 1)), alpha)
    pm = prompt_svm(X, None, alpha)
    assert np.allclose(Wm.W_ @ zc, pm.W_, atol=1e-9)
    assert np.allclose(Wm.W_, np.outer(pm.W_, zc) / (zc @ zc), atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 6), T=st.integers(2, 6), d=st.integers(2, 6), seed=st.integers(0, 10**6))
def test_fast_matches_cvxpy(n, T, d, seed):
    X, z, alpha = rand(n, T, d, seed)
    fast = att_svm(X, z, alpha)
    cs = _constraints(X, z, alpha, np.ones((n, T), bool))
    Wc, _, status, _, _ = _solve_cvxpy(cs, "fro", "CLARABEL")  # raw Clarabel, no polish
    if not fast.feasible_:
        assert Wc is None and "infeasible" in status
        return
    assert Wc is not None
    if np.linalg.norm(fast.W_ - Wc) > 1e-6 * np.linalg.norm(Wc):
        # degenerate instances: raw Clarabel can be off by ~1e-5; then the fast answer must
        # be certified exact and no worse than Clarabel's point rescaled to feasibility
        mc = cs.margins(Wc)[cs.valid].min()
        assert fast.gap_ < 1e-10 and fast.violation_ == 0.0
        assert fast.norm_ <= np.linalg.norm(Wc) / min(1.0, mc) * (1 + 1e-12)
        assert np.linalg.norm(fast.W_ - Wc) <= 1e-4 * np.linalg.norm(Wc)
    ipm = att_svm(X, z, alpha, solver="ipm")
    assert np.linalg.norm(ipm.W_ - fast.W_) <= 1e-8 * np.linalg.norm(fast.W_)


def test_batch_matches_single():
    rng = np.random.default_rng(11)
    B, n, T, d = 12, 4, 5, 3
    X = rng.standard_normal((B, n, T, d))
    z = rng.standard_normal((B, n, d))
    alpha = rng.integers(0, T, (B, n))
    bs = att_svm_batch(X, z, alpha)
    ps = prompt_svm_batch(X, None, alpha)
    assert len(bs) == B and bs.W_.shape == (B, d, d) and ps.W_.shape == (B, d)
    for b in range(B):
        s = att_svm(X[b], z[b], alpha[b])
        assert s.feasible_ == bs.feasible_[b]
        if s.feasible_:
            assert np.allclose(s.W_, bs.W_[b], rtol=1e-7, atol=1e-9)
            assert np.array_equal(s.support_, bs.support_[b])
        p = prompt_svm(X[b], None, alpha[b])
        assert p.feasible_ == ps.feasible_[b]
        if p.feasible_:
            assert np.allclose(p.W_, ps.W_[b], rtol=1e-7, atol=1e-9)
        else:
            # batched conflict_: the support of a verified Farkas certificate (not
            # necessarily minimal, nor the same certificate as the single irreducible
            # one); its sequences alone must be infeasible, and so must the single's
            for conf in (ps[b].conflict_, p.conflict_):
                assert len(conf) and not prompt_svm(X[b][list(conf)], None,
                                                    alpha[b][list(conf)]).feasible_
    assert bs.feasible_.any() and (~ps.feasible_).any()


def test_infeasible_duplicate_tokens():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(4), rng.standard_normal(4)
    X = np.stack([np.stack([a, b, rng.standard_normal(4)]), np.stack([a, b, rng.standard_normal(4)]),
                  rng.standard_normal((3, 4))])
    z = np.tile(rng.standard_normal(4), (3, 1))
    alpha = [0, 1, 2]  # seq 0 selects a over b, seq 1 selects b over a with the same query
    for norm, solver in (("fro", None), ("fro", "ipm"), ("fro", "clarabel"), ("nuc", None)):
        sol = att_svm(X, z, alpha, norm=norm, solver=solver)
        assert not sol.feasible_ and sol.W_ is None
        assert sol.conflict_ == (0, 1)
        assert "INFEASIBLE" in repr(sol) and "conflicting" in sol.summary()
    bs = att_svm_batch(X[None], z[None], np.array([alpha]), irreducible=True)
    assert not bs.feasible_[0] and bs.conflict_[0] == (0, 1)


def test_infeasible_d_too_small():
    # d = 1: seq 0 needs W <= -1, seq 1 needs W >= 1; seq 2 is harmless
    X = np.array([[[1.0], [2.0]], [[2.0], [1.0]], [[3.0], [1.0]]])
    z = np.ones((3, 1))
    sol = att_svm(X, z, [0, 0, 0])
    assert not sol.feasible_ and sol.conflict_ == (0, 1)
    assert not prompt_svm(X, None, [0, 0, 0]).feasible_


def test_other_norms_unit_margin_and_rank():
    X, z, alpha = rand(4, 3, 4, 2)
    fro = att_svm(X, z, alpha)
    for norm in (1.5, 3.0, "l1", "nuc"):
        sol = att_svm(X, z, alpha, norm=norm)
        assert sol.feasible_
        assert sol.violation_ <= 1e-12 and abs(sol.margin_ - 1) < 1e-6, norm
        assert sol.gap_ < 1e-4, (norm, sol.gap_)
        if norm == "nuc":
            assert sol.rank(1e-5) <= fro.rank()
            assert sol.norm_ <= np.linalg.svd(fro.W_, compute_uv=False).sum() + 1e-6
    r1 = att_svm(X, z, alpha, norm="nuc", rank=1)
    assert r1.feasible_ and r1.rank(1e-6) <= 1 and r1.violation_ <= 1e-12


def test_seq2seq_causal():
    rng = np.random.default_rng(4)
    n, T, d = 2, 4, 6
    X = rng.standard_normal((n, T, d))
    alpha = np.tile(np.arange(T), (n, 1))  # each query attends to itself (causal-valid)
    for causal in (False, True):
        sol = seq2seq_svm(X, alpha, causal=causal)
        assert sol.feasible_ and sol.dual_.shape == (n, T, T)
        W = sol.W_
        Wsum = np.zeros_like(W)
        for i in range(n):
            for k in range(T):
                for t in range(T):
                    if t == alpha[i, k] or (causal and t > k):
                        assert sol.dual_[i, k, t] == 0
                        continue
                    A = np.outer(X[i, alpha[i, k]] - X[i, t], X[i, k])
                    assert (A * W).sum() >= 1 - 1e-9
                    Wsum += sol.dual_[i, k, t] * A
        assert np.allclose(W, Wsum, atol=1e-8)
    with pytest.raises(ValueError, match="future"):
        seq2seq_svm(X, np.full((n, T), T - 1), causal=True)


def test_head_and_relaxed():
    R = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, -1.0]])
    y = np.array([1.0, -1.0, 1.0])
    # constraints v1 >= 1, -v2 >= 1, 3 v1 - v2 >= 1 (inactive at (1, -1)) -> v = (1, -1)
    h = head_svm(R, y)
    assert np.allclose(h.W_, [1, -1]) and h.extra["support_indices"].tolist() == [0, 1]
    h3 = head_svm(R, y, p=3)
    assert abs(h3.margin_ - 1) < 1e-6 and np.allclose(h3.W_, [1, -1], atol=1e-5)
    X, _, alpha = rand(5, 4, 5, 9)
    S = np.array([True, True, False, False, True])
    r = relaxed_svm(X, alpha, support=S)
    m = r.margins_
    valid = np.ones_like(m, bool)
    valid[np.arange(5), alpha] = False
    assert (m[S][valid[S]] >= 1 - 1e-9).all() and (m[~S][valid[~S]] >= -1e-9).all()
    assert r.norm_ <= prompt_svm(X, None, alpha).norm_ + 1e-9


def test_multitoken():
    rng = np.random.default_rng(2)
    n, T, d = 4, 5, 8
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, d))
    s = np.full((n, T), 1e-6)
    s[:, 0], s[:, 1] = 0.6, 0.4 - 3e-6
    sol = multitoken_svm(X, z, s)
    assert sol.feasible_ and sol.sets_[:, :2].all() and not sol.sets_[:, 2:].any()
    for i in range(n):
        lhs = (X[i, 1] - X[i, 0]) @ sol.W_fin_ @ z[i]
        assert np.isclose(lhs, np.log(s[i, 1] / s[i, 0]))
        assert abs((X[i, 1] - X[i, 0]) @ sol.W_dir_ @ z[i]) < 1e-6
        assert ((X[i, :2, None] - X[i, None, 2:]) @ sol.W_dir_ @ z[i] >= 1 - 1e-6).all()
    # both problems come back certified by the engine (equality rows included)
    assert sol.dir_.status_ == "optimal" and sol.dir_.gap_ <= 1e-9 and sol.dir_.violation_ <= 1e-12
    assert sol.fin_.feasible_ and sol.fin_.violation_ <= 1e-12 and sol.fin_.gap_ <= 1e-9
    # W_fin is the least-norm solution of its equalities: the lstsq of the stacked rows
    rows = np.stack([np.outer(X[i, 0] - X[i, 1], z[i]).ravel() for i in range(n)])
    w_ls = np.linalg.lstsq(rows, np.log(s[:, 0] / s[:, 1]), rcond=None)[0]
    assert np.allclose(sol.W_fin_.ravel(), w_ls, rtol=1e-9, atol=1e-12)
    Wt = sol.W_fin_ + 7.0 * sol.W_dir_
    sol2 = multitoken_svm(X, z, s, W_trained=Wt)
    assert np.isclose(sol2.R_, 7.0, rtol=1e-5) and sol2.predictivity_ > 1 - 1e-9


def test_bad_inputs():
    X, z, alpha = rand(3, 4, 5)
    with pytest.raises(ValueError, match="X"):
        att_svm(X[0], z, alpha)
    Xn = X.copy()
    Xn[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        att_svm(Xn, z, alpha)
    with pytest.raises(ValueError, match="alpha out of range"):
        att_svm(X, z, [0, 1, 4])
    mask = np.ones((3, 4), bool)
    mask[0, 0] = False
    with pytest.raises(ValueError, match="masked"):
        att_svm(X, z, [0, 1, 1], mask=mask)
    with pytest.raises(ValueError, match="z"):
        att_svm(X, z[:2], alpha)
    with pytest.raises(ValueError, match="alpha is required"):
        att_svm(X, z)
    with pytest.raises(ValueError, match="norm"):
        att_svm(X, z, alpha, norm="bogus")


def test_mask_and_opt_default():
    X, z, _ = rand(4, 5, 6, 1)
    rng = np.random.default_rng(0)
    y, v = np.sign(rng.standard_normal(4)), rng.standard_normal(6)
    mask = np.ones((4, 5), bool)
    mask[:, -1] = False
    sol = att_svm(X, z, y=y, v=v, mask=mask)
    gamma = y[:, None] * (X @ v)
    gamma[:, -1] = -np.inf
    assert np.array_equal(sol.alpha_, gamma.argmax(1))
    assert not sol.support_[:, -1].any() and (sol.dual_[:, -1] == 0).all()
    ref = att_svm(X[:, :-1], z, sol.alpha_)
    assert np.allclose(sol.W_, ref.W_, atol=1e-10)


def test_cli(tmp_path, capsys):
    import argparse

    from attnsvm.cli.solve import configure, run

    X, z, _ = rand(5, 3, 4)
    rng = np.random.default_rng(0)
    f = tmp_path / "d.npz"
    np.savez(f, X=X, z=z, y=np.sign(rng.standard_normal(5)), v=rng.standard_normal(4))
    p = argparse.ArgumentParser()
    configure(p)
    assert run(p.parse_args([str(f)])) == 0
    out = capsys.readouterr().out
    assert "min margin" in out and "duality gap" in out


def test_multitoken_with_single_token_sets_is_the_one_token_svm():
    # Every selected set has one token: no equality rows, W_fin = 0 and W_dir = W_mm(alpha).
    from attnsvm.svm import att_svm, multitoken_svm

    rng = np.random.default_rng(3)
    X = rng.normal(size=(3, 4, 6))
    z = rng.normal(size=(3, 6))
    s = np.full((3, 4), 1e-9)
    s[np.arange(3), [0, 2, 1]] = 1.0
    sol = multitoken_svm(X, z, s)
    ref = att_svm(X, z, alpha=np.array([0, 2, 1]))
    assert sol.feasible_ and np.allclose(sol.W_fin_, 0)
    np.testing.assert_allclose(sol.W_dir_, ref.W_, rtol=1e-5, atol=1e-7)


def test_mmts_fig3_directions():
    """Max-Margin Token Selection, Fig. 3 (joint (v, p)): sequences [(0, 0), u_i], alpha_i = 1.

    Variant a, u = (1, 1), (1, -1), (0.5, 1), y = (1, -1, 1).  Head SVM by hand: the
    constraints v1 + v2 >= 1, v2 - v1 >= 1 meet at v = (0, 1), where the third one,
    0.5 v1 + v2 >= 1, is also tight; v = 0.5 y_1 u_1 + 0.5 y_2 u_2 (KKT, lambda >= 0), so
    v_mm = (0, 1) and all three u_i are support vectors.  Prompt SVM: u_i^T p >= 1; the
    binding pair is u_2, u_3: p1 - p2 = 1, 0.5 p1 + p2 = 1 -> p_mm = (4/3, 1/3) with
    multipliers (7/9, 10/9) >= 0 and u_1^T p = 5/3 > 1 (every other active set violates a
    constraint).  Variant b, u_3 = (0.5, 1.5): v_mm = (0, 1) still, but y_3 v^T u_3 = 1.5,
    so sequence 3 is not a support vector; the plain SVM binds u_2, u_3: p = (5/4, 1/4)
    (multipliers 7/8, 3/4), while the relaxed SVM (u_3^T p >= 0 only) gives p = (1, 0).
    """
    from attnsvm.data import mmts_fig3

    alpha = np.ones(3, int)
    a = mmts_fig3("a")
    R = a.X[np.arange(3), alpha]
    h = head_svm(R, a.y)
    assert np.allclose(h.W_, [0.0, 1.0], atol=1e-10)
    assert h.extra["support_indices"].tolist() == [0, 1, 2]
    p = prompt_svm(a.X, None, alpha)
    assert np.allclose(p.W_, [4 / 3, 1 / 3], atol=1e-10)
    assert p.support_[:, 0].tolist() == [False, True, True]
    assert np.allclose(p.dual_[1:, 0], [7 / 9, 10 / 9], atol=1e-9)
    ra = relaxed_svm(a.X, alpha, a.y)
    assert ra.extra["S"].tolist() == [0, 1, 2] and np.allclose(ra.W_, p.W_, atol=1e-10)

    b = mmts_fig3("b")
    R = b.X[np.arange(3), alpha]
    hb = head_svm(R, b.y)
    assert np.allclose(hb.W_, [0.0, 1.0], atol=1e-10)
    assert hb.extra["support_indices"].tolist() == [0, 1]
    assert np.isclose(hb.margins_[2, 0], 1.5)
    pb = prompt_svm(b.X, None, alpha)
    assert np.allclose(pb.W_, [1.25, 0.25], atol=1e-10)
    assert np.allclose(pb.dual_[1:, 0], [7 / 8, 3 / 4], atol=1e-9)
    rb = relaxed_svm(b.X, alpha, b.y)
    assert rb.extra["S"].tolist() == [0, 1]
    assert np.allclose(rb.W_, [1.0, 0.0], atol=1e-10)
    assert np.linalg.norm(rb.W_ - pb.W_) > 0.3


def test_single_thread_limits_blas_and_restores_it():
    """attnsvm.single_thread (the opt-in, process-wide): inside, every BLAS library runs on
    one thread, nested blocks too; after, the caller's counts are back."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import attnsvm

    def counts():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    if not counts():
        pytest.skip("no BLAS library that threadpoolctl can see")
    seen = []
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = counts()
        with attnsvm.single_thread():
            seen.append(counts())
            with attnsvm.single_thread():
                seen.append(counts())
            seen.append(counts())
        assert counts() == before  # restored
    assert seen and all(c == [1] * len(c) for c in seen)
