"""Models: gradients vs finite differences (gradcheck) and vs an independent autograd risk."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnsvm import data as D
from attnsvm import models as M
from attnsvm.losses import get_loss


def _data(query, B=None, seed=0, mask=False):
    d = D.random_sphere(n=3, T=4, d=3, seed=seed, batch=B)
    kw = {}
    if query in ("seq2seq", "causal"):
        rng = np.random.default_rng(seed)
        kw["y"] = rng.choice([-1.0, 1.0], size=d.X.shape[:-1])
    if mask:
        m = np.ones(d.X.shape[:-1], bool)
        m[..., 0, -1] = False
        kw["mask"] = m
    return d.replace(**kw) if kw else d


class _Objective(torch.autograd.Function):
    """Wrap model.objective: forward = risk L (summed over trials), backward = its gradients.
    gradcheck then compares those gradients with finite differences of L."""

    @staticmethod
    def forward(ctx, model, data, loss, autograd, names, *tensors):
        params = dict(zip(names, tensors))
        L, _, grads = model.objective(params, data, loss, autograd=autograd)
        ctx.grads = [grads[k] for k in names]
        return L.sum()

    @staticmethod
    def backward(ctx, gout):
        return (None,) * 5 + tuple(gout * g for g in ctx.grads)


CONFIGS = [
    (M.WModel, dict(query="cross")),
    (M.WModel, dict(query="first")),
    (M.WModel, dict(query="last")),
    (M.WModel, dict(query="seq2seq")),
    (M.WModel, dict(query="causal")),
    (lambda d, **kw: M.KQModel(d, m=2, reg=0.0, **kw), dict(query="cross")),
    (lambda d, **kw: M.KQModel(d, m=2, **kw), dict(query="causal")),
    (M.DiagModel, dict(query="cross")),
    (M.DiagModel, dict(query="seq2seq")),
    (M.PromptModel, dict()),
    (lambda d, **kw: M.PromptModel(d, W_fixed=np.arange(d * d).reshape(d, d) / 9.0, **kw), dict()),
    (M.WModel, dict(query="cross", train_head=True)),
    (M.WModel, dict(query="first", train_head=True)),
    (M.WModel, dict(query="causal", train_head=True)),
    (lambda d, **kw: M.KQModel(d, m=2, reg=0.0, **kw), dict(query="cross", train_head=True)),
    (lambda d, **kw: M.KQModel(d, m=2, **kw), dict(query="last", train_head=True)),
    (M.PromptModel, dict(train_head=True)),
    (lambda d, **kw: M.PromptModel(d, W_fixed=np.arange(d * d).reshape(d, d) / 9.0, **kw),
     dict(train_head=True)),
    (M.WModel, dict(query="cross", head="relu", train_head=True, head_width=2)),
    (M.WModel, dict(query="seq2seq", head="relu", V=np.ones((3, 2)) / 2)),
    (M.KQModel, dict(query="first", head="relu", train_head=True)),
    (M.WModel, dict(query="cross", head=lambda u: torch.tanh(u).sum(-1))),
]
IDS = [f"{i}-{kw.get('query', 'prompt')}-{kw.get('head', 'linear') if isinstance(kw.get('head', 'linear'), str) else 'module'}"
       f"{'-trained' if kw.get('train_head') else ''}" for i, (_, kw) in enumerate(CONFIGS)]


@pytest.mark.parametrize("ctor, kw", CONFIGS, ids=IDS)
@pytest.mark.parametrize("mask", [False, True])
def test_gradcheck_every_parameterisation(ctor, kw, mask):
    model = ctor(3, **kw)
    data = _data(model.query, B=2, mask=mask)
    params = model.init(2, seed=1, scale=1.5)
    names = list(params)
    for autograd in (False, True):
        if model.head != "linear" and not autograd:  # closed form: linear heads (fixed or trained)
            continue
        for loss in ("logistic", "exponential", "correlation"):
            tensors = [params[k].clone().requires_grad_(True) for k in names]
            f = lambda *ts, a=autograd, lo=loss: _Objective.apply(model, data, lo, a, names, *ts)
            assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("ctor, kw", CONFIGS, ids=IDS)
def test_gradients_match_naive_autograd_risk(ctor, kw):
    """Closed form / stable autograd vs torch.autograd of the plain risk mean loss(y f)."""
    model = ctor(3, **kw)
    data = _data(model.query, B=2, mask=True)
    params = model.init(2, seed=2, scale=1.0)
    pp = {k: t.clone().requires_grad_(True) for k, t in params.items()}
    f = model.forward(pp, data)
    y = torch.as_tensor(data.y)
    valid = torch.ones_like(f)
    if f.ndim == 3:
        valid = torch.as_tensor(data.mask, dtype=f.dtype)
    lossf = get_loss("logistic")
    L = ((lossf.value(y * f) * valid).sum(tuple(range(1, f.ndim))) / valid.sum(tuple(range(1, f.ndim))))
    reg = model._reg(pp)
    g_ref = torch.autograd.grad(L.sum() + (reg.sum() if reg is not None else 0), list(pp.values()))
    L1, gap, grads = model.objective(params, data, "logistic")
    torch.testing.assert_close(L1, L.detach(), rtol=1e-12, atol=1e-14)
    for k, g in zip(params, g_ref):
        torch.testing.assert_close(grads[k], g, rtol=1e-9, atol=1e-13)
    if model.fixed_linear:
        g = data.gamma
        if model.query == "causal":  # query k sees keys t <= k only
            g = np.where(np.tril(np.ones((data.T, data.T), bool)), g, -np.inf)
        Lstar = torch.as_tensor(g.max(-1))
        Lstar = (lossf.value(Lstar) * valid).sum(tuple(range(1, f.ndim))) / valid.sum(tuple(range(1, f.ndim)))
        torch.testing.assert_close(gap, L.detach() - Lstar, rtol=1e-9, atol=1e-14)
    else:
        torch.testing.assert_close(gap, L1)


TRAINED_LINEAR = [i for i, (_, kw) in enumerate(CONFIGS)
                  if kw.get("train_head") and kw.get("head", "linear") == "linear"]


@pytest.mark.parametrize("ctor, kw", [CONFIGS[i] for i in TRAINED_LINEAR],
                         ids=[IDS[i] for i in TRAINED_LINEAR])
@pytest.mark.parametrize("loss", ["logistic", "exponential", "correlation"])
def test_trained_linear_closed_form_matches_autograd(ctor, kw, loss):
    """Trained linear head: closed-form (anchored) gradient == autograd of the stable objective
    == torch.autograd of the plain risk written out independently: f = sum_t s_t v^T x_t."""
    model = ctor(3, **kw)
    data = _data(model.query, B=2, seed=4, mask=True)
    params = model.init(2, seed=5, scale=1.5)
    L0, gap0, g0 = model.objective(params, data, loss)
    L1, _, g1 = model.objective(params, data, loss, autograd=True)
    _, none, g2 = model.objective(params, data, loss, need_gap=False)
    assert none is None
    pp = {k: t.clone().requires_grad_(True) for k, t in params.items()}
    s = torch.softmax(model.logits(pp, data), dim=-1)  # (B, n, T) or (B, n, T, T)
    c = torch.as_tensor(data.X) @ pp["v"][:, None, :, None]  # (B, n, T, 1)
    f = (s @ c)[..., 0] if s.ndim == 4 else (s[..., None] * c).sum((-2, -1))
    y = torch.as_tensor(data.y)
    valid = torch.as_tensor(data.mask, dtype=f.dtype) if f.ndim == 3 else torch.ones_like(f)
    dims = tuple(range(1, f.ndim))
    L = (get_loss(loss).value(y * f) * valid).sum(dims) / valid.sum(dims)
    reg = model._reg(pp)
    g_ref = torch.autograd.grad(L.sum() + (reg.sum() if reg is not None else 0), list(pp.values()))
    torch.testing.assert_close(L0, L.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(L1, L0, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(gap0, L0)
    for k, gr in zip(params, g_ref):
        for g in (g0, g1, g2):
            torch.testing.assert_close(g[k], gr, rtol=1e-10, atol=1e-13)


def test_shapes_and_shared_vs_per_trial_data():
    data = D.random_sphere(n=3, T=4, d=5, batch=2)
    model = M.KQModel(5, m=2)
    params = model.init(2, seed=0)
    assert model.W(params).shape == (2, 5, 5)
    assert model.logits(params, data).shape == (2, 3, 4)
    s = model.attention(params, data)
    torch.testing.assert_close(s.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    assert model.forward(params, data).shape == (2, 3)
    # shared data (no B) is broadcast over trials
    f_shared = model.forward(params, data.trial(0))
    torch.testing.assert_close(f_shared[0], model.forward(params, data)[0])
    s2 = M.WModel(5, query="causal").attention(M.WModel(5).init(2), data)
    assert s2.shape == (2, 3, 4, 4) and torch.all(s2[..., 0, 1:] == 0)
    assert M.PromptModel(5).W({"p": torch.ones(2, 5)}).shape == (2, 5)


def test_effective_W_consistent_with_logits():
    data = D.random_sphere(n=3, T=4, d=5, batch=2)
    for model in (M.KQModel(5, m=3), M.DiagModel(5)):
        params = model.init(2, seed=3, scale=2.0)
        W = model.W(params)
        a = torch.einsum("bntd,bde,bne->bnt", torch.as_tensor(data.X), W, torch.as_tensor(data.z))
        torch.testing.assert_close(model.logits(params, data), a)


def test_init_kinds():
    m = M.KQModel(4, m=3)
    b = m.init(5, seed=0, scale=0.3, kind="balanced")
    assert torch.equal(b["K"], b["Q"])
    torch.testing.assert_close(b["K"].reshape(5, -1).norm(dim=1), torch.full((5,), 0.3, dtype=torch.float64))
    u = m.init(5, kind="unbalanced")
    assert torch.all(u["Q"] == 0) and torch.all(u["K"] != 0)
    assert all(torch.all(t == 0) for t in m.init(2, kind="zero").values())
    assert torch.equal(m.init(3, seed=7)["K"], m.init(3, seed=7)["K"])
    assert M.DiagModel(3).init(2, kind="unbalanced")["q"].abs().sum() == 0
    assert M.WModel(3).init(2, dtype=torch.float32)["W"].dtype == torch.float32


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.WModel(3, query="middle"), "query must be one of"),
        (lambda: M.WModel(3, head="tanh"), "head must be 'linear', 'relu' or a callable"),
        (lambda: M.WModel(3, head=3), "head must be 'linear', 'relu' or a callable"),
        (lambda: M.WModel(3, head="relu"), "a fixed relu head needs V"),
        (lambda: M.WModel(3, head="relu", V=np.ones((4, 2))), r"V must have shape \(d, m\)"),
        (lambda: M.WModel(3, head=torch.nn.Tanh(), train_head=True), "train_head=True is only"),
        (lambda: M.WModel(3).init(2, kind="orthogonal"), "init kind must be one of"),
        (lambda: M.WModel(3).init(2, kind="balanced"), "applies to KQModel and DiagModel only"),
        (lambda: M.PromptModel(3, W_fixed=np.eye(2)), r"W_fixed must have shape \(d, d\)"),
        (lambda: M.PromptModel(3, query="first"), "query must be 'cross'"),
        (lambda: M.WModel(3).objective(M.WModel(3).init(1), D.random_sphere(d=3, cross=False)),
         "query='cross' needs data.z"),
        (lambda: M.WModel(3).objective(M.WModel(3).init(1), D.random_sphere(d=3).replace(v=None)),
         "fixed linear head needs data.v"),
        (lambda: M.WModel(3).objective(M.WModel(3).init(1), D.random_sphere(d=3), loss="hinge"),
         "loss must be one of"),
        (lambda: M.prepare([1, 2]), "data must be a TokenData"),
        (lambda: M.WModel(3, head=torch.nn.Tanh()).forward(M.WModel(3).init(1), D.random_sphere(d=3)),
         r"head must map u of shape \(..., d\) to f"),
    ],
)
def test_model_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_label_layout_must_fit_the_queries():
    """Per-token labels need one query per token; per-sequence labels broadcast over the
    queries of a seq-to-seq model (closed form == autograd there)."""
    d = D.random_sphere(n=3, T=4, d=3, cross=False, seed=2)
    with pytest.raises(ValueError, match=r"one label per query token \(y of shape \(n, T\)\)"):
        M.WModel(3, query="first").objective(M.WModel(3).init(1), d.replace(y=np.ones((3, 4))))
    model = M.WModel(3, query="seq2seq")
    params = model.init(2, seed=1, scale=2.0)
    L0, gap0, g0 = model.objective(params, d)
    L1, gap1, g1 = model.objective(params, d, autograd=True)
    torch.testing.assert_close(L0, L1)
    torch.testing.assert_close(g0["W"], g1["W"], rtol=1e-10, atol=1e-13)
