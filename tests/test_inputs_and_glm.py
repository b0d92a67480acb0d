"""Bad input raises a ValueError that names the problem; GLM builders and predictive quantities."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

import vijax as vj


@pytest.fixture
def data(rng):
    X = rng.normal(size=(30, 3))
    y = (rng.random(30) < 0.5).astype(float)
    return X, y


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda X, y: vj.glm.logistic_regression(X[:, :, None], y), "dimension"),
        (lambda X, y: vj.glm.logistic_regression(X, y[:-1]), "rows"),
        (lambda X, y: vj.glm.logistic_regression(np.where(X > 1.5, np.nan, X), y), "NaN"),
        (lambda X, y: vj.glm.logistic_regression(X, np.where(y > 0, np.inf, y)), "NaN"),
        (lambda X, y: vj.glm.logistic_regression(X, 2 * y + 1), "labels"),
        (lambda X, y: vj.glm.probit_regression(X, np.where(y > 0, 1.0, -1.0) * 0.5), "labels"),
        (lambda X, y: vj.glm.logistic_regression(X, y, prior_variance=0.0), "positive"),
        (lambda X, y: vj.glm.poisson_regression(X, y - 0.5), "counts"),
        (lambda X, y: vj.glm.robust_regression(X, y, likelihood="gumbel"), "likelihood"),
        (lambda X, y: vj.glm.robust_regression(X, y, scale=-1.0), "positive"),
        (lambda X, y: vj.glm.linear_regression(X, y, noise_scale=0.0), "positive"),
        (lambda X, y: vj.GaussianFactor.isotropic(3, variance=-2.0), "positive"),
        (lambda X, y: vj.GaussianFactor.isotropic(0), "dim"),
        (lambda X, y: vj.GaussianFactor.diagonal(np.array([1.0, 0.0, 1.0])), "positive"),
        (lambda X, y: vj.GaussianFactor.dense(np.zeros(3), np.diag([1.0, -1.0, 1.0])), "positive definite"),
        (lambda X, y: vj.GaussianFactor.dense(np.zeros(3), np.triu(np.ones((3, 3)))), "symmetric"),
        (lambda X, y: vj.GaussianFactor.dense(np.zeros(2), np.eye(3)), "shape"),
        (lambda X, y: vj.GaussianFactor.precision(np.zeros(3), np.zeros((3, 3))), "positive definite"),
        (lambda X, y: vj.GaussianFactor.linear_gaussian(X, y[:5], 1.0), "rows"),
        (lambda X, y: vj.LatentLinearModel(vj.GaussianFactor.isotropic(4), vj.Sites(X, vj.potentials.Logistic())),
         "dimensions disagree"),
        (lambda X, y: vj.LatentLinearModel(np.eye(3), vj.Sites(X, vj.potentials.Logistic())), "GaussianFactor"),
        (lambda X, y: vj.LatentLinearModel(None, ()), "Sites"),
        (lambda X, y: vj.Sites(X, vj.potentials.Gaussian(loc=y[:4])), "per-site"),
        (lambda X, y: vj.Sites(X, "logistic"), "potential"),
        (lambda X, y: vj.Sites(X, vj.potentials.Logistic(), offset=np.ones(4)), "per-site"),
        (lambda X, y: vj.Sites(None, vj.potentials.Logistic()), "Identity"),
        (lambda X, y: vj.potentials.Heaviside(eps=0.7), r"\(0.0, 0.5\), got values in \[0.7, 0.7\]\.$"),
        (lambda X, y: vj.potentials.Gaussian(0.0, -1.0), r"got minimum -1\.0\.$"),  # a number, not np.float64(-1.0)
        (lambda X, y: vj.potentials.StudentT(df=0.0), "positive"),
        (lambda X, y: vj.quadrature.GaussHermite(0), "positive integer"),
        (lambda X, y: vj.glm.logistic_regression(X[:0], y[:0]), "no rows"),
        (lambda X, y: vj.glm.poisson_regression(X[:0], y[:0]), "no rows"),
        (lambda X, y: vj.glm.linear_regression(X[:0], y[:0]), "no rows"),
        (lambda X, y: vj.glm.logistic_regression(X[:, :0], y), "no columns"),
        (lambda X, y: vj.gp.model(vj.gp.kernels.SquaredExponential(), X[:0], vj.potentials.Logistic(), y[:0]),
         "no rows"),
    ],
)
def test_bad_input_raises_value_error(data, build, match):
    X, y = data
    with pytest.raises(ValueError, match=match):
        build(X, y)


def test_warnings_name_the_callers_line(data):
    """A warning raised under vj.infer is attributed to the line that called it, not to vijax."""
    X, y = data
    with pytest.warns(vj.ConvergenceWarning, match="stopped after 1 iterations") as record:
        vj.infer(vj.glm.logistic_regression(X, y), vj.EP(max_iter=1))
    assert [w.filename for w in record] == [__file__]


def test_infer_rejects_non_models(data):
    with pytest.raises(ValueError, match="LatentLinearModel"):
        vj.infer(data[0], vj.GKL())
    model = vj.glm.logistic_regression(*data)
    with pytest.raises(ValueError, match="method"):
        vj.infer(model, "gkl")
    with pytest.raises(ValueError, match="init"):
        vj.infer(model, vj.GKL(), init=np.zeros(4))


def test_labels_in_either_convention_give_the_same_model(data):
    X, y = data
    a = vj.infer(vj.glm.logistic_regression(X, y), vj.GKL())
    b = vj.infer(vj.glm.logistic_regression(X, 2 * y - 1), vj.GKL())
    np.testing.assert_allclose(a.log_z, b.log_z, rtol=1e-12)


@pytest.mark.slow
def test_predict_proba_and_log_predictive_by_quadrature(rng, data):
    X, y = data
    post = vj.infer(vj.glm.logistic_regression(X, y), vj.GKL())
    Xt = rng.normal(size=(5, 3))
    p = np.asarray(vj.glm.predict_proba(post, Xt))
    mean, var = (np.asarray(a) for a in post.marginals(Xt))
    for i in range(5):
        s = np.sqrt(var[i])
        ref = integrate.quad(lambda t: stats.norm.pdf(t) / (1 + np.exp(-(mean[i] + s * t))), -12, 12, epsabs=1e-13)[0]
        np.testing.assert_allclose(p[i], ref, rtol=1e-8)
    yt = np.array([1, 0, 1, 1, 0])
    np.testing.assert_allclose(vj.glm.log_predictive(post, Xt, yt), np.log(np.where(yt == 1, p, 1 - p)), rtol=1e-7)

    probit = vj.infer(vj.glm.probit_regression(X, y), vj.GKL())
    m, v = probit.marginals(Xt)
    np.testing.assert_allclose(vj.glm.predict_proba(probit, Xt), stats.norm.cdf(m / np.sqrt(1 + v)), rtol=1e-10)


def test_regression_predictive_densities(rng):
    X = rng.normal(size=(40, 2))
    y = X @ np.array([0.5, -1.0]) + 0.3 * rng.normal(size=40)
    post = vj.infer(vj.glm.linear_regression(X, y, noise_scale=0.3), vj.GKL())
    Xt, yt = rng.normal(size=(4, 2)), rng.normal(size=4)
    m, v = post.marginals(Xt)
    np.testing.assert_allclose(vj.glm.log_predictive(post, Xt, yt), stats.norm.logpdf(yt, m, np.sqrt(v + 0.09)), rtol=1e-10)
    with pytest.raises(ValueError, match="binary"):
        vj.glm.predict_proba(post, Xt)


def test_predict_mean(rng):
    """The predicted mean of a new observation: the mean count ⟨e^η⟩ of Poisson regression (by quadrature
    under q's marginal), x_*ᵀm for linear regression, p(y = 1) for a classifier."""
    X = 0.5 * rng.normal(size=(40, 2))
    counts = rng.poisson(np.exp(X @ np.array([0.7, -0.4]) + 0.5)).astype(float)
    post = vj.infer(vj.glm.poisson_regression(X, counts, offset=0.5), vj.Laplace())
    Xt, exposure = rng.normal(size=(4, 2)), np.log(rng.uniform(1.0, 3.0, size=4))
    mean, var = (np.asarray(a) for a in post.marginals(Xt))
    expected = [integrate.quad(lambda t: stats.norm.pdf(t) * np.exp(mean[i] + exposure[i] + np.sqrt(var[i]) * t),
                               -12, 12, epsabs=1e-13)[0] for i in range(4)]
    np.testing.assert_allclose(vj.glm.predict_mean(post, Xt, offset=exposure), expected, rtol=1e-9)
    y = X @ np.array([0.5, -1.0]) + 0.3 * rng.normal(size=40)
    linear = vj.infer(vj.glm.linear_regression(X, y, noise_scale=0.3), vj.Laplace())
    np.testing.assert_allclose(vj.glm.predict_mean(linear, Xt), Xt @ np.asarray(linear.mean), rtol=1e-12)
    labels = (y > 0).astype(float)
    clf = vj.infer(vj.glm.logistic_regression(X, labels), vj.Laplace())
    np.testing.assert_array_equal(vj.glm.predict_mean(clf, Xt), vj.glm.predict_proba(clf, Xt))
    heavy = vj.infer(vj.glm.robust_regression(X, y, df=1.0), vj.Laplace())  # Cauchy noise
    with pytest.raises(ValueError, match="no mean"):
        vj.glm.predict_mean(heavy, Xt)
    with pytest.raises(ValueError, match="one entry per test point"):
        vj.glm.predict_mean(post, Xt, offset=np.zeros(3))


@pytest.mark.parametrize("kind", ["student_t", "laplace", "poisson"])
def test_other_glms_fit_and_converge(rng, kind):
    X = rng.normal(size=(60, 3)) * 0.5
    w = np.array([0.8, -0.5, 0.3])
    if kind == "poisson":
        model = vj.glm.poisson_regression(X, rng.poisson(np.exp(X @ w)).astype(float))
    else:
        model = vj.glm.robust_regression(X, X @ w + 0.2 * rng.standard_t(2, size=60), likelihood=kind, scale=0.2)
    post = vj.infer(model, vj.GKL())
    assert bool(post.diagnostics.converged)
    assert np.linalg.norm(np.asarray(post.mean) - w) < 0.6


@pytest.mark.slow
def test_float32_breast_cancer_has_no_nans():
    """The demo problem in float32: finite bound, converged to the float32 tolerance."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    X = np.hstack([X, np.ones((len(X), 1))]).astype(np.float32)
    post = vj.infer(vj.glm.logistic_regression(X, y, prior_variance=np.float32(1.0)),
                    vj.GKL(solver=vj.solvers.NewtonCG(tol=1e-2)))
    assert post.mean.dtype == jnp.float32
    assert np.isfinite(float(post.log_z))
    assert np.all(np.isfinite(np.asarray(post.covariance)))
    assert bool(post.diagnostics.converged)
    ref = vj.infer(vj.glm.logistic_regression(X.astype(np.float64), y), vj.GKL())
    np.testing.assert_allclose(post.log_z, ref.log_z, rtol=1e-4)
