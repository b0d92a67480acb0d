"""The base class of every inference method and the state contract they share.

A method is configuration with one State type (a pytree of fixed structure per model shape) and three operations:
``start(model)``, the cold start; ``fit(model, state)``, the one compiled core, whose ``post.state`` restarts where
it ended; ``to_state(model, init)``, a warm start from a `Posterior`, a State or a ``(D,)`` array. Float settings
are traced (a new ``tol`` reuses the programs); iteration caps, families and schedules are static.
"""

from __future__ import annotations

import abc
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from .. import start as _start
from ..model import LatentLinearModel
from ..posterior import Posterior

__all__ = ["AbstractMethod", "compiled", "traced_settings", "same_shapes"]


def traced_settings(method):
    """``method`` with every Python float leaf a weakly typed JAX scalar: traced, never promoting the dtype."""
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x) if isinstance(x, float) else x, method)


@eqx.filter_jit
def _call(method, name, args):
    return getattr(method, name)(*args)


def compiled(method, name: str, *args):
    """``method.<name>(*args)`` compiled, with the method's settings traced (`traced_settings`)."""
    return _call(traced_settings(method), name, args)


class AbstractMethod(eqx.Module):
    """An inference method: a subclass implements the pure, traceable `solve`, `from_gaussian`, `from_expansion`,
    `is_state` (and `init_state`, where it does not start from `vijax.start.expand_at_mode`); the base class compiles
    and composes them."""

    def init_state(self, model: LatentLinearModel):
        """The cold start from the data (pure, traceable): by default, every site's expansion at the mode."""
        return self.from_expansion(model, _start.expand_at_mode(model, self.start_dense(model)))

    @abc.abstractmethod
    def solve(self, model: LatentLinearModel, state) -> Posterior:
        """The fit from ``state`` (pure, traceable); the `Posterior`'s ``state`` is the final State."""

    @abc.abstractmethod
    def from_gaussian(self, model: LatentLinearModel, mean, factor):
        """The State that starts from q = N(``mean``, S), S given by the covariance factor ``factor``."""

    @abc.abstractmethod
    def from_expansion(self, model: LatentLinearModel, expansion):
        """The State that starts from every site's expansion at a point (a `vijax.start.SiteExpansion`)."""

    @abc.abstractmethod
    def is_state(self, model: LatentLinearModel, state) -> bool:
        """Whether ``state`` is a State of this method for ``model`` (its type, structure and shapes)."""

    def check_model(self, model) -> None:
        """Raise a `ValueError` unless this method fits models like ``model`` (a `vj.LatentLinearModel`)."""
        if not isinstance(model, LatentLinearModel):
            raise ValueError(f"infer: `model` must be a vj.LatentLinearModel for vj.{type(self).__name__}, got "
                             f"{type(model).__name__}.")

    def start_dense(self, model: LatentLinearModel) -> bool | None:
        """Whether the start's mode search may form the D × D curvature (None: decided by the model)."""
        return None

    def shares_start(self, model: LatentLinearModel) -> bool:
        """Whether `from_expansion` only repackages the expansion, so that `start` is `vijax.start.shared`."""
        return False

    def start(self, model: LatentLinearModel):
        """The cold start as a State, compiled; constant in the model (so the same program under `jax.grad`)."""
        model = jax.lax.stop_gradient(model)
        if self.shares_start(model):
            return self.from_expansion(model, _start.shared(model, self.start_dense(model)))
        return compiled(self, "init_state", model)

    def fit(self, model: LatentLinearModel, state) -> Posterior:
        """The fit from ``state`` (`start`, `to_state` or ``post.state``), compiled once per model shape."""
        self.check_model(model)
        if not self.is_state(model, state):
            name = type(self).__name__
            raise ValueError(f"{name}.fit(model, state): `state` must be a State of {name} for this model "
                             "(method.start(model), method.to_state(model, init) or post.state); "
                             f"vj.infer(model, method, init) does both steps. Got {_describe(state)}.")
        return compiled(self, "solve", model, state)

    def to_state(self, model: LatentLinearModel, init):
        """The State a warm start from ``init`` begins at: a State, a `Posterior` (of this method: its ``state``) or
        a ``(D,)`` array (every site's expansion there); anything else a `ValueError`."""
        name = type(self).__name__
        model = jax.lax.stop_gradient(model)  # a State is constant in the model (see `start`)
        if isinstance(init, Posterior):
            if self.is_state(model, init.state):
                return init.state
            if init.mean.shape != (model.dim,):
                raise ValueError(f"{name}: `init` is a Posterior of dimension {init.mean.shape}, the model has "
                                 f"D = {model.dim}.")
            return compiled(self, "from_gaussian", model, init.mean, init.factor)
        if isinstance(init, (jax.Array, np.ndarray)):
            w = jnp.asarray(init)
            if w.shape != (model.dim,) or not jnp.issubdtype(w.dtype, jnp.number):
                raise ValueError(f"{name}: an array `init` is a point w of shape ({model.dim},); got shape "
                                 f"{w.shape} and dtype {w.dtype}.")
            _checks.check_finite("init", w, name)
            w = w.astype(model.dtype)
            if self.is_state(model, w):
                return w
            expansion = _compiled_expand_at(model, w)
            if self.shares_start(model):
                return self.from_expansion(model, expansion)
            return compiled(self, "from_expansion", model, expansion)
        if self.is_state(model, init):
            return init
        expected = jax.tree_util.tree_map(lambda x: f"{x.dtype}{list(x.shape)}",
                                          eqx.filter_eval_shape(self.init_state, model))
        raise ValueError(f"{name}: `init` must be None, a vj.Posterior (of any method), a State of {name} for this "
                         f"model (e.g. post.state of a {name} fit; its shapes here: {expected}) or an array of "
                         f"shape ({model.dim},); got {_describe(init)}.")


def _describe(x) -> str:
    if isinstance(x, (eqx.Module, tuple, list, dict)):
        shapes = jax.tree_util.tree_map(lambda a: f"{getattr(a, 'dtype', type(a).__name__)}{list(np.shape(a))}", x)
        return f"{type(x).__name__} with shapes {shapes}"
    return f"{type(x).__name__}: {x!r}"


_compiled_expand_at = eqx.filter_jit(_start.expand_at)


def same_shapes(state, template) -> bool:
    """Whether the pytree ``state`` has the structure of ``template`` and leaves of the same shapes."""
    if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(template):
        return False
    leaves = jax.tree_util.tree_leaves
    return all(np.shape(a) == np.shape(b) for a, b in zip(leaves(state), leaves(template)))
