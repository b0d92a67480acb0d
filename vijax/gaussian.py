"""Gaussian factors exp(−½ wᵀΛw + ηᵀw + c): the Gaussian term of a latent linear model.

`GaussianFactor`'s constructors return the form whose algebra is cheapest, its parameters strongly typed arrays
of the promoted dtype of the arrays passed (else ``jnp.result_type(float)``), so an update never changes their type.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from . import _checks
from ._linalg import LOG_2PI

__all__ = ["GaussianFactor", "IsotropicGaussian", "DiagonalGaussian", "DenseGaussian", "NaturalGaussian"]
__dir__ = __all__.copy


class GaussianFactor(eqx.Module):
    """A Gaussian term exp(−½ wᵀΛw + ηᵀw + c) of the target, built by one of the constructors:

    - `GaussianFactor.isotropic(dim, variance, mean=0)` — N(w | μ, v I);
    - `GaussianFactor.diagonal(variance, mean=0)` — N(w | μ, diag(v));
    - `GaussianFactor.dense(mean, cov)` — N(w | μ, Σ), Σ positive definite;
    - `GaussianFactor.precision(mean, prec)` — N(w | μ, Λ⁻¹), Λ positive definite;
    - `GaussianFactor.linear_gaussian(M, y, noise_variance)` — N(y | M w, ν² I) in w (MᵀM/ν² may be singular).
    """

    # Whether Λ is diagonal, so that tr(ΛS) needs only diag(S).
    diagonal_precision: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """D, the dimension of w."""

    @abc.abstractmethod
    def log_density(self, w):
        """log of the factor at ``w`` (shape ``(D,)``), normalising constant included."""

    @abc.abstractmethod
    def trace_gram(self, C):
        """tr(Λ CᵀC) for a square ``C``: the trace term of ⟨log f⟩ under S = CᵀC."""

    @abc.abstractmethod
    def precision_diagonal(self):
        """diag(Λ), shape ``(D,)``."""

    @abc.abstractmethod
    def precision_matrix(self):
        """Λ as a dense ``(D, D)`` matrix."""

    def expected_log_density(self, mean, cov):
        """⟨log f(w)⟩ under N(mean, S) with S given by a covariance-family factor."""
        return self.log_density(mean) - 0.5 * cov.trace_precision(self)

    @abc.abstractmethod
    def initial_moments(self):
        """A starting mean and per-coordinate scale for the approximation."""

    def whitening(self):
        """``(loc, L)`` with w = loc + L w̃ turning the factor into N(w̃ | 0, I), or None."""
        return None

    @staticmethod
    def isotropic(dim: int, variance=1.0, mean=0.0) -> "IsotropicGaussian":
        return IsotropicGaussian(_checks.integer("dim", dim, "GaussianFactor.isotropic"), variance, mean)

    @staticmethod
    def diagonal(variance, mean=0.0) -> "DiagonalGaussian":
        return DiagonalGaussian(variance, mean)

    @staticmethod
    def dense(mean, cov, jitter=0.0) -> "DenseGaussian":
        return DenseGaussian(mean, cov, jitter)

    @staticmethod
    def precision(mean, prec) -> "NaturalGaussian":
        owner = "GaussianFactor.precision"
        dtype = _checks.float_dtype(mean, prec)
        mean = _checks.as_param("mean", mean, owner, dtype, ndim=1)
        prec = _checks.as_param("prec", prec, owner, dtype, ndim=2)
        _check_square(prec, mean.shape[0], "prec", owner)
        _check_positive_definite(prec, "prec", owner)
        L = jnp.linalg.cholesky(prec)
        logdet = 2 * jnp.sum(jnp.log(jnp.diag(L)))
        shift = prec @ mean
        const = 0.5 * logdet - 0.5 * mean.shape[0] * LOG_2PI - 0.5 * mean @ shift
        return NaturalGaussian(prec, shift, const)

    @staticmethod
    def linear_gaussian(M, y, noise_variance) -> "NaturalGaussian":
        owner = "GaussianFactor.linear_gaussian"
        dtype = _checks.float_dtype(M, y)
        M = _checks.as_param("M", M, owner, dtype, ndim=2)
        y = _checks.as_param("y", y, owner, dtype, ndim=1)
        if M.shape[0] != y.shape[0]:
            raise ValueError(f"{owner}: M has {M.shape[0]} rows but y has {y.shape[0]} entries.")
        _checks.check_finite("M", M, owner)
        _checks.check_finite("y", y, owner)
        _checks.check_positive("noise_variance", noise_variance, owner)
        nu2 = jnp.asarray(noise_variance, M.dtype)
        const = -0.5 * (y @ y) / nu2 - 0.5 * y.shape[0] * (LOG_2PI + jnp.log(nu2))
        return NaturalGaussian(M.T @ M / nu2, M.T @ y / nu2, const)


def _check_square(A, dim, name, owner):
    if A.shape != (dim, dim):
        raise ValueError(f"{owner}: `{name}` must have shape ({dim}, {dim}) to match the mean, got {A.shape}.")


def _check_positive_definite(A, name, owner):
    _checks.check_finite(name, A, owner)
    if not _checks.is_concrete(A):
        return
    a = np.asarray(A, dtype=np.float64)
    if not np.allclose(a, a.T, rtol=1e-10, atol=1e-12 * max(1.0, np.abs(a).max())):
        raise ValueError(f"{owner}: `{name}` must be symmetric.")
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        lam = np.linalg.eigvalsh(a).min()
        raise ValueError(f"{owner}: `{name}` is not positive definite (smallest eigenvalue {lam:.3g}); "
                         "add jitter to its diagonal or check how it was built.") from None


class IsotropicGaussian(GaussianFactor):
    """N(w | μ, v I)."""

    diagonal_precision: ClassVar[bool] = True

    num_dims: int = eqx.field(static=True)
    variance: jax.Array
    mean: jax.Array

    def __init__(self, dim, variance=1.0, mean=0.0):
        owner = "GaussianFactor.isotropic"
        self.num_dims = dim
        dtype = _checks.float_dtype(variance, mean)
        self.variance = _checks.as_param("variance", variance, owner, dtype, ndim=0)
        _checks.check_positive("variance", self.variance, owner)
        self.mean = jnp.broadcast_to(_checks.as_param("mean", mean, owner, dtype), (dim,))
        _checks.check_finite("mean", self.mean, owner)

    @property
    def dim(self):
        return self.num_dims

    def log_density(self, w):
        r = w - self.mean
        return -0.5 * (self.dim * (LOG_2PI + jnp.log(self.variance)) + r @ r / self.variance)

    def trace_gram(self, C):
        return jnp.sum(C**2) / self.variance

    def precision_diagonal(self):
        return jnp.full((self.dim,), 1.0 / self.variance)

    def precision_matrix(self):
        return jnp.eye(self.dim, dtype=self.mean.dtype) / self.variance

    def initial_moments(self):
        return self.mean, jnp.full((self.dim,), jnp.sqrt(self.variance))


class DiagonalGaussian(GaussianFactor):
    """N(w | μ, diag(v))."""

    diagonal_precision: ClassVar[bool] = True

    variance: jax.Array
    mean: jax.Array

    def __init__(self, variance, mean=0.0):
        owner = "GaussianFactor.diagonal"
        dtype = _checks.float_dtype(variance, mean)
        self.variance = _checks.as_param("variance", variance, owner, dtype, ndim=1)
        _checks.check_positive("variance", self.variance, owner)
        self.mean = jnp.broadcast_to(_checks.as_param("mean", mean, owner, dtype), self.variance.shape)
        _checks.check_finite("mean", self.mean, owner)

    @property
    def dim(self):
        return self.variance.shape[0]

    def log_density(self, w):
        r = w - self.mean
        return -0.5 * (self.dim * LOG_2PI + jnp.sum(jnp.log(self.variance)) + jnp.sum(r**2 / self.variance))

    def trace_gram(self, C):
        return jnp.sum(C**2 / self.variance[None, :])

    def precision_diagonal(self):
        return 1.0 / self.variance

    def precision_matrix(self):
        return jnp.diag(1.0 / self.variance)

    def initial_moments(self):
        return self.mean, jnp.sqrt(self.variance)


class DenseGaussian(GaussianFactor):
    """N(w | μ, Σ) with a dense positive-definite Σ = L Lᵀ (L lower-triangular).

    ``jitter`` is added to the diagonal of Σ before factorising and kept for reporting.
    """

    mean: jax.Array
    cov: jax.Array
    chol: jax.Array
    jitter: jax.Array

    def __init__(self, mean, cov, jitter=0.0):
        owner = "GaussianFactor.dense"
        dtype = _checks.float_dtype(mean, cov)
        self.mean = _checks.as_param("mean", mean, owner, dtype, ndim=1)
        _checks.check_finite("mean", self.mean, owner)
        cov = _checks.as_param("cov", cov, owner, dtype, ndim=2)
        _check_square(cov, self.mean.shape[0], "cov", owner)
        self.jitter = _checks.as_param("jitter", jitter, owner, dtype)
        self.cov = cov + self.jitter * jnp.eye(cov.shape[0], dtype=cov.dtype)
        _check_positive_definite(self.cov, "cov", owner)
        self.chol = jnp.linalg.cholesky(self.cov)

    @property
    def dim(self):
        return self.mean.shape[0]

    def log_density(self, w):
        r = solve_triangular(self.chol, w - self.mean, lower=True)
        logdet = 2 * jnp.sum(jnp.log(jnp.diag(self.chol)))
        return -0.5 * (self.dim * LOG_2PI + logdet + r @ r)

    def trace_gram(self, C):
        # tr(Σ⁻¹ CᵀC) = ‖L⁻¹ Cᵀ‖²_F
        return jnp.sum(solve_triangular(self.chol, C.T, lower=True) ** 2)

    def precision_diagonal(self):
        inv_chol = solve_triangular(self.chol, jnp.eye(self.dim, dtype=self.chol.dtype), lower=True)
        return jnp.sum(inv_chol**2, axis=0)

    def precision_matrix(self):
        return cho_solve((self.chol, True), jnp.eye(self.dim, dtype=self.chol.dtype))

    def initial_moments(self):
        return self.mean, jnp.sqrt(jnp.diag(self.cov))

    def whitening(self):
        return self.mean, self.chol


class NaturalGaussian(GaussianFactor):
    """exp(−½ wᵀΛw + ηᵀw + c) with symmetric positive semi-definite Λ (may be singular)."""

    prec: jax.Array
    shift: jax.Array
    log_const: jax.Array

    @property
    def dim(self):
        return self.shift.shape[0]

    def log_density(self, w):
        return -0.5 * w @ (self.prec @ w) + self.shift @ w + self.log_const

    def trace_gram(self, C):
        return jnp.sum((C @ self.prec) * C)

    def precision_diagonal(self):
        return jnp.diag(self.prec)

    def precision_matrix(self):
        return self.prec

    def initial_moments(self):
        d = jnp.diag(self.prec)
        scale = jnp.where(d > 0, jnp.minimum(1.0 / jnp.sqrt(jnp.where(d > 0, d, 1.0)), 1.0), 1.0)
        return jnp.zeros_like(self.shift), scale
