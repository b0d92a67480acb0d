"""Type-II maximum likelihood (ML-II) for GP hyperparameters.

    θ* = argmax_θ  log Ẑ(θ),    log Ẑ = vj.infer(vj.gp.model(kernel_θ, X, likelihood_θ), method).log_z

The gradient is that of ``post.log_z`` (envelope theorem: the inner fit is not differentiated through);
each outer step warm-starts the inner fit from the previous one. Parameters are optimised as logarithms.
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
from ._layout import MulticlassModel, model as multiclass_model
from .models import DEFAULT_JITTER, model
from ..methods import AbstractMethod
from ..potentials import AbstractPotential

__all__ = ["fit_hyperparameters", "HyperparameterFit"]


class HyperparameterFit(eqx.Module):
    """The result of `fit_hyperparameters`.

    - `kernel`, `likelihood`: at the optimum; `posterior`: the method's fit there (its model records them,
      so ``vj.gp.predict(fit.posterior, X_test)`` predicts under them); `log_z`: ``posterior.log_z``.
    - `diagnostics`: the returned run's outer loop: ``objective_trace`` log Ẑ at the start and after each
      step, ``stationarity`` the last relative change, ``grad_norm`` max |∂ log Ẑ/∂θ| (θ the
      log-parameters), ``num_value_evals`` the fits, line-search trials included.
    - `run_log_z`: every run's final log Ẑ, ``(num_restarts + 1,)``, the run from the given start first.
    """

    kernel: AbstractKernel
    likelihood: object
    posterior: Posterior
    log_z: jax.Array
    diagnostics: Diagnostics
    run_log_z: jax.Array

    @property
    def converged(self) -> bool:
        """Whether the outer loop met its stopping rule (``diagnostics.converged``)."""
        return bool(self.diagnostics.converged)


def fit_hyperparameters(kernel: AbstractKernel, X: ArrayLike, likelihood: AbstractPotential | None,
                        method: AbstractMethod, *, labels: ArrayLike | None = None, num_classes: int | None = None,
                        mean: ArrayLike = 0.0, jitter: float = DEFAULT_JITTER,
                        train_likelihood: tuple[str, ...] | None = None,
                        optimizer: optax.GradientTransformation | None = None, max_iter: int = 100,
                        tol: float = 1e-6, num_restarts: int = 0, bounds=None, seed=0,
                        progress: bool = False) -> HyperparameterFit:
    """Maximise the method's log Ẑ over the kernel's and the likelihood's parameters.

    **Arguments:**

    - `kernel`, `X`, `likelihood`, `labels`, `mean`, `jitter`: as for `vj.gp.model`.
    - `num_classes`: C for a multi-class GP (one `kernel` shared by the classes; `likelihood` None, `mean` 0),
      fitted by `method` `vj.gp.multiclass.NestedEP()` or `vj.gp.softmax.SoftmaxBound()`.
    - `method`: any vijax method.
    - `train_likelihood`: positive likelihood parameters to learn; default ``("scale",)`` if it has a scale.
    - `optimizer`: None (default) for L-BFGS (``optax.scale_by_lbfgs`` directions, backtracking until log Ẑ
      rises by the Armijo fraction 10⁻⁴ of the predicted gain), or an optax transformation minimising
      −log Ẑ, every update taken (it receives ``value``, ``grad`` and ``value_fn``).
    - `max_iter`, `tol`: at most ``max_iter`` outer steps; stop when log Ẑ changes by less than
      ``tol·(1 + |log Ẑ|)``.
    - `bounds`: None (unbounded), one ``(low, high)`` for every parameter, or a dict from names (kernel
      parameters without ``log_``, and `train_likelihood`'s) to pairs, e.g. ``{"lengthscale": (1e-2, 1e2)}``,
      in the natural scale; the start and every step are clipped into the box.
    - `num_restarts`: further runs from log-parameters drawn uniformly within `bounds` (as scikit-learn's
      ``n_restarts_optimizer``); the best final log Ẑ is returned.
    - `seed`: the restarts' draws, ``numpy.random.default_rng(seed)``.
    - `progress`: print log Ẑ after every step.
    """
    owner = "vj.gp.fit_hyperparameters"
    if num_classes is None:
        if likelihood is None:
            raise ValueError(f"{owner}: `likelihood` is None; give a vj.potentials likelihood, or `num_classes` "
                             "for a multi-class GP (vj.gp.multiclass.model), whose likelihood the method sets.")
        if train_likelihood is None:
            train_likelihood = ("scale",) if hasattr(likelihood, "scale") else ()
        for name in train_likelihood:
            if not hasattr(likelihood, name):
                raise ValueError(f"{owner}: the {type(likelihood).__name__} likelihood has no parameter `{name}`.")
        data = (X, likelihood, labels, mean, jitter, None)
    else:
        data = _multiclass_data(kernel, X, likelihood, labels, num_classes, mean, jitter, train_likelihood, owner)
        train_likelihood = ()
    _checks.integer("max_iter", max_iter, owner)
    _checks.integer("num_restarts", num_restarts, owner, minimum=0)
    # The jitted functions take everything as arguments, so data of the same shapes reuses their programs.
    params = _checks.strongly_typed(
        (kernel, {name: jnp.log(jnp.asarray(getattr(likelihood, name))) for name in train_likelihood}))
    limits = None if bounds is None else _limits(bounds, params, owner)
    starts = [params]
    if num_restarts:
        if limits is None:
            raise ValueError(f"{owner}: `num_restarts` = {num_restarts} draws each restart's parameters within "
                             "`bounds`; give bounds=(low, high) for every parameter or a dict such as "
                             "{'lengthscale': (0.01, 100.0), 'variance': (0.01, 100.0)}.")
        try:
            rng = np.random.default_rng(seed)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{owner}: `seed` must be an int, None or a numpy.random.Generator, got "
                             f"{seed!r}.") from error
        starts += [_draw(params, limits, rng) for _ in range(num_restarts)]
    prefixes = [f"{owner}: run {r}," if num_restarts else f"{owner}:" for r in range(len(starts))]
    runs = [_run(start, data, method, optimizer, limits, max_iter, tol, progress and prefix)
            for start, prefix in zip(starts, prefixes)]
    finals = [run[3][-1] for run in runs]
    best = int(np.argmax(np.where(np.isfinite(finals), finals, -np.inf)))  # the first on ties
    params, post, grad, trace, evals, converged, stalled, change = runs[best]
    if limits is not None:  # at an active bound, only the components that stay in the box
        grad = _free_gradient(grad, params, limits)
    leaves = [jnp.max(jnp.abs(g)) for g in jax.tree_util.tree_leaves(grad)]
    dtype = jnp.result_type(post.log_z)
    diagnostics = Diagnostics(
        iterations=jnp.asarray(len(trace) - 1), status=Status.of(converged, value=trace[-1], stalled=stalled),
        stationarity=jnp.asarray(change, dtype),
        grad_norm=jnp.max(jnp.stack(leaves)).astype(dtype) if leaves else jnp.zeros((), dtype),
        objective_trace=_host_array(trace, dtype), num_value_evals=jnp.asarray(evals),
        num_grad_evals=jnp.asarray(evals), num_hvp_evals=jnp.asarray(0),
        method=post.diagnostics.method, solver="ML-II (L-BFGS)" if optimizer is None else "ML-II (optax)")
    return HyperparameterFit(params[0], _likelihood(params, data), post, post.log_z, diagnostics,
                             _host_array(finals, dtype))


def _host_array(values, dtype):
    """Python floats as a device array (`jax.device_put` compiles nothing)."""
    return jax.device_put(np.asarray(values, dtype=dtype))


def _run(params, data, method, optimizer, limits, max_iter, tol, progress):
    """One ML-II run: ``(params, fit, gradient, trace of log Ẑ, evaluations, converged, stalled, change)``."""
    if limits is not None:
        params = _project(params, limits)
    # Updates return the states' weakly typed scalars strongly typed: made strong here, so they compile once.
    opt_state = _checks.strongly_typed((_LBFGS if optimizer is None else optimizer).init(params))
    (value, post), grad = _value_and_grad(params, data, method, _start(params, data, method))
    trace, evals, converged, stalled, change = [-float(value)], 1, False, False, np.inf
    if progress:
        print(f"{progress} step    0  log Z = {trace[0]:.6f}", flush=True)
    for it in range(1, max_iter + 1) if np.isfinite(trace[0]) else ():
        for trial, new_state, limit in _trials(grad, opt_state, params, value, data, method, post.state, optimizer,
                                               limits):
            (t_value, t_post), t_grad = _value_and_grad(trial, data, method, post.state)
            evals += 1
            if np.isfinite(float(t_value)) and float(t_value) <= limit:
                break
        else:  # no trial is accepted: stop at the last point
            stalled = True
            break
        params, opt_state, value, post, grad = trial, new_state, t_value, t_post, t_grad
        trace.append(-float(value))
        if progress:
            print(f"{progress} step {it:4d}  log Z = {trace[-1]:.6f}", flush=True)
        change = abs(trace[-1] - trace[-2]) / (1 + abs(trace[-1]))
        if change <= tol:
            converged = True
            break
    return params, post, grad, trace, evals, converged, stalled, change


def _trials(grad, opt_state, params, value, data, method, state, optimizer, limits):
    """One outer step's trials: ``(params, new optimizer state, the largest −log Ẑ accepted)``; L-BFGS's
    backtracking to the Armijo condition, or the optax optimizer's one update (accepted where finite)."""
    if optimizer is not None:
        trial, new_state = _update(grad, opt_state, params, value, data, method, state, optimizer)
        yield (trial if limits is None else _project(trial, limits)), new_state, np.inf
        return
    direction, new_state, predicted = _lbfgs_direction(grad, opt_state, params, limits)
    predicted = float(predicted)  # −log Ẑ falls by about α·predicted along −direction
    for halvings in range(_MAX_HALVINGS):
        alpha = 0.5**halvings
        trial, fall = _along(params, direction, jnp.asarray(alpha), limits, grad)
        fall = alpha * predicted if fall is None else float(fall)
        yield trial, new_state, float(value) - _ARMIJO * fall + _RISE_TOLERANCE * (1 + abs(float(value)))


def _multiclass_data(kernel, X, likelihood, labels, num_classes, mean, jitter, train_likelihood, owner):
    """The validated data of a multi-class GP, as ``_build`` takes it."""
    if likelihood is not None:
        raise ValueError(f"{owner}: with `num_classes` the model is vj.gp.multiclass.model and its likelihood is the "
                         f"method's (NestedEP: multinomial probit, SoftmaxBound: softmax); pass likelihood=None, got "
                         f"{type(likelihood).__name__}.")
    if train_likelihood:
        raise ValueError(f"{owner}: a multi-class GP has no likelihood parameters to train; leave `train_likelihood` "
                         f"unset, got {train_likelihood!r}.")
    if labels is None:
        raise ValueError(f"{owner}: a multi-class GP needs `labels`, integer classes in 0 … num_classes − 1.")
    if not (np.ndim(mean) == 0 and _checks.is_concrete(mean) and float(mean) == 0.0):
        raise ValueError(f"{owner}: a multi-class GP has prior mean 0 (vj.gp.multiclass.model has no `mean`); "
                         "leave `mean` at 0.")
    template = multiclass_model(kernel, X, labels, num_classes, jitter)  # validates X, labels, C and jitter
    return (template.X, None, template.labels, 0.0, template.jitter, template.num_classes)


def _names(params):
    """The name of every leaf of ``params`` (a kernel parameter's without ``log_``)."""
    keys = [path[-1] for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return [k.key if isinstance(k, jax.tree_util.DictKey) else getattr(k, "name", str(k)).removeprefix("log_")
            for k in keys]


def _limits(bounds, params, owner):
    """``bounds`` as (low, high) pytrees shaped like ``params``, in the log scale; ±inf where unbounded."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    names = _names(params)
    available = sorted(set(names))

    def pair(value, what):
        try:
            low, high = (float(v) for v in value)
        except (TypeError, ValueError):
            low = high = None
        if low is None or not (0 < low < high < np.inf):
            raise ValueError(f"{owner}: `bounds` {what} must be a pair (low, high) with 0 < low < high < inf, in the "
                             f"parameters' natural scale (e.g. (1e-2, 1e2)); got {value!r}.")
        return np.log(low), np.log(high)

    if isinstance(bounds, dict):
        unknown = sorted(set(bounds) - set(available))
        if unknown:
            raise ValueError(f"{owner}: `bounds` names {unknown}, which are no parameters being fitted; the names are "
                             f"{available} (kernel parameters without their log_ prefix, and `train_likelihood`).")
        table = {name: pair(value, f"for {name!r}") for name, value in bounds.items()}
    else:
        table = dict.fromkeys(available, pair(bounds, "given as one pair"))
    unbounded = (-np.inf, np.inf)

    def limits(side):
        sides = [jnp.full(jnp.shape(leaf), table.get(name, unbounded)[side], jnp.result_type(leaf))
                 for leaf, name in zip(leaves, names)]
        return jax.tree_util.tree_unflatten(treedef, sides)

    return limits(0), limits(1)


def _draw(params, limits, rng):
    """A restart: each bounded log-parameter uniform in [log low, log high], the others as in ``params``."""
    def draw(value, low, high):
        low, high = np.asarray(low), np.asarray(high)
        bounded = np.isfinite(low) & np.isfinite(high)
        drawn = rng.uniform(np.where(bounded, low, 0.0), np.where(bounded, high, 1.0), size=np.shape(value))
        return jnp.asarray(np.where(bounded, drawn, np.asarray(value)), jnp.result_type(value))

    return jax.tree_util.tree_map(draw, params, *limits)


_LBFGS = optax.scale_by_lbfgs()  # one instance, so the default hashes equal across calls
_ARMIJO = 1e-4
_MAX_HALVINGS = 30
# A trial may lower log Ẑ by this much relative to |log Ẑ|: the inner fits' rounding.
_RISE_TOLERANCE = 1e-12


def _likelihood(params, data):
    lik = data[1]
    for name, value in params[1].items():
        lik = eqx.tree_at(lambda p, name=name: getattr(p, name), lik, jnp.exp(value))
    return lik


def _build(params, data):
    X, _, labels, mean, jitter, num_classes = data
    if num_classes is not None:  # validated by `_multiclass_data`; one kernel shared by every class
        kernel = jax.tree_util.tree_map(lambda p: p.astype(X.dtype), params[0])
        return MulticlassModel((kernel,) * num_classes, X, labels, jitter, num_classes)
    return model(params[0], X, _likelihood(params, data), labels=labels, mean=mean, jitter=jitter)


@eqx.filter_jit
def _start(params, data, method):
    """The inner method's start at ``params``, the model built inside the program."""
    return method.start(_build(params, data))


def _negative_log_z(params, data, method, state):
    post = method.fit(_build(params, data), state)
    return -post.log_z, post


@eqx.filter_jit
def _value_and_grad(params, data, method, state):
    """``((−log Ẑ, the fit), ∂(−log Ẑ)/∂params)``, the fit warm-started from ``state``."""
    return eqx.filter_value_and_grad(_negative_log_z, has_aux=True)(params, data, method, state)


@eqx.filter_jit
def _project(params, limits):
    """``params`` clipped into the box ``limits`` = (low, high)."""
    return jax.tree_util.tree_map(jnp.clip, params, *limits)


def _free(step, params, limits):
    """``step`` with 0 where a move by −step leaves the box at an active bound."""
    def free(s, p, lo, hi):
        return jnp.where(((p <= lo) & (s > 0)) | ((p >= hi) & (s < 0)), jnp.zeros_like(s), s)

    return jax.tree_util.tree_map(free, step, params, *limits)


_free_gradient = eqx.filter_jit(_free)


@eqx.filter_jit
def _lbfgs_direction(grad, opt_state, params, limits):
    """L-BFGS's direction d, its new state and ∇ᵀd (the first-order fall of −log Ẑ along −d); within bounds,
    on the free components, and the projected gradient where d is no descent direction."""
    if limits is None:
        direction, opt_state = _LBFGS.update(grad, opt_state, params)
        return direction, opt_state, optax.tree.vdot(grad, direction)
    free = _free(grad, params, limits)
    direction, opt_state = _LBFGS.update(free, opt_state, params)
    direction = _free(direction, params, limits)
    predicted = optax.tree.vdot(free, direction)
    descent = predicted > 0
    direction = jax.tree_util.tree_map(lambda d, g: jnp.where(descent, d, g), direction, free)
    return direction, opt_state, jnp.where(descent, predicted, optax.tree.vdot(free, free))


@eqx.filter_jit
def _along(params, direction, alpha, limits, grad):
    """params − α·direction, clipped into the box, and ∇ᵀ(params − trial) (None without bounds)."""
    trial = jax.tree_util.tree_map(lambda p, d: p - alpha.astype(p.dtype) * d, params, direction)
    if limits is None:
        return trial, None
    trial = _project(trial, limits)
    return trial, optax.tree.vdot(grad, jax.tree_util.tree_map(jnp.subtract, params, trial))


@eqx.filter_jit
def _update(grad, opt_state, params, value, data, method, state, optimizer):
    """A given optax optimizer's step from ``params``."""
    updates, opt_state = optimizer.update(grad, opt_state, params, value=value, grad=grad,
                                          value_fn=lambda p: _negative_log_z(p, data, method, state)[0])
    return optax.apply_updates(params, updates), opt_state
