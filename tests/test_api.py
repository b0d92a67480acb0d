"""The public API conventions (issue 23): the GP model records what prediction needs, scalar
``log_z`` with shared diagnostics, ``max_iter``, explicit Monte Carlo keys, public namespaces,
clear errors for silent input mistakes, readable kernels."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from helpers import gradient_and_difference

K_ = vj.gp.kernels
P = vj.potentials


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(3)
    X = rng.uniform(-3, 3, size=(15, 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=15)
    return X, y


@pytest.fixture(scope="module")
def gp_fit(regression):
    X, y = regression
    kernel = K_.SquaredExponential(jnp.array([1.1, 2.0]), 0.8)
    post = vj.infer(vj.gp.model(kernel, X, P.Gaussian(loc=y, scale=0.2), jitter=1e-8), vj.GKL())
    return kernel, post


# ----------------------------------------------------------------------------------------------
# The GP model records kernel, X, mean and jitter


def test_gp_model_records_what_prediction_needs(regression):
    X, y = regression
    kernel = K_.Matern32(0.9, 1.3)
    model = vj.gp.model(kernel, X, P.StudentT(df=3.0, loc=y, scale=0.1), mean=0.5, jitter=1e-5)
    assert isinstance(model, vj.gp.GPModel) and isinstance(model, vj.LatentLinearModel)
    assert model.kernel is kernel
    np.testing.assert_array_equal(model.X, X)
    assert float(model.mean) == 0.5 and float(model.jitter) == 1e-5


def test_predict_equals_the_exact_gp(regression, gp_fit):
    X, y = regression
    kernel, post = gp_fit
    X_test = np.random.default_rng(1).uniform(-3, 3, size=(6, 2))
    mean, var = vj.gp.predict(post, X_test)
    # The exact GP posterior: K_*ᵀ (K + s²I)⁻¹ y and k_** − K_*ᵀ (K + s²I)⁻¹ K_*.
    K, Ks = np.asarray(kernel(X)) + 1e-8 * np.eye(15), np.asarray(kernel(X, X_test))
    A = K + 0.04 * np.eye(15)
    np.testing.assert_allclose(mean, Ks.T @ np.linalg.solve(A, y), atol=1e-6)
    np.testing.assert_allclose(var, 0.8 - np.sum(Ks * np.linalg.solve(A, Ks), 0), atol=1e-6)
    lp = vj.gp.log_predictive(post, X_test, mean)
    np.testing.assert_allclose(lp, -0.5 * np.log(2 * np.pi * (var + 0.04)), rtol=1e-10)


def test_gp_classification_predict_proba(regression):
    X, y = regression
    labels = (y > 0).astype(int)
    kernel = K_.SquaredExponential(1.0, 1.5)
    post = vj.infer(vj.gp.model(kernel, X, P.Probit(), labels=labels), vj.EP())
    p = vj.gp.predict_proba(post, X[:5])
    m, v = vj.gp.predict(post, X[:5])
    from scipy import stats
    np.testing.assert_allclose(p, stats.norm.cdf(m / np.sqrt(1 + v)), rtol=1e-6)


def test_model_transformations_keep_what_gp_prediction_needs(regression, gp_fit):
    """`shard_sites` and `piecewise.bound_logistic_sites` return a model of the type given, so
    prediction still takes (post, X_test)."""
    X, y = regression
    kernel, post = gp_fit
    sharded = vj.shard_sites(post.model, jax.make_mesh((1,), ("sites",)))
    logistic = vj.gp.model(kernel, X, P.Logistic(), labels=(y > 0).astype(int))
    bounded = vj.piecewise.bound_logistic_sites(logistic, "quadratic", 10)
    for m, original in ((sharded, post.model), (bounded, logistic)):
        assert isinstance(m, vj.gp.GPModel)
        for a, b in zip(jax.tree.leaves((m.X, m.kernel)), jax.tree.leaves((original.X, original.kernel))):
            np.testing.assert_array_equal(a, b)
    refit = vj.infer(sharded, vj.GKL())
    np.testing.assert_allclose(refit.log_z, post.log_z, rtol=1e-9)
    for a, b in zip(vj.gp.predict(refit, X[:4]), vj.gp.predict(post, X[:4])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)

def test_gp_model_jit_vmap_grad(regression, gp_fit):
    X, y = regression
    kernel, post = gp_fit
    jitted = jax.jit(vj.gp.predict)(post, X[:4])
    np.testing.assert_allclose(jitted[0], vj.gp.predict(post, X[:4])[0], rtol=1e-12)

    def log_z(log_variance):
        k = eqx_set(kernel, log_variance)
        return vj.infer(vj.gp.model(k, X, P.Gaussian(loc=y, scale=0.2), jitter=1e-8), vj.GKL()).log_z

    h = 1e-5
    g, difference = gradient_and_difference(log_z, kernel.log_variance, h)
    np.testing.assert_allclose(g, difference / h, rtol=1e-5)
    # A batch of models (one per noise scale) fitted in one vmapped call, each carrying its kernel.
    models = jax.vmap(lambda s: vj.gp.model(kernel, X, P.Gaussian(loc=y, scale=s), jitter=1e-8))(jnp.array([0.2, 0.4]))
    assert isinstance(models, vj.gp.GPModel)
    z = jax.vmap(lambda m: vj.infer(m, vj.GKL()).log_z)(models)
    np.testing.assert_allclose(z[0], post.log_z, rtol=1e-8)


def eqx_set(kernel, log_variance):
    import equinox as eqx
    return eqx.tree_at(lambda k: k.log_variance, kernel, log_variance)


def test_fit_hyperparameters_returns_the_fitted_kernel_scalar_log_z_and_diagnostics(regression):
    X, y = regression
    kernel = K_.SquaredExponential(1.0, 1.0)
    fit = vj.gp.fit_hyperparameters(kernel, X, P.Gaussian(loc=y, scale=0.3), vj.GKL(), jitter=1e-8, max_iter=40)
    d = fit.diagnostics
    assert isinstance(d, vj.Diagnostics)
    assert np.ndim(fit.log_z) == 0 and float(fit.log_z) == float(fit.posterior.log_z)
    trace = np.asarray(d.objective_trace)
    assert trace[-1] == float(fit.log_z) and trace[-1] > trace[0] + 1
    assert fit.converged == bool(d.converged) and int(d.iterations) == len(trace) - 1
    # The posterior's model is built with the fitted kernel, so prediction uses it.
    assert isinstance(fit.posterior.model, vj.gp.GPModel)
    np.testing.assert_array_equal(fit.posterior.model.kernel.log_lengthscale, fit.kernel.log_lengthscale)
    assert float(fit.kernel.lengthscale) != 1.0
    exact = vj.infer(vj.gp.model(fit.kernel, X, P.Gaussian(loc=y, scale=fit.likelihood.scale), jitter=1e-8), vj.GKL())
    np.testing.assert_allclose(vj.gp.predict(fit.posterior, X[:3])[0], vj.gp.predict(exact, X[:3])[0], atol=1e-8)


# ----------------------------------------------------------------------------------------------
# Kernels print their parameters


def test_kernel_repr_shows_values():
    k = K_.SquaredExponential(lengthscale=jnp.array([0.5, 2.0]), variance=3.0)
    assert repr(k) == "SquaredExponential(lengthscale=[0.5, 2. ], variance=3.0)"
    assert repr(K_.Periodic(0.25, 2.0, 1.5)) == "Periodic(lengthscale=0.25, period=2.0, variance=1.5)"
    assert repr(K_.Matern12(1.0) + K_.White(0.1)) == "(Matern12(lengthscale=1.0, variance=1.0) + White(variance=0.1))"
    assert "log_" not in repr(K_.Linear(2.0) * K_.Matern52(0.3))


# ----------------------------------------------------------------------------------------------
# Silent input mistakes raise


def test_regression_likelihood_without_observations_raises(regression):
    X, y = regression
    for lik in (P.StudentT(df=3.0, scale=0.1), P.Gaussian(scale=0.2), P.Laplace(), P.Cauchy(loc=1.0)):
        with pytest.raises(ValueError, match="loc=y"):
            vj.gp.model(K_.Matern32(), X, lik)
        with pytest.raises(ValueError, match="scalar `loc`"):
            vj.gp.fit_hyperparameters(K_.Matern32(), X, lik, vj.Laplace(), max_iter=1)
    assert isinstance(vj.gp.model(K_.Matern32(), X, P.StudentT(df=3.0, loc=y, scale=0.1)), vj.gp.GPModel)


def test_string_labels_raise_a_vijax_error(regression):
    X, _ = regression
    labels = np.array(["a", "b"] * 7 + ["a"])
    for builder in (vj.glm.logistic_regression, vj.glm.probit_regression):
        with pytest.raises(ValueError, match="`y` must be numeric"):
            builder(X, labels)
    with pytest.raises(ValueError, match="`labels` must be numeric"):
        vj.gp.model(K_.Matern32(), X, P.Logistic(), labels=labels)
    with pytest.raises(ValueError, match="`counts` must be numeric"):
        vj.glm.poisson_regression(X, labels)


# ----------------------------------------------------------------------------------------------
# Public namespaces list only public names


@pytest.mark.parametrize("namespace", [vj.glm, vj.gp, vj.gp.kernels, vj.factor])
def test_namespaces_list_only_public_names(namespace):
    names = dir(namespace)
    assert sorted(names) == sorted(namespace.__all__)
    for private in ("np", "jnp", "eqx", "jax", "annotations"):
        assert private not in names
    for name in names:
        assert hasattr(namespace, name), name


# ----------------------------------------------------------------------------------------------
# Factor models and softmax GPs: scalar log_z, diagnostics, max_iter, explicit keys


@pytest.fixture(scope="module")
def factor_fit():
    rng = np.random.default_rng(0)
    n = 30
    Y = np.concatenate([(rng.uniform(size=(n, 2)) < 0.5).astype(float), rng.integers(0, 3, size=(n, 1)).astype(float)], 1)
    model = vj.factor.factor_analysis([((0, 1), vj.factor.Bernoulli("jaakkola")), (2, vj.factor.Multinomial(3, "log"))],
                                      1, jax.random.PRNGKey(0))
    with pytest.warns(vj.ConvergenceWarning, match="EM .* stopped after 4 iterations"):  # never silent
        post = vj.infer(vj.factor.observe(model, Y), vj.factor.EM(max_iter=4, e_step_max_iter=50))
    return model, Y, post


def test_factor_fit_scalar_log_z_and_diagnostics(factor_fit):
    model, Y, fit = factor_fit
    d = fit.diagnostics
    assert isinstance(d, vj.Diagnostics) and d.method == "EM"
    trace = np.asarray(d.objective_trace)
    assert trace.shape == (5,) and np.isnan(trace[0])  # entry 0: the bound the fit started from (none: cold)
    assert np.ndim(fit.log_z) == 0 and float(fit.log_z) == trace[-1] and int(d.iterations) == 4
    assert np.all(np.diff(trace[1:]) > 0) and not bool(d.converged)
    # The final bound is the E-step's bound of the returned posteriors under the model fitted before it.
    assert np.isclose(float(jnp.sum(fit.posteriors.bound)), trace[-1], rtol=1e-12)
    np.testing.assert_allclose(float(d.stationarity), abs(trace[-1] - trace[-2]) / (1 + abs(trace[-1])), rtol=1e-12)


def test_factor_monte_carlo_takes_a_key_and_returns_jax_arrays(factor_fit):
    model, Y, fit = factor_fit
    key = jax.random.PRNGKey(5)
    probs = vj.factor.probabilities(fit, 1, key=key, num_samples=500)
    assert isinstance(probs, jax.Array) and probs.shape == (30, 1, 3)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(probs, vj.factor.probabilities(fit, block=1, key=key, num_samples=500))
    assert not np.array_equal(probs, vj.factor.probabilities(fit, 1, key=jax.random.PRNGKey(6), num_samples=500))
    lp = vj.factor.log_predictive(fit, Y, key=key, num_samples=500)
    assert isinstance(lp, jax.Array) and np.all(np.asarray(lp) < 0)
    with pytest.raises(ValueError, match="FactorPosterior"):
        vj.factor.log_predictive(fit.posteriors, Y)
    filled = vj.factor.impute(fit, Y, np.ones_like(Y, bool), key=key)
    assert isinstance(filled, jax.Array)
    np.testing.assert_array_equal(filled, Y)
    with pytest.raises(ValueError, match="pass `key="):
        vj.factor.probabilities(fit, 1, num_samples=500)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Bernoulli block is integrated by quadrature: no key needed
        vj.factor.probabilities(fit, 0)


