"""Sparse GP bounds (vijax.gp.sparse) against exact GP regression in NumPy/SciPy."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import linalg, stats

import vijax as vj
from vijax.gp import sparse

jax.config.update("jax_enable_x64", True)

# Each call one program (outside jit every primitive would be a program of its own).
collapsed_elbo, optimal_inducing_posterior, predict_sparse, svgp_elbo, svgp_natural_step = (
    eqx.filter_jit(f) for f in (sparse.collapsed_elbo, sparse.optimal_inducing_posterior, sparse.predict_sparse,
                                sparse.svgp_elbo, sparse.svgp_natural_step))


class _SE(eqx.Module):
    lengthscale: float
    variance: float

    def __call__(self, X1, X2=None):
        X2 = X1 if X2 is None else X2
        d2 = jnp.sum((X1[:, None, :] - X2[None, :, :]) ** 2, axis=-1)
        return self.variance * jnp.exp(-0.5 * d2 / self.lengthscale**2)

    def diagonal(self, X):
        return jnp.full(X.shape[0], self.variance, dtype=X.dtype)


KERN = _SE(lengthscale=0.7, variance=1.3)
NOISE = 0.1


@pytest.fixture
def data(rng):
    N = 40
    X = rng.uniform(-3, 3, size=(N, 1))
    y = np.sin(2 * X[:, 0]) + np.sqrt(NOISE) * rng.standard_normal(N)
    return X, y


def _exact_lml(X, y):
    K = np.asarray(KERN(jnp.asarray(X)))
    return stats.multivariate_normal(np.zeros(len(y)), K + NOISE * np.eye(len(y))).logpdf(y)


def _optimal(X, y, Z, jitter=1e-6):
    m, S = optimal_inducing_posterior(KERN, X, y, NOISE, Z, jitter=jitter)
    return m, jnp.linalg.cholesky(S)


def test_collapsed_equals_exact_when_inducing_is_data(data):
    X, y = data
    assert float(collapsed_elbo(KERN, X, y, NOISE, X, jitter=1e-10)) == pytest.approx(_exact_lml(X, y), abs=1e-6)


def test_collapsed_is_lower_bound_and_monotone_in_nested_inducing_sets(data):
    X, y = data
    exact = _exact_lml(X, y)
    values = [float(collapsed_elbo(KERN, X, y, NOISE, X[:M])) for M in (2, 4, 8, 16, 32)]
    assert all(v <= exact + 1e-8 for v in values)
    assert all(b >= a - 1e-8 for a, b in zip(values, values[1:]))
    assert values[-1] > values[0]


def test_svgp_at_optimal_q_equals_collapsed_and_is_stationary(data, rng):
    X, y = data
    Z = X[:8]
    lik = vj.potentials.Gaussian(loc=y, scale=np.sqrt(NOISE))
    m, R = _optimal(X, y, Z)
    best = svgp_elbo(m, R, KERN, Z, X, lik)
    assert float(best) == pytest.approx(float(collapsed_elbo(KERN, X, y, NOISE, Z)), abs=1e-8)

    gm, gR = jax.grad(svgp_elbo, argnums=(0, 1))(m, R, KERN, Z, X, lik)
    assert np.max(np.abs(gm)) < 1e-6 and np.max(np.abs(jnp.tril(gR))) < 1e-6

    dm = 0.05 * rng.standard_normal(m.shape)
    dR = 0.05 * np.tril(rng.standard_normal(R.shape))
    assert svgp_elbo(m + dm, R, KERN, Z, X, lik) < best
    assert svgp_elbo(m, R + dR, KERN, Z, X, lik) < best


def test_svgp_below_collapsed_at_random_q_and_minibatch_scaling(data, rng):
    X, y = data
    Z = X[:6]
    lik = vj.potentials.Gaussian(loc=y, scale=np.sqrt(NOISE))
    collapsed = collapsed_elbo(KERN, X, y, NOISE, Z)
    for _ in range(5):
        m = rng.standard_normal(6)
        R = np.tril(0.3 * rng.standard_normal((6, 6))) + 0.5 * np.eye(6)
        assert svgp_elbo(m, R, KERN, Z, X, lik) < collapsed
    # Minibatch: the expected-log-likelihood term is rescaled by num_data / batch.
    batch = vj.potentials.Gaussian(loc=y[:10], scale=np.sqrt(NOISE))
    m, R = _optimal(X, y, Z)
    kl_only = -svgp_elbo(m, R, KERN, Z, X[:10], batch, num_data=0)
    full_batch = svgp_elbo(m, R, KERN, Z, X[:10], batch) + kl_only
    assert float(svgp_elbo(m, R, KERN, Z, X[:10], batch, num_data=40)) == pytest.approx(float(4 * full_batch - kl_only))


def test_svgp_with_student_t_likelihood_is_finite_and_differentiable(data):
    X, y = data
    Z = X[:6]
    lik = vj.potentials.StudentT(df=4.0, loc=y, scale=0.3)
    m, R = _optimal(X, y, Z)
    value, grads = jax.value_and_grad(svgp_elbo, argnums=(0, 1))(m, R, KERN, Z, X, lik)
    assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in grads)


def test_predict_sparse_matches_exact_gp_when_inducing_is_data(data):
    X, y = data
    Xs = np.linspace(-3.5, 3.5, 15)[:, None]
    m, S = optimal_inducing_posterior(KERN, X, y, NOISE, X, jitter=1e-10)
    mean, var = predict_sparse(KERN, X, m, S, Xs, jitter=1e-10)

    K = np.asarray(KERN(jnp.asarray(X)))
    Ks = np.asarray(KERN(jnp.asarray(Xs), jnp.asarray(X)))
    cf = linalg.cho_factor(K + NOISE * np.eye(len(y)))
    exact_mean = Ks @ linalg.cho_solve(cf, y)
    exact_var = KERN.variance - np.sum(Ks * linalg.cho_solve(cf, Ks.T).T, axis=1)
    np.testing.assert_allclose(mean, exact_mean, atol=1e-6)
    np.testing.assert_allclose(var, exact_var, atol=1e-6)


def test_collapsed_gradients_match_finite_differences(data):
    X, y = data
    X, y = X[:20], y[:20]
    Z = np.array([[-2.0], [-0.5], [0.7], [2.1]])
    f = jax.jit(lambda Z, s2: collapsed_elbo(KERN, X, y, s2, Z))
    gZ, gs = jax.grad(f, argnums=(0, 1))(Z, NOISE)
    h = 1e-5
    for i in range(Z.shape[0]):
        e = np.zeros_like(Z)
        e[i, 0] = h
        fd = float(f(Z + e, NOISE) - f(Z - e, NOISE)) / (2 * h)
        assert float(gZ[i, 0]) == pytest.approx(fd, rel=1e-5, abs=1e-6)
    fd = float(f(Z, NOISE + h) - f(Z, NOISE - h)) / (2 * h)
    assert float(gs) == pytest.approx(fd, rel=1e-5, abs=1e-6)


def test_input_validation(data):
    X, y = data
    Z = X[:5]
    with pytest.raises(ValueError, match="y"):
        sparse.collapsed_elbo(KERN, X, y[:-1], NOISE, Z)
    with pytest.raises(ValueError, match="input dimension"):
        sparse.collapsed_elbo(KERN, X, y, NOISE, np.zeros((5, 2)))
    with pytest.raises(ValueError, match="X"):
        sparse.optimal_inducing_posterior(KERN, X[:, 0], y, NOISE, Z)
    with pytest.raises(ValueError, match="noise_variance"):
        sparse.collapsed_elbo(KERN, X, y, 0.0, Z)
    with pytest.raises(ValueError, match="mean_u"):
        sparse.predict_sparse(KERN, Z, np.zeros(4), np.eye(5), X)
    with pytest.raises(ValueError, match="chol_u"):
        sparse.svgp_elbo(np.zeros(5), np.eye(4), KERN, Z, X, vj.potentials.Gaussian(loc=y, scale=0.3))


def test_natural_gradient_step_reaches_the_collapsed_optimum_in_one_step():
    import vijax as vj

    rng = np.random.default_rng(5)
    X = rng.uniform(-2, 2, size=(40, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=40)
    kernel, Z = _SE(0.7, 1.2), X[::5]
    likelihood = vj.potentials.Gaussian(loc=y, scale=0.3)
    mean, chol = svgp_natural_step(jnp.zeros(8), jnp.eye(8), kernel, Z, X, likelihood, learning_rate=1.0)
    best_mean, best_cov = vj.gp.optimal_inducing_posterior(kernel, X, y, 0.09, Z)
    np.testing.assert_allclose(mean, best_mean, atol=1e-8)
    np.testing.assert_allclose(chol @ chol.T, best_cov, atol=1e-8)


def test_natural_gradient_steps_raise_a_classification_bound():
    import vijax as vj

    rng = np.random.default_rng(6)
    X = rng.normal(size=(60, 2))
    signs = np.sign(X[:, 0] + 0.5 * X[:, 1] + 0.2 * rng.normal(size=60))
    kernel, Z = _SE(1.0, 2.0), X[:10]
    # Logistic sites on f_n·y_n: the potential is evaluated on the signed latent function.
    likelihood = vj.potentials.Custom(lambda f: jax.nn.log_sigmoid(signs * f))
    mean, chol = jnp.zeros(10), jnp.eye(10) * np.sqrt(2.0)
    values = []
    for _ in range(16):
        mean, chol = svgp_natural_step(mean, chol, kernel, Z, X, likelihood, learning_rate=0.7)
        values.append(float(svgp_elbo(mean, chol, kernel, Z, X, likelihood)))
    assert np.all(np.diff(values) > -1e-8), values
    grads = jax.grad(svgp_elbo, argnums=(0, 1))(mean, chol, kernel, Z, X, likelihood)
    assert max(float(jnp.abs(g).max()) for g in grads) < 1e-5


def test_classification_labels_and_inducing_input_gradients():
    import vijax as vj

    rng = np.random.default_rng(7)
    X = rng.normal(size=(40, 2))
    labels = (X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=40) > 0).astype(float)
    signs = 2 * labels - 1
    kernel, Z = _SE(0.9, 1.5), X[:6] + 0.1
    mean, chol = 0.3 * rng.normal(size=6), np.tril(0.2 * rng.normal(size=(6, 6))) + np.eye(6)
    folded = vj.potentials.Custom(lambda f: jax.nn.log_sigmoid(signs * f))
    logistic = vj.potentials.Logistic()
    # Labels fold into the latent as a potential written on y_n f_n (the two differ only by the
    # quadrature rule: Logistic's own against Gauss–Hermite for Custom).
    np.testing.assert_allclose(svgp_elbo(mean, chol, kernel, Z, X, logistic, labels=labels),
                               svgp_elbo(mean, chol, kernel, Z, X, folded), rtol=1e-5)
    for a, b in zip(svgp_natural_step(mean, chol, kernel, Z, X, logistic, labels=labels, learning_rate=0.5),
                    svgp_natural_step(mean, chol, kernel, Z, X, folded, learning_rate=0.5)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    with pytest.raises(ValueError, match="labels"):
        svgp_elbo(mean, chol, kernel, Z, X, logistic)
    with pytest.raises(ValueError, match="labels"):
        svgp_natural_step(mean, chol, kernel, Z, X, logistic, labels=labels[:-1])
    # Inducing inputs are learnable: the bound's gradient in Z matches central differences.
    elbo_z = lambda Z: svgp_elbo(mean, chol, kernel, Z, X, logistic, labels=labels)
    grad = jax.grad(elbo_z)(jnp.asarray(Z))
    h = 1e-5
    for i, j in ((0, 0), (3, 1), (5, 0)):
        e = np.zeros_like(Z)
        e[i, j] = h
        fd = (elbo_z(Z + e) - elbo_z(Z - e)) / (2 * h)
        np.testing.assert_allclose(grad[i, j], fd, rtol=1e-5, atol=1e-7)


def test_natural_steps_with_a_student_t_likelihood_stay_proper():
    """Student-t sites (not log-concave) on minibatches: a step that would leave S̃⁻¹ indefinite is
    shortened, so 50 steps at ρ = 0.1 stay finite and raise the bound (they returned NaN at step 1)."""
    import vijax as vj

    rng = np.random.default_rng(0)
    n, batch = 4000, 500
    X = rng.uniform(-3, 3, size=(n, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.standard_t(4, size=n)
    kernel, Z = _SE(0.7, 1.0), np.linspace(-3, 3, 30)[:, None]
    likelihood = lambda loc: vj.potentials.StudentT(df=4.0, loc=loc, scale=0.1)  # noqa: E731
    step = jax.jit(lambda m, c, Xb, yb: svgp_natural_step(m, c, kernel, Z, Xb, likelihood(yb), num_data=n,
                                                                learning_rate=0.1))
    elbo = lambda m, c: float(svgp_elbo(m, c, kernel, Z, X, likelihood(y)))  # noqa: E731
    mean, chol = jnp.zeros(30), jnp.eye(30)
    start = elbo(mean, chol)
    for _ in range(50):
        idx = rng.choice(n, batch, replace=False)
        mean, chol = step(mean, chol, X[idx], y[idx])
        assert np.all(np.isfinite(mean)) and np.all(np.isfinite(chol))
    assert elbo(mean, chol) > start
