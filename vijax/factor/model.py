"""The latent Gaussian factor model and its per-data-point evidence lower bound.

    z_n ~ N(μ, Σ),   η_dn = W_d z_n + w_0d ∈ R^{K_d},   y_dn ~ p_d(y | η_dn),   n = 1 … N, d = 1 … D

(Khan thesis eqs. 1.1–1.3). Columns are grouped in `Block`s that share a likelihood type; a block holds
its loadings W (D_b, K, L), offsets w_0 (D_b, K) and its likelihood (with per-column parameters).
"""

from __future__ import annotations

import math
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks, _linalg
from .likelihoods import AbstractLikelihood

__all__ = ["Block", "FactorModel", "ObservedModel", "factor_analysis", "graphical_model", "observe", "elbo_point"]


class Block(eqx.Module):
    """Data columns ``columns`` (a static tuple) with one `AbstractLikelihood` (per-column parameters of
    leading length D_b), loadings W ``(D_b, K, L)`` and offsets w_0 ``(D_b, K)``."""

    columns: tuple = eqx.field(static=True)
    likelihood: AbstractLikelihood
    loadings: jax.Array
    offsets: jax.Array

    def predictors(self, mean, cov):
        """q's predictor moments for one data point: m̃ (D_b, K) and Ṽ (D_b, K, K)."""
        m = jnp.einsum("dkl,l->dk", self.loadings, mean) + self.offsets
        v = jnp.einsum("dkl,lm,djm->dkj", self.loadings, cov, self.loadings)
        return m, v


class FactorModel(eqx.Module):
    """Prior N(μ, Σ) over L latents and the likelihood blocks; the M-step learns μ, Σ if ``learn_prior``, the
    loadings if ``learn_loadings``, with ℓ1 weight ``penalty`` on Σ⁻¹'s off-diagonal (0: none)."""

    mean: jax.Array
    cov: jax.Array
    blocks: tuple
    learn_prior: bool = eqx.field(static=True, default=True)
    learn_loadings: bool = eqx.field(static=True, default=True)
    penalty: float = eqx.field(static=True, default=0.0)

    @property
    def latent_dim(self) -> int:
        return self.mean.shape[0]

    @property
    def num_columns(self) -> int:
        return sum(len(b.columns) for b in self.blocks)

    @property
    def shared_covariance(self) -> bool:
        """Whether every likelihood has constant curvature, so (without missing data) all q(z_n) share V."""
        return all(b.likelihood.constant_curvature for b in self.blocks)


def _as_blocks(likelihoods, num_columns, owner):
    """``likelihoods`` as ((columns, likelihood), …): a single likelihood covers all columns."""
    if isinstance(likelihoods, AbstractLikelihood):
        if num_columns is None:
            raise ValueError(f"{owner}: give `num_columns` with a single likelihood.")
        return [(tuple(range(num_columns)), likelihoods)]
    pairs = []
    for item in likelihoods:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], AbstractLikelihood)):
            raise ValueError(f"{owner}: `likelihoods` must be one likelihood or a sequence of "
                             "(columns, likelihood) pairs.")
        cols = tuple(int(c) for c in np.atleast_1d(np.asarray(item[0])))
        pairs.append((cols, item[1]))
    used = sorted(c for cols, _ in pairs for c in cols)
    if used != list(range(len(used))):
        raise ValueError(f"{owner}: the blocks' columns must cover 0 … D−1 exactly once, got {used}.")
    if num_columns is not None and len(used) != num_columns:
        raise ValueError(f"{owner}: the blocks cover {len(used)} columns, not num_columns={num_columns}.")
    return pairs


def factor_analysis(likelihoods, latent_dim: int, key, num_columns: int | None = None, scale: float = 0.1,
                    dtype=None) -> FactorModel:
    """A factor model with a fixed prior N(0, I) over ``latent_dim`` factors and learned loadings.

    ``likelihoods``: one likelihood for all ``num_columns`` columns, or ``(columns, likelihood)`` pairs for
    mixed data. Loadings start at ``scale`` × N(0, 1) (W = 0 is a stationary point of EM), offsets at 0.
    """
    owner = "factor_analysis"
    _checks.integer("latent_dim", latent_dim, owner)
    dtype = dtype or jnp.result_type(float)
    blocks = []
    for i, (cols, lik) in enumerate(_as_blocks(likelihoods, num_columns, owner)):
        k = lik.num_predictors
        w = scale * jax.random.normal(jax.random.fold_in(key, i), (len(cols), k, latent_dim), dtype)
        blocks.append(Block(cols, _checks.cast_floating(lik.for_columns(len(cols)), dtype), w,
                            jnp.zeros((len(cols), k), dtype)))
    return FactorModel(jnp.zeros(latent_dim, dtype), jnp.eye(latent_dim, dtype=dtype), tuple(blocks),
                       learn_prior=False, learn_loadings=True)


def graphical_model(likelihoods, num_columns: int | None = None, penalty: float = 0.0, dtype=None) -> FactorModel:
    """A latent Gaussian graphical model: one latent per predictor (W = I, w_0 = 0), learned μ and Σ; with
    ``penalty`` λ > 0 the M-step maximises the bound minus (N/2) λ Σ_{i≠j} |Σ⁻¹_ij| (graphical lasso)."""
    owner = "graphical_model"
    if not (penalty >= 0 and math.isfinite(penalty)):
        raise ValueError(f"{owner}: `penalty` must be a finite non-negative number, got {penalty!r}.")
    dtype = dtype or jnp.result_type(float)
    pairs = _as_blocks(likelihoods, num_columns, owner)
    latent = sum(len(cols) * lik.num_predictors for cols, lik in pairs)
    blocks, start = [], 0
    for cols, lik in pairs:
        k = lik.num_predictors
        w = jnp.eye(latent, dtype=dtype)[start:start + len(cols) * k].reshape(len(cols), k, latent)
        blocks.append(Block(cols, _checks.cast_floating(lik.for_columns(len(cols)), dtype), w,
                            jnp.zeros((len(cols), k), dtype)))
        start += len(cols) * k
    return FactorModel(jnp.zeros(latent, dtype), jnp.eye(latent, dtype=dtype), tuple(blocks),
                       learn_prior=True, learn_loadings=False, penalty=float(penalty))


def block_data(block: Block, y, mask):
    """The block's columns of one data row (missing entries replaced by a valid placeholder 0)."""
    idx = jnp.asarray(block.columns)
    yb, mb = y[..., idx], mask[..., idx]
    return jnp.where(mb, yb, 0.0), mb


def block_terms(block: Block, y, mask, mean, cov):
    """mask_d f̲(y_d, m̃_d, Ṽ_d) for the block's columns d of one data row, given its (m̃, Ṽ)."""
    yb, mb = block_data(block, y, mask)
    return jnp.where(mb, block.likelihood.expected(yb, mean, cov), 0.0)


def site_terms(model: FactorModel, y, mask, predictors):
    """Σ_d mask_d f̲(y_d, m̃_d, Ṽ_d) for one data point, given each block's (m̃, Ṽ)."""
    return sum(jnp.sum(block_terms(block, y, mask, m, v)) for block, (m, v) in zip(model.blocks, predictors))


class Prior(eqx.Module):
    """μ, Σ⁻¹ and log det Σ, computed once per step from the model's (μ, Σ)."""

    mean: jax.Array
    precision: jax.Array
    logdet: jax.Array

    @staticmethod
    def of(model: FactorModel) -> "Prior":
        return Prior(model.mean, *_linalg.inverse_logdet(model.cov))


def neg_kl(prior: Prior, mean, cov, logdet_cov):
    """−KL(N(m, V) ‖ N(μ, Σ)) = ½[log|VΣ⁻¹| − tr(Σ⁻¹V) − (m − μ)ᵀΣ⁻¹(m − μ) + L]."""
    d = mean - prior.mean
    return _linalg.neg_kl(jnp.sum(prior.precision * cov), d @ prior.precision @ d, logdet_cov, prior.logdet,
                          mean.shape[0])


def elbo_point(model: FactorModel, y, mask, mean, cov):
    """The lower bound L_n (thesis eq. 3.21) of one data point at q(z_n) = N(mean, cov)."""
    prior = Prior.of(model)
    logdet = 2 * jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(cov))))
    preds = tuple(b.predictors(mean, cov) for b in model.blocks)
    return neg_kl(prior, mean, cov, logdet) + site_terms(model, y, mask, preds)


def check_data(model: FactorModel, Y, mask, owner: str):
    """Validate the data matrix and mask; returns (Y, mask) as arrays."""
    if isinstance(Y, jax.core.Tracer):
        return Y, jnp.ones(Y.shape, bool) if mask is None else mask
    Y = np.asarray(Y, dtype=float)
    if Y.ndim != 2 or Y.shape[1] != model.num_columns:
        raise ValueError(f"{owner}: `Y` must have shape (N, {model.num_columns}), got {Y.shape}.")
    if mask is None:
        if not np.all(np.isfinite(Y)):
            raise ValueError(f"{owner}: `Y` has NaN/inf entries; pass mask=np.isfinite(Y) to treat them as missing.")
        mask = np.ones(Y.shape, bool)
    else:
        mask = np.asarray(mask)
        if mask.shape != Y.shape or mask.dtype != bool:
            raise ValueError(f"{owner}: `mask` must be a boolean array of shape {Y.shape} (True = observed).")
    for block in model.blocks:
        cols = list(block.columns)
        block.likelihood.check(Y[:, cols][mask[:, cols]], owner)
    return jnp.asarray(np.where(mask, Y, 0.0), model.mean.dtype), jnp.asarray(mask)


def check_weights(weights, num_points: int, dtype, owner: str):
    """Validate row weights (default: ones); returns them as an array."""
    if weights is None:
        return jnp.ones(num_points, dtype)
    if isinstance(weights, jax.core.Tracer):
        return weights
    w = np.asarray(weights, dtype=float)
    if w.shape != (num_points,) or not np.all(np.isfinite(w)) or np.any(w < 0) or not np.sum(w) > 0:
        raise ValueError(f"{owner}: `weights` must be {num_points} finite non-negative numbers, one per row of `Y`, "
                         f"not all zero; got shape {w.shape}.")
    return jnp.asarray(w, dtype)


class ObservedModel(eqx.Module):
    """A `FactorModel` with its data (built by `observe`; unobserved entries of `Y` are 0 here): what
    `vj.factor.EM` and `vj.factor.EStep` fit. The static `complete` says no entry is missing."""

    model: FactorModel
    Y: jax.Array
    mask: jax.Array
    weights: jax.Array
    complete: bool = eqx.field(static=True)

    @property
    def num_points(self) -> int:
        return self.Y.shape[0]

    @property
    def latent_dim(self) -> int:
        return self.model.latent_dim

    @property
    def dtype(self):
        return self.model.mean.dtype


def observe(model: FactorModel, Y, mask=None, weights=None) -> ObservedModel:
    """The factor model ``model`` with its observations, ready for ``vj.infer(..., vj.factor.EM())``.

    ``Y``: ``(N, D)``, classes and levels as integers 0 … C−1. ``mask``: ``(N, D)`` booleans, True where
    observed (default: all, and ``Y`` must be finite). ``weights``: ``(N,)`` non-negative row weights w_n
    (default 1), e.g. counts of distinct rows: the bound is Σ_n w_n L_n. Invalid data raise a `ValueError`.
    """
    owner = "vj.factor.observe"
    if not isinstance(model, FactorModel):
        raise ValueError(f"{owner}: `model` must be a vj.factor model (factor_analysis, graphical_model or "
                         f"FactorModel), got {type(model).__name__}.")
    Y, mask = check_data(model, Y, mask, owner)
    if Y.shape[0] < 1:
        raise ValueError(f"{owner}: `Y` has no rows.")
    weights = check_weights(weights, Y.shape[0], Y.dtype, owner)
    complete = not isinstance(mask, jax.core.Tracer) and bool(np.all(np.asarray(mask)))
    return ObservedModel(model, Y, jnp.asarray(mask), weights, complete)
