"""Results in the caller's units: the engine's :class:`~attnsvm.svm.engine.Outcome`
(normalised units) -> :class:`~attnsvm.svm.result.Solution` /
:class:`~attnsvm.svm.result.BatchSolution`.

    sol = to_solution(cs, out, alpha=..., problem=..., vector=..., norm=..., tol=...)
    bs = to_batch_solution(cs, out, ...)

W = 2^-exp W_normalised (exact: a power of two), dual = 2^-2exp lam; a W that over- or
underflows float64 is "not_representable" (batches) or raises
:class:`~attnsvm.svm.result.NotRepresentableError` (single problems).
"""

from __future__ import annotations

import numpy as np

from ..norms import Norm
from .certificate import certify
from .constraints import ConstraintSet, ldexp
from .records import Outcome
from .result import BatchSolution, NotRepresentableError, Solution

__all__ = ["to_user_units", "to_batch_solution", "to_solution", "MIN_REPRESENTABLE"]

# the largest entry of a returned W must be a normal float64 (full relative precision)
MIN_REPRESENTABLE = np.finfo(float).tiny


def to_user_units(cs: ConstraintSet, out: Outcome, N: Norm, tol: float):
    """(W, norm, dual, representable, exp) in the caller's units: W = 2^-exp W_normalised
    (exact: a power of two), dual = 2^-2exp lam.  The certificate in ``out`` was computed
    on W_normalised; where 2^exp W does not give it back bit for bit (entries that went
    subnormal), the answer is re-certified from the returned W.  ``representable`` is
    False where a feasible W over- or underflows float64."""
    e = np.broadcast_to(np.asarray(cs.exp, dtype=np.int64), cs.batch_shape)
    c = out.cert
    W = ldexp(c.W, -e)
    back = ldexp(W, e)
    fin = np.isfinite(W).all((1, 2))
    amax_s = np.abs(np.where(np.isfinite(c.W), c.W, 0.0)).max((1, 2))
    amax = np.abs(np.where(fin[:, None, None], W, 0.0)).max((1, 2))
    rep = ~c.feasible | (fin & ((amax_s == 0) | (amax >= MIN_REPRESENTABLE)))
    redo = np.nonzero(c.feasible & rep & ~np.all(back == c.W, (1, 2)))[0]
    if len(redo):
        c.put(redo, certify(cs.take(redo), back[redo], c.lam[redo], N, tol))
    nrm = ldexp(c.norm, -e)
    dual = ldexp(c.lam, -2 * e)
    return W, nrm, dual, rep, e


def to_batch_solution(cs: ConstraintSet, out: Outcome, *, alpha, problem: str, vector: bool,
                      norm: Norm, tol: float) -> BatchSolution:
    """A :class:`BatchSolution` in the caller's units.  A problem whose solution is not
    representable in float64 gets feasible_ False and status 'not_representable'.
    ``norm``: the :class:`~attnsvm.norms.Norm` the problem was solved in."""
    N = norm
    c = out.cert
    W, nrm, dual, rep, e = to_user_units(cs, out, N, tol)
    feas = c.feasible & rep
    status = np.where(rep, out.status, "not_representable").astype(object)
    W = np.where(feas[:, None, None], W, np.nan)
    nrm = np.where(feas, nrm, np.inf)
    dual = np.where(feas[:, None, None], dual, 0.0)
    support = np.where(feas[:, None, None], c.support, False)
    margins = np.where(feas[:, None, None], c.margins, np.nan)
    nanf = np.where(feas, 1.0, np.nan)
    return BatchSolution(
        W_=W[..., 0] if vector else W, norm_=nrm, margin_=c.margin * nanf,
        violation_=c.violation * nanf, kkt_residual_=c.kkt * nanf, gap_=c.gap * nanf,
        dual_=dual, support_=support, margins_=margins, feasible_=feas, status_=status,
        solver_=out.solver, conflict_=out.conflict, alpha_=alpha, norm=N.name,
        problem=problem, time_=out.time, tol_active=tol,
        extra={"n_constraints": cs.valid.sum((1, 2)), "n_fallback": out.extra["n_fallback"],
               "scale_exp": e, "farkas_bound": out.farkas_bound,
               "lower_bound": ldexp(c.lower, -e), "solver_status": out.extra["solver_status"]},
    )


def to_solution(cs: ConstraintSet, out: Outcome, *, alpha, problem: str, vector: bool,
                norm: Norm, tol: float) -> Solution:
    """The :class:`Solution` of a batch of one; raises :class:`NotRepresentableError`
    (with the normalised solution attached) if W over- or underflows float64.
    ``norm``: the :class:`~attnsvm.norms.Norm` the problem was solved in."""
    N = norm
    c = out.cert
    W, nrm, dual, rep, e = to_user_units(cs, out, N, tol)
    extra = {"n_constraints": int(cs.valid[0].sum()), "scale_exp": int(e[0]),
             "lower_bound": float(ldexp(c.lower, -e)[0]), "solver_status": out.extra[
                 "solver_status"][0], "n_fallback": out.extra["n_fallback"]}
    for k in ("convex_norm",):
        if k in out.extra:
            extra[k] = float(ldexp(np.array([out.extra[k]]), -e)[0])
    if out.status[0] == "infeasible":
        extra["farkas_bound"] = float(out.farkas_bound[0])
        extra["farkas_multipliers"] = out.farkas_lam[0]
        extra["zero_constraints"] = np.argwhere(out.zero[0])
    feas = bool(c.feasible[0])

    def sol(Wout, nrm_out, dual_out, status):
        return Solution(
            W_=(Wout[:, 0] if vector else Wout) if feas else None,
            norm_=float(nrm_out) if feas else float("inf"),
            margin_=float(c.margin[0]) if feas else float("nan"),
            violation_=float(c.violation[0]) if feas else float("nan"),
            kkt_residual_=float(c.kkt[0]) if feas else float("nan"),
            gap_=float(c.gap[0]) if feas else float("nan"),
            dual_=dual_out if feas else None, support_=c.support[0] if feas else None,
            margins_=c.margins[0] if feas else None, status_=str(status),
            solver_=str(out.solver[0]), feasible_=feas, conflict_=tuple(out.conflict[0]),
            alpha_=alpha, norm=N.name, problem=problem, n_iter_=int(out.n_iter[0]),
            time_=out.time, tol_active=tol, extra=extra)

    if not rep[0]:
        scaled = sol(c.W[0], c.norm[0], c.lam[0], out.status[0])
        big = np.abs(c.W[0]).max()
        raise NotRepresentableError(
            f"{problem}: the max-margin solution exists (certified: {out.status[0]}, "
            f"gap {c.gap[0]:.1e}) but ||W|| ~ {big:.3g} * 2^{-int(e[0])} "
            f"({'overflows' if int(e[0]) < 0 else 'underflows'} float64 at this input "
            f"scale); rescale the tokens or queries. The solution in units of 2^{-int(e[0])} "
            "is attached as .solution", solution=scaled, scale_exp=int(e[0]))
    return sol(W[0], nrm[0], dual[0], out.status[0])
