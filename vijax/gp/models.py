"""Gaussian-process models as latent linear models, and their predictive distributions.

A GP model over N inputs is the latent linear model with w = f = (f(x_1), …, f(x_N)),

    p(f | y) ∝ N(f | μ1, K + εI) · ∏_n φ_n(f_n),      K_nm = k(x_n, x_m),

so H = I (``vj.Identity``; for binary classification H = diag(±1), the labels folded in) and every
method of `vj.infer` applies unchanged. The prior is a dense Gaussian factor, which G-KL, LVB and EP
whiten (f = μ + L f̃ with K + εI = LLᵀ), so K is never inverted.

At test inputs X_* (thesis appendix B.6.5), with B = (K + εI)⁻¹ K(X, X_*):

    q(f_*) = N(μ + Bᵀ(m − μ1),  diag k(X_*, X_*) − diag(K(X_*, X) B) + diag(Bᵀ S B)),

q(f) = N(m, S) being the fitted posterior; the last term comes from ``post.marginals(Bᵀ)``, so
any covariance family and any method works.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from .. import _checks
from ..glm import signed_labels
from ..model import DenseGaussian, GaussianFactor, Identity, LatentLinearModel, ScaledIdentity, Sites
from ..potentials import AbstractPotential
from ..quadrature import GaussHermite, safe_sqrt
from .kernels import AbstractKernel, _inputs

__all__ = ["model", "predict", "predict_proba", "log_predictive"]

DEFAULT_JITTER = 1e-6


def model(kernel, X, likelihood, labels=None, mean=0.0, jitter=DEFAULT_JITTER) -> LatentLinearModel:
    """A GP model: prior f ~ N(mean, K(X) + jitter·I), one site φ_n(f_n) per input.

    **Arguments:**

    - `kernel`: a `vj.gp.kernels` kernel.
    - `X`: inputs, shape ``(N, d)`` or ``(N,)``.
    - `likelihood`: a potential carrying the observations, e.g.
      ``vj.potentials.StudentT(df=3.0, loc=y, scale=0.1)``; for binary classification
      ``vj.potentials.Probit()`` or ``Logistic()`` together with ``labels``.
    - `labels`: class labels in {0, 1} or {−1, +1}, required by (and only by) classification
      likelihoods; they are folded into H = diag(±1).
    - `mean`: a constant prior mean (scalar).
    - `jitter`: added to the diagonal of K before factorising (reported on the prior as ``.jitter``).
    """
    owner = "vj.gp.model"
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"{owner}: `kernel` must be a vj.gp.kernels kernel, got {type(kernel).__name__}.")
    if not isinstance(likelihood, AbstractPotential):
        raise ValueError(f"{owner}: `likelihood` must be a vj.potentials potential, got {type(likelihood).__name__}.")
    X = _inputs(X, owner)
    mean = _checks.as_float_array("mean", mean, owner)
    if mean.ndim != 0:
        raise ValueError(f"{owner}: `mean` must be a scalar (a constant mean function), got shape {mean.shape}.")
    _checks.check_finite("mean", mean, owner)
    n = X.shape[0]
    K = kernel(X)
    prior = GaussianFactor.dense(jnp.full(n, mean, K.dtype), K, jitter=jitter)
    signs = label_signs(likelihood, labels, n, owner)
    H = Identity(n) if signs is None else ScaledIdentity(signs.astype(K.dtype))
    return LatentLinearModel(prior, Sites(H, likelihood))


def label_signs(likelihood, labels, n, owner):
    """±1 per input for a classification likelihood (which acts on y_n f_n), else None.

    Raises where a classification likelihood has no ``labels`` (or the wrong number), or where
    another likelihood, which carries its own observations, is given some.
    """
    if not getattr(likelihood, "labels_in_projection", False):  # duck-typed likelihoods carry their own data
        if labels is not None:
            raise ValueError(f"{owner}: `labels` is only for classification likelihoods; a "
                             f"{type(likelihood).__name__} likelihood carries its observations (`loc` or `counts`).")
        return None
    if labels is None:
        raise ValueError(f"{owner}: a {type(likelihood).__name__} likelihood needs `labels` "
                         "(in {0, 1} or {-1, +1}, one per row of X).")
    labels = _checks.as_float_array("labels", labels, owner, ndim=1)
    if labels.shape[0] != n:
        raise ValueError(f"{owner}: X has {n} rows but `labels` has {labels.shape[0]} entries.")
    return signed_labels(labels, owner).astype(labels.dtype)


def _gp_prior(post, owner):
    prior = post.model.prior
    if not isinstance(prior, DenseGaussian) or len(post.model.sites) != 1:
        raise ValueError(f"{owner}: expects the posterior of a `vj.gp.model` (a dense Gaussian prior and one site group).")
    return prior


def predict(post, kernel, X, X_test):
    """Latent predictive mean and variance of f at ``X_test``: two arrays of shape ``(T,)``.

    ``post`` is a fit of ``vj.gp.model(kernel, X, …)`` by any method; ``kernel`` and ``X`` must be
    the ones the model was built with (the prior's jitter is taken from ``post.model``).
    """
    owner = "vj.gp.predict"
    prior = _gp_prior(post, owner)
    X, X_test = _inputs(X, owner), _inputs(X_test, owner)
    if X.shape[0] != prior.dim:
        raise ValueError(f"{owner}: X has {X.shape[0]} rows but the model has {prior.dim} latent values.")
    A = solve_triangular(prior.chol, kernel(X, X_test), lower=True)
    B = solve_triangular(prior.chol.T, A, lower=False)
    centred = B.T @ (post.mean - prior.mean)
    _, posterior_var = post.marginals(B.T)
    var = kernel.diagonal(X_test) - jnp.sum(A**2, axis=0) + posterior_var
    return prior.mean[0] + centred, jnp.maximum(var, 0.0)


def predict_proba(post, kernel, X, X_test, quadrature=GaussHermite()):
    """p(y_* = 1 | x_*) = ⟨φ(f_*)⟩ under q(f_*) for a binary classification GP: shape ``(T,)``."""
    owner = "vj.gp.predict_proba"
    _gp_prior(post, owner)
    potential = post.model.sites[0].potential
    if not potential.labels_in_projection:
        raise ValueError(f"{owner}: needs a classification posterior, got a {type(potential).__name__} likelihood.")
    mean, var = predict(post, kernel, X, X_test)
    return jnp.exp(potential.log_expected_phi(mean, safe_sqrt(var), quadrature))


def log_predictive(post, kernel, X, X_test, y_test, quadrature=GaussHermite()):
    """log p(y_* | x_*, data) ≈ log ⟨p(y_* | f_*)⟩ under q(f_*) for each test point: shape ``(T,)``.

    ``y_test`` holds labels for classification and observations otherwise (the likelihood's
    other parameters, e.g. its scale, are those of the fitted model).
    """
    owner = "vj.gp.log_predictive"
    _gp_prior(post, owner)
    potential = post.model.sites[0].potential
    mean, var = predict(post, kernel, X, X_test)
    y_test = _checks.as_float_array("y_test", y_test, owner, ndim=1)
    if y_test.shape[0] != mean.shape[0]:
        raise ValueError(f"{owner}: X_test has {mean.shape[0]} rows but `y_test` has {y_test.shape[0]} entries.")
    if potential.labels_in_projection:
        mean = signed_labels(y_test, owner) * mean
    else:
        potential = potential.observe(y_test)
    return potential.log_expected_phi(mean, safe_sqrt(var), quadrature)

