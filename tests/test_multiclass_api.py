"""The multi-class GP API: one model (`vj.gp.multiclass.model`) fitted by nested EP and the softmax bounds
through `vj.infer`; posteriors record their model, so predictions take (post, X_test); nested EP reports a
scalar log_z and `vj.Diagnostics`; the fits compile once and reuse their programs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax.methods import ep as ep_module

mc = vj.gp.multiclass
KERNEL = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=3.0)

from helpers import gradient_and_difference, programs  # noqa: E402


def _three_class_data(rng, n):
    # the shapes of tests/test_gp_multiclass.py, so that the compiled programs are shared
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 2)) + 1.5 * np.eye(3)[y][:, :2]
    return X, y


@pytest.fixture(scope="module")
def nested():
    X, y = _three_class_data(np.random.default_rng(20261122), 24)
    model = mc.model(KERNEL, X, y, 3)
    return X, y, model, vj.infer(model, mc.NestedEP())


# ------------------------------------------------------------------------------ the model
def test_model_records_its_layout(nested):
    X, y, model, post = nested
    assert isinstance(model, mc.MulticlassModel) and model.num_classes == 3 and model.dim == 72
    assert len(model.kernels) == 3 and all(isinstance(k, vj.gp.kernels.SquaredExponential) for k in model.kernels)
    np.testing.assert_array_equal(np.asarray(model.X), X)
    np.testing.assert_array_equal(np.asarray(model.labels), y)
    assert isinstance(post.model, mc.MulticlassModel)
    np.testing.assert_array_equal(np.asarray(post.model.labels), y)
    # one kernel per class is accepted as given; a wrong count is refused
    other = vj.gp.kernels.SquaredExponential(lengthscale=2.0, variance=1.0)
    assert mc.model((KERNEL, other, KERNEL), X, y, 3).kernels[1] is not None
    assert mc.predict(post, X[:2])[0].shape == (2, 3)
    with pytest.raises(ValueError, match="3 of them"):
        mc.model((KERNEL, other), X, y, 3)


def test_methods_refuse_other_models(nested):
    X, y, model, post = nested
    binary = vj.gp.model(KERNEL, X, vj.potentials.Probit(), labels=(y == 0).astype(int))
    for method in (mc.NestedEP(), vj.gp.softmax.SoftmaxBound()):
        with pytest.raises(ValueError, match=r"vj.gp.multiclass.model\(kernel, X, labels, num_classes\)"):
            vj.infer(binary, method)
    with pytest.raises(ValueError, match="stick-breaking model is a vj.LatentLinearModel"):
        vj.infer(mc.stick_breaking_model(KERNEL, X, y, 3), mc.NestedEP())
    with pytest.raises(ValueError, match="NestedEP"):
        vj.infer(model, mc.NestedEP(), init=jnp.zeros(72))
    with pytest.raises(ValueError, match="must be None, a posterior of this model"):
        vj.infer(model, vj.gp.softmax.SoftmaxBound(), init={"not": "a state"})
    with pytest.raises(ValueError, match="its sites are not a function"):
        mc.NestedEP().from_gaussian(model, post.mean, post.factor)


# ------------------------------------------------------------------------------ nested EP
def test_nested_ep_log_z_and_diagnostics(nested):
    X, y, model, result = nested
    d = result.diagnostics
    assert isinstance(d, vj.Diagnostics) and d.method == "NestedEP" and d.solver == "parallel"
    assert isinstance(d.info, mc.NestedEPInfo) and 0 < float(d.info.damping) <= 0.7 and int(d.info.skipped) == 0
    assert jnp.shape(result.log_z) == () and np.isfinite(float(result.log_z))
    k = int(d.iterations)
    assert bool(d.converged) and 1 < k < 200
    assert float(d.stationarity) <= 1e-8
    assert int(d.num_value_evals) == k + 1 and int(d.num_grad_evals) == 1 and int(d.num_hvp_evals) == 0
    # the trace: energy after each outer iteration, log_z at the end, NaN-padded to max_iter + 1
    trace = np.asarray(d.objective_trace)
    assert trace.shape == (501,)
    assert np.all(np.isfinite(trace[:k + 1])) and np.all(np.isnan(trace[k + 1:]))
    assert trace[k] == float(result.log_z)
    assert trace[0] < trace[k] - 1.0  # the energy at zero sites is far below the fixed point's
    # grad_norm is max |∂ energy / ∂ active sites|, by autodiff of the public energy: O(tol) at the fixed point
    onehot = np.eye(3)[y]
    gradient = jax.jit(jax.grad(lambda t, n: mc.energy(mc.NestedEPState(t, n), model), argnums=(0, 1)))(
        result.state.tau, result.state.nu)
    expected = max(np.abs(np.asarray(g))[onehot == 0].max() for g in gradient)
    np.testing.assert_allclose(float(d.grad_norm), expected, rtol=1e-6, atol=1e-13)  # rounding at a 2e-8 gradient
    assert float(d.grad_norm) < 1e-6
    # the posterior is over the class-major f, and reads like any vj.Posterior
    assert result.mean.shape == (72,) and result.class_means.shape == (3, 24) and result.site_cov.shape == (24, 3, 3)
    np.testing.assert_allclose(np.asarray(result.class_means[:, 4]), np.asarray(result.mean)[[4, 28, 52]])
    assert "NestedEP (parallel): converged" in result.summary(max_rows=2)


def test_nested_ep_stopped_early_is_not_stationary(nested):
    X, y, model, result = nested
    early, built = programs(lambda: vj.infer(model, mc.NestedEP(tol=0.1)))  # tol is traced: the same program
    assert built == 0
    d = early.diagnostics
    assert bool(d.converged) and int(d.iterations) < int(result.diagnostics.iterations)
    assert 0.01 < float(d.stationarity) <= 0.1 and float(d.grad_norm) > 1e-2
    # the same iterations as the full run, so the traces agree where both are defined
    k = int(d.iterations)
    np.testing.assert_allclose(np.asarray(d.objective_trace[:k + 1]),
                               np.asarray(result.diagnostics.objective_trace[:k + 1]), rtol=1e-12)
    assert float(early.log_z) < float(result.log_z)
    # ... and a refit from it (post.state: the sites) continues to the same fixed point
    again = vj.infer(model, mc.NestedEP(), init=early)
    np.testing.assert_allclose(float(again.log_z), float(result.log_z), rtol=1e-10)
    assert int(again.diagnostics.iterations) < int(result.diagnostics.iterations)


def test_nested_ep_predictions(nested, stick):
    X, y, model, result = nested
    Xt = X[:5] + 0.3
    mean, cov = mc.predict(result, Xt)
    assert mean.shape == (5, 3) and cov.shape == (5, 3, 3)
    # at the training inputs the predictive is the posterior's own marginal (up to the jitter on K's diagonal)
    m_train, c_train = mc.predict(result, X[:2])
    np.testing.assert_allclose(np.asarray(m_train), np.asarray(result.class_means[:, :2]).T, atol=1e-5)
    np.testing.assert_allclose(np.asarray(c_train), np.asarray(result.site_cov[:2]), atol=1e-5)
    for rule in mc.RULES:
        p = mc.predict_proba(result, Xt, rule=rule)
        np.testing.assert_allclose(np.asarray(p).sum(1), 1.0, atol=1e-12)
    # the default rule is EP, and the two rules differ (but agree roughly)
    ep, quad = mc.predict_proba(result, Xt), mc.predict_proba(result, Xt, rule="quadrature")
    np.testing.assert_array_equal(np.asarray(ep), np.asarray(mc.predict_proba(result, Xt, rule="ep")))
    assert 0 < np.abs(np.asarray(ep) - np.asarray(quad)).max() < 0.1
    with pytest.raises(ValueError, match="NestedEPPosterior"):
        mc.predict(object(), X[:3])
    with pytest.raises(ValueError, match="NestedEPPosterior"):
        mc.predict(stick[3], X[:3])


def test_tilted_moments_iteration_cap():
    m0, V0 = np.array([0.3, -0.5, 0.8]), np.array([[1.0, 0.3, 0.1], [0.3, 0.8, 0.2], [0.1, 0.2, 1.2]])
    one = mc.tilted_moments(m0, V0, 1, max_iter=1)
    assert not bool(one[3]) and bool(mc.tilted_moments(m0, V0, 1)[3])  # the cap is respected
    with pytest.raises(ValueError, match="max_iter"):
        mc.NestedEP(max_iter=0)


# ------------------------------------------------------------------------------ the softmax bound
def test_softmax_bound_posterior_diagnostics_and_predictions(nested):
    X, y, model, nested_post = nested
    post = vj.infer(model, vj.gp.softmax.SoftmaxBound("log"))
    d = post.diagnostics
    assert isinstance(post, vj.Posterior) and post.is_lower_bound and np.ndim(post.log_z) == 0
    assert d.method == "SoftmaxBound" and bool(d.converged) and float(d.stationarity) <= 1e-9
    k = int(d.iterations)
    trace = np.asarray(d.objective_trace)
    assert trace.shape == (501,) and trace[k] == float(post.log_z) and np.all(np.isnan(trace[k + 1:]))
    assert np.all(np.diff(trace[:k + 1]) >= -1e-9 * np.abs(trace[1:k + 1]))  # the E-step never lowers the bound
    assert post.mean.shape == (72,) and post.covariance.shape == (72, 72)
    assert isinstance(post.state, vj.gp.softmax.SoftmaxState)
    probs = vj.gp.softmax.predict_proba(post, X[:4], key=jax.random.PRNGKey(0))
    assert isinstance(probs, jax.Array)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-12)
    mean, cov = vj.gp.softmax.predict(post, X[:2])
    np.testing.assert_allclose(np.asarray(mean), np.asarray(post.mean).reshape(3, 24)[:, :2].T, atol=1e-5)
    with pytest.raises(TypeError, match="key"):
        vj.gp.softmax.predict_proba(post, X[:4])
    with pytest.raises(ValueError, match="SoftmaxBound"):
        vj.gp.softmax.predict(nested_post, X[:2])
    # one model, two methods: the softmax fit starts from nested EP's posterior (converted) and reaches its optimum
    converted = vj.infer(model, vj.gp.softmax.SoftmaxBound("log"), init=nested_post)
    np.testing.assert_allclose(float(converted.log_z), float(post.log_z), rtol=1e-8)
    # the bound is differentiable in the kernel (envelope theorem): the derivative of refits
    build = lambda s: mc.model(vj.gp.kernels.SquaredExponential(lengthscale=jnp.exp(s), variance=3.0), X, y, 3)
    method = vj.gp.softmax.SoftmaxBound("log")
    eps = 1e-3
    grad, difference = gradient_and_difference(lambda s: vj.infer(build(s), method, init=post).log_z, 0.0, eps)
    np.testing.assert_allclose(grad, difference / eps, rtol=1e-4)


# ------------------------------------------------------------------------------ programs built and reused
def test_fits_compile_once_and_reuse_their_programs():
    """A cold vj.infer builds at most 2 programs (the start and the fit); a refit on new data of the same
    shapes (other kernel hyperparameters), a warm refit from the posterior and new settings build none."""
    rng = np.random.default_rng(5)
    X, y = rng.normal(size=(7, 2)), np.array([0, 1, 2, 0, 1, 2, 2])  # shapes no other test uses
    model = mc.model(KERNEL, X, y, 3)
    other = mc.model(vj.gp.kernels.SquaredExponential(lengthscale=0.7, variance=2.0), X + 0.1, y[::-1], 3)
    for method, retuned in ((mc.NestedEP(), mc.NestedEP(damping=0.5, tol=1e-6)),
                            (vj.gp.softmax.SoftmaxBound(), vj.gp.softmax.SoftmaxBound(tol=1e-7))):
        post, cold = programs(vj.infer, model, method)
        assert bool(post.diagnostics.converged)
        assert cold <= 2, f"{type(method).__name__}: a cold fit built {cold} programs"
        _, new_data = programs(vj.infer, other, method)
        again, warm = programs(lambda: vj.infer(model, method, init=post))
        _, settings = programs(vj.infer, model, retuned)
        assert (new_data, warm, settings) == (0, 0, 0), (type(method).__name__, new_data, warm, settings)
        # the warm refit restarts where the fit ended
        assert int(again.diagnostics.iterations) <= 2
        np.testing.assert_allclose(float(again.log_z), float(post.log_z), rtol=1e-10)


# ------------------------------------------------------------------------------ the shared EP maths
def test_nested_ep_site_update_is_the_ep_update(rng):
    # cavity → tilted moments → step: the new site makes cavity × site match the tilted moments,
    # i.e. τ + Δτ = 1/V̂ − 1/V₋ and ν + Δν = m̂/V̂ − m₋/V₋ (the form nested EP had before it shared EP's maths)
    m, V = rng.normal(size=6), rng.uniform(0.5, 2.0, 6)
    tau, nu = rng.uniform(0.0, 0.4, 6), rng.normal(size=6)
    m_c, V_c, proper = ep_module.cavity(m, V, tau, nu)
    assert np.all(np.asarray(proper))
    np.testing.assert_allclose(np.asarray(1 / V_c), 1 / V - tau, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(m_c / V_c), m / V - nu, rtol=1e-13, atol=1e-14)
    _, m_hat, V_hat = vj.potentials.Probit().tilted_moments(m_c, V_c)
    dtau, dnu = ep_module.site_step(m, V, m_hat, V_hat)
    np.testing.assert_allclose(np.asarray(tau + dtau), np.asarray(1 / V_hat - 1 / V_c), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(nu + dnu), np.asarray(m_hat / V_hat - m_c / V_c), rtol=1e-10)
    residual = ep_module.moment_residual(m, V, m_hat, V_hat)
    np.testing.assert_allclose(np.asarray(residual),
                               np.abs(np.asarray(m_hat) - m) / np.sqrt(V) + np.abs(np.log(np.asarray(V_hat) / V)))
    # nested EP's scalar update is exactly these, with the new sites kept where they are proper and finite
    up = mc.probit._scalar_update(jnp.asarray(m), jnp.asarray(V), jnp.asarray(tau), jnp.asarray(nu),
                                  jnp.arange(6) != 2)
    np.testing.assert_array_equal(np.asarray(up.tau)[[0, 1, 3, 4, 5]], np.asarray(tau + dtau)[[0, 1, 3, 4, 5]])
    assert float(up.tau[2]) == tau[2] and float(up.residual[2]) == 0.0
    # an improper cavity (1/V ≤ τ) is left alone
    m_c, V_c, proper = ep_module.cavity(0.0, 1.0, 2.0, 0.0)
    assert not bool(proper) and float(V_c) == 1.0


# ------------------------------------------------------------------------------ stick-breaking
@pytest.fixture(scope="module")
def stick():
    X, y = _three_class_data(np.random.default_rng(7), 9)
    model = mc.stick_breaking_model(KERNEL, X, y, 3, pieces=None, ordering=[2, 0, 1])
    return X, y, model, vj.infer(model, vj.Laplace())


def test_stick_model_records_its_layout(stick):
    X, y, model, post = stick
    assert isinstance(model, mc.StickBreakingModel) and isinstance(model, vj.LatentLinearModel)
    assert model.kernel is KERNEL and model.num_classes == 3 and model.ordering == (2, 0, 1)
    assert model.labels == tuple(y.tolist())
    np.testing.assert_array_equal(np.asarray(model.X), X)
    layout = model.layout
    # class 2 first: every input reaches stick 0; inputs of class 2 leave after it
    assert model.dim == 9 + int(np.sum(y != 2)) == layout.point.size
    np.testing.assert_array_equal(layout.sign[:9], np.where(y == 2, 1.0, -1.0))
    # the fit keeps the model's class and layout
    assert isinstance(post.model, mc.StickBreakingModel) and post.model.ordering == (2, 0, 1)


def test_stick_predictions(stick):
    X, y, model, post = stick
    Xt = X[:4] + 0.2
    mean, var = mc.stick_breaking_predict(post, Xt)
    assert mean.shape == var.shape == (4, 2)
    p = mc.stick_breaking_proba(post, Xt)
    np.testing.assert_allclose(np.asarray(p).sum(1), 1.0, atol=1e-12)
    # the layout is static, so prediction composes with jit
    np.testing.assert_allclose(np.asarray(jax.jit(mc.stick_breaking_proba)(post, Xt)), np.asarray(p), rtol=1e-12)
    with pytest.raises(ValueError, match="stick_breaking_model"):
        mc.stick_breaking_proba(vj.infer(vj.gp.model(KERNEL, X, vj.potentials.Logistic(), labels=y == 0),
                                         vj.Laplace()), X[:2])


def test_the_multiclass_models_share_the_label_checks():
    from vijax.gp import _layout

    with pytest.raises(ValueError, match="lie in 0"):
        _layout.class_labels([0, 3], 2, 3, "owner")
    for build in (mc.model, mc.stick_breaking_model):
        with pytest.raises(ValueError, match="lie in 0"):
            build(KERNEL, np.zeros((2, 1)), [0, 3], 3)
