"""Solution objects, constraint sets and certificates of the max-margin problems.

Every problem of THEORY §5 with margin constraints is, after flattening, a set of
linear constraints on a matrix ``W`` (d, e):

    m_k(W) = Delta_k^T W z_k >= b_k,      k = (i, t) with valid[i, t]

with ``Delta`` (n, T, d) the token differences x_{i,alpha_i} - x_{it}, ``Z`` (n, e) the
query of sequence i and ``b`` (n, T) the right-hand side (1, or 0 for the relaxed
problem).  The constraint matrix of k is A_k = Delta_k z_k^T, so
<A_k, A_l> = (Delta_k . Delta_l)(z_k . z_l).  The prompt problem is the case e = 1,
z = 1 (W is then the vector p as a (d, 1) matrix).

Multipliers ``dual_`` always refer to the squared problem min 1/2 ||W||^2 (whatever
the norm), so that 1^T lambda = ||W_mm||^2 at the optimum and, for the Frobenius
norm, W_mm = sum_k lambda_k A_k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ConstraintSet", "Solution", "dual_norm", "primal_norm"]


def single_thread(fn):
    """Run ``fn`` with BLAS limited to one thread: the solvers' many small / medium
    factorisations gain nothing from BLAS threads and lose badly to oversubscription
    on a shared machine (measured: 0.7 s vs 23 s on a loaded 2-core box)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover
            return fn(*args, **kwargs)
        with threadpool_limits(1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------- norms
def _norm_name(norm) -> str | float:
    if isinstance(norm, str):
        key = norm.lower()
        if key in ("fro", "frobenius", "l2", "2"):
            return "fro"
        if key in ("nuc", "nuclear", "trace"):
            return "nuc"
        if key in ("l1", "1"):
            return "l1"
        try:
            return _norm_name(float(key))
        except ValueError:
            raise ValueError(f"norm must be 'fro', 'nuc', 'l1' or a float p > 1; got {norm!r}") from None
    p = float(norm)
    if not np.isfinite(p) or p < 1:
        raise ValueError(f"norm must be 'fro', 'nuc', 'l1' or a float p > 1; got {norm!r}")
    if p == 1:
        return "l1"
    if p == 2:
        return "fro"
    return p


def primal_norm(W: np.ndarray, norm) -> float:
    """||W|| for norm in {"fro", "nuc", "l1", p}; vectors use the l2 / l_p norm."""
    norm = _norm_name(norm)
    W = np.asarray(W, dtype=float)
    if norm == "fro":
        return float(np.linalg.norm(W))
    if norm == "nuc":
        return float(np.linalg.svd(W, compute_uv=False).sum()) if W.ndim == 2 else float(np.linalg.norm(W))
    if norm == "l1":
        return float(np.abs(W).sum())
    return float((np.abs(W) ** norm).sum() ** (1.0 / norm))


def dual_norm(W: np.ndarray, norm) -> float:
    """The dual norm ||W||_*: fro -> fro, nuc -> spectral, l1 -> max abs, l_p -> l_q."""
    norm = _norm_name(norm)
    W = np.asarray(W, dtype=float)
    if norm == "fro":
        return float(np.linalg.norm(W))
    if norm == "nuc":
        return float(np.linalg.norm(W, 2)) if W.ndim == 2 else float(np.linalg.norm(W))
    if norm == "l1":
        return float(np.abs(W).max()) if W.size else 0.0
    q = norm / (norm - 1.0)
    return float((np.abs(W) ** q).sum() ** (1.0 / q))


# ----------------------------------------------------------------------- constraints
@dataclass
class ConstraintSet:
    """Constraints Delta_k^T W z_k >= b_k in padded (n, T) layout.

    Delta (n, T, d), Z (n, e), valid (n, T) bool, b (n, T).  Invalid entries (the
    selected token itself, masked tokens, causal future) carry Delta = 0 and are
    ignored everywhere.
    """

    Delta: np.ndarray
    Z: np.ndarray
    valid: np.ndarray
    b: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return (self.Delta.shape[-3], self.Delta.shape[-2])

    @property
    def n_constraints(self) -> int:
        return int(self.valid.sum())

    @property
    def d(self) -> int:
        return self.Delta.shape[-1]

    @property
    def e(self) -> int:
        return self.Z.shape[-1]

    def margins(self, W: np.ndarray) -> np.ndarray:
        """m_it = Delta_it^T W z_i, (n, T) (0 at invalid entries)."""
        m = ((self.Delta @ W) * self.Z[:, None, :]).sum(-1)
        return np.where(self.valid, m, 0.0)

    def combine(self, lam: np.ndarray) -> np.ndarray:
        """sum_k lam_k A_k = sum_i (sum_t lam_it Delta_it) z_i^T, shape (d, e)."""
        lam = np.where(self.valid, lam, 0.0)
        u = np.einsum("it,itd->id", lam, self.Delta)
        return u.T @ self.Z

    def dense(self) -> np.ndarray:
        """The (N, d*e) matrix of vec(A_k) (C order) over the valid constraints."""
        ii, tt = np.nonzero(self.valid)
        return np.einsum("kd,ke->kde", self.Delta[ii, tt], self.Z[ii]).reshape(len(ii), -1)

    def scale(self) -> float:
        """max_k ||A_k||_F (0 if there is no constraint)."""
        nrm = np.linalg.norm(self.Delta, axis=-1) * np.linalg.norm(self.Z, axis=-1)[:, None]
        nrm = np.where(self.valid, nrm, 0.0)
        return float(nrm.max()) if nrm.size else 0.0


# -------------------------------------------------------------------------- solution
@dataclass(repr=False)
class Solution:
    """A max-margin solution with its certificate (sklearn-style trailing underscores).

    Attributes
    ----------
    W_ : (d, d) / (d, e) matrix, or (d,) vector for prompt / head problems; None if infeasible.
    norm_ : ||W_|| in the problem's norm (inf if infeasible).
    margin_ : min_k m_k(W_) over the constraints (for the relaxed problem: over b_k = 1).
    violation_ : max_k max(0, b_k - m_k(W_)) (relative to the unit margin).
    kkt_residual_ : max of the relative stationarity residual (Frobenius:
        ||W - sum lambda_k A_k|| / ||W||; other norms: ||sum lambda A||_* = ||W|| and
        <sum lambda A, W> = ||W||^2) and the complementarity max lambda_k (m_k - b_k) / ||W||^2.
    gap_ : relative duality gap (||W|| - lb) / lb, lb = sum lambda_k b_k / ||sum lambda_k A_k||_*.
    dual_ : (n, T) multipliers lambda of min 1/2||W||^2 (0 at alpha, masked tokens).
    support_ : (n, T) bool, active constraints m_k <= b_k + tol_active (SVM-neighbours).
    margins_ : (n, T) constraint values m_k(W_) (0 where invalid).
    status_, solver_ : strings; feasible_ : bool.
    conflict_ : indices of the sequences of an (irreducible where possible) infeasible
        subsystem (empty tuple when feasible).
    alpha_ : the selected token indices the problem was built from.
    """

    W_: np.ndarray | None
    norm_: float
    margin_: float
    violation_: float
    kkt_residual_: float
    gap_: float
    dual_: np.ndarray | None
    support_: np.ndarray | None
    margins_: np.ndarray | None
    status_: str
    solver_: str
    feasible_: bool
    conflict_: tuple = ()
    alpha_: np.ndarray | None = None
    norm: str | float = "fro"
    problem: str = "att_svm"
    n_iter_: int = 0
    time_: float = 0.0
    tol_active: float = 1e-6
    extra: dict = field(default_factory=dict)

    # --------------------------------------------------------------- views
    @property
    def neighbours_(self) -> np.ndarray | None:
        """Alias of ``support_``: the SVM-neighbours (active constraints)."""
        return self.support_

    @property
    def direction_(self) -> np.ndarray | None:
        """W_ / ||W_||_F (None when infeasible)."""
        if self.W_ is None:
            return None
        nrm = np.linalg.norm(self.W_)
        return self.W_ / nrm if nrm > 0 else self.W_

    def rank(self, rtol: float = 1e-7) -> int:
        """Numerical rank of W_ (singular values > rtol * largest)."""
        if self.W_ is None or self.W_.ndim != 2:
            return 0 if self.W_ is None else 1
        s = np.linalg.svd(self.W_, compute_uv=False)
        return int((s > rtol * s[0]).sum()) if s.size and s[0] > 0 else 0

    def __repr__(self) -> str:
        shape = None if self.W_ is None else tuple(self.W_.shape)
        if not self.feasible_:
            return (
                f"Solution({self.problem}, norm={self.norm!r}, INFEASIBLE, status={self.status_!r}, "
                f"conflict={list(self.conflict_)}, solver={self.solver_!r})"
            )
        return (
            f"Solution({self.problem}, norm={self.norm!r}, shape={shape}, ||W||={self.norm_:.6g}, "
            f"margin={self.margin_:.6g}, violation={self.violation_:.1e}, kkt={self.kkt_residual_:.1e}, "
            f"gap={self.gap_:.1e}, n_support={int(self.support_.sum()) if self.support_ is not None else 0}, "
            f"status={self.status_!r}, solver={self.solver_!r})"
        )

    def summary(self) -> str:
        """A multi-line, human-readable certificate."""
        lines = [f"{self.problem} (norm={self.norm}) solved by {self.solver_}: status {self.status_}"]
        if not self.feasible_:
            lines.append("  INFEASIBLE: no W satisfies all margin constraints.")
            lines.append(f"  conflicting sequences: {list(self.conflict_)}")
            return "\n".join(lines)
        n_con = int(self.extra.get("n_constraints", 0))
        lines += [
            f"  solution shape        {tuple(self.W_.shape)}",
            f"  norm ||W||            {self.norm_:.10g}",
            f"  min margin            {self.margin_:.10g}   (target 1)",
            f"  max violation         {self.violation_:.3e}",
            f"  KKT residual          {self.kkt_residual_:.3e}",
            f"  relative duality gap  {self.gap_:.3e}",
            f"  active constraints    {int(self.support_.sum())} of {n_con}",
        ]
        if self.W_.ndim == 2:
            lines.append(f"  numerical rank        {self.rank()}")
        lines.append(f"  iterations / time     {self.n_iter_} / {self.time_:.3g} s")
        return "\n".join(lines)


def certify(
    cs: ConstraintSet,
    W: np.ndarray | None,
    lam: np.ndarray | None,
    *,
    norm="fro",
    status: str,
    solver: str,
    alpha=None,
    problem: str = "att_svm",
    n_iter: int = 0,
    time_: float = 0.0,
    tol_active: float = 1e-6,
    vector: bool = False,
    rescale: bool = False,
    conflict: tuple = (),
) -> Solution:
    """Build a Solution with its certificate computed on ALL constraints of ``cs``.

    ``W`` (d, e) (None = infeasible), ``lam`` (n, T) multipliers of min 1/2||W||^2 (may be
    None: then only feasibility numbers are reported).  ``rescale`` divides W by its
    minimal margin ratio when < 1 so the returned point is exactly feasible (used for
    first-order / SCS answers); ``lam`` is scaled along.
    """
    norm = _norm_name(norm)
    n_con = cs.n_constraints
    if W is None:
        return Solution(
            W_=None, norm_=float("inf"), margin_=float("nan"), violation_=float("nan"),
            kkt_residual_=float("nan"), gap_=float("nan"), dual_=None, support_=None,
            margins_=None, status_=status, solver_=solver, feasible_=False,
            conflict_=tuple(int(c) for c in conflict), alpha_=alpha, norm=norm, problem=problem,
            n_iter_=n_iter, time_=time_, tol_active=tol_active, extra={"n_constraints": n_con},
        )
    W = np.asarray(W, dtype=float)
    m = cs.margins(W)
    pos = cs.valid & (cs.b > 0)
    if rescale and pos.any():
        ratio = float((m[pos] / cs.b[pos]).min())
        if 0 < ratio < 1:
            W = W / ratio
            m = m / ratio
            if lam is not None:
                lam = lam / ratio**2
    margin = float(m[pos].min()) if pos.any() else float("inf")
    viol = float(np.maximum(cs.b - m, 0.0)[cs.valid].max()) if n_con else 0.0
    nrm = primal_norm(W, norm)
    kkt = float("nan")
    gap = float("nan")
    if lam is None and n_con == 0:
        lam = np.zeros(cs.valid.shape)
    if lam is not None:
        lam = np.where(cs.valid, np.maximum(lam, 0.0), 0.0)
        S = cs.combine(lam)
        if nrm > 0:
            comp = float(np.abs(lam * (m - cs.b)).max()) / nrm**2 if n_con else 0.0
            if norm == "fro":
                stat = float(np.linalg.norm(W - S)) / nrm
            else:
                dn = dual_norm(S, norm)
                stat = max(abs(dn / nrm - 1.0), abs(float((S * W).sum()) / nrm**2 - 1.0))
            kkt = max(stat, comp)
            lb_num = float((lam * cs.b).sum())
            dn = dual_norm(S, norm)
            if dn > 0 and lb_num > 0:
                lb = lb_num / dn
                # the upper bound is only valid for an exactly feasible point
                feas_scale = 1.0 / margin if 0 < margin < 1 else 1.0
                gap = max(nrm * feas_scale - lb, 0.0) / lb
        else:  # W = 0 is optimal iff no constraint has b > 0
            kkt = 0.0 if not pos.any() else float("inf")
            gap = 0.0 if not pos.any() else float("inf")
    support = cs.valid & (m <= cs.b + tol_active * np.maximum(1.0, np.abs(cs.b)))
    out_W = W[:, 0] if vector else W
    return Solution(
        W_=out_W, norm_=nrm, margin_=margin, violation_=viol, kkt_residual_=kkt, gap_=gap,
        dual_=lam, support_=support, margins_=m, status_=status, solver_=solver,
        feasible_=True, conflict_=(), alpha_=alpha, norm=norm, problem=problem,
        n_iter_=n_iter, time_=time_, tol_active=tol_active, extra={"n_constraints": n_con},
    )
