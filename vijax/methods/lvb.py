"""Local variational bounds (LVB): a Gaussian lower bound on every site, integrated in closed form.

Each non-Gaussian site is bounded below by an exponentiated quadratic in x = hᵀw + b with its
own variational parameter ξ_n,

.. math::

    \\log \\varphi_n(x) \\ge a_n(\\xi_n)\\, x - \\tfrac12 A_n(\\xi_n)\\, x^2 + c_n(\\xi_n)
    \\qquad\\text{(tight at } x = \\pm\\xi_n \\text{, or } x = \\psi_n\\text{)},

so that, with the Gaussian factor f(w) = exp(−½wᵀΛw + ηᵀw + κ) of the model,

.. math::

    \\log Z \\ge \\mathcal B_{\\rm LVB}(\\xi)
      = \\kappa + \\sum_n (a_n b_n - \\tfrac12 A_n b_n^2 + c_n)
        + \\tfrac12 r^\\top P^{-1} r + \\tfrac D2 \\log 2\\pi - \\tfrac12 \\log\\det P,

    P = \\Lambda + \\sum_n A_n h_n h_n^\\top, \\qquad r = \\eta + \\sum_n (a_n - A_n b_n) h_n .

(This is thesis eq. 3.8.4 with its log-determinant constant corrected: the Gaussian integral
gives +½ log det(2πP⁻¹), not −½ log det(2πP).) The Gaussian q_ξ = N(P⁻¹r, P⁻¹) is the LVB
posterior approximation, and B_LVB(ξ) = max_q [G-KL bound of q with each site replaced by its
local bound], attained at q = q_ξ (thesis §4.4.1). Hence the G-KL bound at q_ξ dominates
B_LVB(ξ) for every ξ, and the optimal G-KL bound dominates both.

Local bounds (`local_bound`):

- `Logistic`, ``bound="jaakkola"`` (Jaakkola & Jordan): log σ(x) ≥ log σ(ξ) + (x − ξ)/2 − λ(ξ)(x² − ξ²),
  λ(ξ) = tanh(ξ/2)/(4ξ); optimal ξ_n² = ⟨x_n²⟩_q.
- `Logistic`, ``bound="bohning"`` (Böhning): log σ(x) ≥ log σ(ψ) + σ(−ψ)(x − ψ) − (x − ψ)²/8, a fixed
  curvature ¼; optimal ψ_n = ⟨x_n⟩_q.
- `Laplace`, `StudentT`, `Cauchy` (symmetric super-Gaussian, Palmer et al. 2006): with u = x − loc and
  g(y) = log φ(loc + √y) convex in y = u², the tangent in y gives
  log φ(x) ≥ log φ(loc + ξ) − ½ A(ξ)(u² − ξ²), A(ξ) = −(log φ)'(loc + ξ)/ξ (= 1/(scale·ξ) for Laplace,
  (df + 1)/(df·scale² + ξ²) for Student-t); optimal ξ_n² = ⟨u_n²⟩_q.
- `Gaussian` sites enter exactly and carry no parameter.
- `Masked` sites (`vijax.pad_sites`) use their potential's bound where they are on and the zero
  quadratic where they are off (ξ held at 1 there).

In every case the optimal ξ given q is in closed form, and alternating q ← q_ξ with that update is
coordinate ascent on max_q of the relaxed G-KL bound: B_LVB never decreases (EM, with ξ as
hyperparameters). ``xi`` is a tuple with one entry per site group of the model: an array of shape
``(N_g,)`` (ξ, or ψ for Böhning), or None for a `Gaussian` group.
"""

from __future__ import annotations

import abc
import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import potentials as pot
from .._linalg import LOG_2PI
from ..covariance import CholeskyFactor, DiagonalFactor
from ..model import LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..solvers import fixed_point
from ._base import AbstractMethod
from ._gaussian import integrate, marginals, working_model
from .laplace import expand_at_mode, whitened

__all__ = ["LVB", "bound", "gaussian", "update", "local_bound", "initial_xi", "AbstractLocalBound",
           "Jaakkola", "Bohning", "ScaleMixture", "Exact", "MaskedBound"]

BOUNDS = ("jaakkola", "bohning")


# ----------------------------------------------------------------------------------------------
# Site bounds


class AbstractLocalBound(eqx.Module):
    """An exponentiated-quadratic lower bound log φ(x) ≥ a x − ½ A x² + c with parameter ξ."""

    @abc.abstractmethod
    def quadratic(self, xi):
        """``(a, A, c)`` at ``xi``, each broadcastable to the group's sites."""

    @abc.abstractmethod
    def update(self, mean, var):
        """The ξ maximising ⟨a x − ½ A x² + c⟩ for x ~ N(mean, var) (shape ``(N,)`` each)."""

    def __call__(self, x, xi):
        """The bound itself at ``x`` (for checks: it is ≤ log φ(x))."""
        a, A, c = self.quadratic(xi)
        return a * x - 0.5 * A * x**2 + c

    def expected(self, mean, var):
        """max_ξ ⟨a x − ½ A x² + c⟩ = a μ − ½ A (μ² + v) + c at ξ = `update` (μ, v): a lower bound on
        ⟨log φ(x)⟩ for x ~ N(``mean``, ``var``) (elementwise), differentiable in both through ξ.
        E.g. `Jaakkola`: log σ(ξ) + (μ − ξ)/2 with ξ = √(μ² + v); `Bohning`: log σ(μ) − v/8."""
        a, A, c = self.quadratic(self.update(mean, var))
        return a * mean - 0.5 * A * (mean**2 + var) + c


def _jaakkola_lambda(xi):
    """λ(ξ) = tanh(ξ/2)/(4ξ), even in ξ, with its series 1/8 − ξ²/96 near 0."""
    small = jnp.abs(xi) < 1e-4
    safe = jnp.where(small, 1.0, xi)
    return jnp.where(small, 0.125 - xi**2 / 96.0, jnp.tanh(0.5 * safe) / (4.0 * safe))


class Jaakkola(AbstractLocalBound):
    """log σ(x) ≥ log σ(ξ) + (x − ξ)/2 − λ(ξ)(x² − ξ²): tight at x = ±ξ."""

    def quadratic(self, xi):
        lam = _jaakkola_lambda(xi)
        # log σ(ξ) − ξ/2 = −log(2 cosh(ξ/2)), even in ξ.
        return 0.5 * jnp.ones_like(xi), 2.0 * lam, jax.nn.log_sigmoid(xi) - 0.5 * xi + lam * xi**2

    def update(self, mean, var):
        return jnp.sqrt(mean**2 + var)


class Bohning(AbstractLocalBound):
    """log σ(x) ≥ log σ(ψ) + σ(−ψ)(x − ψ) − (x − ψ)²/8: tight at x = ψ, curvature ¼ everywhere."""

    def quadratic(self, psi):
        slope = jax.nn.sigmoid(-psi)
        return slope + 0.25 * psi, jnp.full_like(psi, 0.25), jax.nn.log_sigmoid(psi) - slope * psi - 0.125 * psi**2

    def update(self, mean, var):
        return mean


class ScaleMixture(AbstractLocalBound):
    """Tangent in y = (x − loc)² of the convex g(y) = log φ(loc + √y): tight at x = loc ± ξ.

    For symmetric super-Gaussian potentials with a ``loc`` (`Laplace`, `StudentT`, `Cauchy`):
    log φ(x) ≥ log φ(loc + ξ) − ½ A(ξ)((x − loc)² − ξ²), A(ξ) = −(log φ)'(loc + ξ)/ξ (by autodiff
    of the potential centred at 0, so no cancellation when |loc| ≫ ξ).
    """

    potential: pot.AbstractPotential

    def _centred(self):
        return eqx.tree_at(lambda p: p.loc, self.potential, jnp.zeros_like(self.potential.loc))

    def quadratic(self, xi):
        centred = self._centred()
        # The bound is valid for every ξ ≠ 0; keep ξ off 0, where A is 0/0 (or ∞ for Laplace).
        xi = jnp.where(jnp.abs(xi) < _tiny(xi), _tiny(xi), xi)
        log_phi, slope = jax.jvp(lambda t: centred.log_phi(t), (xi,), (jnp.ones_like(xi),))
        A = -slope / xi
        loc = self.potential.loc
        return A * loc, A, log_phi + 0.5 * A * (xi**2 - loc**2)

    def update(self, mean, var):
        return jnp.sqrt((mean - self.potential.loc) ** 2 + var)


def _tiny(x):
    return jnp.finfo(jnp.result_type(x)).tiny ** 0.25


class Exact(AbstractLocalBound):
    """A Gaussian site N(loc | x, scale²), which is its own quadratic (no parameter: ξ is None)."""

    potential: pot.Gaussian

    def quadratic(self, xi):
        loc, prec = self.potential.loc, 1.0 / self.potential.scale**2
        return loc * prec, prec, -0.5 * (LOG_2PI + jnp.log(self.potential.scale**2) + loc**2 * prec)

    def update(self, mean, var):
        return None


@functools.singledispatch
def local_bound(potential, bound: str = "jaakkola") -> AbstractLocalBound:
    """The local bound LVB uses for ``potential`` (``bound`` chooses among those for `Logistic`).

    Register one for a new potential type with ``vj.lvb.local_bound.register(MyPotential)``.
    """
    raise ValueError(
        f"LVB: no local variational bound for the potential {type(potential).__name__}. LVB needs an "
        "exponentiated-quadratic lower bound on every site (super-Gaussian sites); supported: Logistic "
        "(bound='jaakkola' or 'bohning'), Laplace, StudentT, Cauchy and Gaussian. Use vj.GKL() for "
        "other potentials, or register a bound with vj.lvb.local_bound.register.")


@local_bound.register
def _(potential: pot.Logistic, bound: str = "jaakkola"):
    return Jaakkola() if bound == "jaakkola" else Bohning()


@local_bound.register(pot.Laplace)
@local_bound.register(pot.StudentT)
@local_bound.register(pot.Cauchy)
def _(potential, bound: str = "jaakkola"):
    return ScaleMixture(potential)


@local_bound.register
def _(potential: pot.Gaussian, bound: str = "jaakkola"):
    return Exact(potential)


class MaskedBound(AbstractLocalBound):
    """The bound of a `Masked` potential: ``bound`` where the mask is on, the zero quadratic
    (log φ̃ = 0 ≥ 0) elsewhere, with ξ held at 1 there (the update never moves it, so masked-out
    sites add nothing to the fixed-point distance either)."""

    bound: AbstractLocalBound
    mask: jax.Array

    def quadratic(self, xi):
        return tuple(jnp.where(self.mask, t, 0.0) for t in self.bound.quadratic(xi))

    def update(self, mean, var):
        xi = self.bound.update(mean, var)
        return None if xi is None else jnp.where(self.mask, xi, jnp.ones_like(xi))


@local_bound.register
def _(potential: pot.Masked, bound: str = "jaakkola"):
    return MaskedBound(local_bound(potential.potential, bound), potential.mask)


def _check_bound(bound):
    if bound not in BOUNDS:
        hint = ""
        if isinstance(bound, str) and bound.startswith("piecewise"):
            hint = (" Piecewise bounds are not exponentiated quadratics, so LVB cannot use them; replace the "
                    "logistic sites with vj.piecewise.bound_logistic_sites(model, kind, pieces) and fit with "
                    "vj.GKL(), which gives a lower bound on the logistic model's log Z.")
        raise ValueError(f"LVB: `bound` must be one of {BOUNDS}, got {bound!r}.{hint}")


def _site_bounds(model: LatentLinearModel, bound: str):
    _check_bound(bound)
    return tuple(local_bound(group.potential, bound) for group in model.sites)


# ----------------------------------------------------------------------------------------------
# The bound and its Gaussian


def _quadratics(xi, model: LatentLinearModel, bound: str):
    return tuple(site.quadratic(x) for site, x in zip(_site_bounds(model, bound), xi))


def _evaluate(xi, model: LatentLinearModel, bound: str):
    """``(B_LVB(ξ), mean, C)`` with q_ξ = N(mean, CᵀC), C = R⁻¹ from the reversed Cholesky P = R Rᵀ."""
    return integrate(model, _quadratics(xi, model, bound))


def bound(xi, model: LatentLinearModel, bound: str = "jaakkola"):
    """B_LVB(ξ), the local variational lower bound on log Z (a pure, differentiable scalar function).

    ``xi`` has one entry per site group: an array of shape ``(N_g,)``, or None for a `Gaussian`
    group; ``bound`` ("jaakkola" or "bohning") chooses the bound for `Logistic` sites. NaN where
    P = Λ + Σ A_n h_n h_nᵀ is not positive definite (e.g. no Gaussian factor and too few sites).
    """
    return _evaluate(xi, model, bound)[0]


def gaussian(xi, model: LatentLinearModel, bound: str = "jaakkola"):
    """The Gaussian q_ξ = N(P⁻¹r, P⁻¹) of the bound at ``xi``: ``(mean, CholeskyFactor)``."""
    _, mean, C = _evaluate(xi, model, bound)
    return mean, CholeskyFactor.from_matrix(C)


def _update(model, bound, mean, factor):
    """The optimal ξ for q = N(mean, S), S given by a covariance-family factor."""
    return _update_from_marginals(model, bound, tuple(g.project(mean) for g in model.sites),
                                  tuple(factor.projected_variances(g.projection) for g in model.sites))


def _update_from_marginals(model, bound, means, variances):
    """The optimal ξ given q's marginals of every site's x_n."""
    return tuple(site.update(m, v) for site, m, v in zip(_site_bounds(model, bound), means, variances))


def update(xi, model: LatentLinearModel, bound: str = "jaakkola"):
    """One fixed-point step: the optimal ξ given q_ξ (ξ_n² = ⟨x_n²⟩, ψ_n = ⟨x_n⟩, ...); never lowers the bound."""
    mean, factor = gaussian(xi, model, bound)
    return _update(model, bound, mean, factor)


def initial_xi(model: LatentLinearModel, bound: str = "jaakkola", init=None):
    """ξ from the marginals of ``init`` (a `Posterior`), or of the Laplace approximation: every site
    expanded to second order at the mode of the log joint (`vj.laplace.expand_at_mode`), which is where
    the posterior is however wide or improper the prior. Where that q is improper (sites with no
    curvature at the mode and no Gaussian factor to hold them), the Gaussian factor's moments are used."""
    if isinstance(init, Posterior):
        return _update(model, bound, init.mean, init.factor)
    if init is not None:
        raise ValueError(f"LVB: `init` must be a Posterior or a tuple of ξ arrays, got {type(init).__name__}.")
    start = expand_at_mode(whitened(model))
    _, means, variances = marginals(model, tuple((nu, tau, 0.0) for tau, nu in zip(start.precision, start.shift)))
    mean, scale = model.initial_moments()
    fallback = _update(model, bound, mean, DiagonalFactor(scale))
    xi = _update_from_marginals(model, bound, means, variances)
    return tuple(None if a is None else jnp.where(jnp.all(jnp.isfinite(a)), a, b) for a, b in zip(xi, fallback))


# ----------------------------------------------------------------------------------------------
# The method


class LVB(AbstractMethod):
    """Local variational bounds: maximise B_LVB(ξ) over the site parameters by fixed-point (EM) steps.

    **Arguments:**

    - `bound`: the bound for `Logistic` sites, ``"jaakkola"`` (variable curvature, tighter) or
      ``"bohning"`` (fixed curvature ¼, so P is the same at every step). `Laplace`, `StudentT` and
      `Cauchy` sites always use the scale-mixture bound; `Gaussian` sites enter exactly. Other
      potentials raise a `ValueError` (use `vj.GKL`).
    - `max_iter`: the most points evaluated (each one O(N D² + D³)).
    - `tol`: stop when ξ is within ``tol`` of the fixed point, in units of q's marginal standard
      deviations (max_n |ξ_n − ξ*_n|/√V_n). EM converges linearly, so the distance is extrapolated
      from two plain steps, Δ_k·r/(1 − r) with r = Δ_k/Δ_{k−1}: a slowly contracting run is not
      stopped early, however small its steps. The steps are accelerated by SQUAREM
      (`vj.solvers.fixed_point`), which keeps the bound non-decreasing. Steps below the rounding of the linear algebra
      (10³ ε, which an ill-conditioned GP prior can reach) also end the run. The bound is stationary
      in ξ, so the envelope gradient of ``log_z`` is accurate to about ``tol`` and the bound to ``tol²``.

    ``vj.infer(model, vj.LVB())`` returns a `Posterior` with q = q_ξ* (a full `CholeskyFactor`,
    S = P⁻¹) and ``log_z`` = B_LVB(ξ*), a lower bound on log Z (``is_lower_bound=True``), never
    above the G-KL bound (thesis §4.4.1). Each step costs O(N D² + D³). ``jax.grad`` of ``log_z``
    in the model's hyperparameters is the derivative of the optimised bound (envelope theorem:
    B_LVB is evaluated at the frozen ξ* with the live model). ``init`` may be a `Posterior` (ξ from
    its marginals) or a tuple of ξ arrays. ``diagnostics.objective_trace`` holds B_LVB after each
    step (non-decreasing) and ``grad_norm`` is max |∂B/∂ξ| at the end.
    """

    bound: str = eqx.field(static=True, default="jaakkola")
    max_iter: int = eqx.field(static=True, default=500)
    tol: float = eqx.field(static=True, default=1e-9)

    def __check_init__(self):
        _check_bound(self.bound)

    def _iterate(self, xi, model):
        """Accelerated fixed-point steps (`vj.solvers.fixed_point`); a step needs only q_ξ's marginals
        (`marginals`: the site form for GP models)."""
        work = working_model(model)

        def evaluate(xi):
            value, means, variances = marginals(model, _quadratics(xi, model, self.bound), work)
            return value, (means, variances)

        def update(xi, aux):
            return _update_from_marginals(model, self.bound, *aux)

        def change(a, b, aux):
            # max_n |Δξ_n| / √V_n, in units of q's marginal standard deviations (Gaussian groups have no ξ).
            return max((jnp.max(jnp.abs(u - w) / jnp.sqrt(v), initial=0.0)
                        for u, w, v in zip(a, b, aux[1]) if u is not None), default=jnp.zeros(()))

        dtype = model.dtype
        return fixed_point(evaluate, update, change, xi, tol=self.tol, max_evals=self.max_iter,
                           floor=1e3 * float(jnp.finfo(dtype).eps))

    def fit(self, model: LatentLinearModel, init=None) -> Posterior:
        frozen = jax.lax.stop_gradient(model)
        xi = init if isinstance(init, tuple) else initial_xi(frozen, self.bound, init)
        xi = jax.lax.stop_gradient(xi)
        run = self._iterate(xi, frozen)
        xi, k, converged, trace = run.x, run.evaluations, run.converged, run.trace
        _, mean, C = _evaluate(xi, frozen, self.bound)
        grad = jax.grad(bound)(xi, frozen, self.bound)
        grad_norm = max((jnp.max(jnp.abs(g)) for g in jax.tree_util.tree_leaves(grad)),
                        default=jnp.zeros((), trace.dtype))
        # Envelope theorem: ∂B/∂ξ = 0 at the fixed point, so the bound at the frozen ξ* with the live
        # model has the derivative of the optimal bound in every hyperparameter.
        log_z = bound(xi, model, self.bound)
        # Work done: one bound evaluation per point tried (k), one gradient (for grad_norm).
        diagnostics = Diagnostics(iterations=k, converged=converged, stationarity=run.distance, grad_norm=grad_norm,
                                  objective_trace=trace, num_value_evals=k, num_grad_evals=1, num_hvp_evals=0,
                                  method="LVB", solver="fixed_point")
        return Posterior(mean, CholeskyFactor.from_matrix(C).canonical(), log_z, diagnostics, model,
                         is_lower_bound=True)


def __dir__():
    return list(__all__)
