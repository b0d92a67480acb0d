"""Design criteria from a Gaussian posterior q(w) = N(m, S).

The information gain of new measurements y* = M* w + N(0, ν² I) (thesis eqs. 5.4.1–5.4.2) is

$$
I(M^*) = H[q] - H[q \\mid y^*] = \\tfrac12 \\log\\det\\big(I + \\nu^{-2} M^* S M^{*\\top}\\big),
$$

independent of y*; among blocks of K orthonormal rows it is largest for S's K leading eigenvectors.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import gaussian_entropy, lanczos, lanczos_variances, leading_eigenvectors
from ..covariance import ChevronFactor, DiagonalFactor, SubspaceFactor
from ..methods import lvb
from ..posterior import Posterior
from ..projections import as_projection

__all__ = ["covariance_product", "information_gain", "row_gains", "greedy_rows", "lanczos", "leading_eigenvectors",
           "lanczos_variances", "free_design", "entropy"]


def _factor(post):
    return post.factor if isinstance(post, Posterior) else post


def _solves(post) -> bool:
    """Whether ``post`` is an LVB fit with Lanczos variances (then S V is a solve with P)."""
    return (isinstance(post, Posterior) and isinstance(post.state, lvb.LVBState)
            and isinstance(post.factor, SubspaceFactor))


def _source(post):
    """What `covariance_product` reads, as a jit argument."""
    return post if _solves(post) else _factor(post)


def covariance_product(post, rtol: float = 1e-6):
    """The map V ↦ S V (V of shape ``(D,)`` or ``(D, K)``) of a posterior's (or factor's) covariance.

    S is never formed. For a `vj.LVB` fit with ``variances="lanczos"`` it is the exact S = P⁻¹, by one CG
    solve with P per column to the relative residual ``rtol`` (`vj.lvb.covariance_solve`).
    """
    if _solves(post):
        return lvb.covariance_solve(post, rtol)
    factor = _factor(post)
    column = lambda v, V: v if V.ndim == 1 else v[:, None]
    if isinstance(factor, ChevronFactor):
        head, tail = factor._head(), factor._tail_variances()
        return lambda V: head.T @ (head @ V) + column(tail, V) * V
    if isinstance(factor, DiagonalFactor):
        var = factor.variances()
        return lambda V: column(var, V) * V
    if isinstance(factor, SubspaceFactor):
        return factor._covariance_mv
    C = factor.cholesky()
    return lambda V: C.T @ (C @ V)


def information_gain(post, rows, noise_variance):
    """½ log det(I + ν⁻² M* S M*ᵀ) for a block ``rows`` = M* ``(K, D)``, or a batch ``(C, K, D)`` → ``(C,)``."""
    rows = jnp.asarray(rows)
    if rows.ndim not in (2, 3):
        raise ValueError(f"information_gain: `rows` must have shape (K, D) or (C, K, D), got {rows.shape}.")
    return _information_gain(_source(post), rows, noise_variance)


@eqx.filter_jit
def _information_gain(post, rows, noise_variance):
    product = covariance_product(post)
    batch = rows if rows.ndim == 3 else rows[None]
    C, K, D = batch.shape
    SMt = product(batch.reshape(C * K, D).T).T.reshape(C, K, D)
    G = jnp.einsum("ckd,cjd->ckj", batch, SMt) / noise_variance
    G = 0.5 * (G + jnp.swapaxes(G, 1, 2)) + jnp.eye(K, dtype=G.dtype)
    gains = 0.5 * jnp.linalg.slogdet(G)[1]
    return gains if rows.ndim == 3 else gains[0]


def row_gains(post, candidates, noise_variance):
    """The information gain ½ log(1 + ν⁻² h_cᵀ S h_c) of each candidate row h_c: shape ``(C,)``.

    ``candidates``: a dense ``(C, D)`` array, a `BCOO` or any projection. Uses the factor's projected
    variances (Lanczos lower bounds for a `vj.LVB` fit with ``variances="lanczos"``).
    """
    projection = as_projection(candidates)
    variances = _factor(post).projected_variances(projection)
    return 0.5 * jnp.log1p(variances / noise_variance)


def greedy_rows(post, candidates, num_rows: int, noise_variance):
    """Pick ``num_rows`` of the ``(C, D)`` candidate rows greedily by information gain.

    Each pick maximises ½ log(1 + ν⁻² h_cᵀ S_k h_c) under S_k after the earlier picks
    (S_{k+1} = S_k − S_k h hᵀ S_k / (ν² + hᵀ S_k h)). Returns ``(indices, gains)``, each ``(num_rows,)``.
    """
    return _greedy_rows(_source(post), jnp.asarray(candidates), int(num_rows), noise_variance)


@eqx.filter_jit
def _greedy_rows(post, X, num_rows, noise_variance):
    A = covariance_product(post)(X.T).T  # rows h_cᵀ S, (C, D)
    var = jnp.sum(A * X, axis=1)

    def pick(carry, _):
        A, var, taken = carry
        score = jnp.where(taken, -jnp.inf, var)
        i = jnp.argmax(score)
        a_i = A[i]  # S_k h_i
        denom = noise_variance + var[i]
        coupling = X @ a_i  # h_cᵀ S_k h_i
        A = A - coupling[:, None] * a_i[None, :] / denom
        var = var - coupling**2 / denom
        return (A, var, taken.at[i].set(True)), (i, 0.5 * jnp.log1p(score[i] / noise_variance))

    _, (indices, gains) = jax.lax.scan(pick, (A, var, jnp.zeros(X.shape[0], bool)), None, length=num_rows)
    return indices, gains


def free_design(post, num_rows: int, num_iter: int | None = None, key=None):
    """The ``num_rows`` unit-norm measurement rows of largest information gain: the leading eigenvectors of S.

    Lanczos on v ↦ S v (`covariance_product`); for a `vj.LVB` fit with ``variances="lanczos"``, ``num_iter``
    (default 5) block steps of 2K CG solves with P to residual 10⁻³. Returns ``(rows (num_rows, D),
    eigenvalues (num_rows,))``: Ritz vectors, so the block's gain is Σ_k ½ log(1 + λ_k/ν²).
    """
    key = jax.random.PRNGKey(0) if key is None else key
    return _free_design(_source(post), key, int(num_rows), num_iter)


# A residual of 10⁻³ (not 10⁻⁶) moves the gain in the 5th digit and halves the time (docs/benchmarks.md).
_DESIGN_RTOL = 1e-3
_DESIGN_BLOCKS = 5


@eqx.filter_jit
def _free_design(post, key, num_rows, num_iter):
    factor = _factor(post)
    product, block = covariance_product(post, _DESIGN_RTOL), None
    if _solves(post):
        block = min(2 * num_rows, factor.dim)
        num_iter = _DESIGN_BLOCKS if num_iter is None else num_iter
    values, vectors = leading_eigenvectors(product, factor.dim, num_rows, num_iter, key, factor.dtype, block)
    return vectors.T, values


def entropy(post):
    """The differential entropy ½ log det(2πe S) of q, from the factor's log det S."""
    factor = _factor(post)
    return gaussian_entropy(factor.logdet(), factor.dim)
