"""attnsvm's real-data analogue of label-noise overfitting (issue 35): the digits ViT of
``attnsvm vit`` (:mod:`attnsvm.realdata.vit`, scikit-learn's bundled digits, no download)
trained on flipped labels, against the clean run.

Setting: symmetric label noise (:func:`attnsvm.realdata.vit.flip_labels`: round(ratio n)
training samples get a uniformly drawn wrong class; nested across ratios per seed) at
noise ratios 0, 0.1, 0.2, 0.4; the quick ViT (1 layer, 2 heads, dim 32) trained by SGD (lr
0.1, batch 32) for 30 epochs, 3 seeds per ratio, the same initialisation and batch order
per seed across ratios; the test set (30 % of the digits, stratified) keeps its true
labels. Recorded (:func:`attnsvm.realdata.vit.label_noise_study`): clean test accuracy,
how many flipped labels are fitted, which tokens clean and flipped samples attend to (the
[CLS] attention of the last layer on ink patches, blank patches or itself; the digits'
analogue of Sakamoto & Sato's signal and noise tokens) and the tracker's SVM alignment
corr(W, W_mm) of every head (:class:`attnsvm.track.Tracker`) at the first and last epoch.

Nothing here judges a paper: Sakamoto & Sato's real-data runs fine-tune pretrained
ViT / BERT backbones on MNIST, CIFAR-10, AG-news and TREC, which do not ship offline.
Every verdict is attnsvm's finding (or a sanity check of the set-up).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnsvm.experiments.base import Check, Claim, Experiment

#: "harmful": the mean clean test accuracy at the largest ratio is below the clean run's by
#: more than this many standard errors (seeds pooled)
SE = 2.0
#: "fitted": the flipped labels count as memorised when at least this share is fitted
FIT = 0.5
#: "attend alike": flipped and clean samples' attention mass on ink patches within this
ATTEND = 0.05
#: "svm": the final median corr(W, W_mm) at a noisy ratio within this of the clean run's
SVM = 0.1


CLAIMS = {
    "flips": Claim("every run flips exactly round(ratio n) training labels, each to another "
                   "class; the test labels are the true ones", kind="sanity"),
    "harmful": Claim(f"label noise costs clean test accuracy: at the largest ratio the mean final "
                     f"test accuracy is below the clean run's by more than {SE:g} standard errors",
                     kind="finding"),
    "fitted": Claim(f"the ViT memorises the flipped labels: at every ratio > 0 a share >= {FIT:g} "
                    f"of the flipped training samples is fitted to its wrong label at the end",
                    kind="finding"),
    "attend": Claim(f"flipped samples attend like clean ones: at every ratio > 0 the final [CLS] "
                    f"attention mass on ink patches of flipped and clean samples differs by <= "
                    f"{ATTEND:g} (Sakamoto & Sato's synthetic model: flipped samples attend to "
                    f"noise tokens)", kind="finding"),
    "svm": Claim(f"label noise leaves the heads' SVM alignment: at every ratio > 0 the final "
                 f"median corr(W, W_mm) over heads and seeds is within {SVM:g} of the clean run's, "
                 f"and every head SVM is certified optimal", kind="finding"),
}


def compute(cfg: dict) -> dict[str, pd.DataFrame]:
    from attnsvm.realdata.vit import ViTConfig, label_noise_study

    vc = ViTConfig(optimizers=(cfg["optimizer"],), seeds=tuple(cfg["seed"] + s for s in range(cfg["seeds"])),
                   epochs=cfg["epochs"], layers=cfg["layers"])
    return label_noise_study(cfg["ratios"], vc, n_train=cfg["n_train"], probe=cfg["probe"])


def per_ratio(tables: dict) -> pd.DataFrame:
    """Per noise ratio at the last epoch: mean and standard error over seeds of the clean test
    accuracy, the flipped samples fitted and predicted as their true class, the ink mass of
    clean and flipped samples; the tracker's median corr(W, W_mm) (last epoch, over heads and
    seeds) and the share of head SVMs certified optimal."""
    h, tr = tables["history"], tables["track"]
    fin = h[h.epoch == h.epoch.max()]
    last = tr[tr.step == tr.step.max()]
    rows = []
    for r, g in fin.groupby("ratio"):
        t = last[last.ratio == r]
        K = len(g)
        rows.append(dict(ratio=r, seeds=K, test_acc=g.test_acc.mean(),
                         test_acc_se=g.test_acc.std(ddof=1) / np.sqrt(K) if K > 1 else np.nan,
                         train_acc_clean=g.train_acc_clean.mean(),
                         fitted=g.train_acc_flipped.mean(), true_class=g.flipped_true.mean(),
                         ink_clean=g.ink_mass_clean.mean(), ink_flipped=g.ink_mass_flipped.mean(),
                         att_ink_flipped=g.att_ink_flipped.mean(), att_ink_clean=g.att_ink_clean.mean(),
                         corr_mm=t.corr_mm.median(), certified=(t.status == "optimal").mean()))
    return pd.DataFrame(rows)


def judge(tables: dict, cfg: dict) -> list[Check]:
    C = CLAIMS
    ps = per_ratio(tables)
    f = tables["flips"]
    ok_flips = bool((f.flips == f.expected).all() and (f.changed == f.flips).all())
    table = "; ".join(
        f"ratio {r.ratio:g}: test acc {r.test_acc:.3f} (se {r.test_acc_se:.3f}), flipped fitted "
        f"{r.fitted:.2f}, true class {r.true_class:.2f}, ink mass clean {r.ink_clean:.3f} / flipped "
        f"{r.ink_flipped:.3f}, corr_mm {r.corr_mm:.3f}" for r in ps.itertuples())
    clean = ps[ps.ratio == 0]
    noisy = ps[ps.ratio > 0]
    out = [C["flips"].check(f"flips per run {sorted(set(f.flips))} (expected "
                            f"{sorted(set(f.expected))}), all changed: {bool((f.changed == f.flips).all())}",
                            ok_flips)]
    if len(clean) == 0 or len(noisy) == 0:
        note = "needs the clean run (ratio 0) and a ratio > 0"
        return out + [C[k].check("not measured", False, note) for k in ("harmful", "fitted", "attend", "svm")]
    c, top = clean.iloc[0], noisy.iloc[-1]
    se = float(np.hypot(c.test_acc_se, top.test_acc_se))
    drop = c.test_acc - top.test_acc
    out.append(C["harmful"].check(f"clean {c.test_acc:.3f} -> ratio {top.ratio:g}: {top.test_acc:.3f} "
                                  f"(drop {drop:.3f}, {drop / se if se > 0 else float('nan'):.1f} se)",
                                  bool(se > 0 and drop > SE * se), table))
    out.append(C["fitted"].check("flipped fitted by ratio: " + ", ".join(
        f"{r.ratio:g}: {r.fitted:.2f}" for r in noisy.itertuples()), bool((noisy.fitted >= FIT).all())))
    gap = (noisy.ink_flipped - noisy.ink_clean).abs()
    out.append(C["attend"].check("|ink mass flipped - clean| by ratio: " + ", ".join(
        f"{r:g}: {v:.3f}" for r, v in zip(noisy.ratio, gap)), bool((gap <= ATTEND).all())))
    dc = (noisy.corr_mm - c.corr_mm).abs()
    out.append(C["svm"].check(
        f"median corr(W, W_mm): clean {c.corr_mm:.3f}; " + ", ".join(
            f"{r.ratio:g}: {r.corr_mm:.3f}" for r in noisy.itertuples())
        + f"; certified {ps.certified.min():.2f}-{ps.certified.max():.2f}",
        bool((dc <= SVM).all() and (ps.certified == 1).all())))
    return out


def plot(tables: dict, cfg: dict, out) -> list:
    from pathlib import Path

    from attnsvm.realdata.vit import plot_label_noise

    if out is None:
        return [plot_label_noise(tables)]
    return [Path(plot_label_noise(tables, Path(out) / "benign_vit.png"))]


_BASE = dict(optimizer="sgd", ratios=(0.0, 0.1, 0.2, 0.4), seed=0, layers=1, probe=32)
EXPERIMENT = Experiment(
    name="benign-vit",
    title="attnsvm: the digits ViT trained on flipped labels (label noise on real data)",
    claim="Trained on flipped labels, the digits ViT's clean test accuracy, its memorisation of "
          "the flipped labels, the tokens flipped samples attend to and its heads' SVM alignment, "
          "against the clean run (attnsvm's findings; no paper claim).",
    configs={
        "tiny": dict(_BASE, ratios=(0.0, 0.4), seeds=2, epochs=1, n_train=120, probe=8),
        "quick": dict(_BASE, seeds=3, epochs=30, n_train=None),
        "full": dict(_BASE, seeds=5, epochs=100, n_train=None),
    },
    compute=compute, judge=judge, plot=plot, verdicts=tuple(CLAIMS.values()), in_default=False,
    deviations=(
        "Not a reproduction: Sakamoto & Sato's real-data runs fine-tune pretrained ViT / BERT "
        "backbones on MNIST, CIFAR-10, AG-news and TREC (not shipped offline); this is the "
        "bundled 8x8 digits with a small ViT trained from scratch (attnsvm vit), symmetric "
        "label noise, and attnsvm's own thresholds (SE, FIT, ATTEND, SVM).",
        "Not in the default `attnsvm reproduce`: quick scale is 4 ratios x 3 seeds x 30 epochs "
        "(one seed's 4 runs took 490 s on the shared 2-core machine at load ~15).",
    ),
)
