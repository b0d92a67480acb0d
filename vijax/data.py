"""Synthetic data sets from the source documents (generated, never downloaded)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from . import _checks

__all__ = ["LogisticData", "synthetic_logistic_regression"]
__dir__ = __all__.copy


class LogisticData(NamedTuple):
    """A logistic-regression data set and the weights that generated it (numpy float64 arrays)."""

    X_train: np.ndarray  # (num_train, dim)
    y_train: np.ndarray  # (num_train,), labels in {-1, +1}
    X_test: np.ndarray  # (num_test, dim)
    y_test: np.ndarray  # (num_test,), labels in {-1, +1}
    w_true: np.ndarray  # (dim,)


def _rng(key_or_seed, owner):
    """A numpy Generator from a non-negative int seed or a JAX PRNG key (typed or raw uint32)."""
    if isinstance(key_or_seed, (int, np.integer, bool, np.bool_)):
        return np.random.default_rng(_checks.integer("key_or_seed", key_or_seed, owner, 0))
    dtype = getattr(key_or_seed, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        key_or_seed = jax.random.key_data(key_or_seed)
    elif dtype is None or np.dtype(dtype) != np.uint32:
        raise ValueError(f"{owner}: `key_or_seed` must be a non-negative integer seed or a single JAX PRNG key, "
                         f"got {type(key_or_seed).__name__}.")
    words = np.asarray(key_or_seed)
    if words.ndim != 1:
        raise ValueError(f"{owner}: expected a single PRNG key, got a batch of keys with shape {words.shape[:-1]}.")
    return np.random.default_rng([int(v) for v in words.astype(np.uint32)])


def synthetic_logistic_regression(key_or_seed, dim: int, num_train: int, num_test: int) -> LogisticData:
    """Correlated-covariate Bayesian logistic regression (Challis thesis §5.2, JMLR 2013 §6.2), as numpy float64.

    The generator is

    $$
    w_\\text{true} \\sim \\mathcal N(0, I_D), \\qquad
    \\tilde x_n = M z_n,\\ z_n \\sim \\mathcal N(0, I_D), \\qquad M = I_D + S_p, \\qquad
    x_{nd} = \\tilde x_{nd} / \\operatorname{sd}_d, \\qquad
    p(y_n = \\pm 1 \\mid x_n) = \\sigma(y_n\\, w_\\text{true}^\\top x_n),
    $$

    where S_p has one standard-normal entry in each row, in a column drawn uniformly (the diagonal included), and
    sd_d is covariate d's sample standard deviation over training and test points together (not centred). The
    matching model is ``vj.glm.logistic_regression(X_train, y_train, prior_variance=1.0)``. One numpy ``Generator``
    draws w_true, S_p's columns, its values, z and uniforms for y, in that order (independent of x64).

    **Arguments:**

    - `key_or_seed`: a non-negative integer seed, or a JAX PRNG key (typed or raw) whose key data seeds the generator.
    - `dim`: D ≥ 1; `num_train` ≥ 1; `num_test` ≥ 0, with ``num_train + num_test ≥ 2``.
    """
    owner = "synthetic_logistic_regression"
    dim = _checks.integer("dim", dim, owner, 1)
    num_train = _checks.integer("num_train", num_train, owner, 1)
    num_test = _checks.integer("num_test", num_test, owner, 0)
    if num_train + num_test < 2:
        raise ValueError(f"{owner}: need num_train + num_test >= 2 points to normalise the covariates.")
    rng = _rng(key_or_seed, owner)
    total = num_train + num_test

    w_true = rng.normal(size=dim)
    M = np.eye(dim)
    columns = rng.integers(0, dim, size=dim)
    M[np.arange(dim), columns] += rng.normal(size=dim)
    X = rng.normal(size=(total, dim)) @ M.T
    scale = X.std(axis=0)
    # A column is constant only if every draw coincides (impossible in practice); keep it as is.
    X /= np.where(scale > 0, scale, 1.0)
    p_positive = 0.5 * (1.0 + np.tanh(0.5 * (X @ w_true)))  # σ(a), overflow-free
    y = np.where(rng.random(total) < p_positive, 1.0, -1.0)
    return LogisticData(X[:num_train], y[:num_train], X[num_train:], y[num_train:], w_true)
