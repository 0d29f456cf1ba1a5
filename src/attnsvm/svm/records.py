"""The records passed between the steps of the engine.

* :class:`Raw`: a solver's answer for one problem, before any certificate (what every
  solver module returns: :mod:`attnsvm.svm.frobenius`, :mod:`attnsvm.svm.nuclear`,
  :mod:`attnsvm.svm.conic`; :mod:`attnsvm.svm.strategy` chooses among them);
* :class:`Outcome`: everything :func:`attnsvm.svm.engine.solve` found for B problems,
  which :mod:`attnsvm.svm.assemble` turns into the caller's solutions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .certificate import Certificate

__all__ = ["Raw", "Outcome", "SOLVER_ERRORS"]

#: the numerical errors a solver may raise ('Singular matrix', 'SVD did not converge', ...):
#: caught and recorded, the next solver then runs; never a raw exception to the caller
SOLVER_ERRORS = (np.linalg.LinAlgError, ValueError, ArithmeticError, FloatingPointError,
                 RuntimeError)


@dataclass
class Raw:
    """A solver's answer for one problem (normalised units), before any certificate."""

    W: np.ndarray | None
    lam: np.ndarray | None
    status: str  # the solver's own word: kept for the record, never trusted
    solver: str
    n_iter: int = 0
    farkas: np.ndarray | None = None  # candidate Farkas multipliers (n, T)
    #: the solver key a second opinion should use, set by the solver that answered (None:
    #: the strategy row's ``fallback_default``)
    fallback: str | None = None


@dataclass
class Outcome:
    """Everything :func:`attnsvm.svm.engine.solve` found for B problems (normalised units)."""

    cert: Certificate
    status: np.ndarray
    solver: np.ndarray
    conflict: list
    n_iter: np.ndarray
    farkas_bound: np.ndarray
    farkas_lam: np.ndarray
    zero: np.ndarray
    time: float = 0.0
    extra: dict = field(default_factory=dict)

