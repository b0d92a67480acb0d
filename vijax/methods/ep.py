"""Expectation propagation (EP): Gaussian site approximations refined by moment matching.

Each site φ_n(x_n), x_n = h_nᵀw + b_n, becomes t̃_n(x) = exp(ν_n x − ½ τ_n x²), q(w) ∝ f(w) ∏_n t̃_n.
With the cavity q_{−n} ∝ N(m_n, V_n) t̃_n^{−η} and the tilted p̂_n ∝ φ_n^η q_{−n} (normaliser Ẑ_n, moments
m̂_n, V̂_n), a damped step moves τ_n by (δ/η)(V̂_n⁻¹ − V_n⁻¹) and ν_n by (δ/η)(m̂_n/V̂_n − m_n/V_n). The energy

$$
\\log Z_{\\rm EP} = \\log\\!\\int f(w) \\prod_n \\tilde t_n\\, dw
+ \\frac1\\eta \\sum_n \\big[\\log \\hat Z_n + \\log Z(m_{-n}, V_{-n}) - \\log Z(m_n, V_n)\\big],
\\qquad \\log Z(m, V) = \\tfrac12 \\log 2\\pi V + \\tfrac{m^2}{2V},
$$

is stationary in the sites at a fixed point (Jylänki 2013, eqs. 2.36–2.45), so its derivative with the sites
frozen is total.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import LOG_2PI as _LOG_2PI, backtrack, select
from ..covariance import CholeskyFactor
from ..model import LatentLinearModel
from ..posterior import Diagnostics, EPInfo, Posterior
from ..solvers import Status, iterate
from ._base import AbstractMethod, same_shapes
from ._envelope import computed
from ._ep_sites import (SiteParams, _change, _check_settings, _direction, _Evaluation, _num_invalid, _placeholder,
                        _quadratics, _residual)
from ._ep_sites import cavity, moment_residual as moment_residual, site_step as site_step  # vj.ep's per-site maths
from ._gaussian import integrate, marginals, working_model
from ..start import expand_at, expand_at_mode

__all__ = ["EP", "SiteParams", "energy", "SCHEDULES"]
__dir__ = __all__.copy

SCHEDULES = ("parallel", "sequential", "double_loop")
_FALLBACK = {"parallel": ("sequential",), "sequential": ("double_loop",), "double_loop": ()}
_SAFE_DAMPING = 0.5  # adaptive damping's step fraction once a full step has raised the residual
_MAX_HALVINGS = 30  # steps shortened to keep q and the cavities proper, and inner line searches
_MAX_EXTRAPOLATION = 64.0  # largest ω of the double loop's outer step
_ARMIJO = 1e-4  # sufficient-decrease constant of the double loop's inner line search
_ROUNDING = 4  # G is known to a few ulps (the double loop's stopping floor)
_MOMENT_ROUNDING = 1000  # moments matched in working precision are known to a few hundred ulps
_QUADRATURE_NOISE = 1e-9  # relative size of the tilted integrals' rule-placement noise in G


def log_normaliser(mean, var):
    """log ∫ exp(−x²/2V + mx/V) dx = ½ log 2πV + m²/2V."""
    return 0.5 * (_LOG_2PI + jnp.log(var)) + 0.5 * mean**2 / var


def _evaluate(sites: SiteParams, model, power, work, anchor=None) -> _Evaluation:
    """q's marginals, the cavities (at ``anchor`` = (means, variances) if given) and the tilted moments."""
    log_zq, means, variances = marginals(model, _quadratics(sites), work)
    value, proper = log_zq, jnp.isfinite(log_zq)
    magnitude = jnp.abs(log_zq)
    out = ([], [], [], [], [])
    for k, (group, tau, nu, m, V) in enumerate(zip(model.sites, sites.precision, sites.shift, means, variances)):
        m_a, V_a = (m, V) if anchor is None else (anchor[0][k], anchor[1][k])
        m_c, V_c, ok = cavity(m_a, V_a, tau, nu, power)
        log_zhat, m_hat, V_hat = group.potential.tilted_moments(m_c, V_c, power)
        terms = (log_zhat + log_normaliser(m_c, V_c) - log_normaliser(m_a, V_a)) / power
        proper = proper & jnp.all(ok)
        ok = ok & jnp.isfinite(terms) & jnp.isfinite(m_hat) & (V_hat > 0)
        value = value + jnp.sum(terms)
        magnitude = magnitude + jnp.sum(jnp.abs(log_normaliser(m_a, V_a))) / power
        for store, item in zip(out, (m, V, m_hat, V_hat, ok)):
            store.append(item)
    value = jnp.where(proper, value, jnp.nan)
    return _Evaluation(value, *map(tuple, out), proper, magnitude)


def energy(sites: SiteParams, model: LatentLinearModel, power: float = 1.0):
    """log Z_EP at ``sites``, differentiable; stationary in ``sites`` at every fixed point, so ``jax.grad``
    in ``model`` at converged, frozen sites is its total derivative. NaN where q or a cavity is improper."""
    return _evaluate(sites, model, power, working_model(model)).value


def _energy_gradient(ev: _Evaluation, model, C, power) -> SiteParams:
    """∂ log Z_EP / ∂sites at ``ev``, S = CᵀC: with δ_n = (m̂ − m, −½(V̂ + m̂² − V − m²)), a = δ₁/ηV,
    b = −(δ₁m + δ₂)/ηV², Σ = HSHᵀ: ∂/∂ν = Σa − δ₁, ∂/∂τ = −m ∘ Σa − (Σ ∘ Σ)b − δ₂."""
    gaps, a, b = [], [], []
    for m, V, m_hat, V_hat, ok in zip(ev.marginal_mean, ev.marginal_var, ev.tilted_mean, ev.tilted_var, ev.valid):
        d1, d2 = jnp.where(ok, m_hat - m, 0.0), jnp.where(ok, -0.5 * (V_hat + m_hat**2 - V - m**2), 0.0)
        gaps.append((d1, d2))
        a.append(d1 / (power * V))
        b.append(-(d1 * m + d2) / (power * V**2))
    G = [group.projection.mv(C.T) for group in model.sites]
    u = sum(Gg.T @ ag for Gg, ag in zip(G, a))
    M = sum(Gg.T @ (bg[:, None] * Gg) for Gg, bg in zip(G, b))
    shift, precision = [], []
    for Gg, m, (d1, d2) in zip(G, ev.marginal_mean, gaps):
        Sa = Gg @ u
        shift.append(Sa - d1)
        precision.append(-m * Sa - jnp.sum((Gg @ M) * Gg, axis=1) - d2)
    return SiteParams(tuple(precision), tuple(shift))


class _Run(NamedTuple):
    """The loop state every schedule shares."""

    sites: SiteParams
    ev: _Evaluation
    residual: jax.Array
    k: jax.Array
    trace: jax.Array
    best: jax.Array
    since_best: jax.Array
    evals: jax.Array
    skipped: jax.Array
    shrunk: jax.Array
    change: jax.Array
    stuck: jax.Array
    best_sites: SiteParams  # the sites with the smallest residual so far (where a fallback restarts)
    best_ev: _Evaluation  # ... and their evaluation
    damping: jax.Array  # the parallel schedule's current step fraction δ
    alpha: jax.Array  # the parallel schedule's step, halved until q and every cavity are proper
    halvings: jax.Array
    tol: jax.Array  # the residual at which the running schedule stops (`EP._prepared`)
    started: jax.Array  # whether ``ev`` is the evaluation of ``sites`` (False: a placeholder, see `solve`)
    outer: tuple  # the double loop's (anchor, its inner optimum Φ, extrapolation factor ω)
    phase: jax.Array  # the index of the running schedule in `EP._chain` (> 0: a fallback took over)


class EP(AbstractMethod):
    """Expectation propagation with damping, power EP and fallbacks to more robust schedules, from the Laplace sites.

    **Arguments:**

    - `schedule`: ``"parallel"`` (default; all sites from one q, steps halved until q and every cavity are
      proper), ``"sequential"`` (rank-one updates of q, site by site) or ``"double_loop"`` (Opper & Winther
      2005: cavities anchored at q's marginals, a convex inner problem; convergent but slow).
    - `damping`: δ ∈ (0, 1], the fraction of each step taken. None (default): δ = 1, but the parallel
      schedule undoes the first step that raises the residual and takes δ = ½ after it.
    - `power`: η ∈ (0, 1] (default 1); power EP (η < 1) is more stable on non-log-concave sites.
    - `max_iter`: the most iterations, the schedule's and its fallbacks' together (default 200).
    - `tol`: converged when max_n |m̂_n − m_n|/√V_n + |log(V̂_n/V_n)| ≤ max(tol, 1000ε) (default 1e-8: the
      energy's error is O(tol²)).
    - `fallback` (default True): hand an unconverged run to the next schedule; `patience` (default 20):
      iterations without a 1% better residual before that; `inner_max_iter` (default 50): the double loop's.

    Returns a `Posterior` with ``log_z`` = `energy` at the frozen sites (not a bound); the State is the
    `SiteParams`. `damping`, `power`, `tol` are traced (η = 1 is its own program, closed-form moments)."""

    schedule: str = eqx.field(static=True, default="parallel")
    damping: float | None = None
    power: float = 1.0
    max_iter: int = eqx.field(static=True, default=200)
    tol: float = 1e-8
    fallback: bool = eqx.field(static=True, default=True)
    patience: int = eqx.field(static=True, default=20)
    inner_max_iter: int = eqx.field(static=True, default=50)
    unit_power: bool = eqx.field(static=True, init=False, repr=False)

    def __post_init__(self):
        self.unit_power = isinstance(self.power, (int, float)) and float(self.power) == 1.0

    def __check_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"EP: `schedule` must be one of {SCHEDULES}, got {self.schedule!r}.")
        _check_settings(self)

    @property
    def step_fraction(self):
        """δ (the first δ of the adaptive parallel schedule)."""
        return 1.0 if self.damping is None else self.damping

    @property
    def _eta(self):
        """η for the site maths: the Python 1.0 of standard EP (closed-form tilted moments), else `power`."""
        return 1.0 if self.unit_power else self.power

    def _start(self, sites, ev, run: _Run) -> _Run:
        residual = _residual(ev)
        zero = jnp.array(0)
        return run._replace(sites=sites, ev=ev, residual=residual, trace=run.trace.at[run.k].set(ev.value),
                            best=residual, since_best=zero, evals=run.evals + 1, best_sites=sites, best_ev=ev,
                            damping=jnp.asarray(self.step_fraction, ev.value.dtype), alpha=jnp.ones((), ev.value.dtype),
                            halvings=zero, started=jnp.array(True))

    def _record(self, run: _Run, sites, ev, evals, skipped, shrunk, change, stuck) -> _Run:
        residual = _residual(ev)
        improved = residual < 0.99 * run.best
        best_sites, best_ev = select(residual < run.best, (sites, ev), (run.best_sites, run.best_ev))
        k = run.k + 1
        return run._replace(sites=sites, ev=ev, residual=residual, k=k, trace=run.trace.at[k].set(ev.value),
                            best=jnp.minimum(run.best, residual), since_best=jnp.where(improved, 0, run.since_best + 1),
                            evals=run.evals + evals, skipped=run.skipped + skipped, shrunk=run.shrunk + shrunk,
                            change=change, stuck=stuck, best_sites=best_sites, best_ev=best_ev)

    def _prepared(self, run: _Run) -> _Run:
        """``run`` ready for its schedule. The double loop stops at max(tol, √(4ε|G|)): as G − G* = O(r²),
        rounding hides G's decrease below that."""
        anchor = (run.ev.marginal_mean, run.ev.marginal_var)
        dtype = run.ev.value.dtype
        tol = jnp.maximum(jnp.asarray(self.tol, dtype), _MOMENT_ROUNDING * jnp.finfo(dtype).eps)
        if "double_loop" in self._chain:
            rounding = jnp.sqrt(_ROUNDING * jnp.finfo(dtype).eps * jnp.abs(run.ev.value))
            floor = jnp.maximum(tol, jnp.where(jnp.isfinite(rounding), rounding, 0.0))
            tol = jnp.where(jnp.asarray([s == "double_loop" for s in self._chain])[run.phase], floor, tol)
        return run._replace(outer=(anchor, jnp.array(-jnp.inf, dtype), jnp.array(1.0, dtype)), tol=tol)

    def _running(self, run: _Run):
        """Whether the running schedule goes on: not converged, not out of iterations or patience, not stuck."""
        return (run.k < self.max_iter) & (run.residual > run.tol) & (run.since_best < self.patience) & ~run.stuck

    def _iteration(self, model, work):
        """The loop body: propose, evaluate, accept; then hand over if the running schedule has stopped."""
        proposals, acceptances = zip(*(self._schedules[name](model, work) for name in self._chain))

        def by_phase(functions, run, *args):  # the running schedule's function
            if len(functions) == 1:
                return functions[0](run, *args)
            return jax.lax.switch(run.phase, [lambda run, f=f: f(run, *args) for f in functions], run)

        def body(run: _Run) -> _Run:
            sites, proposed = jax.lax.cond(run.started, lambda run: by_phase(proposals, run),
                                           lambda run: (run.sites, run), run)
            ev = _evaluate(sites, model, self._eta, work)
            run = jax.lax.cond(run.started, lambda run: by_phase(acceptances, run, proposed, sites, ev),
                               lambda run: self._prepared(self._start(sites, ev, run)), run)
            if len(self._chain) > 1:
                # An unconverged run with iterations left goes on by the next schedule from its best sites.
                hand_over = ~self._running(run) & (run.phase < len(self._chain) - 1) & (run.residual > run.tol) & (
                    run.k < self.max_iter)
                fresh = lambda run: self._prepared(run._replace(
                    sites=run.best_sites, ev=run.best_ev, residual=_residual(run.best_ev), since_best=jnp.array(0),
                    stuck=jnp.array(False), phase=run.phase + 1))
                run = jax.lax.cond(hand_over, fresh, lambda run: run, run)
            return run

        return body

    # Schedules: each a (propose, accept) pair. ``propose(run) -> (sites, run)``; ``accept(run, proposed,
    # sites, ev)`` returns the next run from the run before the proposal, the proposal and the evaluation.

    def _parallel_step(self, model, work):
        def step(run: _Run) -> SiteParams:
            return _direction(run.ev, self._eta).scale(run.damping * run.alpha)

        def propose(run: _Run):
            return run.sites + step(run), run

        def accept(run: _Run, proposed, sites, ev) -> _Run:
            # A step that leaves q or a cavity improper is halved in the next iteration.
            ok = accepted = ev.proper
            halve = ~ok & (run.halvings < _MAX_HALVINGS)
            damping = run.damping
            if self.damping is None:
                # The first full step that raises the residual (a sign of oscillation) is undone; δ = ½ from then on.
                rose = _residual(ev) > run.residual
                accepted = ok & ~(rose & (run.damping > _SAFE_DAMPING))
                damping = jnp.where(ok & rose, jnp.minimum(run.damping, _SAFE_DAMPING), run.damping)
            keep = lambda new, old: select(accepted, new, old)
            done = self._record(run._replace(damping=damping, alpha=jnp.ones_like(run.alpha), halvings=jnp.array(0)),
                                keep(sites, run.sites), keep(ev, run.ev), jnp.array(1),
                                _num_invalid(run.ev), (run.halvings > 0).astype(int),
                                _change(step(run).scale(accepted), run.ev), ~ok)
            halved = run._replace(alpha=0.5 * run.alpha, halvings=run.halvings + 1, evals=run.evals + 1)
            return select(halve, halved, done)

        return propose, accept

    def _sequential_step(self, model, work):
        power, delta = self._eta, self.step_fraction
        dtype = model.dtype
        working_sites, whitening = work

        def sweep_group(carry, group, k):
            S, mean, sites, skipped = carry
            num = group.num_sites
            offset = jnp.broadcast_to(group.offset, (num,)).astype(dtype)

            def site(n, state):
                S, mean, tau, nu, skipped = state
                h = group.projection.row(n).astype(dtype)
                s = S @ h
                V, m = h @ s, h @ mean + offset[n]
                cavity_precision = 1.0 / V - power * tau[n]
                m_c, V_c, ok = cavity(m, V, tau[n], nu[n], power)
                _, m_hat, V_hat = group.potential.site(n, num).tilted_moments(m_c, V_c, power)
                ok = ok & jnp.isfinite(m_hat) & (V_hat > 0)
                V_hat = jnp.where(ok, V_hat, 1.0)
                dtau = jnp.where(ok, delta / power * (1.0 / V_hat - 1.0 / V), 0.0)
                dnu = jnp.where(ok, delta / power * (m_hat / V_hat - m / V), 0.0)
                # The largest α in {1, ½, ¼, …} that keeps q proper (1/V + Δτ > 0) and this site's next cavity.
                proper = lambda a: (1.0 / V + a * dtau > 0) & (cavity_precision + a * ((1 - power) * dtau) > 0)
                alpha, _, fits, _ = backtrack(proper, lambda a, proper: proper, jnp.ones_like(V), _MAX_HALVINGS)
                alpha = jnp.where(fits, alpha, 0.0)
                dtau, dnu = alpha * dtau, alpha * dnu
                gain = 1.0 / (1.0 + dtau * V)
                S = S - (dtau * gain) * jnp.outer(s, s)
                mean = mean + s * ((dnu - dtau * m) * gain)
                return S, mean, tau.at[n].add(dtau), nu.at[n].add(dnu), skipped + (~ok).astype(int)

            tau, nu = sites.precision[k], sites.shift[k]
            S, mean, tau, nu, skipped = jax.lax.fori_loop(0, num, site, (S, mean, tau, nu, skipped))
            sites = eqx.tree_at(lambda s: (s.precision[k], s.shift[k]), sites, (tau, nu))
            return S, mean, sites, skipped

        def propose(run: _Run):
            # Rank-one updates in the working (whitened) coordinates; q recomputed after every sweep.
            _, mean, C = integrate(model, _quadratics(run.sites), working_sites, whitening, map_back=False)
            carry = (C.T @ C, mean, run.sites, jnp.array(0))
            for k, group in enumerate(working_sites):
                carry = sweep_group(carry, group, k)
            _, _, sites, skipped = carry
            return sites, run._replace(skipped=run.skipped + skipped)

        def accept(run: _Run, proposed, sites, ev) -> _Run:
            change = _change(jax.tree_util.tree_map(jnp.subtract, sites, run.sites), run.ev)
            # Rounding can leave q improper (a downdate of a nearly singular S): keep the last proper state, stop.
            keep = lambda new, old: select(ev.proper, new, old)
            return self._record(proposed, keep(sites, run.sites), keep(ev, run.ev), jnp.array(1), jnp.array(0),
                                jnp.array(0), change, ~ev.proper)

        return propose, accept

    def _double_loop(self, model, work):
        power, tol = self._eta, self.tol
        # For fixed cavities the diagonal Newton step is η/(1 + η) of the EP step.
        newton_fraction = power / (1.0 + power)

        def inner(sites, anchor, target):
            """Minimise the convex G(sites; anchor) until the anchored residual is below ``target``."""
            ev = _evaluate(sites, model, power, work, anchor)

            def finished(_, state):
                sites, ev, failed, evals = state
                return failed | ~(_residual(ev) > target)

            def body(_, state):
                sites, ev, _, evals = state
                step = _direction(ev, power).scale(newton_fraction)
                # Slope of G along the step (∂G/∂ν = E_q x − E_p̂ x, ∂G/∂τ = −½(E_q x² − E_p̂ x²)), < 0.
                slope = sum(jnp.sum(jnp.where(ok, (m - mh) * dnu - 0.5 * (m**2 + V - mh**2 - Vh) * dtau, 0.0))
                            for m, V, mh, Vh, ok, dtau, dnu in zip(ev.marginal_mean, ev.marginal_var,
                                                                   ev.tilted_mean, ev.tilted_var, ev.valid,
                                                                   step.precision, step.shift))

                def sufficient(alpha, new):
                    # Armijo; or, within G's noise (quadrature; rounding of its terms), a smaller residual.
                    armijo = (new.value <= ev.value + _ARMIJO * alpha * slope) & (new.value < ev.value)
                    noise = jnp.maximum(_QUADRATURE_NOISE * (1.0 + jnp.abs(ev.value)),
                                        _ROUNDING * jnp.finfo(ev.value.dtype).eps * ev.magnitude)
                    level = (new.value <= ev.value + noise) & (_residual(new) < _residual(ev))
                    return new.proper & (armijo | level)

                trial = lambda alpha: _evaluate(sites + step.scale(alpha), model, power, work, anchor)
                alpha, new, ok, n = backtrack(trial, sufficient, jnp.ones((), ev.value.dtype), _MAX_HALVINGS)
                sites = select(ok, sites + step.scale(alpha), sites)
                ev = select(ok, new, ev)
                return sites, ev, ~ok, evals + n + 1

            state = (sites, ev, jnp.array(False), jnp.array(1))
            (sites, ev, _, evals), _ = iterate(body, state, self.inner_max_iter, finished)
            return sites, ev.value, evals

        def natural(anchor):
            return tuple((m / V, 1.0 / V) for m, V in zip(*anchor))

        def moments(lam):
            return tuple(h / p for h, p in lam), tuple(1.0 / p for _, p in lam)

        def propose(run: _Run):
            # Outer step: move the anchors to q's marginals (CCCP, never lowering Φ(anchor) = min G), or ω
            # times as far when that raises Φ more (ω doubles while it does, else drops back to 1).
            anchor, phi, omega = run.outer
            lam_s, lam_q = natural(anchor), natural((run.ev.marginal_mean, run.ev.marginal_var))
            lam_t = tuple((hs + omega * (hq - hs), ps + omega * (pq - ps)) for (hs, ps), (hq, pq) in zip(lam_s, lam_q))
            proper = jnp.all(jnp.stack([jnp.all(p > 0) for _, p in lam_t]))
            safe = tuple((jnp.where(proper, h, hq), jnp.where(proper, p, pq)) for (h, p), (hq, pq) in zip(lam_t, lam_q))
            trial = moments(safe)
            # Solve the inner problem only as accurately as the outer iterate deserves.
            target = jnp.maximum(0.1 * tol, 0.1 * run.residual)
            sites_t, phi_t, evals_t = inner(run.sites, trial, target)
            extrapolated = omega > 1
            accepted = ~extrapolated | (proper & (phi_t >= phi))

            def plain(_):
                anchor_q = moments(lam_q)
                sites, value, evals = inner(run.sites, anchor_q, target)
                return sites, value, anchor_q, evals

            sites, phi_new, anchor_new, evals = jax.lax.cond(
                accepted, lambda _: (sites_t, phi_t, trial, jnp.array(0)), plain, None)
            omega = jnp.where(accepted & extrapolated, jnp.minimum(2 * omega, _MAX_EXTRAPOLATION),
                              jnp.where(accepted, 2.0, 1.0))
            return sites, run._replace(outer=(anchor_new, phi_new, omega), evals=run.evals + evals_t + evals)

        def accept(run: _Run, proposed, sites, ev) -> _Run:
            change = _change(jax.tree_util.tree_map(jnp.subtract, sites, run.sites), run.ev)
            stuck = ~ev.proper | (change == 0)
            keep = lambda new, old: select(ev.proper, new, old)
            proposed = proposed._replace(outer=keep(proposed.outer, run.outer))
            return self._record(proposed, keep(sites, run.sites), keep(ev, run.ev), jnp.array(1),
                                _num_invalid(run.ev), jnp.array(0), change, stuck)

        return propose, accept

    def shares_start(self, model):
        return True

    def from_expansion(self, model, expansion) -> SiteParams:
        return SiteParams(expansion.precision, expansion.shift)

    def init_state(self, model) -> SiteParams:
        return self.from_expansion(model, expand_at_mode(model))

    def from_gaussian(self, model, mean, factor) -> SiteParams:
        """Every site's expansion at q's mean (EP's sites are not a function of another method's q)."""
        return self.from_expansion(model, expand_at(jax.lax.stop_gradient(model), mean))

    def is_state(self, model, state) -> bool:
        template = SiteParams.zeros(model, shapes_only=True)
        return isinstance(state, SiteParams) and same_shapes(state, template)

    def solve(self, model: LatentLinearModel, state: SiteParams) -> Posterior:
        frozen = jax.lax.stop_gradient(model)
        sites = jax.lax.stop_gradient(state)
        work = working_model(frozen)
        dtype = frozen.dtype
        # The first iteration evaluates the start; until then ``ev`` is a placeholder (``started`` False).
        ev = _placeholder(lambda: _evaluate(sites, frozen, self._eta, work))
        zero, nan, false = jnp.array(0), jnp.array(jnp.nan, dtype), jnp.array(False)
        inf = jnp.array(jnp.inf, dtype)
        run = _Run(sites=sites, ev=ev, residual=inf, k=zero,
                   trace=jnp.full((self.max_iter + len(self._chain),), jnp.nan, dtype), best=inf, since_best=zero,
                   evals=zero, skipped=zero, shrunk=zero, change=nan, stuck=false, best_sites=sites, best_ev=ev,
                   damping=jnp.asarray(self.step_fraction, dtype), alpha=jnp.ones((), dtype), halvings=zero,
                   tol=jnp.asarray(self.tol, dtype), started=false,
                   outer=((ev.marginal_mean, ev.marginal_var), nan, jnp.ones((), dtype)), phase=zero)
        # `_running` stops the run; the cap only bounds the passes (an iteration, or a halving of its step).
        body = self._iteration(frozen, work)
        run, _ = iterate(lambda _, run: body(run), run, (self.max_iter + len(self._chain) + 1) * (_MAX_HALVINGS + 2),
                         lambda _, run: run.started & ~self._running(run))
        return self._finish(model, frozen, work, run)

    @property
    def _chain(self):
        return (self.schedule,) + (_FALLBACK[self.schedule] if self.fallback else ())

    @property
    def _schedules(self):
        return {"parallel": self._parallel_step, "sequential": self._sequential_step, "double_loop": self._double_loop}

    def _finish(self, model, frozen, work, run: _Run) -> Posterior:
        # An unconverged run ends at its best sites (an oscillating run's last can be far from a fixed point).
        converged = run.residual <= run.tol
        use_best = ~converged & (run.best < run.residual)
        sites, ev, residual = select(use_best, (run.best_sites, run.best_ev, run.best), (run.sites, run.ev, run.residual))
        sites = jax.lax.stop_gradient(sites)
        log_z = computed(ev.value, lambda s, m: energy(s, m, self._eta), sites, model)  # = energy at sites
        _, mean, C = integrate(frozen, _quadratics(sites), *work)
        grad = _energy_gradient(ev, frozen, C, self._eta)
        grad_norm = jnp.max(jnp.stack([jnp.max(jnp.abs(g), initial=0.0) for g in jax.tree_util.tree_leaves(grad)]))
        info = EPInfo(max_change=run.change, skipped=run.skipped, shrunk=run.shrunk, fallback=run.phase > 0)
        # the last schedule stopped for want of progress (oscillating or diverging), or its step vanished
        stalled = run.stuck | (run.since_best >= self.patience)
        diagnostics = Diagnostics(
            iterations=run.k, status=Status.of(converged, value=ev.value, stalled=stalled), stationarity=residual,
            grad_norm=grad_norm, objective_trace=run.trace, num_value_evals=run.evals, num_grad_evals=1,
            num_hvp_evals=0, method="EP", solver=self.schedule, info=info)
        factor = CholeskyFactor.from_matrix(C).canonical()
        return Posterior(mean, factor, log_z, diagnostics, model, bound_claim=False, state=sites)
