"""Gaussian processes: kernels, exact regression, every method on GP models, prediction, ML-II."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import vijax as vj
from helpers import gradient_and_difference

K_ = vj.gp.kernels
P = vj.potentials


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(7)
    X = rng.uniform(-3, 3, size=(25, 2))
    y = np.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=25)
    return X, y


def _exact_gp(K, y, noise_var, Ks, kss):
    A = K + noise_var * np.eye(len(y))
    log_ml = stats.multivariate_normal(np.zeros(len(y)), A).logpdf(y)
    mean = Ks.T @ np.linalg.solve(A, y)
    var = kss - np.sum(Ks * np.linalg.solve(A, Ks), axis=0)
    return log_ml, mean, var


# ----------------------------------------------------------------------------------------------
# Kernels


def test_kernels_match_their_formulas(rng):
    X1, X2 = rng.normal(size=(6, 3)), rng.normal(size=(4, 3))
    ell, v = np.array([0.7, 1.3, 2.0]), 1.7
    r = np.sqrt(np.sum(((X1[:, None] - X2[None]) / ell) ** 2, -1))
    expected = [
        (K_.SquaredExponential(ell, v), v * np.exp(-0.5 * r**2)),
        (K_.Matern12(ell, v), v * np.exp(-r)),
        (K_.Matern32(ell, v), v * (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r)),
        (K_.Matern52(ell, v), v * (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)),
        (K_.Linear(v), v * X1 @ X2.T),
        (K_.Periodic(0.8, 2.5, v), v * np.exp(-2 * np.sum(np.sin(np.pi * np.abs(X1[:, None] - X2[None]) / 2.5) ** 2, -1) / 0.64)),
    ]
    evaluate = eqx.filter_jit(lambda kernel, X1, X2: (kernel(X1, X2), kernel.diagonal(X1), kernel(X1)))
    for kernel, value in expected:
        cross, diagonal, gram = evaluate(kernel, X1, X2)  # one program per kernel
        np.testing.assert_allclose(cross, value, rtol=1e-12, atol=1e-14, err_msg=type(kernel).__name__)
        np.testing.assert_allclose(diagonal, np.diag(gram), rtol=1e-12, err_msg=type(kernel).__name__)
        assert np.linalg.eigvalsh(np.asarray(gram) + 1e-10 * np.eye(6)).min() > 0


def test_kernel_algebra_and_white_noise(rng):
    X, Z = rng.normal(size=(5, 2)), rng.normal(size=(3, 2))
    se, lin, white = K_.SquaredExponential(1.2, 0.5), K_.Linear(0.3), K_.White(0.1)
    np.testing.assert_allclose((se + lin)(X, Z), se(X, Z) + lin(X, Z))
    np.testing.assert_allclose((se * lin)(X, Z), se(X, Z) * lin(X, Z))
    np.testing.assert_allclose((se + white)(X), se(X) + 0.1 * np.eye(5))
    np.testing.assert_allclose((se + white)(X, Z), se(X, Z))  # noise is independent between input sets
    np.testing.assert_allclose((se + white).diagonal(X), 0.6)
    # 1-D inputs are a single column
    np.testing.assert_allclose(se(X[:, 0]), se(X[:, :1]))


def test_kernel_gradients_are_finite_at_zero_distance(rng):
    X = rng.normal(size=(4, 2))
    X = np.vstack([X, X[:1]])  # a repeated input
    for cls in (K_.Matern12, K_.Matern32, K_.Matern52, K_.SquaredExponential):
        g = jax.grad(lambda k: jnp.sum(k(X)))(cls(jnp.array([0.9, 1.1]), 1.0))
        assert np.all(np.isfinite(g.log_lengthscale)) and np.isfinite(g.log_variance), cls.__name__


def test_kernel_validation():
    with pytest.raises(ValueError, match="lengthscale"):
        K_.SquaredExponential(lengthscale=-1.0)
    with pytest.raises(ValueError, match="variance"):
        K_.Matern32(variance=0.0)
    with pytest.raises(ValueError, match="lengthscales for inputs"):
        K_.SquaredExponential(lengthscale=jnp.ones(3))(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="columns"):
        K_.Linear()(np.zeros((4, 2)), np.zeros((4, 3)))


# ----------------------------------------------------------------------------------------------
# Exact GP regression: every method is exact on the Gaussian likelihood


@pytest.mark.parametrize("method", [vj.GKL(), vj.EP(), vj.Laplace(), vj.LVB()], ids=lambda m: type(m).__name__)
def test_gaussian_likelihood_is_exact(regression, method):
    X, y = regression
    kernel = K_.SquaredExponential(jnp.array([1.1, 2.0]), 0.8)
    model = vj.gp.model(kernel, X, P.Gaussian(loc=y, scale=0.2), jitter=1e-8)
    post = vj.infer(model, method)
    X_test = np.random.default_rng(1).uniform(-3, 3, size=(7, 2))
    K = np.asarray(kernel(X)) + 1e-8 * np.eye(len(y))
    log_ml, mean, var = _exact_gp(K, y, 0.04, np.asarray(kernel(X, X_test)), np.asarray(kernel.diagonal(X_test)))
    np.testing.assert_allclose(post.log_z, log_ml, rtol=1e-8)
    f_mean, f_var = vj.gp.predict(post, X_test)
    np.testing.assert_allclose(f_mean, mean, atol=1e-6)
    np.testing.assert_allclose(f_var, var, atol=1e-6)
    # The predictive density of y_* adds the noise variance.
    lp = vj.gp.log_predictive(post, X_test, mean + 0.1)
    np.testing.assert_allclose(lp, stats.norm.logpdf(mean + 0.1, mean, np.sqrt(var + 0.04)), atol=1e-6)


def test_constant_mean_shifts_predictions(regression):
    X, y = regression
    kernel = K_.Matern52(1.0, 1.0)
    post = vj.infer(vj.gp.model(kernel, X, P.Gaussian(loc=y + 5.0, scale=0.2), mean=5.0), vj.GKL())
    base = vj.infer(vj.gp.model(kernel, X, P.Gaussian(loc=y, scale=0.2)), vj.GKL())
    X_test = X[:4] + 0.05
    m1, v1 = vj.gp.predict(post, X_test)
    m0, v0 = vj.gp.predict(base, X_test)
    np.testing.assert_allclose(m1, m0 + 5.0, atol=1e-6)
    np.testing.assert_allclose(v1, v0, atol=1e-8)
    np.testing.assert_allclose(post.log_z, base.log_z, atol=1e-7)


def test_sparse_bounds_sit_below_the_exact_evidence(regression):
    X, y = regression
    kernel = K_.SquaredExponential(jnp.array([1.1, 2.0]), 0.8)
    exact = vj.infer(vj.gp.model(kernel, X, P.Gaussian(loc=y, scale=0.2), jitter=1e-6), vj.GKL()).log_z
    Z = X[::3]
    collapsed = vj.gp.collapsed_elbo(kernel, X, y, 0.04, Z)
    mean_u, cov_u = vj.gp.optimal_inducing_posterior(kernel, X, y, 0.04, Z)
    chol = jnp.linalg.cholesky(cov_u)
    svgp_opt = vj.gp.svgp_elbo(mean_u, chol, kernel, Z, X, P.Gaussian(loc=y, scale=0.2))
    svgp_off = vj.gp.svgp_elbo(0.9 * mean_u, 1.1 * chol, kernel, Z, X, P.Gaussian(loc=y, scale=0.2))
    np.testing.assert_allclose(svgp_opt, collapsed, rtol=1e-9)
    assert svgp_off < collapsed < exact
    # Z = X closes the gap up to the jitter's effect on Q = K (K + εI)⁻¹ K.
    assert 0 <= exact - vj.gp.collapsed_elbo(kernel, X, y, 0.04, X, jitter=1e-6) < 1e-3


# ----------------------------------------------------------------------------------------------
# Classification


@pytest.fixture(scope="module")
def classification():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 2))
    labels = (np.sin(2 * X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=30) > 0).astype(float)
    return X, labels


def test_laplace_classification_matches_scikit_learn(classification):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X, labels = classification
    gpc = GaussianProcessClassifier(ConstantKernel(2.0, "fixed") * RBF(0.8, "fixed"), optimizer=None).fit(X, labels)
    kernel = K_.SquaredExponential(0.8, 2.0)
    post = vj.infer(vj.gp.model(kernel, X, P.Logistic(), labels=labels, jitter=1e-10),
                    vj.Laplace(solver=vj.solvers.NewtonCG(tol=1e-10)))
    np.testing.assert_allclose(post.log_z, gpc.log_marginal_likelihood_value_, rtol=1e-7)
    # Logistic sites are log-concave, so the Woodbury preconditioner is the exact curvature: one
    # conjugate-gradient step per Newton step, however ill-conditioned K (jitter 1e-10) is.
    d = post.diagnostics
    assert int(d.num_hvp_evals) <= int(d.iterations) + 1, (int(d.num_hvp_evals), int(d.iterations))
    # scikit-learn's latent mean at test points is k_*ᵀ(y − π) (R&W Alg. 3.2).
    X_test = np.random.default_rng(0).normal(size=(6, 2))
    f_mode = np.asarray(post.mean)
    expected = np.asarray(kernel(X_test, X)) @ (labels - 1 / (1 + np.exp(-f_mode)))
    np.testing.assert_allclose(vj.gp.predict(post, X_test)[0], expected, atol=1e-6)


@pytest.mark.slow
def test_labels_folded_into_projection_match_dense_h(classification):
    X, labels = classification
    kernel = K_.SquaredExponential(1.0, 1.5)
    model = vj.gp.model(kernel, X, P.Probit(), labels=labels)
    dense = vj.LatentLinearModel(model.prior, vj.Sites(np.diag(2 * labels - 1), P.Probit()))
    np.testing.assert_allclose(vj.infer(model, vj.GKL()).log_z, vj.infer(dense, vj.GKL()).log_z, rtol=1e-8)
    post = vj.infer(model, vj.EP())
    p = vj.gp.predict_proba(post, X[:5])
    m, v = vj.gp.predict(post, X[:5])
    np.testing.assert_allclose(p, stats.norm.cdf(m / np.sqrt(1 + v)), rtol=1e-6)
    assert vj.gp.log_predictive(post, X[:5], labels[:5]).shape == (5,)


def test_every_method_runs_on_a_classification_gp(classification):
    X, labels = classification
    kernel = K_.SquaredExponential(1.0, 1.5)
    model = vj.gp.model(kernel, X, P.Logistic(), labels=labels)
    values = {type(m).__name__: float(vj.infer(model, m).log_z)
              for m in (vj.GKL(), vj.EP(), vj.Laplace(), vj.LVB(), vj.MeanField())}
    assert all(np.isfinite(v) for v in values.values()), values
    # Lower bounds sit below the (near-exact) EP estimate; G-KL dominates the local bound and mean field.
    assert values["LVB"] <= values["GKL"] <= values["EP"] + 1e-6
    assert values["MeanField"] <= values["GKL"]


def test_model_validation(classification):
    X, labels = classification
    kernel = K_.SquaredExponential()
    with pytest.raises(ValueError, match="needs `labels`"):
        vj.gp.model(kernel, X, P.Probit())
    with pytest.raises(ValueError, match="only for classification"):
        vj.gp.model(kernel, X, P.Gaussian(loc=labels, scale=1.0), labels=labels)
    with pytest.raises(ValueError, match="entries"):
        vj.gp.model(kernel, X, P.Probit(), labels=labels[:-1])
    with pytest.raises(ValueError, match="per-site parameter"):
        vj.gp.model(kernel, X, P.Gaussian(loc=labels[:-1], scale=1.0))
    with pytest.raises(ValueError, match="kernel"):
        vj.gp.model(lambda a: a, X, P.Probit(), labels=labels)


# ----------------------------------------------------------------------------------------------
# The site form: GP models' fast paths for EP and G-KL


def test_site_form_integral_matches_the_general_one(rng):
    """`marginals` (site form B = I + W½KW½ when W ≥ 0, else the whitened general path) against `integrate`."""
    from vijax.covariance import CholeskyFactor
    from vijax.methods import _gaussian

    n = 12
    X = rng.normal(size=(n, 2))
    K = np.asarray(K_.Matern32(0.7, 1.3)(X)) + 1e-6 * np.eye(n)
    scale = rng.choice([-1.0, 1.0, 2.5], size=n)
    model = vj.LatentLinearModel(
        vj.GaussianFactor.dense(rng.normal(size=n), K),
        (vj.Sites(vj.Identity(n), P.Gaussian(loc=rng.normal(size=n), scale=1.0), offset=0.3),
         vj.Sites(vj.model.ScaledIdentity(jnp.asarray(scale)), P.Logistic())))
    assert _gaussian.diagonal_form(model) is not None

    def general(quadratics):
        value, mean, C = _gaussian.integrate(model, quadratics)
        factor = CholeskyFactor(C)
        return value, [g.project(mean) for g in model.sites], [factor.projected_variances(g.projection) for g in model.sites]

    @jax.jit  # both paths and their gradients in A, one program for both draws
    def both(quadratics):
        first, (a, A, _) = quadratics
        value, means, variances = _gaussian.marginals(model, quadratics)
        grad = jax.grad(lambda A: _gaussian.marginals(model, (first, (a, A, 0.0)))[0])(A)
        grad0 = jax.grad(lambda A: _gaussian.integrate(model, (first, (a, A, 0.0)))[0])(A)
        return (value, means, variances, grad), (*general(quadratics), grad0)

    A = rng.uniform(0, 2, size=n)
    A[3] = 0.0
    for A2 in (A, np.where(np.arange(n) == 5, -0.05, A)):  # the second: W < 0 at one site, the general path
        quadratics = ((rng.normal(size=n), rng.uniform(0, 1, size=n), 0.1), (rng.normal(size=n), A2, -0.2))
        (value, means, variances, grad), (v0, m0, s0, grad0) = both(quadratics)
        np.testing.assert_allclose(value, v0, rtol=1e-12)
        for a, b in zip(means + variances, m0 + s0):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(grad, grad0, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("likelihood", ["logistic", "poisson", "laplace"])
def test_natural_parameter_gkl_reaches_the_cholesky_optimum_on_gp_models(classification, likelihood):
    """The default G-KL on GP models (the dual form, V⁻¹ = K⁻¹ + diag λ) against Newton-CG on the
    Cholesky factor; also with Laplace sites, whose kink makes λ*_n huge where m_n sits on it."""
    X, labels = classification
    kernel = K_.SquaredExponential(0.9, 10.0)  # ill-conditioned K: the hard case for the Cholesky factor
    targets = np.sin(2 * X[:, 0]) + X[:, 1] + 2.0 * (np.arange(len(X)) % 9 == 0)  # a few outliers
    potential, y = {"logistic": (P.Logistic(), labels),
                    "poisson": (P.Poisson(counts=np.random.default_rng(0).poisson(2.0, len(labels))), None),
                    "laplace": (P.Laplace(targets, 0.1), None)}[likelihood]
    model = vj.gp.model(kernel, X, potential, labels=y, mean=0.2)
    fast = vj.infer(model, vj.GKL())
    newton = vj.infer(model, vj.GKL(solver=vj.solvers.NewtonCG(tol=1e-10)))
    d = fast.diagnostics
    assert d.solver == "natural-parameter ascent (dual)" and bool(d.converged) and int(d.iterations) < 30
    trace = np.asarray(d.objective_trace)[: int(d.iterations) + 1]
    assert np.all(np.diff(trace) >= -1e-12 * np.abs(trace[1:])), trace  # a monotone ascent
    np.testing.assert_allclose(fast.log_z, newton.log_z, rtol=1e-9)
    np.testing.assert_allclose(fast.mean, newton.mean, atol=1e-4)
    np.testing.assert_allclose(fast.covariance, newton.covariance, atol=1e-4)
    # The returned log Z is the G-KL bound at the returned Gaussian (so a lower bound).
    np.testing.assert_allclose(fast.log_z, vj.gkl.bound_at(fast, model), rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# Hyperparameters


def test_hyperparameter_gradient_matches_refitted_finite_differences(classification):
    X, labels = classification

    def log_z(log_ell, method):
        kernel = eqx.tree_at(lambda k: k.log_lengthscale, K_.SquaredExponential(1.0, 1.5), log_ell)
        return vj.infer(vj.gp.model(kernel, X, P.Logistic(), labels=labels), method).log_z

    # Laplace's gradient also carries the mode's dependence on θ (implicit differentiation, whitened).
    # G-KL here is the natural-parameter ascent (the Newton-CG path's envelope gradient is checked in test_gkl).
    # The model and methods of `test_every_method_runs_on_a_classification_gp` (a strongly typed θ): the
    # refits reuse its programs (EP's tighter tol is a traced setting).
    for method in (vj.EP(tol=1e-10), vj.GKL(), vj.Laplace()):
        x0, h = jnp.asarray(0.1, jnp.float64), 1e-4
        grad, difference = gradient_and_difference(lambda t: log_z(t, method), x0, h)
        np.testing.assert_allclose(grad, difference / h, rtol=1e-4, err_msg=type(method).__name__)


@pytest.mark.slow
def test_ml2_reaches_the_exact_optimum(regression):
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    X, y = regression
    fit = vj.gp.fit_hyperparameters(K_.SquaredExponential(jnp.ones(2), 1.0), X, P.Gaussian(loc=y, scale=0.3),
                                    vj.GKL(), jitter=1e-8, max_iter=60, tol=1e-10)
    assert fit.converged
    # The line search may trade ~1e-6 near the optimum (inner fits are converged to a tolerance).
    trace = np.asarray(fit.diagnostics.objective_trace)
    assert fit.log_z == trace[-1] and fit.log_z == fit.posterior.log_z
    assert trace[-1] >= trace.max() - 1e-5 and trace[-1] > trace[0] + 10
    # The same objective at the same point in scikit-learn, and its own optimum is not better.
    ell, var, noise = np.asarray(fit.kernel.lengthscale), float(fit.kernel.variance), float(fit.likelihood.scale) ** 2
    sk_kernel = ConstantKernel(var) * RBF(ell) + WhiteKernel(noise + 1e-8)
    gpr = GaussianProcessRegressor(sk_kernel, optimizer=None).fit(X, y)
    np.testing.assert_allclose(fit.posterior.log_z, gpr.log_marginal_likelihood_value_, rtol=1e-7, atol=1e-7)
    best = GaussianProcessRegressor(ConstantKernel() * RBF(np.ones(2)) + WhiteKernel(0.1), n_restarts_optimizer=2,
                                    random_state=0).fit(X, y)
    assert fit.posterior.log_z >= best.log_marginal_likelihood_value_ - 1e-4


@pytest.mark.slow
def test_ml2_with_ep_raises_log_z_on_classification(classification):
    X, labels = classification
    fit = vj.gp.fit_hyperparameters(K_.SquaredExponential(1.0, 1.0), X, P.Probit(), vj.EP(fallback=False),
                                    labels=labels, max_iter=6)
    trace = np.asarray(fit.diagnostics.objective_trace)
    assert trace[-1] > trace[0] + 0.5
    assert np.isfinite(trace).all()


# ----------------------------------------------------------------------------------------------
# JAX citizenship and float32


def test_predict_jits_and_vmaps(regression):
    X, y = regression
    kernel = K_.SquaredExponential(1.0, 1.0)
    post = vj.infer(vj.gp.model(kernel, X, P.StudentT(df=3.0, loc=y, scale=0.1)), vj.GKL())
    X_test = np.random.default_rng(2).normal(size=(3, 5, 2))
    jitted = jax.jit(vj.gp.predict)(post, X_test[0])
    np.testing.assert_allclose(jitted[0], vj.gp.predict(post, X_test[0])[0], rtol=1e-12)
    batched = jax.vmap(lambda xt: vj.gp.predict(post, xt))(X_test)
    np.testing.assert_allclose(batched[1][2], vj.gp.predict(post, X_test[2])[1], rtol=1e-10)


def test_float32_regression(regression):
    X, y = (np.asarray(a, np.float32) for a in regression)
    kernel = K_.SquaredExponential(np.float32(1.0), np.float32(1.0))
    model = vj.gp.model(kernel, X, P.StudentT(df=3.0, loc=y, scale=np.float32(0.2)), jitter=1e-4)
    post = vj.infer(model, vj.Laplace())
    m, v = vj.gp.predict(post, X[:3])
    assert m.dtype == jnp.float32 and np.all(np.isfinite(m)) and np.all(v >= 0)
    ref = vj.infer(jax.tree_util.tree_map(lambda a: a.astype(jnp.float64) if hasattr(a, "astype") else a, model),
                   vj.Laplace())
    np.testing.assert_allclose(post.log_z, ref.log_z, rtol=1e-3)
