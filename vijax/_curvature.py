"""Curvature of the log target: P = Λ + Σ_g H_gᵀ diag(w_g) H_g, and the site terms it is built from.

Every second-order method's stand-in for the negative Hessian in the mean has this form, with site weights w_n ≥ 0
and Λ the precision of the model's Gaussian factor.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .model import LatentLinearModel
from .quadrature import elementwise_derivatives

__all__ = ["Curvature", "site_derivatives", "site_curvatures"]


class Curvature(eqx.Module):
    """P = Λ + Σ_g H_gᵀ diag(w_g) H_g: the negative Hessian of a bound in m (a Newton preconditioner)."""

    model: LatentLinearModel
    weights: tuple[jax.Array, ...]

    def _ridge(self, diag):
        # P may be singular (no proper prior, few sites); relative, so kilometres are regularised as metres.
        return 1e-8 * jnp.maximum(diag, 1e-12 * jnp.maximum(jnp.mean(diag), 1e-12)) + 1e-30

    def matrix(self):
        """P as a dense ``(D, D)`` matrix, without the ridge of `dense` (Laplace's −∇²ℓ)."""
        d, dtype = self.model.dim, self.weights[0].dtype
        P = self.model.prior.precision_matrix() if self.model.prior is not None else jnp.zeros((d, d), dtype)
        return sum((g.projection.gram(w) for g, w in zip(self.model.sites, self.weights)), P).astype(dtype)

    def dense(self):
        P = self.matrix()
        return P + jnp.diag(self._ridge(jnp.diag(P)))

    def sites_mv(self, V):
        """Σ_g H_gᵀ diag(w_g) H_g V for ``V`` of shape ``(D, K)`` (O(nnz(H) K), no D × D matrix)."""
        return sum(group.projection.rmv(w[:, None] * group.projection.mv(V))
                   for group, w in zip(self.model.sites, self.weights))

    def mv(self, V):
        """P V for ``V`` of shape ``(D, K)`` (ridge not included)."""
        prior = self.model.prior
        if prior is None:
            return self.sites_mv(V)
        if prior.diagonal_precision:
            return prior.precision_diagonal()[:, None] * V + self.sites_mv(V)
        return prior.precision_matrix() @ V + self.sites_mv(V)

    def raw_diagonal(self):
        """diag P without the ridge of `dense` (O(nnz(H)), no D × D matrix)."""
        d, dtype = self.model.dim, self.weights[0].dtype
        p = self.model.prior.precision_diagonal() if self.model.prior is not None else jnp.zeros(d, dtype)
        return sum((g.projection.squared_rmv(w) for g, w in zip(self.model.sites, self.weights)), p).astype(dtype)

    def diagonal(self):
        p = self.raw_diagonal()
        return p + self._ridge(p)

    def operator(self):
        """``(v ↦ P v, diag P)`` for ``v`` of shape ``(D,)``, both with the ridge of `dense` (matrix-free solves)."""
        p = self.raw_diagonal()
        ridge = self._ridge(p)
        return (lambda v: self.mv(v[:, None])[:, 0] + ridge * v), p + ridge


def site_derivatives(w, model: LatentLinearModel):
    """Per site group, ``(x, (log φ)'(x), −(log φ)''(x))`` at x = H w + b (each of shape ``(N_g,)``)."""
    out = []
    for group in model.sites:
        x = group.project(w)
        _, slope, second = elementwise_derivatives(group.potential.log_phi, x)
        out.append((x, slope, -second))
    return tuple(out)


def site_curvatures(w, model: LatentLinearModel, gauss_newton=False) -> tuple[jax.Array, ...]:
    """ω_n = −(log φ_n)''(h_nᵀw + b_n) per site group, ``(N_g,)`` each; clipped at zero if ``gauss_newton`` (traced)."""

    return tuple(jnp.where(gauss_newton, jnp.maximum(omega, 0.0), omega) for _, _, omega in site_derivatives(w, model))
