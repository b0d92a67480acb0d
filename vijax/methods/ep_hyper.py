"""EP over hyperparameters: Gaussian sites with uncertain log variances (Jylänki 2013, §2.3, Publication IV).

For a `vj.hierarchical.HierarchicalModel`, site t_n(x_n, φ_l) = N(x_n | y_n, e^{φ_l}) touches x_n = h_nᵀw + b_n
and φ_l = φ_{l_n}. EP approximates p(w, φ) ≈ q(w) q(φ), both Gaussian, q(φ) = ∏_l N(φ_l | μ_l, s_l²) ∝
p(φ) ∏_n e^{ν^φ_n φ_{l_n} − τ^φ_n φ_{l_n}²/2}. The tilted p̂_n(x, φ) ∝ N(x | y_n, e^φ)^η q_{−n}(x) q_{−n}(φ)
is Gaussian in x given φ, so a Gauss–Hermite rule over φ gives Ẑ_n and the moments of x and φ
(`scale_tilted_moments`). All sites move by the damped parallel EP step, halved until q and every cavity are
proper; log Z_EP is `vj.ep.energy`'s with the φ terms added. As the hyperprior variances go to 0, EP is exact.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import potentials
from .._linalg import backtrack, select
from ..covariance import CholeskyFactor
from ..hierarchical import HierarchicalModel
from ..posterior import Diagnostics, EPInfo, Posterior
from ..quadrature import GaussHermite
from ..solvers import Status, iterate
from ..start import expand_at
from ._base import AbstractMethod, compiled, same_shapes
from ._envelope import computed
from ._gaussian import integrate, marginals, working_model
from ._ep_sites import (SiteParams, _change, _check_settings, _direction, _Evaluation, _num_invalid, _placeholder,
                        _quadratics, _residual, cavity)

__all__ = ["HierarchicalEP", "HierarchicalPosterior", "HierarchicalState", "log_variance_tilted_moments",
           "scale_tilted_moments"]
__dir__ = __all__.copy

_MAX_HALVINGS = 30


def log_variance_tilted_moments(loc, mean, var, hyper_mean, hyper_var, power=1.0, quadrature=GaussHermite()):
    """Normaliser and moments of p̂(x, φ) ∝ N(x | loc, e^φ)^η N(x | mean, var) N(φ | hyper_mean, hyper_var).

    `scale_tilted_moments` with a `vj.potentials.Gaussian` site (analytic in x given φ). Arguments
    broadcast elementwise; returns ``(log Ẑ, E x, Var x, E φ, Var φ)`` of that shape."""
    dtype = jnp.result_type(loc, mean, var, hyper_mean, hyper_var, float)
    loc = jnp.asarray(loc, dtype)
    return scale_tilted_moments(potentials.Gaussian(loc, jnp.ones((), dtype)), mean, var, hyper_mean, hyper_var,
                                power, quadrature)


def scale_tilted_moments(potential, mean, var, hyper_mean, hyper_var, power=1.0, quadrature=GaussHermite()):
    """Normaliser and moments of p̂(x, φ) ∝ t(x; e^{φ/2})^η N(x | mean, var) N(φ | hyper_mean, hyper_var).

    t(x; s) is ``potential`` (`vj.potentials.Gaussian` or `StudentT`; its own ``scale`` ignored). At the
    Gauss–Hermite nodes φ_q the x-integral is the potential's ``tilted_moments``, so Ẑ = Σ_q w_q Z(φ_q) and the
    moments are mixtures with weights p_q ∝ w_q Z(φ_q). Per-site ``loc``, ``df`` and the other arguments
    broadcast elementwise; returns ``(log Ẑ, E x, Var x, E φ, Var φ)`` of that shape."""
    potential = eqx.tree_at(lambda t: t.scale, potential, 1.0)  # ignored: set at the φ nodes below
    leaves = [a for a in jax.tree_util.tree_leaves(potential) if eqx.is_array(a)]
    dtype = jnp.result_type(mean, var, hyper_mean, hyper_var, *leaves, float)
    shape = jnp.broadcast_shapes(*(jnp.shape(a) for a in (mean, var, hyper_mean, hyper_var, *leaves)))
    z, weights = quadrature.rule(dtype)
    mean, var, hyper_mean, hyper_var = (jnp.broadcast_to(jnp.asarray(a, dtype), shape)[..., None]
                                        for a in (mean, var, hyper_mean, hyper_var))
    sd = jnp.sqrt(hyper_var)
    phi = hyper_mean + sd * z  # (..., Q)
    # Per-site parameters get a trailing node axis; the scale is e^{φ/2} at every node.
    site = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(jnp.asarray(a, dtype), shape)[..., None]
                                  if eqx.is_array(a) and jnp.ndim(a) > 0 else a, potential)
    site = eqx.tree_at(lambda t: t.scale, site, jnp.exp(0.5 * phi))
    nodes = phi.shape
    log_f, cond_mean, cond_var = site.tilted_moments(jnp.broadcast_to(mean, nodes), jnp.broadcast_to(var, nodes),
                                                     power)
    log_w = log_f + jnp.log(weights)
    log_z = jax.scipy.special.logsumexp(log_w, axis=-1, keepdims=True)
    p = jnp.exp(log_w - log_z)
    x_mean = jnp.sum(p * cond_mean, -1, keepdims=True)
    x_var = jnp.sum(p * (cond_var + (cond_mean - x_mean) ** 2), -1)
    z_mean = jnp.sum(p * z, -1, keepdims=True)  # centred nodes: Var φ stays accurate for tiny s
    phi_var = hyper_var[..., 0] * jnp.sum(p * (z - z_mean) ** 2, -1)
    return log_z[..., 0], x_mean[..., 0], x_var, hyper_mean[..., 0] + sd[..., 0] * z_mean[..., 0], phi_var


class HierarchicalState(eqx.Module):
    """The State of `HierarchicalEP`: the w-sites ``sites`` and the φ-sites ``hyper_sites`` (`vj.ep.SiteParams`)."""

    sites: SiteParams
    hyper_sites: SiteParams


class HierarchicalPosterior(Posterior):
    """q(w) q(φ) from `HierarchicalEP`: a `vj.Posterior` of q(w) (``log_z``: log Z_EP over w and φ, not a
    bound) with q(φ_l) = N(`hyper_mean`_l, `hyper_var`_l), shapes ``(L,)``."""

    hyper_mean: jax.Array
    hyper_var: jax.Array

    def __init__(self, mean, factor, log_z, diagnostics, model, state, hyper_mean, hyper_var):
        super().__init__(mean, factor, log_z, diagnostics, model, bound_claim=False, state=state)
        self.hyper_mean = hyper_mean
        self.hyper_var = hyper_var

    @property
    def weights(self) -> Posterior:
        """q(w) as a `vj.Posterior` of the plug-in model ``model.model``."""
        return Posterior(self.mean, self.factor, self.log_z, self.diagnostics, self.model.model, bound_claim=False,
                         state=self.state.sites)

    def relevances(self):
        """E_q[e^{φ_l}] = exp(μ_l + s_l²/2): the posterior mean of each variance (prior scale², noise σ²)."""
        return jnp.exp(self.hyper_mean + 0.5 * self.hyper_var)


class _Eval(NamedTuple):
    """The moments of x (``w``) and of φ_{l_n} (``hyper``) at every site, sharing log Z_EP, and q(φ)."""

    w: _Evaluation
    hyper: _Evaluation
    q_hyper: tuple  # (mean, var) of q(φ), shape (L,) each


def _q_hyper(model: HierarchicalModel, hyper_sites: SiteParams):
    """q(φ) ∝ p(φ) ∏ t̃^φ: (mean, var, proper, log ∫ p(φ) ∏ t̃^φ dφ); the first two of shape (L,)."""
    L = model.num_hyper
    tau_sum = sum(jax.ops.segment_sum(tau, index, L) for index, tau in zip(model.hyper_index, hyper_sites.precision))
    nu_sum = sum(jax.ops.segment_sum(nu, index, L) for index, nu in zip(model.hyper_index, hyper_sites.shift))
    precision = 1.0 / model.hyper_var + tau_sum
    proper = precision > 0
    var = 1.0 / jnp.where(proper, precision, 1.0)
    mean = (model.hyper_mean / model.hyper_var + nu_sum) * var
    # p(φ) is q(φ)'s "cavity" for all its sites together: log Z(q) − log Z(p).
    log_ratio = -_cavity_log_ratio(mean, var, tau_sum, nu_sum, 1.0, model.hyper_mean, model.hyper_var)
    return mean, var, jnp.all(proper), jnp.sum(log_ratio)


def _cavity_log_ratio(m, V, tau, nu, power, m_c, V_c):
    """log Z(m₋, V₋) − log Z(m, V) (`vj.ep.log_normaliser`) for the cavity of site (τ, ν), without the
    cancellation of the m²/2V terms at tiny V (a collapsed hyperparameter): m₋ − m = ηV₋(τm − ν) and
    m₋/V₋ − m/V = −ην are exact."""
    shift = m_c / V_c
    return 0.5 * (-jnp.log1p(-power * tau * V) + power * V_c * (tau * m - nu) * shift - power * nu * m)


class HierarchicalEP(AbstractMethod):
    """Parallel EP for `vj.hierarchical.HierarchicalModel`: q(w) Gaussian, q(φ) factorised Gaussian.

    **Arguments:**

    - `damping`: δ ∈ (0, 1], the fraction of each EP step taken (default 0.5: many sites share one φ,
      and their undamped parallel steps on it add up and overshoot).
    - `power`: η ∈ (0, 1] (power EP; default 1, standard EP).
    - `max_iter`: at most this many parallel iterations (default 500).
    - `tol`: converged when `vj.ep.moment_residual` for x and φ is ≤ ``tol`` at every site (default 1e-6).
    - `quadrature`: the Gauss–Hermite rule over φ (default 32 nodes).

    Returns a `HierarchicalPosterior`; ``init`` may also be a `vj.Posterior` of q(w) or a ``(D,)`` point w."""

    damping: float = 0.5
    power: float = 1.0
    max_iter: int = eqx.field(static=True, default=500)
    tol: float = 1e-6
    quadrature: GaussHermite = GaussHermite()

    def __check_init__(self):
        _check_settings(self)

    def check_model(self, model) -> None:
        if not isinstance(model, HierarchicalModel):
            raise ValueError(f"HierarchicalEP: `model` must be a vj.HierarchicalModel (e.g. from "
                             f"vj.glm.hierarchical_linear), got {type(model).__name__}.")

    def init_state(self, model: HierarchicalModel) -> HierarchicalState:
        """The exact Gaussian sites at φ = μ_0 (a Student-t group's at its plug-in scale), zero φ-sites."""
        full = lambda a, g: jnp.broadcast_to(a, (g.num_sites,)).astype(model.dtype)
        s2 = [full(g.potential.scale**2, g) for g in model.model.sites]
        loc = [full(g.potential.loc, g) for g in model.model.sites]
        sites = SiteParams(tuple(1.0 / v for v in s2), tuple(m / v for m, v in zip(loc, s2)))
        return HierarchicalState(sites, SiteParams.zeros(model.model))

    def from_expansion(self, model: HierarchicalModel, expansion) -> HierarchicalState:
        """The w-sites from the expansion of the plug-in model's sites (``model.model``); zero φ-sites."""
        return HierarchicalState(SiteParams(expansion.precision, expansion.shift), SiteParams.zeros(model.model))

    def from_gaussian(self, model: HierarchicalModel, mean, factor) -> HierarchicalState:
        """Every site's expansion at q's mean (as `vj.EP` converts), zero φ-sites."""
        return self.from_expansion(model, expand_at(jax.lax.stop_gradient(model.model), mean))

    def is_state(self, model: HierarchicalModel, state) -> bool:
        sites = SiteParams.zeros(model.model, shapes_only=True)
        return isinstance(state, HierarchicalState) and same_shapes(state, HierarchicalState(sites, sites))

    def to_state(self, model: HierarchicalModel, init):
        """As `vj.AbstractMethod.to_state`; a ``(D,)`` point w converts by `from_gaussian` at w."""
        if isinstance(init, (jax.Array, np.ndarray)) and not self.is_state(model, init):
            w = jnp.asarray(init)
            if w.shape != (model.dim,) or not jnp.issubdtype(w.dtype, jnp.floating):
                raise ValueError(f"HierarchicalEP: an array `init` is a point w of shape ({model.dim},); got shape "
                                 f"{w.shape} and dtype {w.dtype}.")
            return compiled(self, "from_gaussian", model, w.astype(model.dtype), None)
        return super().to_state(model, init)

    def evaluate(self, model: HierarchicalModel, sites: SiteParams, hyper_sites: SiteParams, work=None) -> _Eval:
        """q, every site's cavity and tilted moments, and log Z_EP at the given sites."""
        power = self.power
        work = working_model(model.model) if work is None else work
        log_zw, means, variances = marginals(model.model, _quadratics(sites), work)
        q_mean, q_var, proper, log_zphi = _q_hyper(model, hyper_sites)
        value = log_zw + log_zphi
        proper = proper & jnp.isfinite(log_zw)
        out = tuple([] for _ in range(9))  # x's m, V, m̂, V̂, φ's m, V, m̂, V̂, valid
        for group, index, tau, nu, htau, hnu, m, V in zip(model.model.sites, model.hyper_index, sites.precision,
                                                          sites.shift, hyper_sites.precision, hyper_sites.shift,
                                                          means, variances):
            pm, pv = q_mean[index], q_var[index]
            m_c, V_c, ok = cavity(m, V, tau, nu, power)
            pm_c, pv_c, ok_h = cavity(pm, pv, htau, hnu, power)
            log_zhat, m_hat, V_hat, p_hat, pv_hat = scale_tilted_moments(
                group.potential, m_c, V_c, pm_c, pv_c, power, self.quadrature)
            terms = (log_zhat + _cavity_log_ratio(m, V, tau, nu, power, m_c, V_c)
                     + _cavity_log_ratio(pm, pv, htau, hnu, power, pm_c, pv_c)) / power
            ok = ok & ok_h
            proper = proper & jnp.all(ok)
            ok = ok & jnp.isfinite(terms) & (V_hat > 0) & (pv_hat > 0)
            value = value + jnp.sum(terms)
            for store, item in zip(out, (m, V, m_hat, V_hat, pm, pv, p_hat, pv_hat, ok)):
                store.append(item)
        value = jnp.where(proper, value, jnp.nan)
        valid = tuple(out[8])
        x, phi = (_Evaluation(value, *map(tuple, part), valid, proper, jnp.zeros_like(value))
                  for part in (out[:4], out[4:8]))
        return _Eval(x, phi, (q_mean, q_var))

    @staticmethod
    def residual(ev: _Eval):
        """max over valid sites of the x and φ moment residuals (`vj.ep.moment_residual`); inf if improper."""
        return jnp.maximum(_residual(ev.w), _residual(ev.hyper))

    def solve(self, model: HierarchicalModel, state: HierarchicalState) -> HierarchicalPosterior:
        frozen = jax.lax.stop_gradient(model)
        state = jax.lax.stop_gradient(state)
        work = working_model(frozen.model)
        evaluate = lambda s, h: self.evaluate(frozen, s, h, work)
        # The first iteration evaluates the start (a zero step), so `evaluate` is traced once.
        ev = _placeholder(evaluate, state.sites, state.hyper_sites)
        dtype = ev.w.value.dtype
        trace = jnp.full((self.max_iter + 1,), jnp.nan, dtype)
        zero, no = jnp.array(0), jnp.array(False)
        # (sites, φ-sites, evaluation, trace, shrunk, stuck, started, evaluations, skipped, change)
        loop = (state.sites, state.hyper_sites, ev, trace, zero, no, no, zero, zero, jnp.array(jnp.nan, dtype))

        def step(k, loop):
            sites, hyper_sites, ev, trace, shrunk, _, started, evals, skipped, change = loop
            direction = (_direction(ev.w, self.power), _direction(ev.hyper, self.power))
            dw, dh = jax.tree_util.tree_map(lambda d: jnp.where(started, self.damping * d, 0.0), direction)
            move = lambda a: (sites + dw.scale(a), hyper_sites + dh.scale(a))
            alpha, new, ok, halvings = backtrack(lambda a: evaluate(*move(a)), lambda a, new: new.w.proper,
                                                 jnp.ones((), dtype), _MAX_HALVINGS, placeholder=ev)
            taken = jnp.where(ok, alpha, 0.0)
            change = jnp.where(started, jnp.maximum(_change(dw.scale(taken), ev.w), _change(dh.scale(taken), ev.hyper)),
                               change)
            skipped = skipped + jnp.where(started, _num_invalid(ev.w), 0)
            (sites, hyper_sites), ev = select(ok, (move(alpha), new), ((sites, hyper_sites), ev))
            return (sites, hyper_sites, ev, trace.at[k].set(ev.w.value), shrunk + (started & (halvings > 0)), ~ok,
                    started | ok, evals + halvings + 1, skipped, change)

        done = lambda k, loop: loop[6] & (self.residual(loop[2]) <= self.tol) | loop[5]
        (sites, hyper_sites, ev, trace, shrunk, _, _, evals, skipped, change), k = iterate(
            step, loop, self.max_iter + 1, done)
        k = k - 1  # the first pass only evaluated the start
        residual = self.residual(ev)
        _, mean, C = integrate(frozen.model, _quadratics(sites), *work)
        final = HierarchicalState(sites, hyper_sites)
        # log Z_EP as evaluated, differentiable in the model at the frozen sites (stationary at a fixed point).
        log_z = computed(ev.w.value, lambda method, s, m: method.evaluate(m, s.sites, s.hyper_sites).w.value,
                         self, final, model)
        info = EPInfo(max_change=change, skipped=skipped, shrunk=shrunk, fallback=jnp.array(False))
        diagnostics = Diagnostics(iterations=k, status=Status.of(residual <= self.tol, value=ev.w.value),
                                  stationarity=residual, objective_trace=trace, method="HierarchicalEP",
                                  solver="parallel", num_value_evals=evals, info=info)
        q_mean, q_var = ev.q_hyper
        return HierarchicalPosterior(mean, CholeskyFactor.from_matrix(C).canonical(), log_z, diagnostics, model,
                                     final, q_mean, q_var)
