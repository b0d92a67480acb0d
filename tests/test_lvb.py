"""Local variational bounds: the bound orderings of thesis §4.4.1 and Khan Thm 4.6.1, site-bound
validity, monotone fixed-point steps, the stopping rule, errors.

Exactness on conjugate models (and mean field as diagonal G-KL there), jit/vmap/grad, float32, warm
starts and evidence gradients are checked for every method in test_methods.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj

from helpers import logistic_data

TIGHT_GKL = vj.GKL(solver=vj.solvers.NewtonCG(tol=1e-9, max_iter=200))


def _sparse_regression(rng, n=30, d=8, scale=0.3):
    """Gaussian likelihood sites and Laplace-prior sites on the coordinates; no Gaussian factor."""
    X = rng.normal(size=(n, d))
    w = np.where(rng.random(d) < 0.4, rng.laplace(size=d), 0.0)
    y = X @ w + 0.5 * rng.normal(size=n)
    return vj.LatentLinearModel(None, (vj.Sites(X, vj.potentials.Gaussian(y, 0.5)),
                                       vj.Sites(vj.Identity(d), vj.potentials.Laplace(0.0, scale))))


def _relaxed_gkl(xi, model, bound):
    """The G-KL bound at q_ξ with every site replaced by its local bound, in NumPy (thesis §4.4.1)."""
    mean, factor = vj.lvb.gaussian(xi, model, bound)
    m, S = np.asarray(mean), np.asarray(factor.dense())
    d = m.shape[0]
    value = 0.5 * np.linalg.slogdet(2 * np.pi * np.e * S)[1]
    if model.prior is not None:
        v = float(model.prior.variance)
        value += -0.5 * (d * np.log(2 * np.pi * v) + (m @ m + np.trace(S)) / v)
    for group, x in zip(model.sites, xi):
        H = np.asarray(group.projection.mv(jnp.eye(d)))
        mu, var = H @ m, np.einsum("nd,de,ne->n", H, S, H)
        a, A, c = (np.broadcast_to(np.asarray(t), mu.shape)
                   for t in vj.lvb.local_bound(group.potential, bound).quadratic(x))
        value += np.sum(a * mu - 0.5 * A * (mu**2 + var) + c)
    return value


def _xi_from(post, model, bound="jaakkola"):
    """ξ from a posterior's marginals: the fixed point ξ* for an LVB posterior."""
    return vj.LVB(bound=bound).from_gaussian(model, post.mean, post.factor).xi


def _assert_monotone(post):
    trace = np.asarray(post.diagnostics.objective_trace)
    trace = trace[np.isfinite(trace)]
    # One entry per accepted iterate (the last the returned one): at most one per point evaluated.
    assert 2 <= trace.size <= int(post.diagnostics.iterations)
    assert np.all(np.diff(trace) >= -1e-12 * np.abs(trace[1:]))
    np.testing.assert_allclose(trace[-1], post.log_z, rtol=1e-12)


# ------------------------------------------------------------------------------ orderings (§4.4.1)


@pytest.fixture(scope="module")
def logistic():
    X, y = logistic_data(np.random.default_rng(7), 60, 5)
    model = vj.glm.logistic_regression(X, y, prior_variance=2.0)
    fits = {bound: vj.infer(model, vj.LVB(bound=bound)) for bound in ("jaakkola", "bohning")}
    return model, vj.infer(model, TIGHT_GKL), fits


@pytest.mark.parametrize("bound", ["jaakkola", "bohning"])
def test_gkl_dominates_lvb_on_logistic_regression(logistic, bound):
    model, gkl, fits = logistic
    post = fits[bound]
    assert bool(post.diagnostics.converged) and post.diagnostics.grad_norm < 1e-5
    _assert_monotone(post)
    at_lvb = vj.gkl.bound_at(post, model)
    assert float(gkl.log_z) >= float(at_lvb) >= float(post.log_z)

    rng = np.random.default_rng(3)
    xi = (jnp.asarray(rng.uniform(-3.0, 3.0, size=model.sites[0].num_sites)),)
    value = vj.lvb.bound(xi, model, bound)
    mean, factor = vj.lvb.gaussian(xi, model, bound)
    assert float(gkl.log_z) >= float(vj.gkl.bound_at(mean, factor, model)) >= float(value)
    assert float(vj.gkl.bound_at(mean, factor.dense(), model)) >= float(value)
    assert float(post.log_z) >= float(value)
    # B_LVB(ξ) = max_q of the relaxed G-KL bound, attained at q_ξ: checks the log-det constant.
    np.testing.assert_allclose(_relaxed_gkl(xi, model, bound), value, rtol=1e-10)
    # One fixed-point step never lowers the bound.
    assert float(vj.lvb.bound(vj.lvb.update(xi, model, bound), model, bound)) >= float(value)


def test_jaakkola_dominates_bohning(logistic):
    _, _, fits = logistic
    assert float(fits["jaakkola"].log_z) > float(fits["bohning"].log_z)

    jaakkola, bohning = vj.lvb.Jaakkola(), vj.lvb.Bohning()
    x = jnp.linspace(-30.0, 30.0, 1201)[:, None]
    t = jnp.concatenate([jnp.linspace(-12.0, 12.0, 97), jnp.array([1e-9, 1e-5, -1e-3])])[None, :]
    # Khan Thm 4.6.1: for every Gaussian marginal N(m, v) the optimal expected Jaakkola bound
    # (ξ² = m² + v) is at least the optimal expected Böhning bound (ψ = m).
    m = jnp.linspace(-20.0, 20.0, 161)[:, None]
    v = jnp.logspace(-4, 3, 57)[None, :]

    @jax.jit
    def quantities(x, t, m, v):  # one program, not one per primitive
        def expected(site, xi):
            a, A, c = site.quadratic(xi)
            return a * m - 0.5 * A * (m**2 + v) + c

        best_jaakkola = expected(jaakkola, jaakkola.update(m, v))
        mb, vb = jnp.broadcast_arrays(m, v)
        return (jax.nn.log_sigmoid(x), jaakkola(x, t), bohning(x, t), jaakkola(t, t), bohning(t, t),
                jax.nn.log_sigmoid(t), best_jaakkola - expected(bohning, bohning.update(m, v)),
                best_jaakkola - vj.potentials.Logistic().expected_log_phi(mb, jnp.sqrt(vb)))

    exact, j, b, j_at_t, b_at_t, exact_at_t, gap, above_exact = quantities(x, t, m, v)
    assert float(jnp.max(j - exact)) <= 1e-12 and float(jnp.max(b - exact)) <= 1e-12
    np.testing.assert_allclose(j_at_t, exact_at_t, atol=1e-12)
    np.testing.assert_allclose(b_at_t, exact_at_t, atol=1e-12)
    # Both tangent to log σ at x₀, Jaakkola with the smaller curvature 2λ(x₀) ≤ ¼: it lies above.
    assert float(jnp.min(j - b)) >= -1e-12
    assert float(jnp.min(gap)) >= -1e-10
    assert float(jnp.max(above_exact)) <= 1e-9


@pytest.mark.parametrize("potential, curvature", [
    (vj.potentials.Laplace(1.5, 0.7), lambda xi: 1 / (0.7 * np.abs(xi))),
    (vj.potentials.StudentT(3.0, 1.5, 0.7), lambda xi: 4.0 / (3.0 * 0.49 + xi**2)),
    (vj.potentials.Cauchy(1.5, 0.7), lambda xi: 2.0 / (0.49 + xi**2)),
])
def test_super_gaussian_site_bounds(potential, curvature):
    site = vj.lvb.local_bound(potential)
    x = jnp.linspace(-25.0, 25.0, 2001)[:, None]
    xi = jnp.concatenate([jnp.linspace(-8.0, 8.0, 64), jnp.array([1e-6, 1e-3, 30.0])])[None, :]
    assert float(jnp.max(site(x, xi) - potential.log_phi(x))) <= 1e-12
    np.testing.assert_allclose(site(1.5 + xi, xi), potential.log_phi(1.5 + xi), atol=1e-10)
    np.testing.assert_allclose(site(1.5 - xi, xi), potential.log_phi(1.5 - xi), atol=1e-10)
    np.testing.assert_allclose(site.quadratic(xi)[1], curvature(np.asarray(xi)), rtol=1e-10)


@pytest.fixture(scope="module")
def sparse():
    model = _sparse_regression(np.random.default_rng(11))
    return model, vj.infer(model, TIGHT_GKL), vj.infer(model, vj.LVB())


def test_gkl_dominates_lvb_on_laplace_prior_regression(sparse):
    model, gkl, post = sparse
    assert bool(post.diagnostics.converged) and bool(gkl.diagnostics.converged)
    _assert_monotone(post)
    assert float(gkl.log_z) >= float(vj.gkl.bound_at(post, model)) >= float(post.log_z)
    rng = np.random.default_rng(5)
    xi = (None, jnp.asarray(rng.uniform(0.05, 2.0, size=model.dim)))
    value = vj.lvb.bound(xi, model)
    mean, factor = vj.lvb.gaussian(xi, model)
    assert float(post.log_z) >= float(vj.gkl.bound_at(mean, factor, model)) >= float(value)
    assert float(gkl.log_z) >= float(vj.gkl.bound_at(mean, factor, model))
    np.testing.assert_allclose(_relaxed_gkl(xi, model, "jaakkola"), value, rtol=1e-10)


def test_stops_where_the_bound_is_flat_below_its_rounding():
    """A GP with a nearly singular prior (white noise 1e-8): B_LVB carries rounding noise of ~1e-9, so
    steps never change it by less than tol = 1e-12 relative; the run ends on the ξ test instead, at
    the EM fixed point (checked against 300 plain EM steps)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=30)
    y = 0.3 + 0.4 * x + 0.5 * np.sin(2.7 * x) + 1.1 / (1 + x**2) + np.where(rng.uniform(size=30) < 0.1, 1.0, 0.1) * rng.normal(size=30)
    kernel = vj.gp.kernels.SquaredExponential(1.0, 4.0) + vj.gp.kernels.White(1e-8)
    model = vj.gp.model(kernel, x[:, None], vj.potentials.StudentT(3.0, y, 0.1))
    post = vj.infer(model, vj.LVB())
    d = post.diagnostics
    assert bool(d.converged) and int(d.iterations) < 50
    xi = jax.jit(lambda xi: jax.lax.fori_loop(0, 300, lambda _, xi: vj.lvb.update(xi, model), xi))(
        vj.LVB().start(model).xi)
    np.testing.assert_allclose(post.log_z, vj.lvb.bound(xi, model), rtol=1e-10)
    mean, factor = vj.lvb.gaussian(xi, model)
    np.testing.assert_allclose(post.mean, mean, atol=1e-5)
    np.testing.assert_allclose(post.covariance, factor.dense(), atol=1e-5)


# --------------------------------------------------------------------------- the bound under jit


def test_jitted_bound_at_the_fixed_point_is_log_z(logistic):
    model, _, fits = logistic
    post = fits["jaakkola"]
    np.testing.assert_allclose(jax.jit(vj.lvb.bound)(_xi_from(post, model), model), post.log_z, rtol=1e-9)


# ------------------------------------------------------------------------------------------ errors


def test_unsupported_potentials_and_singular_precision(rng):
    X, y = logistic_data(rng, n=10, d=3)
    for model in (vj.glm.probit_regression(X, y), vj.glm.poisson_regression(X, np.round(3 * y)),
                  vj.LatentLinearModel(None, vj.Sites(X, vj.potentials.Custom(jnp.tanh, super_gaussian=True)))):
        with pytest.raises(ValueError, match="no local variational bound.*Logistic"):
            vj.infer(model, vj.LVB())
    with pytest.raises(ValueError, match="bound"):
        vj.LVB(bound="quadratic")
    # Without a Gaussian factor, two logistic sites cannot make P = Σ A_n h_n h_nᵀ positive definite.
    model = vj.LatentLinearModel(None, vj.Sites(X[:2], vj.potentials.Logistic()))
    with pytest.warns(vj.ConvergenceWarning, match="log Z is nan"):
        post = vj.infer(model, vj.LVB())
    assert np.isnan(float(post.log_z)) and not bool(post.diagnostics.converged)
