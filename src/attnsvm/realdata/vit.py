"""A small vision transformer on scikit-learn's bundled digits, trained by SGD, SNGD and
l_p mirror descent, with the attention-selection statistics of docs/theory.md §7 along the run.

Data: ``sklearn.datasets.load_digits`` (1,797 8x8 images, 10 classes, shipped with
scikit-learn, no download). Each image (pixels / 16) is cut into 16 patches of 2x2
pixels (a 4x4 grid, row-major), so a sequence has T = 17 tokens: [CLS] + 16 patches.

Model (:class:`DigitsViT`, pre-LN, nanoGPT style): token embedding + position embedding,
``layers`` blocks ``x <- x + Attn(LN(x)); x <- x + MLP(LN(x))`` and a linear classifier
on the final [CLS] state. The LayerNorm in front of attention has no affine parameters,
so the attention logits of head h are exactly

    a_{k t} = u_k^T W_QK^h u_t,   W_QK^h = W_Q^h (W_K^h)^T / sqrt(d_head),   u = LN(x)

(query k on the left). In the convention of docs/theory.md a_{kt} = x_t^T W z with z the query,
i.e. W = (W_QK^h)^T; the Frobenius norm is the same. Tokens after LN have norm
sqrt(dim), so the only way attention can sharpen is ||W_QK|| growing, the quantity the
max-margin theory tracks.

Recorded per epoch (tidy DataFrames): train/test accuracy and loss; per layer and head
the [CLS] attention soft-sparsity 1/||s||_2^2 (docs/theory.md §7, between 1 and T = 17,
averaged over the test images), the mean max [CLS] attention and ||W_QK^h||_F.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from attnsvm.realdata.optim import make_optimizer

__all__ = [
    "ViTConfig",
    "ViTResults",
    "DigitsViT",
    "digits_tokens",
    "soft_sparsity",
    "train_vit",
    "run_vit",
    "QUICK",
    "FULL",
]

PATCH = 2  # patch side in pixels
GRID = 8 // PATCH  # 4x4 patch grid


# ----------------------------------------------------------------------------- metrics
def soft_sparsity(s: torch.Tensor) -> torch.Tensor:
    """Soft-sparsity 1 / ||s||_2^2 along the last dim (docs/theory.md §7); 1 = one-hot, T = uniform."""
    try:  # the core's metric when it is available
        from attnsvm.metrics import soft_sparsity as core_soft_sparsity
    except ImportError:  # pragma: no cover - only while the core is missing
        return 1.0 / (s * s).sum(-1)
    return core_soft_sparsity(s)


# ----------------------------------------------------------------------------- data
def digits_tokens(test_fraction: float = 0.3, split_seed: int = 0):
    """Digits as patch tokens: returns (X_train, y_train, X_test, y_test, img_test).

    X: (n, 16, 4) float64 numpy, patch j = pixels [2r:2r+2, 2c:2c+2] with j = 4 r + c,
    values in [0, 1]; y: (n,) int labels 0..9; img_test: (n_test, 8, 8) test images.
    The split is stratified and fixed by ``split_seed`` (independent of training seeds).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    imgs = d.images.astype(np.float64) / 16.0  # (1797, 8, 8)
    n = imgs.shape[0]
    patches = imgs.reshape(n, GRID, PATCH, GRID, PATCH).transpose(0, 1, 3, 2, 4)
    X = patches.reshape(n, GRID * GRID, PATCH * PATCH)
    idx_tr, idx_te = train_test_split(
        np.arange(n), test_size=test_fraction, random_state=split_seed, stratify=d.target
    )
    return X[idx_tr], d.target[idx_tr], X[idx_te], d.target[idx_te], imgs[idx_te]


# ----------------------------------------------------------------------------- model
class Attention(nn.Module):
    """Multi-head self-attention with explicit per-head W_Q, W_K, W_V of shape (H, dim, d_head).

    logits[b, h, k, t] = u_k^T W_Q^h (W_K^h)^T u_t / sqrt(d_head), k = query, t = key.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads; got dim={dim}, heads={heads}")
        self.heads, self.d_head = heads, dim // heads
        std = dim**-0.5
        self.W_Q = nn.Parameter(torch.randn(heads, dim, self.d_head) * std)
        self.W_K = nn.Parameter(torch.randn(heads, dim, self.d_head) * std)
        self.W_V = nn.Parameter(torch.randn(heads, dim, self.d_head) * std)
        self.proj = nn.Linear(dim, dim)

    def W_QK(self) -> torch.Tensor:
        """Per-head key-query matrices W_Q^h (W_K^h)^T / sqrt(d_head): (H, dim, dim)."""
        return self.W_Q @ self.W_K.transpose(-1, -2) / math.sqrt(self.d_head)

    def forward(self, u: torch.Tensor):
        """u: (B, T, dim) -> (output (B, T, dim), attention (B, H, T, T))."""
        q = torch.einsum("btd,hde->bhte", u, self.W_Q)
        k = torch.einsum("btd,hde->bhte", u, self.W_K)
        v = torch.einsum("btd,hde->bhte", u, self.W_V)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d_head), dim=-1)
        out = (att @ v).transpose(1, 2).reshape(u.shape[0], u.shape[1], -1)
        return self.proj(out), att


class Block(nn.Module):
    """Pre-LN transformer block; the LN before attention has no affine parameters."""

    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x):
        a, att = self.attn(self.ln1(x))
        x = x + a
        return x + self.mlp(self.ln2(x)), att


class DigitsViT(nn.Module):
    """[CLS] + 16 patch tokens -> ``layers`` pre-LN blocks -> linear classifier on [CLS].

    forward(X (B, 16, 4)) -> (logits (B, 10), [attention (B, H, 17, 17) per layer]).
    """

    def __init__(self, dim=32, heads=2, layers=1, mlp=64, n_classes=10, patch_dim=4, n_patches=16):
        super().__init__()
        self.embed = nn.Linear(patch_dim, dim)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, heads, mlp) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, X):
        x = self.embed(X)
        x = torch.cat([self.cls.expand(X.shape[0], -1, -1), x], dim=1) + self.pos
        atts = []
        for blk in self.blocks:
            x, att = blk(x)
            atts.append(att)
        return self.head(self.ln_f(x[:, 0])), atts

    def W_QK(self) -> list[torch.Tensor]:
        """Per layer, the (H, dim, dim) key-query matrices W_Q^h (W_K^h)^T / sqrt(d_head)."""
        return [blk.attn.W_QK() for blk in self.blocks]


# ----------------------------------------------------------------------------- config
DEFAULT_LR = {
    # Chosen by a short sweep (30 epochs, batch 32, seed 0, 1 layer; final test accuracy):
    #   sgd   0.03: .78  0.1: .86  0.3: .70  1.0: .73
    #   sngd  0.003: .42  0.01: .79  0.03: .91  0.1: .80
    #   md1.1 3e-4: .12  1e-3: .16  3e-3: .49  0.01: .65  0.03: .76  0.1: .72
    #   md3   0.1: .74  0.3: .65  1.0: .10 (stuck)  3.0: .10 (diverged)
    # l_1.1 mirror descent needs a larger lr than its dual-space scale suggests: weights
    # near 0 barely move (dW = |U|^{(2-p)/(p-1)} dU / (p-1)), small ones stay small.
    "sgd": 0.1,
    "sngd": 0.03,
    "md1.1": 0.03,
    "md2": 0.1,  # = SGD's learning rate: p = 2 mirror descent *is* SGD (a built-in check)
    "md3": 0.1,
}


@dataclass(frozen=True)
class ViTConfig:
    """Configuration of :func:`run_vit`.

    optimizers: names for :func:`attnsvm.realdata.optim.make_optimizer`
      ("sgd", "sngd", ``"md<p>"``); lr: learning rate per optimiser (defaults ``DEFAULT_LR``);
    all optimisers get the same budget: ``epochs`` passes of mini-batches of
    ``batch_size`` over the same fixed training split, same initialisation per seed.
    map_epochs: epochs at which [CLS] attention maps of ``map_images`` test images are
      stored (seed ``seeds[0]`` only); None = (0, epochs // 4, epochs).
    """

    optimizers: tuple[str, ...] = ("sgd", "sngd", "md1.1", "md2", "md3")
    lr: dict = field(default_factory=lambda: dict(DEFAULT_LR))
    seeds: tuple[int, ...] = (0, 1, 2)
    epochs: int = 30
    batch_size: int = 32
    dim: int = 32
    heads: int = 2
    layers: int = 1
    mlp: int = 64
    test_fraction: float = 0.3
    split_seed: int = 0
    map_epochs: tuple[int, ...] | None = None
    map_images: int = 4
    threads: int | None = 1  # torch CPU threads during the run (restored after); 1 is fastest
    dtype: str = "float32"  # 3-4x faster than float64 on CPU for this small network

    def epochs_for_maps(self) -> tuple[int, ...]:
        """The epochs whose attention maps are drawn: ``map_epochs`` within [0, epochs], or by
        default the start, a quarter of the run and the end."""
        if self.map_epochs is not None:
            return tuple(e for e in self.map_epochs if 0 <= e <= self.epochs)
        return tuple(sorted({0, self.epochs // 4, self.epochs}))


QUICK = ViTConfig()
FULL = ViTConfig(seeds=(0, 1, 2, 3, 4), epochs=100, layers=2)


@dataclass
class ViTResults:
    """Output of :func:`run_vit`.

    history: one row per (optimizer, seed, epoch): lr, train_loss, train_acc, test_acc,
      soft_sparsity (last layer, mean over heads and test images), wqk_norm (last layer,
      sqrt(sum_h ||W_QK^h||_F^2)).
    layers: one row per (optimizer, seed, epoch, layer, head): soft_sparsity, max_attn
      (mean over test images of the [CLS] max attention), wqk_norm (||W_QK^h||_F).
    maps: one row per (optimizer, epoch, image, patch): [CLS] attention of the last layer
      averaged over heads, on the 4x4 grid (row, col), for seed ``seeds[0]``.
    table: per optimiser final train/test accuracy, sparsity and norm (mean, std over seeds).
    summary: sentences computed from the run (nothing is written in).
    figures: paths of the saved PNGs (empty without ``out``).
    """

    config: ViTConfig
    history: pd.DataFrame
    layers: pd.DataFrame
    maps: pd.DataFrame
    table: pd.DataFrame
    summary: list[str]
    figures: dict[str, str]
    seconds: float

    def __repr__(self) -> str:
        opts = list(dict.fromkeys(self.history.optimizer)) if len(self.history) else []
        return (f"ViTResults(optimizers={opts}, history={len(self.history)} rows, "
                f"figures={list(self.figures)})")


# ----------------------------------------------------------------------------- training
@torch.no_grad()
def _evaluate(model, X, y):
    logits, atts = model(X)
    loss = float(nn.functional.cross_entropy(logits, y))
    acc = float((logits.argmax(-1) == y).double().mean())
    return loss, acc, atts


def train_vit(
    optimizer: str,
    lr: float,
    seed: int,
    data,
    config: ViTConfig = QUICK,
    device=None,
    dtype=torch.float64,
    labels=None,
    on_record=None,
):
    """Train one DigitsViT; returns (history rows, layer rows, map rows) as lists of dicts.

    data = digits_tokens(...). The initialisation and the mini-batch order depend only on
    ``seed``, so different optimisers with the same seed start from the same weights and
    see the same batches. ``labels``: the training labels to fit instead of data's (e.g.
    with flipped labels, :func:`flip_labels`; train_acc is then against them);
    ``on_record(epoch, model)``: called at every record (eval mode), e.g. for per-sample
    statistics (:func:`label_noise_study`).
    """
    X_tr, y_tr, X_te, y_te, _ = data
    if labels is not None:
        y_tr = np.asarray(labels)
    Xtr = torch.as_tensor(X_tr, device=device, dtype=dtype)
    Xte = torch.as_tensor(X_te, device=device, dtype=dtype)
    ytr = torch.as_tensor(y_tr, device=device, dtype=torch.long)
    yte = torch.as_tensor(y_te, device=device, dtype=torch.long)
    torch.manual_seed(seed)
    model = DigitsViT(config.dim, config.heads, config.layers, config.mlp).to(device, dtype)
    opt = make_optimizer(optimizer, model.parameters(), lr)
    gen = torch.Generator().manual_seed(10_000 + seed)
    map_epochs = set(config.epochs_for_maps())
    hist, lay, maps = [], [], []

    def record(epoch):
        tr_loss, tr_acc, _ = _evaluate(model, Xtr, ytr)
        te_loss, te_acc, atts = _evaluate(model, Xte, yte)
        wqk = [w.detach() for w in model.W_QK()]
        for li, (att, w) in enumerate(zip(atts, wqk)):
            s_cls = att[:, :, 0, :]  # (n_test, H, T): the [CLS] query's attention
            ss = soft_sparsity(s_cls).mean(0)  # (H,)
            mx = s_cls.max(-1).values.mean(0)
            nrm = torch.linalg.matrix_norm(w)  # (H,)
            for h in range(att.shape[1]):
                lay.append(
                    dict(optimizer=optimizer, seed=seed, epoch=epoch, layer=li, head=h,
                         soft_sparsity=float(ss[h]), max_attn=float(mx[h]),
                         wqk_norm=float(nrm[h]))
                )
        last_ss = float(soft_sparsity(atts[-1][:, :, 0, :]).mean())
        last_norm = float(torch.linalg.vector_norm(wqk[-1]))
        finite = bool(np.isfinite(tr_loss))
        hist.append(
            dict(optimizer=optimizer, lr=lr, seed=seed, epoch=epoch, train_loss=tr_loss,
                 train_acc=tr_acc, test_acc=te_acc, test_loss=te_loss,
                 soft_sparsity=last_ss, wqk_norm=last_norm, finite=finite)
        )
        if on_record is not None:
            on_record(epoch, model)
        if epoch in map_epochs and seed == config.seeds[0]:
            a = atts[-1][: config.map_images, :, 0, 1:].mean(1)  # (images, 16) patches only
            for i in range(a.shape[0]):
                for j in range(a.shape[1]):
                    maps.append(
                        dict(optimizer=optimizer, epoch=epoch, image=i, patch=j,
                             row=j // GRID, col=j % GRID, attention=float(a[i, j]),
                             cls_self=float(atts[-1][i, :, 0, 0].mean()))
                    )
        return finite

    record(0)
    n = Xtr.shape[0]
    for epoch in range(1, config.epochs + 1):
        model.train()
        perm = torch.randperm(n, generator=gen).to(Xtr.device)
        for b in range(0, n, config.batch_size):
            idx = perm[b : b + config.batch_size]
            logits, _ = model(Xtr[idx])
            loss = nn.functional.cross_entropy(logits, ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        if not record(epoch):  # diverged: stop this run, keep what was recorded
            break
    return hist, lay, maps


# ----------------------------------------------------------------------------- analysis
def _spearman(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    return float(np.corrcoef(ra, rb)[0, 1])


def accuracy_table(history: pd.DataFrame) -> pd.DataFrame:
    """Final-epoch statistics per optimiser, mean and std over seeds."""
    last = history.sort_values("epoch").groupby(["optimizer", "seed"]).tail(1)
    g = last.groupby("optimizer", sort=False)
    out = pd.DataFrame(
        {
            "lr": g["lr"].first(),
            "seeds": g["seed"].nunique(),
            "epochs": g["epoch"].max(),
            "train_acc_mean": g["train_acc"].mean(),
            "train_acc_std": g["train_acc"].std(ddof=1),
            "test_acc_mean": g["test_acc"].mean(),
            "test_acc_std": g["test_acc"].std(ddof=1),
            "soft_sparsity_mean": g["soft_sparsity"].mean(),
            "soft_sparsity_std": g["soft_sparsity"].std(ddof=1),
            "wqk_norm_mean": g["wqk_norm"].mean(),
            "wqk_norm_std": g["wqk_norm"].std(ddof=1),
        }
    )
    order = list(dict.fromkeys(history.optimizer))  # the configuration's order
    return out.reindex(order).reset_index()


def _epochs_to(history, threshold):
    """Per (optimizer, seed): first epoch with test_acc >= threshold (NaN if never)."""
    rows = []
    for (o, s), df in history.groupby(["optimizer", "seed"], sort=False):
        hit = df.loc[df.test_acc >= threshold, "epoch"]
        rows.append(dict(optimizer=o, seed=s, epoch=float(hit.min()) if len(hit) else np.nan))
    return pd.DataFrame(rows)


def summarize(history: pd.DataFrame, layers: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """Plain-language findings, every number computed from the tables of this run."""
    out = []
    t = table.set_index("optimizer")
    for o, r in t.iterrows():
        out.append(
            f"{o} (lr {r.lr:g}): test accuracy {r.test_acc_mean:.3f} +- {r.test_acc_std:.3f}, "
            f"train {r.train_acc_mean:.3f}; final [CLS] soft-sparsity {r.soft_sparsity_mean:.2f} "
            f"(of T = 17), ||W_QK|| {r.wqk_norm_mean:.2f}"
        )
    # 1. sparsity vs norm, per run and layer-head, across epochs
    rhos = []
    for (o, _s, _l, _h), df in layers.groupby(["optimizer", "seed", "layer", "head"]):
        rhos.append(dict(optimizer=o, rho=_spearman(df.wqk_norm, df.soft_sparsity)))
    rho = pd.DataFrame(rhos).dropna()
    if len(rho):
        frac = float((rho.rho < 0).mean())
        per = rho.groupby("optimizer").rho.median()
        out.append(
            "Sparsity vs ||W_QK|| (Spearman over epochs, each run x layer x head; "
            "negative = attention sharpens as the norm grows): "
            f"{frac:.0%} of {len(rho)} curves negative, median rho per optimiser "
            + ", ".join(f"{o} {v:+.2f}" for o, v in per.items())
        )
    h0 = history[history.epoch == 0].groupby("optimizer").soft_sparsity.mean()
    hl = history.sort_values("epoch").groupby(["optimizer", "seed"]).tail(1)
    hl = hl.groupby("optimizer").soft_sparsity.mean()
    n0 = history[history.epoch == 0].groupby("optimizer").wqk_norm.mean()
    nl = history.sort_values("epoch").groupby(["optimizer", "seed"]).tail(1)
    nl = nl.groupby("optimizer").wqk_norm.mean()
    out.append(
        "Last-layer [CLS] soft-sparsity epoch 0 -> final (norm 0 -> final): "
        + "; ".join(
            f"{o} {h0[o]:.2f} -> {hl[o]:.2f} ({n0[o]:.2f} -> {nl[o]:.2f})" for o in hl.index
        )
    )
    flat = [o for o in hl.index
            if abs(nl[o] / n0[o] - 1) < 0.2 and h0[o] / max(hl[o], 1e-12) > 2]
    if flat:
        out.append(
            "Caveat: for " + ", ".join(flat) + " the soft-sparsity fell more than 2x while "
            "||W_QK|| changed by less than 20%: there the sharpening is not explained by norm "
            "growth: with LayerNorm'd tokens of fixed norm it comes from how the tokens and "
            "W_QK's direction align, not from the scale of W_QK."
        )
    # 2. SNGD vs SGD speed
    if {"sgd", "sngd"} <= set(t.index):
        thr = 0.9 * float(t.loc["sgd", "test_acc_mean"])
        e = _epochs_to(history, thr).groupby("optimizer").epoch
        em, es = e.mean(), e.std(ddof=1).fillna(0.0)
        miss = e.apply(lambda x: int(x.isna().sum()))
        pooled = math.sqrt((es["sgd"] ** 2 + es["sngd"] ** 2) / 2)
        diff = em["sgd"] - em["sngd"]
        verdict = ("SNGD faster" if diff > pooled else
                   "SNGD slower" if -diff > pooled else "no clear difference")
        out.append(
            f"Epochs to reach {thr:.3f} test accuracy (90% of SGD's final): "
            f"SGD {em['sgd']:.1f} +- {es['sgd']:.1f}, SNGD {em['sngd']:.1f} +- {es['sngd']:.1f}"
            + (f" (runs never reaching it: SGD {miss['sgd']}, SNGD {miss['sngd']})"
               if miss["sgd"] or miss["sngd"] else "")
            + f" -> {verdict} (difference vs one pooled std) at these learning rates."
        )
    # 3. mirror descent p = 1.1 vs the others
    md = [o for o in t.index if o.startswith("md")]
    if "md1.1" in md and len(md) > 1:
        others = [o for o in t.index if o != "md1.1"]
        a = t.loc["md1.1"]
        best_other = max(others, key=lambda o: t.loc[o, "test_acc_mean"])
        b = t.loc[best_other]
        gap = a.test_acc_mean - b.test_acc_mean
        pooled = math.sqrt((a.test_acc_std**2 + b.test_acc_std**2) / 2)
        sharper = [o for o in others if a.soft_sparsity_mean < t.loc[o, "soft_sparsity_mean"]]
        out.append(
            f"l_1.1 mirror descent: test accuracy {a.test_acc_mean:.3f} vs best other "
            f"({best_other}) {b.test_acc_mean:.3f}, difference {gap:+.3f} "
            f"({'within' if abs(gap) <= pooled else 'beyond'} one pooled std {pooled:.3f}); "
            f"its [CLS] attention is sparser than {len(sharper)} of {len(others)} other "
            f"optimisers ({', '.join(sharper) if sharper else 'none'})."
        )
    if {"sgd", "md2"} <= set(t.index) and t.loc["sgd", "lr"] == t.loc["md2", "lr"]:
        a = history[history.optimizer == "sgd"].set_index(["seed", "epoch"]).test_acc
        b = history[history.optimizer == "md2"].set_index(["seed", "epoch"]).test_acc
        diff = (a - b).abs()
        last = diff.xs(int(history.epoch.max()), level="epoch")
        out.append(
            f"md2 vs SGD (same lr, the same update in exact arithmetic): final test accuracy "
            f"differs by at most {float(last.max()):.2g} over seeds (any epoch: "
            f"{float(diff.max()):.2g}). torch.optim.SGD rounds W + (-lr) G differently from "
            f"W - lr G in ~1% of entries (1 ulp), and training amplifies that: the runs are "
            f"the same update rule, not the same trajectory.")
    return out


# ----------------------------------------------------------------------------- figures
def _colors(names):
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    return {o: cmap(i % 10) for i, o in enumerate(names)}


def plot_curves(history: pd.DataFrame, path=None):
    """2x2 figure: test accuracy, soft-sparsity, ||W_QK|| over epochs; sparsity vs norm.
    Saved to ``path`` (returned as a string) or, with ``path=None``, the Figure is returned."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(history.optimizer))
    col = _colors(names)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [
        ("test_acc", "test accuracy"),
        ("soft_sparsity", "[CLS] soft-sparsity 1/||s||² (last layer)"),
        ("wqk_norm", "||W_QK||_F (last layer)"),
    ]
    for ax, (key, label) in zip(axes.flat, panels):
        for o in names:
            g = history[history.optimizer == o].groupby("epoch")[key]
            m, s = g.mean(), g.std(ddof=1).fillna(0)
            # md2 is SGD (p = 2): dashed so that the overlapping curve stays visible
            ax.plot(m.index, m.values, color=col[o], label=o, ls="--" if o == "md2" else "-")
            ax.fill_between(m.index, m - s, m + s, color=col[o], alpha=0.2)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[1, 1]
    for o in names:
        d = history[history.optimizer == o]
        ax.scatter(d.wqk_norm, d.soft_sparsity, s=8, color=col[o], label=o, alpha=0.6)
    ax.set_xlabel("||W_QK||_F (last layer)")
    ax.set_ylabel("[CLS] soft-sparsity (last layer)")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("Digits ViT: accuracy, attention sparsity and key-query norm (mean ± std over seeds)")
    return _finish(fig, path, dpi=110)


def _finish(fig, path, dpi):
    """Save and close (returning the path) or, without a path, return the open Figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return str(path)


def plot_maps(maps: pd.DataFrame, images: np.ndarray, path=None):
    """Grid of [CLS] attention maps: one row per optimiser; per test image a column block
    [input image, attention at each stored epoch] (last layer, mean over heads). Saved to
    ``path`` or, with ``path=None``, the Figure is returned."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(maps.optimizer))
    epochs = sorted(maps.epoch.unique())
    imgs = sorted(maps.image.unique())
    block = 1 + len(epochs)
    nrow, ncol = len(names), len(imgs) * block
    fig, axes = plt.subplots(nrow, ncol, figsize=(1.25 * ncol, 1.45 * nrow + 0.8), squeeze=False)
    for r, o in enumerate(names):
        for b, i in enumerate(imgs):
            ax = axes[r, b * block]
            ax.imshow(images[i], cmap="gray_r")
            if r == 0:
                ax.set_title(f"test image {i}", fontsize=7)
            if b == 0:
                ax.set_ylabel(o, fontsize=8)
            for c, e in enumerate(epochs):
                d = maps[(maps.optimizer == o) & (maps.image == i) & (maps.epoch == e)]
                grid = np.zeros((GRID, GRID))
                grid[d.row.to_numpy(), d.col.to_numpy()] = d.attention.to_numpy()
                ax = axes[r, b * block + 1 + c]
                ax.imshow(grid, cmap="viridis", vmin=0, vmax=max(grid.max(), 1e-12))
                ax.set_xlabel(f"max {grid.max():.2f}", fontsize=6, labelpad=1)
                if r == 0:
                    ax.set_title(f"epoch {e}", fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("[CLS] attention on the 4x4 patch grid (last layer, mean over heads, first seed; "
                 "colour scaled to each map's max)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    if path is None:
        return fig
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


# ----------------------------------------------------------------------------- driver
def run_vit(config: ViTConfig | None = None, out=None, progress=None, device=None) -> ViTResults:
    """Train every (optimizer, seed) of ``config`` and collect tables, summary and figures.

    out: directory for history.csv, layers.csv, maps.csv, accuracy.csv/.md, summary.txt
    and the figures (None: nothing is written). progress: optional callable(str).
    """
    config = config or QUICK
    threads = torch.get_num_threads()
    if config.threads:  # this network is too small for intra-op threads to pay off
        torch.set_num_threads(config.threads)
    try:
        return _run_vit(config, out, progress, device)
    finally:
        torch.set_num_threads(threads)


def _run_vit(config: ViTConfig, out, progress, device) -> ViTResults:
    dtype = {"float64": torch.float64, "float32": torch.float32}[config.dtype]
    unknown = [o for o in config.optimizers if o not in config.lr]
    if unknown:
        raise ValueError(f"lr has no learning rate for optimizers {unknown}")
    t0 = time.perf_counter()
    data = digits_tokens(config.test_fraction, config.split_seed)
    H, L, M = [], [], []
    for o in config.optimizers:
        for s in config.seeds:
            h, l, m = train_vit(o, config.lr[o], s, data, config, device=device, dtype=dtype)
            H += h
            L += l
            M += m
            if progress:
                progress(f"{o} seed {s}: test acc {h[-1]['test_acc']:.3f} "
                         f"({time.perf_counter() - t0:.0f}s)")
    history, layers, maps = pd.DataFrame(H), pd.DataFrame(L), pd.DataFrame(M)
    table = accuracy_table(history)
    summary = summarize(history, layers, table)
    figures: dict[str, str] = {}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        history.to_csv(out / "history.csv", index=False)
        layers.to_csv(out / "layers.csv", index=False)
        maps.to_csv(out / "maps.csv", index=False)
        table.to_csv(out / "accuracy.csv", index=False)
        (out / "accuracy.md").write_text(format_table(table) + "\n")
        figures["curves"] = plot_curves(history, out / "vit_curves.png")
        if len(maps):
            figures["maps"] = plot_maps(maps, data[4], out / "vit_attention_maps.png")
        cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
        (out / "summary.txt").write_text(
            f"config: {cfg}\n\n" + "\n".join(summary) + "\n"
        )
    return ViTResults(config, history, layers, maps, table, summary, figures,
                      time.perf_counter() - t0)


def format_table(table: pd.DataFrame) -> str:
    """Markdown accuracy table, mean +- std over seeds."""
    lines = [
        "| optimizer | lr | seeds | train acc | test acc | [CLS] soft-sparsity | ‖W_QK‖_F |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r.optimizer} | {r.lr:g} | {r.seeds} | {r.train_acc_mean:.3f} ± {r.train_acc_std:.3f} "
            f"| {r.test_acc_mean:.3f} ± {r.test_acc_std:.3f} "
            f"| {r.soft_sparsity_mean:.2f} ± {r.soft_sparsity_std:.2f} "
            f"| {r.wqk_norm_mean:.2f} ± {r.wqk_norm_std:.2f} |"
        )
    return "\n".join(lines)


def config_from(full: bool = False, **overrides) -> ViTConfig:
    """QUICK or FULL with the given fields replaced (None values are ignored)."""
    base = FULL if full else QUICK
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


# ----------------------------------------------------------------------------- label noise
#: a patch is "ink" when its mean intensity (pixels / 16) is at least this, else "blank"
INK = 0.25
#: token kinds of a digits sequence: [CLS], an ink patch, a blank patch
TOKEN_KINDS = ("cls", "ink", "blank")


def flip_labels(y, ratio: float, seed: int, n_classes: int = 10):
    """Symmetric label noise: round(ratio n) training samples, chosen at random, get a label
    drawn uniformly from the *other* n_classes - 1 classes. The choice is nested across
    ratios for one seed (the samples flipped at 0.1 are among those flipped at 0.2, with the
    same wrong label). Returns (observed labels (n,), flipped (n,) bool)."""
    if not (isinstance(ratio, (int, float)) and 0 <= ratio < 1):
        raise ValueError(f"label noise ratio must be a number in [0, 1); got {ratio!r}")
    y = np.asarray(y)
    n = len(y)
    rng = np.random.default_rng(20_000 + int(seed))
    order, shift = rng.permutation(n), rng.integers(1, n_classes, size=n)
    flipped = np.zeros(n, bool)
    flipped[order[:int(round(ratio * n))]] = True
    return np.where(flipped, (y + shift) % n_classes, y), flipped


def token_kinds(X) -> np.ndarray:
    """(n, 17) the kind of every token (``TOKEN_KINDS`` codes): [CLS] 0, then each patch of
    X (n, 16, 4): ink (1) when its mean intensity is >= ``INK``, blank (2) otherwise."""
    ink = np.asarray(X).mean(-1) >= INK
    return np.concatenate([np.zeros((len(ink), 1), np.int64), np.where(ink, 1, 2)], axis=1)


def digits_extractor(module, args, kwargs):
    """:mod:`attnsvm.track` extractor of :class:`Attention`: the LayerNorm'd tokens u and the
    per-head maps q_h = W_Q[h]^T u, k_h = W_K[h]^T u, scale 1 / sqrt(d_head)."""
    from attnsvm.track import AttentionCall

    u = args[0] if args else kwargs["u"]
    return AttentionCall(hidden=u, W_q=module.W_Q.transpose(1, 2), W_k=module.W_K.transpose(1, 2),
                         scale=1.0 / math.sqrt(module.d_head))


def _noise_stats(model, X, y_obs, y_true, flipped, kinds) -> dict:
    """Per-record statistics of one run on its training set (module section above)."""
    with torch.no_grad():
        logits, atts = model(X)
    pred = logits.argmax(-1).cpu().numpy()
    s = atts[-1][:, :, 0, :].mean(1).double().cpu().numpy()  # (n, 17) [CLS] attention
    ok = pred == y_obs
    out = {"train_acc": ok.mean()}
    for part, m in (("clean", ~flipped), ("flipped", flipped)):
        cnt = max(int(m.sum()), 1)
        out[f"train_acc_{part}"] = ok[m].sum() / cnt if m.any() else np.nan
        top = kinds[m, s[m].argmax(-1)] if m.any() else np.zeros(0, np.int64)
        for k, name in enumerate(TOKEN_KINDS):
            out[f"att_{name}_{part}"] = float(np.mean(top == k)) if m.any() else np.nan
        out[f"ink_mass_{part}"] = float((s[m] * (kinds[m] == 1)).sum(-1).mean()) if m.any() else np.nan
    out["flipped_true"] = float(np.mean(pred[flipped] == y_true[flipped])) if flipped.any() else np.nan
    return out


def label_noise_study(ratios=(0.0, 0.1, 0.2, 0.4), config: ViTConfig = QUICK, n_train=None,
                      probe: int = 32, progress=None, device=None) -> dict:
    """The digits ViT trained on flipped labels (:func:`flip_labels`), one run per (ratio,
    seed) with the first optimiser of ``config`` (same initialisation and batches per seed
    across ratios), against the clean run (ratio 0).

    Tables: ``history`` one row per (ratio, seed, epoch): test_acc / test_loss (clean test
    set), train_acc (against the observed labels), train_acc_clean, train_acc_flipped (the
    flipped samples fitted to their wrong label), flipped_true (flipped samples predicted as
    their true class), ``att_<kind>_<part>`` (the share of clean / flipped training samples whose
    most-attended token of the last layer's [CLS] attention, mean over heads, is the [CLS],
    an ink or a blank patch, :func:`token_kinds`) and ``ink_mass_<part>`` (the attention mass on
    ink patches); ``track``: :class:`attnsvm.track.Tracker` rows (corr_mm, status, ...) per
    (ratio, seed, epoch, layer, head) at the first and last epoch, on the first ``probe``
    training images (the model in float64); ``flips``: per (ratio, seed) the number of
    flipped labels and whether each differs from the true one. ``n_train``: use the first
    n_train training samples only (tests)."""
    import copy

    from attnsvm.track import TrackConfig, Tracker

    ratios = tuple(float(r) for r in ratios)
    for r in ratios:
        if not 0 <= r < 1:
            raise ValueError(f"label noise ratios must be in [0, 1); got {r!r}")
    dtype = {"float64": torch.float64, "float32": torch.float32}[config.dtype]
    opt = config.optimizers[0]
    if opt not in config.lr:
        raise ValueError(f"lr has no learning rate for optimizer {opt!r}")
    X_tr, y_tr, X_te, y_te, img = digits_tokens(config.test_fraction, config.split_seed)
    if n_train is not None:
        X_tr, y_tr = X_tr[:n_train], y_tr[:n_train]
    kinds = token_kinds(X_tr)
    Xtr = torch.as_tensor(X_tr, device=device, dtype=dtype)
    probe_x = torch.as_tensor(X_tr[:probe], device=device, dtype=torch.float64)
    last = config.epochs
    hist, track, flips = [], [], []
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        for r in ratios:
            for seed in config.seeds:
                y_obs, fl = flip_labels(y_tr, r, seed)
                flips.append(dict(ratio=r, seed=seed, n=len(y_tr), flips=int(fl.sum()),
                                  changed=int((y_obs != y_tr).sum()), expected=int(round(r * len(y_tr)))))
                extra = {}

                def on_record(epoch, model, fl=fl, y_obs=y_obs, extra=extra, r=r, seed=seed):
                    extra[epoch] = _noise_stats(model, Xtr, y_obs, y_tr, fl, kinds)
                    if epoch in (0, last):
                        m64 = copy.deepcopy(model).double()
                        tr = Tracker(m64, probe_x, budget=None, extractors={Attention: digits_extractor},
                                     config=TrackConfig(max_queries=8, null_draws=0),
                                     tags={"ratio": r, "seed": seed})
                        track.append(tr.record(epoch))

                h, _, _ = train_vit(opt, config.lr[opt], seed, (X_tr, y_tr, X_te, y_te, img), config,
                                    device=device, dtype=dtype, labels=y_obs, on_record=on_record)
                for row in h:
                    hist.append({"ratio": r, "seed": seed, "epoch": row["epoch"], "optimizer": opt,
                                 "test_acc": row["test_acc"], "test_loss": row["test_loss"],
                                 **extra[row["epoch"]]})
                if progress:
                    progress(f"label noise {r:g} seed {seed}: test acc {h[-1]['test_acc']:.3f}, "
                             f"flipped fitted {extra[h[-1]['epoch']]['train_acc_flipped']:.2f}")
    finally:
        torch.set_num_threads(threads)
    return {"history": pd.DataFrame(hist), "track": pd.concat(track, ignore_index=True),
            "flips": pd.DataFrame(flips)}


def plot_label_noise(tables: dict, path=None):
    """2x2: clean test accuracy over epochs per noise ratio; flipped samples fitted (solid)
    and predicted as their true class (dashed); the final attention mass on ink patches of
    clean and flipped samples; the tracker's corr(W, W_mm) per ratio at the first and last
    epoch (median over heads, one point per seed). Saved to ``path`` or returned."""
    import matplotlib.pyplot as plt

    h, tr = tables["history"], tables["track"]
    ratios = sorted(h.ratio.unique())
    col = {r: plt.get_cmap("viridis")(i / max(len(ratios) - 1, 1)) for i, r in enumerate(ratios)}
    fig, ax = plt.subplots(2, 2, figsize=(10, 7.5))
    for r in ratios:
        g = h[h.ratio == r].groupby("epoch")
        m = g.test_acc.mean()
        ax[0, 0].plot(m.index, m.values, color=col[r], label=f"noise {r:g}")
        if r > 0:
            ax[0, 1].plot(m.index, g.train_acc_flipped.mean().values, color=col[r], label=f"{r:g}: fitted")
            ax[0, 1].plot(m.index, g.flipped_true.mean().values, "--", color=col[r],
                          label=f"{r:g}: true class")
    ax[0, 0].set(xlabel="epoch", ylabel="clean test accuracy", title="test accuracy")
    ax[0, 1].set(xlabel="epoch", ylabel="share of flipped samples",
                 title="flipped: fitted (solid) / true class (dashed)")
    fin = h[h.epoch == h.epoch.max()].groupby("ratio")
    x = np.arange(len(ratios))
    ax[1, 0].bar(x - 0.2, fin.ink_mass_clean.mean().reindex(ratios), 0.4, label="clean samples")
    ax[1, 0].bar(x + 0.2, fin.ink_mass_flipped.mean().reindex(ratios).fillna(0), 0.4,
                 label="flipped samples")
    ax[1, 0].set(xticks=x, xticklabels=[f"{r:g}" for r in ratios], xlabel="noise ratio",
                 ylabel="[CLS] attention mass on ink patches", title="final epoch, last layer")
    med = tr.groupby(["ratio", "seed", "step"]).corr_mm.median().reset_index()
    for k, step in enumerate(sorted(med.step.unique())):
        d = med[med.step == step]
        ax[1, 1].plot(d.ratio.map({r: i for i, r in enumerate(ratios)}) + (k - 0.5) * 0.15,
                      d.corr_mm, "o" if k else "x", label=f"epoch {step}")
    ax[1, 1].set(xticks=x, xticklabels=[f"{r:g}" for r in ratios], xlabel="noise ratio",
                 ylabel="median corr(W, W_mm) over heads",
                 title="tracker: SVM alignment (one point per seed)")
    for a in ax.flat:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle("Digits ViT with flipped training labels (mean over seeds)")
    return _finish(fig, path, dpi=100)
