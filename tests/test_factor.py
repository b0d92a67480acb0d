"""Latent Gaussian factor models: bounds, E-steps, M-steps and EM (vj.factor)."""

import itertools
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

import vijax as vj
from vijax.factor import em as em_module

F = vj.factor


def _em(model, Y, mask=None, weights=None, **settings):
    """EM to ``settings`` (a short run: not converging is not the point, so no ConvergenceWarning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vj.ConvergenceWarning)
        return vj.infer(F.observe(model, Y, mask, weights), F.EM(**settings))


def _run(post):
    """The bounds of the EM iterations that ran (the trace without its start entry and NaN padding)."""
    k = int(post.diagnostics.iterations)
    return np.asarray(post.diagnostics.objective_trace)[1:k + 1]


def _binary_data(rng, n=60, d=5, l=2):
    eta = rng.normal(size=(n, l)) @ (1.5 * rng.normal(size=(l, d))) + 0.3
    return (rng.uniform(size=(n, d)) < 1 / (1 + np.exp(-eta))).astype(float)


def _hermite(num):
    z, w = np.polynomial.hermite_e.hermegauss(num)
    return z, w / w.sum()


def _expected_exact_1d(lik, y, m, v):
    """⟨log p(y | η)⟩ under N(m, v) by 200-node Gauss–Hermite."""
    z, w = _hermite(200)
    eta = m + np.sqrt(v) * z
    vals = np.array([np.asarray(lik.log_prob(jnp.full(len(z), y), jnp.asarray(eta)[:, None]))])[0]
    return float(w @ vals)


# ----------------------------------------------------------------------------------------------
# Bounds


@pytest.mark.parametrize("bound", ["piecewise", "jaakkola", "bohning"])
def test_binary_and_ordinal_bounds_are_below_the_exact_expectation(bound):
    grid = list(itertools.product([-6.0, -1.0, 0.0, 0.7, 4.0], [1e-4, 0.3, 2.0, 30.0]))
    for lik, values in [(F.Bernoulli(bound), (0, 1)), (F.Ordinal(4, bound).for_columns(1), (0, 1, 2, 3))]:
        for (m, v), y in itertools.product(grid, values):
            fb = float(lik.expected(jnp.array([float(y)]), jnp.array([[m]]), jnp.array([[[v]]]))[0])
            exact = _expected_exact_1d(lik, float(y), m, v)
            assert fb <= exact + 1e-10, (type(lik).__name__, bound, m, v, y)
            if bound == "piecewise":  # within D·ε_R of the truth (two llp terms for ordinal)
                assert exact - fb <= 2 * vj.piecewise.max_error("quadratic", 20) + 1e-10


def test_local_parameters_are_at_their_optimum():
    """Jaakkola ξ* = √(m² + v) and Böhning ψ* = m maximise the quadratic bounds (thesis 4.16, 4.36)."""
    xs = np.linspace(-12, 12, 24001)
    for m, v in [(-2.0, 0.5), (0.3, 3.0), (5.0, 0.01)]:
        for name, local in [("jaakkola", vj.lvb.Jaakkola()), ("bohning", vj.lvb.Bohning())]:
            a, A, c = (np.asarray(t) for t in local.quadratic(jnp.asarray(xs)))
            best = np.max(a * m - 0.5 * A * (m**2 + v) + c)  # ⟨log σ(x)⟩ bound over a grid of ξ
            ours = float(F.Bernoulli(name).expected(jnp.array([1.0]), jnp.array([[m]]), jnp.array([[[v]]]))[0])
            np.testing.assert_allclose(ours, best, rtol=1e-7, atol=1e-9)


def _expected_exact_categorical(lik, y, m, V, num=16):
    """⟨log p(y | η)⟩ for η ~ N(m, V) (K = 3) by a tensor Gauss–Hermite rule."""
    z, w = _hermite(num)
    grid = np.array(list(itertools.product(z, repeat=3)))
    weights = np.prod(np.array(list(itertools.product(w, repeat=3))), 1)
    eta = m + grid @ np.linalg.cholesky(V).T
    vals = np.asarray(lik.log_prob(jnp.full(len(eta), float(y)), jnp.asarray(eta)))
    return float(weights @ vals)


def test_categorical_bounds_are_below_the_exact_expectation(rng):
    cases = []  # (y, m, V): two draws of (m, V), every label
    for _ in range(2):
        m = rng.normal(size=3)
        a = rng.normal(size=(3, 3))
        V = a @ a.T * rng.uniform(0.05, 1.0) + 0.05 * np.eye(3)
        cases += [(y, m, V) for y in range(4)]
    ys, ms, Vs = (np.array(x, float) for x in zip(*cases))
    likelihoods = {"stick": F.StickBreaking(4), "stick-jaakkola": F.StickBreaking(4, "jaakkola"),
                   **{bound: F.Multinomial(4, bound) for bound in ("bohning", "log", "tilted", "pos")}}
    exact, bounds = {}, {}
    for name, lik in likelihoods.items():
        truth = exact.setdefault(type(lik), np.array([_expected_exact_categorical(lik, *case) for case in cases]))
        # All draws and labels in one program per likelihood.
        bounds[name] = np.asarray(eqx.filter_jit(lambda lik, y, m, V: lik.expected(y, m, V))(lik, ys, ms, Vs))
        assert np.all(bounds[name] <= truth + 1e-6), name
    assert np.all(bounds["tilted"] >= bounds["log"] - 1e-12)


def test_category_probabilities_sum_to_one(rng):
    eta = jnp.asarray(rng.normal(scale=3.0, size=(7, 4)))
    for lik in [F.StickBreaking(5), F.Multinomial(5)]:
        probs = sum(jnp.exp(lik.log_prob(jnp.full(7, float(k)), eta)) for k in range(5))
        np.testing.assert_allclose(probs, 1.0, atol=1e-12)
    ordinal = F.Ordinal(5, thresholds=[-2.0, -0.3, 0.1, 2.5]).for_columns(7)
    probs = sum(jnp.exp(ordinal.log_prob(jnp.full(7, float(k)), eta[:, :1])) for k in range(5))
    np.testing.assert_allclose(probs, 1.0, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# E-step


def _gaussian_model(rng, d=5, l=2):
    model = F.factor_analysis(F.GaussianColumn(rng.uniform(0.3, 1.0, d)), l, jax.random.PRNGKey(1), num_columns=d,
                              scale=1.0)
    return eqx_offsets(model, jnp.asarray(rng.normal(size=(d, 1))))


def eqx_offsets(model, offsets):
    import equinox as eqx
    return eqx.tree_at(lambda m: m.blocks[0].offsets, model, offsets)


@pytest.mark.parametrize("complete", [True, False])
def test_gaussian_e_step_gives_the_exact_marginal_likelihood(rng, complete):
    model = _gaussian_model(rng)
    n, d = 40, 5
    Y = rng.normal(size=(n, d)) * 2
    mask = np.ones((n, d), bool) if complete else rng.uniform(size=(n, d)) > 0.3
    q = F.e_step(model, jnp.asarray(Y), jnp.asarray(mask), F.initial_posteriors(model, n), complete=complete)
    W = np.asarray(model.blocks[0].loadings[:, 0, :])
    w0 = np.asarray(model.blocks[0].offsets[:, 0])
    cov = W @ W.T + np.diag(np.asarray(model.blocks[0].likelihood.noise))
    exact = [multivariate_normal(w0[o], cov[np.ix_(o, o)]).logpdf(Y[i, o]) for i, o in enumerate(mask)]
    np.testing.assert_allclose(q.bound, exact, rtol=1e-10, atol=1e-10)
    assert bool(jnp.all(q.converged))


def test_vmapped_e_step_equals_a_loop_over_points(rng):
    Y = _binary_data(rng, n=8)
    mask = rng.uniform(size=Y.shape) > 0.2
    model = F.factor_analysis(F.Bernoulli(), 2, jax.random.PRNGKey(0), num_columns=5, scale=1.0)
    q0 = F.initial_posteriors(model, 8)
    batch = F.e_step(model, jnp.asarray(Y), jnp.asarray(mask), q0)
    for i in range(0, 8, 2):
        one = F.e_step(model, jnp.asarray(Y[i:i + 1]), jnp.asarray(mask[i:i + 1]), jax.tree.map(lambda a: a[i:i + 1], q0))
        np.testing.assert_allclose(one.mean[0], batch.mean[i], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(one.cov[0], batch.cov[i], rtol=1e-12, atol=1e-12)
    # The E-step is at the maximum of each L_n: the gradient of elbo_point in (m, V) vanishes there.
    grad = jax.jit(jax.grad(F.elbo_point, argnums=(3, 4)))(model, jnp.asarray(Y[0]), jnp.asarray(mask[0]), batch.mean[0],
                                                    batch.cov[0])
    assert max(float(jnp.max(jnp.abs(g))) for g in grad) < 1e-5
    np.testing.assert_allclose(F.elbo_point(model, jnp.asarray(Y[0]), jnp.asarray(mask[0]), batch.mean[0], batch.cov[0]),
                               batch.bound[0], rtol=1e-12)


@pytest.mark.parametrize("likelihood", [F.Multinomial(4, "log"), F.Bernoulli("jaakkola")], ids=["log", "jaakkola"])
def test_newton_mean_steps_reach_the_same_optimum_in_fewer_steps(rng, likelihood):
    """Bounds with optimised local parameters: Newton steps in m (the bound's own curvature) and the
    fixed-point steps converge to the same q, where ∂L_n/∂(m, V) = 0; Newton in fewer steps."""
    n, l = 6, 3
    Y = rng.integers(0, likelihood.num_predictors + 1 if likelihood.num_predictors > 1 else 2, size=(n, 8)).astype(float)
    model = F.factor_analysis(likelihood, l, jax.random.PRNGKey(2), num_columns=8, scale=2.0)
    q0, mask = F.initial_posteriors(model, n), jnp.ones(Y.shape, bool)
    plain = F.e_step(model, jnp.asarray(Y), mask, q0, max_iter=2000, tol=1e-14)
    newton = F.e_step(model, jnp.asarray(Y), mask, q0, max_iter=2000, tol=1e-14, newton=True)
    assert bool(jnp.all(newton.converged)) and bool(jnp.all(plain.converged))
    np.testing.assert_allclose(newton.bound, plain.bound, rtol=1e-9)
    np.testing.assert_allclose(newton.mean, plain.mean, atol=1e-5)
    assert int(jnp.sum(newton.iterations)) < int(jnp.sum(plain.iterations))
    grad = jax.grad(F.elbo_point, argnums=(3, 4))(model, jnp.asarray(Y[0]), mask[0], newton.mean[0], newton.cov[0])
    assert max(float(jnp.max(jnp.abs(g))) for g in grad) < 1e-5


def test_bohning_em_equals_gaussian_em_on_pseudo_data(rng):
    """Böhning EM is Gaussian EM on ỹ = 4(y + b_ψ) with noise 4, ψ = m̃ (thesis §4.4): same q, same M-step."""
    n, d, l = 50, 5, 2
    Y = _binary_data(rng, n=n, d=d, l=l)
    binary = F.factor_analysis(F.Bernoulli("bohning"), l, jax.random.PRNGKey(3), num_columns=d, scale=1.0)
    binary = eqx_offsets(binary, jnp.asarray(rng.normal(size=(d, 1))))
    mask = jnp.ones((n, d), bool)
    q = F.e_step(binary, jnp.asarray(Y), mask, F.initial_posteriors(binary, n), complete=True, tol=1e-14)
    W, w0 = binary.blocks[0].loadings, binary.blocks[0].offsets
    psi = np.asarray(jnp.einsum("dkl,nl->ndk", W, q.mean) + w0)[..., 0]
    pseudo = 4 * (Y + psi / 4 - 1 / (1 + np.exp(-psi)))
    gaussian = F.factor_analysis(F.GaussianColumn(4.0, learn_noise=False), l, jax.random.PRNGKey(3), num_columns=d)
    import equinox as eqx
    gaussian = eqx.tree_at(lambda m: (m.blocks[0].loadings, m.blocks[0].offsets), gaussian, (W, w0))
    qg = F.e_step(gaussian, jnp.asarray(pseudo), mask, F.initial_posteriors(gaussian, n), complete=True)
    # The Böhning E-step is a fixed-point (MM) iteration stopped at a bound change of 1e-14: m to ~1e-7.
    np.testing.assert_allclose(qg.mean, q.mean, atol=1e-6)
    np.testing.assert_allclose(qg.cov, q.cov, atol=1e-12)
    mb, mg = F.m_step(binary, jnp.asarray(Y), mask, q), F.m_step(gaussian, jnp.asarray(pseudo), mask, qg)
    np.testing.assert_allclose(mb.blocks[0].loadings, mg.blocks[0].loadings, atol=1e-5)
    np.testing.assert_allclose(mb.blocks[0].offsets, mg.blocks[0].offsets, atol=1e-5)
    # ... and the Gaussian M-step is the exact maximiser: W, w₀ solve Σ_n ⟨x̃x̃ᵀ⟩ θ = Σ_n ỹ x̃ (thesis 3.42–3.43).
    x = np.concatenate([np.asarray(qg.mean), np.ones((n, 1))], 1)
    second = x.T @ x
    second[:l, :l] += np.asarray(qg.cov).sum(0)
    theta = np.linalg.solve(second, x.T @ pseudo).T
    np.testing.assert_allclose(mg.blocks[0].loadings[:, 0], theta[:, :l], atol=1e-8)
    np.testing.assert_allclose(mg.blocks[0].offsets[:, 0], theta[:, l], atol=1e-8)


# ----------------------------------------------------------------------------------------------
# EM


def test_em_bound_never_decreases_on_mixed_data_with_missing_entries(rng):
    n, l = 80, 2
    z = rng.normal(size=(n, l))
    lin = lambda k: z @ rng.normal(size=(l, k))
    Y = np.concatenate([
        (rng.uniform(size=(n, 2)) < 1 / (1 + np.exp(-lin(2)))).astype(float),
        rng.poisson(np.exp(0.5 * lin(1))),
        np.digitize(lin(1)[:, 0] + rng.logistic(size=n), [-1.0, 1.0])[:, None].astype(float),
        np.argmax(np.concatenate([np.zeros((n, 1)), lin(2)], 1) + rng.gumbel(size=(n, 3)), 1)[:, None].astype(float),
        lin(1) + 0.3 * rng.normal(size=(n, 1)),
    ], 1)
    mask = rng.uniform(size=Y.shape) > 0.15
    likelihoods = [((0, 1), F.Bernoulli()), (2, F.PoissonColumn()), (3, F.Ordinal(3)), (4, F.StickBreaking(3)),
                   (5, F.GaussianColumn())]
    result = _em(F.factor_analysis(likelihoods, l, jax.random.PRNGKey(0)), Y, mask, max_iter=15)
    trace = _run(result)
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))
    assert trace[-1] > trace[0] + 10
    assert np.all(np.diff(np.asarray(result.fitted.blocks[2].likelihood.thresholds)) > 0)
    # Held-out entries: the predictive densities are proper and beat a constant guess for the binary block.
    lp = np.asarray(F.log_predictive(result, Y, key=jax.random.PRNGKey(2)))
    assert np.all(np.isfinite(lp))
    probs = np.asarray(F.probabilities(result, block=3, key=jax.random.PRNGKey(3)))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-10)
    filled = F.impute(result, Y, mask, key=jax.random.PRNGKey(3))
    np.testing.assert_array_equal(filled[mask], Y[mask])
    assert set(np.unique(filled[:, 3])) <= {0.0, 1.0, 2.0}


def test_row_weights_equal_repeated_rows(rng):
    """Σ_n w_n L_n with integer weights is the bound of the data with row n repeated w_n times: the
    whole EM (every M-step update: penalised prior, loadings, Gaussian noise, ordinal thresholds)
    must agree."""
    n, l = 30, 2
    z = rng.normal(size=(n, l))
    lin = lambda k: z @ rng.normal(size=(l, k))
    Y = np.concatenate([(rng.uniform(size=(n, 1)) < 1 / (1 + np.exp(-lin(1)))).astype(float),
                        np.digitize(lin(1)[:, 0] + rng.logistic(size=n), [-1.0, 1.0])[:, None].astype(float),
                        lin(1) + 0.3 * rng.normal(size=(n, 1))], 1)
    mask = rng.uniform(size=Y.shape) > 0.1
    counts = rng.permutation(np.repeat([0, 1, 2], [8, n - 16, 8]))  # as many rows repeated: one compilation
    likelihoods = [(0, F.Bernoulli("jaakkola")), (1, F.Ordinal(3)), (2, F.GaussianColumn())]
    fa = F.factor_analysis(likelihoods, l, jax.random.PRNGKey(1))
    model = F.FactorModel(fa.mean, fa.cov, fa.blocks, learn_prior=True, learn_loadings=True, penalty=0.05)
    weighted = _em(model, Y, mask, weights=counts.astype(float), max_iter=6, tol=0.0)
    rows = np.repeat(np.arange(n), counts)
    repeated = _em(model, Y[rows], mask[rows], max_iter=6, tol=0.0)
    np.testing.assert_allclose(weighted.diagnostics.objective_trace, repeated.diagnostics.objective_trace, rtol=1e-8)
    for a, b in zip(jax.tree.leaves(weighted.fitted), jax.tree.leaves(repeated.fitted)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bound", ["jaakkola"])  # piecewise: in the mixed-data test
def test_em_bound_never_decreases_for_binary_factor_analysis(rng, bound):
    Y = _binary_data(rng, n=60)
    result = _em(F.factor_analysis(F.Bernoulli(bound), 2, jax.random.PRNGKey(0), num_columns=5), Y, max_iter=25)
    trace = _run(result)
    assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))
    assert trace[-1] > trace[0]


def test_graphical_lasso_matches_scikit_learn(rng):
    from sklearn.covariance import graphical_lasso

    a = rng.normal(size=(40, 5))
    s = np.cov(a.T, bias=True)
    theta, _ = em_module._graphical_lasso(jnp.asarray(s), 0.1, jnp.eye(5), iterations=3000)
    _, expected = graphical_lasso(s, alpha=0.1, tol=1e-10, max_iter=1000)
    np.testing.assert_allclose(theta, expected, atol=2e-4)


def test_sparse_graphical_model_gives_a_sparser_precision(rng):
    Y = _binary_data(rng, n=80, d=4)
    dense = _em(F.graphical_model(F.Bernoulli("jaakkola"), num_columns=4), Y, max_iter=20)
    sparse = _em(F.graphical_model(F.Bernoulli("jaakkola"), num_columns=4, penalty=0.1), Y, max_iter=20)
    off = lambda r: np.abs(np.linalg.inv(np.asarray(r.fitted.cov))[~np.eye(4, dtype=bool)]).sum()
    assert off(sparse) < 0.5 * off(dense)
    trace = _run(sparse)
    assert np.all(np.diff(trace) >= -1e-6 * np.abs(trace[1:]))


def test_float32_fit_runs(rng):
    Y = _binary_data(rng, n=40)
    model = F.factor_analysis(F.Bernoulli("jaakkola"), 2, jax.random.PRNGKey(0), num_columns=5, dtype=jnp.float32)
    result = _em(model, Y, max_iter=10)
    assert result.posteriors.mean.dtype == jnp.float32 and result.log_z.dtype == jnp.float32
    trace = _run(result)
    assert np.all(np.isfinite(trace)) and trace[-1] > trace[0]


def test_bad_input_is_rejected(rng):
    model = F.factor_analysis(F.Bernoulli(), 2, jax.random.PRNGKey(0), num_columns=3)
    with pytest.raises(ValueError, match="0 or 1"):
        F.observe(model, np.full((4, 3), 2.0))
    with pytest.raises(ValueError, match="shape"):
        F.observe(model, np.zeros((4, 2)))
    with pytest.raises(ValueError, match="mask"):
        F.observe(model, np.where(np.eye(4, 3) > 0, np.nan, 0.0))
    with pytest.raises(ValueError, match="bound"):
        F.Bernoulli("exact")
    with pytest.raises(ValueError, match="num_classes"):
        F.StickBreaking(1)
    with pytest.raises(ValueError, match="increasing"):
        F.Ordinal(3, thresholds=[1.0, 0.0])
    with pytest.raises(ValueError, match="exactly once"):
        F.factor_analysis([((0, 1), F.Bernoulli()), ((1, 2), F.PoissonColumn())], 2, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="classes 0"):
        F.observe(F.factor_analysis([(0, F.StickBreaking(3))], 1, jax.random.PRNGKey(0)), np.array([[3.0]]))
    for weights in ([1.0, 2.0], [1.0, -1.0, 1.0, 1.0], [0.0] * 4):
        with pytest.raises(ValueError, match="weights"):
            F.observe(model, np.zeros((4, 3)), weights=weights)
    with pytest.raises(ValueError, match="model"):
        F.observe(np.zeros(3), np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"vj.factor.observe\(model, Y, mask\)"):
        vj.infer(model, F.EM())  # the model alone, without its data
    with pytest.raises(ValueError, match="max_iter"):
        F.EM(max_iter=0)
    with pytest.raises(ValueError, match="tol"):
        F.EM(tol=-1.0)


# ----------------------------------------------------------------------------------------------
# EM and the E-step as methods of vj.infer: programs, warm starts, warnings, held-out rows

from helpers import programs  # noqa: E402


def test_em_compiles_once_restarts_where_it_ended_and_warns_unconverged(rng):
    # 11 rows × 3 columns, one latent: shapes no other test uses, so the counts start cold
    model = F.factor_analysis(F.Bernoulli("jaakkola"), 1, jax.random.PRNGKey(4), num_columns=3)
    data = F.observe(model, _binary_data(rng, n=11, d=3, l=1))
    other = F.observe(model, _binary_data(rng, n=11, d=3, l=1))
    method = F.EM(max_iter=200)
    post, cold = programs(vj.infer, data, method)
    assert cold <= 2, f"a cold EM fit built {cold} programs"
    d = post.diagnostics
    assert isinstance(post, F.FactorPosterior) and isinstance(post, vj.Posterior) and post.is_lower_bound
    assert bool(d.converged) and d.method == "EM" and isinstance(d.info, F.FactorInfo)
    k = int(d.iterations)
    trace = np.asarray(d.objective_trace)
    assert trace.shape == (201,) and np.isnan(trace[0]) and trace[k] == float(post.log_z)
    assert np.all(np.isfinite(trace[1:k + 1])) and np.all(np.isnan(trace[k + 1:]))
    assert float(d.stationarity) < 1e-6
    np.testing.assert_allclose(float(post.log_z), float(post.diagnostics.objective_trace[k]))
    np.testing.assert_allclose(float(jnp.sum(post.posteriors.bound)), float(post.log_z), rtol=1e-12)
    # what EM learned is in the posterior and its state
    assert isinstance(post.state, F.EMState)
    np.testing.assert_array_equal(post.state.model.blocks[0].loadings, post.fitted.blocks[0].loadings)
    assert not np.allclose(post.fitted.blocks[0].loadings, model.blocks[0].loadings)
    _, new_data = programs(vj.infer, other, method)
    again, warm = programs(lambda: vj.infer(data, method, init=post))
    _, settings = programs(vj.infer, data, F.EM(max_iter=200, tol=1e-4, e_step_tol=1e-8))
    assert (new_data, warm, settings) == (0, 0, 0), (new_data, warm, settings)
    assert int(again.diagnostics.iterations) == 1
    np.testing.assert_allclose(float(again.log_z), float(post.log_z), rtol=1e-10)
    # a fit stopped by max_iter warns (a ConvergenceWarning from vj.infer), and a refit from it goes on
    with pytest.warns(vj.ConvergenceWarning, match="EM .* stopped after 3 iterations"):
        short = vj.infer(data, F.EM(max_iter=3))
    assert not bool(short.diagnostics.converged) and int(short.diagnostics.iterations) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", vj.ConvergenceWarning)
        resumed = vj.infer(data, method, init=short)
    np.testing.assert_allclose(float(resumed.log_z), float(post.log_z), rtol=1e-6)
    # the posterior reads as N Gaussians q(z_n)
    assert post.mean.shape == (11, 1) and post.covariance.shape == (11, 1, 1) and post.std.shape == (11, 1)
    means, variances = post.marginals(np.ones((2, 1)))
    assert means.shape == variances.shape == (11, 2)
    assert post.sample(jax.random.PRNGKey(0), 5).shape == (5, 11, 1)
    assert "EM (E-step" in post.summary() and "converged" in post.summary()
    with pytest.raises(ValueError, match="EM"):
        vj.infer(data, method, init=jnp.zeros(3))


def test_e_step_method_fits_held_out_rows_under_the_learned_model(rng):
    Y = _binary_data(rng, n=11, d=3, l=1)
    model = F.factor_analysis(F.Bernoulli("jaakkola"), 1, jax.random.PRNGKey(4), num_columns=3)
    post = vj.infer(F.observe(model, Y), F.EM(max_iter=200))
    # at the EM fixed point, the E-step under the learned model gives the same posteriors and bound
    rows = vj.infer(F.observe(post.fitted, Y), F.EStep())
    d = rows.diagnostics
    assert bool(d.converged) and d.method == "EStep"
    np.testing.assert_array_equal(rows.fitted.blocks[0].loadings, post.fitted.blocks[0].loadings)
    np.testing.assert_allclose(float(rows.log_z), float(post.log_z), rtol=1e-8)
    np.testing.assert_allclose(np.asarray(rows.mean), np.asarray(post.mean), atol=1e-5)
    k = int(d.iterations)
    trace = np.asarray(d.objective_trace)
    assert trace[k] == float(rows.log_z) and np.all(np.diff(trace[:k + 1]) >= -1e-9 * np.abs(trace[1:k + 1]))
    # held-out entries of new rows: their posteriors from the observed entries, then the predictive
    held = np.ones(Y.shape, bool)
    held[np.arange(11), np.arange(11) % 3] = False
    test = vj.infer(F.observe(post.fitted, Y, held), F.EStep())
    log_p = np.asarray(F.log_predictive(test, Y))  # Bernoulli columns: quadrature, no key needed
    assert np.all(np.isfinite(log_p)) and np.all(log_p < 0)
    again, warm = programs(lambda: vj.infer(F.observe(post.fitted, Y, held), F.EStep(), init=test))
    assert warm == 0 and int(again.diagnostics.iterations) <= 2
    # the piecewise bound's E-step settles at the bound's noise floor (its steps wander there without a
    # measurable contraction): every point stops, converged, well before the iteration cap
    piecewise = F.factor_analysis(F.Bernoulli(), 1, jax.random.PRNGKey(4), num_columns=3)
    rows = vj.infer(F.observe(eqx.tree_at(lambda m: m.blocks[0].loadings, piecewise, post.fitted.blocks[0].loadings),
                              Y, held), F.EStep())
    assert bool(rows.diagnostics.converged) and int(rows.diagnostics.iterations) < 1000
    assert int(rows.diagnostics.info.e_step_unconverged) == 0
