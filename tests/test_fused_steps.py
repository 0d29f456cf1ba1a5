"""Each named step of the compiled training kernel (attnsvm.fused.kernels), called on its
own, against the plain torch reference it must equal (tests/test_fused.py holds whole runs
of the kernel to the torch engine):

    _query_vectors + _logits     model._logits
    _softmax_rows                torch.softmax of the logits
    _gradient (via grad_batch)   model.evaluate(grad=True): the scaled gradient, log(L - L*)
    _apply_rule                  optimizer.update, for every step loop of fused.PROGRAMS
    _gradient_stop, _update_stop the trainer's stop rules (attnsvm.steppers.TorchStepper)

Tolerance: 1e-13 relative (the torch reference sums in BLAS order, the kernel in its own
fixed order; rounding only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import fused
from attnsvm import models as M
from attnsvm import optim as O
from attnsvm.fused import codes as C
from attnsvm.losses import get_loss
from attnsvm.models import prepare
from test_fused import _models as fused_models

pytestmark = pytest.mark.skipif(not fused.available(), reason="numba is not installed")

RTOL = 1e-13
D_ = 3


def _models():
    """The four models of tests/test_fused.py (one table for both files), at d = D_."""
    return fused_models(D_)


class Trial:
    """One trial (B = 1) laid out for the kernel's steps: the plan's arrays, the flat
    parameters P (the W model holds W^T), scratch, and the torch reference's inputs."""

    def __init__(self, model, loss="logistic", opt=None, scale=0.7, seed=3):
        data = D.random_sphere(n=3, T=4, d=D_, seed=2, cross=type(model).__name__ != "PromptModel")
        self.K = fused._kernels()
        self.model, self.lossf = model, get_loss(loss)
        self.tdata = prepare(data)
        self.Q = 1 if model._single(self.tdata) else self.tdata["X"].shape[2]
        self.params = model.init(1, seed=seed, scale=scale)
        self.opt = opt or O.ngd(0.1)
        self.plan = plan = fused.Plan(model, self.tdata, self.lossf, self.opt, self.Q, 1,
                                      check_stall=False)
        plan.ic[C.IC_NEEDGAP] = 1
        slots = plan._empty_slots()
        for nm, s in plan.slots.items():
            slots[s][:] = self.params[nm].reshape(1, -1).numpy()
        self.so = self.K._slots(*slots)
        self.P = np.empty(self.so[3])
        self.K._load(plan.ic, *slots, 0, self.P, self.so)
        self.scratch = self.K._scratch(plan.ic, self.so[3])
        ic = plan.ic
        self.n, self.T, self.d = ic[C.IC_N], ic[C.IC_T], ic[C.IC_D]
        self.R = self.n * ic[C.IC_Q]
        self.row = [a[0] for a in (plan.X, plan.Z, plan.gam, plan.gopt, plan.yl, plan.w, plan.mask)]
        X, logw, XT, aux = self.row[0], self.row[5], self.scratch[15], self.scratch[16]
        self.K._trial_setup(X, logw, XT, aux, self.n, self.T, self.d, self.R)

    def unflat(self, v):
        """The kernel's flat vector as {name: (1, ...)} (W^T back to W)."""
        out = {}
        for nm, shp in self.model.param_shapes().items():
            s = self.plan.slots[nm]
            t = v[self.so[s]:self.so[s + 1]].reshape(shp)
            out[nm] = torch.from_numpy((t.T if nm == "W" else t).copy())[None]
        return out

    def flat(self, tensors):
        """{name: (1, ...)} as the kernel's flat vector (W as W^T)."""
        v = np.empty(self.so[3])
        for nm, t in tensors.items():
            s = self.plan.slots[nm]
            a = t[0].numpy()
            v[self.so[s]:self.so[s + 1]] = (a.T if nm == "W" else a).ravel()
        return v

    def logits(self):
        KT, WZ, ZQ, A, S, Rr, *_ = self.scratch
        X, Z, gam, gopt, yl, logw, mask = self.row
        self.K._query_vectors(self.plan.ic, Z, self.P, self.plan.Wf, self.so[1], KT, ZQ, WZ,
                              self.scratch[11])
        ovf = self.K._logits(self.plan.ic, WZ, self.scratch[15], mask, A)
        return ovf, A[:self.R * self.T].reshape(self.n, -1, self.T).copy()


@pytest.mark.parametrize("mname", ["W", "KQ", "Diag", "Prompt"])
def test_logits_and_softmax_steps_equal_torch(mname):
    for trained in (False, True):
        tr = Trial(_models()[mname](trained))
        ovf, A = tr.logits()
        ref = tr.model._logits(tr.params, tr.tdata)[0].numpy()
        assert not ovf
        np.testing.assert_allclose(A, ref, rtol=RTOL, atol=RTOL * np.abs(ref).max())
        S, Rr, aux = tr.scratch[4], tr.scratch[5], tr.scratch[16]
        tr.K._softmax_rows(tr.scratch[3], tr.R, tr.T, Rr, S, aux)
        sref = torch.softmax(torch.from_numpy(ref), -1).numpy()
        np.testing.assert_allclose(S[:tr.R * tr.T].reshape(sref.shape), sref, rtol=RTOL, atol=1e-300)
        # the anchor (block 4) is the first maximiser, s_k = 1 / (1 + x) (block 2)
        k = aux[4 * tr.R:5 * tr.R].astype(int)
        np.testing.assert_array_equal(k, ref.reshape(tr.R, tr.T).argmax(-1))
        np.testing.assert_allclose(1.0 / (1.0 + aux[2 * tr.R:3 * tr.R]),
                                   sref.reshape(tr.R, tr.T).max(-1), rtol=RTOL)


def test_logits_step_reports_overflow():
    """A parameter at 1e308 sends a logit to inf: the step says so (the trainer then
    undoes the last step)."""
    tr = Trial(M.WModel(D_))
    tr.P[:] = 1e308
    ovf, _ = tr.logits()
    assert ovf


@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
@pytest.mark.parametrize("mname", ["W", "KQ", "Diag", "Prompt"])
def test_gradient_step_equals_model_evaluate(mname, loss):
    """The compiled gradient (_gradient, through its driver grad_batch: Plan.evaluate):
    the scaled gradient (tensors with max|.| = 1, log scales) and log(L - L*) equal
    model.evaluate's, fixed and trained head, in both regimes of the row factors (scale
    0.7: linear; scale 60: saturated, the log domain)."""
    for trained in (False, True):
        for scale in (0.7, 60.0):
            tr = Trial(_models()[mname](trained), loss=loss, scale=scale)
            got = tr.plan.evaluate(tr.params, need_gap=True)
            ev = tr.model.evaluate(tr.params, tr.tdata, tr.lossf, grad=True, need_gap=True)
            what = f"{mname} trained={trained} {loss} scale={scale}"
            for nm, t in ev.grads.tensors.items():
                np.testing.assert_allclose(got.grads.log_scale[nm].numpy(),
                                           ev.grads.log_scale[nm].numpy(), rtol=RTOL, atol=RTOL,
                                           err_msg=f"{what} {nm}")
                np.testing.assert_allclose(got.grads.tensors[nm].numpy(), t.numpy(), rtol=1e-12,
                                           atol=1e-12, err_msg=f"{what} {nm}")
            np.testing.assert_allclose(got.log_gap.numpy(), ev.log_gap.numpy(), rtol=1e-12,
                                       atol=1e-12, err_msg=what)


RULES = {
    "gd": lambda: O.gd(0.5),
    "ngd": lambda: O.ngd(0.3),
    "ngd-global": lambda: O.ngd(0.3, norm="global"),
    "ngd-relative": lambda: O.ngd(0.05, norm="global", relative=True),
    "sign": lambda: O.sign_descent(0.05),
    "coordinate": lambda: O.coordinate_descent(0.2),
    "nsd-l3": lambda: O.nsd("l3", lr=0.2),
    "polyak": lambda: O.polyak(0.2, max_lr=2.0),
    "mirror3": lambda: O.mirror(3.0, lr=0.3),
    "md1.5-normalized": lambda: O.mirror(1.5, lr=0.1, normalized=True),
}


def test_rules_cover_every_program():
    seen = {tuple(int(k.op) for k in make().kernel) for make in RULES.values()}
    assert set(fused.PROGRAMS) <= seen, set(fused.PROGRAMS) - seen


@pytest.mark.parametrize("rname", sorted(RULES))
@pytest.mark.parametrize("mname", ["W", "KQ"])
def test_rule_step_equals_optimizer_update(mname, rname):
    """_apply_rule from the torch gradient (scaled form) equals optimizer.update."""
    opt = RULES[rname]()
    tr = Trial(_models()[mname](True), opt=opt)
    ev = tr.model.evaluate(tr.params, tr.tdata, tr.lossf, grad=True, need_gap=True)
    ref, _ = opt.update(ev.grads, opt.init(tr.params), tr.params, ev.log_gap)
    G = tr.flat(ev.grads.tensors)
    ls = np.full(3, -np.inf)
    for nm, s in tr.plan.slots.items():
        ls[s] = float(ev.grads.log_scale[nm][0])
    N = np.empty_like(tr.P)
    Dv, work = tr.scratch[13], tr.scratch[14]
    flags = tr.K._apply_rule(tr.plan.ic, tr.plan.fc, tr.P, G, N, tr.so, np.ones(3), ls,
                             float(ev.log_gap[0]), Dv, work)
    assert flags & 1 and flags & 2
    got = tr.unflat(N)
    for nm, t in ref.items():
        np.testing.assert_allclose(got[nm].numpy(), t.numpy(), rtol=RTOL,
                                   atol=RTOL * float(t.abs().max()), err_msg=nm)


def test_stop_steps_follow_the_trainer():
    """Why a trial stops: a NaN or +inf log scale (overflow) before a zero gradient (all
    -inf), and after the update a non-finite parameter before an unchanged one."""
    K = fused._kernels()
    inf = np.inf
    assert K._gradient_stop(np.array([0.0, -inf, -inf]), 2) == 0
    assert K._gradient_stop(np.array([-inf, -inf, 5.0]), 2) == C.STOP_ZERO  # slot 2 unused
    assert K._gradient_stop(np.array([-inf, np.nan, -inf]), 2) == C.STOP_NONFINITE
    assert K._gradient_stop(np.array([inf, -inf, -inf]), 1) == C.STOP_NONFINITE
    assert K._update_stop(3, 1) == 0
    assert K._update_stop(1, 1) == C.STOP_NOCHANGE
    assert K._update_stop(1, 0) == 0
    assert K._update_stop(2, 1) == C.STOP_NONFINITE
