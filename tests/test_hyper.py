"""Hyperparameters integrated (`vj.hyper`): the marginal likelihood as a function, CCD and grid rules, NUTS, and the
predictive mixed over θ.

One small GP classification (N = 50, an isotropic squared-exponential kernel, θ = (log lengthscale, log variance)
under a N(0, I) prior, Laplace inside) is shared by the tests, and checked against a brute-force grid over θ (61 × 61
fits, one vmapped program) computed here; a conjugate model whose log p(y | θ) is exactly quadratic in θ checks the
rules' formulas against closed forms.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import vijax as vj
from helpers import gradient_and_difference, programs

N = 50
METHOD = vj.Laplace()


def _data():
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, size=(N, 2))
    g = np.sin(2 * X[:, 0]) + 0.8 * X[:, 1] ** 2 - 1
    y = (g + 0.4 * rng.normal(size=N) > 0).astype(float)
    return jnp.asarray(X), jnp.asarray(y)


X, Y = _data()
X_TEST = jnp.asarray(np.random.default_rng(4).uniform(-2, 2, size=(7, 2)))
Y_TEST = jnp.asarray([0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])


def build(theta):
    kernel = vj.gp.kernels.SquaredExponential(lengthscale=jnp.exp(theta[0]), variance=jnp.exp(theta[1]))
    return vj.gp.model(kernel, X, vj.potentials.Logistic(), labels=Y)


def log_prior(theta):
    return jnp.sum(stats.norm.logpdf(0.0) - 0.5 * theta**2)


THETA0 = jnp.zeros(2)


@eqx.filter_jit
def _reference_log_densities(thetas):
    return jax.vmap(lambda th: vj.infer(build(th), METHOD).log_z + log_prior(th))(thetas)


@pytest.fixture(scope="module")
def reference():
    """The posterior mean and sd of θ and log ∫ p̂(y | θ) p(θ) dθ by the midpoint rule on a 61 × 61 grid over a box
    that holds the posterior (the density at its edges is below e⁻¹⁰ of its peak)."""
    a, b = np.linspace(-4.5, 3.0, 61), np.linspace(-3.5, 6.0, 61)
    thetas = np.stack(np.meshgrid(a, b, indexing="ij"), -1).reshape(-1, 2)
    values = np.asarray(_reference_log_densities(jnp.asarray(thetas)))
    assert np.all(np.isfinite(values))
    peak = values.max()
    grid = values.reshape(61, 61)
    assert peak - max(grid[0].max(), grid[-1].max(), grid[:, 0].max(), grid[:, -1].max()) > 10.0
    w = np.exp(values - peak)
    total = w.sum()
    w /= total
    mean = w @ thetas
    sd = np.sqrt(w @ (thetas - mean) ** 2)
    log_z = peak + np.log(total) + np.log((a[1] - a[0]) * (b[1] - b[0]))
    return mean, sd, log_z


@pytest.fixture(scope="module")
def ccd():
    return vj.hyper.integrate(build, METHOD, log_prior, THETA0, rule="ccd")


@eqx.filter_jit
def _per_point(predictive, posteriors, *args):
    """``predictive`` at each of a batch of posteriors (vmapped, one program), not mixed."""
    return jax.vmap(lambda post: predictive(post, *args))(posteriors)


def _check_against(result_mean, result_sd, result_log_z, reference, mean_tol, sd_tol, log_z_tol):
    mean, sd, log_z = reference
    np.testing.assert_array_less(np.abs(np.asarray(result_mean) - mean) / sd, mean_tol)
    np.testing.assert_array_less(np.abs(np.asarray(result_sd) / sd - 1), sd_tol)
    if result_log_z is not None:
        assert abs(float(result_log_z) - log_z) < log_z_tol


# ----------------------------------------------------------------------------------------------------------------
# The marginal likelihood as a function


def test_marginal_gradient_matches_differences_and_a_warm_refit_compiles_nothing():
    m = vj.hyper.marginal(build, METHOD)
    theta = jnp.asarray([-0.2, 0.8])
    post = m.fit(theta)
    for direction in (jnp.asarray([1.0, 0.0]), jnp.asarray([0.3, -1.0])):
        step = 1e-4 * direction
        grad, difference = gradient_and_difference(lambda th: m(th, post), theta, step)
        np.testing.assert_allclose(float(grad @ step), float(difference), rtol=1e-5)
    # the value is the method's log Z for the model built at theta, also under jit
    np.testing.assert_allclose(float(m(theta, post)), float(vj.infer(build(theta), METHOD).log_z), rtol=1e-9)
    np.testing.assert_allclose(float(jax.jit(m)(theta, post)), float(m(theta, post)), rtol=1e-12)
    warm = m.fit(theta + 0.05, post)
    again, count = programs(m.fit, theta - 0.1, warm)
    assert count == 0
    np.testing.assert_allclose(float(again.log_z), float(m(theta - 0.1, post)), rtol=1e-9)


# ----------------------------------------------------------------------------------------------------------------
# The deterministic rules


def test_ccd_design_is_the_standard_one_and_its_weights_are_exact_for_a_gaussian():
    for dim, size in zip(range(1, 7), (3, 9, 15, 25, 27, 45)):
        z, log_delta = vj.hyper.ccd_design(dim, f0=1.1)
        assert z.shape == (size, dim) and log_delta.shape == (size,)
        np.testing.assert_array_equal(z[0], 0.0)
        np.testing.assert_allclose(np.linalg.norm(z[1:], axis=1), 1.1 * np.sqrt(dim))  # one sphere
        if dim >= 2:  # resolution ≥ V: main effects and two-factor interactions mutually orthogonal
            corners = np.sign(z[1 + 2 * dim:])
            effects = [corners[:, i] for i in range(dim)]
            effects += [corners[:, i] * corners[:, j] for i in range(dim) for j in range(i + 1, dim)]
            E = np.stack(effects, 1)
            np.testing.assert_allclose(E.T @ E, len(corners) * np.eye(E.shape[1]))
        # Σ_k Δ_k N(z_k | 0, I) g(z_k) = E[g] for g = 1, z_i, z_i z_j
        w = np.exp(log_delta) * stats.multivariate_normal(np.zeros(dim), np.eye(dim)).pdf(z).reshape(-1)
        np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-12)
        np.testing.assert_allclose(w @ z, 0.0, atol=1e-12)
        np.testing.assert_allclose((z * w[:, None]).T @ z, np.eye(dim), atol=1e-12)


def test_rules_are_exact_when_p_of_y_given_theta_is_gaussian():
    """y = Xw + ε, w ~ N(θ, I), θ ~ N(0, τ²I): log p(y | θ) is quadratic in θ, so the posterior of θ and the log
    marginal likelihood log N(y | 0, XXᵀ(1 + τ²) + σ²I) are known in closed form."""
    rng = np.random.default_rng(5)
    Xg = rng.normal(size=(20, 3))
    yg = Xg @ rng.normal(size=3) + 0.5 * rng.normal(size=20)
    sigma, tau = 0.5, 1.5
    Xg, yg = jnp.asarray(Xg), jnp.asarray(yg)
    build_g = lambda th: vj.glm.linear_regression(Xg, yg - Xg @ th, noise_scale=sigma)
    prior_g = lambda th: jnp.sum(stats.norm.logpdf(0.0) - np.log(tau) - 0.5 * (th / tau) ** 2)
    X_, y_ = np.asarray(Xg), np.asarray(yg)
    C = X_ @ X_.T + sigma**2 * np.eye(20)
    precision = X_.T @ np.linalg.solve(C, X_) + np.eye(3) / tau**2
    cov = np.linalg.inv(precision)
    mean = cov @ X_.T @ np.linalg.solve(C, y_)
    log_z = stats.multivariate_normal(np.zeros(20), C + tau**2 * X_ @ X_.T).logpdf(y_)
    for rule, tol in (("ccd", 1e-7), ("grid", 5e-3)):
        res = vj.hyper.integrate(build_g, vj.Laplace(), prior_g, jnp.zeros(3), rule=rule)
        np.testing.assert_allclose(res.mode, mean, atol=1e-6)
        np.testing.assert_allclose(res.covariance, cov, rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose(res.mean, mean, atol=tol * np.sqrt(np.diag(cov)).min())
        np.testing.assert_allclose(res.sd, np.sqrt(np.diag(cov)), rtol=tol)
        np.testing.assert_allclose(float(res.log_z), log_z, atol=tol)
        np.testing.assert_allclose(float(jnp.sum(res.weights)), 1.0, rtol=1e-12)
    # the GLM predictives accept the result and mix over its points
    X_new = jnp.asarray(rng.normal(size=(4, 3)))
    y_new = jnp.asarray(rng.normal(size=4))
    w = np.asarray(res.weights)
    means = np.asarray(_per_point(vj.glm.predict_mean, res.posteriors, X_new))
    logs = np.asarray(_per_point(vj.glm.log_predictive, res.posteriors, X_new, y_new))
    np.testing.assert_allclose(vj.glm.predict_mean(res, X_new), w @ means, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vj.glm.log_predictive(res, X_new, y_new), np.log(w @ np.exp(logs)), rtol=1e-10)


def test_grid_rule_agrees_with_the_brute_force_grid(reference):
    res = vj.hyper.integrate(build, METHOD, log_prior, THETA0, rule="grid", batch_size=8)  # 24 batches and 5 left
    assert res.points.shape == (197, 2) and bool(res.mode_converged)
    _check_against(res.mean, res.sd, res.log_z, reference, 0.1, 0.15, 0.05)


def test_ccd_agrees_with_the_brute_force_grid(ccd, reference):
    assert ccd.points.shape == (9, 2) and ccd.rule == "ccd"
    _check_against(ccd.mean, ccd.sd, ccd.log_z, reference, 0.25, 0.25, 0.1)
    # the centre is the mode, a stationary point of the log density
    np.testing.assert_allclose(ccd.points[0], ccd.mode)
    np.testing.assert_allclose(ccd.log_densities[0], ccd.log_densities.max())


def test_mixture_predictive_is_the_weighted_average_of_the_points(ccd):
    w = np.asarray(ccd.weights)
    probs = np.asarray(_per_point(vj.gp.predict_proba, ccd.posteriors, X_TEST))
    logs = np.asarray(_per_point(vj.gp.log_predictive, ccd.posteriors, X_TEST, Y_TEST))
    means, variances = (np.asarray(a) for a in _per_point(vj.gp.predict, ccd.posteriors, X_TEST))
    mixed = np.asarray(vj.gp.predict_proba(ccd, X_TEST))
    np.testing.assert_allclose(mixed, w @ probs, rtol=1e-12)
    assert np.all((mixed > 0) & (mixed < 1))
    assert np.max(np.abs(mixed - probs[0])) > 1e-3  # not the mode's predictive
    np.testing.assert_allclose(vj.gp.log_predictive(ccd, X_TEST, Y_TEST), np.log(w @ np.exp(logs)), rtol=1e-12)
    mean, var = vj.gp.predict(ccd, X_TEST)
    np.testing.assert_allclose(mean, w @ means, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(var, w @ variances + w @ (means - w @ means) ** 2, rtol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# NUTS


@pytest.mark.slow
def test_nuts_agrees_with_the_brute_force_grid(reference):
    pytest.importorskip("numpyro")
    res = vj.hyper.sample(build, METHOD, log_prior, jax.random.key(0), 300, 300, THETA0, num_posteriors=20)
    assert res.draws.shape == (300, 2) and res.points.shape == (20, 2)
    assert int(res.info.num_divergent) == 0
    # the tolerances, or three Monte Carlo standard errors where those are larger (ESS ≈ 200 here:
    # 0.07 sd for a mean, ≈ 5 % for an sd)
    ess = np.asarray(res.info.ess)
    assert np.all(ess > 100)
    mean_tol = np.maximum(0.1, 3 / np.sqrt(ess))
    sd_tol = np.maximum(0.15, 3 / np.sqrt(2 * ess))
    _check_against(res.mean, res.sd, None, reference, mean_tol, sd_tol, None)
    probs = np.asarray(vj.gp.predict_proba(res, X_TEST))
    per_point = np.asarray(_per_point(vj.gp.predict_proba, res.posteriors, X_TEST))
    np.testing.assert_allclose(probs, per_point.mean(0), rtol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_is_refused_with_a_clear_error(monkeypatch):
    integrate = vj.hyper.integrate
    with pytest.raises(ValueError, match="flat"):
        integrate(build, METHOD, log_prior, jnp.zeros((2, 1)))
    with pytest.raises(ValueError, match="at most 6"):
        integrate(build, METHOD, log_prior, jnp.zeros(7))
    with pytest.raises(ValueError, match="'ccd' or 'grid'"):
        integrate(build, METHOD, log_prior, THETA0, rule="simpson")
    with pytest.raises(ValueError, match="instance"):
        integrate(build, vj.Laplace, log_prior, THETA0)
    with pytest.raises(ValueError, match="f0"):
        integrate(build, METHOD, log_prior, THETA0, f0=1.0)
    with pytest.raises(ValueError, match="max_points"):
        integrate(build, METHOD, log_prior, THETA0, rule="grid", step=0.01)
    with pytest.raises(ValueError, match="not finite"):
        integrate(build, METHOD, lambda th: jnp.sum(th) - jnp.inf, THETA0)
    with pytest.raises(ValueError, match="function"):
        vj.hyper.marginal(None, METHOD)
    with pytest.raises(ValueError, match="num_samples"):
        vj.hyper.sample(build, METHOD, log_prior, jax.random.key(0), 0, 10, THETA0)
    monkeypatch.setitem(__import__("sys").modules, "numpyro.infer", None)
    with pytest.raises(ImportError, match="pip install numpyro"):
        vj.hyper.sample(build, METHOD, log_prior, jax.random.key(0), 10, 10, THETA0)
