"""Chevron Cholesky factor: K dense upper-triangular rows over a diagonal."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from ._base import AbstractCovariance, AbstractFactor, as_scale, check_rank

__all__ = ["Chevron", "ChevronFactor"]


class Chevron(AbstractCovariance):
    """C upper-triangular with rows 1…K dense and rows K+1…D diagonal (thesis §4.3).

    $$
    C = \\begin{pmatrix} \\Theta \\\\ 0\\ \\operatorname{diag}(d) \\end{pmatrix},
    \\qquad \\Theta \\in \\mathbb R^{K\\times D}\\ \\text{upper-triangular}.
    $$

    O(N D K) per bound (O(nnz(H) K) for sparse H). The first K coordinates carry the correlations, so order
    the most strongly coupled coordinates first.
    """

    rows: int = eqx.field(static=True)

    def _k(self, dim):
        return check_rank("rows", self.rows, dim, "Chevron", minimum=0)

    def init(self, dim, scale=1.0):
        k, scale = self._k(dim), as_scale(scale, dim)
        return ChevronFactor(jnp.eye(k, dim, dtype=scale.dtype) * scale[None, :], scale[k:])

    def from_dense(self, cov):
        k = self._k(cov.shape[0])
        C = jnp.linalg.cholesky(cov).T
        return ChevronFactor(C[:k], jnp.diag(C)[k:])


class ChevronFactor(AbstractFactor):
    """``head`` (K, D): the dense rows of C (entries below the diagonal ignored); ``tail`` (D − K,): the rest of diag(C)."""

    head: jax.Array
    tail: jax.Array

    @property
    def dim(self):
        return self.head.shape[1]

    @property
    def rank(self):
        return self.head.shape[0]

    def _head(self):
        return jnp.triu(self.head)

    def _tail_variances(self):
        return jnp.concatenate([jnp.zeros(self.rank, self.tail.dtype), self.tail**2])

    def projected_variances(self, projection):
        dense_part = jnp.sum(projection.mv(self._head().T) ** 2, axis=-1)
        return dense_part + projection.squared_mv(self._tail_variances())

    def logdet(self):
        diagonal = jnp.concatenate([jnp.diag(self.head[:, : self.rank]), self.tail])
        return 2 * jnp.sum(jnp.log(jnp.abs(diagonal)))

    def variances(self):
        return jnp.sum(self._head() ** 2, axis=0) + self._tail_variances()

    def trace_precision(self, gaussian):
        return gaussian.trace_gram(self._head()) + jnp.sum(gaussian.precision_diagonal() * self._tail_variances())

    def cholesky(self):
        tail_rows = jnp.eye(self.dim - self.rank, self.dim, self.rank, dtype=self.tail.dtype) * jnp.pad(self.tail, (self.rank, 0))
        return jnp.concatenate([self._head(), tail_rows], axis=0)

    def dense(self):
        head = self._head()
        return head.T @ head + jnp.diag(self._tail_variances())

    def canonical(self):
        signs = jnp.sign(jnp.diag(self.head[:, : self.rank]))
        return ChevronFactor(self._head() * signs[:, None], jnp.abs(self.tail))

    def sample(self, key, num_samples):
        z = jax.random.normal(key, (num_samples, self.dim), self.tail.dtype)
        return z[:, : self.rank] @ self._head() + jnp.pad(z[:, self.rank:] * self.tail, ((0, 0), (self.rank, 0)))

    def preconditioner(self, curvature):
        """Jacobi: entry C_ij is scaled by 1/(P_jj + δ_ij / C_ii²), the mean by 1/P_jj."""
        p = curvature.diagonal()
        k = self.rank
        head_denominator = p[None, :] + jnp.eye(k, self.dim, dtype=p.dtype) / jnp.diag(self.head[:, :k])[:, None] ** 2
        tail_denominator = p[k:] + 1.0 / self.tail**2

        def apply(mean_tangent, factor_tangent):
            head = jnp.triu(factor_tangent.head / head_denominator)
            return mean_tangent / p, ChevronFactor(head, factor_tangent.tail / tail_denominator)

        return apply
