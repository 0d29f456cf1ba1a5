"""Runs that never stall silently (issue 11 §2): long runs past saturation keep an exact
direction, trials that must stop say why, and train() validates its arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.svm import att_svm
from attnsvm.train import train


@pytest.fixture(scope="module")
def planted():
    data = D.planted(n=4, T=4, d=17, seed=0)
    return data, att_svm(data.X, data.z, data.opt).W_


@pytest.mark.slow
def test_ngd_1e5_steps_keeps_moving_and_never_loses_direction(planted):
    """1e5 NGD steps past saturation: before the scaled gradient the gradient underflowed to
    exactly 0 after ~10^4 steps and the run froze. Now ||W|| keeps growing like lr t, no trial
    stops, L - L* is resolved in the log domain (~1e-310, below the smallest float64), and
    corr(W, W_mm) never falls more than 1e-6 below its running peak."""
    data, W_mm = planted
    steps, lr = 100_000, 0.01
    tr = train(M.WModel(17), data, optimizer=O.ngd(lr), steps=steps, init="zero",
               record_every=1000, references={"mm": W_mm})
    m = tr.metrics
    assert tr.steps_run == steps and not tr.stopped.any()
    assert m["norm"].iloc[-1] > 0.99 * lr * steps
    corr = m["corr_mm"].to_numpy()[1:]
    assert np.all(corr >= np.maximum.accumulate(corr) - 1e-6)
    assert corr[-1] > 0.9999
    assert m["log10_gap"].iloc[-1] < -300 and np.isfinite(m["log10_gap"].iloc[-1])
    assert m["loss_gap"].iloc[-1] < 1e-300  # subnormal or 0: only the log keeps its digits


@pytest.mark.parametrize("opt", [O.polyak(0.5), O.ngd(0.1, norm="global")], ids=["polyak", "ngd-global"])
def test_polyak_and_global_ngd_move_past_the_old_freeze(planted, opt):
    """Polyak froze at step ~400 and ngd(norm="global") at ~5,100 (global_norm underflowed to
    0 while max|G| ~ 1e-163), without the trials being marked stopped."""
    data, W_mm = planted
    tr = train(M.WModel(17), data, optimizer=opt, steps=8000, init="zero", record_every=1000,
               references={"mm": W_mm}, record_params=True)
    assert tr.steps_run == 8000 and not tr.stopped.any()
    W = tr.param_history["W"][:, 0]
    moved = np.abs(W[1:] - W[:-1]).reshape(len(W) - 1, -1).max(1)
    assert (moved > 0).all()  # still moving in every recorded interval, the last included
    assert tr.metrics["log10_gap"].iloc[-1] < -200  # |G| ~ 1e-200: its square underflows
    assert tr.metrics["corr_mm"].iloc[-1] > 0.999


def test_exponential_loss_gradient_flow_does_not_freeze():
    """kqflow-diag seed 4 froze at L - L* ~ 1e-164 (the exponential loss underflowed and the
    gradient became exactly 0). The relative-step flow now keeps going."""
    data = D.random_sphere(n=3, T=3, d=8, seed=4)
    model = M.DiagModel(8)
    init = {"k": np.full(8, 0.01), "q": np.zeros(8)}
    tr = train(model, data, loss="exponential", optimizer=O.ngd(0.01, norm="global", relative=True),
               steps=4000, init=init, record_every=500)
    m = tr.metrics
    assert not tr.stopped.any() and tr.steps_run == 4000
    assert m["log10_gap"].iloc[-1] < -170  # past the old freeze, still resolved
    assert m["norm"].is_monotonic_increasing


def test_a_trial_with_no_gradient_stops_with_its_reason():
    good = D.random_sphere(n=3, T=4, d=3, seed=0)
    same = np.repeat(good.X[:, :1], 4, axis=1)  # identical tokens: the gradient is exactly 0
    data = D.TokenData(X=np.stack([good.X, same]), y=np.stack([good.y] * 2),
                       z=np.stack([good.z] * 2), v=np.stack([good.v] * 2))
    tr = train(M.WModel(3), data, optimizer=O.ngd(0.1), steps=50)
    assert list(tr.stop_reason) == ["", "zero gradient"] and list(tr.stop_step) == [-1, 0]
    assert tr.stops.stop_reason.tolist() == ["", "zero gradient"]
    assert "1 zero gradient" in repr(tr)


def test_gd_step_below_float64_resolution_is_marked():
    """GD with a step far below the resolution of W cannot move: marked, not silent."""
    data = D.random_sphere(n=3, T=4, d=3, seed=0)
    tr = train(M.WModel(3), data, optimizer=O.gd(1e-30), steps=10, init="random", scale=1.0)
    assert list(tr.stop_reason) == ["no change in float64"] and tr.steps_run == 1


def test_norm_metric_is_scale_safe():
    data = D.random_sphere(n=3, T=4, d=6, seed=0)
    model = M.WModel(6)
    big = {"W": 1e160 * torch.eye(6, dtype=torch.float64)[None]}
    assert float(model.norms(big)["norm"][0]) == pytest.approx(np.sqrt(6) * 1e160, rel=1e-14)
    tr = train(model, data, optimizer=O.gd(1e-3), steps=0, init={"W": 1e160 * np.eye(6)})
    assert tr.metrics["norm"].iloc[0] == pytest.approx(2.449489742783178e160, rel=1e-14)


def test_data_at_1e300_is_a_clear_error():
    data = D.random_sphere(n=3, T=4, d=3, seed=0)
    huge = data.replace(X=data.X * 1e300)
    with pytest.raises(ValueError, match="overflow float64.*rescale X"):
        train(M.WModel(3), huge, optimizer=O.ngd(0.1), steps=5)
    # a large but representable scale trains, with finite metrics (the gap is ~1e98 here:
    # the scores y v^T x are ~1e99, the gap from the cancellation-free log form)
    ok = train(M.WModel(3), data.replace(X=data.X * 1e100, z=data.z * 1e-100), steps=20)
    assert np.isfinite(ok.metrics.drop(columns=["trial", "step", "stopped"]).to_numpy()).all()
    assert ok.metrics.loss_gap.iloc[0] > 1e97


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(steps=10.0), "steps must be an integer >= 0; got the float 10.0"),
        (dict(steps=True), "steps must be an integer"),
        (dict(B=0), "B must be an integer >= 1"),
        (dict(seed=-1), r"seed must be an integer in \[0, 2\*\*63 - 1\]; got -1"),
        (dict(scale=float("nan")), "scale must be a finite number > 0"),
        (dict(init={"W": np.full((3, 3), np.nan)}), r"init\['W'\] contains NaN or inf"),
        (dict(init={"W": "zeros"}), r"init\['W'\] must be a numeric array"),
        (dict(references={"mm": np.zeros((4, 4))}), r"references\['mm'\] must have shape \(3, 3\)"),
        (dict(references={"mm": np.full((3, 3), np.inf)}), r"references\['mm'\] contains NaN"),
        (dict(device="cuda:7" if torch.cuda.is_available() else "cuda"), "device 'cuda"),
        (dict(device="tpu"), "device 'tpu' is not a torch device"),
        (dict(optimizer="adamx"), "unknown optimizer 'adamx'"),
        (dict(alpha=np.zeros(4, dtype=float)), "alpha must hold integer token indices"),
        (dict(batch_size=2.5), "batch_size must be an integer"),
    ],
)
def test_train_validates_its_arguments(kw, match):
    data = D.random_sphere(n=4, T=5, d=3, seed=0)
    with pytest.raises(ValueError, match=match):
        train(M.WModel(3), data, **{"steps": 3, **kw})


def test_train_refuses_a_model_of_another_dimension():
    with pytest.raises(ValueError, match="the model has d = 4 but the data has d = 3"):
        train(M.WModel(4), D.random_sphere(n=4, T=5, d=3), steps=1)
    with pytest.raises(ValueError, match="d must be a positive integer"):
        M.WModel(0)


def test_an_overflowing_product_KQ_stops_the_trial_cleanly():
    """K, Q finite but W = K Q^T overflowing used to crash the metrics (svdvals of inf)."""
    data = D.random_sphere(n=3, T=4, d=3, seed=0)
    model = M.KQModel(3, reg=0.0)
    big = np.full((3, 3), 1e153)  # W = K Q^T ~ 3e306, finite; a few relative steps overflow it
    tr = train(model, data, optimizer=O.ngd(0.5, norm="global", relative=True), steps=50,
               init={"K": big, "Q": big}, record_every=10)
    assert list(tr.stop_reason) == ["non-finite step"] and tr.stop_step[0] >= 0
    with pytest.raises(ValueError, match="initial parameters overflow"):
        train(model, data, steps=1, init={"K": 100 * big, "Q": 100 * big})
    assert np.isfinite(tr.W).all()
    assert np.isfinite(tr.metrics.drop(columns=["trial", "step", "stopped"]).to_numpy()).all()


# ------------------------------------------------- Polyak: overshoot and its range cap
def _polyak_population(B, steps, seed=0):
    from attnsvm.tokens import outcome

    data = D.random_sphere(seed=seed, batch=B)  # n = 6, T = 8, d = 10, cross-attention
    tr = train(M.WModel(10), data, optimizer=O.polyak(1.0), steps=steps, B=B, seed=seed,
               record_every=steps)
    out = outcome(tr.W, data.X, data.y, data.v, data.z)
    out["capped"] = tr.state["polyak_capped"].numpy()
    out["norm"] = tr.metrics.groupby("trial")["norm"].last().to_numpy()
    out["stop_reason"] = tr.stop_reason
    return tr, out


def test_polyak_issue_runs_no_longer_stop_on_a_non_finite_step():
    """Issue 25: on random_sphere(seed=0, batch=8) with c = 1, trials 0, 4 and 7 overshot to
    ||W|| ~ 1e4-1e7 within 20 steps and stopped at steps 11-18 ("non-finite step": the
    next Polyak length, e^{margin ||W||}, left float64). They now take the recorded range
    cap and keep running; the other five never take it."""
    tr, out = _polyak_population(8, 300)
    assert tr.steps_run == 300 and not tr.stopped.any()
    assert np.flatnonzero(out["capped"].to_numpy()).tolist() == [0, 4, 7]
    assert (out["norm"].to_numpy()[[0, 4, 7]] > 1e6).all()


@pytest.mark.slow
def test_polyak_population_1e5_steps_no_trial_ends_on_a_non_finite_step(capsys):
    """64 random datasets (n = 6, T = 8, d = 10, cross-attention, logistic loss), Polyak with
    c = 1, 1e5 steps (fused engine, ~35 s). No trial stops. Trials that never take the
    range cap reach the GMM (corr 1.0000); capped trials (the early overshoot of the
    Polyak step, docs/theory.md §6.3) end on a locally optimal selection and, when it is
    not the optimal one, aligned with its SVM (corr > 0.999). corr with the SVM of the
    reached tokens is printed per trial."""
    tr, out = _polyak_population(64, 100_000)
    with capsys.disabled():
        print("\nPolyak c = 1, 1e5 steps, random_sphere(seed=0, batch=64): per trial")
        print(out[["outcome", "corr_lmm", "corr_gmm", "alpha_is_opt", "capped", "norm",
                   "stop_reason"]].to_string())
    assert not tr.stopped.any() and (tr.stop_reason == "").all()
    assert (out["p_sel_mean"] > 0.99).all() and out["locally_optimal"].all()
    free = out["capped"] == 0
    assert (out.loc[free, "corr_gmm"] > 0.9999).all()
    lmm = ~free & ~out["alpha_is_opt"]
    assert (out.loc[lmm, "corr_lmm"] > 0.999).all()
    assert 0 < (~free).sum() < 64
