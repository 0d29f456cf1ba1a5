"""Label noise and the generalisation of token selection (issue 35; docs/benign.md).

Two papers study the prompt-attention model f(X) = nu^T X^T softmax(X W^T p) under label
noise:

- Sakamoto & Sato, "Benign Overfitting in Token Selection of Attention Mechanism" (ICML 2025,
  arXiv 2409.17625) -- :func:`sakamoto_sato`, the synthetic generator of their public code
  (GitHub ``keitaroskmt/benign-attention``, ``main.py``);
- Magen, Shang, Xu, Frei, Hu, Vardi, "Benign Overfitting in Single-Head Attention"
  (NeurIPS 2025, arXiv 2410.07746) -- :func:`two_token`, a two-token signal / noise reading
  of their abstract (their text was not available to this reproduction; see the function).

A dataset is a :class:`NoisyLabels`: the training :class:`~attnsvm.data.TokenData` with the
*observed* labels (some flipped), the clean labels, which samples were flipped, the role
of every token position (signal / weakly relevant / noise) and a held-out test set with
clean labels. :func:`generalisation` turns a run's recorded prompts into the metrics the
papers plot (test accuracy and loss, train accuracy on clean and on flipped samples, which
role each sample attends to), batched over trials.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .data import TokenData, load_arrays
from .generalisation import ROLES, columns

__all__ = ["ROLES", "NoisyLabels", "sakamoto_sato", "two_token", "predict", "generalisation"]


@dataclass(frozen=True, eq=False)
class NoisyLabels:
    """A label-noise dataset (batched over B trials).

    Fields:
        train:   TokenData, X (B, n, T, d), y (B, n) the *observed* labels (flipped where
                 ``flipped``), v (B, d) the fixed head nu;
        clean_y: (B, n) the labels before flipping (y = clean_y * (1 - 2 flipped));
        flipped: (B, n) bool, the samples whose label was flipped;
        roles:   (T,) int, ``ROLES[roles[t]]`` is the role of token position t;
        test:    TokenData (B, m, T, d) with clean labels, drawn independently of train;
        meta:    the generator's name and arguments (stored with the data).
    """

    train: TokenData
    clean_y: np.ndarray
    flipped: np.ndarray
    roles: np.ndarray
    test: TokenData
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not (self.train.batched and self.test.batched):
            raise ValueError("NoisyLabels needs batched train and test TokenData (B, n, T, d)")
        B, n, T = self.train.B, self.train.n, self.train.T
        flipped = np.asarray(self.flipped, dtype=bool)
        clean = np.asarray(self.clean_y, dtype=np.float64)
        if flipped.shape != (B, n) or clean.shape != (B, n):
            raise ValueError(f"flipped and clean_y must have shape (B, n) = ({B}, {n}); got "
                             f"{flipped.shape}, {clean.shape}")
        if not np.array_equal(np.where(flipped, -clean, clean), self.train.y):
            raise ValueError("train.y must equal clean_y with the flipped samples negated")
        roles = np.asarray(self.roles, dtype=np.int64)
        if roles.shape != (T,) or roles.min() < 0 or roles.max() >= len(ROLES):
            raise ValueError(f"roles must be (T,) = ({T},) codes in 0..{len(ROLES) - 1}; got {roles}")
        if self.test.B != B or self.test.T != T or self.test.d != self.train.d:
            raise ValueError(f"test must have B = {B}, T = {T}, d = {self.train.d}; got X "
                             f"{self.test.X.shape}")
        object.__setattr__(self, "flipped", flipped)
        object.__setattr__(self, "clean_y", clean)
        object.__setattr__(self, "roles", roles)

    @property
    def noise_ratio(self) -> np.ndarray:
        """(B,) the share of flipped training labels per trial."""
        return self.flipped.mean(1)

    def save(self, path) -> Path:
        """Write to ``path`` (.npz, no pickles; written under a temporary name, then renamed)."""
        path = Path(path)
        if not path.parent.is_dir():
            raise ValueError(f"{path}: cannot write: the folder {path.parent} does not exist")
        arrays = dict(X=self.train.X, y=self.train.y, v=self.train.v, clean_y=self.clean_y,
                      flipped=self.flipped, roles=self.roles, X_test=self.test.X,
                      y_test=self.test.y, meta_keys=np.array(list(self.meta), dtype=str),
                      meta_values=np.array([repr(v) for v in self.meta.values()], dtype=str))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    @classmethod
    def load(cls, path) -> NoisyLabels:
        """Read a file written by :meth:`save` (``allow_pickle=False``); meta values come
        back as their repr strings."""
        a = load_arrays(path, required=("X", "y", "v", "clean_y", "flipped", "roles", "X_test",
                                        "y_test"), optional=("meta_keys", "meta_values"))
        meta = dict(zip(a.get("meta_keys", []).tolist(), a.get("meta_values", []).tolist()))
        try:
            return cls(TokenData(X=a["X"], y=a["y"], v=a["v"]), a["clean_y"], a["flipped"],
                       a["roles"], TokenData(X=a["X_test"], y=a["y_test"], v=a["v"]), meta)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def _check(name, value, ok, expected):
    if not ok:
        raise ValueError(f"{name} must be {expected}; got {value!r}")


def _flip_count(n: int, noise_ratio: float) -> int:
    """Flipped samples per dataset, as the public code: ceil(n * ratio), rounded down to an
    even number split equally between the two classes."""
    return 2 * (int(np.ceil(n * noise_ratio - 1e-12)) // 2)


def sakamoto_sato(n: int = 20, T: int = 8, d: int = 2000, signal_norm: float = 20.0,
                  rho: float = 0.1, noise_ratio: float = 0.2, n_test: int = 1000, seed: int = 0,
                  batch: int = 1) -> NoisyLabels:
    """Sakamoto & Sato's synthetic label-noise data (public code ``main.py``, final version).

    Signal vectors mu_1 = s e_1, mu_2 = s e_2 (s = ``signal_norm``); a sample of clean label
    y in {+1, -1} has class vector mu_y (mu_{+1} = mu_1, mu_{-1} = mu_2) and tokens
    (numbered from 0; every token has its own xi ~ N(0, I_d)):

        x_0 = xi + mu_y             the relevant (signal) token
        x_1 = xi + rho mu_y         weakly relevant, aligned with the class
        x_2 = xi + rho mu_{-y}      weakly relevant, aligned with the other class
        x_t = xi  (t >= 3)          irrelevant (noise) tokens

    Labels are balanced (the first n // 2 samples +1, the rest -1); k = ceil(n * ratio)
    rounded down to even samples are flipped, k / 2 in each class (as the code does).
    The head is fixed: nu = (mu_1 - mu_2) / ||mu_1 - mu_2|| / s. The test set (``n_test``
    samples, same construction, balanced, clean labels) is drawn independently of the
    training set. Each of the B = ``batch`` trials draws its own train and test data.

    Departures from the code: float64 (the code: float32); the code's test set reuses the
    training seed, so its first n test samples share the training samples' noise; here
    the test set is independent; the flipped samples are placed at random positions within
    each class (the code flips the first k / 2 of each class: the same up to order).
    """
    for nm, v, lo in (("n", n, 2), ("T", T, 3), ("d", d, 2), ("n_test", n_test, 2),
                      ("batch", batch, 1)):
        _check(nm, v, isinstance(v, (int, np.integer)) and v >= lo, f"an integer >= {lo}")
    _check("signal_norm", signal_norm, np.isfinite(signal_norm) and signal_norm > 0, "> 0")
    _check("rho", rho, np.isfinite(rho) and rho > 0, "> 0 (the code's assertion)")
    _check("noise_ratio", noise_ratio, 0 <= noise_ratio < 0.5, "in [0, 0.5)")
    rng = np.random.default_rng(seed)
    B = int(batch)
    mu = np.zeros((2, d))
    mu[0, 0] = mu[1, 1] = signal_norm
    nu = (mu[0] - mu[1]) / np.linalg.norm(mu[0] - mu[1]) / signal_norm

    def draw(m: int, k: int):
        y = np.where(np.arange(m) < m // 2, 1.0, -1.0)
        X = rng.standard_normal((B, m, T, d))
        own = np.where(y[:, None] > 0, mu[0], mu[1])  # (m, d) mu_y
        other = np.where(y[:, None] > 0, mu[1], mu[0])
        X[:, :, 0] += own
        X[:, :, 1] += rho * own
        X[:, :, 2] += rho * other
        flipped = np.zeros((B, m), bool)
        for b in range(B):
            for cls in (np.flatnonzero(y > 0), np.flatnonzero(y < 0)):
                flipped[b, rng.choice(cls, k // 2, replace=False)] = True
        return X, np.broadcast_to(y, (B, m)).copy(), flipped

    X, yc, flipped = draw(n, _flip_count(n, noise_ratio))
    Xt, yt, _ = draw(n_test, 0)
    v = np.broadcast_to(nu, (B, d))
    roles = np.array([0, 1, 2] + [3] * (T - 3))
    meta = dict(generator="sakamoto_sato", n=n, T=T, d=d, signal_norm=signal_norm, rho=rho,
                noise_ratio=noise_ratio, n_test=n_test, seed=seed)
    return NoisyLabels(TokenData(X=X, y=np.where(flipped, -yc, yc), v=v), yc, flipped, roles,
                       TokenData(X=Xt, y=yt, v=v), meta)


def two_token(n: int = 200, d: int = 2000, snr: float = 1.0, noise_ratio: float = 0.1,
              n_test: int = 1000, seed: int = 0, batch: int = 1) -> NoisyLabels:
    """Two-token signal / noise data with flipped labels (attnsvm's reading of Magen et al.'s
    abstract: "the signal-to-noise ratio (SNR) of the data distribution, namely, the ratio
    between norms of signal and noise tokens").

    Orthogonal class vectors mu_{+1} = r e_1, mu_{-1} = r e_2 with r = snr * sqrt(d); token
    0 (signal) is mu_y, token 1 (noise) is xi ~ N(0, I_d) restricted to the complement of
    span(e_1, e_2), so ||x_0|| / E||x_1|| ~ snr. ``round(n * noise_ratio)`` samples (at
    random positions) have their label flipped. Head nu = (e_1 - e_2) / sqrt(2) (the
    Bayes direction of the signal token; in Magen et al. the head is trained:
    :func:`two_step_gd`). Test set: ``n_test`` clean samples, drawn independently. Labels
    uniform in {-1, +1}.
    """
    for nm, v, lo in (("n", n, 2), ("d", d, 3), ("n_test", n_test, 2), ("batch", batch, 1)):
        _check(nm, v, isinstance(v, (int, np.integer)) and v >= lo, f"an integer >= {lo}")
    _check("snr", snr, np.isfinite(snr) and snr > 0, "> 0")
    _check("noise_ratio", noise_ratio, 0 <= noise_ratio < 0.5, "in [0, 0.5)")
    rng = np.random.default_rng(seed)
    B, r = int(batch), float(snr) * np.sqrt(d)

    def draw(m: int, k: int):
        y = rng.choice(np.array([-1.0, 1.0]), size=(B, m))
        X = np.zeros((B, m, 2, d))
        X[..., 0, 0] = np.where(y > 0, r, 0.0)
        X[..., 0, 1] = np.where(y < 0, r, 0.0)
        X[..., 1, 2:] = rng.standard_normal((B, m, d - 2))
        flipped = np.zeros((B, m), bool)
        for b in range(B):
            flipped[b, rng.choice(m, k, replace=False)] = True
        return X, y, flipped

    X, yc, flipped = draw(n, int(round(n * noise_ratio)))
    Xt, yt, _ = draw(n_test, 0)
    nu = np.zeros(d)
    nu[0], nu[1] = 1 / np.sqrt(2), -1 / np.sqrt(2)
    v = np.broadcast_to(nu, (B, d))
    meta = dict(generator="two_token", n=n, d=d, snr=snr, noise_ratio=noise_ratio,
                n_test=n_test, seed=seed)
    return NoisyLabels(TokenData(X=X, y=np.where(flipped, -yc, yc), v=v), yc, flipped,
                       np.array([0, 3]), TokenData(X=Xt, y=yt, v=v), meta)


def predict(X: np.ndarray, p: np.ndarray, v: np.ndarray, W: np.ndarray | None = None):
    """Outputs f(X) = v^T X^T softmax(X W p) and the attention s, batched over trials.

    X (B, m, T, d); p (R, B, d) (R recorded steps) or (B, d); v (B, d) or (R, B, d);
    W (d, d) fixed key-query matrix (default identity). Returns f (R, B, m) and s
    (R, B, m, T) (without R when p is (B, d)).
    """
    p = np.asarray(p, dtype=np.float64)
    single = p.ndim == 2
    P = p[None] if single else p
    q = P if W is None else P @ np.asarray(W).T  # W p per row
    B, m, T, d = X.shape
    Xf = X.reshape(B, m * T, d)
    a = np.matmul(Xf, q.transpose(1, 2, 0)).reshape(B, m, T, -1).transpose(3, 0, 1, 2)
    a = a - a.max(-1, keepdims=True)
    s = np.exp(a)
    s /= s.sum(-1, keepdims=True)
    V = np.asarray(v, dtype=np.float64)
    if V.ndim == 2:  # one head per trial: v^T x_t once
        g = np.matmul(Xf, V[:, :, None]).reshape(B, m, T)[None]
    else:
        g = np.matmul(Xf, V.transpose(1, 2, 0)).reshape(B, m, T, -1).transpose(3, 0, 1, 2)
    f = (s * g).sum(-1)
    return (f[0], s[0]) if single else (f, s)


def generalisation(data: NoisyLabels, p: np.ndarray, steps, v: np.ndarray | None = None,
                   W: np.ndarray | None = None, chunk: int = 250) -> pd.DataFrame:
    """The papers' generalisation metrics of recorded prompts, one row per (trial, step).

    ``p`` (R, B, d): the prompt of each trial at the recorded ``steps`` (R,) (e.g.
    ``Trajectory.param_history["p"]`` and ``record_steps``); ``v``: the head (default the
    data's fixed nu; (R, B, d) for a trained head). Columns:

        train_acc, train_acc_clean, train_acc_flipped  sign(f) = observed label, on all /
                                   clean / flipped samples (NaN when there are none)
        train_loss                 mean logistic loss on the observed labels
        test_acc, test_loss        on the held-out clean test set
        att_<role>_clean, att_<role>_flipped   the share of clean / flipped training
                                   samples whose most-attended token (argmax s) has that
                                   role (``ROLES``)
        test_att_signal            the share of test samples attending most to the signal token
    A sample with f = 0 counts as misclassified. The test set is processed ``chunk``
    samples at a time (memory). The columns are :func:`attnsvm.generalisation.columns` (the
    formulas of the trainer's metric ``train(..., metrics=[Generalisation.of(data)])``).
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 3 or p.shape[1:] != (data.train.B, data.train.d):
        raise ValueError(f"p must have shape (R, B, d) = (R, {data.train.B}, {data.train.d}); "
                         f"got {p.shape}")
    steps = np.asarray(steps)
    if steps.shape != (p.shape[0],):
        raise ValueError(f"steps must have shape (R,) = ({p.shape[0]},); got {steps.shape}")
    import torch

    from .losses import logistic

    v = data.train.v if v is None else v
    f, s = predict(data.train.X, p, v, W)  # (R, B, n), (R, B, n, T)
    Xt = data.test.X
    ft, tt = [], []
    for i in range(0, Xt.shape[1], chunk):
        fi, si = predict(Xt[:, i:i + chunk], p, v, W)
        ft.append(fi)
        tt.append(si.argmax(-1))
    T_ = torch.as_tensor
    cols = columns(T_(f), T_(s.argmax(-1)), T_(data.train.y[None]), logistic.value,
                   T_(data.flipped[None]), T_(data.roles), T_(np.concatenate(ft, -1)),
                   T_(np.concatenate(tt, -1)), T_(data.test.y[None]))
    cols = {k: c.numpy() for k, c in cols.items()}
    R, B = p.shape[:2]
    df = pd.DataFrame({k: np.asarray(c).T.ravel() for k, c in cols.items()})  # (B, R) order
    df.insert(0, "step", np.tile(steps, B))
    df.insert(0, "trial", np.repeat(np.arange(B), R))
    return df



def joint_gd(data: TokenData, lr: float = 5e-3, steps: int = 1000, record_every: int = 10,
             device=None):
    """Full-batch GD on (W, p) jointly from W = I, p = 0 in f(X) = nu^T X^T softmax(X W^T p)
    with nu fixed and the mean logistic loss: Sakamoto & Sato's final public code
    (``params = [model.W, model.p]``, ``SGD(lr)``, ``eye_(W)``, ``zeros_(p)``).

    Exact reduction: the gradients are dL/dp = W G and dL/dW = p G^T with G = sum_it
    (dL/da_it) x_it in the span of the training tokens, so from (I, 0) every iterate is
    W = I + U A U^T, p = U c (U (d, k) an orthonormal basis of span{x_it}, k <= nT), and GD
    on (W, p) is GD on (A, c): grad_c = (I + A) g, grad_A = c g^T with g = U^T G; the
    logits are a = x^T W^T p = (U^T x)^T (c + A^T c). U comes from the Gram matrix of the
    training tokens, X X^T = V S^2 V^T (U = X^T V S^-1, the coordinates U^T x_it = rows of
    V S; directions with S^2 below 1e-12 max S^2 are dropped). Batched over the B trials.

    Returns (record_steps (R,), q (R, B, d): the effective prompt W^T p at each record,
    loss (R, B): the training loss there).
    """
    import torch

    if not data.batched or data.v is None:
        raise ValueError("joint_gd needs batched TokenData with the fixed head v")
    _check("lr", lr, np.isfinite(lr) and lr > 0, "> 0")
    _check("steps", steps, isinstance(steps, (int, np.integer)) and steps >= 1, "an integer >= 1")
    _check("record_every", record_every,
           isinstance(record_every, (int, np.integer)) and record_every >= 1, "an integer >= 1")
    B, n, T, d = data.X.shape
    dev = torch.device("cpu") if device is None else torch.device(device)
    f64 = dict(dtype=torch.float64, device=dev)
    Xf = torch.as_tensor(data.X.reshape(B, n * T, d), **f64)
    reduce = d > n * T  # else U = I (the span is generically all of R^d)
    if reduce:
        lam, V = torch.linalg.eigh(Xf @ Xf.transpose(1, 2))  # (B, nT), (B, nT, nT)
        keep = lam > 1e-12 * lam.amax(1, keepdim=True)
        S = torch.sqrt(torch.where(keep, lam, 0.0))
        Zf = V * S[:, None, :]  # rows: U^T x_it
        Sinv = torch.where(keep, 1.0 / torch.where(keep, S, 1.0), 0.0)
    else:
        Zf = Xf
    k = Zf.shape[-1]
    g_t = torch.as_tensor(np.einsum("bntd,bd->bnt", data.X, data.v), **f64)
    y = torch.as_tensor(data.y, **f64)
    A = torch.zeros(B, k, k, **f64)
    c = torch.zeros(B, k, **f64)
    rec, qs, losses = [], [], []
    for step in range(steps + 1):
        qz = c + torch.bmm(c[:, None, :], A)[:, 0]  # c + A^T c
        s = torch.softmax(torch.bmm(Zf, qz[:, :, None]).reshape(B, n, T), -1)
        f = (s * g_t).sum(-1)
        u = y * f
        if step % record_every == 0 or step == steps:
            rec.append(step)
            qs.append(qz)
            losses.append(torch.nn.functional.softplus(-u).mean(1))
        if step == steps:
            break
        lp = -torch.sigmoid(-u) * y / n  # dL/df_i
        da = (lp[..., None] * s * (g_t - f[..., None])).reshape(B, 1, n * T)  # dL/da_it
        gz = torch.bmm(da, Zf)[:, 0]  # g = U^T G
        gc = gz + torch.bmm(A, gz[:, :, None])[..., 0]  # (I + A) g
        A.baddbmm_(c[:, :, None], gz[:, None, :], alpha=-lr)  # A - lr c g^T, in place
        c = c - lr * gc
    Q = torch.stack(qs)  # (R, B, k) coordinates
    if reduce:  # q = U qz = X^T V S^-1 qz
        Q = torch.einsum("bid,rbi->rbd", Xf, torch.einsum("bij,rbj->rbi", V, Q * Sinv[None]))
    q = Q
    return np.asarray(rec), q.cpu().numpy(), torch.stack(losses).cpu().numpy()


def two_step_gd(data: TokenData, lr_v: float, lr_p: float, steps: int = 2):
    """GD from v = 0, p = 0 on the head v and the prompt p of f(X) = v^T X^T softmax(X p)
    (mean logistic loss), with step size ``lr_v`` for v and ``lr_p`` for p:

        v <- v - lr_v dL/dv,  p <- p - lr_p dL/dp   (both gradients at the same point)

    dL/dv = (1/n) sum_i l'(y_i f_i) y_i X_i^T s_i; dL/dp = (1/n) sum_i l'(y_i f_i) y_i
    sum_t s_it (v^T x_it - f_i) x_it, l'(u) = -1 / (1 + e^u). At v = 0 the p-gradient is
    0, so step 1 moves v only and step 2 is the first to move p. Batched over the B trials
    of ``data`` (its head, if any, is ignored).

    Returns (steps (S+1,), p (S+1, B, d), v (S+1, B, d)): the iterates from the start.
    """
    _check("lr_v", lr_v, np.isfinite(lr_v) and lr_v > 0, "> 0")
    _check("lr_p", lr_p, np.isfinite(lr_p) and lr_p > 0, "> 0")
    _check("steps", steps, isinstance(steps, (int, np.integer)) and steps >= 1, "an integer >= 1")
    if not data.batched:
        raise ValueError("two_step_gd needs batched TokenData (B, n, T, d)")
    X, y = data.X, data.y
    B, n, T, d = X.shape
    p, v = np.zeros((B, d)), np.zeros((B, d))
    ps, vs = [p], [v]
    for _ in range(steps):
        a = np.einsum("bntd,bd->bnt", X, p)
        s = np.exp(a - a.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        g = np.einsum("bntd,bd->bnt", X, v)  # v^T x_it
        f = (s * g).sum(-1)
        lp = -0.5 * (1 - np.tanh(0.5 * y * f)) * y / n  # l'(y f) y / n, l'(u) = -sigmoid(-u)
        gv = np.einsum("bn,bnt,bntd->bd", lp, s, X)
        gp = np.einsum("bnt,bntd->bd", lp[..., None] * s * (g - f[..., None]), X)
        p, v = p - lr_p * gp, v - lr_v * gv
        ps.append(p)
        vs.append(v)
    return np.arange(steps + 1), np.stack(ps), np.stack(vs)
