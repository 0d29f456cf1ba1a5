"""The Graph-SVM of next-token prediction, solved and proven (docs/theory.md "Next-token
prediction"; Li, Huang, Ildiz, Rawat, Oymak, AISTATS 2024, the "hard retrieval" part).

    W_svm = argmin ||W||  s.t. for every sample i, label y of i and token j != y of i:
        (e_y - e_j)^T W e_k  = 0    if y, j are in one SCC of the priority graph G_k
        (e_y - e_j)^T W e_k >= 1    otherwise                          (k = k_i = s_iT)

E (K, d) embeddings, seqs (n, T) token ids, y (n,) or (n, L) labels (-1 padding); the
rows are enumerated, merged when repeated, by :func:`attnsvm.ntp.graph.graph_rows`.

Solvers (one matrix constraint each, no Python loop of scalar constraints): the ``graph``
field of the norm's row of :data:`attnsvm.svm.strategy.STRATEGIES`
(:func:`attnsvm.svm.frobenius.graph_candidates`, :func:`attnsvm.svm.nuclear.
graph_candidates`); a norm without one is refused by name.

* ``norm="fro"``: least-distance programming by NNLS (an exact active set) where the dense
  rows fit, else the dual QP  min 1/2 lam^T G lam - sum_{ineq} lam_k,  lam_ineq >= 0
  (G_kl = <A_k, A_l> = (Delta_k . Delta_l)(z_k . z_l), A_k = Delta_k z_k^T, Delta_k = e_y - e_j,
  z_k = e_k), solved by Clarabel, W = sum_k lam_k A_k, then the exact active-set polish
  (:func:`attnsvm.svm.fast.polish_fro`: a KKT solve on the support);
* ``norm="nuc"``: the SDP pair min ||W||_* / max sum_ineq lam s.t. ||S(lam)||_2 <= 1 by
  the project's primal-dual interior-point method (:func:`attnsvm.svm.sdp.nuclear_ipm`,
  its numba kernel :func:`~attnsvm.svm.sdp.nuclear_ipm_small`) with the equalities as
  free-multiplier rows, on the reduced problem W = U C V^T (U, V orthonormal bases of
  span{Delta_r}, span{z_r}: ||W||_* = ||C||_*, C at most min(d, K - 1) x (distinct
  queries)), the answer as it is, else corrected onto its tight rows in the tangent
  space of its rank, else re-solved on its support (:func:`attnsvm.svm.nuclear._nuc_ipm`); cvxpy + Clarabel /
  SCS (vectorised rows) only where none of these is proven.

Proof: THE certificate, :func:`attnsvm.svm.certificate.certify`, with the Graph-SVM's
proof part (:func:`proof_part`: :class:`attnsvm.svm.certificate.ForestProof`), computed
from the returned W and multipliers on the problem's data (E restricted to the tokens that
occur, scaled by a power of two: exact) with a rounding-error bound for every
floating-point step (gamma_n = n u / (1 - n u), u = 2^-53,
Higham, "Accuracy and Stability of Numerical Algorithms", §3):

* margins row by row, m_r = Delta_r^T W z_r (Delta_r = fl(e_y - e_j), |exact - Delta_r| <=
  u |Delta_r|), with the certificate's bound (:func:`attnsvm.svm.certificate.
  margin_enclosure`: 1.01 gamma_{2d+2} |Delta_r|^T |W| |z_r|, on the row's own size);
  where that is coarse (a margin cancelling large terms: near-collinear
  tokens), the margin in twice the working precision (TwoProduct and TwoSum, Ogita, Rump,
  Oishi 2005) with its bound: a proven lower bound of every inequality margin and upper
  bound of every |equality residual|  ->  ``violation_`` (proven upper bound);
* a feasible point near W, proven: the equality rows are reduced EXACTLY to a spanning
  forest of each query's tie graph (every other tie row is a sum of forest rows); a
  proven lower bound sigma of the smallest singular value of the forest rows (from
  their (m, m) Gram matrix, :func:`attnsvm.svm.certificate.forest_sigma`) gives an exact correction delta
  with W + delta on every equality and ||delta||_F <= ||residuals|| / sigma; W + delta
  keeps inequality margins >= margin_lo - ||A_r||_F ||delta||_F, so ``upper`` = (||W|| +
  c ||delta||) / min(1, that margin) bounds the norm of an exactly feasible point.  An
  instance whose equalities cannot be met (a tie of coefficient 2^-41 against margins
  of size 1) gets no such point: never 'optimal';
* weak duality: for lam >= 0 on inequalities (free on equalities) and every W' meeting
  the constraints, sum_ineq lam_r <= <S, W'> <= ||S||_* ||W'||, S = sum_r lam_r A_r =
  Delta^T diag(lam) z; so lb = sum lam / ||S||_* <= the optimal norm, with ||S||_*
  bounded above (computation error of S and of the norm included; spectral / nuclear
  norms through an SVD whose residual and orthogonality defects are bounded as well);
* ``gap_`` = (upper - lb) / lb, an upper bound of the relative suboptimality.

status_ (:func:`attnsvm.svm.certificate.verdict` on the certificate, as for every
problem): "optimal" when the proven violation is <= FEAS_TOL (1e-9), a feasible point is
proven and the proven gap <= GAP_GRAPH (1e-9); "optimal_inaccurate" / "suboptimal" for
larger proven gaps; "infeasible" only with a Farkas certificate verified by
:func:`attnsvm.svm.farkas.farkas_verify` (``conflict_`` then names the samples);
"uncertified" when neither is proven (``extra["reason"]`` says why; a solver's
numerical error is recorded there, never raised).

Resources: rows, SCCs, solves and proofs work on the tokens that occur (no (K, K) or
(K, d^2) array); the solve's memory is estimated first (:func:`memory_need`) and a
problem that cannot fit is refused with it.
"""

from __future__ import annotations

import time

import numpy as np

from .._parallel import thread_pool
from .._validation import check_memory
from ..norms import Norm, get_norm
from .certificate import FEAS_TOL, TINY, ForestProof, certify, proven_gap, two_diff, verdict
from .constraints import ConstraintSet, margin_ratio
from .farkas import farkas_lp, farkas_polish, farkas_verify
from .records import SOLVER_ERRORS
from .result import Solution
from .strategy import STRATEGIES, strategy
from .validate import as_tol

__all__ = ["graph_svm", "graph_svm_batch", "prove", "GAP_GRAPH", "graph_constraints"]

GAP_GRAPH = 1e-9  # proven relative gap of an "optimal" Graph-SVM answer


# ----------------------------------------------------------------- constraints
def graph_constraints(E: np.ndarray, rows) -> ConstraintSet:
    """The unbatched :class:`ConstraintSet` of the rows (layout (N, 1): one row per
    "sequence"): Delta_r = e_y - e_j, z_r = e_k, b_r = 0 on equalities, 1 otherwise.
    The rounding error of each difference is kept (``Delta_lo``, by TwoSum), so the exact
    checks (Farkas certificates) see the exact E_y - E_j: infeasibility that comes from an
    exact linear relation among the tokens' differences is provable only on those."""
    Delta, lo = two_diff(E[rows.y], E[rows.j])
    Z = E[rows.k]
    N = len(rows)
    valid = np.ones((N, 1), bool)
    b = np.where(rows.eq, 0.0, 1.0)[:, None]
    return ConstraintSet(Delta[:, None, :], Z, valid, b, rows.eq[:, None].copy(), 0,
                         Delta_lo=lo[:, None, :])


def graph_norm(norm) -> Norm:
    """The :class:`~attnsvm.norms.Norm` of ``norm`` (the one conversion, at the door), which
    must have a Graph-SVM solver and its proven bounds in its row of
    :data:`attnsvm.svm.strategy.STRATEGIES` (``graph``, ``graph_bounds``); ValueError
    naming the norms that have them otherwise."""
    N = get_norm(norm)
    if strategy(N).graph is None or strategy(N).graph_bounds is None:
        ok = " or ".join(repr(M.name) for M, st in STRATEGIES.items()
                         if st.graph is not None and st.graph_bounds is not None)
        raise ValueError(f"norm must be {ok} for graph_svm; got {norm!r}")
    return N


def _validate(E, seqs, y, norm, tol=1e-6):
    """(NTPData, Norm, tol) validated, before any work (ValueError naming the argument)."""
    from ..ntp.data import NTPData

    N = graph_norm(norm)
    tol = as_tol(tol)
    data = NTPData(E, seqs, y)
    return data, N, tol


def _to_feasible(cs: ConstraintSet, W):
    """W / min inequality margin (minimal margin 1: :func:`attnsvm.svm.constraints.
    margin_ratio`, the engine's rule; no KAPPA here: the Graph-SVM's proof bounds each
    margin's rounding itself)."""
    r = float(margin_ratio(cs, cs.margins(W)))
    return W / r if r > 0 and np.isfinite(r) else W


# ------------------------------------------------------------------------ proof
def proof_part(cs: ConstraintSet, rows, N: Norm) -> ForestProof:
    """The Graph-SVM's proof part of :func:`attnsvm.svm.certificate.certify` for the rows'
    constraint set ``cs`` (:func:`graph_constraints` of the same rows): its tie rows
    (k, y, j) reduced to a spanning forest with sigma proven
    (:class:`~attnsvm.svm.certificate.ForestProof`), the norm's proven bounds (the
    ``graph_bounds`` field of its row of :data:`attnsvm.svm.strategy.STRATEGIES`) and
    GAP_GRAPH for "optimal"."""
    return ForestProof.of(cs, rows.k, rows.y, rows.j, strategy(N).graph_bounds, GAP_GRAPH)


def _proof_dict(c) -> dict:
    """The proven numbers of a one-problem certificate ``c`` of :func:`certify` with the
    Graph-SVM's proof part, by name (``extra["proof"]``): margins (N,) computed,
    margin_lo, violation_hi, norm_hi, norm, eq_shift, feas_margin, upper, lb, gap_hi."""
    return {"margins": c.margins.reshape(-1), "margin_lo": float(c.margin[0]),
            "violation_hi": float(c.violation[0]), "norm": float(c.norm[0]),
            **{k: float(v[0]) for k, v in c.proven.items()},
            "lb": float(c.lower[0]), "gap_hi": float(c.gap[0])}


def prove(E: np.ndarray, rows, W: np.ndarray, lam: np.ndarray | None, norm) -> dict:
    """Proven numbers of an answer W (d, d) with multipliers lam (N,) (None: primal only)
    on the Graph-SVM rows ``rows`` of embeddings E: the one certificate
    (:func:`attnsvm.svm.certificate.certify` with :func:`proof_part`), by name
    (:func:`_proof_dict`; the bounds: the module docstring and
    :class:`~attnsvm.svm.certificate.ForestProof`).  gap_hi is inf when lb = 0 but a
    margin is needed, or when no feasible point is proven; 0 for W = 0 with nothing
    needed."""
    N = graph_norm(norm)
    cs = graph_constraints(np.asarray(E, float), rows)
    csb = cs.batched()
    c = certify(csb, np.asarray(W, float)[None], None if lam is None else
                np.asarray(lam, float)[None, :, None], N, proof=proof_part(csb, rows, N))
    return _proof_dict(c)


def _farkas(cs: ConstraintSet):
    """A verified Farkas certificate of the rows, or None."""
    csb = cs.batched()
    lam = farkas_lp(csb.take(0))
    if lam is None:
        return None
    ok, bound, lv = farkas_verify(csb, farkas_polish(csb, lam[None]))
    if not ok[0]:
        return None
    return lv[0][:, 0], float(bound[0])


def _pow2_scale(E: np.ndarray, ref: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """E * 2^-e with max |ref| in [1/2, 1) (``ref`` default E; exact unless an entry falls
    below float64's normal range), and e."""
    R = E if ref is None else ref
    mx = max(abs(float(R.max())), abs(float(R.min()))) if R.size else 0.0  # (no |R| copy)
    if mx == 0 or not np.isfinite(mx):
        return E, 0
    e = int(np.frexp(mx)[1])
    return np.ldexp(E, -e), e


class _LocalRows:
    """A row set read on the tokens that occur: k, y, j local ids (rows of E[rows.tokens])."""

    def __init__(self, rows):
        self.k, self.y, self.j = rows.local(rows.k), rows.local(rows.y), rows.local(rows.j)
        self.eq = rows.eq

    def __len__(self) -> int:
        return len(self.k)


def memory_need(n_rows: int, n_eq: int, d: int, norm) -> tuple[float, str]:
    """(bytes, what) a graph_svm solve of ``n_rows`` distinct rows (``n_eq`` equalities)
    in dimension d needs at least: the solver's largest arrays (the ``graph_memory`` field
    of the norm's row of :data:`attnsvm.svm.strategy.STRATEGIES`: Frobenius
    :func:`attnsvm.svm.frobenius.graph_memory`, nuclear :func:`attnsvm.svm.nuclear.
    graph_memory`) plus the proof's (rows, d) arrays and the equalities' (m, m) Gram
    matrix and eigendecomposition."""
    proof = 8.0 * (8 * float(n_rows) * float(d) + 4 * float(n_eq) ** 2)
    mem = strategy(graph_norm(norm)).graph_memory
    if mem is None:  # (a row that states no solver memory: the proof's alone)
        return proof, "the proof's (rows, d) arrays"
    solve, what = mem(n_rows, d)
    return proof + solve, what


def _out_scale(x: float, s: int, upper: bool) -> float:
    """x * 2^s for a proven bound x (an upper bound stays one, a lower bound too, where
    the result leaves the normal range)."""
    with np.errstate(over="ignore", under="ignore"):
        v = float(np.ldexp(x, s))
    if 0 < abs(v) < TINY or (np.isfinite(x) and not np.isfinite(v)):
        v = float(np.nextafter(v, np.inf if upper else 0.0))
    return v


def _uncertified(base, extra, names, t0, reason: str) -> Solution:
    extra["reason"] = reason
    return Solution(W_=None, norm_=np.inf, margin_=np.nan, violation_=np.nan,
                    kkt_residual_=np.nan, gap_=np.nan, dual_=None, support_=None,
                    margins_=None, status_="uncertified", solver_="+".join(names) or "none",
                    feasible_=False, time_=time.perf_counter() - t0, extra=extra, **base)


def graph_svm(E, seqs, y, norm="fro", *, exclude=None, tol: float = 1e-6) -> Solution:
    """The Graph-SVM of a next-token-prediction dataset, certified (docs/theory.md §10):

        W_svm = argmin ||W||  s.t. for every sample i, label y of i and token j != y of i:
            (e_y - e_j)^T W e_k  = 0    if y, j are in one SCC of the priority graph G_k
            (e_y - e_j)^T W e_k >= 1    otherwise                          (k = k_i = s_iT)

    with e_k = E[k] and G_k the token-priority graph of the samples whose query is k
    (:func:`attnsvm.ntp.graph_rows` enumerates the rows).  The solvers and the proof of
    ``violation_`` and ``gap_``: the docstring of :mod:`attnsvm.svm.graph` (on the API
    page: "The Graph-SVM: its solvers and its proof").

    Parameters
    ----------
    E : (K, d) token embeddings.  seqs : (n, T) token ids (query = last token).
    y : (n,) next-token ids, or (n, L) sets of acceptable next tokens (-1 padding; the
        local-convergence setting).
    norm : "fro" (trained W) or "nuc" (trained (K, Q)).
    exclude : optional (n, T) bool (or 0/1), positions left out of the constraints (the
        paper's local setting drops tokens of small but non-negligible probability).
    tol : activity tolerance of ``support_`` (a finite number > 0).

    Works on the tokens that occur (E's other rows are never read past validation); a
    problem whose solve cannot fit in memory is refused up front (ValueError naming the
    memory it needs, :func:`memory_need`).  Solved and proven on E scaled by a power of
    two (max |E| in [1/2, 1): exact), the answer scaled back; an answer that float64
    cannot hold at the caller's scale (entries beyond its range) is 'uncertified' with
    the reason, the scaled answer in ``extra``.

    Returns
    -------
    :class:`~attnsvm.svm.Solution` with problem "graph_svm".  The constraint layout is one
    row per distinct constraint r (``extra["rows"]``: k, y, j, eq, samples, scc):
    ``margins_``, ``dual_``, ``support_`` are (N, 1).  ``margin_`` is the proven lower
    bound of the inequality margins, ``violation_`` and ``gap_`` proven upper bounds;
    ``extra["proof"]`` holds every proven number.  Without inequality rows (every
    preference is a tie) the answer is W = 0.  ``conflict_`` (infeasible): the samples
    whose rows carry the verified Farkas certificate.  ``extra["reason"]``: why an
    answer is 'uncertified'.

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import graph_svm
        >>> E = np.eye(3)                              # K = 3 tokens in d = 3
        >>> seqs = np.array([[0, 1, 2], [1, 0, 2]])    # query token 2 (the last) in both
        >>> sol = graph_svm(E, seqs, y=[0, 1])         # 0 and 1 each beat the other: one SCC, a tie
        >>> sol.status_, sol.extra["rows"].eq.tolist()
        ('optimal', [True, False, True, False])
        >>> sol2 = graph_svm(E, seqs[:1], y=[0])       # 0 alone must beat 1 and 2
        >>> sol2.status_, round(sol2.norm_, 6)
        ('optimal', 0.816497)
    """
    from ..ntp.graph import _as_exclude, _graph_rows

    data, N, tol = _validate(E, seqs, y, norm, tol)
    ex = None if exclude is None else _as_exclude(exclude, data.n, data.T)
    st = strategy(N)
    st.graph_warm()  # an empty numba cache is compiled before the timer starts
    t0 = time.perf_counter()
    rows = _graph_rows(data.seqs, data.labels, ex, data.K)  # (validated by NTPData)
    d = data.d
    need, what = memory_need(len(rows), int(rows.eq.sum()), d, N)
    if need > 2 ** 26:  # (below 64 MiB: no question of fitting, and no system call)
        check_memory(need, f"graph_svm ({N.name}) on {len(rows):,} distinct rows in dimension "
                     f"{d} ({what})", "use fewer samples or tokens")
    L = _LocalRows(rows)
    Eu = data.E[rows.tokens]
    Es, e = _pow2_scale(Eu, data.E)
    p = e if np.array_equal(np.ldexp(Es, e), Eu) else 0  # the scale of the proof
    Ep = Es if p == e else Eu
    sh = 2 * p - 2 * e  # W on Ep = W on Es * 2^sh
    cs = graph_constraints(Es, L)
    base = dict(norm=N.name, problem="graph_svm", tol_active=tol)
    extra = {"rows": rows, "scc": rows.scc_local, "tokens": rows.tokens,
             "n_constraints": len(rows), "n_equalities": int(rows.eq.sum())}
    ineq = ~rows.eq
    # the proof's constraint set: on Ep (= Es where the scaling is exact) and its part
    csp = (cs if Ep is Es else graph_constraints(Ep, L)).batched()
    part = proof_part(csp, L, N)

    def cert(W, lam):  # THE certificate, with the Graph-SVM's proof part
        return certify(csp, W[None], None if lam is None else lam[None, :, None], N, tol,
                       proof=part)

    if not ineq.any():  # nothing to separate: W = 0 meets every equality
        W = np.zeros((d, d))
        c = cert(W, np.zeros(len(rows)))
        extra["proof"] = _proof_dict(c)
        return Solution(W_=W, norm_=0.0, margin_=np.inf, violation_=float(c.violation[0]),
                        kkt_residual_=0.0, gap_=0.0, dual_=np.zeros((len(rows), 1)),
                        support_=np.ones((len(rows), 1), bool), margins_=c.margins[0],
                        status_=str(verdict(c.feasible, c.gap, False, part.gap_optimal)[0]), solver_="trivial", feasible_=True,
                        time_=time.perf_counter() - t0, extra=extra, **base)
    zero = (np.abs(cs.Delta[:, 0]).max(1) == 0) | (np.abs(cs.Z).max(1) == 0)
    # the best primal (certificate, W at the proof's scale, name, rank);
    # the best multipliers (lb, lam at the proof's scale, name, their certificate)
    best_p = best_lam = None
    names = []
    fk = None
    errors = []
    nan_W = np.full((d, d), np.nan)
    if not (zero & ineq).any():
        with np.errstate(all="ignore"):  # numpy's error state is per thread (a context variable)
            for W, lam, name in _guarded(st.graph, cs, errors):
                names.append(name)
                if W is None and best_p is None and fk is None:  # the solver saw no answer
                    fk = _farkas_guarded(cs, errors)
                    if fk is not None:
                        break
                Wp = lam_p = None
                if W is not None and np.all(np.isfinite(W)):
                    Wp = np.ldexp(_to_feasible(cs, W), sh)  # exact: margins are bilinear in E
                if lam is not None and np.all(np.isfinite(lam)):
                    lam_p = np.ldexp(np.where(ineq, np.maximum(lam, 0.0), lam), sh)
                if Wp is None and lam_p is None:
                    continue
                c = cert(nan_W if Wp is None else Wp, lam_p)
                # primal answers ranked: proven feasible first, then the smaller proven
                # norm of a feasible point near W
                key = (not c.feasible[0], c.proven["upper"][0])
                if Wp is not None and (best_p is None or key < best_p[3]):
                    best_p = (c, Wp, name, key)
                if lam_p is not None and (best_lam is None or c.lower[0] > best_lam[0]):
                    best_lam = (float(c.lower[0]), lam_p, name, c)
                if best_p is not None and best_lam is not None:
                    c0 = best_p[0]
                    g = proven_gap(c0.proven["upper"][0], c0.proven["norm_hi"][0], best_lam[0],
                                   True)
                    if str(verdict(c0.feasible, g, False, part.gap_optimal)[0]) == "optimal":
                        break
    if errors:
        extra["errors"] = errors
    if best_p is not None:
        c, Wp, name, _ = best_p
        lname = "none"
        if best_lam is not None:
            lname = best_lam[2]
            if best_lam[3] is not c:  # the best W and the best multipliers: certified together
                c = cert(Wp, best_lam[1])
        status = str(verdict(c.feasible, c.gap, False, part.gap_optimal)[0])
        extra["tried"] = names
        if status != "uncertified":
            return _assemble(c, Wp, name, lname, status, p, L, tol, base, extra, t0)
        extra["proof"] = _proof_dict(c)
    fk = _farkas_guarded(cs, errors) if fk is None else fk
    if fk is not None:
        name = "+".join(names) or "none"
        lam_f, bound = fk
        hit = np.abs(lam_f) > 1e-9 * np.abs(lam_f).max()
        conflict = tuple(int(s) for s in rows.samples_of(np.nonzero(hit)[0]))
        extra.update(farkas_multipliers=lam_f, farkas_bound=bound)
        return Solution(W_=None, norm_=np.inf, margin_=np.nan, violation_=np.nan,
                        kkt_residual_=np.nan, gap_=np.nan, dual_=None, support_=None,
                        margins_=None, status_="infeasible", solver_=name + "+farkas-lp",
                        feasible_=False, conflict_=conflict, time_=time.perf_counter() - t0,
                        extra=extra, **base)
    if best_p is None:
        reason = ("no solver returned an answer" + (f" ({'; '.join(errors)})" if errors else "")
                  + ", and no Farkas certificate of infeasibility was verified")
    elif not best_p[0].violation[0] <= FEAS_TOL:
        reason = (f"the best answer's proven violation {best_p[0].violation[0]:.3g} exceeds "
                  f"{FEAS_TOL:g}")
    else:
        reason = ("no exactly feasible point is proven near the best answer (its equality "
                  "residuals, on the scale of the equality rows' smallest singular value "
                  f"{part.sigma:.3g}, move it off the inequalities)")
    return _uncertified(base, extra, names, t0, reason)


def _assemble(c, Wp, name, lname, st, p, L, tol, base, extra, t0):
    """The Solution of a proven answer Wp (certificate ``c``) on Ep = E 2^-p, scaled back to
    the caller's E (W = Wp 2^-2p: exact unless float64 cannot hold it, then
    'uncertified')."""
    pr = _proof_dict(c)
    nrm = pr["norm"]
    lam_p, kkt = c.lam.reshape(-1), float(c.kkt[0])
    support = c.support.reshape(-1)
    with np.errstate(over="ignore", under="ignore"):
        W = np.ldexp(Wp, -2 * p)
        exact = bool(np.all(np.isfinite(W)) and np.array_equal(np.ldexp(W, 2 * p), Wp))
        norm_out = float(np.ldexp(nrm, -2 * p))
    if p:
        for k_, up in (("norm_hi", True), ("upper", True), ("eq_shift", True), ("lb", False)):
            pr[k_] = _out_scale(pr[k_], -2 * p, up)
        pr["norm"] = norm_out
    extra["proof"] = pr
    if not (exact and np.isfinite(norm_out) and norm_out > 0):
        extra.update(W_scaled=Wp, scale_log2=-2 * p)
        return _uncertified(base, extra, [name], t0, (
            f"the proven answer (norm {nrm:.6g} x 2^{-2 * p}) is beyond float64's range at the "
            "caller's scale of E: W_scaled (for E scaled by 2^-p) holds it, W = W_scaled "
            "* 2^scale_log2"))
    with np.errstate(over="ignore", under="ignore"):
        dual = np.ldexp(lam_p, -4 * p)
    if not np.all(np.isfinite(dual)) or (p and not np.array_equal(np.ldexp(dual, 4 * p), lam_p)):
        tot = float(lam_p[~L.eq].sum())
        dual = lam_p / tot if tot > 0 else lam_p
        extra["dual_normalisation"] = "sum over inequality rows 1 (||W||^2 is beyond float64)"
    return Solution(
        W_=W, norm_=norm_out, margin_=pr["margin_lo"],
        violation_=pr["violation_hi"], kkt_residual_=kkt,
        gap_=pr["gap_hi"], dual_=dual[:, None], support_=support[:, None],
        margins_=pr["margins"][:, None], status_=st,
        solver_=name if lname == name else f"{name} (multipliers: {lname})",
        feasible_=True, time_=time.perf_counter() - t0, extra=extra, **base)


def _guarded(solver, cs, errors: list):
    """The candidates of ``solver(cs)`` until it ends or raises a numerical error (recorded
    in ``errors``: the caller's verdict is then 'uncertified' with the reason unless
    another candidate is proven; never a raw exception)."""
    try:
        yield from solver(cs)
    except SOLVER_ERRORS as exc:
        where = f"{solver.__module__.rsplit('.', 1)[-1]}.{solver.__name__}"
        errors.append(f"{where}: {type(exc).__name__}: {exc}")


def _farkas_guarded(cs, errors: list):
    try:
        return _farkas(cs)
    except SOLVER_ERRORS as exc:
        errors.append(f"farkas: {type(exc).__name__}: {exc}")
        return None


def graph_svm_batch(problems, norm="fro", **kw) -> list[Solution]:
    """Graph-SVMs of many datasets: ``problems`` a list of (E, seqs, y) tuples or
    :class:`~attnsvm.ntp.NTPData`; returns the list of Solutions (each as
    :func:`graph_svm`, ``kw`` its keyword arguments ``exclude`` and ``tol``).  Inputs are
    all validated before any solve starts (ValueError naming the problem and argument).
    The problems are solved on attnsvm's worker threads (:func:`attnsvm._parallel.
    thread_pool`, :func:`~attnsvm._parallel.n_threads` of them: ``kernel_threads(1)``
    keeps them on the caller's thread); each answer is the one :func:`graph_svm` gives
    alone (measured on a shared 2-core machine under load 4-7, 16 problems n10T6K8d8,
    2 threads vs one, wall time, min of 5 interleaved: nuclear 1.11-1.65x, Frobenius
    1.12-1.15x faster).

    Example::

        >>> from attnsvm.ntp import ntp_random
        >>> from attnsvm.svm import graph_svm_batch
        >>> sols = graph_svm_batch([ntp_random(4, 6, 8, 8, seed=s) for s in range(3)])
        >>> [s.status_ for s in sols]
        ['optimal', 'optimal', 'optimal']
    """
    from ..ntp.data import NTPData
    from ..ntp.graph import _check_ids

    if isinstance(problems, (NTPData, np.ndarray, str)) or not isinstance(problems, (list, tuple)):
        raise ValueError("problems must be a list of NTPData or (E, seqs, y) tuples; got "
                         f"a {type(problems).__name__}" + (
                             " (pass [data], or call graph_svm)" if isinstance(problems, NTPData)
                             else ""))
    unknown = sorted(set(kw) - {"exclude", "tol"})
    if unknown:
        raise ValueError(f"graph_svm_batch: unknown keyword argument(s) {unknown}; "
                         "graph_svm takes exclude and tol")
    items = []
    for b, p in enumerate(problems):
        if isinstance(p, NTPData):
            items.append(p)
            continue
        if not isinstance(p, (tuple, list)) or len(p) != 3:
            raise ValueError(f"problems[{b}] must be an NTPData or an (E, seqs, y) tuple")
        try:
            items.append(NTPData(*p))
        except ValueError as exc:
            raise ValueError(f"problems[{b}]: {exc}") from None
    N = graph_norm(norm)
    if "tol" in kw:
        as_tol(kw["tol"])
    if kw.get("exclude") is not None:
        for b, p in enumerate(items):
            try:
                _check_ids(p.seqs, p.y, p.K, kw["exclude"])
            except ValueError as exc:
                raise ValueError(f"problems[{b}]: {exc}") from None
    out: list = [None] * len(items)

    def run(b0: int, b1: int) -> None:  # each slice writes its own entries
        for b in range(b0, b1):
            out[b] = graph_svm(items[b].E, items[b].seqs, items[b].y, N, **kw)

    thread_pool(run, len(items), per_thread=4)
    return out
