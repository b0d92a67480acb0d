"""Multi-class GP classification with the multinomial-probit likelihood, by nested EP.

f_c ~ GP(0, K_c) for C classes over N inputs (f class-major) and p(y_i = c | f_i) = ∫ N(u | 0, 1)
∏_{j≠c} Φ(u + f_ic − f_ij) du (Riihimäki, Jylänki & Vehtari, JMLR 2013). An inner EP over the C − 1 probit
factors of z_ij = u_i + f_{i,y_i} − f_ij, with sites exp(−½ τ_ij z² + ν_ij z) and u_i integrated out, gives
the outer site exp(−½ f_iᵀT̃_i f_i + h_iᵀf_i), T̃_i = diag(π_i) − π_iπ_iᵀ/S_i, π_i = τ_i + e_{y_i}, S_i = 1ᵀπ_i,
h_i = e_{y_i}1ᵀa_i − a_i, a_i = ν_i − τ_i(1ᵀν_i)/S_i. With D_c = diag(π_c), E_c = D_c½(I + D_c½K_cD_c½)⁻¹D_c½
and M = Σ_c E_c (R&W Alg. 3.3), Σ = K − KEK + KER M⁻¹RᵀEK in O(C N³). `log_z` is the EP energy of the
augmented model (Jylänki eqs. 2.42/2.45); the sites are updated in parallel, damped.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.linalg import block_diag

from ... import _checks
from ..._factorisation import Primal, SiteForm
from ...covariance import AbstractFactor
from ...methods.ep import cavity, log_normaliser, moment_residual, site_step
from ...posterior import Diagnostics, Posterior
from ...potentials import Probit
from ...quadrature import GaussHermite
from ...solvers import Status, iterate
from .._layout import MulticlassMethod, MulticlassModel

__all__ = ["NestedEP", "NestedEPState", "NestedEPPosterior", "NestedEPInfo", "NestedEPFactor", "energy",
           "tilted_moments", "multinomial_probit_log_likelihood", "predict", "predict_proba", "RULES"]
__dir__ = __all__.copy

RULES = ("ep", "quadrature")  # `predict_proba`'s integration rules
_PROBIT = Probit()


def multinomial_probit_log_likelihood(f, label, quadrature=GaussHermite(64)):
    """log p(y = label | f) = log ∫ N(u | 0, 1) ∏_{j≠label} Φ(u + f_label − f_j) du, by Gauss–Hermite in u.

    ``f``: ``(C,)``; ``label``: an int. 64 nodes: near machine precision for |f_c − f_j| up to about 10."""
    f = jnp.asarray(f)
    onehot = jax.nn.one_hot(label, f.shape[-1], dtype=f.dtype)
    gap = f @ onehot - f  # f_label − f_j, 0 at j = label where Φ is replaced by 1
    log_terms = lambda u: jnp.sum(jnp.where(onehot > 0, 0.0, jax.scipy.special.log_ndtr(u + gap)))
    return quadrature.log_expect_exp(log_terms, jnp.zeros((), f.dtype), jnp.ones((), f.dtype))


def _site_terms(tau, nu, onehot):
    """π = τ + e_y, S = 1ᵀπ, s = 1ᵀν and the outer site location h."""
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
    """Means and variances of z_j = u + f_y − f_j under q(f) = N(m, V) and u | f ~ N((s − τᵀd)/S, 1/S),
    d_j = f_y − f_j (entry y is u itself, in no factor)."""
    S = 1.0 + jnp.sum(tau)
    D = onehot[None, :] - jnp.eye(m.shape[-1], dtype=m.dtype)  # d = D f
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
    """The EP update (power 1) of every probit factor Φ(z) from its marginal N(mz, vz) under q.

    A factor with an improper cavity or a non-finite new site is left alone; a proper cavity gives τ_new > 0
    (the probit is log-concave), so every π stays ≥ 0."""
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


def _combine(m0, V0, tau, nu, onehot):
    """q(f) ∝ N(f | m0, V0) exp(−½ fᵀT̃f + hᵀf): V = (I + V0 T̃)⁻¹ V0, m = (I + V0 T̃)⁻¹ (m0 + V0 h)."""
    pi, S, _, h = _site_terms(tau, nu, onehot)
    A = jnp.eye(m0.shape[0], dtype=m0.dtype) + V0 @ _site_precision(pi, S)
    V = jnp.linalg.solve(A, V0)
    return jnp.linalg.solve(A, m0 + V0 @ h), 0.5 * (V + V.T)


def _inner_energy(m0, V0, tau, nu, onehot, m, V):
    """log Ẑ ≈ log ∫ N(f | m0, V0) p(y | f) df from the inner sites (Jylänki eqs. 2.42/2.45)."""
    mz, vz = _z_marginals(m, V, tau, nu, onehot)
    factors = jnp.sum(_scalar_update(mz, vz, tau, nu, onehot == 0).log_terms)
    pi, S, s, h = _site_terms(tau, nu, onehot)
    T = _site_precision(pi, S)
    # ∫ N(f | m0, V0) exp(−½fᵀT̃f + hᵀf) df, centred at m0 so that V0 is never inverted
    r = h - T @ m0
    _, logdet = jnp.linalg.slogdet(jnp.eye(m0.shape[0], dtype=m0.dtype) + V0 @ T)
    gaussian = -0.5 * logdet + h @ m0 - 0.5 * m0 @ T @ m0 + 0.5 * r @ V @ r
    return factors + 0.5 * (s**2 / S - jnp.log(S)) + gaussian


def tilted_moments(cavity_mean, cavity_cov, label, max_iter=100, tol=1e-10):
    """Normaliser and moments of p̂(f) ∝ N(f | m, V) p(y = label | f) by the inner EP of nested EP.

    **Arguments:**

    - `cavity_mean` ``(C,)``, `cavity_cov` ``(C, C)`` (positive definite): m and V; `label`: an int y.
    - `max_iter`, `tol`: at most ``max_iter`` sequential sweeps over the C − 1 probit factors, until every
      factor's moment-matching residual is ≤ ``tol``.

    **Returns:** ``(log_z, mean, cov, converged)``: EP's log ∫ N(f | m, V) p(y | f) df (an orthant probability,
    not exact), tilted mean ``(C,)`` and covariance ``(C, C)``. O(C⁴) a sweep; pure, so ``jax.vmap`` it."""
    m0 = jnp.asarray(cavity_mean)
    V0 = jnp.asarray(cavity_cov, m0.dtype)
    C = m0.shape[0]
    onehot = jax.nn.one_hot(label, C, dtype=m0.dtype)
    tau = nu = jnp.zeros_like(m0)

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


class _Posterior(NamedTuple):
    mean: jax.Array  # (C, N)
    alpha: jax.Array  # K⁻¹ mean, (C, N)
    site_cov: jax.Array  # (N, C, C): the C × C block of Σ at each input
    E: jax.Array  # (C, N, N)
    m_factor: Primal  # M = Σ_c E_c, (N, N), factorised
    logdet: jax.Array  # log det(I + K W) + Σ_i log S_i = Σ_c log det B_c + log det M


def _side_by_side(P):
    """(C, N, T) → (N, C·T): the blocks P_c next to each other, for one triangular solve."""
    return jnp.moveaxis(P, 0, 1).reshape(P.shape[1], -1)


def _blocks(m_factor, cross, b, diag):
    """The C × C blocks diag_c(k_c** − k_c*ᵀE_c k_c*) + (E k_*)ᵀM⁻¹(E k_*) of Σ (or the predictive) at T points,
    ``(T, C, C)``, from ``cross`` k_c* and ``b`` = E_c k_c*, both ``(C, N, T)``, and ``diag`` k_c** ``(C, T)``."""
    C, n, t = cross.shape
    g = m_factor.half_solve(_side_by_side(b)).reshape(n, C, t)
    own = diag - jnp.sum(cross * b, axis=1)
    return jax.vmap(jnp.diag)(own.T) + jnp.einsum("kct,kdt->tcd", g, g)


def _class_factors(Kc, pic):
    """One class's log det(I + D½KD½), E = (K + D⁻¹)⁻¹ and E K."""
    sites = SiteForm.of(Kc, pic)
    E = sites.sites_solve(jnp.eye(Kc.shape[0], dtype=Kc.dtype))
    E = 0.5 * (E + E.T)
    return sites.logdet(), E, E @ Kc


def _posterior(K, pi, h):
    """q(f) = N(Σh, Σ), Σ = (K⁻¹ + D − D R S⁻¹ RᵀD)⁻¹, from K ``(C, N, N)``, π and h ``(C, N)``."""
    # One class at a time: XLA's batched CPU Cholesky and triangular solves are slower than a loop.
    logdet_b, E, P = (jnp.stack(x) for x in zip(*[_class_factors(K[c], pi[c]) for c in range(K.shape[0])]))
    M = Primal.of(jnp.sum(E, 0))
    e = jnp.einsum("cnm,cm->cn", E, jnp.einsum("cnm,cm->cn", K, h))
    g = M.solve(jnp.sum(e, 0))
    alpha = h - e + E @ g
    mean = jnp.einsum("cnm,cm->cn", K, alpha)
    site_cov = _blocks(M, K, P, jnp.diagonal(K, axis1=-2, axis2=-1))
    return _Posterior(mean, alpha, site_cov, E, M, jnp.sum(logdet_b) + M.logdet())


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


class NestedEPState(eqx.Module):
    """The State of `NestedEP`: the inner sites exp(−½ τ_ij z² + ν_ij z), ``tau`` and ``nu`` ``(N, C)``, 0 at
    each input's own class. Zero sites are the cold start (q = the prior)."""

    tau: jax.Array
    nu: jax.Array


class NestedEPInfo(eqx.Module):
    """``post.diagnostics.info`` of `NestedEP`: `damping`, δ at the end; `skipped`, factor updates left out
    in the last iteration (improper cavity or non-finite moments)."""

    damping: jax.Array
    skipped: jax.Array

    def __repr__(self):
        if not _checks.is_concrete(self):
            return super().__repr__()
        return f"NestedEPInfo(damping={float(self.damping):.6g}, skipped={int(self.skipped)})"


class NestedEPFactor(AbstractFactor):
    """Nested EP's covariance Σ = K − KEK + KER M⁻¹ RᵀEK, C·N × C·N, never stored.

    Fields: ``prior_cov`` K_c and ``E``, ``(C, N, N)``; ``m_factor``, M as a `Primal` ``(N, N)``.
    ``variances()`` costs O(C N²); the other methods form Σ."""

    prior_cov: jax.Array
    E: jax.Array
    m_factor: Primal

    @property
    def dim(self) -> int:
        return self.E.shape[0] * self.E.shape[1]

    def _cross(self):
        """G ``(N, C·N)`` with GᵀG = [E_1K_1 … E_CK_C]ᵀ M⁻¹ [E_1K_1 … E_CK_C], the low-rank term."""
        return self.m_factor.half_solve(_side_by_side(self.E @ self.prior_cov))

    def dense(self):
        K, G = self.prior_cov, self._cross()
        return block_diag(*(K - K @ self.E @ K)) + G.T @ G

    def variances(self):
        K = self.prior_cov
        own = jnp.diagonal(K, axis1=-2, axis2=-1) - jnp.sum(K * (self.E @ K), axis=-2)  # diag(K − KEK), (C, N)
        return own.reshape(-1) + jnp.sum(self._cross() ** 2, axis=0)

    def projected_variances(self, projection):
        return jnp.sum(projection.mv(self.cholesky().T) ** 2, axis=-1)

    def logdet(self):
        return 2 * jnp.sum(jnp.log(jnp.diag(self.cholesky())))

    def canonical(self):
        return self

    def preconditioner(self, curvature):
        raise ValueError("NestedEPFactor: nested EP's covariance is not a family a solver optimises.")


class NestedEPPosterior(Posterior):
    """A `vj.Posterior` of nested EP: q(f) = N(mean, Σ) over the class-major f, ``(C·N,)``, ``factor`` a
    `NestedEPFactor`, ``log_z`` the EP energy (not a bound). Also `site_cov` ``(N, C, C)``, the C × C block of
    Σ at each input, and `alpha` ``(C, N)`` = K⁻¹ mean (for the predictive means, R&W Alg. 3.4)."""

    site_cov: jax.Array
    alpha: jax.Array

    def __init__(self, mean, factor, log_z, diagnostics, model, state, site_cov, alpha):
        super().__init__(mean, factor, log_z, diagnostics, model, bound_claim=False, state=state)
        self.site_cov = site_cov
        self.alpha = alpha

    @property
    def class_means(self):
        """The posterior mean of f as ``(C, N)``: row c is f_c at the training inputs."""
        return self.mean.reshape(self.alpha.shape)


class _Loop(NamedTuple):
    tau: jax.Array
    nu: jax.Array
    residual: jax.Array
    damping: jax.Array
    trace: jax.Array


_MIN_DAMPING = 0.05  # δ is halved when the residual rises, down to this (or the method's δ, if smaller)


def energy(state: NestedEPState, model: MulticlassModel):
    """The EP energy at the sites ``state`` (`NestedEP`'s ``log_z``); stationary in the sites at a fixed point,
    so with a converged ``post.state`` its ``jax.grad`` in the model's kernels is d log Z_EP / dθ."""
    onehot = model.onehot()
    return _evaluate(model.prior_covariances(), state.tau * (1 - onehot), state.nu * (1 - onehot), onehot)[2]


class NestedEP(MulticlassMethod):
    """Nested EP for the multinomial-probit multi-class GP (Riihimäki, Jylänki & Vehtari 2013): a
    `NestedEPPosterior`, in O(C N³) an outer iteration.

    **Arguments:**

    - `damping`: the initial δ ∈ (0, 1] of the parallel site updates; halved, down to min(0.05, δ), whenever
      the largest moment-matching residual rises.
    - `tol`: converged when max_ij |m̂_ij − m_ij|/√v_ij + |log(v̂_ij/v_ij)| ≤ ``tol`` (the energy's error is
      of order tol²).
    - `max_iter`: most outer iterations (static: it sizes the objective trace).

    **Diagnostics:** `stationarity` the largest residual, `grad_norm` max |∂ log_z / ∂(τ, ν)| (0 at a fixed
    point), `objective_trace` the energy at each iteration, `info` a `NestedEPInfo`.
    """

    damping: float = 0.7
    tol: float = 1e-8
    max_iter: int = eqx.field(static=True, default=500)

    def __check_init__(self):
        if _checks.is_concrete(self.damping) and not (0 < self.damping <= 1):
            raise ValueError(f"NestedEP: `damping` must lie in (0, 1], got {self.damping!r}.")
        _checks.check_positive("tol", self.tol, "NestedEP")
        _checks.integer("max_iter", self.max_iter, "NestedEP")

    def init_state(self, model: MulticlassModel) -> NestedEPState:
        zeros = jnp.zeros((model.num_inputs, model.num_classes), model.dtype)
        return NestedEPState(zeros, zeros)

    def from_gaussian(self, model, mean, factor):
        raise ValueError("NestedEP: its sites are not a function of another method's Gaussian; start from None "
                         "(zero sites), a NestedEP posterior of a model of the same shapes, or its post.state.")

    def is_state(self, model, state) -> bool:
        shape = (model.num_inputs, model.num_classes)
        return isinstance(state, NestedEPState) and jnp.shape(state.tau) == shape and jnp.shape(state.nu) == shape

    def solve(self, model: MulticlassModel, state: NestedEPState) -> NestedEPPosterior:
        """Nested EP on stop_gradient(K), then the energy with the live K at the frozen final sites."""
        K = model.prior_covariances()
        frozen = jax.lax.stop_gradient(K)
        onehot = jax.lax.stop_gradient(model.onehot())
        tau, nu = jax.lax.stop_gradient((state.tau * (1 - onehot), state.nu * (1 - onehot)))
        floor = jnp.minimum(_MIN_DAMPING, self.damping)
        trace = jnp.full((self.max_iter + 1,), jnp.nan, K.dtype)

        def step(k, s: _Loop) -> _Loop:
            _, update, value = _evaluate(frozen, s.tau, s.nu, onehot)
            residual = jnp.max(update.residual)
            delta = jnp.where(residual > s.residual, jnp.maximum(0.5 * s.damping, floor), s.damping)
            tau, nu = (old + delta * (new - old) for old, new in ((s.tau, update.tau), (s.nu, update.nu)))
            return _Loop(tau, nu, residual, delta, s.trace.at[k].set(value))

        init = _Loop(tau, nu, jnp.asarray(jnp.inf, K.dtype), jnp.asarray(self.damping, K.dtype), trace)
        loop, iterations = iterate(step, init, self.max_iter, lambda _, s: ~(s.residual > self.tol))  # NaN stops
        sites = jax.lax.stop_gradient((loop.tau, loop.nu))
        post, update, log_z = _evaluate(K, *sites, onehot)
        post = jax.lax.stop_gradient(post)
        # The energy's gradient in the active sites (the own-class entries are no parameters): ~0 at a fixed point.
        gradient = jax.grad(lambda t, n: _evaluate(frozen, t, n, onehot)[2], argnums=(0, 1))(*sites)
        grad_norm = jnp.max(jnp.abs(jnp.where(onehot == 0, jnp.stack(gradient), 0.0)))
        diagnostics = Diagnostics(
            iterations=iterations, status=Status.of(loop.residual <= self.tol, value=log_z),
            stationarity=jnp.max(update.residual),
            grad_norm=grad_norm, objective_trace=loop.trace.at[iterations].set(jax.lax.stop_gradient(log_z)),
            num_value_evals=iterations + 1, num_grad_evals=jnp.asarray(1), num_hvp_evals=jnp.asarray(0),
            method="NestedEP", solver="parallel", info=NestedEPInfo(loop.damping, update.skipped))
        factor = NestedEPFactor(frozen, post.E, post.m_factor)
        return NestedEPPosterior(post.mean.reshape(-1), factor, log_z, diagnostics, model, NestedEPState(*sites),
                                 post.site_cov, post.alpha)


def predict(post: NestedEPPosterior, X_test):
    """Predictive latent means ``(T, C)`` and covariances ``(T, C, C)`` at ``X_test`` ``(T, d)`` (R&W Alg. 3.4):
    μ_*c = k_c*ᵀ α_c and Σ_* = diag_c(k_c** − k_c*ᵀ E_c k_c*) + (E k_*)ᵀ M⁻¹ (E k_*)."""
    return _predict(post, X_test, "vj.gp.multiclass.predict")


def _predict(post, X_test, owner):
    if not isinstance(post, NestedEPPosterior):
        raise ValueError(f"{owner}: `post` must be the NestedEPPosterior of vj.infer(vj.gp.multiclass.model(...), "
                         f"vj.gp.multiclass.NestedEP()), got {type(post).__name__}.")
    model, factor = post.model, post.factor
    X_test = _checks.as_inputs(X_test, owner)
    cross = jnp.stack([k(model.X, X_test) for k in model.kernels])  # (C, N, T)
    diag = jnp.stack([k.diagonal(X_test) for k in model.kernels])  # (C, T)
    mean = jnp.einsum("cnt,cn->tc", cross, post.alpha)
    return mean, _blocks(factor.m_factor, cross, factor.E @ cross, diag)


@eqx.filter_jit
@functools.partial(jax.vmap, in_axes=(0, 0, None))
def _log_proba_quadrature(mean, cov, quadrature):
    """log p(y = c) = log P(g_c ≥ g_j ∀j), g = f + ε, by a 1-D rule in g_c with each f_j | g_c Gaussian."""
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


def predict_proba(post: NestedEPPosterior, X_test, rule="ep", quadrature=GaussHermite(64)):
    """Class probabilities p(y_* = c | x_*, data) at ``X_test`` ``(T, d)``: ``(T, C)``, rows summing to one.

    The predictive N(μ_*, Σ_*) (`predict`) against the likelihood, renormalised, by ``rule``: ``"ep"``, the
    inner-EP estimate (`tilted_moments`, every between-class correlation kept), or ``"quadrature"``, with
    g = f_* + ε, P(g_c ≥ g_j ∀j) by ``quadrature`` in g_c, each f_j | g_c Gaussian (exact for diagonal Σ_*).
    """
    owner = "vj.gp.multiclass.predict_proba"
    if rule not in RULES:
        raise ValueError(f"{owner}: `rule` must be 'ep' (inner EP on the predictive) or 'quadrature' "
                         f"(a 1-D rule), got {rule!r}.")
    mean, cov = _predict(post, X_test, owner)
    log_p = _log_proba_ep(mean, cov) if rule == "ep" else _log_proba_quadrature(mean, cov, quadrature)
    return jax.nn.softmax(log_p, axis=-1)


@jax.jit
def _log_proba_ep(mean, cov):
    classes = jnp.arange(mean.shape[1])
    return jax.vmap(lambda m, V: jax.vmap(lambda c: tilted_moments(m, V, c)[0])(classes))(mean, cov)
