"""``attnsvm train``: train B trials of an attention model and summarise the run."""

from __future__ import annotations

import argparse

from attnsvm.cli._args import (
    NPZ_FORMAT,
    add_progress,
    check_out_file,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    progress_on,
    seed_int,
    torch_device,
    write_atomic,
)

HELP = "train attention models (built-in demo or a .npz TokenData) and summarise the run"

DEFAULT_TRIALS = 200

EPILOG = NPZ_FORMAT + """

What train reads: X, y and v (every model here has the fixed linear head v); z for
--query cross; mask if present. y of shape (n, T) needs --query seq2seq or causal. A
batched file trains one trial per dataset (B trials; --trials must agree or be left out).

Examples:
  attnsvm train --steps 1000 --optimizer ngd --lr 0.1
  attnsvm train --data my.npz --model KQ --query last --optimizer adam --opt-arg eps=0
  attnsvm train --data s2s.npz --query causal --out metrics.parquet"""


def configure(parser: argparse.ArgumentParser) -> None:
    # the choices come from the registries (models, queries, losses, initialisations, rules)
    from attnsvm.losses import LOSSES
    from attnsvm.models import INIT_KINDS, MODELS, QUERIES

    parser.add_argument("--data", default=None, metavar="FILE.npz",
                        help="TokenData .npz, format below (default: the random_sphere demo, "
                             "n=6 T=8 d=10, one dataset per trial)")
    parser.add_argument("--model", default="W", choices=list(MODELS),
                        help="parameterisation: W (combined key-query matrix), KQ (W = K Q^T), "
                             "Diag (W = diag(k * q)), Prompt (trained query p, W = I)")
    parser.add_argument("--query", default=None, choices=QUERIES,
                        help="where the queries come from: cross (the data's z), first / last "
                             "(self-attention: that token of the sequence is the query), "
                             "seq2seq / causal (every token is a query; causal: keys t <= k) "
                             "(default cross; not for --model Prompt)")
    parser.add_argument("--optimizer", default="ngd", metavar="RULE",
                        help="a rule of attnsvm.optim: "
                             + ", ".join(_rule_names()) + ", or md<p> (l_p mirror descent)")
    parser.add_argument("--lr", type=positive_float, default=None,
                        help="step size > 0 (Polyak: its c) (default 0.1; --opt-arg lr=... "
                             "or, for Polyak, c=... gives it too: both given must agree)")
    parser.add_argument("--opt-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="another hyper-parameter of the rule, e.g. --opt-arg eps=0 "
                             "--opt-arg beta=0.9 (repeatable; default: the rule's own)")
    parser.add_argument("--p", type=float, default=None,
                        help="l_p exponent > 1 for --optimizer mirror (default 2)")
    parser.add_argument("--loss", default="logistic",
                        choices=list(LOSSES),
                        help="loss of the margin u = y f")
    parser.add_argument("--trials", type=positive_int, default=None,
                        help=f"B independent trials (default {DEFAULT_TRIALS}; a batched "
                             f"--data file sets B)")
    parser.add_argument("--steps", type=nonnegative_int, default=500,
                        help="optimiser steps per trial")
    parser.add_argument("--seed", type=seed_int, default=0,
                        help="seed of the demo data, the initialisation and SGD's mini-batches")
    parser.add_argument("--init", default="random",
                        choices=list(INIT_KINDS),
                        help="initialisation: random (norm --scale), zero, balanced (K = Q) or "
                             "unbalanced (Q = 0; KQ and Diag only)")
    parser.add_argument("--scale", type=nonnegative_float, default=0.1,
                        help="Frobenius norm of the random initialisation")
    parser.add_argument("--record-every", type=positive_int, default=None,
                        help="record the metrics every this many steps, and at the last "
                             "(default: max(steps // 100, min(steps, 25)))")
    parser.add_argument("--device", default=None,
                        help="torch device: cpu, cuda, cuda:N or mps (default: cpu)")
    add_progress(parser, "a progress bar on stderr", bar=True)
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="write the metrics table (.parquet or .csv); an existing file "
                             "is kept unless --force (default: print the summary only)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out file")


def _rule_names() -> list[str]:
    from attnsvm.optim import RULES

    return sorted(RULES)


def _value(text: str):
    """A hyper-parameter value from the command line: bool, int, float, None or a string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def make_optimizer(name: str, lr: float | None, p: float | None, pairs: list[str]):
    """The rule ``name`` of ``attnsvm.optim.get`` with lr (Polyak: c), p (mirror) and the
    ``KEY=VALUE`` pairs; a ValueError names a bad pair, rule or hyper-parameter.

    The step size is the rule's hyper-parameter ``lr`` (or ``c``: the one its ``hyper``
    holds). ``lr=None`` (``--lr`` not given): the pair's value if one sets it, else 0.1;
    ``--lr`` and a pair that set it to different values: a ValueError naming both."""
    from attnsvm import optim as O

    hyper = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--opt-arg {pair!r}: expected KEY=VALUE, e.g. eps=0")
        key, val = pair.split("=", 1)
        hyper[key.strip()] = _value(val)
    rule = O.get(name)  # the name is checked before its hyper-parameters
    key = next((k for k in ("lr", "c") if k in rule.hyper), None)
    if key is not None:
        if lr is not None and key in hyper and hyper[key] != lr:
            raise ValueError(f"--lr {lr:g} and --opt-arg {key}={hyper[key]!r} set the step size "
                             f"of {name} to different values; give one of them")
        hyper.setdefault(key, 0.1 if lr is None else lr)
    elif lr is not None:
        raise ValueError(f"--lr: the rule {name} has no step size (lr or c)")
    if p is not None:
        hyper["p"] = p
    return O.get(name, **hyper)


def check_out(path: str | None, force: bool):
    """The ``--out`` metrics file, checked before any work is done (.parquet or .csv)."""
    return check_out_file(path, force, (".parquet", ".csv"), "the metrics table")


def write_table(df, out, force: bool) -> None:
    """Write ``df`` to ``out`` under a temporary name, then rename (never a torn file)."""
    if out.suffix == ".parquet":
        write_atomic(out, force, lambda tmp: df.to_parquet(tmp, index=False))
    else:
        write_atomic(out, force, lambda tmp: df.to_csv(tmp, index=False))


def run(args: argparse.Namespace) -> int:
    from attnsvm import data as D
    from attnsvm import models as M
    from attnsvm.train import train

    # every argument is checked before the data is loaded or anything is trained
    out = check_out(args.out, args.force)
    if args.model == "Prompt" and args.query not in (None, "cross"):
        raise ValueError(f"--query {args.query} does not apply to --model Prompt (its one "
                         f"query is the trained prompt p); leave --query out")
    query = args.query or "cross"
    if args.p is not None and args.optimizer != "mirror":
        raise ValueError(f"--p applies to --optimizer mirror only (got --optimizer "
                         f"{args.optimizer})")
    p = 2.0 if args.p is None and args.optimizer == "mirror" else args.p
    if args.optimizer == "mirror" and not (p > 1 and p < float("inf")):
        raise ValueError(f"--p must be a finite number > 1 for l_p mirror descent; got {args.p}")
    opt = make_optimizer(args.optimizer, args.lr, p, args.opt_arg)
    device = torch_device(args.device)

    if args.data:
        data = D.TokenData.load(args.data)
        if data.batched and args.trials is not None and args.trials != data.B:
            raise ValueError(f"--data {args.data} holds B = {data.B} datasets (one per "
                             f"trial); --trials {args.trials} disagrees: leave --trials out")
        B = data.B if data.batched else (args.trials or DEFAULT_TRIALS)
        source = args.data + (f" ({data.label_note()})" if data.label_map else "")
    else:
        B = args.trials or DEFAULT_TRIALS
        data = D.random_sphere(seed=args.seed, batch=B)
        source = f"random_sphere(n=6, T=8, d=10, batch={B})"
    if args.model != "Prompt" and query == "cross" and data.z is None:
        raise ValueError(f"--query cross needs cross-attention queries z, and {source} has "
                         f"none; use --query first|last (self-attention: the first or last "
                         f"token is the query) or add z to the file")
    if data.seq2seq and (args.model == "Prompt" or query in ("cross", "first", "last")):
        what = "--model Prompt" if args.model == "Prompt" else f"--query {query}"
        fix = ("--model W|KQ|Diag with --query seq2seq|causal" if args.model == "Prompt"
               else "--query seq2seq|causal")
        raise ValueError(f"{source} holds seq-to-seq labels y of shape (n, T) (one per query "
                         f"token), which {what} cannot use (one query per sequence); use "
                         f"{fix}, or labels y of shape (n,)")
    d = data.d
    kw = {} if args.model == "Prompt" else {"query": query}
    model = M.MODELS[args.model](d, **kw)
    traj = train(model, data, loss=args.loss, optimizer=opt, steps=args.steps, B=B, seed=args.seed,
                 init=args.init, scale=args.scale, record_every=args.record_every,
                 progress=progress_on(args), device=device)
    last = traj.metrics.groupby("trial").last()
    shown_query = "" if args.model == "Prompt" else f" ({query})"
    print(f"data: {source}; model {args.model}{shown_query}; {opt!r}; "
          f"{args.loss} loss; {B} trials x {traj.steps_run} steps")
    print(f"  final loss gap L - L*: median {last['loss_gap'].median():.3e}  max {last['loss_gap'].max():.3e}"
          f"  (log10: median {last['log10_gap'].median():.1f})")
    if "p_sel_mean" in last:
        print(f"  p_sel (prob. of the optimal token): mean {last['p_sel_mean'].mean():.4f}  "
              f"min {last['p_sel_min'].min():.4f}")
    stops = traj.stops[traj.stopped]
    why = "" if stops.empty else " (" + ", ".join(
        f"{c} {r}" for r, c in stops.stop_reason.value_counts().items()) + ")"
    print(f"  norm ||W||: mean {last['norm'].mean():.3f}   stopped trials: {int(traj.stopped.sum())}{why}")
    print(f"  {traj.outcome_line()}")
    if out is not None:
        write_table(traj.metrics, out, args.force)
        print(f"  metrics ({len(traj.metrics)} rows) -> {out}")
    return 0
