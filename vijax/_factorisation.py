"""The factorisation of a Gaussian's precision P = Λ + Σ_g H_gᵀ diag(w_g) H_g: its log-determinant, solves and S = P⁻¹.

- `Primal` (O(D³)): s P s = R Rᵀ by reversed Cholesky, s = diag(P)^−½ (metres and kilometres factorise alike), so
  log det P = 2 Σ_i log(R_ii / s_i), P⁻¹ v = s ∘ R⁻ᵀ R⁻¹ (s ∘ v) and S = Cᵀ C with C = R⁻¹ diag(s) upper-triangular.
- `SiteForm` (O(N³)): K⁻¹ + W, W = diag(w) ≥ 0, in the coordinates of N sites with prior covariance K. With
  B = I + W½ K W½ = L Lᵀ and V = L⁻¹ W½ K (Rasmussen & Williams Alg. 3.2), Σ = K − Vᵀ V, log det(I + K W) =
  2 Σ_i log L_ii and (K + W⁻¹)⁻¹ u = W½ B⁻¹ W½ u: K is never inverted.

`conditional` gives f* | f under a Gaussian process prior, for every GP predictive.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve, solve_triangular

from ._linalg import inverse_factor, reversed_cholesky

__all__ = ["Conditional", "Primal", "SiteForm", "conditional"]


class Primal(eqx.Module):
    """P = diag(s)⁻¹ R Rᵀ diag(s)⁻¹, equilibrated and factorised (module docstring); build with `Primal.of`."""

    R: jax.Array  # (D, D) upper-triangular: the reversed Cholesky factor of s P s
    scale: jax.Array  # (D,) s = diag(P)^−½

    @staticmethod
    def of(P) -> "Primal":
        """The factorisation of a symmetric ``(D, D)`` matrix P (NaN where it is not positive definite)."""
        P = 0.5 * (P + P.T)
        scale = 1.0 / jnp.sqrt(jnp.diag(P))
        return Primal(reversed_cholesky(scale[:, None] * P * scale[None, :]), scale)

    @property
    def proper(self):
        """Whether P is positive definite: the factor is finite and no pivot at the rounding of P's unit diagonal."""
        d = self.R.shape[0]
        pivots = jnp.diag(self.R) ** 2
        return jnp.all(jnp.isfinite(self.R)) & jnp.all(pivots > d * jnp.finfo(self.R.dtype).eps)

    def logdet(self):
        """log det P."""
        return 2 * jnp.sum(jnp.log(jnp.diag(self.R) / self.scale))

    def half_solve(self, v):
        """R⁻¹ (s ∘ v), so that vᵀ P⁻¹ v = ‖half_solve(v)‖² (``v`` of shape ``(D,)`` or ``(D, K)``)."""
        return solve_triangular(self.R, _times(self.scale, v), lower=False)

    def half_multiply(self, v):
        """Rᵀ (v / s), so that vᵀ P v = ‖half_multiply(v)‖² (``v`` of shape ``(D,)`` or ``(D, K)``)."""
        return self.R.T @ _times(1.0 / self.scale, v)

    def solve(self, v):
        """P⁻¹ v for ``v`` of shape ``(D,)`` or ``(D, K)``."""
        return _times(self.scale, solve_triangular(self.R, self.half_solve(v), lower=False, trans="T"))

    def covariance_factor(self, basis=None):
        """C, upper-triangular, with B P⁻¹ Bᵀ = Cᵀ C (``basis`` B lower-triangular, or None for B = I)."""
        return inverse_factor(self.R, jnp.diag(self.scale) if basis is None else basis * self.scale[None, :])


class SiteForm(eqx.Module):
    """The precision K⁻¹ + diag(w) in site form (module docstring); build with `SiteForm.of`."""

    K: jax.Array  # (N, N) the sites' prior covariance
    root: jax.Array  # (N,) W½
    L: jax.Array  # (N, N) lower-triangular, B = I + W½ K W½ = L Lᵀ

    @staticmethod
    def of(K, weights) -> "SiteForm":
        """The site form of K⁻¹ + diag(``weights``), ``weights`` clipped at 0 (an unselected `lax.cond` branch)."""
        root = jnp.sqrt(jnp.maximum(weights, 0.0))
        B = jnp.eye(K.shape[0], dtype=K.dtype) + root[:, None] * K * root[None, :]
        return SiteForm(K, root, jnp.linalg.cholesky(B))

    @property
    def proper(self):
        return jnp.all(jnp.isfinite(self.L))

    def logdet(self):
        """log det(I + W½ K W½) = log det(I + K W)."""
        return 2 * jnp.sum(jnp.log(jnp.diag(self.L)))

    def cross(self):
        """V = L⁻¹ W½ K, ``(N, N)``: Σ = K − Vᵀ V."""
        return solve_triangular(self.L, self.root[:, None] * self.K, lower=True)

    def variances(self):
        """diag Σ, Σ = (K⁻¹ + W)⁻¹."""
        return jnp.diag(self.K) - jnp.sum(self.cross() ** 2, axis=0)

    def sites_solve(self, u):
        """(K + W⁻¹)⁻¹ u = W½ B⁻¹ W½ u (``u`` of shape ``(N,)`` or ``(N, K)``)."""
        return _times(self.root, cho_solve((self.L, True), _times(self.root, u)))

    def solve(self, v):
        """Σ v = K v − K (K + W⁻¹)⁻¹ K v."""
        Kv = self.K @ v
        return Kv - self.K @ self.sites_solve(Kv)


class Conditional(NamedTuple):
    """f* | f for jointly Gaussian (f, f*) with means (μ, μ*): see `conditional`."""

    whitened: jax.Array  # (N, T) A = L⁻¹K*: E[f* | f] = μ* + Aᵀ f̃ in the whitened f̃ = L⁻¹(f − μ)
    weights: jax.Array  # (N, T) B = K⁻¹K* = L⁻ᵀA: E[f* | f] = μ* + Bᵀ(f − μ)
    variances: jax.Array  # (T,) Var[f* | f] = k** − colsums(A∘A)


def conditional(chol, cross, prior_diag) -> Conditional:
    """f* | f ~ N(μ* + Bᵀ(f − μ), diag(k** − ‖L⁻¹K*‖²)), B = K⁻¹K*, for Cov f = K = LLᵀ (``chol`` L, ``(N, N)``
    lower-triangular), Cov(f, f*) = K* (``cross``, ``(N, T)``) and Var f* = k** (``prior_diag``, ``(T,)``); under
    q(f) = N(m, S), E f* = μ* + Bᵀ(m − μ) and Var f* = k** − ‖L⁻¹K*‖² + diag(BᵀSB)."""

    A = solve_triangular(chol, cross, lower=True)
    return Conditional(A, solve_triangular(chol, A, lower=True, trans="T"), prior_diag - jnp.sum(A**2, axis=0))


def _times(d, v):
    """diag(d) v for ``v`` of shape ``(N,)`` or ``(N, K)``."""
    return d * v if v.ndim == 1 else d[:, None] * v
