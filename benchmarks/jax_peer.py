"""The JAX program a researcher would write instead of attnsvm (the peer of
bench_cuda.py and bench_train.py): the README's training row (W model, cross-attention,
fixed linear head v, logistic loss, NGD with step ``lr``), float64, plain softmax and
autodiff, ``jit(fori_loop(vmap(step)))``. One definition for both benchmarks.

The loss of one trial (X (n, T, d), z (n, d), y (n,), v (d,)):
mean_i softplus(-y_i sum_t softmax(X_i W z_i)_t v . x_it).
"""

from __future__ import annotations


def jax_program(lr: float = 0.1):
    """(run, grad_zero): run(W, X, z, y, v, S) = S NGD steps on every trial (W (B, d, d),
    batched data); grad_zero(W, X, z, y, v) = whether each trial's gradient is exactly 0.
    Set XLA_FLAGS before the first call if JAX must use one thread (bench_train.py does)."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def loss(W, X, z, y, v):
        a = jnp.einsum("ntd,de,ne->nt", X, W, z)  # a_t = x_t^T W z
        s = jax.nn.softmax(a, axis=-1)
        f = jnp.einsum("nt,ntd,d->n", s, X, v)
        return jnp.mean(jax.nn.softplus(-y * f))

    def step(W, X, z, y, v):
        g = jax.grad(loss)(W, X, z, y, v)
        return W - lr * g / jnp.linalg.norm(g)

    vstep = jax.vmap(step)

    @jax.jit
    def run(W, X, z, y, v, S):
        return jax.lax.fori_loop(0, S, lambda i, W: vstep(W, X, z, y, v), W)

    @jax.jit
    def grad_zero(W, X, z, y, v):
        G = jax.vmap(jax.grad(loss))(W, X, z, y, v)
        return jnp.all(G == 0.0, axis=(1, 2))

    return run, grad_zero
