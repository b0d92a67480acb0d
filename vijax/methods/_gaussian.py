"""The Gaussian integral that LVB and EP share: log ∫ f(w) ∏_n exp(a_n x_n − ½ A_n x_n² + c_n) dw.

With x_n = h_nᵀw + b_n and f(w) = exp(−½wᵀΛw + ηᵀw + κ), the integrand is an unnormalised Gaussian
with precision P = Λ + Σ_n A_n h_n h_nᵀ and shift r = η + Σ_n (a_n − A_n b_n) h_n:

    log ∫ = κ + Σ_n (a_n b_n − ½ A_n b_n² + c_n) + ½ rᵀP⁻¹r + (D/2) log 2π − ½ log det P.

For a dense Gaussian factor N(μ, LLᵀ) (a GP prior) the integral is taken in the whitened
coordinates w = μ + L w̃ (dw = |L| dw̃ turns f into N(w̃ | 0, I)), so P̃ = I + Σ A_n h̃_n h̃_nᵀ with
h̃ = Lᵀh and nothing ever inverts the prior covariance; the Gaussian maps back as mean = μ + L m̃,
S = L S̃ Lᵀ.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from ..covariance._dense import _reversed_cholesky
from ..model import LatentLinearModel

__all__ = ["integrate", "working_model"]

_LOG_2PI = math.log(2 * math.pi)


def working_model(model: LatentLinearModel):
    """``(sites, whitening)``: the site groups in the coordinates the integral is taken in.

    ``whitening`` is ``(μ, L)`` for a dense Gaussian factor (the groups then act on w̃), else None.
    """
    whitening = model.prior.whitening() if model.prior is not None else None
    if whitening is None:
        return model.sites, None
    loc, L = whitening
    return tuple(group.change_basis(loc, L) for group in model.sites), whitening


def integrate(model: LatentLinearModel, quadratics, sites=None, whitening=None, map_back=True):
    """``(log ∫, mean, C)``: the integral and its normalised Gaussian N(mean, CᵀC), C upper-triangular.

    ``quadratics`` holds one ``(a, A, c)`` per site group (each broadcastable to ``(N_g,)``).
    ``sites``/``whitening`` from `working_model` may be passed to reuse the change of basis;
    ``map_back=False`` returns the Gaussian in the working (whitened) coordinates.
    The value is NaN where P is not positive definite (the integral diverges).
    """
    if sites is None:
        sites, whitening = working_model(model)
    d, dtype = model.dim, model.dtype
    if whitening is not None:
        P, r, const = jnp.eye(d, dtype=dtype), jnp.zeros(d, dtype), jnp.asarray(-0.5 * d * _LOG_2PI, dtype)
    elif model.prior is None:
        P, r, const = jnp.zeros((d, d), dtype), jnp.zeros(d, dtype), jnp.zeros((), dtype)
    else:
        # log f(w) = −½ wᵀΛw + ηᵀw + κ: κ and η are log f and its gradient at 0.
        const, r = (t.astype(dtype) for t in jax.value_and_grad(model.prior.log_density)(jnp.zeros(d, dtype)))
        P = model.prior.precision_matrix().astype(dtype)
    for group, (a, A, c) in zip(sites, quadratics):
        # The model's dtype (that of H) is the working dtype, whatever the parameters' dtypes.
        a, A, c = (jnp.broadcast_to(t, (group.num_sites,)).astype(dtype) for t in (a, A, c))
        b = jnp.broadcast_to(group.offset, (group.num_sites,)).astype(dtype)
        P = P + group.projection.gram(A)
        r = r + group.projection.rmv(a - A * b)
        const = const + jnp.sum(a * b - 0.5 * A * b**2 + c)
    R = _reversed_cholesky(0.5 * (P + P.T))  # P = RRᵀ; NaN where P is not positive definite
    z = solve_triangular(R, r, lower=False)  # rᵀP⁻¹r = ‖z‖², and the mean is P⁻¹r = R⁻ᵀz
    value = const + 0.5 * z @ z + 0.5 * d * _LOG_2PI - jnp.sum(jnp.log(jnp.diag(R)))
    mean = solve_triangular(R, z, lower=False, trans="T")
    if whitening is not None and map_back:
        # S = L P⁻¹ Lᵀ = CᵀC with C = R⁻¹Lᵀ (upper × upper: still upper-triangular), one solve.
        loc, L = whitening
        return value, loc + L @ mean, solve_triangular(R, L.T, lower=False)
    return value, mean, solve_triangular(R, jnp.eye(d, dtype=R.dtype), lower=False)
