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
import jax.numpy as jnp
import numpy as np
import optax

from ..inference import infer
from ..posterior import Posterior
from .kernels import AbstractKernel
from .models import DEFAULT_JITTER, model

__all__ = ["fit_hyperparameters", "HyperparameterFit"]


class HyperparameterFit(eqx.Module):
    """The result of `fit_hyperparameters`.

    - `kernel`, `likelihood`: at the optimum.
    - `posterior`: the method's fit at the optimum.
    - `log_z`: ``posterior.log_z`` per outer step (a NumPy array; the first entry is at the start).
    - `converged`: whether the change of log Ẑ fell below ``tol`` before ``num_steps``. A step whose
      log Ẑ is not finite stops the run at the last finite point (``converged`` False).
    """

    kernel: AbstractKernel
    likelihood: object
    posterior: Posterior
    log_z: np.ndarray
    converged: bool = eqx.field(static=True)


def fit_hyperparameters(kernel, X, likelihood, method, *, labels=None, mean=0.0, jitter=DEFAULT_JITTER,
                        train_likelihood=None, optimizer=None, num_steps=100, tol=1e-6,
                        progress=False) -> HyperparameterFit:
    """Maximise the method's log Ẑ over the kernel's and the likelihood's parameters.

    **Arguments:**

    - `kernel`, `X`, `likelihood`, `labels`, `mean`, `jitter`: as for `vj.gp.model`.
    - `method`: any vijax method (`vj.GKL()`, `vj.EP()`, `vj.Laplace()`, `vj.LVB()`, …).
    - `train_likelihood`: names of positive likelihood parameters to learn; default ``("scale",)``
      when the likelihood has a scale, else none. ``()`` keeps the likelihood fixed.
    - `optimizer`: an optax transformation minimising −log Ẑ; default ``optax.lbfgs()`` (its line
      search re-runs the warm-started inner fit).
    - `num_steps`, `tol`: at most ``num_steps`` outer steps; stop when log Ẑ changes by less than
      ``tol·(1 + |log Ẑ|)``.
    - `progress`: print log Ẑ after every step.
    """
    owner = "vj.gp.fit_hyperparameters"
    if train_likelihood is None:
        train_likelihood = ("scale",) if hasattr(likelihood, "scale") else ()
    for name in train_likelihood:
        if not hasattr(likelihood, name):
            raise ValueError(f"{owner}: the {type(likelihood).__name__} likelihood has no parameter `{name}`.")
    if not (isinstance(num_steps, int) and num_steps >= 1):
        raise ValueError(f"{owner}: `num_steps` must be a positive integer, got {num_steps!r}.")
    optimizer = optax.lbfgs() if optimizer is None else optimizer

    def build(params):
        kern, logs = params
        lik = likelihood
        for name, value in logs.items():
            lik = eqx.tree_at(lambda p, name=name: getattr(p, name), lik, jnp.exp(value))
        return model(kern, X, lik, labels=labels, mean=mean, jitter=jitter), lik

    def negative_log_z(params, init):
        post = infer(build(params)[0], method, init=init)
        return -post.log_z, post

    @eqx.filter_jit
    def step(params, opt_state, init):
        (value, post), grad = eqx.filter_value_and_grad(negative_log_z, has_aux=True)(params, init)
        updates, opt_state = optimizer.update(grad, opt_state, params, value=value, grad=grad,
                                              value_fn=lambda p: negative_log_z(p, init)[0])
        return optax.apply_updates(params, updates), opt_state, post

    params = (kernel, {name: jnp.log(jnp.asarray(getattr(likelihood, name))) for name in train_likelihood})
    refit = eqx.filter_jit(lambda p, init: infer(build(p)[0], method, init=init))
    post = eqx.filter_jit(lambda p: infer(build(p)[0], method))(params)
    opt_state = optimizer.init(params)
    trace, converged = [], False
    good = (params, post)  # the last point whose fit was finite
    for it in range(num_steps):
        # ``post`` (the fit at the previous point) warm-starts the fit at ``params`` inside the step.
        new_params, opt_state, post = step(params, opt_state, post)
        value = float(post.log_z)
        if progress:
            print(f"{owner}: step {it:4d}  log Z = {value:.6f}", flush=True)
        if not np.isfinite(value):
            params, post = good
            break
        good = (params, post)
        trace.append(value)
        if it > 0 and abs(trace[-1] - trace[-2]) <= tol * (1 + abs(value)):
            converged = True
            break
        params = new_params
    post = refit(params, post)
    trace.append(float(post.log_z))
    return HyperparameterFit(params[0], build(params)[1], post, np.asarray(trace), converged)
