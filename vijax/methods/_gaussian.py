"""The Gaussian integral that LVB and EP share: log ∫ f(w) ∏_n exp(a_n x_n − ½ A_n x_n² + c_n) dw.

With x_n = h_nᵀw + b_n and f(w) = exp(−½wᵀΛw + ηᵀw + κ), P = Λ + Σ_n A_n h_n h_nᵀ, r = η + Σ_n (a_n − A_n b_n) h_n:

    log ∫ = κ + Σ_n (a_n b_n − ½ A_n b_n² + c_n) + ½ rᵀP⁻¹r + (D/2) log 2π − ½ log det P.

A dense Gaussian factor N(μ, LLᵀ) is integrated in w̃ = L⁻¹(w − μ) (its covariance never inverted); GP models
(one site per coordinate) use the site form B = I + W½KW½ (R&W §3.4.3, `integrate_diagonal`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .._factorisation import Primal, SiteForm
from .._linalg import LOG_2PI
from ..covariance import CholeskyFactor
from ..model import DenseGaussian, Identity, LatentLinearModel, ScaledIdentity
from ..start import working_model

__all__ = ["integrate", "working_model", "diagonal_form", "integrate_diagonal", "marginals", "precision_operator"]


def integrate(model: LatentLinearModel, quadratics, sites=None, whitening=None, map_back=True):
    """``(log ∫, mean, C)``: the integral (NaN where it diverges) and its Gaussian N(mean, CᵀC), C upper-triangular,
    for ``quadratics`` one ``(a, A, c)`` per site group (``sites``, ``whitening``: `working_model`'s, to reuse;
    ``map_back=False``: the Gaussian in the whitened coordinates)."""
    if sites is None:
        sites, whitening = working_model(model)
    d, dtype = model.dim, model.dtype
    if whitening is not None:
        P, r, const = jnp.eye(d, dtype=dtype), jnp.zeros(d, dtype), jnp.asarray(-0.5 * d * LOG_2PI, dtype)
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
    factor = Primal.of(P)
    # A P singular to working precision can still factorise, with pivots at rounding: it diverges (`Primal.proper`).
    z = factor.half_solve(r)  # rᵀP⁻¹r = ‖z‖²
    value = jnp.where(factor.proper, const + 0.5 * z @ z + 0.5 * d * LOG_2PI - 0.5 * factor.logdet(), jnp.nan)
    mean = factor.solve(r)
    if whitening is not None and map_back:
        # S = L P⁻¹ Lᵀ = CᵀC with C upper-triangular (L lower-triangular), one solve.
        loc, L = whitening
        return value, loc + L @ mean, factor.covariance_factor(L)
    return value, mean, factor.covariance_factor()


def precision_operator(model: LatentLinearModel, quadratics):
    """``(product, r, const)``: v ↦ P v (P never formed), r and the constant, in the model's coordinates, so that
    log ∫ = const + ½ rᵀP⁻¹r + (D/2) log 2π − ½ log det P."""
    d, dtype = model.dim, model.dtype
    zero = jnp.zeros(d, dtype)
    if model.prior is None:
        const, r = jnp.zeros((), dtype), zero
        prior_product = lambda v: jnp.zeros_like(v)  # noqa: E731
    else:
        const, r = (t.astype(dtype) for t in jax.value_and_grad(model.prior.log_density)(zero))
        grad = jax.grad(model.prior.log_density)
        prior_product = lambda v: -jax.jvp(grad, (zero,), (v,))[1].astype(dtype)  # noqa: E731  Λv (log f quadratic)
    terms = []
    for group, (a, A, c) in zip(model.sites, quadratics):
        a, A, c = (jnp.broadcast_to(t, (group.num_sites,)).astype(dtype) for t in (a, A, c))
        b = jnp.broadcast_to(group.offset, (group.num_sites,)).astype(dtype)
        r = r + group.projection.rmv(a - A * b)
        const = const + jnp.sum(a * b - 0.5 * A * b**2 + c)
        terms.append((group.projection, A))

    def product(v):
        out = prior_product(v)
        for projection, A in terms:
            out = out + projection.rmv(A * projection.mv(v))
        return out

    return product, r, const


def diagonal_form(model: LatentLinearModel):
    """``(K, μ, scales)`` for a dense N(μ, K) and every group one site per coordinate, x_gn = s_gn w_n + b_gn (H = I or
    diag(s): GP models), ``scales`` one s_g per group; else None."""
    if not isinstance(model.prior, DenseGaussian) or not model.sites:
        return None
    scales = []
    for group in model.sites:
        if isinstance(group.projection, Identity) and group.projection.dim == model.dim:
            scales.append(jnp.ones(model.dim, model.dtype))
        elif isinstance(group.projection, ScaledIdentity) and group.num_sites == model.dim:
            scales.append(group.projection.scale.astype(model.dtype))
        else:
            return None
    return model.prior.cov.astype(model.dtype), model.prior.mean.astype(model.dtype), tuple(scales)


class DiagonalIntegral(NamedTuple):
    """log ∫ N(w | μ, K) exp(rᵀw − ½ wᵀ diag(W) w) dw, its Gaussian N(mean, Σ) and the factor B."""

    value: jax.Array
    mean: jax.Array
    alpha: jax.Array  # K⁻¹(mean − μ), so that (mean − μ)ᵀK⁻¹(mean − μ) = αᵀ(mean − μ)
    variances: jax.Array | None  # diag Σ (None unless asked for)
    logdet_b: jax.Array  # log det(I + W½KW½) = log det(I + KW)


def integrate_diagonal(K, mu, W, r, variances=True) -> DiagonalIntegral:
    """The integral of N(μ, K) exp(rᵀw − ½ wᵀdiag(W)w), W ≥ 0: exp(rᵀμ − ½μᵀWμ) det(B)^{−½} exp(½ r'ᵀΣr'),
    r' = r − Wμ, Σ = K − K W½ B⁻¹ W½ K, B = I + W½KW½ (R&W Alg. 3.2; K never inverted)."""
    factor = SiteForm.of(K, W)  # W clipped at 0, so that an unselected branch of a `cond` stays finite
    r0 = r - W * mu
    u = K @ r0
    inner = factor.sites_solve(u)  # (K + W⁻¹)⁻¹ u
    logdet_b = factor.logdet()
    value = r @ mu - 0.5 * mu @ (W * mu) + 0.5 * (r0 @ u - u @ inner) - 0.5 * logdet_b
    alpha = r0 - inner
    return DiagonalIntegral(value, mu + K @ alpha, alpha, factor.variances() if variances else None, logdet_b)


def _diagonal_quadratics(scales, sites, quadratics, dtype):
    """The quadratics in x_g = s_g w + b_g as (W, r, const) on w."""
    W = r = const = 0.0
    for s, group, (a, A, c) in zip(scales, sites, quadratics):
        a, A, c = (jnp.broadcast_to(t, s.shape).astype(dtype) for t in (a, A, c))
        b = jnp.broadcast_to(group.offset, s.shape).astype(dtype)
        W = W + s**2 * A
        r = r + s * (a - A * b)
        const = const + jnp.sum(a * b - 0.5 * A * b**2 + c)
    return W, r, const


def marginals(model: LatentLinearModel, quadratics, work=None):
    """``(log ∫, means, variances)``: `integrate`'s value and the site marginals (one entry per group), by the
    site form where `diagonal_form` applies and W ≥ 0."""
    work = working_model(model) if work is None else work

    def general(_):
        value, mean, C = integrate(model, quadratics, *work)
        factor = CholeskyFactor(C)
        return (value, tuple(g.project(mean) for g in model.sites),
                tuple(factor.projected_variances(g.projection) for g in model.sites))

    form = diagonal_form(model)
    if form is None:
        return general(None)
    K, mu, scales = form
    W, r, const = _diagonal_quadratics(scales, model.sites, quadratics, model.dtype)

    def diagonal(_):
        out = integrate_diagonal(K, mu, W, r)
        means = tuple(s * out.mean + jnp.broadcast_to(g.offset, s.shape) for s, g in zip(scales, model.sites))
        return const + out.value, means, tuple(s**2 * out.variances for s in scales)

    return jax.lax.cond(jnp.all(W >= 0), diagonal, general, None)
