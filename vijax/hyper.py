"""Hyperparameters integrated, not optimised, with any vijax method as the inner integral.

A model ``build(theta)`` depends on an unconstrained flat ``(P,)`` array θ. A method gives
log p̂(y | θ) = ``vj.infer(build(theta), method).log_z``, differentiable in θ by the envelope theorem (`marginal`).
`integrate` (a central composite design or a grid around the mode, after INLA) and `sample` (NUTS) integrate θ
against a prior p(θ) into a `vj.posterior.Mixture`, which the GP and GLM predictives accept:
p(y_* | y) ≈ Σ_k w_k ∫ p(y_* | f_*) q_k(f_*) df_*.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _checks
from .inference import ConvergenceWarning, check_method, infer
from .methods import AbstractMethod
from ._linalg import batched_map
from .posterior import Mixture, Posterior
from .solvers import LBFGS

__all__ = ["marginal", "Marginal", "integrate", "Integration", "sample", "Samples", "SamplerInfo",
           "ccd_design", "MAX_DIM"]
__dir__ = __all__.copy

MAX_DIM = 6  # the deterministic rules' largest dim θ (a grid or design grows exponentially with it)


def _log_density(theta, build, method, log_prior, init):
    """log p̂(y | θ) + log p(θ), the method's fit at θ warm-started from ``init``, and that fit."""
    post = infer(build(theta), method, init)
    return post.log_z + jnp.asarray(log_prior(theta), post.log_z.dtype), post


@eqx.filter_jit
def _fit(build, method, theta, init):
    return infer(build(theta), method, init)


@eqx.filter_jit
def _fits(build, method, log_prior, thetas, init, batch_size):
    return batched_map(lambda th: _log_density(th, build, method, log_prior, init), thetas, batch_size)


@eqx.filter_jit
def _gradients(build, method, log_prior, thetas, init, batch_size):
    return batched_map(jax.grad(lambda th: _log_density(th, build, method, log_prior, init)[0]), thetas, batch_size)


@eqx.filter_jit
def _mode(build, method, log_prior, theta0, init, solver):
    return solver.maximise(lambda th: _log_density(th, build, method, log_prior, init)[0], theta0)


def _check_args(build, method, log_prior, batch_size, owner):
    if not callable(build):
        raise ValueError(f"{owner}: `build` must be a function theta -> model (e.g. a vj.gp.model), got "
                         f"{type(build).__name__}.")
    check_method(method, owner)
    if log_prior is not None and not callable(log_prior):
        raise ValueError(f"{owner}: `log_prior` must be a function theta -> log p(theta) (a scalar), got "
                         f"{type(log_prior).__name__}.")
    _checks.integer("batch_size", batch_size, owner)


def _check_theta(theta0, owner, name="theta0"):
    theta0 = _checks.as_float_array(name, theta0, owner)
    if theta0.ndim != 1 or theta0.shape[0] == 0:
        raise ValueError(f"{owner}: `{name}` must be a flat (P,) array of the unconstrained hyperparameters, got shape "
                         f"{theta0.shape}; stack them, e.g. jnp.array([log_lengthscale, log_variance]).")
    if not jnp.issubdtype(theta0.dtype, jnp.floating):
        theta0 = theta0.astype(jnp.result_type(float))
    _checks.check_finite(name, theta0, owner)
    return theta0


def _start(build, method, log_prior, theta0, owner):
    """The cold fit at θ0, its log density checked finite."""
    post0 = _fit(build, method, theta0, None)
    prior0 = jnp.asarray(log_prior(theta0))
    if jnp.ndim(prior0) != 0:
        raise ValueError(f"{owner}: `log_prior(theta)` must return a scalar, got shape {jnp.shape(prior0)}.")
    value0 = float(post0.log_z) + float(prior0)
    if not np.isfinite(value0):
        raise ValueError(f"{owner}: log p(y | theta0) + log p(theta0) is not finite (log Z = {float(post0.log_z)}, "
                         f"log prior = {float(prior0)}) at theta0 = {np.asarray(theta0)}; start where the model "
                         "and the prior are defined (see the inner fit's diagnostics: "
                         f"{post0.diagnostics!r}).")
    return post0


class Marginal(eqx.Module):
    """θ ↦ log p̂(y | θ), the method's ``log_z`` for ``build(theta)``; made by `marginal`.

    ``m(theta, init=None)`` is log p̂(y | θ), ``m.fit(theta, init=None)`` the whole `vj.Posterior`, ``init`` a
    previous fit or State to warm-start from. Both compile once per shape (keep one ``build``, not a new lambda per
    call). ``jax.grad(m)`` is the envelope-theorem gradient; `m` works under `jax.jit` and `jax.vmap`.
    """

    build: Callable = eqx.field(static=True)
    method: AbstractMethod

    def fit(self, theta, init=None) -> Posterior:
        """The method's `vj.Posterior` for ``build(theta)``."""
        owner = "vj.hyper.Marginal.fit"
        theta = _check_theta(theta, owner, "theta")
        post = _fit(self.build, self.method, theta, init)
        if _checks.is_concrete(post.log_z) and np.ndim(post.log_z) == 0 and not bool(post.diagnostics.converged):
            warnings.warn(f"{owner}: the inner fit ({post.diagnostics.method}) did not converge at theta = "
                          f"{np.asarray(theta)}; log p(y | theta) and its gradient are not at the optimum.",
                          ConvergenceWarning, stacklevel=2)
        return post

    def __call__(self, theta, init=None) -> jax.Array:
        """log p̂(y | θ) (a scalar)."""
        return self.fit(theta, init).log_z


def marginal(build: Callable, method: AbstractMethod) -> Marginal:
    """The log marginal likelihood θ ↦ log p̂(y | θ) = ``vj.infer(build(theta), method).log_z`` as a `Marginal`.

    **Arguments:**

    - `build`: ``theta -> model``, θ a flat ``(P,)`` array; every θ must give a model of the same structure and shapes.
    - `method`: any vijax method (`vj.EP()`, `vj.Laplace()`, `vj.GKL()`, …).
    """
    _check_args(build, method, None, 1, "vj.hyper.marginal")
    return Marginal(build, method)


def ccd_design(dim: int, f0: float = 1.1) -> tuple[np.ndarray, np.ndarray]:
    """The central composite design in P = ``dim`` whitened coordinates z and its log weights: ``(z, log_delta)``.

    z ``(K, P)``: the centre, the 2P axial points ±f0·√P·e_i and the factorial points ±f0 (full 2^P for P ≤ 4, the
    half fraction for P = 5, 6), so K = 3, 9, 15, 25, 27, 45 (Rue, Martino & Chopin 2009, §6.5).
    Δ_0 = (2π)^{P/2}(1 − 1/f0²) and Δ_k = (2π)^{P/2} exp(P f0²/2) / ((K − 1) f0²) make ∫ f(z) dz ≈ Σ_k Δ_k f(z_k)
    exact in mass, mean and covariance for a Gaussian f; ``f0`` > 1 keeps Δ_0 positive.
    """
    owner = "vj.hyper.ccd_design"
    if not (isinstance(dim, (int, np.integer)) and 1 <= dim <= MAX_DIM):
        raise ValueError(f"{owner}: `dim` must be an integer in 1..{MAX_DIM}, got {dim!r}.")
    if not f0 > 1.0:
        raise ValueError(f"{owner}: `f0` must exceed 1 (the centre's weight is (2π)^(P/2)(1 − 1/f0²)), got {f0!r}.")
    axial = np.concatenate([np.sqrt(dim) * np.eye(dim), -np.sqrt(dim) * np.eye(dim)])
    rows = [np.zeros((1, dim)), axial]
    if dim >= 2:
        base = dim if dim <= 4 else dim - 1
        corners = np.array(np.meshgrid(*[[-1.0, 1.0]] * base, indexing="ij")).reshape(base, -1).T
        if base < dim:  # the generator: the last factor is the product of the base factors
            corners = np.concatenate([corners, np.prod(corners, axis=1, keepdims=True)], axis=1)
        rows.append(corners)
    z = f0 * np.concatenate(rows)
    k = z.shape[0]
    log_delta = 0.5 * dim * math.log(2 * math.pi) + np.concatenate(
        [[math.log(1.0 - 1.0 / f0**2)], np.full(k - 1, 0.5 * dim * f0**2 - math.log((k - 1) * f0**2))])
    return z, log_delta


class Integration(Mixture):
    """θ integrated by a deterministic rule: the result of `integrate`, a `vj.posterior.Mixture`.

    **Fields:** `points` θ_k ``(K, P)``, `weights` w_k ``(K,)`` and `posteriors` (leading axis K) as for the
    mixture; `log_densities` log p̂(y | θ_k) + log p(θ_k) ``(K,)``; `log_z` log ∫ p̂(y | θ) p(θ) dθ by the rule;
    `mode` θ̂ ``(P,)`` and `covariance` Σ = (−∇²(log p̂ + log p))⁻¹ at θ̂, whose principal axes the rule is laid on;
    `mode_converged`; `rule` (``"ccd"`` or ``"grid"``).
    """

    points: jax.Array
    weights: jax.Array
    posteriors: Posterior
    log_densities: jax.Array
    log_z: jax.Array
    mode: jax.Array
    covariance: jax.Array
    mode_converged: jax.Array
    rule: str = eqx.field(static=True)


def integrate(build: Callable, method: AbstractMethod, log_prior: Callable, theta0, rule: str = "ccd", *,
              f0: float = 1.1, step: float = 0.5, extent: float = 4.0, max_points: int = 20_000,
              difference_step: float = 1e-3, solver: LBFGS | None = None, batch_size: int = 1) -> Integration:
    """Integrate the hyperparameters θ by a central composite design or a grid around the mode of p(θ | y).

    With ℓ(θ) = log p̂(y | θ) + log p(θ): the mode θ̂ by `vj.solvers.LBFGS` on envelope gradients;
    A = −∇²ℓ(θ̂) by central differences of the envelope gradient (`jax.hessian` of log p̂ would miss how the inner
    optimum moves with θ); θ = θ̂ + L z with Σ = A⁻¹ = L Lᵀ; then the fits at the rule's points and
    w_k ∝ Δ_k exp(ℓ(θ_k)). ``"ccd"`` uses `ccd_design` (the Laplace evidence when ℓ is quadratic); ``"grid"`` the
    lattice ``step``·ℤ^P within |z| ≤ ``extent``, Δ_k = step^P, warning if the edge is within e⁻⁴ of the peak.
    log_z = ½ log det Σ + log Σ_k Δ_k exp(ℓ(θ_k)). CCD sees skew and tails at K points only: a grid's moments are finer.

    **Arguments:**

    - `build`, `method`: as for `marginal` (P ≤ 6).
    - `log_prior`: ``theta -> log p(theta)``, a scalar JAX function (unnormalised: log_z up to the same constant).
    - `theta0`: where the mode search starts (``(P,)``); every inner fit is warm-started from the fit there.
    - `rule`: ``"ccd"`` (default) or ``"grid"``.
    - `f0`: CCD's radius factor (> 1; 1.1 as in INLA and GPstuff). `step`, `extent`, `max_points`: the grid's
      spacing and radius in standard deviations, and the most points it may have.
    - `difference_step`: h of the Hessian's differences, in θ's units.
    - `solver`: the mode search's `vj.solvers.LBFGS` (default ``LBFGS(tol=1e-10, max_iter=200)``).
    - `batch_size`: fits per vmapped batch; 1 (default) fits one after another (under `jax.vmap` every lane runs
      until the slowest converges, a loss on a CPU); raise it on an accelerator.
    """
    owner = "vj.hyper.integrate"
    _check_args(build, method, log_prior, batch_size, owner)
    if rule not in ("ccd", "grid"):
        raise ValueError(f"{owner}: `rule` must be 'ccd' or 'grid', got {rule!r}.")
    theta0 = _check_theta(theta0, owner)
    dim = theta0.shape[0]
    if dim > MAX_DIM:
        raise ValueError(f"{owner}: theta has {dim} entries; the CCD and grid rules are for at most {MAX_DIM} "
                         "hyperparameters (their points grow exponentially with it). Use vj.hyper.sample (NUTS).")
    if rule == "grid" and not (step > 0 and extent >= step):
        raise ValueError(f"{owner}: the grid needs `step` > 0 and `extent` ≥ `step`, got step={step!r}, "
                         f"extent={extent!r}.")
    _checks.check_positive("difference_step", difference_step, owner)
    solver = LBFGS(tol=1e-10, max_iter=200) if solver is None else solver
    if not isinstance(solver, LBFGS):
        raise ValueError(f"{owner}: `solver` must be a vj.solvers.LBFGS, got {type(solver).__name__}.")
    if rule == "grid":
        z = _grid(dim, step, extent)
        if z.shape[0] > max_points:
            raise ValueError(f"{owner}: the grid has {z.shape[0]} points (step {step}, extent {extent}, "
                             f"{dim} dimensions), more than max_points={max_points}; take a larger `step`, a "
                             "smaller `extent`, raise `max_points`, or use rule='ccd'.")
        log_delta = np.full(z.shape[0], dim * math.log(step))
    else:
        try:
            z, log_delta = ccd_design(dim, f0)
        except ValueError as error:
            raise ValueError(str(error).replace("vj.hyper.ccd_design", owner)) from None

    post0 = _start(build, method, log_prior, theta0, owner)
    sol = _mode(build, method, log_prior, theta0, post0, solver)
    dtype = sol.x.dtype
    mode = np.asarray(sol.x, np.float64)
    if not (np.all(np.isfinite(mode)) and np.isfinite(float(sol.value))):
        raise ValueError(f"{owner}: the mode search failed (log density {float(sol.value)} at {mode}); check that "
                         "the prior is proper and the model defined near theta0.")
    shifts = difference_step * np.eye(dim)
    around = jnp.asarray(np.concatenate([mode + shifts, mode - shifts]), dtype)
    grads = np.asarray(_gradients(build, method, log_prior, around, post0, min(batch_size, 2 * dim)), np.float64)
    hessian = (grads[:dim] - grads[dim:]).T / (2 * difference_step)  # column i: ∂∇ℓ/∂θ_i
    precision = -0.5 * (hessian + hessian.T)
    eigenvalues, vectors = np.linalg.eigh(precision)
    if not (np.all(np.isfinite(eigenvalues)) and eigenvalues.min() > 0):
        raise ValueError(f"{owner}: −∇² log p(theta | y) at the mode {mode} is not positive definite (eigenvalues "
                         f"{eigenvalues}): the posterior of theta is improper or flat there. Use a proper, more "
                         "informative prior, or reparametrise theta.")
    scales = 1.0 / np.sqrt(eigenvalues)
    L = vectors * scales  # Σ = L Lᵀ, columns along the principal axes
    points = mode + z @ L.T
    values, posteriors = _fits(build, method, log_prior, jnp.asarray(points, dtype), post0, batch_size)
    values = np.asarray(values, np.float64)
    values = np.where(np.isfinite(values), values, -np.inf)
    if not np.isfinite(values[0]):
        raise ValueError(f"{owner}: the inner fit failed at the mode {mode}; see the method's diagnostics.")
    if rule == "grid":
        edge = values[np.linalg.norm(z, axis=1) > extent - step]
        if edge.size and edge.max() > values.max() - 4.0:
            warnings.warn(f"{owner}: the density at the grid's edge (radius {extent} sd) is within e^-4 of its "
                          "largest value: the grid may cut off the posterior of theta; raise `extent`.",
                          UserWarning, stacklevel=2)
    log_terms = log_delta + values
    top = log_terms.max()
    total = top + math.log(np.sum(np.exp(log_terms - top)))
    weights = np.exp(log_terms - total)
    as_array = lambda x: jnp.asarray(x, dtype)
    return Integration(points=as_array(points), weights=as_array(weights), posteriors=posteriors,
                       log_densities=as_array(values), log_z=as_array(total + np.sum(np.log(scales))),
                       mode=as_array(mode), covariance=as_array(L @ L.T), mode_converged=sol.converged, rule=rule)


def _grid(dim, step, extent):
    """The lattice step·ℤ^P inside the ball of radius ``extent`` (numpy, ``(K, P)``), the centre first."""
    n = int(math.floor(extent / step + 1e-9))
    axis = step * np.arange(-n, n + 1)
    z = np.array(np.meshgrid(*[axis] * dim, indexing="ij")).reshape(dim, -1).T
    z = z[np.linalg.norm(z, axis=1) <= extent * (1 + 1e-12)]
    order = np.argsort(np.linalg.norm(z, axis=1), kind="stable")
    return z[order]


class SamplerInfo(eqx.Module):
    """How the NUTS run went: `num_divergent` (after warm-up), `accept_prob` (mean), `step_size` (adapted),
    `mean_num_steps` (leapfrog steps per draw), `ess` (effective sample size per coordinate of θ, ``(P,)``)."""

    num_divergent: jax.Array
    accept_prob: jax.Array
    step_size: jax.Array
    mean_num_steps: jax.Array
    ess: jax.Array


class Samples(Mixture):
    """θ sampled by NUTS: the result of `sample`, a `vj.posterior.Mixture`.

    **Fields:** `draws` ``(S, P)`` after warm-up; `points` ``(K, P)``, the (evenly thinned) draws fitted for the
    mixture, with `weights` 1/K and `posteriors`; `log_densities` log p̂(y | θ_k) + log p(θ_k); `info` a
    `SamplerInfo`. ``mean`` and ``sd`` are over all draws.
    """

    draws: jax.Array
    points: jax.Array
    weights: jax.Array
    posteriors: Posterior
    log_densities: jax.Array
    info: SamplerInfo

    @property
    def mean(self) -> jax.Array:
        return jnp.mean(self.draws, axis=0)

    @property
    def sd(self) -> jax.Array:
        return jnp.std(self.draws, axis=0)

    @property
    def mc_error(self) -> jax.Array:
        """sd/√ESS per coordinate: the Monte Carlo standard error of ``mean``."""
        return self.sd / jnp.sqrt(self.info.ess)


def sample(build: Callable, method: AbstractMethod, log_prior: Callable, key, num_samples: int, num_warmup: int,
           theta0, *, num_posteriors: int | None = 200, target_accept_prob: float = 0.8,
           dense_mass: bool = True, batch_size: int = 1) -> Samples:
    """NUTS (NumPyro's, an optional dependency) over θ on log p̂(y | θ) + log p(θ), each step a fit at θ warm-started
    from the fit at ``theta0``, with the envelope gradient.

    **Arguments:**

    - `build`, `method`, `log_prior`: as for `integrate`.
    - `key`: a `jax.random` key; `num_samples`, `num_warmup`: draws kept and warm-up (adaptation) steps, one chain.
    - `theta0`: the starting point, ``(P,)`` (e.g. ``vj.hyper.integrate(...).mode``).
    - `num_posteriors`: the method is fitted at this many draws (evenly thinned; None: every draw) for the mixture.
    - `target_accept_prob`, `dense_mass`: NumPyro's NUTS settings (a dense mass matrix by default: P is small).
    - `batch_size`: as for `integrate`, for the fits at the points.
    """
    owner = "vj.hyper.sample"
    try:
        from numpyro.diagnostics import effective_sample_size
        from numpyro.infer import MCMC, NUTS
    except ImportError:
        raise ImportError(f"{owner} runs NumPyro's NUTS, which is not installed: pip install numpyro "
                          "(vijax's core does not depend on it).") from None
    _check_args(build, method, log_prior, batch_size, owner)
    _checks.integer("num_samples", num_samples, owner)
    _checks.integer("num_warmup", num_warmup, owner, 0)
    if num_posteriors is not None:
        _checks.integer("num_posteriors", num_posteriors, owner)
    theta0 = _check_theta(theta0, owner)
    post0 = _start(build, method, log_prior, theta0, owner)

    def potential(theta):
        return -_log_density(theta, build, method, log_prior, post0)[0]

    kernel = NUTS(potential_fn=potential, target_accept_prob=target_accept_prob, dense_mass=dense_mass)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=1, progress_bar=False)
    mcmc.run(key, init_params=theta0, extra_fields=("diverging", "accept_prob", "num_steps"))
    draws = np.asarray(mcmc.get_samples())
    dtype = theta0.dtype
    extra = {name: np.asarray(value) for name, value in mcmc.get_extra_fields().items()}
    as_array = lambda x: jnp.asarray(x, dtype)
    info = SamplerInfo(num_divergent=jnp.asarray(int(extra["diverging"].sum())),
                       accept_prob=as_array(extra["accept_prob"].mean()),
                       step_size=as_array(np.asarray(mcmc.last_state.adapt_state.step_size)),
                       mean_num_steps=as_array(extra["num_steps"].mean()),
                       ess=as_array(effective_sample_size(draws[None])))
    k = num_samples if num_posteriors is None else min(num_posteriors, num_samples)
    points = draws[np.round(np.linspace(0, num_samples - 1, k)).astype(int)]
    values, posteriors = _fits(build, method, log_prior, as_array(points), post0, batch_size)
    return Samples(draws=as_array(draws), points=as_array(points), weights=as_array(np.full(k, 1.0 / k)),
                   posteriors=posteriors, log_densities=values, info=info)
