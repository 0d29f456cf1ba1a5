"""The fused engine (attnsvm.fused, numba) against the torch reference path of ``train``.

Every supported model x head x loss x rule runs a few steps both ways on a small problem;
parameters and every metric must agree to 1e-12 relative. A run far past saturation
(20k NGD steps, the gradient underflows float64 after ~1e4) must agree too, and match a
50-digit mpmath gradient at its last iterate. Unsupported configurations fall back to
torch under engine="auto" and raise a ValueError naming the problem under "fused".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attnsvm import data as D
from attnsvm import fused
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.losses import logistic
from attnsvm.optim import kernel_ops
from attnsvm.train import train

pytestmark = pytest.mark.skipif(not fused.available(), reason="numba is not installed")

RTOL = 1e-12

IN_KERNEL = {
    "gd": lambda: O.gd(0.5),
    "ngd": lambda: O.ngd(0.3),
    "ngd-global": lambda: O.ngd(0.3, norm="global"),
    "ngd-relative": lambda: O.ngd(0.05, norm="global", relative=True),
    "sign": lambda: O.sign_descent(0.05),
    "sign-global": lambda: O.sign_descent(0.05, scope="global"),
    "coordinate": lambda: O.coordinate_descent(0.2),
    "nsd-l3": lambda: O.nsd("l3", lr=0.2),
    "polyak": lambda: O.polyak(0.2, max_lr=2.0),  # uncapped: test_polyak_uncapped
    "mirror3": lambda: O.mirror(3.0, lr=0.3),
    "md1.5-normalized": lambda: O.mirror(1.5, lr=0.1, normalized=True),
    "md2": lambda: O.mirror(2.0, lr=0.3),
    "md2-normalized": lambda: O.mirror(2.0, lr=0.3, normalized=True),
    "ngd-relative-per-tensor": lambda: O.ngd(0.05, relative=True),
}
TORCH_UPDATE = {  # the fused gradient feeds the torch update
    "momentum": lambda: O.momentum(0.2, beta=0.9),
    "adam": lambda: O.adam(0.05, eps=0.0),
    "spectral": lambda: O.spectral_descent(0.2),
}
LOSSES = ["logistic", "exponential", "correlation"]


def _models(d):
    rng = np.random.default_rng(5)
    Wf = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    return {
        "W": lambda trained: M.WModel(d, train_head=trained),
        "KQ": lambda trained: M.KQModel(d, m=2, reg=1e-3, train_head=trained),
        "Diag": lambda trained: M.DiagModel(d, train_head=trained),
        "Prompt": lambda trained: M.PromptModel(d, W_fixed=Wf, train_head=trained),
    }


def assert_same(tf, tt, rtol=RTOL):
    """Fused trajectory tf equals torch trajectory tt: params, metrics, stops."""
    assert tf.extra["engine"] in ("fused", "fused-gradient"), tf.extra
    assert tt.extra["engine"] == "torch"
    assert tf.steps_run == tt.steps_run
    np.testing.assert_array_equal(tf.stop_step, tt.stop_step)
    np.testing.assert_array_equal(tf.stop_reason, tt.stop_reason)
    np.testing.assert_array_equal(tf.record_steps, tt.record_steps)
    for k in tt.params:
        np.testing.assert_allclose(tf.params[k].numpy(), tt.params[k].numpy(), rtol=rtol,
                                   atol=rtol * float(tt.params[k].abs().max()), err_msg=k)
    mf, mt = tf.metrics, tt.metrics
    assert list(mf.columns) == list(mt.columns)
    for c in mt.columns:
        a, b = mf[c].to_numpy(), mt[c].to_numpy()
        if a.dtype == bool or c in ("trial", "step"):
            np.testing.assert_array_equal(a, b, err_msg=c)
            continue
        # relative, except where the value is a cancelling sum: a cosine (corr_*, terms of
        # size 1) and the risk (the correlation loss sums terms of both signs)
        atol = rtol if c.startswith("corr_") else (
            rtol * float(np.abs(b).max()) if c == "loss" else 0.0)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=c)


def _run_both(model, data, opt, steps, **kw):
    tf = train(model, data, optimizer=opt, steps=steps, engine="fused", **kw)
    tt = train(model, data, optimizer=opt, steps=steps, engine="torch", **kw)
    return tf, tt


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("mname", ["W", "KQ", "Diag", "Prompt"])
def test_every_model_head_rule_equals_torch(mname, loss):
    d = 3
    models = _models(d)
    cross = mname != "Prompt"
    data = D.random_sphere(n=3, T=4, d=d, seed=11, batch=2, cross=cross)
    for trained in (False, True):
        model = models[mname](trained)
        for rname, make in {**IN_KERNEL, **TORCH_UPDATE}.items():
            opt = make()
            tf, tt = _run_both(model, data, opt, 10, record_every=5, seed=3, scale=0.5,
                               loss=loss, references={"ref": np.eye(d) if mname != "Prompt"
                                                      else np.ones(d)})
            assert tf.extra["engine"] == ("fused" if rname in IN_KERNEL else "fused-gradient")
            try:
                assert_same(tf, tt)
            except AssertionError as exc:  # name the combination
                raise AssertionError(f"{mname} trained={trained} {loss} {rname}: {exc}") from None


def test_polyak_uncapped_within_its_conditioning():
    """Uncapped Polyak steps (c gap / |G|^2) amplify rounding by orders of magnitude per
    step on these problems; the fused run may differ from torch by no more than torch
    differs from itself after a perturbation of the start by a few ulps (x 10)."""
    d = 3
    for mname, make in _models(d).items():
        data = D.random_sphere(n=3, T=4, d=d, seed=11, batch=2, cross=mname != "Prompt")
        model = make(False)
        init = model.init(2, seed=3, scale=0.5)
        kw = dict(optimizer=O.polyak(0.1), steps=10, record_every=5)
        tf = train(model, data, init=init, engine="fused", **kw)
        tt = train(model, data, init=init, engine="torch", **kw)
        tp = train(model, data, init={k: v * (1 + 4e-16) for k, v in init.items()},
                   engine="torch", **kw)
        for k in tt.params:
            scale = float(tt.params[k].abs().max())
            diff = float((tf.params[k] - tt.params[k]).abs().max()) / scale
            cond = float((tp.params[k] - tt.params[k]).abs().max()) / scale
            assert diff <= max(RTOL, 10 * cond), (mname, k, diff, cond)


@pytest.mark.parametrize("query", ["first", "last", "seq2seq", "causal"])
def test_queries_and_masks_equal_torch(query):
    rng = np.random.default_rng(2)
    n, T, d = 3, 5, 3
    base = D.random_sphere(n=n, T=T, d=d, seed=7, batch=2, cross=False)
    mask = rng.random((2, n, T)) > 0.3
    mask[..., 0] = True
    if query == "last":
        mask[..., -1] = False  # the last valid token is not the last slot
    y = base.y if query in ("first", "last") else np.where(rng.random((2, n, T)) > 0.5, 1.0, -1.0)
    data = base.replace(mask=mask, y=y)
    for trained in (False, True):
        model = M.WModel(d, query=query, train_head=trained)
        for opt in (O.ngd(0.3), O.polyak(0.2, max_lr=2.0), O.adam(0.05)):
            tf, tt = _run_both(model, data, opt, 10, record_every=5, seed=1, scale=0.5)
            assert_same(tf, tt)


def test_far_past_saturation_equals_torch_and_mpmath():
    """5000 NGD steps of lr 2 on a planted problem (||W|| ~ 5000-8000, L - L* ~ 1e-1200): the
    plain gradient has underflowed float64 long before; both engines keep an exact
    direction and agree, and the fused scaled gradient at the last iterate matches a
    50-digit reference in direction and log scale."""
    mp = pytest.importorskip("mpmath")
    data = D.planted(n=3, T=3, d=4, seed=0, batch=2, score_gap=0.5)
    model = M.WModel(4)
    tf, tt = _run_both(model, data, O.ngd(2.0), 5000, record_every=1000, seed=0)
    assert_same(tf, tt)
    assert float(tf.metrics.log10_gap.max()) < 0 and float(tf.metrics.log10_gap.min()) < -1000
    W = tf.params["W"]
    assert tf.steps_run == 5000 and (tf.stop_reason == "").all()  # never stalled
    assert float(W.norm(dim=(1, 2)).min()) > 4000  # and kept growing (lr * steps = 10^4)
    tdata = M.prepare(data)
    G = model.evaluate({"W": W}, tdata).grads.value()["W"]
    assert float(G.abs().max()) == 0.0  # the plain gradient has underflowed
    plan = fused.Plan(model, tdata, logistic, O.ngd(0.5), Q=1, B=2, check_stall=True)
    fev = plan.evaluate({"W": W}, need_gap=True)
    mp.mp.dps = 50
    X, z, y, v = data.X, data.z, data.y, data.v
    for b in range(2):
        ref = _mp_grad(mp, X[b], z[b], y[b], v[b], W[b].numpy())
        nref = mp.sqrt(mp.fsum(x * x for x in ref))
        g = fev.grads.tensors["W"][b].numpy().ravel()
        g = g / np.linalg.norm(g)
        err = max(abs(float(ref[i] / nref) - g[i]) for i in range(len(g)))
        assert err < 1e-12, err
        # the log scale too: log |G| (fused) vs log |G| (mpmath)
        lref = float(mp.log(nref))
        lf = float(fev.grads.log_scale["W"][b]) + np.log(np.linalg.norm(
            fev.grads.tensors["W"][b].numpy()))
        assert abs(lf - lref) < 1e-9 * abs(lref), (lf, lref)


def _mp_grad(mp, X, z, y, v, W, loss="logistic"):
    """dL/dW of L = mean_i loss(y_i v^T X_i^T softmax(X_i W z_i)), in mpmath (logistic or
    exponential loss).

    dL/da_t = loss'(f) s_t (c_t - f) with c_t - f written as (c_t - c_k) - sum_u s_u (c_u - c_k)
    (an identity; k any index): past saturation f and c_k agree to thousands of digits,
    so c_t - f itself would need that many."""
    n, T, d = X.shape
    G = [mp.mpf(0)] * (d * d)
    for i in range(n):
        wz = [mp.fsum(mp.mpf(W[j, l]) * mp.mpf(z[i, l]) for l in range(d)) for j in range(d)]
        a = [mp.fsum(mp.mpf(X[i, t, j]) * wz[j] for j in range(d)) for t in range(T)]
        mx = max(a)
        e = [mp.exp(at - mx) for at in a]
        se = mp.fsum(e)
        s = [et / se for et in e]
        c = [mp.mpf(y[i]) * mp.fsum(mp.mpf(v[j]) * mp.mpf(X[i, t, j]) for j in range(d))
             for t in range(T)]
        k = a.index(mx)
        dev = mp.fsum(s[u] * (c[u] - c[k]) for u in range(T))  # f - c_k
        f = c[k] + dev
        # d/df of log(1 + e^{-f}) / n, of e^{-f} / n
        lp = -1 / (1 + mp.exp(f)) / n if loss == "logistic" else -mp.exp(-f) / n
        for t in range(T):
            ga = lp * s[t] * ((c[t] - c[k]) - dev)
            for j in range(d):
                for l in range(d):
                    G[j * d + l] += ga * mp.mpf(X[i, t, j]) * mp.mpf(z[i, l])
    return G


def _mp_log_lam_top(mp, X, z, y, v, W, loss):
    """max_i log lam_i, lam_i = w_i (-loss'(f_i)) s_j,i (w_i = 1/n, f_i the margin, s_j,i
    the second-largest attention of sequence i) in mpmath: what the fused kernel's choice
    between its linear and log-domain row factors reads (kernels.PLAIN_MIN / PLAIN_MAX)."""
    n, T, d = X.shape
    top = -mp.inf
    for i in range(n):
        a = [mp.fsum(mp.mpf(X[i, t, j]) * mp.fsum(mp.mpf(W[j, l]) * mp.mpf(z[i, l])
                                                   for l in range(d)) for j in range(d))
             for t in range(T)]
        lse = max(a) + mp.log(mp.fsum(mp.exp(at - max(a)) for at in a))
        ls_j = sorted(a)[-2] - lse
        f = mp.fsum(mp.exp(a[t] - lse) * mp.mpf(y[i]) * mp.fsum(
            mp.mpf(v[j]) * mp.mpf(X[i, t, j]) for j in range(d)) for t in range(T))
        lnd = -mp.log(1 + mp.exp(f)) if loss == "logistic" else -f
        top = max(top, -mp.log(n) + lnd + ls_j)
    return top


def _assert_fused_grad_exact(mp, data, W, loss):
    """The fused scaled gradient at W (unbatched (d, d)) equals the torch reference path's
    and a 50-digit mpmath gradient: direction to 1e-12, log |G| to 1e-12 relative."""
    from attnsvm.losses import LOSSES

    d = W.shape[0]
    model = M.WModel(d)
    tdata = M.prepare(data)
    Wt = torch.as_tensor(W)[None]
    plan = fused.Plan(model, tdata, LOSSES[loss], O.ngd(0.1), Q=1, B=1, check_stall=True)
    gf = plan.evaluate({"W": Wt}, need_gap=False).grads
    gt = model.evaluate({"W": Wt}, tdata, loss=loss, need_gap=False).grads
    ref = _mp_grad(mp, data.X, data.z, data.y, data.v, W, loss)
    nref = mp.sqrt(mp.fsum(x * x for x in ref))
    uref = np.array([float(x / nref) for x in ref])
    lref = float(mp.log(nref))
    for g in (gf, gt):
        t = g.tensors["W"][0].numpy().ravel()
        lg = float(g.log_scale["W"][0]) + np.log(np.linalg.norm(t))
        assert np.abs(t / np.linalg.norm(t) - uref).max() < 1e-12
        assert abs(lg - lref) <= 1e-12 * max(1.0, abs(lref)), (lg, lref)


def _bisect(fn, lo, hi, iters=60):
    """x in [lo, hi] with fn(x) = 0, fn(lo) > 0 > fn(hi) (geometric bisection)."""
    assert fn(lo) > 0 > fn(hi)
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if fn(mid) > 0 else (lo, mid)
    return (lo * hi) ** 0.5


@pytest.mark.parametrize("loss", ["logistic", "exponential"])
def test_row_factor_regimes_at_the_switch_equal_torch_and_mpmath(loss):
    """Along W = alpha W0 the softmax saturates and the largest row factor lam falls
    through kernels.PLAIN_MIN = 2^-900 at alpha*: there the kernel leaves its linear row
    factors for the log domain. Right at the switch (alpha* (1 +- 1e-12), 1 +- 1e-6),
    well inside each regime and deep in saturation (lam ~ e^-6000, the plain gradient
    underflows), the fused gradient equals torch's and mpmath's."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    K = fused._kernels()
    data = D.planted(n=3, T=4, d=4, seed=0, score_gap=0.5)
    W0 = train(M.WModel(4), data, optimizer=O.ngd(0.5), steps=300, seed=0,
               engine="torch").params["W"][0].numpy()
    W0 = W0 / np.linalg.norm(W0)
    lmin = float(mp.log(K.PLAIN_MIN))

    def gap(alpha):
        return float(_mp_log_lam_top(mp, data.X, data.z, data.y, data.v, alpha * W0, loss)) - lmin

    a_star = _bisect(gap, 1.0, 1e5)
    assert abs(gap(a_star)) < 1e-6
    seen = set()
    for f in (1 - 1e-6, 1 - 1e-12, 1.0, 1 + 1e-12, 1 + 1e-6, 0.01, 0.5, 2.0, 10.0):
        alpha = a_star * f
        seen.add(gap(alpha) > 0)
        _assert_fused_grad_exact(mp, data, alpha * W0, loss)
    assert seen == {True, False}  # both regimes were exercised


def test_row_factor_overflow_switch_equals_torch_and_mpmath():
    """The exponential loss at large negative margins (labels flipped, head scaled by c):
    -loss'(f) = e^-f grows past kernels.PLAIN_MAX = 2^900 and the kernel takes the log
    domain; around that switch and beyond (lam ~ e^5000, finite only in log form) the
    fused gradient equals torch's and mpmath's."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    K = fused._kernels()
    base = D.planted(n=3, T=4, d=4, seed=1, score_gap=0.5)
    W = 0.7 * np.eye(4)
    lmax = float(mp.log(K.PLAIN_MAX))

    def data_at(c):
        return base.replace(y=-base.y, v=c * base.v)

    def gap(c):
        dat = data_at(c)
        return lmax - float(_mp_log_lam_top(mp, dat.X, dat.z, dat.y, dat.v, W, "exponential"))

    c_star = _bisect(gap, 1.0, 1e5)
    seen = set()
    for f in (1 - 1e-6, 1 - 1e-12, 1.0, 1 + 1e-12, 1 + 1e-6, 0.1, 8.0):
        seen.add(gap(c_star * f) > 0)
        _assert_fused_grad_exact(mp, data_at(c_star * f), W, "exponential")
    assert seen == {True, False}


def test_deterministic_and_thread_independent():
    data = D.random_sphere(n=4, T=5, d=6, seed=3, batch=16)
    model = M.KQModel(6, m=3)
    runs = []
    old = torch.get_num_threads()
    for threads in (1, 3, 2, 1):  # slices of 16, 6 / 5 / 5, 8 / 8 trials
        torch.set_num_threads(threads)
        try:
            runs.append(train(model, data, optimizer=O.ngd(0.2), steps=200, engine="fused"))
        finally:
            torch.set_num_threads(old)
    for r in runs[1:]:
        for k in r.params:
            assert torch.equal(r.params[k], runs[0].params[k])
        pd.testing.assert_frame_equal(r.metrics, runs[0].metrics, check_exact=True)


def test_kernel_threads_setting_is_local_and_results_independent(monkeypatch):
    """kernel_threads(n) sets the pool size for this thread only (another thread keeps the
    default), NUMBA_NUM_THREADS is read, torch's thread count is left alone, and the fused
    run is bit-identical on 1, 3 and 2 kernel threads."""
    import threading

    import attnsvm
    from attnsvm import _parallel as P

    assert attnsvm.kernel_threads is P.kernel_threads
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    old = torch.get_num_threads()
    base = P.n_threads()
    assert base == max(1, min(P.cpu_count(), old))
    seen = {}
    with P.kernel_threads(3):
        assert P.n_threads() == 3
        th = threading.Thread(target=lambda: seen.setdefault("other", P.n_threads()))
        th.start()
        th.join()
    assert seen["other"] == base and P.n_threads() == base
    monkeypatch.setenv("NUMBA_NUM_THREADS", "5")
    assert P.n_threads() == 5
    with P.kernel_threads(2):  # the context's setting first
        assert P.n_threads() == 2
    monkeypatch.setenv("NUMBA_NUM_THREADS", "zero")
    with pytest.raises(ValueError, match="NUMBA_NUM_THREADS"):
        P.n_threads()
    monkeypatch.delenv("NUMBA_NUM_THREADS")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            with P.kernel_threads(bad):
                pass
    data = D.random_sphere(n=4, T=5, d=6, seed=3, batch=16)
    runs = []
    for nt in (1, 3, 2):
        with P.kernel_threads(nt):
            runs.append(train(M.WModel(6), data, optimizer=O.ngd(0.2), steps=60, engine="fused",
                              record_every=7))
    assert torch.get_num_threads() == old
    for r in runs[1:]:
        assert torch.equal(r.params["W"], runs[0].params["W"])
        pd.testing.assert_frame_equal(r.metrics, runs[0].metrics, check_exact=True)


def test_stop_reasons_equal_torch():
    """Zero gradient (a trial whose data make every score equal), a step below the
    resolution of W (GD with a tiny lr), non-finite steps (a huge lr overflows)."""
    data = D.random_sphere(n=3, T=4, d=3, seed=4, batch=3)
    X = data.X.copy()
    X[1] = X[1, :, :1, :]  # trial 1: all tokens of a sequence equal -> zero gradient
    data = data.replace(X=X)
    model = M.WModel(3)
    for opt in (O.gd(1e-30), O.ngd(1e305), O.ngd(0.1)):
        tf, tt = _run_both(model, data, opt, 20, record_every=3, scale=0.5)
        assert_same(tf, tt)
        assert (tf.stop_reason != "").any()
    # every trial stops on a zero gradient at step 0: the run ends at 0 (torch semantics)
    same = data.replace(X=np.broadcast_to(X[1], X.shape).copy())
    tf, tt = _run_both(model, same, O.ngd(0.1), 20)
    assert_same(tf, tt)
    assert tf.steps_run == 0


def test_auto_falls_back_and_fused_refuses():
    data = D.random_sphere(n=3, T=4, d=3, seed=4, batch=2)
    cases = [
        (M.WModel(3, head="relu", head_width=2, train_head=True), {}, "head 'relu'"),
        (M.WModel(3), {"loss": lambda u: torch.log1p(torch.exp(-u))}, "loss"),
        (M.WModel(3), {"autograd": True}, "autograd"),
        (M.WModel(3), {"optimizer": O.sgd(0.1, batch_size=2)}, "mini-batches"),
        (M.WModel(3), {"dtype": torch.float32}, "dtype"),
    ]
    for model, kw, what in cases:
        ta = train(model, data, steps=3, engine="auto", **kw)
        assert ta.extra["engine"] == "torch"
        tt = train(model, data, steps=3, engine="torch", **kw)
        for k in tt.params:
            assert torch.equal(ta.params[k], tt.params[k])
        with pytest.raises(ValueError, match=what):
            train(model, data, steps=3, engine="fused", **kw)
    with pytest.raises(ValueError, match="engine must be one of"):
        train(M.WModel(3), data, steps=3, engine="numba")
    assert train(M.WModel(3), data, steps=3).extra["engine"] == "fused"


def test_unsupported_without_numba(monkeypatch):
    monkeypatch.setattr(fused._kernels, "module", None)
    monkeypatch.setattr(fused._kernels, "error", ImportError("No module named 'numba'"))
    data = D.random_sphere(n=3, T=4, d=3, seed=4, batch=2)
    assert train(M.WModel(3), data, steps=3).extra["engine"] == "torch"
    with pytest.raises(ValueError, match="numba is not importable"):
        train(M.WModel(3), data, steps=3, engine="fused")


# ------------------------------------------- dispatch by the data the transforms carry
def test_every_kernel_program_is_held_to_torch():
    """Each step loop of the kernel (fused.PROGRAMS: a sequence of opcodes) is run by at least
    one rule of IN_KERNEL, which test_every_model_head_rule_equals_torch holds to torch."""
    seen = {tuple(int(k.op) for k in make().kernel) for make in IN_KERNEL.values()}
    assert set(fused.PROGRAMS) <= seen, set(fused.PROGRAMS) - seen
    for name, make in IN_KERNEL.items():
        assert fused.program(make()) is not None, name


def test_renamed_and_new_rules_of_accelerated_parts_run_fused():
    """The engine reads Optimizer.kernel, never a name: a renamed rule, and a rule chained
    anew from accelerated transforms (sign descent written by hand, a relative l_3 step),
    run inside the kernel and equal torch; the same parts in an order no step loop runs, or
    with one part that has no counterpart, take the fused gradient and equal torch too."""
    data = D.random_sphere(n=3, T=4, d=3, seed=2, batch=2)
    model = M.WModel(3)
    renamed = O.ngd(0.3)._replace(name="my_ngd", hyper={})
    by_hand = O.rule("handmade_sign", {"lr": 0.05}, O.scale_by_sign(), O.scale_by_learning_rate(0.05))
    rel_l3 = O.rule("rel_l3", {}, O.scale_by_steepest("l3"), O.scale_by_param_norm("l3"),
                    O.scale_by_learning_rate(0.02))
    reordered = O.rule("lr_first", {}, O.scale_by_learning_rate(0.3), O.scale_by_steepest("fro"))
    mixed = O.rule("sign_trace", {}, O.scale_by_sign(), O.trace(0.5), O.scale_by_learning_rate(0.05))
    for opt, engine in [(renamed, "fused"), (by_hand, "fused"), (rel_l3, "fused"),
                        (reordered, "fused-gradient"), (mixed, "fused-gradient")]:
        tf, tt = _run_both(model, data, opt, 12, record_every=4, seed=1, scale=0.5)
        assert tf.extra["engine"] == engine, opt.name
        assert_same(tf, tt)
    # the hand-made sign rule is the registered one, step for step
    ta = train(model, data, optimizer=by_hand, steps=12, seed=1, scale=0.5)
    tb = train(model, data, optimizer=O.sign_descent(0.05), steps=12, seed=1, scale=0.5)
    assert torch.equal(ta.params["W"], tb.params["W"])


@pytest.mark.parametrize("mname", ["W", "Diag", "Prompt"])
def test_polyak_range_cap_equals_torch(mname):
    """Start in the flat region (attention saturated on random tokens: L - L* = O(1),
    ||G|| ~ e^-1e3), where every Polyak length leaves float64: each step takes the range cap,
    in the kernel as in torch, counted the same; near 2^40 the capped steps are scaled
    back onto the ball."""
    d = 3
    data = D.random_sphere(n=3, T=4, d=d, seed=5, batch=2, cross=mname != "Prompt")
    model = _models(d)[mname](False)
    init = model.init(2, seed=3, scale=1.0)
    for size in (1e3, 0.9 * kernel_ops.PARAM_MAX ** (0.5 if mname == "Diag" else 1.0)):
        start = {k: v * (size / float(v.abs().max())) for k, v in init.items()}
        tf, tt = _run_both(model, data, O.polyak(1.0), 40, record_every=10, init=start)
        assert tf.extra["engine"] == "fused"
        assert_same(tf, tt)
        assert torch.equal(tf.state["polyak_capped"], tt.state["polyak_capped"])
        assert (tt.state["polyak_capped"] > 0).all() and not tt.stopped.any()
        norm = torch.stack([v.reshape(2, -1).norm(dim=1) for v in tt.params.values()]).norm(dim=0)
        assert (norm <= kernel_ops.PARAM_MAX * (1 + 1e-12)).all()


# ------------------------------------------------------------ records inside the kernel
def _kernel_vs_recorder(model, data, opt, steps, **kw):
    """The same fused run with its records taken inside the kernel (the default) and by the
    recorder between segments (record_params=True keeps the segment path): the same
    records, every metric to 1e-12 relative (assert_same's tolerances), the same stops."""
    tk = train(model, data, optimizer=opt, steps=steps, engine="fused", **kw)
    ts = train(model, data, optimizer=opt, steps=steps, engine="fused", record_params=True, **kw)
    assert tk.extra == {"engine": "fused", "engine_reason": None, "records": "kernel"}, tk.extra
    assert ts.extra["records"].startswith("segments (record_params"), ts.extra
    ts.extra["engine"] = "torch"  # (assert_same's labels: the recorder is the reference)
    assert_same(tk, ts)
    for k in tk.params:
        assert torch.equal(tk.params[k], ts.params[k])  # the records do not touch the run
    return tk


def test_records_in_kernel_equal_the_recorder_every_model_and_rule():
    """Every compiled model x head x rule, with p_sel (alpha: opt), a shared and a per-trial
    reference (corr_*), KQ's nuclear norm, a stride that does not divide the run."""
    d = 3
    data = D.random_sphere(n=3, T=4, d=d, seed=11, batch=2)
    rng = np.random.default_rng(0)
    for mname, make in _models(d).items():
        shp = (d,) if mname == "Prompt" else (d, d)
        refs = {"eye": np.ones(d) if mname == "Prompt" else np.eye(d),
                "each": rng.standard_normal((2, *shp))}
        dd = data if mname != "Prompt" else D.random_sphere(n=3, T=4, d=d, seed=11, batch=2,
                                                            cross=False)
        for trained in (False, True):
            for rname, mk in IN_KERNEL.items():
                try:
                    _kernel_vs_recorder(make(trained), dd, mk(), 11, record_every=4, seed=3,
                                        scale=0.5, references=refs)
                except AssertionError as exc:
                    raise AssertionError(f"{mname} trained={trained} {rname}: {exc}") from None


def test_records_in_kernel_past_saturation_and_at_stops():
    """A run far past saturation (L - L* ~ 1e-1200, p_sel -> 1 and the gap in the log
    domain), every-step records; runs whose trials stop (zero gradient at step 0 on one
    trial, a step below the resolution of W, an overflowing step): the stopped trials'
    later records hold their frozen parameters, as the recorder's."""
    data = D.planted(n=3, T=3, d=4, seed=0, batch=2, score_gap=0.5)
    tk = _kernel_vs_recorder(M.WModel(4), data, O.ngd(2.0), 3000, record_every=500, seed=0,
                             references={"eye": np.eye(4)})
    assert float(tk.metrics.log10_gap.min()) < -500
    _kernel_vs_recorder(M.KQModel(4, m=2), data, O.ngd(0.5), 30, record_every=1, seed=0)
    sd = D.random_sphere(n=3, T=4, d=3, seed=4, batch=3)
    X = sd.X.copy()
    X[1] = X[1, :, :1, :]  # trial 1: a zero gradient at step 0
    sd = sd.replace(X=X)
    for opt in (O.gd(1e-30), O.ngd(1e305), O.ngd(0.1)):
        tk = _kernel_vs_recorder(M.WModel(3), sd, opt, 20, record_every=3, scale=0.5)
        assert tk.stopped.any()


def test_records_in_kernel_run_in_one_segment(monkeypatch):
    """A default fused run calls the kernel once, whatever its stride; the recorder's
    per-segment record is never called."""
    from attnsvm import recorder

    calls = []
    real = fused.Plan.run
    monkeypatch.setattr(fused.Plan, "run", lambda self, *a, **k: calls.append(a[:2]) or
                        real(self, *a, **k))
    monkeypatch.setattr(recorder.Recorder, "record", lambda *a, **k: pytest.fail("recorded"))
    data = D.random_sphere(n=3, T=4, d=3, seed=1, batch=4)
    tr = train(M.WModel(3), data, steps=40, record_every=1)
    assert calls == [(0, 40)] and list(tr.record_steps) == list(range(41))
    # with a progress bar: one call per stride, the same records; in chunks: the same
    calls.clear()
    tp = train(M.WModel(3), data, steps=40, record_every=15, progress=True)
    assert calls == [(0, 15), (15, 30), (30, 40)]
    for other in (train(M.WModel(3), data, steps=40, record_every=15),
                  train(M.WModel(3), data, steps=40, record_every=15, chunk=3)):
        pd.testing.assert_frame_equal(tp.metrics, other.metrics, check_exact=True)
        assert other.extra["records"] == "kernel"


@pytest.mark.parametrize("mname", ["W", "KQ", "Diag", "Prompt"])
def test_own_initial_parameters_become_the_slots_bit_for_bit(mname):
    """A run's own initial tensors (init="random") become the kernel's slots, uncopied
    (memory: train_memory's "fused"); the same start given as the caller's dict is copied
    and left unwritten. Both runs equal bit for bit, in the kernel's records and in the
    torch recorder's (record_params=True), with stops (trial 1: a zero gradient where
    nothing else moves: Diag, Prompt; W trains its head, KQ has a ridge term)."""
    data = D.random_sphere(n=3, T=4, d=4, seed=2, batch=5)
    X = data.X.copy()
    X[1] = X[1, :, :1, :]
    data = data.replace(X=X)
    model = _models(4)[mname](mname == "W")
    start = model.init(5, seed=7, scale=0.5)
    given = {k: v.clone() for k, v in start.items()}
    for kw in ({}, {"record_params": True}):
        own = train(model, data, optimizer=O.ngd(0.3), steps=30, record_every=7, seed=7,
                    scale=0.5, engine="fused", **kw)
        cp = train(model, data, optimizer=O.ngd(0.3), steps=30, record_every=7,
                   init=given, engine="fused", **kw)
        assert own.extra["engine"] == cp.extra["engine"] == "fused"
        assert own.stop_reason[1] == ("zero gradient" if mname in ("Diag", "Prompt") else "")
        np.testing.assert_array_equal(own.stop_step, cp.stop_step)
        for k in start:
            assert torch.equal(own.params[k], cp.params[k])
            assert torch.equal(given[k], start[k])  # the caller's arrays are not written
        pd.testing.assert_frame_equal(own.metrics, cp.metrics, check_exact=True)
        np.testing.assert_array_equal(own.W, cp.W)


def test_plan_load_adopts_only_its_own_unshared_tensors():
    """Plan.load(own=True) takes a float64 C-contiguous CPU tensor as its slot (shared
    memory); a caller's tensor (own=False), a non-contiguous one or two parameters sharing
    memory are copied (the kernel writes its slots)."""
    from attnsvm.losses import get_loss
    from attnsvm.models import prepare

    model = M.KQModel(3)
    tdata = prepare(D.random_sphere(n=2, T=3, d=3, seed=0, batch=2))
    plan = fused.Plan(model, tdata, get_loss("logistic"), O.ngd(0.1), 1, 2, check_stall=True)
    p = model.init(2, seed=1)
    views = plan.load(p, own=True)
    assert all(np.shares_memory(views[k].numpy(), p[k].numpy()) for k in p)
    for q, own, kept in ((p, False, ()), ({"K": p["K"], "Q": p["K"]}, True, ()),
                         ({"K": p["K"].transpose(1, 2), "Q": p["Q"]}, True, ("Q",))):
        views = plan.load(q, own=own)
        for k in q:
            assert np.shares_memory(views[k].numpy(), q[k].numpy()) == (k in kept)
            assert torch.equal(views[k], q[k])


@pytest.mark.parametrize("engine", ["fused", "torch"])
def test_start_check_in_row_chunks_refuses_a_non_finite_gradient(engine):
    """The start's gradient, checked a row chunk at a time and not kept (the fused
    engine): a trial of the last chunk whose gradient overflows float64 (logits and loss
    finite) is refused before any step, as the torch engine refuses it."""
    from attnsvm.steppers import row_chunks

    B, d = 1100, 32
    model = M.WModel(d)
    assert len(row_chunks(model.init(B))) > 1  # the row-chunked path runs
    data = D.random_sphere(n=2, T=3, d=d, seed=0, batch=B)
    X = data.X.copy()
    X[B - 1] *= 1e300
    with pytest.raises(ValueError, match="not finite at the start.*rescale X"):
        train(model, data.replace(X=X), optimizer=O.ngd(0.1), steps=2, engine=engine)
    ok = train(model, data, optimizer=O.ngd(0.1), steps=2, engine=engine)
    assert ok.extra["engine"] == engine


@pytest.mark.parametrize("mname", ["W", "Prompt"])
def test_start_check_chunks_leave_the_run_bit_for_bit(mname, monkeypatch):
    """The fused start's row chunks (sized by the objective's temporaries, their
    gradients checked and let go) change nothing in the trajectory: the same run with
    the start in one batch is equal bit for bit (records in the kernel and in the torch
    recorder)."""
    import attnsvm.train as T

    B, d = 1200, 32
    data = D.random_sphere(n=6, T=8, d=d, seed=4, batch=B)
    model = getattr(M, mname + "Model")(d)
    seen = []
    real = T.row_chunks
    monkeypatch.setattr(T, "row_chunks", lambda p: seen.append(len(real(p))) or real(p))
    for kw in ({}, {"record_params": True}):
        seen.clear()
        tr = train(model, data, optimizer=O.ngd(0.3), steps=6, record_every=3, engine="fused", **kw)
        assert max(seen) > 1 or kw  # the start ran in row chunks (Prompt: with the records
        # in the kernel only; the torch recorder's step 0 takes the chunks of the parameters)
        with monkeypatch.context() as m:
            m.setattr(T, "row_chunks", lambda p: [(0, B)])
            one = train(model, data, optimizer=O.ngd(0.3), steps=6, record_every=3,
                        engine="fused", **kw)
        for k in tr.params:
            assert torch.equal(tr.params[k], one.params[k])
        if not kw:  # the kernel's records (the torch recorder's step 0: 1e-15, BLAS blocking)
            pd.testing.assert_frame_equal(tr.metrics, one.metrics, check_exact=True)
