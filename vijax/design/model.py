"""The sparse linear model: noisy linear measurements of w with a sparsity prior on filter responses.

$$
p(w \\mid y) \\;\\propto\\; \\mathcal N(y \\mid M w, \\nu^2 I) \\prod_{j=1}^{J} \\varphi_j(b_j^\\top w),
\\qquad s = B w,
$$

with M ∈ R^{N×D} (N ≪ D measurements), B ∈ R^{J×D} (`vijax.design.filters`) and φ a sparsity potential
(thesis §5.4): a `vj.LatentLinearModel` with measurement sites (group 0) and sparsity sites (group 1).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from .. import _checks, potentials
from ..methods.ep import SiteParams
from ..model import LatentLinearModel, Sites
from ..projections import as_projection

__all__ = ["sparse_linear_model", "measurement_sites", "ep_sites", "smoothed_laplace", "MEASUREMENTS", "SPARSITY"]

MEASUREMENTS, SPARSITY = 0, 1  # the site groups of a sparse linear model
_OWNER = "sparse_linear_model"


def measurement_sites(M, y, noise_variance, owner=_OWNER) -> Sites:
    """The Gaussian sites N(y_n | m_nᵀ w, ν²) of measurements ``M`` (N, D) with values ``y`` (N,)."""
    projection = as_projection(M)
    y = _checks.as_float_array("y", y, owner, ndim=1)
    _checks.check_finite("y", y, owner)
    if projection.shape[0] != y.shape[0]:
        raise ValueError(f"{owner}: M has {projection.shape[0]} rows (measurements) but y has {y.shape[0]} "
                         "entries; give one observed value per row of M.")
    _checks.check_positive("noise_variance", noise_variance, owner)
    scale = jnp.sqrt(jnp.asarray(noise_variance, y.dtype))
    return Sites(projection, potentials.Gaussian(loc=y, scale=scale))


def sparse_linear_model(M, y, noise_variance, B, prior) -> LatentLinearModel:
    """p(w | y) ∝ N(y | M w, ν² I) · ∏_j φ_j(b_jᵀ w): a `vj.LatentLinearModel` for signal recovery and design.

    ∏_j φ_j(b_jᵀw) is a density in s, not in w, so ``log_z`` is **not a lower bound on log p(y)** (off by
    log |det B| for a square B); q(w) is unaffected, but do not compare ``log_z`` across filters B.

    **Arguments:**

    - `M`: the measurements ``(N, D)``: a dense array, a `BCOO` or any vijax projection.
    - `y`: the measured values ``(N,)``; `noise_variance`: ν² > 0.
    - `B`: the filters ``(J, D)``: a dense array, a `BCOO` or a projection (`vijax.design.filters`).
    - `prior`: the potential on s = B w: `vj.potentials.Laplace(scale=τ)` or `vj.potentials.StudentT(df=ν,
      scale=σ)`, parameters scalar or ``(J,)``; `vj.potentials.Gaussian(scale=σ)` gives the conjugate model.

    **Returns:** a `vj.LatentLinearModel` with sites ``Gaussian(loc=y, scale=ν)`` on M and ``prior`` on B.
    """
    measurements = measurement_sites(M, y, noise_variance)
    filters = as_projection(B)
    if filters.shape[1] != measurements.dim:
        raise ValueError(f"{_OWNER}: M has D = {measurements.dim} columns but B has {filters.shape[1]}; both act on "
                         "the same signal w, so give B one column per coordinate of w.")
    if not isinstance(prior, (potentials.Laplace, potentials.StudentT, potentials.Gaussian, potentials.Custom,
                              SmoothedLaplace)):
        raise ValueError(f"{_OWNER}: `prior` must be vj.potentials.Laplace(scale=τ) or "
                         f"vj.potentials.StudentT(df=ν, scale=σ) (or Gaussian(scale=σ) for the conjugate model, "
                         f"vj.design.smoothed_laplace(τ) for MAP, or a Custom potential), got {type(prior).__name__}.")
    return LatentLinearModel(None, (measurements, Sites(filters, prior)))


def _prior_precision(potential):
    """1 / Var of a sparsity potential as a density in s (1/σ² for a Student-t with ν ≤ 2)."""
    if isinstance(potential, potentials.Laplace):
        return 1.0 / (2.0 * potential.scale**2)
    if isinstance(potential, potentials.Gaussian):
        return 1.0 / potential.scale**2
    if isinstance(potential, potentials.StudentT):
        return jnp.where(potential.df > 2, (potential.df - 2) / (potential.df * potential.scale**2),
                         1.0 / potential.scale**2)
    return jnp.asarray(1.0)


def ep_sites(model: LatentLinearModel, previous: SiteParams | None = None) -> SiteParams:
    """Starting sites for `vj.EP` on a sparse linear model (its ``init``).

    EP's default start has zero curvature at Laplace sites (q improper while N < D). Here the measurement
    sites are exact and each sparsity site starts at 1/Var φ_j, or at its value in ``previous`` (a warm start).
    """
    measurement, sparsity = model.sites[MEASUREMENTS], model.sites[SPARSITY]
    gauss = measurement.potential
    mask = getattr(gauss, "mask", None)
    if mask is not None:  # a padded model (vj.pad_sites): padding sites contribute nothing
        gauss = gauss.potential
    dtype = model.dtype
    n = measurement.num_sites
    tau = jnp.broadcast_to(1.0 / gauss.scale**2, (n,)).astype(dtype)
    nu = jnp.broadcast_to((gauss.loc - measurement.offset) / gauss.scale**2, (n,)).astype(dtype)
    if mask is not None:
        tau, nu = jnp.where(mask, tau, 0.0), jnp.where(mask, nu, 0.0)
    if previous is not None and previous.precision[SPARSITY].shape == (sparsity.num_sites,):
        s_tau, s_nu = previous.precision[SPARSITY], previous.shift[SPARSITY]
    else:
        potential = sparsity.potential
        s_tau = jnp.broadcast_to(_prior_precision(getattr(potential, "potential", potential)),
                                 (sparsity.num_sites,)).astype(dtype)
        s_nu = jnp.zeros(sparsity.num_sites, dtype)
    return SiteParams((tau, s_tau), (nu, s_nu))


class SmoothedLaplace(potentials.AbstractPotential):
    """φ(s) ∝ exp(−(√(s² + ε²) − ε)/τ) / 2τ with ε = ``smoothing``·τ (see `smoothed_laplace`)."""

    scale: jax.Array
    smoothing: jax.Array
    log_concave: ClassVar[bool] = True
    super_gaussian: ClassVar[bool] = True

    def __init__(self, scale=1.0, smoothing=1e-2):
        dtype = _checks.float_dtype(scale, smoothing)
        self.scale = potentials._param("scale", scale, "smoothed_laplace", dtype, positive=True)
        self.smoothing = potentials._param("smoothing", smoothing, "smoothed_laplace", dtype, positive=True)

    def log_phi(self, x):
        eps = self.smoothing * self.scale
        return -(jnp.sqrt(x**2 + eps**2) - eps) / self.scale - jnp.log(2 * self.scale)


def smoothed_laplace(scale, smoothing=1e-2) -> SmoothedLaplace:
    """φ(s) ∝ exp(−√(s² + ε²)/τ) with ε = ``smoothing``·τ: a twice-differentiable Laplace for MAP estimation.

    Newton steps stall on the Laplace potential's kink; the mode stays within O(ε) of the Laplace model's.
    """
    return SmoothedLaplace(scale, smoothing)
