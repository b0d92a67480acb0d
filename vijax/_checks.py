"""Input validation where data enters vijax (concrete arrays only), and the one rule for the type of parameters.

Parameters are strongly typed arrays of one floating dtype, so that an optimiser's update keeps their type and a
jitted step compiles once: the dtype of the data they go with (a builder's ``X``, a group's ``H``), else the promoted
dtype of the arrays passed for that object (``StudentT(df=3.0, loc=y)`` takes ``y``'s), else ``jnp.result_type(float)``.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx


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


def _floating_dtype_of(x):
    """The dtype of a strongly typed floating array or NumPy scalar, else None."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)) and not getattr(x, "weak_type", False):
        if jnp.issubdtype(x.dtype, jnp.floating):
            return jax.dtypes.canonicalize_dtype(x.dtype)
    return None


def float_dtype(*values):
    """The promoted dtype of the strongly typed floating arrays among ``values``' leaves, else result_type(float)."""
    dtypes = [d for d in map(_floating_dtype_of, jax.tree_util.tree_leaves(values)) if d is not None]
    return (jax.dtypes.canonicalize_dtype(functools.reduce(jnp.promote_types, dtypes)) if dtypes
            else jnp.result_type(float))



def as_param(name: str, x, owner: str, dtype=None, ndim: int | None = None):
    """A parameter as a strongly typed array of ``dtype`` (default ``float_dtype(x)``), checked by `as_float_array`."""
    arr = as_float_array(name, x, owner, ndim)
    dtype = float_dtype(x) if dtype is None else jax.dtypes.canonicalize_dtype(dtype)
    if arr.dtype == dtype and not arr.weak_type:
        return arr
    return jnp.asarray(arr, dtype=dtype)


def cast_floating(tree, dtype):
    """``tree`` with every floating array leaf a strongly typed array of ``dtype`` (the others, and the tree if none
    changes, kept): how a builder gives a kernel or potential the dtype of its data."""
    dtype = jax.dtypes.canonicalize_dtype(dtype)

    def needs_cast(x):
        return (isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating)
                and (x.dtype != dtype or getattr(x, "weak_type", False)))

    if not any(map(needs_cast, jax.tree_util.tree_leaves(tree))):
        return tree  # the same object: a model records the kernel it was given
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype) if needs_cast(x) else x, tree)


def strongly_typed(tree):
    """``tree`` with every weakly typed array leaf strongly typed (optimiser state built from Python numbers)."""
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=x.dtype) if getattr(x, "weak_type", False) else x,
                                  tree)



def data_dtype(tree):
    """The promoted floating dtype of ``tree``'s array leaves, or None when it has none."""
    dtypes = [jax.dtypes.canonicalize_dtype(x.dtype) for x in jax.tree_util.tree_leaves(tree)
              if isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating)]
    return functools.reduce(jnp.promote_types, dtypes) if dtypes else None


def format_param(x) -> str:
    """A parameter for `repr`: a concrete scalar by value (``3.0``), an array or tracer as ``f64[100]``."""
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        if np.ndim(x) == 0 and not isinstance(x, jax.core.Tracer):
            value = np.asarray(x).item()
            if isinstance(value, float):
                text = f"{value:.6g}"
                return text if any(c in text for c in ".ein") else text + ".0"
            return repr(value)
        dtype = np.dtype(x.dtype)
        name = f"{dtype.kind}{8 * dtype.itemsize}" if dtype.kind in "fiuc" and dtype.name != "bfloat16" else dtype.name

        return f"{name}[{','.join(map(str, np.shape(x)))}]"
    if callable(x) and not isinstance(x, eqx.Module):
        return getattr(x, "__name__", type(x).__name__)
    return repr(x)


def integer(name: str, value, owner: str, minimum: int = 1) -> int:
    """``value`` as a Python int, refusing bools, non-integers and values below ``minimum``."""
    words = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer ≥ {minimum}")
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if isinstance(value, (bool, np.bool_)) or number is None or number < minimum:
        raise ValueError(f"{owner}: `{name}` must be {words}, got {value!r}.")
    return number


def check_finite(name: str, x, owner: str) -> None:
    if is_concrete(x) and not bool(np.all(np.isfinite(np.asarray(x)))):
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(np.asarray(x))))
        raise ValueError(f"{owner}: `{name}` contains {bad} NaN or infinite value(s); "
                         "remove or impute them before building the model.")


def check_positive(name: str, x, owner: str) -> None:
    check_finite(name, x, owner)
    if is_concrete(x) and not bool(np.all(np.asarray(x) > 0)):
        raise ValueError(f"{owner}: `{name}` must be strictly positive, got minimum {np.min(np.asarray(x)).item()!r}.")


def check_in_open_interval(name: str, x, lo: float, hi: float, owner: str) -> None:
    check_finite(name, x, owner)
    if is_concrete(x):
        a = np.asarray(x)
        if not bool(np.all((a > lo) & (a < hi))):
            raise ValueError(f"{owner}: `{name}` must lie in ({lo}, {hi}), got values in "
                             f"[{a.min().item()!r}, {a.max().item()!r}].")


def check_broadcastable(name: str, x, num_sites: int, owner: str) -> None:
    shape = jnp.shape(x)
    if shape not in ((), (1,), (num_sites,)):
        raise ValueError(f"{owner}: per-site parameter `{name}` has shape {shape}; it must be a scalar "
                         f"or have one entry per site, shape ({num_sites},).")


def check_data_shape(X, owner: str, name: str = "X"):
    """A model's data ``(N, d)``: at least one row (observation) and one column."""
    if X.shape[0] == 0:
        raise ValueError(f"{owner}: `{name}` has no rows (N = 0); a model needs at least one observation.")
    if X.shape[1] == 0:
        raise ValueError(f"{owner}: `{name}` has no columns; give at least one covariate (e.g. an intercept "
                         "column of ones).")


def as_inputs(X, owner: str):
    """GP inputs as a finite, strongly typed float ``(N, d)`` array (a vector is ``(N, 1)``)."""
    X = as_param("X", X, owner)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"{owner}: inputs must have shape (N, d) or (N,), got {X.shape}.")
    check_finite("X", X, owner)
    return X
