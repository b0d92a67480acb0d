"""EP over hyperparameters (`vj.methods.ep_hyper`) and hierarchical sparse linear models (`vj.glm.hierarchical_linear`).

References: a 2-D grid for the tilted moments; ordinary EP (exact, conjugate) where q(φ) collapses to a
point; the exact posterior by a 2-D grid over (log scale, log noise) for a common-scale model; a long
NUTS run (slow) for ARD."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax.methods.ep_hyper import HierarchicalEP, log_variance_tilted_moments

_FIT = eqx.filter_jit(HierarchicalEP().fit)  # one compilation for the common-scale models below
_W = np.array([1.5, 0.0, 0.0, -1.0, 0.0])


def _data(seed=0, n=30):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, _W.size))
    return X, X @ _W + 0.5 * rng.normal(size=n)


def _log_normal(x, m, v):
    return -0.5 * (np.log(2 * np.pi * v) + (x - m) ** 2 / v)


@pytest.mark.parametrize("power", [1.0, 0.5])
def test_tilted_moments_match_a_2d_grid(power):
    loc, m, v, mu, s2 = 0.7, -0.3, 0.8, 0.2, 1.5
    got = log_variance_tilted_moments(loc, m, v, mu, s2, power)
    x, phi = np.meshgrid(np.linspace(-10, 10, 1201), np.linspace(-12, 12, 1201), indexing="ij")
    log_p = power * _log_normal(loc, x, np.exp(phi)) + _log_normal(x, m, v) + _log_normal(phi, mu, s2)
    p = np.exp(log_p)
    cell = (x[1, 0] - x[0, 0]) * (phi[0, 1] - phi[0, 0])
    z = p.sum() * cell
    p /= p.sum()
    ex, ephi = np.sum(p * x), np.sum(p * phi)
    want = (np.log(z), ex, np.sum(p * x**2) - ex**2, ephi, np.sum(p * phi**2) - ephi**2)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-6, atol=1e-8)


def test_collapsed_hyperprior_recovers_ordinary_ep():
    X, y = _data()
    noise = np.log(0.25)
    model = vj.glm.hierarchical_linear(X, y, groups="common", scale_prior=(0.3, 1e-12), noise_prior=(noise, 1e-12))
    post = _FIT(model)
    assert bool(post.diagnostics.converged)
    ordinary = vj.infer(model.model, vj.EP())  # the same sites with every φ at its prior mean
    np.testing.assert_allclose(post.mean, ordinary.mean, atol=1e-10)
    np.testing.assert_allclose(post.weights.covariance, ordinary.covariance, atol=1e-10)
    np.testing.assert_allclose(post.log_z, ordinary.log_z, atol=1e-8)
    # ... which is exact here: the conjugate posterior and evidence at σ² = 0.25, prior variance e^0.3.
    precision = X.T @ X / 0.25 + np.eye(5) / np.exp(0.3)
    np.testing.assert_allclose(post.mean, np.linalg.solve(precision, X.T @ y / 0.25), atol=1e-10)
    cov = 0.25 * np.eye(len(y)) + np.exp(0.3) * X @ X.T
    log_evidence = -0.5 * (len(y) * np.log(2 * np.pi) + np.linalg.slogdet(cov)[1] + y @ np.linalg.solve(cov, y))
    np.testing.assert_allclose(post.log_z, log_evidence, atol=1e-8)
    np.testing.assert_allclose(post.hyper_mean, [noise, 0.3], atol=1e-9)


def _grid_posterior(X, y, prior_var=4.0, X_test=None, y_test=None):
    """Exact posterior of the common-scale model: a grid over (a, b) = (log scale, log noise) variances,
    with w | a, b Gaussian (eigen-decomposition of XᵀX)."""
    n = X.shape[0]
    lam, U = np.linalg.eigh(X.T @ X)
    Xy = U.T @ (X.T @ y)
    a, b = np.meshgrid(np.linspace(-9, 6, 301), np.linspace(-6, 3, 301), indexing="ij")
    ea, eb = np.exp(a)[..., None], np.exp(b)[..., None]
    precision = lam / eb + 1 / ea  # of w | a, b, in the eigenbasis
    log_lik = -0.5 * (n * np.log(2 * np.pi) + n * b + np.sum(np.log1p(ea * lam / eb), -1)
                      + y @ y / eb[..., 0] - np.sum(Xy**2 / precision, -1) / eb[..., 0] ** 2)
    log_p = log_lik + _log_normal(a, 0.0, prior_var) + _log_normal(b, 0.0, prior_var)
    cell = (a[1, 0] - a[0, 0]) * (b[0, 1] - b[0, 0])
    log_z = np.log(np.sum(np.exp(log_p - log_p.max()))) + log_p.max() + np.log(cell)
    p = np.exp(log_p - log_p.max())
    p /= p.sum()
    mean_w = (Xy / precision) / eb  # E[w | a, b] in the eigenbasis
    out = dict(log_z=log_z, mean=U @ np.einsum("ij,ijk->k", p, mean_w),
               relevances=np.array([np.sum(p * np.exp(b)), np.sum(p * np.exp(a))]),
               hyper_mean=np.array([np.sum(p * b), np.sum(p * a)]))
    if X_test is not None:
        Z = X_test @ U
        m = np.einsum("tk,ijk->ijt", Z, mean_w)
        v = np.einsum("tk,ijk->ijt", Z**2, 1 / precision) + eb
        dens = np.einsum("ij,ijt->t", p, np.exp(_log_normal(y_test, m, v)))
        out["log_predictive"] = np.log(dens)
    return out


def test_common_scale_and_uncertain_noise_against_the_exact_grid_posterior():
    X, y = _data(n=40)
    X_test, y_test = _data(seed=5, n=8)
    model = vj.glm.hierarchical_linear(X[:30], y[:30], groups="common")
    post = _FIT(model)
    assert bool(post.diagnostics.converged) and post.diagnostics.stationarity <= 1e-6
    ref = _grid_posterior(X[:30], y[:30], X_test=X_test, y_test=y_test)
    # Stated tolerances: EP's factorised q(w)q(φ) is an approximation; on this problem its means are
    # within 3e-3 of the exact ones (posterior sds ≈ 0.1), E[e^φ] within 5%, log Z within 0.1.
    np.testing.assert_allclose(post.mean, ref["mean"], atol=5e-3)
    np.testing.assert_allclose(post.relevances(), ref["relevances"], rtol=0.05)
    np.testing.assert_allclose(post.hyper_mean, ref["hyper_mean"], atol=0.02)
    assert abs(float(post.log_z) - ref["log_z"]) < 0.1
    mean, var, lp = vj.glm.hierarchical_predict(post, X_test, y_test)
    np.testing.assert_allclose(lp, ref["log_predictive"], atol=0.05)  # seen: within 0.03
    assert mean.shape == var.shape == (8,) and np.all(var > post.relevances()[0])


def test_ard_relevances_and_float32():
    X, y = _data()
    model = vj.glm.hierarchical_linear(X, y, groups="ard")
    post = _FIT(model)
    assert bool(post.diagnostics.converged)
    # Irrelevant inputs (true weight 0) get smaller posterior scales than the relevant ones.
    rel = np.asarray(post.relevances()[1:])
    assert min(rel[0], rel[3]) > max(rel[1], rel[2], rel[4])
    model32 = vj.glm.hierarchical_linear(X.astype(np.float32), y.astype(np.float32), groups="ard")
    post32 = eqx.filter_jit(HierarchicalEP(tol=1e-4).fit)(model32)
    assert post32.mean.dtype == jnp.float32 and bool(post32.diagnostics.converged)
    np.testing.assert_allclose(post32.mean, post.mean, atol=1e-3)


def test_bad_input_is_refused():
    X, y = _data()
    with pytest.raises(ValueError, match="groups"):
        vj.glm.hierarchical_linear(X, y, groups="lasso")
    with pytest.raises(ValueError, match="D = 5"):
        vj.glm.hierarchical_linear(X, y, groups=np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="0..G-1"):
        vj.glm.hierarchical_linear(X, y, groups=np.array([0, 2, 2, 2, 0]))
    with pytest.raises(ValueError, match="HierarchicalModel"):
        HierarchicalEP().fit(vj.glm.linear_regression(X, y))
    with pytest.raises(ValueError, match="damping"):
        HierarchicalEP(damping=0.0)


@pytest.mark.slow
def test_ard_against_nuts():
    """Posterior means, E[φ] and relevances of an ARD model against 2 × 4000 NUTS draws (~1 min)."""
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    rng = np.random.default_rng(1)
    w = np.array([1.5, 0, 0, -1.0, 0.0, 0.5])
    X = rng.normal(size=(40, w.size))
    y = X @ w + 0.5 * rng.normal(size=40)
    post = HierarchicalEP().fit(vj.glm.hierarchical_linear(X, y, groups="ard"))

    def model(X, y):
        phi0 = numpyro.sample("phi0", dist.Normal(0.0, 2.0))
        phi = numpyro.sample("phi", dist.Normal(0.0, 2.0).expand([w.size]))
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([w.size]))  # non-centred: w = z e^{φ/2}
        weights = numpyro.deterministic("w", z * jnp.exp(0.5 * phi))
        numpyro.sample("y", dist.Normal(X @ weights, jnp.exp(0.5 * phi0)), obs=y)

    mcmc = MCMC(NUTS(model, target_accept_prob=0.95), num_warmup=1000, num_samples=4000, num_chains=2,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), X, y)
    s = {k: np.asarray(v) for k, v in mcmc.get_samples().items()}
    phi = np.concatenate([s["phi0"][:, None], s["phi"]], 1)
    # Stated tolerances (seen: means within 0.003, E φ within 0.05, relevances within 20%): the means
    # within 0.1 posterior sd, E φ within 0.15, E[e^φ] within 35% (heavy right tails make the MCMC
    # estimate of E[e^φ] itself uncertain by ~10%).
    np.testing.assert_array_less(np.abs(post.mean - s["w"].mean(0)), 0.1 * s["w"].std(0))
    np.testing.assert_allclose(post.hyper_mean, phi.mean(0), atol=0.15)
    np.testing.assert_allclose(post.relevances(), np.exp(phi).mean(0), rtol=0.35)
