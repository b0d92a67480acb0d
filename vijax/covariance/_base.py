"""The family/factor interface every covariance parameterisation implements."""

from __future__ import annotations

import abc
from typing import Callable, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _checks


class AbstractCovariance(eqx.Module):
    """A covariance family: configuration that builds factors of its own structure.

    ``concave``: whether the G-KL bound is jointly concave in (m, factor) for log-concave sites (Newton-CG).
    """

    concave: ClassVar[bool] = True

    @abc.abstractmethod
    def init(self, dim: int, scale) -> "AbstractFactor":
        """A factor with S ≈ diag(scale²) (``scale`` scalar or shape ``(dim,)``; exact where the structure allows)."""

    @abc.abstractmethod
    def from_dense(self, cov) -> "AbstractFactor":
        """A factor of this family close to a dense covariance (exact when it fits the structure)."""

    def from_curvature(self, curvature) -> "AbstractFactor":
        """S ≈ P⁻¹ for a curvature P (see `vj.gkl.curvature`): a well-scaled start (here S = diag(P)⁻¹)."""
        return self.init(curvature.model.dim, 1.0 / jnp.sqrt(curvature.diagonal()))

    @property
    def num_rounds(self) -> int:
        """Outer rounds of `update` between inner solves (structure updates such as a subspace basis)."""
        return 0

    def update(self, factor: "AbstractFactor", mean, objective: Callable, curvature) -> "AbstractFactor":
        """One outer update of the fixed part of ``factor`` at ``mean``, given ``objective``: factor ↦ the bound
        there and the expected site ``curvature`` (a `vijax._curvature.Curvature`)."""
        return factor

    def owns(self, factor, dim: int) -> bool:
        """Whether ``factor`` has exactly the structure ``self.init(dim)`` would build."""
        template = eqx.filter_eval_shape(self.init, dim, 1.0)
        if jax.tree_util.tree_structure(template) != jax.tree_util.tree_structure(factor):
            return False
        shapes = lambda tree: [jnp.shape(x) for x in jax.tree_util.tree_leaves(tree)]
        return shapes(template) == shapes(factor)


class AbstractFactor(eqx.Module):
    """The parameters of one covariance S, and the quantities the bounds need from it."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """D, the dimension of w."""

    @abc.abstractmethod
    def projected_variances(self, projection):
        """s_n² = h_nᵀ S h_n for every row of ``projection``: shape ``(N,)``."""

    @abc.abstractmethod
    def logdet(self):
        """log det S."""

    @abc.abstractmethod
    def variances(self):
        """diag(S), shape ``(D,)``."""

    def trace_precision(self, gaussian):
        """tr(Λ S) for the model's Gaussian term with precision Λ."""
        if gaussian.diagonal_precision:
            return jnp.sum(gaussian.precision_diagonal() * self.variances())
        return gaussian.trace_gram(self.cholesky())

    def dense(self):
        """S as a dense ``(D, D)`` matrix (CᵀC unless the family overrides it)."""
        C = self.cholesky()
        return C.T @ C

    def cholesky(self):
        """A square ``C`` with S = CᵀC (upper-triangular; from `dense`, O(D³), unless the family stores one)."""
        return jnp.linalg.cholesky(self.dense()).T

    @abc.abstractmethod
    def canonical(self) -> "AbstractFactor":
        """The same S with sign conventions fixed (positive Cholesky diagonals)."""

    def sample(self, key, num_samples: int):
        """``num_samples`` draws from N(0, S): shape ``(num_samples, D)``."""
        z = jax.random.normal(key, (num_samples, self.dim), self.dtype)
        return z @ self.cholesky()

    @abc.abstractmethod
    def preconditioner(self, curvature):
        """A map ``(mean_tangent, factor_tangent) ↦`` approximate inverse negative Hessian applied to them."""

    def trainable(self):
        """A pytree of booleans (equinox filter spec): which leaves the solver optimises."""
        return jax.tree_util.tree_map(lambda _: True, self)

    @property
    def dtype(self):
        return jnp.result_type(*jax.tree_util.tree_leaves(self))


def as_scale(scale, dim):
    scale = jnp.asarray(scale)
    if not jnp.issubdtype(scale.dtype, jnp.floating):
        scale = scale.astype(jnp.result_type(float))
    return jnp.broadcast_to(scale, (dim,))


def check_rank(name, value, dim, owner, minimum=1):
    """A structural size such as a bandwidth or a rank: an int in [minimum, dim]."""
    value = _checks.integer(name, value, owner, minimum)
    if value > dim:
        raise ValueError(f"{owner}: `{name}` must lie in [{minimum}, D = {dim}], got {value}; "
                         f"use a smaller `{name}` or vj.covariance.Full() for D = {dim}.")
    return value
