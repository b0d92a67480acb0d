"""Second-order and quasi-Newton maximisers of a scalar ``fn(x)`` of a flat ``x``, each one `jax.lax.while_loop`.

Each stops on the squared Newton decrement λ² = ∇fᵀ(−∇²f)⁻¹∇f ≈ 2(f* − f), estimated by gᵀd (d the ascent
direction): once λ² ≤ ``tol`` (or f's rounding 4 ε |f|) the last step is taken. ``tol`` is 1e-10 for the Newton
solvers (float64-accurate gradients after a quadratic last step), 1e-14 for `LBFGS`, whose last step gains less.
"""

from __future__ import annotations

import abc
import collections
import enum
from typing import Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from ._linalg import nan_trace, pcg, select

__all__ = ["AbstractSolver", "NewtonCG", "Newton", "GaussNewton", "LBFGS", "Solution", "Status",
           "iterate", "extrapolated_distance", "FixedPoint", "fixed_point"]
__dir__ = __all__.copy

_ROUNDING = 64  # f is known to about this many ulps: a smaller increase of f is no evidence of progress
_DECREMENT_ROUNDING = 4  # a predicted gain ½λ² below a few ulps of f cannot be realised


class Status(enum.IntEnum):
    """Why a fit stopped (`Diagnostics.status`, an int array): `CONVERGED` (0), `MAX_ITER` (1), `STALLED` (2: no
    further progress possible, e.g. no rise along a step, EP oscillating), `NONFINITE` (3: the objective at the end)
    or `FELL_BACK` (4: the optimum was worse than the start, which is returned; `vj.AIKL`)."""

    CONVERGED = 0
    MAX_ITER = 1
    STALLED = 2
    NONFINITE = 3
    FELL_BACK = 4

    @staticmethod
    def of(converged, *, value=None, stalled=False, fell_back=False) -> jax.Array:
        """The int32 code, by precedence: ``value`` (the final objective; None: unchecked) not finite, ``fell_back``,
        ``converged``, ``stalled``, else `MAX_ITER`."""
        code = jnp.where(converged, Status.CONVERGED, jnp.where(stalled, Status.STALLED, Status.MAX_ITER))
        code = jnp.where(fell_back, Status.FELL_BACK, code)
        if value is not None:
            code = jnp.where(jnp.isfinite(value), code, Status.NONFINITE)
        return code.astype(jnp.int32)


class Solution(NamedTuple):
    """What a solver returns; ``trace[k]`` is f after iteration k (``trace[0]`` at ``x0``, NaN after the last) and
    ``decrement`` the last gᵀd measured (before the final step)."""

    x: jax.Array
    value: jax.Array
    grad_norm: jax.Array  # max |gradient| at x
    iterations: jax.Array
    status: jax.Array
    trace: jax.Array
    num_value_evals: jax.Array  # objective only
    num_grad_evals: jax.Array  # objective and gradient
    num_hvp_evals: jax.Array  # Hessian-vector products
    decrement: jax.Array  # gᵀd, the squared Newton decrement (estimated by the solver's direction)

    @property
    def converged(self) -> jax.Array:
        """``status == Status.CONVERGED``."""
        return self.status == Status.CONVERGED


class AbstractSolver(eqx.Module):
    """A maximiser; ``preconditioner(x)``, if given, returns v ↦ M v, M ≻ 0 approximating (−∇²fn(x))⁻¹."""

    tol: eqx.AbstractVar[float]
    max_iter: eqx.AbstractVar[int]

    @abc.abstractmethod
    def maximise(self, fn: Callable, x0: jax.Array, preconditioner: Callable | None = None) -> Solution:
        """Maximise ``fn`` (scalar, of a flat ``(P,)`` vector) from ``x0``, optionally preconditioned."""

    def threshold(self, f):
        """The squared Newton decrement at which the solver stops: ``tol``, or the rounding of f."""
        return jnp.maximum(self.tol, _DECREMENT_ROUNDING * jnp.finfo(jnp.result_type(f)).eps * jnp.abs(f))


def iterate(step, state, max_iter: int, done=None):
    """``(state, k)`` after ``state = step(k, state)`` for k = 0, 1, … until ``done(k, state)`` (None: never) or
    ``max_iter``; ``done`` is checked before each step."""
    def unfinished(carry):
        k, state = carry
        return (k < max_iter) if done is None else (k < max_iter) & ~done(k, state)

    def body(carry):
        k, state = carry
        return k + 1, step(k, state)

    k, state = jax.lax.while_loop(unfinished, body, (jnp.array(0), state))
    return state, k


def extrapolated_distance(change, previous_change, floor):
    """How far a linearly converging iteration is from its limit: Δ_k r/(1 − r), r = Δ_k/Δ_{k−1} (Δ_k = ``change``,
    Δ_{k−1} = ``previous_change``); inf until a contraction is seen, 0 once Δ_k ≤ ``floor``."""
    rate = change / previous_change
    contracting = jnp.isfinite(previous_change) & (rate < 1)
    extrapolated = jnp.where(contracting, change * rate / jnp.where(contracting, 1 - rate, 1.0), jnp.inf)
    return jnp.where(change <= floor, 0.0, extrapolated)


class FixedPoint(NamedTuple):
    """What `fixed_point` returns: the last accepted iterate and how the run ended."""

    x: object  # a pytree like x0
    value: jax.Array  # the objective at x
    evaluations: jax.Array  # calls of ``evaluate`` (the cost unit)
    converged: jax.Array
    distance: jax.Array  # extrapolated distance of x from the fixed point at the end
    trace: jax.Array  # the objective at each accepted iterate (NaN after the last)


def fixed_point(evaluate, update, change, x0, *, tol, max_evals, floor):
    """Maximise an objective by its monotone map x ← F(x) (an EM), accelerated by SQUAREM (Varadhan & Roland 2008).

    ``evaluate(x) -> (value, aux)``; ``update(x, aux)``: F(x); ``change(a, b, aux)``: a step's size. Each cycle takes
    x₁ = F(x₀), x₂ = F(x₁) and tries x' = x₀ − 2αr + α²v (r = x₁ − x₀, v = x₂ − 2x₁ + x₀, α = −‖r‖/‖v‖ ≤ −1), kept
    if value(x') ≥ value(x₁) to 16 ulps, else the run goes on from x₂. Stops, returning x₂, once the plain steps'
    `extrapolated_distance` is ≤ ``tol``."""
    value, aux = evaluate(x0)
    inf = jnp.array(jnp.inf, value.dtype)
    trace = nan_trace(max_evals, value.dtype)
    # phase 0: the point is an accepted iterate x₀; 1: the point is x₁; 2: the point is x'.
    state = dict(k=jnp.array(1), phase=jnp.array(0), point=x0, value=value, aux=aux, x0=x0, x2=x0,
                 v1=value, accepted=jnp.array(-1), trace=trace, distance=inf, done=jnp.array(False))

    def cond(s):
        return ~s["done"] & (s["k"] < max_evals) & (jnp.isfinite(s["value"]) | (s["phase"] == 2))

    def body(s):
        fx = update(s["point"], s["aux"])
        # x' is accepted unless below x₁ by more than rounding (on a flat objective, not by its last bits).
        slack = 16 * jnp.finfo(s["v1"].dtype).eps * jnp.abs(s["v1"])
        accept = (s["phase"] == 0) | ((s["phase"] == 2) & (s["value"] >= s["v1"] - slack))
        # An accepted point starts a cycle: x₀ = point, next x₁ = F(x₀).
        accepted = s["accepted"] + accept
        trace = jnp.where(accept, s["trace"].at[accepted].set(s["value"]), s["trace"])
        x0 = select(accept, s["point"], s["x0"])
        # At x₁: x₂ = F(x₁), the plain steps' distance, and the extrapolation.
        r, x2 = optax.tree.sub(s["point"], s["x0"]), fx
        v = optax.tree.sub(optax.tree.sub(x2, s["point"]), r)
        distance = extrapolated_distance(change(x2, s["point"], s["aux"]), change(s["point"], s["x0"], s["aux"]), floor)
        nv = optax.tree.norm(v)
        alpha = jnp.minimum(jnp.where(nv > 0, -optax.tree.norm(r) / jnp.where(nv > 0, nv, 1.0), -1.0), -1.0)
        extrapolated = optax.tree.add_scale(optax.tree.add_scale(s["x0"], -2 * alpha, r), alpha**2, v)
        at_x1 = (s["phase"] == 1)
        done = at_x1 & (distance <= tol)
        point = select(accept, fx, select(at_x1, select(done, x2, extrapolated), s["x2"]))
        phase = jnp.where(accept, 1, jnp.where(at_x1 & ~done, 2, 0))
        value, aux = evaluate(point)
        return dict(k=s["k"] + 1, phase=phase, point=point, value=value, aux=aux, x0=x0,
                    x2=select(at_x1, x2, s["x2"]),
                    v1=jnp.where(at_x1, s["value"], s["v1"]), accepted=accepted, trace=trace,
                    distance=jnp.where(at_x1, distance, s["distance"]), done=done)

    s = jax.lax.while_loop(cond, body, state)
    # The last point evaluated is x₂ when the run converged; otherwise the last accepted iterate is the best known.
    ok = jnp.isfinite(s["value"]) & (s["phase"] != 2)
    x = select(ok, s["point"], s["x0"])
    value = jnp.where(ok, s["value"], s["trace"][jnp.maximum(s["accepted"], 0)])
    trace = jnp.where(ok, s["trace"].at[s["accepted"] + 1].set(s["value"]), s["trace"])
    return FixedPoint(x, value, s["k"], s["done"] & jnp.isfinite(s["value"]), s["distance"], trace)


def _ascent(g, d):
    """``d`` if it is an ascent direction, else the gradient (possible only without negative curvature)."""
    slope = jnp.vdot(g, d)
    ok = slope > 0
    return jnp.where(ok, d, g), jnp.where(ok, slope, jnp.vdot(g, g))


# The point x (x0, f = −∞ and d = 0 before the first evaluation), slope = gᵀd, and the next trial's step alpha.
_LoopState = collections.namedtuple("_LoopState", "x f g d slope alpha k failed done trace n_grad n_hvp")


_C1 = 1e-4


def _acceptable(f, slope, f_new, dphi_new, alpha=1.0):
    """Sufficient increase (Armijo) for step α along d or, within f's rounding, Hager–Zhang's approximate Wolfe."""
    finite = jnp.isfinite(f_new) & jnp.isfinite(dphi_new)
    armijo = f_new >= f + _C1 * alpha * slope
    rounding = _ROUNDING * jnp.finfo(jnp.result_type(f)).eps * jnp.abs(f)
    approximate = (f_new >= f - rounding) & (dphi_new >= -0.8 * slope) & (dphi_new <= 0.9 * slope)
    return finite & (armijo | approximate)


def _newton_loop(solver, fn, x0, direction, local_model=None):
    """One trial x + αd a pass (first x0; accepted: its full step next, rejected: α halved), so fn is traced once.

    ``local_model(x)``: f, ∇f and a curvature (default: none); ``direction(x, g, curvature)``: d and its HVP count."""
    if local_model is None:
        local_model = lambda x: (*jax.value_and_grad(fn)(x), None)  # noqa: E731
    dtype = x0.dtype
    zero, false = jnp.array(0), jnp.array(False)
    trace = nan_trace(solver.max_iter, dtype)
    minus_inf = jnp.array(-jnp.inf, dtype)
    state = _LoopState(x0, minus_inf, jnp.zeros_like(x0), jnp.zeros_like(x0), jnp.array(jnp.inf, dtype),
                       jnp.ones((), dtype), zero, false, false, trace, zero, zero)

    def cond(s):
        return (s.k < solver.max_iter) & ~s.failed & ~s.done

    def body(s):
        started = jnp.isfinite(s.f)
        last = started & (s.slope <= solver.threshold(s.f))
        x_try = s.x + s.alpha * s.d
        f_try, g_try, curv_try = local_model(x_try)
        accept = jnp.where(started, _acceptable(s.f, s.slope, f_try, jnp.vdot(g_try, s.d), s.alpha)
                           & ((s.alpha == 1) | (f_try > s.f)), jnp.isfinite(f_try))
        def new_direction():
            d, n = direction(x_try, g_try, curv_try)
            return _ascent(g_try, d) + (n,)

        d, slope, n_hvp = jax.lax.cond(accept & ~last, new_direction, lambda: (s.d, s.slope, zero))
        keep = lambda new, old: jnp.where(accept, new, old)
        alpha = jnp.where(accept, 1.0, 0.5 * s.alpha).astype(dtype)
        k = s.k + (accept & started)
        # After the last step x is the answer; a step halved past 2⁻⁴⁰ (or a start not finite) is a failure.
        failed = ~accept & ~last & ((alpha < 2.0**-40) | ~started)
        return _LoopState(keep(x_try, s.x), keep(f_try, s.f), keep(g_try, s.g), d, slope, alpha, k, failed,
                          last, jnp.where(accept, s.trace.at[k].set(f_try), s.trace), s.n_grad + 1, s.n_hvp + n_hvp)

    s = jax.lax.while_loop(cond, body, state)
    return _solution(solver, s, s.n_hvp)


def _solution(solver, s, n_hvp) -> Solution:
    """From a loop's final state: ``s.done``, the last step was taken; ``s.failed``, no acceptable step."""
    status = Status.of(s.done | (s.slope <= solver.threshold(s.f)), value=s.f, stalled=s.failed)
    return Solution(s.x, s.f, jnp.max(jnp.abs(s.g), initial=0.0), s.k, status, s.trace, jnp.array(0), s.n_grad,
                    n_hvp, s.slope)


class NewtonCG(AbstractSolver):
    """Hessian-free (truncated) Newton with Armijo backtracking: −∇²f · d = ∇f by preconditioned CG on autodiff
    Hessian-vector products, to relative residual min(½, (gᵀMg)^{1/4}), stopping on non-negative curvature.

    **Arguments:** `tol` (λ² at which the last step is taken; 1e-10), `max_iter` (Newton iterations; 100),
    `max_cg` (CG iterations per Newton step; 50).
    """

    tol: float = 1e-10
    max_iter: int = eqx.field(static=True, default=100)
    max_cg: int = eqx.field(static=True, default=50)

    def maximise(self, fn, x0, preconditioner=None):
        value_and_grad = jax.value_and_grad(fn)

        def local_model(x):
            (f, g), linear = jax.linearize(value_and_grad, x)
            return f, g, lambda v: linear(v)[1]

        def direction(x, g, hvp):
            precond = preconditioner(x) if preconditioner is not None else (lambda v: v)
            return pcg(lambda v: -hvp(v), g, precond, self.max_cg)

        return _newton_loop(self, fn, x0, direction, local_model)


class Newton(AbstractSolver):
    """Dense Newton for small problems: the autodiff Hessian, −V max(|λ|, δ) Vᵀ where indefinite.

    **Arguments:** `tol` (λ² at which the last step is taken; 1e-10), `max_iter` (Newton iterations; 100)."""

    tol: float = 1e-10
    max_iter: int = eqx.field(static=True, default=100)

    def maximise(self, fn, x0, preconditioner=None):
        def direction(x, g, _):
            # The Hessian only at accepted points (a trial needs the value and gradient alone).
            lam, V = jnp.linalg.eigh(-jax.hessian(fn)(x))
            # Only a (numerically) singular direction is floored: the scale of the parameters sets the rest.
            floor = 10 * jnp.finfo(lam.dtype).eps * jnp.max(jnp.abs(lam)) + jnp.finfo(lam.dtype).tiny
            lam = jnp.maximum(jnp.abs(lam), floor)
            return V @ ((V.T @ g) / lam), jnp.array(x.shape[0])

        return _newton_loop(self, fn, x0, direction)


class GaussNewton(AbstractSolver):
    """Newton steps with the preconditioner as the inverse Hessian, d = M(x) ∇f(x) (gradient ascent without one).

    For vijax's log joints M⁻¹ = Λ + Σ H diag(ω⁺) Hᵀ (Gauss–Newton): Newton's steps where the sites are log-concave.

    **Arguments:** `tol` (gᵀMg at which the last step is taken; 1e-10), `max_iter` (100)."""

    tol: float = 1e-10
    max_iter: int = eqx.field(static=True, default=100)

    def maximise(self, fn, x0, preconditioner=None):
        def direction(x, g, _):
            return (preconditioner(x)(g) if preconditioner is not None else g), jnp.array(0)

        return _newton_loop(self, fn, x0, direction)


# s_mem, y_mem: (memory, dim) steps and changes of −∇f, newest last; rho: 1/sᵀy (0: empty); b: the line search
# along d from x (`_Bracket`); fresh: x0 not evaluated yet.
_LBFGSState = collections.namedtuple("_LBFGSState", "x f g d slope s_mem y_mem rho k failed done trace n_grad b fresh")


class LBFGS(AbstractSolver):
    """Limited-memory BFGS, preconditioned, with a strong Wolfe line search (c₂ = 0.9, α = 1 first).

    H_k ∇f is the two-loop recursion (Nocedal & Wright §7.2) over the last ``memory`` pairs with sᵀy > 0, H_k⁰ = M(x_k)
    (or sᵀy/yᵀy I). With ``gain_tol`` the run also stops (converged) once f rose by at most ``gain_tol`` over
    ``gain_window`` iterations: for objectives known only to some accuracy (AI-KL's lattice bound).

    **Arguments:** `tol` (gᵀH_k g at which the last step is taken; 1e-14), `max_iter` (1000), `memory` (pairs kept;
    10), `max_backtracks` (line-search trials; 30), `gain_tol` (None: no gain test), `gain_window` (10).
    """

    tol: float = 1e-14
    max_iter: int = eqx.field(static=True, default=1000)
    memory: int = eqx.field(static=True, default=10)
    max_backtracks: int = eqx.field(static=True, default=30)
    gain_tol: float | None = None
    gain_window: int = eqx.field(static=True, default=10)

    def maximise(self, fn, x0, preconditioner=None):
        value_and_grad = jax.value_and_grad(fn)
        dtype = x0.dtype

        def direction(x, g, s_mem, y_mem, rho):
            def backward(q, i):
                a = rho[i] * jnp.vdot(s_mem[i], q)
                return q - a * y_mem[i], a

            order = jnp.arange(self.memory)
            q, a = jax.lax.scan(backward, g, order[::-1])
            a = a[::-1]
            if preconditioner is not None:
                r = preconditioner(x)(q)
            else:
                # The newest stored pair scales the identity (zero pairs: a unit-length first step).
                sy, yy = jnp.vdot(s_mem[-1], y_mem[-1]), jnp.vdot(y_mem[-1], y_mem[-1])
                r = jnp.where(rho[-1] > 0, sy / jnp.where(yy > 0, yy, 1.0), 1.0 / jnp.maximum(jnp.linalg.norm(g), 1.0)) * q

            def forward(r, i):
                b = rho[i] * jnp.vdot(y_mem[i], r)
                return r + s_mem[i] * (a[i] - b), None

            r, _ = jax.lax.scan(forward, r, order)
            return _ascent(g, r)

        def cond(s):
            return s.fresh | ((s.k < self.max_iter) & ~s.failed & ~s.done)

        def body(s):
            # One evaluation per pass, at the trial x + αd (x0 on the first pass, d = 0).
            f_a, g_a = value_and_grad(s.x + s.b.alpha * s.d)
            f_a = jnp.asarray(f_a, dtype)
            b = _wolfe_step(s.b, s.f, s.slope, s.d, f_a, g_a)
            ended = s.fresh | b.done | (b.n >= self.max_backtracks)
            last = ~s.fresh & (s.slope <= self.threshold(s.f))
            ok = ~s.fresh & (b.lo > 0)
            x = jnp.where(ok, s.x + b.lo * s.d, s.x)
            f = jnp.where(s.fresh, f_a, jnp.where(ok, b.f_lo, s.f))
            g = jnp.where(s.fresh, g_a, jnp.where(ok, b.g_lo, s.g))
            step, change = x - s.x, s.g - g  # y: the change of the gradient of −f
            sy = jnp.vdot(step, change)
            store = ok & (sy > jnp.finfo(dtype).eps * jnp.vdot(change, change))
            shift = lambda mem, new: jnp.where(store, jnp.concatenate([mem[1:], new[None]]), mem)
            s_mem, y_mem = shift(s.s_mem, step), shift(s.y_mem, change)
            rho = shift(s.rho, 1.0 / jnp.where(store, sy, 1.0))
            d, slope = jax.lax.cond(ended & (s.fresh | (ok & ~last)), lambda: direction(x, g, s_mem, y_mem, rho),
                                    lambda: (s.d, s.slope))
            k = s.k + ok
            trace = jnp.where(s.fresh, s.trace.at[0].set(f_a), jnp.where(ok, s.trace.at[k].set(f), s.trace))
            done = last
            if self.gain_tol is not None:
                # the gain over the last gain_window accepted steps (the trace holds f after each)
                window = jnp.maximum(k - self.gain_window, 0)
                done = done | (ok & (k >= self.gain_window) & (f - trace[window] <= self.gain_tol))
            finished = _LBFGSState(x, f, g, d, slope, s_mem, y_mem, rho, k, ~s.fresh & ~ok & ~last, done, trace,
                                   s.n_grad + 1, _wolfe_start(f, g, slope), jnp.array(False))
            searching = s._replace(b=b, n_grad=s.n_grad + 1)
            return jax.tree_util.tree_map(lambda new, old: jnp.where(ended, new, old), finished, searching)

        zeros, zero, empty = jnp.zeros_like(x0), jnp.zeros((), dtype), jnp.zeros((self.memory, x0.shape[0]), dtype)
        f0, false = jnp.asarray(-jnp.inf, dtype), jnp.array(False)
        state = _LBFGSState(x0, f0, zeros, zeros, zero, empty, empty, jnp.zeros((self.memory,), dtype), jnp.array(0),
                            false, false, nan_trace(self.max_iter, dtype), jnp.array(0), _wolfe_start(f0, zeros, zero),
                            jnp.array(True))
        s = jax.lax.while_loop(cond, body, state)
        return _solution(self, s, jnp.array(0))


# `LBFGS`'s strong Wolfe line search on φ(α) = fn(x + α d), one trial a pass. lo: the best acceptable step (0: none)
# with φ, ∇fn, φ' there; hi: the bracket's other end (inf until known); alpha: the next trial.
_Bracket = collections.namedtuple("_Bracket", "lo f_lo g_lo dphi_lo hi f_hi dphi_hi alpha done n")


def _wolfe_start(f, g, slope):
    """The bracket before the line search's first trial, α = 1."""
    dtype = f.dtype
    return _Bracket(jnp.zeros((), dtype), f, g, slope, jnp.asarray(jnp.inf, dtype), jnp.asarray(-jnp.inf, dtype),
                    jnp.asarray(jnp.nan, dtype), jnp.ones((), dtype), jnp.array(False), jnp.array(0))


def _wolfe_step(b, f, slope, d, f_a, g_a):
    """``b`` after the trial x + b.alpha d with objective ``f_a``, gradient ``g_a`` (``f``, ``slope``: φ(0), φ'(0)).

    Next trial: without a bracket, φ' extrapolated linearly to zero (at most ×10); inside [lo, hi], the secant zero
    of φ' where the ends' slopes differ in sign, else the quadratic's maximiser through φ(lo), φ'(lo), φ(hi)."""
    dtype = f.dtype
    inf = jnp.asarray(jnp.inf, dtype)
    dphi_a = jnp.vdot(g_a, d)
    finite = jnp.isfinite(f_a) & jnp.isfinite(dphi_a)
    flat = jnp.abs(dphi_a) <= 0.9 * slope  # c₂ = 0.9
    acceptable = _acceptable(f, slope, f_a, dphi_a, b.alpha)
    better = acceptable & ((f_a > b.f_lo) | flat)
    done = better & flat
    # The maximum lies between the new point and the old lo when φ' points back there.
    past_peak = better & (dphi_a * (b.lo - b.alpha) > 0)
    lo, f_lo, g_lo, dphi_lo = (jnp.where(better, new, old) for new, old in
                               ((b.alpha, b.lo), (f_a, b.f_lo), (g_a, b.g_lo), (dphi_a, b.dphi_lo)))
    # Past the peak, the old lo becomes the other end of the bracket.
    hi, f_hi, dphi_hi = (jnp.where(past_peak, old_lo, jnp.where(better, old_hi, new)) for old_lo, old_hi, new in
                         ((b.lo, b.hi, b.alpha), (b.f_lo, b.f_hi, jnp.where(finite, f_a, -inf)),
                          (b.dphi_lo, b.dphi_hi, jnp.where(finite, dphi_a, jnp.nan))))
    width = hi - lo
    secant = lo + width * dphi_lo / (dphi_lo - dphi_hi)
    shortfall = f_lo + dphi_lo * width - f_hi
    quadratic = lo + dphi_lo * width**2 / (2 * shortfall)
    # A trial beyond lo clearly below it: φ' far from linear (a barrier, an overflow); backtrack by φ's quadratic, ≥ ½.
    worse = (hi > lo) & ~(f_hi >= f_lo - 1e-6 * (1.0 + jnp.abs(f_lo)))
    use_secant = jnp.isfinite(dphi_hi) & (dphi_hi * dphi_lo < 0) & ~worse
    inside = jnp.where(use_secant, secant,
                       jnp.where(jnp.isfinite(f_hi) & (shortfall > 0), quadratic, lo + 0.5 * width))
    margin = 0.1 * width
    far = jnp.where(worse, 0.5 * width, width - margin)
    inside = jnp.clip(inside, jnp.minimum(lo + margin, lo + far), jnp.maximum(lo + margin, lo + far))
    # No bracket yet (lo moved forward, φ' still positive): extrapolate φ' to zero.
    decreasing = b.dphi_lo > dphi_lo
    step = jnp.where(decreasing, (lo - b.lo) * dphi_lo / jnp.where(decreasing, b.dphi_lo - dphi_lo, 1.0), jnp.inf)
    beyond = lo + jnp.minimum(step, 9.0 * lo)
    alpha = jnp.where(done, b.alpha, jnp.where(jnp.isfinite(hi), inside, beyond))
    return _Bracket(lo, f_lo, g_lo, dphi_lo, hi, f_hi, dphi_hi, alpha, done, b.n + 1)
