"""Multi-token max-margin problems (ATT-SVM', docs/theory.md §5) for nonlinear heads.

Selected set of sequence i: O_i = {t : s_it >= threshold} (final softmax probabilities).

    W_dir = argmin ||W||  s.t. (x_it - x_itau)^T W z_i = 0   for t, tau in O_i,
                               (x_it - x_itau)^T W z_i >= 1  for t in O_i, tau not in O_i;
    W_fin = argmin ||W||  s.t. (x_itau - x_it)^T W z_i = log(s_itau / s_it)  for t, tau in O_i;
    W_eq  = W_fin + R W_dir,  R = argmin_R ||W_fin + R W_dir - W_trained||_F
          = <W_trained - W_fin, W_dir> / ||W_dir||_F^2;
    predictivity = corr(W_trained, W_eq).

Both problems go through the shared engine (:func:`attnsvm.svm.engine.solve`) as
constraint sets with equality constraints, and come back as certified
:class:`~attnsvm.svm.result.Solution` objects (``dir_``, ``fin_``).  Layout: one row
(pseudo-sequence) per pair (i, t in O_i) with selected token t and inequalities over
tau not in O_i; the row of the reference token o_i (the most attended one) also carries
the equalities against every other t in O_i (equalities over all pairs follow from these
and are not repeated).  Frobenius norm by default (the papers'); any norm of
:func:`attnsvm.norms.get_norm` may be given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..metrics import correlation
from . import engine
from .constraints import build_constraints
from .result import Solution
from .validate import as_array, as_mask, as_norm, as_tol

__all__ = ["MultiTokenSolution", "multitoken_svm", "selected_sets"]


def selected_sets(s, threshold: float = 1e-3) -> np.ndarray:
    """O = s >= threshold, bool with the shape of s (..., n, T).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import selected_sets
        >>> selected_sets(np.array([[0.7, 0.3, 1e-5]]))
        array([[ True,  True, False]])
    """
    s = np.asarray(s, dtype=float)
    return s >= threshold


def _corr(A, B) -> float:
    return float(correlation(np.ravel(A), np.ravel(B)))


@dataclass(repr=False)
class MultiTokenSolution:
    """W_dir_, W_fin_, W_eq_ (d, e); R_ (float); sets_ (n, T) bool; predictivity_ =
    corr(W_trained, W_eq) (nan without W_trained), corr_dir_ = corr(W_trained, W_dir);
    feasible_, status_, solver_, violation_, gap_ of the W_dir problem; ``dir_`` and
    ``fin_`` the certified :class:`Solution` of each problem.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import multitoken_svm
        >>> sol = multitoken_svm(np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]]), np.array([[1.0, 1.0]]),
        ...                      np.array([[0.6, 0.4, 0.0]]))
        >>> sol.status_, sol.W_fin_.shape
        ('optimal', (2, 2))
    """

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
    gap_: float = float("nan")
    dir_: Solution | None = None
    fin_: Solution | None = None
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"MultiTokenSolution(feasible={self.feasible_}, |O|={int(self.sets_.sum())}, "
                f"R={self.R_:.4g}, predictivity={self.predictivity_:.4f}, "
                f"corr_dir={self.corr_dir_:.4f}, status={self.status_!r}, gap={self.gap_:.1e})")

    summary = __repr__


def _rows(X, O, valid, s):
    """The row layout: (row_seq, sel, ineq_valid, eq_cells, b_fin) for rows (i, t in O_i)."""
    n, T, _ = X.shape
    ref = np.argmax(np.where(O, s, -np.inf), axis=1)  # reference token o_i (most attended)
    ri, rt = np.nonzero(O)
    ineq = (valid & ~O)[ri]  # tau not in O_i
    is_ref = rt == ref[ri]
    eqc = O[ri] & is_ref[:, None] & (np.arange(T)[None, :] != rt[:, None])
    with np.errstate(divide="ignore"):
        b_fin = np.where(eqc, np.log(s[ri, rt][:, None]) - np.log(np.where(eqc, s[ri], 1.0)), 0.0)
    return ri, rt, ineq, eqc, b_fin


def multitoken_svm(X, z, s, threshold: float = 1e-3, W_trained=None, mask=None, *,
                   norm="fro", solver=None, tol: float = 1e-6) -> MultiTokenSolution:
    """Solve W_dir, W_fin and W_eq (see module docstring).

    X (n, T, d), z (n, e), s (n, T) final attention probabilities (> 0 on the selected
    sets), mask (n, T) bool, W_trained (d, e) optional.  Both problems are certified by
    the engine; ``feasible_`` / ``status_`` are those of W_dir.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import multitoken_svm
        >>> X = np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]])
        >>> z = np.array([[1.0, 1.0]])
        >>> s = np.array([[0.6, 0.4, 0.0]])                # final attention: tokens 0 and 1 selected
        >>> sol = multitoken_svm(X, z, s)
        >>> sol.feasible_, sol.sets_.tolist()
        (True, [[True, True, False]])
    """
    tol = as_tol(tol)  # before any work
    X = as_array(X, "X", (3,), "(n, T, d)")
    n, T, d = X.shape
    z = as_array(z, "z", (2,), "(n, e)")
    if z.shape[0] != n:
        raise ValueError(f"z must have shape ({n}, e); got {z.shape}")
    s = as_array(s, "s", (2,), "(n, T)")
    if s.shape != (n, T):
        raise ValueError(f"s must have shape ({n}, {T}); got {s.shape}")
    threshold = float(threshold)
    if not (np.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite number > 0; got {threshold}")
    valid = as_mask(mask, (n, T))
    O = selected_sets(s, threshold) & valid
    if not O.any(1).all():
        bad = np.nonzero(~O.any(1))[0][:10].tolist()
        raise ValueError(f"every sequence needs a selected token (s >= threshold); none in "
                         f"sequences {bad}")
    Wt = None
    if W_trained is not None:
        Wt = as_array(W_trained, "W_trained", (2,), "(d, e)")
        if Wt.shape != (d, z.shape[1]):
            raise ValueError(f"W_trained must have shape ({d}, {z.shape[1]}); got {Wt.shape}")
    N = as_norm(norm)
    ri, rt, ineq, eqc, b_fin = _rows(X, O, valid, s)
    Xr, Zr = X[ri][None], z[ri][None]
    # W_dir: inequalities (b = 1) and equalities (b = 0)
    cs_dir = build_constraints(Xr, Zr, rt[None], (ineq | eqc)[None],
                                      np.where(eqc, 0.0, 1.0)[None], eqc[None])
    # W_fin: the equalities with b = log(s_o / s_t) alone
    cs_fin = build_constraints(Xr, Zr, rt[None], eqc[None], b_fin[None], eqc[None])

    def run(cs, problem):
        out = engine.solve(cs, N, solver=solver, tol=tol)
        sol = engine.to_solution(cs, out, alpha=rt, problem=problem, vector=False, norm=N,
                                 tol=tol)
        sol.conflict_ = tuple(sorted({int(ri[c]) for c in sol.conflict_}))
        return sol

    sd = run(cs_dir, "multitoken_dir")
    sf = run(cs_fin, "multitoken_fin")
    W_fin = sf.W_ if sf.feasible_ else np.full((d, z.shape[1]), np.nan)
    W_dir = sd.W_ if sd.feasible_ else None
    R = float("nan")
    W_eq = None
    pred = corr_dir = float("nan")
    corr_fin = _corr(Wt, W_fin) if Wt is not None and sf.feasible_ else float("nan")
    if W_dir is not None and sf.feasible_:
        if Wt is not None:
            nd = float((W_dir**2).sum())
            R = float(((Wt - W_fin) * W_dir).sum() / nd) if nd > 0 else 0.0
            W_eq = W_fin + R * W_dir
            pred = _corr(Wt, W_eq)
            corr_dir = _corr(Wt, W_dir)
        else:
            W_eq = W_fin.copy()
    return MultiTokenSolution(W_dir_=W_dir, W_fin_=W_fin, W_eq_=W_eq, R_=R, sets_=O,
                              predictivity_=pred, corr_dir_=corr_dir, corr_fin_=corr_fin,
                              feasible_=sd.feasible_, status_=sd.status_, solver_=sd.solver_,
                              violation_=sd.violation_, gap_=sd.gap_, dir_=sd, fin_=sf)
