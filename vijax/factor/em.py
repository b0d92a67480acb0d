"""Variational EM for latent Gaussian factor models: vmapped E-steps, M-steps, the EM driver.

**E-step.** For each data point, q(z_n) = N(m_n, V_n) maximises L_n (thesis eq. 3.21). With g = ∂f̲/∂m̃
and G = ∂f̲/∂Ṽ summed over the point's observed columns, one step is

    P* = Σ⁻¹ − 2 Σ_d W_dᵀ G_d W_d,        P ← (1 − ρ) P + ρ P*,        m ← m + ρ P⁻¹ (−Σ⁻¹(m − μ) + Σ_d W_dᵀ g_d)

(natural-gradient ascent in q's natural parameters). At ρ = 1 it is Newton's method in m with the
covariance at its fixed point: for a bound that is a Gaussian expectation of a fixed function
(piecewise, Gaussian, Poisson, Jaakkola at fixed ξ) the Hessian in m̃ is 2G (Price's theorem), and for
quadratic bounds one step is the thesis's closed-form E-step (Algs. 2, 4, 5). A step that would lower
L_n is rejected and ρ halved; an accepted one doubles ρ (up to 1), so every L_n rises monotonically.
A point stops once q is within ``tol`` of its fixed point, in units of q's own marginal standard
deviations: accepted steps move m and diag V by Δ_k = max_i(|Δm_i|/√V_ii, |ΔV_ii|/V_ii), and the
distance still to go is extrapolated from the last two as Δ_k r/(1 − r), r = Δ_k/Δ_{k−1}
(`vj.solvers.extrapolated_distance`: the plain steps converge linearly, slowly where the likelihood
dominates the prior), or after ``max_iter`` steps. (A test on the change of L_n would stop with q
only √tol from its optimum: L_n is stationary there.)
The step is written for one point and mapped over all of them with `jax.vmap` inside one `jax.jit`.
When every likelihood has constant curvature (Gaussian, Böhning) and no entry is missing, P* is the
same for every point: V is computed once and only the means iterate (the shared-covariance
shortcut of thesis Alg. 5).

**M-step.** μ and Σ in closed form (eq. 3.37; the graphical lasso when penalised); each column's
(W_d, w_0d) by steps with the curvature Σ_n Λ_dn ⊗ ⟨x̃x̃ᵀ⟩, x̃ = (z_n, 1), Λ = −2G — for quadratic
bounds the closed forms (3.42–3.43, 4.14–4.15, 4.30–4.31, 5.28–5.29) — backtracked per column so the
bound never falls; then each likelihood's own parameters (`update`).
"""

from __future__ import annotations

import time
import warnings
from typing import Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from jax.typing import ArrayLike
from .._linalg import backtrack, select
from .._keywords import renamed
from ..posterior import Diagnostics
from ..solvers import extrapolated_distance, iterate
from .model import FactorModel, Prior, block_data, check_data, check_weights, neg_kl, site_terms

__all__ = ["Posteriors", "FactorFit", "e_step", "m_step", "fit", "initial_posteriors"]

_HALVINGS = 30
_ROUNDING = 10  # a step that lowers L_n by less than this many ulps is rounding, not a worse q


class Posteriors(NamedTuple):
    """The per-point Gaussians q(z_n) = N(mean[n], cov[n]) and their bounds L_n.

    ``precision`` = cov⁻¹; ``iterations`` and ``converged`` report the last E-step per point.
    """

    mean: jax.Array        # (N, L)
    cov: jax.Array         # (N, L, L)
    precision: jax.Array   # (N, L, L)
    bound: jax.Array       # (N,)
    iterations: jax.Array  # (N,)
    converged: jax.Array   # (N,)


def initial_posteriors(model: FactorModel, num_points: int) -> Posteriors:
    """q(z_n) = prior for every point."""
    n = num_points
    prior = Prior.of(model)
    tile = lambda a: jnp.broadcast_to(a, (n,) + a.shape)
    return Posteriors(tile(model.mean), tile(model.cov), tile(prior.precision), jnp.full(n, -jnp.inf, model.mean.dtype),
                      jnp.zeros(n, jnp.int32), jnp.zeros(n, bool))


def _logdet_from_precision(chol):
    return -2 * jnp.sum(jnp.log(jnp.diagonal(chol)))


def _psd(h):
    """Per-column curvature matrices (D_b, K, K) clipped to be positive semi-definite (round-off in a
    concave bound's curvature, or a bound that is not concave in m̃, must not give an indefinite
    step matrix)."""
    if h.shape[-1] == 1:
        return jnp.maximum(h, 0.0)
    w, q = jnp.linalg.eigh(0.5 * (h + jnp.swapaxes(h, -1, -2)))
    return jnp.einsum("dij,dj,dkj->dik", q, jnp.maximum(w, 0.0), q)


def _mean_curvatures(model, y, mask, preds):
    """Each block's −∂²f̲/∂m̃² per column (D_b, K, K) at fixed Ṽ. Columns are independent, so K
    forward-over-reverse products with the k-th unit vector in every column give all columns at once."""
    out = []
    for i in range(len(model.blocks)):
        sites = lambda m, i=i: site_terms(model, y, mask, preds[:i] + ((m, preds[i][1]),) + preds[i + 1:])
        grad_m = jax.grad(sites)
        m = preds[i][0]
        k = m.shape[-1]
        units = jnp.broadcast_to(jnp.eye(k, dtype=m.dtype)[:, None, :], (k,) + m.shape)
        cols = jax.vmap(lambda t: jax.jvp(grad_m, (m,), (t,))[1])(units)   # (K, D_b, K): [k, d, j] = H_d[j, k]
        out.append(_psd(-jnp.transpose(cols, (1, 2, 0))))
    return out


def _point_step_parts(model, prior, y, mask, mean, cov, logdet, newton):
    """(L_n, P*, gradient in m, Newton matrix or None) at q = N(mean, cov) for one point: one
    value-and-gradient of the sites (and, with ``newton``, their curvature in m̃)."""
    preds = tuple(b.predictors(mean, cov) for b in model.blocks)
    sites, grads = jax.value_and_grad(lambda p: site_terms(model, y, mask, p))(preds)
    p_star, grad = prior.precision, -prior.precision @ (mean - prior.mean)
    for block, (gm, gv) in zip(model.blocks, grads):
        lam = -(gv + jnp.swapaxes(gv, -1, -2))
        if block.likelihood.num_predictors == 1:
            lam = _psd(lam)  # a concave bound has G ≤ 0; guard against round-off
        p_star = p_star + jnp.einsum("dkl,dkj,djm->lm", block.loadings, lam, block.loadings)
        grad = grad + jnp.einsum("dkl,dk->l", block.loadings, gm)
    hessian = None  # the plain step uses P* itself
    if newton:
        hessian = prior.precision
        for block, h in zip(model.blocks, _mean_curvatures(model, y, mask, preds)):
            hessian = hessian + jnp.einsum("dkl,dkj,djm->lm", block.loadings, h, block.loadings)
        hessian = 0.5 * (hessian + hessian.T)
    return neg_kl(prior, mean, cov, logdet) + sites, 0.5 * (p_star + p_star.T), grad, hessian


class _PointState(NamedTuple):
    mean: jax.Array
    cov: jax.Array
    precision: jax.Array
    logdet: jax.Array
    bound: jax.Array
    target: jax.Array  # P* at (mean, cov)
    grad: jax.Array    # ∂L_n/∂m at (mean, cov)
    hessian: jax.Array | None  # −∂²L_n/∂m² at (mean, cov) with ``newton``, else None
    rho: jax.Array
    change: jax.Array  # Δ of the last accepted step
    previous: jax.Array  # Δ of the one before
    done: jax.Array


def _point_e_step(model, prior, y, mask, mean, cov, precision, shared, max_iter, tol, newton):
    """Monotone natural-gradient ascent of L_n for one point (``shared``: a fixed (V, P, log|V|) or None).

    Each iteration evaluates the sites once, with their gradient, at the proposed q: if the step is
    accepted that gradient drives the next step, so rejected steps are the only wasted work.
    """
    eye = jnp.eye(model.latent_dim, dtype=mean.dtype)
    floor = 1e3 * float(jnp.finfo(mean.dtype).eps)  # steps lost in rounding (float32's resolution in float32)
    if shared is None:
        logdet0 = _logdet_from_precision(jnp.linalg.cholesky(precision))
    else:
        cov, precision, logdet0 = shared
    parts = lambda m, v, ld: _point_step_parts(model, prior, y, mask, m, v, ld, newton)
    inf = jnp.asarray(jnp.inf, mean.dtype)
    state = _PointState(mean, cov, precision, logdet0, *parts(mean, cov, logdet0),
                        jnp.asarray(1.0, mean.dtype), inf, inf, jnp.asarray(False))

    def body(_, s: _PointState) -> _PointState:
        if shared is None:
            p_new = (1 - s.rho) * s.precision + s.rho * s.target
            chol = jnp.linalg.cholesky(p_new)
            v_new = jax.scipy.linalg.cho_solve((chol, True), eye)
            v_new, logdet = 0.5 * (v_new + v_new.T), _logdet_from_precision(chol)
        else:
            p_new, v_new, logdet = s.precision, s.cov, s.logdet
        if newton:
            m_new = s.mean + s.rho * jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(s.hessian), True), s.grad)
        else:
            m_new = s.mean + s.rho * (v_new @ s.grad)
        value, target, grad, hessian = parts(m_new, v_new, logdet)
        # A step that loses less than the rounding of L_n is not a worse q.
        accept = jnp.isfinite(value) & (value >= s.bound - _ROUNDING * jnp.finfo(value.dtype).eps * jnp.abs(s.bound))
        sd = jnp.sqrt(jnp.diagonal(s.cov))
        change = jnp.maximum(jnp.max(jnp.abs(m_new - s.mean) / sd), jnp.max(jnp.abs(jnp.diagonal(v_new - s.cov)) / sd**2))
        change, previous = jnp.where(accept, change, s.change), jnp.where(accept, s.change, s.previous)
        converged = accept & (extrapolated_distance(change, previous, floor) <= tol)
        stalled = (~accept) & (s.rho <= 2.0**-_HALVINGS)
        pick = lambda a, b: select(accept, a, b)  # (None for hessian)
        return _PointState(pick(m_new, s.mean), pick(v_new, s.cov), pick(p_new, s.precision), pick(logdet, s.logdet),
                           pick(value, s.bound), pick(target, s.target), pick(grad, s.grad), pick(hessian, s.hessian),
                           jnp.where(accept, jnp.minimum(2 * s.rho, 1.0), 0.5 * s.rho), change, previous,
                           converged | stalled)

    out, iterations = iterate(body, state, max_iter, lambda _, s: s.done)
    converged = extrapolated_distance(out.change, out.previous, floor) <= tol
    return out.mean, out.cov, out.precision, out.bound, iterations, converged


def _shared_covariance(model: FactorModel, prior: Prior):
    """V, P and log|V| for constant-curvature likelihoods: P = Σ⁻¹ + Σ_d W_dᵀ Λ_d W_d (thesis 4.28, 5.26)."""
    p = prior.precision
    for block in model.blocks:
        lam = block.likelihood.curvature(len(block.columns), p.dtype)
        p = p + jnp.einsum("dkl,dkj,djm->lm", block.loadings, lam, block.loadings)
    p = 0.5 * (p + p.T)
    chol = jnp.linalg.cholesky(p)
    v = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(p.shape[0], dtype=p.dtype))
    return 0.5 * (v + v.T), p, _logdet_from_precision(chol)


@eqx.filter_jit
def e_step(model: FactorModel, Y, mask, q: Posteriors, max_iter: int = 500, tol: float = 1e-9,
           complete: bool = False, newton: bool = False) -> Posteriors:
    """Fit every q(z_n), warm-started at ``q``, by `jax.vmap` of the per-point ascent.

    ``complete`` (static) says no entry is missing, which allows the shared-covariance shortcut.
    ``newton`` (static) steps the means with the bound's own curvature in m̃, −∂²f̲/∂m̃², instead of
    the fixed-point curvature −2∂f̲/∂Ṽ. The two agree for bounds that are Gaussian expectations of a
    fixed function (piecewise, Poisson, Gaussian); for bounds with optimised local parameters
    (Böhning, Jaakkola, log, tilted) the fixed-point curvature is a majoriser and its steps converge
    linearly, slowly where the likelihood dominates the prior, while Newton's converge quadratically.
    It costs one more L × L factorisation per step, so it pays for large latent spaces with few
    points (`vj.gp.softmax`), not for many small ones.
    """
    prior = Prior.of(model)
    shared = _shared_covariance(model, prior) if (complete and model.shared_covariance and not newton) else None
    step = lambda y, mk, m, v, p: _point_e_step(model, prior, y, mk, m, v, p, shared, max_iter, tol, newton)
    mean, cov, precision, bound, its, done = jax.vmap(step)(Y, mask, q.mean, q.cov, q.precision)
    return Posteriors(mean, cov, precision, bound, its, done)


# ----------------------------------------------------------------------------------------------
# M-step


def _graphical_lasso(sample_cov, penalty, precision0, iterations: int = 500, rho: float = 1.0):
    """argmax_Θ log|Θ| − tr(SΘ) − λ Σ_{i≠j} |Θ_ij| by ADMM (Boyd et al. 2011, §6.5), from Θ₀."""
    eye = jnp.eye(sample_cov.shape[0], dtype=sample_cov.dtype)
    off = 1.0 - eye

    def body(_, c):
        z, u = c
        w, q = jnp.linalg.eigh(rho * (z - u) - sample_cov)
        theta = (q * ((w + jnp.sqrt(w**2 + 4 * rho)) / (2 * rho))) @ q.T
        a = theta + u
        z = jnp.where(off > 0, jnp.sign(a) * jnp.maximum(jnp.abs(a) - penalty / rho, 0.0), a)
        return z, u + theta - z

    z, u = jax.lax.fori_loop(0, iterations, body, (precision0, jnp.zeros_like(precision0)))
    w, q = jnp.linalg.eigh(rho * (z - u) - sample_cov)
    return (q * ((w + jnp.sqrt(w**2 + 4 * rho)) / (2 * rho))) @ q.T, z


def penalty_term(model: FactorModel, num_points):
    """(N/2) λ Σ_{i≠j} |Σ⁻¹_ij|, subtracted from the bound of a sparse graphical model (N: the total
    weight of the data points)."""
    if model.penalty == 0.0:
        return 0.0
    prec = Prior.of(model).precision
    off = jnp.sum(jnp.abs(prec)) - jnp.sum(jnp.abs(jnp.diagonal(prec)))
    return 0.5 * num_points * model.penalty * off


def _update_prior(model: FactorModel, q: Posteriors, weights) -> FactorModel:
    w = weights / jnp.sum(weights)
    mu = w @ q.mean
    d = q.mean - mu
    s = jnp.einsum("n,nij->ij", w, q.cov) + (d * w[:, None]).T @ d
    s = 0.5 * (s + s.T)
    if model.penalty > 0:
        precision, _ = _graphical_lasso(s, model.penalty, Prior.of(model).precision)
        chol = jnp.linalg.cholesky(0.5 * (precision + precision.T))
        s = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(s.shape[0], dtype=s.dtype))
        s = 0.5 * (s + s.T)
    return eqx.tree_at(lambda m: (m.mean, m.cov), model, (mu, s))


def _column_sums(block, Y, mask, weights, mean, cov):
    """Per-column Σ_n w_n mask f̲ of one block given every point's predictor moments m̃ (N, D_b, K), Ṽ (N, D_b, K, K)."""

    def point(y, mk, m, v):
        yb, mb = block_data(block, y, mk)
        return jnp.where(mb, block.likelihood.expected(yb, m, v), 0.0)

    return weights @ jax.vmap(point)(Y, mask, mean, cov)


def _block_values(block, Y, mask, weights, q, loadings, offsets):
    """Per-column Σ_n w_n mask f̲ of one block at loadings W, offsets w_0, shape (D_b,)."""
    blk = eqx.tree_at(lambda b: (b.loadings, b.offsets), block, (loadings, offsets))
    return _column_sums(blk, Y, mask, weights, *jax.vmap(blk.predictors)(q.mean, q.cov))


def _update_loadings(block, Y, mask, weights, q: Posteriors, steps: int):
    """Backtracked curvature steps on each column's (W_d, w_0d); never lowers a column's bound."""
    d, k, l = block.loadings.shape
    moments = jnp.concatenate([jnp.concatenate([q.cov + q.mean[:, :, None] * q.mean[:, None, :], q.mean[:, :, None]], 2),
                               jnp.concatenate([q.mean[:, None, :], jnp.ones_like(q.mean[:, :1, None])], 2)], 1)
    free = jnp.ones(l + 1, bool).at[l].set(block.likelihood.intercept)

    def one_step(_, params):
        w, w0 = params
        blk = eqx.tree_at(lambda b: (b.loadings, b.offsets), block, (w, w0))
        # One pass over the sites: the column values and ∂/∂(m̃, Ṽ), which give both the gradient in
        # (W_d, w_0d) — ∂m̃/∂W_d = m, ∂Ṽ/∂W_d through W_d V W_dᵀ — and the curvature Λ = −2 sym ∂/∂Ṽ.
        f0, vjp = jax.vjp(lambda m, v: _column_sums(blk, Y, mask, weights, m, v),
                          *jax.vmap(blk.predictors)(q.mean, q.cov))
        g_m, g_v = vjp(jnp.ones_like(f0))
        g_sym = g_v + jnp.swapaxes(g_v, -1, -2)
        lam = -g_sym
        grad_w = jnp.einsum("ndk,nl->dkl", g_m, q.mean) + jnp.einsum("ndkj,djl,nlm->dkm", g_sym, w, q.cov)
        grad = jnp.concatenate([grad_w, jnp.sum(g_m, 0)[..., None]], -1) * free   # (D_b, K, L+1)
        curv = jnp.einsum("ndkj,nab->dkajb", lam, moments)                       # (D_b, K, L+1, K, L+1)
        curv = curv * (free[None, None, :, None, None] & free[None, None, None, None, :])
        fixed = jnp.diag(jnp.tile(~free, k).astype(curv.dtype))
        n = k * (l + 1)
        curv = curv.reshape(d, n, n)
        # A small ridge keeps the step finite where the bound is flat in ṽ (linear piecewise bounds).
        ridge = 1e-10 * jnp.trace(curv, axis1=1, axis2=2) / n + jnp.finfo(curv.dtype).eps
        curv = curv + fixed + ridge[:, None, None] * jnp.eye(n, dtype=curv.dtype)
        step = jnp.linalg.solve(curv, grad.reshape(d, n, 1)).reshape(d, k, l + 1)
        step = jnp.where(jnp.isfinite(step), step, 0.0)
        # Trust region ‖step‖ ≤ 1 + ‖θ_d‖: where the curvature vanishes the step is a long gradient step.
        size = jnp.sqrt(jnp.sum(step**2, (1, 2)))
        radius = 1.0 + jnp.sqrt(jnp.sum(w**2, (1, 2)) + jnp.sum(w0**2, 1))
        step = step * jnp.minimum(1.0, radius / jnp.maximum(size, jnp.finfo(size.dtype).tiny))[:, None, None]

        def trial(t):
            return _block_values(block, Y, mask, weights, q, w + t[:, None, None] * step[..., :l],
                                 w0 + t[:, None] * step[..., l])

        t, _, ok, _ = backtrack(trial, lambda t, f: f >= f0, jnp.ones(d, f0.dtype), _HALVINGS)
        return (jnp.where(ok[:, None, None], w + t[:, None, None] * step[..., :l], w),
                jnp.where(ok[:, None], w0 + t[:, None] * step[..., l], w0))

    w, w0 = jax.lax.fori_loop(0, steps, one_step, (block.loadings, block.offsets))
    return eqx.tree_at(lambda b: (b.loadings, b.offsets), block, (w, w0))


def _update_likelihood(block, Y, mask, weights, q):
    idx = jnp.asarray(block.columns)
    preds = jax.vmap(block.predictors)(q.mean, q.cov)
    y, mk = Y[:, idx], mask[:, idx]
    weight = jnp.where(mk, weights[:, None], 0.0)
    return eqx.tree_at(lambda b: b.likelihood, block, block.likelihood.update(jnp.where(mk, y, 0.0), weight, *preds))


@eqx.filter_jit
def m_step(model: FactorModel, Y, mask, q: Posteriors, loading_steps: int = 1, weights=None) -> FactorModel:
    """Update μ, Σ (if ``learn_prior``), each block's loadings (if ``learn_loadings``) and likelihood,
    maximising Σ_n w_n L_n (``weights`` w_n: default 1)."""
    weights = jnp.ones(Y.shape[0], Y.dtype) if weights is None else weights
    if model.learn_prior:
        model = _update_prior(model, q, weights)
    blocks = []
    for block in model.blocks:
        if model.learn_loadings:
            block = _update_loadings(block, Y, mask, weights, q, loading_steps)
        blocks.append(_update_likelihood(block, Y, mask, weights, q))
    return eqx.tree_at(lambda m: m.blocks, model, tuple(blocks))


# ----------------------------------------------------------------------------------------------
# The EM driver


class FactorFit(NamedTuple):
    """Result of `fit`.

    - `model`: the learned `FactorModel`.
    - `posteriors`: the per-point `Posteriors` after the last E-step.
    - `log_z`: the final bound Σ_n w_n L_n (minus the ℓ1 penalty, if any), a scalar.
    - `diagnostics`: a `vj.Diagnostics` of the EM loop: ``objective_trace`` the bound after each
      E-step (never falling), ``iterations`` the E-steps run, ``converged`` whether the bound's
      relative change fell below ``tol``, ``stationarity`` that last relative change,
      ``num_value_evals`` the bounds evaluated (one per E-step); ``grad_norm`` is not computed (NaN).
    """

    model: FactorModel
    posteriors: Posteriors
    log_z: jax.Array
    diagnostics: Diagnostics

    @property
    def converged(self) -> bool:
        """Whether the bound's relative change fell below ``tol`` (``diagnostics.converged``)."""
        return bool(self.diagnostics.converged)

    @property
    def bound(self) -> np.ndarray:
        """Deprecated: the bound per EM iteration, now ``diagnostics.objective_trace``."""
        warnings.warn("FactorFit.bound is deprecated: the final bound is `log_z` and the bound per EM iteration "
                      "is `diagnostics.objective_trace`.", DeprecationWarning, stacklevel=2)
        return np.asarray(self.diagnostics.objective_trace)


def _report(progress, it, value, change, elapsed):
    line = f"EM {it:4d}   bound {value: .6e}   change {change:.2e}   {elapsed:7.2f} s"
    if callable(progress):
        progress(it, value)
    else:
        print(line, flush=True)


def fit(model: FactorModel, Y: ArrayLike, mask: ArrayLike | None = None, *, weights: ArrayLike | None = None,
        max_iter: int = 100, tol: float = 1e-6,
        e_step_max_iter: int = 100, loading_steps: int = 1, progress: bool | Callable = False,
        num_iters: int | None = None, e_step_iters: int | None = None) -> FactorFit:
    """Variational EM: alternate `e_step` (all q(z_n), vmapped, warm-started) and `m_step` until the
    bound's relative change is below ``tol`` or ``max_iter`` iterations.

    ``Y`` is (N, D) with the columns the model's blocks name (classes and levels as integers 0 … C−1);
    ``mask`` (N, D) booleans mark the observed entries (default: all). ``weights`` (N,) are
    non-negative row weights w_n, e.g. the counts of distinct rows: the bound is Σ_n w_n L_n, so
    a row of weight 2 counts as that row twice (default: 1 each). ``e_step_max_iter`` caps each
    E-step (`e_step`'s ``max_iter``). ``progress=True`` prints the bound at each iteration; a callable
    is called as ``progress(iteration, bound)``. (``num_iters`` and ``e_step_iters`` are the deprecated
    names of ``max_iter`` and ``e_step_max_iter``.)
    """
    owner = "vj.factor.fit"
    max_iter = renamed(owner, "num_iters", "max_iter", num_iters, max_iter)
    e_step_max_iter = renamed(owner, "e_step_iters", "e_step_max_iter", e_step_iters, e_step_max_iter)
    for name, value in (("max_iter", max_iter), ("e_step_max_iter", e_step_max_iter)):
        if not (isinstance(value, (int, np.integer)) and value >= 1):
            raise ValueError(f"{owner}: `{name}` must be a positive integer, got {value!r}.")
    Y, mask = check_data(model, Y, mask, owner)
    weights = check_weights(weights, Y.shape[0], Y.dtype, owner)
    complete = bool(np.all(np.asarray(mask)))
    q = initial_posteriors(model, Y.shape[0])
    trace, converged, change, start = [], False, np.inf, time.perf_counter()
    for it in range(max_iter):
        q = e_step(model, Y, mask, q, e_step_max_iter, complete=complete)
        value = float(weights @ q.bound - penalty_term(model, jnp.sum(weights)))
        change = abs(value - trace[-1]) / (1.0 + abs(value)) if trace else np.inf
        trace.append(value)
        if progress:
            _report(progress, it, value, change, time.perf_counter() - start)
        if change < tol:
            converged = True
            break
        model = m_step(model, Y, mask, q, loading_steps, weights)
    dtype = Y.dtype
    diagnostics = Diagnostics(
        iterations=jnp.asarray(len(trace)), converged=jnp.asarray(converged), stationarity=jnp.asarray(change, dtype),
        grad_norm=jnp.asarray(jnp.nan, dtype), objective_trace=jnp.asarray(trace, dtype),
        num_value_evals=jnp.asarray(len(trace)), num_grad_evals=jnp.asarray(0), num_hvp_evals=jnp.asarray(0),
        method="variational EM", solver="E-step (natural gradient) / M-step")
    return FactorFit(model, q, jnp.asarray(trace[-1], dtype), diagnostics)
