"""Properties every method shares, over the methods × models registry (`registry.py`):

- exactness on conjugate models (q and log Z equal the closed form; MAP: the mode; diagonal
  families: the exact mean, variances 1/diag(precision) and a strict bound);
- `jit`, `vmap` and `grad` compose with `vj.infer`, and float32 data stay in float32;
- a warm start from a method's own answer reaches it again at once;
- the evidence gradient (envelope theorem) equals finite differences of refitted log Z.

Method-specific checks stay in the per-method files (test_gkl.py, test_ep.py, ...)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj

from helpers import gradient_and_difference, logistic_data
from registry import GRADIENT_PAIRS, HYPERS, METHODS, MODELS, PAIRS


@functools.cache
def _model(name):
    return MODELS[name].build()


@functools.cache
def _fit(method, model):
    return vj.infer(_model(model)[0], METHODS[method].make())


def _param(pair):
    marks = [pytest.mark.slow] if pair.slow else []
    return pytest.param(pair, id=f"{pair.method}-{pair.model}", marks=marks)


# ------------------------------------------------------------------------------------------ exactness


@pytest.mark.parametrize("pair", [_param(p) for p in PAIRS])
def test_exact_on_conjugate_models(pair):
    model, (mean, S, log_z) = _model(pair.model)
    spec = METHODS[pair.method]
    post = _fit(pair.method, pair.model)
    tol_z, tol_m, tol_s = spec.tols
    assert bool(post.diagnostics.converged)
    assert post.diagnostics.method == type(spec.make()).__name__
    assert post.is_lower_bound is spec.is_lower_bound
    np.testing.assert_allclose(post.mean, mean, atol=tol_m)
    if pair.expect == "diagonal":
        np.testing.assert_allclose(np.diag(post.covariance), 1 / np.diag(np.linalg.inv(S)), atol=tol_s)
        np.testing.assert_array_equal(post.covariance, np.diag(np.diag(post.covariance)))
        assert float(post.log_z) < log_z - 1e-3  # a strict bound: correlations are lost
        return
    np.testing.assert_allclose(post.covariance, S, atol=tol_s)
    if pair.expect == "mode":  # MAP's log Z is the log joint at the mode
        np.testing.assert_allclose(post.log_z, model.log_joint(jnp.asarray(mean)), atol=tol_z)
    else:
        np.testing.assert_allclose(post.log_z, log_z, rtol=0, atol=tol_z)


def test_mean_field_is_diagonal_gkl_and_the_gkl_bound_is_tight_at_the_posterior():
    model, (mean, S, log_z) = _model("conjugate_offset")
    mf, diag = _fit("meanfield", "conjugate_offset"), _fit("gkl_diagonal", "conjugate_offset")
    assert mf.diagnostics.method == "MeanField"
    for field in ("mean", "log_z", "covariance"):
        np.testing.assert_allclose(getattr(mf, field), getattr(diag, field), rtol=1e-12, atol=1e-14)
    # The G-KL bound at the exact posterior is log Z.
    np.testing.assert_allclose(vj.gkl.bound_at(jnp.asarray(mean), jnp.asarray(S), model), log_z, rtol=1e-10)


# ------------------------------------------------------------------------------------------ transformations

# (method, rtol of log Z, of the mean, of the evidence gradient): batched fits against single ones.
# EP's vmap of grad compiles the longest (about 60 CPU seconds): in the default suite EP checks
# jit and vmap only (grad_rtol None), and the slow suite adds the gradient; MAP checks jit and vmap.
COMPOSE = [
    pytest.param("gkl", 1e-10, 1e-7, 1e-8, marks=pytest.mark.slow),
    pytest.param("laplace", 1e-10, 1e-9, 1e-8),
    pytest.param("map", 1e-10, 1e-9, None),  # MAP's log Z is Laplace's mode term: its gradient is Laplace's check
    pytest.param("lvb", 1e-9, 1e-7, 1e-8),
    pytest.param("ep", 1e-10, 1e-7, None, id="ep-no-grad"),
    pytest.param("ep", 1e-10, 1e-7, 1e-8, marks=pytest.mark.slow),
]


@functools.cache
def _datasets():
    """Three logistic-regression data sets of one shape (30, 3), stacked: Xs (3, 30, 3), ys (3, 30)."""
    rng = np.random.default_rng(6)
    data = [logistic_data(rng, 30, 3) for _ in range(3)]
    return tuple(np.stack(a) for a in zip(*data))


@pytest.mark.parametrize("name, rtol, mean_rtol, grad_rtol", COMPOSE)
def test_jit_vmap_and_grad_compose(name, rtol, mean_rtol, grad_rtol):
    Xs, ys = _datasets()
    method = METHODS[name].default()

    def fit(X, y, log_var):
        post = vj.infer(vj.glm.logistic_regression(X, y, prior_variance=jnp.exp(log_var)), method)
        return post.log_z, post.mean

    batched_z, batched_m = jax.jit(jax.vmap(fit, in_axes=(0, 0, None)))(Xs, ys, 0.0)
    for k in range(3):
        z, m = fit(Xs[k], ys[k], 0.0)
        np.testing.assert_allclose(batched_z[k], z, rtol=rtol)
        np.testing.assert_allclose(batched_m[k], m, rtol=mean_rtol, atol=1e-9)
    if grad_rtol is None:
        return
    log_z = lambda X, y, t: fit(X, y, t)[0]
    grads = jax.jit(jax.vmap(jax.grad(log_z, argnums=2), in_axes=(0, 0, None)))(Xs, ys, 0.0)
    assert grads.shape == (3,)
    np.testing.assert_allclose(grads[1], jax.grad(log_z, argnums=2)(Xs[1], ys[1], 0.0), rtol=grad_rtol)


# (method, its settings for float32, rtol of log Z against the float64 fit)
FLOAT32 = [("lvb", vj.LVB, 1e-5), ("ep", vj.EP, 1e-4)]  # defaults: EP stops at its float32 rounding floor


@pytest.mark.parametrize("name, make, rtol", FLOAT32, ids=[c[0] for c in FLOAT32])
def test_float32_data_give_a_float32_fit(name, make, rtol):
    """The prior's float64 parameters do not promote a float32 fit."""
    Xs, ys = _datasets()
    ref = vj.infer(vj.glm.logistic_regression(Xs[0], ys[0]), METHODS[name].default())
    single = vj.infer(vj.glm.logistic_regression(np.float32(Xs[0]), np.float32(ys[0])), make())
    assert single.log_z.dtype == single.mean.dtype == jnp.float32
    assert bool(single.diagnostics.converged)
    np.testing.assert_allclose(single.log_z, ref.log_z, rtol=rtol)


# ------------------------------------------------------------------------------------------ warm starts


@pytest.mark.parametrize("name", [pytest.param("gkl", marks=pytest.mark.slow), "laplace", "lvb",
                                  pytest.param("ep", marks=pytest.mark.slow)])
def test_warm_start_from_its_own_answer(name):
    spec = METHODS[name]
    model = _model("logistic")[0]
    post = _fit(name, "logistic")
    again = vj.infer(model, (spec.warm or spec.make)(), init=post)
    assert int(again.diagnostics.iterations) <= spec.warm_iterations
    np.testing.assert_allclose(again.log_z, post.log_z, rtol=spec.warm_rtol, atol=0)
    if name == "gkl":  # a posterior of another family warm-starts through its dense covariance
        diag = vj.infer(model, vj.GKL(covariance=vj.covariance.Diagonal()), init=post)
        assert bool(diag.diagnostics.converged)


# ------------------------------------------------------------------------------------------ evidence gradients


@pytest.mark.parametrize("name, hyper", [pytest.param(m, h, marks=[pytest.mark.slow] if slow else [], id=f"{m}-{h}")
                                         for m, h, slow in GRADIENT_PAIRS])
def test_log_z_gradient_matches_refitted_finite_differences(name, hyper):
    """d log Z/dθ at the stop-gradient optimum (envelope theorem; EP at frozen sites) equals central
    differences of log Z refitted at θ ± h; where log Z is known in closed form, its derivative too."""
    spec = METHODS[name]
    build, exact = HYPERS[hyper]
    method = spec.gradient()
    log_z = lambda t: vj.infer(build(t), method).log_z
    theta, h = 0.2, 1e-4
    grad, difference = gradient_and_difference(log_z, theta, h)
    fd = float(difference) / h
    np.testing.assert_allclose(grad, fd, rtol=spec.gradient_rtol, atol=1e-7)
    if exact is not None:
        np.testing.assert_allclose(grad, (exact(theta + h) - exact(theta - h)) / (2 * h), rtol=1e-6)
