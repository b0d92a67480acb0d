"""Gaussian-process models as latent linear models, and their predictive distributions.

A GP model over N inputs is the latent linear model with w = f = (f(x_1), …, f(x_N)),

    p(f | y) ∝ N(f | μ1, K + εI) · ∏_n φ_n(f_n),      K_nm = k(x_n, x_m),

so H = I (diag(±1) for binary classification) and every method of `vj.infer` applies. At test inputs X_*,
with B = (K + εI)⁻¹ K(X, X_*) and q(f) = N(m, S) the fit,

    q(f_*) = N(μ + Bᵀ(m − μ1),  diag k(X_*, X_*) − diag(K(X_*, X) B) + diag(Bᵀ S B)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from .. import _checks
from .._factorisation import conditional
from ..glm import signed_labels
from ..model import DenseGaussian, GaussianFactor, Identity, LatentLinearModel, ScaledIdentity, Sites
from ..potentials import AbstractPotential
from ..quadrature import GaussHermite, safe_sqrt
from .kernels import AbstractKernel
from ..posterior import Mixture, Posterior

__all__ = ["GPModel", "model", "predict", "predict_proba", "log_predictive"]

DEFAULT_JITTER = 1e-6


class GPModel(LatentLinearModel):
    """A `LatentLinearModel` with prior f ~ N(mean·1, K(X) + jitter·I) that also records the ``kernel``
    (leaves, so ``jax.grad`` of a fit's ``log_z`` reaches it) and the inputs ``X`` ``(N, d)``; see `vj.gp.model`.
    """

    kernel: AbstractKernel
    X: jax.Array

    def __init__(self, prior, sites, kernel, X):
        super().__init__(prior, sites)
        self.kernel = kernel
        self.X = X

    @property
    def mean(self):
        """The constant prior mean (a scalar)."""
        return self.prior.mean[0]

    @property
    def jitter(self):
        """What was added to the diagonal of K(X) before factorising."""
        return self.prior.jitter


def model(kernel: AbstractKernel, X: ArrayLike, likelihood: AbstractPotential, labels: ArrayLike | None = None,
          mean: ArrayLike = 0.0, jitter: float = DEFAULT_JITTER) -> GPModel:
    """A GP model: prior f ~ N(mean, K(X) + jitter·I), one site φ_n(f_n) per input.

    **Arguments:**

    - `kernel`: a `vj.gp.kernels` kernel; `X`: inputs, shape ``(N, d)`` or ``(N,)``.
    - `likelihood`: a potential carrying the observations, e.g. ``vj.potentials.StudentT(df=3.0, loc=y,
      scale=0.1)``; for binary classification ``vj.potentials.Probit()`` or ``Logistic()`` with ``labels``.
    - `labels`: class labels in {0, 1} or {−1, +1}, for (and only for) classification likelihoods.
    - `mean`: a constant prior mean (scalar).
    - `jitter`: added to the diagonal of K before factorising.

    Returns a `GPModel` of X's floating dtype (the kernel's and likelihood's parameters and the mean are cast).
    """
    owner = "vj.gp.model"
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"{owner}: `kernel` must be a vj.gp.kernels kernel, got {type(kernel).__name__}.")
    if not isinstance(likelihood, AbstractPotential):
        raise ValueError(f"{owner}: `likelihood` must be a vj.potentials potential, got {type(likelihood).__name__}.")
    X = _checks.as_inputs(X, owner)
    _checks.check_data_shape(X, owner)
    kernel = _checks.cast_floating(kernel, X.dtype)
    likelihood = _checks.cast_floating(likelihood, X.dtype)
    mean = _checks.as_param("mean", mean, owner, X.dtype, ndim=0)
    _checks.check_finite("mean", mean, owner)
    n = X.shape[0]
    _check_observations(likelihood, n, owner)
    K = kernel(X)
    prior = GaussianFactor.dense(jnp.full(n, mean, K.dtype), K, jitter=jitter)
    signs = label_signs(likelihood, labels, n, owner)
    H = Identity(n) if signs is None else ScaledIdentity(signs.astype(K.dtype))
    return GPModel(prior, Sites(H, likelihood), kernel, X)


def _check_observations(likelihood, n, owner):
    """Refuse a location likelihood with a scalar ``loc`` (``loc=y`` left out), which would fit y ≡ loc."""
    loc = getattr(likelihood, "loc", None)
    if loc is None or n <= 1 or jnp.ndim(loc) != 0 and jnp.size(loc) != 1:
        return
    raise ValueError(f"{owner}: the {type(likelihood).__name__} likelihood has a scalar `loc` "
                     f"({float(jnp.ravel(loc)[0]) if _checks.is_concrete(loc) else 'traced'}), so every one of the {n} "
                     f"observations would be that value. Pass the observations, e.g. "
                     f"vj.potentials.{type(likelihood).__name__}(loc=y, ...) with y of shape ({n},).")


def label_signs(likelihood, labels, n, owner):
    """±1 per input for a classification likelihood (which acts on y_n f_n), else None (and no labels)."""
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


def _latent(post, X_test, owner):
    """The latent predictive means and variances at ``X_test`` under the posterior's `GPModel`, and its likelihood."""
    prior = post.model.prior
    if not isinstance(prior, DenseGaussian) or len(post.model.sites) != 1:
        raise ValueError(f"{owner}: expects the posterior of a `vj.gp.model` (a dense Gaussian prior and one site group).")
    if not isinstance(post.model, GPModel):
        raise ValueError(f"{owner}: the posterior's model is a {type(post.model).__name__}, which does not record "
                         "a kernel and inputs; build it with vj.gp.model(kernel, X, likelihood).")
    kernel, X = post.model.kernel, post.model.X
    X_test = _checks.as_inputs(X_test, owner)
    if X.shape[0] != prior.dim:
        raise ValueError(f"{owner}: X has {X.shape[0]} rows but the model has {prior.dim} latent values.")
    if X_test.shape[1] != X.shape[1]:
        raise ValueError(f"{owner}: X_test has {X_test.shape[1]} columns but the training inputs have {X.shape[1]}.")
    centred, var = conditional_marginals(post, prior.chol, kernel(X, X_test), kernel.diagonal(X_test))
    return prior.mean[0] + centred, var, post.model.sites[0].potential


def conditional_marginals(post, chol, cross, prior_diag, columns=None):
    """Centred means Bᵀ(m − μ) and variances k** − ‖L⁻¹k*‖² + diag(BᵀSB), each ``(T,)``, at T test inputs under
    q = ``post`` = N(m, S) from the latent values ``columns`` (all if None) with prior covariance LLᵀ (``chol``):
    B = K⁻¹K*, K* = ``cross`` ``(n, T)``, k** = ``prior_diag`` ``(T,)``."""
    cond = conditional(chol, cross, prior_diag)
    B = cond.weights
    H = B.T if columns is None else jnp.zeros((B.shape[1], post.mean.shape[0]), B.dtype).at[:, columns].set(B.T)
    _, var = post.marginals(H)
    return H @ (post.mean - post.model.prior.mean), jnp.maximum(cond.variances + var, 0.0)


def predict(post: Posterior | Mixture, X_test: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Latent predictive mean and variance of f at ``X_test``, each ``(T,)``, for a fit of `vj.gp.model` by any
    method, or a `vj.posterior.Mixture` over hyperparameters (`vj.hyper.integrate`): the mixture's moments."""
    if isinstance(post, Mixture):
        return post.mix(predict, X_test, combine="moments")
    return _latent(post, X_test, "vj.gp.predict")[:2]


def predict_proba(post: Posterior | Mixture, X_test: ArrayLike,
                  quadrature: GaussHermite = GaussHermite()) -> jax.Array:
    """p(y_* = 1 | x_*) = ⟨φ(f_*)⟩ under q(f_*) for a binary classification GP: shape ``(T,)``.

    For a `vj.posterior.Mixture` over hyperparameters, Σ_k w_k p(y_* = 1 | x_*, θ_k)."""
    owner = "vj.gp.predict_proba"
    if isinstance(post, Mixture):
        return post.mix(predict_proba, X_test, quadrature)
    mean, var, potential = _latent(post, X_test, owner)
    if not potential.labels_in_projection:
        raise ValueError(f"{owner}: needs a classification posterior, got a {type(potential).__name__} likelihood.")
    return jnp.exp(potential.log_expected_phi(mean, safe_sqrt(var), quadrature))


def log_predictive(post: Posterior | Mixture, X_test: ArrayLike, y_test: ArrayLike,
                   quadrature: GaussHermite = GaussHermite()) -> jax.Array:
    """log p(y_* | x_*, data) ≈ log ⟨p(y_* | f_*)⟩ under q(f_*) for each test point: shape ``(T,)``.

    ``y_test`` holds labels for classification and observations otherwise (the likelihood's other
    parameters are the fitted model's). For a `vj.posterior.Mixture`, log Σ_k w_k p(y_* | x_*, θ_k).
    """
    owner = "vj.gp.log_predictive"
    if isinstance(post, Mixture):
        return post.mix(log_predictive, X_test, y_test, quadrature, combine="log")
    mean, var, potential = _latent(post, X_test, owner)
    y_test = _checks.as_float_array("y_test", y_test, owner, ndim=1)
    if y_test.shape[0] != mean.shape[0]:
        raise ValueError(f"{owner}: X_test has {mean.shape[0]} rows but `y_test` has {y_test.shape[0]} entries.")
    if potential.labels_in_projection:
        mean = signed_labels(y_test, owner) * mean
    else:
        potential = potential.observe(y_test)
    return potential.log_expected_phi(mean, safe_sqrt(var), quadrature)
