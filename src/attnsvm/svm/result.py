"""The results of the max-margin problems: :class:`Solution` (one problem) and
:class:`BatchSolution` (B problems), every verdict in them set by the one certificate
(:func:`attnsvm.svm.certificate.certify`); :class:`NotRepresentableError`; the norms they
report (:func:`primal_norm`, :func:`dual_norm`).

Multipliers ``dual_`` always refer to the squared problem min 1/2 ||W||^2 (whatever the
norm), so that sum_k lam_k b_k = ||W_mm||^2 at the optimum and, for the Frobenius norm,
W_mm = sum_k lambda_k A_k.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from .certificate import fro_norm

__all__ = ["Solution", "BatchSolution", "NotRepresentableError", "primal_norm", "dual_norm"]


class NotRepresentableError(OverflowError, ValueError):
    """The max-margin solution exists but over- or underflows float64 at the input's scale.

    ``solution`` holds the certified solution of the normalised problem (W_ in units of
    2^-scale_exp) and ``scale_exp`` the exponent: W = 2^-scale_exp * solution.W_.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import NotRepresentableError, att_svm
        >>> X = np.array([[[1e-300, 0.0], [0.0, 0.0]]])    # a unit margin needs ||W|| ~ 1e600
        >>> try:
        ...     att_svm(X, np.array([[1e-300, 0.0]]), alpha=[0])
        ... except NotRepresentableError as exc:
        ...     print(exc.solution.status_, exc.scale_exp)  # W = 2^-scale_exp * solution.W_
        optimal -1992
    """

    def __init__(self, msg, solution=None, scale_exp=None):
        super().__init__(msg)
        self.solution = solution
        self.scale_exp = scale_exp


# ----------------------------------------------------------------------------- norms
def primal_norm(W: np.ndarray, norm) -> float:
    """||W|| in ``norm`` (any spec of :func:`attnsvm.norms.get_norm`); vectors: the
    vector norm (l_2 for nuc / spectral).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import primal_norm
        >>> W = np.diag([3.0, 4.0])
        >>> primal_norm(W, "fro"), primal_norm(W, "nuc"), primal_norm(W, "spectral")
        (5.0, 7.0, 4.0)
    """
    from ..norms import get_norm

    W = np.asarray(W, dtype=float)
    return float(get_norm(norm).value(W, vector=W.ndim == 1))


def dual_norm(W: np.ndarray, norm) -> float:
    """The dual norm ||W||_* (fro -> fro, nuc <-> spectral, l1 <-> linf, l_p -> l_q).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import dual_norm
        >>> W = np.diag([3.0, 4.0])
        >>> dual_norm(W, "nuc"), dual_norm(W, "l1")        # spectral and linf
        (4.0, 4.0)
    """
    from ..norms import get_norm

    W = np.asarray(W, dtype=float)
    return float(get_norm(norm).dual.value(W, vector=W.ndim == 1))


# -------------------------------------------------------------------------- solution
@dataclass(repr=False)
class Solution:
    """A max-margin solution with its certificate (sklearn-style trailing underscores).

    Attributes
    ----------
    W_ : (d, d) / (d, e) matrix, or (d,) vector for prompt / head problems; None if no
        answer (infeasible or uncertified).
    norm_ : ||W_|| in the problem's norm (inf without an answer).
    margin_ : min_k m_k(W_) / b_k over the constraints with b_k > 0.
    violation_ : max_k max(0, b_k - m_k(W_)) (|m_k - b_k| for equalities), relative to the
        unit margin.
    kkt_residual_ : relative stationarity residual of min 1/2||W||^2 (Frobenius:
        ||W - sum lambda_k A_k|| / ||W||; other norms: ||sum lambda A||_* = ||W|| and
        <sum lambda A, W> = ||W||^2) and the complementarity max lambda_k (m_k - b_k) / ||W||^2.
    gap_ : certified relative duality gap (||W|| - lb) / lb, lb = sum lambda_k b_k /
        ||sum lambda_k A_k||_* (a lower bound on the optimal norm).
    dual_ : (n, T) multipliers lambda of min 1/2||W||^2 (0 at alpha, masked tokens).
    support_ : (n, T) bool, active constraints m_k <= b_k + tol_active (SVM-neighbours).
    margins_ : (n, T) constraint values m_k(W_) (0 where invalid).
    status_ : from the certificate only: "optimal" (feasible, gap <= 1e-6),
        "optimal_inaccurate" (gap <= 1e-3), "suboptimal", "infeasible" (a Farkas
        certificate proven exactly: sum lambda_k A_k = 0), "uncertified" (neither proven),
        "heuristic_rank" (rank-constrained heuristic, feasible).
    solver_ : the solver that produced W_.  feasible_ : bool: every margin of W_ proven
        >= b_k for the exact data (:mod:`attnsvm.svm.certificate`; equalities to 1e-9).
    conflict_ : indices of the sequences of an (irreducible where possible) infeasible
        subsystem, from the verified Farkas certificate (empty tuple when feasible).
    alpha_ : the selected token indices the problem was built from.
    extra : n_constraints, scale_exp (the internal normalisation: the solver worked on
        W * 2^scale_exp), farkas_bound (infeasible: inf, no W meets the constraints),
        lower_bound (the weak-duality lower bound on the optimal norm, evaluated in
        floating point).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import att_svm
        >>> sol = att_svm(np.array([[[1.0, 0.0], [0.0, 1.0]]]), np.array([[1.0, 0.0]]), alpha=[0])
        >>> sol.status_, sol.feasible_, sol.W_.shape, sol.gap_ <= 1e-6
        ('optimal', True, (2, 2), True)
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
    norm: str = "fro"
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
        m = np.abs(self.W_).max() if self.W_.size else 0.0
        if m == 0:
            return self.W_
        W1 = self.W_ / m
        return W1 / float(fro_norm(W1.reshape(1, -1)))  # (a vector W_ too)

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
                f"Solution({self.problem}, norm={self.norm!r}, {self.status_.upper()}, "
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
            if self.status_ == "infeasible":
                lines.append("  INFEASIBLE: no W satisfies all margin constraints (Farkas "
                             "certificate proven: sum lam_k A_k = 0 exactly, lam >= 0, "
                             "sum lam_k b_k > 0).")
                lines.append(f"  conflicting sequences: {list(self.conflict_)}")
                zero = self.extra.get("zero_constraints")
                if zero is not None and len(zero):
                    lines.append(f"  constraints with A_k = 0 (token equal to the selected one, "
                                 f"or a zero query): {len(zero)}, e.g. (i, t) = "
                                 f"{[tuple(int(v) for v in z) for z in zero[:5]]}")
            else:
                lines.append("  NO CERTIFIED ANSWER: neither a W with every margin proven >= 1 nor "
                             "a Farkas certificate of infeasibility could be proven.")
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


class _Deferred:
    """A field of :class:`DeferredSolution` whose value is computed where one of the
    deferred fields is first read (by the thunk the solver left, which gives them all;
    then kept, as a field set at construction is).  Setting it (the dataclass
    ``__init__``, ``dataclasses.replace``, a caller) stores the value."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        d = obj.__dict__
        value = d.get(self.name, _MISSING)
        if value is _MISSING:
            thunk = d.get("_deferred")
            if thunk is None:
                raise AttributeError(f"{type(obj).__name__} has no value for {self.name!r}")
            for k, v in thunk().items():  # (two threads: the same values, computed twice)
                d.setdefault(k, v)  # (a value the caller set stays)
            value = d[self.name]
        return value

    def __set__(self, obj, value):
        obj.__dict__[self.name] = value


_MISSING = object()


class DeferredSolution(Solution):
    """A :class:`Solution` some of whose reported numbers (``kkt_residual_``, ``margins_``,
    ``support_``, ``dual_``: none of them decides the status) are computed where one of
    them is first read, by the same operations on the same data (so the same values as if
    they had been computed at once): the single-problem fast path
    (:func:`attnsvm.svm.lean.att_svm_lean`), where computing them costs as much as the
    proof.  Made by :meth:`make` (or constructed as a :class:`Solution`: every field
    given).  Copies and pickles hold every value."""

    kkt_residual_ = _Deferred()
    margins_ = _Deferred()
    support_ = _Deferred()
    dual_ = _Deferred()

    @classmethod
    def make(cls, thunk, **values) -> DeferredSolution:
        """The solution of ``values`` (every field of :class:`Solution` but the deferred
        ones, by name) and ``thunk`` (a zero-argument callable giving the deferred ones,
        {name: value}), set as the dataclass ``__init__`` would set them (it has no
        ``__post_init__``), in one step."""
        obj = cls.__new__(cls)
        values["_deferred"] = thunk
        obj.__dict__.update(values)
        return obj

    def __getstate__(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}  # (every value)

    def __setstate__(self, state):
        self.__dict__.update(state)


@dataclass(repr=False)
class BatchSolution:
    """Solutions of B problems (leading dimension B on every array).

    W_ (B, d, e) or (B, d) for prompt problems (NaN where there is no answer); norm_,
    margin_, violation_, kkt_residual_, gap_ (B,); dual_, support_, margins_ (B, n, T);
    feasible_ (B,) bool; status_ (B,) str; conflict_ list of B tuples; solver_ (B,) str.
    ``sol[b]`` gives the :class:`Solution` of problem b; ``len(sol)`` = B.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import att_svm_batch
        >>> X = np.tile(np.array([[[1.0, 0.0], [0.0, 1.0]]]), (3, 1, 1, 1))   # B = 3 copies
        >>> sol = att_svm_batch(X, np.ones((3, 1, 2)), alpha=np.zeros((3, 1), int))
        >>> len(sol), sol[0].status_, np.round(sol.norm_, 6)
        (3, 'optimal', array([0.5, 0.5, 0.5]))
    """

    W_: np.ndarray
    norm_: np.ndarray
    margin_: np.ndarray
    violation_: np.ndarray
    kkt_residual_: np.ndarray
    gap_: np.ndarray
    dual_: np.ndarray
    support_: np.ndarray
    margins_: np.ndarray
    feasible_: np.ndarray
    status_: np.ndarray
    solver_: np.ndarray
    conflict_: list
    alpha_: np.ndarray
    norm: str = "fro"
    problem: str = "att_svm"
    time_: float = 0.0
    tol_active: float = 1e-6
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.feasible_)

    @property
    def neighbours_(self) -> np.ndarray:
        """Alias of ``support_`` (B, n, T) bool: the SVM-neighbours (active constraints) per problem."""
        return self.support_

    def __getitem__(self, b: int) -> Solution:
        feas = bool(self.feasible_[b])
        extra = {k: v[b] for k, v in self.extra.items() if isinstance(v, np.ndarray)
                 and v.shape[:1] == (len(self),)}
        return Solution(
            W_=self.W_[b] if feas else None, norm_=float(self.norm_[b]),
            margin_=float(self.margin_[b]), violation_=float(self.violation_[b]),
            kkt_residual_=float(self.kkt_residual_[b]), gap_=float(self.gap_[b]),
            dual_=self.dual_[b] if feas else None, support_=self.support_[b] if feas else None,
            margins_=self.margins_[b] if feas else None, status_=str(self.status_[b]),
            solver_=str(self.solver_[b]), feasible_=feas, conflict_=tuple(self.conflict_[b]),
            alpha_=self.alpha_[b], norm=self.norm, problem=self.problem,
            tol_active=self.tol_active, extra=extra,
        )

    def __repr__(self) -> str:
        B = len(self)
        nf = int(self.feasible_.sum())
        f = self.feasible_
        mv = float(np.nanmax(self.violation_[f])) if nf else float("nan")
        mg = float(np.nanmax(self.gap_[f])) if nf else float("nan")
        ni = int((self.status_ == "infeasible").sum())
        return (f"BatchSolution({self.problem}, norm={self.norm!r}, B={B}, feasible={nf}/{B}, "
                f"infeasible={ni}, max violation={mv:.1e}, max gap={mg:.1e}, "
                f"time={self.time_:.3g}s)")

    def summary(self) -> str:
        """The batch in one line (its repr): B, how many problems are feasible and how many
        proven infeasible, the largest violation and gap over the feasible ones, the time."""
        return repr(self)
