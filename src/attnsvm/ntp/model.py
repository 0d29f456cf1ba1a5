"""The NTP model of Li et al. (AISTATS 2024): one self-attention layer whose query is the
last token, its next-token loss in a form exact past saturation, and its batched trainer.

Model (B trials, batched; docs/theory.md "Next-token prediction").  Sample i has tokens
X_i = E[s_i] (T, d) and query z_i = x_iT = e_{k_i}:

    a_it = x_it^T W z_i        (W, or W = K Q^T for the (K, Q) parameterisation)
    s_i = softmax_t(a_i)

Heads (the public code's ``cls_choice``):

* ``"iden"`` (the global-convergence notebooks, ``loss_type='nll'``): the output is the
  attention mass on each token id, p_i(v) = sum_{t: s_it = v} s_it, and
  loss_i = -log p_i(y_i) = LSE_t(a_it) - LSE_{t in Y_i}(a_it)  (Y_i: positions of the label);
* ``"gen"`` (the local-convergence notebook, ``loss_type='ce'``): logits over the
  vocabulary o_i = E (X_i^T s_i), loss_i = LSE_v(o_iv) - o_{i y_i}  (cross-entropy).

L = (1/n) sum_i loss_i.  Scaled gradient (as :mod:`attnsvm.models.objective`): with
M_i the log of the attention left off the target, dL/da_it = (1/n) exp(M_i) g_it with
O(1) entries g_it:

* iden: M_i = LSE_{t not in Y}(a) - LSE_t(a) = log(1 - p_i(y_i)); g_it = softmax over the
  non-label positions at t not in Y, -softmax over the label positions at t in Y;
* gen: with the anchor k = argmax_t a_it, r_t = exp(a_t - a_runner-up), exp(M) = s_t / r_t
  (:func:`attnsvm.models.objective.softmax_terms`), D_t = x_t - x_k, u = x_k +
  exp(M) sum_t r_t D_t, h = E^T (softmax(E u) - e_y), c_t = D_t^T h, cbar = sum_t r_t c_t:
  g_t = r_t (c_t - exp(M) cbar) (t != k), g_k = -s_k cbar.

So the direction of the gradient is exact however far it underflows (checked against
mpmath in tests/test_ntp_model.py).  dL/dW = sum_it (dL/da_it) x_it z_i^T; (K, Q):
dL/dK = G Q, dL/dQ = G^T K.

:func:`train_ntp` (also reached through :func:`attnsvm.train.train` with an
:class:`NTPModel`) runs every step rule of :mod:`attnsvm.optim` on B trials at once
(full batch; the torch engine).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ..models.objective import _row_factors, _scaled, softmax_terms
from .data import NTPData

__all__ = ["NTPModel", "NTPObjective", "ntp_tensors", "train_ntp", "HEADS"]

HEADS = ("iden", "gen")
NEG_INF = float("-inf")


def ntp_tensors(data, device=None, dtype=torch.float64) -> dict:
    """Tensors of one NTPData (Bx = 1) or of a list of same-shape NTPData (Bx = len):
    E (Bx, K, d), X (Bx, n, T, d), Z (Bx, n, d), ymask (Bx, n, T) bool (positions whose
    token is a label), yid (Bx, n) (the first label), seqs (Bx, n, T).

    Example::

        >>> from attnsvm.ntp import ntp_random, ntp_tensors
        >>> t = ntp_tensors(ntp_random(4, 6, 8, 8, seed=0))
        >>> {k: tuple(v.shape) for k, v in t.items()}
        {'E': (1, 8, 8), 'X': (1, 4, 6, 8), 'Z': (1, 4, 8), 'ymask': (1, 4, 6), 'yid': (1, 4), 'seqs': (1, 4, 6)}
    """
    items = [data] if isinstance(data, NTPData) else list(data)
    if not items or not all(isinstance(d, NTPData) for d in items):
        raise ValueError("data must be an NTPData or a non-empty list of NTPData")
    shp = {(d.n, d.T, d.K, d.d) for d in items}
    if len(shp) != 1:
        raise ValueError(f"the datasets of a batch must share (n, T, K, d); got {sorted(shp)}")
    E = np.stack([d.E for d in items])
    seqs = np.stack([d.seqs for d in items])
    Y = np.stack([d.labels for d in items])  # (Bx, n, L)
    ymask = ((seqs[:, :, None, :] == Y[..., None]) & (Y[..., None] >= 0)).any(2)
    X = np.take_along_axis(E[:, None, :, :], seqs[..., None], axis=2)  # (Bx, n, T, d)
    t = dict(device=device, dtype=dtype)
    return {"E": torch.as_tensor(E, **t), "X": torch.as_tensor(X, **t),
            "Z": torch.as_tensor(X[:, :, -1, :], **t),
            "ymask": torch.as_tensor(ymask, device=device),
            "yid": torch.as_tensor(Y[..., 0], device=device),
            "seqs": torch.as_tensor(seqs, device=device)}


class NTPObjective(tuple):
    """(loss (B,), gap (B,) = loss, log_gap (B,) = log loss, grads Scaled)."""

    def __new__(cls, loss, log_loss, grads):
        return super().__new__(cls, (loss, loss, log_loss, grads))

    loss = property(lambda self: self[0], doc="(B,) the NTP loss of each trial.")
    gap = property(lambda self: self[1], doc="(B,) L - L* = L (the NTP loss has L* = 0).")
    log_gap = property(lambda self: self[2], doc="(B,) log L, exact past saturation.")
    grads = property(lambda self: self[3], doc="the gradient in scaled form (optim.Scaled).")


class NTPModel:
    """One self-attention layer for next-token prediction (module docstring).

    d: embedding dimension; param: "W" (combined key-query, trained W) or "KQ" (W = K Q^T,
    K, Q (d, m), m = d by default); head: "iden" | "gen".

    Example::

        >>> from attnsvm.ntp import NTPModel, ntp_random
        >>> model = NTPModel(8)                                # trained W (d, d), identity head
        >>> traj = model.fit(ntp_random(4, 6, 8, 8, seed=0), steps=50)
        >>> model, traj.steps_run
        (NTPModel(d=8, param='W', head='iden'), 50)
    """

    ntp = True

    def __init__(self, d: int, param: str = "W", head: str = "iden", m: int | None = None):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be a positive integer; got {d!r}")
        if param not in ("W", "KQ"):
            raise ValueError(f"param must be 'W' or 'KQ'; got {param!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}; got {head!r}")
        m = d if m is None else m
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ValueError(f"m must be a positive integer; got {m!r}")
        self.d, self.param, self.head, self.m = int(d), param, head, int(m)

    def __repr__(self) -> str:
        return f"NTPModel(d={self.d}, param={self.param!r}, head={self.head!r})"

    def fit(self, data, *args, **kwargs):
        """:func:`train_ntp` of this model (what :func:`attnsvm.train.train` calls)."""
        return train_ntp(self, data, *args, **kwargs)

    # ---------------------------------------------------------- parameters
    def param_shapes(self) -> dict:
        """Shapes of one trial's parameters: {"W": (d, d)} or {"K": (d, m), "Q": (d, m)}."""
        if self.param == "W":
            return {"W": (self.d, self.d)}
        return {"K": (self.d, self.m), "Q": (self.d, self.m)}

    def init(self, B: int = 1, seed: int = 0, scale: float = 1.0, kind: str = "random",
             device=None, dtype=torch.float64) -> dict:
        """i.i.d. N(0, 1) entries rescaled to Frobenius norm ``scale`` per tensor and
        trial ("random"), or zeros ("zero"); seeded (torch.Generator, CPU)."""
        if kind not in ("random", "zero"):
            raise ValueError(f"init kind must be 'random' or 'zero'; got {kind!r}")
        gen = torch.Generator().manual_seed(int(seed))
        out = {}
        for name, shape in self.param_shapes().items():
            a = torch.randn((B, *shape), generator=gen, dtype=torch.float64)
            a = scale * a / a.reshape(B, -1).norm(dim=1).reshape(B, 1, 1)
            out[name] = (a if kind == "random" else torch.zeros_like(a)).to(device=device, dtype=dtype)
        return out

    def W(self, params) -> torch.Tensor:
        """The combined key-query matrix (B, d, d): W, or K Q^T."""
        if self.param == "W":
            return params["W"]
        return params["K"] @ params["Q"].transpose(-1, -2)

    def finite(self, params) -> torch.Tensor:
        """(B,) bool: every parameter and W of the trial is finite."""
        ok = torch.isfinite(self.W(params)).reshape(self.W(params).shape[0], -1).all(1)
        for v in params.values():
            ok &= torch.isfinite(v).reshape(v.shape[0], -1).all(1)
        return ok

    # -------------------------------------------------------------- forward
    def logits(self, params, t: dict) -> torch.Tensor:
        """a_it = x_it^T W z_i: (B, n, T)."""
        WZ = t["Z"] @ self.W(params).transpose(-1, -2)  # (B, n, d): W z_i
        return (t["X"] @ WZ[..., None])[..., 0]

    def attention(self, params, t: dict) -> torch.Tensor:
        """Softmax attention over the T tokens, (B, n, T): s = softmax(X W x_T)."""
        return torch.softmax(self.logits(params, t), -1)

    def probs(self, params, t: dict) -> torch.Tensor:
        """The model's next-token distribution (B, n, K): attention mass per token id
        (iden) or softmax(E X^T s) (gen)."""
        s = self.attention(params, t)
        if self.head == "iden":
            K = t["E"].shape[1]
            oh = torch.nn.functional.one_hot(t["seqs"], K).to(s.dtype)  # (Bx, n, T, K)
            return torch.einsum("bnt,bntk->bnk", s, oh.expand(s.shape[0], *oh.shape[1:]))
        u = torch.einsum("bnt,bntd->bnd", s, t["X"])
        return torch.softmax(torch.einsum("bkd,bnd->bnk", t["E"], u), -1)

    def loss_plain(self, params, t: dict) -> torch.Tensor:
        """The loss by plain torch ops (the autograd reference): (B,)."""
        a = self.logits(params, t)
        if self.head == "iden":
            lab = torch.where(t["ymask"], a, torch.full_like(a, NEG_INF))
            return (torch.logsumexp(a, -1) - torch.logsumexp(lab, -1)).mean(-1)
        s = torch.softmax(a, -1)
        u = torch.einsum("bnt,bntd->bnd", s, t["X"])
        o = torch.einsum("bkd,bnd->bnk", t["E"], u)
        oy = o.gather(-1, t["yid"].expand(o.shape[0], -1)[..., None])[..., 0]
        return (torch.logsumexp(o, -1) - oy).mean(-1)

    # ------------------------------------------------------------ objective
    def _iden_terms(self, a, ymask):
        lab = torch.where(ymask, a, torch.full_like(a, NEG_INF))
        non = torch.where(ymask, torch.full_like(a, NEG_INF), a)
        A = torch.logsumexp(a, -1, keepdim=True)
        AY = torch.logsumexp(lab, -1, keepdim=True)
        AN = torch.logsumexp(non, -1, keepdim=True)
        M = (AN - A)[..., 0]  # log(1 - p_y) <= 0 (-inf: no non-label position)
        finN = torch.isfinite(AN)
        g = torch.where(ymask, -torch.exp(lab - AY),
                        torch.where(finN, torch.exp(non - torch.where(finN, AN, 0.0)), 0.0))
        lo = -torch.log1p(-torch.exp(M))  # loss_i = -log p_y
        logl = torch.where(lo > 0, torch.log(lo), M)  # log loss_i (= M once e^M underflows)
        return M, g, lo, logl

    def _gen_terms(self, a, t):
        st = softmax_terms(a)
        X = t["X"]
        xk = X.expand(a.shape[0], *X.shape[1:]).gather(
            2, st.k[..., None].expand(*st.k.shape, X.shape[-1]))  # (B, n, 1, d)
        D = X - xk  # (B, n, T, d), 0 at the anchor
        dr = torch.einsum("bnt,bntd->bnd", st.r, D)
        u = xk[:, :, 0] + st.eM[..., None] * dr
        o = torch.einsum("bkd,bnd->bnk", t["E"], u)
        lse = torch.logsumexp(o, -1)
        p = torch.softmax(o, -1)
        yid = t["yid"].expand(a.shape[0], -1)
        p = p - torch.nn.functional.one_hot(yid, o.shape[-1]).to(p.dtype)
        h = torch.einsum("bkd,bnk->bnd", t["E"], p)
        c = torch.einsum("bntd,bnd->bnt", D, h)
        cbar = (st.r * c).sum(-1, keepdim=True)
        g = st.r * (c - st.eM[..., None] * cbar)
        g = g.scatter(-1, st.k, -(st.s.gather(-1, st.k) * cbar))
        lo = lse - o.gather(-1, yid[..., None])[..., 0]
        return st.M, g, lo, torch.log(lo)

    def evaluate(self, params, t: dict, grad: bool = True) -> NTPObjective:
        """(L (B,), log L (B,), scaled gradient) in the stable form (module docstring)."""
        with torch.no_grad():
            a = self.logits(params, t)
            n = a.shape[1]
            M, g, lo, logl = (self._iden_terms(a, t["ymask"]) if self.head == "iden"
                              else self._gen_terms(a, t))
            L = lo.mean(-1)
            logL = torch.logsumexp(logl, -1) - math.log(n)
            if not grad:
                return NTPObjective(L, logL, None)
            fac, top = _row_factors((M - math.log(n))[..., None])
            Ga = g * fac  # (B, n, T)
            GX = (Ga[..., None, :] @ t["X"])[..., 0, :]  # sum_t Ga_it x_it: (B, n, d)
            G = GX.transpose(-1, -2) @ t["Z"]  # (B, d, d)
            if self.param == "W":
                raw = {"W": G}
            else:
                raw = {"K": G @ params["Q"], "Q": G.transpose(-1, -2) @ params["K"]}
            return NTPObjective(L, logL, _scaled(raw, top))


# ------------------------------------------------------------------ trainer
def _corr(W: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    Wf, Rf = W.reshape(W.shape[0], -1), R.reshape(R.shape[0], -1)
    wm = Wf.abs().amax(1, keepdim=True).clamp_min(1e-300)
    rm = Rf.abs().amax(1, keepdim=True).clamp_min(1e-300)
    Wf, Rf = Wf / wm, Rf / rm
    return (Wf * Rf).sum(1) / (Wf.norm(dim=1) * Rf.norm(dim=1)).clamp_min(1e-300)


def train_ntp(model: NTPModel, data, optimizer=None, steps: int = 1000, B: int | None = None,
              seed: int = 0, init="random", scale: float | None = None,
              record_every: int | None = None, references: dict | None = None,
              record_params: bool = False, device=None, dtype=torch.float64, progress=False):
    """Train B trials of an :class:`NTPModel` (full batch, every step rule of
    :mod:`attnsvm.optim`); returns an :class:`attnsvm.train.Trajectory`.

    data: an NTPData (shared by the trials) or a list of B NTPData of one shape (one
    dataset per trial: a population).  init: "random" | "zero" | {name: (B, ...)};
    scale: the Frobenius norm of each initial tensor (default sqrt(d / 3), that of the
    public code's nn.Linear default init).  references: {name: (d, d) or (B, d, d)} adds
    ``corr_<name>`` = <W, R> / (||W|| ||R||).  Metrics every ``record_every`` steps (default
    max(1, steps // 100)) and at the last step: loss, log10_loss, norm, ``corr_<ref>``.
    A trial stops ("non-finite step") when an update would overflow; "zero gradient"
    when its gradient is exactly 0.

    Example::

        >>> from attnsvm.ntp import NTPModel, ntp_random, train_ntp
        >>> from attnsvm.svm import graph_svm
        >>> data = ntp_random(4, 6, 8, 8, seed=0)
        >>> svm = graph_svm(data.E, data.seqs, data.y)
        >>> traj = train_ntp(NTPModel(8), data, "ngd", steps=200, B=2, references={"svm": svm.W_})
        >>> last = traj.metrics.groupby("trial").last()
        >>> bool((last.corr_svm > 0.9).all()), list(last.index)
        (True, [0, 1])
    """
    from .._validation import INT64_MAX, Interval, check_param
    from ..optim import get as get_optimizer
    from ..optim import ngd
    from ..train import Trajectory

    if not isinstance(model, NTPModel):
        raise ValueError(f"model must be an NTPModel; got {type(model).__name__}")
    optimizer = ngd(0.1) if optimizer is None else get_optimizer(optimizer)
    if optimizer.batch_size is not None:
        raise ValueError("NTP training is full-batch: stochastic rules (batch_size) are not supported")
    steps = check_param("steps", steps, [Interval(int, 0, None)])
    seed = check_param("seed", seed, [Interval(int, 0, INT64_MAX)])
    t = ntp_tensors(data, device=device, dtype=dtype)
    if t["X"].shape[-1] != model.d:
        raise ValueError(f"the model has d = {model.d} but the data has d = {t['X'].shape[-1]}")
    Bx = t["X"].shape[0]
    B = Bx if B is None else check_param("B", B, [Interval(int, 1, None)])
    if Bx != 1 and B != Bx:
        raise ValueError(f"data holds {Bx} datasets but B = {B} trials were requested")
    scale = math.sqrt(model.d / 3.0) if scale is None else scale
    if isinstance(init, dict):
        params = {k: torch.as_tensor(v, device=device, dtype=dtype).clone() for k, v in init.items()}
        for k, shp in model.param_shapes().items():
            if k not in params or tuple(params[k].shape) != (B, *shp):
                raise ValueError(f"init[{k!r}] must have shape {(B, *shp)}")
    else:
        params = model.init(B, seed, scale, init, device, dtype)
    refs = {}
    for name, R in (references or {}).items():
        R = torch.as_tensor(np.asarray(R, float), device=device, dtype=dtype)
        R = R.expand(B, model.d, model.d) if R.ndim == 2 else R
        if R.shape != (B, model.d, model.d):
            raise ValueError(f"references[{name!r}] must be (d, d) or (B, d, d); got {tuple(R.shape)}")
        refs[name] = R
    k = max(1, steps // 100) if record_every is None else check_param("record_every", record_every,
                                                                    [Interval(int, 1, None)])
    state = optimizer.init(params)
    active = torch.ones(B, dtype=torch.bool, device=t["X"].device)
    stop_step = np.full(B, -1)
    reason = np.full(B, "", dtype=object)
    rows, rec_steps, hist = [], [], []

    def record(step, ev):
        W = model.W(params)
        vals = {"loss": ev.loss, "log10_loss": ev.log_gap / math.log(10.0),
                "norm": W.reshape(B, -1).norm(dim=1)}
        for name, R in refs.items():
            vals[f"corr_{name}"] = _corr(W, R)
        rec_steps.append(step)
        rows.append({kk: v.detach().cpu().numpy() for kk, v in vals.items()})
        if record_params:
            hist.append(W.detach().cpu().numpy().copy())

    it = range(steps)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="train (ntp)", unit="step")
    ev = model.evaluate(params, t)
    last = -1
    for step in it:
        if step % k == 0:
            record(step, ev)
            last = step
        zero = ~ev.grads.nonzero() & active
        if zero.any():
            stop_step[zero.cpu().numpy()] = step
            reason[zero.cpu().numpy()] = "zero gradient"
            active &= ~zero
        new, new_state = optimizer.update(ev.grads, state, params, ev.log_gap)
        bad = ~model.finite(new) & active
        if bad.any():
            stop_step[bad.cpu().numpy()] = step
            reason[bad.cpu().numpy()] = "non-finite step"
            active &= ~bad
        params = {kk: torch.where(active.reshape(B, *([1] * (v.ndim - 1))), new[kk], v)
                  for kk, v in params.items()}
        state = {kk: torch.where(active.reshape(B, *([1] * (v.ndim - 1))), new_state[kk], v)
                 for kk, v in state.items()} if state else state
        ev = model.evaluate(params, t)
        if not bool(active.any()):
            steps = step + 1
            break
    if last != steps:
        record(steps, ev)
    R = len(rec_steps)
    df = pd.DataFrame({kk: np.stack([r[kk] for r in rows], 1).reshape(-1) for kk in rows[0]})
    df.insert(0, "step", np.tile(np.asarray(rec_steps), B))
    df.insert(0, "trial", np.repeat(np.arange(B), R))
    return Trajectory(
        params={kk: v.detach() for kk, v in params.items()}, metrics=df,
        W=model.W(params).detach().cpu().numpy(), steps_run=steps,
        record_steps=np.asarray(rec_steps), stop_step=stop_step,
        param_history={"W": np.stack(hist)} if record_params else None,
        stop_reason=reason.astype(str), state=state, extra={"engine": "torch", "model": "ntp"})


