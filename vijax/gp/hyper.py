"""Type-II maximum likelihood (ML-II) for GP hyperparameters.

    θ* = argmax_θ  log Ẑ(θ),    log Ẑ = vj.infer(vj.gp.model(kernel_θ, X, likelihood_θ), method).log_z

The gradient is that of ``post.log_z`` (the envelope theorem: each method evaluates its objective
once more at its stopped-gradient optimum, so ∂ log Ẑ/∂θ needs no differentiation through the inner
fit). Each outer step warm-starts the inner fit from the previous posterior. Kernel parameters are
stored as logarithms, and the trained likelihood parameters (by default its ``scale``) are optimised
as logarithms too, so every step keeps them positive.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from .. import _checks
from ..posterior import Diagnostics, Posterior
from ..solvers import Status
from .kernels import AbstractKernel
from .models import DEFAULT_JITTER, model
from ..methods import AbstractMethod
from ..potentials import AbstractPotential

__all__ = ["fit_hyperparameters", "HyperparameterFit"]


class HyperparameterFit(eqx.Module):
    """The result of `fit_hyperparameters`.

    - `kernel`, `likelihood`: at the optimum.
    - `posterior`: the method's fit at the optimum; ``posterior.model`` is the `vj.gp.GPModel` built
      with the fitted kernel and likelihood, so ``vj.gp.predict(fit.posterior, X_test)`` predicts
      under them.
    - `log_z`: the final log Ẑ, ``posterior.log_z`` (a scalar).
    - `diagnostics`: a `vj.Diagnostics` of the outer (ML-II) loop: ``objective_trace`` holds log Ẑ
      per outer step (the first entry at the start, the last at the returned point), ``iterations`` the
      parameter updates kept (one less than the trace's length), ``converged`` whether the change of
      log Ẑ fell below ``tol`` before ``max_iter`` (a step whose log Ẑ is not finite, or a line search
      that finds no rise, stops the run at the last point, not converged), ``stationarity`` that last
      relative change, ``grad_norm`` max |∂ log Ẑ/∂θ| at the returned point (θ: the log-parameters),
      ``num_value_evals`` and ``num_grad_evals`` the fits (each with its gradient) of the run,
      line-search trials included.
    """

    kernel: AbstractKernel
    likelihood: object
    posterior: Posterior
    log_z: jax.Array
    diagnostics: Diagnostics

    @property
    def converged(self) -> bool:
        """Whether the outer loop met its stopping rule (``diagnostics.converged``)."""
        return bool(self.diagnostics.converged)


def fit_hyperparameters(kernel: AbstractKernel, X: ArrayLike, likelihood: AbstractPotential, method: AbstractMethod, *,
                        labels: ArrayLike | None = None, mean: ArrayLike = 0.0, jitter: float = DEFAULT_JITTER,
                        train_likelihood: tuple[str, ...] | None = None,
                        optimizer: optax.GradientTransformation | None = None, max_iter: int = 100,
                        tol: float = 1e-6, progress: bool = False) -> HyperparameterFit:
    """Maximise the method's log Ẑ over the kernel's and the likelihood's parameters.

    **Arguments:**

    - `kernel`, `X`, `likelihood`, `labels`, `mean`, `jitter`: as for `vj.gp.model`.
    - `method`: any vijax method (`vj.GKL()`, `vj.EP()`, `vj.Laplace()`, `vj.LVB()`, …).
    - `train_likelihood`: names of positive likelihood parameters to learn; default ``("scale",)``
      when the likelihood has a scale, else none. ``()`` keeps the likelihood fixed.
    - `optimizer`: None (default) for L-BFGS: directions from ``optax.scale_by_lbfgs`` (the first one
      of length at most 1 in the log-parameters), step lengths by backtracking from 1 until log Ẑ
      rises by the Armijo fraction 10⁻⁴ of the predicted gain. Each trial is one warm-started fit and
      its envelope gradient, one compiled program, so an accepted full step costs one fit. Or an optax
      transformation minimising −log Ẑ, whose updates are all taken (it receives ``value``,
      ``grad`` and ``value_fn``, so optax's own line searches work too).
    - `max_iter`, `tol`: at most ``max_iter`` outer steps; stop when log Ẑ changes by less than
      ``tol·(1 + |log Ẑ|)``.
    - `progress`: print log Ẑ after every step.
    """
    owner = "vj.gp.fit_hyperparameters"
    if train_likelihood is None:
        train_likelihood = ("scale",) if hasattr(likelihood, "scale") else ()
    for name in train_likelihood:
        if not hasattr(likelihood, name):
            raise ValueError(f"{owner}: the {type(likelihood).__name__} likelihood has no parameter `{name}`.")
    if not (isinstance(max_iter, int) and max_iter >= 1):
        raise ValueError(f"{owner}: `max_iter` must be a positive integer, got {max_iter!r}.")
    # Everything the jitted functions need travels as arguments (arrays traced, the rest static), so
    # a second call with data of the same shapes reuses the compiled start, evaluation and direction. The
    # inner fit is carried as the method's State: each fit starts from the last accepted one.
    data = (X, likelihood, labels, mean, jitter)
    params = (kernel, {name: jnp.log(jnp.asarray(getattr(likelihood, name))) for name in train_likelihood})
    transform = _LBFGS if optimizer is None else optimizer
    # Optimizer states hold weakly typed scalars, which their updates return strongly typed: made strong
    # here, so that the direction (or update) compiles once rather than once more at its second call.
    opt_state = _checks.strongly_typed(transform.init(params))
    (value, post), grad = _value_and_grad(params, data, method, _start(params, data, method))
    trace, evals, converged, stalled, change = [-float(value)], 1, False, False, np.inf
    if progress:
        print(f"{owner}: step    0  log Z = {trace[0]:.6f}", flush=True)
    for it in range(1, max_iter + 1) if np.isfinite(trace[0]) else ():
        if optimizer is None:
            direction, new_state, predicted = _lbfgs_direction(grad, opt_state, params)
            predicted = float(predicted)  # −log Ẑ falls by about α·predicted along −direction
            alpha, accepted = 1.0, False
            for _ in range(_MAX_HALVINGS):
                trial = _along(params, direction, jnp.asarray(alpha))
                (t_value, t_post), t_grad = _value_and_grad(trial, data, method, post.state)
                evals += 1
                limit = float(value) - _ARMIJO * alpha * predicted + _RISE_TOLERANCE * (1 + abs(float(value)))
                if np.isfinite(float(t_value)) and float(t_value) <= limit:
                    accepted = True
                    break
                alpha *= 0.5
            if not accepted:  # no step raises log Ẑ: stop at the last point
                stalled = True
                break
        else:
            trial, new_state = _update(grad, opt_state, params, value, data, method, post.state, transform)
            (t_value, t_post), t_grad = _value_and_grad(trial, data, method, post.state)
            evals += 1
            if not np.isfinite(float(t_value)):  # stop at the last finite point
                stalled = True
                break
        params, opt_state, value, post, grad = trial, new_state, t_value, t_post, t_grad
        trace.append(-float(value))
        if progress:
            print(f"{owner}: step {it:4d}  log Z = {trace[-1]:.6f}", flush=True)
        change = abs(trace[-1] - trace[-2]) / (1 + abs(trace[-1]))
        if change <= tol:
            converged = True
            break
    leaves = [jnp.max(jnp.abs(g)) for g in jax.tree_util.tree_leaves(grad)]
    dtype = jnp.result_type(post.log_z)
    diagnostics = Diagnostics(
        iterations=jnp.asarray(len(trace) - 1), status=Status.of(converged, value=trace[-1], stalled=stalled),
        stationarity=jnp.asarray(change, dtype),
        grad_norm=jnp.max(jnp.stack(leaves)).astype(dtype) if leaves else jnp.zeros((), dtype),
        objective_trace=jnp.asarray(trace, dtype), num_value_evals=jnp.asarray(evals),
        num_grad_evals=jnp.asarray(evals), num_hvp_evals=jnp.asarray(0),
        method=post.diagnostics.method, solver="ML-II (L-BFGS)" if optimizer is None else "ML-II (optax)")
    return HyperparameterFit(params[0], _likelihood(params, data), post, post.log_z, diagnostics)


_LBFGS = optax.scale_by_lbfgs()  # one instance, so the default hashes equal across calls
_ARMIJO = 1e-4
_MAX_HALVINGS = 30
# A trial may lower log Ẑ by this much relative to |log Ẑ|: the inner fits' rounding, which decides
# nothing once the gain is that small (the change test then stops the run).
_RISE_TOLERANCE = 1e-12


def _likelihood(params, data):
    lik = data[1]
    for name, value in params[1].items():
        lik = eqx.tree_at(lambda p, name=name: getattr(p, name), lik, jnp.exp(value))
    return lik


def _build(params, data):
    X, _, labels, mean, jitter = data
    lik = _likelihood(params, data)
    return model(params[0], X, lik, labels=labels, mean=mean, jitter=jitter), lik


@eqx.filter_jit
def _start(params, data, method):
    """The inner method's start at ``params``, the model built inside the program (its kernel matrix and
    Cholesky factor are not computed op by op)."""
    return method.start(_build(params, data)[0])


def _negative_log_z(params, data, method, state):
    post = method.fit(_build(params, data)[0], state)
    return -post.log_z, post


@eqx.filter_jit
def _value_and_grad(params, data, method, state):
    """``((−log Ẑ, the fit), ∂(−log Ẑ)/∂params)`` at ``params``, the fit warm-started from ``state``:
    the one program that holds the inner fit."""
    return eqx.filter_value_and_grad(_negative_log_z, has_aux=True)(params, data, method, state)


@eqx.filter_jit
def _lbfgs_direction(grad, opt_state, params):
    """L-BFGS's direction d = H·∇ at ``params`` (its memory updated with this point), the new state and
    ∇ᵀd, the first-order fall of −log Ẑ along −d."""
    direction, opt_state = _LBFGS.update(grad, opt_state, params)
    return direction, opt_state, optax.tree.vdot(grad, direction)


@eqx.filter_jit
def _along(params, direction, alpha):
    """params − α·direction."""
    return jax.tree_util.tree_map(lambda p, d: p - alpha.astype(p.dtype) * d, params, direction)


@eqx.filter_jit
def _update(grad, opt_state, params, value, data, method, state, optimizer):
    """A given optax optimizer's step from ``params``."""
    updates, opt_state = optimizer.update(grad, opt_state, params, value=value, grad=grad,
                                          value_fn=lambda p: _negative_log_z(p, data, method, state)[0])
    return optax.apply_updates(params, updates), opt_state
