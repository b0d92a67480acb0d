"""Predictions from a fitted factor model: predictive densities of entries, class probabilities, imputation.

Each function takes the `FactorPosterior` of `vj.factor.EM` or `vj.factor.EStep` (fit new rows with `EStep`
first). For an entry (n, d), p(y_dn | observed) ≈ ⟨p(y | η)⟩ under q's predictor N(m̃_dn, Ṽ_dn) (thesis
eq. 3.26): by 32-node Gauss–Hermite for scalar predictors, by Monte Carlo with ``num_samples`` draws from
``key`` (required only then) for categorical ones.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp
from jax.typing import ArrayLike

from .._linalg import normal_log_density
from ..quadrature import GaussHermite
from .em import FactorPosterior, Posteriors
from .likelihoods import GaussianColumn
from .model import FactorModel

__all__ = ["log_predictive", "probabilities", "impute"]

_QUADRATURE = GaussHermite(32)


def _log_expected_prob(lik, y, mean, cov, key, num_samples):
    """log⟨p(y | η)⟩ for one point's block: ``y`` (D_b,), ``mean`` (D_b, K), ``cov`` (D_b, K, K)."""
    if isinstance(lik, GaussianColumn):  # exact: y ~ N(m̃, ṽ + ψ)
        return normal_log_density(y, mean[:, 0], cov[:, 0, 0] + lik.noise)
    if lik.num_predictors == 1:
        return _QUADRATURE.log_expect_exp(lambda eta: lik.log_prob(y, eta[:, None]), mean[:, 0],
                                          jnp.sqrt(cov[:, 0, 0]))
    k = lik.num_predictors
    chol = jnp.linalg.cholesky(cov + 1e-12 * jnp.eye(k, dtype=cov.dtype))
    eps = jax.random.normal(key, (num_samples,) + mean.shape, mean.dtype)
    eta = mean + jnp.einsum("dkj,sdj->sdk", chol, eps)
    return logsumexp(jax.vmap(lambda e: lik.log_prob(y, e))(eta), axis=0) - jnp.log(num_samples)


def _fitted(owner, post):
    if not isinstance(post, FactorPosterior):
        raise ValueError(f"{owner}: expects the FactorPosterior of vj.infer(vj.factor.observe(model, Y, mask), "
                         f"vj.factor.EM()) (or vj.factor.EStep()), got {type(post).__name__}.")
    return post.fitted, post.posteriors


def _monte_carlo_key(key, blocks, owner):
    """``key``; where a Monte Carlo estimate needs one and none was given, a ValueError."""
    if key is not None:
        return key
    if any(block.likelihood.num_predictors > 1 for block in blocks):
        raise ValueError(f"{owner}: pass `key=jax.random.PRNGKey(...)`: categorical predictions are Monte Carlo "
                         "estimates.")
    return jax.random.PRNGKey(0)  # unused: every block is integrated by quadrature


def log_predictive(post: FactorPosterior, Y: ArrayLike, *, key: jax.Array | None = None,
                   num_samples: int = 2000) -> jax.Array:
    """log p(y_dn | q(z_n)) ``(N, D)`` for every entry of ``Y`` ``(N, D)``, e.g. to score held-out entries.

    Entries not to be scored may hold any valid value (q was fitted with its own mask)."""
    owner = "vj.factor.log_predictive"
    model, q = _fitted(owner, post)
    key = _monte_carlo_key(key, model.blocks, owner)
    return _log_predictive(model, q, Y, key, num_samples)


@eqx.filter_jit
def _log_predictive(model: FactorModel, q: Posteriors, Y, key, num_samples: int):
    Y = jnp.asarray(Y, model.mean.dtype)
    out = jnp.zeros(Y.shape, Y.dtype)
    for i, block in enumerate(model.blocks):
        mean, cov = jax.vmap(block.predictors)(q.mean, q.cov)
        idx = np.asarray(block.columns)
        keys = jax.random.split(jax.random.fold_in(key, i), Y.shape[0])
        vals = jax.vmap(lambda y, m, v, k: _log_expected_prob(block.likelihood, y, m, v, k, num_samples))(
            Y[:, idx], mean, cov, keys)
        out = out.at[:, idx].set(vals)
    return out


def probabilities(post: FactorPosterior, block: int = 0, *, key: jax.Array | None = None,
                  num_samples: int = 2000) -> jax.Array:
    """Predictive probabilities ``(N, D_b, C)`` of every outcome of the discrete block ``block``."""
    owner = "vj.factor.probabilities"
    model, q = _fitted(owner, post)
    blk = model.blocks[block]
    if blk.likelihood.num_outcomes is None:
        raise ValueError(f"{owner}: block {block} ({type(blk.likelihood).__name__}) is not discrete; "
                         "use log_predictive or impute for continuous columns.")
    key = _monte_carlo_key(key, (blk,), owner)
    return _probabilities(model, q, block, key, num_samples)


@eqx.filter_jit
def _probabilities(model: FactorModel, q: Posteriors, block: int, key, num_samples: int):
    blk = model.blocks[block]
    c = blk.likelihood.num_outcomes
    mean, cov = jax.vmap(blk.predictors)(q.mean, q.cov)
    keys = jax.random.split(key, mean.shape[0])

    def point(m, v, k):
        outcome = lambda value: _log_expected_prob(blk.likelihood, jnp.full(m.shape[0], value, m.dtype), m, v, k,
                                                   num_samples)
        return jnp.exp(jax.vmap(outcome, out_axes=-1)(jnp.arange(c, dtype=m.dtype)))

    return jax.vmap(point)(mean, cov, keys)


def impute(post: FactorPosterior, Y: ArrayLike, mask: ArrayLike, *, key: jax.Array | None = None,
           num_samples: int = 2000) -> jax.Array:
    """``Y`` ``(N, D)`` with its unobserved entries (``mask`` False) set to the predictive mode (discrete
    columns) or mean (Gaussian, Poisson)."""
    owner = "vj.factor.impute"
    model, q = _fitted(owner, post)
    key = _monte_carlo_key(key, model.blocks, owner)  # continuous blocks have one predictor: no key
    Y = np.array(Y, dtype=float)
    mask = np.asarray(mask, bool)
    for i, block in enumerate(model.blocks):
        idx = np.asarray(block.columns)
        if block.likelihood.num_outcomes is None:
            mean, cov = jax.vmap(block.predictors)(q.mean, q.cov)
            fill = np.asarray(jax.vmap(block.likelihood.predictive_mean)(mean, cov))
        else:
            fill = np.argmax(np.asarray(_probabilities(model, q, i, key, num_samples)), -1).astype(float)
        Y[:, idx] = np.where(mask[:, idx], Y[:, idx], fill)
    return jnp.asarray(Y, model.mean.dtype)
