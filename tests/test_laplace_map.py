"""Laplace and MAP: NumPy/SciPy oracles, the Cholesky factor, fallback curvature, bad starts, the default solver.

Exactness on conjugate models, jit/vmap/grad, warm starts and evidence gradients are checked for
every method in test_methods.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from scipy.special import expit, log_expit

import vijax as vj

from helpers import logistic_data as _classification_data, regression_data as _regression_data
from registry import MODELS

TIGHT = vj.solvers.NewtonCG(tol=1e-10, max_iter=200)


def _numpy_neg_log_joint(X, y, v):
    """−ℓ(w) for logistic regression with prior N(0, v I), its gradient and Hessian, in NumPy."""
    Z = np.where(y > 0, 1.0, -1.0)[:, None] * X
    d = X.shape[1]

    def f(w):
        return 0.5 * w @ w / v + 0.5 * d * np.log(2 * np.pi * v) - np.sum(log_expit(Z @ w))

    def grad(w):
        return w / v - Z.T @ expit(-(Z @ w))

    def hess(w):
        s = expit(Z @ w)
        return np.eye(d) / v + Z.T @ ((s * (1 - s))[:, None] * Z)

    return f, grad, hess


# ------------------------------------------------------------------------------------------ exactness


def test_conjugate_fit_has_an_upper_cholesky_factor_and_exact_curvature():
    """On a Gaussian target (exact: test_methods.py) the Laplace factor is an upper-triangular Cholesky
    factor of the covariance, and no fallback curvature is used."""
    model, (_, S, _) = MODELS["conjugate_dense_sparse"].build()
    post = vj.infer(model, vj.Laplace(solver=TIGHT))
    assert not post.is_lower_bound and not bool(post.diagnostics.info.fallback)
    assert isinstance(post.factor, vj.covariance.CholeskyFactor)
    C = np.asarray(post.factor.cholesky())
    np.testing.assert_array_equal(C, np.triu(C))
    np.testing.assert_allclose(C.T @ C, S, atol=1e-8)


# ------------------------------------------------------------------------------------------ logistic regression


def test_map_mode_matches_scipy(rng):
    X, y = _classification_data(rng)
    model = vj.glm.logistic_regression(X, y, prior_variance=2.0)
    post = vj.infer(model, vj.MAP(solver=TIGHT))
    assert bool(post.diagnostics.converged)
    assert np.max(np.abs(jax.grad(vj.laplace.log_joint)(post.mean, model))) < 1e-9

    f, grad, hess = _numpy_neg_log_joint(X, y, 2.0)
    ref = scipy.optimize.minimize(f, np.zeros(X.shape[1]), jac=grad, hess=hess, method="trust-exact",
                                  options={"gtol": 1e-12})
    np.testing.assert_allclose(post.mean, ref.x, atol=1e-6)
    np.testing.assert_allclose(post.log_z, -f(ref.x), atol=1e-9)
    # predictive functions work on the MAP posterior (its covariance is the Laplace one)
    p = vj.glm.predict_proba(post, X[:5])
    assert p.shape == (5,) and np.all((p > 0) & (p < 1))


def test_laplace_evidence_matches_numpy(rng):
    X, y = _classification_data(rng)
    model = vj.glm.logistic_regression(X, y, prior_variance=2.0)
    post = vj.infer(model, vj.Laplace())
    w = np.asarray(post.mean)
    f, _, hess = _numpy_neg_log_joint(X, y, 2.0)
    _, logdet = np.linalg.slogdet(hess(w))
    expected = -f(w) + 0.5 * X.shape[1] * np.log(2 * np.pi) - 0.5 * logdet
    np.testing.assert_allclose(post.log_z, expected, rtol=1e-12)
    np.testing.assert_allclose(post.covariance, np.linalg.inv(hess(w)), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(vj.laplace.evidence(post.mean, model), post.log_z, rtol=1e-12)
    # the MAP and Laplace modes and covariances agree
    map_post = vj.infer(model, vj.MAP())
    np.testing.assert_allclose(map_post.mean, post.mean, rtol=1e-12)
    np.testing.assert_allclose(map_post.covariance, post.covariance, rtol=1e-12)


# ------------------------------------------------------------------------------------------ non-log-concave sites


def test_student_t_outlier_uses_exact_hessian(rng):
    X, y = _regression_data(rng, n=20, d=3, noise=0.3)
    y[0] += 8.0  # an outlier: its site curvature is negative at the mode
    model = vj.glm.robust_regression(X, y, likelihood="student_t", scale=0.3, df=3.0)
    post = vj.infer(model, vj.Laplace(solver=TIGHT))
    (omega,) = vj.laplace.site_curvatures(post.mean, model)
    assert float(omega[0]) < 0
    assert not bool(post.diagnostics.info.fallback)
    A = -np.asarray(jax.hessian(model.log_joint)(post.mean))
    np.testing.assert_allclose(post.covariance, np.linalg.inv(A), rtol=1e-9)
    np.testing.assert_allclose(post.log_z, model.log_joint(post.mean) + 1.5 * np.log(2 * np.pi)
                               - 0.5 * np.linalg.slogdet(A)[1], rtol=1e-12)


@pytest.mark.parametrize("with_prior", [True, False])
def test_indefinite_hessian_falls_back_to_gauss_newton(with_prior):
    # Two outliers either side of w = 0: a stationary point of ℓ (a minimum between two modes)
    # where −∇²ℓ is negative; the solver starts and stops there.
    X = np.ones((2, 1))
    potential = vj.potentials.StudentT(df=3.0, loc=np.array([-5.0, 5.0]), scale=0.5)
    prior = vj.GaussianFactor.isotropic(1, 100.0) if with_prior else None
    model = vj.LatentLinearModel(prior, vj.Sites(X, potential))
    assert float(vj.laplace.negative_hessian(jnp.zeros(1), model)[0, 0]) < 0
    for method in (vj.Laplace(), vj.MAP()):
        post = vj.infer(model, method, init=jnp.zeros(1))
        assert bool(post.diagnostics.info.fallback)
        assert np.isfinite(post.log_z) and np.all(np.isfinite(post.covariance))
        assert float(post.covariance[0, 0]) > 0
    if with_prior:  # Gauss–Newton curvature: only the prior's (both site curvatures clip to 0)
        assert float(post.diagnostics.info.jitter) == 0.0
        np.testing.assert_allclose(post.covariance, [[100.0]], rtol=1e-12)
    else:  # Gauss–Newton curvature is zero: a jitter makes it invertible, and is reported
        assert float(post.diagnostics.info.jitter) > 0
    # the fit from the default start finds a mode, where no fallback is needed
    if with_prior:
        assert not bool(vj.infer(model, vj.Laplace(), init=jnp.array([1.0])).diagnostics.info.fallback)


# ------------------------------------------------------------------------------------------ inputs


def test_bad_init_raises(rng):
    X, y = _classification_data(rng, n=30)
    model = vj.glm.logistic_regression(X, y)
    for bad in ("zeros", jnp.zeros(4), jnp.zeros((3, 1)), jnp.array([0.0, np.nan, 0.0]), vj.GKL()):
        for method in (vj.Laplace(), vj.MAP()):
            with pytest.raises(ValueError, match="`init`"):
                vj.infer(model, method, init=bad)


def test_laplace_on_gp_classification_matches_scikit_learn(rng):
    """A GP classifier with a fixed kernel is a latent linear model with H = diag(y) and prior N(0, K)."""
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X = rng.normal(size=(40, 2))
    labels = (X[:, 0] * X[:, 1] + 0.3 * rng.normal(size=40) > 0).astype(int)
    kernel = ConstantKernel(2.0, "fixed") * RBF(0.8, "fixed")
    reference = GaussianProcessClassifier(kernel=kernel, optimizer=None, max_iter_predict=500).fit(X, labels)
    K = kernel(X) + 1e-10 * np.eye(40)
    y = 2.0 * labels - 1.0
    model = vj.LatentLinearModel(vj.GaussianFactor.dense(np.zeros(40), K),
                                 vj.Sites(np.diag(y), vj.potentials.Logistic()))
    post = vj.infer(model, vj.Laplace(solver=vj.solvers.NewtonCG(tol=1e-10, max_iter=200)))
    assert bool(post.diagnostics.converged) and not bool(post.diagnostics.info.fallback)
    np.testing.assert_allclose(post.log_z, reference.log_marginal_likelihood_value_, rtol=0, atol=1e-6)


def test_default_mode_solver_is_gauss_newton_exactly_where_its_steps_are_newtons(rng):
    from vijax.methods.laplace import mode_solver

    X, y = _classification_data(rng)
    logistic = vj.glm.logistic_regression(X, y, prior_variance=2.0)
    robust = vj.LatentLinearModel(vj.GaussianFactor.isotropic(3, 1.0), vj.Sites(X, vj.potentials.StudentT(3.0, y, 0.5)))
    assert isinstance(mode_solver(logistic), vj.solvers.GaussNewton)  # log-concave: Gauss–Newton = −∇²ℓ
    assert isinstance(mode_solver(robust), vj.solvers.NewtonCG)  # Student-t: ω_n < 0 where |r_n| is large
    mine = vj.solvers.LBFGS()
    assert mode_solver(logistic, mine) is mine
    for method in (vj.Laplace(), vj.MAP()):
        assert vj.infer(logistic, method).diagnostics.solver == "GaussNewton"
