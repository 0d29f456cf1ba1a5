"""A quick tour of attnsvm: train many trials at once, solve the max-margin problem with a
certificate, and ask which direction each run converged to.

    attnsvm examples --copy ex && python ex/quick_tour.py          (about 10 s on a laptop CPU)
"""

from __future__ import annotations

import numpy as np

from attnsvm import optim
from attnsvm.data import random_sphere
from attnsvm.models import WModel
from attnsvm.svm import att_svm, att_svm_batch
from attnsvm.tokens import outcome
from attnsvm.train import train

# 1. 64 independent datasets (tokens, queries and head on the unit sphere, labels +-1)
data = random_sphere(n=6, T=8, d=10, seed=0, batch=64)

# 2. normalised GD on the key-query matrix W of each trial, one batched float64 program
run = train(WModel(10), data, loss="logistic", optimizer=optim.get("ngd", lr=0.1), steps=1000)
print(run)

# 3. the tokens each run selected, and their max-margin SVM, certified
alpha = WModel(10).attention(run.params, data).numpy().argmax(-1)  # (64, 6)
svm = att_svm_batch(data.X, data.z, alpha)
print(svm)  # feasibility, worst violation and duality gap over the 64 problems
one = att_svm(data.X[0], data.z[0], alpha[0], norm="fro")
print(one.summary())

# 4. did each run converge to the globally optimal SVM (GMM), a local one (LMM), or neither?
table = outcome(run.W, data.X, data.y, data.v, data.z)
print(table.outcome.value_counts().to_string())
assert np.isfinite(table.corr_lmm.dropna()).all()

# 5. the same with another optimiser: sign descent's attention aligns with the l_inf SVM
sign = train(WModel(10), data.trial(0), optimizer="sign", steps=1500)
a0 = WModel(10).attention(sign.params, data.trial(0)).numpy().argmax(-1)[0]
for norm in ("fro", "linf"):
    W_mm = att_svm(data.X[0], data.z[0], a0, norm=norm).W_
    corr = float((sign.W[0] * W_mm).sum() / np.linalg.norm(sign.W[0]) / np.linalg.norm(W_mm))
    print(f"sign descent vs the {norm} SVM: corr {corr:.4f}")
