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
from .._keywords import renamed
from ..posterior import Diagnostics, Posterior
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
      log Ẑ fell below ``tol`` before ``max_iter`` (a step whose log Ẑ is not finite stops the run at
      the last finite point, not converged), ``stationarity`` that last relative change, ``grad_norm``
      max |∂ log Ẑ/∂θ| at the last step (θ: the log-parameters), ``num_value_evals`` and
      ``num_grad_evals`` the fits and gradients outside the optimizer's line search.
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
                        tol: float = 1e-6, progress: bool = False, num_steps: int | None = None) -> HyperparameterFit:
    """Maximise the method's log Ẑ over the kernel's and the likelihood's parameters.

    **Arguments:**

    - `kernel`, `X`, `likelihood`, `labels`, `mean`, `jitter`: as for `vj.gp.model`.
    - `method`: any vijax method (`vj.GKL()`, `vj.EP()`, `vj.Laplace()`, `vj.LVB()`, …).
    - `train_likelihood`: names of positive likelihood parameters to learn; default ``("scale",)``
      when the likelihood has a scale, else none. ``()`` keeps the likelihood fixed.
    - `optimizer`: an optax transformation minimising −log Ẑ; default ``optax.lbfgs()`` (its line
      search re-runs the warm-started inner fit).
    - `max_iter`, `tol`: at most ``max_iter`` outer steps; stop when log Ẑ changes by less than
      ``tol·(1 + |log Ẑ|)``. (``num_steps`` is the deprecated name of ``max_iter``.)
    - `progress`: print log Ẑ after every step.
    """
    owner = "vj.gp.fit_hyperparameters"
    max_iter = renamed(owner, "num_steps", "max_iter", num_steps, max_iter)
    if train_likelihood is None:
        train_likelihood = ("scale",) if hasattr(likelihood, "scale") else ()
    for name in train_likelihood:
        if not hasattr(likelihood, name):
            raise ValueError(f"{owner}: the {type(likelihood).__name__} likelihood has no parameter `{name}`.")
    if not (isinstance(max_iter, int) and max_iter >= 1):
        raise ValueError(f"{owner}: `max_iter` must be a positive integer, got {max_iter!r}.")
    optimizer = _LBFGS if optimizer is None else optimizer
    # Everything the jitted functions need travels as arguments (arrays traced, the rest static), so
    # a second call with data of the same shapes reuses the compiled start, step and fit. The inner fit
    # is carried as the method's State: each step starts from the last step's fit.
    data = (X, likelihood, labels, mean, jitter)
    params = (kernel, {name: jnp.log(jnp.asarray(getattr(likelihood, name))) for name in train_likelihood})
    state = _start(params, data, method)
    # optax.lbfgs's state holds weakly typed scalars, which its update returns strongly typed: made strong
    # here, so the step compiles once rather than once more at its second call.
    opt_state = _checks.strongly_typed(optimizer.init(params))
    trace, converged, change, grad_norm, steps = [], False, np.inf, np.nan, 0
    post, stale = None, False  # the fit at `params`; whether `params` moved past it
    for it in range(max_iter):
        new_params, opt_state, fitted, step_grad_norm = _step(params, opt_state, state, data, method, optimizer)
        steps += 1
        value = float(fitted.log_z)
        if progress:
            print(f"{owner}: step {it:4d}  log Z = {value:.6f}", flush=True)
        if not np.isfinite(value):  # stop at the last finite point (or report the failed first fit)
            if post is None:
                post, post_params = fitted, params
            params, stale = post_params, False
            break
        post, post_params, stale = fitted, params, False
        grad_norm = float(step_grad_norm)
        trace.append(value)
        if it > 0:
            change = abs(trace[-1] - trace[-2]) / (1 + abs(value))
            if change <= tol:
                converged = True
                break
        params, state, stale = new_params, post.state, True
    if stale:  # out of steps: the fit at the last parameters (a converged run's last fit is already there)
        post = _fit(params, data, method, state)
        trace.append(float(post.log_z))
    dtype = jnp.result_type(post.log_z)
    diagnostics = Diagnostics(
        iterations=jnp.asarray(len(trace) - 1), converged=jnp.asarray(converged),
        stationarity=jnp.asarray(change, dtype),
        grad_norm=jnp.asarray(grad_norm, dtype), objective_trace=jnp.asarray(trace, dtype),
        num_value_evals=jnp.asarray(steps + stale), num_grad_evals=jnp.asarray(steps), num_hvp_evals=jnp.asarray(0),
        method=post.diagnostics.method, solver="ML-II (optax)")
    return HyperparameterFit(params[0], _likelihood(params, data), post, post.log_z, diagnostics)


_LBFGS = optax.lbfgs()  # one instance, so the default optimizer hashes equal across calls


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
def _fit(params, data, method, state):
    return method.fit(_build(params, data)[0], state)


@eqx.filter_jit
def _step(params, opt_state, state, data, method, optimizer):
    """One optimizer step on −log Ẑ; ``state`` (the fit at the previous point) warm-starts the fits."""
    (value, post), grad = eqx.filter_value_and_grad(_negative_log_z, has_aux=True)(params, data, method, state)
    updates, opt_state = optimizer.update(grad, opt_state, params, value=value, grad=grad,
                                          value_fn=lambda p: _negative_log_z(p, data, method, state)[0])
    leaves = [jnp.max(jnp.abs(g)) for g in jax.tree_util.tree_leaves(grad)]
    grad_norm = jnp.max(jnp.stack(leaves)) if leaves else jnp.zeros(())
    return optax.apply_updates(params, updates), opt_state, post, grad_norm
