"""Next-token prediction through the one trainer (issue 32 item 3, issue 31 item 3).

* ``train(NTPModel(...), ...)`` equals the retired ``train_ntp`` (main before the change)
  to 1e-12 on the published sizes and every full-batch step rule: its outputs are stored in
  tests/data/ntp_train_ref.npz (made by main's ``train_ntp`` at commit 65de643, with the
  datasets, rules (``HYPER``), seeds and steps of :func:`test_train_equals_the_retired_
  train_ntp`: per run W, the metrics trial, step, loss, log10 loss, norm, corr to R, the
  stop steps and steps run);
* every argument an NTP model cannot honour is refused by name before any work;
* an explicit ``scale`` is honoured; the loss is exact past overflow (log-sum-exp), against
  mpmath; a run whose objective stops being finite stops with its reason.
"""

from __future__ import annotations

from pathlib import Path

import mpmath as mp
import numpy as np
import pytest
import torch

from attnsvm.ntp import PUBLISHED_SIZES, NTPData, NTPModel, ntp_random, ntp_tensors
from attnsvm.optim import RULES, gd, get, ngd
from attnsvm.train import train

REF = Path(__file__).parent / "data" / "ntp_train_ref.npz"
#: the hyper-parameters the stored runs used, per rule (every full-batch rule)
HYPER = {"gd": dict(lr=0.5), "nsd": dict(lr=0.1, norm="linf"), "ngd": dict(lr=0.1),
         "sign": dict(lr=0.01), "spectral": dict(lr=0.1), "coordinate": dict(lr=0.1),
         "polyak": {}, "mirror": dict(lr=0.1, p=3.0), "momentum": dict(lr=0.1),
         "adam": dict(lr=0.01), "adamw": dict(lr=0.01), "adagrad": dict(lr=0.1),
         "signum": dict(lr=0.01), "muon": dict(lr=0.05)}
CONFIGS = (("W", "iden"), ("KQ", "iden"), ("W", "gen"))


def test_the_stored_runs_cover_every_full_batch_rule():
    assert set(HYPER) == {r for r in RULES if get(r).batch_size is None}


def _cases():
    for size in PUBLISHED_SIZES:
        for rule in HYPER:
            for param, head in CONFIGS:
                # every rule at every size for W; (K, Q) and the gen head at the first size
                if (param, head) == ("W", "iden") or size == "n4T6K8d8":
                    yield size, rule, param, head


@pytest.mark.slow
@pytest.mark.parametrize("size, rule, param, head", list(_cases()))
def test_train_equals_the_retired_train_ntp(size, rule, param, head):
    ref = np.load(REF)
    n, T, K, d = PUBLISHED_SIZES[size]
    Ds = [ntp_random(n, T, K, d, seed=[7, s]) for s in range(2)]
    R = np.random.default_rng(3).standard_normal((d, d))
    tr = train(NTPModel(d, param, head), Ds, optimizer=get(rule, **HYPER[rule]), steps=40,
               seed=5, record_every=10, references={"R": R})
    key = f"{size}|{rule}|{param}|{head}"
    m = tr.metrics
    got = np.c_[m.trial, m.step, m.loss, m.log10_gap, m.norm, m.corr_R]
    want = ref[key + "|metrics"]
    assert got.shape == want.shape
    # where the old loss overflowed to inf (-log1p(-e^M) once 1 - p_y rounds to 1), ours
    # is finite (log-sum-exp: the fix); a rule that steps on log L (Polyak) then ran on
    # inf, so only the finiteness is compared for it
    old_inf = ~np.isfinite(want[:, 2])
    assert np.isfinite(got[:, 2]).all()
    if old_inf.any() and get(rule).needs_gap:
        return
    W0 = ref[key + "|W"]
    assert np.abs(tr.W - W0).max() <= 1e-12 * max(1.0, np.abs(W0).max())
    keep = np.ones(got.shape, bool)
    keep[old_inf, 2:4] = False
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-12, atol=1e-12)
    # stops: the same trials, at the same steps, unless the one trainer stopped a trial
    # whose update no longer changed its parameters (then W is the same, as checked)
    stop0, stop = ref[key + "|stop"], tr.stop_step
    same = stop == stop0
    assert np.all(same | (np.asarray(tr.stop_reason) == "no change in float64"))


@pytest.fixture(scope="module")
def data():
    return ntp_random(4, 6, 8, 8, seed=0)


@pytest.mark.parametrize("kw, needle", [
    (dict(loss="no-such-loss"), "loss"),
    (dict(loss="logistic"), "loss='logistic': NTPModel cannot honour it"),
    (dict(batch_size=2), "batch_size=2: NTPModel cannot honour it"),
    (dict(autograd=True), "autograd=True: NTPModel cannot honour it"),
    (dict(alpha=[1, 2]), "alpha=[1, 2]: NTPModel cannot honour it"),
    (dict(chunk=0), "chunk"),
    (dict(engine="bogus"), "engine"),
    (dict(engine="fused"), "engine='fused'"),
    (dict(record_params="no"), "record_params"),
    (dict(scale=-1.0), "scale"),
    (dict(scale=float("nan")), "scale"),
    (dict(init={"W": np.full((8, 8), np.nan)}), "init['W'] contains NaN"),
    (dict(optimizer="sgd"), "full-batch"),
    (dict(dtype=torch.int64), "dtype"),
    (dict(device="bogus"), "device"),
    (dict(references={"r": np.ones((3, 3))}), "references['r']"),
])
def test_ntp_arguments_refused_by_name(data, kw, needle):
    with pytest.raises(ValueError, match=None) as e:
        train(NTPModel(8), data, steps=3, **kw)
    assert needle in str(e.value), str(e.value)


def test_data_that_is_not_ntp_is_refused_by_name():
    from attnsvm.data import random_sphere

    with pytest.raises(ValueError, match="NTPData"):
        train(NTPModel(8), random_sphere(n=2, T=3, d=8), steps=1)


def test_explicit_scale_is_honoured_and_the_default_is_the_models(data):
    for scale in (0.1, 2.5):
        tr = train(NTPModel(8), data, steps=0, B=3, scale=scale)
        assert np.allclose(tr.metrics.norm, scale, rtol=1e-14)
    tr = train(NTPModel(8), data, steps=0, B=3)
    assert np.allclose(tr.metrics.norm, np.sqrt(8 / 3), rtol=1e-14)


def _mp_loss(D, W, dps=60):
    """-log p_y (iden head) of each sample, mean over samples, in mpmath."""
    mp.mp.dps = dps
    out = mp.mpf(0)
    for i in range(D.n):
        X = D.E[D.seqs[i]]
        a = [mp.fsum(mp.mpf(float(X[t, j])) * mp.mpf(float(W[j, k])) * mp.mpf(float(X[-1, k]))
                     for j in range(D.d) for k in range(D.d)) for t in range(D.T)]
        lab = [a[t] for t in range(D.T) if D.seqs[i, t] in set(D.labels[i][D.labels[i] >= 0])]
        out += mp.log(mp.fsum(mp.exp(x) for x in a)) - mp.log(mp.fsum(mp.exp(x) for x in lab))
    return float(out / D.n)


def test_loss_exact_past_overflow_of_one_minus_p(data):
    """gd(1000): the attention leaves the labels (p_y -> e^-46), where -log1p(-e^M) gave
    inf; the reported loss is finite and equals mpmath's, and the run records it."""
    tr = train(NTPModel(8), data, optimizer=gd(1000.0), steps=20, B=1, seed=1, record_every=1)
    W = tr.W[0]
    model = NTPModel(8)
    L = float(model.evaluate({"W": torch.as_tensor(W)[None]}, ntp_tensors(data), grad=False).loss[0])
    assert np.isfinite(tr.metrics.loss).all()
    ref = _mp_loss(data, W)
    assert abs(L - ref) <= 1e-12 * max(1.0, abs(ref)), (L, ref)
    # a W far from the labels: loss ~ margin * ||W||, not inf
    far = -50.0 * W / np.linalg.norm(W) if np.linalg.norm(W) > 0 else np.eye(8)
    Lf = float(model.evaluate({"W": torch.as_tensor(far)[None]}, ntp_tensors(data), grad=False).loss[0])
    rf = _mp_loss(data, far)
    assert np.isfinite(Lf) and abs(Lf - rf) <= 1e-12 * abs(rf), (Lf, rf)


def test_a_run_whose_objective_overflows_stops_with_its_reason(data):
    """Tokens at 1e150 (logits ~1e299 at the start, finite): the first GD step overflows;
    the trial stops ("non-finite step") at its last finite parameters, whose loss is
    finite; the same with the NTP objective made non-finite directly (its gradient scale
    turns NaN, which the trainer reads as an overflow)."""
    big = NTPData(data.E * 1e150, data.seqs, data.y)
    tr = train(NTPModel(8), big, optimizer=gd(1.0), steps=10, B=2, record_every=1)
    assert set(tr.stop_reason) == {"non-finite step"}
    assert np.isfinite(tr.W).all() and np.isfinite(tr.metrics.loss).all()
    t = ntp_tensors(data)
    a = torch.full((1, data.n, 1, data.T), float("inf"), dtype=torch.float64)
    ev = NTPModel(8).evaluate({"W": torch.zeros(1, 8, 8, dtype=torch.float64)}, t, logits=a)
    assert not torch.isfinite(ev.loss).any() and bool(ev.grads.nonfinite().all())


def test_chunks_equal_one_run(data):
    """chunk=2 of B=3 trials: the unchunked run."""
    a = train(NTPModel(8, "KQ"), data, optimizer=ngd(0.1), steps=12, B=3, record_every=4)
    b = train(NTPModel(8, "KQ"), data, optimizer=ngd(0.1), steps=12, B=3, record_every=4, chunk=2)
    # the same run to rounding (a chunk of one trial takes another matmul kernel)
    np.testing.assert_allclose(a.W, b.W, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(a.metrics.to_numpy(float), b.metrics.to_numpy(float), rtol=1e-13)
