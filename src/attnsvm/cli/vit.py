"""``attnsvm vit``: a small ViT on scikit-learn's digits, trained by SGD, SNGD and l_p mirror
descent; attention sparsity and key-query norm along training (attnsvm.realdata.vit)."""

from __future__ import annotations

import argparse

HELP = "train a small ViT on the bundled digits with SGD/SNGD/mirror descent; sparsity vs norm"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--full", action="store_true",
                   help="the long run (5 seeds, 100 epochs, 2 layers; ~25 min on 2 cores)")
    p.add_argument("--out", default="results/vit", help="output directory (default results/vit)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run")
    p.add_argument("--optimizers", nargs="+", default=None,
                   help="subset of sgd sngd md1.1 md2 md3 (md<p> for any p > 1)")
    p.add_argument("--lr", nargs="+", default=None, metavar="NAME=LR",
                   help="learning-rate overrides, e.g. --lr sgd=0.05 md1.1=0.01")
    p.add_argument("--layers", type=int, default=None, help="transformer blocks")
    p.add_argument("--dtype", choices=["float32", "float64"], default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true")


def run(args: argparse.Namespace) -> int:
    from attnsvm.realdata.vit import DEFAULT_LR, config_from, run_vit

    lr = dict(DEFAULT_LR)
    for item in args.lr or []:
        name, _, value = item.partition("=")
        try:
            lr[name] = float(value)
        except ValueError:
            print(f"attnsvm vit: --lr expects NAME=LR; got {item!r}")
            return 2
    cfg = config_from(
        args.full,
        seeds=tuple(args.seeds) if args.seeds else None,
        epochs=args.epochs,
        optimizers=tuple(args.optimizers) if args.optimizers else None,
        layers=args.layers,
        dtype=args.dtype,
        threads=args.threads,
        lr=lr,
    )
    missing = [o for o in cfg.optimizers if o not in cfg.lr]
    for o in missing:
        print(f"attnsvm vit: no learning rate for {o!r}; give one with --lr {o}=LR")
    if missing:
        return 2
    res = run_vit(cfg, out=args.out, progress=None if args.quiet else print)
    print()
    print("\n".join(res.summary))
    print(f"\n{len(cfg.optimizers)} optimisers x {len(cfg.seeds)} seeds x {cfg.epochs} epochs "
          f"in {res.seconds:.0f}s; tables and figures in {args.out}/")
    for name, path in res.figures.items():
        print(f"  {name}: {path}")
    return 0
