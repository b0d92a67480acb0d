"""Lanczos, the one Krylov eigen-solver (`vijax._linalg`): against `numpy.linalg.eigh`, at breakdown, and its
callers (the Subspace family's basis; LVB's variance estimates, against exact LVB variances)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax import _linalg
from vijax.covariance.subspace import _leading_eigenvectors
from vijax.methods import lvb


def _psd(rng, D, spectrum):
    U = np.linalg.qr(rng.normal(size=(D, D)))[0]
    return (U * spectrum) @ U.T


def test_leading_eigenvectors_match_eigh(rng):
    A = _psd(rng, 40, np.geomspace(1e-2, 10.0, 40))
    values, vectors = np.linalg.eigh(A)
    top, V = _linalg.leading_eigenvectors(lambda v: jnp.asarray(A) @ v, 40, 5, num_iter=30)
    np.testing.assert_allclose(top, values[::-1][:5], rtol=1e-9)
    np.testing.assert_allclose(np.abs(np.sum(np.asarray(V) * vectors[:, ::-1][:, :5], axis=0)), 1.0, atol=1e-7)
    # the Subspace family's basis (a block operator) is the same Lanczos
    E = _leading_eigenvectors(lambda X: jnp.asarray(A) @ X, 40, 3, jnp.float64)
    np.testing.assert_allclose(np.abs(np.sum(np.asarray(E) * vectors[:, ::-1][:, :3], axis=0)), 1.0, atol=1e-7)
    # block Krylov steps (products of whole (D, b) blocks): exact once the space is R^D, 8 · 5 = 40 ...
    top, V = _linalg.leading_eigenvectors(lambda X: jnp.asarray(A) @ X, 40, 5, num_iter=8, block=5)
    np.testing.assert_allclose(top, values[::-1][:5], rtol=1e-10)
    np.testing.assert_allclose(np.abs(np.sum(np.asarray(V) * vectors[:, ::-1][:, :5], axis=0)), 1.0, atol=1e-9)
    # ... and the Ritz values of a smaller space interlace: each ≤ its eigenvalue, the leading one close
    top, _ = _linalg.leading_eigenvectors(lambda X: jnp.asarray(A) @ X, 40, 2, num_iter=4, block=4)
    assert np.all(top <= values[::-1][:2] * (1 + 1e-12)) and top[0] > 0.99 * values[-1]
    with pytest.raises(ValueError, match="Krylov dimension"):
        _linalg.leading_eigenvectors(lambda X: X, 40, 9, num_iter=2, block=4)


def test_ritz_pairs_quadrature_and_breakdown(rng):
    A = _psd(rng, 12, np.linspace(0.5, 3.0, 12))
    v = np.asarray(jax.random.rademacher(jax.random.PRNGKey(1), (12,), jnp.float64))
    theta, V, weights = _linalg.ritz_pairs(lambda x: jnp.asarray(A) @ x, jnp.asarray(v), 12)
    np.testing.assert_allclose(theta, np.linalg.eigvalsh(A), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(V).T @ np.asarray(V), np.eye(12), atol=1e-10)
    np.testing.assert_allclose(np.sum(weights), 1.0, rtol=1e-12)
    # Gauss quadrature of v's spectral measure: v^T P^-1 v and v^T log(P) v, exact at k = D
    w, U = np.linalg.eigh(A)
    np.testing.assert_allclose(lvb._quadrature(lambda x: jnp.asarray(A) @ x, jnp.asarray(v), 12),
                               [v @ (U * np.log(w)) @ U.T @ v, v @ np.linalg.solve(A, v)], rtol=1e-9)
    # three distinct eigenvalues: the Krylov space is invariant after 3 steps, Lanczos restarts orthogonally
    B = _psd(rng, 12, np.repeat([1.0, 2.0, 5.0], 4))
    _, _, beta = _linalg.lanczos(lambda x: jnp.asarray(B) @ x, jnp.ones(12), 8)
    # three steps span an invariant space: a zero coupling, then a fresh direction (whose space is invariant too)
    np.testing.assert_array_equal(np.asarray(beta) == 0, [False, False, True, False, False, True, False])
    theta, V, _ = _linalg.ritz_pairs(lambda x: jnp.asarray(B) @ x, jnp.ones(12), 8)
    np.testing.assert_allclose(np.asarray(V).T @ np.asarray(V), np.eye(8), atol=1e-10)
    theta = np.asarray(theta)
    assert all(np.min(np.abs(theta - lam)) < 1e-10 for lam in (1.0, 2.0, 5.0))  # the invariant block's
    assert np.all((theta > 1 - 1e-10) & (theta < 5 + 1e-10))  # the rest interlace


@pytest.fixture(scope="module")
def image_model():
    rng = np.random.default_rng(0)
    D, N = 24, 10
    w = rng.laplace(0, 0.3, D)
    M = rng.normal(size=(N, D))
    M /= np.linalg.norm(M, axis=1, keepdims=True)
    y = M @ w + 0.07 * rng.normal(size=N)
    B = vj.design.filters.finite_differences((4, 6), periodic=True)
    return vj.design.sparse_linear_model(M, y, 0.005, B, vj.potentials.Laplace(scale=0.3))


def test_lvb_lanczos_variances_against_exact(image_model):
    model = image_model
    # k = D Lanczos vectors: the double loop finds the exact LVB fixed point, without forming P
    full = vj.infer(model, vj.LVB(variances="lanczos", num_lanczos=model.dim))
    assert bool(full.diagnostics.converged) and isinstance(full.factor, vj.covariance.SubspaceFactor)
    xi = lvb._update(model, "jaakkola", full.mean, full.factor)
    mean, factor = vj.lvb.gaussian(xi, model)  # q_ξ from the dense P
    np.testing.assert_allclose(full.mean, mean, atol=1e-8)
    np.testing.assert_allclose(full.factor.variances(), factor.variances(), rtol=1e-8)
    for a, b in zip(lvb._update(model, "jaakkola", mean, factor)[1:], xi[1:]):  # a fixed point of exact LVB
        np.testing.assert_allclose(a, b, rtol=1e-7)
    # k < D at the same ξ: every site variance is underestimated (a lower bound), the mean is exact
    quadratics = lvb._quadratics(xi, model, "jaakkola")
    _, means, variances = vj.methods._gaussian.marginals(model, quadratics)
    v0 = jax.random.rademacher(jax.random.PRNGKey(0), (model.dim,), jnp.float64)
    _, est_means, est_vars, _ = lvb._lanczos_marginals(model, quadratics, 8, v0)
    for m, e_m, v, e_v in zip(means, est_means, variances, est_vars):
        np.testing.assert_allclose(e_m, m, atol=1e-8)
        assert np.all(np.asarray(e_v) <= np.asarray(v) * (1 + 1e-9))
    assert 0.05 < np.sum(est_vars[1]) / np.sum(variances[1]) < 0.95  # a real underestimate, not zero
    # the reported share of tr P⁻¹ (exactly 1 here), estimated from 8 Rademacher probes
    assert int(full.diagnostics.info.num_lanczos) == model.dim
    assert 0.6 < float(full.diagnostics.info.variance_fraction) < 1.4
    # log_z: B_LVB with log det P averaged over the probes' Gauss quadratures (the first probe's is the fit's
    # last Lanczos run, reused); written out here with every probe's own quadrature
    quadratics = lvb._quadratics(lvb._update(model, "jaakkola", full.mean, full.factor), model, "jaakkola")
    product, r, const = vj.methods._gaussian.precision_operator(model, quadratics)
    probes = jax.random.rademacher(jax.random.PRNGKey(0), (lvb._NUM_PROBES, model.dim), jnp.float64)
    per_probe = np.array([lvb._quadrature(product, v, model.dim) for v in probes])
    base = float(const + 0.5 * r @ full.mean + 0.5 * model.dim * np.log(2 * np.pi))
    np.testing.assert_allclose(full.log_z, base - 0.5 * per_probe[:, 0].mean(), rtol=1e-9)
    one = vj.infer(model, vj.LVB(variances="lanczos", num_lanczos=model.dim, num_probes=1))
    np.testing.assert_allclose(one.mean, full.mean, atol=1e-10)
    np.testing.assert_allclose(one.log_z, base - 0.5 * per_probe[0, 0], rtol=1e-9)
    with pytest.raises(ValueError, match="num_probes"):
        vj.LVB(variances="lanczos", num_probes=0)
    with pytest.raises(ValueError, match="variances"):
        vj.LVB(variances="probing")
    with pytest.raises(ValueError, match="num_lanczos"):
        vj.LVB(variances="lanczos", num_lanczos=0)


def test_lvb_lanczos_outer_loop_stops_on_the_relative_change_of_xi(image_model):
    # k < D: glm-ie's plain outer loop, ended at the first step with ‖Δξ‖/‖ξ‖ ≤ tol; written out here with
    # the same Lanczos estimates (F̂; each CG from the last mean, to the loop's residual), it must
    # stop at the same step with the same ξ (so the same mean).
    model, k, tol = image_model, 8, 2e-2
    post = vj.infer(model, vj.LVB(variances="lanczos", num_lanczos=k, tol=tol, max_iter=40))
    v0 = jax.random.rademacher(jax.random.PRNGKey(0), (lvb._NUM_PROBES, model.dim), jnp.float64)[0]
    inner = lvb._inner_rtol(tol, jnp.float64)
    assert inner == 1e-6 and lvb._inner_rtol(1e-9, jnp.float64) == 1e-2 * np.finfo(float).eps ** 0.5

    @jax.jit
    def F(xi, m):
        _, means, variances, extras = lvb._lanczos_marginals(model, lvb._quadratics(xi, model, "jaakkola"), k, v0,
                                                             m, inner)
        return lvb._update_from_marginals(model, "jaakkola", means, variances), extras[0]

    mean, scale = model.initial_moments()
    xi = lvb._update(model, "jaakkola", mean, vj.covariance.DiagonalFactor(scale))
    m = jnp.zeros(model.dim)
    for steps in range(1, 41):
        new, m = F(xi, m)
        change = np.linalg.norm(np.asarray(new[1]) - np.asarray(xi[1])) / np.linalg.norm(np.asarray(xi[1]))
        xi = new
        if change <= tol:
            break
    assert 1 < steps < 40 and bool(post.diagnostics.converged) and int(post.diagnostics.iterations) == steps
    np.testing.assert_allclose(float(post.diagnostics.stationarity), change, rtol=1e-6)
    expected = lvb._lanczos_marginals(model, lvb._quadratics(xi, model, "jaakkola"), k, v0, m)[3][0]
    np.testing.assert_allclose(post.mean, expected, atol=1e-8)
    # a tolerance below the estimated map's oscillation is reported as not converged
    with pytest.warns(vj.ConvergenceWarning):
        stuck = vj.infer(model, vj.LVB(variances="lanczos", num_lanczos=k, tol=1e-6, max_iter=40))
    assert not bool(stuck.diagnostics.converged) and int(stuck.diagnostics.iterations) == 40


def test_lvb_lanczos_posterior_designs_from_its_exact_covariance(image_model):
    """A Lanczos-variance LVB fit keeps ξ (`LVBState`); `vj.design` multiplies by its exact S = P⁻¹ through CG
    solves with P, so the free design is S's leading eigenvectors, not those of the rank-k factor."""
    model, k = image_model, 8
    method = vj.LVB(variances="lanczos", num_lanczos=k, tol=1e-2, max_iter=40)
    post = vj.infer(model, method)
    assert isinstance(post.state, vj.lvb.LVBState) and isinstance(post.factor, vj.covariance.SubspaceFactor)
    _, factor = vj.lvb.gaussian(post.state.xi, model)  # q_ξ's S from the dense P
    S = np.asarray(factor.dense())
    V = np.random.default_rng(1).normal(size=(model.dim, 3))
    solve = vj.lvb.covariance_solve(post)
    np.testing.assert_allclose(solve(jnp.asarray(V)), S @ V, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(solve(jnp.asarray(V[:, 0])), S @ V[:, 0], rtol=1e-5, atol=1e-8)
    rows, values = vj.design.free_design(post, 2)  # 2K + 6 = 10 solves, each to a residual of 10⁻³
    lam, U = np.linalg.eigh(S)
    np.testing.assert_allclose(values, lam[::-1][:2], rtol=2e-4)
    np.testing.assert_allclose(np.abs(np.asarray(rows) @ U[:, ::-1][:, :2]), np.eye(2), atol=1e-3)
    gain = 0.5 * np.linalg.slogdet(np.eye(2) + np.asarray(rows) @ S @ np.asarray(rows).T / 0.005)[1]
    np.testing.assert_allclose(vj.design.information_gain(post, rows, 0.005), gain, rtol=1e-5)
    np.testing.assert_allclose(0.5 * np.sum(np.log1p(values / 0.005)), gain, rtol=1e-4)  # the loop's record
    # the rank-k factor's own leading eigenvectors hold less information under q's S
    from_factor, _ = vj.design.free_design(post.factor, 2)
    assert float(vj.design.information_gain(post, from_factor, 0.005)) < gain - 0.05
    # the state restarts the fit (its ξ and mean); the cold state (`start`) fits as ``init=None`` does
    again = vj.infer(model, method, init=post.state)
    assert int(again.diagnostics.iterations) == 1 < int(post.diagnostics.iterations)
    np.testing.assert_allclose(vj.infer(model, method, init=post).mean, again.mean, atol=1e-12)  # the same restart
    np.testing.assert_allclose(vj.infer(model, method, init=method.start(model)).mean, post.mean, atol=1e-10)
    with pytest.raises(ValueError, match="bohning"):
        vj.infer(model, vj.LVB(bound="bohning", variances="lanczos"), init=post.state)
