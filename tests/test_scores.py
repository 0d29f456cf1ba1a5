"""gamma and opt have one home (attnsvm.scores): numpy and torch agree with a loop."""

from __future__ import annotations

import numpy as np
import torch

from attnsvm.scores import opt_tokens, scores


def _loop(X, y, v, mask=None):
    n, T, _ = X.shape
    seq = y.ndim == 2
    g = np.empty((n, T, T) if seq else (n, T))
    for i in range(n):
        for t in range(T):
            if seq:
                for k in range(T):
                    g[i, k, t] = y[i, k] * v @ X[i, t] if mask is None or mask[i, t] else -np.inf
            else:
                g[i, t] = y[i] * v @ X[i, t] if mask is None or mask[i, t] else -np.inf
    return g


def test_scores_numpy_torch_and_loop_agree():
    rng = np.random.default_rng(0)
    X, v = rng.standard_normal((4, 5, 3)), rng.standard_normal(3)
    mask = rng.random((4, 5)) > 0.3
    mask[:, 0] = True
    for y in (rng.choice([-1.0, 1.0], 4), rng.choice([-1.0, 1.0], (4, 5))):
        for m in (None, mask):
            ref = _loop(X, y, v, m)
            np.testing.assert_allclose(scores(X, y, v, m), ref)
            got = scores(torch.as_tensor(X), torch.as_tensor(y), torch.as_tensor(v),
                         None if m is None else torch.as_tensor(m))
            np.testing.assert_allclose(got.numpy(), ref)
            np.testing.assert_array_equal(opt_tokens(ref), opt_tokens(torch.as_tensor(ref)).numpy())
    # batched: a leading trial dim on every argument
    Xb, vb, yb = np.stack([X, 2 * X]), np.stack([v, -v]), np.stack([np.ones(4), -np.ones(4)])
    np.testing.assert_allclose(scores(Xb, yb, vb)[1], _loop(2 * X, -np.ones(4), -v))


def test_opt_ties_take_the_lowest_index():
    g = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    assert opt_tokens(g).tolist() == [1, 0] == opt_tokens(torch.as_tensor(g)).tolist()
