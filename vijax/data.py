"""Synthetic data sets from the source documents (generated, never downloaded)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["LogisticData", "synthetic_logistic_regression"]


class LogisticData(NamedTuple):
    X_train: np.ndarray  # (num_train, dim)
    y_train: np.ndarray  # (num_train,), labels in {-1, +1}
    X_test: np.ndarray  # (num_test, dim)
    y_test: np.ndarray  # (num_test,)
    w_true: np.ndarray  # (dim,)


def synthetic_logistic_regression(seed: int, dim: int, num_train: int, num_test: int) -> LogisticData:
    """Correlated-covariate logistic regression (Challis thesis §5.2).

    .. math::

        w_\\text{true} \\sim \\mathcal N(0, I_D), \\quad x = M z,\\ z \\sim \\mathcal N(0, I_D), \\quad
        M = I + S_p, \\quad p(y = \\pm 1 \\mid x) = \\sigma(y\\, w_\\text{true}^\\top x),

    where S_p has one standard-normal entry per row; the thesis does not say in which column, so
    here the column is drawn uniformly at random. Each covariate is then rescaled to unit variance
    (with the scale estimated on the training and test points together).
    """
    for name, value in (("dim", dim), ("num_train", num_train), ("num_test", num_test)):
        if not (isinstance(value, (int, np.integer)) and value >= 1):
            raise ValueError(f"synthetic_logistic_regression: `{name}` must be a positive integer, got {value!r}.")
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=dim)
    M = np.eye(dim)
    M[np.arange(dim), rng.integers(0, dim, size=dim)] += rng.normal(size=dim)
    X = rng.normal(size=(num_train + num_test, dim)) @ M.T
    X /= X.std(axis=0)
    p_positive = 1 / (1 + np.exp(-X @ w_true))
    y = np.where(rng.random(num_train + num_test) < p_positive, 1.0, -1.0)
    return LogisticData(X[:num_train], y[:num_train], X[num_train:], y[num_train:], w_true)
