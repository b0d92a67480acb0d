"""Shared numerical helpers: the one place for maths that several layers use.

This module sits at the bottom of vijax's layers (it imports nothing from vijax), so potentials,
Gaussian factors, covariance families, solvers, methods and models may all use it.

- `LOG_2PI`: log 2π.
- `reversed_cholesky(P)`: the upper-triangular R with P = R Rᵀ.
- `inverse_factor(R, basis)`: C = R⁻¹ Bᵀ, the upper-triangular factor of S = B P⁻¹ Bᵀ = CᵀC.
- `select(cond, new, old)`: a tree-wide ``jnp.where``.
- `nan_trace(max_iter, dtype, first)`: an objective trace of ``max_iter + 1`` entries, NaN where unused.
- `backtrack(evaluate, acceptable, step, max_halvings)`: halve a step until a trial is acceptable.
- `neg_kl(trace, mahalanobis, logdet_q, logdet_p, dim)`: −KL between two Gaussians, from its terms.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

__all__ = ["LOG_2PI", "reversed_cholesky", "inverse_factor", "select", "nan_trace", "backtrack", "neg_kl"]

LOG_2PI = math.log(2 * math.pi)
"""log 2π, as a Python float (weakly typed: it takes the dtype of the arrays it meets)."""


def reversed_cholesky(P):
    """Upper-triangular R with P = R Rᵀ: the Cholesky factor of P with rows and columns reversed.

    ``P``: a symmetric positive-definite ``(D, D)`` matrix. Then P⁻¹ = R⁻ᵀR⁻¹, so C = R⁻¹ is an
    upper-triangular factor of the covariance P⁻¹ = CᵀC (vijax's convention, S = CᵀC). NaN where P
    is not positive definite, like `jnp.linalg.cholesky`.
    """
    return jnp.linalg.cholesky(P[::-1, ::-1])[::-1, ::-1]


def inverse_factor(R, basis=None):
    """C = R⁻¹ Bᵀ, the upper-triangular factor of S = B P⁻¹ Bᵀ = CᵀC, from P = R Rᵀ (`reversed_cholesky`).

    ``R``: ``(D, D)`` upper-triangular. ``basis``: B, a lower-triangular ``(D, D)`` matrix (e.g. the
    Cholesky factor L of a prior covariance LLᵀ, for a precision P computed in whitened coordinates),
    or None for B = I. With B lower-triangular, R⁻¹Bᵀ is a product of upper-triangular matrices and so
    upper-triangular itself. One triangular solve (O(D³)); P⁻¹ is never formed.
    """
    rhs = jnp.eye(R.shape[0], dtype=R.dtype) if basis is None else basis.T
    return solve_triangular(R, rhs, lower=False)


def select(cond, new, old):
    """``jnp.where(cond, new, old)`` on every leaf of two pytrees of the same structure.

    ``cond`` is a boolean scalar (or an array that broadcasts against every leaf). The usual way to
    accept or reject a trial point inside a `jax.lax.while_loop`.
    """
    return jax.tree_util.tree_map(lambda a, b: jnp.where(cond, a, b), new, old)


def nan_trace(max_iter: int, dtype, first=None):
    """An objective trace: shape ``(max_iter + 1,)``, NaN except entry 0, which is ``first`` if given.

    Loops write the objective of iterate k at index k, so the NaNs mark the iterations not run.
    """
    trace = jnp.full((max_iter + 1,), jnp.nan, dtype)
    return trace if first is None else trace.at[0].set(first)


def backtrack(evaluate, acceptable, step, max_halvings: int):
    """Halve ``step`` until ``acceptable(step, evaluate(step))``, at most ``max_halvings`` times.

    ``step``: a scalar, or an array of independent steps (one per column, per coordinate …), each
    halved only while its own trial is unacceptable. ``evaluate(step)`` returns the trial's value (any
    pytree); ``acceptable(step, value)`` a boolean of ``step``'s shape. One `jax.lax.while_loop`, with
    ``evaluate`` and ``acceptable`` traced twice each (the first trial and the loop body).

    Returns ``(step, value, ok, halvings)``: the last steps tried, their value, whether each is
    acceptable (callers keep the old point where it is not) and the number of halvings.
    """
    def unfinished(state):
        *_, ok, k = state
        return jnp.any(~ok) & (k < max_halvings)

    def halve(state):
        step, _, ok, k = state
        step = jnp.where(ok, step, 0.5 * step)
        value = evaluate(step)
        return step, value, acceptable(step, value), k + 1

    value = evaluate(step)
    return jax.lax.while_loop(unfinished, halve, (step, value, acceptable(step, value), jnp.array(0)))


def neg_kl(trace, mahalanobis, logdet_q, logdet_p, dim):
    """−KL(N(m, V) ‖ N(μ, Σ)) = ½[log|V| − log|Σ| − tr(Σ⁻¹V) − (m − μ)ᵀΣ⁻¹(m − μ) + dim].

    Each caller computes the terms in its own parametrisation (precisions, Cholesky factors,
    whitened coordinates): ``trace`` = tr(Σ⁻¹V), ``mahalanobis`` = (m − μ)ᵀΣ⁻¹(m − μ), the log
    determinants, and the dimension.
    """
    return 0.5 * (logdet_q - logdet_p - trace - mahalanobis + dim)
