"""The one entry point: ``vj.infer(model, method)``."""

from __future__ import annotations

import warnings

import numpy as np

from . import _checks
from .methods import AbstractMethod
from .posterior import Posterior
from .solvers import Status

__all__ = ["infer", "ConvergenceWarning"]


class ConvergenceWarning(UserWarning):
    """A fit stopped before its convergence test held, or its log Z is not finite.

    Filter it like any warning, e.g. ``warnings.simplefilter("error", vj.ConvergenceWarning)`` to make
    it an exception, or ``"ignore"`` inside a loop that checks ``post.diagnostics`` itself."""


def infer(model, method, init=None) -> Posterior:
    """Fit ``method`` (e.g. ``vj.GKL()``) to ``model``; returns a `Posterior`.

    ``method`` is an instance of a `vj.AbstractMethod` subclass (``vj.GKL()``, not the class ``vj.GKL``).
    ``init`` warm-starts the fit: None (the method's cold start from the data), a `Posterior` of any
    method, a State of this method (``post.state``), or a ``(D,)`` array (see `vj.AbstractMethod`).
    It is ``method.fit(model, state)`` with ``state = method.start(model)`` or
    ``method.to_state(model, init)``: one code path inside or outside `jax.jit`, `jax.vmap` and
    `jax.grad`. The fit is compiled once per model structure and shape and method configuration; its
    settings (tolerances, damping) are traced, so a new ``tol`` compiles nothing, nor does a warm
    refit from a posterior of the same method. ``jax.grad`` of ``infer(...).log_z`` with respect to
    the model's hyperparameters is the derivative of the optimised objective.
    """
    check_method(method, "infer")
    method.check_model(model)
    state = method.start(model) if init is None else method.to_state(model, init)
    post = method.fit(model, state)
    _warn_unless_converged(post)
    return post


def check_method(method, owner: str) -> None:
    """A `ValueError` naming ``owner`` unless ``method`` is a vijax method instance (a class gets its own message)."""
    if isinstance(method, type) and issubclass(method, AbstractMethod):
        raise ValueError(f"{owner}: `method` is the class vj.{method.__name__}, not an instance; call it to make "
                         f"one: vj.{method.__name__}().")
    if not isinstance(method, AbstractMethod):
        raise ValueError(f"{owner}: `method` must be a vijax method, an instance of a vj.AbstractMethod subclass such "
                         f"as vj.GKL() or vj.EP(); got {type(method).__name__}: {method!r}.")


def _warn_unless_converged(post: Posterior) -> None:
    """A `ConvergenceWarning` saying why a concrete fit (not under `jit`, `vmap` or `grad`) did not converge."""
    d = post.diagnostics
    if not (_checks.is_concrete(d.status, post.log_z) and np.ndim(d.status) == 0):
        return
    name = f"{d.method} ({d.solver})"
    status = Status(int(d.status))
    if status == Status.NONFINITE or (not np.isfinite(float(post.log_z)) and post.defines_log_z):
        message = (f": log Z is {float(post.log_z)}, the fit failed, and it is not a lower bound "
                   "(post.is_lower_bound is False); a wider or improper posterior than the data determine, or "
                   "non-finite data, are the usual causes")
    elif status == Status.CONVERGED:
        return
    elif status == Status.FELL_BACK:
        message = ": the optimum found has a lower objective than the start, so the posterior is the start"
    else:
        why = ("no further progress was possible" if status == Status.STALLED
               else "the iteration limit came first (raise the method's iteration limit)")
        message = (f" stopped after {int(d.iterations)} iterations without converging: {why} (final stationarity "
                   f"{float(d.stationarity):.3g}); log Z, its gradient and the moments are not at the optimum")
    warnings.warn(f"{name}{message}. See post.diagnostics.", ConvergenceWarning, stacklevel=3)


def __dir__():
    return list(__all__)
