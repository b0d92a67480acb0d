"""The layout of a multi-class GP: integer labels, one kernel per class, and the class-wise prior.

Shared by the multi-class models (`vj.gp.multiclass`: nested EP and stick-breaking; `vj.gp.softmax`).
C classes over N inputs, one latent function per class, f_c ~ GP(0, K_c) independently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import is_concrete
from .kernels import AbstractKernel

__all__ = ["class_labels", "class_kernels", "class_prior_covariances", "same_arrays"]


def class_labels(labels, n, num_classes, owner):
    """Integer labels in {0, …, C − 1}, one per input, as a NumPy array of shape ``(n,)``.

    Raises a ValueError naming ``owner`` for a ``num_classes`` below 2, a wrong shape, non-integer
    values or labels outside 0 … C − 1.
    """
    if not (isinstance(num_classes, (int, np.integer)) and num_classes >= 2):
        raise ValueError(f"{owner}: `num_classes` must be an integer ≥ 2, got {num_classes!r}.")
    y = np.asarray(labels)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"{owner}: `labels` must have shape ({n},), one per row of X, got {y.shape}.")
    if not (np.issubdtype(y.dtype, np.integer) or np.all(np.mod(y, 1) == 0)):
        raise ValueError(f"{owner}: `labels` must be integer class indices in 0 … {num_classes - 1}.")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"{owner}: `labels` must lie in 0 … {num_classes - 1} (num_classes = {num_classes}); "
                         f"got values from {y.min()} to {y.max()}. Map class names to 0 … C − 1 first.")
    return y


def class_kernels(kernel, num_classes, owner):
    """One kernel per class, a tuple of length C: a single kernel is shared by every class."""
    kernels = (kernel,) * num_classes if isinstance(kernel, AbstractKernel) else tuple(kernel)
    if len(kernels) != num_classes or not all(isinstance(k, AbstractKernel) for k in kernels):
        raise ValueError(f"{owner}: `kernel` must be a vj.gp.kernels kernel or a sequence of {num_classes} "
                         "of them (one per class).")
    return kernels


def class_prior_covariances(kernel, X, num_classes, jitter, owner):
    """K_c(X) + jitter·I stacked over the classes: shape ``(C, N, N)`` for X of shape ``(N, d)``."""
    kernels = class_kernels(kernel, num_classes, owner)
    eye = jnp.eye(X.shape[0], dtype=X.dtype)
    return jnp.stack([k(X) + jitter * eye for k in kernels])


def same_arrays(a, b) -> bool:
    """Whether two pytrees (kernels, inputs) have the same structure and equal leaves; True when either
    holds tracers, which cannot be compared. Checks a deprecated prediction call form's kernel and X
    against those a fit recorded."""
    if jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b):
        return False
    if not is_concrete(a, b):
        return True
    return all(np.shape(x) == np.shape(y) and np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
