"""``attnsvm solve DATA.npz``: solve a max-margin problem and print (and save) its certificate.

The problem follows the data and ``--query`` as ``attnsvm train`` does:

    cross          att_svm(X, z, alpha)                  queries z_i from the file
    first / last   att_svm(X, X[:, q], alpha)            self-attention, z_i = x_{i,q}
    seq2seq        seq2seq_svm(X, alpha)                 every token a query, alpha (n, T)
    causal         seq2seq_svm(X, alpha, causal=True)    keys t <= k only
    prompt         prompt_svm(X, None, alpha)            --problem prompt, or no z and no --query

The selected tokens are alpha = opt (argmax of the scores gamma = y v^T x over the
admissible keys) unless ``--alpha`` names them.
"""

from __future__ import annotations

import argparse
import re

from attnsvm.cli._args import NPZ_FORMAT, check_out_file, positive_int, write_atomic

HELP = "solve the attention SVM for a TokenData .npz, print its certificate, save W_mm"

SEQ2SEQ = ("seq2seq", "causal")

#: --solver values by norm: attnsvm's own solvers, then the cvxpy solvers it configures.
#: (The rows of attnsvm.svm.strategy.STRATEGIES without "auto", written out here so that
#: building the CLI does not import the solvers; tests/test_cli.py holds them equal.)
NATIVE_SOLVERS = {"fro": ("fast", "active", "ipm", "mnp"),
                  "nuc": ("fast", "barrier", "working_set")}
CVXPY_SOLVERS = ("clarabel", "scs")

EPILOG = NPZ_FORMAT + """

What solve reads: X; y and v for --alpha opt (otherwise give --alpha); z for --query
cross; mask if present. One dataset (not batched). y of shape (n, T) needs --query
seq2seq or causal.

Problems (docs/theory.md, section 5), chosen by --problem and --query:
  --query cross         min ||W|| s.t. (x_{i,alpha_i} - x_it)^T W z_i >= 1 (att_svm)
  --query first|last    the same with z_i = x_{i,first} / the last valid token
  --query seq2seq       (x_{i,alpha_ik} - x_it)^T W x_ik >= 1 for every query k (seq2seq_svm)
  --query causal        the same over keys t <= k only
  --problem prompt      min ||p||_2 s.t. (x_{i,alpha_i} - x_it)^T p >= 1 (prompt_svm)
Without --query: cross if the file has z, else the prompt problem.

--alpha: opt (default: argmax_t gamma_it, gamma = y v^T x, over the admissible keys), or
the selected token indices: one per sequence (0,2,1), or for seq2seq / causal one row of
T per sequence, rows separated by ';' (0,0,1;1,1,2).

--out FILE.npz holds:
  W_mm            the solution: (d, d) matrix, or (d,) vector p_mm for the prompt problem
                  (absent when infeasible)
  norm_value      ||W_mm|| in norm_name (fro | nuc | l1 | p)
  margin          min over the constraints of the margin (target 1)
  violation       max over the constraints of max(0, 1 - margin)
  kkt_residual    KKT residual (stationarity and complementarity, relative)
  gap             relative duality gap
  rank            numerical rank of W_mm (matrices)
  alpha           selected tokens, (n,) or (n, T)
  margins, dual, support   per constraint (n, T), or (n, T, T) [i, query k, key t]
  conflict        sequences of a conflicting subset when infeasible
  feasible, status, solver, problem, query, norm_name
Read it with np.load(FILE) (no pickles). Exit status: 0 feasible (W_mm found), 1
infeasible, 2 bad input.

Examples:
  attnsvm solve data.npz --norm nuc --out wmm.npz
  attnsvm solve selfattn.npz --query last --alpha 0,2,1,1
  attnsvm solve s2s.npz --query causal --out wmm.npz --force"""


def _norm_names() -> str:
    """The named norms of :data:`attnsvm.norms.NORMS` (the registry), for --norm's help."""
    from attnsvm.norms import NORMS

    return " | ".join(NORMS)


def _solver_help() -> str:
    """--solver's help, from the tables NATIVE_SOLVERS and CVXPY_SOLVERS."""
    cvx = " | ".join(CVXPY_SOLVERS)
    per = ";  ".join(f"{n}: {' | '.join(v)} | {cvx}" for n, v in NATIVE_SOLVERS.items())
    native = " and ".join(NATIVE_SOLVERS)
    return (f"{per};  any other norm: {cvx} (default: {NATIVE_SOLVERS['fro'][0]} for "
            f"{native}, {CVXPY_SOLVERS[0]} otherwise)")


def configure(parser: argparse.ArgumentParser) -> None:
    from attnsvm.models import QUERIES

    parser.add_argument("data", metavar="DATA.npz", help="TokenData .npz (format below)")
    parser.add_argument("--query", default=None, choices=QUERIES,
                        help="where the queries come from, as in `attnsvm train` (default: "
                             "cross if the file has z, else the prompt problem)")
    parser.add_argument("--problem", default="auto", choices=["auto", "att", "prompt"],
                        help="att (W with queries) or prompt (the vector p, keys = X); auto: "
                             "att if the file has z or --query is given, else prompt")
    parser.add_argument("--norm", default="fro",
                        help=f"norm of the SVM: {_norm_names()} | l<P> or P (a number >= 1, "
                             f"entrywise l_p); the prompt problem is Frobenius only")
    parser.add_argument("--alpha", default="opt",
                        help="'opt' (argmax_t y v^T x_t) or token indices: I,J,... one per "
                             "sequence; seq2seq/causal: rows of T separated by ';'")
    parser.add_argument("--rank", type=positive_int, default=None,
                        help="rank <= m, nuclear norm with one query per sequence only "
                             "(default: no rank constraint)")
    parser.add_argument("--solver", default=None,
                        help=_solver_help())
    parser.add_argument("--out", default=None, metavar="FILE.npz",
                        help="save W_mm and its certificate (keys below); an existing file is "
                             "kept unless --force (default: print only)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out file")


# ------------------------------------------------------------------------- parsing
def _indices(text: str, what: str, tokens: int | None = None) -> list[int]:
    items = [t.strip() for t in text.split(",")]
    if not all(re.fullmatch(r"[+-]?\d+", t) for t in items):
        raise ValueError(f"--alpha expects 'opt' or comma-separated integer token indices, {what} "
                         f"(e.g. 0,2,1); got {text!r}")
    out = [int(t) for t in items]
    big = [i for i in out if not -2 ** 63 <= i < 2 ** 63]  # beyond any array's integers
    if big:
        span = f"[0, {tokens - 1}]" if tokens else "[0, T - 1]"
        raise ValueError(f"--alpha: alpha out of range: token indices must lie in {span}; "
                         f"got {big[:5]}")
    return out


def parse_alpha(text: str, n: int, T: int | None = None, tokens: int | None = None):
    """``"opt"`` -> None; ``"0,2,1"`` -> array([0, 2, 1]) (one index per sequence);
    with ``T`` (seq2seq): ``"0,0,1;0,1,1"`` -> an (n, T) array, one row per sequence.
    ``tokens``: T, for the message of an index too large for any array."""
    import numpy as np

    if text.strip().lower() == "opt":
        return None
    tokens = T if tokens is None else tokens
    if T is None:
        if ";" in text:
            raise ValueError(f"--alpha {text!r}: rows separated by ';' are for --query seq2seq "
                             f"or causal; give one token index per sequence (e.g. 0,2,1)")
        alpha = np.array(_indices(text, "one per sequence", tokens))
        if len(alpha) != n:
            raise ValueError(f"--alpha gives {len(alpha)} token indices, but the data has n = "
                             f"{n} sequences (one index each)")
        return alpha
    rows = [r for r in text.split(";")]
    if len(rows) != n:
        raise ValueError(f"--alpha gives {len(rows)} rows, but the data has n = {n} sequences "
                         f"(one row of T = {T} indices each, rows separated by ';')")
    out = []
    for i, row in enumerate(rows):
        idx = _indices(row, "one row of T per sequence, rows separated by ';'", tokens)
        if len(idx) != T:
            raise ValueError(f"--alpha row {i} gives {len(idx)} token indices; each row needs "
                             f"T = {T}, one selected key per query token")
        out.append(idx)
    return np.array(out)


def check_solver(solver: str | None, norm) -> str | None:
    """``solver`` lower-cased if it solves ``norm``, else a ValueError listing those that do."""
    if solver is None:
        return None
    key = solver.strip().lower()
    allowed = (*NATIVE_SOLVERS.get(norm, ()), *CVXPY_SOLVERS)
    if key not in allowed:
        known = sorted({s for v in NATIVE_SOLVERS.values() for s in v} | set(CVXPY_SOLVERS))
        what = "unknown --solver" if key not in known else "--solver"
        raise ValueError(f"{what} {solver!r} for --norm {norm}: use one of {', '.join(allowed)}")
    return key


def load(path: str) -> dict:
    """The arrays of ``path``: X, optional y, z, v, mask, validated as TokenData when the
    file has labels (anything wrong is a ValueError naming the file); ``seq2seq`` says
    whether y holds one label per query token."""
    from attnsvm.data import TokenData, load_arrays

    arrays = load_arrays(path, required=("X",), optional=("y", "z", "v", "mask"))
    if "y" in arrays:
        try:
            data = TokenData(**arrays)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if data.batched:
            raise ValueError(f"{path} holds B = {data.B} datasets (X of shape "
                             f"{data.X.shape}); solve takes one: save one of them "
                             f"(TokenData.trial(b).save(...))")
        return {"X": data.X, "y": data.y, "z": data.z, "v": data.v, "mask": data.mask,
                "seq2seq": data.seq2seq, "labels": data.label_note()}
    try:  # no labels: validate the rest through TokenData with placeholder labels
        X = arrays["X"]
        if getattr(X, "ndim", 0) != 3:
            raise ValueError(f"X must have shape (n, T, d); got {getattr(X, 'shape', None)}")
        data = TokenData(X=X, y=[1.0] * X.shape[0], z=arrays.get("z"), v=arrays.get("v"),
                         mask=arrays.get("mask"))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return {"X": data.X, "y": None, "z": data.z, "v": data.v, "mask": data.mask,
            "seq2seq": False, "labels": ""}


# ------------------------------------------------------------------ the problem
def choose(args: argparse.Namespace, data: dict, source: str) -> str:
    """The problem to solve: "prompt" or a query kind of QUERIES; a ValueError names a
    combination that does not apply."""
    query, problem = args.query, args.problem
    if problem == "prompt":
        if query is not None:
            raise ValueError(f"--query {query} does not apply to --problem prompt (its one query "
                             f"is the trained vector p); leave --query out")
        if data["seq2seq"]:
            raise ValueError(f"{source} holds seq-to-seq labels y of shape (n, T), which the "
                             f"prompt problem cannot use (one query per sequence); use --query "
                             f"seq2seq|causal")
        return "prompt"
    if query is None:
        if data["seq2seq"]:
            raise ValueError(f"{source} holds seq-to-seq labels y of shape (n, T) (one per query "
                             f"token); use --query seq2seq|causal")
        if data["z"] is not None:
            return "cross"
        if problem == "att":
            raise ValueError(f"--problem att needs cross-attention queries z, and {source} "
                             f"has none; use --query first|last|seq2seq|causal "
                             f"(self-attention) or --problem prompt")
        return "prompt"
    if query == "cross" and data["z"] is None:
        raise ValueError(f"--query cross needs cross-attention queries z, and {source} has "
                         f"none; use --query first|last (self-attention: the first or last "
                         f"token is the query), seq2seq|causal, or add z to the file")
    if data["seq2seq"] and query not in SEQ2SEQ:
        raise ValueError(f"{source} holds seq-to-seq labels y of shape (n, T) (one per query "
                         f"token), which --query {query} cannot use (one query per sequence); "
                         f"use --query seq2seq|causal, or labels y of shape (n,)")
    return query


def self_queries(X, mask, which: str):
    """z_i = x_{i,first} or x_{i,last valid} (n, d), as the models take them."""
    import numpy as np

    if which == "first":
        return X[:, 0, :]
    if mask is None:
        return X[:, -1, :]
    last = np.cumsum(mask, axis=1).argmax(axis=1)  # the last valid token
    return X[np.arange(X.shape[0]), last, :]


def seq2seq_opt(X, y, v, mask, causal: bool):
    """alpha_ik = argmax over the admissible keys t of gamma_ikt (n, T): gamma = y v^T x_t
    with y_ik (seq-to-seq labels) or y_i (one label per sequence, the same for every
    query); admissible: valid keys, and t <= k when causal."""
    import numpy as np

    from attnsvm.scores import scores

    n, T, _ = X.shape
    g = scores(X, y, v)
    g = np.broadcast_to(g[:, None, :], (n, T, T)) if g.ndim == 2 else g
    ok = np.ones((n, T, T), bool)
    if mask is not None:
        ok &= np.asarray(mask, bool)[:, None, :]
    if causal:
        ok &= np.tril(np.ones((T, T), bool))[None]
    return np.argmax(np.where(ok, g, -np.inf), axis=-1)


def solution_arrays(sol, query: str) -> dict:
    """What ``--out`` writes: W_mm, the certificate numbers and the per-constraint arrays
    (plain numpy, strings as unicode arrays: np.load reads them without pickles)."""
    import numpy as np

    out = {
        "norm_name": np.str_(str(sol.norm)),
        "norm_value": np.float64(sol.norm_),
        "margin": np.float64(sol.margin_),
        "violation": np.float64(sol.violation_),
        "kkt_residual": np.float64(sol.kkt_residual_),
        "gap": np.float64(sol.gap_),
        "feasible": np.bool_(sol.feasible_),
        "status": np.str_(sol.status_),
        "solver": np.str_(sol.solver_),
        "problem": np.str_(sol.problem),
        "query": np.str_(query),
        "conflict": np.asarray(sol.conflict_, dtype=np.int64),
    }
    if sol.W_ is not None:
        out["W_mm"] = np.asarray(sol.W_, dtype=np.float64)
        out["rank"] = np.int64(sol.rank())
    if sol.alpha_ is not None:
        out["alpha"] = np.asarray(sol.alpha_, dtype=np.int64)
    for key, val in (("margins", sol.margins_), ("dual", sol.dual_), ("support", sol.support_)):
        if val is not None:
            out[key] = np.asarray(val)
    return out


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from attnsvm._validation import check_memory
    from attnsvm.norms import get_norm
    from attnsvm.svm import att_svm, prompt_svm, seq2seq_svm

    out = check_out_file(args.out, args.force, (".npz",), "the solution")
    try:
        norm = get_norm(args.norm).name
    except ValueError as exc:
        raise ValueError(f"--norm {args.norm}: {exc}") from None
    solver = check_solver(args.solver, norm)
    data = load(args.data)
    X, y, v, mask = data["X"], data["y"], data["v"], data["mask"]
    n, T, _ = X.shape
    kind = choose(args, data, args.data)
    seq = kind in SEQ2SEQ
    alpha = parse_alpha(args.alpha, n, T if seq else None, tokens=T)
    if alpha is None and (y is None or v is None):
        missing = [k for k in ("y", "v") if data[k] is None]
        example = "i1,i2,..." if not seq else "rows of T indices separated by ';'"
        raise ValueError(f"--alpha opt (argmax_t y_i v^T x_it) needs labels y and the head v; "
                         f"{args.data} has no {' or '.join(missing)}: give --alpha "
                         f"{example} (the selected token indices)")
    if kind == "prompt" and norm != "fro":
        raise ValueError(f"--norm {args.norm} does not apply to the prompt SVM, which is "
                         f"Frobenius only (min ||p||_2)" + (
                             "; the file has no queries z, so --problem auto chose prompt"
                             if args.problem == "auto" else ""))
    if args.rank is not None and norm != "nuc":
        raise ValueError(f"--rank applies to the nuclear norm only (--norm nuc); got --norm "
                         f"{norm}" + (" (the prompt SVM)" if kind == "prompt" else ""))
    if args.rank is not None and seq:
        raise ValueError(f"--rank applies to one query per sequence (--query cross|first|last); "
                         f"the seq-to-seq SVM of --query {kind} has no rank option")

    d = X.shape[2]
    e = 1 if kind == "prompt" else (data["z"].shape[1] if kind == "cross" else d)
    check_memory(8.0 * d * e * 2, f"the solution W_mm ({d} x {e}, float64) and its "
                 f"certificate", "solve a smaller problem (fewer features d)")
    if kind == "prompt":
        sol = prompt_svm(X, None, alpha, y=y, v=v, mask=mask, solver=solver)
    elif seq:
        if alpha is None:
            alpha = seq2seq_opt(X, y, v, mask, causal=kind == "causal")
        sol = seq2seq_svm(X, alpha, causal=kind == "causal", mask=mask, norm=norm, solver=solver)
    else:
        Z = data["z"] if kind == "cross" else self_queries(X, mask, kind)
        sol = att_svm(X, Z, alpha, y=y, v=v, norm=norm, rank=args.rank, mask=mask,
                      solver=solver)
    what = {"prompt": "prompt vector p", "cross": "queries z from the file",
            "first": "self-attention, query = first token",
            "last": "self-attention, query = last valid token",
            "seq2seq": "seq-to-seq, every token a query",
            "causal": "causal seq-to-seq, keys t <= k"}[kind]
    labels = f"; {data['labels']}" if data.get("labels") else ""
    print(f"data: {args.data} (n = {n}, T = {T}, d = {X.shape[2]}); {what}{labels}")
    print(sol.summary())
    if solver in CVXPY_SOLVERS and not str(sol.solver_).lower().startswith(solver):
        print(f"note: --solver {solver} failed on this problem; the solution above comes "
              f"from {sol.solver_}")
    a = np.asarray(sol.alpha_)
    shown = a.tolist() if a.ndim == 1 else "; ".join(",".join(map(str, r)) for r in a.tolist())
    print(f"alpha = {shown}")
    if out is not None:
        arrays = solution_arrays(sol, kind)

        def write(tmp):
            with open(tmp, "wb") as fh:  # a handle: np.savez would append .npz to a name
                np.savez(fh, **arrays)

        write_atomic(out, args.force, write)
        print(f"W_mm and certificate -> {out}" if sol.feasible_
              else f"certificate (infeasible: no W_mm) -> {out}")
    return 0 if sol.feasible_ else 1
