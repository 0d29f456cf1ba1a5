"""One home per norm: value, dual, steepest-descent direction and cvxpy form (docs/theory.md §5-6).

The five papers tie one optimiser to one norm, and the max-margin problem of a run is
``min ||W|| s.t. margins >= 1`` in that norm. Everything the library needs to know about a
norm lives in one :class:`Norm` object:

    N = get_norm("spectral")       # or "fro", "nuc", "l1", "linf", 3.0, "l1.5", ...
    N.value(W)                     ||W||, batched over leading dims, numpy or torch
    N.dual                         the dual norm ||G||_* = sup_{||D|| <= 1} <G, D>
    N.steepest(G)                  D* = argmax_{||D|| <= 1} <G, D>  (unit norm, <G, D*> = ||G||_*)
    N.cvxpy(expr), N.objective(expr), N.solver       the convex-programming side

Normalised steepest descent w.r.t. ``N`` is ``W <- W - lr N.steepest(G)``: NGD for the
Frobenius norm, sign descent for the entrywise max-norm, spectral descent (Muon without
momentum) for the spectral norm, the greedy coordinate rule for l_1. Adding a norm is
adding one subclass here (and its test).

Item dims: the last two dims of a matrix (``vector=False``) or the last dim
(``vector=True``, or a 1-d input); every leading dim is a batch dim. For vectors the
nuclear and the spectral norm are the Euclidean norm. All values and directions are
computed from ``A / max|A|`` (per item), so nothing under- or overflows at scales 1e-200
or 1e+200, and a direction stays defined however small the gradient is. numpy in gives
numpy out, torch in gives torch out (same device and dtype).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["Norm", "get_norm", "register_norm", "NORMS", "Frobenius", "Nuclear", "Spectral",
           "Lp", "l_p"]


# ------------------------------------------------------------------------- helpers
def _as_torch(A):
    """(tensor, back) where back(t) converts a result to A's type."""
    if isinstance(A, torch.Tensor):
        return A, lambda t: t
    a = np.asarray(A, dtype=np.float64)
    return torch.from_numpy(np.ascontiguousarray(a)), lambda t: t.numpy()


def _item_dims(A: torch.Tensor, vector: bool) -> tuple[int, ...]:
    return (-1,) if (vector or A.ndim == 1) else (-2, -1)


def _expand(x: torch.Tensor, k: int) -> torch.Tensor:
    return x.reshape(*x.shape, *([1] * k))


def _max_abs(A: torch.Tensor, dims) -> torch.Tensor:
    """max |A| over ``dims`` (0 for an empty item)."""
    if A.numel() == 0:
        return torch.zeros(A.shape[: A.ndim - len(dims)], dtype=A.dtype, device=A.device)
    F = A.flatten(A.ndim - len(dims)) if len(dims) > 1 else A
    lo, hi = F.amin(-1), F.amax(-1)  # (aminmax along a dim is ~4x slower on the CPU)
    # max(-min, max): no |A| temporary; NaN propagates; + 0.0: |-0.0| is +0.0
    return torch.maximum(hi, lo.neg_()).add_(0.0)


_CHUNK = 1 << 17  # entries per chunk of items in :meth:`Norm.value` (1 MiB of float64)


def _chunk_rows(t: torch.Tensor, dims) -> int:
    """Rows of dim 0 per chunk for the value of many items on the CPU (for a norm whose
    value is the same per item in any batch: ``Norm._exact_ops``); 0: in one go (few
    items, another device, or autograd)."""
    if (t.ndim <= len(dims) or t.device.type != "cpu" or t.numel() <= 2 * _CHUNK
            or (t.requires_grad and torch.is_grad_enabled())):
        return 0
    c = max(1, _CHUNK // max(1, t.numel() // t.shape[0]))
    return c if c < t.shape[0] else 0


def _scaled(A: torch.Tensor, dims):
    """(A / m, m) with m = max|A| per item (items that are 0 stay 0 with m = 0)."""
    m = _max_abs(A, dims)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    return A / _expand(safe, len(dims)), m


class Norm:
    """A norm on matrices (d, e) or vectors (d,), batched over leading dims.

    Attributes: ``name`` (canonical), ``p`` (entrywise exponent, None for spectral
    norms), ``solver`` (cvxpy solver it needs by default), ``euclidean`` (True for the
    Frobenius norm only: ||A||^2 = <A, A>, self-dual).
    Subclasses implement ``_value(A1, dims)`` and ``_steepest(G1, dims)`` on inputs
    scaled to max|A| = 1 (or 0).
    """

    name: str = ""
    p: float | None = None
    solver: str = "CLARABEL"
    # value() uses only exact or correctly rounded elementwise ops (abs, min, max, /, *,
    # sqrt) and per-item reductions: the same bits for any number of items, so it may run
    # in chunks (a general power x^p may not: torch's vectorised and scalar pow can differ
    # in the last bit)
    _exact_ops: bool = False
    # ||A||^2 = <A, A> (the Frobenius norm, self-dual): numerical code may compute it and
    # its dual in numpy (attnsvm.svm.certificate.fro_norm) instead of through torch
    euclidean: bool = False

    # -------------------------------------------------------------- identity
    def __repr__(self) -> str:
        return f"Norm({self.name!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Norm) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("Norm", self.name))

    def __str__(self) -> str:
        return self.name

    @property
    def dual(self) -> Norm:
        """The dual norm ||G||_* = sup_{||D|| <= 1} <G, D>."""
        raise NotImplementedError

    # ----------------------------------------------------------------- value
    def value(self, A, vector: bool = False):
        """||A|| over the item dims: (..., d, e) -> (...) [vector: (..., d) -> (...)]."""
        t, back = _as_torch(A)
        dims = _item_dims(t, vector)
        c = _chunk_rows(t, dims) if self._exact_ops else 0
        if c:  # many items on the CPU: c rows at a time, the temporaries staying in cache
            return back(torch.cat([self._value_of(t[i:i + c], dims)
                                   for i in range(0, t.shape[0], c)]))
        return back(self._value_of(t, dims))

    def _value_of(self, t, dims):
        """:meth:`value` of a tensor (each item on its own: the same per item in chunks)."""
        if t.numel() == 0:
            A1, m = _scaled(t, dims)
            return m * self._value(A1, dims)
        # m = max|t| per item from one min/max pass (NaN for an item with a NaN, inf for one
        # with an inf; abs: +0 and a positive NaN, as max |t| gives)
        F = t.flatten(-len(dims))
        lo, hi = F.amin(-1), F.amax(-1)  # (aminmax along a dim is ~4x slower on the CPU)
        m = torch.maximum(-lo, hi).abs()
        # every item finite (the usual case): the sum of m >= 0 is finite iff each m is (or
        # it overflowed: the per-item test decides); one read instead of isfinite's four ops
        if not math.isfinite((m if m.numel() == 1 else m.sum()).item()):
            fin = torch.isfinite(m)
            if not bool(fin.all()):  # inf items have norm inf, NaN items NaN
                v = self._value_of(torch.where(_expand(fin, len(dims)), t, torch.zeros_like(t)), dims)
                return torch.where(fin, v, torch.where(torch.isnan(m), torch.full_like(v, float("nan")),
                                                       torch.full_like(v, float("inf"))))
        safe = torch.where(m > 0, m, torch.ones_like(m))
        return m * self._value(t / _expand(safe, len(dims)), dims)

    def _value(self, A1, dims):
        raise NotImplementedError

    # ------------------------------------------------------------- steepest
    def steepest(self, G, vector: bool = False):
        """D* = argmax_{||D|| <= 1} <G, D>, same shape as G; 0 where G = 0.

        ||D*|| = 1 and <G, D*> = ||G||_* (the dual norm) for every nonzero item.
        Scale-free: computed from G / max|G|, so a gradient of size 1e-300 has the same
        direction as the same gradient at size 1."""
        t, back = _as_torch(G)
        dims = _item_dims(t, vector)
        G1, m = _scaled(t, dims)
        D = self._steepest(G1, dims)
        # in place: D is a fresh tensor (every _steepest computes it from G1, our own copy)
        return back(D.masked_fill_(_expand(~(m > 0), len(dims)), 0.0))

    def _steepest(self, G1, dims):
        raise NotImplementedError

    def steepest_unit(self, G, vector: bool = False, inplace: bool = False):
        """:meth:`steepest` of a tensor G whose items have max |G| = 1 or are 0 (or hold a
        NaN): a scaled gradient's tensors (:class:`attnsvm.optim.Scaled`), for which the
        rescaling by max |G| divides by 1 (exact). The same values; a norm may skip the
        rescaling (:class:`Frobenius`). ``inplace``: G is the caller's to overwrite."""
        return self.steepest(G, vector)

    # ---------------------------------------------------------------- cvxpy
    def cvxpy(self, expr):
        """The cvxpy expression ||expr|| (a matrix (d, e) or a vector expression)."""
        raise NotImplementedError

    def objective(self, expr):
        """A cvxpy objective minimised by the same point as ||expr||: the norm itself,
        or 1/2 ||expr||_F^2 for the Frobenius norm (a QP, better conditioned)."""
        return self.cvxpy(expr)


def _is_vector_expr(expr) -> bool:
    shape = tuple(expr.shape)
    return len(shape) <= 1 or min(shape) == 1


def _vec(expr):
    import cvxpy as cp

    return cp.vec(expr, order="C") if len(tuple(expr.shape)) > 1 else expr


# --------------------------------------------------------------- entrywise l_p
class Lp(Norm):
    """Entrywise l_p norm ||A||_p = (sum_j |A_j|^p)^{1/p}, 1 <= p <= inf.

    Dual: l_q with 1/p + 1/q = 1. Steepest direction (q the dual exponent):
        1 < p < inf:  D = sign(G) |G|^{q-1} / ||G||_q^{q-1}
        p = inf:      D = sign(G)                        (sign descent)
        p = 1:        D = sign(G_j) e_j on the maximisers j of |G_j|, split evenly
                      (the greedy coordinate rule)
    p = 2 is :class:`Frobenius`.
    """

    def __init__(self, p: float):
        p = float(p)
        if not (p >= 1):
            raise ValueError(f"an entrywise norm needs p >= 1; got p = {p}")
        self.p = p
        self.q = math.inf if p == 1 else (1.0 if math.isinf(p) else p / (p - 1.0))
        self.name = "l1" if p == 1 else ("linf" if math.isinf(p) else f"l{p:g}")
        self._exact_ops = p == 1 or math.isinf(p)

    @property
    def dual(self) -> Norm:
        return l_p(self.q)

    def _value(self, A1, dims):
        if math.isinf(self.p):
            return _max_abs(A1, dims)
        if self.p == 1:
            return A1.abs().sum(dims)
        return A1.abs().pow(self.p).sum(dims).pow(1.0 / self.p)

    def _steepest(self, G1, dims):
        if math.isinf(self.p):
            return G1.sign()
        if self.p == 1:
            top = G1.abs() == _expand(_max_abs(G1, dims), len(dims))
            cnt = top.sum(dims, keepdim=True).clamp_min(1)
            return G1.sign() * top / cnt
        q = self.q
        Dq = G1.abs().pow(q - 1.0)
        nq = G1.abs().pow(q).sum(dims).pow(1.0 / q)  # ||G1||_q >= 1 for a nonzero item
        nq = torch.where(nq > 0, nq, torch.ones_like(nq))
        return G1.sign() * Dq / _expand(nq.pow(q - 1.0), len(dims))

    def cvxpy(self, expr):
        import cvxpy as cp

        v = _vec(expr)
        if self.p == 1:
            return cp.norm1(v)
        if math.isinf(self.p):
            return cp.norm_inf(v)
        return cp.pnorm(v, self.p)


class Frobenius(Lp):
    """||A||_F = sqrt(sum A_j^2) (entrywise l_2), self-dual; steepest direction G / ||G||_F."""

    def __init__(self):
        super().__init__(2.0)
        self.name = "fro"
        self._exact_ops = True  # x^2 is x * x, and sqrt is correctly rounded
        self.euclidean = True

    @property
    def dual(self) -> Norm:
        return self

    def _value(self, A1, dims):
        return A1.pow(2).sum(dims).sqrt()

    def _steepest(self, G1, dims):
        n = G1.pow(2).sum(dims).sqrt()  # G1 is Norm.steepest's own copy: divided in place
        return G1.div_(_expand(torch.where(n > 0, n, torch.ones_like(n)), len(dims)))

    def steepest_unit(self, G, vector: bool = False, inplace: bool = False):
        """G / ||G||_F for items with max |G| = 1 or 0 (:meth:`Norm.steepest_unit`): the
        same bits as :meth:`steepest` (G / max|G| is G itself; ||G||_F >= 1 > 0 exactly
        where max|G| > 0, NaN where it is NaN: the same items are set to 0) in a third
        of its ops; ``inplace``: divided in G's own buffer."""
        dims = _item_dims(G, vector)
        # the sum of squares ~4 MiB of items at a time (no G-sized temporary; each item's
        # sum is the same reduction, the same bits)
        item = G.numel() // G.shape[0] if G.shape[0] else 0
        rows = max(1, (4 << 20) // max(1, item * G.element_size()))
        # (keepdim: n in the shape that divides G)
        n = (G.pow(2).sum(dims, keepdim=True) if G.shape[0] <= rows else
             torch.cat([g.pow(2).sum(dims, keepdim=True) for g in G.split(rows)])).sqrt()
        # (the usual case: no zero or NaN item, fewer ops and passes; amin propagates NaN)
        if n.numel() and (n if n.numel() == 1 else n.amin()).item() > 0:
            return G.div_(n) if inplace else G / n
        pos = n > 0
        div = torch.where(pos, n, 1.0)
        D = G.div_(div) if inplace else G / div
        return D.masked_fill_(~pos, 0.0)  # a zero item (+0 for -0), a NaN one

    def cvxpy(self, expr):
        import cvxpy as cp

        return cp.norm(_vec(expr), 2)

    def objective(self, expr):
        import cvxpy as cp

        return 0.5 * cp.sum_squares(expr)


# ------------------------------------------------------------- spectral family
def _svd_rtol(G1) -> float:
    return max(G1.shape[-2:]) * float(torch.finfo(G1.dtype).eps)


class Nuclear(Norm):
    """||A||_* = sum_k sigma_k(A) (trace norm); dual: spectral. Steepest direction
    u_1 v_1^T (top singular pair; <G, D> = sigma_1(G)). Vectors: the l_2 norm."""

    name = "nuc"
    p = None
    solver = "SCS"

    @property
    def dual(self) -> Norm:
        return SPECTRAL

    def _value(self, A1, dims):
        if len(dims) == 1:
            return A1.pow(2).sum(-1).sqrt()
        return torch.linalg.svdvals(A1).sum(-1)

    def _steepest(self, G1, dims):
        if len(dims) == 1:
            return FRO._steepest(G1, dims)
        U, _, Vh = torch.linalg.svd(G1, full_matrices=False)
        return U[..., :, :1] @ Vh[..., :1, :]

    def cvxpy(self, expr):
        import cvxpy as cp

        if _is_vector_expr(expr):
            return cp.norm(_vec(expr), 2)
        return cp.normNuc(expr)


class Spectral(Norm):
    """||A||_op = sigma_1(A) (operator 2-norm); dual: nuclear. Steepest direction: the
    orthogonal polar factor U V^T of G (singular values > max(d, e) eps sigma_1 kept),
    the update of spectral descent / Muon; <G, D> = ||G||_*. Vectors: the l_2 norm."""

    name = "spectral"
    p = None
    solver = "SCS"

    @property
    def dual(self) -> Norm:
        return NUC

    def _value(self, A1, dims):
        if len(dims) == 1:
            return A1.pow(2).sum(-1).sqrt()
        return torch.linalg.matrix_norm(A1, ord=2)

    def _steepest(self, G1, dims):
        if len(dims) == 1:
            return FRO._steepest(G1, dims)
        return polar(G1)

    def cvxpy(self, expr):
        import cvxpy as cp

        if _is_vector_expr(expr):
            return cp.norm(_vec(expr), 2)
        return cp.sigma_max(expr)


def polar(G: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """Orthogonal polar factor U_r V_r^T of G (..., d, e) by SVD, over the singular values
    > rtol * sigma_1 (default max(d, e) * eps): the direction of spectral descent."""
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    tol = (_svd_rtol(G) if rtol is None else rtol) * S[..., :1]
    keep = (S > tol).to(G.dtype)
    return (U * keep[..., None, :]) @ Vh


# ------------------------------------------------------------------- registry
FRO = Frobenius()
NUC = Nuclear()
SPECTRAL = Spectral()
L1 = Lp(1.0)
LINF = Lp(math.inf)

#: the named norms, by canonical name (entrywise l_p for other p via ``get_norm(p)``)
NORMS: dict[str, Norm] = {N.name: N for N in (FRO, NUC, SPECTRAL, L1, LINF)}

_ALIASES = {
    "fro": FRO, "frobenius": FRO, "l2": FRO, "2": FRO, "f": FRO,
    "nuc": NUC, "nuclear": NUC, "trace": NUC,
    "spectral": SPECTRAL, "spec": SPECTRAL, "op": SPECTRAL, "operator": SPECTRAL,
    "l1": L1, "1": L1,
    "linf": LINF, "inf": LINF, "max": LINF, "l_inf": LINF,
}


def register_norm(norm: Norm, *aliases: str) -> Norm:
    """Add ``norm`` to :data:`NORMS` under ``norm.name``, and its ``aliases`` (case-free) to
    the names :func:`get_norm` knows; returns ``norm`` (usable as a class decorator's
    instance: ``register_norm(MyNorm(), "mine")``). Then ``get_norm("mine")``,
    ``nsd(norm="mine")``, ``att_svm(..., norm="mine")`` (solved by cvxpy with
    :meth:`Norm.cvxpy`, certified with ``norm.dual``) and ``attnsvm solve --norm mine``
    use it. A ValueError names a name already taken by another norm (registering an
    instance of the same class and name again replaces it)."""
    if not isinstance(norm, Norm) or not norm.name:
        raise ValueError(f"register_norm needs a Norm instance with a name; got {norm!r}")
    keys = [norm.name.strip().lower(), *(a.strip().lower() for a in aliases)]
    for k in keys:
        taken = _ALIASES.get(k, NORMS.get(k))
        if taken is not None and not (type(taken) is type(norm) and taken.name == norm.name):
            raise ValueError(f"norm name {k!r} is taken by {taken!r}")
    NORMS[norm.name] = norm
    for k in keys:
        _ALIASES[k] = norm
    return norm


def l_p(p: float) -> Norm:
    """The entrywise l_p norm (p = 2 gives :data:`FRO`, 1 :data:`L1`, inf :data:`LINF`)."""
    p = float(p)
    if p == 2:
        return FRO
    if p == 1:
        return L1
    if math.isinf(p) and p > 0:
        return LINF
    return Lp(p)


def get_norm(spec) -> Norm:
    """A :class:`Norm` from a name, a number p >= 1, or a Norm (returned unchanged).

    Names: "fro" (aliases "frobenius", "l2", 2), "nuc" ("nuclear", "trace"), "spectral"
    ("op", "spec"), "l1" (1), "linf" ("inf", "max", inf), ``"l<p>"`` or a float p for the
    entrywise l_p norm (e.g. "l3", "l1.5", 1.75)."""
    if type(spec) is str and spec in _ALIASES:  # (the common case: a registered name as
        return _ALIASES[spec]  # given; its keys are stored stripped and lower-case)
    if isinstance(spec, Norm):
        return spec
    if isinstance(spec, bool):
        raise ValueError(f"norm must be a name or a number p >= 1; got {spec!r}")
    if isinstance(spec, (int, float, np.integer, np.floating)):
        p = float(spec)
        if not (p >= 1):
            raise ValueError(f"an entrywise norm needs p >= 1; got p = {spec!r}")
        return l_p(p)
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key in _ALIASES:
            return _ALIASES[key]
        num = key[1:] if key.startswith("l") else key
        num = num[1:] if num.startswith("_") else num
        try:
            p = float(num)
        except ValueError:
            p = None
        if p is not None:
            if not p >= 1:
                raise ValueError(f"an entrywise norm needs p >= 1; got {spec!r}")
            return l_p(p)
        known = ", ".join(sorted({N.name for N in _ALIASES.values()}))
        raise ValueError(f"unknown norm {spec!r}; use one of {known} or 'l<p>' / a number "
                         f"p >= 1 (entrywise l_p)")
    raise ValueError(f"norm must be a name or a number p >= 1; got {type(spec).__name__}")
