"""``attnsvm solve DATA.npz``: solve a max-margin problem and print its certificate."""

from __future__ import annotations

import argparse
import re

from attnsvm.cli._args import positive_int

HELP = "solve the attention SVM (THEORY §5) for a TokenData .npz and print the certificate"

#: --solver values by norm: attnsvm's own solvers, then the cvxpy solvers it configures.
NATIVE_SOLVERS = {"fro": ("fast", "ipm", "mnp"), "nuc": ("fast", "barrier", "working_set")}
CVXPY_SOLVERS = ("clarabel", "scs")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", help="TokenData .npz (keys X, y, z, v, mask)")
    parser.add_argument("--norm", default=None,
                        help="fro (default) | nuc | l1 | P (float > 1); the prompt problem is "
                             "Frobenius only")
    parser.add_argument("--alpha", default="opt",
                        help="'opt' (argmax y v^T x) or comma-separated token indices, one per "
                             "sequence")
    parser.add_argument("--problem", default="auto", choices=["auto", "att", "prompt"],
                        help="att (W with queries z) or prompt (p, keys = X); auto: att if z")
    parser.add_argument("--rank", type=positive_int, default=None,
                        help="rank <= m (nuclear norm only)")
    parser.add_argument("--solver", default=None,
                        help="fro: fast | ipm | mnp | clarabel | scs;  nuc: fast | barrier | "
                             "working_set | clarabel | scs;  l1, P: clarabel | scs")


def parse_alpha(text: str, n: int):
    """``"opt"`` -> None; ``"0,2,1"`` -> array([0, 2, 1]) (one index per sequence)."""
    import numpy as np

    if text.strip().lower() == "opt":
        return None
    items = [t.strip() for t in text.split(",")]
    if not all(re.fullmatch(r"[+-]?\d+", t) for t in items):
        raise ValueError(f"--alpha expects 'opt' or comma-separated integer token indices, one "
                         f"per sequence (e.g. 0,2,1); got {text!r}")
    alpha = np.array([int(t) for t in items])
    if len(alpha) != n:
        raise ValueError(f"--alpha gives {len(alpha)} token indices, but the data has n = {n} "
                         f"sequences (one index each)")
    return alpha


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
    file has labels (anything wrong is a ValueError naming the file)."""
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
        if data.seq2seq:
            raise ValueError(f"{path} holds seq-to-seq labels y of shape (n, T); solve takes "
                             f"one label per sequence (the seq-to-seq SVM is "
                             f"attnsvm.svm.seq2seq_svm)")
        return {"X": data.X, "y": data.y, "z": data.z, "v": data.v, "mask": data.mask}
    X = arrays["X"]
    if X.ndim != 3:
        raise ValueError(f"{path}: X must have shape (n, T, d); got {X.shape}")
    return {"X": X, "y": None, "z": arrays.get("z"), "v": arrays.get("v"),
            "mask": arrays.get("mask")}


def run(args: argparse.Namespace) -> int:
    from attnsvm.svm import att_svm, prompt_svm
    from attnsvm.svm.solution import _norm_name

    try:
        norm = _norm_name("fro" if args.norm is None else args.norm)
    except ValueError as exc:
        raise ValueError(f"--norm {args.norm}: {exc}") from None
    data = load(args.data)
    X, z = data["X"], data["z"]
    n = X.shape[0]
    alpha = parse_alpha(args.alpha, n)
    if alpha is None and (data["y"] is None or data["v"] is None):
        missing = [k for k in ("y", "v") if data[k] is None]
        raise ValueError(f"--alpha opt (argmax_t y_i v^T x_it) needs labels y and the head v; "
                         f"{args.data} has no {' or '.join(missing)}: give --alpha i1,i2,... "
                         f"(one token index per sequence)")
    problem = args.problem
    if problem == "auto":
        problem = "att" if z is not None else "prompt"
    if problem == "att" and z is None:
        raise ValueError(f"--problem att needs cross-attention queries z, and {args.data} has "
                         f"none; use --problem prompt")
    if problem == "prompt" and norm != "fro":
        raise ValueError(f"--norm {args.norm} does not apply to the prompt SVM, which is "
                         f"Frobenius only (min ||p||_2)" + (
                             "; the file has no queries z, so --problem auto chose prompt"
                             if args.problem == "auto" else ""))
    if args.rank is not None and norm != "nuc":
        raise ValueError(f"--rank applies to the nuclear norm only (--norm nuc); got --norm "
                         f"{norm}" + (" (the prompt SVM)" if problem == "prompt" else ""))
    solver = check_solver(args.solver, norm)
    if problem == "prompt":
        sol = prompt_svm(X, None, alpha, y=data["y"], v=data["v"], mask=data["mask"],
                         solver=solver)
    else:
        sol = att_svm(X, z, alpha, y=data["y"], v=data["v"], norm=norm, rank=args.rank,
                      mask=data["mask"], solver=solver)
    print(sol.summary())
    if solver in CVXPY_SOLVERS and not str(sol.solver_).lower().startswith(solver):
        print(f"note: --solver {solver} failed on this problem; the solution above comes "
              f"from {sol.solver_}")
    print(f"alpha = {sol.alpha_.tolist()}")
    return 0 if sol.feasible_ else 1
