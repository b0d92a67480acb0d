"""Variational EM for latent Gaussian factor models: vmapped E-steps, M-steps and the EM driver.

**E-step.** Each q(z_n) = N(m_n, V_n) maximises L_n (thesis eq. 3.21) by natural-gradient steps, with
g = ∂f̲/∂m̃ and G = ∂f̲/∂Ṽ summed over the point's observed columns:

    P* = Σ⁻¹ − 2 Σ_d W_dᵀ G_d W_d,        P ← (1 − ρ) P + ρ P*,        m ← m + ρ P⁻¹ (−Σ⁻¹(m − μ) + Σ_d W_dᵀ g_d)

At ρ = 1 this is Newton's method in m (Price's theorem); a step that would lower L_n is rejected and ρ
halved, an accepted one doubles ρ (up to 1).

**M-step.** μ and Σ in closed form (eq. 3.37; the graphical lasso when penalised); each column's (W_d, w_0d)
by a curvature step (Λ = −2G), backtracked so the bound never falls; then each likelihood's `update`.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from .._linalg import backtrack, inverse_logdet, nan_trace, select
from ..covariance import CholeskyFactor
from ..methods import AbstractMethod
from ..posterior import Diagnostics, Posterior
from ..solvers import Status, extrapolated_distance, iterate
from .model import FactorModel, ObservedModel, Prior, block_data, block_terms, neg_kl, site_terms

__all__ = ["EM", "EStep", "EMState", "FactorPosterior", "FactorInfo", "Posteriors", "e_step", "m_step", "initial_posteriors",
           "penalty_term"]

_HALVINGS = 30
_ROUNDING = 10  # a step that lowers L_n by less than this many ulps is rounding, not a worse q


class Posteriors(NamedTuple):
    """The per-point Gaussians q(z_n) = N(mean[n], cov[n]), cov⁻¹, the bounds L_n and the last E-step's report."""

    mean: jax.Array        # (N, L)
    cov: jax.Array         # (N, L, L)
    precision: jax.Array   # (N, L, L)
    bound: jax.Array       # (N,)
    iterations: jax.Array  # (N,)
    converged: jax.Array   # (N,)


def initial_posteriors(model: FactorModel, num_points: int) -> Posteriors:
    """q(z_n) = prior for every point."""
    n, prior = num_points, Prior.of(model)
    tile = lambda a: jnp.broadcast_to(a, (n,) + a.shape)
    return Posteriors(tile(model.mean), tile(model.cov), tile(prior.precision), jnp.full(n, -jnp.inf, model.mean.dtype),
                      jnp.zeros(n, jnp.int32), jnp.zeros(n, bool))


def _psd(h):
    """Per-column curvatures (D_b, K, K) clipped to positive semi-definite (round-off, or a non-concave bound)."""
    if h.shape[-1] == 1:
        return jnp.maximum(h, 0.0)
    w, q = jnp.linalg.eigh(0.5 * (h + jnp.swapaxes(h, -1, -2)))
    return jnp.einsum("dij,dj,dkj->dik", q, jnp.maximum(w, 0.0), q)


def _mean_curvatures(model, y, mask, preds):
    """Each block's −∂²f̲/∂m̃² per column (D_b, K, K) at fixed Ṽ, by K forward-over-reverse products."""
    out = []
    for i, (m, v) in enumerate(preds):
        grad_m = jax.grad(lambda m: site_terms(model, y, mask, preds[:i] + ((m, v),) + preds[i + 1:]))
        units = jnp.broadcast_to(jnp.eye(m.shape[-1], dtype=m.dtype)[:, None, :], m.shape[-1:] + m.shape)
        cols = jax.vmap(lambda t: jax.jvp(grad_m, (m,), (t,))[1])(units)   # (K, D_b, K): [k, d, j] = H_d[j, k]
        out.append(_psd(-jnp.transpose(cols, (1, 2, 0))))
    return out


def _precision(model, prior, curvatures):
    """Σ⁻¹ + Σ_d W_dᵀ Λ_d W_d (symmetrised) for the blocks' per-column curvatures Λ (D_b, K, K)."""
    p = prior.precision
    for block, lam in zip(model.blocks, curvatures):
        p = p + jnp.einsum("dkl,dkj,djm->lm", block.loadings, lam, block.loadings)
    return 0.5 * (p + p.T)


def _point_step_parts(model, prior, y, mask, mean, cov, logdet_precision, newton):
    """(L_n, P*, gradient in m, Newton matrix or None) at q = N(mean, cov) for one point."""
    preds = tuple(b.predictors(mean, cov) for b in model.blocks)
    sites, grads = jax.value_and_grad(lambda p: site_terms(model, y, mask, p))(preds)
    grad, lams = -prior.precision @ (mean - prior.mean), []
    for block, (gm, gv) in zip(model.blocks, grads):
        lam = -(gv + jnp.swapaxes(gv, -1, -2))
        lams.append(_psd(lam) if block.likelihood.num_predictors == 1 else lam)  # a concave bound has G ≤ 0
        grad = grad + jnp.einsum("dkl,dk->l", block.loadings, gm)
    hessian = _precision(model, prior, _mean_curvatures(model, y, mask, preds)) if newton else None
    return neg_kl(prior, mean, cov, -logdet_precision) + sites, _precision(model, prior, lams), grad, hessian


class _PointState(NamedTuple):
    mean: jax.Array
    cov: jax.Array
    precision: jax.Array
    logdet: jax.Array  # log det precision
    bound: jax.Array
    target: jax.Array  # P* at (mean, cov)
    grad: jax.Array    # ∂L_n/∂m at (mean, cov)
    hessian: jax.Array | None  # −∂²L_n/∂m² at (mean, cov) with ``newton``, else None
    rho: jax.Array
    change: jax.Array  # Δ of the last accepted step
    previous: jax.Array  # Δ of the one before
    done: jax.Array
    settled: jax.Array  # the steps stopped shrinking without raising L_n beyond its rounding (see below)
    trace: jax.Array | None  # L_n after each iteration (entry 0: at the start), with ``record``; else None


def _point_e_step(model, prior, y, mask, mean, cov, precision, shared, max_iter, tol, newton, record=False):
    """Monotone natural-gradient ascent of L_n for one point (``shared``: a fixed (P, V, log|P|) or None)."""
    floor = 1e3 * float(jnp.finfo(mean.dtype).eps)  # steps lost in rounding (float32's resolution in float32)
    if shared is None:
        logdet0 = inverse_logdet(precision)[1]  # (the unused inverse is dead code under jit)
    else:
        precision, cov, logdet0 = shared
    parts = lambda m, v, ld: _point_step_parts(model, prior, y, mask, m, v, ld, newton)
    inf = jnp.asarray(jnp.inf, mean.dtype)
    first = parts(mean, cov, logdet0)
    trace = nan_trace(max_iter, mean.dtype, first[0]) if record else None
    state = _PointState(mean, cov, precision, logdet0, *first, jnp.asarray(1.0, mean.dtype), inf, inf,
                        jnp.asarray(False), jnp.asarray(False), trace)

    def body(k, s: _PointState) -> _PointState:
        if shared is None:
            p_new = (1 - s.rho) * s.precision + s.rho * s.target
            v_new, logdet = inverse_logdet(p_new)
        else:
            p_new, v_new, logdet = s.precision, s.cov, s.logdet
        if newton:
            m_new = s.mean + s.rho * jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(s.hessian), True), s.grad)
        else:
            m_new = s.mean + s.rho * (v_new @ s.grad)
        value, target, grad, hessian = parts(m_new, v_new, logdet)
        # A step that loses less than the rounding of L_n is not a worse q.
        rounding = _ROUNDING * jnp.finfo(value.dtype).eps * jnp.abs(s.bound)
        accept = jnp.isfinite(value) & (value >= s.bound - rounding)
        sd = jnp.sqrt(jnp.diagonal(s.cov))
        change = jnp.maximum(jnp.max(jnp.abs(m_new - s.mean) / sd), jnp.max(jnp.abs(jnp.diagonal(v_new - s.cov)) / sd**2))
        change, previous = jnp.where(accept, change, s.change), jnp.where(accept, s.change, s.previous)
        # Settled: optimal to the bound's accuracy (module docstring); no contraction is measurable there.
        settled = accept & (jnp.abs(value - s.bound) <= rounding) & (change >= previous)
        converged = accept & (extrapolated_distance(change, previous, floor) <= tol) | settled
        stalled = (~accept) & (s.rho <= 2.0**-_HALVINGS)
        pick = lambda a, b: select(accept, a, b)  # (None for hessian)
        bound = pick(value, s.bound)
        trace = None if s.trace is None else s.trace.at[k + 1].set(bound)
        return _PointState(pick(m_new, s.mean), pick(v_new, s.cov), pick(p_new, s.precision), pick(logdet, s.logdet),
                           bound, pick(target, s.target), pick(grad, s.grad), pick(hessian, s.hessian),
                           jnp.where(accept, jnp.minimum(2 * s.rho, 1.0), 0.5 * s.rho), change, previous,
                           converged | stalled, settled, trace)

    out, iterations = iterate(body, state, max_iter, lambda _, s: s.done)
    # A settled point's accuracy is its last step (its extrapolated distance is not measurable).
    distance = jnp.where(out.settled, out.change, extrapolated_distance(out.change, out.previous, floor))
    extras = _PointExtras(distance, jnp.max(jnp.abs(out.grad)), out.trace)
    return out.mean, out.cov, out.precision, out.bound, iterations, out.settled | (distance <= tol), extras


class _PointExtras(NamedTuple):
    distance: jax.Array  # the extrapolated distance of q from its fixed point (the convergence test's measure)
    grad_norm: jax.Array  # max |∂L_n/∂m| at the returned q
    trace: jax.Array | None  # L_n after each iteration, with ``record``


def _shared_covariance(model: FactorModel, prior: Prior):
    """P, V = P⁻¹ and log|P| for constant-curvature likelihoods: P = Σ⁻¹ + Σ_d W_dᵀ Λ_d W_d (thesis 4.28, 5.26)."""
    dtype = prior.precision.dtype
    p = _precision(model, prior, [b.likelihood.curvature(len(b.columns), dtype) for b in model.blocks])
    return (p, *inverse_logdet(p))


@eqx.filter_jit
def e_step(model: FactorModel, Y, mask, q: Posteriors, max_iter: int = 500, tol: float = 1e-9,
           complete: bool = False, newton: bool = False) -> Posteriors:
    """Fit every q(z_n), warm-started at ``q``, by `jax.vmap` of the per-point ascent (module docstring).

    A point stops after ``max_iter`` steps, once q is within ``tol`` of its fixed point in its marginal
    standard deviations (`vj.solvers.extrapolated_distance`), or once a step changes L_n only by rounding.
    ``complete`` (static): no entry is missing (the shared-covariance shortcut applies). ``newton`` (static):
    step the means with the bound's own curvature −∂²f̲/∂m̃², not −2∂f̲/∂Ṽ (they differ for optimised local
    parameters): quadratic convergence for one more L × L factorisation a step."""
    return e_step_run(model, Y, mask, q, max_iter, tol, complete, newton)[0]


def e_step_run(model: FactorModel, Y, mask, q: Posteriors, max_iter, tol, complete: bool = False,
               newton: bool = False, record: bool = False):
    """`e_step` with a `_PointExtras` over the points (``record``: each point's L_n trace)."""
    prior = Prior.of(model)
    shared = _shared_covariance(model, prior) if (complete and model.shared_covariance and not newton) else None
    step = lambda y, mk, m, v, p: _point_e_step(model, prior, y, mk, m, v, p, shared, max_iter, tol, newton, record)
    mean, cov, precision, bound, its, done, extras = jax.vmap(step)(Y, mask, q.mean, q.cov, q.precision)
    return Posteriors(mean, cov, precision, bound, its, done), extras


def _graphical_lasso(sample_cov, penalty, precision0, iterations: int = 500, rho: float = 1.0):
    """argmax_Θ log|Θ| − tr(SΘ) − λ Σ_{i≠j} |Θ_ij| by ADMM (Boyd et al. 2011, §6.5), from Θ₀."""
    diagonal = jnp.eye(sample_cov.shape[0], dtype=bool)

    def theta_of(z, u):  # the Θ-update: argmax log|Θ| − tr(SΘ) − (ρ/2)‖Θ − Z + U‖²
        w, q = jnp.linalg.eigh(rho * (z - u) - sample_cov)
        return (q * ((w + jnp.sqrt(w**2 + 4 * rho)) / (2 * rho))) @ q.T

    def body(_, c):
        z, u = c
        theta = theta_of(z, u)
        a = theta + u
        z = jnp.where(diagonal, a, jnp.sign(a) * jnp.maximum(jnp.abs(a) - penalty / rho, 0.0))
        return z, u + theta - z

    z, u = jax.lax.fori_loop(0, iterations, body, (precision0, jnp.zeros_like(precision0)))
    return theta_of(z, u), z


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
        s = inverse_logdet(0.5 * (precision + precision.T))[0]
    return eqx.tree_at(lambda m: (m.mean, m.cov), model, (mu, s))


def _column_sums(block, Y, mask, weights, mean, cov):
    """Per-column Σ_n w_n mask f̲ of one block given every point's predictor moments m̃ (N, D_b, K), Ṽ (N, D_b, K, K)."""
    return weights @ jax.vmap(lambda y, mk, m, v: block_terms(block, y, mk, m, v))(Y, mask, mean, cov)


def _update_loadings(block, Y, mask, weights, q: Posteriors):
    """One backtracked curvature step on each column's (W_d, w_0d); never lowers a column's bound."""
    d, k, l = block.loadings.shape
    moments = jnp.concatenate([jnp.concatenate([q.cov + q.mean[:, :, None] * q.mean[:, None, :], q.mean[:, :, None]], 2),
                               jnp.concatenate([q.mean[:, None, :], jnp.ones_like(q.mean[:, :1, None])], 2)], 1)
    free = jnp.ones(l + 1, bool).at[l].set(block.likelihood.intercept)
    w, w0 = block.loadings, block.offsets
    # One pass over the sites: the column values and ∂/∂(m̃, Ṽ), which give both the gradient in
    # (W_d, w_0d) — ∂m̃/∂W_d = m, ∂Ṽ/∂W_d through W_d V W_dᵀ — and the curvature Λ = −2 sym ∂/∂Ṽ.
    f0, vjp = jax.vjp(lambda m, v: _column_sums(block, Y, mask, weights, m, v),
                      *jax.vmap(block.predictors)(q.mean, q.cov))
    g_m, g_v = vjp(jnp.ones_like(f0))
    g_sym = g_v + jnp.swapaxes(g_v, -1, -2)  # Λ = −g_sym
    grad_w = jnp.einsum("ndk,nl->dkl", g_m, q.mean) + jnp.einsum("ndkj,djl,nlm->dkm", g_sym, w, q.cov)
    grad = jnp.concatenate([grad_w, jnp.sum(g_m, 0)[..., None]], -1) * free   # (D_b, K, L+1)
    curv = jnp.einsum("ndkj,nab->dkajb", -g_sym, moments)                       # (D_b, K, L+1, K, L+1)
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
        blk = eqx.tree_at(lambda b: (b.loadings, b.offsets), block, (w + t[:, None, None] * step[..., :l],
                                                                     w0 + t[:, None] * step[..., l]))
        return _column_sums(blk, Y, mask, weights, *jax.vmap(blk.predictors)(q.mean, q.cov))

    t, _, ok, _ = backtrack(trial, lambda t, f: f >= f0, jnp.ones(d, f0.dtype), _HALVINGS)
    w = jnp.where(ok[:, None, None], w + t[:, None, None] * step[..., :l], w)
    w0 = jnp.where(ok[:, None], w0 + t[:, None] * step[..., l], w0)
    return eqx.tree_at(lambda b: (b.loadings, b.offsets), block, (w, w0))


def _update_likelihood(block, Y, mask, weights, q):
    y, mk = block_data(block, Y, mask)
    weight = jnp.where(mk, weights[:, None], 0.0)
    preds = jax.vmap(block.predictors)(q.mean, q.cov)
    return eqx.tree_at(lambda b: b.likelihood, block, block.likelihood.update(y, weight, *preds))


@eqx.filter_jit
def m_step(model: FactorModel, Y, mask, q: Posteriors, weights=None) -> FactorModel:
    """Update μ, Σ (if ``learn_prior``), each block's loadings (if ``learn_loadings``) and likelihood,
    maximising Σ_n w_n L_n (``weights`` w_n: default 1)."""
    weights = jnp.ones(Y.shape[0], Y.dtype) if weights is None else weights
    if model.learn_prior:
        model = _update_prior(model, q, weights)
    blocks = []
    for block in model.blocks:
        if model.learn_loadings:
            block = _update_loadings(block, Y, mask, weights, q)
        blocks.append(_update_likelihood(block, Y, mask, weights, q))
    return eqx.tree_at(lambda m: m.blocks, model, tuple(blocks))


class EMState(eqx.Module):
    """The State of `EM`: the model after the last M-step, the q(z_n) after the last E-step and that
    E-step's Σ_n w_n L_n (−inf before the first)."""

    model: FactorModel
    posteriors: Posteriors
    bound: jax.Array


class FactorInfo(eqx.Module):
    """What `EM` and `EStep` report in ``post.diagnostics.info``: the most iterations a point's last E-step
    took (`e_step_iterations`) and the points whose last E-step hit its cap (`e_step_unconverged`)."""

    e_step_iterations: jax.Array
    e_step_unconverged: jax.Array

    def __repr__(self):
        if not _checks.is_concrete(self):
            return super().__repr__()
        return (f"FactorInfo(e_step_iterations={int(self.e_step_iterations)}, "
                f"e_step_unconverged={int(self.e_step_unconverged)})")


class FactorPosterior(Posterior):
    """What `EM` and `EStep` return: N Gaussians q(z_n), one per row, and the model they were fitted under.

    ``mean`` ``(N, L)``, ``covariance`` ``(N, L, L)``, ``factor`` a batched `vj.covariance.CholeskyFactor`;
    `log_z` the last E-step's Σ_n w_n L_n (minus any ℓ1 penalty), a lower bound on log p(Y | fitted);
    `fitted` the learned `FactorModel` (the given one for `EStep`); `posteriors` the `Posteriors`; `model`
    the `ObservedModel`; `state` an `EMState` (`EM`) or `Posteriors` (`EStep`); `diagnostics` with a
    `FactorInfo`. `vj.factor.log_predictive`, `probabilities` and `impute` take it.
    """

    fitted: FactorModel
    posteriors: Posteriors

    def __init__(self, fitted, posteriors, log_z, diagnostics, model, state):
        chol = jnp.swapaxes(jnp.linalg.cholesky(posteriors.cov), -1, -2)
        super().__init__(posteriors.mean, CholeskyFactor(chol), log_z, diagnostics, model, bound_claim=True,
                         state=state)
        self.fitted = fitted
        self.posteriors = posteriors

    @property
    def covariance(self):
        """Every q(z_n)'s covariance, ``(N, L, L)``."""
        return self.posteriors.cov

    @property
    def std(self):
        """Every q(z_n)'s marginal standard deviations, ``(N, L)``."""
        return jnp.sqrt(jnp.diagonal(self.posteriors.cov, axis1=-2, axis2=-1))

    def marginals(self, H):
        """Means and variances of ``H z_n`` under each q(z_n), H a dense ``(K, L)`` array: two ``(N, K)`` arrays."""
        H = jnp.asarray(H)
        if H.ndim != 2 or H.shape[1] != self.mean.shape[-1]:
            raise ValueError(f"FactorPosterior.marginals: H must have shape (K, {self.mean.shape[-1]}), got {H.shape}.")
        return self.mean @ H.T, jnp.einsum("kl,nlm,km->nk", H, self.posteriors.cov, H)

    def sample(self, key, num_samples: int):
        """``num_samples`` draws of every z_n from q(z_n): shape ``(num_samples, N, L)``."""
        z = jax.random.normal(key, (num_samples,) + self.mean.shape, self.mean.dtype)
        return self.mean + jnp.einsum("snl,nlm->snm", z, self.factor.matrix)

    def summary(self, names=None, max_rows: int | None = None) -> str:
        """The fit in a few lines: method, convergence, the bound, and the shape of the data and latents."""
        d = self.diagnostics
        status = "converged" if bool(np.all(d.converged)) else "NOT converged"
        n, latent = np.shape(self.mean)
        return "\n".join([f"{d.method} ({d.solver}): {status} after {int(d.iterations)} iterations",
                          f"log Z ≥ {float(self.log_z):.6g} (the bound Σ_n w_n L_n: a lower bound on log p(Y))",
                          f"{n} rows, {latent} latent dimensions, {self.fitted.num_columns} columns"])


def _cast_like(new, old):
    """``new`` with the dtypes of ``old`` leaf by leaf (a loop's carry keeps its types)."""
    return jax.tree_util.tree_map(lambda a, b: jax.lax.convert_element_type(a, jnp.result_type(b)), new, old)


def _factor_info(q: Posteriors):
    return FactorInfo(jnp.max(q.iterations), jnp.sum(~q.converged))


class _EMLoop(NamedTuple):
    model: FactorModel
    q: Posteriors
    value: jax.Array
    change: jax.Array
    converged: jax.Array
    trace: jax.Array


class _FactorMethod(AbstractMethod):
    """What `EM` and `EStep` share: they fit an `ObservedModel`, from their own States only."""

    def check_model(self, model) -> None:
        name = type(self).__name__
        if isinstance(model, FactorModel):
            raise ValueError(f"infer: vj.factor.{name} fits a factor model with its data: pass "
                             f"vj.factor.observe(model, Y, mask), not the FactorModel alone.")
        if not isinstance(model, ObservedModel):
            raise ValueError(f"infer: vj.factor.{name} fits a factor model with its data, "
                             f"vj.factor.observe(model, Y, mask); got {type(model).__name__}.")

    def is_state(self, model, state) -> bool:
        if not isinstance(state, self._state_type):  # before tracing init_state for the template
            return False
        template = eqx.filter_eval_shape(self.init_state, model)
        return (jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(template)
                and all(np.shape(a) == np.shape(b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(template))))

    def to_state(self, model, init):
        """``init`` as a State (a State, or a posterior whose ``state`` is one), else a ValueError."""
        candidate = init.state if isinstance(init, Posterior) else init
        if self.is_state(model, candidate):
            return candidate
        raise ValueError(f"{type(self).__name__}: `init` must be None, {self._accepted} for a model of these shapes "
                         f"(N = {model.num_points} rows, L = {model.latent_dim} latents), or its post.state; got "
                         f"{type(init).__name__}.")

    def from_gaussian(self, model, mean, factor):
        self.from_expansion(model, None)

    def from_expansion(self, model, expansion):
        raise ValueError(f"{type(self).__name__}: a start from another method's Gaussian or from a point does not "
                         "apply to a factor model (its latents are one z_n per row); start from None or from a fit "
                         "of this method.")


class EM(_FactorMethod):
    """Variational EM: alternate E-steps (every q(z_n), warm-started) and M-steps until the bound's
    relative change |B_k − B_{k−1}| / (1 + |B_k|) is below ``tol``, or ``max_iter``.

    **Arguments:**

    - `max_iter`: EM iterations at most (static: it sizes the trace); default 100.
    - `tol`: the bound's relative change at convergence (default 1e-6).
    - `e_step_max_iter`, `e_step_tol`: each E-step's cap (static) and tolerance (see `e_step`).

    Returns a `FactorPosterior`; ``objective_trace`` entry k is the bound after E-step k (never falling). After
    an unconverged stop, ``fitted`` is one M-step ahead of ``posteriors``.
    """

    max_iter: int = eqx.field(static=True, default=100)
    tol: float = 1e-6
    e_step_max_iter: int = eqx.field(static=True, default=100)
    e_step_tol: float = 1e-9
    _state_type: ClassVar[type] = EMState
    _accepted: ClassVar[str] = "an EM posterior (post)"

    def __check_init__(self):
        for name in ("max_iter", "e_step_max_iter"):
            _checks.integer(name, getattr(self, name), "EM")
        for name in ("tol", "e_step_tol"):
            value = getattr(self, name)
            if _checks.is_concrete(value) and not value >= 0:
                raise ValueError(f"EM: `{name}` must be a non-negative number, got {value!r}.")

    def init_state(self, model: ObservedModel) -> EMState:
        return EMState(model.model, initial_posteriors(model.model, model.num_points),
                       jnp.asarray(-jnp.inf, model.dtype))

    def solve(self, model: ObservedModel, state: EMState) -> FactorPosterior:
        data, state = jax.lax.stop_gradient((model, state))
        Y, mask, weights = data.Y, data.mask, data.weights
        dtype = model.dtype
        total = jnp.sum(weights)
        start = jnp.where(jnp.isfinite(state.bound), state.bound, jnp.nan)

        def step(k, s: _EMLoop) -> _EMLoop:
            q = _cast_like(e_step(s.model, Y, mask, s.q, self.e_step_max_iter, self.e_step_tol, complete=data.complete),
                           s.q)
            value = weights @ q.bound - penalty_term(s.model, total)
            change = jnp.abs(value - s.value) / (1.0 + jnp.abs(value))
            converged = change < self.tol
            fm = jax.lax.cond(converged, lambda m: m, lambda m: _cast_like(m_step(m, Y, mask, q, weights), m), s.model)
            return _EMLoop(fm, q, value, change, converged, s.trace.at[k + 1].set(value))

        init = _EMLoop(state.model, state.posteriors, state.bound.astype(dtype), jnp.asarray(jnp.inf, dtype),
                       jnp.asarray(False), nan_trace(self.max_iter, dtype, start))
        out, iterations = iterate(step, init, self.max_iter, lambda _, s: s.converged)
        diagnostics = Diagnostics(
            iterations=iterations, status=Status.of(out.converged, value=out.value), stationarity=out.change,
            objective_trace=out.trace, num_value_evals=iterations, method="EM",
            solver="E-step (natural gradient) / M-step", info=_factor_info(out.q))
        return FactorPosterior(out.model, out.q, out.value, diagnostics, model, EMState(out.model, out.q, out.value))


class EStep(_FactorMethod):
    """The E-step alone: every q(z_n) under the model as given, e.g. for new rows,
    ``vj.infer(vj.factor.observe(post.fitted, Y_test, mask_test), vj.factor.EStep())``.

    **Arguments:** `max_iter` (static; default 1000), `tol` (default 1e-9), `newton` (static): as for `e_step`.

    Returns a `FactorPosterior` (``state`` the `Posteriors`). ``stationarity`` is the largest extrapolated
    distance; ``objective_trace`` Σ_n w_n L_n after each iteration (stopped points at their final value).
    """

    max_iter: int = eqx.field(static=True, default=1000)
    tol: float = 1e-9
    newton: bool = eqx.field(static=True, default=False)
    _state_type: ClassVar[type] = Posteriors
    _accepted: ClassVar[str] = "a FactorPosterior (post)"

    def __check_init__(self):
        _checks.integer("max_iter", self.max_iter, "EStep")
        if _checks.is_concrete(self.tol) and not self.tol >= 0:
            raise ValueError(f"EStep: `tol` must be a non-negative number, got {self.tol!r}.")

    def init_state(self, model: ObservedModel) -> Posteriors:
        return initial_posteriors(model.model, model.num_points)

    def solve(self, model: ObservedModel, state: Posteriors) -> FactorPosterior:
        data, state = jax.lax.stop_gradient((model, state))
        fm = data.model
        q, extras = e_step_run(fm, data.Y, data.mask, state, self.max_iter, self.tol, data.complete, self.newton,
                               record=True)
        q = _cast_like(q, state)  # the State keeps its types, so a warm start reuses the program
        penalty = penalty_term(fm, jnp.sum(data.weights))
        value = data.weights @ q.bound - penalty
        trace = _total_trace(extras.trace, q.bound, q.iterations, data.weights) - penalty
        evals = jnp.sum(q.iterations) + q.mean.shape[0]
        diagnostics = Diagnostics(
            iterations=jnp.max(q.iterations), status=Status.of(jnp.all(q.converged), value=value),
            stationarity=jnp.max(extras.distance), grad_norm=jnp.max(extras.grad_norm), objective_trace=trace,
            num_value_evals=evals, num_grad_evals=evals, method="EStep",
            solver="natural gradient (Newton)" if self.newton else "natural gradient", info=_factor_info(q))
        return FactorPosterior(fm, q, value, diagnostics, model, q)


def _total_trace(traces, bounds, iterations, weights):
    """Σ_n w_n L_n after each iteration from the per-point traces ``(N, max_iter + 1)``, stopped points held."""
    k = jnp.arange(traces.shape[1])
    held = jnp.where(k[None, :] <= iterations[:, None], traces, bounds[:, None])
    return jnp.where(k <= jnp.max(iterations), weights @ held, jnp.nan)
