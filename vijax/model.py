"""The latent linear model p(w) ∝ N(w | μ, Σ) · ∏_n φ_n(h_nᵀ w + b_n): `Sites` (potentials, their projection H
and offset b) and `LatentLinearModel`. Re-exports `vijax.gaussian`'s factors and `vijax.projections`.
"""

from __future__ import annotations

import copy

import equinox as eqx
import jax
import jax.numpy as jnp

from . import _checks
from .gaussian import DenseGaussian, DiagonalGaussian, GaussianFactor, IsotropicGaussian, NaturalGaussian
from .potentials import AbstractPotential
from .projections import AbstractProjection, Dense, Identity, ScaledIdentity, Sparse, as_projection

__all__ = ["GaussianFactor", "IsotropicGaussian", "DiagonalGaussian", "DenseGaussian", "NaturalGaussian",
           "AbstractProjection", "Dense", "Sparse", "Identity", "ScaledIdentity", "as_projection", "Sites",
           "LatentLinearModel"]
__dir__ = __all__.copy


class Sites(eqx.Module):
    """A group of site potentials φ_n(h_nᵀ w + b_n).

    **Arguments:**

    - `H`: projections, shape ``(N, D)``: a dense array, a `BCOO` matrix, or `Identity(D)`.
    - `potential`: an `AbstractPotential` whose per-site parameters broadcast to ``(N,)``.
    - `offset`: b, a scalar or shape ``(N,)`` (default 0).

    The potential's parameters and the offset take the floating dtype of ``H`` (with `Identity`, the potential's).
    """

    projection: AbstractProjection
    potential: AbstractPotential
    offset: jax.Array

    def __init__(self, H, potential, offset=0.0):
        if not isinstance(potential, AbstractPotential):
            raise ValueError(f"Sites: `potential` must be a vj.potentials potential, got {type(potential).__name__}.")
        self.projection = as_projection(H)
        dtype = _checks.data_dtype(self.projection)
        if dtype is not None:
            potential = _checks.cast_floating(potential, dtype)
        else:
            dtype = _checks.float_dtype(offset, potential)
        self.potential = potential
        self.offset = _checks.as_param("offset", offset, "Sites", dtype)
        _checks.check_finite("offset", self.offset, "Sites")
        _checks.check_broadcastable("offset", self.offset, self.num_sites, "Sites")
        potential.check_num_sites(self.num_sites)

    @property
    def num_sites(self) -> int:
        return self.projection.shape[0]

    @property
    def dim(self) -> int:
        return self.projection.shape[1]

    def project(self, w):
        """``H w + b``."""
        return self.projection.mv(w) + self.offset

    def change_basis(self, loc, L):
        """The same sites on w̃ where w = loc + L w̃."""
        return Sites(self.projection.right_multiply(L), self.potential, self.offset + self.projection.mv(loc))


_KEEP = object()


class LatentLinearModel(eqx.Module):
    r"""A latent linear model: a Gaussian factor f and groups g of sites n,

    $$
    p(w) \propto f(w) \prod_g \prod_n \phi_{gn}(h_{gn}^\top w + b_{gn}).
    $$

    **Arguments:**

    - `prior`: a `GaussianFactor`, or None for a target with no Gaussian term.
    - `sites`: a `Sites` group or a tuple of them (e.g. likelihood sites and Laplace-prior sites with H = I).

    All parameters are stored in one floating ``dtype``: that of the projections, else of the prior.
    """

    prior: GaussianFactor | None
    sites: tuple[Sites, ...]

    def __init__(self, prior, sites):
        if prior is not None and not isinstance(prior, GaussianFactor):
            raise ValueError("LatentLinearModel: `prior` must be a vj.GaussianFactor or None, "
                             f"got {type(prior).__name__}.")
        sites = (sites,) if isinstance(sites, Sites) else tuple(sites)
        if not sites or not all(isinstance(s, Sites) for s in sites):
            raise ValueError("LatentLinearModel: `sites` must be a vj.Sites or a non-empty tuple of them.")
        dims = {s.dim for s in sites} | ({prior.dim} if prior is not None else set())
        if len(dims) != 1:
            raise ValueError(f"LatentLinearModel: dimensions disagree: prior and site groups have D = {sorted(dims)}; "
                             "every H must have one column per latent coordinate.")
        self.prior = prior
        self.sites = sites
        dtype = _checks.data_dtype(self._dtype_leaves())
        if dtype is not None:
            self.prior = _checks.cast_floating(prior, dtype)
            self.sites = _checks.cast_floating(sites, dtype)

    def replace(self, *, prior=_KEEP, sites=_KEEP) -> "LatentLinearModel":
        """This model, of its own type (a GP model keeps its kernel and inputs), with another ``prior``
        and/or ``sites``; the parts not given are the same objects."""
        prior = self.prior if prior is _KEEP else prior
        sites = self.sites if sites is _KEEP else sites
        checked = LatentLinearModel(prior, sites)  # the same checks as a new model's
        new = copy.copy(self)  # no __init__: subclasses build their fields from other arguments
        object.__setattr__(new, "prior", checked.prior)
        object.__setattr__(new, "sites", checked.sites)
        return new

    @property
    def dim(self) -> int:
        return self.sites[0].dim

    @property
    def dtype(self):
        """The floating dtype of the model's data (that of its projections, else of its prior)."""
        return _checks.data_dtype(self._dtype_leaves())

    def _dtype_leaves(self):
        return [s.projection for s in self.sites if not isinstance(s.projection, Identity)] or [self.prior]

    def initial_moments(self):
        """A starting mean and per-coordinate scale: the Gaussian factor's, or (0, 1) without one."""
        dtype = self.dtype
        if self.prior is None:
            return jnp.zeros(self.dim, dtype), jnp.ones(self.dim, dtype)
        return tuple(a.astype(dtype) for a in self.prior.initial_moments())

    def log_joint(self, w):
        """log f(w) + Σ log φ_n(h_nᵀw + b_n): the unnormalised log target at ``w`` (shape ``(D,)``)."""
        value = self.prior.log_density(w) if self.prior is not None else 0.0
        for group in self.sites:
            value = value + jnp.sum(group.potential.log_phi(group.project(w)))
        return value
