"""Batched max-margin problems: B problems of one shape at once, in any norm.

Each problem b is min ||W|| s.t. (x_{b,i,alpha_bi} - x_{b,it})^T W z_{b,i} >= 1.  The B
problems go through the same engine as a single problem (:func:`attnsvm.svm.engine.solve`:
a single problem is B = 1): the Frobenius ones through the compiled exact active-set
minimum-norm-point solver (:func:`attnsvm.svm.active.mnp_active`, numba; Wolfe's method on
each problem's Gram matrix G = (Delta Delta^T) o (Z Z^T)) or, without numba and for the
problems it leaves unresolved, one vectorised interior-point method on the equivalent
minimum-norm-point problem (:func:`attnsvm.svm.fast.batched_mnp`) and an exact batched
active-set polish; the other norms one by one; every answer is certified by the one
batched certificate, and problems that do not certify are re-solved by a second solver.

Frobenius batches with numba (n T <= 400) take the Frobenius row's fast path
(:func:`attnsvm.svm.lean.batch_lean`): each problem's steps (normalisation, the
active-set solve, rescaling) in one compiled call, then the one certificate in plain
numpy over the batch; problems certified optimal, and infeasible ones whose Farkas
certificate is proven, are settled there with the engine's numbers; the others go
through the engine as described.
"""

from __future__ import annotations

import numpy as np

from . import engine
from .constraints import build_constraints, scaled_keys
from .result import BatchSolution
from .strategy import solver_key, strategy
from .validate import as_alpha, as_array, as_mask, as_norm, as_tol

__all__ = ["BatchSolution", "att_svm_batch", "prompt_svm_batch"]


def _batch_inputs(X, alpha, mask):
    X = as_array(X, "X", (3, 4), "(B, n, T, d) or (n, T, d)")
    a = np.asarray(alpha)
    if a.ndim != 2:
        raise ValueError(f"alpha must have shape (B, n); got {a.shape}")
    B = a.shape[0]
    if X.ndim == 3:
        X = np.broadcast_to(X, (B, *X.shape))
    if X.shape[0] != B:
        raise ValueError(f"X must have leading dimension B={B} (alpha has {B} rows); got {X.shape}")
    _, n, T, d = X.shape
    if n == 0 or T == 0 or d == 0:
        raise ValueError(f"X must have n, T, d >= 1; got shape {X.shape}")
    valid = as_mask(mask, (B, n, T))
    a = as_alpha(alpha, (B, n), T, valid, what="problems")
    return X, a, valid


def _fast_batch(norm, solver, B: int, n: int, T: int):
    """The strategy row's compiled batch path (``fast_batch``) where its rule
    (``fast_batch_applies``) admits B problems of n x T tokens and ``solver``; else None."""
    N = as_norm(norm)
    st = strategy(N)
    if st.fast_batch is not None and st.fast_batch_applies(B, n, T, solver_key(solver, N)):
        return st.fast_batch
    return None


def _engine_rest(X, z, a, valid, xexp, *, norm, solver, tol, irreducible, problem, vector):
    """``rest(idx)`` for a fast path (the strategy row's ``fast_batch``): the problems idx
    (sorted, at least one) of the batch X (B, n, T, d) divided by 2^xexp, z, a, valid
    through the general engine, as a :class:`BatchSolution` whose first len(idx) rows are
    theirs (one problem runs in a batch of two, as the others do: the engine's batched
    path)."""
    B = len(a)
    xexp = np.broadcast_to(np.asarray(xexp, np.int64), (B,))

    def rest(idx):
        sub = idx if len(idx) > 1 else np.array([idx[0], 1 - idx[0] if B == 2 else
                                                 (idx[0] + 1) % B])
        cs = build_constraints(X[sub], z[sub], a[sub], valid[sub], x_exp=xexp[sub])
        return _solve(cs, norm=norm, solver=solver, tol=tol, irreducible=irreducible,
                      alpha=a[sub], problem=problem, vector=vector)

    return rest


def _solve(cs, *, norm, solver, tol, irreducible, alpha, problem, vector) -> BatchSolution:
    N = as_norm(norm)
    out = engine.solve(cs, N, solver=solver, tol=tol, irreducible=irreducible)
    return engine.to_batch_solution(cs, out, alpha=alpha, problem=problem, vector=vector,
                                    norm=N, tol=tol)


def att_svm_batch(X, z, alpha, *, norm="fro", mask=None, solver=None, tol=1e-6,
                  irreducible=False) -> BatchSolution:
    """B ATT-SVMs at once: for each b,

        W_b = argmin ||W||  s.t. (x_{b,i,alpha_bi} - x_{b,it})^T W z_{b,i} >= 1.

    X (B, n, T, d) or shared (n, T, d); z (B, n, e) or (n, e); alpha (B, n) integer;
    mask (n, T) or (B, n, T); ``norm`` any norm of :func:`attnsvm.norms.get_norm`.
    Each problem equals :func:`att_svm` on it (same engine and certificate).
    ``irreducible=True`` names an irreducible conflict (one LP per infeasible problem); by
    default conflict_ holds the sequences in the support of the verified Farkas
    certificate (sum mu_k A_k = 0), not necessarily minimal.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import att_svm_batch
        >>> rng = np.random.default_rng(0)
        >>> X = rng.standard_normal((5, 4, 3, 2))      # B = 5 problems of n = 4, T = 3, d = 2
        >>> z = rng.standard_normal((5, 4, 2))
        >>> sol = att_svm_batch(X, z, alpha=np.zeros((5, 4), int))
        >>> len(sol), sol.W_.shape, sol.status_.shape
        (5, (5, 2, 2), (5,))
    """
    tol = as_tol(tol)  # before any work
    X, a, valid = _batch_inputs(X, alpha, mask)
    B, n, T, d = X.shape
    z = as_array(z, "z", (2, 3), "(B, n, e) or (n, e)")
    if z.ndim == 2:
        z = np.broadcast_to(z, (B, *z.shape))
    if z.shape[:2] != (B, n) or z.shape[2] == 0:
        raise ValueError(f"z must have shape ({B}, {n}, e) or ({n}, e); got {z.shape}")
    fast = _fast_batch(norm, solver, B, n, T)
    if fast is not None:  # the row's compiled fast path (solve per problem, numpy certificate)
        kw = dict(tol=tol, irreducible=irreducible, problem="att_svm", vector=False)
        return fast(X, z, a, valid, 0, **kw,
                    rest=_engine_rest(X, z, a, valid, 0, norm=norm, solver=solver, **kw))
    cs = build_constraints(X, z, a, valid)
    return _solve(cs, norm=norm, solver=solver, tol=tol, irreducible=irreducible, alpha=a,
                  problem="att_svm", vector=False)


def prompt_svm_batch(X, W, alpha, *, norm="fro", mask=None, solver=None, tol=1e-6,
                     irreducible=False) -> BatchSolution:
    """B prompt SVMs at once: p_b = argmin ||p|| s.t. (k_{b,i,alpha_bi} - k_{b,it})^T p >= 1,

    k = W^T x.  X (B, n, T, d) or (n, T, d); W (d, d') or (B, d, d') or None (identity);
    alpha (B, n).  ``W_`` of the result is p with shape (B, d').

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import prompt_svm_batch
        >>> X = np.array([[[[2.0, 0.0], [0.0, 1.0]]], [[[0.0, 3.0], [1.0, 0.0]]]])  # B=2, n=1, T=2, d=2
        >>> sol = prompt_svm_batch(X, None, alpha=[[0], [0]])
        >>> list(sol.status_), np.round(sol.norm_, 6)
        (['optimal', 'optimal'], array([0.447214, 0.316228]))
    """
    tol = as_tol(tol)  # before any work
    X, a, valid = _batch_inputs(X, alpha, mask)
    B, n, T, d = X.shape
    K, eK = scaled_keys(X, W, valid)
    fast = _fast_batch(norm, solver, B, n, T)
    if fast is not None:  # the row's compiled fast path (solve per problem, numpy certificate)
        kw = dict(tol=tol, irreducible=irreducible, problem="prompt_svm", vector=True)
        z = np.ones((B, n, 1))
        return fast(K, z, a, valid, eK, **kw,
                    rest=_engine_rest(K, z, a, valid, eK, norm=norm, solver=solver, **kw))
    cs = build_constraints(K, np.ones((B, n, 1)), a, valid,
                                  x_exp=np.broadcast_to(np.asarray(eK), (B,)))
    return _solve(cs, norm=norm, solver=solver, tol=tol, irreducible=irreducible, alpha=a,
                  problem="prompt_svm", vector=True)
