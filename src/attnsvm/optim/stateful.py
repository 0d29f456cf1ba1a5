"""Step rules with state: heavy-ball momentum, Adam / AdamW, Adagrad, Signum and Muon.

Each is a chain of :mod:`.transforms` (optax's shape): the state is the union of its
transforms' states, a dict of tensors that all carry the leading trial dim B (the trainer
freezes a stopped trial's state with its parameters). Moments of normalised rules are
kept in scaled form (tensor with max|.| = 1 times exp(log scale) per trial), and Adam's
and Adagrad's second moments as elementwise logarithms, so that their directions stay
exact when the gradient underflows float64 (see :mod:`attnsvm.optim.base`).
"""

from __future__ import annotations

from .base import Optimizer, check_lr, check_lr_or_schedule, check_unit, register
from .transforms import (
    add_decayed_weights,
    newton_schulz,
    orthogonalize,
    rule,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_rss,
    scale_by_sign,
    trace,
    trace_scaled,
)

__all__ = ["momentum", "adam", "adamw", "adagrad", "signum", "muon", "newton_schulz"]


@register("momentum", "heavy_ball")
def momentum(lr: float = 0.1, beta: float = 0.9, nesterov: bool = False) -> Optimizer:
    """Heavy-ball momentum (torch.optim.SGD semantics, no dampening):

        m <- beta m + G;   W <- W - lr m   (nesterov: W <- W - lr (G + beta m))."""
    lr, beta = check_lr(lr), check_unit(beta, "beta")
    return rule("momentum", {"lr": lr, "beta": beta, "nesterov": bool(nesterov)},
                trace(beta, nesterov), scale_by_learning_rate(lr))


def _adam(name: str, lr, b1, b2, eps, weight_decay) -> Optimizer:
    lr = check_lr_or_schedule(lr)
    moments = scale_by_adam(b1, b2, eps)  # checks b1, b2, eps
    hyper = {"lr": lr, "b1": float(b1), "b2": float(b2), "eps": float(eps)}
    if name == "adamw":
        decay = add_decayed_weights(weight_decay)  # checks weight_decay
        hyper["weight_decay"] = float(weight_decay)
        return rule(name, hyper, moments, decay, scale_by_learning_rate(lr))
    return rule(name, hyper, moments, scale_by_learning_rate(lr))


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
    """AdamW (torch.optim.AdamW semantics): W <- W - lr (u + wd W), u the Adam direction
    (= W (1 - lr wd) - lr u); ``lr`` a number or a schedule, as in :func:`adam`."""
    return _adam("adamw", lr, b1, b2, eps, weight_decay)


@register("adagrad")
def adagrad(lr: float = 1e-2, eps: float = 1e-10, initial: float = 0.0) -> Optimizer:
    """Adagrad (torch.optim.Adagrad semantics, no lr decay): v <- v + G^2,
    W <- W - lr G / (sqrt(v) + eps), v_0 = ``initial``; ``lr`` a number or a schedule."""
    return rule("adagrad", {"lr": check_lr_or_schedule(lr), "eps": float(eps),
                            "initial": float(initial)},
                scale_by_rss(eps, initial), scale_by_learning_rate(lr))


@register("signum")
def signum(lr: float = 0.1, beta: float = 0.9) -> Optimizer:
    """Signum: m <- beta m + (1 - beta) G,  W <- W - lr sign(m) (beta = 0: sign descent).
    m is kept scaled, so sign(m) is exact for any size of G."""
    lr, beta = check_lr(lr), check_unit(beta, "beta")
    return rule("signum", {"lr": lr, "beta": beta},
                trace_scaled(beta, 1.0 - beta), scale_by_sign(), scale_by_learning_rate(lr))


@register("muon")
def muon(lr: float = 0.02, beta: float = 0.95, nesterov: bool = True,
         ns_steps: int | None = None) -> Optimizer:
    """Muon: momentum, then the orthogonal polar factor (spectral steepest direction):

        m <- beta m + G,   D = polar(G + beta m) [nesterov] or polar(m),   W <- W - lr D,

    polar(A) = U V^T for A = U S V^T by an exact SVD in float64 (``ns_steps``: Muon's
    Newton-Schulz iteration instead). Vector parameters (B, d) take D = A / ||A||_2 (the
    spectral steepest direction of a vector). beta = 0 is spectral descent."""
    lr, beta = check_lr(lr), check_unit(beta, "beta")
    return rule("muon", {"lr": lr, "beta": beta, "nesterov": bool(nesterov), "ns_steps": ns_steps},
                trace_scaled(beta, 1.0, nesterov), orthogonalize(ns_steps),
                scale_by_learning_rate(lr))
