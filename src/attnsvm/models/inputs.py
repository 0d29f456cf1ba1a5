"""Data going into a model: ``TokenData`` (or a dict of arrays) -> dict of batched tensors."""

from __future__ import annotations

import torch

from attnsvm.data import TokenData

__all__ = ["prepare"]


def prepare(data, device=None, dtype=torch.float64) -> dict:
    """TokenData (or a dict of arrays) -> dict of tensors with a leading data-batch dim Bx.

    Keys X (Bx, n, T, d), y (Bx, n) or (Bx, n, T), z (Bx, n, d), mask (Bx, n, T), v (Bx, d)
    (None when absent). Unbatched data gets Bx = 1. A dict that is already prepared (X a
    4-d tensor) is returned as it is, with its step-independent caches.
    """
    if isinstance(data, dict) and isinstance(data.get("X"), torch.Tensor) and data["X"].ndim == 4:
        return data
    if isinstance(data, dict):
        data = TokenData(**{k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
                            for k, v in data.items()})
    if not isinstance(data, TokenData):
        raise ValueError(f"data must be a TokenData; got {type(data).__name__}")
    out = data.to_torch(device=device, dtype=dtype)
    if not data.batched:
        out = {k: (None if t is None else t[None]) for k, t in out.items()}
    return out
