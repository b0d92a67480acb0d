"""Multi-class GP classification with the multinomial-probit likelihood, by nested EP.

C classes, N inputs, one latent function per class, f_c ~ GP(0, K_c) independently; the latent
vector is class-major, f = (f_1(x_1), …, f_1(x_N), …, f_C(x_N)), and f_i ∈ R^C collects the values
at input i.

**Multinomial probit, nested EP** (Riihimäki, Jylänki & Vehtari, JMLR 2013; Jylänki thesis §3.2):

$$
p(y_i = c \\mid f_i) = \\int \\mathcal N(u \\mid 0, 1) \\prod_{j \\ne c} \\Phi(u + f_{ic} - f_{ij})\\, du .
$$

Dropping the integral over the auxiliary u_i leaves C − 1 probit factors Φ(z_ij), each on a scalar
z_ij = u_i + f_{i,y_i} − f_ij. Each outer site's tilted moments come from an *inner* EP over these
factors with scalar sites exp(−½ τ_ij z² + ν_ij z); integrating u_i out of the inner approximation
gives the outer site exp(−½ f_iᵀ T̃_i f_i + h_iᵀ f_i) with

$$
\\tilde T_i = \\operatorname{diag}(\\pi_i) - \\pi_i \\pi_i^\\top / S_i, \\qquad
\\pi_i = \\tau_i + e_{y_i},\\ S_i = 1^\\top \\pi_i, \\qquad
h_i = e_{y_i} 1^\\top a_i - a_i,\\ a_i = \\nu_i - \\tau_i (1^\\top \\nu_i)/S_i
$$

(τ_{i,y_i} = ν_{i,y_i} = 0). T̃_i 1 = 0 and rank T̃_i = C − 1: the structure of R&W's softmax
Laplace, so with W = Σ_i U_i T̃_i U_iᵀ = D − D R S⁻¹ Rᵀ D (D = diag π, R the stacked identities)
the posterior Σ = (K⁻¹ + W)⁻¹ costs one N × N Cholesky per class plus one for
M = Σ_c E_c, E_c = D_c½ (I + D_c½ K_c D_c½)⁻¹ D_c½ (R&W Alg. 3.3), O(C N³) in all:

$$
\\Sigma = K - K E K + K E R M^{-1} R^\\top E K .
$$

The outer loop is the paper's *incremental* scheme: one damped inner update of every (τ_ij, ν_ij)
per outer iteration, all sites in parallel, from the z_ij marginals of the current q (the inner
approximation's f-marginal *is* q(f_i), and u_i | f_i is Gaussian with precision S_i, so no C × C
cavity is ever formed). Its fixed points are those of nested EP with converged inner EPs, and
`log_z` is the EP energy (Jylänki eqs. 2.42/2.45) of the augmented model, which equals the nested
energy there; it is stationary in the sites, so ``jax.grad`` of `log_z` in the kernel
hyperparameters is the total derivative (`nested_ep_log_z`). `tilted_moments` runs one full
inner EP (sequential over the C − 1 factors) for a given cavity; `predict_proba` uses it at each
test input with the predictive N(μ_*, Σ_*) as the cavity (the EP estimate of the orthant
probability), or a 1-D Gauss–Hermite rule (``rule=``).

The inner sites are updated by the EP maths of `vijax.methods.ep` (`cavity`, `site_step`, `moment_residual`,
`log_normaliser`), as in `vj.EP`. `NestedEPResult` records the layout of the fit (the kernels, X,
the labels and C), so predictions take ``(result, X_test)``.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import block_diag, cho_solve, solve_triangular

from ...methods.ep import cavity, log_normaliser, moment_residual, site_step
from ...posterior import Diagnostics
from ...solvers import iterate
from ...potentials import Probit
from ...quadrature import GaussHermite
from .._layout import class_kernels, class_labels, class_prior_covariances, same_arrays
from ... import _checks
from ..._keywords import renamed
from ..kernels import AbstractKernel
from ..models import DEFAULT_JITTER

__all__ = [
    "NestedEPResult",
    "nested_ep",
    "nested_ep_log_z",
    "tilted_moments",
    "multinomial_probit_log_likelihood",
    "predict",
    "predict_proba",
    "posterior_covariance",
    "RULES",
]

RULES = ("ep", "quadrature")  # `predict_proba`'s integration rules
_PROBIT = Probit()


# ----------------------------------------------------------------------------------------------
# The multinomial-probit likelihood


def multinomial_probit_log_likelihood(f, label, quadrature=GaussHermite(64)):
    """log p(y = label | f) = log ∫ N(u | 0, 1) ∏_{j≠label} Φ(u + f_label − f_j) du, by Gauss–Hermite in u.

    ``f`` has shape ``(C,)`` (vmap for more); ``label`` an integer. The integrand is smooth, so
    64 nodes give near machine precision for |f_c − f_j| up to about 10.
    """
    f = jnp.asarray(f)
    onehot = jax.nn.one_hot(label, f.shape[-1], dtype=f.dtype)
    gap = f @ onehot - f  # f_label − f_j, 0 at j = label where Φ is replaced by 1
    log_terms = lambda u: jnp.sum(jnp.where(onehot > 0, 0.0, jax.scipy.special.log_ndtr(u + gap)))
    return quadrature.log_expect_exp(log_terms, jnp.zeros((), f.dtype), jnp.ones((), f.dtype))


# ----------------------------------------------------------------------------------------------
# Site algebra (one input i; last axis is the class)


def _site_terms(tau, nu, onehot):
    """π = τ + e_y, S = 1ᵀπ, s = 1ᵀν and the outer site location h (see the module docstring)."""
    pi = tau + onehot
    S = jnp.sum(pi, -1)
    s = jnp.sum(nu, -1)
    a = nu - tau * (s / S)[..., None]
    h = onehot * jnp.sum(a, -1, keepdims=True) - a
    return pi, S, s, h


def _site_precision(pi, S):
    """T̃ = diag(π) − ππᵀ/S, shape ``(C, C)``."""
    return jnp.diag(pi) - jnp.outer(pi, pi) / S


def _z_marginals(m, V, tau, nu, onehot):
    """Means and variances of z_j = u + f_y − f_j under q(f) = N(m, V) and the inner u | f.

    u | f ~ N((s − τᵀd)/S, 1/S) with d_j = f_y − f_j, so z = s/S + (I − 1ρᵀ) d + noise, ρ = τ/S.
    Entry y is u itself, which no factor uses (masked by the callers).
    """
    C = m.shape[-1]
    eye = jnp.eye(C, dtype=m.dtype)
    S = 1.0 + jnp.sum(tau)
    D = onehot[None, :] - eye  # d = D f
    A = D - jnp.outer(jnp.ones_like(tau), (tau / S) @ D)
    mean = jnp.sum(nu) / S + A @ m
    var = jnp.einsum("jk,kl,jl->j", A, V, A) + 1.0 / S
    return mean, var


class _ScalarUpdate(NamedTuple):
    tau: jax.Array
    nu: jax.Array
    residual: jax.Array  # |m̂ − m|/√v + |log(v̂/v)| per factor (0 where not updated)
    log_terms: jax.Array  # log Ẑ + log Z(cavity) − log Z(q): the factors' share of the energy
    skipped: jax.Array


def _scalar_update(mz, vz, tau, nu, active):
    """The EP update of every probit factor Φ(z) from its marginal N(mz, vz) under q (elementwise).

    The cavity, step, residual and energy terms are those of `vj.EP` (`vj.ep.cavity`, `site_step`,
    `moment_residual`, `log_normaliser`; power η = 1). A factor whose cavity is improper
    (1/v − τ ≤ 0) or whose new site is not finite is left alone; for a proper cavity the probit
    (log-concave) gives τ_new > 0, so every π stays ≥ 0 and the posterior's B_c = I + D_c½ K_c D_c½
    stays positive definite.
    """
    mc, vc, proper = cavity(mz, vz, tau, nu)
    proper = active & proper
    log_zhat, m_hat, v_hat = _PROBIT.tilted_moments(jnp.where(proper, mc, 0.0), vc)
    step_tau, step_nu = site_step(mz, vz, m_hat, v_hat)
    tau_new, nu_new = tau + step_tau, nu + step_nu
    ok = proper & jnp.isfinite(tau_new) & jnp.isfinite(nu_new) & (tau_new >= 0)
    residual = moment_residual(mz, vz, m_hat, v_hat)
    log_terms = log_zhat + log_normaliser(mc, vc) - log_normaliser(mz, vz)
    return _ScalarUpdate(jnp.where(ok, tau_new, tau), jnp.where(ok, nu_new, nu), jnp.where(ok, residual, 0.0),
                         jnp.where(proper, log_terms, 0.0), jnp.sum(active & ~ok))


# ----------------------------------------------------------------------------------------------
# One site: the inner EP (tilted moments for a given cavity)


def _combine(m0, V0, tau, nu, onehot):
    """q(f) ∝ N(f | m0, V0) exp(−½ fᵀT̃f + hᵀf): V = (I + V0 T̃)⁻¹ V0, m = (I + V0 T̃)⁻¹ (m0 + V0 h)."""
    pi, S, _, h = _site_terms(tau, nu, onehot)
    A = jnp.eye(m0.shape[0], dtype=m0.dtype) + V0 @ _site_precision(pi, S)
    V = jnp.linalg.solve(A, V0)
    return jnp.linalg.solve(A, m0 + V0 @ h), 0.5 * (V + V.T)


def _inner_energy(m0, V0, tau, nu, onehot, m, V):
    """log Ẑ ≈ log ∫ N(f | m0, V0) p(y | f) df from the inner sites (Jylänki eqs. 2.42/2.45)."""
    active = onehot == 0
    mz, vz = _z_marginals(m, V, tau, nu, onehot)
    factors = jnp.sum(_scalar_update(mz, vz, tau, nu, active).log_terms)
    pi, S, s, h = _site_terms(tau, nu, onehot)
    T = _site_precision(pi, S)
    # ∫ N(f | m0, V0) exp(−½fᵀT̃f + hᵀf) df, centred at m0 so that V0 is never inverted
    r = h - T @ m0
    _, logdet = jnp.linalg.slogdet(jnp.eye(m0.shape[0], dtype=m0.dtype) + V0 @ T)
    gaussian = -0.5 * logdet + h @ m0 - 0.5 * m0 @ T @ m0 + 0.5 * r @ V @ r
    return factors + 0.5 * (s**2 / S - jnp.log(S)) + gaussian


def _inner_ep(m0, V0, onehot, max_iter, tol, tau=None, nu=None):
    """Inner EP for one site: sequential sweeps over the C − 1 factors until the residual ≤ ``tol``."""
    C = m0.shape[0]
    tau = jnp.zeros_like(m0) if tau is None else tau
    nu = jnp.zeros_like(m0) if nu is None else nu

    def factor(j, carry):
        tau, nu, m, V, worst = carry
        mz, vz = _z_marginals(m, V, tau, nu, onehot)
        active = (jnp.arange(C) == j) & (onehot == 0)
        up = _scalar_update(mz, vz, tau, nu, active)
        m, V = _combine(m0, V0, up.tau, up.nu, onehot)
        return up.tau, up.nu, m, V, jnp.maximum(worst, jnp.max(up.residual))

    def sweep(_, state):
        tau, nu, m, V, _ = state
        return jax.lax.fori_loop(0, C, factor, (tau, nu, m, V, jnp.zeros((), m0.dtype)))

    m, V = _combine(m0, V0, tau, nu, onehot)
    init = (tau, nu, m, V, jnp.asarray(jnp.inf, m0.dtype))
    (tau, nu, m, V, residual), _ = iterate(sweep, init, max_iter, lambda _, s: ~(s[4] > tol))  # NaN stops
    return _inner_energy(m0, V0, tau, nu, onehot, m, V), m, V, residual <= tol


def tilted_moments(cavity_mean, cavity_cov, label, max_iter=100, tol=1e-10, *, max_sweeps=None):
    """Normaliser and moments of p̂(f) ∝ N(f | m, V) p(y = label | f) by the inner EP of nested EP.

    **Arguments:**

    - `cavity_mean`, `cavity_cov`: m, shape ``(C,)``, and V, shape ``(C, C)`` (positive definite).
    - `label`: the class y, an integer in 0 … C − 1.
    - `max_iter`, `tol`: at most ``max_iter`` sequential sweeps over the C − 1 probit factors, until
      every factor's moment-matching residual is ≤ ``tol``. (`max_sweeps` is the deprecated name
      of `max_iter`.)

    **Returns:** ``(log_z, mean, cov, converged)``: the EP estimates of log Ẑ = log ∫ N(f | m, V)
    p(y | f) df (an orthant probability of a (C − 1)-dimensional Gaussian, which inner EP does not
    compute exactly), of the tilted mean ``(C,)`` and covariance ``(C, C)``. Cost O(C⁴) per sweep
    (C ≲ 20 is the intended range). Pure: ``jax.vmap`` it over sites.
    """
    max_iter = renamed("vj.gp.multiclass.tilted_moments", "max_sweeps", "max_iter", max_sweeps, max_iter)
    m0 = jnp.asarray(cavity_mean)
    V0 = jnp.asarray(cavity_cov, m0.dtype)
    onehot = jax.nn.one_hot(label, m0.shape[0], dtype=m0.dtype)
    return _inner_ep(m0, V0, onehot, max_iter, tol)


# ----------------------------------------------------------------------------------------------
# The posterior given all sites: O(C N³) by the softmax-Laplace structure


class _Posterior(NamedTuple):
    mean: jax.Array  # (C, N)
    alpha: jax.Array  # K⁻¹ mean, (C, N)
    site_cov: jax.Array  # (N, C, C): the C × C block of Σ at each input
    E: jax.Array  # (C, N, N)
    chol_m: jax.Array  # (N, N), M = Σ_c E_c = L Lᵀ
    logdet: jax.Array  # log det(I + K W) + Σ_i log S_i = Σ_c log det B_c + log det M


def _side_by_side(P):
    """(C, N, T) → (N, C·T): the blocks P_c next to each other, for one triangular solve."""
    return jnp.moveaxis(P, 0, 1).reshape(P.shape[1], -1)


def _class_factors(Kc, pic):
    """For one class: the Cholesky factor L of B = I + D½KD½, E = D½B⁻¹D½ and E K."""
    eye = jnp.eye(Kc.shape[0], dtype=Kc.dtype)
    d = jnp.sqrt(pic)
    L = jnp.linalg.cholesky(eye + d[:, None] * Kc * d[None, :])
    Q = solve_triangular(L, eye, lower=True) * d[None, :]  # L⁻¹D½
    E = Q.T @ Q
    return L, E, E @ Kc


def _posterior(K, pi, h):
    """q(f) = N(Σh, Σ), Σ = (K⁻¹ + D − D R S⁻¹ RᵀD)⁻¹, from K ``(C, N, N)``, π and h ``(C, N)``."""
    n = K.shape[-1]
    # One class at a time: XLA's batched CPU Cholesky and triangular solves are slower than a loop.
    L, E, P = (jnp.stack(x) for x in zip(*[_class_factors(K[c], pi[c]) for c in range(K.shape[0])]))
    L_m = jnp.linalg.cholesky(jnp.sum(E, 0))
    e = jnp.einsum("cnm,cm->cn", E, jnp.einsum("cnm,cm->cn", K, h))
    g = cho_solve((L_m, True), jnp.sum(e, 0))
    alpha = h - e + E @ g
    mean = jnp.einsum("cnm,cm->cn", K, alpha)
    G = solve_triangular(L_m, _side_by_side(P), lower=True).reshape(n, -1, n)  # L_M⁻¹ E_c K_c, (N, C, N)
    own = jnp.diagonal(K, axis1=-2, axis2=-1) - jnp.sum(K * P, axis=-2)  # diag(K − KEK), (C, N)
    site_cov = jax.vmap(jnp.diag)(own.T) + jnp.einsum("kcn,kdn->ncd", G, G)
    logdet = 2 * jnp.sum(jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1))) + 2 * jnp.sum(jnp.log(jnp.diag(L_m)))
    return _Posterior(mean, alpha, site_cov, E, L_m, logdet)


def _evaluate(K, tau, nu, onehot):
    """Posterior, z-marginal updates and the EP energy for sites (τ, ν) of shape ``(N, C)``."""
    pi, S, s, h = _site_terms(tau, nu, onehot)
    post = _posterior(K, pi.T, h.T)
    mz, vz = jax.vmap(_z_marginals)(post.mean.T, post.site_cov, tau, nu, onehot)
    update = _scalar_update(mz, vz, tau, nu, onehot == 0)
    # Energy of the augmented model: the factors' terms, ∫N(u)∏ sites du = exp(½s²/S − ½log S) per
    # input, and ∫N(f|0,K) exp(−½fᵀWf + hᵀf) = det(I+KW)^{−½} exp(½hᵀμ); the ½ log S cancel.
    energy = jnp.sum(update.log_terms) + 0.5 * jnp.sum(s**2 / S) - 0.5 * post.logdet + 0.5 * jnp.sum(h.T * post.mean)
    return post, update, energy


# ----------------------------------------------------------------------------------------------
# Outer loop


class NestedEPResult(eqx.Module):
    """A nested-EP fit of a multinomial-probit GP classifier, with the layout it was fitted on.

    **Fields:**

    - `mean`: posterior latent means, shape ``(C, N)`` (class-major).
    - `site_cov`: the C × C posterior covariance of f_i at each input, ``(N, C, C)``.
    - `alpha`: K⁻¹ mean, ``(C, N)`` (predictive means are K(X_*, X) α per class).
    - `E`, `chol_m`: E_c ``(C, N, N)`` and the Cholesky factor of M = Σ_c E_c ``(N, N)``
      (predictive covariances, R&W Alg. 3.4).
    - `prior_cov`: K_c + jitter·I, ``(C, N, N)``.
    - `tau`, `nu`: the inner sites, ``(N, C)`` (0 at each input's own class); pass as ``init``.
    - `log_z`: the EP energy, a scalar approximation of log p(y | X).
    - `diagnostics`: a `vj.Diagnostics`: `iterations` (outer), `converged`, `stationarity` (the
      largest moment-matching residual |m̂ − m|/√v + |log(v̂/v)| over the probit factors at the
      returned sites), `grad_norm` (max |∂ log_z / ∂(τ, ν)| there: 0 at an EP fixed point, up to
      O(tol)), `objective_trace` (the energy after each outer iteration, NaN-padded to
      ``max_iter + 1``), `num_value_evals`, `num_grad_evals`, `num_hvp_evals`; method
      ``"NestedEP"``, solver ``"parallel"``.
    - `damping`: δ at the end; `skipped`: factor updates left out in the last iteration (improper
      cavity or non-finite moments).
    - The layout: `kernels` (one per class), `X` ``(N, d)``, `labels` ``(N,)`` and `num_classes` C,
      so that `predict` and `predict_proba` need only the test inputs.

    ``result.iterations``, ``.converged`` and ``.residual`` are deprecated names for
    ``result.diagnostics.iterations``, ``.converged`` and ``.stationarity``.
    """

    mean: jax.Array
    site_cov: jax.Array
    alpha: jax.Array
    E: jax.Array
    chol_m: jax.Array
    prior_cov: jax.Array
    tau: jax.Array
    nu: jax.Array
    log_z: jax.Array
    diagnostics: Diagnostics
    damping: jax.Array
    skipped: jax.Array
    kernels: tuple[AbstractKernel, ...]
    X: jax.Array
    labels: jax.Array
    num_classes: int = eqx.field(static=True)

    def _deprecated(self, old, new):
        # stacklevel: this method, the property, two frames of equinox's __getattribute__, the caller
        warnings.warn(f"NestedEPResult.{old} is deprecated; use result.diagnostics.{new}.", DeprecationWarning,
                      stacklevel=5)
        return getattr(self.diagnostics, new)

    @property
    def iterations(self):
        return self._deprecated("iterations", "iterations")

    @property
    def converged(self):
        return self._deprecated("converged", "converged")

    @property
    def residual(self):
        return self._deprecated("residual", "stationarity")


class _Loop(NamedTuple):
    tau: jax.Array
    nu: jax.Array
    residual: jax.Array
    damping: jax.Array
    trace: jax.Array


class _Fit(NamedTuple):
    post: _Posterior
    log_z: jax.Array
    diagnostics: Diagnostics
    tau: jax.Array
    nu: jax.Array
    damping: jax.Array
    skipped: jax.Array


@eqx.filter_jit
def _fit(K, onehot, tau, nu, damping, min_damping, tol, trace):
    """Parallel incremental nested EP from sites (τ, ν), then the posterior and energy at the final sites.

    δ halves (down to ``min_damping``) whenever the largest moment-matching residual rises, the
    standard cure for oscillating parallel EP. The loop runs on stop_gradient(K); the energy is then
    evaluated with the live K at the frozen sites, so its gradient is the total derivative. ``trace``
    (NaN, shape ``(max_iter + 1,)``) receives the energy after each iteration.
    """
    frozen = jax.lax.stop_gradient(K)
    max_iter = trace.shape[0] - 1

    def step(k, state):
        _, update, energy = _evaluate(frozen, state.tau, state.nu, onehot)
        residual = jnp.max(update.residual)
        delta = jnp.where(residual > state.residual, jnp.maximum(0.5 * state.damping, min_damping), state.damping)
        tau = state.tau + delta * (update.tau - state.tau)
        nu = state.nu + delta * (update.nu - state.nu)
        return _Loop(tau, nu, residual, delta, state.trace.at[k].set(energy))

    init = _Loop(tau, nu, jnp.asarray(jnp.inf, K.dtype), damping, trace)
    loop, iterations = iterate(step, init, max_iter, lambda _, s: ~(s.residual > tol))  # NaN stops
    sites = jax.lax.stop_gradient((loop.tau, loop.nu))
    post, update, energy = _evaluate(K, *sites, onehot)
    # The energy's gradient in the active sites (the own-class entries are no parameters): ~0 at a fixed point.
    gradient = jax.grad(lambda t, n: _evaluate(frozen, t, n, onehot)[2], argnums=(0, 1))(*sites)
    grad_norm = jnp.max(jnp.abs(jnp.where(onehot == 0, jnp.stack(gradient), 0.0)))
    diagnostics = Diagnostics(
        iterations=iterations, converged=loop.residual <= tol, stationarity=jnp.max(update.residual),
        grad_norm=grad_norm, objective_trace=loop.trace.at[iterations].set(jax.lax.stop_gradient(energy)),
        num_value_evals=iterations + 1, num_grad_evals=jnp.asarray(1), num_hvp_evals=jnp.asarray(0),
        method="NestedEP", solver="parallel")
    return _Fit(post, energy, diagnostics, loop.tau, loop.nu, loop.damping, update.skipped)


def nested_ep_log_z(K, labels, tau, nu):
    """The EP energy at sites (τ, ν) ``(N, C)`` as a function of the prior covariances K ``(C, N, N)``.

    At an EP fixed point the energy is stationary in the sites, so with ``tau``, ``nu`` held fixed
    (e.g. those of a `NestedEPResult`), ``jax.grad`` of this through K(θ) is d log Z_EP / dθ.
    """
    onehot = jax.nn.one_hot(labels, K.shape[0], dtype=K.dtype)
    return _evaluate(K, tau, nu, onehot)[2]


def nested_ep(kernel, X, labels, num_classes, damping=0.7, min_damping=0.05, tol=1e-8, max_iter=500,
              jitter=DEFAULT_JITTER, init=None) -> NestedEPResult:
    """Nested EP for multi-class GP classification with the multinomial-probit likelihood.

    **Arguments:**

    - `kernel`: a `vj.gp.kernels` kernel shared by every class (the paper's setting), or a sequence
      of ``num_classes`` kernels.
    - `X`: inputs ``(N, d)``; `labels`: integer classes in 0 … C − 1, shape ``(N,)``.
    - `num_classes`: C ≥ 2 (classes without training points are allowed).
    - `damping`: the initial δ ∈ (0, 1] of the parallel site updates; halved, down to `min_damping`,
      whenever the largest moment-matching residual rises.
    - `tol`: converged when max_ij |m̂_ij − m_ij|/√v_ij + |log(v̂_ij/v_ij)| ≤ ``tol`` over the probit
      factors (the energy's error is of order tol²); `max_iter`: most outer iterations (a new value
      compiles the loop anew; new `tol` or `damping` values do not).
    - `jitter`: added to each K_c's diagonal; `init`: a previous `NestedEPResult` (same N, C) to
      warm-start from, e.g. at a neighbouring grid point of hyperparameters.

    **Returns:** a `NestedEPResult`, which records the kernels, X and labels for `predict` and
    `predict_proba`. One outer iteration costs O(C N³) (C Cholesky factorisations of N × N matrices
    and one more of M) plus O(C² N²) for the per-input C × C covariances.
    """
    owner = "vj.gp.multiclass.nested_ep"
    X = _checks.as_inputs(X, owner)
    y = class_labels(labels, X.shape[0], num_classes, owner)
    if not (0 < float(damping) <= 1 and 0 < float(min_damping) <= float(damping)):
        raise ValueError(f"{owner}: need 0 < min_damping ≤ damping ≤ 1, got damping={damping}, "
                         f"min_damping={min_damping}.")
    if not (isinstance(max_iter, (int, np.integer)) and max_iter >= 1):
        raise ValueError(f"{owner}: `max_iter` must be a positive integer, got {max_iter!r}.")
    kernels = class_kernels(kernel, num_classes, owner)
    K = class_prior_covariances(kernels, X, num_classes, jitter, owner)
    onehot = jax.nn.one_hot(jnp.asarray(y), num_classes, dtype=K.dtype)
    if init is None:
        tau = nu = jnp.zeros_like(onehot)
    else:
        if init.tau.shape != onehot.shape:
            raise ValueError(f"{owner}: `init` has sites of shape {init.tau.shape}, expected {onehot.shape}.")
        tau, nu = init.tau * (1 - onehot), init.nu * (1 - onehot)
    # Numbers as arrays, not static: fits with other tolerances or damping reuse the compiled loop.
    settings = (jnp.asarray(float(v), K.dtype) for v in (damping, min_damping, tol))
    fit = _fit(K, onehot, tau, nu, *settings, jnp.full((int(max_iter) + 1,), jnp.nan, K.dtype))
    post = fit.post
    return NestedEPResult(mean=post.mean, site_cov=post.site_cov, alpha=post.alpha, E=post.E, chol_m=post.chol_m,
                          prior_cov=K, tau=fit.tau, nu=fit.nu, log_z=fit.log_z, diagnostics=fit.diagnostics,
                          damping=fit.damping, skipped=fit.skipped, kernels=kernels, X=X, labels=jnp.asarray(y),
                          num_classes=int(num_classes))


def posterior_covariance(result: NestedEPResult):
    """The full posterior covariance Σ = K − KEK + KER M⁻¹ RᵀEK, ``(C·N, C·N)`` class-major (small N only)."""
    C, n, _ = result.E.shape
    K = result.prior_cov
    KEK = K @ result.E @ K
    own = block_diag(*[K[c] - KEK[c] for c in range(C)])
    G = solve_triangular(result.chol_m, _side_by_side(result.E @ K), lower=True)
    return own + G.T @ G


# ----------------------------------------------------------------------------------------------
# Prediction


def _recorded(result, legacy, owner, form):
    """The kernels, X and X_test of a prediction: ``legacy`` is empty (new form, the fit's layout) or
    ``(kernel, X, X_test)`` of the deprecated form, which must agree with what the fit recorded."""
    if not isinstance(result, NestedEPResult):
        raise ValueError(f"{owner}: `result` must be the NestedEPResult of vj.gp.multiclass.nested_ep, "
                         f"got {type(result).__name__}.")
    if len(legacy) == 1:
        return result.kernels, result.X, legacy[0]
    if len(legacy) != 3:
        raise ValueError(f"{owner}: call {owner.rsplit('.', 1)[-1]}(result, X_test); got {len(legacy) + 1} "
                         "positional arguments.")
    kernel, X, X_test = legacy
    warnings.warn(f"{owner}({form}) is deprecated: the result records its kernels and X; "
                  f"call {owner.rsplit('.', 1)[-1]}(result, X_test).", DeprecationWarning, stacklevel=3)
    kernels, X = class_kernels(kernel, result.num_classes, owner), _checks.as_inputs(X, owner)
    if not (same_arrays(kernels, result.kernels) and same_arrays(X, result.X)):
        raise ValueError(f"{owner}: the kernel or X given differ from those `result` was fitted with, so the "
                         f"prediction would be wrong; call {owner.rsplit('.', 1)[-1]}(result, X_test).")
    return kernels, X, X_test


def predict(result: NestedEPResult, X_test, *legacy):
    """Predictive latent means ``(T, C)`` and covariances ``(T, C, C)`` at ``X_test`` ``(T, d)`` (R&W Alg. 3.4).

    μ_*c = k_c*ᵀ α_c and Σ_* = diag_c(k_c** − k_c*ᵀ E_c k_c*) + (E k_*)ᵀ M⁻¹ (E k_*), with the kernels
    and X recorded in ``result``. (The form ``predict(result, kernel, X, X_test)`` is deprecated.)
    """
    owner = "vj.gp.multiclass.predict"
    kernels, X, X_test = _recorded(result, (X_test, *legacy), owner, "result, kernel, X, X_test")
    return _predict(result, kernels, X, X_test, owner)


def _predict(result, kernels, X, X_test, owner):
    C, n, _ = result.E.shape
    X, X_test = _checks.as_inputs(X, owner), _checks.as_inputs(X_test, owner)
    if X.shape[0] != n:
        raise ValueError(f"{owner}: X has {X.shape[0]} rows but the fit has {n} inputs.")
    cross = jnp.stack([k(X, X_test) for k in kernels])  # (C, N, T)
    diag = jnp.stack([k.diagonal(X_test) for k in kernels])  # (C, T)
    mean = jnp.einsum("cnt,cn->tc", cross, result.alpha)
    b = result.E @ cross  # E_c k_c*, (C, N, T)
    t = cross.shape[-1]
    g = solve_triangular(result.chol_m, _side_by_side(b), lower=True).reshape(n, C, t)
    own = diag - jnp.sum(cross * b, axis=1)  # (C, T)
    cov = jax.vmap(jnp.diag)(own.T) + jnp.einsum("kct,kdt->tcd", g, g)
    return mean, cov


def _gauss_hermite_proba(mean, cov, quadrature):
    """p(y = c) = P(g_c ≥ g_j ∀j), g = f + ε, by a 1-D rule in g_c with each f_j | g_c Gaussian.

    Exact (up to the rule) when cov is diagonal; otherwise the correlation of the f_j given g_c
    is dropped.
    """
    C = mean.shape[0]
    var = jnp.diag(cov)

    def one_class(c):
        sc = jnp.sqrt(1.0 + var[c])
        beta = cov[:, c] / sc**2
        cond_var = jnp.maximum(var - beta * cov[:, c], 0.0)
        others = jnp.arange(C) != c

        def integrand(x):  # x: standardised g_c
            g = mean[c] + sc * x
            arg = (g - mean - beta * (g - mean[c])) / jnp.sqrt(1.0 + cond_var)
            return jnp.sum(jnp.where(others, jax.scipy.special.log_ndtr(arg), 0.0))

        return quadrature.log_expect_exp(integrand, jnp.zeros((), mean.dtype), jnp.ones((), mean.dtype))

    return jax.vmap(one_class)(jnp.arange(C))


def predict_proba(result: NestedEPResult, X_test, *legacy, rule="ep", quadrature=GaussHermite(64), method=None):
    """Class probabilities p(y_* = c | x_*, data) at ``X_test`` ``(T, d)``: shape ``(T, C)``, rows summing to one.

    The predictive latent f_* ~ N(μ_*, Σ_*) (`predict`) is integrated against the likelihood:

    - ``rule="ep"`` (default): log p(y_* = c) is the inner-EP estimate of log ∫ N(f | μ_*, Σ_*)
      p(c | f) df (`tilted_moments` with the predictive as the cavity), which keeps every
      between-class correlation of Σ_*; the C estimates are renormalised (EP's orthant probabilities
      sum to 1 only approximately).
    - ``rule="quadrature"``: with g = f_* + ε, p(c) = P(g_c ≥ g_j ∀j) by ``quadrature`` in g_c
      (the u of the likelihood shifted by f_c), each f_j replaced by its Gaussian conditional given
      g_c; exact for a class-diagonal Σ_* (far from the data) and an approximation otherwise;
      renormalised.

    Deprecated forms: ``predict_proba(result, kernel, X, X_test, method=…)`` (``method`` is the old
    name of ``rule``).
    """
    owner = "vj.gp.multiclass.predict_proba"
    if len(legacy) > 2:  # the old positional (result, kernel, X, X_test, method, quadrature)
        method, *rest = legacy[2:]
        quadrature = rest[0] if rest else quadrature
        legacy = legacy[:2]
    if method is not None:
        warnings.warn(f"{owner}: `method` is deprecated; use `rule` (same values: {RULES}).", DeprecationWarning,
                      stacklevel=2)
        rule = method
    if rule not in RULES:
        raise ValueError(f"{owner}: `rule` must be 'ep' (inner EP on the predictive) or 'quadrature' "
                         f"(a 1-D rule), got {rule!r}.")
    kernels, X, X_test = _recorded(result, (X_test, *legacy), owner, "result, kernel, X, X_test")
    mean, cov = _predict(result, kernels, X, X_test, owner)
    log_p = _log_proba_ep(mean, cov) if rule == "ep" else _log_proba_quadrature(mean, cov, quadrature)
    return jax.nn.softmax(log_p, axis=-1)


@jax.jit
def _log_proba_ep(mean, cov):
    classes = jnp.arange(mean.shape[1])
    return jax.vmap(lambda m, V: jax.vmap(lambda c: tilted_moments(m, V, c)[0])(classes))(mean, cov)


@eqx.filter_jit
def _log_proba_quadrature(mean, cov, quadrature):
    return jax.vmap(lambda m, V: _gauss_hermite_proba(m, V, quadrature))(mean, cov)


def __dir__():
    return list(__all__)
