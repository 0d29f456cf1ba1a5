"""Your own token data: save it as an .npz, load it, and solve the attention SVM in several
norms with checkable certificates (and see an infeasible problem named).

    attnsvm examples --copy ex && python ex/own_data_svm.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from attnsvm.data import TokenData
from attnsvm.svm import att_svm, seq2seq_svm

rng = np.random.default_rng(1)
n, T, d = 5, 4, 6
X = rng.standard_normal((n, T, d))          # your tokens: n sequences of T tokens in R^d
z = rng.standard_normal((n, d))             # one query per sequence (e.g. a [CLS] state)
y = rng.choice([-1.0, 1.0], size=n)         # labels +-1
v = rng.standard_normal(d)                  # a fixed linear head

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "mine.npz"
    TokenData(X=X, y=y, z=z, v=v).save(path)  # keys X, y, z, v (and mask)
    data = TokenData.load(path)

# the SVM of the globally optimal tokens opt_i = argmax_t y_i v^T x_it, in four norms
for norm in ("fro", "nuc", "linf", "spectral"):
    sol = att_svm(data.X, data.z, "opt", y=data.y, v=data.v, norm=norm)
    print(sol)                               # ||W||, margin, violation, gap, status
    # the certificate is recomputed from W_ itself: check it once more by hand
    margins = np.einsum("itd,de,ie->it", data.X[np.arange(n), sol.alpha_][:, None] - data.X,
                        sol.W_, data.z)
    valid = np.arange(T)[None, :] != sol.alpha_[:, None]
    assert margins[valid].min() >= 1 - 1e-8

# self-attention, every token a query, causal
sol = seq2seq_svm(data.X, np.zeros((n, T), dtype=int), causal=True)
print(sol.summary())

# an infeasible problem: sequence 2 has two identical tokens and selects one of them
X_bad = data.X.copy()
X_bad[2, 1] = X_bad[2, 0]
bad = att_svm(X_bad, data.z, np.zeros(n, dtype=int))
print(bad)                                   # INFEASIBLE, conflict=[2]
assert not bad.feasible_ and 2 in bad.conflict_
