"""The compiled counterpart of a transform, as data: an opcode and its numbers.

Every :class:`~attnsvm.optim.transforms.Transform` that the fused engine
(:mod:`attnsvm.fused`) can run inside its numba kernel carries a :class:`KernelOp`:
``Transform.kernel = KernelOp(Op.STEEPEST, {"lp": LP_INF, "p": inf, "q": 1.0, ...})``.
A chained rule's ``Optimizer.kernel`` is the tuple of its transforms' ops (None as soon
as one transform has none). The engine reads only these numbers: a rule is accelerated
because of what it is made of, never because of its name, so a renamed rule or a new
rule chained from accelerated parts runs compiled too (tests/test_fused.py).

This module imports neither torch nor numba: the kernels read the same constants.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import NamedTuple

__all__ = ["Op", "KernelOp", "LP_FRO", "LP_INF", "LP_ONE", "LP_GEN", "lp_args", "PARAM_MAX",
           "POLYAK_CAP"]

#: Polyak's range cap (attnsvm.optim.transforms.scale_by_polyak): a step that would take
#: ||params|| past PARAM_MAX takes the relative length POLYAK_CAP ||params|| instead
PARAM_MAX = 2.0 ** 40
POLYAK_CAP = 2.0 ** -12

# entrywise norms the kernel's steepest direction / norm loops know (``lp`` argument)
LP_FRO, LP_INF, LP_ONE, LP_GEN = 0, 1, 2, 3


class Op(IntEnum):
    """Opcodes of the transforms the kernel implements (``attnsvm.fused`` maps a sequence of
    them to one of its step loops)."""

    LEARNING_RATE = 1   # u <- lr u                          args: lr
    STEEPEST = 2        # u <- D*(u) in an entrywise norm     args: lp, p, q, global
    PARAM_NORM = 3      # u <- ||params|| u (relative step)   args: lp, p
    POLYAK = 4          # u <- c (L - L*) / ||u||^2 u         args: c, max_lr, maxlr, cap
    NORMALIZE = 5       # u <- u / ||u||_q                    args: lp, q
    DESCEND = 6         # params <- params - u                (the apply step)
    MIRROR = 7          # params <- (grad psi)^-1(grad psi(params) - u), l_p potential; args: p


class KernelOp(NamedTuple):
    """A transform's compiled counterpart: ``op`` (an :class:`Op`) and ``args``, the numbers
    the kernel reads (names of its integer / real configuration slots)."""

    op: int
    args: dict = {}


def lp_args(norm) -> dict | None:
    """{"lp": kind, "p": p, "q": q} of an entrywise l_p norm (a :class:`attnsvm.norms.Norm`
    with an exponent p), or None for a norm the kernel does not run (spectral, nuclear)."""
    p = getattr(norm, "p", None)
    if p is None:
        return None
    p = float(p)
    if p == 2.0:
        return {"lp": LP_FRO, "p": 2.0, "q": 2.0}
    if math.isinf(p):
        return {"lp": LP_INF, "p": math.inf, "q": 1.0}
    if p == 1.0:
        return {"lp": LP_ONE, "p": 1.0, "q": math.inf}
    return {"lp": LP_GEN, "p": p, "q": p / (p - 1.0)}
