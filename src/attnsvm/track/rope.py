"""Which max-margin problem does a trained rotary (RoPE) head approach? (docs/theory.md §11, "The
attention SVM of today's models").

One factored RoPE head, q = W_Q z, k_t = W_K x_t (W_Q, W_K: d_h x d), the query at position T
over keys at positions 0..T-1, logit a_t = scale (R_T q)^T (R_t k_t) = sum_l g_l(t - T) x_t^T
Theta_l z with the plane basis B_l = {E_b / sqrt 2, F_b / sqrt 2}, Theta_l = scale W_K^T B_l^T W_Q
and g_l(delta) = sqrt 2 (cos, sin)(delta theta_b). Trained by NGD (one global norm) with a fixed
linear head v and the logistic loss until the gradient underflows; then corr(Theta, .) with

- ``fro``: the Frobenius RoPE-SVM, min ||Theta||_F on the lifted keys x~_t = [g_l x_t]_l;
- ``group_nuclear``: min sum_b ||Theta_{E_b} + i Theta_{F_b}||_* (the factorisation's bias);
- ``no_lift``: the position-blind SVM min ||W||_F, (x_alpha - x_t)^T W z >= 1, against the
  offset-0 matrix sum_l Theta_l.

    python -m attnsvm.track.rope [SEEDS]       # the numbers quoted in docs/theory.md (3 seeds)

Our finding (not a paper claim); cvxpy (Clarabel, SCS) solves the SVMs.
"""

from __future__ import annotations

import numpy as np
import torch

from attnsvm.metrics import correlation

__all__ = ["plane_basis", "rope_rotations", "rope_head_study"]


def rope_rotations(P: int, d_head: int, base: float = 10.0):
    """(R (P, d_h, d_h), theta (d_h / 2,)): R_p rotates plane b = (2b, 2b + 1) by p theta_b,
    theta_b = base^(-2b / d_h).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track.rope import rope_rotations
    >>> R, theta = rope_rotations(5, 4)
    >>> R.shape, theta.round(4).tolist(), bool(np.allclose(R[2], R[1] @ R[1]))
    ((5, 4, 4), [1.0, 0.3162], True)

    ```
    """
    theta = base ** (-np.arange(0, d_head, 2) / d_head)
    R = np.zeros((P, d_head, d_head))
    for p in range(P):
        for b, t in enumerate(theta):
            c, s = np.cos(p * t), np.sin(p * t)
            R[p, 2 * b:2 * b + 2, 2 * b:2 * b + 2] = [[c, -s], [s, c]]
    return R, theta


def plane_basis(d_head: int) -> np.ndarray:
    """(d_h, d_h, d_h): E_0/sqrt2, F_0/sqrt2, E_1/sqrt2, ... (identity and quarter turn of
    each plane; orthonormal in the Frobenius inner product).

    ```pycon
    >>> import numpy as np
    >>> from attnsvm.track.rope import plane_basis
    >>> B = plane_basis(4)
    >>> bool(np.allclose(np.einsum("aij,bij->ab", B, B), np.eye(4)))    # orthonormal
    True

    ```
    """
    B = []
    for b in range(d_head // 2):
        E = np.zeros((d_head, d_head))
        F = np.zeros((d_head, d_head))
        E[2 * b, 2 * b] = E[2 * b + 1, 2 * b + 1] = 1
        F[2 * b, 2 * b + 1], F[2 * b + 1, 2 * b] = -1, 1
        B += [E / np.sqrt(2), F / np.sqrt(2)]
    return np.array(B)


def _corr(a, b):
    """corr(a, b) over all entries (:func:`attnsvm.metrics.correlation` of the flattened arrays)."""
    return float(correlation(np.ravel(a), np.ravel(b), vector=True))


def rope_head_study(seed: int = 0, n: int = 6, T: int = 5, d: int = 4, base: float = 10.0,
                    steps: int = 4000, lr: float = 0.1, init: float = 0.01) -> dict:
    """Train one factored RoPE head (d_h = d) to saturation and compare its lifted matrix with
    the three SVMs of the module docstring; returns a dict of the correlations, the parameter
    norm, the smallest attention on the selected token and whether the selection is optimal.

    ```pycon
    >>> from attnsvm.track.rope import rope_head_study
    >>> r = rope_head_study(steps=20)                    # (4000 steps by default: saturation)
    >>> sorted(r)
    ['corr_fro', 'corr_group_nuclear', 'corr_no_lift', 'min_sel_prob', 'param_norm', 'seed', 'selects_opt', 'steps']

    ```
    """
    import cvxpy as cp

    dh = d
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, T, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    z = rng.standard_normal((n, d))
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    v = rng.standard_normal(d)
    y = rng.choice([-1.0, 1.0], n)
    R, _ = rope_rotations(T + 1, dh, base)
    Rk, Rq = torch.tensor(R[:T]), torch.tensor(R[T])
    Xt, zt, vt, yt = (torch.tensor(a) for a in (X, z, v, y))
    g = torch.Generator().manual_seed(seed)
    Wq = (init * torch.randn(dh, d, generator=g, dtype=torch.float64)).requires_grad_()
    Wk = (init * torch.randn(dh, d, generator=g, dtype=torch.float64)).requires_grad_()
    scale = 1 / np.sqrt(dh)

    def logits():  # the model's own computation: rotate q and k, then dot
        q = Rq @ (Wq @ zt.T)  # (dh, n)
        k = torch.einsum("tab,bd,ntd->nta", Rk, Wk, Xt)  # (n, T, dh)
        return scale * torch.einsum("nta,an->nt", k, q)

    done = 0
    for _ in range(steps):
        s = torch.softmax(logits(), -1)
        loss = torch.nn.functional.softplus(-yt * torch.einsum("nt,ntd,d->n", s, Xt, vt)).mean()
        gq, gk = torch.autograd.grad(loss, (Wq, Wk))
        nrm = torch.sqrt((gq ** 2).sum() + (gk ** 2).sum())
        if not nrm > 1e-200:  # the gradient has underflowed: saturated
            break
        with torch.no_grad():
            Wq -= lr * gq / nrm
            Wk -= lr * gk / nrm
        done += 1
    s = torch.softmax(logits(), -1).detach().numpy()
    alpha = s.argmax(-1)
    B = plane_basis(dh)
    L = len(B)
    gl = np.einsum("ca,tcb,lab->tl", R[T], R[:T], B)  # g_l(query T, key t)
    Wqn, Wkn = Wq.detach().numpy(), Wk.detach().numpy()
    Th = np.stack([scale * Wkn.T @ Bl.T @ Wqn for Bl in B])  # (L, d, d)
    Xl = gl[None, :, :, None] * X[:, :, None, :]  # lifted keys (n, T, L, d)
    lifted = np.einsum("ntld,lde,ne->nt", Xl, Th, z)
    ref = logits().detach().numpy()
    if not np.allclose(lifted, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max()):
        raise AssertionError("the lift does not reproduce the RoPE head's logits")

    def svm(kind):
        V = [cp.Variable((d, d)) for _ in range(L if kind != "no_lift" else 1)]
        cons = []
        for i in range(n):
            for t in range(T):
                if t == alpha[i]:
                    continue
                if kind == "no_lift":
                    cons.append((X[i, alpha[i]] - X[i, t]) @ V[0] @ z[i] >= 1)
                else:
                    cons.append(sum((Xl[i, alpha[i], m] - Xl[i, t, m]) @ V[m] @ z[i]
                                    for m in range(L)) >= 1)
        if kind == "group_nuclear":
            obj = sum(cp.normNuc(cp.bmat([[V[2 * b], -V[2 * b + 1]], [V[2 * b + 1], V[2 * b]]]))
                      for b in range(L // 2)) / 2
            cp.Problem(cp.Minimize(obj), cons).solve(solver="SCS", eps=1e-7, max_iters=200000)
        else:
            cp.Problem(cp.Minimize(sum(cp.sum_squares(m) for m in V)), cons).solve(solver="CLARABEL")
        return np.stack([m.value for m in V])

    gamma = y[:, None] * (X @ v)
    return dict(seed=seed, steps=done, param_norm=float(np.sqrt((Wqn ** 2).sum() + (Wkn ** 2).sum())),
                min_sel_prob=float(s.max(-1).min()), selects_opt=bool((alpha == gamma.argmax(-1)).all()),
                corr_fro=_corr(Th, svm("fro")), corr_group_nuclear=_corr(Th, svm("group_nuclear")),
                corr_no_lift=_corr(Th.sum(0), svm("no_lift")[0]))


if __name__ == "__main__":  # pragma: no cover
    import sys

    for sd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print(rope_head_study(sd))
