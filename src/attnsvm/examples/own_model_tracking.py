"""Track how SVM-like the heads of your own transformer are while it trains.

A tiny GPT-2 built from a config (no download) learns a toy next-token task; at a few
steps the tracker records, per layer and head, attention sparsity, ||W|| with
W = W_k^T W_q / sqrt(d_h), the causal seq-to-seq SVM of the tokens the head selects (with
its certificate) and corr(W, W_mm) against a rotation null.

    attnsvm examples --copy ex && python ex/own_model_tracking.py        (about 30 s)
"""

from __future__ import annotations

import torch
import transformers

from attnsvm.track import Tracker

torch.manual_seed(0)
cfg = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                              bos_token_id=0, eos_token_id=0,
                              attn_implementation="eager")
model = transformers.GPT2LMHeadModel(cfg)

# toy data: sequences that repeat their first half, so attention has something to select
def batch(b=32, T=12):
    half = torch.randint(0, 32, (b, T // 2))
    return torch.cat([half, half], dim=1)

probe = {"input_ids": batch(4)}                      # a fixed held-out batch
tracker = Tracker(model, probe, steps=[0, 50, 150], tags={"optimizer": "adamw"})
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(151):
    tracker.step(step)                               # records at steps 0, 50, 150
    ids = batch()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()

t = tracker.table
print(tracker)
print(t.groupby("step")[["soft_sparsity", "wqk_norm", "corr_mm", "corr_rot_q95"]].median())
assert set(t.step) == {0, 50, 150} and len(t) == 3 * 2 * 2
