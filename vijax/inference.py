"""The one entry point: ``vj.infer(model, method)``."""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import numpy as np

from . import _checks
from .methods import AbstractMethod
from .model import LatentLinearModel
from .posterior import Posterior

__all__ = ["infer", "ConvergenceWarning"]


class ConvergenceWarning(UserWarning):
    """A fit stopped before its convergence test held, or its log Z is not finite.

    Filter it like any warning, e.g. ``warnings.simplefilter("error", vj.ConvergenceWarning)`` to make
    it an exception, or ``"ignore"`` inside a loop that checks ``post.diagnostics`` itself."""


@eqx.filter_jit
def _fit(model, method, init):
    return method.fit(model, init)


def infer(model: LatentLinearModel, method, init=None) -> Posterior:
    """Fit ``method`` (e.g. ``vj.GKL()``) to ``model``; returns a `Posterior`.

    ``method`` is an instance of a `vj.AbstractMethod` subclass (``vj.GKL()``, not the class ``vj.GKL``).
    ``init`` warm-starts the fit: None, a previous `Posterior`, or the method's own parameters (the one
    rule for every method is in `vj.AbstractMethod`'s docstring).
    The fit is compiled once per model structure and shape (`equinox.filter_jit`; EP compiles its
    fallback schedules only for a fit that needs them) and is traceable: it works under `jax.jit` and `jax.vmap`, and
    ``jax.grad`` of ``infer(...).log_z`` with respect to the model's
    hyperparameters is the derivative of the optimised objective.
    """
    if not isinstance(model, LatentLinearModel):
        raise ValueError(f"infer: `model` must be a vj.LatentLinearModel, got {type(model).__name__}.")
    if isinstance(method, type) and issubclass(method, AbstractMethod):
        raise ValueError(f"infer: `method` is the class vj.{method.__name__}, not an instance; call it to make "
                         f"one: vj.infer(model, vj.{method.__name__}()).")
    if not isinstance(method, AbstractMethod):
        raise ValueError(f"infer: `method` must be a vijax method, an instance of a vj.AbstractMethod subclass such "
                         f"as vj.GKL() or vj.EP(); got {type(method).__name__}: {method!r}.")
    if isinstance(init, (jax.Array, np.ndarray)) and _checks.is_concrete(init) and not np.all(np.isfinite(init)):
        raise ValueError("infer: `init` contains NaN or infinite values; pass a finite starting point or None.")
    # Outside jit, vmap and grad a method may run in compiled stages, so that code only some fits need
    # (EP's fallback schedules) is compiled only when a fit needs it.
    staged = getattr(method, "staged_fit", None)
    post = staged(model, init) if staged is not None and _checks.is_concrete(model, init) else _fit(model, method, init)
    _warn_unless_converged(post)
    return post


def _warn_unless_converged(post: Posterior) -> None:
    """A `ConvergenceWarning` for a concrete fit (not under `jit`, `vmap` or `grad`) that did not converge."""
    d = post.diagnostics
    if not (_checks.is_concrete(d.converged, post.log_z) and np.ndim(d.converged) == 0):
        return
    name = f"{d.method} ({d.solver})"
    log_z = float(post.log_z)
    if not np.isfinite(log_z):
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
