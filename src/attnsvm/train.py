"""Batched trainer: B independent trials in one tensor program (THEORY.md §6-8).

    traj = train(WModel(d), data, loss="logistic", optimizer=ngd(lr=0.1), steps=1000, B=100)
    traj.metrics      tidy DataFrame, one row per (trial, step)
    traj.params       final parameters, dict of (B, ...) tensors
    traj.W            final effective W (B, d, d) [Prompt: p (B, d)] as numpy

Trials whose gradient is exactly zero are frozen (their parameters stop changing; the
row column ``stopped`` turns True) and the run ends when every trial has stopped. A
step that would produce a non-finite parameter also freezes its trial.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from .metrics import correlation
from .models import AttentionModel, prepare
from .optim import Optimizer, ngd

__all__ = ["train", "Trajectory", "minibatch"]


@dataclass
class Trajectory:
    """Result of ``train``.

    params: final parameters {name: (B, ...) tensor}; metrics: DataFrame with columns
    trial, step, loss, loss_gap, norm [, norm_nuc, norm_head], p_sel_mean, p_sel_min,
    p_max, soft_sparsity, corr_<ref>..., stopped; W: final model.W(params) as numpy;
    param_history: {name: (n_records, B, ...)} if ``record_params``; record_steps:
    (n_records,) steps at which metrics were recorded; steps_run: steps executed;
    stop_step: (B,) step at which each trial stopped (-1: still running at the end).
    """

    params: dict
    metrics: pd.DataFrame
    W: np.ndarray
    steps_run: int
    record_steps: np.ndarray
    stop_step: np.ndarray
    param_history: dict | None = None
    alpha: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def stopped(self) -> np.ndarray:
        return self.stop_step >= 0


def _init_params(model, init, B, seed, scale, device, dtype):
    if isinstance(init, str):
        return model.init(B, seed=seed, scale=scale, kind=init, device=device, dtype=dtype)
    if not isinstance(init, dict):
        raise ValueError(f"init must be a kind {('random', 'zero', 'balanced', 'unbalanced')} or a dict")
    shapes = model.param_shapes()
    if set(init) != set(shapes):
        raise ValueError(f"init must have the keys {sorted(shapes)}; got {sorted(init)}")
    out = {}
    for k, shp in shapes.items():
        t = torch.as_tensor(np.asarray(init[k]) if not isinstance(init[k], torch.Tensor) else init[k])
        t = t.to(device=device, dtype=dtype).clone()
        if tuple(t.shape) == shp:
            t = t.expand(B, *shp).clone()
        if tuple(t.shape) != (B, *shp):
            raise ValueError(f"init[{k!r}] must have shape {shp} or {(B, *shp)}; got {tuple(t.shape)}")
        out[k] = t
    return out


def _dict_batch(init, model, Bx):
    shapes = model.param_shapes()
    for k, shp in shapes.items():
        if k in init and np.ndim(init[k]) == len(shp) + 1:
            return int(np.shape(init[k])[0])
    return Bx


def _alpha_tensor(model, tdata, alpha, Q, B):
    """Selected tokens as a (Bx, n, Q) long tensor, or None (no v and no alpha)."""
    if alpha is None:
        if tdata.get("v") is None:
            return None
        return model._gamma(tdata, Q).argmax(-1)
    a = torch.as_tensor(np.asarray(alpha), dtype=torch.long, device=tdata["X"].device)
    n = tdata["X"].shape[1]
    if a.ndim >= 1 and a.shape[-1] == n and Q == 1:
        a = a[..., None]
    if a.ndim == 2:
        a = a[None]
    T = tdata["X"].shape[2]
    if a.ndim != 3 or a.shape[1:] != (n, Q) or a.shape[0] not in (1, B):
        raise ValueError(f"alpha must have shape (n,) = ({n},) or (B, n) = ({B}, {n}) "
                         f"[seq2seq (n, T)]; got {tuple(np.shape(alpha))}")
    if bool(((a < 0) | (a >= T)).any()):
        raise ValueError(f"alpha must hold token indices in [0, T = {T}); got {np.asarray(alpha).tolist()}")
    return a


def minibatch(tdata: dict, B: int, batch_size: int, gen: torch.Generator) -> dict:
    """Per-trial random subsets of ``batch_size`` sequences (without replacement): every
    field gets a leading B. Draws from ``gen`` (CPU generator) -> reproducible."""
    X = tdata["X"]
    n = X.shape[1]
    idx = torch.rand(B, n, generator=gen).argsort(dim=1)[:, :batch_size].to(X.device)
    out = {}
    for k, t in tdata.items():
        if k.startswith("_"):  # caches of the full data
            continue
        if t is None or k == "v":
            out[k] = None if t is None else t.expand(B, *t.shape[1:])
            continue
        t = t.expand(B, *t.shape[1:])
        ix = idx.reshape(B, batch_size, *([1] * (t.ndim - 2))).expand(B, batch_size, *t.shape[2:])
        out[k] = t.gather(1, ix)
    return out


def _record(model, params, tdata, lossf, alpha, refs, Q):
    """Per-trial metrics (B, n_metrics) and their names."""
    with torch.no_grad():
        L, gap, _ = model.objective(params, tdata, lossf, grad=False)
        a = model._logits(params, tdata)
        s = torch.softmax(a, dim=-1)  # (B, n, Q, T)
        B = s.shape[0]
        cols = {"loss": L, "loss_gap": gap}
        cols.update(model.norms(params))
        if alpha is not None:
            ix = alpha.expand(B, *alpha.shape[1:])[..., None]
            psel = s.gather(-1, ix)[..., 0].reshape(B, -1)
            cols["p_sel_mean"] = psel.mean(1)
            cols["p_sel_min"] = psel.min(1).values
        flat = s.reshape(B, -1, s.shape[-1])
        cols["p_max"] = flat.max(-1).values.mean(1)
        cols["soft_sparsity"] = (1.0 / flat.pow(2).sum(-1)).mean(1)
        Wc = model.W(params)
        for name, R in refs.items():
            cols[f"corr_{name}"] = correlation(Wc, R, vector=Wc.ndim == 2)
    names = list(cols)
    return names, torch.stack([cols[k].to(torch.float64).reshape(B) for k in names], dim=1)


def train(model: AttentionModel, data, loss="logistic", optimizer: Optimizer | None = None,
          steps: int = 1000, B: int | None = None, seed: int = 0, init="random",
          scale: float = 0.1, record_every: int | None = None, references: dict | None = None,
          record_params: bool = False, progress: bool = False, device=None,
          dtype=torch.float64, alpha=None, batch_size: int | None = None,
          autograd: bool = False) -> Trajectory:
    """Train B independent trials of ``model`` on ``data`` with a step rule.

    Each step: (L, L - L*, G) = model.objective(params, data) (stable form, §8),
    params <- optimizer.step(params, G, L - L*) for the trials still running.
    A trial stops when G is exactly 0 (or a step would be non-finite).

    data: TokenData, unbatched (shared by all trials) or batched with B datasets.
    init: "random" | "zero" | "balanced" | "unbalanced" (with ``scale``, ``seed``) or a
    dict {name: (..) or (B, ..)} of initial parameters.
    record_every: metrics every k steps (default max(1, steps // 100)) plus the first
    and last step. references: {name: (d, d) or (B, d, d) [Prompt: (d,) or (B, d)]};
    adds corr_<name> = <W, R> / (|W| |R|). alpha: selected tokens for p_sel (default
    opt = argmax gamma when data has v). batch_size (or optimizer.batch_size):
    mini-batch of sequences per trial and step (SGD/SNGD), drawn from ``seed``.
    autograd: use torch.autograd of the stable objective instead of the closed-form gradient
    (linear heads, fixed or trained; other heads always use autograd).
    """
    from .losses import get_loss

    lossf = get_loss(loss)
    optimizer = ngd(0.1) if optimizer is None else optimizer
    tdata = prepare(data, device=device, dtype=dtype)
    Bx = tdata["X"].shape[0]
    if B is None:
        B = Bx if not isinstance(init, dict) else _dict_batch(init, model, Bx)
    if Bx != 1 and B != Bx:
        raise ValueError(f"data holds B = {Bx} datasets but B = {B} trials were requested")
    if steps < 0:
        raise ValueError(f"steps must be >= 0; got {steps}")
    params = _init_params(model, init, B, seed, scale, device, dtype)
    Q = model._logits(params, tdata).shape[2] if steps >= 0 else 1
    alpha_t = _alpha_tensor(model, tdata, alpha, Q, B)
    refs = {}
    for name, R in (references or {}).items():
        refs[name] = torch.as_tensor(np.asarray(R), device=tdata["X"].device, dtype=dtype)
    bs = batch_size if batch_size is not None else optimizer.batch_size
    n = tdata["X"].shape[1]
    if bs is not None and not 1 <= bs <= n:
        raise ValueError(f"batch_size must be in [1, n = {n}]; got {bs}")
    gen = torch.Generator().manual_seed(int(seed) + 7919)
    k = max(1, steps // 100) if record_every is None else int(record_every)
    if k < 1:
        raise ValueError(f"record_every must be >= 1; got {record_every}")

    active = torch.ones(B, dtype=torch.bool, device=tdata["X"].device)
    stop_step = torch.full((B,), -1, dtype=torch.long)
    rec_steps, rec_vals, hist, names = [], [], [], None

    def record(t):
        nonlocal names
        names, vals = _record(model, params, tdata, lossf, alpha_t, refs, Q)
        rec_steps.append(t)
        rec_vals.append(torch.cat([vals, (~active).to(vals.dtype)[:, None]], dim=1))
        if record_params:
            hist.append({kk: v.detach().cpu().clone() for kk, v in params.items()})

    it = range(steps)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="train", unit="step")
    t = 0
    all_active = True
    for t in it:
        if t % k == 0:
            record(t)
        batch = tdata if bs is None else minibatch(tdata, B, bs, gen)
        _, gap, grads = model.objective(params, batch, lossf, autograd=autograd,
                                        need_gap=optimizer.needs_gap)
        # exactly zero: every entry 0 (a squared norm would underflow already at |G| ~ 1e-162)
        nonzero = torch.stack([(g.reshape(B, -1) != 0).any(1) for g in grads.values()]).any(0)
        zero = ~nonzero & active
        if bool(zero.any()):
            stop_step[zero.cpu()] = t
            active = active & ~zero
            all_active = False
            if not bool(active.any()):
                break
        new = optimizer.step(params, grads, gap)
        # one reduction per trial: non-finite (or overflowing) parameters freeze the trial
        fin = torch.isfinite(sum(v.reshape(B, -1).sum(1) for v in new.values()))
        if not bool(fin.all()):
            bad = ~fin & active
            stop_step[bad.cpu()] = t
            active = active & fin
            all_active = False
        if all_active:
            params = new
        else:
            params = {kk: torch.where(active.reshape(B, *([1] * (v.ndim - 1))), new[kk], v)
                      for kk, v in params.items()}
            if not bool(active.any()):
                t += 1
                break
    else:
        t = steps
    steps_run = t
    if rec_steps and rec_steps[-1] == steps_run:  # re-record: stop flags may have changed
        rec_steps.pop()
        rec_vals.pop()
        if record_params:
            hist.pop()
    record(steps_run)

    vals = torch.stack(rec_vals).cpu().numpy()  # (R, B, M)
    R = len(rec_steps)
    df = pd.DataFrame(vals.transpose(1, 0, 2).reshape(B * R, -1), columns=[*names, "stopped"])
    df.insert(0, "step", np.tile(np.asarray(rec_steps), B))
    df.insert(0, "trial", np.repeat(np.arange(B), R))
    df["stopped"] = df["stopped"].astype(bool)
    history = None
    if record_params:
        history = {kk: np.stack([h[kk].numpy() for h in hist]) for kk in params}
    return Trajectory(
        params={kk: v.detach() for kk, v in params.items()},
        metrics=df,
        W=model.W(params).detach().cpu().numpy(),
        steps_run=steps_run,
        record_steps=np.asarray(rec_steps),
        stop_step=stop_step.numpy(),
        param_history=history,
        alpha=None if alpha_t is None else alpha_t.cpu().numpy(),
    )
