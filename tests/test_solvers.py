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


def test_lbfgs_on_rosenbrock():
    fn = lambda x: -(100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2)
    sol = vj.solvers.LBFGS(max_iter=2000).maximise(fn, jnp.array([-1.2, 1.0]))
    assert bool(sol.converged)
    np.testing.assert_allclose(sol.x, [1.0, 1.0], atol=1e-5)


def test_newton_cg_caps_its_conjugate_gradients(rng):
    """`max_cg` bounds the Hessian-vector products of each Newton step; a cap below the problem's needs
    costs iterations, not the answer."""
    A, b, x_star = _concave_quadratic(rng, 30, 1e3)
    fn = lambda x: b @ x - 0.5 * x @ A @ x
    full = vj.solvers.NewtonCG().maximise(fn, jnp.zeros(30))
    capped = vj.solvers.NewtonCG(max_cg=3, max_iter=2000).maximise(fn, jnp.zeros(30))
    assert bool(full.converged) and bool(capped.converged)
    assert int(full.num_hvp_evals) > 3 * int(full.iterations)
    assert int(capped.num_hvp_evals) == 3 * int(capped.iterations) and int(capped.iterations) > 10 * int(full.iterations)
    np.testing.assert_allclose(capped.x, x_star, atol=1e-4)


def test_lbfgs_line_search_stops_at_max_backtracks():
    """`max_backtracks` trials per line search at most: with one, the first step from Rosenbrock's
    standard start is not acceptable, and L-BFGS stops there and says so rather than go on."""
    fn = lambda x: -(100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2)
    x0 = jnp.array([-1.2, 1.0])
    sol = vj.solvers.LBFGS(max_backtracks=1).maximise(fn, x0)
    assert not bool(sol.converged) and int(sol.iterations) == 0 and int(sol.num_grad_evals) == 2
    np.testing.assert_array_equal(sol.x, x0)


def test_lbfgs_reports_a_failed_line_search():
    # Finite only at the start: no step can increase it, so the solver must stop and say so.
    fn = lambda x: jnp.where(jnp.all(x == 0), 0.0, jnp.nan) + jnp.sum(x)
    sol = vj.solvers.LBFGS().maximise(fn, jnp.zeros(3))
    assert int(sol.status) == vj.Status.STALLED
    assert int(sol.iterations) == 0
    np.testing.assert_array_equal(sol.x, np.zeros(3))


def test_lbfgs_under_jit_and_vmap(rng):
    A, _, _ = _concave_quadratic(rng, 8, 10.0)
    B = jnp.asarray(rng.normal(size=(5, 8)))
    solve = lambda b: vj.solvers.LBFGS().maximise(lambda x: b @ x - 0.5 * x @ A @ x, jnp.zeros(8)).x
    xs = jax.jit(jax.vmap(solve))(B)
    np.testing.assert_allclose(xs, np.linalg.solve(np.asarray(A), np.asarray(B).T).T, atol=1e-7)


SOLVERS = [vj.solvers.NewtonCG(), vj.solvers.Newton(), vj.solvers.LBFGS()]


@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: type(s).__name__)
def test_default_stop_is_invariant_to_the_scale_of_the_parameters(rng, solver):
    """The squared Newton decrement does not change when a coordinate is measured in other units:
    rescaling coordinates by 1e-2 … 1e2 gives the same answer to the same relative accuracy, where a
    test on max |∇f| would stop far too early or far too late. (L-BFGS estimates the
    decrement through its preconditioner, here Jacobi, as vijax's objectives always supply one.)"""
    A, b, x_star = _concave_quadratic(rng, 6, 1e2)
    # A smooth non-quadratic term keeps Newton from finishing in one step.
    fn = lambda x: b @ x - 0.5 * x @ A @ x - jnp.sum(jnp.logaddexp(0.0, 2.0 * x))
    ref = vj.solvers.Newton(tol=1e-28).maximise(fn, jnp.zeros(6)).x
    errors = []
    for scale in (1e-2, 1.0, 1e2):
        units = jnp.asarray(scale ** np.linspace(-1, 1, 6))
        scaled = lambda u: fn(units * u)
        jacobi = lambda u: lambda g: g / -jnp.diag(jax.hessian(scaled)(u))
        sol = solver.maximise(scaled, jnp.zeros(6), jacobi)
        assert bool(sol.converged)
        assert float(sol.decrement) <= 1e-10
        errors.append(np.max(np.abs(units * sol.x - ref)))
    # A Jacobi-preconditioned gᵀMg underestimates the decrement of this dense Hessian: first-order
    # solvers stop further from the optimum, but equally far at every scale.
    assert max(errors) <= (1e-6 if isinstance(solver, (vj.solvers.NewtonCG, vj.solvers.Newton)) else 1e-5)
    assert max(errors) <= 10 * min(errors) + 1e-12


def test_lbfgs_uses_the_preconditioner(rng):
    """With the exact inverse Hessian as its initial matrix L-BFGS takes Newton steps."""
    A, b, x_star = _concave_quadratic(rng, 30, 1e3)
    fn = lambda x: b @ x - 0.5 * x @ A @ x
    sol = vj.solvers.LBFGS().maximise(fn, jnp.zeros(30), lambda x: lambda g: jnp.linalg.solve(A, g))
    assert bool(sol.converged) and int(sol.iterations) <= 2
    np.testing.assert_allclose(sol.x, x_star, atol=1e-10)
    plain = vj.solvers.LBFGS().maximise(fn, jnp.zeros(30))
    assert bool(plain.converged) and int(plain.iterations) > 20
    np.testing.assert_allclose(plain.x, x_star, atol=1e-4)


def test_lbfgs_traces_the_objective_once(rng):
    """L-BFGS evaluates the objective in one place (the line search is the loop body), so a costly
    objective appears once in the compiled program; the result is that of a plain quadratic solve."""
    A, b, x_star = _concave_quadratic(rng, 8, 1e2)
    traces = []

    def fn(x):
        traces.append(1)
        return b @ x - 0.5 * x @ A @ x

    sol = jax.jit(lambda x0: vj.solvers.LBFGS().maximise(fn, x0))(jnp.zeros(8))
    assert len(traces) == 1
    assert bool(sol.converged) and int(sol.num_grad_evals) >= int(sol.iterations) + 1
    np.testing.assert_allclose(sol.x, x_star, atol=1e-6)


def test_lbfgs_gain_rule_stops_at_the_first_small_window(rng):
    """With gain_tol, L-BFGS stops (converged) at the first iteration k whose gain over the last
    gain_window iterations is at most gain_tol, before the decrement test would stop it."""
    A, b, x_star = _concave_quadratic(rng, 40, 1e4)
    fn = lambda x: b @ x - 0.5 * x @ A @ x
    plain = jax.jit(lambda x0: vj.solvers.LBFGS(memory=3).maximise(fn, x0))(jnp.zeros(40))
    sol = jax.jit(lambda x0: vj.solvers.LBFGS(memory=3, gain_tol=1e-3, gain_window=5).maximise(fn, x0))(jnp.zeros(40))
    k = int(sol.iterations)
    trace = np.asarray(sol.trace)[:k + 1]
    gains = trace[5:] - trace[:-5]  # gains[j]: over iterations j .. j + 5
    assert bool(sol.converged) and k < int(plain.iterations)
    assert gains[-1] <= 1e-3 and np.all(gains[:-1] > 1e-3)
    assert float(sol.value) == trace[-1] and float(plain.value) - float(sol.value) > 0


def test_newton_solvers_stop_at_float32_resolution(rng):
    """In float32 the decrement cannot fall below the rounding of f: the solvers stop there, converged."""
    A, b, x_star = _concave_quadratic(rng, 10, 1e2)
    A32, b32 = A.astype(jnp.float32), b.astype(jnp.float32)
    fn = lambda x: 1e3 + b32 @ x - 0.5 * x @ A32 @ x - jnp.sum(jnp.logaddexp(0.0, x))
    for solver in SOLVERS:
        sol = solver.maximise(fn, jnp.zeros(10, jnp.float32))
        assert sol.x.dtype == jnp.float32
        assert bool(sol.converged), type(solver).__name__
        assert int(sol.iterations) < 50


def test_backtrack_halves_each_step_until_its_own_trial_is_acceptable():
    """Steps per coordinate: each is halved only while its own trial is unacceptable; a step that never
    becomes acceptable is reported as such after the allowed halvings."""
    from vijax._linalg import backtrack
    limit = jnp.array([1.0, 0.3, 0.01, -1.0])  # acceptable: step ≤ limit (the last never)
    step, value, ok, halvings = backtrack(lambda t: t, lambda t, v: v <= limit, jnp.ones(4), 10)
    np.testing.assert_array_equal(np.asarray(step), [1.0, 0.25, 2.0**-7, 2.0**-10])
    np.testing.assert_array_equal(np.asarray(ok), [True, True, True, False])
    assert int(halvings) == 10
    # Scalar steps under jit, with a pytree value: the first acceptable step ends the search.
    f = jax.jit(lambda t0: backtrack(lambda t: {"f": -(t - 0.1) ** 2}, lambda t, v: v["f"] >= -0.01, t0, 30))
    step, value, ok, halvings = f(jnp.array(1.0))
    assert float(step) == 0.125 and bool(ok) and int(halvings) == 3
    assert float(value["f"]) == pytest.approx(-(0.125 - 0.1) ** 2)


def test_iterate_stops_early_and_counts_steps():
    from vijax.solvers import iterate
    state, k = iterate(lambda k, s: s + k, jnp.array(0), 100, lambda k, s: s >= 10)
    assert int(state) == 10 and int(k) == 5  # 0 + 0 + 1 + 2 + 3 + 4
    state, k = iterate(lambda k, s: s * 2, jnp.array(1.0), 7)
    assert float(state) == 128.0 and int(k) == 7


def test_neg_kl_against_the_integral_it_stands_for():
    """−KL(q ‖ p) = E_q[log p − log q]: by quadrature in one dimension, by Monte Carlo in three."""
    from scipy import integrate, stats
    from vijax._linalg import neg_kl
    for (m, v), (mu, s2) in [((0.3, 0.5), (-1.0, 2.0)), ((2.0, 3.0), (0.0, 0.1))]:
        q, p = stats.norm(m, np.sqrt(v)), stats.norm(mu, np.sqrt(s2))
        exact = integrate.quad(lambda x: q.pdf(x) * (p.logpdf(x) - q.logpdf(x)), -30, 30, epsabs=1e-13)[0]
        got = neg_kl(v / s2, (m - mu) ** 2 / s2, np.log(v), np.log(s2), 1)
        assert float(got) == pytest.approx(exact, rel=1e-9)
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(2, 3, 3))
    V, Sigma = A @ A.T + np.eye(3), B @ B.T + np.eye(3)
    m, mu = rng.normal(size=(2, 3))
    P = np.linalg.inv(Sigma)
    got = neg_kl(np.trace(P @ V), (m - mu) @ P @ (m - mu), np.linalg.slogdet(V)[1], np.linalg.slogdet(Sigma)[1], 3)
    x = stats.multivariate_normal(m, V).rvs(400_000, random_state=1)
    estimate = np.mean(stats.multivariate_normal(mu, Sigma).logpdf(x) - stats.multivariate_normal(m, V).logpdf(x))
    assert float(got) == pytest.approx(estimate, abs=0.02)
