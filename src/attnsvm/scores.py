"""Token scores and optimal tokens (docs/theory.md §4), the one home of ``gamma`` and ``opt``.

    gamma_it = y_i v^T x_it                     (one label per sequence)
    gamma_ikt = y_ik v^T x_it                   (seq-to-seq: one label per query token k)
    opt_i = argmax_t gamma_it                   (ties: the lowest index)

numpy in -> numpy out, torch in -> torch out; batched over leading dims. Used by
``TokenData.gamma``, the SVM problems, the models' stable objective and the token
diagnostics.
"""

from __future__ import annotations

import numpy as np

__all__ = ["scores", "opt_tokens"]


def _is_torch(a) -> bool:
    return type(a).__module__.startswith("torch")


def scores(X, y, v, mask=None):
    """gamma = y v^T x with masked tokens at -inf.

    X (..., n, T, d); v (..., d); y (..., n) -> gamma (..., n, T), or seq-to-seq labels
    y (..., n, T) -> gamma (..., n, T, T) indexed [i, query k, key t]; mask (..., n, T)
    bool (True = valid token).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import scores
        >>> X = np.array([[[1.0, 0.0], [0.0, 2.0]]])
        >>> scores(X, y=np.array([1.0]), v=np.array([1.0, 1.0]))
        array([[1., 2.]])
    """
    if _is_torch(X):
        import torch

        vx = (X @ v[..., None, :, None])[..., 0]  # (..., n, T)
        y = torch.as_tensor(y, dtype=vx.dtype, device=vx.device)
        seq = y.ndim == X.ndim - 1
        g = y[..., :, :, None] * vx[..., :, None, :] if seq else y[..., None] * vx
        if mask is not None:
            m = torch.as_tensor(mask, dtype=torch.bool, device=vx.device)
            g = g.masked_fill(~(m[..., :, None, :] if seq else m), float("-inf"))
        return g
    X = np.asarray(X, dtype=float)
    v = np.asarray(v, dtype=float)
    y = np.asarray(y, dtype=float)
    vx = np.einsum("...ntd,...d->...nt", X, v)
    seq = y.ndim == X.ndim - 1
    g = y[..., :, :, None] * vx[..., :, None, :] if seq else y[..., None] * vx
    if mask is not None:
        m = np.asarray(mask, bool)
        g = np.where(m[..., :, None, :] if seq else m, g, -np.inf)
    return g


def opt_tokens(gamma):
    """opt = argmax_t gamma_t over the last dim (ties: the first, lowest index).

    Example::

        >>> import numpy as np
        >>> from attnsvm.svm import opt_tokens
        >>> opt_tokens(np.array([[1.0, 2.0, 0.5], [3.0, 1.0, 1.0]]))
        array([1, 0])
    """
    if _is_torch(gamma):
        return gamma.argmax(-1)
    return np.argmax(np.asarray(gamma), axis=-1)
