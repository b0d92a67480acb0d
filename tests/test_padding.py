"""Padded site groups (`vj.pad_sites`, `vj.potentials.Masked`): exact, and compiled once per padded size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse
from scipy.special import expit

import vijax as vj

SIZE = 24  # the padded number of sites; the models below have 17 … 20


def _logistic(rng, n=20, d=3):
    X = rng.normal(size=(n, d))
    y = (rng.random(n) < expit(X @ np.array([1.0, -0.5, 0.8][:d]))).astype(float)
    return vj.glm.logistic_regression(X, y, prior_variance=2.0)


def _poisson(rng, n=20, d=3):
    X = 0.5 * rng.normal(size=(n, d))
    offset = 0.3 * rng.normal(size=n)  # per-site offsets, padded along with the counts
    counts = rng.poisson(np.exp(X @ np.array([0.7, -0.4, 0.5][:d]) + offset + 0.5)).astype(float)
    return vj.glm.poisson_regression(X, counts, prior_variance=2.0, offset=offset)


def _laplace_regression(rng, n=20, d=3):
    X = rng.normal(size=(n, d))
    y = X @ np.array([0.5, -1.0, 0.3][:d]) + rng.laplace(size=n)
    return vj.glm.robust_regression(X, y, likelihood="laplace")


def _assert_same_fit(a, b, check_grad_norm=True, same_run=True):
    """The padded fit ``b`` equals the unpadded ``a``: answer to rounding, the same run (``same_run``;
    else, for LVB, whose accelerated steps are accepted by comparisons that rounding can tip once the
    bound is flat, the same answer within two evaluations)."""
    assert np.isfinite(float(a.log_z))
    np.testing.assert_allclose(float(b.log_z), float(a.log_z), rtol=0, atol=1e-9)
    np.testing.assert_allclose(b.mean, a.mean, rtol=0, atol=1e-9)
    np.testing.assert_allclose(b.covariance, a.covariance, rtol=0, atol=1e-9)
    da, db = a.diagnostics, b.diagnostics
    if same_run:
        assert int(db.iterations) == int(da.iterations)
    else:
        assert abs(int(db.iterations) - int(da.iterations)) <= 2
    assert bool(db.converged) == bool(da.converged)
    assert bool(da.converged)
    assert b.is_lower_bound == a.is_lower_bound
    if not same_run:
        return
    np.testing.assert_allclose(float(db.stationarity), float(da.stationarity), rtol=1e-3, atol=1e-12)
    if check_grad_norm:
        np.testing.assert_allclose(float(db.grad_norm), float(da.grad_norm), rtol=1e-3, atol=1e-12)
    np.testing.assert_allclose(np.asarray(db.objective_trace), np.asarray(da.objective_trace), rtol=0, atol=1e-9)


METHODS = {
    "gkl": vj.GKL(),
    "gkl_diagonal": vj.GKL(covariance=vj.covariance.Diagonal()),
    "ep": vj.EP(),
    "laplace": vj.Laplace(),
    "map": vj.MAP(),
    "meanfield": vj.MeanField(),
}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("problem", ["logistic", "poisson"])
def test_padded_fit_equals_unpadded(rng, problem, method):
    model = {"logistic": _logistic, "poisson": _poisson}[problem](rng)
    padded = vj.pad_sites(model, SIZE)
    a, b = vj.infer(model, METHODS[method]), vj.infer(padded, METHODS[method])
    # EP's grad_norm is the energy's gradient over every site's parameters, the padding sites' too.
    _assert_same_fit(a, b, check_grad_norm=method != "ep")


@pytest.mark.parametrize("problem", ["logistic", "laplace_regression"])
def test_padded_lvb_equals_unpadded(rng, problem):
    model = {"logistic": _logistic, "laplace_regression": _laplace_regression}[problem](rng)
    _assert_same_fit(vj.infer(model, vj.LVB()), vj.infer(vj.pad_sites(model, SIZE), vj.LVB()), same_run=False)


def test_sequential_ep_and_sparse_projection(rng):
    X = rng.normal(size=(18, 3)) * (rng.random((18, 3)) < 0.7)
    X[:, 0] += 1.0  # no empty row
    y = np.where(rng.random(18) < 0.5, 1.0, -1.0)
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(3, 1.0),
                                 vj.Sites(jsparse.BCOO.fromdense(y[:, None] * X), vj.potentials.Logistic()))
    padded = vj.pad_sites(model, multiple=16)
    assert padded.sites[0].num_sites == 32
    np.testing.assert_array_equal(padded.sites[0].projection.matrix.todense()[18:], np.tile(y[-1] * X[-1], (14, 1)))
    method = vj.EP(schedule="sequential", power=0.7, fallback=False)  # `site()` and the quadrature rule
    _assert_same_fit(vj.infer(model, method), vj.infer(padded, method), check_grad_norm=False)


def test_one_compilation_for_every_real_size(rng):
    fit = jax.jit(lambda m: vj.infer(m, vj.Laplace()).log_z)
    models = [_poisson(rng, n) for n in (17, 20)]
    values = [fit(vj.pad_sites(m, SIZE)) for m in models]
    assert fit._cache_size() == 1
    for model, value in zip(models, values):
        np.testing.assert_allclose(float(value), float(vj.infer(model, vj.Laplace()).log_z), rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", [vj.GKL(), vj.Laplace()], ids=["gkl", "laplace"])
def test_hyperparameter_gradients_unchanged(rng, method):
    model = _poisson(rng)

    def log_z(log_variance, base):
        prior = vj.GaussianFactor.isotropic(base.dim, jnp.exp(log_variance))
        return vj.infer(vj.LatentLinearModel(prior, base.sites), method).log_z

    grad = jax.grad(log_z)
    g, g_padded = float(grad(0.3, model)), float(grad(0.3, vj.pad_sites(model, SIZE)))
    assert np.isfinite(g) and np.isfinite(g_padded)
    np.testing.assert_allclose(g_padded, g, rtol=1e-9, atol=1e-10)


def test_predictions_use_the_real_sites(rng):
    model = _logistic(rng)
    X = np.asarray(model.sites[0].projection.matrix)
    a, b = vj.infer(model, vj.Laplace()), vj.infer(vj.pad_sites(model, SIZE), vj.Laplace())
    np.testing.assert_allclose(vj.glm.predict_proba(b, X[:5]), vj.glm.predict_proba(a, X[:5]), atol=1e-10)
    y = np.ones(5)
    np.testing.assert_allclose(vj.glm.log_predictive(b, X[:5], y), vj.glm.log_predictive(a, X[:5], y), atol=1e-10)


# ------------------------------------------------------------------------------ structure, no fits


def test_padded_structure(rng):
    model = _poisson(rng, n=5)
    padded = vj.pad_sites(model, 8)
    group = padded.sites[0]
    assert isinstance(group.potential, vj.potentials.Masked)
    np.testing.assert_array_equal(group.potential.mask, [True] * 5 + [False] * 3)
    counts = np.asarray(model.sites[0].potential.counts)
    np.testing.assert_array_equal(group.potential.potential.counts, np.r_[counts, [counts[-1]] * 3])
    np.testing.assert_array_equal(group.offset[5:], [model.sites[0].offset[-1]] * 3)
    np.testing.assert_array_equal(group.projection.matrix[5:], np.tile(model.sites[0].projection.matrix[-1], (3, 1)))
    # An exact fit pads to its own size; padding again keeps the mask; a bucket rule.
    np.testing.assert_array_equal(vj.pad_sites(model, 5).sites[0].potential.mask, [True] * 5)
    again = vj.pad_sites(padded, 10).sites[0].potential
    np.testing.assert_array_equal(again.mask, [True] * 5 + [False] * 5)
    assert not isinstance(again.potential, vj.potentials.Masked)
    assert vj.pad_sites(model, multiple=4).sites[0].num_sites == 8
    # Same structure and shapes for different real sizes: one compiled program.
    other = vj.pad_sites(_poisson(rng, n=7), 8)
    assert jax.tree_util.tree_structure(other) == jax.tree_util.tree_structure(padded)
    assert [a.shape for a in jax.tree_util.tree_leaves(other)] == [a.shape for a in jax.tree_util.tree_leaves(padded)]
    # The log joint is unchanged anywhere.
    w = jnp.asarray(rng.normal(size=3))
    np.testing.assert_allclose(padded.log_joint(w), model.log_joint(w), rtol=1e-13)


def test_piecewise_bound_keeps_the_mask(rng):
    padded = vj.pad_sites(_logistic(rng, n=6), 8)
    bounded = vj.piecewise.bound_logistic_sites(padded, "linear", 7).sites[0].potential
    assert isinstance(bounded, vj.potentials.Masked) and isinstance(bounded.potential, vj.potentials.PiecewiseLogistic)
    np.testing.assert_array_equal(bounded.mask, padded.sites[0].potential.mask)


def test_several_groups(rng):
    X = rng.normal(size=(6, 3))
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(3, 1.0),
                                 (vj.Sites(X, vj.potentials.Logistic()),
                                  vj.Sites(vj.Identity(3), vj.potentials.Laplace(scale=0.5))))
    padded = vj.pad_sites(model, (8, None))
    assert padded.sites[0].num_sites == 8 and padded.sites[1] is model.sites[1]
    assert vj.pad_sites(model, (8, 3)).sites[1].num_sites == 3  # an Identity group at its own size
    with pytest.raises(ValueError, match="Identity"):
        vj.pad_sites(model, 8)
    with pytest.raises(ValueError, match="one per group"):
        vj.pad_sites(model, (8,))


def test_masked_potential():
    inner = vj.potentials.Poisson(jnp.array([2.0, 0.0, 5.0]))
    masked = vj.potentials.Masked(inner, jnp.array([True, False, True]))
    assert masked.log_concave and not masked.labels_in_projection
    mu, sigma = jnp.array([0.1, 0.2, 0.3]), jnp.array([0.5, 0.6, 0.7])

    @jax.jit  # one program for every quantity below
    def quantities(mu, sigma):
        return (masked.expected_log_phi(mu, sigma), inner.expected_log_phi(mu, sigma),
                masked.tilted_moments(mu, sigma**2), jax.grad(lambda m: jnp.sum(masked.expected_log_phi(m, sigma)))(mu),
                vj.quadrature.elementwise_derivatives(masked.log_phi, mu))

    expected, unmasked, (log_z, mean, var), grad, (_, slope, second) = quantities(mu, sigma)
    assert float(expected[1]) == 0.0 and float(expected[0]) == float(unmasked[0])
    assert float(log_z[1]) == 0.0 and float(mean[1]) == float(mu[1]) and float(var[1]) == float(sigma[1] ** 2)
    assert float(grad[1]) == 0.0 and float(grad[0]) != 0.0
    assert float(slope[1]) == 0.0 and float(second[1]) == 0.0
    assert isinstance(masked.observe(jnp.ones(4)), vj.potentials.Poisson)
    bound = vj.lvb.local_bound(vj.potentials.Masked(vj.potentials.Logistic(), jnp.array([True, False])))
    a, A, c = bound.quadratic(jnp.array([1.5, 2.5]))
    assert float(a[1]) == float(A[1]) == float(c[1]) == 0.0 and float(A[0]) > 0
    np.testing.assert_array_equal(bound.update(jnp.array([1.0, 3.0]), jnp.array([1.0, 1.0]))[1], 1.0)
    with pytest.raises(ValueError, match="mask"):
        vj.potentials.Masked(inner, jnp.ones((3, 2), bool))
    with pytest.raises(ValueError, match="booleans"):
        vj.potentials.Masked(inner, jnp.array([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="mask"):
        vj.Sites(np.ones((3, 2)), vj.potentials.Masked(vj.potentials.Logistic(), jnp.ones(4, bool)))


def test_bad_input(rng):
    model = _logistic(rng, n=10)
    with pytest.raises(ValueError, match="10 sites, more than the padded size 8"):
        vj.pad_sites(model, 8)
    for bad in (0, -3, 2.5, True, "12"):
        with pytest.raises(ValueError, match="positive integer"):
            vj.pad_sites(model, bad)
    with pytest.raises(ValueError, match="positive integer"):
        vj.pad_sites(model, multiple=0)
    with pytest.raises(ValueError, match="exactly one"):
        vj.pad_sites(model)
    with pytest.raises(ValueError, match="exactly one"):
        vj.pad_sites(model, 12, multiple=4)
    with pytest.raises(ValueError, match="LatentLinearModel"):
        vj.pad_sites(model.sites[0], 12)
    gp = vj.gp.model(vj.gp.kernels.SquaredExponential(), rng.normal(size=(4, 1)), vj.potentials.Gaussian(jnp.zeros(4)))
    with pytest.raises(ValueError, match="cannot be padded"):
        vj.pad_sites(gp, 6)
