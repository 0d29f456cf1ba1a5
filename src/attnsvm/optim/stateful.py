"""Step rules with state: heavy-ball momentum, Adam / AdamW, Signum and Muon.

State is a dict of tensors that all carry the leading trial dim B (the trainer freezes
a stopped trial's state with its parameters). Moments of normalised rules are kept in
scaled form (tensor with max|.| = 1 times exp(log scale) per trial), and Adam's second
moment as an elementwise logarithm, so that their directions stay exact when the
gradient underflows float64 (see :mod:`attnsvm.optim.base`).
"""

from __future__ import annotations

import math

import torch

from attnsvm.norms import SPECTRAL, polar

from .base import (
    Optimizer,
    as_scaled,
    check_lr,
    check_lr_or_schedule,
    check_unit,
    expand,
    item_steepest,
    item_view,
    register,
    scaled_sum,
)

__all__ = ["momentum", "adam", "adamw", "signum", "muon", "newton_schulz"]


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def _lin_comb(m, lm, a: float, g, lg, b: float):
    """(a m e^{lm} + b g e^{lg}) in scaled form (see :func:`scaled_sum`)."""
    return scaled_sum(m, lm, a, g, lg, b)


def _scaled_state(params, *names):
    st = {}
    for k, P in params.items():
        B = P.shape[0]
        for n in names:
            st[f"{n}:{k}"] = torch.zeros_like(P)
            st[f"l{n}:{k}"] = torch.full((B,), -math.inf, dtype=P.dtype, device=P.device)
    return st


@register("momentum", "heavy_ball")
def momentum(lr: float = 0.1, beta: float = 0.9, nesterov: bool = False) -> Optimizer:
    """Heavy-ball momentum (torch.optim.SGD semantics, no dampening):

        m <- beta m + G;   W <- W - lr m   (nesterov: W <- W - lr (G + beta m))."""
    lr, beta = check_lr(lr), check_unit(beta, "beta")

    def init(params):
        return {f"m:{k}": torch.zeros_like(P) for k, P in params.items()}

    def update(grads, state, params, log_gap=None):
        G = as_scaled(grads).value()
        out, new = {}, {}
        for k, P in params.items():
            m = beta * state[f"m:{k}"] + G[k]
            new[f"m:{k}"] = m
            out[k] = P - lr * (G[k] + beta * m if nesterov else m)
        return out, new

    return Optimizer("momentum", init, update,
                     {"lr": lr, "beta": beta, "nesterov": bool(nesterov), "_stateful": True})


def _adam(name: str, lr, b1, b2, eps, weight_decay) -> Optimizer:
    lr, b1 = check_lr_or_schedule(lr), check_unit(b1, "b1")
    b2 = check_unit(b2, "b2", lo_open=True)
    eps = float(eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    wd = float(weight_decay)
    if not (math.isfinite(wd) and wd >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0; got {weight_decay!r}")

    def init(params):
        st = _scaled_state(params, "m")
        for k, P in params.items():
            st[f"lv:{k}"] = torch.full_like(P, -math.inf)  # elementwise log v
        P0 = next(iter(params.values()))
        st["t"] = torch.zeros(P0.shape[0], dtype=P0.dtype, device=P0.device)
        return st

    def update(grads, state, params, log_gap=None):
        g = as_scaled(grads)
        t = state["t"] + 1
        lc1 = torch.log1p(-torch.pow(b1, t))       # log(1 - b1^t)
        lc2 = torch.log1p(-torch.pow(b2, t))       # log(1 - b2^t)
        out, new = {}, {"t": t}
        lr_t = lr(state["t"]) if callable(lr) else lr  # a schedule sees the steps taken (B,)
        for k, P in params.items():
            eta = expand(lr_t, P) if callable(lr) else lr
            Gs, lg = g.tensors[k], g.log_scale[k]
            m, lm = _lin_comb(state[f"m:{k}"], state[f"lm:{k}"], b1, Gs, lg, 1.0 - b1)
            lG2 = 2.0 * (torch.log(Gs.abs()) + expand(lg, Gs))  # log G^2, elementwise
            lv = torch.logaddexp(state[f"lv:{k}"] + _log(b2), lG2 + _log(1.0 - b2))
            # u = m_hat / (sqrt(v_hat) + eps) with m_hat = m / c1, v_hat = v / c2:
            #   = m_s e^{lm} sqrt(c2) e^{-lv/2} / c1 / (1 + eps sqrt(c2) e^{-lv/2})
            e = expand(lm - lc1 + 0.5 * lc2, P) - 0.5 * lv
            u = m * torch.exp(e)
            if eps > 0:
                u = u / (1.0 + eps * torch.exp(expand(0.5 * lc2, P) - 0.5 * lv))
            u = torch.where(torch.isfinite(lv), u, torch.zeros_like(u))
            base = P * (1.0 - eta * wd) if wd else P
            out[k] = base - eta * u
            new[f"m:{k}"], new[f"lm:{k}"], new[f"lv:{k}"] = m, lm, lv
        return out, new

    hyper = {"lr": lr, "b1": b1, "b2": b2, "eps": eps, "_stateful": True}
    if name == "adamw":
        hyper["weight_decay"] = wd
    return Optimizer(name, init, update, hyper)


@register("adam")
def adam(lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    """Adam (torch.optim.Adam semantics, elementwise, per trial):

        m <- b1 m + (1 - b1) G,   v <- b2 v + (1 - b2) G^2,
        W <- W - lr m_hat / (sqrt(v_hat) + eps),  m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t).

    ``eps`` may be 0 (then Adam is scale-invariant in G, a smoothed sign descent). m is kept
    scaled and v as log v elementwise: exact for any size of G. ``lr`` may be a schedule,
    a callable of the per-trial count of steps taken t (B,) -> eta_t (B,), e.g.
    ``InversePower(0.1, 0.5)``: eta_t = 0.1 (t + 2)^(-1/2) (torch: ``LambdaLR``)."""
    return _adam("adam", lr, b1, b2, eps, 0.0)


@register("adamw")
def adamw(lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 1e-2) -> Optimizer:
    """AdamW (torch.optim.AdamW semantics): W <- W (1 - lr wd), then the Adam step; ``lr``
    a number or a schedule, as in :func:`adam`."""
    return _adam("adamw", lr, b1, b2, eps, weight_decay)


@register("signum")
def signum(lr: float = 0.1, beta: float = 0.9) -> Optimizer:
    """Signum: m <- beta m + (1 - beta) G,  W <- W - lr sign(m) (beta = 0: sign descent).
    m is kept scaled, so sign(m) is exact for any size of G."""
    lr, beta = check_lr(lr), check_unit(beta, "beta")

    def update(grads, state, params, log_gap=None):
        g = as_scaled(grads)
        out, new = {}, {}
        for k, P in params.items():
            m, lm = _lin_comb(state[f"m:{k}"], state[f"lm:{k}"], beta, g.tensors[k],
                              g.log_scale[k], 1.0 - beta)
            new[f"m:{k}"], new[f"lm:{k}"] = m, lm
            out[k] = P - lr * torch.sign(m)
        return out, new

    return Optimizer("signum", lambda params: _scaled_state(params, "m"), update,
                     {"lr": lr, "beta": beta, "_stateful": True})


def newton_schulz(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximate polar factor of G (..., d, e) by the quintic Newton-Schulz iteration of
    Muon (coefficients (3.4445, -4.7750, 2.0315), from X_0 = G / ||G||_F): its singular
    values land in roughly [0.7, 1.2], not exactly 1 (use :func:`attnsvm.norms.polar`
    for the exact factor)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    tr = G.shape[-2] > G.shape[-1]
    X = G.transpose(-1, -2) if tr else G
    n = torch.linalg.matrix_norm(X).clamp_min(1e-300)
    X = X / n[..., None, None]
    for _ in range(int(steps)):
        A = X @ X.transpose(-1, -2)
        X = a * X + (b * A + c * A @ A) @ X
    return X.transpose(-1, -2) if tr else X


@register("muon")
def muon(lr: float = 0.02, beta: float = 0.95, nesterov: bool = True,
         ns_steps: int | None = None) -> Optimizer:
    """Muon: momentum, then the orthogonal polar factor (spectral steepest direction):

        m <- beta m + G,   D = polar(G + beta m) [nesterov] or polar(m),   W <- W - lr D,

    polar(A) = U V^T for A = U S V^T by an exact SVD in float64 (``ns_steps``: Muon's
    Newton-Schulz iteration instead). Vector parameters (B, d) take D = A / ||A||_2 (the
    spectral steepest direction of a vector). beta = 0 is spectral descent."""
    lr, beta = check_lr(lr), check_unit(beta, "beta")
    if ns_steps is not None and (int(ns_steps) != ns_steps or ns_steps < 1):
        raise ValueError(f"ns_steps must be a positive integer or None; got {ns_steps!r}")

    def update(grads, state, params, log_gap=None):
        g = as_scaled(grads)
        out, new = {}, {}
        for k, P in params.items():
            Gs, lg = g.tensors[k], g.log_scale[k]
            m, lm = _lin_comb(state[f"m:{k}"], state[f"lm:{k}"], beta, Gs, lg, 1.0)
            new[f"m:{k}"], new[f"lm:{k}"] = m, lm
            A = _lin_comb(Gs, lg, 1.0, m, lm, beta)[0] if nesterov else m
            if A.ndim == 2:  # a vector: its spectral steepest direction is A / ||A||_2
                D = item_steepest(SPECTRAL, A)
            else:
                M = item_view(A)
                D = (polar(M) if ns_steps is None else newton_schulz(M, ns_steps)).reshape(A.shape)
            out[k] = P - lr * D
        return out, new

    return Optimizer("muon", lambda params: _scaled_state(params, "m"), update,
                     {"lr": lr, "beta": beta, "nesterov": bool(nesterov), "ns_steps": ns_steps,
                      "_stateful": True})
