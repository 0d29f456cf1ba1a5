"""The NTP model of Li et al. (AISTATS 2024): one self-attention layer whose query is the
last token, its next-token loss in a form exact past saturation, and its batched trainer.

Model (B trials, batched; docs/theory.md "Next-token prediction").  Sample i has tokens
X_i = E[s_i] (T, d) and query z_i = x_iT = e_{k_i}:

    a_it = x_it^T W z_i        (W, or W = K Q^T for the (K, Q) parameterisation)
    s_i = softmax_t(a_i)

Heads (the public code's ``cls_choice``):

* ``"iden"`` (the global-convergence notebooks, ``loss_type='nll'``): the output is the
  attention mass on each token id, p_i(v) = sum_{t: s_it = v} s_it, and
  loss_i = -log p_i(y_i) = LSE_t(a_it) - LSE_{t in Y_i}(a_it)  (Y_i: positions of the label);
* ``"gen"`` (the local-convergence notebook, ``loss_type='ce'``): logits over the
  vocabulary o_i = E (X_i^T s_i), loss_i = LSE_v(o_iv) - o_{i y_i}  (cross-entropy).

L = (1/n) sum_i loss_i.  Scaled gradient (as :mod:`attnsvm.models.objective`): with
M_i the log of the attention left off the target, dL/da_it = (1/n) exp(M_i) g_it with
O(1) entries g_it:

* iden: M_i = LSE_{t not in Y}(a) - LSE_t(a) = log(1 - p_i(y_i)); g_it = softmax over the
  non-label positions at t not in Y, -softmax over the label positions at t in Y;
* gen: with the anchor k = argmax_t a_it, r_t = exp(a_t - a_runner-up), exp(M) = s_t / r_t
  (:func:`attnsvm.models.objective.softmax_terms`), D_t = x_t - x_k, u = x_k +
  exp(M) sum_t r_t D_t, h = E^T (softmax(E u) - e_y), c_t = D_t^T h, cbar = sum_t r_t c_t:
  g_t = r_t (c_t - exp(M) cbar) (t != k), g_k = -s_k cbar.

So the direction of the gradient is exact however far it underflows (checked against
mpmath in tests/test_ntp_model.py).  dL/dW = sum_it (dL/da_it) x_it z_i^T; (K, Q):
dL/dK = G Q, dL/dQ = G^T K.

:class:`NTPModel` implements the model protocol of :func:`attnsvm.train.train` (the one
trainer: its torch stepper, stops and recorder): ``train(NTPModel(8), data,
optimizer=ngd(0.1), steps=1000)`` runs every full-batch step rule of :mod:`attnsvm.optim`
on B trials at once (the trainer's docstring shows it). The deprecated alias
``train_ntp`` lives in :mod:`attnsvm.train` (this package imports nothing above it).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..models.base import products_grad, products_logits, token_query_products
from ..models.objective import row_factors, scaled_grads, softmax_terms
from .data import NTPData

__all__ = ["NTPModel", "NTPObjective", "ntp_tensors", "HEADS"]

HEADS = ("iden", "gen")
_TENSOR_KEYS = {"E", "X", "Z", "ymask", "yid", "seqs"}
P_SMALL = 1e-4  # below this p_y, the iden loss is computed as LSE_t(a) - LSE_Y(a)
_M_SMALL = math.log1p(-P_SMALL)  # M = log(1 - p_y) above this: p_y < P_SMALL
NEG_INF = float("-inf")
#: the most logits (B n T) whose three log-sum-exps are taken in one call (the identity head)
LSE_STACK_MAX = 1 << 16


def ntp_tensors(data, device=None, dtype=torch.float64) -> dict:
    """Tensors of one NTPData (Bx = 1) or of a list of same-shape NTPData (Bx = len):
    E (Bx, K, d), X (Bx, n, T, d), Z (Bx, n, d), ymask (Bx, n, T) bool (positions whose
    token is a label), yid (Bx, n) (the first label), seqs (Bx, n, T).

    Example::

        >>> from attnsvm.ntp import ntp_random, ntp_tensors
        >>> t = ntp_tensors(ntp_random(4, 6, 8, 8, seed=0))
        >>> {k: tuple(v.shape) for k, v in t.items()}
        {'E': (1, 8, 8), 'X': (1, 4, 6, 8), 'Z': (1, 4, 8), 'ymask': (1, 4, 6), 'yid': (1, 4), 'seqs': (1, 4, 6)}
    """
    items = [data] if isinstance(data, NTPData) else data
    if (not isinstance(items, (list, tuple)) or not items
            or not all(isinstance(d, NTPData) for d in items)):
        raise ValueError(f"data must be an NTPData or a non-empty list of NTPData; got a "
                         f"{type(data).__name__}")
    shp = {(d.n, d.T, d.K, d.d) for d in items}
    if len(shp) != 1:
        raise ValueError(f"the datasets of a batch must share (n, T, K, d); got {sorted(shp)}")
    E = np.stack([d.E for d in items])
    seqs = np.stack([d.seqs for d in items])
    Y = np.stack([d.labels for d in items])  # (Bx, n, L)
    ymask = ((seqs[:, :, None, :] == Y[..., None]) & (Y[..., None] >= 0)).any(2)
    X = np.take_along_axis(E[:, None, :, :], seqs[..., None], axis=2)  # (Bx, n, T, d)
    t = dict(device=device, dtype=dtype)
    return {"E": torch.as_tensor(E, **t), "X": torch.as_tensor(X, **t),
            "Z": torch.as_tensor(X[:, :, -1, :], **t),
            "ymask": torch.as_tensor(ymask, device=device),
            "yid": torch.as_tensor(Y[..., 0], device=device),
            "seqs": torch.as_tensor(seqs, device=device)}


def _token_query_products(t: dict, signed: bool = False) -> torch.Tensor | None:
    """The products x_it z_i^T of data shared by the trials
    (:func:`attnsvm.models.base.token_query_products`: P (n T, d d), the logits a = P vec(W)
    and the gradient vec(G) = P^T vec(Ga) in one product each); ``signed``: the rows of label
    positions (ymask) negated. None where the data are per trial or P would be too large.
    Cached in ``t`` (callers must not modify the data)."""
    cache = t.setdefault("_cache", {})
    key = ("ntp_products", signed)
    if key not in cache:
        P = token_query_products(t["X"], t["Z"][:, :, None, :])
        ym = t.get("ymask")
        if P is not None and signed:
            P = None if ym is None or ym.shape[0] != 1 else torch.where(ym.reshape(-1, 1), -P, P)
        cache[key] = P
    return cache[key]


def _lse_masks(t: dict, a: torch.Tensor) -> tuple:
    """(-inf as a 0-dim tensor of a's dtype, the masks (3, Bx, n, T) of every position,
    the label positions (ymask) and the others) of the identity head's log-sum-exps;
    cached in ``t`` (callers must not modify the data)."""
    cache = t.setdefault("_cache", {})
    hit = cache.get("ntp_lse_masks")
    ym = t["ymask"]
    if hit is None or hit[0] is not ym or hit[1].dtype != a.dtype or hit[1].device != a.device:
        ninf = torch.tensor(NEG_INF, dtype=a.dtype, device=a.device)
        hit = cache["ntp_lse_masks"] = (ym, ninf, torch.stack([torch.ones_like(ym), ym, ~ym]))
    return hit[1], hit[2]


class NTPObjective(tuple):
    """(loss (B,), gap (B,) = loss, log_gap (B,) = log loss, grads Scaled)."""

    def __new__(cls, loss, log_loss, grads):
        return super().__new__(cls, (loss, loss, log_loss, grads))

    loss = property(lambda self: self[0], doc="(B,) the NTP loss of each trial.")
    gap = property(lambda self: self[1], doc="(B,) L - L* = L (the NTP loss has L* = 0).")
    log_gap = property(lambda self: self[2], doc="(B,) log L, exact past saturation.")
    grads = property(lambda self: self[3], doc="the gradient in scaled form (optim.Scaled).")


class NTPModel:
    """One self-attention layer for next-token prediction (module docstring).

    d: embedding dimension; param: "W" (combined key-query, trained W) or "KQ" (W = K Q^T,
    K, Q (d, m), m = d by default); head: "iden" | "gen".

    Example (training it: :func:`attnsvm.train.train`)::

        >>> from attnsvm.ntp import NTPModel, ntp_random
        >>> model = NTPModel(8)                                # trained W (d, d), identity head
        >>> t = model.prepare(ntp_random(4, 6, 8, 8, seed=0))
        >>> obj = model.evaluate(model.init(B=2, scale=1.0), t)  # L, log L, scaled gradient
        >>> model, tuple(obj.loss.shape), sorted(obj.grads.tensors)
        (NTPModel(d=8, param='W', head='iden'), (2,), ['W'])
    """

    ntp = True
    #: train() arguments an NTP model cannot honour, with the only value it accepts
    #: (its own next-token loss; full batch; the closed-form scaled gradient; no selected
    #: tokens alpha: the Graph-SVM's selection is a set of tokens per sample)
    train_fixed = {"loss": None, "batch_size": None, "autograd": False, "alpha": None}
    #: no compiled (fused) kernel: the trainer's torch engine runs it
    has_kernel = False

    def __init__(self, d: int, param: str = "W", head: str = "iden", m: int | None = None):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be a positive integer; got {d!r}")
        if param not in ("W", "KQ"):
            raise ValueError(f"param must be 'W' or 'KQ'; got {param!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}; got {head!r}")
        m = d if m is None else m
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ValueError(f"m must be a positive integer; got {m!r}")
        self.d, self.param, self.head, self.m = int(d), param, head, int(m)
        #: the geometry its GD converges in: W -> the Frobenius Graph-SVM, (K, Q) -> nuclear
        self.geometry = "fro" if param == "W" else "nuc"
        self.w_shape = (self.d, self.d)
        #: the Frobenius norm of each initial tensor by default: sqrt(d / 3), that of the
        #: public code's nn.Linear default init
        self.default_scale = math.sqrt(self.d / 3.0)

    def __repr__(self) -> str:
        return f"NTPModel(d={self.d}, param={self.param!r}, head={self.head!r})"

    # ------------------------------------------------- the trainer's protocol
    def prepare(self, data, device=None, dtype=torch.float64) -> dict:
        """The trainer's data tensors (:func:`ntp_tensors`): X (Bx, n, T, d), Z, ...;
        a ValueError naming ``data`` when it is not an NTPData or a list of them. Tensors
        already prepared (a dict with the keys of :func:`ntp_tensors`) are returned as
        they are."""
        if isinstance(data, dict) and set(data) >= _TENSOR_KEYS:
            return data
        return ntp_tensors(data, device=device, dtype=dtype)

    def queries_per_sequence(self, tdata) -> int:
        """One query per sample (its last token)."""
        return 1

    def norms(self, params) -> dict:
        """{"norm": ||W||_F (B,)} for the metrics table."""
        W = self.W(params)
        return {"norm": W.reshape(W.shape[0], -1).norm(dim=1)}

    def _logits(self, params, t: dict) -> torch.Tensor:
        """The logits in the trainer's layout (B, n, 1, T) (one query)."""
        return self.logits(params, t)[:, :, None, :]

    # ---------------------------------------------------------- parameters
    def param_shapes(self) -> dict:
        """Shapes of one trial's parameters: {"W": (d, d)} or {"K": (d, m), "Q": (d, m)}."""
        if self.param == "W":
            return {"W": (self.d, self.d)}
        return {"K": (self.d, self.m), "Q": (self.d, self.m)}

    def init(self, B: int = 1, seed: int = 0, scale: float = 1.0, kind: str = "random",
             device=None, dtype=torch.float64) -> dict:
        """i.i.d. N(0, 1) entries rescaled to Frobenius norm ``scale`` per tensor and
        trial ("random"), or zeros ("zero"); seeded (torch.Generator, CPU)."""
        if kind not in ("random", "zero"):
            raise ValueError(f"init kind must be 'random' or 'zero'; got {kind!r}")
        gen = torch.Generator().manual_seed(int(seed))
        out = {}
        for name, shape in self.param_shapes().items():
            a = torch.randn((B, *shape), generator=gen, dtype=torch.float64)
            nrm = a.reshape(B, -1).norm(dim=1).reshape(B, 1, 1)
            a = a.mul_(scale).div_(nrm)  # in place: the same bits as scale * a / nrm
            out[name] = (a if kind == "random" else torch.zeros_like(a)).to(device=device, dtype=dtype)
        return out

    def W(self, params) -> torch.Tensor:
        """The combined key-query matrix (B, d, d): W, or K Q^T."""
        if self.param == "W":
            return params["W"]
        return params["K"] @ params["Q"].transpose(-1, -2)

    @property
    def factorised(self) -> bool:
        """W is a product of the parameters (K Q^T: its entries may overflow first)."""
        return self.param != "W"

    def finite(self, params) -> torch.Tensor:
        """(B,) bool: every parameter and W of the trial is finite."""
        ok = None
        ts = list(params.values()) + ([self.W(params)] if self.factorised else [])
        for v in ts:  # min and max per trial (they propagate NaN): one pass, no temporary
            F = v.reshape(v.shape[0], -1)
            lo, hi = F.amin(1), F.amax(1)  # (aminmax along a dim: ~4x slower on the CPU)
            f = torch.isfinite(lo) & torch.isfinite(hi)
            ok = f if ok is None else ok & f
        return ok

    def _products(self, t: dict, signed: bool = False):
        """:func:`_token_query_products` for a trained W (None for (K, Q): W = K Q^T and its
        polar-factor rules are ill-conditioned enough that the rounding of another order of
        the sums shows at 1e-9)."""
        return _token_query_products(t, signed) if self.param == "W" else None

    # -------------------------------------------------------------- forward
    def logits(self, params, t: dict) -> torch.Tensor:
        """a_it = x_it^T W z_i: (B, n, T) (einsum: X is not copied B times when the trials
        share the data)."""
        Z, X = t["Z"], t["X"]
        W = self.W(params)
        P = self._products(t)
        if P is not None:  # one product: a_b = P vec(W_b) (the view P.t() made once)
            cache = t["_cache"]
            Pt = cache.get("ntp_products_t")
            if Pt is None:
                Pt = cache["ntp_products_t"] = P.t()
            return products_logits(P, W, Pt).reshape(W.shape[0], *X.shape[1:3])
        WZ = (torch.einsum("bij,nj->bni", W, Z[0]) if Z.shape[0] == 1
              else torch.einsum("bij,bnj->bni", W, Z))  # (B, n, d): W z_i
        return (torch.einsum("ntd,bnd->bnt", X[0], WZ) if X.shape[0] == 1
                else torch.einsum("bntd,bnd->bnt", X, WZ))

    def attention(self, params, t: dict) -> torch.Tensor:
        """Softmax attention over the T tokens, (B, n, T): s = softmax(X W x_T)."""
        return torch.softmax(self.logits(params, t), -1)

    def probs(self, params, t: dict) -> torch.Tensor:
        """The model's next-token distribution (B, n, K): attention mass per token id
        (iden) or softmax(E X^T s) (gen)."""
        s = self.attention(params, t)
        if self.head == "iden":
            K = t["E"].shape[1]
            oh = torch.nn.functional.one_hot(t["seqs"], K).to(s.dtype)  # (Bx, n, T, K)
            return torch.einsum("bnt,bntk->bnk", s, oh.expand(s.shape[0], *oh.shape[1:]))
        u = torch.einsum("bnt,bntd->bnd", s, t["X"])
        return torch.softmax(torch.einsum("bkd,bnd->bnk", t["E"], u), -1)

    def loss_plain(self, params, t: dict) -> torch.Tensor:
        """The loss by plain torch ops (the autograd reference): (B,)."""
        a = self.logits(params, t)
        if self.head == "iden":
            lab = torch.where(t["ymask"], a, torch.full_like(a, NEG_INF))
            return (torch.logsumexp(a, -1) - torch.logsumexp(lab, -1)).mean(-1)
        s = torch.softmax(a, -1)
        u = torch.einsum("bnt,bntd->bnd", s, t["X"])
        o = torch.einsum("bkd,bnd->bnk", t["E"], u)
        oy = o.gather(-1, t["yid"].expand(o.shape[0], -1)[..., None])[..., 0]
        return (torch.logsumexp(o, -1) - oy).mean(-1)

    # ------------------------------------------------------------ objective
    def _iden_objective(self, params, a, t: dict, grad: bool, need_gap: bool) -> NTPObjective:
        """The identity head's (L, log L, scaled gradient) from the logits a (B, n, T)
        (module docstring): with the log-sum-exps A_i over all positions, AY_i over the
        label positions and AN_i over the others, M_i = AN_i - A_i, and the scaled
        gradient's entries (1/n) exp(M_i - top) g_it (top: the log scale), g_it =
        -exp(a_it - AY_i) at a label position, exp(a_it - AN_i) elsewhere (0 where AN_i
        is -inf): the sign is carried by the products' rows (:func:`_token_query_products`,
        ``signed``) where the data are shared."""
        ymask = t["ymask"]
        n = a.shape[1]
        # the three log-sum-exps (every position, the label positions, the others; -inf
        # elsewhere): for a few logits in one call on the stack (3, B, n, T) (each row's
        # reduction is that of its own call: the same bits, a third of the calls), else
        # one call each (no 3x logits-sized temporary)
        ninf, m3 = _lse_masks(t, a)
        if a.numel() <= LSE_STACK_MAX:
            A, AY, AN = torch.logsumexp(torch.where(m3, a, ninf), -1, keepdim=True).unbind(0)
        else:
            A = torch.logsumexp(a, -1, keepdim=True)
            AY = torch.logsumexp(torch.where(ymask, a, ninf), -1, keepdim=True)
            AN = torch.logsumexp(torch.where(ymask, ninf, a), -1, keepdim=True)
        M = AN - A  # log(1 - p_y) <= 0 (-inf: no non-label position)
        # loss_i = -log p_y: -log1p(-e^M) while p_y >= P_SMALL (its rounding error in
        # 1 - p_y is then below 1e-12 of the loss), else LSE_t(a) - LSE_Y(a) (> 9.2: exact
        # however small p_y, where e^M = 1 - p_y rounds to 1 and the first form is inf)
        lo = torch.where(M < _M_SMALL, -torch.log1p(-torch.exp(M)), A - AY)[..., 0]
        L = lo.mean(-1)
        logL = None  # log L: asked for (need_gap) or without the gradient
        if need_gap or not grad:
            logl = torch.where(lo > 0, torch.log(lo), M[..., 0])  # log loss_i (M once e^M underflows)
            logL = torch.logsumexp(logl, -1) - math.log(n)
        if not grad:
            return NTPObjective(L, logL, None)
        fac, top = row_factors(M - math.log(n))
        top = top + (L - L)  # NaN where L is not finite (L - L = 0 elsewhere: top itself)
        # |g| in one exp (a - AN where AN is finite, else a - 0 = -inf there: e^-inf = 0)
        E = torch.exp(a - torch.where(ymask, AY, AN.nan_to_num(0.0, 0.0, 0.0)))
        E.mul_(fac)
        P = self._products(t, signed=True)  # the label rows negated: Ga = -E there
        raw = self._raw_grads(params, E if P is not None else torch.where(ymask, -E, E), t, P)
        return NTPObjective(L, logL, scaled_grads(raw, top))

    def _gen_terms(self, a, t):
        st = softmax_terms(a)
        X = t["X"]
        xk = X.expand(a.shape[0], *X.shape[1:]).gather(
            2, st.k[..., None].expand(*st.k.shape, X.shape[-1]))  # (B, n, 1, d)
        D = X - xk  # (B, n, T, d), 0 at the anchor
        dr = torch.einsum("bnt,bntd->bnd", st.r, D)
        u = xk[:, :, 0] + st.eM[..., None] * dr
        o = torch.einsum("bkd,bnd->bnk", t["E"], u)
        lse = torch.logsumexp(o, -1)
        p = torch.softmax(o, -1)
        yid = t["yid"].expand(a.shape[0], -1)
        p = p - torch.nn.functional.one_hot(yid, o.shape[-1]).to(p.dtype)
        h = torch.einsum("bkd,bnk->bnd", t["E"], p)
        c = torch.einsum("bntd,bnd->bnt", D, h)
        cbar = (st.r * c).sum(-1, keepdim=True)
        g = st.r * (c - st.eM[..., None] * cbar)
        g = g.scatter(-1, st.k, -(st.s.gather(-1, st.k) * cbar))
        lo = lse - o.gather(-1, yid[..., None])[..., 0]
        return st.M, g, lo, torch.log(lo)

    def evaluate(self, params, t: dict, loss=None, grad: bool = True, autograd: bool = False,
                 need_gap: bool = True, logits=None) -> NTPObjective:
        """(L (B,), log L (B,), scaled gradient) in the stable form (module docstring).

        The trainer's signature: ``loss`` must be None (the model's own next-token loss),
        ``autograd`` False (the closed form); ``need_gap=False`` (with ``grad``) may skip
        log L (returned as None; L is always computed: a non-finite L marks the gradient
        non-finite); ``logits``: :meth:`_logits` already computed at ``params``. A trial
        whose L is not finite gets a non-finite gradient scale (the trainer stops it:
        "non-finite step")."""
        if loss is not None or autograd:
            raise ValueError("an NTPModel has its own next-token loss and closed-form gradient: "
                             "loss must be None and autograd False")
        with torch.no_grad():
            a = self.logits(params, t) if logits is None else logits[:, :, 0]
            n = a.shape[1]
            if self.head == "iden":
                return self._iden_objective(params, a, t, grad, need_gap)
            M, g, lo, logl = self._gen_terms(a, t)
            L = lo.mean(-1)
            logL = torch.logsumexp(logl, -1) - math.log(n)
            if not grad:
                return NTPObjective(L, logL, None)
            fac, top = row_factors((M - math.log(n))[..., None])
            top = top + (L - L)  # NaN where L is not finite
            Ga = g * fac  # (B, n, T)
            return NTPObjective(L, logL, scaled_grads(self._raw_grads(params, Ga, t), top))

    def _raw_grads(self, params, Ga, t, P=None) -> dict:
        """{name: dL/dparam / exp(log scale)} from Ga = dL/da / exp(log scale) (B, n, T):
        G = sum_it Ga_it x_it z_i^T (B, d, d) (``P``: the products x_it z_i^T of
        :func:`_token_query_products`, possibly signed row by row, to use instead), and
        (K, Q): (G Q, G^T K)."""
        X, Z = t["X"], t["Z"]
        P = self._products(t) if P is None else P
        if P is not None:  # one product: vec(G_b) = P^T vec(Ga_b)
            G = products_grad(P, Ga).reshape(Ga.shape[0], self.d, self.d)
        else:
            GX = (torch.einsum("bnt,ntd->bnd", Ga, X[0]) if X.shape[0] == 1
                  else torch.einsum("bnt,bntd->bnd", Ga, X))  # sum_t Ga_it x_it: (B, n, d)
            G = (torch.einsum("bnd,ne->bde", GX, Z[0]) if Z.shape[0] == 1
                 else torch.einsum("bnd,bne->bde", GX, Z))  # (B, d, d)
        if self.param == "W":
            return {"W": G}
        return {"K": G @ params["Q"], "Q": G.transpose(-1, -2) @ params["K"]}
