"""Parameters are strongly typed arrays of one floating dtype, so an optimiser's update never changes a type.

Kernels, potentials, Gaussian factors and the model builders store what they are given (Python numbers
included) as arrays with ``weak_type=False``: optax returns strongly typed arrays, and a jitted step
whose inputs changed from weak to strong types would be traced and compiled again (three times in all,
before the fix: 10 s each for a GP). The dtype is the data's where there is data (a builder's X, a
`Sites` group's H), else that of the arrays passed, else ``jnp.result_type(float)``
(`vijax._checks.as_param`). Shapes are tiny: what is measured is types and compilations.
"""

import pickle

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import vijax as vj
from helpers import built

K_ = vj.gp.kernels
P = vj.potentials

# Programs built by XLA (compiled, or loaded from the persistent cache) come from `helpers.built`; the
# functions traced for jit, in order, from this listener (listeners cannot be unregistered in every JAX
# version, so the tests read differences).
_TRACED = []


def _on_trace(event, duration, **kwargs):
    if event == "/jax/core/compile/jaxpr_trace_duration":
        _TRACED.append(kwargs.get("fun_name"))


jax.monitoring.register_event_duration_secs_listener(_on_trace)


def _floating_leaves(tree):
    return [x for x in jax.tree_util.tree_leaves(tree)
            if isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating)]


def _assert_typed(tree, dtype, what=""):
    leaves = _floating_leaves(tree)
    assert leaves, f"{what}: no floating parameters"
    weak = [x for x in leaves if getattr(x, "weak_type", False)]
    assert not weak, f"{what}: {len(weak)} weakly typed parameter(s) in {tree!r}"
    assert {np.dtype(x.dtype) for x in leaves} == {np.dtype(dtype)}, f"{what}: dtypes {[x.dtype for x in leaves]}"


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(8, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=8)
    return X, y


# ------------------------------------------------------------------------------- a jitted optax loop


def _run(step, params, opt_state, *args, num_steps=3):
    """The programs each of ``num_steps`` calls of ``step`` built."""
    counts = []
    for _ in range(num_steps):
        before = built()[0]
        params, opt_state, value = step(params, opt_state, *args)
        jax.block_until_ready(value)
        counts.append(built()[0] - before)
        assert np.isfinite(float(value))
    return counts, params


def _exact_negative_log_marginal(params, X, y):
    """−log N(y | 0, K + s²I): the exact GP regression evidence from the kernel matrix alone."""
    kernel, likelihood = params
    A = kernel(X) + likelihood.scale**2 * jnp.eye(X.shape[0], dtype=X.dtype)
    L = jnp.linalg.cholesky(A)
    alpha = jax.scipy.linalg.cho_solve((L, True), y)
    return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(L))) + 0.5 * X.shape[0] * jnp.log(2 * jnp.pi)


def test_optax_loop_over_python_float_parameters_compiles_once(data):
    """The documentation's kernel and likelihood, built from Python floats, under optax.adam: one
    program for three steps (before: one per step, as the parameters' types went weak → strong)."""
    X, y = (jnp.asarray(a) for a in data)
    params = (K_.SquaredExponential(lengthscale=1.0, variance=1.0), P.Gaussian(loc=y, scale=0.3))
    optimizer = optax.adam(1e-2)

    @eqx.filter_jit
    def step(params, opt_state, X, y):
        value, grad = eqx.filter_value_and_grad(_exact_negative_log_marginal)(params, X, y)
        updates, opt_state = optimizer.update(grad, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, value

    counts, final = _run(step, params, optimizer.init(eqx.filter(params, eqx.is_array)), X, y)
    assert counts[0] >= 1 and counts[1:] == [0, 0], counts
    _assert_typed(final, jnp.float64, "after three steps")


def test_optax_loop_through_vj_infer_compiles_once(data):
    """ML-II by hand: a jitted step on the Laplace evidence of a `vj.gp.model` (kernel and noise scale
    from Python floats) builds its programs on the first call only."""
    X, y = data
    optimizer = optax.adam(1e-2)
    params = (K_.SquaredExponential(lengthscale=1.0, variance=1.0), jnp.log(P.Gaussian(scale=0.3).scale))

    def negative_log_z(params, X, y):
        kernel, log_scale = params
        model = vj.gp.model(kernel, X, P.Gaussian(loc=y, scale=jnp.exp(log_scale)))
        return -vj.infer(model, vj.Laplace()).log_z

    @eqx.filter_jit
    def step(params, opt_state, X, y):
        value, grad = eqx.filter_value_and_grad(negative_log_z)(params, X, y)
        updates, opt_state = optimizer.update(grad, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, value

    counts, final = _run(step, params, optimizer.init(params), X, y)
    assert counts[0] >= 1 and counts[1:] == [0, 0], counts
    _assert_typed(final, jnp.float64, "after three steps")


def test_fit_hyperparameters_traces_its_step_once(data):
    """vj.gp.fit_hyperparameters with its default L-BFGS, whose optax state holds weakly typed scalars:
    the fit-and-gradient program and the direction are each traced once over several steps (before:
    twice, then three times with weakly typed kernel parameters), and the fit is in one program only."""
    X, y = data
    start = len(_TRACED)
    fit = vj.gp.fit_hyperparameters(K_.SquaredExponential(lengthscale=1.0, variance=1.0), X,
                                    P.Gaussian(loc=y, scale=0.3), vj.Laplace(), max_iter=3, tol=0.0)
    assert int(fit.diagnostics.iterations) == 3
    assert int(fit.diagnostics.num_grad_evals) >= 4  # the start and a fit per trial
    traced = _TRACED[start:]
    assert traced.count("_value_and_grad") == 1 and traced.count("_lbfgs_direction") == 1, traced


# ------------------------------------------------------------- every parameter, from Python floats


def _kernels():
    se = K_.SquaredExponential(lengthscale=1.0, variance=1.0)
    return {
        "SquaredExponential": se,
        "Matern12": K_.Matern12(0.5, 2.0),
        "Matern32": K_.Matern32(lengthscale=[1.0, 2.0]),
        "Matern52": K_.Matern52(1, 2),  # Python ints
        "Periodic": K_.Periodic(1.0, 2.0, 0.5),
        "Linear": K_.Linear(variance=0.3),
        "White": K_.White(0.1),
        "Sum": se + K_.White(0.1),
        "Product": K_.Linear(1.0) * K_.Matern32(),
    }


def _potentials():
    y = np.linspace(-1.0, 1.0, 5)
    return {
        "Heaviside": P.Heaviside(0.1),
        "Gaussian": P.Gaussian(loc=0.5, scale=0.2),
        "Laplace": P.Laplace(loc=y, scale=0.1),
        "StudentT": P.StudentT(df=3.0, loc=y, scale=0.1),
        "Cauchy": P.Cauchy(scale=2.0),
        "Poisson": P.Poisson(np.array([0, 1, 3])),  # integer counts become floating
        "Masked": P.Masked(P.StudentT(df=3.0, scale=0.1), np.array([True, False])),
    }


def _factors():
    G = vj.GaussianFactor
    return {
        "isotropic": G.isotropic(3, variance=1.0),
        "isotropic_mean": G.isotropic(3, variance=2.0, mean=0.5),
        "diagonal": G.diagonal([1.0, 2.0], mean=0.0),
        "dense": G.dense([0.0, 1.0], [[2.0, 0.5], [0.5, 1.0]], jitter=1e-6),
        "precision": G.precision([0.0, 1.0], [[2.0, 0.5], [0.5, 1.0]]),
        "linear_gaussian": G.linear_gaussian([[1.0, 0.0], [0.5, 2.0]], [0.3, -0.2], noise_variance=0.5),
    }


def _builders(X, y):
    labels = (y > 0).astype(int)
    counts = np.round(np.exp(y)).astype(int)
    glm = vj.glm
    return {
        "logistic_regression": glm.logistic_regression(X, labels, prior_variance=1.0),
        "probit_regression": glm.probit_regression(X, labels, prior_variance=2.0),
        "poisson_regression": glm.poisson_regression(X, counts, prior_variance=1.0, offset=0.5),
        "robust_student_t": glm.robust_regression(X, y, "student_t", scale=0.5, df=4.0, prior_variance=1.0),
        "robust_laplace": glm.robust_regression(X, y, "laplace", scale=0.5),
        "linear_regression": glm.linear_regression(X, y, noise_scale=0.3, prior_variance=1.0),
        "hierarchical_linear": glm.hierarchical_linear(X, y, df=4.0),
        "gp_regression": vj.gp.model(K_.SquaredExponential(1.0, 1.0), X, P.StudentT(df=3.0, loc=y, scale=0.1),
                                     mean=0.5, jitter=1e-6),
        "gp_classification": vj.gp.model(K_.Matern32(1.0, 1.0) + K_.White(0.01), X, P.Heaviside(0.1), labels=labels),
        "sites": vj.LatentLinearModel(vj.GaussianFactor.isotropic(2, 1.0),
                                      vj.Sites(X, P.Gaussian(scale=0.1), offset=1.0)),
    }


@pytest.mark.parametrize("name", list(_kernels()))
def test_kernel_parameters_are_strongly_typed(name):
    _assert_typed(_kernels()[name], jnp.result_type(float), name)


@pytest.mark.parametrize("name", list(_potentials()))
def test_potential_parameters_are_strongly_typed(name):
    _assert_typed(_potentials()[name], jnp.result_type(float), name)


@pytest.mark.parametrize("name", list(_factors()))
def test_gaussian_factor_parameters_are_strongly_typed(name):
    _assert_typed(_factors()[name], jnp.result_type(float), name)


@pytest.mark.parametrize("name", list(_builders(np.zeros((8, 2)), np.linspace(-1, 1, 8))))
def test_builder_parameters_are_strongly_typed(name, data):
    X, y = data
    _assert_typed(_builders(X, y)[name], X.dtype, name)


def test_x32_default_is_float32():
    """Without x64 the default floating dtype is float32 (read at construction, not at import)."""
    with jax.enable_x64(False):
        for name, obj in {**_kernels(), **_potentials(), **_factors()}.items():
            _assert_typed(obj, jnp.float32, name)


# ---------------------------------------------------------------------------------- float32 data


def test_float32_data_give_float32_parameters(data):
    X, y = (a.astype(np.float32) for a in data)
    for name, model in _builders(X, y).items():
        _assert_typed(model, jnp.float32, name)
    # GP models: the kernel and likelihood (float64 from Python floats) take the inputs' dtype.
    gp = _builders(X, y)["gp_regression"]
    _assert_typed(gp.kernel, jnp.float32, "GP kernel")
    # A potential takes the dtype of the arrays it is given, a site group that of its H.
    _assert_typed(P.StudentT(df=3.0, loc=y, scale=0.1), jnp.float32, "StudentT(loc=float32)")
    _assert_typed(K_.SquaredExponential(np.ones(2, np.float32), 1.0), jnp.float32, "ARD float32")
    _assert_typed(vj.Sites(X, P.Heaviside(0.1)), jnp.float32, "Sites(float32 H)")
    _assert_typed(vj.GaussianFactor.dense(np.zeros(2), np.eye(2, dtype=np.float32)), jnp.float64, "promoted")
    # And a float32 model stays float32 through a fit.
    post = vj.infer(_builders(X, y)["robust_student_t"], vj.Laplace())
    assert post.mean.dtype == post.log_z.dtype == jnp.float32


# ---------------------------------------------------------------------------- under transformations


def test_construction_under_jit_vmap_and_grad(data):
    X, y = data

    def build(scale):
        return P.StudentT(df=3.0, loc=y, scale=scale), K_.SquaredExponential(scale, 1.0)

    # A Python float argument is a weakly typed tracer: stored strongly typed.
    _assert_typed(jax.jit(build)(0.5), jnp.float64, "jit, Python float")
    # A float32 tracer keeps its dtype where it is the only array passed.
    kernel = jax.jit(lambda s: K_.Matern32(s, s))(jnp.float32(0.5))
    _assert_typed(kernel, jnp.float32, "jit, float32")
    _assert_typed(jax.vmap(build)(jnp.array([0.1, 0.2])), jnp.float64, "vmap")
    grad = jax.grad(lambda s: jnp.sum(build(s)[1](X)) + jnp.sum(build(s)[0].log_phi(jnp.zeros(8))))(0.5)
    assert np.isfinite(grad)


def test_pickle_tree_and_equality_round_trips(data):
    X, y = data
    objects = {**_kernels(), **_potentials(), **_factors(), "model": _builders(X, y)["linear_regression"]}
    for name, obj in objects.items():
        again = pickle.loads(pickle.dumps(obj))
        assert bool(eqx.tree_equal(obj, again)), name
        leaves, treedef = jax.tree_util.tree_flatten(obj)
        rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
        assert bool(eqx.tree_equal(obj, rebuilt)) and type(rebuilt) is type(obj), name
        _assert_typed(again, jnp.result_type(float), name)


def test_reprs_show_values_and_shapes():
    y = np.zeros(100)
    assert repr(P.StudentT(df=3.0, loc=y, scale=0.1)) == "StudentT(df=3.0, loc=f64[100], scale=0.1)"
    assert repr(P.StudentT(df=3.0, loc=y.astype(np.float32), scale=0.1)) == "StudentT(df=3.0, loc=f32[100], scale=0.1)"
    assert repr(P.Masked(P.Gaussian(scale=2.0), np.ones(3, bool))) == \
        "Masked(potential=Gaussian(loc=0.0, scale=2.0), mask=bool[3])"
    assert repr(P.Logistic()) == "Logistic()"
    assert repr(K_.SquaredExponential(lengthscale=1.0, variance=1.0)) == "SquaredExponential(lengthscale=1.0, variance=1.0)"
    assert "weak" not in repr(vj.GaussianFactor.isotropic(3, variance=1.0))
    # Under tracing the parameters are tracers, shown by dtype and shape.
    shown = []
    jax.jit(lambda s: shown.append(repr(P.Gaussian(scale=s))) or s)(jnp.ones(4))
    assert shown == ["Gaussian(loc=f64[], scale=f64[4])"]


def test_integer_settings_accept_numpy_integers_and_refuse_bools_and_floats():
    """One check (`_checks.integer`) for every integer setting: NumPy integers pass as ints, bools and floats fail."""
    from vijax import _checks

    assert _checks.integer("n", np.int64(3), "owner") == 3 and type(_checks.integer("n", np.int64(3), "owner")) is int
    assert _checks.integer("n", 0, "owner", minimum=0) == 0
    for bad, minimum, words in [(True, 1, "a positive integer"), (2.0, 1, "a positive integer"),
                                (-1, 0, "a non-negative integer"), (4, 8, "an integer ≥ 8")]:
        with pytest.raises(ValueError, match=f"owner: `n` must be {words}, got"):
            _checks.integer("n", bad, "owner", minimum)
