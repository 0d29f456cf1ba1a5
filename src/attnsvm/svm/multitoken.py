"""Multi-token max-margin problems (ATT-SVM', THEORY §5) for nonlinear heads.

Selected set of sequence i: O_i = {t : s_it >= threshold} (final softmax probabilities).

    W_dir = argmin ||W||_F  s.t. (x_it - x_itau)^T W z_i = 0   for t, tau in O_i,
                                 (x_it - x_itau)^T W z_i >= 1  for t in O_i, tau not in O_i;
    W_fin = argmin ||W||_F  s.t. (x_itau - x_it)^T W z_i = log(s_itau / s_it)  for t, tau in O_i;
    W_eq  = W_fin + R W_dir,  R = argmin_R ||W_fin + R W_dir - W_trained||_F
          = <W_trained - W_fin, W_dir> / ||W_dir||^2;
    predictivity = corr(W_trained, W_eq).

Equalities over all pairs in O_i are expressed against one reference token o_i in O_i
(equivalent, and non-redundant).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..metrics import correlation

__all__ = ["MultiTokenSolution", "multitoken_svm", "selected_sets"]


def selected_sets(s, threshold: float = 1e-3) -> np.ndarray:
    """O = s >= threshold, bool with the shape of s (..., n, T)."""
    s = np.asarray(s, dtype=float)
    return s >= threshold


def _corr(A, B) -> float:
    return float(correlation(np.ravel(A), np.ravel(B)))


@dataclass(repr=False)
class MultiTokenSolution:
    """W_dir_, W_fin_, W_eq_ (d, e); R_ (float); sets_ (n, T) bool; predictivity_ =
    corr(W_trained, W_eq) (nan without W_trained), corr_dir_ = corr(W_trained, W_dir);
    feasible_ (W_dir problem), status_, solver_."""

    W_dir_: np.ndarray | None
    W_fin_: np.ndarray
    W_eq_: np.ndarray | None
    R_: float
    sets_: np.ndarray
    predictivity_: float
    corr_dir_: float
    corr_fin_: float
    feasible_: bool
    status_: str
    solver_: str
    violation_: float = float("nan")
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"MultiTokenSolution(feasible={self.feasible_}, |O|={int(self.sets_.sum())}, "
                f"R={self.R_:.4g}, predictivity={self.predictivity_:.4f}, "
                f"corr_dir={self.corr_dir_:.4f}, status={self.status_!r})")

    summary = __repr__


def multitoken_svm(X, z, s, threshold: float = 1e-3, W_trained=None, mask=None,
                   solver: str = "CLARABEL") -> MultiTokenSolution:
    """Solve W_dir, W_fin and W_eq (see module docstring).

    X (n, T, d), z (n, e), s (n, T) final attention probabilities, mask (n, T) bool,
    W_trained (d, e) optional.  W_fin is the exact least-norm solution of its
    equalities (lstsq); W_dir a QP (cvxpy, one equality and one inequality block).
    """
    import cvxpy as cp

    from .problems import _arr, _mask

    X = _arr(X, "X", (3,), "(n, T, d)")
    n, T, d = X.shape
    z = _arr(z, "z", (2,), "(n, e)")
    if z.shape[0] != n:
        raise ValueError(f"z must have shape ({n}, e); got {z.shape}")
    s = _arr(s, "s", (2,), "(n, T)")
    if s.shape != (n, T):
        raise ValueError(f"s must have shape ({n}, {T}); got {s.shape}")
    valid = _mask(mask, (n, T))
    O = selected_sets(s, threshold) & valid
    if not O.any(1).all():
        raise ValueError("every sequence needs a selected token (s >= threshold)")
    e = z.shape[1]
    ref = np.argmax(np.where(O, s, -np.inf), axis=1)  # reference token o_i (most attended)
    # equality rows: t in O_i \ {o_i}: (x_it - x_io)^T W z_i  (= 0 for W_dir, = log(s_it/s_io) for W_fin)
    ei, et = np.nonzero(O & (np.arange(T)[None, :] != ref[:, None]))
    Deq = X[ei, et] - X[ei, ref[ei]]
    Meq = np.einsum("kd,ke->kde", Deq, z[ei]).reshape(len(ei), d * e)
    beq = np.log(s[ei, et] / s[ei, ref[ei]])
    # inequality rows: t in O_i, tau not in O_i (valid): (x_it - x_itau)^T W z_i >= 1
    ii, tt, uu = np.nonzero(O[:, :, None] & (valid & ~O)[:, None, :])
    Min = np.einsum("kd,ke->kde", X[ii, tt] - X[ii, uu], z[ii]).reshape(len(ii), d * e)
    if len(ei):
        w_fin, *_ = np.linalg.lstsq(Meq, beq, rcond=None)
    else:
        w_fin = np.zeros(d * e)
    W_fin = w_fin.reshape(d, e)
    W = cp.Variable(d * e)
    cons = []
    if len(ii):
        cons.append(Min @ W >= 1)
    if len(ei):
        cons.append(Meq @ W == 0)
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(W)), cons)
    try:
        prob.solve(solver=solver)
        status = str(prob.status)
    except cp.error.SolverError as exc:  # pragma: no cover
        status = f"solver_error: {exc}"
    feasible = status in ("optimal", "optimal_inaccurate") and W.value is not None
    W_dir = np.asarray(W.value).reshape(d, e) if feasible else None
    viol = float("nan")
    if feasible:
        viol = float(max(np.maximum(1 - Min @ W.value, 0).max() if len(ii) else 0.0,
                         np.abs(Meq @ W.value).max() if len(ei) else 0.0))
    R = float("nan")
    W_eq = None
    pred = corr_dir = float("nan")
    corr_fin = _corr(np.asarray(W_trained, float), W_fin) if W_trained is not None else float("nan")
    if feasible:
        if W_trained is not None:
            Wt = _arr(W_trained, "W_trained", (2,), "(d, e)")
            nd = float((W_dir**2).sum())
            R = float(((Wt - W_fin) * W_dir).sum() / nd) if nd > 0 else 0.0
            W_eq = W_fin + R * W_dir
            pred = _corr(Wt, W_eq)
            corr_dir = _corr(Wt, W_dir)
        else:
            W_eq = W_fin.copy()
    return MultiTokenSolution(W_dir_=W_dir, W_fin_=W_fin, W_eq_=W_eq, R_=R, sets_=O,
                              predictivity_=pred, corr_dir_=corr_dir, corr_fin_=corr_fin,
                              feasible_=feasible, status_=status, solver_=solver,
                              violation_=viol)
