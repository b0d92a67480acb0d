"""Oracles shared by the tests: closed-form answers computed with NumPy/SciPy only."""

import numpy as np


def gaussian_posterior(prior_mean, prior_cov, X, y, noise_var):
    """Exact posterior and log evidence of y ~ N(X w, noise_var I), w ~ N(prior_mean, prior_cov)."""
    prec = np.linalg.inv(prior_cov) + X.T @ X / noise_var
    cov = np.linalg.inv(prec)
    mean = cov @ (np.linalg.solve(prior_cov, prior_mean) + X.T @ y / noise_var)
    K = X @ prior_cov @ X.T + noise_var * np.eye(len(y))
    r = y - X @ prior_mean
    sign, logdet = np.linalg.slogdet(2 * np.pi * K)
    log_z = -0.5 * (logdet + r @ np.linalg.solve(K, r))
    return mean, cov, log_z
