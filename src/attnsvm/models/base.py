"""``AttentionModel``: one attention layer, batched over trials (docs/theory.md §2).

Logits a_{iqt} = x_{it}^T W z_{iq}, attention s_{iq} = softmax_t(a_{iq}), output
f_{iq} = h(X_i^T s_{iq}). A model is a plain object (not an ``nn.Module``): parameters are
a dict of tensors with a leading trial dim B, so B independent trials are one tensor
program. Subclasses (:mod:`attnsvm.models.params`) define the parameterisation:
``_param_shapes``, ``W`` (the effective key-query matrix), ``_wz`` (the vectors W z_iq) and
``_grads_from_ga`` (closed-form parameter gradients from dL/da). Queries and masks live in
:mod:`.attention`, heads in :mod:`.heads`, the stable objective in :mod:`.objective`.

Data: a ``TokenData`` or the dict of :func:`~attnsvm.models.inputs.prepare`: X (Bx, n, T, d)
with Bx = 1 (shared) or B (one dataset per trial); y (Bx, n) or (Bx, n, T); z (Bx, n, d);
mask; v (Bx, d).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from attnsvm.losses import get_loss
from attnsvm.norms import FRO
from attnsvm.scores import scores

from . import attention as A
from . import objective as O
from .heads import Head
from .inputs import prepare

__all__ = ["AttentionModel", "INIT_KINDS", "KernelInputs"]

INIT_KINDS = ("random", "zero", "balanced", "unbalanced")


def _token_product(A, X, transpose: bool):
    """A_iq X_i^T (``transpose``: A (B, n, Q, d) -> (B, n, Q, T), the logits) or A_iq X_i
    (A (B, n, Q, T) -> (B, n, Q, d), sum_t A_iqt x_it) for every trial and sequence, as
    one batched product (no chunk loop, no (B, n, T, d) temporary). X (Bx, n, T, d) with
    Bx = B, or Bx = 1 shared by the B trials: contracted by einsum, never broadcast to B
    copies; A may broadcast over n (the prompt's one query vector).

    The contract (tests/test_setup_cost.py): equal to the plain sum of the products to
    rounding (|error| <= gamma_k sum |A| |X|, k = d or T terms); the last bit may depend on
    the batch (BLAS blocking), as every other batched op of the torch engine (chunk= runs
    agree to 1e-12, tests/test_chunked.py). train() reuses the values it has computed at
    the same parameters, so its records equal a fresh computation bit for bit."""
    if X.shape[0] != 1 or A.shape[0] == 1:
        return torch.matmul(A, X.transpose(-1, -2) if transpose else X)
    if A.shape[1] != X.shape[1]:
        A = A.expand(A.shape[0], X.shape[1], *A.shape[2:])
    return torch.einsum("bnqd,ntd->bnqt" if transpose else "bnqt,ntd->bnqd", A, X[0])


#: the most entries of the token-query products x_it z_iq^T kept for the one-product
#: logits and gradient of a W (:func:`token_query_products`): 2 MiB of float64
PRODUCTS_MAX = 1 << 18


def token_query_products(X, Z, cache: dict | None = None, key=None):
    """The products x_it z_iq^T of data shared by the trials as one matrix, P (n Q T, d d)
    with P[(i, q, t), (j, l)] = x_itj z_iql (X (1, n, T, d), Z (1, n, Q, d)), so that the
    logits a_iqt = x_it^T W z_iq of every trial are one product a = P vec(W) and the
    gradient vec(sum_iqt Ga_iqt x_it z_iq^T) = P^T vec(Ga) (one op each instead of two
    contractions and their reshapes: what a step of few trials costs; the same sums in
    another order: equal to rounding). None where the data are per trial or P would
    exceed :data:`PRODUCTS_MAX` entries. Cached in ``cache[key]`` when given."""
    if cache is not None and key in cache:
        return cache[key]
    Bx, n, T, d = X.shape
    Q = Z.shape[2]
    P = None
    if Bx == 1 and Z.shape[0] == 1 and n * Q * T * d * d <= PRODUCTS_MAX and Z.shape[-1] == d:
        P = (X[0, :, None, :, :, None] * Z[0, :, :, None, None, :]).reshape(n * Q * T, d * d)
    if cache is not None:
        cache[key] = P
    return P


def products_logits(P, W, Pt=None):
    """a (B, R) = P vec(W) per trial: P (R, d d) of :func:`token_query_products`, W (B, d, d);
    ``Pt``: the view P.t() where the caller keeps it (the same product)."""
    return torch.mm(W.reshape(W.shape[0], -1), P.t() if Pt is None else Pt)


def products_grad(P, Ga):
    """vec(G) (B, d d) = P^T vec(Ga) per trial (Ga (B, ...) with R entries per trial)."""
    return torch.mm(Ga.reshape(Ga.shape[0], -1), P)


class KernelInputs(NamedTuple):
    """What the compiled engine (:mod:`attnsvm.fused`) reads from a model, through
    :meth:`AttentionModel.kernel_inputs` (never by its class or private methods).

    kind: the parameterisation the kernels implement ("W" | "KQ" | "Diag" | "Prompt");
    trained: the head v is trained (else fixed: the token scores gamma); Z: the queries
    (Bx, n, Q, d) or None (the prompt's query is a parameter); weights: the query weights w
    (Bx|1, n, Q); labels (Bx, n, Q) (trained head) or None; gamma (masked keys -> 0) and
    gamma_opt (fixed head) or None; key_mask (.., T) bool or None; W_fixed (d, d) (prompt)
    or None; m: the width of K, Q (KQ) or 0; reg: the ridge coefficient (KQ) or 0."""

    kind: str
    trained: bool
    Z: torch.Tensor | None
    weights: torch.Tensor
    labels: torch.Tensor | None
    gamma: torch.Tensor | None
    gamma_opt: torch.Tensor | None
    key_mask: torch.Tensor | None
    W_fixed: np.ndarray | None = None
    m: int = 0
    reg: float = 0.0


class AttentionModel:
    """Base class: queries, masks, heads, forward pass and the stable objective.

    d: token dimension; query: "cross" | "first" | "last" | "seq2seq" | "causal";
    head: "linear" | "relu" | callable; train_head: train v (linear) or V (relu);
    head_width / V: width or fixed weights of a relu head.
    """

    has_query_data = True
    factorised = False  # W is a product of the parameters (its entries may overflow first)
    #: the trainer's protocol (attnsvm.train): the norm of a random init by default, the
    #: arguments the model cannot honour ({} : every one), the geometry GD converges in
    #: (attnsvm.tokens.run_geometry), whether W is diagonal (an SVM over diagonal W)
    default_scale = 0.1
    train_fixed: dict = {}
    geometry = "fro"
    diagonal = False
    #: the parameterisation the compiled kernels implement, declared by the class itself
    #: (a subclass that does not declare it again runs on the torch engine)
    kernel_kind: str | None = None

    def __init__(self, d: int, query: str = "cross", head="linear", train_head: bool = False,
                 head_width: int | None = None, V=None):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(f"d must be a positive integer; got {d!r}")
        if query not in A.QUERIES:
            raise ValueError(f"query must be one of {A.QUERIES}; got {query!r}")
        self.d = int(d)
        self.query = query
        self._headf = Head(self.d, head, train_head, head_width, V)
        self.head = head
        self.train_head = self._headf.train
        self.head_width = self._headf.width
        self.V_fixed = self._headf.V_fixed

    def __repr__(self) -> str:
        head = self.head if isinstance(self.head, str) else "callable"
        extra = ", train_head=True" if self.train_head else ""
        return f"{type(self).__name__}(d={self.d}, query={self.query!r}, head={head!r}{extra})"

    # ------------------------------------------------------------ parameters
    def _param_shapes(self) -> dict:
        raise NotImplementedError

    def param_shapes(self) -> dict:
        """Per-trial shapes of the trained tensors (without the leading B)."""
        shapes = dict(self._param_shapes())
        if self._headf.param:
            shapes[self._headf.param] = self._headf.param_shape()
        return shapes

    def init(self, B: int = 1, seed: int = 0, scale: float = 0.1, kind: str = "random",
             device=None, dtype=torch.float64) -> dict:
        """Initial parameters for B independent trials.

        kind: "random" (i.i.d. N(0,1) entries, each tensor rescaled to Frobenius norm
        ``scale`` per trial), "zero" (all 0), "balanced" (K = Q, k = q; random otherwise),
        "unbalanced" (K = a random, Q = 0; k = a, q = 0). Seeded via torch.Generator
        (CPU, then moved to ``device``): the same seed gives bit-identical tensors.
        """
        if kind not in INIT_KINDS:
            raise ValueError(f"init kind must be one of {INIT_KINDS}; got {kind!r}")
        gen = torch.Generator().manual_seed(int(seed))
        out = {}
        for name, shape in self.param_shapes().items():
            a = torch.randn((B, *shape), generator=gen, dtype=torch.float64)
            nrm = a.reshape(B, -1).norm(dim=1).reshape(B, *([1] * len(shape)))
            # in place: one copy of the parameters, not three (the same bits as scale * a / nrm)
            out[name] = a.mul_(scale).div_(nrm) if kind != "zero" else torch.zeros_like(a)
        out = self._shape_init(out, kind)
        return {k: t.to(device=device, dtype=dtype) for k, t in out.items()}

    def _shape_init(self, params, kind):
        if kind in ("balanced", "unbalanced"):
            raise ValueError(f"init kind {kind!r} applies to KQModel and DiagModel only")
        return params

    def W(self, params) -> torch.Tensor:
        """Effective key-query matrix (B, d, d)."""
        raise NotImplementedError

    def finite(self, params) -> torch.Tensor:
        """(B,) bool: every parameter (and, for factorised models, W itself) is finite."""
        ts = list(params.values()) + ([self._w_entries(params)] if self.factorised else [])
        ok = None
        for v in ts:  # min and max per trial (they propagate NaN): one pass, no |v| copy
            F = v.reshape(v.shape[0], -1)
            lo, hi = F.amin(1), F.amax(1)  # (aminmax along a dim: ~4x slower on the CPU)
            f = torch.isfinite(lo) & torch.isfinite(hi)
            ok = f if ok is None else ok & f
        return ok

    def _w_entries(self, params) -> torch.Tensor:
        """(B, ...) the entries of W that :meth:`finite` checks: W itself (a model whose W
        has structural zeros may give the others only: the same answer, less memory)."""
        return self.W(params)

    def norms(self, params) -> dict:
        """Per-trial norms for the metrics table: {"norm": ||W||_F (B,), ...} (scale-safe)."""
        W = self.W(params)
        out = {"norm": FRO.value(W, vector=W.ndim == 2)}
        if self._headf.param:
            h = params[self._headf.param]
            out["norm_head"] = FRO.value(h.reshape(h.shape[0], -1), vector=True)
        return out

    def _reg(self, params):
        """Ridge term added to the objective per trial (B,), or None."""
        return None

    def _reg_grads(self, params) -> dict:
        """Plain gradients of ``_reg`` ({} when there is none)."""
        return {}

    @property
    def w_shape(self) -> tuple:
        """The shape of one trial's W (a reference direction's shape): (d, d)."""
        return (self.d, self.d)

    # ------------------------------------------------------ the trainer's protocol
    def prepare(self, data, device=None, dtype=torch.float64) -> dict:
        """The data tensors the trainer reads (:func:`~attnsvm.models.inputs.prepare`)."""
        return prepare(data, device=device, dtype=dtype)

    def queries_per_sequence(self, data) -> int:
        """Q: 1 (cross / first / last, prompt) or T (seq2seq, causal)."""
        return 1 if self._single(data) else data["X"].shape[2]

    @property
    def has_kernel(self) -> bool:
        """Whether the compiled engine implements this model (its class declares
        ``kernel_kind``)."""
        return type(self).__dict__.get("kernel_kind") is not None

    def _kernel_params(self) -> dict:
        """W_fixed, m, reg of :class:`KernelInputs` (subclasses that have them)."""
        return {}

    def kernel_inputs(self, data, Q: int) -> KernelInputs | None:
        """The arrays the compiled engine reads (:class:`KernelInputs`), or None when
        the engine does not implement this model."""
        if not self.has_kernel:
            return None
        trained = not self.fixed_linear
        Z = self.queries(data) if self.has_query_data else None
        if trained:
            labels, weights, gam, gopt = self._labels(data, Q), self._query_weights(data, Q), None, None
        else:
            gam, gopt, weights, _ = self._consts(data, Q)
            labels = None
        return KernelInputs(self.kernel_kind, trained, Z, weights, labels, gam, gopt,
                            self._key_mask(data), **self._kernel_params())

    # ------------------------------------------------------------- geometry
    def queries(self, data: dict) -> torch.Tensor:
        """Query vectors z_{iq}: (Bx, n, Q, d)."""
        return A.queries(self.query, data)

    def _key_mask(self, data) -> torch.Tensor | None:
        return A.key_mask(self.query, data)

    def _query_weights(self, data, Q: int) -> torch.Tensor:
        return A.query_weights(data, Q)

    def _wz(self, params, Z) -> torch.Tensor:
        """(W z_{iq}) for all queries: (B, n, Q, d) (or broadcastable)."""
        raise NotImplementedError

    def logits(self, params, data) -> torch.Tensor:
        """a_{iqt} = x_{it}^T W z_{iq}: (B, n, T) [one query] or (B, n, T, T) [seq2seq]."""
        data = prepare(data)
        a = self._logits(params, data)
        return a[:, :, 0] if self._single(data) else a

    def _single(self, data) -> bool:
        return self.query in ("cross", "first", "last") or not self.has_query_data

    def _logits(self, params, data) -> torch.Tensor:
        X = data["X"]
        WZ = self._wz(params, self.queries(data) if self.has_query_data else None)
        a = _token_product(WZ, X, transpose=True)  # (B, n, Q, T)
        m = self._key_mask(data)
        if m is not None:
            a = a.masked_fill(~m, float("-inf"))
        return a

    def attention(self, params, data) -> torch.Tensor:
        """s = softmax over keys: (B, n, T) or (B, n, T, T) (seq2seq: [query k, key t])."""
        return torch.softmax(self.logits(params, data), dim=-1)

    def _forward(self, params, data):
        a = self._logits(params, data)
        s = torch.softmax(a, dim=-1)
        U = A.pool_anchored(a, s, data["X"])  # (B, n, Q, d)
        return self._headf(params, U, data), a, s

    def forward(self, params, data) -> torch.Tensor:
        """f_{iq} = h(X_i^T s_{iq}): (B, n) or (B, n, T) (seq2seq)."""
        data = prepare(data)
        f = self._forward(params, data)[0]
        return f[:, :, 0] if self._single(data) else f

    __call__ = forward

    # ------------------------------------------------------------- objective
    @property
    def fixed_linear(self) -> bool:
        """Whether the head is linear and not trained (f = v^T r with v fixed): the setting of
        the token scores gamma and the ATT-SVM (docs/theory.md §4)."""
        return self._headf.fixed_linear

    def _labels(self, data, Q):
        y = data["y"]
        if y.ndim == 3 and Q == 1:
            raise ValueError(f"the data hold one label per query token (y of shape (n, T)) but "
                             f"query={self.query!r} has one query per sequence; use "
                             "query='seq2seq' or 'causal', or labels y of shape (n,)")
        return y[:, :, None] if y.ndim == 2 else y  # (Bx, n, Q)

    def _gamma(self, data, Q):
        """gamma_{iqt} = y_{iq} v^T x_{it} (Bx, n, Q, T) (attnsvm.scores) with inadmissible
        keys (padding, causal future) at -inf; cached in ``data`` (callers must not modify it)."""
        self._labels(data, Q)  # the label layout must fit the queries
        key = ("_gamma", self.query, Q)
        cache = data.setdefault("_cache", {})
        if key not in cache:
            g = scores(data["X"], data["y"], data["v"])
            g = g[:, :, None, :] if g.ndim == 3 else g
            m = self._key_mask(data)
            cache[key] = g if m is None else g.masked_fill(~m, float("-inf"))
        return cache[key]

    def _consts(self, data, Q):
        """Step-independent terms of the fixed-head objective, cached in ``data``:
        gamma with masked keys -> 0 (Bx, n, Q, T), gamma_opt (Bx, n, Q) (0 for a query slot
        without admissible key), query weights w (Bx|1, n, Q), whether any key is masked."""
        key = ("_consts", type(self).__name__, self.query, Q)
        cache = data.setdefault("_cache", {})
        if key not in cache:
            gam = self._gamma(data, Q)
            gopt = gam.max(-1).values
            cache[key] = (torch.nan_to_num(gam, neginf=0.0), torch.nan_to_num(gopt, neginf=0.0),
                          self._query_weights(data, Q), bool(torch.isinf(gam).any()))
        return cache[key]

    def evaluate(self, params, data, loss="logistic", grad: bool = True, autograd: bool = False,
                 need_gap: bool = True, logits=None) -> O.Objective:
        """Risk L (B,), gap L - L* (B,), log(L - L*) (B,) and the scaled gradient
        (:class:`~attnsvm.optim.Scaled`), in the stable form of :mod:`.objective`.

        L* = sum w loss(gamma_opt) for a fixed linear head, 0 otherwise. ``autograd=True``
        uses torch.autograd of the stable objective (the reference path) instead of the
        closed form; other heads always use autograd. ``need_gap=False`` (closed form) may
        skip L and log(L - L*) (returned as None). ``logits``: ``self._logits(params, data)``
        where the caller already has them (the same values; not recomputed, except by the
        autograd paths, which need their own)."""
        lossf = get_loss(loss)
        data = prepare(data)
        if self.fixed_linear:
            if data.get("v") is None:
                raise ValueError("a fixed linear head needs data.v of shape (d,); got None")
            return O.fixed_linear(self, params, data, lossf, grad, autograd, need_gap, logits)
        if self.head == "linear":
            return O.trained_linear(self, params, data, lossf, grad, autograd, need_gap, logits)
        return O.autograd_head(self, params, data, lossf, grad, logits)

    def objective(self, params, data, loss="logistic", grad: bool = True, autograd: bool = False,
                  need_gap: bool = True):
        """(L (B,), L - L* (B,), plain gradients {name: (B, ...)} or None): :meth:`evaluate`
        with the gradient unscaled (it may underflow to 0 far past saturation: the trainer
        uses :meth:`evaluate`)."""
        ev = self.evaluate(params, data, loss, grad, autograd, need_gap)
        return ev.loss, ev.gap, (None if ev.grads is None else ev.grads.value())

    def _gx(self, data, Ga):
        """GX_{iq} = sum_t (dL/da_iqt) x_it: (B, n, Q, d)."""
        return _token_product(Ga, data["X"], transpose=False)

    def _grads_from_ga(self, params, data, Ga) -> dict:
        raise NotImplementedError
