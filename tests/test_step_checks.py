"""The torch engine's cheap checks at small B (issue 33, item 4): each per-step test of
"every entry finite" is one sum and one read (isfinite is four ops), and a sum that
overflows sends the step to the per-entry test, never to a wrong answer. Here each such
test is fed the case it must catch (a non-finite entry, an unchanged trial, a row with one
admissible key) and the case whose sum overflows while every entry is finite; and a step
whose checks all pass is shown to take the fast paths (no torch.where is run)."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnsvm import data as D
from attnsvm import models as M
from attnsvm import steppers
from attnsvm.losses import get_loss, log_gap
from attnsvm.models.objective import softmax_terms
from attnsvm.norms import FRO
from attnsvm.ntp import NTPModel, ntp_random
from attnsvm.optim import ngd
from attnsvm.train import train

INF = math.inf


def _rows_one_by_one(a):
    """softmax_terms of each row of a (B, n, Q, T) on its own, concatenated."""
    parts = [softmax_terms(a[b:b + 1, i:i + 1]) for b in range(a.shape[0]) for i in range(a.shape[1])]
    return [torch.cat([getattr(p, f).reshape(-1) for p in parts]) for f in ("s", "M", "eM", "r")]


@pytest.mark.parametrize("case", ["sum-overflows", "one-key-row", "nan-row", "finite"])
def test_softmax_terms_batched_equals_row_by_row(case):
    """The batch's one finiteness test picks the same values as each row's own call: also
    where the sum of a_j - a_k over the rows overflows (each row finite: the fast values),
    and where one row has a single admissible key (M = -inf) or a NaN logit (M = NaN)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1, 3, 1, 5, generator=g, dtype=torch.float64)
    if case == "sum-overflows":  # a_j - a_k = -1e308 in every row: the sum is -inf
        a[..., 0] = 1e308 / 2
        a[..., 1:] = -1e308 / 2
    elif case == "one-key-row":
        a[0, 1, 0, 1:] = -INF
    elif case == "nan-row":
        a[0, 2, 0, 3] = math.nan
    st = softmax_terms(a)
    want = _rows_one_by_one(a)
    for f, w in zip(("s", "M", "eM", "r"), want):
        np.testing.assert_array_equal(getattr(st, f).reshape(-1).numpy(), w.numpy(), err_msg=f)
    if case == "sum-overflows":
        assert torch.isfinite(st.M).all() and (st.M < -1e307).all()
    if case == "one-key-row":
        assert st.M[0, 1, 0] == -INF and st.s[0, 1, 0].tolist() == [1.0, 0, 0, 0, 0]
    if case == "nan-row":
        assert math.isnan(st.M[0, 2, 0])


def test_frobenius_value_of_items_whose_maxima_overflow_their_sum():
    """max|A| of each item finite but their sum inf: the per-item test decides (the exact
    norms, no recursion); an inf item has norm inf, a NaN item NaN."""
    A = torch.full((3, 1), 1e308, dtype=torch.float64)
    assert FRO.value(A, vector=True).tolist() == [1e308] * 3
    A = torch.tensor([[3.0, 4.0], [INF, 1.0], [math.nan, 1.0]], dtype=torch.float64)
    v = FRO.value(A, vector=True)
    assert v[0] == 5.0 and v[1] == INF and math.isnan(v[2])


def test_log_gap_falls_back_where_the_direct_form_is_not_finite():
    """The direct log gap underflows far out (loss(g) ~ e^-800): the log-loss form takes
    over for that entry only, and the entries beside it keep the direct value."""
    lossf = get_loss("logistic")
    g = torch.tensor([1.0, 800.0], dtype=torch.float64)
    D_ = torch.tensor([0.5, 0.5], dtype=torch.float64)
    out = log_gap(lossf, g, torch.log(D_), D_)
    assert torch.isfinite(out).all()
    # the exact values: log(loss(g - D) - loss(g)); at g = 800 loss ~ e^-u
    assert out[0] == pytest.approx(math.log(math.log1p(math.exp(-0.5)) - math.log1p(math.exp(-1.0))), rel=1e-14)
    assert out[1] == pytest.approx(-799.5 + math.log1p(-math.exp(-0.5)), rel=1e-14)


class _Stops:
    def __init__(self, active):
        self.active = torch.as_tensor(active)


def _stepper(check_stall=True):
    data = D.random_sphere(n=3, T=4, d=3, seed=0)
    model = M.WModel(3)
    st = steppers.TorchStepper(model, model.prepare(data), get_loss("logistic"), ngd(0.1),
                               first=None)
    st.check_stall = check_stall
    st.all_active, st.sums = True, None
    return st


@pytest.mark.parametrize("stall", [True, False])
def test_update_check_says_no_to_every_planted_violation(stall):
    """_update_ok: True only when every running trial's new W is finite and (stall check)
    differs from the old one; a planted inf, NaN or unchanged trial gives False; an
    overflowing sum of finite entries gives False (the full checks then decide) or True
    only when that is right; a stopped trial's violation is ignored."""
    old = {"W": torch.randn(3, 2, 2, dtype=torch.float64)}
    fine = {"W": old["W"] + 0.5}
    assert _stepper(stall)._update_ok(fine, old, _Stops([True] * 3)) is True
    for b, bad in [(0, INF), (1, -INF), (2, math.nan)]:
        new = {"W": fine["W"].clone()}
        new["W"][b, 1, 0] = bad
        st = _stepper(stall)
        assert st._update_ok(new, old, _Stops([True] * 3)) is False
        st = _stepper(stall)
        st.all_active = False  # the trial with the violation has stopped: not read
        assert st._update_ok(new, old, _Stops([i != b for i in range(3)])) is True
    if stall:
        same = {"W": fine["W"].clone()}
        same["W"][1] = old["W"][1]
        assert _stepper()._update_ok(same, old, _Stops([True] * 3)) is False
    huge = {"W": torch.full((3, 2, 2), 1e308, dtype=torch.float64)}  # sums overflow
    assert _stepper(stall)._update_ok(huge, old, _Stops([True] * 3)) is False


def test_a_step_whose_checks_pass_takes_the_fast_paths():
    """A record-free step at B = 1 (W, fixed head, NGD; NTP, identity head) runs no
    torch.where of a general path (for a zero, non-finite or stopped entry), reads at most five numbers (the checks) and NTP's three log-sum-exps are one
    call."""
    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    d = 4
    dat = D.random_sphere(n=3, T=5, d=d, seed=0)
    nd = ntp_random(4, 6, 8, d, seed=0)
    runs = {"W": lambda s: train(M.WModel(d), dat, optimizer=ngd(0.1), steps=s, engine="torch",
                                 record_every=s),
            "NTP": lambda s: train(NTPModel(d), nd, optimizer=ngd(0.1), steps=s, record_every=s)}
    for name, run in runs.items():
        run(2)
        counts = []
        for s in (2, 7):
            with Ops() as ops:
                run(s)
            counts.append(ops.n)
        per5 = counts[1].copy()
        per5.subtract(counts[0])  # the ops of 5 steps
        # NTP's identity head: the formula's own three (the log-sum-exps' masks, the loss's
        # two forms, the gradient's exponent), none of a general path
        assert per5["where"] == (3 * 5 if name == "NTP" else 0), name
        assert per5["_local_scalar_dense"] <= 5 * 5, name  # at most five reads a step
        if name == "NTP":
            assert per5["logsumexp"] == 5


def test_ntp_log_sum_exps_in_one_call_equal_three_calls(monkeypatch):
    """The identity head's three log-sum-exps stacked in one call (few logits) give the
    bits of one call each (many logits: no 3x temporary), gradient and loss alike."""
    from attnsvm.ntp import model as ntpm

    model = NTPModel(5)
    t = model.prepare(ntp_random(6, 7, 8, 5, seed=1))
    params = model.init(B=9, seed=2, scale=3.0)
    one = model.evaluate(params, t)
    monkeypatch.setattr(ntpm, "LSE_STACK_MAX", 0)
    three = model.evaluate(params, t)
    for x, y in zip(one[:3], three[:3]):
        assert torch.equal(x, y)
    assert torch.equal(one.grads.tensors["W"], three.grads.tensors["W"])
    assert torch.equal(one.grads.log_scale["W"], three.grads.log_scale["W"])
