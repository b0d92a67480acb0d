"""The one entry point: ``vj.infer(model, method)``."""

from __future__ import annotations

import warnings

import numpy as np

from . import _checks
from .methods import AbstractMethod
from .posterior import Posterior

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
    if isinstance(method, type) and issubclass(method, AbstractMethod):
        raise ValueError(f"infer: `method` is the class vj.{method.__name__}, not an instance; call it to make "
                         f"one: vj.infer(model, vj.{method.__name__}()).")
    if not isinstance(method, AbstractMethod):
        raise ValueError(f"infer: `method` must be a vijax method, an instance of a vj.AbstractMethod subclass such "
                         f"as vj.GKL() or vj.EP(); got {type(method).__name__}: {method!r}.")
    method.check_model(model)
    state = method.start(model) if init is None else method.to_state(model, init)
    post = method.fit(model, state)
    _warn_unless_converged(post)
    if _checks.is_concrete(post.log_z) and np.ndim(post.log_z) == 0:
        message = method.report(post)
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=2)
    return post


def _warn_unless_converged(post: Posterior) -> None:
    """A `ConvergenceWarning` for a concrete fit (not under `jit`, `vmap` or `grad`) that did not converge."""
    d = post.diagnostics
    if not (_checks.is_concrete(d.converged, post.log_z) and np.ndim(d.converged) == 0):
        return
    name = f"{d.method} ({d.solver})"
    log_z = float(post.log_z)
    if not np.isfinite(log_z) and post.defines_log_z:
        warnings.warn(f"{name}: log Z is {log_z}, the fit failed, and it is not a lower bound "
                      "(post.is_lower_bound is False); see post.diagnostics (a wider or improper "
                      "posterior than the data determine, or non-finite data, are the usual causes).",
                      ConvergenceWarning, stacklevel=3)
    elif not bool(d.converged):
        warnings.warn(f"{name} stopped after {int(d.iterations)} iterations without converging (final "
                      f"stationarity {float(d.stationarity):.3g}): log Z, its gradient and the moments are not at "
                      "the optimum. Raise the method's iteration limit or see post.diagnostics.",
                      ConvergenceWarning, stacklevel=3)


def __dir__():
    return list(__all__)
