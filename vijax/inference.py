"""The one entry point: ``vj.infer(model, method)``."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np

from . import _checks
from .model import LatentLinearModel
from .posterior import Posterior

__all__ = ["infer"]


@eqx.filter_jit
def _fit(model, method, init):
    return method.fit(model, init)


def infer(model: LatentLinearModel, method, init=None) -> Posterior:
    """Fit ``method`` (e.g. ``vj.GKL()``) to ``model``; returns a `Posterior`.

    ``init`` warm-starts the fit from a previous `Posterior` (or method parameters).
    The fit is compiled once per model structure and shape (`equinox.filter_jit`) and
    is traceable: it works under `jax.jit` and `jax.vmap`, and
    ``jax.grad`` of ``infer(...).log_z`` with respect to the model's
    hyperparameters is the derivative of the optimised objective.
    """
    if not isinstance(model, LatentLinearModel):
        raise ValueError(f"infer: `model` must be a vj.LatentLinearModel, got {type(model).__name__}.")
    if not hasattr(method, "fit"):
        raise ValueError(f"infer: `method` must be a vijax method such as vj.GKL(), got {method!r}.")
    if isinstance(init, (jax.Array, np.ndarray)) and _checks.is_concrete(init) and not np.all(np.isfinite(init)):
        raise ValueError("infer: `init` contains NaN or infinite values; pass a finite starting point or None.")
    return _fit(model, method, init)
