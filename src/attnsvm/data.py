"""Token data: the ``TokenData`` container and seeded generators (docs/theory.md §1).

A dataset holds n sequences ``X[i]`` in R^{T x d} (rows are tokens x_{i1}..x_{iT}),
labels ``y[i]`` in {-1, +1} (seq-to-seq: ``y[i, k]``), optional cross-attention
queries ``z[i]`` in R^d, an optional padding ``mask`` (True = valid token) and an
optional fixed linear head ``v`` in R^d.

A leading batch dimension B holds B independent datasets (one per trial): X is then
(B, n, T, d), y (B, n) [or (B, n, T)], z (B, n, d), mask (B, n, T), v (B, d).
Shared parts given without B are broadcast to B at construction.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from ._files import atomic_write
from ._shapes import axis_size
from ._validation import as_numpy

__all__ = [
    "TokenData",
    "load_arrays",
    "stack",
    "random_sphere",
    "planted",
    "gaussian_mixture",
    "mmts_fig1",
    "mmts_fig1_multi",
    "mmts_fig3",
    "mirror_joint_toy",
    "MMTS_FIG1_W",
    "NAMED",
]


def _as_float(name: str, a) -> np.ndarray:
    """``a`` as a C-contiguous float64 array; refuses None, complex, string, object, ragged
    and non-finite input with a ValueError naming the field."""
    if a is None:
        what = {"X": "tokens X of shape (n, T, d)", "y": "labels y of shape (n,)"}.get(name, name)
        raise ValueError(f"{name} is None; TokenData needs {what}")
    a = as_numpy(a, name)  # a torch tensor is read detached (requires_grad, GPU)
    try:
        raw = np.asarray(a)
    except (TypeError, ValueError):  # ragged nested lists
        raise ValueError(f"{name} must be a numeric array; got a ragged {type(a).__name__} "
                         f"(rows of different lengths)") from None
    kind = raw.dtype.kind
    if kind == "c":
        raise ValueError(f"{name} is complex ({raw.dtype}); TokenData holds real arrays")
    if kind in "USa":
        raise ValueError(f"{name} holds strings ({raw.dtype}), not numbers")
    if kind == "O":
        raise ValueError(f"{name} is an object array (dtype object, e.g. Python objects or "
                         f"None entries); TokenData holds numeric arrays only")
    if kind not in "biuf":
        raise ValueError(f"{name} must be a numeric array; got dtype {raw.dtype}")
    arr = raw.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return np.ascontiguousarray(arr)


def _as_labels(y) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels ``y`` as float64 in {-1, +1} and the original pair (negative, positive), or
    None when ``y`` already holds only -1 and +1.

    Any two distinct values are accepted (numbers, booleans, strings), as scikit-learn
    does: sorted, the first becomes -1 and the second +1 (0 / 1 -> -1 / +1, False / True
    -> -1 / +1, "cat" / "dog" -> -1 / +1). One value other than -1 / +1, three or more
    values, or NaN are a ValueError naming the values."""
    if y is None:
        return _as_float("y", y), None
    try:
        raw = np.asarray(y)
    except (TypeError, ValueError):
        return _as_float("y", y), None  # ragged: _as_float names it
    if raw.dtype.kind in "US" or raw.dtype.kind == "b":
        vals = np.unique(raw)
        if vals.size != 2:
            raise ValueError(f"y must hold two distinct labels (any two values, mapped to -1 "
                             f"and +1); got {vals.size}: {vals[:5].tolist()}")
        return np.where(raw == vals[1], 1.0, -1.0), vals
    arr = _as_float("y", raw)
    if np.all(np.abs(arr) == 1.0):
        return arr, None
    vals = np.unique(raw) if raw.dtype.kind in "iu" else np.unique(arr)  # ints stay ints
    if vals.size != 2:
        what = "one value" if vals.size == 1 else f"{vals.size} values"
        raise ValueError(f"y must contain labels in {{-1, +1}} or any two distinct values "
                         f"(mapped to -1 and +1); got {what}: {vals[:5].tolist()}")
    return np.where(arr == float(vals[1]), 1.0, -1.0), vals


def _check_shape(name: str, arr: np.ndarray, expected: tuple, batch: int | None,
                 symbols: str) -> np.ndarray:
    """Accept ``expected`` or (batch, *expected); broadcast shared arrays to the batch.

    ``symbols`` names the dims, e.g. "(n, d)"; the error says expected vs actual shape.
    """
    full = expected if batch is None else (batch, *expected)
    if arr.shape == full:
        return arr
    if batch is not None and arr.shape == expected:
        return np.ascontiguousarray(np.broadcast_to(arr, full))
    sym = symbols if batch is None else "(B, " + symbols[1:]
    raise ValueError(f"{name} must have shape {sym} = {full}; got {arr.shape}")


@dataclass(frozen=True, eq=False)
class TokenData:
    """n sequences of T tokens in R^d, labels, optional queries/mask/head (docs/theory.md §1).

    Fields (numpy float64; mask bool). Unbatched shapes, batched add a leading B:
        X: (n, T, d) tokens;  y: (n,) labels in {-1, +1} or (n, T) for seq-to-seq
           (any two distinct values are mapped to -1 / +1, sorted: 0 / 1, False / True,
           "a" / "b"; ``label_map`` reports the mapping);
        z: (n, d) cross-attention queries or None (self-attention);
        mask: (n, T) bool, True = valid token, or None (all valid);
        v: (d,) fixed linear head or None (trained head).
    Validation raises ValueError naming the field and the expected vs actual shape.
    """

    X: np.ndarray
    y: np.ndarray
    z: np.ndarray | None = None
    mask: np.ndarray | None = None
    v: np.ndarray | None = None

    def __post_init__(self):
        X = _as_float("X", self.X)
        if X.ndim not in (3, 4):
            raise ValueError(f"X must have shape (n, T, d) or (B, n, T, d); got {X.shape}")
        if X.ndim == 4 and X.shape[0] == 0:
            raise ValueError(f"X has an empty batch (B = 0); got shape {X.shape}")
        n, T, d = X.shape[-3:]
        if n == 0:
            raise ValueError(f"X is empty (n = 0 sequences); got shape {X.shape}")
        if T == 0:
            raise ValueError(f"X has no tokens (T = 0 tokens per sequence); got shape {X.shape}")
        if d == 0:
            raise ValueError(f"X has empty tokens (d = 0 features per token); got shape {X.shape}")
        if T < 2:
            raise ValueError(f"X must have T >= 2 tokens per sequence; got T = {T} (shape {X.shape})")
        B = X.shape[0] if X.ndim == 4 else None
        object.__setattr__(self, "X", X)

        y, labels = _as_labels(self.y)
        object.__setattr__(self, "_labels", labels)
        # Seq-to-seq labels are (n, T) or (B, n, T). With batched X and B == n, (B, n) is
        # read as one label per sequence and trial; shared seq-to-seq labels are then
        # ambiguous and must be given as (B, n, T).
        seq = y.shape == (B, n, T) or (y.shape == (n, T) and y.shape != (B, n))
        y = _check_shape("y", y, (n, T) if seq else (n,), B, "(n, T)" if seq else "(n,)")
        if not np.all(np.abs(y) == 1.0):
            bad = np.unique(y[np.abs(y) != 1.0])[:5]
            raise ValueError(f"y must contain labels in {{-1, +1}}; got values {bad.tolist()}")
        object.__setattr__(self, "y", y)

        if self.z is not None:
            object.__setattr__(self, "z", _check_shape("z", _as_float("z", self.z), (n, d), B, "(n, d)"))
        if self.v is not None:
            object.__setattr__(self, "v", _check_shape("v", _as_float("v", self.v), (d,), B, "(d,)"))
        if self.mask is not None:
            m = np.asarray(as_numpy(self.mask, "mask"))
            if m.dtype != np.bool_:
                if m.dtype.kind not in "iuf" or not np.all((m == 0) | (m == 1)):
                    raise ValueError(f"mask must be boolean (True = valid token); got dtype "
                                     f"{m.dtype}" + ("" if m.dtype.kind not in "iuf" else
                                                     " with values other than 0 and 1"))
                m = m.astype(bool)
            m = _check_shape("mask", np.ascontiguousarray(m), (n, T), B, "(n, T)")
            if not np.all(m.any(axis=-1)):
                raise ValueError("mask must leave at least one valid token per sequence")
            object.__setattr__(self, "mask", m)

    # ----------------------------------------------------------------- labels
    @property
    def label_map(self) -> dict | None:
        """{original label: -1 or +1} when y was given as two values other than -1 / +1
        (e.g. ``{0: -1, 1: 1}``), else None (y already in {-1, +1})."""
        if self._labels is None:
            return None
        neg, pos = (v.item() if hasattr(v, "item") else v for v in self._labels)
        return {neg: -1, pos: 1}

    def label_note(self) -> str:
        """The mapping in words, e.g. "labels 0 -> -1, 1 -> +1" ("" when there is none)."""
        m = self.label_map
        if m is None:
            return ""
        return "labels " + ", ".join(f"{k!r} -> {v:+d}" if isinstance(k, str) else
                                     f"{k:g} -> {v:+d}" if isinstance(k, float) else
                                     f"{k} -> {v:+d}" for k, v in m.items())

    def _keep_labels(self, other: TokenData) -> TokenData:
        """``other`` with this dataset's label mapping (its y is this y, already mapped)."""
        if self._labels is not None and other._labels is None:
            object.__setattr__(other, "_labels", self._labels)
        return other

    # ----------------------------------------------------------------- shapes
    @property
    def batched(self) -> bool:
        """Whether the data hold B datasets (X of shape (B, n, T, d))."""
        return self.X.ndim == 4

    @property
    def B(self) -> int | None:
        """Number of datasets B of batched data (None when unbatched)."""
        return self.X.shape[0] if self.batched else None

    n = axis_size("X", -3, "Number of sequences n per dataset.")
    T = axis_size("X", -2, "Number of tokens T per sequence.")
    d = axis_size("X", -1, "Token dimension d.")

    @property
    def seq2seq(self) -> bool:
        """True when y holds one label per query token: y (…, n, T)."""
        return self.y.ndim == self.X.ndim - 1

    # ----------------------------------------------------------------- scores
    @property
    def gamma(self) -> np.ndarray:
        """Token scores gamma_{it} = y_i v^T x_{it}, shape (..., n, T).

        Seq-to-seq: gamma_{ikt} = y_{ik} v^T x_{it}, shape (..., n, T, T) (query k, key t).
        Masked tokens get -inf. Needs the fixed head v.
        """
        from .scores import scores

        if self.v is None:
            raise ValueError("gamma needs the fixed linear head v; this TokenData has v = None")
        return scores(self.X, self.y, self.v, self.mask)

    @property
    def opt(self) -> np.ndarray:
        """Globally optimal token index opt_i = argmax_t gamma_{it}, shape (..., n) [(…, n, T)]."""
        from .scores import opt_tokens

        return opt_tokens(self.gamma)

    # -------------------------------------------------------------- batching
    def trial(self, b: int) -> TokenData:
        """The unbatched dataset of trial b (batched data only)."""
        if not self.batched:
            raise ValueError("trial(b) needs batched TokenData (X of shape (B, n, T, d))")
        return self._keep_labels(TokenData(**{
            f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[b])
            for f in fields(self)}))

    def broadcast(self, B: int) -> TokenData:
        """Batched copy with B identical trials (no-op check if already batched with B)."""
        if self.batched:
            if self.B != B:
                raise ValueError(f"data has batch B = {self.B}; cannot broadcast to B = {B}")
            return self
        return stack([self] * B)

    def replace(self, **changes) -> TokenData:
        """A validated copy with some fields replaced (the label mapping kept unless y is)."""
        out = replace(self, **changes)
        return out if "y" in changes else self._keep_labels(out)

    # ----------------------------------------------------------------- torch
    def to_torch(self, device=None, dtype=None) -> dict:
        """Dict of torch tensors {X, y, z, mask, v} (None kept); float fields in ``dtype``."""
        import torch

        dtype = torch.float64 if dtype is None else dtype
        out = {}
        for f in fields(self):
            a = getattr(self, f.name)
            if a is None:
                out[f.name] = None
            elif f.name == "mask":
                out[f.name] = torch.as_tensor(a, device=device)
            else:
                out[f.name] = torch.as_tensor(a, device=device, dtype=dtype)
        return out

    # ------------------------------------------------------------------- I/O
    def save(self, path) -> Path:
        """Write to ``path`` (.npz, no pickles); absent fields are not stored.

        The file is written under a temporary name and renamed, so an interrupted save
        never leaves a truncated file at ``path``.
        """
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"{path}: is a directory; give a file name such as {path / 'data.npz'}")
        if not path.parent.is_dir():
            raise ValueError(f"{path}: cannot write: the folder {path.parent} does not exist")
        arrays = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if self._labels is not None:  # the original labels (negative, positive): no pickles
            arrays["labels"] = np.asarray(self._labels)
        def write(tmp):
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)

        return atomic_write(path, write)

    @classmethod
    def load(cls, path) -> TokenData:
        """Read a .npz written by ``save`` (``allow_pickle=False``) and validate it.

        Every problem with the file (missing, a folder, not an .npz archive, truncated,
        a missing or pickled array, invalid contents) is a ValueError naming the file.
        """
        arrays = load_arrays(path, required=("X", "y"), optional=("z", "mask", "v", "labels"))
        labels = arrays.pop("labels", None)
        try:
            data = cls(**arrays)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if labels is not None and labels.shape == (2,) and data._labels is None:
            object.__setattr__(data, "_labels", labels)
        return data

    def __repr__(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name).shape}" for f in fields(self)
                 if getattr(self, f.name) is not None]
        if self._labels is not None:
            parts.append(self.label_note())
        return "TokenData(" + ", ".join(parts) + ")"


# ----------------------------------------------------------------------- .npz I/O
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty archive
_NPY_MAGIC = b"\x93NUMPY"


def _describe_start(head: bytes) -> str:
    """What a non-.npz file looks like, from its first bytes (for the error message)."""
    if head.startswith(_NPY_MAGIC):
        return ("a plain .npy array, not an .npz archive of named arrays; save with "
                "TokenData.save or np.savez(path, X=..., y=...)")
    if head[:1] == b"\x80":
        return "a Python pickle, not an .npz archive (attnsvm does not load pickles)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\r\n\t" for c in text):
        return f"a text file (it starts with {text[:24]!r}), not an .npz archive"
    return f"not an .npz archive (it starts with {head[:8]!r})"


def load_arrays(path, required=("X", "y"), optional=()) -> dict[str, np.ndarray]:
    """The arrays ``required + optional`` of the .npz file ``path`` (absent optional
    arrays are left out), read with ``allow_pickle=False``.

    Raises ValueError naming the file and the problem: no such file, a folder, an empty,
    truncated or corrupt file, a plain .npy / pickle / text file, a missing required
    array, an array of Python objects (pickled), or a member that is not a .npy array.
    """
    import zipfile
    import zlib

    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p}: no such file")
    if p.is_dir():
        raise ValueError(f"{p}: is a directory, not an .npz file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise ValueError(f"{p}: cannot read the file ({exc.strerror or exc})") from None
    if not head:
        raise ValueError(f"{p}: the file is empty (0 bytes), not an .npz archive")
    if not head.startswith(_ZIP_MAGIC):
        raise ValueError(f"{p}: is {_describe_start(head)}")
    broken = (zipfile.BadZipFile, zlib.error, EOFError, OSError)
    try:
        npz = np.load(p, allow_pickle=False)
    except broken as exc:
        raise ValueError(f"{p}: the .npz archive is truncated or corrupt ({exc})") from None
    out = {}
    with npz as f:
        missing = [k for k in required if k not in f.files]
        if missing:
            raise ValueError(f"{p}: missing required arrays {missing}; the file has {f.files}")
        for k in (*required, *optional):
            if k not in f.files:
                continue
            try:
                a = f[k]
            except ValueError as exc:
                if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
                    raise ValueError(
                        f"{p}: array {k!r} holds Python objects (a pickled object array), "
                        f"which attnsvm does not load (allow_pickle=False); store numeric "
                        f"arrays only and leave absent fields out (np.savez(..., {k}=None) "
                        f"writes such an array)") from None
                raise ValueError(f"{p}: array {k!r} cannot be read ({exc})") from None
            except broken as exc:
                raise ValueError(f"{p}: array {k!r} is truncated or corrupt ({exc})") from None
            if not isinstance(a, np.ndarray):
                raise ValueError(f"{p}: member {k!r} of the archive is not a .npy array")
            out[k] = a
    return out


def stack(items: list[TokenData]) -> TokenData:
    """Stack unbatched datasets of equal shapes into one batched TokenData (B = len(items))."""
    items = list(items)
    if not items:
        raise ValueError("stack needs a non-empty list of TokenData")
    if any(t.batched for t in items):
        raise ValueError("stack takes unbatched TokenData (X of shape (n, T, d))")
    out = {}
    for f in fields(TokenData):
        vals = [getattr(t, f.name) for t in items]
        if all(v is None for v in vals):
            out[f.name] = None
        elif any(v is None for v in vals):
            raise ValueError(f"stack: field {f.name} is None in some datasets but not others")
        else:
            shapes = {v.shape for v in vals}
            if len(shapes) > 1:
                raise ValueError(f"stack: field {f.name} has different shapes {sorted(shapes)}")
            out[f.name] = np.stack(vals)
    return TokenData(**out)


# ---------------------------------------------------------------- generators
def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _lead(batch: int | None) -> tuple:
    return () if batch is None else (int(batch),)


def random_sphere(n: int = 6, T: int = 8, d: int = 10, seed: int = 0, batch: int | None = None,
                  cross: bool = True) -> TokenData:
    """Monte-Carlo setting of the papers: tokens x_{it}, queries z_i and head v uniform on
    the unit sphere S^{d-1}, labels y_i uniform in {-1, +1}.

    Shapes: X (n, T, d), z (n, d) (None if ``cross=False``), v (d,), y (n,);
    with ``batch=B`` each trial gets its own draw: leading B on every field.
    """
    rng = np.random.default_rng(seed)
    L = _lead(batch)
    X = _unit(rng.standard_normal((*L, n, T, d)))
    z = _unit(rng.standard_normal((*L, n, d)))
    v = _unit(rng.standard_normal((*L, d)))
    y = rng.choice(np.array([-1.0, 1.0]), size=(*L, n))
    return TokenData(X=X, y=y, z=z if cross else None, v=v)


def planted(n: int = 4, T: int = 4, d: int | None = None, seed: int = 0, batch: int | None = None,
            opt: np.ndarray | int | None = None, score_gap: float = 0.5, cross: bool = True) -> TokenData:
    """Planted optimal token per sequence with near-orthogonal noise (d >= nT regime).

    Tokens: x_{it} = P_v^perp g_{it} + y_i gamma_{it} v with g_{it} ~ N(0, I_d / d)
    (nearly orthogonal for d >> nT), head v = e_1, score gamma_{i,opt_i} = 1 and
    gamma_{it} ~ U(-1, 1 - score_gap) for t != opt_i, so opt_i is the unique optimum.
    ``opt``: int or (n,) array of planted indices (default: random per sequence).
    Queries z_i ~ unit sphere (``cross=True``) or None. d defaults to n*T + 1.
    Shapes as ``random_sphere``; with ``batch=B`` a leading B.
    """
    d = n * T + 1 if d is None else d
    if d < 2:
        raise ValueError(f"planted needs d >= 2; got d = {d}")
    rng = np.random.default_rng(seed)
    L = _lead(batch)
    G = rng.standard_normal((*L, n, T, d)) / np.sqrt(d)
    G[..., 0] = 0.0
    if opt is None:
        alpha = rng.integers(0, T, size=(*L, n))
    else:
        alpha = np.broadcast_to(np.asarray(opt, dtype=np.int64), (*L, n))
    gam = rng.uniform(-1.0, 1.0 - score_gap, size=(*L, n, T))
    np.put_along_axis(gam, alpha[..., None], 1.0, axis=-1)
    y = rng.choice(np.array([-1.0, 1.0]), size=(*L, n))
    G[..., 0] = y[..., None] * gam
    z = _unit(rng.standard_normal((*L, n, d)))
    v = np.zeros((*L, d))
    v[..., 0] = 1.0
    return TokenData(X=G, y=y, z=z if cross else None, v=v)


def gaussian_mixture(n: int = 20, T: int = 8, d: int = 10, seed: int = 0, batch: int | None = None,
                     snr: float = 2.0, sigma: float = 1.0 / 3.0, cross: bool = True) -> TokenData:
    """Gaussian-mixture data for joint (W, v) training (no fixed head: v = None).

    One relevant token per sequence at a random position r_i: x_{i r_i} = y_i mu + sigma g,
    the others x_{it} = sigma g (g ~ N(0, I_d / d)), with mu = snr * e_1 / ||e_1||
    shared by all trials; y_i uniform in {-1, +1}. Queries z_i = q + sigma g' with q = e_2
    (cross) or None. The ideal head is v ∝ mu and the ideal attention selects r_i.
    """
    if d < 2:
        raise ValueError(f"gaussian_mixture needs d >= 2; got d = {d}")
    rng = np.random.default_rng(seed)
    L = _lead(batch)
    X = sigma * rng.standard_normal((*L, n, T, d)) / np.sqrt(d)
    y = rng.choice(np.array([-1.0, 1.0]), size=(*L, n))
    r = rng.integers(0, T, size=(*L, n))
    mu = np.zeros(d)
    mu[0] = snr
    rel = np.take_along_axis(X, r[..., None, None], axis=-2) + y[..., None, None] * mu
    np.put_along_axis(X, r[..., None, None], rel, axis=-2)
    q = np.zeros(d)
    q[1] = 1.0
    z = q + sigma * rng.standard_normal((*L, n, d)) / np.sqrt(d)
    return TokenData(X=X, y=y, z=z if cross else None)


# ------------------------------------------------------ the papers' datasets
#: Fixed key-query matrix of the prompt model in ``mmts_fig1`` (W = W_K^T W_Q = diag(1,1,0)).
MMTS_FIG1_W = np.diag([1.0, 1.0, 0.0])


def mmts_fig1(s: float = 0.9) -> TokenData:
    """Max-Margin Token Selection in Attention (Tarzanagh et al.), Fig. 1 (single sequence).

    Prompt model with fixed W = diag(1, 1, 0) (``MMTS_FIG1_W``) and head v = e_3, one
    sequence X = [(-0.1, 1, 1), (1, 0, 0.9), (0, 0, s)], y = +1. Scores gamma = (1, 0.9, s):
    token 0 is optimal; s = 0.9 gives global convergence, s = 0 the locally optimal case.
    Shapes: X (1, 3, 3), y (1,), v (3,), z None (the prompt p plays the query).
    """
    X = np.array([[[-0.1, 1.0, 1.0], [1.0, 0.0, 0.9], [0.0, 0.0, float(s)]]])
    return TokenData(X=X, y=np.array([1.0]), v=np.array([0.0, 0.0, 1.0]))


def mmts_fig1_multi(seed: int = 0) -> TokenData:
    """Max-Margin Token Selection in Attention, Fig. 1 (several sequences), prompt model.

    n = 3, T = 7, d = 3. First two coordinates: 0.2 N(0, 1) plus the shift (1, 0) for
    token 0, (-1, 1) for tokens 1-3 and (-0.5, -0.5) for tokens 4-6; third coordinate
    1 for token 0 and 0.5 otherwise (so v = e_3 makes token 0 optimal); y = +1.
    Use with the fixed W = ``MMTS_FIG1_W``.
    """
    rng = np.random.default_rng(seed)
    n, T = 3, 7
    shift = np.array([[1.0, 0.0]] + [[-1.0, 1.0]] * 3 + [[-0.5, -0.5]] * 3)
    X = np.empty((n, T, 3))
    X[..., :2] = 0.2 * rng.standard_normal((n, T, 2)) + shift
    X[..., 2] = 0.5
    X[:, 0, 2] = 1.0
    return TokenData(X=X, y=np.ones(n), v=np.array([0.0, 0.0, 1.0]))


def mmts_fig3(variant: str = "a") -> TokenData:
    """Max-Margin Token Selection in Attention, Fig. 3: joint (v, p) training, n=3, T=2, d=2.

    Sequence i = [(0, 0), u_i] with u = (1, 1), (1, -1), (0.5, 1) [variant "a"] or
    (1, 1), (1, -1), (0.5, 1.5) [variant "b"]; y = (1, -1, 1); head trained (v = None).
    """
    u3 = {"a": (0.5, 1.0), "b": (0.5, 1.5)}
    if variant not in u3:
        raise ValueError(f"variant must be 'a' or 'b'; got {variant!r}")
    U = np.array([(1.0, 1.0), (1.0, -1.0), u3[variant]])
    X = np.stack([np.zeros_like(U), U], axis=1)
    return TokenData(X=X, y=np.array([1.0, -1.0, 1.0]))


def mirror_joint_toy() -> TokenData:
    """Toy dataset of the l_p mirror-descent paper (joint (W, v) training figure).

    X = [[(-2.7, 1.2), (1.4, 2.1), (1.3, -0.1)], [(0.4, -2.2), (-1.1, -0.4), (0.9, 0.1)]],
    z_i = x_{i1} (the first token), y = (1, -1); head trained (v = None).
    Shapes: X (2, 3, 2), z (2, 2), y (2,).
    """
    X = np.array([[[-2.7, 1.2], [1.4, 2.1], [1.3, -0.1]],
                  [[0.4, -2.2], [-1.1, -0.4], [0.9, 0.1]]])
    return TokenData(X=X, y=np.array([1.0, -1.0]), z=X[:, 0, :].copy())


#: name -> constructor of the hand-built datasets.
NAMED = {
    "mmts_fig1": mmts_fig1,
    "mmts_fig1_multi": mmts_fig1_multi,
    "mmts_fig3": mmts_fig3,
    "mirror_joint_toy": mirror_joint_toy,
}


# ------------------------------------- populations around the Max-Margin Token Selection figures
def mmts_fig1_notebook(seeds=(0,)) -> TokenData:
    """Fig. 1(c) / Fig. 4 dataset exactly as drawn by the paper's ``multi_input_converge``
    notebook, one trial per seed: ``torch.Generator().manual_seed(seed)``, then

        X = 0.2 * randn(n, T, d)  (float32, as in the notebook, stored as float64)
        X[:, 0] += (1, 0, 0); X[:, 1:4] += (-1, 1, 0); X[:, 4:] += (-0.5, -0.5, 0)
        X[:, 0, 2] = 1 (optimal score); X[:, 1:, 2] = 0.5,   v = e_3, y = +1,

    n = 3, T = 7, d = 3 (use with ``MMTS_FIG1_W``). Seed 0 is the dataset of the paper's
    Figures 1(c) and 4. The same model as ``mmts_fig1_multi`` with torch's RNG, so a
    population over seeds 0..K-1 contains the paper's instance. Shapes (K, 3, 7, 3).
    """
    import torch

    n, T, d = 3, 7, 3
    shift = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [-0.5, -0.5, 0.0]])
    out = []
    for s in seeds:  # one generator per seed reproduces the notebook's draw exactly
        g = torch.Generator().manual_seed(int(s))
        X = torch.randn((n, T, d), generator=g) * 0.2
        X[:, 0] += shift[0]
        X[:, 1:(T + 1) // 2] += shift[1]
        X[:, -(T - 1) // 2:] += shift[2]
        X[:, 0, -1] = 1.0
        X[:, 1:, -1] = 0.5
        out.append(X.numpy().astype(np.float64))
    K = len(out)
    return TokenData(X=np.stack(out), y=np.ones((K, n)), v=np.tile([0.0, 0.0, 1.0], (K, 1)))


def jitter_keys(base: TokenData, batch: int, sigma: float = 0.2, seed: int = 0,
                keys: int = 2, tokens=None) -> TokenData:
    """A population around a hand-built dataset: ``batch`` copies of ``base`` (unbatched)
    whose first ``keys`` coordinates (the key coordinates of the Fig. 1 layout, where the
    last coordinate holds the score) get i.i.d. N(0, sigma^2) noise; the scores, labels
    and head are kept. Trial 0 is ``base`` itself (no noise), so the population contains
    the paper's instance; trial b > 0 uses the b-th noise draw of ``seed``, so a smaller
    batch is a prefix of a larger one. sigma = 0.2 is the noise level of the paper's own
    multi-input generator (``mmts_fig1_notebook``). ``tokens``: indices of the jittered
    tokens (default all). Shapes as ``base`` with a leading ``batch``.
    """
    if base.batched:
        raise ValueError("jitter_keys takes an unbatched base dataset")
    rng = np.random.default_rng(seed)
    X = np.repeat(base.X[None], batch, axis=0)
    sel = np.arange(base.T) if tokens is None else np.asarray(tokens)
    noise = rng.standard_normal((max(batch - 1, 0), base.n, base.T, keys))
    X[1:, :, sel, :keys] += sigma * noise[:, :, sel]
    extra = {f: np.repeat(getattr(base, f)[None], batch, axis=0)
             for f in ("y", "z", "mask", "v") if getattr(base, f) is not None}
    return TokenData(X=X, **extra)


def mmts_fig3_population(variant: str = "a", batch: int = 1, sigma: float = 0.2,
                         seed: int = 0) -> TokenData:
    """Populations around the two datasets of Fig. 3 (joint (v, p) training), trial 0 the
    paper's own (``mmts_fig3``), a smaller batch a prefix of a larger one.

    "a" (Theorem 5: every selected token u_i is a support vector of the head SVM
    v_mm = e_2): u_i = (t_i + sigma g_i, y_i) with the paper's t = (1, 1, 0.5), so every
    u_i stays on the margin y_i v^T u_i = 1 of v = e_2 (the assumption holds by construction).
    "b" (Theorem 6: some selected token is not a support vector): both coordinates of the
    paper's u_i get N(0, sigma^2) noise (generic data; which u_i are support vectors is
    data-dependent and must be checked). Shapes X (batch, 3, 2, 2), y (batch, 3).
    """
    base = mmts_fig3(variant)
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((max(batch - 1, 0), base.n, 2))
    X = np.repeat(base.X[None], batch, axis=0)
    if variant == "a":
        X[1:, :, 1, 0] += sigma * g[..., 0]
    else:
        X[1:, :, 1, :] += sigma * g
    return TokenData(X=X, y=np.repeat(base.y[None], batch, axis=0))
