"""Design criteria from a Gaussian posterior q(w) = N(m, S): information gain, candidate scores, free design.

For a block of new measurements y* = M* w + noise, noise ~ N(0, ν² I), the information gain of the
Gaussian approximation (thesis eqs. 5.4.1–5.4.2; Seeger & Nickisch 2011) is

$$
I(M^*) = H[q] - H[q \\mid y^*] = \\tfrac12 \\log\\det\\big(I + \\nu^{-2} M^* S M^{*\\top}\\big),
$$

independent of y*. Among blocks of K orthonormal rows it is largest for the K leading eigenvectors of S
(the *free design*), found here by Lanczos with products v ↦ S v only (`covariance_product`), so a chevron,
diagonal or subspace covariance never forms a D × D matrix. An LVB fit with Lanczos variances multiplies by its
exact S = P⁻¹ through CG solves with P (`vj.lvb.covariance_solve`), not by the rank-k estimate in its factor.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

# Lanczos lives in the foundation layer (one implementation for design, the Subspace family and LVB);
# it is re-exported here as part of `vj.design`.
from .._linalg import gaussian_entropy, lanczos, lanczos_variances, leading_eigenvectors
from ..covariance import ChevronFactor, CholeskyFactor, DiagonalFactor, SubspaceFactor
from ..methods import lvb
from ..posterior import Posterior
from ..projections import as_projection

__all__ = ["covariance_product", "information_gain", "row_gains", "greedy_rows", "lanczos", "leading_eigenvectors",
           "lanczos_variances", "free_design", "entropy"]


def _factor(post):
    return post.factor if isinstance(post, Posterior) else post


def _solves(post) -> bool:
    """Whether ``post`` is an LVB fit whose factor is its Lanczos estimate of S (then S V is solved with P)."""
    return (isinstance(post, Posterior) and isinstance(post.state, lvb.LVBState)
            and isinstance(post.factor, SubspaceFactor))


def _source(post):
    """What `covariance_product` reads, as a jit argument: the posterior where products are solves with its
    precision (`_solves`), else just its factor."""
    return post if _solves(post) else _factor(post)


def covariance_product(post, rtol: float = 1e-6):
    """The map V ↦ S V (V of shape ``(D,)`` or ``(D, K)``) of a posterior's (or factor's) covariance.

    Costs O(D·r·K) for a chevron factor of r dense rows, O(D K) for a diagonal one, O(D·rank·K) for a
    subspace one, O(D² K) for a dense Cholesky factor; S itself is never formed. For a `vj.LVB` fit with
    ``variances="lanczos"`` it is q's exact S = P⁻¹, by one CG solve with P per column
    (`vj.lvb.covariance_solve`, each solve to the relative residual ``rtol``; its factor's rank-k estimate
    misses S's leading eigenvectors).
    """
    if _solves(post):
        return lvb.covariance_solve(post, rtol)
    factor = _factor(post)
    if isinstance(factor, ChevronFactor):
        head = jnp.triu(factor.head)
        tail = jnp.concatenate([jnp.zeros(factor.rank, factor.tail.dtype), factor.tail**2])
        return lambda V: head.T @ (head @ V) + (tail if V.ndim == 1 else tail[:, None]) * V
    if isinstance(factor, DiagonalFactor):
        var = factor.variances()
        return lambda V: (var if V.ndim == 1 else var[:, None]) * V
    if isinstance(factor, SubspaceFactor):
        E, C, c = factor.basis, jnp.triu(factor.chol), factor.scale

        def product(V):
            inside = E.T @ V
            return E @ (C.T @ (C @ inside)) + c**2 * (V - E @ inside)

        return product
    if isinstance(factor, CholeskyFactor):
        C = factor.cholesky()
        return lambda V: C.T @ (C @ V)
    C = factor.cholesky()  # other families: their square factor, once
    return lambda V: C.T @ (C @ V)


def information_gain(post, rows, noise_variance):
    """½ log det(I + ν⁻² M* S M*ᵀ) for a block ``rows`` = M* of shape ``(K, D)``, or a batch ``(C, K, D)`` → ``(C,)``.

    ``post`` is a `vj.Posterior` (or a covariance factor); ``noise_variance`` is ν².
    """
    rows = jnp.asarray(rows)
    if rows.ndim not in (2, 3):
        raise ValueError(f"information_gain: `rows` must have shape (K, D) or (C, K, D), got {rows.shape}.")
    return _information_gain(_source(post), rows, noise_variance)


@eqx.filter_jit
def _information_gain(post, rows, noise_variance):
    product = covariance_product(post)
    batch = rows if rows.ndim == 3 else rows[None]
    C, K, D = batch.shape
    SMt = product(batch.reshape(C * K, D).T).T.reshape(C, K, D)  # S M*ᵀ for every block, by one product
    G = jnp.einsum("ckd,cjd->ckj", batch, SMt) / noise_variance
    G = 0.5 * (G + jnp.swapaxes(G, 1, 2)) + jnp.eye(K, dtype=G.dtype)
    gains = 0.5 * jnp.linalg.slogdet(G)[1]
    return gains if rows.ndim == 3 else gains[0]


def row_gains(post, candidates, noise_variance):
    """The information gain ½ log(1 + ν⁻² h_cᵀ S h_c) of each candidate row h_c: shape ``(C,)``.

    ``candidates`` is a dense ``(C, D)`` array, a `BCOO` or any projection; uses the factor's projected
    variances (one product with the candidates). For a `vj.LVB` fit with ``variances="lanczos"`` those are
    its Lanczos estimates, lower bounds on the variances under q; `greedy_rows` and `information_gain` solve
    with its precision instead.
    """
    projection = as_projection(candidates)
    variances = _factor(post).projected_variances(projection)
    return 0.5 * jnp.log1p(variances / noise_variance)


def greedy_rows(post, candidates, num_rows: int, noise_variance):
    """Pick ``num_rows`` of the ``(C, D)`` candidate rows greedily by information gain.

    Each pick maximises ½ log(1 + ν⁻² h_cᵀ S_k h_c) under the covariance S_k after the rows already
    picked are measured (rank-one Gaussian updates S_{k+1} = S_k − S_k h hᵀ S_k / (ν² + hᵀ S_k h)), so the
    block's total gain is the sum of the picks' gains. Costs one product of S with the candidates and
    O(C D) per pick. Returns ``(indices (num_rows,), gains (num_rows,))``.
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

    Lanczos on v ↦ S v (`covariance_product`), so structured covariances are never formed; compiled once per
    covariance family and shape. For a `vj.LVB` fit with ``variances="lanczos"`` the rows are the leading
    eigenvectors of its exact S = P⁻¹ (not of the rank-k estimate in its factor), by block Krylov steps
    whose products are CG solves with P (to a relative residual of 10⁻³) of 2K columns at a time;
    ``num_iter`` counts those steps there (default 5: a Krylov space of 10K vectors). Returns
    ``(rows (num_rows, D), eigenvalues (num_rows,))``; the block's gain is Σ_k ½ log(1 + λ_k/ν²) (the rows
    are Ritz vectors, so M* S M*ᵀ = diag(λ) up to the products' accuracy).
    """
    key = jax.random.PRNGKey(0) if key is None else key
    return _free_design(_source(post), key, int(num_rows), num_iter)


# How the free design of an LVB fit with Lanczos variances solves with P (see `free_design`). On the 64 × 64
# image model (80 Lanczos vectors; K = 3 rows; `benchmarks/design_images.py`'s set-up, idle machine) the
# chosen block's information gain under q, and the design's seconds:
#   N = 100:  rank-80 factor 1.97;  Lanczos on S, 12 solves 3.309 (2.6 s), 40 solves 3.309 (8.2 s);
#             blocks of 2K = 6, 4 steps 3.299 (1.2 s), 5 steps 3.309 (1.5 s);
#   N = 2048: Lanczos on S, 12 solves 1.675 (20 s), 40 solves 1.716 (70 s); blocks of 6, 5 steps 1.687 (6.2 s).
# A block's CG reads M once for all its columns (M is 2048 × 4096 there). Residual 10⁻³ against 10⁻⁶ moved
# the gain in the 5th digit and halved the time: Krylov methods with full reorthogonalisation take inexact
# products in their stride.
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


def __dir__():
    return list(__all__)
