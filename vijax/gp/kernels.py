"""Covariance functions k(x, x') as equinox modules.

``kernel(X1, X2)`` is the ``(N1, N2)`` cross-covariance, ``kernel(X)`` the ``(N, N)`` covariance (white noise
included) and ``kernel.diagonal(X)`` its diagonal, for inputs ``(N, d)`` (a 1-D array is ``(N, 1)``).
Positive parameters are stored as logarithms (``log_variance``, …; strongly typed arrays, so an optax step
keeps them positive and compiles once); the properties ``variance``, … give the values. Stationary
kernels use r² = Σ_j (x_j − x'_j)² / ℓ_j² (one ℓ per input dimension for ARD, or a scalar). Kernels add
and multiply: ``k1 + k2``, ``k1 * k2``.
"""

from __future__ import annotations

import abc
import dataclasses
import operator

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx

from .. import _checks
from ..quadrature import safe_sqrt

__all__ = ["AbstractKernel", "SquaredExponential", "Matern12", "Matern32", "Matern52", "Periodic", "Linear", "White",
           "Sum", "Product"]
__dir__ = __all__.copy


def _format(value):
    """A parameter's value for `repr`: numbers for concrete arrays, dtype and shape for traced ones."""
    if isinstance(value, jax.core.Tracer) or np.ndim(value) == 0:
        return _checks.format_param(value)
    return np.array2string(np.asarray(value), precision=6, separator=", ")


def _log_positive(name, value, owner, dtype):
    """log of a positive parameter, a strongly typed array of ``dtype``."""
    value = _checks.as_param(name, value, owner, dtype)
    _checks.check_positive(name, value, owner)
    return jnp.log(value)


def _exp(name):
    """The property ``name``: the exponential of the stored ``log_<name>``."""
    return property(lambda self: jnp.exp(getattr(self, f"log_{name}")), doc=f"The {name} (positive).")


class AbstractKernel(eqx.Module):
    """Base class: subclasses define ``_matrix(X1, X2, same)`` and ``_diagonal(X)``."""

    def __call__(self, X1, X2=None):
        owner = type(self).__name__
        X1 = _checks.as_inputs(X1, owner)
        X2 = X1 if X2 is None else _checks.as_inputs(X2, owner)
        if X1.shape[1] != X2.shape[1]:
            raise ValueError(f"{owner}: inputs have {X1.shape[1]} and {X2.shape[1]} columns; they must agree.")
        return self._matrix(X1, X2, X2 is X1)

    def diagonal(self, X):
        """k(x_n, x_n) for each row: shape ``(N,)``."""
        return self._diagonal(_checks.as_inputs(X, type(self).__name__))

    @abc.abstractmethod
    def _matrix(self, X1, X2, same):
        """k(X1, X2), shape ``(N1, N2)``; ``same`` when X2 is X1 (exact zeros on the diagonal of r²)."""

    @abc.abstractmethod
    def _diagonal(self, X):
        """k(x_n, x_n), shape ``(N,)``."""

    def __repr__(self):
        """The parameters' values (``variance=2.0``), not their stored logarithms."""
        parts = []
        for field in dataclasses.fields(self):
            name, value = field.name, getattr(self, field.name)
            if name.startswith("log_"):
                name, value = name[4:], jnp.exp(value)
            parts.append(f"{name}={_format(value)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __add__(self, other):
        return Sum(self, other)

    def __mul__(self, other):
        return Product(self, other)


class _Combination(AbstractKernel):
    first: AbstractKernel
    second: AbstractKernel

    def __repr__(self):
        return f"({self.first!r} {self._symbol} {self.second!r})"

    def _matrix(self, X1, X2, same):
        return self._op(self.first._matrix(X1, X2, same), self.second._matrix(X1, X2, same))

    def _diagonal(self, X):
        return self._op(self.first._diagonal(X), self.second._diagonal(X))


class Sum(_Combination):
    """k₁ + k₂."""

    _op, _symbol = operator.add, "+"


class Product(_Combination):
    """k₁ · k₂ (elementwise)."""

    _op, _symbol = operator.mul, "*"


class _Stationary(AbstractKernel):
    """v · profile(r²) with r² = Σ_j (x_j − x'_j)² / ℓ_j²."""

    log_lengthscale: jnp.ndarray
    log_variance: jnp.ndarray

    def __init__(self, lengthscale=1.0, variance=1.0):
        owner = type(self).__name__
        dtype = _checks.float_dtype(lengthscale, variance)
        self.log_lengthscale = _log_positive("lengthscale", lengthscale, owner, dtype)
        self.log_variance = _log_positive("variance", variance, owner, dtype)
        if self.log_lengthscale.ndim > 1:
            raise ValueError(f"{owner}: `lengthscale` must be a scalar or one value per input dimension.")

    lengthscale = _exp("lengthscale")
    variance = _exp("variance")

    def _matrix(self, X1, X2, same):
        ell = self.lengthscale
        if ell.ndim == 1 and ell.shape[0] != X1.shape[1]:
            raise ValueError(f"{type(self).__name__}: {ell.shape[0]} lengthscales for inputs with "
                             f"{X1.shape[1]} columns.")
        A, B = X1 / ell, X2 / ell
        r2 = jnp.sum(A**2, 1)[:, None] + jnp.sum(B**2, 1)[None, :] - 2 * A @ B.T
        r2 = jnp.maximum(r2, 0.0)
        if same:  # the expansion leaves rounding error where the distance is exactly zero
            r2 = r2 * (1 - jnp.eye(r2.shape[0], dtype=r2.dtype))
        return self.variance * self._profile(r2)

    def _diagonal(self, X):
        return jnp.full(X.shape[0], self.variance * self._profile(jnp.zeros((), X.dtype)), X.dtype)

    @abc.abstractmethod
    def _profile(self, r2):
        """k as a function of the scaled squared distance r², for unit variance."""


class SquaredExponential(_Stationary):
    """v exp(−r²/2) (ARD when ``lengthscale`` has one entry per input dimension)."""

    def _profile(self, r2):
        return jnp.exp(-0.5 * r2)


class Matern12(_Stationary):
    """v exp(−r) (Ornstein–Uhlenbeck)."""

    def _profile(self, r2):
        return jnp.exp(-safe_sqrt(r2))


class Matern32(_Stationary):
    """v (1 + √3 r) exp(−√3 r)."""

    def _profile(self, r2):
        s = jnp.sqrt(3.0) * safe_sqrt(r2)
        return (1 + s) * jnp.exp(-s)


class Matern52(_Stationary):
    """v (1 + √5 r + 5r²/3) exp(−√5 r)."""

    def _profile(self, r2):
        s = jnp.sqrt(5.0) * safe_sqrt(r2)
        return (1 + s + s**2 / 3) * jnp.exp(-s)


class Periodic(AbstractKernel):
    """v exp(−2 Σ_j sin²(π |x_j − x'_j| / p) / ℓ_j²) (MacKay's periodic kernel)."""

    log_lengthscale: jnp.ndarray
    log_period: jnp.ndarray
    log_variance: jnp.ndarray

    def __init__(self, lengthscale=1.0, period=1.0, variance=1.0):
        dtype = _checks.float_dtype(lengthscale, period, variance)
        self.log_lengthscale = _log_positive("lengthscale", lengthscale, "Periodic", dtype)
        self.log_period = _log_positive("period", period, "Periodic", dtype)
        self.log_variance = _log_positive("variance", variance, "Periodic", dtype)

    lengthscale = _exp("lengthscale")
    period = _exp("period")
    variance = _exp("variance")

    def _matrix(self, X1, X2, same):
        diff = X1[:, None, :] - X2[None, :, :]
        s = jnp.sin(jnp.pi * diff / self.period) / self.lengthscale
        return self.variance * jnp.exp(-2 * jnp.sum(s**2, axis=-1))

    def _diagonal(self, X):
        return jnp.full(X.shape[0], self.variance, X.dtype)


class _VarianceOnly(AbstractKernel):
    log_variance: jnp.ndarray

    def __init__(self, variance=1.0):
        self.log_variance = _log_positive("variance", variance, type(self).__name__, _checks.float_dtype(variance))

    variance = _exp("variance")


class Linear(_VarianceOnly):
    """Σ_j v_j x_j x'_j (``variance`` a scalar or one value per input dimension)."""

    def _matrix(self, X1, X2, same):
        return (X1 * self.variance) @ X2.T

    def _diagonal(self, X):
        return jnp.sum(X**2 * self.variance, axis=1)


class White(_VarianceOnly):
    """v δ(x, x'): v I in ``kernel(X)``, zero between different input sets (independent noise)."""

    def _matrix(self, X1, X2, same):
        if same:
            return self.variance * jnp.eye(X1.shape[0], dtype=X1.dtype)
        return jnp.zeros((X1.shape[0], X2.shape[0]), X1.dtype)

    def _diagonal(self, X):
        return jnp.full(X.shape[0], self.variance, X.dtype)
