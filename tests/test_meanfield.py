"""Free-form mean field (H = I): the coordinate-ascent bound against independent quadrature."""

import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from helpers import gradient_and_difference
from vijax.methods import meanfield

D = 6


def _dense_prior(rng, scale=1.0):
    A = rng.normal(size=(D, D))
    cov = scale * (A @ A.T / D + 0.5 * np.eye(D))
    return vj.GaussianFactor.dense(rng.normal(size=D), cov), cov


def _laplace_model(rng, scale=1.0):
    prior, cov = _dense_prior(rng, scale)
    sites = vj.Sites(vj.Identity(D), vj.potentials.Laplace(loc=rng.normal(size=D), scale=0.3))
    return vj.LatentLinearModel(prior, sites), cov


def _quadrature_bound(post, model, cov):
    """B_MF of the reported factors by brute-force 1-D quadrature of each tilted density."""
    group = model.sites[0]
    loc, scale = np.asarray(group.potential.loc), float(group.potential.scale)
    precision = np.linalg.inv(cov)
    m = np.asarray(post.mean)
    mu = np.asarray(model.prior.mean)
    total = 0.0
    for k in range(D):
        v = 1.0 / precision[k, k]
        c = m[k] - precision[k] @ (m - mu) / precision[k, k]
        x = np.linspace(c - 12 * np.sqrt(v), c + 12 * np.sqrt(v), 400001)
        log_unnorm = -np.abs(x - loc[k]) / scale - np.log(2 * scale) - 0.5 * (x - c) ** 2 / v
        q = np.exp(log_unnorm - log_unnorm.max())
        q /= np.trapezoid(q, x)
        log_q = np.log(np.maximum(q, 1e-300))
        log_phi = -np.abs(x - loc[k]) / scale - np.log(2 * scale)
        total += np.trapezoid(q * (log_phi - log_q), x)  # ⟨log φ⟩ + H[q]
        np.testing.assert_allclose(np.trapezoid(q * x, x), m[k], atol=1e-6)
        np.testing.assert_allclose(np.trapezoid(q * (x - m[k]) ** 2, x), np.asarray(post.covariance)[k, k], rtol=1e-5)
    s = np.diag(np.asarray(post.covariance))
    _, logdet = np.linalg.slogdet(2 * np.pi * cov)
    total += -0.5 * (logdet + (m - mu) @ precision @ (m - mu) + s @ np.diag(precision))
    return total


def test_free_form_bound_matches_quadrature_and_beats_gaussian_factors(rng):
    model, cov = _laplace_model(rng)
    post = vj.infer(model, vj.MeanField())
    assert post.diagnostics.solver == "coordinate_ascent" and bool(post.diagnostics.converged)
    assert post.is_lower_bound
    np.testing.assert_allclose(post.log_z, _quadrature_bound(post, model, cov), atol=1e-6)
    gaussian = vj.infer(model, vj.MeanField(free_form=False, solver=vj.solvers.NewtonCG(tol=1e-9)))
    assert gaussian.diagnostics.solver == "NewtonCG"
    assert float(post.log_z) > float(gaussian.log_z) + 1e-3  # Laplace sites: non-Gaussian factors do better
    trace = np.asarray(post.diagnostics.objective_trace)
    trace = trace[np.isfinite(trace)]
    assert np.all(np.diff(trace) >= -1e-10), "coordinate ascent never lowers the bound"


def test_free_form_equals_gaussian_mean_field_for_gaussian_sites(rng):
    prior, cov = _dense_prior(rng)
    y = rng.normal(size=D)
    model = vj.LatentLinearModel(prior, vj.Sites(vj.Identity(D), vj.potentials.Gaussian(loc=y, scale=0.7)))
    post = vj.infer(model, vj.MeanField())
    ref = vj.infer(model, vj.GKL(covariance=vj.covariance.Diagonal(), solver=vj.solvers.NewtonCG(tol=1e-10)))
    precision = np.linalg.inv(cov) + np.eye(D) / 0.49
    exact_mean = np.linalg.solve(precision, np.linalg.solve(cov, np.asarray(prior.mean)) + y / 0.49)
    np.testing.assert_allclose(post.mean, exact_mean, atol=1e-8)
    np.testing.assert_allclose(np.diag(post.covariance), 1 / np.diag(precision), atol=1e-10)
    np.testing.assert_allclose(post.log_z, ref.log_z, atol=1e-8)


def test_free_form_evidence_gradient_matches_finite_differences(rng):
    seed = int(rng.integers(1 << 30))

    def log_z(log_scale):
        model, _ = _laplace_model(np.random.default_rng(seed), jnp.exp(log_scale))
        return vj.infer(model, vj.MeanField()).log_z

    eps = 1e-4
    grad, difference = gradient_and_difference(log_z, 0.2, eps)
    np.testing.assert_allclose(grad, difference / eps, rtol=1e-5)


def test_models_without_the_free_form_structure_use_gaussian_factors(rng):
    X = rng.normal(size=(30, D))
    y = (X @ rng.normal(size=D) > 0).astype(float)
    model = vj.glm.logistic_regression(X, y)
    assert not meanfield.free_form_applies(model)
    post = vj.infer(model, vj.MeanField())
    assert post.diagnostics.method == "MeanField" and post.diagnostics.solver == "NewtonCG"
    with pytest.raises(ValueError, match="init"):
        vj.infer(_laplace_model(rng)[0], vj.MeanField(), init="start")
