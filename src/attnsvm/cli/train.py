"""``attnsvm train``: train B trials of an attention model and summarise the run."""

from __future__ import annotations

import argparse

HELP = "train attention models (built-in demo or a .npz TokenData) and summarise the run"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None,
                        help="TokenData .npz (default: the random_sphere demo n=6 T=8 d=10)")
    parser.add_argument("--model", default="W", choices=["W", "KQ", "Diag", "Prompt"])
    parser.add_argument("--query", default="cross", choices=["cross", "first", "last", "seq2seq", "causal"])
    parser.add_argument("--optimizer", default="ngd", choices=["gd", "ngd", "polyak", "mirror"])
    parser.add_argument("--lr", type=float, default=0.1, help="step size (Polyak: its c)")
    parser.add_argument("--p", type=float, default=2.0, help="l_p exponent for --optimizer mirror")
    parser.add_argument("--loss", default="logistic", choices=["logistic", "exponential", "correlation"])
    parser.add_argument("--trials", type=int, default=200, help="B independent trials")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", default="random", choices=["random", "zero", "balanced", "unbalanced"])
    parser.add_argument("--scale", type=float, default=0.1, help="initialisation norm")
    parser.add_argument("--record-every", type=int, default=None)
    parser.add_argument("--device", default=None, help="torch device, e.g. cuda")
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    parser.add_argument("--out", default=None, help="write the metrics table (.parquet or .csv)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnsvm import data as D
    from attnsvm import models as M
    from attnsvm import optim as O
    from attnsvm.train import train

    if args.data:
        data = D.TokenData.load(args.data)
        B = data.B if data.batched else args.trials
        source = args.data
    else:
        data = D.random_sphere(seed=args.seed, batch=args.trials)
        B = args.trials
        source = f"random_sphere(n=6, T=8, d=10, batch={B})"
    d = data.d
    kw = {} if args.model == "Prompt" else {"query": args.query}
    model = {"W": M.WModel, "KQ": M.KQModel, "Diag": M.DiagModel, "Prompt": M.PromptModel}[args.model](d, **kw)
    opt = {"gd": lambda: O.gd(args.lr), "ngd": lambda: O.ngd(args.lr), "polyak": lambda: O.polyak(args.lr),
           "mirror": lambda: O.mirror(args.p, args.lr)}[args.optimizer]()
    traj = train(model, data, loss=args.loss, optimizer=opt, steps=args.steps, B=B, seed=args.seed,
                 init=args.init, scale=args.scale, record_every=args.record_every,
                 progress=args.progress, device=args.device)
    last = traj.metrics.groupby("trial").last()
    print(f"data: {source}; model {args.model} ({args.query}); {args.optimizer} lr={args.lr}; "
          f"{args.loss} loss; {B} trials x {traj.steps_run} steps")
    print(f"  final loss gap L - L*: median {last['loss_gap'].median():.3e}  max {last['loss_gap'].max():.3e}")
    if "p_sel_mean" in last:
        print(f"  p_sel (prob. of the optimal token): mean {last['p_sel_mean'].mean():.4f}  "
              f"min {last['p_sel_min'].min():.4f}")
    print(f"  norm ||W||: mean {last['norm'].mean():.3f}   stopped trials: {int(traj.stopped.sum())}")
    if args.out:
        out = Path(args.out)
        if out.suffix == ".parquet":
            traj.metrics.to_parquet(out, index=False)
        else:
            traj.metrics.to_csv(out, index=False)
        print(f"  metrics ({len(traj.metrics)} rows) -> {out}")
    return 0
