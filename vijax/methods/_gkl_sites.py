"""G-KL for GP-type models by coordinate ascent in the site form (Khan, Mohamed & Murphy 2012).

For a dense prior N(μ, K) and sites on single coordinates, x_gn = s_gn w_n + b_gn
(`_gaussian.diagonal_form`), the G-KL bound depends on q = N(m, V) only through m, diag V and the
prior terms, and at its maximum (thesis eq. 3.48)

.. math::

    V^{-1} = K^{-1} + \\mathrm{diag}(\\lambda), \\qquad \\lambda = -2\\, \\partial F / \\partial \\operatorname{diag} V,
    \\qquad F(m, v) = \\sum_{g,n} \\langle \\log \\varphi_{gn}(x) \\rangle_{N(s m_n + b, s^2 v_n)} .

So q is searched over (m, λ), D + D numbers instead of D(D+3)/2. With m = μ + Kα, B = I + Λ½KΛ½,
tr(K⁻¹V) = D − Σ λ_n v_n and log det(VK⁻¹) = −log det B, the bound is

.. math::

    \\mathcal B(m, \\lambda) = \\tfrac12\\big[-\\log\\det B + \\textstyle\\sum_n \\lambda_n v_n - \\alpha^\\top (m - \\mu)\\big] + F(m, v),

computable from one Cholesky of B (`integrate_diagonal`). Each iteration

1. takes a Newton step in m for fixed v (the concave problem of thesis eq. 3.68; the Newton model is
   itself a Gaussian integral, with W = −∂²F/∂m²), with backtracking;
2. moves λ towards the fixed point λ* = −2∂F/∂v (thesis eq. 3.61, all coordinates at once), with
   backtracking: along Δλ = λ* − λ the bound's slope is ½ Δλᵀ(V∘V)Δλ ≥ 0 (V∘V is positive
   semi-definite), so a short enough step always raises it.

Every accepted step raises the bound (a monotone ascent, like thesis Alg. 3, which updates one
coordinate at a time with rank-one updates; the parallel form costs one Cholesky per step and
vectorises). For log-concave sites λ* ≥ 0, which keeps B positive definite. Used by `GKL` on such
models; the result is the same optimum as the Newton-CG fit of the whitened Cholesky factor.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from ..covariance._dense import _reversed_cholesky
from ..posterior import Diagnostics
from ..quadrature import elementwise_derivatives, safe_sqrt
from ._gaussian import diagonal_form, integrate_diagonal

__all__ = ["applies", "fit"]

_MAX_HALVINGS = 20
_ROUNDING = 4  # a rise of B below this many ulps is no progress


def applies(model) -> bool:
    """True for a dense prior with single-coordinate sites whose potentials are all log-concave."""
    return diagonal_form(model) is not None and all(bool(g.potential.log_concave) for g in model.sites)


class _State(NamedTuple):
    m: jax.Array
    alpha: jax.Array  # K⁻¹(m − μ)
    lam: jax.Array
    var: jax.Array  # diag V, V = (K⁻¹ + diag λ)⁻¹
    logdet_b: jax.Array
    value: jax.Array
    k: jax.Array
    trace: jax.Array
    evals: jax.Array
    stalled: jax.Array
    stationarity: jax.Array


def _site_terms(model, quadrature, scales):
    """F's terms by coordinate, f_n(m_n, v_n): F(m, v) = Σ_n f_n, the sites' expected log-potentials."""
    def terms(m, v):
        total = 0.0
        for s, group in zip(scales, model.sites):
            x = s * m + jnp.broadcast_to(group.offset, s.shape)
            total = total + group.potential.expected_log_phi(x, safe_sqrt(s**2 * v), quadrature)
        return total

    return terms


def _var_gradient(terms, m, v):
    # Each f_n depends on (m_n, v_n) only, so forward mode with a unit tangent gives all of ∂F/∂v.
    return jax.jvp(lambda v: terms(m, v), (v,), (jnp.ones_like(v),))[1]


def fixed_point_precisions(model, mean, variances, quadrature):
    """λ* = max(−2 ∂F/∂v, 0) at q's marginals (``mean``, ``variances``): the site precisions that a
    q with these marginals implies (thesis eq. 3.61), where a warm start from any Gaussian begins."""
    _, _, scales = diagonal_form(model)
    return jnp.maximum(-2.0 * _var_gradient(_site_terms(model, quadrature, scales), mean, variances), 0.0)


def is_state(state, model) -> bool:
    """Whether ``state`` (a `Posterior.state`) is site-form λ for ``model``."""
    return isinstance(state, jax.Array) and state.shape == (model.dim,)


def fit(model, quadrature, max_iter: int, tol: float, mean, lam):
    """``(mean, λ, C, diagnostics)`` with q = N(mean, CᵀC) the G-KL optimum (C upper-triangular) and
    V⁻¹ = K⁻¹ + diag λ, by ascent from (``mean``, ``lam``). Where the bound is not finite there, λ is
    raised (λ ← 4λ + 3/K_nn, about a quarter of each variance) until it is."""
    K, mu, scales = diagonal_form(model)
    dtype = K.dtype
    terms = _site_terms(model, quadrature, scales)
    expected = lambda m, v: jnp.sum(terms(m, v))
    ones = jnp.ones_like(mu)

    def mean_gradient(m, v):
        return jax.jvp(lambda m: terms(m, v), (m,), (ones,))[1]

    def bound(m, alpha, lam, var, logdet_b):
        return 0.5 * (-logdet_b + lam @ var - alpha @ (m - mu)) + expected(m, var)

    def gradient_gaps(m, alpha, lam, var):
        """|∂B/∂m| = |∂F/∂m − α| and |∂B/∂v| = ½|λ − λ*|, λ* = −2 ∂F/∂v."""
        return jnp.abs(mean_gradient(m, var) - alpha), 0.5 * jnp.abs(lam + 2.0 * _var_gradient(terms, m, var))

    def stationarity(m, alpha, lam, var):
        """The gradient in units of q's marginals: max_n |∂B/∂m_n|·√v_n, |∂B/∂v_n|·v_n (the change of
        the bound a unit step in the marginal's own scale would make; a site at the kink of a Laplace
        potential has a tiny v_n, and |∂B/∂v_n| of order 1e-3 there is nothing)."""
        d_m, d_v = gradient_gaps(m, alpha, lam, var)
        return jnp.maximum(jnp.max(d_m * jnp.sqrt(var)), jnp.max(d_v * var))

    def covariance(lam):
        out = integrate_diagonal(K, mu, lam, jnp.zeros_like(mu))
        return out.variances, out.logdet_b

    def backtrack(value0, trial):
        """The first t in 1, ½, ¼, … whose ``trial(t)`` (a (value, state) pair) does not lower value0
        beyond its rounding (near the optimum a full step changes B by less than that, either way)."""
        floor = value0 - _ROUNDING * jnp.finfo(dtype).eps * jnp.abs(value0)

        def cond(c):
            t, value, _, n = c
            return ~(value >= floor) & (n < _MAX_HALVINGS)

        def body(c):
            t, _, _, n = c
            value, state = trial(0.5 * t)
            return 0.5 * t, value, state, n + 1

        value, state = trial(jnp.ones((), dtype))
        t, value, state, n = jax.lax.while_loop(cond, body, (jnp.ones((), dtype), value, state, jnp.array(1)))
        return value >= floor, value, state, n

    def step(st: _State) -> _State:
        # 1. Newton in m for fixed v: maximise −½(m − μ)ᵀK⁻¹(m − μ) + F(m, v) through its quadratic model.
        _, g_m, curvature = elementwise_derivatives(lambda m: terms(m, st.var), st.m)
        omega = jnp.maximum(-curvature, 0.0)
        newton = integrate_diagonal(K, mu, omega, g_m + omega * st.m, variances=False)

        def mean_trial(t):
            m, alpha = st.m + t * (newton.mean - st.m), st.alpha + t * (newton.alpha - st.alpha)
            return bound(m, alpha, st.lam, st.var, st.logdet_b), (m, alpha)

        ok, value, (m, alpha), n_m = backtrack(st.value, mean_trial)
        m, alpha = jnp.where(ok, m, st.m), jnp.where(ok, alpha, st.alpha)
        value = jnp.where(ok, value, st.value)

        # 2. λ towards its fixed point λ* = −2 ∂F/∂v for fixed m.
        g_v = _var_gradient(terms, m, st.var)
        direction = jnp.maximum(-2.0 * g_v, 0.0) - st.lam

        def lam_trial(t):
            lam = st.lam + t * direction
            var, logdet_b = covariance(lam)
            return bound(m, alpha, lam, var, logdet_b), (lam, var, logdet_b)

        ok_l, new_value, (lam, var, logdet_b), n_l = backtrack(value, lam_trial)
        lam = jnp.where(ok_l, lam, st.lam)
        var, logdet_b = jnp.where(ok_l, var, st.var), jnp.where(ok_l, logdet_b, st.logdet_b)
        new_value = jnp.where(ok_l, new_value, value)
        k = st.k + 1
        # No rise beyond the rounding of B: no step can make progress that B would show.
        stalled = new_value - st.value <= _ROUNDING * jnp.finfo(dtype).eps * jnp.abs(new_value)
        return _State(m, alpha, lam, var, logdet_b, new_value, k, st.trace.at[k].set(new_value),
                      st.evals + n_m + n_l, stalled, stationarity(m, alpha, lam, var))

    L = model.prior.chol.astype(dtype)
    alpha = jax.scipy.linalg.cho_solve((L, True), mean - mu)

    def start(lam):
        var, logdet_b = covariance(lam)
        return lam, var, logdet_b, bound(mean, alpha, lam, var, logdet_b)

    def raise_precisions(state):
        (lam, *_), k = state
        return start(4.0 * lam + 3.0 / jnp.diag(K)), k + 1

    first = start(jnp.maximum(lam, 0.0))
    (lam, var, logdet_b, value), n_start = jax.lax.while_loop(
        lambda s: ~jnp.isfinite(s[0][3]) & (s[1] < _MAX_HALVINGS), raise_precisions, (first, jnp.array(0)))
    trace = jnp.full((max_iter + 1,), jnp.nan, dtype).at[0].set(value)
    st = _State(mean, alpha, lam, var, logdet_b, value, jnp.array(0), trace, 1 + n_start, jnp.array(False),
                stationarity(mean, alpha, lam, var))
    st = jax.lax.while_loop(lambda s: (s.k < max_iter) & ~s.stalled & ~(s.stationarity <= tol), step, st)

    d_m, d_v = gradient_gaps(st.m, st.alpha, st.lam, st.var)
    grad_norm = jnp.maximum(jnp.max(d_m), jnp.max(d_v))
    # q's covariance (once): V = L(I + LᵀΛL)⁻¹Lᵀ = CᵀC with C = R⁻¹Lᵀ, I + LᵀΛL = RRᵀ (whitened, as in
    # `integrate`, so K is never inverted).
    G = jnp.sqrt(st.lam)[:, None] * L
    R = _reversed_cholesky(jnp.eye(L.shape[0], dtype=dtype) + G.T @ G)
    C = solve_triangular(R, L.T, lower=False)
    # A run the rounding of B stopped has converged where the bound is flat to √tol in q's units.
    converged = jnp.isfinite(st.value) & (st.stationarity <= jnp.where(st.stalled, jnp.sqrt(tol), tol))
    diagnostics = Diagnostics(st.k, converged, grad_norm, st.trace, st.evals, st.k, jnp.array(0), "GKL",
                              "site-form coordinate ascent", stationarity=st.stationarity)
    return st.m, st.lam, C, diagnostics
