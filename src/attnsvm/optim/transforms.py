"""Gradient transforms chained into step rules, as optax's ``chain`` (batched over trials).

A :class:`Transform` is a pair of pure functions with explicit state::

    state = t.init(params)                                  # {key: (B, ...) tensor}
    updates, state = t.update(updates, state, params, log_gap)

``updates`` enter the first transform as the scaled gradient (:class:`~.base.Scaled`) and
leave each transform either scaled or as a plain dict {name: (B, ...)}; the last transform
of a rule is an *apply* step that returns the new parameters (:func:`descend`:
params - u, the sign convention of every rule here; :func:`mirror_step`: l_p mirror
descent). :func:`chain` composes transforms; :func:`rule` makes the chain an
:class:`~.base.Optimizer` with a name and its hyper-parameters::

    adagrad = rule("adagrad", {"lr": 0.1}, scale_by_rss(), scale_by_learning_rate(0.1))

State keys of the transforms of one chain must differ (a ValueError says which clash).
Transforms whose state changes later steps are ``stateful`` (momentum, moments,
counters of a schedule); the trainer then never calls an unchanged step a stall.

Each transform the compiled engine can run carries its counterpart as data,
``kernel = KernelOp(opcode, numbers)`` (:mod:`.kernel_ops`); a rule whose transforms all
carry one has ``Optimizer.kernel`` = their tuple, which :mod:`attnsvm.fused` reads.

Transforms: :func:`scale_by_learning_rate` (a number, per-trial tensor or schedule),
:func:`scale_by_steepest` (D*(G) in a norm, per tensor or in the l_2 product over
tensors), :func:`scale_by_sign`, :func:`normalize_by` (G / ||G||), :func:`scale_by_param_norm`
(relative step), :func:`trace` (heavy-ball momentum), :func:`trace_scaled` (a scaled
moving average: Signum's and Muon's momentum), :func:`scale_by_adam`, :func:`scale_by_rss`
(Adagrad), :func:`orthogonalize` (polar factor: Muon), :func:`add_decayed_weights`,
:func:`scale_by_polyak`, and the apply steps :func:`descend`, :func:`mirror_step`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from attnsvm.metrics import inverse_mirror_map, mirror_map
from attnsvm.norms import FRO, SPECTRAL, get_norm, polar

from .base import (
    Optimizer,
    Scaled,
    as_scaled,
    check_lr,
    check_lr_or_schedule,
    check_unit,
    expand,
    item_norm,
    item_steepest,
    item_view,
    log_global_norm,
    log_norm,
    no_state,
    scaled_sum,
)
from .kernel_ops import PARAM_MAX, POLYAK_CAP, KernelOp, Op, lp_args

__all__ = [
    "Transform", "chain", "rule", "scale_by_learning_rate", "scale_by_steepest", "scale_by_sign",
    "normalize_by", "scale_by_param_norm", "trace", "trace_scaled", "scale_by_adam",
    "scale_by_rss", "orthogonalize", "newton_schulz", "add_decayed_weights", "scale_by_polyak",
    "descend", "mirror_step", "PARAM_MAX", "POLYAK_CAP",
]


class Transform(NamedTuple):
    """One gradient transform: ``init(params) -> state``, ``update(updates, state, params,
    log_gap) -> (updates, state)``; ``kernel``: its compiled counterpart (a
    :class:`~.kernel_ops.KernelOp`) or None; ``stateful``: its state changes later steps;
    ``needs_gap``: it reads log(L - L*) (B,)."""

    init: Callable
    update: Callable
    kernel: KernelOp | None = None
    stateful: bool = False
    needs_gap: bool = False


class Lazy(NamedTuple):
    """Unit directions with per-trial factors still to apply: the update
    u_k = (factor w_k) D_k. The steepest direction of a product norm (weights w) and the
    scalings that follow it (a relative step, the learning rate) multiply their scalars
    first and the tensor once, in the order of the reference formula
    eta = lr ||params||, u_k = (eta w_k) D_k (so the rules keep their bits)."""

    tensors: dict
    factor: object = None         # None, a number, or a per-trial tensor (B,) / (B, 1, ..)
    weights: dict | None = None   # {name: (B,)} or None

    def value(self, consume: bool = False) -> dict:
        """{k: (factor w_k) D_k}. ``consume``: the last use of this update (the apply
        step's): the products are written into the directions D_k, which are the Lazy's
        own (every steepest direction is a fresh tensor, or the trainer's gradient it
        owns), one parameter-sized buffer fewer; the same bits."""
        out = {}
        for k, D in self.tensors.items():
            f = self.factor
            if isinstance(f, torch.Tensor) and f.ndim == 1:
                f = expand(f, D)
            if self.weights is not None:
                w = expand(self.weights[k], D)
                f = w if f is None else f * w
            if f is None:
                out[k] = D
            elif consume and (not isinstance(f, torch.Tensor) or (
                    torch.broadcast_shapes(f.shape, D.shape) == D.shape
                    and torch.result_type(f, D) == D.dtype and not D.requires_grad)):
                out[k] = D.mul_(f)
            else:
                out[k] = f * D
        return out

    def times(self, f) -> Lazy:
        """The same update times f (a number or a per-trial tensor): factor <- f factor."""
        return self._replace(factor=f if self.factor is None else f * self.factor)


def _plain(u) -> dict:
    return u.value() if isinstance(u, (Scaled, Lazy)) else u


def _lead(params) -> torch.Tensor:
    return next(iter(params.values()))


# ------------------------------------------------------------------------ chain
def chain(*transforms: Transform) -> Transform:
    """The transforms applied in order (state: the union of theirs; kernel: the tuple of
    their ops, or None if one has none)."""
    ts = tuple(transforms)
    if not ts or not all(isinstance(t, Transform) for t in ts):
        raise ValueError("chain() takes one or more Transforms")

    def init(params):
        state = {}
        for t in ts:
            s = t.init(params)
            clash = set(s) & set(state)
            if clash:
                raise ValueError(f"chain(): two transforms keep state under {sorted(clash)}")
            state.update(s)
        return state

    def update(updates, state, params, log_gap=None):
        new = {}
        for t in ts:
            updates, s = t.update(updates, state, params, log_gap)
            new.update(s)
        return updates, new

    ops = []
    for t in ts:
        if t.kernel is None:
            ops = None
            break
        ops.extend(t.kernel if isinstance(t.kernel, tuple) and not isinstance(t.kernel, KernelOp)
                   else [t.kernel])
    return Transform(init, update, None if ops is None else tuple(ops),
                     any(t.stateful for t in ts), any(t.needs_gap for t in ts))


def rule(name: str, hyper: dict, *transforms: Transform, apply: Transform | None = None,
         batch_size: int | None = None) -> Optimizer:
    """An :class:`~.base.Optimizer` named ``name`` (``hyper``: its hyper-parameters, for
    its repr and the CLI) that chains ``transforms`` and then ``apply`` (default
    :func:`descend`: params <- params - u). E.g. Adagrad in one line::

        rule("adagrad", {"lr": lr}, scale_by_rss(), scale_by_learning_rate(lr))
    """
    c = chain(*transforms, descend() if apply is None else apply)
    ops = c.kernel
    return Optimizer(name, c.init, c.update, dict(hyper), needs_gap=c.needs_gap,
                     batch_size=batch_size, kernel=ops, stateful=c.stateful)


# ------------------------------------------------------------- scale transforms
def scale_by_learning_rate(lr) -> Transform:
    """u <- eta_t u: eta a number > 0, a per-trial tensor (broadcastable to the parameters,
    e.g. (B, 1, 1)), or a schedule: a callable of the per-trial count of steps taken
    t (B,) -> eta_t (B,) (e.g. :class:`~.base.InversePower`; its count is the state
    ``"lr:t"``). Kernel: a number only."""
    lr = check_lr_or_schedule(lr)
    if callable(lr):
        def init(params):
            P0 = _lead(params)
            return {"lr:t": torch.zeros(P0.shape[0], dtype=P0.dtype, device=P0.device)}

        def update(u, state, params, log_gap=None):
            t = state["lr:t"]
            eta = lr(t)
            U = _plain(u)
            return {k: expand(eta, U[k]) * U[k] for k in U}, {"lr:t": t + 1}

        return Transform(init, update, None, stateful=True)

    def update(u, state, params, log_gap=None):
        if isinstance(u, Lazy):
            return u.times(lr), {}
        U = _plain(u)
        return {k: lr * U[k] for k in U}, {}

    kernel = KernelOp(Op.LEARNING_RATE, {"lr": lr}) if isinstance(lr, float) else None
    return Transform(no_state, update, kernel)


def _product_weights(g: Scaled, N):
    """w_k = ||G_k||_* / sqrt(sum_j ||G_j||_*^2) per trial (the steepest direction of the
    l_2 product of N over the tensors is w_k D*_k); 0 for a zero gradient."""
    ld = {k: log_norm(g, k, N.dual) for k in g.tensors}
    lt = 0.5 * torch.logsumexp(2 * torch.stack(list(ld.values())), dim=0)
    return {k: torch.where(torch.isfinite(lt), torch.exp(l - lt), torch.zeros_like(l))
            for k, l in ld.items()}


SCOPES = ("per_tensor", "global")


def scale_by_steepest(norm="fro", scope: str = "per_tensor") -> Transform:
    """u <- D*(u) = argmax_{||D|| <= 1} <u, D>, the unit steepest direction in ``norm``
    (fro: u / ||u||_F; linf: sign u; l1: the greedy coordinate; spectral: the polar factor
    U V^T; l_p: sign(u)|u|^{q-1} / ||u||_q^{q-1}), from the scaled tensors: exact however
    small u is. scope "per_tensor": each tensor its own unit direction; "global": the
    direction of the l_2 product of the norm over a trial's tensors, w_k D*(u_k) with
    w_k = ||u_k||_* / sqrt(sum_j ||u_j||_*^2). Kernel: entrywise norms."""
    N = get_norm(norm)
    if scope not in SCOPES:
        raise ValueError(f"norm scope must be 'per_tensor' or 'global'; got {scope!r}")
    glob = scope == "global"

    def update(u, state, params, log_gap=None):
        g = as_scaled(u)
        w = _product_weights(g, N) if glob else None  # (read before T is overwritten)
        # the scaled tensors have max |T| = 1 (or 0): N.steepest_unit, in place when the
        # gradient is the update's own (Scaled.owned, the trainer's step)
        return Lazy({k: item_steepest(N, T, unit=True, inplace=g.owned)
                     for k, T in g.tensors.items()}, None, w), {}

    la = lp_args(N)
    kernel = None if la is None else KernelOp(Op.STEEPEST, {**la, "global": int(glob)})
    return Transform(no_state, update, kernel)


def scale_by_sign() -> Transform:
    """u <- sign(u) entrywise (the steepest direction of the l_inf norm, per tensor)."""
    def update(u, state, params, log_gap=None):
        g = as_scaled(u)
        return {k: torch.sign(T) for k, T in g.tensors.items()}, {}

    return Transform(no_state, update, KernelOp(Op.STEEPEST, {**lp_args(get_norm("linf")),
                                                              "global": 0}))


def normalize_by(norm) -> Transform:
    """u <- u / ||u|| per tensor in ``norm`` (0 stays 0), from the scaled tensors (l_p
    mirror descent's normalisation by the dual norm). Kernel: entrywise norms."""
    N = get_norm(norm)

    def update(u, state, params, log_gap=None):
        g = as_scaled(u)
        out = {}
        for k, t in g.tensors.items():
            n = item_norm(N, t)
            out[k] = t / expand(torch.where(n > 0, n, torch.ones_like(n)), t)
        return out, {}

    la = lp_args(N)
    kernel = None if la is None else KernelOp(Op.NORMALIZE, {"lp": la["lp"], "q": la["p"]})
    return Transform(no_state, update, kernel)


def _param_norm(params, N):
    """sqrt(sum_k ||P_k||^2) per trial in the norm N (scale-safe)."""
    vals = torch.stack([item_norm(N, p) for p in params.values()])
    m = vals.amax(0)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return m * (vals / safe).pow(2).sum(0).sqrt()


def scale_by_param_norm(norm="fro") -> Transform:
    """u <- ||params|| u, the l_2 product of ``norm`` over a trial's tensors: a step
    proportional to the parameters' size (``relative=True`` of the steepest rules)."""
    N = get_norm(norm)

    def update(u, state, params, log_gap=None):
        pn = _param_norm(params, N)
        if isinstance(u, Lazy):
            return u.times(pn), {}
        U = _plain(u)
        return {k: expand(pn, U[k]) * U[k] for k in U}, {}

    la = lp_args(N)
    kernel = None if la is None else KernelOp(Op.PARAM_NORM, {"lp": la["lp"], "p": la["p"]})
    return Transform(no_state, update, kernel)


def add_decayed_weights(weight_decay: float) -> Transform:
    """u <- u + wd params (decoupled weight decay when followed by the learning rate)."""
    wd = float(weight_decay)
    if not (math.isfinite(wd) and wd >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0; got {weight_decay!r}")

    def update(u, state, params, log_gap=None):
        U = _plain(u)
        return ({k: U[k] + wd * params[k] for k in U} if wd else U), {}

    return Transform(no_state, update)


# --------------------------------------------------------------- stateful ones
def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def _scaled_state(params, *names):
    st = {}
    for k, P in params.items():
        B = P.shape[0]
        for n in names:
            st[f"{n}:{k}"] = torch.zeros_like(P)
            st[f"l{n}:{k}"] = torch.full((B,), -math.inf, dtype=P.dtype, device=P.device)
    return st


def trace(beta: float = 0.9, nesterov: bool = False) -> Transform:
    """Heavy-ball momentum on the plain value (torch.optim.SGD, no dampening):
    m <- beta m + u; u <- m (nesterov: u + beta m). State ``m:<name>``."""
    beta = check_unit(beta, "beta")

    def init(params):
        return {f"m:{k}": torch.zeros_like(P) for k, P in params.items()}

    def update(u, state, params, log_gap=None):
        G = _plain(u)
        out, new = {}, {}
        for k in G:
            m = beta * state[f"m:{k}"] + G[k]
            new[f"m:{k}"] = m
            out[k] = G[k] + beta * m if nesterov else m
        return out, new

    return Transform(init, update, None, stateful=True)


def trace_scaled(decay: float, gain: float = 1.0, nesterov: bool = False) -> Transform:
    """A moving average kept in scaled form (exact however small u is):
    m <- decay m + gain u; u <- m (nesterov: u + decay m), scaled. State ``m:<name>``
    (tensor, max|.| = 1) and ``lm:<name>`` (its log scale). Signum: (beta, 1 - beta);
    Muon: (beta, 1, nesterov)."""
    decay = check_unit(decay, "beta")

    def update(u, state, params, log_gap=None):
        g = as_scaled(u)
        out_t, out_l, new = {}, {}, {}
        for k, Gs in g.tensors.items():
            lg = g.log_scale[k]
            m, lm = scaled_sum(state[f"m:{k}"], state[f"lm:{k}"], decay, Gs, lg, gain)
            new[f"m:{k}"], new[f"lm:{k}"] = m, lm
            out_t[k], out_l[k] = scaled_sum(Gs, lg, 1.0, m, lm, decay) if nesterov else (m, lm)
        return Scaled(out_t, out_l), new

    return Transform(lambda params: _scaled_state(params, "m"), update, None, stateful=True)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Transform:
    """Adam's moments (torch.optim.Adam, elementwise): m <- b1 m + (1 - b1) G,
    v <- b2 v + (1 - b2) G^2, u <- m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t),
    v_hat = v / (1 - b2^t). m is kept scaled and v as log v elementwise: exact for any size
    of G. State: ``m:<k>``, ``lm:<k>``, ``lv:<k>``, ``t`` (steps taken, (B,))."""
    b1 = check_unit(b1, "b1")
    b2 = check_unit(b2, "b2", lo_open=True)
    eps = float(eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")

    def init(params):
        st = _scaled_state(params, "m")
        for k, P in params.items():
            st[f"lv:{k}"] = torch.full_like(P, -math.inf)  # elementwise log v
        P0 = _lead(params)
        st["t"] = torch.zeros(P0.shape[0], dtype=P0.dtype, device=P0.device)
        return st

    def update(u, state, params, log_gap=None):
        g = as_scaled(u)
        t = state["t"] + 1
        lc1 = torch.log1p(-torch.pow(b1, t))       # log(1 - b1^t)
        lc2 = torch.log1p(-torch.pow(b2, t))       # log(1 - b2^t)
        out, new = {}, {"t": t}
        for k, Gs in g.tensors.items():
            lg = g.log_scale[k]
            m, lm = scaled_sum(state[f"m:{k}"], state[f"lm:{k}"], b1, Gs, lg, 1.0 - b1)
            lG2 = 2.0 * (torch.log(Gs.abs()) + expand(lg, Gs))  # log G^2, elementwise
            lv = torch.logaddexp(state[f"lv:{k}"] + _log(b2), lG2 + _log(1.0 - b2))
            # u = m_hat / (sqrt(v_hat) + eps) with m_hat = m / c1, v_hat = v / c2:
            #   = m_s e^{lm} sqrt(c2) e^{-lv/2} / c1 / (1 + eps sqrt(c2) e^{-lv/2})
            e = expand(lm - lc1 + 0.5 * lc2, Gs) - 0.5 * lv
            v = m * torch.exp(e)
            if eps > 0:
                v = v / (1.0 + eps * torch.exp(expand(0.5 * lc2, Gs) - 0.5 * lv))
            out[k] = torch.where(torch.isfinite(lv), v, torch.zeros_like(v))
            new[f"m:{k}"], new[f"lm:{k}"], new[f"lv:{k}"] = m, lm, lv
        return out, new

    return Transform(init, update, None, stateful=True)


def scale_by_rss(eps: float = 1e-10, initial: float = 0.0) -> Transform:
    """Adagrad's root of the sum of squares (torch.optim.Adagrad, elementwise):
    v <- v + G^2 (v_0 = ``initial``), u <- G / (sqrt(v) + eps), with v kept as log v: exact
    for any size of G. State ``lr2:<name>`` (log v)."""
    eps, initial = float(eps), float(initial)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0; got {eps!r}")
    if not (math.isfinite(initial) and initial >= 0):
        raise ValueError(f"initial must be a finite number >= 0; got {initial!r}")

    def init(params):
        return {f"lr2:{k}": torch.full_like(P, _log(initial)) for k, P in params.items()}

    def update(u, state, params, log_gap=None):
        g = as_scaled(u)
        out, new = {}, {}
        for k, Gs in g.tensors.items():
            lg = expand(g.log_scale[k], Gs)
            lv = torch.logaddexp(state[f"lr2:{k}"], 2.0 * (torch.log(Gs.abs()) + lg))
            # u = G / (sqrt v + eps) = Gs e^{lg - lv/2} / (1 + eps e^{-lv/2})
            v = Gs * torch.exp(lg - 0.5 * lv)
            if eps > 0:
                v = v / (1.0 + eps * torch.exp(-0.5 * lv))
            out[k] = torch.where(torch.isfinite(lv), v, torch.zeros_like(v))
            new[f"lr2:{k}"] = lv
        return out, new

    return Transform(init, update, None, stateful=True)


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


def orthogonalize(ns_steps: int | None = None) -> Transform:
    """u <- polar(u) = U V^T (u = U S V^T, exact SVD in float64; ``ns_steps``: Muon's
    Newton-Schulz iteration instead); a vector parameter (B, d) gets u / ||u||_2."""
    if ns_steps is not None and (int(ns_steps) != ns_steps or ns_steps < 1):
        raise ValueError(f"ns_steps must be a positive integer or None; got {ns_steps!r}")

    def update(u, state, params, log_gap=None):
        g = as_scaled(u)
        out = {}
        for k, A in g.tensors.items():
            if A.ndim == 2:  # a vector: its spectral steepest direction is A / ||A||_2
                out[k] = item_steepest(SPECTRAL, A)
            else:
                M = item_view(A)
                out[k] = (polar(M) if ns_steps is None else newton_schulz(M, ns_steps)).reshape(A.shape)
        return out, {}

    return Transform(no_state, update)


# ----------------------------------------------------------------------- Polyak
def scale_by_polyak(c: float = 1.0, max_lr: float | None = None, cap: float = POLYAK_CAP) -> Transform:
    """Polyak's step u <- eta_t u, eta_t = c (L - L*) / ||u||_F^2 (one global Frobenius norm
    per trial), i.e. a step of length l = c (L - L*) / ||u|| along u / ||u||, computed as

        log l = log c + log(L - L*) - log||u||,   u_k / ||u|| = T_k exp(ls_k - log||u||)

    from the scaled tensors (T_k, ls_k) and the log gap: finite however far L - L* and u
    have underflowed (a zero gradient or gap: a zero step). ``max_lr`` caps eta_t.

    Range cap (recorded, recoverable). Off convexity the gap need not vanish with the
    gradient: with attention saturated on a non-optimal token L - L* stays O(1) while
    ||G|| ~ exp(-margin ||W||), so l grows like exp(margin ||W||) (docs/theory.md §6.3).
    A step that would take the parameters past PARAM_MAX = 2^40 (||params|| + l > PARAM_MAX;
    beyond it the log-domain gap and gradient scales, ~ margin ||W||, lose their absolute
    precision: ulp(2^40) = 2^-12) takes instead the relative length
    l = cap max(||params||, 1) along the same exact direction, and if that step ends past
    PARAM_MAX the new parameters are scaled back to norm PARAM_MAX: steepest descent with
    a step proportional to the parameters (projected onto the ball of radius PARAM_MAX),
    which keeps turning the direction towards a max-margin one while Polyak's own step is
    unbounded. Where the gap falls again, the Polyak step resumes by itself. The count of
    capped steps per trial is the state ``"polyak_capped"`` (B,). Runs whose steps stay in
    range are unchanged, bit for bit.
    """
    c = check_lr(c, "c")
    if max_lr is not None:
        max_lr = check_lr(max_lr, "max_lr")
    cap = check_lr(cap, "cap")
    log_c = math.log(c)

    def init(params):
        P0 = _lead(params)
        return {"polyak_capped": torch.zeros(P0.shape[0], dtype=P0.dtype, device=P0.device)}

    def update(u, state, params, log_gap):
        g = as_scaled(u)
        lg = log_global_norm(g)
        ll = log_c + log_gap - lg  # log(c gap / ||G||): the step's length
        if max_lr is not None:  # eta_t ||G|| <= max_lr ||G||
            ll = torch.minimum(ll, math.log(max_lr) + lg)
        pn = _param_norm(params, FRO)
        over = (ll > torch.log((PARAM_MAX - pn).clamp_min(0.0))) & torch.isfinite(lg)
        capped = state["polyak_capped"]
        anyover = bool(over.any())
        if anyover:
            ll = torch.where(over, torch.log(cap * pn.clamp_min(1.0)), ll)
            capped = capped + over.to(capped.dtype)
        ok = torch.isfinite(lg) & torch.isfinite(ll)
        out = {}
        for k, T in g.tensors.items():
            f = torch.exp(ll + g.log_scale[k] - lg)  # l * (scale of u_k) / ||u||
            if anyover:  # |ll| << |ls_k|, |lg| there: the difference first
                f = torch.where(over, torch.exp(ll + (g.log_scale[k] - lg)), f)
            f = torch.where(ok, f, torch.zeros_like(f))
            out[k] = expand(f, T) * T
        if anyover:  # a capped step ending past PARAM_MAX is scaled back onto it
            new = {k: P - out[k] for k, P in params.items()}
            nn = _param_norm(new, FRO)
            back = over & (nn > PARAM_MAX)
            if bool(back.any()):
                sc = torch.where(back, PARAM_MAX / nn, torch.ones_like(nn))
                out = {k: torch.where(expand(back, P), P - expand(sc, P) * new[k], out[k])
                       for k, P in params.items()}
        return out, {"polyak_capped": capped}

    kernel = KernelOp(Op.POLYAK, {"c": c, "max_lr": float(max_lr or 1.0),
                                  "maxlr": int(max_lr is not None), "cap": cap})
    return Transform(init, update, kernel, stateful=False, needs_gap=True)


# ------------------------------------------------------------------ apply steps
def descend() -> Transform:
    """The apply step of every rule but mirror descent: params <- params - u."""
    def update(u, state, params, log_gap=None):
        # a Lazy's (factor w_k) D_k is written into D_k, its own tensor, and the new
        # parameters into that (the same products and subtraction, two parameter-sized
        # buffers fewer at the step's peak)
        fresh = isinstance(u, Lazy)
        U = u.value(consume=True) if fresh else _plain(u)
        return {k: (torch.sub(P, U[k], out=U[k]) if fresh and U[k].shape == P.shape
                    and U[k].dtype == P.dtype and not P.requires_grad else P - U[k])
                for k, P in params.items()}, {}

    return Transform(no_state, update, KernelOp(Op.DESCEND, {}))


def mirror_step(p: float) -> Transform:
    """The apply step of l_p mirror descent, psi(W) = (1/p) sum |W_j|^p (p > 1, entrywise):
    params <- inv(grad psi(params) - u), grad psi(W) = sign(W)|W|^{p-1},
    inv(U) = sign(U)|U|^{1/(p-1)}."""
    p = float(p)
    if not p > 1:
        raise ValueError(f"mirror descent needs p > 1; got p = {p}")

    def update(u, state, params, log_gap=None):
        U = _plain(u)
        return {k: inverse_mirror_map(mirror_map(P, p) - U[k], p) for k, P in params.items()}, {}

    return Transform(no_state, update, KernelOp(Op.MIRROR, {"p": p}))
