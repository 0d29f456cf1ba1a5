"""Which solver solves which norm: one table, one row per norm.

    st = strategy(N)                 # the Strategy of norm N (the default row if it has none)
    key = solver_key(solver, N)      # a user's ``solver=`` validated for N
    r = solve_one(cs1, N, key)       # one problem by the row's solvers -> Raw
    key2 = st.fallback_key(r.fallback) # the second solver, when the certificate asks for one

A row (:class:`Strategy`) says, for one norm:

* ``solvers``: the solver names accepted besides cvxpy's (``"auto"``, ``"fast"`` and the
  norm's own: a name of another norm's row is an error for this one);
* ``single``: the norm's own solver of one problem (``(cs, key) -> Raw | None``; None:
  not applicable, cvxpy then solves it) and ``polish``: what improves its answer;
* ``batch_applies`` / ``batch``: many problems at once, where the norm has a batched
  solver;
* ``fast_single`` / ``fast_batch``: the norm's compiled fast path from the raw tokens
  (Frobenius: :func:`attnsvm.svm.lean.att_svm_lean` / :func:`~attnsvm.svm.lean.batch_lean`:
  the solve in one compiled call per problem, the status from the same plain-numpy
  certificate; a problem it does not settle goes through the engine), tried by the entry
  points (:func:`attnsvm.svm.att_svm`, :func:`~attnsvm.svm.att_svm_batch`,
  :func:`~attnsvm.svm.prompt_svm_batch`) where ``fast_single_applies(n, T, key)`` /
  ``fast_batch_applies(B, n, T, key)`` says so;
* ``cvxpy_solver``: the cvxpy solver where the norm's own default (``Norm.solver``) is
  measured worse;
* ``retry_gap``: the certified relative gap above which an answer is re-solved by a
  second solver (exact solvers must reach GAP_OPTIMAL, conic ones GAP_INACCURATE);
* ``fallback_default``: the second solver where the first did not name one (its
  :class:`~attnsvm.svm.records.Raw` ``fallback`` field: nuclear IPM -> barrier -> SCS
  working set, Clarabel -> SCS, :data:`CONIC_SECOND`);
* ``graph``: the Graph-SVM's solver (its strict and equality rows,
  :func:`attnsvm.svm.graph.graph_svm`): ``cs -> iterator of (W, lam, name)``
  candidates, in order, each proven by the Graph-SVM's proof until one is optimal
  (None: the norm has no Graph-SVM, an error naming those that have); ``graph_warm``:
  loads (or compiles) its kernels before the timer starts.

The engine (:func:`attnsvm.svm.engine.solve`) and the Graph-SVM
(:func:`attnsvm.svm.graph.graph_svm`) read nothing else about solvers.  A new
norm's solver is one module (returning :class:`~attnsvm.svm.records.Raw`) and one row here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from ..norms import FRO, NUC, SPECTRAL, Norm
from . import active, frobenius, lean, nuclear
from .certificate import FRO_BOUNDS, GAP_INACCURATE, GAP_OPTIMAL, NUC_BOUNDS, NormBounds
from .conic import solve_cvxpy
from .constraints import ConstraintSet
from .records import Raw

__all__ = ["Strategy", "STRATEGIES", "DEFAULT", "SOLVERS", "strategy", "solver_key",
           "solve_one", "solve_conic"]


@dataclass(frozen=True)
class Strategy:
    """How the problems of one norm are solved (see the module docstring)."""

    solvers: tuple[str, ...] = ("auto", "fast")
    single: Callable[[ConstraintSet, str | None], Raw | None] | None = None
    polish: Callable[[ConstraintSet, Raw], Raw] | None = None
    batch_applies: Callable[[ConstraintSet, str | None, int], bool] | None = None
    batch: Callable | None = None
    fast_single_applies: Callable[[int, int, str | None], bool] | None = None
    fast_single: Callable | None = None
    fast_batch_applies: Callable[[int, int, int, str | None], bool] | None = None
    fast_batch: Callable | None = None
    cvxpy_solver: str | None = None
    retry_gap: float = GAP_INACCURATE
    fallback_default: str = "clarabel"
    graph: Callable[[ConstraintSet], Iterator[tuple]] | None = None
    graph_warm: Callable[[], object] = active.available
    graph_memory: Callable[[int, int], tuple[float, str]] | None = None  # (rows, d) -> bytes, what
    graph_bounds: NormBounds | None = None  # the norm's proven bounds for the Graph-SVM's proof

    def fallback_key(self, named: str | None) -> str:
        """The second solver: the one the first solver named (``Raw.fallback``), else
        ``fallback_default``."""
        return named or self.fallback_default


#: the norms with rows of their own; every other norm: :data:`DEFAULT` (cvxpy with the
#: norm's own expression and solver, retried with the other conic solver)
STRATEGIES: dict[Norm, Strategy] = {
    # exact solvers (active set, or interior point + exact KKT polish): the gap must reach
    # GAP_OPTIMAL; a second opinion from Clarabel, then SCS
    FRO: Strategy(solvers=("auto", "fast", "active", "ipm", "mnp"),
                  single=frobenius.solve_single, polish=frobenius.polish,
                  batch_applies=frobenius.batch_applies, batch=frobenius.solve_batch,
                  fast_single_applies=lean.applies, fast_single=lean.att_svm_lean,
                  fast_batch_applies=lean.batch_applies, fast_batch=lean.batch_lean,
                  retry_gap=GAP_OPTIMAL, graph=frobenius.graph_candidates,
                  graph_memory=frobenius.graph_memory, graph_bounds=FRO_BOUNDS),
    # SDP interior point -> Clarabel working set -> dual barrier (inside nuclear.solve_single);
    # after the certificate: the next of them, then the conic solvers
    NUC: Strategy(solvers=("auto", "fast", "barrier", "working_set"),
                  single=nuclear.solve_single, graph=nuclear.graph_candidates,
                  graph_warm=nuclear.graph_kernels_ready, graph_memory=nuclear.graph_memory,
                  graph_bounds=NUC_BOUNDS),
    # Clarabel's SDP vs SCS (the spectral norm's default), measured at (20, 8, 10): gap
    # 5.5e-9 vs 1.2e-7; at (50, 10, 20): 1.4e-9 in 1.7 s vs 2.3e-8 in 3.4 s (SCS stays
    # the fallback)
    SPECTRAL: Strategy(cvxpy_solver="CLARABEL"),
}
DEFAULT = Strategy()

#: the second opinion on each cvxpy solver's answer (the other conic solver), by the
#: solver cvxpy ran (``solve_cvxpy`` returns its cvxpy name)
CONIC_SECOND = {"CLARABEL": "scs"}

#: solver names accepted besides the cvxpy solvers, by norm (a view of the table)
SOLVERS = {N: s.solvers for N, s in STRATEGIES.items() if s.solvers != DEFAULT.solvers}


def strategy(N: Norm) -> Strategy:
    """The row of norm ``N`` (:data:`DEFAULT` where it has none)."""
    return STRATEGIES.get(N, DEFAULT)


def solver_key(solver, N: Norm) -> str | None:
    """Validate ``solver`` for norm ``N``: None/"auto", a solver of this norm's row, or a
    cvxpy solver name (lower-cased); ValueError naming the choices otherwise."""
    if solver is None:
        return None
    key = str(solver).lower()
    own = strategy(N).solvers
    if key in own:
        return key
    for nm, st in STRATEGIES.items():
        if key in st.solvers and key not in ("auto", "fast"):
            raise ValueError(f"solver {solver!r} applies to the {nm.name!r} norm only, not "
                             f"{N.name!r}; use one of {list(own)} or a cvxpy solver name")
    if key == "fast":
        return None
    import cvxpy as cp

    if key.upper() not in cp.installed_solvers():
        raise ValueError(f"unknown solver {solver!r}; use one of {list(own)} or an installed "
                         f"cvxpy solver ({', '.join(s.lower() for s in cp.installed_solvers())})")
    return key


def solve_conic(cs: ConstraintSet, N: Norm, solver: str | None = None, eps: float | None = None):
    """:func:`attnsvm.svm.conic.solve_cvxpy` with the row's cvxpy solver where ``solver``
    is None (matrices; vectors, e = 1: Clarabel, as there)."""
    if solver is None and cs.e > 1:
        solver = strategy(N).cvxpy_solver
    return solve_cvxpy(cs, N, solver, eps)


def solve_one(cs: ConstraintSet, N: Norm, key) -> Raw:
    """One problem (unbatched, normalised) by its row: the norm's own solver where ``key``
    names none of cvxpy's, else (or where it does not apply) cvxpy; then the row's polish."""
    st = strategy(N)
    r = None
    own = key in (None, "auto", "fast", *st.solvers)
    if own and st.single is not None:
        r = st.single(cs, key)
    if r is None:
        r = Raw(*solve_conic(cs, N, None if own else key))
        r = replace(r, fallback=CONIC_SECOND.get(str(r.solver).upper()))
    if st.polish is not None:
        r = st.polish(cs, r)
    return r
