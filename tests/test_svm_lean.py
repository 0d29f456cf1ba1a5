"""The compiled small-problem path of att_svm (attnsvm.svm.lean) against the general
engine on the same inputs (every field bit for bit where the lean path answers; None,
and so the engine's own answer, where it must not: infeasible, zero constraints, no
constraint, extreme scales), and against an independent solver (cvxpy + Clarabel) and
the KKT conditions."""

import numpy as np
import pytest

pytest.importorskip("numba")

from attnsvm.norms import FRO  # noqa: E402
from attnsvm.svm import active, att_svm, engine, farkas, lean  # noqa: E402
from attnsvm.svm.problems import _run  # noqa: E402

FIELDS = ("norm_", "margin_", "violation_", "kkt_residual_", "gap_", "status_", "solver_",
          "feasible_", "conflict_", "n_iter_", "tol_active", "norm", "problem")
ARRAYS = ("W_", "dual_", "support_", "margins_", "alpha_")


def general(X, z, alpha, valid, tol=1e-6):
    """att_svm through the general engine (build_constraints + engine.solve)."""
    cs = engine.build_constraints(X[None], z[None], alpha[None], valid[None])
    return _run(cs, norm="fro", solver=None, tol=tol, alpha=alpha, problem="att_svm",
                vector=False, irreducible=True)


def same(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x == y or (isinstance(x, float) and np.isnan(x) and np.isnan(y)), f
    for f in ARRAYS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert x.shape == y.shape and x.dtype == y.dtype, f
            assert np.array_equal(x, y), f
    assert a.extra.keys() == b.extra.keys()
    for k, x in a.extra.items():
        assert np.array_equal(x, b.extra[k]), k


def instance(rng, n, T, d, e, kind):
    X = rng.standard_normal((n, T, d))
    z = rng.standard_normal((n, e))
    Ws = rng.standard_normal((d, e))
    valid = np.ones((n, T), bool)
    if kind == "tie" and n > 1:  # a repeated sequence
        X[1], z[1] = X[0], z[0]
    if kind == "lowrank":  # tokens on a line
        X = X[..., :1] * rng.standard_normal(d)
    if kind == "mask":
        valid = rng.random((n, T)) > 0.3
        valid[:, 0] = True
    if kind == "scale":  # far from unit scale (exact powers of two and not)
        X = X * 10.0 ** rng.integers(-150, 150)
        z = z * 3.7 ** rng.integers(-60, 60)
    s = ((X @ Ws) * z[:, None, :]).sum(-1)
    alpha = np.argmax(np.where(valid, s, -np.inf), axis=1)
    if kind == "dup" and T > 2:  # duplicate (unselected) tokens: repeated constraints
        for i in range(n):
            t1, t2 = [t for t in range(T) if t != alpha[i]][:2]
            X[i, t1] = X[i, t2]
    if kind == "random":  # often infeasible
        alpha = np.array([rng.choice(np.nonzero(valid[i])[0]) for i in range(n)])
    return X, z, alpha, valid


@pytest.mark.parametrize("kind", ["planted", "dup", "tie", "lowrank", "mask", "scale", "random"])
def test_lean_equals_engine(kind):
    rng = np.random.default_rng(["planted", "dup", "tie", "lowrank", "mask", "scale",
                                 "random"].index(kind))
    answered = 0
    for _ in range(25):
        n, T = rng.integers(1, 9), rng.integers(2, 9)
        d, e = rng.integers(1, 7), rng.integers(1, 7)
        X, z, alpha, valid = instance(rng, n, T, d, e, kind)
        ref = general(X, z, alpha, valid)
        got = lean.att_svm_lean(X, z, alpha, valid, tol=1e-6)
        if got is None:  # the engine decides: att_svm gives the engine's answer
            assert ref.status_ != "optimal" or ref.solver_ != "mnp-active" or kind == "scale"
            same(att_svm(X, z, alpha, mask=valid), ref)
            continue
        answered += 1
        assert ref.status_ == "optimal"
        same(got, ref)
        same(att_svm(X, z, alpha, mask=valid), ref)
    if kind != "random":
        assert answered >= 15


def test_deferred_fields_are_the_engines():
    """The single fast path's result defers kkt_residual_, margins_, support_, dual_ (none
    decides the status) to their first read: before it they are not computed; read, each
    is the engine's (bit for bit, also where W scales up, k <= 0, or down, k > 0); copies,
    pickles, dataclasses.replace / asdict hold every value; a field set by the caller wins;
    one without a value is an AttributeError naming it."""
    import copy
    import dataclasses
    import pickle

    from attnsvm.svm.result import DeferredSolution

    rng = np.random.default_rng(5)
    deferred = ("kkt_residual_", "margins_", "support_", "dual_")
    seen_k = set()
    for scale in (1.0, 2.0 ** -20, 2.0 ** 20, 1e-3):
        X, z, alpha, valid = instance(rng, 6, 5, 4, 3, "planted")
        X = X * scale
        got = lean.att_svm_lean(X, z, alpha, valid, tol=1e-6)
        assert isinstance(got, DeferredSolution)
        assert not any(f in vars(got) for f in deferred)  # (not computed yet)
        seen_k.add(np.sign(got.extra["scale_exp"]))
        ref = general(X, z, alpha, valid)
        assert type(ref) is not DeferredSolution
        same(got, ref)  # (reads every field: the deferred ones computed now)
        assert all(f in vars(got) for f in deferred)
        for other in (copy.deepcopy(lean.att_svm_lean(X, z, alpha, valid, tol=1e-6)),
                      pickle.loads(pickle.dumps(lean.att_svm_lean(X, z, alpha, valid,
                                                                  tol=1e-6))),
                      dataclasses.replace(lean.att_svm_lean(X, z, alpha, valid, tol=1e-6))):
            same(other, ref)
        d = dataclasses.asdict(lean.att_svm_lean(X, z, alpha, valid, tol=1e-6))
        assert d.keys() == {f.name for f in dataclasses.fields(ref)}
        assert d["kkt_residual_"] == ref.kkt_residual_
        assert np.array_equal(d["dual_"], ref.dual_)
    assert {-1, 1} <= seen_k  # (W scaled up and down)
    fresh = lean.att_svm_lean(X, z, alpha, valid, tol=1e-6)
    fresh.kkt_residual_ = 0.5  # (set before the first read: the caller's value stays)
    assert np.array_equal(fresh.margins_, ref.margins_) and fresh.kkt_residual_ == 0.5
    orphan = DeferredSolution.make(None, **{f.name: getattr(ref, f.name)
                                          for f in dataclasses.fields(ref)
                                          if f.name not in deferred})
    assert orphan.norm_ == ref.norm_
    with pytest.raises(AttributeError, match="kkt_residual_"):
        _ = orphan.kkt_residual_


def test_lean_matches_clarabel_and_kkt():
    import cvxpy as cp

    rng = np.random.default_rng(7)
    for kind in ("planted", "dup", "tie"):
        X, z, alpha, valid = instance(rng, 6, 5, 4, 3, kind)
        sol = lean.att_svm_lean(X, z, alpha, valid, tol=1e-6)
        assert sol is not None and sol.status_ == "optimal"
        n, T, d = X.shape
        keep = valid & (np.arange(T)[None, :] != alpha[:, None])
        ii, tt = np.nonzero(keep)
        D = X[ii, alpha[ii]] - X[ii, tt]
        M = np.einsum("kd,ke->kde", D, z[ii]).reshape(len(ii), -1)
        W = cp.Variable((d, 3))
        prob = cp.Problem(cp.Minimize(cp.sum_squares(W)), [M @ cp.vec(W, order="C") >= 1])
        prob.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
        assert sol.norm_ == pytest.approx(np.linalg.norm(W.value), rel=1e-7)
        m = M @ sol.W_.reshape(-1)
        lam = sol.dual_[ii, tt]
        assert m.min() == pytest.approx(1.0, abs=1e-12) and lam.min() >= 0
        assert np.abs(lam * (m - 1)).max() <= 1e-9 * lam.max()
        assert np.allclose(lam @ M, sol.W_.reshape(-1), rtol=0, atol=1e-10 * sol.norm_)
        assert np.allclose(sol.margins_[ii, tt], m, rtol=0, atol=1e-12)
        assert np.array_equal(sol.support_, keep & (sol.margins_ <= 1 + 1e-6))


def test_lean_declines():
    """Where the engine must decide, the lean path returns None."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((3, 4, 2))
    z = rng.standard_normal((3, 2))
    a = np.zeros(3, np.int64)
    v = np.ones((3, 4), bool)
    X2 = X.copy()
    X2[1, 2] = X2[1, 0]  # a token equal to the selected one: A_k = 0, infeasible
    assert lean.att_svm_lean(X2, z, a, v, tol=1e-6) is None
    assert att_svm(X2, z, a).status_ == "infeasible"
    v1 = np.zeros((3, 4), bool)
    v1[:, 0] = True  # no constraint: W = 0
    assert lean.att_svm_lean(X, z, a, v1, tol=1e-6) is None
    assert att_svm(X, z, a, mask=v1).norm_ == 0.0
    Xi = np.zeros((2, 2, 1))
    Xi[0, 1, 0], Xi[1, 0, 0] = 1.0, 1.0  # -W >= 1 and W >= 1: infeasible
    zi = np.ones((2, 1))
    assert lean.att_svm_lean(Xi, zi, np.array([0, 0]), np.ones((2, 2), bool), tol=1e-6) is None
    s = att_svm(Xi, zi, np.array([0, 0]))
    assert s.status_ == "infeasible" and s.conflict_ == (0, 1)
    from attnsvm.svm.solution import NotRepresentableError

    Xp, zp, ap, vp = instance(rng, 4, 3, 2, 2, "planted")
    assert lean.att_svm_lean(Xp, zp, ap, vp, tol=1e-6) is not None
    for s in (2.0 ** 1000, 2.0 ** -1000):  # W_mm under- / overflows float64: the engine raises
        assert lean.att_svm_lean(Xp * s, zp * s, ap, vp, tol=1e-6) is None
        with pytest.raises(NotRepresentableError):
            att_svm(Xp * s, zp * s, ap)
    assert not lean.applies(20, 15, None) and not lean.applies(2, 2, "ipm")


# ------------------------------------------------------------------ batches
def general_batch(X, z, alpha, valid, xexp=0, irreducible=False, problem="att_svm",
                  vector=False):
    """The batch through the general engine (build_constraints + engine.solve)."""
    B = len(X)
    cs = engine.build_constraints(X, z, alpha, valid, x_exp=np.broadcast_to(xexp, (B,)))
    out = engine.solve(cs, "fro", solver=None, tol=1e-6, irreducible=irreducible)
    return engine.to_batch_solution(cs, out, alpha=alpha, problem=problem, vector=vector,
                                    norm=FRO, tol=1e-6)


def lean_batch(X, z, alpha, valid, irreducible=False, max_iter=None):
    """The batch through the Frobenius row's fast path (lean.batch_lean), the problems it
    does not settle through the engine (batch._engine_rest, as att_svm_batch)."""
    from attnsvm.svm.batch import _engine_rest

    kw = dict(tol=1e-6, irreducible=irreducible, problem="att_svm", vector=False)
    return lean.batch_lean(X, z, alpha, valid, 0, **kw, max_iter=max_iter,
                           rest=_engine_rest(X, z, alpha, valid, 0, norm="fro", solver=None,
                                             **kw))


BATCH_FIELDS = ("W_", "norm_", "margin_", "violation_", "kkt_residual_", "gap_", "dual_",
                "support_", "margins_", "feasible_", "status_", "solver_", "alpha_")


def same_batch(a, b):
    for f in BATCH_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.shape == y.shape and x.dtype == y.dtype, f
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f
    assert a.conflict_ == b.conflict_
    assert (a.norm, a.problem, a.tol_active) == (b.norm, b.problem, b.tol_active)
    assert a.extra.keys() == b.extra.keys()
    inf = a.status_ == "infeasible"
    for k, x in a.extra.items():
        y = b.extra[k]
        if k == "lower_bound":  # infeasible: from the solver's last multipliers (rounding)
            assert np.array_equal(x[~inf], y[~inf])
            assert np.all((x[inf] >= 0) & (y[inf] >= 0))
        else:
            assert np.array_equal(x, y, equal_nan=np.asarray(x).dtype.kind == "f"), k


def batch_instance(rng, B, n, T, d, e, kind):
    X = rng.standard_normal((B, n, T, d))
    z = rng.standard_normal((B, n, e))
    alpha = rng.integers(0, T, (B, n))  # random: about half infeasible
    valid = np.ones((B, n, T), bool)
    if kind == "planted":
        Ws = rng.standard_normal((B, d, e))
        alpha = np.argmax(((X @ Ws[:, None]) * z[:, :, None, :]).sum(-1), axis=-1)
    if kind == "degenerate":
        X[::3, :, 1] = X[::3, :, 2]  # duplicate tokens (zero constraints where selected)
        X[1::4, 1], z[1::4, 1] = X[1::4, 0], z[1::4, 0]  # repeated sequences
        valid = rng.random((B, n, T)) > 0.2
        valid[np.arange(B)[:, None], np.arange(n)[None, :], alpha] = True
        valid[2, :, :] = False  # no constraint at all
        valid[2, np.arange(n), alpha[2]] = True
        z[5, 0] = 0.0  # a zero query: its constraints have A_k = 0
        X[7] *= 2.0 ** 600  # far from unit scale
    return X, z, alpha, valid


@pytest.mark.parametrize("kind", ["planted", "random", "degenerate"])
@pytest.mark.parametrize("irreducible", [False, True])
def test_batch_lean_equals_engine(kind, irreducible):
    from attnsvm.svm import att_svm_batch

    rng = np.random.default_rng(11 + irreducible)
    n_inf = n_feas = 0
    for B, n, T, d, e in ((40, 6, 8, 5, 3), (70, 3, 4, 2, 2), (9, 5, 6, 4, 1)):
        X, z, alpha, valid = batch_instance(rng, B, n, T, d, e, kind)
        ref = general_batch(X, z, alpha, valid, irreducible=irreducible)
        got = lean_batch(X, z, alpha, valid, irreducible=irreducible)
        same_batch(got, ref)
        same_batch(att_svm_batch(X, z, alpha, mask=valid, irreducible=irreducible), ref)
        n_inf += (ref.status_ == "infeasible").sum()
        n_feas += ref.feasible_.sum()
    assert n_feas >= 10 and (kind == "planted" or n_inf >= 10)


def test_prompt_batch_lean_equals_engine():
    from attnsvm.svm import prompt_svm_batch
    from attnsvm.svm.constraints import scaled_keys

    rng = np.random.default_rng(5)
    B, n, T, d = 300, 6, 8, 10
    X = rng.standard_normal((B, n, T, d))
    alpha = rng.integers(0, T, (B, n))
    valid = np.ones((B, n, T), bool)
    for Wk in (None, rng.standard_normal((d, d)) * 1e-3):
        K, eK = scaled_keys(X, Wk, valid)
        ref = general_batch(K, np.ones((B, n, 1)), alpha, valid, eK, problem="prompt_svm",
                            vector=True)
        got = prompt_svm_batch(X, Wk, alpha)
        same_batch(got, ref)
        assert 50 <= got.feasible_.sum() <= B - 50  # both kinds, many of each


def test_batch_lean_hands_over_stalled_problems():
    """A major-cycle cap of 1 leaves every problem (or one) to the engine: its answers."""
    rng = np.random.default_rng(9)
    X, z, alpha, valid = batch_instance(rng, 12, 4, 5, 3, 3, "random")
    ref = general_batch(X, z, alpha, valid)
    got = lean_batch(X, z, alpha, valid, max_iter=1)
    same_batch(got, ref)
    # one stalled problem among settled ones (the engine gets it in a batch of two)
    Xp, zp, ap, vp = batch_instance(rng, 5, 4, 5, 3, 3, "planted")
    ref = general_batch(Xp, zp, ap, vp)
    Xp[3, :, 1] = Xp[3, np.arange(4), ap[3]]  # a zero constraint in problem 3: the engine's
    ref3 = general_batch(Xp, zp, ap, vp)
    got = lean_batch(Xp, zp, ap, vp)
    same_batch(got, ref3)
    assert ref3.status_[3] == "infeasible" and ref.status_[3] == "optimal"


@pytest.mark.parametrize("n", [1, 6, 12, 13, 20])
def test_conflict_tuples(n):
    """conflict_ from hit rows (farkas.conflict_tuples, the batched lean path's and the
    engine's): the table lookup (n <= 12) and the nonzero pass (n > 12) give, for each
    problem with ok, the sequences it hits, in order (() else)."""
    rng = np.random.default_rng(n)
    B = 200
    hit = rng.random((B, n)) < 0.3
    ok = rng.random(B) < 0.6
    want = [tuple(int(i) for i in np.flatnonzero(hit[b])) if ok[b] else () for b in range(B)]
    assert farkas.conflict_tuples(hit, ok) == want


def test_lean_hands_over_tokens_scaled_into_the_subnormal_range():
    """A valid nonzero token entry that the normalisation (X 2^-eX) takes into the subnormal
    range may lose bits: the kernel hands the problem to the engine (None), whose answer
    att_svm returns; the same entry on a masked token, or just above the range, is kept."""
    rng = np.random.default_rng(21)
    X, z, alpha, valid = instance(rng, 4, 3, 2, 2, "planted")
    X = X / np.abs(X).max() * 3.0  # max |x| in [2, 4): X 2^-2
    t = (alpha[0] + 1) % 3
    for tiny, handed in ((2.0 ** -1000, False), (2.0 ** -1060, True)):
        X2 = X.copy()
        X2[0, t, 0] = tiny
        got = lean.att_svm_lean(X2, z, alpha, valid, tol=1e-6)
        assert (got is None) == handed
        ref = general(X2, z, alpha, valid)
        same(att_svm(X2, z, alpha, mask=valid), ref)
        if got is not None:
            same(got, ref)
    v2 = valid.copy()
    v2[0, t] = False  # masked: not read
    X2[0, t, 0] = 2.0 ** -1060
    assert lean.att_svm_lean(X2, z, alpha, v2, tol=1e-6) is not None


def _unit_answers(rng, kind):
    """A batch of Frobenius ATT-SVMs (every problem with a constraint) and the active-set
    solver's answers rescaled to minimal margin 1: (cs, W, lam)."""
    from attnsvm.svm.engine import _to_feasible

    X, z, alpha, valid = batch_instance(rng, 40, 5, 6, 4, 3, kind)
    valid[2] = True
    cs = engine.build_constraints(X, z, alpha, valid)
    cs = cs.take(np.nonzero(cs.valid.any((1, 2)))[0])
    B, (n, T), d = cs.batch_shape[0], cs.shape, cs.d
    mu, lam, W, rho2, st, it = active.mnp_active(
        cs.Delta.reshape(B, n * T, d), np.repeat(cs.Z, T, axis=1), cs.valid.reshape(B, -1))
    W, lam = _to_feasible(cs, W, lam.reshape(B, n, T))
    return cs, W, lam


def test_unit_certificate_is_certify():
    """certify_unit (the fast path's certificate, one numpy pass over B problems) against
    certificate.certify on the same answers, problem by problem: where it says feasible,
    certify does and every number is the same bits; it never proves what certify does not;
    it refuses answers that miss a margin (scaled down by 1e-9, a row pushed below 1) or
    that the bound cannot decide (margins exactly 1 without KAPPA)."""
    from attnsvm.svm.certificate import certify
    from attnsvm.svm.engine import _to_feasible
    from attnsvm.svm.unit_certificate import certify_unit

    rng = np.random.default_rng(17)
    for kind in ("planted", "random", "degenerate"):
        cs, W, lam = _unit_answers(rng, kind)
        short = W * (1 - 1e-9)  # every margin below 1: refused
        push = W.copy()
        push[:, 0, 0] += 1e-3  # (a random change: some margin drops below 1)
        bare, lbare = _to_feasible(cs, W / 1.0000001, lam)  # min margin 1 exactly, then KAPPA
        bare = bare / (1 + 2.0 ** -40)  # (KAPPA undone: margins at 1, the bound undecided)
        for Wt, lt in ((W, lam), (short, lam), (push, lam), (bare, lbare)):
            ref = certify(cs, Wt, lt, FRO, 1e-6)
            got = certify_unit(cs.Delta, cs.Z, cs.valid, Wt, lt, 1e-6)
            assert not (got.feasible & ~ref.feasible).any()
            f = got.feasible
            for k in ("W", "lam", "margins", "norm", "margin", "violation", "kkt", "gap",
                      "lower", "support"):
                x, y = getattr(got, k)[f], getattr(ref, k)[f]
                assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
            if Wt is W:
                assert f.sum() >= 0.9 * ref.feasible.sum() and (kind == "random" or f.sum() > 5)
                bare_numbers = certify_unit(cs.Delta, cs.Z, cs.valid, Wt, lt, 1e-6, prove=False)
                assert not bare_numbers.feasible.any()  # (no proof run: nothing feasible)
                assert np.array_equal(bare_numbers.lower, got.lower)
            if Wt is short:
                assert not f.any()
            if Wt is push:
                m = cs.margins(Wt)
                assert not (f & np.where(cs.valid, m < 1, False).any((1, 2))).any()
            if Wt is bare:  # margins 1 to rounding: the bound proves none of the tight ones
                m = cs.margins(Wt)
                tight = np.where(cs.valid, m <= 1.0 + 1e-15, False).any((1, 2))
                assert tight.any() and not (f & tight).any()


def test_margins_dot2_one_answer_per_row():
    """certificate.margins_dot2 with one W per row (the batch fast path's exact margins of
    several problems in one call): the bits of one call per problem, and every exact
    margin (Fractions) inside m +- err."""
    from fractions import Fraction

    from attnsvm.svm.certificate import margins_dot2, two_diff

    rng = np.random.default_rng(37)
    R, d, e = 9, 4, 2
    Ey, Ej, Z = rng.standard_normal((R, d)), rng.standard_normal((R, d)), rng.standard_normal((R, e))
    Ej = Ey + rng.standard_normal((R, d)) * 1e-5
    D, lo = two_diff(Ey, Ej)
    Ws = rng.standard_normal((3, d, e)) * 1e6
    owner = np.array([0, 0, 1, 2, 2, 2, 1, 0, 1])
    m, err = margins_dot2(D, lo, Ws[owner], Z)
    for k in range(3):
        r = owner == k
        m1, e1 = margins_dot2(D[r], lo[r], Ws[k], Z[r])
        assert np.array_equal(m[r], m1) and np.array_equal(err[r], e1)
    for r in range(R):
        W = Ws[owner[r]]
        ex = sum((Fraction(float(Ey[r, a])) - Fraction(float(Ej[r, a]))) * Fraction(float(W[a, b]))
                 * Fraction(float(Z[r, b])) for a in range(d) for b in range(e))
        assert abs(Fraction(float(m[r])) - ex) <= Fraction(float(err[r]))


def test_unit_certificate_prove_mask():
    """certify_unit's per-problem ``prove`` mask: feasible only where the mask says so and
    the full proof does, every number the same bits as without the mask (and as a batch of
    just those problems: each problem's numbers are computed alone)."""
    from attnsvm.svm.unit_certificate import certify_unit

    rng = np.random.default_rng(31)
    cs, W, lam = _unit_answers(rng, "random")
    full = certify_unit(cs.Delta, cs.Z, cs.valid, W, lam, 1e-6)
    mask = rng.random(len(W)) < 0.5
    got = certify_unit(cs.Delta, cs.Z, cs.valid, W, lam, 1e-6, prove=mask)
    assert full.feasible.sum() > 5 and (full.feasible & ~mask).any()
    assert np.array_equal(got.feasible, full.feasible & mask)
    off = certify_unit(cs.Delta, cs.Z, cs.valid, W, lam, 1e-6, prove=False)
    j = np.nonzero(mask)[0]
    part = certify_unit(cs.Delta[j], cs.Z[j], cs.valid[j], W[j], lam[j], 1e-6)
    for k in ("W", "lam", "margins", "norm", "margin", "violation", "kkt", "lower", "support"):
        x = getattr(got, k)
        assert np.array_equal(x, getattr(full, k), equal_nan=x.dtype.kind == "f"), k
        assert np.array_equal(x[j], getattr(part, k), equal_nan=x.dtype.kind == "f"), k
    assert np.array_equal(got.gap[mask], full.gap[mask], equal_nan=True)
    assert np.array_equal(got.gap[~mask], off.gap[~mask], equal_nan=True)


def test_unit_certificate_decides_undecided_margins_exactly():
    """certify_unit's ``decide``: asked only for problems whose margins the bound leaves
    undecided (none refuted), and then feasible exactly where it says so; with the
    engine's exact proof (certificate.prove_margins on the exact data) every margin of a
    problem it makes feasible is >= 1 in rational arithmetic (exact_margins, an
    independent check), and every number is certify_unit's; answers that miss a margin by
    more than rounding (1e-9 short) are never asked, even of a decide that says yes."""
    from fractions import Fraction

    from attnsvm.svm.certificate import exact_margins, margin_enclosure, prove_margins
    from attnsvm.svm.engine import _to_feasible
    from attnsvm.svm.unit_certificate import certify_unit

    rng = np.random.default_rng(29)
    decided = 0
    for kind in ("planted", "random"):
        cs, W, lam = _unit_answers(rng, kind)
        bare, lbare = _to_feasible(cs, W / 1.0000001, lam)
        bare = bare / (1 + 2.0 ** -40)  # (margins at 1: the bound leaves the tight undecided)
        for Wt, lt in ((bare, lbare), (W * (1 - 1e-9), lam)):
            asked = []

            def exact(j, Wt=Wt, asked=asked, cs=cs):
                asked.append(j)
                return prove_margins(cs.take(j), Wt[j], positive=True)

            plain = certify_unit(cs.Delta, cs.Z, cs.valid, Wt, lt, 1e-6)
            got = certify_unit(cs.Delta, cs.Z, cs.valid, Wt, lt, 1e-6, decide=exact)
            yes = certify_unit(cs.Delta, cs.Z, cs.valid, Wt, lt, 1e-6,
                               decide=lambda j: np.ones(len(j), bool))
            j = np.concatenate(asked) if asked else np.zeros(0, int)
            # asked: not proven by the bound, none of its margins refuted by it
            m, err = margin_enclosure(cs, Wt)
            refuted = (cs.valid & (m - 1.0 < -err)).any((1, 2))
            assert not plain.feasible[j].any() and not refuted[j].any()
            assert np.array_equal(yes.feasible & ~plain.feasible,
                                  np.isin(np.arange(len(Wt)), j))
            if Wt is not bare:
                assert not asked and not yes.feasible.any()  # (1e-9 short: refuted)
                continue
            assert len(j) > 0
            new = got.feasible & ~plain.feasible
            assert np.array_equal(got.feasible, plain.feasible | new)
            for b in np.nonzero(new)[0]:  # proven: every margin >= 1 exactly
                idx = [tuple(int(x) for x in q) for q in np.argwhere(cs.valid[b])]
                assert all(mk >= 1 for mk in exact_margins(cs, int(b), Wt[b], idx))
                assert Fraction(1) <= min(exact_margins(cs, int(b), Wt[b], idx))
                decided += 1
            for k in ("W", "lam", "margins", "norm", "margin", "violation", "kkt", "lower",
                      "support"):
                x, y = getattr(got, k), getattr(plain, k)
                assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), k
            f = got.feasible
            assert np.isfinite(got.gap[new]).all()
            assert np.array_equal(got.gap[f & plain.feasible], plain.gap[f & plain.feasible])
    assert decided > 0


def test_batch_lean_proves_undecided_margins_as_the_engine():
    """Answers whose tight margins the rounding-error bound leaves undecided (4 of these
    1,000 prompt SVMs: margins 1 + 2^-40) are proven on the exact data in the fast path
    (the compensated enclosure margins_dot2 decides them; the engine's exact proof agrees)
    and none goes to the engine: the engine's answers bit for bit.  The proof refuses W
    scaled down by 2^-38 (margins 1 + 2^-40 then below 1) and data that is not the
    kernel's."""
    from attnsvm.svm.constraints import scaled_keys

    rng = np.random.default_rng(0)
    B, n, T, d = 1000, 6, 8, 10
    X = rng.standard_normal((B, n, T, d))
    alpha = rng.integers(0, T, (B, n))
    valid = np.ones((B, n, T), bool)
    K, eK = scaled_keys(X, None, valid)
    z = np.ones((B, n, 1))
    xexp = np.broadcast_to(np.asarray(eK, np.int64), (B,)).copy()
    solved = lean._solve_batch(K, z, alpha, valid, xexp, 20 * n * T + 50)
    info, D, Zs, v, W, lam, mu = solved
    opt = np.nonzero(info[:, 2] == active.OPTIMAL)[0]
    plain = lean._settle(*solved, tol=1e-6, irreducible=False)[0]
    exact = lean._exact_margins(K, z, alpha, valid, xexp, D, Zs, v)
    got = lean._settle(*solved, tol=1e-6, irreducible=False, exact=exact)[0]
    undecided = np.setdiff1d(opt, plain)
    assert len(undecided) >= 2 and np.array_equal(np.sort(got), np.arange(B))
    assert exact(undecided, W[undecided]).all()
    # the compensated enclosure alone proves them (the rational fallback not called)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lean, "prove_margins", lambda *a, **k: pytest.fail("fallback"))
        assert exact(undecided, W[undecided]).all()
    # and the engine's exact proof agrees
    from attnsvm.svm.certificate import prove_margins

    cs = engine.build_constraints(K[undecided], z[undecided], alpha[undecided],
                                  valid[undecided], x_exp=xexp[undecided])
    assert prove_margins(cs, W[undecided], positive=True).all()
    assert not exact(undecided, W[undecided] * (1 - 2.0 ** -38)).any()
    D2 = D.copy()
    D2[undecided, 0, 1, 0] *= 1 + 2.0 ** -50
    bad = lean._exact_margins(K, z, alpha, valid, xexp, D2, Zs, v)
    assert not bad(undecided, W[undecided]).any()
    sub = np.concatenate([undecided, opt[:20], np.setdiff1d(np.arange(B), opt)[:20]])
    ref = general_batch(K[sub], z[sub], alpha[sub], valid[sub], xexp[sub],
                        problem="prompt_svm", vector=True)
    from attnsvm.svm import prompt_svm_batch

    calls = []
    kw = dict(tol=1e-6, irreducible=False, problem="prompt_svm", vector=True)
    out = lean.batch_lean(K[sub], z[sub], alpha[sub], valid[sub], xexp[sub], **kw,
                          rest=lambda idx: calls.append(idx))
    assert not calls
    same_batch(out, ref)
    assert (out.status_[:len(undecided)] == "optimal").all()
    same_batch(prompt_svm_batch(X[sub], None, alpha[sub]), ref)


def test_unit_certificate_one_is_certify_unit():
    """certify_unit_one (the single problem's certificate: Python-float scalars, fewer
    numpy calls) against certify_unit on the same answers, problem by problem: it proves
    exactly the answers certify_unit proves (its larger underflow term changes no verdict
    here) and every number is the same bits; answers that miss a margin (scaled down by
    1e-9, a row pushed below 1), that the bound cannot decide (margins exactly 1 without
    KAPPA) or whose multipliers are not finite get None."""
    from attnsvm.svm.engine import _to_feasible
    from attnsvm.svm.unit_certificate import certify_unit, certify_unit_one

    rng = np.random.default_rng(23)
    proven = refused = 0
    for kind in ("planted", "random", "degenerate"):
        cs, W, lam = _unit_answers(rng, kind)
        push = W.copy()
        push[:, 0, 0] += 1e-3
        bare, lbare = _to_feasible(cs, W / 1.0000001, lam)
        bare = bare / (1 + 2.0 ** -40)
        nan_lam = lam.copy()
        nan_lam[:, 0, 0] = np.nan
        for Wt, lt in ((W, lam), (W * (1 - 1e-9), lam), (push, lam), (bare, lbare),
                       (W, nan_lam)):
            ref = certify_unit(cs.Delta, cs.Z, cs.valid, Wt, lt, 1e-6)
            for b in np.nonzero(np.isfinite(Wt).all((1, 2)))[0]:
                got = certify_unit_one(cs.Delta[b], cs.Z[b], cs.valid[b], Wt[b], lt[b], 1e-6)
                want = ref.feasible[b] and np.isfinite(ref.gap[b])
                assert (got is not None) == want, (kind, b)
                if got is None:
                    refused += 1
                    continue
                proven += 1
                for k in ("lam", "margins", "support"):
                    x, y = getattr(got, k), getattr(ref, k)[b]
                    assert x.dtype == y.dtype and np.array_equal(x, y), k
                for k in ("norm", "margin", "violation", "kkt", "gap", "lower"):
                    x, y = getattr(got, k), float(getattr(ref, k)[b])
                    assert type(x) is float and (x == y or (np.isnan(x) and np.isnan(y))), k
                assert got.wmax == np.abs(Wt[b]).max()
                assert got.n_constraints == cs.valid[b].sum()
    assert proven > 50 and refused > 50
    # a margin 1 + 2e-12 that the common bound E' = d e max|D| max|W| max|z| (4e6 here)
    # leaves undecided and E_k (~1) proves: the second pass, with E_k; at 1 exactly: None
    D = np.array([[[1.0, 0.0], [0.0, 0.0]]])
    Z = np.array([[1.0, 0.5]])
    v = np.array([[True, False]])
    lam1 = np.array([[1.0, 0.0]])
    for w00, ok in ((1 + 2e-12, True), (1.0, False)):
        W1 = np.array([[w00, 0.0], [0.0, 1e6]])
        got = certify_unit_one(D, Z, v, W1, lam1, 1e-6)
        ref = certify_unit(D[None], Z[None], v[None], W1[None], lam1[None], 1e-6)
        assert (got is not None) == ok == bool(ref.feasible[0])
        if ok:
            assert (got.norm, got.margin, got.kkt, got.gap) == (
                ref.norm[0], ref.margin[0], ref.kkt[0], ref.gap[0])
    # margins that overflow (W near the largest float): None, and certify_unit refuses
    W1 = np.array([[1e308, 0.0], [0.0, 1.0]])
    D1 = np.array([[[2.0, 0.0], [0.0, 0.0]]])  # (m = 2e308: inf)
    assert certify_unit_one(D1, Z, v, W1, lam1, 1e-6) is None
    assert not certify_unit(D1[None], Z[None], v[None], W1[None], lam1[None], 1e-6).feasible[0]


def _bits(x):
    """x's float64 bits (arrays, Python floats): NaNs and signed zeros compared exactly."""
    a = np.asarray(x, dtype=float)
    return a.view(np.int64)


def test_unit_one_core_compiled_reductions_are_numpys(monkeypatch):
    """unit_one_core with numba (the exact reductions of one compiled pass,
    _active_kernels.unit_one_scan) against its numpy definition (_unit_one_numpy): the
    same verdict (None or not) and every number and array the same bits, deferred ones
    included, on answers proven, refused and malformed (negative, -0.0, NaN or inf
    multipliers, nonzero multipliers on invalid constraints, NaN margins, no valid
    constraint); and the scan's reductions against numpy's on arrays with NaN, -0.0 and
    inf entries."""
    from attnsvm.svm import unit_certificate as uc

    K = active.kernels()
    rng = np.random.default_rng(41)
    cases = []
    for kind in ("planted", "random", "degenerate"):
        cs, W, lam = _unit_answers(rng, kind)
        for b in range(len(W)):
            if np.isfinite(W[b]).all():
                cases.append((cs.Delta[b], cs.Z[b], cs.valid[b], W[b], lam[b]))
    D, Z, v, W, lam = cases[0]
    for change in ("neg", "negzero", "nan", "inf", "invalid", "Wnan", "none", "W0"):
        lt, Wt, vt = lam.copy(), W.copy(), v.copy()
        k = tuple(np.argwhere(v)[0])
        off = tuple(np.argwhere(~v)[0])
        if change == "neg":
            lt[k] = -0.5
        elif change == "negzero":
            lt[k] = -0.0
        elif change == "nan":
            lt[off] = np.nan
        elif change == "inf":
            lt[k] = np.inf
        elif change == "invalid":
            lt[off] = 0.25
        elif change == "Wnan":
            Wt[0, 0] = np.nan
        elif change == "none":
            vt[:] = False
        else:
            Wt[:] = 0.0
        cases.append((D, Z, vt, Wt, lt))
    proven = 0
    with np.errstate(all="ignore"):
        for D, Z, v, W, lam in cases:
            got = uc.unit_one_core(D, Z, v, W, lam)
            ref = uc._unit_one_numpy(D, Z, v, W, lam)
            assert (got is None) == (ref is None)
            if got is None:
                continue
            proven += 1
            for f in ("lam", "m0", "v", "W", "S", "norm", "margin", "violation", "gap",
                      "lower", "wmax", "n_constraints"):
                x, y = getattr(got, f), getattr(ref, f)
                assert type(x) is type(y) and np.array_equal(_bits(x), _bits(y)), f
            assert np.array_equal(got.support(1e-6), ref.support(1e-6))
            assert np.array_equal(_bits(got.margins()), _bits(ref.margins()))
            assert _bits(got.kkt()) == _bits(ref.kkt())
            nz = np.abs(W)[W != 0]
            assert got.wmin == (nz.min() if nz.size else np.inf)
        # the scan alone: numpy's reductions, NaN / -0.0 / inf entries included
        for _ in range(200):
            n, T, d, e = rng.integers(1, 5, 4)
            D, Z, W, S = (rng.standard_normal(s) for s in ((n, T, d), (n, e), (d, e), (d, e)))
            lam, m0 = rng.standard_normal((n, T)), rng.standard_normal((n, T))
            v = rng.random((n, T)) < 0.7
            for a in (D, Z, W, S, lam, m0):
                r = rng.random(a.shape)
                a[r < 0.05] = np.nan
                a[(r > 0.05) & (r < 0.1)] = -0.0
                a[(r > 0.1) & (r < 0.13)] = -np.inf
            lam[rng.random((n, T)) < 0.5] = 0.0
            plain, wmax, zmax, dmax, margin, nv, smax, wmin = K.unit_one_scan(
                D, Z, v, W, lam, m0, S)
            clip = np.where(v, np.maximum(lam, 0.0), 0.0)
            assert plain == (np.isfinite(lam).all() and np.array_equal(_bits(clip), _bits(lam)))
            for x, a in ((wmax, W), (zmax, Z), (dmax, D), (smax, S)):
                assert _bits(x) == _bits(np.abs(a).max())
            assert _bits(margin) == _bits(np.where(v, m0, np.inf).min())
            assert nv == np.count_nonzero(v)
            nz = np.abs(W)[(W != 0) & ~np.isnan(W)]
            assert wmin == (nz.min() if nz.size else np.inf)
    assert proven > 50


def test_lean_scales_down_to_the_subnormal_range():
    """Where W maps to the caller's units near float64's underflow (tokens at ~2^s, one
    direction of them 2^-520 smaller: W_mm ~ 2^-s with a row ~ 2^(-520-s), subnormal from
    s ~ 502), the fast path answers only where W maps back exactly (every nonzero entry
    normal in the caller's units, or the round trip exact), else the engine decides: the
    same answer as the engine's (or the same NotRepresentableError) at every scale."""
    from attnsvm.svm.result import NotRepresentableError

    rng = np.random.default_rng(8)
    answered = refused = 0
    for s in range(490, 512):
        X, z, alpha, valid = instance(rng, 5, 4, 3, 3, "planted")
        X = X * 2.0 ** s
        X[:, :, 0] *= 2.0 ** -520  # (W's row 0 ~ 2^-520 of the others)
        try:
            ref = general(X, z, alpha, valid)
        except NotRepresentableError:
            ref = None
        got = lean.att_svm_lean(X, z, alpha, valid, tol=1e-6)
        if got is None:
            refused += 1
            if ref is not None:
                same(att_svm(X, z, alpha, mask=valid), ref)
            continue
        answered += 1
        assert ref is not None
        same(got, ref)
    assert answered and refused


def test_entry_points_take_the_fast_path_of_the_strategy_row(monkeypatch):
    """att_svm, att_svm_batch and prompt_svm_batch reach the compiled path through the
    Frobenius row's fields (fast_single / fast_batch and their rules), not by name: the
    row's functions are what they call, a rule that refuses (a solver the path does not
    stand for, or a row that says no) sends them to the engine, with its answer."""
    from dataclasses import replace

    from attnsvm.svm import att_svm_batch, prompt_svm_batch, strategy

    row = strategy.STRATEGIES[FRO]
    calls = []

    def single(*a, **k):
        calls.append("single")
        return row.fast_single(*a, **k)

    def batch(*a, **k):
        calls.append("batch")
        return row.fast_batch(*a, **k)

    monkeypatch.setitem(strategy.STRATEGIES, FRO, replace(row, fast_single=single,
                                                          fast_batch=batch))
    rng = np.random.default_rng(4)
    X, z, alpha, valid = instance(rng, 4, 3, 2, 2, "planted")
    assert att_svm(X, z, alpha).status_ == "optimal" and calls == ["single"]
    Xb, zb, ab, vb = batch_instance(rng, 5, 4, 3, 2, 2, "planted")
    att_svm_batch(Xb, zb, ab)
    prompt_svm_batch(Xb, None, ab)
    assert calls == ["single", "batch", "batch"]
    att_svm(X, z, alpha, solver="ipm")  # (the rule: not the active-set solver)
    att_svm_batch(Xb, zb, ab, solver="ipm")
    assert calls == ["single", "batch", "batch"]
    monkeypatch.setitem(strategy.STRATEGIES, FRO, replace(
        row, fast_single=single, fast_single_applies=lambda *a: False))
    same(att_svm(X, z, alpha), general(X, z, alpha, valid))
    assert calls == ["single", "batch", "batch"]
