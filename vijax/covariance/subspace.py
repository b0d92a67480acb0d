"""Subspace Cholesky: a full Cholesky factor inside a K-dimensional subspace, isotropic outside."""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _checks
from .._linalg import inverse_factor, leading_eigenvectors, reversed_cholesky
from ._base import AbstractCovariance, AbstractFactor, as_scale, check_rank
from ._dense import CholeskyFactor

__all__ = ["Subspace", "SubspaceFactor"]


class Subspace(AbstractCovariance):
    """S = E CᵀC Eᵀ + c² (I − E Eᵀ) with E a ``(D, K)`` orthonormal basis (thesis §4.3, app. B.2).

    For fixed E the bound is jointly concave in (m, C, c) and costs O(N D K). E starts as the top-K
    eigenvectors of Σ_n w_n h_n h_nᵀ (the directions of largest site curvature, which the data pin down) and
    is updated ``num_updates`` times between inner solves: ``"fixed_point"`` recomputes them at the current
    solution (thesis app. B.2.3; may lower the bound), ``"gradient"`` takes E ← orth(E + α ∂B/∂E) with α the
    best of a few step sizes (never lowers it).
    """

    rank: int = eqx.field(static=True)
    num_updates: int = eqx.field(static=True, default=5)
    basis_update: Literal["fixed_point", "gradient"] = eqx.field(static=True, default="fixed_point")

    def __check_init__(self):
        if self.basis_update not in ("fixed_point", "gradient"):
            raise ValueError(f"Subspace: `basis_update` must be 'fixed_point' or 'gradient', got {self.basis_update!r}.")
        _checks.integer("num_updates", self.num_updates, "Subspace", 0)

    def _k(self, dim):
        return check_rank("rank", self.rank, dim, "Subspace")

    @property
    def num_rounds(self):
        return self.num_updates

    def init(self, dim, scale=1.0):
        k, scale = self._k(dim), as_scale(scale, dim)
        outside = jnp.sqrt(jnp.mean(scale[k:] ** 2)) if k < dim else jnp.ones((), scale.dtype)
        return SubspaceFactor(jnp.eye(dim, k, dtype=scale.dtype), jnp.diag(scale[:k]), outside)

    def from_dense(self, cov):
        k = self._k(cov.shape[0])
        lam, V = jnp.linalg.eigh(cov)
        E = V[:, ::-1][:, :k]
        outside = jnp.sqrt(jnp.mean(lam[: cov.shape[0] - k])) if k < cov.shape[0] else jnp.ones((), cov.dtype)
        return SubspaceFactor(E, jnp.linalg.cholesky(E.T @ cov @ E).T, outside)

    def from_curvature(self, curvature):
        dim, k = curvature.model.dim, self._k(curvature.model.dim)
        E = _leading_eigenvectors(curvature.sites_mv, dim, k, curvature.weights[0].dtype)
        # C = R⁻¹ with EᵀPE = R Rᵀ, and c² = (D − K) / tr((I − EEᵀ) P): S ≈ P⁻¹ within the structure.
        inner = E.T @ curvature.mv(E)
        C = inverse_factor(reversed_cholesky(0.5 * (inner + inner.T)))
        outside_trace = jnp.sum(curvature.diagonal()) - jnp.trace(inner)
        scale = jnp.sqrt((dim - k) / outside_trace) if k < dim else jnp.ones((), C.dtype)
        return SubspaceFactor(E, C, scale)

    def update(self, factor, mean, objective, curvature):
        if self.basis_update == "fixed_point":
            E = _leading_eigenvectors(curvature.sites_mv, factor.dim, factor.rank, factor.scale.dtype)
            return factor.in_basis(E)

        def value(E):
            return objective(eqx.tree_at(lambda f: f.basis, factor, E))

        g = jax.grad(value)(factor.basis)
        g = g - factor.basis @ (factor.basis.T @ g)  # tangent to the Stiefel manifold: drop the in-span part
        steps = jnp.array([0.0, 1.0, 0.25, 1 / 16, 1 / 64, 1 / 256]) / jnp.maximum(jnp.max(jnp.abs(g)), 1e-30)
        candidates = jax.vmap(lambda a: jnp.linalg.qr(factor.basis + a * g)[0])(steps.astype(g.dtype))
        values = jax.lax.map(value, candidates)
        best = jnp.argmax(jnp.where(jnp.isfinite(values), values, -jnp.inf))
        return factor.in_basis(candidates[best])


class SubspaceFactor(AbstractFactor):
    """``basis`` E (D, K) orthonormal (held fixed by the solvers), ``chol`` C (K, K) upper-triangular, ``scale`` c."""

    basis: jax.Array
    chol: jax.Array
    scale: jax.Array

    @property
    def dim(self):
        return self.basis.shape[0]

    @property
    def rank(self):
        return self.basis.shape[1]

    def trainable(self):
        return SubspaceFactor(False, True, True)

    def _C(self):
        return jnp.triu(self.chol)

    def projected_variances(self, projection):
        G = projection.mv(self.basis)  # (N, K): coordinates of h_n in the subspace
        inside = jnp.sum((G @ self._C().T) ** 2, axis=-1)
        outside = jnp.maximum(projection.squared_mv(jnp.ones(self.dim, G.dtype)) - jnp.sum(G**2, axis=-1), 0.0)
        return inside + self.scale**2 * outside

    def logdet(self):
        return 2 * jnp.sum(jnp.log(jnp.abs(jnp.diag(self.chol)))) + (self.dim - self.rank) * jnp.log(self.scale**2)

    def variances(self):
        return jnp.sum((self.basis @ self._C().T) ** 2, axis=1) + self.scale**2 * (1 - jnp.sum(self.basis**2, axis=1))

    def trace_precision(self, gaussian):
        inside = gaussian.trace_gram(self._C() @ self.basis.T)
        outside = jnp.sum(gaussian.precision_diagonal()) - gaussian.trace_gram(self.basis.T)
        return inside + self.scale**2 * outside

    def dense(self):
        A = self.basis @ self._C().T
        E = self.basis
        return A @ A.T + self.scale**2 * (jnp.eye(self.dim, dtype=E.dtype) - E @ E.T)

    def canonical(self):
        C = self._C()
        return SubspaceFactor(self.basis, C * jnp.sign(jnp.diag(C))[:, None], jnp.abs(self.scale))

    def sample(self, key, num_samples):
        k1, k2 = jax.random.split(key)
        z1 = jax.random.normal(k1, (num_samples, self.rank), self.chol.dtype)
        z2 = jax.random.normal(k2, (num_samples, self.dim), self.chol.dtype)
        return z1 @ self._C() @ self.basis.T + self.scale * (z2 - (z2 @ self.basis) @ self.basis.T)

    def _covariance_mv(self, V):
        """S V for V of shape ``(D,)`` or ``(D, B)``, O(D K) per column."""
        inside = self.basis.T @ V
        return self.basis @ (self._C().T @ (self._C() @ inside)) + self.scale**2 * (V - self.basis @ inside)

    def in_basis(self, E):
        """The factor with basis ``E`` whose in-subspace covariance is Eᵀ S E (c kept)."""
        inner = E.T @ self._covariance_mv(E)
        return SubspaceFactor(E, jnp.linalg.cholesky(0.5 * (inner + inner.T)).T, self.scale)

    def preconditioner(self, curvature):
        """Block: the full-Cholesky preconditioner on EᵀPE for C, Jacobi for m, the c-curvature for c."""
        p = curvature.diagonal()
        inner = self.basis.T @ curvature.mv(self.basis)
        apply_inner = CholeskyFactor(self.chol)._preconditioner(0.5 * (inner + inner.T))
        outside = jnp.sum(p) - jnp.trace(inner) + (self.dim - self.rank) / self.scale**2

        def apply(mean_tangent, factor_tangent):
            _, chol = apply_inner(jnp.zeros(self.rank, p.dtype), CholeskyFactor(factor_tangent.chol))
            return mean_tangent / p, SubspaceFactor(jnp.zeros_like(self.basis), chol.matrix, factor_tangent.scale / outside)

        return apply


def _leading_eigenvectors(mv, dim, k, dtype):
    """Top-k eigenvectors of a symmetric PSD operator ``mv`` (``(D, B) → (D, B)``), by `_linalg`'s Lanczos."""
    _, E = leading_eigenvectors(lambda v: mv(v[:, None])[:, 0], dim, k, dtype=dtype)
    return E
