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
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

__all__ = ["AbstractSolver", "NewtonCG", "Newton", "LBFGS", "Solution"]


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
        return jnp.isfinite(f_new) & (f_new >= f + c1 * alpha * slope)

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
        full_step_ok = jnp.isfinite(f_try) & (f_try >= s.f + _C1 * s.slope)

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
