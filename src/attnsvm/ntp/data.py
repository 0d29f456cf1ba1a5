"""Next-token-prediction data: a vocabulary, token-id sequences and next-token labels.

Li, Huang, Ildiz, Rawat, Oymak, "Mechanics of Next Token Prediction with Self-Attention"
(AISTATS 2024), docs/theory.md "Next-token prediction".

    E     (K, d)   the embedding of token k is the row e_k
    seqs  (n, T)   token ids s_i1 .. s_iT of sample i; its query token is k_i = s_iT
    y     (n,)     the next token of sample i (an id), or
          (n, L)   several acceptable next tokens (the local-convergence setting: the
                   tokens a trained model selects), padded with -1 (a list of lists of
                   different lengths is padded)

Every label must occur in its sequence (the paper's "realizable label" assumption: the
attention layer outputs a convex combination of the sequence's tokens, so it can only
predict a token it sees).  :class:`NTPData` checks all of it at construction.

Generators: :func:`ntp_random` is the paper's ``data_generator(choice='random')`` with
``next_data``'s rejection step (cyclic: at least one query token's priority graph has a
strongly connected component of two or more tokens; acyclic: none has), at the published
sizes :data:`PUBLISHED_SIZES`.  :func:`attnsvm.ntp.text.from_text` turns text into token
ids through a Hugging Face tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validation import INT64_MAX, Interval, Satisfies, check_param

__all__ = ["NTPData", "ntp_random", "load_ntp", "PUBLISHED_SIZES", "GRAPH_KINDS"]

#: the paper's experiment sizes (figure names): n samples, T tokens, K vocabulary, d dim
PUBLISHED_SIZES = {
    "n4T6K8d8": (4, 6, 8, 8),
    "n6T4K6d8": (6, 4, 6, 8),
    "n10T6K8d8": (10, 6, 8, 8),
}
GRAPH_KINDS = ("cyclic", "acyclic", "any")


def _as_array(a, name: str, what: str) -> np.ndarray:
    """``np.asarray(a)``, a ragged nesting (rows of different lengths) refused by name."""
    try:
        return np.asarray(a)
    except ValueError:  # numpy: "inhomogeneous shape" of a ragged list
        lengths = sorted({len(r) for r in a if hasattr(r, "__len__")}) if hasattr(a, "__iter__") \
            else []
        raise ValueError(f"{name} must be {what}; got a ragged list (rows of lengths "
                         f"{lengths})") from None


def _int_array(a, name: str, ndim: tuple[int, ...]) -> np.ndarray:
    arr = _as_array(a, name, "an array of integer token ids with rows of one length")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or (
            np.issubdtype(arr.dtype, np.floating) and arr.size and np.all(np.isfinite(arr))
            and np.all(arr == np.round(arr)))):
        if not (arr.size == 0 and arr.dtype != bool):
            raise ValueError(f"{name} must hold integer token ids; got dtype {arr.dtype}")
    if arr.ndim not in ndim:
        want = " or ".join(f"{k}-d" for k in ndim)
        raise ValueError(f"{name} must be {want}; got shape {arr.shape}")
    return arr.astype(np.int64)


def _pad_ragged(y):
    """A list of label lists of different lengths -> (n, L) padded with -1 (other input
    is returned as it is)."""
    if isinstance(y, (list, tuple)) and y and any(isinstance(r, (list, tuple, np.ndarray)) for r in y):
        rows = [np.atleast_1d(_as_array(r, f"y[{i}]", "a list of integer token ids"))
                for i, r in enumerate(y)]
        if any(r.ndim != 1 for r in rows):
            raise ValueError("y must be (n,) ids or (n, L) label sets")
        for i, r in enumerate(rows):
            if r.size and (r.dtype == bool or r.dtype.kind not in "iuf"):
                raise ValueError(f"y[{i}] must hold integer token ids; got {r.tolist()} "
                                 f"(dtype {r.dtype})")
        L = max(len(r) for r in rows)
        out = np.full((len(rows), max(L, 1)), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            if r.size and not (np.issubdtype(r.dtype, np.integer) or np.all(r == np.round(r))):
                raise ValueError(f"y[{i}] must hold integer token ids; got {r.tolist()}")
            out[i, :len(r)] = r
        return out
    return y


@dataclass(frozen=True)
class NTPData:
    """A validated NTP dataset (see the module docstring for the layout).

    Raises ValueError naming the argument for: E not a finite 2-d float array, seqs not
    (n, T) integer ids in [0, K), y not (n,) or (n, L) ids (-1 = padding in (n, L)), a
    sample without label, or a label that does not occur in its own sequence.

    Example::

        >>> import numpy as np
        >>> from attnsvm.ntp import NTPData
        >>> data = NTPData(E=np.eye(3), seqs=[[0, 1, 2], [1, 0, 2]], y=[0, 1])
        >>> data, data.query, data.X.shape
        (NTPData(n=2, T=3, K=3, d=3, single-label), array([2, 2]), (2, 3, 3))
    """

    E: np.ndarray
    seqs: np.ndarray
    y: np.ndarray

    def __post_init__(self):
        E = _as_array(self.E, "E", "a (K, d) array of token embeddings")
        if E.dtype == bool or E.dtype.kind not in "iuf":
            what = {"c": "complex numbers (the imaginary part would be dropped; pass E.real "
                         "where it is 0)", "U": "strings", "S": "bytes", "O": "Python objects",
                    "b": "booleans"}.get(E.dtype.kind, f"dtype {E.dtype}")
            raise ValueError(f"E must be a (K, d) array of finite real numbers; got {what}")
        if E.ndim != 2 or E.shape[0] < 1 or E.shape[1] < 1:
            raise ValueError(f"E must be a (K, d) array of token embeddings; got shape {np.shape(E)}")
        if not np.all(np.isfinite(E)):
            raise ValueError("E must hold finite real numbers")
        E = E.astype(float)
        K = E.shape[0]
        seqs = _int_array(self.seqs, "seqs", (2,))
        n, T = seqs.shape
        if n < 1 or T < 1:
            raise ValueError(f"seqs must be (n, T) with n, T >= 1; got shape {seqs.shape}")
        bad = (seqs < 0) | (seqs >= K)
        if bad.any():
            i, t = np.argwhere(bad)[0]
            raise ValueError(f"seqs[{i}, {t}] = {seqs[i, t]} is not a token id in [0, K={K})")
        y = _int_array(_pad_ragged(self.y), "y", (1, 2))
        if y.shape[0] != n:
            raise ValueError(f"y must have one row per sequence (n = {n}); got shape {y.shape}")
        Y = y[:, None] if y.ndim == 1 else y
        pad = Y == -1
        if y.ndim == 1 and pad.any():
            raise ValueError(f"y[{int(np.argmax(pad[:, 0]))}] = -1: every sample needs a label")
        badl = ~pad & ((Y < 0) | (Y >= K))
        if badl.any():
            i, j = np.argwhere(badl)[0]
            raise ValueError(f"y[{i}{'' if y.ndim == 1 else f', {j}'}] = {Y[i, j]} is not a token "
                             f"id in [0, K={K}) (or -1 padding in an (n, L) label array)")
        if pad.all(1).any():
            raise ValueError(f"sample {int(np.argmax(pad.all(1)))} has no label (all -1)")
        present = (Y[:, :, None] == seqs[:, None, :]).any(-1) | pad
        if not present.all():
            i, j = np.argwhere(~present)[0]
            raise ValueError(f"label y[{i}] = {Y[i, j]} does not occur in its sequence "
                             f"seqs[{i}] = {seqs[i].tolist()}: an attention layer can only "
                             "predict a token of its input (realizable labels)")
        object.__setattr__(self, "E", E)
        object.__setattr__(self, "seqs", seqs)
        object.__setattr__(self, "y", y)

    # ----------------------------------------------------------------- views
    K = property(lambda self: self.E.shape[0], doc="Vocabulary size K (rows of E), an int.")
    d = property(lambda self: self.E.shape[1], doc="Embedding dimension d (columns of E), an int.")
    n = property(lambda self: self.seqs.shape[0], doc="Number of sequences n, an int.")
    T = property(lambda self: self.seqs.shape[1],
                 doc="Sequence length T (the last token is the query), an int.")

    @property
    def query(self) -> np.ndarray:
        """k_i = s_iT, the last token of each sequence (n,)."""
        return self.seqs[:, -1]

    @property
    def X(self) -> np.ndarray:
        """Token embeddings of the sequences X_i = E[s_i]: (n, T, d)."""
        return self.E[self.seqs]

    @property
    def labels(self) -> np.ndarray:
        """Labels as (n, L) with -1 padding (L = 1 for single labels)."""
        return self.y[:, None] if self.y.ndim == 1 else self.y

    @property
    def multi_label(self) -> bool:
        """True when y is (n, L): several next tokens per sequence (the local setting)."""
        return self.y.ndim == 2

    def __repr__(self) -> str:
        kind = "multi-label" if self.multi_label else "single-label"
        return f"NTPData(n={self.n}, T={self.T}, K={self.K}, d={self.d}, {kind})"

    # ------------------------------------------------------------------- io
    def save(self, path) -> Path:
        """Write E, seqs, y to ``path`` (.npz, uncompressed; the suffix is added if
        missing).  :func:`load_ntp` reads it back (and validates it again)."""
        from attnsvm._files import atomic_write

        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(path.suffix + ".npz")

        def write(tmp):
            with open(tmp, "wb") as fh:  # a file object: np.savez adds no suffix
                np.savez(fh, E=self.E, seqs=self.seqs, y=self.y, kind=np.array("ntp"))

        return atomic_write(path, write)


#: what load_ntp expects, in its error messages
NTP_FILE = "an NTP data file (.npz with arrays E, seqs, y, as NTPData.save writes)"


def load_ntp(path) -> NTPData:
    """Read an :class:`NTPData` written by :meth:`NTPData.save` (no pickles).

    Raises FileNotFoundError where there is no file at ``path``; ValueError naming the file
    and what was expected for anything else: a folder, an empty, truncated or corrupt
    archive, a plain .npy, a text or pickle file, a missing array, an array of Python
    objects, or contents that fail a check of :class:`NTPData`.

    >>> import tempfile, pathlib
    >>> data = NTPData([[1.0, 0.0], [0.0, 1.0]], [[0, 1], [1, 1]], [0, 1])
    >>> path = data.save(pathlib.Path(tempfile.mkdtemp()) / "ntp.npz")
    >>> load_ntp(path)
    NTPData(n=2, T=2, K=2, d=2, single-label)
    """
    from attnsvm.data import load_arrays

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no NTP data file at {str(path)!r}")
    try:
        z = load_arrays(path, required=("E", "seqs", "y"))
    except ValueError as exc:
        raise ValueError(f"{exc}; expected {NTP_FILE}") from None
    try:
        return NTPData(z["E"], z["seqs"], z["y"])
    except ValueError as exc:
        raise ValueError(f"{path}: {exc} (in {NTP_FILE})") from None


# ---------------------------------------------------------------- generators
def _draw(rng, n, T, K, d):
    """One draw of the paper's data_generator(choice='random', rep_seq=False,
    check_label=True): E rows uniform on the unit sphere; T <= K distinct tokens per
    sequence (T > K: all K tokens then T - K repeated ones); labels uniform over the
    vocabulary, replaced by a uniformly chosen token of the sequence when absent."""
    E = rng.standard_normal((K, d))
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    if T <= K:
        seqs = np.argsort(rng.random((n, K)), axis=1)[:, :T]
    else:
        head = np.argsort(rng.random((n, K)), axis=1)
        seqs = np.concatenate([head, rng.integers(0, K, (n, T - K))], axis=1)
    y = rng.integers(0, K, n)
    absent = ~(seqs == y[:, None]).any(1)
    y = np.where(absent, seqs[np.arange(n), rng.integers(0, T, n)], y)
    return E, seqs, y


def ntp_random(n: int, T: int, K: int, d: int, graph: str = "any", seed=0,
               max_tries: int = 100_000) -> NTPData:
    """A random NTP dataset as in the paper's code (``data_utils.next_data`` with
    token_choice='random'), rejection-sampled until the priority graphs are ``graph``:

    "cyclic": some query token's graph G_k has an SCC with >= 2 tokens (then the
    Graph-SVM has equality constraints and W_fin is not 0); "acyclic": every SCC of
    every G_k is a single token; "any": no condition.  ``seed``: an int or a numpy
    SeedSequence entropy list.  Raises ValueError for bad sizes, RuntimeError when no
    draw in ``max_tries`` meets the condition.

    Example::

        >>> from attnsvm.ntp import ntp_random
        >>> data = ntp_random(4, 6, 8, 8, graph="cyclic", seed=0)   # the paper's n4T6K8d8 size
        >>> data
        NTPData(n=4, T=6, K=8, d=8, single-label)
    """
    from .graph import scc_table

    for name, v in (("n", n), ("T", T), ("K", K), ("d", d)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer; got {v!r}")
    if T < 2:
        raise ValueError(f"T must be >= 2 (a query token and at least one other); got {T}")
    if graph not in GRAPH_KINDS:
        raise ValueError(f"graph must be one of {GRAPH_KINDS}; got {graph!r}")
    seed = check_param("seed", seed, [Interval(int, 0, INT64_MAX), Satisfies(
        _seed_entropy, "an integer in [0, 2**63 - 1] or a list of such integers (SeedSequence "
        "entropy)")])
    max_tries = check_param("max_tries", max_tries, [Interval(int, 1, None)])
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        E, seqs, y = _draw(rng, n, T, K, d)
        if graph == "any":
            return NTPData(E, seqs, y)
        scc = scc_table(seqs, y, K)
        cyclic = _has_cycle(scc)
        if cyclic == (graph == "cyclic"):
            return NTPData(E, seqs, y)
    raise RuntimeError(f"no {graph} draw of size n={n}, T={T}, K={K} in {max_tries} tries")


def _seed_entropy(seed) -> list:
    """A SeedSequence entropy list: non-negative integers (ValueError otherwise)."""
    if isinstance(seed, (list, tuple)) and seed and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v <= INT64_MAX
            for v in seed):
        return [int(v) for v in seed]
    raise ValueError(f"seed must be an integer in [0, 2**63 - 1] or a non-empty list of such "
                     f"integers (SeedSequence entropy); got {seed!r}")


def _has_cycle(scc: np.ndarray) -> bool:
    """Whether some row of an SCC table (K, K) has a component of >= 2 tokens."""
    for row in scc:
        if row[0] < 0:
            continue
        if np.unique(row).size < row.size:
            return True
    return False
