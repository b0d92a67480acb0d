"""EP over hyperparameters (`vj.methods.ep_hyper`) and hierarchical sparse linear models (`vj.glm.hierarchical_linear`).

References: a 2-D grid for the tilted moments; ordinary EP (exact, conjugate) where q(φ) collapses to a
point; the exact posterior by a 2-D grid over (log scale, log noise) for a common-scale model; a long
NUTS run (slow) for ARD. Student-t likelihood with an uncertain scale: its tilted moments against a
2-D grid; the exact posterior of a one-weight model with outliers by a grid over (w, log scale²)
(the prior scale integrated per w); the Gaussian likelihood as ν → ∞. `vj.infer`'s contract on a
tiny model: programs built once (counted as in ``tests/test_execution.py``), warm refits and
conversions, jit, and the evidence's gradient against the conjugate closed form."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln

import vijax as vj
from vijax.methods.ep_hyper import (HierarchicalEP, HierarchicalPosterior, HierarchicalState, log_variance_tilted_moments,
                                    scale_tilted_moments)

from helpers import programs  # noqa: E402


def _FIT(model):
    return vj.infer(model, HierarchicalEP())  # compiled once per model structure and shape
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


def _log_student_t(y, x, nu, log_s2):
    r2 = (y - x) ** 2 / np.exp(log_s2)
    return (gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(np.pi * nu) - 0.5 * log_s2
            - 0.5 * (nu + 1) * np.log1p(r2 / nu))


_SCALE_MOMENTS = eqx.filter_jit(scale_tilted_moments)


@pytest.mark.parametrize("power", [1.0, 0.5])
def test_student_t_tilted_moments_match_a_2d_grid_and_the_gaussian_limit(power):
    loc, m, v, mu, s2, nu = 2.5, -0.3, 0.8, -0.5, 1.5, 3.0  # the site far in the cavity's tail: bimodal in x
    power = jnp.asarray(power)
    got = _SCALE_MOMENTS(vj.potentials.StudentT(nu, loc), m, v, mu, s2, power)
    x, phi = np.meshgrid(np.linspace(-10, 10, 2001), np.linspace(-14, 12, 1301), indexing="ij")
    log_p = float(power) * _log_student_t(loc, x, nu, phi) + _log_normal(x, m, v) + _log_normal(phi, mu, s2)
    p = np.exp(log_p)
    z = p.sum() * (x[1, 0] - x[0, 0]) * (phi[0, 1] - phi[0, 0])
    p /= p.sum()
    ex, ephi = np.sum(p * x), np.sum(p * phi)
    want = (np.log(z), ex, np.sum(p * x**2) - ex**2, ephi, np.sum(p * phi**2) - ephi**2)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-8, atol=1e-9)  # seen: within 5e-12
    # ν → ∞: the Gaussian site (differences O(1/ν); seen: 1.4e-7 at ν = 1e8, from the rule's rounding).
    big = _SCALE_MOMENTS(vj.potentials.StudentT(1e8, loc), m, v, mu, s2, power)
    np.testing.assert_allclose(np.array(big), np.array(log_variance_tilted_moments(loc, m, v, mu, s2, power)),
                               atol=1e-6)


def test_collapsed_hyperprior_recovers_ordinary_ep():
    X, y = _data()
    noise = np.log(0.25)
    model = vj.glm.hierarchical_linear(X, y, groups="common", scale_prior=(0.3, 1e-12), noise_prior=(noise, 1e-12))
    post = _FIT(model)
    assert bool(post.diagnostics.converged)
    ordinary = vj.infer(model.model, vj.EP())  # the same sites with every φ at its prior mean
    np.testing.assert_allclose(post.mean, ordinary.mean, atol=1e-10)
    np.testing.assert_allclose(post.covariance, ordinary.covariance, atol=1e-10)
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


def _student_t_grid_posterior(x, y, nu, X_test, y_test, prior=(0.0, 4.0)):
    """Exact posterior of y_n ~ St(x_n w, ν, e^b), w ~ N(0, e^a), a, b ~ N(prior): a grid over (w, b), with
    p(w) = ∫ N(w | 0, e^a) p(a) da and E[a | w], E[e^a | w] on a grid over a for every w."""
    w = np.linspace(-3, 4, 1401)
    b = np.linspace(-12, 6, 721)
    a = np.linspace(-20, 10, 1201)
    lp_wa = _log_normal(w[:, None], 0.0, np.exp(a)) + _log_normal(a, *prior)
    top = lp_wa.max(1, keepdims=True)
    pa = np.exp(lp_wa - top)
    log_pw = np.log(pa.sum(1) * (a[1] - a[0])) + top[:, 0]
    pa /= pa.sum(1, keepdims=True)
    log_j = sum(_log_student_t(y[n], x[n] * w[:, None], nu, b) for n in range(len(y))) + log_pw[:, None] \
        + _log_normal(b, *prior)
    top = log_j.max()
    p = np.exp(log_j - top)
    log_z = np.log(p.sum() * (w[1] - w[0]) * (b[1] - b[0])) + top
    p /= p.sum()
    pw, pb = p.sum(1), p.sum(0)
    mean = np.sum(pw * w)
    dens = [np.sum(p * np.exp(_log_student_t(yt, xt * w[:, None], nu, b))) for xt, yt in zip(X_test, y_test)]
    return dict(log_z=log_z, mean=mean, sd=np.sqrt(np.sum(pw * (w - mean) ** 2)),
                hyper_mean=np.array([np.sum(pb * b), np.sum(pw * (pa @ a))]),
                relevances=np.array([np.sum(pb * np.exp(b)), np.sum(pw * (pa @ np.exp(a)))]),
                log_predictive=np.log(dens))


def _outliers():
    rng = np.random.default_rng(3)
    x = rng.normal(size=24)
    y = 0.8 * x + 0.3 * rng.normal(size=24)
    y[[2, 11]] += [3.0, -2.5]  # two outliers
    return x, y


def test_student_t_likelihood_against_the_exact_grid_posterior():
    x, y = _outliers()
    X, Xt, yt = x[:20, None], x[20:, None], y[20:]
    post = _FIT(vj.glm.hierarchical_linear(X, y[:20], groups="common", df=4.0))
    assert bool(post.diagnostics.converged)
    ref = _student_t_grid_posterior(x[:20], y[:20], 4.0, x[20:], yt)
    # Stated tolerances (seen: mean within 0.006 sd, sd 6% low, E[e^b] 1.7%, E b 0.009, log Z 0.012,
    # log predictive 0.006): the mean within 0.1 posterior sd, the sd within 10% (EP's factorised q(w)q(b)
    # is narrower than p(w | y) here), E[e^b] within 5%, E b within 0.05, log Z within 0.1. The prior
    # scale, set by one weight, is EP's weak spot (seen: E a within 0.001 but E[e^a] 20% low, as with the
    # Gaussian likelihood: the Gaussian q(a) misses the right tail of p(a | y)); asserted within 0.1 and 30%.
    sd = float(np.sqrt(post.weights.covariance[0, 0]))
    assert abs(float(post.mean[0]) - ref["mean"]) < 0.1 * ref["sd"]
    np.testing.assert_allclose(sd, ref["sd"], rtol=0.1)
    np.testing.assert_allclose(post.relevances()[0], ref["relevances"][0], rtol=0.05)
    assert abs(float(post.hyper_mean[0]) - ref["hyper_mean"][0]) < 0.05
    assert abs(float(post.hyper_mean[1]) - ref["hyper_mean"][1]) < 0.1
    np.testing.assert_allclose(post.relevances()[1], ref["relevances"][1], rtol=0.3)
    assert abs(float(post.log_z) - ref["log_z"]) < 0.1
    _, var, lp = vj.glm.hierarchical_predict(post, Xt, yt)
    np.testing.assert_allclose(lp, ref["log_predictive"], atol=0.05)
    np.testing.assert_allclose(var, sd**2 * x[20:] ** 2 + 2.0 * np.exp(post.hyper_mean[0] + 0.5 * post.hyper_var[0]))


@pytest.mark.slow
def test_student_t_likelihood_tends_to_the_gaussian_one():
    """As ν → ∞ the Student-t fit is the Gaussian-likelihood fit (~20 s: a second compilation)."""
    x, y = _outliers()
    X = x[:20, None]
    post = _FIT(vj.glm.hierarchical_linear(X, y[:20], groups="common", df=4.0))  # ν an array leaf: compiled once
    big = _FIT(vj.glm.hierarchical_linear(X, y[:20], groups="common", df=1e8))
    gauss = _FIT(vj.glm.hierarchical_linear(X, y[:20], groups="common"))
    # The robust fit discounts the outliers: its noise scale is well below the Gaussian likelihood's.
    assert post.relevances()[0] < 0.5 * gauss.relevances()[0]
    # ν → ∞: the Gaussian likelihood's fit (differences O(1/ν) and the Student-t rule's ~1e-7).
    np.testing.assert_allclose(big.mean, gauss.mean, atol=1e-5)
    np.testing.assert_allclose(big.hyper_mean, gauss.hyper_mean, atol=1e-5)
    np.testing.assert_allclose(big.hyper_var, gauss.hyper_var, rtol=1e-5)
    np.testing.assert_allclose(big.log_z, gauss.log_z, atol=1e-5)


def test_ard_relevances_and_float32():
    X, y = _data()
    model = vj.glm.hierarchical_linear(X, y, groups="ard")
    post = _FIT(model)
    assert bool(post.diagnostics.converged)
    # Irrelevant inputs (true weight 0) get smaller posterior scales than the relevant ones.
    rel = np.asarray(post.relevances()[1:])
    assert min(rel[0], rel[3]) > max(rel[1], rel[2], rel[4])
    model32 = vj.glm.hierarchical_linear(X.astype(np.float32), y.astype(np.float32), groups="ard")
    post32 = vj.infer(model32, HierarchicalEP(tol=1e-4))
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
        vj.infer(vj.glm.linear_regression(X, y), HierarchicalEP())
    with pytest.raises(TypeError):  # fit takes a State: the old entry point fit(model) is gone
        HierarchicalEP().fit(vj.glm.hierarchical_linear(X, y))
    with pytest.raises(ValueError, match="vj.infer"):
        HierarchicalEP().fit(vj.glm.hierarchical_linear(X, y), None)
    with pytest.raises(ValueError, match="damping"):
        HierarchicalEP(damping=0.0)
    with pytest.raises(ValueError, match="df"):
        vj.glm.hierarchical_linear(X, y, df=-1.0)
    with pytest.raises(ValueError, match="StudentT"):
        vj.hierarchical.HierarchicalModel(vj.model.Sites(X, vj.potentials.Laplace(y)), 0, [0.0], [1.0])


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
    post = vj.infer(vj.glm.hierarchical_linear(X, y, groups="ard"), HierarchicalEP())

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


def _tiny(seed, noise=(-1.0, 4.0), scale=(0.0, 4.0)):
    # N = 9, D = 2: shapes no other test uses, so the counts start cold in this process.
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(9, 2))
    return vj.glm.hierarchical_linear(X, X @ np.array([1.0, -0.5]) + 0.3 * rng.normal(size=9), groups="common",
                                      noise_prior=noise, scale_prior=scale)


def test_infer_returns_a_posterior_and_reuses_its_programs():
    """A cold `vj.infer` builds at most 2 programs (start, fit); new data of the same shapes, a warm
    refit from the posterior and new settings build none; the refit ends at once, where the fit ended;
    other starts (another method's posterior, a point) reach the same fixed point; under jit, the same."""
    model, other = _tiny(0), _tiny(1)
    jax.block_until_ready(jnp.asarray(0.5))  # the process's one-off program that stages a Python float
    post, cold = programs(vj.infer, model, HierarchicalEP())
    assert cold <= 2, f"a cold fit built {cold} programs"
    assert isinstance(post, vj.Posterior) and isinstance(post, HierarchicalPosterior)
    assert isinstance(post.state, HierarchicalState) and isinstance(post.model, vj.HierarchicalModel)
    d = post.diagnostics
    assert bool(d.converged) and (d.method, d.solver) == ("HierarchicalEP", "parallel")
    assert d.objective_trace.shape == (501,) and float(d.objective_trace[int(d.iterations)]) == float(post.log_z)
    assert isinstance(d.info, vj.EPInfo) and int(d.info.skipped) == 0 and not post.is_lower_bound
    _, new_data = programs(vj.infer, other, HierarchicalEP())
    again, warm = programs(lambda: vj.infer(model, HierarchicalEP(), init=post))
    _, settings = programs(lambda: vj.infer(model, HierarchicalEP(tol=1e-8, damping=0.3, power=0.9)))
    assert (new_data, warm, settings) == (0, 0, 0), f"new data {new_data}, warm {warm}, settings {settings}"
    assert int(again.diagnostics.iterations) == 0
    np.testing.assert_array_equal(again.mean, post.mean)
    assert float(again.log_z) == float(post.log_z)
    # Other starts: a plain vj.Posterior of q(w) (as another method's), a point w (each one small conversion
    # program: every site's expansion at the mean, or at w).
    assert type(post.weights) is vj.Posterior
    for init in (post.weights, np.zeros(2)):
        converted = vj.infer(model, HierarchicalEP(tol=1e-9), init=init)
        np.testing.assert_allclose(converted.mean, post.mean, atol=1e-5)
        np.testing.assert_allclose(converted.hyper_mean, post.hyper_mean, atol=1e-5)
    # Inside jit: one program, the same numbers.
    jitted = jax.jit(lambda m: vj.infer(m, HierarchicalEP()))(model)
    np.testing.assert_allclose(jitted.mean, post.mean, atol=1e-12)
    np.testing.assert_allclose(jitted.log_z, post.log_z, rtol=1e-12)
    with pytest.raises(ValueError, match="point w of shape \\(2,\\)"):
        vj.infer(model, HierarchicalEP(), init=np.zeros(3))


@pytest.mark.slow  # ~9 s: the derivative programs of a fit
def test_log_z_gradient_is_the_conjugate_evidence_gradient():
    """With the hyperpriors collapsed to points, log Z_EP is the conjugate evidence
    log N(y | 0, σ²I + e^a XXᵀ), and its gradient in y (the envelope theorem at frozen sites) is −C⁻¹y."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(9, 2))
    y = X @ np.array([1.0, -0.5]) + 0.3 * rng.normal(size=9)
    build = lambda y: vj.glm.hierarchical_linear(X, y, groups="common", noise_prior=(np.log(0.25), 1e-12),
                                                 scale_prior=(0.3, 1e-12))
    grad = jax.grad(lambda y: vj.infer(build(y), HierarchicalEP(tol=1e-9)).log_z)(jnp.asarray(y))
    C = 0.25 * np.eye(9) + np.exp(0.3) * X @ X.T
    np.testing.assert_allclose(grad, -np.linalg.solve(C, y), atol=1e-7)
