"""Unconstrained (`Full`) and diagonal (`Diagonal`) Cholesky factors S = CᵀC."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from .._linalg import inverse_factor, reversed_cholesky
from ._base import AbstractCovariance, AbstractFactor, as_scale

__all__ = ["Full", "Diagonal", "CholeskyFactor", "DiagonalFactor"]


class Full(AbstractCovariance):
    """Unconstrained S = CᵀC with C upper-triangular: D(D+1)/2 parameters, O(N D²) per bound."""

    def init(self, dim, scale=1.0):
        return CholeskyFactor.from_matrix(jnp.diag(as_scale(scale, dim)))

    def from_dense(self, cov):
        return CholeskyFactor.from_matrix(jnp.linalg.cholesky(cov).T)

    def from_curvature(self, curvature):
        # P = R Rᵀ with R upper-triangular gives P⁻¹ = R⁻ᵀR⁻¹, so C = R⁻¹.
        return CholeskyFactor.from_matrix(inverse_factor(reversed_cholesky(curvature.dense())))


class CholeskyFactor(AbstractFactor):
    """Upper-triangular C, stored square with the lower triangle ignored (it gets zero gradient and curvature)."""

    matrix: jax.Array

    @staticmethod
    def from_matrix(C):
        return CholeskyFactor(jnp.triu(C))

    @property
    def dim(self):
        return self.matrix.shape[-1]

    def cholesky(self):
        return jnp.triu(self.matrix)

    def projected_variances(self, projection):
        # s_n² = ‖C h_n‖²: the single (N×D)·(D×D) product that dominates the bound.
        return jnp.sum(projection.mv(self.cholesky().T) ** 2, axis=-1)

    def logdet(self):
        return 2 * jnp.sum(jnp.log(jnp.abs(jnp.diag(self.cholesky()))))

    def variances(self):
        return jnp.sum(self.cholesky() ** 2, axis=0)

    def trace_precision(self, gaussian):
        return gaussian.trace_gram(self.cholesky())

    def canonical(self):
        C = self.cholesky()
        return CholeskyFactor.from_matrix(C * jnp.sign(jnp.diag(C))[:, None])

    def preconditioner(self, curvature):
        """Block preconditioner from P = Λ + Σ_g H_gᵀ diag(w_g) H_g ≈ −∇²_m B.

        Row i of C has negative Hessian ≈ P[i:, i:] + e₁e₁ᵀ / C_ii² (entropy). With P = R Rᵀ (R upper-
        triangular) all D block solves are two triangular solves with R plus a Sherman–Morrison correction.
        """
        return self._preconditioner(curvature.dense())

    def _preconditioner(self, P):
        R = reversed_cholesky(P)
        U = solve_triangular(R.T, jnp.diag(1.0 / jnp.diag(R)), lower=True)
        barrier = 1.0 / jnp.diag(self.cholesky()) ** 2
        shrink = barrier / (1.0 + barrier * jnp.diag(U))

        def apply(mean_tangent, factor_tangent):
            # Column 0 carries the mean block (P⁻¹ = R⁻ᵀR⁻¹); column i+1 row i of C.
            rhs = jnp.concatenate([mean_tangent[:, None], factor_tangent.cholesky().T], axis=1)
            Y = solve_triangular(R, rhs, lower=False)
            Y = Y.at[:, 1:].set(jnp.tril(Y[:, 1:]))
            X = solve_triangular(R.T, Y, lower=True)
            rows = X[:, 1:] - U * (shrink * jnp.diag(X[:, 1:]))[None, :]
            return X[:, 0], CholeskyFactor(rows.T)

        return apply


class Diagonal(AbstractCovariance):
    """S = diag(c²): D parameters, O(nnz(H)) per bound (mean field in the Cholesky form)."""

    def init(self, dim, scale=1.0):
        return DiagonalFactor(as_scale(scale, dim))

    def from_dense(self, cov):
        # The diagonal factor minimising KL(q_diag ‖ N(0, cov)) has precision diag(cov⁻¹).
        return DiagonalFactor(1.0 / jnp.sqrt(jnp.diag(jnp.linalg.inv(cov))))


class DiagonalFactor(AbstractFactor):
    """``scale`` c (D,): S = diag(c²)."""

    scale: jax.Array

    @property
    def dim(self):
        return self.scale.shape[0]

    def cholesky(self):
        return jnp.diag(self.scale)

    def projected_variances(self, projection):
        return projection.squared_mv(self.scale**2)

    def logdet(self):
        return 2 * jnp.sum(jnp.log(jnp.abs(self.scale)))

    def variances(self):
        return self.scale**2

    def trace_precision(self, gaussian):
        return jnp.sum(gaussian.precision_diagonal() * self.scale**2)

    def dense(self):
        return jnp.diag(self.scale**2)

    def canonical(self):
        return DiagonalFactor(jnp.abs(self.scale))

    def sample(self, key, num_samples):
        return jax.random.normal(key, (num_samples, self.dim), self.scale.dtype) * self.scale

    def preconditioner(self, curvature):
        """Jacobi preconditioner: diag(P) for the mean, diag(P) + 1/c² for the scales."""
        p = curvature.diagonal()
        entropy = 1.0 / self.scale**2

        def apply(mean_tangent, factor_tangent):
            return mean_tangent / p, DiagonalFactor(factor_tangent.scale / (p + entropy))

        return apply
