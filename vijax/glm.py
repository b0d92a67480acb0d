"""Bayesian generalised linear models: builders and predictive quantities.

Each builder returns a `LatentLinearModel` with prior N(0, v I) and one site group over the rows of X,
shape ``(N, D)`` (add a column of ones for an intercept): `logistic_regression`, `probit_regression`,
`poisson_regression`, `robust_regression` (Student-t or Laplace noise) and the conjugate `linear_regression`;
`hierarchical_linear` builds a `vj.hierarchical.HierarchicalModel` for `vj.HierarchicalEP`. Data and parameters
take X's floating dtype, strongly typed (so a jitted loop updating a parameter compiles once). The predictives
integrate the site potential over q's 1-D marginal of x_*ᵀw, and also take a `vj.posterior.Mixture`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from . import _checks, potentials
from .hierarchical import HierarchicalModel
from .methods.ep_hyper import scale_tilted_moments
from .model import GaussianFactor, Identity, LatentLinearModel, Sites
from .posterior import Mixture, Posterior
from .quadrature import GaussHermite, safe_sqrt

__all__ = ["logistic_regression", "probit_regression", "poisson_regression", "robust_regression", "linear_regression",
           "hierarchical_linear", "hierarchical_predict", "signed_labels", "predict_proba", "predict_mean",
           "log_predictive"]
__dir__ = __all__.copy


def _design(X, owner, data=True):
    """X as a finite float ``(N, D)`` array; a model's data (``data``) needs N ≥ 1 and D ≥ 1."""
    X = _checks.as_param("X", X, owner, ndim=2)
    _checks.check_finite("X", X, owner)
    if data:
        _checks.check_data_shape(X, owner)
    return X


def _data(X, y, owner, name="y", data=True):
    """`_design`'s X and the targets ``y`` ``(N,)``, finite, in X's dtype."""
    X = _design(X, owner, data)
    y = _checks.as_param(name, y, owner, X.dtype, ndim=1)
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"{owner}: X has {X.shape[0]} rows but `{name}` has {y.shape[0]} entries.")
    _checks.check_finite(name, y, owner)
    return X, y


def signed_labels(y: ArrayLike, owner: str = "signed_labels") -> jax.Array:
    """Binary labels, all in {0, 1} or all in {−1, +1}, as ±1 floats (raises on anything else).

    Args:
        y: labels, shape ``(N,)``.
        owner: the function named in the error message.
    """
    if _checks.is_concrete(y):
        values = set(np.unique(np.asarray(y)).tolist())
        if not (values <= {0.0, 1.0} or values <= {-1.0, 1.0}):
            raise ValueError(f"{owner}: labels must all be in {{0, 1}} or all in {{-1, +1}}; "
                             f"got the values {sorted(values)[:10]}.")
    y = jnp.asarray(y)
    return jnp.where(y > 0, 1.0, -1.0).astype(jnp.result_type(float))


def _prior(X, prior_variance, owner):
    prior_variance = _checks.as_param("prior_variance", prior_variance, owner, X.dtype)
    _checks.check_positive("prior_variance", prior_variance, owner)
    return GaussianFactor.isotropic(X.shape[1], prior_variance)


def _binary(X, y, prior_variance, potential, owner):
    X, y = _data(X, y, owner)
    labels = signed_labels(y, owner).astype(X.dtype)
    return LatentLinearModel(_prior(X, prior_variance, owner), Sites(labels[:, None] * X, potential))


def logistic_regression(X: ArrayLike, y: ArrayLike, prior_variance: ArrayLike = 1.0) -> LatentLinearModel:
    """Bayesian logistic regression: p(w | X, y) ∝ N(w | 0, v I) ∏_n σ(y_n x_nᵀw), sites on H = diag(y) X.

    Args:
        X: covariates, shape ``(N, D)``.
        y: labels, shape ``(N,)``, all in {0, 1} or all in {−1, +1}.
        prior_variance: v > 0, each weight's prior variance (may be traced, e.g. for ML-II).
    """
    return _binary(X, y, prior_variance, potentials.Logistic(), "logistic_regression")


def probit_regression(X: ArrayLike, y: ArrayLike, prior_variance: ArrayLike = 1.0) -> LatentLinearModel:
    """Bayesian probit regression: p(w | X, y) ∝ N(w | 0, v I) ∏_n Φ(y_n x_nᵀw), sites on H = diag(y) X.

    Args:
        X: covariates, shape ``(N, D)``.
        y: labels, shape ``(N,)``, all in {0, 1} or all in {−1, +1}.
        prior_variance: v > 0, each weight's prior variance.
    """
    return _binary(X, y, prior_variance, potentials.Probit(), "probit_regression")


def poisson_regression(X: ArrayLike, counts: ArrayLike, prior_variance: ArrayLike = 1.0,
                       offset: ArrayLike = 0.0) -> LatentLinearModel:
    """Counts with log link: p(w) ∝ N(w | 0, v I) ∏_n Poisson(counts_n | exp(x_nᵀw + offset_n)).

    Args:
        X: covariates, shape ``(N, D)``.
        counts: non-negative counts, shape ``(N,)``.
        prior_variance: v > 0, each weight's prior variance.
        offset: scalar or ``(N,)``, added to the linear predictor (e.g. log exposure).
    """
    owner = "poisson_regression"
    X, counts = _data(X, counts, owner, "counts")
    offset = _checks.as_param("offset", offset, owner, X.dtype)
    return LatentLinearModel(_prior(X, prior_variance, owner), Sites(X, potentials.Poisson(counts), offset))


def robust_regression(X: ArrayLike, y: ArrayLike, likelihood: str = "student_t", scale: ArrayLike = 1.0,
                      df: ArrayLike = 3.0, prior_variance: ArrayLike = 1.0) -> LatentLinearModel:
    """Regression with heavy-tailed noise: y_n = x_nᵀw + ε_n, ε_n Student-t or Laplace.

    Student-t sites are not log-concave: use EP, Laplace or G-KL (its default solver); LVB uses a scale-mixture bound.

    Args:
        X: covariates, shape ``(N, D)``.
        y: targets, shape ``(N,)``.
        likelihood: ``"student_t"`` (with ``df``, default 3) or ``"laplace"``.
        scale: the noise scale (positive; scalar or ``(N,)``).
        df: the Student-t degrees of freedom (ignored for ``"laplace"``).
        prior_variance: v > 0, each weight's prior variance.
    """
    owner = "robust_regression"
    X, y = _data(X, y, owner)
    scale = _checks.as_param("scale", scale, owner, X.dtype)
    if likelihood == "student_t":
        potential = potentials.StudentT(df=_checks.as_param("df", df, owner, X.dtype), loc=y, scale=scale)
    elif likelihood == "laplace":
        potential = potentials.Laplace(loc=y, scale=scale)
    else:
        raise ValueError(f"{owner}: `likelihood` must be 'student_t' or 'laplace', got {likelihood!r}.")
    return LatentLinearModel(_prior(X, prior_variance, owner), Sites(X, potential))


def linear_regression(X: ArrayLike, y: ArrayLike, noise_scale: ArrayLike = 1.0,
                      prior_variance: ArrayLike = 1.0) -> LatentLinearModel:
    """Conjugate Bayesian linear regression: p(w | X, y) ∝ N(w | 0, v I) ∏_n N(y_n | x_nᵀw, noise_scale²).

    Args:
        X: covariates, shape ``(N, D)``.
        y: targets, shape ``(N,)``.
        noise_scale: the standard deviation of the Gaussian noise (positive).
        prior_variance: v > 0, each weight's prior variance.
    """
    owner = "linear_regression"
    X, y = _data(X, y, owner)
    noise_scale = _checks.as_param("noise_scale", noise_scale, owner, X.dtype)
    return LatentLinearModel(_prior(X, prior_variance, owner), Sites(X, potentials.Gaussian(loc=y, scale=noise_scale)))


def hierarchical_linear(X, y, groups="ard", scale_prior=(0.0, 4.0), noise_prior=(0.0, 4.0), df=None):
    """A sparse linear model with hierarchical priors (Jylänki 2013, Publication IV; Seeger 2008; Neal 1996),
    fitted by ``vj.infer(model, vj.HierarchicalEP())``:

    $$
    y_n \\mid w, φ_0 \\sim \\mathcal N(x_n^\\top w, e^{φ_0}) \\ \\text{or}\\ \\mathrm{St}(x_n^\\top w, ν, e^{φ_0}), \\qquad
    w_j \\mid φ \\sim \\mathcal N(0, e^{φ_{l_j}}), \\qquad
    φ_0 \\sim \\mathcal N(\\text{noise\\_prior}), \\quad φ_l \\sim \\mathcal N(\\text{scale\\_prior}).
    $$

    **Arguments:**

    - `X`: ``(N, D)`` inputs (standardise the columns: the default hyperpriors are on the unit scale); `y`: ``(N,)``.
    - `groups`: ``"ard"`` (one scale per input), ``"common"`` (one shared scale: Laplace-like shrinkage), or an int
      array ``(D,)`` of group labels 0..G−1 (one scale per group).
    - `scale_prior`, `noise_prior`: (mean, variance) of the Gaussian hyperpriors on each log prior variance φ_l
      (scalars or ``(G,)``) and on the log noise variance φ_0 (scalars); default (0, 4).
    - `df`: ``None`` (Gaussian) or ν > 0: St(y_n | x_nᵀw, ν, e^{φ_0}), robust to outliers.

    Hyperparameter 0 is log σ², 1..G the log prior variances, so ``post.relevances()[1:]`` are E[e^{φ_l}].
    """
    owner = "hierarchical_linear"
    X, y = _data(X, y, owner)
    D = X.shape[1]
    named = {"ard": np.arange(D), "common": np.zeros(D, int)}
    if isinstance(groups, str):
        if groups not in named:
            raise ValueError(f"{owner}: `groups` must be 'ard', 'common' or an int array of shape ({D},); got {groups!r}.")
        labels = named[groups]
    else:
        labels = np.asarray(groups)
        if labels.shape != (D,) or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
            raise ValueError(f"{owner}: `groups` as an array must hold D = {D} non-negative ints (group labels); "
                             f"got shape {labels.shape}, dtype {labels.dtype}.")
        if set(np.unique(labels).tolist()) != set(range(labels.max() + 1)):
            raise ValueError(f"{owner}: group labels must be 0..G-1 with every group used; got {np.unique(labels)}.")
    G = int(labels.max()) + 1
    noise_mean, noise_var = (jnp.ravel(jnp.asarray(p, X.dtype)) for p in noise_prior)
    scale_mean, scale_var = (jnp.broadcast_to(jnp.asarray(p, X.dtype), (G,)) for p in scale_prior)
    if noise_mean.shape != (1,) or noise_var.shape != (1,):
        raise ValueError(f"{owner}: `noise_prior` must be a pair of scalars (mean, variance) of log σ².")
    names = ("log noise variance",) + tuple(f"log scale {g}" for g in range(G))
    if df is None:
        likelihood = potentials.Gaussian(loc=y)
    else:
        if _checks.is_concrete(df) and not (np.ndim(df) == 0 and float(df) > 0):
            raise ValueError(f"{owner}: `df` must be None (Gaussian likelihood) or a positive number "
                             f"(Student-t degrees of freedom); got {df!r}.")
        likelihood = potentials.StudentT(df=jnp.asarray(df, X.dtype), loc=y)
    sites = (Sites(X, likelihood), Sites(Identity(D), potentials.Gaussian(loc=jnp.zeros(D, X.dtype))))
    return HierarchicalModel(sites, (np.zeros(X.shape[0], int), jnp.asarray(labels + 1)),
                             jnp.concatenate([noise_mean, scale_mean]), jnp.concatenate([noise_var, scale_var]), names)


def hierarchical_predict(post, X_test, y_test=None, quadrature=GaussHermite()):
    """Predictive of a `hierarchical_linear` fit: ``(mean, variance)`` of y_*, each ``(N_test,)``, and with ``y_test``
    also log p(y_* | data) ≈ log ∫∫ t(y_* | x; e^{φ_0}) N(x | x_*ᵀm, x_*ᵀSx_*) q(φ_0) dx dφ_0, t the likelihood.
    The variance is x_*ᵀSx_* + E_q[e^{φ_0}] (times ν/(ν − 2) for a Student-t; infinite for ν ≤ 2)."""
    owner = "hierarchical_predict"
    X_test = _design(X_test, owner, data=False)
    mean, var = post.weights.marginals(X_test)
    phi_mean, phi_var = post.hyper_mean[0], post.hyper_var[0]
    likelihood = post.weights.model.sites[0].potential
    noise = jnp.exp(phi_mean + 0.5 * phi_var)
    if isinstance(likelihood, potentials.StudentT):
        nu = likelihood.df
        noise = jnp.where(nu > 2, noise * nu / jnp.where(nu > 2, nu - 2, 1.0), jnp.inf)
    if y_test is None:
        return mean, var + noise
    y_test = _data(X_test, y_test, owner, "y_test", data=False)[1]
    lp = scale_tilted_moments(likelihood.observe(y_test), mean, var, phi_mean, phi_var, 1.0, quadrature)[0]
    return mean, var + noise, lp


def _site_potential(post, owner):
    """The GLM's one site potential, for new data: a padded model's (`vj.pad_sites`) without its mask."""
    if len(post.model.sites) != 1:
        raise ValueError(f"{owner}: expects a GLM posterior (one site group); got {len(post.model.sites)} groups.")
    potential = post.model.sites[0].potential
    return potential.potential if isinstance(potential, potentials.Masked) else potential


def predict_proba(post: Posterior | Mixture, X_test: ArrayLike,
                  quadrature: GaussHermite = GaussHermite()) -> jax.Array:
    """p(y = 1 | x_*) = ⟨φ(x_*ᵀw)⟩_q for logistic, probit or Heaviside GLMs, shape ``(T,)``.

    Args:
        post: a binary GLM's posterior, or a `vj.posterior.Mixture` over hyperparameters (then Σ_k w_k p_k).
        X_test: test covariates, shape ``(T, D)``.
        quadrature: the 1-D rule for expectations without a closed form.
    """
    owner = "predict_proba"
    if isinstance(post, Mixture):
        return post.mix(predict_proba, X_test, quadrature)
    potential = _site_potential(post, owner)
    if not potential.labels_in_projection:
        raise ValueError(f"{owner}: needs a binary classification posterior, got a {type(potential).__name__} likelihood.")
    X_test = _design(X_test, owner, data=False)
    mean, var = post.marginals(X_test)
    return jnp.exp(potential.log_expected_phi(mean, safe_sqrt(var), quadrature))


def predict_mean(post: Posterior | Mixture, X_test: ArrayLike, offset: ArrayLike = 0.0) -> jax.Array:
    """E[y_* | x_*, data] = ⟨E[y | η_*]⟩_q, η_* = x_*ᵀw + ``offset``: the predicted means, shape ``(T,)``.

    With m_*, v_* q's marginal of x_*ᵀw: Poisson, the mean count exp(m_* + v_*/2) (pass log exposure as ``offset``);
    binary GLMs, `predict_proba`; Gaussian, Laplace and Student-t (ν > 1), m_* (a Cauchy likelihood has no mean).

    Args:
        post: a GLM's posterior, or a `vj.posterior.Mixture` over hyperparameters (the means mixed).
        X_test: test covariates, shape ``(T, D)``.
        offset: scalar or ``(T,)``, added to the linear predictor.
    """
    owner = "predict_mean"
    if isinstance(post, Mixture):
        return post.mix(predict_mean, X_test, offset)
    potential = _site_potential(post, owner)
    if potential.labels_in_projection:
        return predict_proba(post, X_test)
    X_test = _design(X_test, owner, data=False)
    offset = _checks.as_param("offset", offset, owner, X_test.dtype)
    _checks.check_finite("offset", offset, owner)
    if jnp.ndim(offset) != 0 and jnp.shape(offset) != (X_test.shape[0],):
        raise ValueError(f"{owner}: `offset` must be a scalar or have one entry per test point, shape "
                         f"({X_test.shape[0]},); got shape {jnp.shape(offset)}.")
    mean, var = post.marginals(X_test)
    if isinstance(potential, potentials.Poisson):
        return jnp.exp(mean + offset + 0.5 * var)
    if isinstance(potential, potentials.StudentT) and _checks.is_concrete(potential.df) \
            and not bool(jnp.all(potential.df > 1)):
        raise ValueError(f"{owner}: a Student-t likelihood with ν ≤ 1 has no mean.")
    if isinstance(potential, (potentials.Gaussian, potentials.Laplace, potentials.StudentT)):
        return mean + offset
    raise ValueError(f"{owner}: no predicted mean for a {type(potential).__name__} likelihood (a Cauchy "
                     "likelihood has none); use log_predictive for predictive densities.")


def log_predictive(post: Posterior | Mixture, X_test: ArrayLike, y_test: ArrayLike,
                   quadrature: GaussHermite = GaussHermite()) -> jax.Array:
    """log p(y_* | x_*, data) ≈ log ⟨p(y_* | x_*ᵀw)⟩_q for each test point, shape ``(T,)``.

    Args:
        post: a GLM's posterior, or a `vj.posterior.Mixture` over hyperparameters (then log Σ_k w_k p_k).
        X_test: test covariates, shape ``(T, D)``.
        y_test: labels (binary GLMs, in the training label set) or targets / counts, shape ``(T,)``.
        quadrature: the 1-D rule for expectations without a closed form.
    """
    owner = "log_predictive"
    if isinstance(post, Mixture):
        return post.mix(log_predictive, X_test, y_test, quadrature, combine="log")
    potential = _site_potential(post, owner)
    X_test, y_test = _data(X_test, y_test, owner, "y_test", data=False)
    if potential.labels_in_projection:
        X_test = signed_labels(y_test, owner)[:, None] * X_test
    else:
        potential = potential.observe(y_test)
    mean, var = post.marginals(X_test)
    return potential.log_expected_phi(mean, safe_sqrt(var), quadrature)
