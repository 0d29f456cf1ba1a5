"""``attnsvm vit``: a small ViT on scikit-learn's digits, trained by SGD, SNGD and l_p mirror
descent; attention sparsity and key-query norm along training (attnsvm.realdata.vit)."""

from __future__ import annotations

import argparse
import math
import re

from attnsvm.cli._args import (
    add_progress,
    check_out_dir,
    default_out,
    nonnegative_int,
    positive_int,
    progress_on,
)

HELP = "train a small ViT on the bundled digits with SGD/SNGD/mirror descent; sparsity vs norm"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--full", action="store_true",
                   help="the long run (5 seeds, 100 epochs, 2 layers; ~25 min on 2 cores) "
                        "instead of the quick one (3 seeds, 30 epochs, 1 layer)")
    p.add_argument("--out", default=default_out("vit"),
                   help="output directory (tables, figures, summary.txt)")
    p.add_argument("--seeds", type=nonnegative_int, nargs="+", default=None,
                   help="training seeds (default 0 1 2; --full: 0 1 2 3 4)")
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="epochs per run (default 30; --full: 100)")
    p.add_argument("--optimizers", nargs="+", default=None,
                   help="subset of sgd sngd md1.1 md2 md3 (md<p> for any p > 1) (default: "
                        "all five)")
    p.add_argument("--lr", nargs="+", default=None, metavar="NAME=LR",
                   help="learning-rate overrides, e.g. --lr sgd=0.05 md1.1=0.01 (default: "
                        "sgd=0.1 sngd=0.03 md1.1=0.03 md2=0.1 md3=0.1)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="transformer blocks (default 1; --full: 2)")
    p.add_argument("--dtype", choices=["float32", "float64"], default=None,
                   help="dtype of the network (default float32; the statistics are float64)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads during the run (default 1)")
    p.add_argument("--label-noise", type=_noise_ratio, nargs="+", default=None, metavar="RATIO",
                   help="train on flipped labels at these noise ratios (e.g. 0 0.1 0.2 0.4; "
                        "ratio 0 is the clean run) with the first optimizer (default sgd): clean "
                        "test accuracy, flipped labels fitted, the patches flipped samples attend "
                        "to and the tracker's SVM alignment (the benign-vit experiment's study)")
    add_progress(p, "a line per optimiser and seed", aliases=("--quiet",))


def _noise_ratio(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        r = float("nan")
    if not (math.isfinite(r) and 0 <= r < 1):
        raise argparse.ArgumentTypeError(f"expected a noise ratio in [0, 1); got {text!r}")
    return r


def run(args: argparse.Namespace) -> int:
    from attnsvm.realdata.vit import DEFAULT_LR, config_from, run_vit

    check_out_dir(args.out)  # before the data and the model are loaded
    lr = dict(DEFAULT_LR)
    for item in args.lr or []:
        name, _, value = item.partition("=")
        try:
            lr[name] = float(value)
        except ValueError:
            raise ValueError(f"--lr expects NAME=LR (e.g. sgd=0.05); got {item!r}") from None
        if not (math.isfinite(lr[name]) and lr[name] > 0):
            raise ValueError(f"--lr {item}: the learning rate must be a finite number > 0")
    for o in args.optimizers or []:
        m = re.fullmatch(r"md([0-9.eE+-]+)", o)
        if o not in ("sgd", "sngd") and not (m and _is_p(m.group(1))):
            raise ValueError(f"--optimizers {o}: use sgd, sngd or md<p> with p > 1 "
                             f"(e.g. md1.1, md3)")
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
    if missing:
        raise ValueError(f"no learning rate for {', '.join(missing)}; give one with "
                         + " ".join(f"--lr {o}=LR" for o in missing))
    if args.label_noise is not None:
        return _label_noise(cfg if args.optimizers else config_from(
            args.full, seeds=cfg.seeds, epochs=args.epochs, layers=args.layers, dtype=args.dtype,
            threads=args.threads, lr=lr, optimizers=("sgd",)), args)
    res = run_vit(cfg, out=args.out, progress=print if progress_on(args) else None)
    print()
    print("\n".join(res.summary))
    print(f"\n{len(cfg.optimizers)} optimisers x {len(cfg.seeds)} seeds x {cfg.epochs} epochs "
          f"in {res.seconds:.0f}s; tables and figures in {args.out}/")
    for name, path in res.figures.items():
        print(f"  {name}: {path}")
    return 0


def _label_noise(cfg, args) -> int:
    """The label-noise study (attnsvm.realdata.vit.label_noise_study) at args.label_noise,
    its tables, figure and findings (attnsvm.experiments.benign_vit) written to args.out."""
    import time
    from pathlib import Path

    from attnsvm.experiments.benign_vit import judge, per_ratio
    from attnsvm.realdata.vit import label_noise_study, plot_label_noise

    t0 = time.perf_counter()
    ratios = tuple(sorted(set(args.label_noise)))
    tables = label_noise_study(ratios, cfg, progress=print if progress_on(args) else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.to_csv(out / f"noise_{name}.csv", index=False)
    per_ratio(tables).to_csv(out / "noise_per_ratio.csv", index=False)
    fig = plot_label_noise(tables, out / "vit_label_noise.png")
    lines = [f"[{c.kind}] {'holds' if c.passed else 'does not hold'}: {c.claim}\n    measured: "
             f"{c.measured}" for c in judge(tables, {})]
    (out / "noise_summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nlabel noise {', '.join(f'{r:g}' for r in ratios)} x {len(cfg.seeds)} seeds x "
          f"{cfg.epochs} epochs ({cfg.optimizers[0]}) in {time.perf_counter() - t0:.0f}s; tables "
          f"and figure in {args.out}/\n  figure: {fig}")
    return 0


def _is_p(text: str) -> bool:
    try:
        p = float(text)
    except ValueError:
        return False
    return math.isfinite(p) and p > 1
