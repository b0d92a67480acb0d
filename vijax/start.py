"""Where every method starts: the mode w* of the log joint ℓ and every site's Gauss–Newton expansion there,

$$
\\log \\varphi_n(x) \\approx \\nu_n x - \\tfrac12 \\tau_n x^2 + \\text{const}, \\qquad
\\tau_n = \\max(-(\\log\\varphi_n)''(x^*_n), 0), \\quad \\nu_n = (\\log\\varphi_n)'(x^*_n) + \\tau_n x^*_n
$$

(x*_n = h_nᵀw* + b_n; ν_n = 0 where τ_n = 0): the Laplace approximation, where the data put the posterior however
wide f, so no site expectation overflows there. The mode search stops at a squared Newton decrement of 10⁻⁶ (each
method converges on its own terms); where it fails, the expansion is taken at its starting point.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from ._curvature import Curvature, site_curvatures, site_derivatives
from ._factorisation import Primal, SiteForm
from ._linalg import pcg
from .model import GaussianFactor, LatentLinearModel, Sparse
from .solvers import AbstractSolver, GaussNewton

__all__ = ["SiteExpansion", "expand_at", "expand_at_mode", "shared", "mode_search", "matrix_free", "whitened",
           "working_model", "DENSE_MAX_DIM"]
__dir__ = __all__.copy

DENSE_MAX_DIM = 2048  # above this D the mode search never forms the D × D curvature
_MAX_CG = 200  # CG steps per matrix-free Newton step (truncated by the forcing term long before)
# A starting point needs no more than a rough mode: the method started from it converges on its own terms.
_START_SOLVER = GaussNewton(tol=1e-6, max_iter=50)


class SiteExpansion(eqx.Module):
    """Every site's Gauss–Newton expansion log φ_n(x) ≈ ν_n x − ½ τ_n x² at `mode` ``(D,)``: `precision` τ ≥ 0 and
    `shift` ν, one ``(N_g,)`` array per site group (in x, so the same in any basis of w)."""

    mode: jax.Array
    precision: tuple[jax.Array, ...]
    shift: tuple[jax.Array, ...]

    @property
    def quadratics(self):
        """The sites as ``(a, A, c)`` quadratics a x − ½ A x² + c (c = 0) of the shared Gaussian integral."""
        return tuple((nu, tau, 0.0) for tau, nu in zip(self.precision, self.shift))

    def curvature(self, model: LatentLinearModel) -> Curvature:
        """P = Λ + Σ_g H_gᵀ diag(τ_g) H_g, the Laplace approximation's precision (never formed here)."""
        return Curvature(model, self.precision)


def working_model(model: LatentLinearModel):
    """``(sites, whitening)``: for a dense Gaussian factor N(μ, LLᵀ), the site groups acting on w̃ = L⁻¹(w − μ) and
    ``(μ, L)``; else the groups as they are and None."""
    whitening = model.prior.whitening() if model.prior is not None else None
    if whitening is None:
        return model.sites, None
    loc, L = whitening
    return tuple(group.change_basis(loc, L) for group in model.sites), whitening


def whitened(model: LatentLinearModel) -> LatentLinearModel:
    """The model in w̃ = L⁻¹(w − μ) for a dense Gaussian factor N(μ, LLᵀ) (prior N(0, I)); others as they are."""
    sites, whitening = working_model(model)
    if whitening is None:
        return model
    return LatentLinearModel(GaussianFactor.isotropic(model.dim, 1.0), sites)


def matrix_free(model: LatentLinearModel) -> bool:
    """Whether the dense curvature is out of reach: a sparse H, or D above `DENSE_MAX_DIM`."""
    return model.dim > DENSE_MAX_DIM or any(isinstance(g.projection, Sparse) for g in model.sites)


def _woodbury_preconditioner(model):
    """P⁻¹ = Λ⁻¹ − Λ⁻¹Hᵀ W½ B⁻¹ W½ HΛ⁻¹, B = I + W½ HΛ⁻¹Hᵀ W½, for Λ diagonal and one group of N ≤ D sites."""
    (group,) = model.sites
    projection = group.projection
    inv_prec = 1.0 / model.prior.precision_diagonal()
    G = projection.mv(inv_prec[:, None] * projection.rmv(jnp.eye(group.num_sites, dtype=model.dtype)))

    def preconditioner(w):
        factor = SiteForm.of(G, site_curvatures(w, model, gauss_newton=True)[0])

        def solve(v):
            u = inv_prec * v
            return u - inv_prec * projection.rmv(factor.sites_solve(projection.mv(u)))

        return solve

    return preconditioner


def mode_search(model: LatentLinearModel, w0, solver: AbstractSolver, dense: bool | None = None):
    """Maximise ℓ from ``w0`` with ``solver``, preconditioned by the Gauss–Newton curvature, dense unless ``dense``
    is False or the model is `matrix_free`; returns the `Solution`."""
    if dense is None:
        dense = not matrix_free(model)
    prior, sites = model.prior, model.sites
    curvature = lambda w: Curvature(model, site_curvatures(w, model, gauss_newton=True))  # noqa: E731
    if not dense:
        def preconditioner(w):
            # truncated CG preconditioned by diag(P)⁻¹: an ascent direction for any truncation
            product, diagonal = curvature(w).operator()
            return lambda v: pcg(product, v, lambda r: r / diagonal, _MAX_CG)[0]
    elif prior is not None and prior.diagonal_precision and len(sites) == 1 and sites[0].num_sites <= model.dim:
        preconditioner = _woodbury_preconditioner(model)
    else:
        def preconditioner(w):
            return Primal.of(curvature(w).dense()).solve
    return solver.maximise(model.log_joint, w0, preconditioner)


def expand_at(model: LatentLinearModel, w) -> SiteExpansion:
    """The `SiteExpansion` of every site at ``w`` (shape ``(D,)``), no search."""
    precision, shift = [], []
    for x, slope, omega in site_derivatives(w, model):
        tau = jnp.where(jnp.isfinite(omega), jnp.maximum(omega, 0.0), 0.0)
        precision.append(tau)
        shift.append(jnp.where(tau > 0, slope + tau * x, 0.0))
    return SiteExpansion(w, tuple(precision), tuple(shift))


def expand_at_mode(model: LatentLinearModel, dense: bool | None = None,
                   solver: AbstractSolver = _START_SOLVER) -> SiteExpansion:
    """The `SiteExpansion` at the mode of the log joint, searched from the Gaussian factor's mean (or 0);
    ``dense``: form the D × D curvature in the search (None: unless the model is `matrix_free`)."""
    frozen = jax.lax.stop_gradient(model)
    sites, whitening = working_model(frozen)
    work = frozen if whitening is None else LatentLinearModel(GaussianFactor.isotropic(model.dim, 1.0), sites)
    w0 = frozen.initial_moments()[0] if whitening is None else jnp.zeros(model.dim, model.dtype)
    sol = mode_search(work, w0, solver, dense)
    mode = jnp.where(jnp.isfinite(sol.value) & jnp.all(jnp.isfinite(sol.x)), sol.x, w0)
    if whitening is not None:
        loc, L = whitening
        mode = loc + L @ mode
    return expand_at(frozen, mode)


_shared = eqx.filter_jit(expand_at_mode)


def shared(model: LatentLinearModel, dense: bool | None = None) -> SiteExpansion:
    """`expand_at_mode` compiled: one program per model shape and ``dense``, whichever method asks."""
    return _shared(model, not matrix_free(model) if dense is None else bool(dense))
