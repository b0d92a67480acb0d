"""Multi-class GP classification: nested EP (multinomial probit) and the stick-breaking model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

import vijax as vj
from helpers import gradient_and_difference

mc = vj.gp.multiclass
KERNEL = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=3.0)


def _three_class_data(rng, n):
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 2)) + 1.5 * np.eye(3)[y][:, :2]
    return X, y


_log_lik = jax.jit(mc.multinomial_probit_log_likelihood)
_log_lik_batch = jax.jit(jax.vmap(mc.multinomial_probit_log_likelihood, in_axes=(0, None)))


def _exact_tilted(m0, V0, label, nodes=30):
    """log Ẑ, mean and covariance of N(f | m0, V0) p(label | f) on a tensor Gauss–Hermite grid (C = 3)."""
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    grid = np.stack(np.meshgrid(z, z, z, indexing="ij"), -1).reshape(-1, 3)
    weights = np.prod(np.stack(np.meshgrid(w, w, w, indexing="ij"), -1).reshape(-1, 3), 1)
    f = m0 + grid @ np.linalg.cholesky(V0).T
    lik = np.exp(np.asarray(_log_lik_batch(f, label)))
    p = weights * lik
    Z = p.sum()
    mean = p @ f / Z
    cov = (p[:, None] * (f - mean)).T @ (f - mean) / Z
    return np.log(Z), mean, cov


# ------------------------------------------------------------------------------ the likelihood
def test_likelihood_sums_to_one_and_matches_scipy(rng):
    for C in (2, 3, 5):
        f = rng.normal(scale=2.0, size=C)
        p = np.exp([float(_log_lik(f, c)) for c in range(C)])
        np.testing.assert_allclose(p.sum(), 1.0, atol=1e-10)
        for c in (0, C - 1):
            others = [j for j in range(C) if j != c]
            integrand = lambda u: stats.norm.pdf(u) * np.prod(stats.norm.cdf(u + f[c] - f[others]))
            np.testing.assert_allclose(p[c], integrate.quad(integrand, -12, 12, epsabs=1e-13)[0], rtol=1e-9)
    # C = 2 has the closed form Φ((f_0 − f_1)/√2)
    np.testing.assert_allclose(float(_log_lik(jnp.array([0.7, -0.4]), 0)),
                               stats.norm.logcdf(1.1 / np.sqrt(2)), rtol=1e-10)


# ------------------------------------------------------------------------------ the inner EP
def test_inner_ep_tilted_moments_match_grid(rng):
    A = rng.normal(size=(3, 3))
    m0, V0 = np.array([0.3, -0.5, 0.8]), 0.7 * A @ A.T + 0.3 * np.eye(3)
    inner = jax.jit(mc.tilted_moments)
    for label in range(3):
        log_z, mean, cov, converged = inner(m0, V0, label)
        exact_log_z, exact_mean, exact_cov = _exact_tilted(m0, V0, label)
        assert bool(converged)
        # The inner EP is exact only for one factor (C = 2); with C − 1 = 2 coupled probit factors its
        # error is that of EP for a 2-D Gaussian orthant probability. For this strongly correlated
        # cavity (eigenvalues 0.33 … 7.7) it is at most 0.009 in log Ẑ, 0.2% of the scale in the mean
        # and 2.6% in the covariance (EP's variances are a little small); the 30-node grid agrees
        # with a 50-node one to 1e-6. About 1.5–2× margins.
        scale = np.abs(exact_cov).max()
        np.testing.assert_allclose(float(log_z), exact_log_z, atol=0.02)
        np.testing.assert_allclose(np.asarray(mean), exact_mean, atol=0.005 * scale)
        np.testing.assert_allclose(np.asarray(cov), exact_cov, atol=0.04 * scale)
        # ... and it does move the moments: the cavity is far from the answer
        assert np.abs(exact_mean - m0).max() > 0.2


def test_inner_ep_is_exact_for_two_classes():
    m0, V0 = np.array([0.4, -0.3]), np.array([[1.3, 0.5], [0.5, 0.8]])
    log_z, mean, cov, _ = jax.jit(mc.tilted_moments)(m0, V0, 1)
    # p(1 | f) = Φ((f_1 − f_0)/√2): a probit on d = f_1 − f_0, Var d = 1.3 + 0.8 − 1.0 = 1.1
    np.testing.assert_allclose(float(log_z), stats.norm.logcdf(-0.7 / np.sqrt(2 + 1.1)), rtol=1e-10)
    z, w = np.polynomial.hermite_e.hermegauss(80)
    f = m0 + np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, 2) @ np.linalg.cholesky(V0).T
    p = np.outer(w, w).reshape(-1) * stats.norm.cdf((f[:, 1] - f[:, 0]) / np.sqrt(2))
    exact_mean = p @ f / p.sum()
    np.testing.assert_allclose(np.asarray(mean), exact_mean, atol=1e-9)
    np.testing.assert_allclose(np.asarray(cov), (p[:, None] * (f - exact_mean)).T @ (f - exact_mean) / p.sum(),
                               atol=1e-9)


# ------------------------------------------------------------------------------ nested EP
def test_nested_ep_with_two_classes_is_binary_probit_ep(rng):
    # p(y=0 | f) = Φ((f_0 − f_1)/√2): binary probit on g = (f_0 − f_1)/√2 ~ GP(0, k); with one factor
    # per site the inner EP is exact, so nested EP and binary EP share fixed point and energy.
    X = rng.normal(size=(15, 2))
    y = (X[:, 0] + 0.5 * rng.normal(size=15) > 0).astype(int)
    result = vj.infer(mc.model(KERNEL, X, y, 2), mc.NestedEP())
    binary = vj.infer(vj.gp.model(KERNEL, X, vj.potentials.Probit(), labels=1 - y), vj.EP())
    assert bool(result.diagnostics.converged)
    np.testing.assert_allclose(float(result.log_z), float(binary.log_z), rtol=1e-8)
    f = result.class_means
    np.testing.assert_allclose(np.asarray(f[0] - f[1]) / np.sqrt(2), np.asarray(binary.mean), atol=1e-5)


def test_nested_ep_three_classes(rng):
    X, y = _three_class_data(rng, 24)
    result = vj.infer(mc.model(KERNEL, X, y, 3), mc.NestedEP())
    assert isinstance(result, mc.NestedEPPosterior) and isinstance(result, vj.Posterior)
    d = result.diagnostics
    assert bool(d.converged) and int(d.iterations) < 200 and int(d.info.skipped) == 0
    assert np.isfinite(float(result.log_z)) and float(result.log_z) < 0 and not result.is_lower_bound
    # outer sites: T̃_i 1 = 0, PSD, rank C − 1
    onehot = np.eye(3)[y]
    pi, S, _, h = mc.probit._site_terms(result.state.tau, result.state.nu, onehot)
    T = jax.vmap(mc.probit._site_precision)(pi, S)
    np.testing.assert_allclose(np.asarray(T @ jnp.ones(3)), 0.0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(h.sum(1)), 0.0, atol=1e-12)
    eig = np.linalg.eigvalsh(np.asarray(T))
    assert eig.min() > -1e-12 and np.all(eig[:, 1] > 1e-6)
    # the posterior blocks agree with the dense Σ = (K⁻¹ + W)⁻¹
    W = np.zeros((72, 72))
    idx = np.arange(3)[None, :] * 24 + np.arange(24)[:, None]
    for i in range(24):
        W[np.ix_(idx[i], idx[i])] = T[i]
    K = np.asarray(jax.scipy.linalg.block_diag(*result.factor.prior_cov))
    dense = np.linalg.inv(np.linalg.inv(K) + W)
    np.testing.assert_allclose(np.asarray(result.covariance), dense, atol=1e-8)
    np.testing.assert_allclose(np.asarray(result.std) ** 2, np.diag(dense), atol=1e-8)  # the structured diagonal
    np.testing.assert_allclose(np.asarray(result.site_cov[5]), dense[np.ix_(idx[5], idx[5])], atol=1e-8)
    h_full = np.asarray(h).T.reshape(-1)
    np.testing.assert_allclose(np.asarray(result.mean), dense @ h_full, atol=1e-8)
    # fixed point of *nested* EP: the full inner EP at a site's cavity reproduces q(f_i)
    i = 7
    V, m = np.asarray(result.site_cov[i]), np.asarray(result.class_means[:, i])
    cav_prec = np.linalg.inv(V) - np.asarray(T[i])
    V_cav = np.linalg.inv(cav_prec)
    m_cav = V_cav @ (np.linalg.solve(V, m) - np.asarray(h[i]))
    _, m_hat, V_hat, _ = jax.jit(mc.tilted_moments)(m_cav, V_cav, int(y[i]))
    np.testing.assert_allclose(np.asarray(m_hat), m, atol=1e-4)
    np.testing.assert_allclose(np.asarray(V_hat), V, atol=1e-4)
    # predictions: rows sum to one, and the training inputs are mostly classified right
    for rule in ("ep", "quadrature"):
        p = np.asarray(mc.predict_proba(result, X[:10], rule=rule))
        np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
        assert np.all(p > 0) and np.mean(p.argmax(1) == y[:10]) >= 0.7


def test_nested_ep_energy_gradient_is_total_derivative(rng):
    # log_z is stationary in the sites at convergence: jax.grad of vj.infer(...).log_z in the kernel (the
    # energy at the frozen final sites) is d log Z_EP / dℓ, the derivative of refits at ℓ ± ε.
    X, y = _three_class_data(rng, 24)
    method = mc.NestedEP(tol=1e-8)
    build = lambda log_ell: mc.model(vj.gp.kernels.SquaredExponential(lengthscale=jnp.exp(log_ell), variance=3.0),
                                     X, y, 3)
    result = vj.infer(build(0.0), method)
    np.testing.assert_allclose(float(mc.energy(result.state, build(0.0))), float(result.log_z), rtol=1e-12)
    eps = 1e-3
    grad, difference = gradient_and_difference(lambda s: vj.infer(build(s), method, init=result).log_z, 0.0, eps)
    np.testing.assert_allclose(grad, difference / eps, rtol=1e-4)
    assert abs(grad) > 1e-2


def test_nested_ep_log_z_matches_importance_sampling():
    # N = 2, C = 3: a 6-D integral, importance sampled with a Student-t around the EP posterior.
    X, y = np.array([[0.0], [1.0]]), np.array([0, 2])
    result = vj.infer(mc.model(KERNEL, X, y, 3), mc.NestedEP())
    mean, cov = np.asarray(result.mean), np.asarray(result.covariance)
    proposal = stats.multivariate_t(loc=mean, shape=1.5 * cov, df=5, seed=3)
    f = proposal.rvs(200_000)
    log_lik = jax.jit(jax.vmap(lambda g: _log_lik(g[:, 0], y[0]) + _log_lik(g[:, 1], y[1])))
    K = np.asarray(jax.scipy.linalg.block_diag(*result.factor.prior_cov))
    log_w = (np.asarray(log_lik(f.reshape(-1, 3, 2))) + stats.multivariate_normal(np.zeros(6), K).logpdf(f)
             - proposal.logpdf(f))
    w = np.exp(log_w - log_w.max())
    log_z = log_w.max() + np.log(w.mean())
    se = w.std() / np.sqrt(w.size) / w.mean()
    assert se < 0.005
    # EP's error here is ~0.004 (about 0.2% of |log Z| = 2.5); the test allows 0.03 (1.2%)
    np.testing.assert_allclose(float(result.log_z), log_z, atol=0.03)


def test_predictive_probabilities_match_monte_carlo(rng):
    A = rng.normal(size=(3, 3))
    m, V = np.array([0.5, -0.2, 0.1]), A @ A.T + 0.1 * np.eye(3)
    g = m + rng.normal(size=(1_000_000, 3)) @ np.linalg.cholesky(V).T + rng.normal(size=(1_000_000, 3))
    mc_p = np.bincount(g.argmax(1), minlength=3) / g.shape[0]  # p(c) = P(f_c + ε_c is the largest)
    ep = np.asarray(jax.nn.softmax(mc.probit._log_proba_ep(m[None], V[None])[0]))
    np.testing.assert_allclose(ep, mc_p, atol=0.015)  # EP orthant error ~1%, MC error 5e-4
    # the 1-D rule is exact (to the rule and MC) for a class-diagonal covariance
    D = np.diag(np.diag(V))
    g = m + rng.normal(size=(1_000_000, 3)) * np.sqrt(np.diag(V) + 1)
    mc_p = np.bincount(g.argmax(1), minlength=3) / g.shape[0]
    q = np.exp(np.asarray(mc.probit._log_proba_quadrature(m[None], D[None], vj.quadrature.GaussHermite(64))[0]))
    np.testing.assert_allclose(q.sum(), 1.0, atol=1e-8)
    np.testing.assert_allclose(q, mc_p, atol=2.5e-3)


# ------------------------------------------------------------------------------ stick-breaking
def test_stick_probabilities_sum_to_one(rng):
    eta = rng.normal(scale=3.0, size=(50, 4))
    p = np.asarray(mc.stick_breaking_probabilities(eta))
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
    s = 1 / (1 + np.exp(-eta))
    np.testing.assert_allclose(p[:, 2], s[:, 2] * (1 - s[:, 0]) * (1 - s[:, 1]), rtol=1e-12)
    np.testing.assert_allclose(p[:, 4], np.prod(1 - s, 1), rtol=1e-12)


def test_stick_model_sites_are_the_log_likelihood(rng):
    X, y = _three_class_data(rng, 9)
    model = mc.stick_breaking_model(KERNEL, X, y, 3, pieces=None, ordering=[2, 0, 1])
    layout = model.layout
    eta = rng.normal(size=(9, 2))
    w = eta[layout.point, layout.stick]
    sites = float(jnp.sum(model.sites[0].potential.log_phi(model.sites[0].project(jnp.asarray(w)))))
    p = np.asarray(mc.stick_breaking_probabilities(eta))  # columns in stick order: classes 2, 0, 1
    np.testing.assert_allclose(sites, np.sum(np.log(p[np.arange(9), np.argsort([2, 0, 1])[y]])), rtol=1e-12)


def test_stick_model_with_two_classes_is_binary_logistic(rng):
    X = rng.normal(size=(12, 2))
    y = (X[:, 1] > 0).astype(int)
    stick = vj.infer(mc.stick_breaking_model(KERNEL, X, y, 2, pieces=None), vj.Laplace())
    binary = vj.infer(vj.gp.model(KERNEL, X, vj.potentials.Logistic(), labels=1 - y, jitter=1e-6), vj.Laplace())
    np.testing.assert_allclose(float(stick.log_z), float(binary.log_z), rtol=1e-10)


@pytest.mark.slow
def test_stick_model_bounds_and_predictions(rng):
    X, y = _three_class_data(rng, 10)
    exact = mc.stick_breaking_model(KERNEL, X, y, 3, pieces=None)
    pw = vj.infer(mc.stick_breaking_model(KERNEL, X, y, 3), vj.GKL())
    ep = vj.infer(exact, vj.EP())
    assert bool(pw.diagnostics.converged) and bool(ep.diagnostics.converged) and pw.is_lower_bound
    # importance sampling of the stick-logistic model's log Z around the EP posterior
    proposal = stats.multivariate_t(loc=np.asarray(ep.mean), shape=1.5 * np.asarray(ep.covariance), df=5, seed=4)
    w_samples = proposal.rvs(50_000)
    log_w = np.asarray(jax.vmap(exact.log_joint)(jnp.asarray(w_samples))) - proposal.logpdf(w_samples)
    w = np.exp(log_w - log_w.max())
    log_z = log_w.max() + np.log(w.mean())
    se = w.std() / np.sqrt(w.size) / w.mean()
    assert se < 0.01
    assert float(pw.log_z) <= log_z + 3 * se
    assert float(pw.log_z) <= float(ep.log_z) + 1e-3
    np.testing.assert_allclose(float(ep.log_z), log_z, atol=0.05)
    assert log_z - float(pw.log_z) < 1.0  # the bound is not vacuous
    for post in (pw, ep):
        p = np.asarray(mc.stick_breaking_proba(post, X))
        np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-12)
        assert np.mean(p.argmax(1) == y) >= 0.7
    # probabilities from the predictive marginals agree with Monte Carlo over them
    mean, var = mc.stick_breaking_predict(ep, X[:3])
    # each stick's marginals are the GP conditional on its own latent values, in dense NumPy
    layout, K, m, S = exact.layout, np.asarray(exact.prior.cov), np.asarray(ep.mean), np.asarray(ep.covariance)
    for j in range(2):
        idx = np.flatnonzero(layout.stick == j)
        cross = np.asarray(KERNEL(X[layout.point[idx]], X[:3]))
        B = np.linalg.solve(K[np.ix_(idx, idx)], cross)
        np.testing.assert_allclose(mean[:, j], B.T @ m[idx], rtol=1e-9, atol=1e-12)
        expected = (np.asarray(KERNEL.diagonal(X[:3])) - np.sum(cross * B, 0)
                    + np.einsum("it,ij,jt->t", B, S[np.ix_(idx, idx)], B))
        np.testing.assert_allclose(var[:, j], expected, rtol=1e-8, atol=1e-12)
    eta = np.asarray(mean)[:, None] + np.sqrt(np.asarray(var))[:, None] * rng.normal(size=(3, 200_000, 2))
    np.testing.assert_allclose(np.asarray(mc.stick_breaking_proba(ep, X[:3])),
                               np.asarray(mc.stick_breaking_probabilities(eta)).mean(1), atol=5e-3)


# ------------------------------------------------------------------------------ validation
def test_inputs_are_validated(rng):
    X, y = _three_class_data(rng, 6)
    with pytest.raises(ValueError, match="lie in 0"):
        mc.model(KERNEL, X, y + 1, 3)
    with pytest.raises(ValueError, match="shape"):
        mc.model(KERNEL, X, y[:4], 3)
    with pytest.raises(ValueError, match="num_classes"):
        mc.stick_breaking_model(KERNEL, X, y * 0, 1)
    with pytest.raises(ValueError, match="permutation"):
        mc.stick_breaking_model(KERNEL, X, y, 3, ordering=[0, 0, 1])
    with pytest.raises(ValueError, match="integer"):
        mc.model(KERNEL, X, y + 0.5, 3)
    with pytest.raises(ValueError, match="jitter"):
        mc.model(KERNEL, X, y, 3, jitter=-1.0)
    with pytest.raises(ValueError, match="damping"):
        mc.NestedEP(damping=1.5)
    with pytest.raises(ValueError, match="bound"):
        vj.gp.softmax.SoftmaxBound("exact")
    with pytest.raises(ValueError, match="rule"):
        mc.predict_proba(None, X, rule="mc")


def test_softmax_bounds_are_ordered_and_below_the_exact_gkl_bound():
    """C = 2: softmax(f) is a logistic likelihood on f_1 − f_0 ~ GP(0, 2K); every local bound on
    ⟨log softmax⟩ is below the G-KL bound with exact expectations, and "tilted" ≥ "log" (a = 0 is the log bound)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20, 2))
    labels = (X[:, 0] + 0.3 * rng.normal(size=20) > 0).astype(int)
    exact = vj.infer(vj.gp.model(vj.gp.kernels.SquaredExponential(1.0, 4.0), X, vj.potentials.Logistic(),
                                 labels=labels), vj.GKL()).log_z
    model = mc.model(vj.gp.kernels.SquaredExponential(1.0, 2.0), X, labels, 2)
    fits = {b: vj.infer(model, vj.gp.softmax.SoftmaxBound(b)) for b in vj.gp.softmax.BOUNDS}
    for b, r in fits.items():
        assert bool(r.diagnostics.converged) and r.is_lower_bound, b
        assert float(r.log_z) <= float(exact) + 1e-8, b
    assert float(fits["tilted"].log_z) >= float(fits["log"].log_z) - 1e-8
    assert float(exact) - float(fits["tilted"].log_z) < 1.0
    probs = vj.gp.softmax.predict_proba(fits["tilted"], X[:6], key=jax.random.PRNGKey(0))
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-12)
    assert np.mean((probs[:, 1] > 0.5) == (labels[:6] == 1)) >= 0.8
