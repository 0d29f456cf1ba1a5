"""Certificates are proofs (attnsvm.svm.certificate): no 'infeasible' claimed for a feasible
problem, no 'optimal' / feasible answer with a margin below 1, checked against an
independent exact-arithmetic oracle (Fractions of the caller's float inputs) over
near-degenerate families, every norm and every solver path; plus the cases of issue 25
and checks fed violating inputs."""

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnsvm.svm import att_svm, att_svm_batch, certificate, engine, prompt_svm, prompt_svm_batch
from attnsvm.svm.solution import ConstraintSet, farkas_verify


# --------------------------------------------------------------------------- oracle
def exact_rows(X, z, alpha, mask=None):
    """The exact constraint rows vec((x_{i,alpha_i} - x_it) z_i^T) (rationals of the float
    inputs) and their (i, t)."""
    n, T, d = X.shape
    rows, idx = [], []
    for i in range(n):
        for t in range(T):
            if t == alpha[i] or (mask is not None and not mask[i, t]):
                continue
            dx = [Fraction(float(X[i, alpha[i], c])) - Fraction(float(X[i, t, c]))
                  for c in range(d)]
            rows.append([a * Fraction(float(zf)) for a in dx for zf in z[i]])
            idx.append((i, t))
    return rows, idx


def solve_unique(M, rhs):
    """The unique solution of M x = rhs (lists of Fractions) by Gauss-Jordan elimination,
    or None when there is none or more than one."""
    A = [row[:] + [r] for row, r in zip(M, rhs)]
    ncol = len(M[0])
    piv = []
    r0 = 0
    for c in range(ncol):
        p = next((i for i in range(r0, len(A)) if A[i][c] != 0), None)
        if p is None:
            return None  # a free column: not unique
        A[r0], A[p] = A[p], A[r0]
        A[r0] = [x / A[r0][c] for x in A[r0]]
        for i in range(len(A)):
            if i != r0 and A[i][c] != 0:
                f = A[i][c]
                A[i] = [x - f * y for x, y in zip(A[i], A[r0])]
        piv.append(c)
        r0 += 1
    if any(A[i][-1] != 0 for i in range(r0, len(A))):
        return None  # inconsistent
    return [A[i][-1] for i in range(ncol)]


def exactly_feasible(rows) -> bool:
    """{w : a_k . w >= 1 for all k} nonempty, decided exactly: it is empty iff the Farkas
    polyhedron {lam >= 0, sum lam_k a_k = 0, sum lam_k = 1} is nonempty, and then it has
    a vertex, the unique solution on a support with linearly independent columns
    [a_k; 1]: every support is tried (Fractions; N <= 6 here)."""
    N = len(rows)
    if N == 0:
        return True
    dim = len(rows[0])
    for r in range(1, N + 1):
        for K in combinations(range(N), r):
            M = [[rows[k][j] for k in K] for j in range(dim)] + [[Fraction(1)] * r]
            sol = solve_unique(M, [Fraction(0)] * dim + [Fraction(1)])
            if sol is not None and all(v >= 0 for v in sol):
                return False
    return True


def exact_min_margin(rows, W) -> Fraction:
    """min_k a_k . vec(W) exactly (W the returned float matrix, C order)."""
    w = [Fraction(float(x)) for x in np.asarray(W, float).ravel()]
    return min(sum((a * b for a, b in zip(r, w)), Fraction(0)) for r in rows)


def check(sol, rows, feasible):
    """Zero false certificates: 'infeasible' only when exactly infeasible; a feasible /
    'optimal' answer only with every exact margin >= 1."""
    if sol.status_ == "infeasible":
        assert not feasible, "false Farkas certificate: the problem is feasible"
        assert not sol.feasible_
    if sol.feasible_:
        assert feasible
        W = sol.W_ if sol.W_.ndim == 2 else sol.W_[:, None]
        assert exact_min_margin(rows, W) >= 1, f"margin < 1 in an answer ({sol.status_})"
    if str(sol.status_).startswith("optimal"):
        assert sol.feasible_


# ----------------------------------------------------------------- the issue's cases
ISSUE_X = np.array([[[1.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]]])


@pytest.mark.parametrize("eps", [1e-7, 1e-8, 1e-9, 1e-10, 1e-12, 1e-15])
@pytest.mark.parametrize("solver", [None, "ipm", "mnp", "clarabel"])
def test_issue_25_no_false_infeasible(eps, solver):
    """att_svm(X, z=[[1, 0], [1, eps]], alpha=[0, 1]) is feasible for every eps > 0
    (W00 = 1, W01 = -2/eps); lambda = (1, 1) leaves the residual (0, -eps, 0, 0)."""
    z = np.array([[1.0, 0.0], [1.0, eps]])
    sol = att_svm(ISSUE_X, z, [0, 1], solver=solver)
    assert sol.status_ != "infeasible" and sol.conflict_ == ()
    rows, _ = exact_rows(ISSUE_X, z, [0, 1])
    check(sol, rows, True)


def test_issue_25_farkas_residual_rejected():
    """The certificate the old check accepted: lam = (1, 1), residual -eps != 0."""
    z = np.array([[1.0, 0.0], [1.0, 1e-9]])
    cs = engine.build_constraints(ISSUE_X[None], z[None], np.array([[0, 1]]),
                                  np.ones((1, 2, 2), bool))
    lam = np.zeros((1, 2, 2))
    lam[0, 0, 1] = lam[0, 1, 0] = 1.0
    ok, bound, _ = farkas_verify(cs, lam)
    assert not ok[0] and np.isfinite(bound[0])
    # eps = 0: the same multipliers are an exact certificate
    cs0 = engine.build_constraints(ISSUE_X[None], np.array([[[1.0, 0.0], [1.0, 0.0]]]),
                                   np.array([[0, 1]]), np.ones((1, 2, 2), bool))
    ok0, bound0, lam0 = farkas_verify(cs0, lam)
    assert ok0[0] and bound0[0] == np.inf
    assert (lam0[0] * cs0.b[0]).sum() == 1.0
    sol = att_svm(ISSUE_X, [[1.0, 0.0], [1.0, 0.0]], [0, 1])
    assert sol.status_ == "infeasible" and sol.conflict_ == (0, 1)


def test_farkas_uses_the_exact_token_differences():
    """(1 - 1e-20) rounds to 1: the rounded differences cancel under lam = (1, 1), the
    caller's exact ones do not (the problem is feasible, ||W|| ~ 1e20)."""
    X = np.array([[[1.0, 0.0], [1e-20, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    z = np.ones((2, 1))
    cs = engine.build_constraints(X[None], z[None], np.array([[0, 0]]),
                                  np.ones((1, 2, 2), bool), normalise_data=False)
    assert np.array_equal(cs.Delta[0, 0, 1], -cs.Delta[0, 1, 1])  # rounded: they cancel
    lam = np.zeros((1, 2, 2))
    lam[0, 0, 1] = lam[0, 1, 1] = 1.0
    assert not farkas_verify(cs, lam)[0][0]
    rows, _ = exact_rows(X, z, [0, 0])
    assert exactly_feasible(rows)
    check(att_svm(X, z, [0, 0]), rows, True)


def test_farkas_exact_recovers_a_rounded_certificate():
    """Multipliers off by rounding (1 + 1e-12, 1) are replaced by the exact null vector of
    their support: a true certificate is still found; one off its support is not."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3))
    X = np.stack([x, x[[1, 0]]])  # two sequences, the same tokens, alpha swapped
    z = np.tile(rng.standard_normal(4), (2, 1))
    cs = engine.build_constraints(X[None, :, :, :].reshape(1, 2, 2, 3), z[None],
                                  np.array([[0, 0]]), np.ones((1, 2, 2), bool))
    lam = np.zeros((1, 2, 2))
    lam[0, 0, 1], lam[0, 1, 1] = 1 + 1e-12, 1.0
    ok, _, lx = farkas_verify(cs, lam)
    assert ok[0] and lx[0, 0, 1] == lx[0, 1, 1] == 0.5
    lam[0, 1, 1] = 0.0
    assert not farkas_verify(cs, lam)[0][0]


def test_prove_margins_fails_below_one_and_decides_exact_ties():
    """A margin of exactly 1 - 2^-52 is not proven; exactly 1 (undecided by the bound) is
    proven in exact arithmetic; the bound is not fooled by cancellation."""
    D = np.array([[[[1.0, 0.0]]]])
    cs = ConstraintSet(D, np.ones((1, 1, 1)), np.ones((1, 1, 1), bool), np.ones((1, 1, 1)))
    assert certificate.prove_margins(cs, np.array([[[1.0], [5.0]]]))[0]
    assert not certificate.prove_margins(cs, np.array([[[1 - 2.0**-52], [5.0]]]))[0]
    assert not certificate.prove_margins(cs, np.array([[[1.0], [5.0]]]), exact=False)[0]
    # cancellation: 2^60 - (2^60 - 1) computes as 0 or 2 in floats; exact margin is 1
    D2 = np.array([[[[1.0, -1.0]]]])
    cs2 = ConstraintSet(D2, np.ones((1, 1, 1)), np.ones((1, 1, 1), bool), np.ones((1, 1, 1)))
    W = np.array([[[2.0**60 + 2**8], [2.0**60]]])  # exact margin 256 >= 1
    assert certificate.prove_margins(cs2, W)[0]
    W = np.array([[[2.0**60], [2.0**60]]])  # exact margin 0 < 1
    assert not certificate.prove_margins(cs2, W)[0]
    m, err = certificate.margin_enclosure(cs2, np.array([[[1.0 + 2**-52], [1.0]]]))
    assert abs(float(m[0, 0, 0]) - 2**-52) <= err[0, 0, 0]
    # an overflowing margin proves nothing (inf >= inf must not pass)
    assert not certificate.prove_margins(cs, np.array([[[1e308], [0.0]]]) * 10)[0]
    cs3 = ConstraintSet(np.array([[[[1e300, 0.0]]]]), np.ones((1, 1, 1)),
                        np.ones((1, 1, 1), bool), np.ones((1, 1, 1)))
    assert not certificate.prove_margins(cs3, np.array([[[1e300], [0.0]]]))[0]


def test_prove_feasible_scales_by_a_rounding_only():
    rng = np.random.default_rng(1)
    D = rng.standard_normal((1, 4, 3, 5))
    Z = rng.standard_normal((1, 4, 5))
    W = rng.standard_normal((1, 5, 5))
    one = np.ones((1, 4, 3))
    cs = ConstraintSet(D, Z, one > 0, one)
    cs = ConstraintSet(D * np.sign(cs.margins(W))[..., None], Z, one > 0, one)
    W = W / cs.margins(W).min()  # minimal margin 1 in floats (a hair below or above)
    W2, _, ok = certificate.prove_feasible(cs, W, 0 * one, np.ones(1, bool))
    assert ok[0] and (W2 / W).min() >= 1 and (W2 / W).max() - 1 <= certificate.MAX_BUMP
    W3 = W * 0.99  # not a rounding: neither scaled nor proven
    W4, _, ok3 = certificate.prove_feasible(cs, W3, 0 * one, np.ones(1, bool))
    assert not ok3[0] and np.array_equal(W4, W3)


def test_farkas_enclosure_equals_exact_on_data():
    """The floating-point enclosure (supports spanning R^{d e}) and the exact rational check
    give the same verdicts on random infeasible and perturbed candidates; a candidate whose
    nearby exact null vector has a negative entry is refused by both."""
    rng = np.random.default_rng(2)
    agree = 0
    for _ in range(30):
        d = int(rng.integers(2, 5))
        P = rng.standard_normal((d + 1, d))
        w = rng.random(d + 1) + 0.05
        P[-1] = -(w[:-1] @ P[:-1]) / w[-1]  # sum_k w_k P_k ~ 0: the origin in the hull
        X = np.stack([np.zeros((d + 1, d)), -P], 1)[None]  # Delta_k = 0 - (-P_k) = P_k
        cs = engine.build_constraints(X, np.ones((1, d + 1, 1)), np.zeros((1, d + 1), int),
                                      np.ones((1, d + 1, 2), bool))
        lam = np.zeros((1, d + 1, 2))
        lam[0, :, 1] = w * (1 + 1e-13 * rng.standard_normal(d + 1))
        if rng.random() < 0.3:
            lam[0, 0, 1] = -lam[0, 0, 1] * 1e-3  # negative: no certificate near it
            assert not certificate.farkas_enclosure(cs, np.abs(lam) * 0 + lam)[0]
        e1 = certificate.farkas_enclosure(cs, np.maximum(lam, 0))[0]
        e2 = certificate.farkas_exact(cs, np.maximum(lam, 0))[0][0]
        assert e1 == e2
        agree += e1
    assert agree >= 10  # (the enclosure applies and proves most of them)
    # the issue's case: a support of 2 < d e + 1 = 5, the enclosure does not apply
    cs0 = engine.build_constraints(ISSUE_X[None], np.array([[[1.0, 0.0], [1.0, 0.0]]]),
                                   np.array([[0, 1]]), np.ones((1, 2, 2), bool))
    lam = np.zeros((1, 2, 2))
    lam[0, 0, 1] = lam[0, 1, 0] = 1.0
    assert not certificate.farkas_enclosure(cs0, lam)[0]
    assert certificate.farkas_exact(cs0, lam)[0][0]


# ------------------------------------------------------------------ property test
def rotation(rng, k):
    q, r = np.linalg.qr(rng.standard_normal((k, k)))
    return q * np.sign(np.diag(r))


@st.composite
def degenerate(draw):
    """Near-degenerate problems: n = 2 or 3 sequences, T = 2 or 3 tokens; sequence 1
    repeats sequence 0's tokens with alpha swapped, its query is z_0 + eps v (eps = 0:
    exactly infeasible before rotation); then a random rotation of the token space and of
    the query space and a power-of-ten scaling of each."""
    seed = draw(st.integers(0, 2**32 - 1))
    n, T = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3)]))
    d, e = draw(st.sampled_from([2, 3])), draw(st.sampled_from([1, 2, 3]))
    k = draw(st.integers(2, 15))
    eps = draw(st.sampled_from([0.0, 10.0**-k]))
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    X[1] = X[0][[1, 0] + list(range(2, T))]
    z = rng.standard_normal((n, e))
    z[1] = z[0] + eps * rng.standard_normal(e)
    alpha = np.zeros(n, int)
    if draw(st.booleans()):
        X = X @ rotation(rng, d).T
        z = z @ rotation(rng, e).T
    X = X * 10.0 ** draw(st.integers(-3, 3))
    z = z * 10.0 ** draw(st.integers(-3, 3))
    return X, z, alpha


PATHS = [("fro", None), ("fro", "ipm"), ("fro", "mnp"), ("fro", "clarabel"),
         ("nuc", None), ("nuc", "barrier"), ("l1", None), (1.5, None), ("linf", None)]


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(degenerate(), st.sampled_from(PATHS), st.sampled_from(["single", "batch", "prompt",
                                                               "prompt_batch"]))
def test_no_false_certificates(prob, path, kind):
    """Zero false certificates on near-degenerate families, every norm and solver path,
    single, batched (the compiled lean path for the Frobenius default) and prompt."""
    X, z, alpha = prob
    norm, solver = path
    if kind in ("prompt", "prompt_batch"):
        z = np.ones((X.shape[0], 1))
        if norm == "nuc":  # (l_2 on vectors)
            norm, solver = "fro", None
    rows, _ = exact_rows(X, z, alpha)
    feasible = exactly_feasible(rows)
    if kind == "single":
        sol = att_svm(X, z, alpha, norm=norm, solver=solver)
    elif kind == "prompt":
        sol = prompt_svm(X, None, alpha, norm=norm, solver=solver)
    else:  # a batch of two: the problem and its mirror image (same verdict)
        Xb, ab = np.stack([X, -X]), np.stack([alpha, alpha])
        if kind == "batch":
            bs = att_svm_batch(Xb, np.stack([z, z]), ab, norm=norm, solver=solver,
                               irreducible=False)
        else:
            bs = prompt_svm_batch(Xb, None, ab, norm=norm, solver=solver)
        for b in range(2):
            rb, _ = exact_rows(Xb[b], z, alpha)
            check(bs[b], rb, feasible)
        return
    check(sol, rows, feasible)


@pytest.mark.parametrize("norm", ["fro", "l1", 1.5])
def test_relaxed_margins_proven_where_b_is_one(norm):
    """The relaxed problem: margins >= 1 (i in S) proven exactly; m_k >= 0 (i not in S),
    active at the optimum, to the stated tolerance FEAS_TOL (docs/theory.md §5.6)."""
    from attnsvm.svm import relaxed_svm
    from attnsvm.svm.solution import FEAS_TOL

    n_opt = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((5, 4, 6))
        alpha = rng.integers(0, 4, 5)
        S = np.array([True, True, False, False, False])
        sol = relaxed_svm(X, alpha, support=S, norm=norm)
        if not sol.feasible_:
            continue
        n_opt += 1
        rows, idx = exact_rows(X, np.ones((5, 1)), alpha)
        w = [Fraction(float(x)) for x in sol.W_]
        for r, (i, _t) in zip(rows, idx):
            m = sum((a * b for a, b in zip(r, w)), Fraction(0))
            assert m >= 1 if S[i] else m >= -FEAS_TOL
    assert n_opt >= 2


def test_margin_enclosure_holds_on_batches():
    """|m_k(W) - m^_k| <= err_k against the exact margins (Fractions), on a batch of
    problems with e > 1, masked constraints and cancelling W (the batched products of
    margin_enclosure over each problem's n T rows)."""
    rng = np.random.default_rng(5)
    B, n, T, d, e = 4, 3, 4, 5, 3
    D = rng.standard_normal((B, n, T, d)) * 2.0 ** rng.integers(-30, 30, (B, n, T, 1))
    Z = rng.standard_normal((B, n, e))
    valid = rng.random((B, n, T)) < 0.8
    cs = ConstraintSet(D, Z, valid, np.ones((B, n, T)))
    W = rng.standard_normal((B, d, e)) * 2.0 ** rng.integers(-20, 20, (B, 1, e))
    W[1, 1] = -W[1, 0]  # cancellation within a product
    m, err = certificate.margin_enclosure(cs, W)
    assert np.isinf(err[~valid]).all()
    for b in range(B):
        idx = [tuple(int(v) for v in p) for p in np.argwhere(valid[b])]
        for (i, t), mk in zip(idx, certificate.exact_margins(cs, b, W[b], idx)):
            assert abs(Fraction(float(m[b, i, t])) - mk) <= Fraction(float(err[b, i, t]))


def test_tri_inv_is_the_inverse():
    """_tri_inv (the Farkas enclosure's estimate of lambda_min: only the lower triangle's
    rows formed) against LAPACK's inverse of the same lower-triangular stack, and exactly
    triangular (0 above the diagonal, 1 / L_jj on it)."""
    rng = np.random.default_rng(3)
    for B, p in ((5, 1), (40, 7), (9, 12)):
        M = rng.standard_normal((B, p, p + 2))
        L = np.linalg.cholesky(M @ np.swapaxes(M, 1, 2))
        Li = certificate._tri_inv(L)
        assert np.allclose(Li, np.linalg.inv(L), rtol=1e-10, atol=1e-12)
        assert (np.triu(Li, 1) == 0).all()
        assert np.array_equal(np.diagonal(Li, axis1=1, axis2=2),
                              1.0 / np.diagonal(L, axis1=1, axis2=2))


def test_farkas_enclosure_batch_equals_one_by_one():
    """The batched enclosure (supports gathered by flat index over the batch) gives each
    problem the verdict it gets alone, for e > 1, differently sized supports and problems
    left out by ``which``; infeasible by construction (pairs Delta, -Delta on the same z:
    equal multipliers cancel exactly), candidates perturbed by 1e-13."""
    rng = np.random.default_rng(6)
    d, e, B = 2, 2, 6
    p = d * e
    nmax = p + 2
    D = np.zeros((B, nmax, 3, d))
    Z = np.zeros((B, nmax, e))
    valid = np.zeros((B, nmax, 3), bool)
    lam = np.zeros((B, nmax, 3))
    for b in range(B):
        P = p + b % 3  # pairs: K = 2 P >= 2 p > p + 1 constraints spanning R^{d x e}
        a, z = rng.standard_normal((P, d)), rng.standard_normal((P, e))
        w = rng.random(P) + 0.05
        D[b, :P, 0], D[b, :P, 2], Z[b, :P] = a, -a, z  # (token 1 masked)
        D[b, :P, 1] = rng.standard_normal((P, d))
        valid[b, :P, 0] = valid[b, :P, 2] = True
        for t in (0, 2):
            lam[b, :P, t] = w * (1 + 1e-13 * rng.standard_normal(P))
    cs = ConstraintSet(D, Z, valid, valid.astype(float))
    which = np.arange(B) != 2
    ok = certificate.farkas_enclosure(cs, lam, which)
    one = [bool(certificate.farkas_enclosure(cs.take([b]), lam[b:b + 1])[0]) for b in range(B)]
    assert list(ok) == [o and w for o, w in zip(one, which)]
    assert sum(one) >= 4 and not ok[2]
    bad = lam.copy()
    bad[0, 0, 0] *= 1.5  # far from any exact null vector: refused, batched and alone
    assert not certificate.farkas_enclosure(cs, bad)[0]
    assert not certificate.farkas_enclosure(cs.take([0]), bad[:1])[0]


def test_abs_matmul_chunks_equal_the_full_product():
    """|A| @ C formed in chunks of problems equals the full-size product bit for bit (and
    broadcasts an unbatched C)."""
    rng = np.random.default_rng(7)
    A = rng.standard_normal((150, 12, 5))
    C = rng.standard_normal((150, 5, 3))
    for c in (C, C[0]):
        full = np.abs(A) @ c
        got = certificate._abs_matmul(A, c, chunk=16)
        assert got.shape == full.shape and np.array_equal(got, full)


def test_prove_unit_margins_equals_prove_margins():
    """The single-problem proof of the lean path (prove_unit_margins) gives prove_margins'
    verdict (exact=False) on the same data: answers just above, at and below margin 1
    (rescaled to minimal margin 1 - 2^-50 .. 1 + 2^-30), masked constraints, an overflowing
    and a non-finite W; and it refutes a margin below 1."""
    rng = np.random.default_rng(11)
    seen = set()
    for k in range(60):
        n, T, d, e = 1 + k % 4, 2 + k % 5, 1 + k % 6, 1 + k % 3
        D = rng.standard_normal((n, T, d)) * 2.0 ** rng.integers(-8, 8)
        Z = rng.standard_normal((n, e))
        valid = rng.random((n, T)) < 0.85
        W = rng.standard_normal((d, e))
        m = np.einsum("ntc,cf,nf->nt", D, W, Z)
        m = np.where(valid, m, np.inf)
        if np.isfinite(m).any() and m.min() != 0:
            W = W * (np.sign(m.min()) / m.min()) * (1 + rng.choice([-2.0**-50, 0, 2.0**-44,
                                                                    2.0**-30]))
        if k == 7:
            with np.errstate(over="ignore"):
                W = W * 1e308 * 10
        if k == 8:
            W[0, 0] = np.nan
        cs = ConstraintSet(D[None], Z[None], valid[None], np.ones((1, n, T)))
        want = bool(certificate.prove_margins(cs, W[None], exact=False)[0])
        assert certificate.prove_unit_margins(D, Z, valid, W) == want
        seen.add(want)
    assert seen == {True, False}
    D = np.array([[[1.0, 0.0]]])
    assert not certificate.prove_unit_margins(D, np.ones((1, 1)), np.ones((1, 1), bool),
                                              np.array([[1 - 2.0**-52], [5.0]]))
