r"""Sparse variational GPs with inducing points (Titsias 2009; Hensman et al. 2013).

Inputs ``X`` (N, d), targets ``y`` (N,), inducing inputs ``Z`` (M, d), noise variance :math:`\sigma^2`,
:math:`p(u) = \mathcal N(0, K_{ZZ})` with :math:`K_{ZZ} = k(Z, Z) + \text{jitter}\, I = L L^\top`,
:math:`K_{ZX} = k(Z, X)`, :math:`Q_{XX} = K_{XZ} K_{ZZ}^{-1} K_{ZX}`. Everything costs :math:`O(N M^2)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

from .. import _checks
from .._factorisation import conditional
from .._linalg import LOG_2PI as _LOG_2PI, backtrack, neg_kl
from ..quadrature import safe_sqrt
from .kernels import AbstractKernel
from .models import label_signs
from ..potentials import AbstractPotential

_MAX_HALVINGS = 30  # of a natural-gradient step that would leave S̃⁻¹ indefinite

__all__ = ["collapsed_elbo", "optimal_inducing_posterior", "predict_sparse", "svgp_elbo", "svgp_natural_step"]
__dir__ = __all__.copy


def _inputs(owner, X, inducing, y=None, noise_variance=None):
    """X, Z, y and the noise variance, checked."""
    X = _checks.as_float_array("X", X, owner, ndim=2)
    Z = _checks.as_float_array("inducing", inducing, owner, ndim=2)
    if X.shape[1] != Z.shape[1]:
        raise ValueError(f"{owner}: `X` has {X.shape[1]} input dimension(s) but `inducing` has "
                         f"{Z.shape[1]} (shapes {X.shape} and {Z.shape}).")
    if y is not None:
        y = _checks.as_float_array("y", y, owner, ndim=1)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"{owner}: `y` has shape {y.shape} but `X` has {X.shape[0]} rows.")
    if noise_variance is not None:
        noise_variance = _checks.as_float_array("noise_variance", noise_variance, owner, ndim=0)
        _checks.check_positive("noise_variance", noise_variance, owner)
    return X, Z, y, noise_variance


def _q_u(owner, mean_u, cov_name, cov_u, M):
    mean_u = _checks.as_float_array("mean_u", mean_u, owner, ndim=1)
    cov_u = _checks.as_float_array(cov_name, cov_u, owner, ndim=2)
    if mean_u.shape != (M,) or cov_u.shape != (M, M):
        raise ValueError(f"{owner}: with {M} inducing points `mean_u` must have shape ({M},) and "
                         f"`{cov_name}` shape ({M}, {M}); got {mean_u.shape} and {cov_u.shape}.")
    return mean_u, cov_u


def _chol_kzz(kernel, Z, jitter):
    Kzz = kernel(Z)
    return jnp.linalg.cholesky(Kzz + jitter * jnp.eye(Z.shape[0], dtype=Kzz.dtype))


def _expected_log_lik(likelihood, signs, f_mean, f_var):
    """Σ_n ⟨log p(y_n | f_n)⟩ under N(f_mean, f_var), the labels' ``signs`` (or None) folded in."""
    if signs is not None:
        f_mean = signs * f_mean
    return jnp.sum(likelihood.expected_log_phi(f_mean, safe_sqrt(f_var)))


def _titsias_terms(kernel, X, y, noise_variance, Z, jitter):
    """L, AAᵀ, L_B = chol(I + AAᵀ) and c = σ⁻¹L_B⁻¹Ay, with A = σ⁻¹L⁻¹K_ZX."""
    L = _chol_kzz(kernel, Z, jitter)
    sigma = jnp.sqrt(noise_variance)
    A = solve_triangular(L, kernel(Z, X), lower=True) / sigma
    AAT = A @ A.T
    LB = jnp.linalg.cholesky(jnp.eye(Z.shape[0], dtype=A.dtype) + AAT)
    c = solve_triangular(LB, A @ y, lower=True) / sigma
    return L, AAT, LB, c


def collapsed_elbo(kernel: AbstractKernel, X: ArrayLike, y: ArrayLike, noise_variance: ArrayLike, inducing: ArrayLike,
                   jitter: float = 1e-6) -> jax.Array:
    r"""Titsias' collapsed bound on :math:`\log p(y)` for Gaussian-likelihood regression.

    $$
    \mathcal L_2 = \log \mathcal N(y \mid 0, Q_{XX} + \sigma^2 I)
    - \frac{1}{2\sigma^2} \operatorname{tr}(K_{XX} - Q_{XX}),
    $$

    exact when ``inducing = X`` (up to jitter).
    """
    X, Z, y, noise_variance = _inputs("collapsed_elbo", X, inducing, y, noise_variance)
    _, AAT, LB, c = _titsias_terms(kernel, X, y, noise_variance, Z, jitter)
    log_marginal = (-0.5 * X.shape[0] * (_LOG_2PI + jnp.log(noise_variance))
                    - jnp.sum(jnp.log(jnp.diag(LB)))
                    - 0.5 * jnp.dot(y, y) / noise_variance + 0.5 * jnp.dot(c, c))
    trace = jnp.sum(kernel.diagonal(X)) / noise_variance - jnp.trace(AAT)
    return log_marginal - 0.5 * trace


def optimal_inducing_posterior(kernel: AbstractKernel, X: ArrayLike, y: ArrayLike, noise_variance: ArrayLike,
                               inducing: ArrayLike, jitter: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    r"""The optimal :math:`q(u)` of the collapsed bound: ``(mean_u, cov_u)``, shapes (M,) and (M, M).

    $$
    q(u) = \mathcal N\big(\sigma^{-2} K_{ZZ} \Lambda^{-1} K_{ZX} y,\; K_{ZZ} \Lambda^{-1} K_{ZZ}\big),
    \qquad \Lambda = K_{ZZ} + \sigma^{-2} K_{ZX} K_{XZ}.
    $$
    """
    X, Z, y, noise_variance = _inputs("optimal_inducing_posterior", X, inducing, y, noise_variance)
    L, _, LB, c = _titsias_terms(kernel, X, y, noise_variance, Z, jitter)
    W = solve_triangular(LB, L.T, lower=True).T  # W = L L_B^{-T}
    return W @ c, W @ W.T


def _marginals(kernel, Z, L, mean_u, chol_or_cov, X, is_chol):
    r"""Means and variances of :math:`q(f_n) = \int p(f_n \mid u) q(u)\,du` at the rows of ``X``."""
    cond = conditional(L, kernel(Z, X), kernel.diagonal(X))
    P = cond.weights                                          # K_ZZ^{-1} K_ZX: columns a_n
    mean = P.T @ mean_u
    if is_chol:
        extra = jnp.sum((chol_or_cov.T @ P) ** 2, axis=0)     # a_n^T R R^T a_n
    else:
        extra = jnp.sum(P * (chol_or_cov @ P), axis=0)        # a_n^T S a_n
    return mean, cond.variances + extra


def predict_sparse(kernel: AbstractKernel, inducing: ArrayLike, mean_u: ArrayLike, cov_u: ArrayLike, X_test: ArrayLike,
                   jitter: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    r"""Predictive marginals of the latent function under :math:`q(u) = \mathcal N(\mu, S)`: ``(mean, var)``, each (T,).

    $$
    q(f_*) = \mathcal N\big(K_{*Z} K_{ZZ}^{-1}\mu,\; k_{**} - \operatorname{diag}(K_{*Z} K_{ZZ}^{-1} K_{Z*})
    + \operatorname{diag}(K_{*Z} K_{ZZ}^{-1} S K_{ZZ}^{-1} K_{Z*})\big)
    $$

    (add the noise variance to ``var`` for noisy observations)."""
    X_test, Z, _, _ = _inputs("predict_sparse", X_test, inducing)
    mean_u, cov_u = _q_u("predict_sparse", mean_u, "cov_u", cov_u, Z.shape[0])
    L = _chol_kzz(kernel, Z, jitter)
    return _marginals(kernel, Z, L, mean_u, cov_u, X_test, is_chol=False)


def _svgp_inputs(owner, mean_u, chol_u, kernel, inducing, X, likelihood, num_data, jitter, labels):
    """X, Z, μ, R = tril(chol_u), the labels' signs, L and the minibatch scale num_data / N, checked."""
    X, Z, _, _ = _inputs(owner, X, inducing)
    mean_u, R = _q_u(owner, mean_u, "chol_u", chol_u, Z.shape[0])
    signs = label_signs(likelihood, labels, X.shape[0], owner)
    scale = 1.0 if num_data is None else num_data / X.shape[0]
    return X, Z, mean_u, jnp.tril(R), signs, _chol_kzz(kernel, Z, jitter), scale


def svgp_elbo(mean_u: ArrayLike, chol_u: ArrayLike, kernel: AbstractKernel, inducing: ArrayLike, X: ArrayLike,
              likelihood: AbstractPotential, num_data: int | None = None, jitter: float = 1e-6,
              labels: ArrayLike | None = None) -> jax.Array:
    r"""Uncollapsed SVGP bound (Hensman et al. 2013) for any factorising likelihood.

    $$
    \mathcal L = \frac{N_\text{data}}{N_\text{batch}} \sum_{n \in \text{batch}}
    \big\langle \log p(y_n \mid f_n) \big\rangle_{q(f_n)}
    - \mathrm{KL}\big(\mathcal N(\mu, S) \,\|\, \mathcal N(0, K_{ZZ})\big),
    $$

    with :math:`S = R R^\top` (:math:`R` = ``tril(chol_u)``), :math:`a_n = K_{ZZ}^{-1} k_{Zn}`,
    :math:`q(f_n) = \mathcal N(a_n^\top \mu,\; k_{nn} - a_n^\top K_{ZZ} a_n + a_n^\top S a_n)` and
    :math:`2\,\mathrm{KL} = \|L^{-1} R\|_F^2 + \|L^{-1}\mu\|^2 - M + 2\sum_m \log L_{mm} - 2\sum_m \log |R_{mm}|`.

    ``likelihood``: a potential over the batch (e.g. ``vijax.potentials.Gaussian(loc=y, scale=sigma)``;
    classification likelihoods with the batch's ``labels``); ``num_data`` defaults to the batch size."""
    X, Z, mean_u, R, signs, L, scale = _svgp_inputs("svgp_elbo", mean_u, chol_u, kernel, inducing, X, likelihood,
                                                     num_data, jitter, labels)
    f_mean, f_var = _marginals(kernel, Z, L, mean_u, R, X, is_chol=True)
    expected = _expected_log_lik(likelihood, signs, f_mean, f_var)

    LinvR = solve_triangular(L, R, lower=True)
    Linvm = solve_triangular(L, mean_u, lower=True)
    logdet = lambda T: 2 * jnp.sum(jnp.log(jnp.abs(jnp.diag(T))))
    return scale * expected + neg_kl(jnp.sum(LinvR**2), jnp.dot(Linvm, Linvm), logdet(R), logdet(L), Z.shape[0])


def svgp_natural_step(mean_u, chol_u, kernel, inducing, X, likelihood, num_data=None, learning_rate=1.0,
                      jitter=1e-6, labels=None):
    r"""One natural-gradient step on q(u) for `svgp_elbo` (Hensman et al. 2013; Salimbeni et al. 2018).

    In whitened coordinates v = L⁻¹u, q(v) = N(m̃, S̃); with g_m, g_v the derivatives of the scaled expected
    log-likelihood in each marginal's mean and variance, and ã_n = L⁻¹k_Zn,

    $$
    S̃^{-1} \leftarrow (1-\rho) S̃^{-1} + \rho \big(I - 2 \tilde A \operatorname{diag}(g_v) \tilde A^\top\big),
    \qquad
    S̃^{-1}m̃ \leftarrow (1-\rho) S̃^{-1}m̃ + \rho \big(\tilde A g_m - 2 \tilde A \operatorname{diag}(g_v) \tilde A^\top m̃\big).
    $$

    With ρ = ``learning_rate`` = 1 and a Gaussian likelihood on the full data, one step lands on
    `optimal_inducing_posterior`. Where S̃⁻¹ would turn indefinite (e.g. Student-t), ρ is halved until it is
    positive definite (after 30 halvings q is kept). Returns the new ``(mean_u, chol_u)``, ``chol_u`` lower."""
    X, Z, mean_u, R, signs, L, scale = _svgp_inputs("svgp_natural_step", mean_u, chol_u, kernel, inducing, X,
                                                     likelihood, num_data, jitter, labels)
    eye = jnp.eye(Z.shape[0], dtype=L.dtype)
    cond = conditional(L, kernel(Z, X), kernel.diagonal(X))
    A, prior_var = cond.whitened, cond.variances                       # columns ã_n
    m_w = solve_triangular(L, mean_u, lower=True)
    R_w = solve_triangular(L, R, lower=True)                 # S̃ = R̃ R̃ᵀ
    R_w_inv = solve_triangular(R_w, eye, lower=True)
    precision = R_w_inv.T @ R_w_inv

    f_mean = A.T @ m_w
    f_var = prior_var + jnp.sum((R_w.T @ A) ** 2, axis=0)
    g_m, g_v = (scale * g for g in jax.grad(_expected_log_lik, argnums=(2, 3))(likelihood, signs, f_mean, f_var))
    curvature = -2 * (A * g_v) @ A.T

    def factor(rho):
        return jnp.linalg.cholesky((1 - rho) * precision + rho * (eye + curvature))

    rho, P, proper, _ = backtrack(factor, lambda _, P: jnp.all(jnp.isfinite(P)), jnp.asarray(learning_rate, L.dtype),
                                  _MAX_HALVINGS)
    rho = jnp.where(proper, rho, 0.0)
    P = jnp.where(proper, P, factor(0.0))
    new_shift = (1 - rho) * precision @ m_w + rho * (A @ g_m + curvature @ m_w)
    new_mean = jax.scipy.linalg.cho_solve((P, True), new_shift)
    new_chol = jnp.linalg.cholesky(jax.scipy.linalg.cho_solve((P, True), eye))
    return L @ new_mean, L @ new_chol
