"""The factorisation module (`vijax._factorisation`) against dense NumPy linear algebra."""

import numpy as np
import pytest

from vijax._factorisation import Primal, SiteForm, conditional


def _spd(rng, n, scales=None):
    A = rng.normal(size=(n, n))
    P = A @ A.T + n * np.eye(n)
    if scales is not None:  # covariates in very different units
        P = scales[:, None] * P * scales[None, :]
    return P


@pytest.mark.parametrize("scaled", [False, True], ids=["unit", "scales 1e-3 to 1e3"])
def test_primal_matches_dense_linear_algebra(rng, scaled):
    d = 6
    P = _spd(rng, d, np.logspace(-3, 3, d) if scaled else None)
    v, V = rng.normal(size=d), rng.normal(size=(d, 3))
    fac = Primal.of(P)
    assert bool(fac.proper)
    np.testing.assert_allclose(float(fac.logdet()), np.linalg.slogdet(P)[1], rtol=1e-12)
    S = np.linalg.inv(P)
    np.testing.assert_allclose(fac.solve(v), S @ v, rtol=1e-9, atol=1e-12 * np.abs(S @ v).max())
    np.testing.assert_allclose(fac.solve(V), S @ V, rtol=1e-9, atol=1e-12 * np.abs(S @ V).max())
    np.testing.assert_allclose(np.sum(np.asarray(fac.half_solve(v)) ** 2), v @ S @ v, rtol=1e-10)
    np.testing.assert_allclose(np.sum(np.asarray(fac.half_multiply(v)) ** 2), v @ P @ v, rtol=1e-10)
    C = np.asarray(fac.covariance_factor())
    np.testing.assert_array_equal(C, np.triu(C))
    np.testing.assert_allclose(C.T @ C, S, rtol=1e-9, atol=1e-12 * np.abs(S).max())
    B = np.tril(rng.normal(size=(d, d))) + 3 * np.eye(d)  # a prior's Cholesky factor
    C = np.asarray(fac.covariance_factor(B))
    np.testing.assert_allclose(C.T @ C, B @ S @ B.T, rtol=1e-9, atol=1e-12 * np.abs(B @ S @ B.T).max())


def test_primal_reports_a_singular_matrix(rng):
    X = rng.normal(size=(2, 5))
    assert not bool(Primal.of(X.T @ X).proper)  # rank 2 of 5


def test_site_form_matches_dense_linear_algebra(rng):
    n = 7
    K = _spd(rng, n)
    w = rng.uniform(0.0, 3.0, size=n)
    w[2] = 0.0  # a site without curvature
    u = rng.normal(size=n)
    fac = SiteForm.of(K, w)
    assert bool(fac.proper)
    Sigma = np.linalg.inv(np.linalg.inv(K) + np.diag(w))
    np.testing.assert_allclose(fac.variances(), np.diag(Sigma), rtol=1e-10)
    np.testing.assert_allclose(float(fac.logdet()), np.linalg.slogdet(np.eye(n) + K @ np.diag(w))[1], rtol=1e-12)
    np.testing.assert_allclose(fac.solve(u), Sigma @ u, rtol=1e-9)
    cross = np.asarray(fac.cross())
    np.testing.assert_allclose(K - cross.T @ cross, Sigma, rtol=1e-9, atol=1e-12)
    # (K + W⁻¹)⁻¹ u = W½ (I + W½ K W½)⁻¹ W½ u, finite where a weight is zero
    root = np.sqrt(w)
    expected = root * np.linalg.solve(np.eye(n) + root[:, None] * K * root[None, :], root * u)
    np.testing.assert_allclose(fac.sites_solve(u), expected, rtol=1e-10)


def test_conditional_is_gaussian_conditioning(rng):
    n, t = 5, 3
    joint = _spd(rng, n + t)
    K, cross, Kss = joint[:n, :n], joint[:n, n:], joint[n:, n:]
    cond = conditional(np.linalg.cholesky(K), cross, np.diag(Kss))
    B = np.linalg.solve(K, cross)
    np.testing.assert_allclose(cond.weights, B, rtol=1e-9)
    np.testing.assert_allclose(cond.variances, np.diag(Kss - cross.T @ B), rtol=1e-10)
    # A = L⁻¹K*: Aᵀ f̃ with f̃ = L⁻¹f is the conditional mean Bᵀf
    f = rng.normal(size=n)
    f_white = np.linalg.solve(np.linalg.cholesky(K), f)
    np.testing.assert_allclose(np.asarray(cond.whitened).T @ f_white, B.T @ f, rtol=1e-9)
