"""Multi-class GP classification with the softmax (multinomial-logit) likelihood and its local bounds.

C classes, f_c ~ GP(0, K_c) independently, p(y_i = c | f_i) = softmax(f_i)_c. Only the differences
η_ik = f_ik − f_i0 (k = 1 … C−1) enter the likelihood, which is `vj.factor.Multinomial` with η_0 = 0,
so the model is a latent Gaussian model with one "data point": the latents are the whitened values
f̃ with f_c = L_c f̃_c (K_c + εI = L_c L_cᵀ), prior N(0, I) (no K⁻¹ is ever formed), and column i's
loadings map f̃ to (η_i1 … η_i,C−1). `fit` runs the factor model's E-step — monotone ascent of the
bound, with the covariance by natural-gradient steps and the mean by Newton steps (``newton=True``:
the bounds' own curvature in m̃, which their fixed-point curvature only majorises)

    log Z ≥ −KL(q(f̃) ‖ N(0, I)) + Σ_i f̲(y_i, m̃_i, Ṽ_i)

with the Böhning, log, tilted or product-of-sigmoids bound f̲ on ⟨log softmax⟩ (Khan thesis ch. 5) —
and `predict_proba` averages the softmax over q's predictive at test inputs by Monte Carlo.
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from .. import _checks
from ..posterior import Diagnostics
from ..factor import Block, FactorModel, Multinomial, e_step, initial_posteriors
from ._layout import class_kernels as _kernels, class_labels as _labels, class_prior_covariances as _prior_covariances
from ._layout import same_arrays
from .kernels import AbstractKernel

__all__ = ["SoftmaxFit", "fit", "predict", "predict_proba"]


class SoftmaxFit(eqx.Module):
    """q(f̃) = N(mean, cov) over the whitened latents (class-major, C·N), the bound ``log_z`` (a
    scalar), the prior Cholesky factors ``chol`` (C, N, N), the E-step's ``diagnostics`` (a
    `vj.Diagnostics`: ``iterations``, ``converged``; ``objective_trace`` holds the final bound only,
    as the E-step keeps no trace; ``stationarity`` and ``grad_norm`` are not computed, NaN), and what
    prediction needs: the C class ``kernels`` and the inputs ``X`` (N, d)."""

    mean: jax.Array
    cov: jax.Array
    chol: jax.Array
    log_z: jax.Array
    diagnostics: Diagnostics
    kernels: tuple
    X: jax.Array

    @property
    def iterations(self):
        """E-step iterations (``diagnostics.iterations``)."""
        return self.diagnostics.iterations

    @property
    def converged(self):
        """Whether the E-step converged (``diagnostics.converged``)."""
        return self.diagnostics.converged


def _loadings(chol, num_classes):
    """W̃ (N, C−1, C·N): row (i, k) is e_{k,i}ᵀ L − e_{0,i}ᵀ L, the map from f̃ to η_ik = f_ik − f_i0."""
    c, n = num_classes, chol.shape[-1]
    blocks = jnp.zeros((n, c - 1, c, n), chol.dtype)
    blocks = blocks.at[:, :, 0, :].set(-chol[0][:, None, :])
    idx = jnp.arange(1, c)
    blocks = blocks.at[:, idx - 1, idx, :].set(jnp.transpose(chol[1:], (1, 0, 2)))
    return blocks.reshape(n, c - 1, c * n)


def fit(kernel, X, labels, num_classes: int, bound: str = "log", jitter: float = 1e-6, max_iter: int = 500,
        tol: float = 1e-9) -> SoftmaxFit:
    """Fit q(f) under the softmax likelihood with ``bound`` ("bohning", "log", "tilted" or "pos").

    ``max_iter`` and ``tol`` are those of the E-step (`vj.factor.e_step`: q within ``tol`` of its
    optimum in units of its marginal standard deviations).

    ``kernel`` is one kernel shared by the classes or a sequence of C kernels; ``labels`` are integers
    0 … C−1.
    """
    owner = "vj.gp.softmax.fit"
    X = _checks.as_inputs(X, owner)
    n = X.shape[0]
    y = _labels(labels, n, num_classes, owner)
    chol = jnp.linalg.cholesky(_prior_covariances(kernel, X, num_classes, jitter, owner))
    mean, cov, log_z, diagnostics = _fit(chol, jnp.asarray(y, X.dtype), Multinomial(num_classes, bound), max_iter, tol)
    return SoftmaxFit(mean, cov, chol, log_z, diagnostics, tuple(_kernels(kernel, num_classes, owner)), X)


@eqx.filter_jit
def _fit(chol, y, likelihood, max_iter, tol):
    num_classes, n = chol.shape[0], chol.shape[1]
    latent = num_classes * n
    block = Block(tuple(range(n)), likelihood, _loadings(chol, num_classes), jnp.zeros((n, num_classes - 1), chol.dtype))
    model = FactorModel(jnp.zeros(latent, chol.dtype), jnp.eye(latent, dtype=chol.dtype), (block,),
                        learn_prior=False, learn_loadings=False)
    q = e_step(model, y[None], jnp.ones((1, n), bool), initial_posteriors(model, 1), max_iter, tol, newton=True)
    log_z, nan = q.bound[0], jnp.asarray(jnp.nan, chol.dtype)
    diagnostics = Diagnostics(iterations=q.iterations[0], converged=q.converged[0], stationarity=nan, grad_norm=nan,
                              objective_trace=log_z[None], num_value_evals=q.iterations[0],
                              num_grad_evals=q.iterations[0], num_hvp_evals=jnp.zeros((), q.iterations.dtype),
                              method="softmax", solver="E-step (Newton)")
    return q.mean[0], q.cov[0], log_z, diagnostics


def _legacy(result, args, owner, new_form):
    """``(X_test, rest)`` from a call ``f(result, X_test, ...)`` or the deprecated ``f(result, kernel, X, X_test, ...)``."""
    if not isinstance(args[0], AbstractKernel):
        return args[0], args[1:]
    warnings.warn(f"{owner}(result, kernel, X, X_test, ...) is deprecated: the fit records its kernels and inputs, "
                  f"so call {new_form}.", DeprecationWarning, stacklevel=3)
    kernels = tuple(_kernels(args[0], len(result.kernels), owner))
    if not (same_arrays(kernels, result.kernels) and same_arrays(_checks.as_inputs(args[1], owner), result.X)):
        raise ValueError(f"{owner}: `kernel` or `X` differ from those the fit recorded; call {new_form}.")
    return args[2], args[3:]


def predict(result: SoftmaxFit, X_test, *legacy):
    """Predictive latent means (M, C) and covariances (M, C, C) at ``X_test``, under the kernels and
    inputs the fit records. (The form ``predict(result, kernel, X, X_test)`` is deprecated.)"""
    owner = "vj.gp.softmax.predict"
    X_test, rest = _legacy(result, (X_test,) + legacy, owner, "vj.gp.softmax.predict(result, X_test)")
    if rest:
        raise ValueError(f"{owner}: takes (result, X_test).")
    return _predict(result, _checks.as_inputs(X_test, owner))


def _predict(result, X_test):
    kernels, X = result.kernels, result.X
    num_classes, n = result.chol.shape[0], result.chol.shape[1]
    # A_c = K_*c L_c⁻ᵀ maps the whitened f̃_c to the conditional mean of f_*c.
    A = jnp.stack([solve_triangular(result.chol[c], k(X, X_test), lower=True).T for c, k in enumerate(kernels)])
    m = result.mean.reshape(num_classes, n)
    V = result.cov.reshape(num_classes, n, num_classes, n)
    mean = jnp.einsum("cmn,cn->mc", A, m)
    cov = jnp.einsum("cmn,cndo,dmo->mcd", A, V, A)
    prior_var = jnp.stack([k.diagonal(X_test) for k in kernels], -1) - jnp.sum(A**2, -1).T
    return mean, cov + jax.vmap(jnp.diag)(prior_var)


def predict_proba(result: SoftmaxFit, X_test, *legacy, key=None, num_samples: int = 4000):
    """Class probabilities (M, C), a JAX array: ⟨softmax(f_*)⟩ under the predictive Gaussian, by Monte
    Carlo with ``num_samples`` draws from ``key`` (a `jax.random` key; calling without one is
    deprecated: it warns and uses ``jax.random.PRNGKey(0)``). (The form ``predict_proba(result,
    kernel, X, X_test)`` is deprecated.)"""
    owner = "vj.gp.softmax.predict_proba"
    X_test, rest = _legacy(result, (X_test,) + legacy, owner, "vj.gp.softmax.predict_proba(result, X_test, key=key)")
    if len(rest) > 1:
        raise ValueError(f"{owner}: takes (result, X_test, key=...).")
    key = rest[0] if rest else key
    if key is None:
        warnings.warn("vj.gp.softmax.predict_proba: pass `key=jax.random.PRNGKey(...)`; the probabilities are a "
                      "Monte Carlo estimate, and calling without a key (a fixed PRNGKey(0)) is deprecated and "
                      "will raise.", DeprecationWarning, stacklevel=2)
        key = jax.random.PRNGKey(0)
    mean, cov = _predict(result, _checks.as_inputs(X_test, owner))
    chol = jnp.linalg.cholesky(cov + 1e-10 * jnp.eye(cov.shape[-1], dtype=cov.dtype))
    eps = jax.random.normal(key, (num_samples,) + mean.shape, mean.dtype)
    samples = mean + jnp.einsum("mcd,smd->smc", chol, eps)
    return jnp.mean(jax.nn.softmax(samples, -1), 0)


def __dir__():
    return list(__all__)
