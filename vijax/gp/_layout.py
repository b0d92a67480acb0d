"""The multi-class GP model that `vj.gp.multiclass.NestedEP` and `vj.gp.softmax.SoftmaxBound` fit, and the
label and kernel checks the stick-breaking model shares."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from ..methods import AbstractMethod
from ..posterior import Posterior
from .kernels import AbstractKernel
from .models import DEFAULT_JITTER

__all__ = ["MulticlassModel", "MulticlassMethod", "model", "class_labels"]


def class_labels(labels, n, num_classes, owner):
    """Integer labels in {0, …, C − 1}, one per input, as a NumPy array of shape ``(n,)`` (checked)."""
    _checks.integer("num_classes", num_classes, owner, minimum=2)
    y = np.asarray(labels)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"{owner}: `labels` must have shape ({n},), one per row of X, got {y.shape}.")
    if not (np.issubdtype(y.dtype, np.integer) or (np.issubdtype(y.dtype, np.number) and np.all(np.mod(y, 1) == 0))):
        raise ValueError(f"{owner}: `labels` must be integer class indices in 0 … {num_classes - 1}.")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"{owner}: `labels` must lie in 0 … {num_classes - 1} (num_classes = {num_classes}); "
                         f"got values from {y.min()} to {y.max()}. Map class names to 0 … C − 1 first.")
    return y


class MulticlassModel(eqx.Module):
    """A multi-class GP classifier (`vj.gp.multiclass.model`): C latent functions f_c ~ GP(0, K_c) over N inputs,
    f = (f_1(x_1), …, f_1(x_N), …, f_C(x_N)) class-major, ``dim`` = C·N.

    **Fields:** `kernels` (one per class; leaves, so ``jax.grad`` of a fit's ``log_z`` reaches them),
    `X` ``(N, d)``, `labels` ``(N,)`` integers, `jitter` and the static `num_classes` C.
    """

    kernels: tuple[AbstractKernel, ...]
    X: jax.Array
    labels: jax.Array
    jitter: jax.Array
    num_classes: int = eqx.field(static=True)

    @property
    def num_inputs(self) -> int:
        """N, the number of training inputs."""
        return self.X.shape[0]

    @property
    def dim(self) -> int:
        """C·N, the dimension of the latent vector f."""
        return self.num_classes * self.X.shape[0]

    @property
    def dtype(self):
        return self.X.dtype

    def prior_covariances(self):
        """K_c(X) + jitter·I for every class: ``(C, N, N)``."""
        eye = jnp.eye(self.X.shape[0], dtype=self.X.dtype)
        return jnp.stack([k(self.X) + self.jitter * eye for k in self.kernels])

    def onehot(self):
        """The labels one-hot, ``(N, C)`` in the working dtype."""
        return jax.nn.one_hot(self.labels, self.num_classes, dtype=self.dtype)


def model(kernel, X, labels, num_classes: int, jitter: float = DEFAULT_JITTER) -> MulticlassModel:
    """A multi-class GP classifier: C latent functions f_c ~ GP(0, K_c + jitter·I) over the inputs X.

    **Arguments:**

    - `kernel`: a `vj.gp.kernels` kernel shared by every class, or a sequence of ``num_classes`` kernels.
    - `X`: inputs ``(N, d)`` or ``(N,)``; `labels`: integer classes in 0 … C − 1, shape ``(N,)``.
    - `num_classes`: C ≥ 2 (classes without training points are allowed).
    - `jitter`: added to the diagonal of each K_c.

    Returns a `MulticlassModel`, fitted by `vj.gp.multiclass.NestedEP` or `vj.gp.softmax.SoftmaxBound`.
    """
    owner = "vj.gp.multiclass.model"
    X = _checks.as_inputs(X, owner)
    y = class_labels(labels, X.shape[0], num_classes, owner)
    kernels = (kernel,) * int(num_classes) if isinstance(kernel, AbstractKernel) else tuple(kernel)
    if len(kernels) != num_classes or not all(isinstance(k, AbstractKernel) for k in kernels):
        raise ValueError(f"{owner}: `kernel` must be a vj.gp.kernels kernel or a sequence of {num_classes} "
                         "of them (one per class).")
    kernels = tuple(_checks.cast_floating(k, X.dtype) for k in kernels)
    jitter = _checks.as_float_array("jitter", jitter, owner, ndim=0)
    if _checks.is_concrete(jitter) and not (np.isfinite(float(jitter)) and float(jitter) >= 0):
        raise ValueError(f"{owner}: `jitter` must be a finite number ≥ 0, got {float(jitter)!r}.")
    return MulticlassModel(kernels, X, jnp.asarray(y), jitter.astype(X.dtype), int(num_classes))


class MulticlassMethod(AbstractMethod):
    """A method that fits the `MulticlassModel` (which has no sites, so no start from a point w)."""

    def check_model(self, model) -> None:
        if isinstance(model, MulticlassModel):
            return
        hint = ""
        if hasattr(model, "layout") and hasattr(model, "ordering"):
            hint = (" A stick-breaking model is a vj.LatentLinearModel: fit it with vj.GKL(), vj.EP() or any "
                    "method of vj.infer.")
        raise ValueError(f"infer: {type(self).__name__} fits a multi-class GP model, built by "
                         f"vj.gp.multiclass.model(kernel, X, labels, num_classes); got {type(model).__name__}.{hint}")

    def from_expansion(self, model, expansion):
        raise ValueError(f"{type(self).__name__}: a start from a point w does not apply to the multi-class GP model; "
                         "start from None, a posterior of this model or its post.state.")

    def to_state(self, model, init):
        """``init`` as a State: a State of this method, or a posterior of a model of the same shapes."""
        if isinstance(init, (jax.Array, np.ndarray)):  # refused before the base class expands (absent) sites
            self.from_expansion(model, None)
        if isinstance(init, Posterior) or self.is_state(model, init):
            return super().to_state(model, init)
        raise ValueError(f"{type(self).__name__}: `init` must be None, a posterior of this model (of any method) or "
                         f"its post.state; got {type(init).__name__}.")
