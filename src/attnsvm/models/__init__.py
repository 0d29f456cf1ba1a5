"""Batched one-layer attention models (docs/theory.md §2) and their stable objective (§8).

Read in this order: :mod:`.base` (the model: logits, attention, forward, objective),
:mod:`.params` (W, (K, Q), diagonal, prompt), :mod:`.attention` (queries, masks, the
softmax around its anchor), :mod:`.heads`, :mod:`.objective` (L, L - L* and the scaled
gradient, exact far past saturation), :mod:`.inputs` (data -> tensors).

    model = WModel(d, query="cross")          # or KQModel(d, m), DiagModel(d), PromptModel(d, W)
    params = model.init(B, seed=0)            # {"W": (B, d, d)}
    model.attention(params, data)             # (B, n, T)
    ev = model.evaluate(params, data, "logistic")   # ev.loss, ev.gap, ev.log_gap, ev.grads
"""

from .attention import QUERIES
from .base import INIT_KINDS, AttentionModel
from .inputs import prepare
from .objective import Objective
from .params import EPS, DiagModel, KQModel, PromptModel, WModel

# Short aliases used in the docs: attnsvm.models.W(d), KQ(d, m), Diag(d), Prompt(d, W_fixed)
W = WModel
KQ = KQModel
Diag = DiagModel
Prompt = PromptModel

#: the parameterisations by short name (``attnsvm train --model NAME`` lists these)
MODELS = {"W": WModel, "KQ": KQModel, "Diag": DiagModel, "Prompt": PromptModel}

__all__ = [
    "prepare", "AttentionModel", "Objective", "WModel", "KQModel", "DiagModel", "PromptModel",
    "W", "KQ", "Diag", "Prompt", "INIT_KINDS", "QUERIES", "EPS",
    "MODELS",
]
