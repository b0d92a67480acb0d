"""The Laplace approximation: a Gaussian at the mode of the log joint.

For the model p(w) ∝ f(w) ∏_n φ_n(h_nᵀw + b_n), with log joint ℓ(w) = log f(w) + Σ_n log φ_n(h_nᵀw + b_n),
q(w) = N(w*, A⁻¹) at the mode w* = argmax ℓ, with

$$
A = -\\nabla^2 \\ell(w^*) = \\Lambda + \\sum_n \\omega_n h_n h_n^\\top,
\\qquad \\omega_n = -(\\log \\varphi_n)''(h_n^\\top w^* + b_n),

\\log Z \\approx \\ell(w^*) + \\tfrac D2 \\log 2\\pi - \\tfrac12 \\log\\det A .
$$

Λ is the precision of f (zero without one); the evidence is exact for Gaussian sites. Where A is not positive
definite, the Gauss–Newton curvature (ω_n ← max(ω_n, 0)) takes its place, with a reported jitter if still singular.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

import numpy as np

from .._factorisation import Primal
from .._linalg import LOG_2PI
from .._curvature import Curvature, site_curvatures
from ..covariance import CholeskyFactor
from ..model import LatentLinearModel
from ..posterior import Diagnostics, LaplaceInfo, Posterior
from ..solvers import AbstractSolver, GaussNewton, NewtonCG, Solution
from ._base import AbstractMethod
from ._envelope import computed
from ..start import mode_search, whitened

__all__ = ["Laplace", "mode_solver", "log_joint", "site_curvatures", "negative_hessian", "evidence"]
__dir__ = __all__.copy

_MAX_JITTER_TRIES = 12


def log_joint(w, model: LatentLinearModel):
    """ℓ(w) = log f(w) + Σ_n log φ_n(h_nᵀw + b_n), the unnormalised log posterior at ``w`` (shape ``(D,)``)."""
    return model.log_joint(w)


def negative_hessian(w, model: LatentLinearModel, gauss_newton=False):
    """A = Λ + Σ_g H_gᵀ diag(ω_g) H_g = −∇²ℓ(w), dense ``(D, D)`` (Gauss–Newton with ``gauss_newton``)."""
    return _precision(model, site_curvatures(w, model, gauss_newton), w.dtype)


def _precision(model: LatentLinearModel, weights, dtype):
    """Λ + Σ_g H_gᵀ diag(weights_g) H_g (`Curvature.matrix`), dense and symmetrised."""
    A = Curvature(model, tuple(w.astype(dtype) for w in weights)).matrix()
    return 0.5 * (A + A.T)


def evidence(w, model: LatentLinearModel, gauss_newton=False, jitter=0.0):
    """The Laplace evidence ℓ(w) + (D/2) log 2π − ½ log det(A + jitter·I) at a mode ``w`` (NaN unless it is PD)."""
    A = negative_hessian(w, model, gauss_newton)
    factor = Primal.of(A + jitter * jnp.eye(model.dim, dtype=A.dtype))
    return log_joint(w, model) + 0.5 * model.dim * LOG_2PI - 0.5 * factor.logdet()


def mode_solver(model: LatentLinearModel, solver: AbstractSolver | None = None) -> AbstractSolver:
    """``solver``, or `GaussNewton` where every site is log-concave (Newton's steps without HVPs), else `NewtonCG`."""
    if solver is not None:
        return solver
    return GaussNewton() if all(bool(g.potential.log_concave) for g in model.sites) else NewtonCG()


def curvature_at_mode(mode, model: LatentLinearModel):
    """``(factor, fallback, jitter)``: the `Primal` factorisation of the first positive-definite curvature among the
    exact A = −∇²ℓ, the Gauss–Newton A⁺ and A⁺ + jitter·I, jitter in {10⁻¹⁰s, 10⁻⁹s, …} (s the mean |diag A⁺|)."""
    dtype = mode.dtype
    omega = site_curvatures(mode, model)
    clipped = tuple(jnp.maximum(w, 0.0) for w in omega)
    scale = jnp.maximum(jnp.mean(jnp.abs(Curvature(model, clipped).raw_diagonal())), jnp.finfo(dtype).tiny)
    eye = jnp.eye(model.dim, dtype=dtype)

    def jitter_of(k):  # k = 0: exact; 1: Gauss–Newton; 2, 3, …: Gauss–Newton + jitter 10^(k − 12) s
        return jnp.where(k >= 2, scale * jnp.asarray(10.0, dtype) ** (k - 12), 0.0)

    def cond(state):
        _, ok, k = state
        return ~ok & (k < _MAX_JITTER_TRIES + 2)

    def body(state):
        _, _, k = state
        weights = tuple(jnp.where(k == 0, w, c) for w, c in zip(omega, clipped))
        factor = Primal.of(_precision(model, weights, dtype) + jitter_of(k) * eye)
        return factor, jnp.all(jnp.isfinite(factor.R)), k + 1

    nan = Primal(jnp.full((model.dim, model.dim), jnp.nan, dtype), jnp.full(model.dim, jnp.nan, dtype))
    factor, _, k = jax.lax.while_loop(cond, body, (nan, jnp.array(False), jnp.array(0)))
    return factor, k > 1, jitter_of(k - 1)


def is_point(model: LatentLinearModel, state) -> bool:
    """Whether ``state`` is a floating array of shape ``(D,)``: the State of `Laplace` and `MAP`."""
    return isinstance(state, (jax.Array, np.ndarray)) and tuple(state.shape) == (model.dim,) and \
        jnp.issubdtype(state.dtype, jnp.floating)


class ModeFit(NamedTuple):
    """The mode of the frozen model and the factorisation of its curvature A (a `Primal`)."""

    mode: jax.Array
    curvature: Primal
    fallback: jax.Array
    jitter: jax.Array
    solution: Solution

    def factor(self, basis=None) -> CholeskyFactor:
        """The `CholeskyFactor` of S = A⁻¹ = CᵀC, or with a lower-triangular ``basis`` B of B A⁻¹ Bᵀ."""
        return CholeskyFactor.from_matrix(self.curvature.covariance_factor(basis))

    def info(self) -> LaplaceInfo:
        """The `LaplaceInfo` of ``post.diagnostics.info``: the curvature's fallback and jitter."""
        return LaplaceInfo(fallback=jnp.asarray(self.fallback, bool), jitter=jnp.asarray(self.jitter, self.mode.dtype))


def fit_mode(model: LatentLinearModel, w0, solver: AbstractSolver) -> ModeFit:
    """The mode of the frozen model, searched from ``w0``, and its curvature (shared by `Laplace` and `MAP`)."""
    frozen = jax.lax.stop_gradient(model)
    sol = mode_search(frozen, jax.lax.stop_gradient(w0), solver)
    mode = jax.lax.stop_gradient(sol.x)
    curvature, fallback, jitter = curvature_at_mode(mode, frozen)
    return ModeFit(mode, curvature, fallback, jitter, sol)


def differentiable_mode(fit: ModeFit, model: LatentLinearModel):
    """The mode, with dw*/dθ = A⁻¹ ∂_θ∇ℓ (implicit function theorem): one Newton step's derivative, not its value."""
    g = jax.grad(log_joint)(fit.mode, model)
    step = fit.curvature.solve(g)
    return fit.mode + (step - jax.lax.stop_gradient(step))


class AbstractModeMethod(AbstractMethod):
    """`Laplace` and `MAP`: the State is the point ``(D,)`` where the mode search starts (cold: the prior mean)."""

    solver: eqx.AbstractVar[AbstractSolver | None]

    def from_expansion(self, model, expansion):
        return expansion.mode

    def init_state(self, model):
        return jax.lax.stop_gradient(model.initial_moments()[0])

    def from_gaussian(self, model, mean, factor):
        return mean

    def is_state(self, model, state):
        return is_point(model, state)


class Laplace(AbstractModeMethod):
    """The Laplace approximation q(w) = N(w*, (−∇²ℓ(w*))⁻¹) and its evidence estimate (not a bound) as ``log_z``.

    A dense prior N(μ, LLᵀ) is handled in the whitened coordinates, where the curvature is well conditioned.
    ``jax.grad`` of ``log_z`` is the total derivative of the evidence, through the mode by implicit differentiation
    (of the Gauss–Newton evidence where the exact curvature is not positive definite: ``diagnostics.info.fallback``).

    **Arguments:**

    - `solver`: a `vj.solvers` solver for the mode (default `None`: see `mode_solver`).
    """

    solver: AbstractSolver | None = None

    def solve(self, model: LatentLinearModel, state) -> Posterior:
        solver = mode_solver(model, self.solver)
        w0 = jax.lax.stop_gradient(state).astype(model.dtype)
        whitening = model.prior.whitening() if model.prior is not None else None
        if whitening is None:
            fit = fit_mode(model, w0, solver)
            mode, factor = fit.mode, fit.factor()
        else:
            # In w = μ + L w̃ the curvature I + L̃ᵀWL̃ stays well conditioned (and the evidence is invariant).
            loc0, L0 = jax.lax.stop_gradient(whitening)
            fit = fit_mode(whitened(model), solve_triangular(L0, w0 - loc0, lower=True), solver)
            mode, factor = loc0 + L0 @ fit.mode, fit.factor(basis=L0)  # S = L S̃ Lᵀ
        # `evidence` at the mode, from the factorisation of A + jitter·I already at hand.
        value = log_joint(fit.mode, whitened(model)) + 0.5 * model.dim * LOG_2PI - 0.5 * fit.curvature.logdet()

        def log_z(fit, model):
            work = whitened(model)
            return evidence(differentiable_mode(fit, work), work, fit.fallback, fit.jitter)

        diagnostics = Diagnostics.from_solution(fit.solution, method="Laplace", solver=type(solver).__name__,
                                                info=fit.info())
        return Posterior(mode, factor, computed(value, log_z, fit, model), diagnostics, model, bound_claim=False,
                         state=jax.lax.stop_gradient(mode))
