"""The max-margin problems of docs/theory.md §5 (single instances).

Every problem builds a normalised :class:`~attnsvm.svm.constraints.ConstraintSet` (a batch
of one) and goes through the one engine, :func:`attnsvm.svm.engine.solve`: the same
solvers, the same certificate and the same verified infeasibility verdict as the
batched solvers.  Arguments are checked by :mod:`attnsvm.svm.validate`.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..scores import opt_tokens, scores  # re-exported: the one home is attnsvm.scores
from . import engine
from .constraints import (
    ConstraintSet,
    build_constraints,
    normalise,
    normalise_constraints,
    scaled_keys,
)
from .farkas import farkas_conflict
from .result import Solution
from .strategy import solve_conic, solver_key, strategy
from .validate import (
    as_alpha,
    as_array,
    as_labels,
    as_mask,
    as_norm,
    as_support,
    as_tol,
    resolve_alpha,
)

__all__ = [
    "att_svm",
    "prompt_svm",
    "seq2seq_svm",
    "head_svm",
    "relaxed_svm",
    "farkas_conflict",
    "scores",
    "opt_tokens",
]


def _constraints(X, Z, alpha, valid, b=None) -> ConstraintSet:
    """The constraint set of one problem in the caller's units (no normalisation): for
    tests and comparisons with an independent solver."""
    cs = build_constraints(np.asarray(X, float)[None], np.asarray(Z, float)[None],
                           np.asarray(alpha)[None], np.asarray(valid, bool)[None],
                           None if b is None else np.asarray(b, float)[None],
                           normalise_data=False)
    return cs.take(0)


def _solve_cvxpy(cs: ConstraintSet, norm, solver=None, eps=None):
    """cvxpy solve of one (unbatched) constraint set: (W, lam, status, solver, n_iter)."""
    return solve_conic(cs, as_norm(norm), solver, eps)


def _run(cs: ConstraintSet, *, norm, solver, tol, alpha, problem, vector, irreducible,
         rank=None) -> Solution:
    N = as_norm(norm)
    out = engine.solve(cs, N, solver=solver, tol=tol, irreducible=irreducible, rank=rank)
    return engine.to_solution(cs, out, alpha=alpha, problem=problem, vector=vector, norm=N,
                              tol=tol)


def _queries(z, n: int) -> np.ndarray:
    z = as_array(z, "z", (2,), "(n, e)")
    if z.shape[0] != n:
        raise ValueError(f"z must have shape ({n}, e) (one query per sequence); got {z.shape}")
    if z.shape[1] == 0:
        raise ValueError("z must have at least one column (e >= 1)")
    return z


def _tokens(X, name: str = "X") -> np.ndarray:
    X = as_array(X, name, (3,), "(n, T, d)")
    n, T, d = X.shape
    if n == 0 or T == 0 or d == 0:
        raise ValueError(f"{name} must have n, T, d >= 1; got shape {X.shape}")
    return X


def _rank(rank) -> int | None:
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or int(rank) < 1:
        raise ValueError(f"rank must be a positive integer; got {rank!r}")
    return int(rank)


# ---------------------------------------------------------------------------- problems
def att_svm(X, z, alpha=None, *, y=None, v=None, norm="fro", rank=None, mask=None,
            solver=None, tol=1e-6, irreducible=True) -> Solution:
    """Attention SVM (ATT-SVM), docs/theory.md §5:

        W_mm(alpha) = argmin ||W||  s.t.  (x_{i,alpha_i} - x_it)^T W z_i >= 1,
                                          t != alpha_i (valid tokens), all i.

    Parameters
    ----------
    X : (n, T, d) tokens.  z : (n, e) queries (usually e = d).
    alpha : (n,) integer selected tokens; default (None or "opt") argmax_t y_i v^T x_it
        (needs labels y in {-1, +1} and v).
    norm : any norm of :func:`attnsvm.norms.get_norm`: "fro" (default), "nuc",
        "spectral", "l1", "linf", a float p >= 1 or ``"l<p>"`` (entrywise l_p).
    rank : optional m with rank(W) <= m (nonconvex): if the convex solution already has
        numerical rank <= m it is returned (exact, status says so); otherwise a heuristic
        (status "heuristic_rank"): the convex problem restricted to W = U C, U the top-m
        left singular vectors of the convex solution.
    mask : (n, T) bool, True = valid token.
    solver : None (Frobenius: with numba, the compiled exact active-set min-norm-point
        solver for N = n_constraints <= 300, or N <= 4000 and N <= 3 d e (n T < 300:
        normalisation and solve in one compiled call, the certificate in one numpy pass:
        the Frobenius row's fast path, :mod:`attnsvm.svm.lean`);
        else the dual min-norm-point solver if N <= d e or a structured primal IPM, then
        an exact active-set polish; nuclear: primal-dual SDP interior-point method on a
        working set after reducing W to span(Delta) x span(z), the dual log-barrier as
        its fallback; other
        norms: cvxpy with the norm's expression and default solver), "ipm" / "mnp"
        (Frobenius), "barrier" / "working_set" (nuclear), or a cvxpy solver name
        ("clarabel", "scs").  An answer that does not certify is re-solved by a second
        solver.
    tol : tolerance (relative to the unit margin) for reporting active constraints.
    irreducible : name an irreducible conflicting set (LP) when infeasible.

    The problem is solved on tokens and queries scaled by powers of two (max |entry| in
    [1/2, 1)) and mapped back exactly: scaling X by c and z by c' scales W_mm by
    1 / (c c').  Returns a :class:`Solution` with ``W_`` (d, e) whose certificate is
    computed from ``W_`` on all constraints; ``feasible_=False`` with status "infeasible"
    and ``conflict_`` (sequence indices) only when a Farkas certificate is verified.
    Raises :class:`~attnsvm.svm.result.NotRepresentableError` when W_mm over- or
    underflows float64 at the input's scale.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import att_svm
        >>> X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [-1.0, 0.0]]])  # (n=2, T=2, d=2)
        >>> z = np.array([[1.0, 0.0], [0.0, 1.0]])                                # (n, e=2) queries
        >>> sol = att_svm(X, z, alpha=[0, 0])          # token 0 selected in both sequences
        >>> sol.status_, round(sol.norm_, 6), sol.feasible_
        ('optimal', 1.0, True)
        >>> np.round(sol.margins_, 6)                  # >= 1 on every other token
        array([[0., 1.],
               [0., 1.]])
    """
    tol = as_tol(tol)  # before any work
    X = _tokens(X)
    n, T, d = X.shape
    z = _queries(z, n)
    valid = as_mask(mask, (n, T))
    alpha = resolve_alpha(alpha, X, valid, y, v)
    N = as_norm(norm)
    rank = _rank(rank)
    st = strategy(N)
    if (st.fast_single is not None and rank is None
            and st.fast_single_applies(n, T, solver_key(solver, N))):
        # the row's compiled fast path (Frobenius: solve in one compiled call, the one
        # certificate in numpy; None: the engine decides)
        sol = st.fast_single(np.ascontiguousarray(X), np.ascontiguousarray(z), alpha, valid,
                             tol=tol)
        if sol is not None:
            return sol
    cs = build_constraints(X[None], z[None], alpha[None], valid[None])
    return _run(cs, norm=N, solver=solver, tol=tol, alpha=alpha, problem="att_svm",
                vector=False, irreducible=irreducible, rank=rank)


def prompt_svm(X, W=None, alpha=None, *, y=None, v=None, mask=None, norm="fro", solver=None,
               tol=1e-6, irreducible=True) -> Solution:
    """Prompt SVM (docs/theory.md §5): p_mm = argmin ||p|| s.t. (k_{i,alpha_i} - k_it)^T p >= 1,

    keys k_it = W^T x_it.  X (n, T, d), W (d, d') fixed (default identity), alpha (n,).
    ``W_`` of the result is the vector p (d',).  Equivalent to :func:`att_svm` with
    tokens K = X W and queries z_i = 1 (e = 1).  ``norm``: a vector norm (default l_2;
    "nuc" / "spectral" are l_2 on vectors).  A zero W (all keys equal) is infeasible.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import prompt_svm
        >>> X = np.array([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])   # one sequence of 3 tokens
        >>> sol = prompt_svm(X, alpha=[0])                         # p_mm: token 0 beats the others
        >>> sol.status_, np.round(sol.W_, 6)
        ('optimal', array([ 0.5, -0.5]))
    """
    tol = as_tol(tol)  # before any work
    X = _tokens(X)
    n, T, d = X.shape
    valid = as_mask(mask, (n, T))
    alpha = resolve_alpha(alpha, X, valid, y, v)
    K, eK = scaled_keys(X, W, valid)
    cs = build_constraints(K[None], np.ones((1, n, 1)), alpha[None], valid[None],
                           x_exp=np.asarray(eK).reshape(1))
    return _run(cs, norm=norm, solver=solver, tol=tol, alpha=alpha, problem="prompt_svm",
                vector=True, irreducible=irreducible)


def _seq2seq_constraints(X, alpha, causal: bool, valid) -> tuple[ConstraintSet, np.ndarray]:
    """Flatten (i, k) into n*T "sequences" with key tokens X_i and query x_ik."""
    n, T, d = X.shape
    Xf = np.repeat(X, T, axis=0)  # (n*T, T, d)
    Zf = X.reshape(n * T, d)
    ks = np.arange(T)
    keyv = np.repeat(valid, T, axis=0)  # (n*T, T) valid keys
    qv = valid.reshape(-1)  # valid queries
    vf = keyv & qv[:, None]
    if causal:
        vf &= ks[None, :] <= np.tile(ks, n)[:, None]
    af = alpha.reshape(-1)
    sel_ok = vf[np.arange(n * T), af] | ~qv
    if not sel_ok.all():
        bad = sorted({int(i) // T for i in np.nonzero(~sel_ok)[0]})
        raise ValueError(f"alpha selects masked tokens in sequences {bad}")
    af = np.where(qv, af, 0)
    return build_constraints(Xf[None], Zf[None], af[None], vf[None]), af


def seq2seq_svm(X, alpha, causal: bool = False, mask=None, *, norm="fro", solver=None,
                tol=1e-6, irreducible=True) -> Solution:
    """Seq-to-seq attention SVM (SAtt-SVM), docs/theory.md §5:

        min ||W||  s.t.  (x_{i,alpha_ik} - x_it)^T W x_ik >= 1   for t != alpha_ik
                         (causal: only t <= k), every sequence i and query k.

    X (n, T, d), alpha (n, T) integer selected key of each query (causal:
    alpha_ik <= k).  The result's ``dual_``, ``support_``, ``margins_`` have shape
    (n, T, T) indexed [i, query k, key t]; ``conflict_`` lists sequences i.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import seq2seq_svm
        >>> X = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])   # n=1, T=3: every token is a query
        >>> sol = seq2seq_svm(X, alpha=[[2, 2, 2]])                # each query selects token 2
        >>> sol.status_, sol.W_.shape
        ('optimal', (2, 2))
    """
    tol = as_tol(tol)  # before any work
    X = _tokens(X)
    n, T, d = X.shape
    valid = as_mask(mask, (n, T))
    a = as_alpha(alpha, (n, T), T, None)
    if causal and np.any((a > np.arange(T)[None, :]) & valid):
        raise ValueError("alpha selects a future token (alpha_ik > k) in causal mode")
    cs, _ = _seq2seq_constraints(X, a, causal, valid)
    sol = _run(cs, norm=norm, solver=solver, tol=tol, alpha=a, problem="seq2seq_svm",
               vector=False, irreducible=irreducible)
    for name in ("dual_", "support_", "margins_"):
        val = getattr(sol, name)
        if val is not None:
            setattr(sol, name, val.reshape(n, T, T))
    sol.conflict_ = tuple(sorted({int(c) // T for c in sol.conflict_}))
    sol.alpha_ = a
    return sol


def _head_constraints(R: np.ndarray, y: np.ndarray) -> ConstraintSet:
    """y_i v^T r_i >= 1 as a (n, 1) constraint set with Delta_i = y_i r_i, z_i = 1."""
    n = R.shape[0]
    Rs, eR = normalise(R[None], (1, 2))
    return normalise_constraints((y[:, None] * Rs[0])[None, :, None, :], np.ones((1, n, 1)),
                                 np.ones((1, n, 1), bool), exp=eR)


def head_svm(R, y, p=2, *, alpha=None, solver=None, tol=1e-6) -> Solution:
    """Head SVM (docs/theory.md §5): v_mm = argmin ||v||_p s.t. y_i v^T r_i >= 1.

    R (n, d) selected tokens r_i = x_{i,alpha_i} (or X (n, T, d) with integer ``alpha``),
    y (n,) in {-1, +1}; p: any vector norm spec (2 = "fro" default, "l1", 1.5, "linf").
    ``W_`` is v (d,); ``support_`` (n, 1) marks the support vectors
    (``support_indices`` in ``extra``).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import head_svm
        >>> R = np.array([[2.0, 0.0], [-1.0, 0.0], [0.0, 3.0]])    # selected tokens r_i
        >>> sol = head_svm(R, y=[1, -1, 1])
        >>> sol.status_, np.round(sol.W_, 6), sol.extra["support_indices"]
        ('optimal', array([1.      , 0.333333]), array([1, 2]))
    """
    tol = as_tol(tol)  # before any work
    R = as_array(R, "R", (2, 3), "(n, d) or (n, T, d) with alpha")
    if R.ndim == 3:
        if alpha is None:
            raise ValueError("alpha is required when R is (n, T, d)")
        a = as_alpha(alpha, (R.shape[0],), R.shape[1])
        R = R[np.arange(R.shape[0]), a]
    n, d = R.shape
    if n == 0 or d == 0:
        raise ValueError(f"R must have n, d >= 1; got shape {R.shape}")
    y = as_labels(y, n)
    sol = _run(_head_constraints(R, y), norm=p, solver=solver, tol=tol, alpha=alpha,
               problem="head_svm", vector=True, irreducible=True)
    if sol.support_ is not None:
        sol.extra["support_indices"] = np.nonzero(sol.support_[:, 0])[0]
    return sol


def relaxed_svm(X, alpha, y=None, *, W=None, z=None, support=None, mask=None, norm="fro",
                solver=None, tol=1e-6) -> Solution:
    """Relaxed joint SVM (docs/theory.md §5) for the attention parameter of a jointly trained (v, p):

        min ||p||  s.t. (k_{i,alpha_i} - k_it)^T p >= 1  for i in S,
                                                   >= 0  for i not in S,

    S = support sequences of the head SVM on r_i = x_{i,alpha_i} (computed from y when
    ``support`` is not given; ``support`` may be a bool (n,) mask or integer indices).
    Prompt form with keys k = W^T x (W default identity); with ``z`` (n, e) the W form
    (x_{i,alpha_i} - x_it)^T W z_i instead.  Returns a Solution (``extra['S']`` = S).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import relaxed_svm
        >>> X = np.array([[[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [0.0, 2.0]]])
        >>> sol = relaxed_svm(X, alpha=[0, 0], y=[1, -1])
        >>> sol.status_, sol.extra["S"], np.round(sol.W_, 6)
        ('optimal', array([0, 1]), array([ 0.333333, -0.666667]))
    """
    tol = as_tol(tol)  # before any work
    X = _tokens(X)
    n, T, d = X.shape
    valid = as_mask(mask, (n, T))
    if alpha is None or isinstance(alpha, str):
        raise ValueError("relaxed_svm needs alpha: integer selected tokens (n,)")
    alpha = as_alpha(alpha, (n,), T, valid)
    if support is None:
        if y is None:
            raise ValueError("relaxed_svm needs y (to compute the head-SVM support) or support")
        hs = head_svm(X[np.arange(n), alpha], y)
        if not hs.feasible_:
            raise ValueError("the head SVM on the selected tokens is infeasible: y not separable "
                             f"(status {hs.status_}, conflicting sequences {list(hs.conflict_)})")
        S = hs.support_[:, 0]
    else:
        S = as_support(support, n)
    b = np.where(S[:, None], 1.0, 0.0) * np.ones((1, T))
    if z is not None:
        z = _queries(z, n)
        cs = build_constraints(X[None], z[None], alpha[None], valid[None], b[None])
        vector = False
    else:
        K, eK = scaled_keys(X, W, valid)
        cs = build_constraints(K[None], np.ones((1, n, 1)), alpha[None], valid[None], b[None],
                               x_exp=np.asarray(eK).reshape(1))
        vector = True
    sol = _run(cs, norm=norm, solver=solver, tol=tol, alpha=alpha, problem="relaxed_svm",
               vector=vector, irreducible=True)
    sol.extra["S"] = np.nonzero(S)[0]
    return sol
