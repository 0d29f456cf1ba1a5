"""``attnsvm solve DATA.npz``: solve a max-margin problem and print its certificate."""

from __future__ import annotations

import argparse

HELP = "solve the attention SVM (THEORY §5) for a TokenData .npz and print the certificate"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", help="TokenData .npz (keys X, y, z, v, mask)")
    parser.add_argument("--norm", default="fro", help="fro | nuc | l1 | P (float > 1)")
    parser.add_argument("--alpha", default="opt",
                        help="'opt' (argmax y v^T x) or comma-separated token indices")
    parser.add_argument("--problem", default="auto", choices=["auto", "att", "prompt"],
                        help="att (W with queries z) or prompt (p, keys = X); auto: att if z")
    parser.add_argument("--rank", type=int, default=None, help="rank <= m (nuclear norm)")
    parser.add_argument("--solver", default=None, help="fast | ipm | clarabel | scs")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from attnsvm.svm import att_svm, prompt_svm

    with np.load(args.data, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    X = data["X"]
    if X.ndim != 3:
        print(f"error: X must have shape (n, T, d); got {X.shape} (batched files: solve one at a time)")
        return 2
    z = data.get("z")
    if z is not None and z.ndim == 0:
        z = None
    mask = data.get("mask")
    if mask is not None and mask.ndim == 0:
        mask = None
    y, v = data.get("y"), data.get("v")
    if args.alpha == "opt":
        alpha = None
    else:
        alpha = np.array([int(a) for a in args.alpha.split(",")])
    norm = args.norm
    try:
        norm = float(norm)
    except ValueError:
        pass
    try:
        if args.problem == "prompt" or (args.problem == "auto" and z is None):
            sol = prompt_svm(X, None, alpha, y=y, v=v, mask=mask, solver=args.solver)
        else:
            sol = att_svm(X, z, alpha, y=y, v=v, norm=norm, rank=args.rank, mask=mask,
                          solver=args.solver)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    print(sol.summary())
    print(f"alpha = {sol.alpha_.tolist()}")
    return 0 if sol.feasible_ else 1
