"""Second-order and quasi-Newton maximisers, each a single `jax.lax.while_loop`.

Every solver maximises a scalar objective ``fn(x)`` of a flat vector ``x`` (vijax's
objectives are bounds and evidences, larger is better) and stops when
``max |∇fn(x)| < tol`` or after ``max_iter`` iterations. Because the whole run is
one `while_loop`, fits compose with `jax.jit` and `jax.vmap`.

- `NewtonCG` — Hessian-free Newton: preconditioned conjugate gradients on
  autodiff Hessian-vector products (``jax.linearize`` of the gradient, so each
  product reuses the forward pass), truncated by a forcing sequence, with an
  Armijo backtracking line search that guarantees ascent.
- `Newton` — dense Hessian (small problems); indefinite Hessians are shifted to
  negative definite by their eigenvalues.
- `LBFGS` — optax's L-BFGS with its zoom line search (for non-concave objectives).
- `NonlinearCG` — preconditioned Polak–Ribière+ conjugate gradients: one gradient
  per iteration and O(dim) memory, for the largest problems.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

__all__ = ["AbstractSolver", "NewtonCG", "Newton", "LBFGS", "NonlinearCG", "Solution"]


class Solution(NamedTuple):
    """What a solver returns.

    ``trace[k]`` is the objective after iteration k (``trace[0]`` at ``x0``; NaN after
    the last iteration). Evaluation counts let benchmarks convert iterations into cost.
    """

    x: jax.Array
    value: jax.Array
    grad_norm: jax.Array  # max |gradient| at x
    iterations: jax.Array
    converged: jax.Array
    trace: jax.Array
    num_value_evals: jax.Array  # objective only
    num_grad_evals: jax.Array  # objective and gradient
    num_hvp_evals: jax.Array  # Hessian-vector products


class AbstractSolver(eqx.Module):
    tol: float = eqx.field(static=True, default=1e-3)
    max_iter: int = eqx.field(static=True, default=100)

    def maximise(self, fn: Callable, x0: jax.Array, preconditioner: Callable | None = None) -> Solution:
        raise NotImplementedError


def _max_abs(g):
    return jnp.max(jnp.abs(g))


def _backtracking(fn, x, f, slope, direction, alpha0, max_halvings=40, c1=1e-4):
    """Largest α in {α0, α0/2, …} with fn(x + α d) ≥ f + c1 α slope (finite values only)."""

    def sufficient(alpha, f_new):
        # A step too short to change f in floating point is no progress, whatever Armijo says.
        return jnp.isfinite(f_new) & (f_new >= f + c1 * alpha * slope) & (f_new > f)

    def cond(state):
        alpha, f_new, k = state
        return ~sufficient(alpha, f_new) & (k < max_halvings)

    def body(state):
        alpha, _, k = state
        alpha = 0.5 * alpha
        return alpha, fn(x + alpha * direction), k + 1

    alpha0 = jnp.asarray(alpha0, x.dtype)
    alpha, f_new, k = jax.lax.while_loop(cond, body, (alpha0, fn(x + alpha0 * direction), jnp.array(0)))
    return alpha, k + 1, sufficient(alpha, f_new)


def _ascent(g, d):
    """``d`` if it is an ascent direction, else the gradient (possible only without negative curvature)."""
    slope = jnp.vdot(g, d)
    ok = slope > 0
    return jnp.where(ok, d, g), jnp.where(ok, slope, jnp.vdot(g, g))


class _LoopState(NamedTuple):
    x: jax.Array
    f: jax.Array
    g: jax.Array
    d: jax.Array
    slope: jax.Array
    k: jax.Array
    failed: jax.Array
    trace: jax.Array
    n_val: jax.Array
    n_grad: jax.Array
    n_hvp: jax.Array


_C1 = 1e-4


def _acceptable(f, slope, f_new, dphi_new, alpha=1.0):
    """Sufficient increase (Armijo) for the step α along d, or — once the increase is lost in
    the rounding of f near the optimum — Hager and Zhang's approximate Wolfe conditions:
    f_new within a few ulps of f and the directional derivative −0.8 φ'(0) ≤ φ'(α) ≤ 0.9 φ'(0)."""
    finite = jnp.isfinite(f_new) & jnp.isfinite(dphi_new)
    armijo = f_new >= f + _C1 * alpha * slope
    rounding = 64 * jnp.finfo(jnp.result_type(f)).eps * jnp.abs(f)
    approximate = (f_new >= f - rounding) & (dphi_new >= -0.8 * slope) & (dphi_new <= 0.9 * slope)
    return finite & (armijo | approximate)


def _newton_loop(solver, fn, x0, local_model, direction):
    """Shared outer loop of the Newton solvers.

    ``local_model(x)`` returns the objective, its gradient and curvature information at
    ``x``; ``direction(x, g, curvature)`` returns a Newton direction and the number of
    Hessian-vector products it used. The full step is tried first *with* the local model
    at the trial point, so an accepted step (the usual case) costs no extra evaluation;
    otherwise an Armijo backtracking search halves the step.
    """

    def direction_unless_converged(x, g, curv):
        # No direction is needed where the loop will stop anyway.
        d, n_hvp = jax.lax.cond(_max_abs(g) < solver.tol,
                                lambda: (jnp.zeros_like(g), jnp.array(0)),
                                lambda: direction(x, g, curv))
        d, slope = _ascent(g, d)
        return d, slope, n_hvp

    def model_and_direction(x):
        f, g, curv = local_model(x)
        return (f, g) + direction_unless_converged(x, g, curv)

    f0, g0, d0, slope0, n_hvp0 = model_and_direction(x0)
    trace = jnp.full((solver.max_iter + 1,), jnp.nan, f0.dtype).at[0].set(f0)
    zero = jnp.array(0)
    state = _LoopState(x0, f0, g0, d0, slope0, zero, jnp.array(False), trace, zero, jnp.array(1), n_hvp0)

    def cond(s):
        return (s.k < solver.max_iter) & ~s.failed & (_max_abs(s.g) >= solver.tol)

    def body(s):
        x_try = s.x + s.d
        f_try, g_try, curv_try = local_model(x_try)
        full_step_ok = _acceptable(s.f, s.slope, f_try, jnp.vdot(g_try, s.d))

        def accept():
            d, slope, n_hvp = direction_unless_converged(x_try, g_try, curv_try)
            return x_try, f_try, g_try, d, slope, jnp.array(True), zero, jnp.array(1), n_hvp

        def backtrack():
            alpha, n_val, found = _backtracking(fn, s.x, s.f, s.slope, s.d, 0.5, c1=_C1)
            x_new = jnp.where(found, s.x + alpha * s.d, s.x)
            f, g, d, slope, n_hvp = model_and_direction(x_new)
            return x_new, f, g, d, slope, found, n_val, jnp.array(2), n_hvp

        x, f, g, d, slope, moved, n_val, n_grad, n_hvp = jax.lax.cond(full_step_ok, accept, backtrack)
        return _LoopState(x, f, g, d, slope, s.k + moved, ~moved,
                          jnp.where(moved, s.trace.at[s.k + 1].set(f), s.trace),
                          s.n_val + n_val, s.n_grad + n_grad, s.n_hvp + n_hvp)

    s = jax.lax.while_loop(cond, body, state)
    converged = _max_abs(s.g) < solver.tol
    return Solution(s.x, s.f, _max_abs(s.g), s.k, converged, s.trace, s.n_val, s.n_grad, s.n_hvp)


class NewtonCG(AbstractSolver):
    """Hessian-free (truncated) Newton.

    The Newton system −∇²f · d = ∇f is solved by preconditioned conjugate gradients
    to relative residual η_k = min(½, √max|∇f|) (loose far from the optimum, where a
    short CG run is a well-scaled preconditioned gradient step; tight near it, for
    superlinear convergence), stopping early on non-negative curvature. With a concave objective (G-KL with log-concave sites) the steps
    converge superlinearly.

    **Arguments:** `tol` (max |gradient| at convergence), `max_iter` (Newton
    iterations), `max_cg` (CG iterations per Newton step).
    """

    tol: float = eqx.field(static=True, default=1e-3)
    max_iter: int = eqx.field(static=True, default=100)
    max_cg: int = eqx.field(static=True, default=50)

    def maximise(self, fn, x0, preconditioner=None):
        value_and_grad = jax.value_and_grad(fn)

        def local_model(x):
            (f, g), linear = jax.linearize(value_and_grad, x)
            return f, g, lambda v: linear(v)[1]

        def direction(x, g, hvp):
            precond = preconditioner(x) if preconditioner is not None else (lambda v: v)
            return _pcg(lambda v: -hvp(v), g, precond, self.max_cg)

        return _newton_loop(self, fn, x0, local_model, direction)


def _pcg(A, b, M, max_iter):
    """Truncated preconditioned CG for A d = b; returns (d, number of products with A)."""
    b_norm = jnp.linalg.norm(b)
    forcing = jnp.minimum(0.5, jnp.sqrt(jnp.max(jnp.abs(b)))) * b_norm
    z = M(b)

    class S(NamedTuple):
        d: jax.Array
        r: jax.Array
        z: jax.Array
        p: jax.Array
        rz: jax.Array
        i: jax.Array
        stop: jax.Array

    def cond(s):
        return (s.i < max_iter) & ~s.stop & (jnp.linalg.norm(s.r) > forcing)

    def body(s):
        Ap = A(s.p)
        curvature = jnp.vdot(s.p, Ap)
        negative = curvature <= 0
        alpha = s.rz / jnp.where(negative, 1.0, curvature)
        # On non-positive curvature keep the current iterate (or the preconditioned gradient at the start).
        d = jnp.where(negative, jnp.where(s.i == 0, s.z, s.d), s.d + alpha * s.p)
        r = s.r - alpha * Ap
        z = M(r)
        rz = jnp.vdot(r, z)
        p = z + (rz / s.rz) * s.p
        return S(d, r, z, p, rz, s.i + 1, negative)

    zero = jnp.zeros_like(b)
    s = jax.lax.while_loop(cond, body, S(zero, b, z, z, jnp.vdot(b, z), jnp.array(0), jnp.array(False)))
    return s.d, s.i


class Newton(AbstractSolver):
    """Dense Newton: forms the Hessian by autodiff; for small parameter counts.

    An indefinite Hessian is replaced by −V max(|λ|, δ) Vᵀ (its eigenvalues made
    negative), so every step is an ascent direction.
    """

    tol: float = eqx.field(static=True, default=1e-3)
    max_iter: int = eqx.field(static=True, default=100)

    def maximise(self, fn, x0, preconditioner=None):
        def local_model(x):
            f, g = jax.value_and_grad(fn)(x)
            return f, g, jax.hessian(fn)(x)

        def direction(x, g, hessian):
            lam, V = jnp.linalg.eigh(-hessian)
            floor = 1e-10 * jnp.maximum(jnp.max(jnp.abs(lam)), 1.0)
            lam = jnp.maximum(jnp.abs(lam), floor)
            return V @ ((V.T @ g) / lam), jnp.array(x.shape[0])

        return _newton_loop(self, fn, x0, local_model, direction)


class LBFGS(AbstractSolver):
    """L-BFGS (optax) with its zoom line search; ``memory`` past updates."""

    tol: float = eqx.field(static=True, default=1e-3)
    max_iter: int = eqx.field(static=True, default=1000)
    memory: int = eqx.field(static=True, default=10)

    def maximise(self, fn, x0, preconditioner=None):
        loss = lambda x: -fn(x)
        opt = optax.lbfgs(memory_size=self.memory)
        value_and_grad = optax.value_and_grad_from_state(loss)
        opt_state = opt.init(x0)
        f0, g0 = jax.value_and_grad(loss)(x0)
        trace = jnp.full((self.max_iter + 1,), jnp.nan, f0.dtype).at[0].set(-f0)

        def cond(s):
            x, state, g, k, _, _ = s
            return (k < self.max_iter) & (_max_abs(g) >= self.tol) & jnp.all(jnp.isfinite(x))

        def body(s):
            x, state, g, k, trace, n_val = s
            value, grad = value_and_grad(x, state=state)
            updates, state = opt.update(grad, state, x, value=value, grad=grad, value_fn=loss)
            x = optax.apply_updates(x, updates)
            value = optax.tree.get(state, "value")
            grad = optax.tree.get(state, "grad")
            n_ls = optax.tree.get(state, "info").num_linesearch_steps
            return x, state, grad, k + 1, trace.at[k + 1].set(-value), n_val + n_ls

        x, state, g, k, trace, n_val = jax.lax.while_loop(cond, body, (x0, opt_state, g0, jnp.array(0), trace, jnp.array(0)))
        f = -optax.tree.get(state, "value")
        f = jnp.where(k == 0, -f0, f)
        return Solution(x, f, _max_abs(g), k, _max_abs(g) < self.tol, trace, n_val, n_val + 1, jnp.array(0))


class _CGState(NamedTuple):
    x: jax.Array
    f: jax.Array
    g: jax.Array
    z: jax.Array  # preconditioned gradient M g
    d: jax.Array
    slope: jax.Array  # gᵀd > 0
    gain: jax.Array  # f_k − f_{k−1}, for the next initial step
    k: jax.Array
    failed: jax.Array
    trace: jax.Array
    n_grad: jax.Array


class NonlinearCG(AbstractSolver):
    """Preconditioned nonlinear conjugate gradients (Polak–Ribière+), for very large problems.

    With z_k = M_k g_k (M_k the preconditioner at x_k, or the identity),

    .. math::

        d_k = z_k + \\beta_k d_{k-1}, \\qquad
        \\beta_k = \\max\\Big(0, \\frac{z_k^\\top (g_k - g_{k-1})}{z_{k-1}^\\top g_{k-1}}\\Big),

    restarted (d_k = z_k) whenever d_k is not an ascent direction. The step along d_k meets
    the strong Wolfe conditions with curvature constant ``c2`` (see `_wolfe`), started from
    α₀ = min(1, 2.02 (f_k − f_{k−1}) / g_kᵀd_k) (α₀ = 1 at the first iteration and after a
    stall, where the preconditioned gradient is Newton-scaled; 1/max|g| without a
    preconditioner). Every trial evaluates the objective *and* its gradient, so the accepted
    trial needs no extra evaluation: one to a few gradients per iteration and O(dim) memory,
    which is why it suits problems too large for the Hessian-vector products of `NewtonCG`.

    ``c2`` trades line-search work for conjugacy: 0.1 (default) is cheapest on G-KL
    bounds; a small value (0.01) makes each line search nearly exact, which recovers the
    finite termination of linear CG on quadratics without a preconditioner.

    **Arguments:** `tol` (max |gradient| at convergence), `max_iter` (iterations),
    `max_backtracks` (line-search trials per iteration), `c2` (Wolfe curvature constant).
    """

    tol: float = eqx.field(static=True, default=1e-3)
    max_iter: int = eqx.field(static=True, default=1000)
    max_backtracks: int = eqx.field(static=True, default=30)
    c2: float = eqx.field(static=True, default=0.1)

    def maximise(self, fn, x0, preconditioner=None):
        value_and_grad = jax.value_and_grad(fn)
        precondition = (lambda x, g: preconditioner(x)(g)) if preconditioner is not None else (lambda x, g: g)

        def line_search(s):
            first = 1.0 if preconditioner is not None else 1.0 / jnp.maximum(_max_abs(s.g), 1.0)
            alpha0 = jnp.where(s.gain > 0, jnp.minimum(1.0, 2.02 * s.gain / s.slope), first)
            return _wolfe(value_and_grad, s.x, s.f, s.g, s.d, s.slope, alpha0, self.max_backtracks, self.c2)

        def body(s):
            alpha, f, g, ok, n = line_search(s)
            x = jnp.where(ok, s.x + alpha * s.d, s.x)
            f, g = jnp.where(ok, f, s.f), jnp.where(ok, g, s.g)
            z = precondition(x, g)
            beta = jnp.maximum(0.0, jnp.vdot(z, g - s.g) / jnp.vdot(s.z, s.g))
            d, slope = _restarted(g, z, z + beta * s.d)
            return _CGState(x, f, g, z, d, slope, f - s.f, s.k + ok, ~ok,
                            jnp.where(ok, s.trace.at[s.k + 1].set(f), s.trace), s.n_grad + n)

        def cond(s):
            return (s.k < self.max_iter) & ~s.failed & (_max_abs(s.g) >= self.tol)

        f0, g0 = value_and_grad(x0)
        z0 = precondition(x0, g0)
        trace = jnp.full((self.max_iter + 1,), jnp.nan, f0.dtype).at[0].set(f0)
        zero = jnp.zeros((), f0.dtype)
        d0, slope0 = _restarted(g0, z0, z0)
        state = _CGState(x0, f0, g0, z0, d0, slope0, zero, jnp.array(0), jnp.array(False), trace, jnp.array(1))
        s = jax.lax.while_loop(cond, body, state)
        return Solution(s.x, s.f, _max_abs(s.g), s.k, _max_abs(s.g) < self.tol, s.trace,
                        jnp.array(0), s.n_grad, jnp.array(0))


class _Bracket(NamedTuple):
    lo: jax.Array  # best acceptable step so far (0 at the start) ...
    f_lo: jax.Array
    g_lo: jax.Array  # ... its objective and gradient
    dphi_lo: jax.Array  # and directional derivative
    hi: jax.Array  # the other end of a bracket around the maximum along d (inf until one is known)
    f_hi: jax.Array
    dphi_hi: jax.Array
    alpha: jax.Array  # the next trial
    done: jax.Array
    n: jax.Array


def _wolfe(value_and_grad, x, f, g, d, slope, alpha0, max_trials, c2):
    """A step α along ascent direction ``d`` meeting the strong Wolfe conditions

        φ(α) ≥ φ(0) + c₁ α φ'(0)   and   |φ'(α)| ≤ c₂ φ'(0),     φ(α) = fn(x + α d).

    Near the optimum the sufficient-increase test is lost in the rounding of φ; there the
    approximate Wolfe conditions of `_acceptable` stand in for it.

    Each trial evaluates fn and its gradient, so the accepted step's gradient comes for
    free. Before a bracket is known, the next trial extrapolates φ' linearly to zero (at
    most ×10); inside a bracket [lo, hi] (either order) it is the zero of the secant on φ'
    when the ends' derivatives have opposite signs, else the maximiser of the quadratic
    through φ(lo), φ'(lo), φ(hi), kept 10 % away from both ends. On a quadratic the second
    trial is exact. Returns (α, f, g, found, trials); where the curvature condition is never
    met the best acceptable step is returned, and ``found`` is False only if there is none.
    """
    dtype = x.dtype
    inf = jnp.asarray(jnp.inf, dtype)
    c2_slope = c2 * slope

    def cond(b):
        return ~b.done & (b.n < max_trials)

    def body(b):
        f_a, g_a = value_and_grad(x + b.alpha * d)
        dphi_a = jnp.vdot(g_a, d)
        finite = jnp.isfinite(f_a) & jnp.isfinite(dphi_a)
        flat = jnp.abs(dphi_a) <= c2_slope
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
        use_secant = jnp.isfinite(dphi_hi) & (dphi_hi * dphi_lo < 0)
        inside = jnp.where(use_secant, secant,
                           jnp.where(jnp.isfinite(f_hi) & (shortfall > 0), quadratic, lo + 0.5 * width))
        margin = 0.1 * width
        inside = jnp.clip(inside, jnp.minimum(lo + margin, hi - margin), jnp.maximum(lo + margin, hi - margin))
        # No bracket yet (lo moved forward, φ' still positive): extrapolate φ' to zero.
        decreasing = b.dphi_lo > dphi_lo
        step = jnp.where(decreasing, (lo - b.lo) * dphi_lo / jnp.where(decreasing, b.dphi_lo - dphi_lo, 1.0), jnp.inf)
        beyond = lo + jnp.minimum(step, 9.0 * lo)
        alpha = jnp.where(done, b.alpha, jnp.where(jnp.isfinite(hi), inside, beyond))
        return _Bracket(lo, f_lo, g_lo, dphi_lo, hi, f_hi, dphi_hi, alpha, done, b.n + 1)

    start = _Bracket(jnp.zeros((), dtype), f, g, slope, inf, -inf, jnp.asarray(jnp.nan, dtype),
                     jnp.asarray(alpha0, dtype), jnp.array(False), jnp.array(0))
    b = jax.lax.while_loop(cond, body, start)
    return b.lo, b.f_lo, b.g_lo, b.lo > 0, b.n


def _restarted(g, z, d):
    """``d`` if it is an ascent direction, else a restart along the preconditioned gradient ``z``
    (or along ``g`` itself should the preconditioner not be positive definite there)."""
    z, _ = _ascent(g, z)
    slope = jnp.vdot(g, d)
    ok = slope > 0
    return jnp.where(ok, d, z), jnp.where(ok, slope, jnp.vdot(g, z))
