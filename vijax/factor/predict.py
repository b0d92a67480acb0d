"""Predictions from a fitted factor model: predictive densities of entries, class probabilities, imputation.

Each function takes the `FactorFit` that `vj.factor.fit` returns, as `vj.glm` and `vj.gp` predictions
take the fitted posterior: ``log_predictive(fit, Y)``, ``probabilities(fit)``, ``impute(fit, Y, mask)``.
For rows the model was not fitted on, pass the model and their posteriors from `vj.factor.e_step`
instead of the fit: ``log_predictive(model, q_test, Y_test)``.

For an entry (n, d), p(y_dn | observed) ≈ ⟨p(y | η)⟩ under q's predictor N(m̃_dn, Ṽ_dn) (thesis eq. 3.26),
with q(z_n) fitted on the point's observed entries. Scalar predictors are integrated by Gauss–Hermite
quadrature (32 nodes); categorical ones (K > 1) by Monte Carlo with ``num_samples`` draws from ``key``,
a `jax.random` key the caller passes (without one, a Monte Carlo estimate warns with a
`DeprecationWarning` and uses ``jax.random.PRNGKey(0)``; a future version will raise). All three
functions return JAX arrays.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp
from jax.typing import ArrayLike

from ..quadrature import GaussHermite
from .em import FactorFit, Posteriors
from .likelihoods import Gaussian
from .model import FactorModel

__all__ = ["log_predictive", "probabilities", "impute"]

_QUADRATURE = GaussHermite(32)


def _block_predictors(block, q: Posteriors):
    return jax.vmap(block.predictors)(q.mean, q.cov)  # (N, D_b, K), (N, D_b, K, K)


def _log_expected_prob(lik, y, mean, cov, key, num_samples):
    """log⟨p(y | η)⟩ for one point's block: ``y`` (D_b,), ``mean`` (D_b, K), ``cov`` (D_b, K, K)."""
    if isinstance(lik, Gaussian):  # exact: y ~ N(m̃, ṽ + ψ)
        var = cov[:, 0, 0] + lik.noise
        return -0.5 * (jnp.log(2 * jnp.pi * var) + (y - mean[:, 0]) ** 2 / var)
    if lik.num_predictors == 1:
        return _QUADRATURE.log_expect_exp(lambda eta: lik.log_prob(y, eta[:, None]), mean[:, 0],
                                          jnp.sqrt(cov[:, 0, 0]))
    k = lik.num_predictors
    chol = jnp.linalg.cholesky(cov + 1e-12 * jnp.eye(k, dtype=cov.dtype))
    eps = jax.random.normal(key, (num_samples,) + mean.shape, mean.dtype)
    eta = mean + jnp.einsum("dkj,sdj->sdk", chol, eps)
    return logsumexp(jax.vmap(lambda e: lik.log_prob(y, e))(eta), axis=0) - jnp.log(num_samples)


def _fitted(owner, fit, args, names):
    """(model, q, args): from ``fit`` (a `FactorFit`), or from ``(model, q, *args)`` (rows not fitted)."""
    if isinstance(fit, FactorFit):
        return fit.model, fit.posteriors, args
    if isinstance(fit, FactorModel) and args and isinstance(args[0], Posteriors):
        return fit, args[0], args[1:]
    raise TypeError(f"{owner}: expects the `FactorFit` that vj.factor.fit returns, or a `FactorModel` and "
                    f"`Posteriors` (from vj.factor.e_step), as {owner}(fit, {names}) or {owner}(model, q, {names}); "
                    f"got {type(fit).__name__}.")


def _monte_carlo_key(key, blocks, owner):
    """``key``, or (deprecated) a fixed key where a Monte Carlo estimate needs one and none was given."""
    if key is not None:
        return key
    if any(block.likelihood.num_predictors > 1 for block in blocks):
        warnings.warn(f"{owner}: pass `key=jax.random.PRNGKey(...)`; categorical predictions are Monte Carlo "
                      "estimates, and calling without a key (a fixed PRNGKey(0)) is deprecated and will raise.",
                      DeprecationWarning, stacklevel=3)
    return jax.random.PRNGKey(0)


def log_predictive(fit: FactorFit, Y: ArrayLike, *more, key: jax.Array | None = None,
                   num_samples: int = 2000) -> jax.Array:
    """log p(y_dn | q(z_n)) for every entry of ``Y`` (N, D): score held-out entries with it.

    ``fit``: the `FactorFit` of the data's rows (or a model and per-point posteriors: see the module
    docstring). Entries of ``Y`` not to be scored may hold any valid
    value (they are not used by q, which was fitted with its own mask). ``key`` (a `jax.random` key)
    drives the Monte Carlo estimate for categorical blocks. Returns a JAX array of shape (N, D).
    """
    model, q, (Y,) = _fitted("vj.factor.log_predictive", fit, (Y,) + more, "Y")
    key = _monte_carlo_key(key, model.blocks, "vj.factor.log_predictive")
    return _log_predictive(model, q, Y, key, num_samples)


@eqx.filter_jit
def _log_predictive(model: FactorModel, q: Posteriors, Y, key, num_samples: int):
    Y = jnp.asarray(Y, model.mean.dtype)
    out = jnp.zeros(Y.shape, Y.dtype)
    for i, block in enumerate(model.blocks):
        mean, cov = _block_predictors(block, q)
        idx = np.asarray(block.columns)
        keys = jax.random.split(jax.random.fold_in(key, i), Y.shape[0])
        vals = jax.vmap(lambda y, m, v, k: _log_expected_prob(block.likelihood, y, m, v, k, num_samples))(
            Y[:, idx], mean, cov, keys)
        out = out.at[:, idx].set(vals)
    return out


def probabilities(fit: FactorFit, *args, block: int = 0, key: jax.Array | None = None,
                  num_samples: int = 2000) -> jax.Array:
    """Predictive probabilities of every outcome of discrete block ``block``: shape (N, D_b, C).

    ``fit``: a `FactorFit` (or a model and per-point posteriors). ``key`` (a `jax.random` key) drives the Monte Carlo estimate for a
    categorical block. Returns a JAX array."""
    model, q, args = _fitted("vj.factor.probabilities", fit, args, "block=...")
    if args:  # the block by position
        (block,) = args
    blk = model.blocks[block]
    if blk.likelihood.num_outcomes is None:
        raise ValueError(f"probabilities: block {block} ({type(blk.likelihood).__name__}) is not discrete; "
                         "use log_predictive or impute for continuous columns.")
    key = _monte_carlo_key(key, (blk,), "vj.factor.probabilities")
    return _probabilities(model, q, block, key, num_samples)


@eqx.filter_jit
def _probabilities(model: FactorModel, q: Posteriors, block: int, key, num_samples: int):
    blk = model.blocks[block]
    c = blk.likelihood.num_outcomes
    mean, cov = _block_predictors(blk, q)
    keys = jax.random.split(key, mean.shape[0])

    def point(m, v, k):
        outcome = lambda value: _log_expected_prob(blk.likelihood, jnp.full(m.shape[0], value, m.dtype), m, v, k,
                                                   num_samples)
        return jnp.exp(jax.vmap(outcome, out_axes=-1)(jnp.arange(c, dtype=m.dtype)))

    return jax.vmap(point)(mean, cov, keys)


def impute(fit: FactorFit, Y: ArrayLike, mask: ArrayLike, *more, key: jax.Array | None = None,
           num_samples: int = 2000) -> jax.Array:
    """``Y`` with its unobserved entries (``mask`` False) set to the predictive mode (discrete columns)
    or mean (Gaussian, Poisson): a JAX array of shape (N, D). ``fit``: a `FactorFit`; ``key`` as for
    `probabilities`."""
    model, q, (Y, mask) = _fitted("vj.factor.impute", fit, (Y, mask) + more, "Y, mask")
    key = _monte_carlo_key(key, [b for b in model.blocks if b.likelihood.num_outcomes is not None],
                           "vj.factor.impute")
    Y = np.array(Y, dtype=float)
    mask = np.asarray(mask, bool)
    for i, block in enumerate(model.blocks):
        idx = np.asarray(block.columns)
        if block.likelihood.num_outcomes is None:
            mean, cov = _block_predictors(block, q)
            fill = np.asarray(jax.vmap(block.likelihood.predictive_mean)(mean, cov))
        else:
            fill = np.argmax(np.asarray(_probabilities(model, q, i, key, num_samples)),
                             -1).astype(float)
        sub = Y[:, idx]
        sub[~mask[:, idx]] = fill[~mask[:, idx]]
        Y[:, idx] = sub
    return jnp.asarray(Y, model.mean.dtype)
