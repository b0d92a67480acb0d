"""Input validation used where data enters vijax (constructors and builders).

Checks run only on concrete arrays: inside `jax.jit`, `jax.vmap` or `jax.grad`
the values are tracers and are validated by whoever built them outside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(xs))


def as_float_array(name: str, x, owner: str, ndim: int | None = None):
    """`jnp.asarray` that rejects non-numeric input and (optionally) wrong ranks."""
    if isinstance(x, jax.core.Tracer):
        arr = x
    else:
        try:
            arr = jnp.asarray(x)
        except TypeError:  # strings, objects: JAX has no dtype for them
            raise ValueError(f"{owner}: `{name}` must be numeric, got dtype {np.asarray(x).dtype}; "
                             "encode labels or categories as numbers first.") from None
        if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
                or jnp.issubdtype(arr.dtype, jnp.bool_)):
            raise ValueError(f"{owner}: `{name}` must be numeric, got dtype {arr.dtype}.")
        if not jnp.issubdtype(arr.dtype, jnp.floating):
            arr = arr.astype(jnp.result_type(float))
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{owner}: `{name}` must have {ndim} dimension(s), got shape {arr.shape}.")
    return arr


def check_finite(name: str, x, owner: str) -> None:
    if is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(np.asarray(x))))
        raise ValueError(f"{owner}: `{name}` contains {bad} NaN or infinite value(s); "
                         "remove or impute them before building the model.")


def check_positive(name: str, x, owner: str) -> None:
    check_finite(name, x, owner)
    if is_concrete(x) and not bool(np.all(np.asarray(x) > 0)):
        raise ValueError(f"{owner}: `{name}` must be strictly positive, got minimum {np.min(np.asarray(x))!r}.")


def check_in_open_interval(name: str, x, lo: float, hi: float, owner: str) -> None:
    check_finite(name, x, owner)
    if is_concrete(x):
        a = np.asarray(x)
        if not bool(np.all((a > lo) & (a < hi))):
            raise ValueError(f"{owner}: `{name}` must lie in ({lo}, {hi}), got values in "
                             f"[{a.min()!r}, {a.max()!r}].")


def check_broadcastable(name: str, x, num_sites: int, owner: str) -> None:
    shape = jnp.shape(x)
    if shape not in ((), (1,), (num_sites,)):
        raise ValueError(f"{owner}: per-site parameter `{name}` has shape {shape}; it must be a scalar "
                         f"or have one entry per site, shape ({num_sites},).")


def as_inputs(X, owner: str):
    """GP inputs as a finite float ``(N, d)`` array (a vector is ``(N, 1)``)."""
    X = as_float_array("X", X, owner)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"{owner}: inputs must have shape (N, d) or (N,), got {X.shape}.")
    check_finite("X", X, owner)
    return X
