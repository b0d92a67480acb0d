"""Gaussian Kullback–Leibler (G-KL) bound and its maximisation.

For q(w) = N(m, S), S = CᵀC, and the model p(w) ∝ f(w) ∏_n φ_n(h_nᵀw + b_n):

$$
\\log Z \\ge \\mathcal B(m, C) = \\tfrac12 \\log\\det(2\\pi e S) + \\langle \\log f(w) \\rangle_q
+ \\sum_n \\langle \\log \\varphi_n(\\mu_n + \\sigma_n z)\\rangle_{z},
\\qquad \\mu_n = h_n^\\top m + b_n,\\ \\sigma_n^2 = h_n^\\top S h_n .
$$

It is jointly concave in (m, C) when every φ_n is log-concave, and equal to log Z when every φ_n is Gaussian.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular

from .._linalg import backtrack, gaussian_entropy
from .._curvature import Curvature
from ..covariance import AbstractCovariance, AbstractFactor, CholeskyFactor, Full
from ..model import LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..quadrature import GaussHermite, safe_sqrt
from ..solvers import LBFGS, AbstractSolver, NewtonCG
from ._base import AbstractMethod, same_shapes
from . import _gkl_natural
from ._envelope import computed
from ..start import whitened

__all__ = ["GaussianParams", "NaturalParams", "GKL", "bound", "bound_at", "curvature", "shrunk_until_finite"]
__dir__ = __all__.copy

_DEFAULT_QUADRATURE = GaussHermite()


class GaussianParams(eqx.Module):
    """Variational parameters of q = N(mean, S): the mean and a covariance-family factor."""

    mean: jax.Array
    factor: AbstractFactor


def bound(params: GaussianParams, model: LatentLinearModel, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
    """The G-KL lower bound on log Z at ``params`` (a pure, differentiable scalar function)."""
    m, factor = params.mean, params.factor
    value = gaussian_entropy(factor.logdet(), m.shape[0])
    if model.prior is not None:
        value = value + model.prior.expected_log_density(m, factor)
    for group in model.sites:
        mu = group.project(m)
        sigma = safe_sqrt(factor.projected_variances(group.projection))
        value = value + jnp.sum(group.potential.expected_log_phi(mu, sigma, quadrature))
    return value


def bound_at(q, *args, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
    """The G-KL bound at ``bound_at(mean, covariance, model)`` (``covariance`` ``(D, D)`` or a covariance-family
    factor) or ``bound_at(posterior, model)`` (a `Posterior` of any method): methods compared on one scale."""
    if isinstance(q, Posterior):
        (model,) = args
        mean, covariance = q.mean, q.factor
    else:
        mean, (covariance, model) = q, args
    factor = covariance if isinstance(covariance, AbstractFactor) else Full().from_dense(covariance)
    return bound(GaussianParams(mean, factor), model, quadrature)


def curvature(params: GaussianParams, model: LatentLinearModel, quadrature=_DEFAULT_QUADRATURE) -> Curvature:
    """Site curvatures w_n = max(−2 ∂⟨log φ_n⟩/∂σ_n², 0) = max(−⟨(log φ_n)''⟩, 0) at ``params``."""
    weights = []
    for group in model.sites:
        mu = group.project(params.mean)
        var = params.factor.projected_variances(group.projection)
        grad_var = jax.grad(lambda v: jnp.sum(group.potential.expected_log_phi(mu, safe_sqrt(v), quadrature)))(var)
        weights.append(jnp.maximum(-2.0 * grad_var, 0.0))
    return Curvature(model, tuple(weights))


def shrunk_until_finite(params: GaussianParams, objective, max_halvings: int = 60) -> GaussianParams:
    """``params`` with S scaled by 4⁻ᵏ for the smallest k ≥ 0 at which ``objective`` is finite (⟨eˣ⟩ = e^{m + v/2})."""
    free, fixed = eqx.partition(params.factor, params.factor.trainable())

    def at(t):
        return GaussianParams(params.mean, eqx.combine(jax.tree_util.tree_map(lambda a: t * a, free), fixed))

    one = jnp.ones((), params.mean.dtype)
    t, _, _, _ = backtrack(lambda t: objective(at(t)), lambda t, value: jnp.isfinite(value), one, max_halvings)
    return at(t)


class NaturalParams(eqx.Module):
    """The State of natural-parameter G-KL: the mean ``(D,)`` and λ per group, S⁻¹ = Λ + Σ_g H_gᵀ diag(λ_g) H_g."""

    mean: jax.Array
    precision: tuple[jax.Array, ...]


class GKL(AbstractMethod):
    """Gaussian KL approximate inference: maximise `bound` over q = N(m, CᵀC); ``log_z`` is the bound at q.

    The fit starts from the Laplace approximation (`vijax.start.expand_at_mode`). With the full family, no `solver`
    and log-concave sites it is natural-parameter ascent over (m, λ), S⁻¹ = Λ + Σ_g H_gᵀ diag(λ_g) H_g (State
    `NaturalParams`); otherwise the solver maximises over (m, C) (State `GaussianParams`), to the same optimum.

    **Arguments:**

    - `covariance`: a covariance family (default `vj.covariance.Full()`).
    - `solver`: a `vj.solvers` solver (default: `NewtonCG()` preconditioned by the family's structure; `LBFGS()`
      for the non-concave `FactorAnalysis`).
    - `quadrature`: the rule for site expectations without a closed form.
    - `whiten`: change of basis w = μ + L w̃ for dense priors (full covariance only).
    - `tol`: the stopping decrement of the natural-parameter ascent and of the default `NewtonCG` (default 1e-10).
    - `max_iter`: their iteration cap (default 200).
    """

    covariance: AbstractCovariance = Full()
    solver: AbstractSolver | None = None
    quadrature: GaussHermite = GaussHermite()
    whiten: bool = eqx.field(static=True, default=True)
    tol: float = 1e-10
    max_iter: int = eqx.field(static=True, default=200)

    def _solver(self):
        if self.solver is not None:
            return self.solver
        return NewtonCG(tol=self.tol, max_iter=self.max_iter) if self.covariance.concave else LBFGS()

    def _solve(self, solver, params, model):
        spec = GaussianParams(True, params.factor.trainable())
        free, fixed = eqx.partition(params, spec)
        x0, unravel = ravel_pytree(free)
        as_params = lambda x: eqx.combine(unravel(x), fixed)
        objective = lambda x: bound(as_params(x), model, self.quadrature)

        def preconditioner(x):
            p = as_params(x)
            apply = p.factor.preconditioner(curvature(p, model, self.quadrature))

            def M(v):
                t = as_params(v)
                dm, dfactor = apply(t.mean, t.factor)
                return ravel_pytree(eqx.filter(GaussianParams(dm, dfactor), spec))[0].astype(v.dtype)

            return M

        sol = solver.maximise(objective, x0, preconditioner)
        return as_params(sol.x), sol

    def _natural(self, model) -> bool:
        return self.solver is None and isinstance(self.covariance, Full) and _gkl_natural.applies(model)

    def start_dense(self, model):
        return None if isinstance(self.covariance, Full) else False

    def shares_start(self, model):
        return self._natural(model)

    def from_expansion(self, model, expansion):
        if self._natural(model):
            return NaturalParams(expansion.mode, expansion.precision)
        params = GaussianParams(expansion.mode, self.covariance.from_curvature(expansion.curvature(model)))
        return shrunk_until_finite(params, lambda p: bound(p, model, self.quadrature))

    def from_gaussian(self, model, mean, factor):
        frozen = jax.lax.stop_gradient(model)
        if self._natural(frozen):
            means = tuple(g.project(mean) for g in frozen.sites)
            variances = tuple(factor.projected_variances(g.projection) for g in frozen.sites)
            return NaturalParams(mean, _gkl_natural.fixed_point_precisions(frozen, means, variances, self.quadrature))
        if not self.covariance.owns(factor, model.dim):
            factor = self.covariance.from_dense(factor.dense())
        return GaussianParams(mean, factor)

    def is_state(self, model, state):
        if self._natural(model):
            template = NaturalParams(jax.ShapeDtypeStruct((model.dim,), model.dtype),
                                     tuple(jax.ShapeDtypeStruct((g.num_sites,), model.dtype) for g in model.sites))
            return isinstance(state, NaturalParams) and same_shapes(state, template)
        return (isinstance(state, GaussianParams) and jnp.shape(state.mean) == (model.dim,)
                and self.covariance.owns(state.factor, model.dim))

    def solve(self, model: LatentLinearModel, state) -> Posterior:
        frozen = jax.lax.stop_gradient(model)
        state = jax.lax.stop_gradient(state)
        whitens = self.whiten and isinstance(self.covariance, Full) and frozen.prior is not None
        whitening = frozen.prior.whitening() if whitens else None
        work_model = whitened(frozen) if whitening is not None else frozen
        mean = state.mean
        if whitening is not None:
            loc, L = whitening
            mean = solve_triangular(L, mean - loc, lower=True)
        if self._natural(frozen):
            return self._solve_natural(model, frozen, work_model, whitening, mean, state.precision)
        params = state
        if whitening is not None:
            C = solve_triangular(L, state.factor.cholesky().T, lower=True).T
            params = GaussianParams(mean, CholeskyFactor.from_matrix(C))

        solver = self._solver()
        opt, sol = self._solve(solver, params, work_model)
        if self.covariance.num_rounds:
            # Families with a structure (a subspace basis) alternate its updates and solves.
            def round_(_, carry):
                opt, sol = carry
                objective = lambda factor: bound(GaussianParams(opt.mean, factor), work_model, self.quadrature)
                factor = self.covariance.update(opt.factor, opt.mean, objective,
                                                curvature(opt, work_model, self.quadrature))
                opt = GaussianParams(opt.mean, factor)
                opt, new = self._solve(solver, opt, work_model)
                spent = {f: getattr(sol, f) + getattr(new, f) for f in ("iterations", "num_value_evals",
                                                                         "num_grad_evals", "num_hvp_evals")}
                return opt, new._replace(**spent)

            opt, sol = jax.lax.fori_loop(0, self.covariance.num_rounds, round_, (opt, sol))
        opt = GaussianParams(opt.mean, opt.factor.canonical())
        if whitening is not None:
            opt = GaussianParams(loc + L @ opt.mean, CholeskyFactor.from_matrix(opt.factor.cholesky() @ L.T))
        opt = jax.lax.stop_gradient(opt)
        log_z = bound(opt, model, self.quadrature)  # at the frozen optimum: the envelope theorem
        diagnostics = Diagnostics.from_solution(sol, method="GKL", solver=type(solver).__name__)
        return Posterior(opt.mean, opt.factor, log_z, diagnostics, model, bound_claim=True, state=opt)

    def _solve_natural(self, model, frozen, work, whitening, mean, precision) -> Posterior:
        out = _gkl_natural.fit(frozen, work, mean, precision, self.quadrature, self.max_iter, self.tol)
        mean, C = out.mean, out.cholesky
        if whitening is not None:
            loc, L = whitening
            mean, C = loc + L @ mean, C @ L.T  # S = L S̃ Lᵀ; upper × upper is upper-triangular
        opt = jax.lax.stop_gradient(GaussianParams(mean, CholeskyFactor.from_matrix(C).canonical()))
        # the fit's own value, differentiable as the bound (evaluated only under differentiation)
        log_z = computed(out.value, lambda p, m: bound(p, m, self.quadrature), opt, model)
        state = jax.lax.stop_gradient(NaturalParams(opt.mean, out.lam))
        return Posterior(opt.mean, opt.factor, log_z, out.diagnostics, model, bound_claim=True, state=state)
