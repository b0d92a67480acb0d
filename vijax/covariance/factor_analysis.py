"""Factor-analysis covariance S = ΘΘᵀ + diag(d²)."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from ._base import AbstractCovariance, AbstractFactor, as_scale, check_rank

__all__ = ["FactorAnalysis", "FactorAnalysisFactor"]

# Θ starts at this fraction of the scale: Θ = 0 is a stationary point of the bound (∂B/∂Θ = 2 ∂B/∂S Θ).
_INITIAL_LOADING = 0.1


class FactorAnalysis(AbstractCovariance):
    """S = ΘΘᵀ + diag(d²) with Θ of shape ``(D, rank)`` (thesis §4.3.1.2).

    O(N D K) per bound; log det S by the matrix determinant lemma in O(D K²). The bound is **not** concave
    in (Θ, d), so the default solver is L-BFGS and different starts can reach different optima.
    """

    rank: int = eqx.field(static=True)
    concave: ClassVar[bool] = False

    def _k(self, dim):
        return check_rank("rank", self.rank, dim, "FactorAnalysis")

    def init(self, dim, scale=1.0):
        k, scale = self._k(dim), as_scale(scale, dim)
        # Θ_ij ∝ [j = i mod K]: vertically stacked K × K identities (the thesis's default).
        stacked = (jnp.arange(dim)[:, None] % k == jnp.arange(k)[None, :]).astype(scale.dtype)
        return FactorAnalysisFactor(_INITIAL_LOADING * scale[:, None] * stacked, scale)

    def from_dense(self, cov):
        # Probabilistic-PCA fit: the top-K eigenpairs, the rest averaged into an isotropic d².
        dim, k = cov.shape[0], self._k(cov.shape[0])
        lam, V = jnp.linalg.eigh(cov)
        noise = jnp.mean(lam[: dim - k]) if k < dim else 0.5 * lam[0]
        loadings = V[:, ::-1][:, :k] * jnp.sqrt(jnp.maximum(lam[::-1][:k] - noise, 0.0))
        return FactorAnalysisFactor(loadings, jnp.full(dim, jnp.sqrt(noise)))


class FactorAnalysisFactor(AbstractFactor):
    """``loadings`` Θ (D, K) and ``scale`` d (D,)."""

    loadings: jax.Array
    scale: jax.Array

    @property
    def dim(self):
        return self.scale.shape[0]

    def projected_variances(self, projection):
        return jnp.sum(projection.mv(self.loadings) ** 2, axis=-1) + projection.squared_mv(self.scale**2)

    def logdet(self):
        # det(ΘΘᵀ + D²) = det(D²) det(I + Θᵀ D⁻² Θ)
        scaled = self.loadings / self.scale[:, None]
        inner = jnp.eye(scaled.shape[1], dtype=scaled.dtype) + scaled.T @ scaled
        L = jnp.linalg.cholesky(inner)
        return 2 * jnp.sum(jnp.log(jnp.abs(self.scale))) + 2 * jnp.sum(jnp.log(jnp.diag(L)))

    def variances(self):
        return jnp.sum(self.loadings**2, axis=1) + self.scale**2

    def trace_precision(self, gaussian):
        return gaussian.trace_gram(self.loadings.T) + jnp.sum(gaussian.precision_diagonal() * self.scale**2)

    def dense(self):
        return self.loadings @ self.loadings.T + jnp.diag(self.scale**2)

    def canonical(self):
        return FactorAnalysisFactor(self.loadings, jnp.abs(self.scale))

    def sample(self, key, num_samples):
        k1, k2 = jax.random.split(key)
        z1 = jax.random.normal(k1, (num_samples, self.loadings.shape[1]), self.scale.dtype)
        z2 = jax.random.normal(k2, (num_samples, self.dim), self.scale.dtype)
        return z1 @ self.loadings.T + z2 * self.scale

    def preconditioner(self, curvature):
        """Jacobi on the Gauss–Newton curvature: P_jj for m and Θ_j·, P_jj + 2/d_j² for d."""
        p = curvature.diagonal()

        def apply(mean_tangent, factor_tangent):
            return mean_tangent / p, FactorAnalysisFactor(factor_tangent.loadings / p[:, None],
                                                          factor_tangent.scale / (p + 2.0 / self.scale**2))

        return apply
