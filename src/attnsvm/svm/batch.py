"""Batched Frobenius / prompt SVMs: many small problems solved at once.

Each problem b is min 1/2||W||_F^2 s.t. (x_{b,i,alpha_bi} - x_{b,it})^T W z_{b,i} >= 1.
All B problems go through one vectorised interior-point method on the equivalent
minimum-norm-point problem (see :func:`attnsvm.svm.fast.batched_mnp`), an exact batched
active-set polish, and a certificate computed on all constraints.  Problems that do
not certify are re-solved one by one with the exact single-problem path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .fast import batched_mnp
from .problems import INFEASIBLE_RHO, _arr, _solve, farkas_conflict
from .solution import ConstraintSet, Solution, single_thread

__all__ = ["BatchSolution", "att_svm_batch", "prompt_svm_batch"]


@dataclass(repr=False)
class BatchSolution:
    """Solutions of B problems (leading dimension B on every array).

    W_ (B, d, e) or (B, d) for prompt problems (NaN where infeasible); norm_, margin_,
    violation_, kkt_residual_, gap_ (B,); dual_, support_, margins_ (B, n, T);
    feasible_ (B,) bool; status_ (B,) str; conflict_ list of B tuples; solver_ (B,) str.
    ``sol[b]`` gives the :class:`Solution` of problem b; ``len(sol)`` = B.
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
    problem: str = "att_svm"
    time_: float = 0.0
    tol_active: float = 1e-6
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.feasible_)

    @property
    def neighbours_(self) -> np.ndarray:
        return self.support_

    def __getitem__(self, b: int) -> Solution:
        feas = bool(self.feasible_[b])
        return Solution(
            W_=self.W_[b] if feas else None, norm_=float(self.norm_[b]),
            margin_=float(self.margin_[b]), violation_=float(self.violation_[b]),
            kkt_residual_=float(self.kkt_residual_[b]), gap_=float(self.gap_[b]),
            dual_=self.dual_[b] if feas else None, support_=self.support_[b] if feas else None,
            margins_=self.margins_[b] if feas else None, status_=str(self.status_[b]),
            solver_=str(self.solver_[b]), feasible_=feas, conflict_=tuple(self.conflict_[b]),
            alpha_=self.alpha_[b], norm="fro", problem=self.problem, tol_active=self.tol_active,
            extra={"n_constraints": int(self.extra["n_constraints"][b])},
        )

    def __repr__(self) -> str:
        B = len(self)
        nf = int(self.feasible_.sum())
        f = self.feasible_
        mv = float(np.nanmax(self.violation_[f])) if nf else float("nan")
        mg = float(np.nanmax(self.gap_[f])) if nf else float("nan")
        return (f"BatchSolution({self.problem}, B={B}, feasible={nf}/{B}, max violation={mv:.1e}, "
                f"max gap={mg:.1e}, time={self.time_:.3g}s)")

    def summary(self) -> str:
        return repr(self)


def _batch_constraints(X, Z, alpha, valid):
    B, n, T, d = X.shape
    bi = np.arange(B)[:, None]
    ni = np.arange(n)[None, :]
    sel = X[bi, ni, alpha]  # (B, n, d)
    v = valid.copy()
    v[bi, ni, alpha] = False
    Delta = np.where(v[..., None], sel[:, :, None, :] - X, 0.0)
    return Delta, v


@single_thread
def _solve_batch(Delta, Z, v, alpha, *, problem, vector, tol, irreducible, chunk=1024):
    t0 = time.perf_counter()
    B, n, T, d = Delta.shape
    e = Z.shape[-1]
    N = n * T
    W = np.zeros((B, d, e))
    lam = np.zeros((B, n, T))
    feas = np.ones(B, bool)
    certified = np.ones(B, bool)
    conflict: list = [() for _ in range(B)]
    solver = np.array(["batch-mnp-ipm"] * B, dtype=object)
    for s in range(0, B, chunk):
        sl = slice(s, min(B, s + chunk))
        D = Delta[sl].reshape(-1, N, d)
        Zr = np.repeat(Z[sl], T, axis=1)  # (b, N, e)
        vf = v[sl].reshape(-1, N)
        G = np.matmul(D, D.transpose(0, 2, 1)) * np.matmul(Zr, Zr.transpose(0, 2, 1))
        has = vf.any(1)
        mu, rho2, conv, _ = batched_mnp(G, vf)
        scale = np.sqrt(np.diagonal(G, axis1=1, axis2=2).max(1))
        rho = np.sqrt(np.maximum(rho2, 0.0))
        infeas = has & (rho <= INFEASIBLE_RHO * np.maximum(scale, 1e-300))
        # W = sum mu_k A_k / rho^2 ; polish on the support: G_SS lam_S = 1
        S = vf & (mu > 1e-6 * mu.max(1, keepdims=True)) & ~infeas[:, None]
        idx = np.arange(N)

        def comb(lm, D=D, Zr=Zr):
            return (D * lm[..., None]).transpose(0, 2, 1) @ Zr

        def marg(Wb, D=D, Zr=Zr):
            return (np.matmul(D, Wb) * Zr).sum(-1)

        lp = np.zeros_like(mu)
        mp = np.zeros_like(mu)
        act = np.nonzero(S.any(1))[0]
        for _ in range(6):  # batched primal-dual active-set polish on G_SS lam_S = 1
            if len(act) == 0:
                break
            Sa = S[act]
            Sf = Sa.astype(float)
            Gs = G[act] * Sf[:, :, None] * Sf[:, None, :]
            Gs[:, idx, idx] += 1.0 - Sf
            ev, U = np.linalg.eigh(Gs)
            keep = ev > 1e-12 * np.maximum(ev.max(1, keepdims=True), 1e-300)
            inv = np.where(keep, 1.0 / np.where(keep, ev, 1.0), 0.0)
            la = (U @ (inv * (U.transpose(0, 2, 1) @ Sf[..., None])[..., 0])[..., None])[..., 0] * Sf
            Wa = (D[act] * la[..., None]).transpose(0, 2, 1) @ Zr[act]
            ma = (np.matmul(D[act], Wa) * Zr[act]).sum(-1)
            lp[act], mp[act] = la, ma
            neg = Sa & (la < -1e-10 * np.maximum(np.abs(la).max(1, keepdims=True), 1.0))
            viol = vf[act] & ~Sa & (ma < 1 - 1e-10)
            S[act] = (Sa & ~neg) | viol
            act = act[(neg | viol).any(1)]
        Wp = comb(lp)
        lam_ipm = np.where(rho2[:, None] > 0, mu / np.maximum(rho2[:, None], 1e-300), 0.0)

        ok_p = (
            (lp >= -1e-9 * np.maximum(np.abs(lp).max(1, keepdims=True), 1.0)).all(1)
            & np.where(vf, mp >= 1 - 1e-10, True).all(1)
            & np.where(S, np.abs(mp - 1) <= 1e-9, True).all(1)
            & ~infeas & has
        )
        Wi = comb(lam_ipm)
        lam_b = np.where(ok_p[:, None], np.maximum(lp, 0.0), lam_ipm)
        W_b = np.where(ok_p[:, None, None], Wp, Wi)
        W[sl] = W_b
        lam[sl] = lam_b.reshape(-1, n, T)
        feas[sl] = ~infeas
        certified[sl] = (ok_p | conv | ~has) | infeas
        solver[sl] = np.where(ok_p, "batch-mnp-ipm+polish", "batch-mnp-ipm")
        for j in np.nonzero(infeas)[0]:
            b = s + j
            supp = np.nonzero(mu[j] > 1e-6 * mu[j].max())[0]
            conflict[b] = tuple(sorted({int(k) // T for k in supp}))
            if irreducible:
                cs = ConstraintSet(Delta[b], Z[b], v[b], np.where(v[b], 1.0, 0.0))
                c = farkas_conflict(cs)
                if c:
                    conflict[b] = c
    # certificates on all constraints, vectorised
    m = (np.matmul(Delta, W[:, None]) * Z[:, :, None, :]).sum(-1)
    m = np.where(v, m, 0.0)
    has = v.any((1, 2))
    margin = np.where(has, np.where(v, m, np.inf).min((1, 2)), np.inf)
    ratio = np.where((margin > 0) & (margin < 1) & has, margin, 1.0)
    W = W / ratio[:, None, None]  # exactly feasible
    m = m / ratio[:, None, None]
    lam = lam / ratio[:, None, None] ** 2
    margin = margin / ratio
    viol = np.where(has, np.maximum(1 - np.where(v, m, np.inf), 0).max((1, 2)), 0.0)
    nrm = np.linalg.norm(W, axis=(1, 2))
    Sm = np.einsum("bit,bitd->bid", lam, Delta).transpose(0, 2, 1) @ Z
    nS = np.linalg.norm(Sm, axis=(1, 2))
    safe = np.maximum(nrm, 1e-300)
    # infeasible or degenerate problems (no certificate) may overflow here: their entries are
    # masked by ``has`` / ``feas`` and re-solved exactly below
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        stat = np.linalg.norm(W - Sm, axis=(1, 2)) / safe
        comp = np.abs(lam * np.where(v, m - 1, 0)).max((1, 2)) / safe**2
        lb = lam.sum((1, 2)) / np.maximum(nS, 1e-300)
        gap = np.where(has, np.maximum(nrm - lb, 0) / np.maximum(lb, 1e-300), 0.0)
    kkt = np.where(has, np.maximum(stat, comp), 0.0)
    support = v & (m <= 1 + tol)
    status = np.where(feas, "optimal", "infeasible").astype(object)
    # fall back to the exact single-problem path for the (rare) uncertified problems
    bad = np.nonzero((~certified) | (feas & ~((gap < 1e-6) & (viol <= 1e-9))))[0]
    for b in bad:
        cs = ConstraintSet(Delta[b], Z[b], v[b], np.where(v[b], 1.0, 0.0))
        sol = _solve(cs, norm="fro", solver="clarabel", tol=tol, alpha=alpha[b],
                     problem=problem, vector=False, irreducible=irreducible)
        feas[b] = sol.feasible_
        status[b] = sol.status_
        solver[b] = sol.solver_ + " (fallback)"
        conflict[b] = sol.conflict_
        if sol.feasible_:
            W[b], lam[b], m[b] = sol.W_, sol.dual_, sol.margins_
            nrm[b], margin[b], viol[b] = sol.norm_, sol.margin_, sol.violation_
            kkt[b], gap[b], support[b] = sol.kkt_residual_, sol.gap_, sol.support_
    inf_ = ~feas
    W[inf_] = np.nan
    nrm[inf_] = np.inf
    for arr in (margin, viol, kkt, gap):
        arr[inf_] = np.nan
    lam[inf_] = 0.0
    support[inf_] = False
    m[inf_] = np.nan
    Wout = W[..., 0] if vector else W
    return BatchSolution(
        W_=Wout, norm_=nrm, margin_=margin, violation_=viol, kkt_residual_=kkt, gap_=gap,
        dual_=lam, support_=support, margins_=m, feasible_=feas, status_=status,
        solver_=solver, conflict_=conflict, alpha_=alpha, problem=problem,
        time_=time.perf_counter() - t0, tol_active=tol,
        extra={"n_constraints": v.sum((1, 2)), "n_fallback": len(bad)},
    )


def _batch_inputs(X, alpha, mask, B=None):
    X = _arr(X, "X", (3, 4), "(B, n, T, d) or (n, T, d)")
    a = np.asarray(alpha)
    if a.ndim != 2:
        raise ValueError(f"alpha must have shape (B, n); got {a.shape}")
    if B is None:
        B = a.shape[0]
    if X.ndim == 3:
        X = np.broadcast_to(X, (B, *X.shape))
    if X.shape[0] != B:
        raise ValueError(f"X must have leading dimension B={B}; got {X.shape}")
    _, n, T, d = X.shape
    if a.shape != (B, n):
        raise ValueError(f"alpha must have shape ({B}, {n}); got {a.shape}")
    if np.any(a < 0) or np.any(a >= T):
        raise ValueError(f"alpha out of range: token indices must lie in [0, {T - 1}]")
    a = a.astype(int)
    if mask is None:
        valid = np.ones((B, n, T), bool)
    else:
        valid = np.broadcast_to(np.asarray(mask, bool), (B, n, T)).copy()
    bi, ni = np.arange(B)[:, None], np.arange(n)[None, :]
    if not valid[bi, ni, a].all():
        bad = sorted({int(b) for b in np.nonzero(~valid[bi, ni, a])[0]})
        raise ValueError(f"alpha selects masked tokens in problems {bad[:10]}")
    return X, a, valid


def att_svm_batch(X, z, alpha, *, mask=None, tol=1e-6, irreducible=False) -> BatchSolution:
    """B Frobenius ATT-SVMs at once: for each b,

        W_b = argmin ||W||_F  s.t. (x_{b,i,alpha_bi} - x_{b,it})^T W z_{b,i} >= 1.

    X (B, n, T, d) or shared (n, T, d); z (B, n, e) or (n, e); alpha (B, n);
    mask (n, T) or (B, n, T).  ``irreducible=True`` computes an irreducible conflict
    (one LP per infeasible problem); by default conflict_ holds the sequences in the
    support of the Farkas certificate mu (sum mu_k A_k = 0), not necessarily minimal.
    """
    a0 = np.asarray(alpha)
    X, a, valid = _batch_inputs(X, alpha, mask, a0.shape[0] if a0.ndim == 2 else None)
    B, n, T, d = X.shape
    z = _arr(z, "z", (2, 3), "(B, n, e) or (n, e)")
    if z.ndim == 2:
        z = np.broadcast_to(z, (B, *z.shape))
    if z.shape[:2] != (B, n):
        raise ValueError(f"z must have shape ({B}, {n}, e); got {z.shape}")
    Delta, v = _batch_constraints(X, z, a, valid)
    return _solve_batch(Delta, np.ascontiguousarray(z), v, a, problem="att_svm", vector=False,
                        tol=tol, irreducible=irreducible)


def prompt_svm_batch(X, W, alpha, *, mask=None, tol=1e-6, irreducible=False) -> BatchSolution:
    """B prompt SVMs at once: p_b = argmin ||p|| s.t. (k_{b,i,alpha_bi} - k_{b,it})^T p >= 1,

    k = W^T x.  X (B, n, T, d) or (n, T, d); W (d, d') or (B, d, d') or None (identity);
    alpha (B, n).  ``W_`` of the result is p with shape (B, d').
    """
    a0 = np.asarray(alpha)
    X, a, valid = _batch_inputs(X, alpha, mask, a0.shape[0] if a0.ndim == 2 else None)
    B, n, T, d = X.shape
    if W is None:
        K = X
    else:
        Wk = _arr(W, "W", (2, 3), "(d, d') or (B, d, d')")
        if Wk.shape[-2] != d:
            raise ValueError(f"W must have shape ({d}, d'); got {Wk.shape}")
        K = X @ (Wk if Wk.ndim == 2 else Wk[:, None])
    Delta, v = _batch_constraints(K, None, a, valid)
    return _solve_batch(Delta, np.ones((B, n, 1)), v, a, problem="prompt_svm", vector=True,
                        tol=tol, irreducible=irreducible)
