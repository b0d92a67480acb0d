"""The solvers on objectives with known maximisers: quadratics, Rosenbrock, failure reporting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj


def _concave_quadratic(rng, dim, condition):
    Q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    A = (Q * np.geomspace(1.0, condition, dim)) @ Q.T
    b = rng.normal(size=dim)
    return jnp.asarray(A), jnp.asarray(b), np.linalg.solve(A, b)


def test_nonlinear_cg_on_an_ill_conditioned_quadratic(rng):
    A, b, x_star = _concave_quadratic(rng, 30, 1e3)
    fn = lambda x: b @ x - 0.5 * x @ A @ x
    sol = vj.solvers.NonlinearCG(tol=1e-7, max_iter=500, c2=0.01).maximise(fn, jnp.zeros(30))
    assert bool(sol.converged)
    np.testing.assert_allclose(sol.x, x_star, atol=1e-6)
    # Conjugacy is what makes CG beat gradient ascent (which needs ~condition × log(1/tol) steps).
    assert int(sol.iterations) <= 90
    # Monotone, up to the rounding of f that the approximate Wolfe conditions allow near the optimum.
    trace = np.asarray(sol.trace)[: int(sol.iterations) + 1]
    assert np.all(np.diff(trace) > -1e-12 * np.abs(trace[-1]))


def test_nonlinear_cg_uses_the_preconditioner(rng):
    A, b, x_star = _concave_quadratic(rng, 30, 1e3)
    fn = lambda x: b @ x - 0.5 * x @ A @ x
    exact = lambda x: lambda g: jnp.linalg.solve(A, g)  # the inverse negative Hessian: Newton steps
    sol = vj.solvers.NonlinearCG(tol=1e-9).maximise(fn, jnp.zeros(30), exact)
    assert bool(sol.converged) and int(sol.iterations) <= 2
    np.testing.assert_allclose(sol.x, x_star, atol=1e-9)


def test_nonlinear_cg_on_rosenbrock():
    fn = lambda x: -(100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2)
    sol = vj.solvers.NonlinearCG(tol=1e-6, max_iter=2000).maximise(fn, jnp.array([-1.2, 1.0]))
    assert bool(sol.converged)
    np.testing.assert_allclose(sol.x, [1.0, 1.0], atol=1e-5)


def test_nonlinear_cg_reports_a_failed_line_search():
    # Finite only at the start: no step can increase it, so the solver must stop and say so.
    fn = lambda x: jnp.where(jnp.all(x == 0), 0.0, jnp.nan) + jnp.sum(x)
    sol = vj.solvers.NonlinearCG().maximise(fn, jnp.zeros(3))
    assert not bool(sol.converged)
    assert int(sol.iterations) == 0
    np.testing.assert_array_equal(sol.x, np.zeros(3))


def test_nonlinear_cg_under_jit_and_vmap(rng):
    A, _, _ = _concave_quadratic(rng, 8, 10.0)
    B = jnp.asarray(rng.normal(size=(5, 8)))
    solve = lambda b: vj.solvers.NonlinearCG(tol=1e-8).maximise(lambda x: b @ x - 0.5 * x @ A @ x, jnp.zeros(8)).x
    xs = jax.jit(jax.vmap(solve))(B)
    np.testing.assert_allclose(xs, np.linalg.solve(np.asarray(A), np.asarray(B).T).T, atol=1e-7)


@pytest.mark.parametrize("family", [vj.covariance.Full(), vj.covariance.Chevron(3), vj.covariance.Banded(2)])
@pytest.mark.slow
def test_nonlinear_cg_fits_gkl_like_newton_cg(rng, family):
    X = rng.normal(size=(120, 10))
    y = (X @ rng.normal(size=10) + rng.normal(size=120) > 0).astype(float)
    model = vj.glm.logistic_regression(X, y)
    ref = vj.infer(model, vj.GKL(covariance=family, solver=vj.solvers.NewtonCG(tol=1e-9)))
    post = vj.infer(model, vj.GKL(covariance=family, solver=vj.solvers.NonlinearCG(tol=1e-6)))
    assert bool(post.diagnostics.converged)
    assert post.diagnostics.solver == "NonlinearCG"
    np.testing.assert_allclose(post.log_z, ref.log_z, atol=1e-8, rtol=0)
    np.testing.assert_allclose(post.mean, ref.mean, atol=1e-5)
