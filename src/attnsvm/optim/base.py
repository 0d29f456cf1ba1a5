"""The optimiser interface (optax-shaped, batched over trials) and scale-free gradients.

An :class:`Optimizer` is a pair of pure functions::

    state = opt.init(params)
    new_params, new_state = opt.update(grads, state, params, log_gap)

``params`` is a dict of tensors with a leading trial dimension B; ``state`` is a dict of
tensors that all have the leading B too (so the trainer can freeze a stopped trial's
state together with its parameters by one ``torch.where`` per entry); ``grads`` is a
:class:`Scaled` gradient (or a plain dict, wrapped with log scale 0); ``log_gap`` is
log(L - L*) per trial (B,), read by Polyak only (``opt.needs_gap``).

Why scaled gradients. Past saturation the gradient of softmax attention shrinks like
exp(-||W|| margin): after ~10^4 NGD steps its entries underflow float64 (the gradient
becomes exactly 0 and the run freezes), long after its *direction* stopped changing.
The trainer therefore hands the optimiser G as ``G = tensors[k] * exp(log_scale[k])``
with ``max |tensors[k]| = 1`` per trial (0 and -inf for an exactly zero gradient), and
every rule that divides by a norm (NGD, sign descent, spectral descent, normalised
mirror descent, Polyak's ratio, Adam's moments) computes its step from the scaled
tensors and log-domain factors: its direction is exact however small G is. Rules whose
step is proportional to G (GD, momentum) use the value and lose nothing that float64
could represent in W.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "Optimizer", "Scaled", "as_scaled", "normalize", "scaled_sum", "log_norm", "log_global_norm",
    "register", "RULES", "get", "check_lr", "item_view", "item_norm", "item_steepest",
]


class Optimizer(NamedTuple):
    """A step rule: ``init(params) -> state``, ``update(grads, state, params, log_gap) ->
    (params, state)``, both pure and batched over the leading trial dim.

    name: registry name; hyper: its hyper-parameters; needs_gap: whether ``update``
    reads ``log_gap`` (the trainer may skip computing it); batch_size: None (full batch)
    or the mini-batch size of a stochastic rule (SGD, SNGD), drawn by the trainer;
    kernel: the compiled counterpart of a rule chained from transforms
    (:mod:`attnsvm.optim.transforms`), a tuple of :class:`~.kernel_ops.KernelOp` that
    :mod:`attnsvm.fused` reads, or None (the rule runs in torch); stateful: the state
    changes later steps (momentum, moments, a schedule's count), so an unchanged step
    is not a stall."""

    name: str
    init: Callable
    update: Callable
    hyper: dict
    needs_gap: bool = False
    batch_size: int | None = None
    kernel: tuple | None = None
    stateful: bool = False

    def __repr__(self) -> str:
        h = ", ".join(f"{k}={v!r}" for k, v in self.hyper.items() if not k.startswith("_"))
        bs = "" if self.batch_size is None else f", batch_size={self.batch_size}"
        return f"{self.name}({h}{bs})"


def no_state(params) -> dict:
    return {}


# ------------------------------------------------------------------ scaled grads
def _bshape(t: torch.Tensor) -> tuple:
    return (t.shape[0],) + (1,) * (t.ndim - 1)


def normalize(t: torch.Tensor, log_scale: torch.Tensor | None = None, inplace: bool = False):
    """(t / m, log m [+ log_scale]) with m = max|t| per trial (over all dims but the first).

    A trial whose t is 0 gets (0, -inf); one with a NaN or inf entry a log scale of nan or
    +inf (see :meth:`Scaled.nonfinite`). t (B, ...) -> ((B, ...), (B,)). ``inplace``: t is
    the caller's to overwrite (divided in its own buffer, m = max(-min t, max t) without a
    |t| temporary: the same bits)."""
    if inplace and t.numel():
        lo, hi = torch.aminmax(t.reshape(t.shape[0], -1), dim=1)
        m = torch.maximum(lo.neg_(), hi)
    else:
        m = t.reshape(t.shape[0], -1).abs().amax(1) if t.numel() else t.new_zeros(t.shape[0])
    safe = torch.where(m > 0, m, torch.ones_like(m))
    ls = torch.where(m > 0, torch.log(safe), torch.where(torch.isnan(m), m, torch.full_like(m, -math.inf)))
    if log_scale is not None:
        ls = ls + log_scale
    return (t.div_ if inplace else t.div)(safe.reshape(_bshape(t))), ls


def scaled_sum(a, la, ca: float, b, lb, cb: float, inplace: bool = False):
    """ca a e^{la} + cb b e^{lb} in scaled form: (tensor with max|.| = 1, log scale (B,)).

    a, b (B, ...); la, lb (B,) log scales (-inf: zero); ca, cb >= 0 constants.
    ``inplace``: a and b are the caller's to overwrite (the sum in a's buffer, same bits)."""
    l1 = la + (math.log(ca) if ca > 0 else -math.inf)
    l2 = lb + (math.log(cb) if cb > 0 else -math.inf)
    L = torch.maximum(l1, l2)
    Lf = torch.where(torch.isfinite(L), L, torch.zeros_like(L))
    f1, f2 = expand(torch.exp(l1 - Lf), a), expand(torch.exp(l2 - Lf), b)
    t = a.mul_(f1).add_(b.mul_(f2)) if inplace else a * f1 + b * f2
    return normalize(t, Lf, inplace)


class Scaled(NamedTuple):
    """Tensors times per-trial scales: the gradient ``G[k] = tensors[k] * exp(log_scale[k])``.

    tensors: {name: (B, ...)} with max|tensors[k]| = 1 per trial (or all 0);
    log_scale: {name: (B,)} (-inf where G[k] = 0)."""

    tensors: dict
    log_scale: dict
    plain: dict | None = None  # the unscaled tensors when the gradient was given plainly
    #: the tensors are the update's own: made for this one update (the trainer's gradient of
    #: the step), so a rule may overwrite them (e.g. divide them by their norm in place);
    #: False (default): they may be the caller's, never written
    owned: bool = False

    @classmethod
    def of(cls, tensors: dict, log_scale: dict | None = None) -> Scaled:
        """Normalise plain tensors (times exp(log_scale[k]) if given) to scaled form."""
        out, ls = {}, {}
        for k, t in tensors.items():
            out[k], ls[k] = normalize(t, None if log_scale is None else log_scale[k])
        return cls(out, ls, tensors if log_scale is None else None)

    def value(self) -> dict:
        """The plain gradient {k: tensors[k] * exp(log_scale[k])} (may underflow to 0;
        exactly the given tensors when the gradient was given plainly)."""
        if self.plain is not None:
            return self.plain
        return {k: t * torch.exp(self.log_scale[k]).reshape(_bshape(t))
                for k, t in self.tensors.items()}

    def add(self, extra: dict, inplace: bool = False) -> Scaled:
        """G + extra (plain tensors added to some entries, e.g. a ridge term), scaled.
        ``inplace``: this gradient's tensors and ``extra`` are the caller's to overwrite
        (no parameter-sized temporaries; the same bits)."""
        out, ls = dict(self.tensors), dict(self.log_scale)
        for k, e in extra.items():
            es, le = normalize(e, inplace=inplace)
            out[k], ls[k] = scaled_sum(out[k], ls[k], 1.0, es, le, 1.0, inplace=inplace)
        return Scaled(out, ls)

    def nonzero(self) -> torch.Tensor:
        """(B,) bool: the gradient of the trial is not exactly zero."""
        return torch.stack([torch.isfinite(l) for l in self.log_scale.values()]).any(0)

    def nonfinite(self) -> torch.Tensor:
        """(B,) bool: the gradient of the trial has a NaN or inf entry (overflow)."""
        return torch.stack([torch.isnan(l) | torch.isposinf(l) for l in self.log_scale.values()]).any(0)


def as_scaled(grads) -> Scaled:
    """``grads`` as a :class:`Scaled` (returned as is when it is one; a dict of tensors is
    split into tensors with max |.| = 1 per trial and their log scales)."""
    return grads if isinstance(grads, Scaled) else Scaled.of(grads)


def item_view(t: torch.Tensor) -> torch.Tensor:
    """The per-trial item of a parameter tensor (B, *shape): a vector (B, d) when shape has
    one dim, else a matrix (B, shape[0], prod(shape[1:])) (a conv / embedding tensor is
    seen as its first dim against the rest, as Muon does)."""
    if t.ndim <= 3:
        return t
    return t.reshape(t.shape[0], t.shape[1], -1)


def item_norm(norm, t: torch.Tensor) -> torch.Tensor:
    """||t_b|| per trial (B,) in ``norm`` over the item of :func:`item_view`."""
    v = item_view(t)
    return norm.value(v, vector=v.ndim == 2)


def item_steepest(norm, t: torch.Tensor, unit: bool = False, inplace: bool = False) -> torch.Tensor:
    """``norm.steepest`` of each trial's item, in the shape of t. ``unit``: t holds a
    :class:`Scaled` gradient's tensors (max |t| = 1 per trial, or 0):
    ``norm.steepest_unit`` (the same values, fewer ops); ``inplace``: t may be overwritten."""
    v = item_view(t)
    if unit:
        D = norm.steepest_unit(v, vector=v.ndim == 2, inplace=inplace)
        return D if v is t else D.reshape(t.shape)
    return norm.steepest(v, vector=v.ndim == 2).reshape(t.shape)


def log_norm(grads: Scaled, name: str, norm) -> torch.Tensor:
    """log ||G[name]|| in ``norm`` (a Norm), per trial (B,); -inf for a zero gradient."""
    return torch.log(item_norm(norm, grads.tensors[name])) + grads.log_scale[name]


def log_global_norm(grads: Scaled, norm=None) -> torch.Tensor:
    """log sqrt(sum_k ||G_k||^2) per trial: the l_2 product of the per-tensor norms
    (Frobenius by default: the global Frobenius norm over every tensor of a trial)."""
    from attnsvm.norms import FRO

    norm = FRO if norm is None else norm
    logs = torch.stack([log_norm(grads, k, norm) for k in grads.tensors])
    return 0.5 * torch.logsumexp(2 * logs, dim=0)


def expand(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-trial (B,) value reshaped to broadcast over ``like`` (B, ...)."""
    return x.reshape(_bshape(like))


def check_lr(lr, name: str = "lr"):
    """A finite step size > 0 (ValueError naming the argument otherwise). A tensor of
    per-trial step sizes (broadcastable to the parameters, e.g. (B, 1, 1)) is accepted too."""
    if isinstance(lr, torch.Tensor):
        if lr.numel() == 0 or not bool((torch.isfinite(lr) & (lr > 0)).all()):
            raise ValueError(f"{name} must hold finite numbers > 0")
        return lr
    if isinstance(lr, bool):
        raise ValueError(f"{name} must be a finite number > 0; got {lr!r}")
    try:
        val = float(lr)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number > 0; got {lr!r}") from None
    if not math.isfinite(val) or val <= 0:
        raise ValueError(f"{name} must be a finite number > 0; got {lr!r}")
    return val


@dataclass(frozen=True)
class InversePower:
    """Step-size schedule eta_t = lr (t + offset)^(-power), t = 0, 1, ... the number of steps
    already taken (the decaying steps of the implicit-bias analyses, e.g. Adam with
    eta_t = (t + 2)^(-a), a in (0, 1], in Zhang, Zou and Cao 2024). Called with a tensor of
    per-trial step counts t (B,), it returns the step sizes (B,). A frozen dataclass, so it
    pickles into sweep workers and prints its formula."""

    lr: float
    power: float = 0.5
    offset: float = 2.0

    def __post_init__(self):
        check_lr(self.lr)
        if not (math.isfinite(float(self.power)) and float(self.power) >= 0):
            raise ValueError(f"power must be a finite number >= 0; got {self.power!r}")
        if not (math.isfinite(float(self.offset)) and float(self.offset) > 0):
            raise ValueError(f"offset must be a finite number > 0; got {self.offset!r}")

    def __call__(self, t):
        return self.lr * (t + self.offset) ** (-self.power)

    def __str__(self) -> str:
        return f"{self.lr:g} (t + {self.offset:g})^-{self.power:g}"


def check_lr_or_schedule(lr, name: str = "lr"):
    """A step size (see :func:`check_lr`) or a schedule: a callable of the per-trial step
    count t (B,) (0 at the first step) returning step sizes, e.g. :class:`InversePower`."""
    if callable(lr):
        return lr
    return check_lr(lr, name)


def check_unit(x, name: str, lo_open: bool = False) -> float:
    """A number in [0, 1) (``lo_open``: (0, 1))."""
    try:
        val = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1); got {x!r}") from None
    if not (0 <= val < 1) or (lo_open and val == 0):
        raise ValueError(f"{name} must be a number in {'(0' if lo_open else '[0'}, 1); got {x!r}")
    return val


# ----------------------------------------------------------------------- registry
#: every rule, by canonical name: {name: constructor}; ``attnsvm.optim.get(name, **hyper)``
RULES: dict[str, Callable[..., Optimizer]] = {}
ALIASES: dict[str, str] = {}


def register(name: str, *aliases: str):
    """Decorator: register a rule constructor under ``name`` (and optional aliases)."""
    def deco(fn):
        for n in (name, *aliases):
            if n in RULES or n in ALIASES:
                raise RuntimeError(f"optimizer {n!r} registered twice")
        RULES[name] = fn
        ALIASES.update({a: name for a in aliases})
        return fn

    return deco


def get(name: str | Optimizer, **hyper) -> Optimizer:
    """The rule ``name`` built with ``hyper`` (e.g. ``get("adam", lr=1e-2, eps=0)``);
    an Optimizer is returned unchanged (``hyper`` must then be empty).

    Names: ``sorted(attnsvm.optim.RULES)``. Mirror descent also reads as ``"md<p>"``
    (``"md1.5"`` = ``get("mirror", p=1.5)``)."""
    if isinstance(name, Optimizer):
        if hyper:
            raise ValueError("hyper-parameters are given to get() only with a rule name")
        return name
    if not isinstance(name, str):
        raise ValueError(f"optimizer must be a name or an Optimizer; got {type(name).__name__}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key.startswith("md") and key not in RULES:
        try:
            p = float(key[2:])
        except ValueError:
            raise ValueError(f"optimizer name 'md<p>' needs a number p; got {name!r}") from None
        return RULES["mirror"](p=p, **hyper)
    if key not in RULES:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(sorted(RULES))}")
    try:
        return RULES[key](**hyper)
    except TypeError as exc:  # an unknown hyper-parameter name
        raise ValueError(f"optimizer {key!r}: {exc}") from None
