"""Numerical helpers several layers share, written once; at the bottom of vijax's layers (imports nothing from it)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

__all__ = ["LOG_2PI", "reversed_cholesky", "inverse_factor", "inverse_logdet", "select", "nan_trace", "backtrack",
           "normal_log_density", "gaussian_entropy", "neg_kl", "pcg", "lanczos", "ritz_pairs", "block_ritz_pairs",
           "leading_eigenvectors", "lanczos_variances", "unit_legendre_rule"]

LOG_2PI = math.log(2 * math.pi)
"""log 2π, as a Python float (weakly typed: it takes the dtype of the arrays it meets)."""


@functools.lru_cache(maxsize=None)
def unit_legendre_rule(num_nodes: int):
    """Gauss–Legendre nodes and weights on [0, 1] (NumPy float64)."""
    x, w = np.polynomial.legendre.leggauss(num_nodes)
    return 0.5 * (x + 1), 0.5 * w


def reversed_cholesky(P):
    """Upper-triangular R with P = R Rᵀ for a symmetric positive-definite ``(D, D)`` P, so that C = R⁻¹ is an
    upper-triangular factor of P⁻¹ = CᵀC (vijax's S = CᵀC). NaN where P is not positive definite."""
    return jnp.linalg.cholesky(P[::-1, ::-1])[::-1, ::-1]


def inverse_factor(R, basis=None):
    """C = R⁻¹ Bᵀ, the upper-triangular factor of S = B P⁻¹ Bᵀ = CᵀC, from P = R Rᵀ (`reversed_cholesky`), by one
    triangular solve; ``basis`` B is lower-triangular ``(D, D)`` (e.g. a prior's Cholesky factor) or None (B = I)."""
    rhs = jnp.eye(R.shape[0], dtype=R.dtype) if basis is None else basis.T
    return solve_triangular(R, rhs, lower=False)


def inverse_logdet(A):
    """A⁻¹ (symmetrised) and log det A of a symmetric positive-definite ``(D, D)`` A, by one Cholesky factor."""
    chol = jnp.linalg.cholesky(A)
    inverse = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(A.shape[0], dtype=chol.dtype))
    return 0.5 * (inverse + inverse.T), 2 * jnp.sum(jnp.log(jnp.diagonal(chol)))


def select(cond, new, old):
    """``jnp.where(cond, new, old)`` on every leaf of two like pytrees (accepting or rejecting a trial point)."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(cond, a, b), new, old)


def nan_trace(max_iter: int, dtype, first=None):
    """An objective trace ``(max_iter + 1,)``, NaN (iterations not run) except entry 0 (``first``, if given)."""
    trace = jnp.full((max_iter + 1,), jnp.nan, dtype)
    return trace if first is None else trace.at[0].set(first)


def backtrack(evaluate, acceptable, step, max_halvings: int, placeholder=None):
    """Halve ``step`` (a scalar, or independent steps each halved while its own trial fails) until
    ``acceptable(step, evaluate(step))``, at most ``max_halvings`` times, in one `while_loop` that lowers ``evaluate``
    once (its state starts from ``placeholder``, default zeros). Returns ``(step, value, ok, halvings)``."""
    def unfinished(state):
        *_, ok, k = state
        return jnp.any(~ok) & (k < max_halvings)

    def halve(state):
        step, _, ok, k = state
        step = jnp.where(ok, step, 0.5 * step)
        value = evaluate(step)
        return step, value, acceptable(step, value), k + 1

    if placeholder is None:
        placeholder = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(evaluate, step))
    # Start one halving "before" the first trial: 2·step halved is step exactly (a power of two).
    ok = jnp.zeros(jnp.shape(step), bool)
    return jax.lax.while_loop(unfinished, halve, (2 * step, placeholder, ok, jnp.array(-1)))


def normal_log_density(x, mean, var):
    """log N(x | mean, var) = −½(log 2π + log var + (x − mean)²/var), elementwise (broadcast)."""
    return -0.5 * (LOG_2PI + jnp.log(var) + (x - mean) ** 2 / var)


def gaussian_entropy(logdet_cov, dim):
    """The differential entropy of a ``dim``-variate Gaussian, ½ log det(2πe S) = ½(log det S + dim (1 + log 2π))."""
    return 0.5 * (logdet_cov + dim * (1.0 + LOG_2PI))


def neg_kl(trace, mahalanobis, logdet_q, logdet_p, dim):
    """−KL(N(m, V) ‖ N(μ, Σ)) = ½[log|V| − log|Σ| − tr(Σ⁻¹V) − (m − μ)ᵀΣ⁻¹(m − μ) + dim], from its terms."""
    return 0.5 * (logdet_q - logdet_p - trace - mahalanobis + dim)


def pcg(A, b, M, max_iter, rtol=None):
    """Truncated preconditioned CG for A d = b (A, M maps); returns (d, products with A). Stops at ‖b − A d‖ ≤
    rtol ‖b‖, or without ``rtol`` at the truncated-Newton forcing term min(½, (bᵀMb)^¼) ‖b‖."""
    z = M(b)
    rz0 = jnp.vdot(b, z)
    # bᵀMb estimates the squared Newton decrement whatever the scale of the parameters.
    forcing = jnp.minimum(0.5, jnp.sqrt(jnp.sqrt(jnp.maximum(rz0, 0.0)))) if rtol is None else rtol
    forcing = forcing * jnp.linalg.norm(b)

    def cond(state):
        _, r, _, _, _, i, stop = state
        return (i < max_iter) & ~stop & (jnp.linalg.norm(r) > forcing)

    def body(state):
        d, r, z, p, rz, i, _ = state
        Ap = A(p)
        curvature = jnp.vdot(p, Ap)
        negative = curvature <= 0
        alpha = rz / jnp.where(negative, 1.0, curvature)
        # On non-positive curvature keep the current iterate (or the preconditioned gradient at the start).
        d = jnp.where(negative, jnp.where(i == 0, z, d), d + alpha * p)
        r = r - alpha * Ap
        z = M(r)
        rz_next = jnp.vdot(r, z)
        return d, r, z, z + (rz_next / rz) * p, rz_next, i + 1, negative

    d, *_, i, _ = jax.lax.while_loop(cond, body, (jnp.zeros_like(b), b, z, z, rz0, jnp.array(0), jnp.array(False)))

    return d, i


def lanczos(product, v0, num_iter: int):
    """``num_iter`` = k steps of Lanczos with full (twice) reorthogonalisation on the symmetric map ``product``
    from ``v0`` ``(D,)``: ``(Q (D, k), alpha (k,), beta (k − 1,))``, T = QᵀAQ tridiagonal. A breakdown continues with
    a random orthogonal direction and zero coupling, so T stays exact."""
    D, dtype = v0.shape[0], v0.dtype
    rtol = 1e-2 * float(jnp.finfo(dtype).eps) ** 0.5
    Q = jnp.zeros((D, num_iter), dtype).at[:, 0].set(v0 / jnp.linalg.norm(v0))
    key = jax.random.PRNGKey(17)

    def orthogonalise(z, Q):
        for _ in range(2):  # against every vector so far (the columns beyond k are still zero)
            z = z - Q @ (Q.T @ z)
        return z

    def body(k, state):
        Q, alpha, beta = state
        q = Q[:, k]
        z = product(q)
        a = q @ z
        scale = jnp.linalg.norm(z)
        z = orthogonalise(z, Q)
        b = jnp.linalg.norm(z)
        tiny = b <= rtol * scale
        fresh = orthogonalise(jax.random.normal(jax.random.fold_in(key, k), (D,), dtype), Q)
        nxt = jnp.where(tiny, fresh / jnp.linalg.norm(fresh), z / jnp.where(tiny, 1.0, b))
        Q = jnp.where(k + 1 < num_iter, Q.at[:, jnp.minimum(k + 1, num_iter - 1)].set(nxt), Q)
        return Q, alpha.at[k].set(a), beta.at[k].set(jnp.where(tiny, 0.0, b))

    alpha = beta = jnp.zeros(num_iter, dtype)
    Q, alpha, beta = jax.lax.fori_loop(0, num_iter, body, (Q, alpha, beta))
    return Q, alpha, beta[:-1]


def ritz_pairs(product, v0, num_iter: int):
    """Ritz pairs of ``num_iter`` Lanczos steps from ``v0``: ``(values (k,) ascending, vectors (D, k), weights (k,))``,
    the weights U₁ₖ² Gauss quadrature's: v0ᵀ f(A) v0 ≈ ‖v0‖² Σ_k U₁ₖ² f(θ_k)."""
    Q, alpha, beta = lanczos(product, v0, num_iter)
    T = jnp.diag(alpha) + jnp.diag(beta, 1) + jnp.diag(beta, -1)
    values, U = jnp.linalg.eigh(T)
    return values, Q @ U, U[0] ** 2


def block_ritz_pairs(product, V0, num_blocks: int):
    """Ritz pairs of K_q(A, V0) = span[V0, …, A^{q−1} V0]: ``(values (m,) ascending, vectors (D, m))``, m = q·b ≤ D;
    ``product`` maps ``(D, b)`` blocks, and T = Qᵀ(AQ) from the stored products."""
    D, b = V0.shape
    m = num_blocks * b
    if m > D:
        raise ValueError(f"block_ritz_pairs: {num_blocks} blocks of {b} vectors exceed the dimension {D}.")

    def orthonormal(Y, Q):
        for _ in range(2):
            Y, _ = jnp.linalg.qr(Y - Q @ (Q.T @ Y))  # the columns of Q beyond the blocks so far are still zero
        return Y

    def body(k, state):
        Q, AQ, X = state
        AX = product(X)
        Q = jax.lax.dynamic_update_slice(Q, X, (0, k * b))
        AQ = jax.lax.dynamic_update_slice(AQ, AX, (0, k * b))
        return Q, AQ, orthonormal(AX, Q)

    zero = jnp.zeros((D, m), V0.dtype)
    Q, AQ, _ = jax.lax.fori_loop(0, num_blocks, body, (zero, zero, orthonormal(V0, zero)))
    T = Q.T @ AQ
    values, U = jnp.linalg.eigh(0.5 * (T + T.T))
    return values, Q @ U


def _start(key, dim, dtype, block=None):
    key = jax.random.PRNGKey(0) if key is None else key
    dtype = jnp.result_type(float) if dtype is None else dtype
    return jax.random.normal(key, (dim,) if block is None else (dim, block), dtype)


def leading_eigenvectors(product, dim: int, num: int, num_iter: int | None = None, key=None, dtype=None,
                         block: int | None = None):
    """The ``num`` largest eigenvalues and unit eigenvectors of a symmetric map, ``(values (num,), vectors (D, num))``.

    ``num_iter`` Lanczos steps (default min(D, max(2·num + 20, 40))) from a random start (``key``, default
    PRNGKey(0)); with ``block`` = b, ``num_iter`` block steps of `block_ritz_pairs` (default 5, at most D/b)."""
    if block is None:
        num_iter = min(dim, max(2 * num + 20, 40)) if num_iter is None else min(int(num_iter), dim)
    else:
        num_iter = min(dim // block, 5 if num_iter is None else int(num_iter))
    if not 1 <= num <= num_iter * (block or 1):

        raise ValueError(f"leading_eigenvectors: need 1 ≤ num ≤ (Krylov dimension) ≤ D, got num={num}, "
                         f"num_iter={num_iter}, block={block}, D={dim}.")
    if block is None:
        values, vectors, _ = ritz_pairs(product, _start(key, dim, dtype), num_iter)
    else:
        values, vectors = block_ritz_pairs(product, _start(key, dim, dtype, block), num_iter)
    values, vectors = values[::-1][:num], vectors[:, ::-1][:, :num]
    return values, vectors / jnp.linalg.norm(vectors, axis=0)


def lanczos_variances(precision_product, dim: int, num_iter: int, key=None, dtype=None, v0=None):
    """Lower bounds diag(Q T⁻¹ Qᵀ) = Σ_k (QU)²_{:k} / θ_k ≤ diag(P⁻¹) from ``num_iter`` Lanczos steps on the
    precision P (Schneider & Willsky 2001), exact at D; start ``v0`` (default normal from ``key``, PRNGKey(0)).
    Returns ``(variances (D,), ritz_values (k,), ritz_vectors (D, k))``, θ ascending."""
    num_iter = min(int(num_iter), dim)
    v0 = _start(key, dim, dtype) if v0 is None else v0
    values, vectors, _ = ritz_pairs(precision_product, v0, num_iter)
    return jnp.sum(vectors**2 / values[None, :], axis=1), values, vectors


def batched_map(fn, xs, batch_size):
    """``fn`` over the leading axis of ``xs`` by `jax.lax.map` in whole vmapped batches of ``batch_size``, the rows
    padded by repeating the last (a remainder batch would compile a second vmapped copy of ``fn``)."""

    if batch_size == 1:
        return jax.lax.map(fn, xs)
    count = jax.tree_util.tree_leaves(xs)[0].shape[0]
    batch = min(batch_size, count)
    index = jnp.minimum(jnp.arange(-(-count // batch) * batch), count - 1)
    out = jax.lax.map(fn, jax.tree_util.tree_map(lambda leaf: leaf[index], xs), batch_size=batch)
    return jax.tree_util.tree_map(lambda leaf: leaf[:count], out)
