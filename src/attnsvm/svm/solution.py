"""The old home of the constraint sets, the certificate and the result objects, kept as an
import path: each now lives in the module of its concern (:mod:`attnsvm.svm.constraints`:
:class:`ConstraintSet`, ``exp2``, ``ldexp``; :mod:`attnsvm.svm.certificate`: :func:`certify`,
:class:`Certificate`, the tolerances; :mod:`attnsvm.svm.farkas`: :func:`farkas_verify`;
:mod:`attnsvm.svm.result`: :class:`Solution`, :class:`BatchSolution`,
:class:`NotRepresentableError`, ``primal_norm``, ``dual_norm``).
"""

from __future__ import annotations

from .certificate import (
    FEAS_TOL,
    GAP_INACCURATE,
    GAP_OPTIMAL,
    Certificate,
    _fro_sums,
    certify,
)
from .constraints import ConstraintSet, exp2, ldexp
from .farkas import FARKAS_BOUND, farkas_verify
from .result import BatchSolution, NotRepresentableError, Solution, dual_norm, primal_norm

__all__ = [
    "ConstraintSet",
    "Solution",
    "BatchSolution",
    "Certificate",
    "NotRepresentableError",
    "certify",
    "farkas_verify",
    "primal_norm",
    "dual_norm",
    "FEAS_TOL",
    "GAP_OPTIMAL",
    "GAP_INACCURATE",
    "FARKAS_BOUND",
    "exp2",
    "ldexp",
    "_fro_sums",
]
