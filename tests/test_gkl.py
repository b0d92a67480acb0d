"""G-KL: a singular Gaussian factor, solvers, gradients, concavity, whitening, marginals and samples.

Exactness on conjugate models, jit/vmap/grad, warm starts and evidence gradients are checked for
every method in test_methods.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import vijax as vj
from vijax.methods.gkl import GaussianParams

from helpers import gaussian_posterior, spd

TIGHT = vj.solvers.NewtonCG(tol=1e-10, max_iter=200)


# ------------------------------------------------------------------------------------------ exactness


def test_linear_gaussian_factor_with_singular_precision(rng):
    """A Gaussian likelihood N(y | M w, ν²I) with fewer rows than D, plus Gaussian sites on w (a prior)."""
    d, k = 5, 3
    M = rng.normal(size=(k, d))
    y = rng.normal(size=k)
    lik = vj.GaussianFactor.linear_gaussian(M, y, noise_variance=0.3)
    assert np.linalg.matrix_rank(np.asarray(lik.precision_matrix())) == k
    prior_sites = vj.Sites(vj.Identity(d), vj.potentials.Gaussian(loc=0.0, scale=1.5))
    post = vj.infer(vj.LatentLinearModel(lik, prior_sites), vj.GKL(solver=TIGHT))
    mean, S, log_z = gaussian_posterior(np.zeros(d), 2.25 * np.eye(d), M, y, 0.3)
    np.testing.assert_allclose(post.log_z, log_z, atol=1e-8)
    np.testing.assert_allclose(post.mean, mean, atol=1e-8)
    np.testing.assert_allclose(post.covariance, S, atol=1e-8)


@pytest.mark.parametrize("solver", [vj.solvers.NewtonCG(tol=1e-8), vj.solvers.Newton(tol=1e-8),
                                    vj.solvers.LBFGS(tol=1e-7, max_iter=3000)])
def test_solvers_reach_the_same_optimum(rng, solver):
    X = rng.normal(size=(80, 5))
    y = (X @ rng.normal(size=5) + rng.normal(size=80) > 0).astype(float)
    model = vj.glm.logistic_regression(X, y)
    ref = vj.infer(model, vj.GKL(solver=vj.solvers.Newton(tol=1e-10)))
    post = vj.infer(model, vj.GKL(solver=solver))
    assert bool(post.diagnostics.converged)
    np.testing.assert_allclose(post.log_z, ref.log_z, atol=1e-7)
    np.testing.assert_allclose(post.mean, ref.mean, atol=1e-5)
    trace = np.asarray(post.diagnostics.objective_trace)
    trace = trace[np.isfinite(trace)]
    assert np.all(np.diff(trace) >= -1e-9), "the bound must increase monotonically"


def test_newton_cg_converges_quadratically(rng):
    X = rng.normal(size=(200, 10))
    y = (X @ rng.normal(size=10) > 0).astype(float)
    post = vj.infer(vj.glm.logistic_regression(X, y), vj.GKL(solver=vj.solvers.NewtonCG(tol=1e-8)))
    assert bool(post.diagnostics.converged)
    assert int(post.diagnostics.iterations) <= 15
    assert int(post.diagnostics.num_hvp_evals) <= 80


# ------------------------------------------------------------------------------------------ gradients


def _random_params(rng, family, d):
    mean = jnp.asarray(rng.normal(size=d))
    if isinstance(family, vj.covariance.Full):
        C = np.triu(0.3 * rng.normal(size=(d, d)))
        C[np.diag_indices(d)] = rng.uniform(0.3, 1.2, size=d)
        return GaussianParams(mean, family.from_dense(C.T @ C))
    return GaussianParams(mean, family.init(d, rng.uniform(0.3, 1.2, size=d)))


POTENTIAL_MODELS = {
    "logistic": lambda X, y: vj.potentials.Logistic(),
    "probit": lambda X, y: vj.potentials.Probit(),
    "student_t": lambda X, y: vj.potentials.StudentT(df=3.0, loc=y, scale=0.5),
    "laplace": lambda X, y: vj.potentials.Laplace(loc=y, scale=0.5),
    "poisson": lambda X, y: vj.potentials.Poisson(np.round(np.abs(y) * 2)),
    "heaviside": lambda X, y: vj.potentials.Heaviside(0.1),
    "cauchy": lambda X, y: vj.potentials.Cauchy(loc=y, scale=0.5),
}


@pytest.mark.parametrize("family", [vj.covariance.Full(), vj.covariance.Diagonal()], ids=["full", "diagonal"])
@pytest.mark.parametrize("name", sorted(POTENTIAL_MODELS))
def test_bound_gradient_matches_finite_differences(rng, family, name):
    X = 0.5 * rng.normal(size=(25, 4))
    y = rng.normal(size=25)
    prior = vj.GaussianFactor.dense(np.zeros(4), spd(rng, 4))
    model = vj.LatentLinearModel(prior, vj.Sites(X, POTENTIAL_MODELS[name](X, y)))
    params = _random_params(rng, family, 4)
    x0, unravel = ravel_pytree(params)
    f = jax.jit(lambda x: vj.gkl.bound(unravel(x), model))
    g = jax.grad(f)(x0)
    eps = 1e-6
    for i in range(x0.shape[0]):
        e = jnp.zeros_like(x0).at[i].set(eps)
        fd = (f(x0 + e) - f(x0 - e)) / (2 * eps)
        np.testing.assert_allclose(g[i], fd, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["logistic", "probit", "laplace", "poisson"])
def test_bound_is_concave_for_log_concave_sites(rng, name):
    """Thesis theorem 4.2.2: the Hessian in (m, C) is negative semi-definite at any point."""
    X = 0.7 * rng.normal(size=(30, 4))
    y = rng.normal(size=30)
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(4, 1.5), vj.Sites(X, POTENTIAL_MODELS[name](X, y)))
    for _ in range(3):
        params = _random_params(rng, vj.covariance.Full(), 4)
        x0, unravel = ravel_pytree(params)
        H = jax.jit(jax.hessian(lambda x: vj.gkl.bound(unravel(x), model)))(x0)
        eig = np.linalg.eigvalsh(np.asarray(H))
        assert eig.max() <= 1e-8 * max(1.0, np.abs(eig).max()), eig.max()


@pytest.mark.slow
def test_student_t_bound_is_not_concave(rng):
    """Student-t sites are not log-concave: some point has a positive curvature direction."""
    X = np.eye(2)
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(2, 100.0),
                                 vj.Sites(X, vj.potentials.StudentT(df=1.0, loc=np.array([4.0, -4.0]), scale=0.1)))
    params = GaussianParams(jnp.zeros(2), vj.covariance.Full().init(2, 0.05))
    x0, unravel = ravel_pytree(params)
    H = jax.hessian(lambda x: vj.gkl.bound(unravel(x), model))(x0)
    assert np.linalg.eigvalsh(np.asarray(H)).max() > 0


def test_univariate_reduction_by_monte_carlo(rng):
    """⟨log φ(hᵀw)⟩ under N(m, S) equals the 1-D expectation used by the bound (thesis C4)."""
    X = rng.normal(size=(5, 3))
    model = vj.LatentLinearModel(None, vj.Sites(X, vj.potentials.Logistic()))
    params = _random_params(rng, vj.covariance.Full(), 3)
    post = vj.Posterior(params.mean, params.factor, jnp.nan, None, model, bound_claim=False)
    w = post.sample(jax.random.key(0), 400_000)
    mc = np.mean(np.sum(np.asarray(jax.nn.log_sigmoid(w @ X.T)), axis=1))
    entropy = 0.5 * (3 * (1 + np.log(2 * np.pi)) + np.linalg.slogdet(np.asarray(post.covariance))[1])
    np.testing.assert_allclose(float(vj.gkl.bound(params, model)) - entropy, mc, atol=0.01)


@pytest.mark.slow
def test_whitening_leaves_the_bound_unchanged(rng):
    """Appendix B.5: the change of basis is exact, so whitened and plain fits agree on a non-conjugate model."""
    X = rng.normal(size=(40, 4))
    y = (rng.random(40) < 0.5).astype(float)
    cov = spd(rng, 4)
    model = vj.LatentLinearModel(vj.GaussianFactor.dense(np.ones(4), cov),
                                 vj.Sites(vj.glm.signed_labels(y)[:, None] * X, vj.potentials.Logistic()))
    a = vj.infer(model, vj.GKL(solver=TIGHT, whiten=True))
    b = vj.infer(model, vj.GKL(solver=TIGHT, whiten=False))
    np.testing.assert_allclose(a.log_z, b.log_z, atol=1e-9)
    np.testing.assert_allclose(a.covariance, b.covariance, atol=1e-7)


def test_posterior_marginals_and_samples(rng):
    X = rng.normal(size=(40, 3))
    y = (rng.random(40) < 0.5).astype(float)
    post = vj.infer(vj.glm.logistic_regression(X, y), vj.GKL())
    Xt = rng.normal(size=(7, 3))
    mean, var = post.marginals(Xt)
    np.testing.assert_allclose(mean, Xt @ post.mean, rtol=1e-12)
    np.testing.assert_allclose(var, np.einsum("nd,de,ne->n", Xt, post.covariance, Xt), rtol=1e-10)
    w = post.sample(jax.random.key(1), 200_000)
    np.testing.assert_allclose(np.cov(np.asarray(w).T), post.covariance, atol=0.01)
    assert np.all(np.linalg.eigvalsh(np.asarray(post.covariance)) > 0)
    assert np.all(np.diag(np.asarray(post.factor.cholesky())) > 0)
