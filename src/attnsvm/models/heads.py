"""Output heads f = h(u) of the pooled token u = X^T s (docs/theory.md §2).

    "linear"   f = v^T u      v fixed (data.v) or trained (params["v"] (B, d))
    "relu"     f = 1^T ReLU(V^T u)   V (d, m) fixed or trained (params["V"] (B, d, m))
    callable   any torch function u (..., d) -> f (...)  (its own parameters are not trained)
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Head"]


class Head:
    """The head of a model: kind, whether it is trained, its width and fixed weights."""

    def __init__(self, d: int, head="linear", train_head: bool = False,
                 head_width: int | None = None, V=None):
        self.kind = head
        self.train = bool(train_head)
        self.V_fixed = None
        if isinstance(head, str):
            if head not in ("linear", "relu"):
                raise ValueError(f"head must be 'linear', 'relu' or a callable; got {head!r}")
            if head == "relu" and not train_head:
                if V is None:
                    raise ValueError("a fixed relu head needs V of shape (d, m) or (B, d, m)")
                self.V_fixed = np.asarray(V, dtype=np.float64)
                if self.V_fixed.ndim not in (2, 3) or self.V_fixed.shape[-2] != d:
                    raise ValueError(f"V must have shape (d, m) = ({d}, m) or (B, d, m); "
                                     f"got {self.V_fixed.shape}")
                head_width = self.V_fixed.shape[-1]
            self.width = int(head_width or d)
        elif callable(head):
            if train_head:
                raise ValueError("train_head=True is only for 'linear' and 'relu' heads")
            self.width = None
        else:
            raise ValueError(f"head must be 'linear', 'relu' or a callable; got {type(head).__name__}")
        self.d = d

    @property
    def param(self) -> str | None:
        """Name of the trained head tensor ("v" or "V"), or None."""
        if not self.train:
            return None
        return "v" if self.kind == "linear" else "V"

    def param_shape(self) -> tuple:
        """Per-trial shape of the trained head: v (d,) for a linear head, V (d, width) for relu."""
        return (self.d,) if self.kind == "linear" else (self.d, self.width)

    @property
    def fixed_linear(self) -> bool:
        """Whether this is a linear head with v fixed (not trained)."""
        return self.kind == "linear" and not self.train

    def __call__(self, params, U, data) -> torch.Tensor:
        """f (B, n, Q) from the pooled tokens U (B, n, Q, d)."""
        if self.kind == "linear":
            v = params["v"] if self.train else data.get("v")
            if v is None:
                raise ValueError("a fixed linear head needs data.v of shape (d,); got None")
            return (U @ v[:, None, :, None])[..., 0]
        if self.kind == "relu":
            V = params["V"] if self.train else torch.as_tensor(self.V_fixed, device=U.device,
                                                              dtype=U.dtype)
            if V.ndim == 2:
                V = V[None]
            return torch.relu(U @ V[:, None]).sum(-1)
        f = self.kind(U)
        if tuple(f.shape) != tuple(U.shape[:-1]):
            raise ValueError(f"head must map u of shape (..., d) to f of shape (...); got "
                             f"{tuple(U.shape)} -> {tuple(f.shape)}")
        return f
