"""The one entry point: ``vj.infer(model, method)``."""

from __future__ import annotations

import warnings

import numpy as np

from . import _checks
from .methods import AbstractMethod
from .posterior import Posterior
from .solvers import Status

__all__ = ["infer", "ConvergenceWarning"]
__dir__ = __all__.copy


class ConvergenceWarning(UserWarning):
    """A fit stopped before its convergence test held, or its log Z is not finite (filter it like any warning)."""


def infer(model, method, init=None) -> Posterior:
    """Fit ``method`` (e.g. ``vj.GKL()``) to ``model``: ``method.fit(model, method.start(model))``, a `Posterior`.

    ``init`` warm-starts the fit (``method.to_state(model, init)``): a `Posterior` of any method, a State of this
    method (``post.state``) or a ``(D,)`` array. One code path under `jax.jit`, `jax.vmap` and `jax.grad`, compiled
    once per model shape and method configuration (settings such as ``tol`` are traced).
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
