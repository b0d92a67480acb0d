"""Gaussian Kullback–Leibler (G-KL) bound and its maximisation.

For q(w) = N(m, S), S = CᵀC, and the model p(w) ∝ f(w) ∏_n φ_n(h_nᵀw + b_n):

$$
\\log Z \\ge \\mathcal B(m, C) =
\\underbrace{\\tfrac12 \\log\\det(2\\pi e S)}_{\\text{entropy}}
+ \\underbrace{\\langle \\log f(w) \\rangle_q}_{\\text{Gaussian term}}
+ \\sum_n \\langle \\log \\varphi_n(\\mu_n + \\sigma_n z)\\rangle_{z},
\\qquad \\mu_n = h_n^\\top m + b_n,\\ \\sigma_n^2 = h_n^\\top S h_n .
$$

With a Gaussian f = N(μ, Σ) the Gaussian term is
−½[log det(2πΣ) + (m−μ)ᵀΣ⁻¹(m−μ) + tr(Σ⁻¹S)] (thesis eq. 4.1.1). The bound is
jointly concave in (m, C) when every φ_n is log-concave, and exact (equal to
log Z, with q the posterior) when every φ_n is Gaussian.

For a dense prior N(μ, LLᵀ), `GKL(whiten=True)` maximises over w̃ with
w = μ + L w̃ (thesis appendix B.5): the prior becomes N(0, I), the projections
H L, and the answer is mapped back as m = μ + L m̃, C = C̃ Lᵀ.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import solve_triangular

from .._linalg import backtrack
from .._curvature import Curvature
from ..covariance import AbstractCovariance, AbstractFactor, CholeskyFactor, Full
from ..model import LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..quadrature import GaussHermite, safe_sqrt
from ..solvers import LBFGS, AbstractSolver, NewtonCG
from ._base import AbstractMethod
from . import _gkl_natural
from ._envelope import computed
from .laplace import expand_at_mode, whitened

__all__ = ["GaussianParams", "GKL", "bound", "bound_at", "curvature", "shrunk_until_finite"]

_DEFAULT_QUADRATURE = GaussHermite()
_NATURAL_MAX_ITER = 200
_NATURAL_TOL = 1e-10  # the natural-parameter ascent's decrement at which it takes its last step


class GaussianParams(eqx.Module):
    """Variational parameters of q = N(mean, S): the mean and a covariance-family factor."""

    mean: jax.Array
    factor: AbstractFactor


def bound(params: GaussianParams, model: LatentLinearModel, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
    """The G-KL lower bound on log Z at ``params`` (a pure, differentiable scalar function)."""
    m, factor = params.mean, params.factor
    value = 0.5 * (m.shape[0] * (1.0 + math.log(2 * math.pi)) + factor.logdet())
    if model.prior is not None:
        value = value + model.prior.expected_log_density(m, factor)
    for group in model.sites:
        mu = group.project(m)
        sigma = safe_sqrt(factor.projected_variances(group.projection))
        value = value + jnp.sum(group.potential.expected_log_phi(mu, sigma, quadrature))
    return value


def bound_at(q, *args, quadrature: GaussHermite = _DEFAULT_QUADRATURE):
    """The G-KL bound at any Gaussian: ``bound_at(mean, covariance, model)`` or ``bound_at(posterior, model)``.

    ``covariance`` is a dense ``(D, D)`` matrix or a covariance-family factor; a `Posterior` (from any
    method, e.g. `vj.LVB`) supplies its mean and factor. Useful to compare methods on one scale: the
    G-KL bound at the LVB Gaussian is never below the LVB bound (thesis §4.4.1).
    """
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
    """``params`` with S scaled by 4⁻ᵏ, for the smallest k ≥ 0 at which ``objective`` is finite.

    Every family's S is quadratic in its trainable leaves (CᵀC, ΘΘᵀ + diag d², …), so halving them
    quarters S; a site expectation that overflows for a wide q (⟨eˣ⟩ = e^{m + v/2}) is finite for a
    narrow enough one."""
    free, fixed = eqx.partition(params.factor, params.factor.trainable())

    def at(t):
        return GaussianParams(params.mean, eqx.combine(jax.tree_util.tree_map(lambda a: t * a, free), fixed))

    one = jnp.ones((), params.mean.dtype)
    t, _, _, _ = backtrack(lambda t: objective(at(t)), lambda t, value: jnp.isfinite(value), one, max_halvings)
    return at(t)


class GKL(AbstractMethod):
    """Gaussian KL approximate inference: maximise `bound` over (m, C).

    **Arguments:**

    - `covariance`: a covariance family (`vj.covariance.Full()` by default; see
      `vj.covariance` for the constrained families that scale to large D).
    - `solver`: a `vj.solvers` solver; by default the family's own choice
      (`NewtonCG()`, preconditioned by the family's structure; `LBFGS()` for the
      non-concave `FactorAnalysis`).
    - `quadrature`: the rule for site expectations without a closed form.
    - `whiten`: change of basis w = μ + L w̃ for dense priors (full covariance only).

    ``vj.infer(model, vj.GKL())`` returns a `Posterior` whose ``log_z`` is the bound
    (a lower bound on log Z) at the q it returns. Without ``init`` the fit starts from the Laplace
    approximation (`initial_params`), never from the prior.

    **Which algorithm.** With the full family, no `solver` given and log-concave sites (logistic,
    probit, Poisson, Laplace, Gaussian, ...), the fit is natural-parameter ascent: q is searched in
    the form the optimum has, S⁻¹ = Λ + Σ_g H_gᵀ diag(λ_g) H_g, over (m, λ), D + N numbers, with one
    D × D (N > D) or N × N (N ≤ D: GP models, wide data) factorisation a step; see
    `vijax.methods._gkl_natural`. ``post.state`` holds λ. Otherwise (another family, a `solver`
    given, or sites that are not log-concave) the bound is maximised over (m, C) by the solver. Both
    reach the same optimum; ``solver=vj.solvers.NewtonCG()`` selects the latter. A warm start
    (``init``) takes the same path as a cold one: λ from a natural-parameter posterior's ``state``,
    else the fixed-point λ of the Gaussian given.
    """

    covariance: AbstractCovariance = Full()
    solver: AbstractSolver | None = None
    quadrature: GaussHermite = GaussHermite()
    whiten: bool = eqx.field(static=True, default=True)

    def _whitening(self, model):
        if not (self.whiten and isinstance(self.covariance, Full) and model.prior is not None):
            return None
        return model.prior.whitening()

    def _solver(self):
        if self.solver is not None:
            return self.solver
        return NewtonCG() if self.covariance.concave else LBFGS()

    def _solve(self, solver, params, model):
        """Maximise the bound over the trainable leaves of ``params``; returns (params, Solution)."""
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

    def init_params(self, model, init=None) -> GaussianParams:
        """The starting point in ``model``'s coordinates: ``init`` (a `Posterior` or `GaussianParams`), or
        the data-driven start of `initial_params`."""
        if isinstance(init, GaussianParams):
            return init
        if isinstance(init, Posterior):
            factor = init.factor
            if not self.covariance.owns(factor, model.dim):
                factor = self.covariance.from_dense(init.covariance)
            return GaussianParams(init.mean, factor)
        if init is not None:
            raise ValueError(f"GKL: `init` must be a Posterior or GaussianParams, got {type(init).__name__}.")
        return self.initial_params(model)

    def initial_params(self, model) -> GaussianParams:
        """Where a fit without ``init`` starts: the mode of the log joint, with S the family's fit to the
        inverse of the (Gauss–Newton) curvature there — the Laplace approximation — shrunk by factors of
        4 until the bound is finite. Never the prior: under a wide prior a site expectation such as a
        Poisson site's ⟨eˣ⟩ = e^{m + v/2} overflows, while at the mode the data have set the scale."""
        start = expand_at_mode(model)
        params = GaussianParams(start.mode, self.covariance.from_curvature(Curvature(model, start.precision)))
        return shrunk_until_finite(params, lambda p: bound(p, model, self.quadrature))

    def _natural(self, model) -> bool:
        return self.solver is None and isinstance(self.covariance, Full) and _gkl_natural.applies(model)

    def _fit_natural(self, model, frozen, init) -> Posterior:
        whitening = self._whitening(frozen)
        work = whitened(frozen) if whitening is not None else frozen
        to_work = (lambda m: m) if whitening is None else (
            lambda m: solve_triangular(whitening[1], m - whitening[0], lower=True))
        if init is None:
            start = expand_at_mode(work)
            mean, lam = start.mode, start.precision
        elif isinstance(init, Posterior) and _gkl_natural.is_state(init.state, frozen):
            mean, lam = to_work(init.mean), init.state
        else:
            params = self.init_params(frozen, init)
            means = tuple(g.project(params.mean) for g in frozen.sites)
            variances = tuple(params.factor.projected_variances(g.projection) for g in frozen.sites)
            mean = to_work(params.mean)
            lam = _gkl_natural.fixed_point_precisions(frozen, means, variances, self.quadrature)
        mean, lam = jax.lax.stop_gradient((mean, lam))
        out = _gkl_natural.fit(frozen, work, mean, lam, self.quadrature, _NATURAL_MAX_ITER, _NATURAL_TOL)
        mean, C = out.mean, out.cholesky
        if whitening is not None:
            loc, L = whitening
            mean, C = loc + L @ mean, C @ L.T  # S = L S̃ Lᵀ; upper × upper is upper-triangular
        opt = jax.lax.stop_gradient(GaussianParams(mean, CholeskyFactor.from_matrix(C).canonical()))
        # The bound at the q returned (the fit's own value), differentiable as the bound with the live model
        # (the envelope theorem): evaluated again only under differentiation.
        log_z = computed(out.value, lambda p, m: bound(p, m, self.quadrature), opt, model)
        return Posterior(opt.mean, opt.factor, log_z, out.diagnostics, model, bound_claim=True,
                         state=jax.lax.stop_gradient(out.lam))

    def fit(self, model: LatentLinearModel, init=None) -> Posterior:
        frozen = jax.lax.stop_gradient(model)
        if self._natural(frozen):
            return self._fit_natural(model, frozen, init)
        whitening = self._whitening(frozen)
        work_model = whitened(frozen) if whitening is not None else frozen
        if init is None:
            params = self.initial_params(work_model)
        else:
            params = jax.lax.stop_gradient(self.init_params(frozen, init))
            if whitening is not None:
                loc, L = whitening
                C = params.factor.cholesky()
                params = GaussianParams(solve_triangular(L, params.mean - loc, lower=True),
                                        CholeskyFactor.from_matrix(solve_triangular(L, C.T, lower=True).T))
        params = jax.lax.stop_gradient(params)

        solver = self._solver()
        opt, sol = self._solve(solver, params, work_model)
        if self.covariance.num_rounds:
            # Families with a fixed structure (a subspace basis) alternate structure updates and solves.
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
            loc, L = whitening
            opt = GaussianParams(loc + L @ opt.mean, CholeskyFactor.from_matrix(opt.factor.cholesky() @ L.T))
        opt = jax.lax.stop_gradient(opt)
        # Envelope theorem: at the optimum ∂B/∂(m, C) = 0, so differentiating the bound with
        # the parameters frozen gives the derivative of the optimal bound in the model.
        log_z = bound(opt, model, self.quadrature)
        diagnostics = Diagnostics.from_solution(sol, method="GKL", solver=type(solver).__name__)
        return Posterior(opt.mean, opt.factor, log_z, diagnostics, model, bound_claim=True)


def __dir__():
    return list(__all__)
