"""The multi-class GP API: fits record their layout, predictions take (fit, X_test), nested EP reports a
scalar log_z and `vj.Diagnostics`, and the deprecated call forms still give the same numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax.methods import ep as ep_module

mc = vj.gp.multiclass
KERNEL = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=3.0)


def _three_class_data(rng, n):
    # the shapes of tests/test_gp_multiclass.py, so that the compiled programs are shared
    y = np.arange(n) % 3
    X = rng.normal(size=(n, 2)) + 1.5 * np.eye(3)[y][:, :2]
    return X, y


@pytest.fixture(scope="module")
def nested():
    X, y = _three_class_data(np.random.default_rng(20261122), 24)
    return X, y, mc.nested_ep(KERNEL, X, y, 3)


# ------------------------------------------------------------------------------ nested EP
def test_nested_ep_records_its_layout(nested):
    X, y, result = nested
    assert result.kernels == (KERNEL,) * 3 and result.num_classes == 3
    np.testing.assert_array_equal(np.asarray(result.X), X)
    np.testing.assert_array_equal(np.asarray(result.labels), y)
    # one kernel per class is recorded as given
    other = vj.gp.kernels.SquaredExponential(lengthscale=2.0, variance=1.0)
    assert mc.predict(result, X[:2])[0].shape == (2, 3)
    with pytest.raises(ValueError, match="3 of them"):
        mc.nested_ep((KERNEL, other), X, y, 3)


def test_nested_ep_log_z_and_diagnostics(nested):
    X, y, result = nested
    d = result.diagnostics
    assert isinstance(d, vj.Diagnostics) and d.method == "NestedEP" and d.solver == "parallel"
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
    gradient = jax.grad(lambda t, n: mc.nested_ep_log_z(result.prior_cov, y, t, n), argnums=(0, 1))(result.tau,
                                                                                                     result.nu)
    expected = max(np.abs(np.asarray(g))[onehot == 0].max() for g in gradient)
    np.testing.assert_allclose(float(d.grad_norm), expected, rtol=1e-6, atol=1e-13)  # rounding at a 2e-8 gradient
    assert float(d.grad_norm) < 1e-6


def test_nested_ep_stopped_early_is_not_stationary(nested):
    X, y, result = nested
    early = mc.nested_ep(KERNEL, X, y, 3, tol=0.1)  # tol is traced: the same compiled loop
    d = early.diagnostics
    assert bool(d.converged) and int(d.iterations) < int(result.diagnostics.iterations)
    assert 0.01 < float(d.stationarity) <= 0.1 and float(d.grad_norm) > 1e-2
    # the same iterations as the full run, so the traces agree where both are defined
    k = int(d.iterations)
    np.testing.assert_allclose(np.asarray(d.objective_trace[:k + 1]),
                               np.asarray(result.diagnostics.objective_trace[:k + 1]), rtol=1e-12)
    assert float(early.log_z) < float(result.log_z)


def test_nested_ep_predictions_new_form_equals_old(nested):
    X, y, result = nested
    Xt = X[:5] + 0.3
    mean, cov = mc.predict(result, Xt)
    assert mean.shape == (5, 3) and cov.shape == (5, 3, 3)
    with pytest.warns(DeprecationWarning, match="predict"):
        old_mean, old_cov = mc.predict(result, KERNEL, X, Xt)
    np.testing.assert_array_equal(np.asarray(old_mean), np.asarray(mean))
    np.testing.assert_array_equal(np.asarray(old_cov), np.asarray(cov))
    for rule in mc.RULES:
        p = mc.predict_proba(result, Xt, rule=rule)
        with pytest.warns(DeprecationWarning):
            old = mc.predict_proba(result, KERNEL, X, Xt, method=rule)
        np.testing.assert_array_equal(np.asarray(old), np.asarray(p))
        with pytest.warns(DeprecationWarning, match="`method` is deprecated"):
            old = mc.predict_proba(result, Xt, method=rule)
        np.testing.assert_array_equal(np.asarray(old), np.asarray(p))
    with pytest.warns(DeprecationWarning):  # the old positional form, method fifth
        old = mc.predict_proba(result, KERNEL, X, Xt, "quadrature")
    np.testing.assert_array_equal(np.asarray(old), np.asarray(mc.predict_proba(result, Xt, rule="quadrature")))
    # the default rule is EP, and the two rules differ (but agree roughly)
    ep, quad = mc.predict_proba(result, Xt), mc.predict_proba(result, Xt, rule="quadrature")
    np.testing.assert_array_equal(np.asarray(ep), np.asarray(mc.predict_proba(result, Xt, rule="ep")))
    assert 0 < np.abs(np.asarray(ep) - np.asarray(quad)).max() < 0.1


def test_nested_ep_old_form_with_another_kernel_or_X_is_refused(nested):
    X, y, result = nested
    other = vj.gp.kernels.SquaredExponential(lengthscale=2.0, variance=3.0)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="differ"):
        mc.predict(result, other, X, X[:3])
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="differ"):
        mc.predict_proba(result, KERNEL, X + 1.0, X[:3])
    with pytest.raises(ValueError, match="X_test"):
        mc.predict(result, KERNEL, X)
    with pytest.raises(ValueError, match="NestedEPResult"):
        mc.predict(object(), X[:3])


def test_nested_ep_deprecated_names(nested):
    X, y, result = nested
    d = result.diagnostics
    for old, new in (("iterations", d.iterations), ("converged", d.converged), ("residual", d.stationarity)):
        with pytest.warns(DeprecationWarning, match=old):
            assert getattr(result, old) == new
    m0, V0 = np.array([0.3, -0.5, 0.8]), np.array([[1.0, 0.3, 0.1], [0.3, 0.8, 0.2], [0.1, 0.2, 1.2]])
    new = mc.tilted_moments(m0, V0, 1, max_iter=3)
    with pytest.warns(DeprecationWarning, match="max_sweeps"):
        old = mc.tilted_moments(m0, V0, 1, max_sweeps=3)
    for a, b in zip(new, old):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    one = mc.tilted_moments(m0, V0, 1, max_iter=1)
    assert not bool(one[3]) and bool(mc.tilted_moments(m0, V0, 1)[3])  # the cap is respected
    with pytest.raises(ValueError, match="max_iter"):
        mc.nested_ep(KERNEL, X, y, 3, max_iter=0)


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


def test_stick_predictions_new_form_equals_old(stick):
    X, y, model, post = stick
    Xt = X[:4] + 0.2
    mean, var = mc.stick_breaking_predict(post, Xt)
    assert mean.shape == var.shape == (4, 2)
    with pytest.warns(DeprecationWarning, match="stick_breaking_predict"):
        old_mean, old_var = mc.stick_breaking_predict(post, KERNEL, X, Xt, y, 3, ordering=[2, 0, 1])
    np.testing.assert_array_equal(np.asarray(old_mean), np.asarray(mean))
    np.testing.assert_array_equal(np.asarray(old_var), np.asarray(var))
    p = mc.stick_breaking_proba(post, Xt)
    np.testing.assert_allclose(np.asarray(p).sum(1), 1.0, atol=1e-12)
    with pytest.warns(DeprecationWarning, match="stick_breaking_proba"):
        old = mc.stick_breaking_proba(post, KERNEL, X, Xt, y, 3, [2, 0, 1])
    np.testing.assert_array_equal(np.asarray(old), np.asarray(p))
    # the layout is static, so prediction composes with jit
    np.testing.assert_allclose(np.asarray(jax.jit(mc.stick_breaking_proba)(post, Xt)), np.asarray(p), rtol=1e-12)


def test_stick_old_form_must_match_the_model(stick, rng):
    X, y, model, post = stick
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="differ"):
        mc.stick_breaking_predict(post, KERNEL, X, X[:2], y, 3)  # default ordering, not the model's
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="differ"):
        mc.stick_breaking_proba(post, KERNEL, X, X[:2], (y + 1) % 3, 3, [2, 0, 1])
    with pytest.raises(ValueError, match="stick_breaking_model"):
        mc.stick_breaking_proba(vj.infer(vj.gp.model(KERNEL, X, vj.potentials.Logistic(), labels=y == 0),
                                         vj.Laplace()), X[:2])
    with pytest.raises(ValueError, match=r"stick_breaking_predict\(post, X_test\)"):
        mc.stick_breaking_predict(post, X[:2], y)


def test_softmax_uses_the_shared_layout():
    from vijax.gp import _layout, softmax

    assert softmax._kernels is _layout.class_kernels and softmax._labels is _layout.class_labels
    assert softmax._prior_covariances is _layout.class_prior_covariances
    with pytest.raises(ValueError, match="lie in 0"):
        _layout.class_labels([0, 3], 2, 3, "owner")
