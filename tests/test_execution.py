"""How a fit executes: compiled programs counted, program sizes budgeted, memory checked at scale.

- **Compile counts.** Every program XLA builds (compiled, or loaded from the persistent cache) fires
  JAX's backend-compile event; a listener counts them. For every method: a cold fit builds at most 2
  programs (its start and its fit; the methods whose start is the shared site expansion need only the
  fit once another method has started from it), a refit on new data of the same shapes, a warm refit
  from its own posterior and a fit with a new tolerance or damping build none, and a warm start from
  another method's posterior builds at most its conversion.
- **Program sizes.** The lowered text of each method's default fit, and of the shared start, on the
  demo problem (breast cancer, D = 31) stays under a committed budget: deterministic, so a change that
  bloats a program fails here instead of slowing every user's first call.
- **Memory by structure.** The default fit of every method that takes a sparse H on a realsim-shaped
  model (D = 20,958, N = 36,000, 3.7 M non-zeros) is lowered and compiled, never run; its
  ``memory_analysis()`` (arguments plus temporaries) stays under 2 GB. A D × D, N × D or nnz × D array
  would need 3.5 GB, 6 GB or 600 GB. The other families likewise, each at a scale where the wrong
  structure cannot hide: the sparse GP bounds' value and gradient at N = 200,000 inputs and M = 64
  inducing points (within 1 GB: an N × N kernel would be 320 GB), and a factor model's EM and E-step on
  20,000 rows × 500 binary columns with 5 factors (within 3 GB, about 28 arrays of N × D: an N × N
  matrix would be 3.2 GB, a D × D matrix per row 40 GB).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

import vijax as vj
from helpers import logistic_data, sparse_logistic_rows

from helpers import programs  # noqa: E402


def _model(seed):
    # N = 37, D = 5: shapes no other test uses, so the counts start cold in this process.
    X, y = logistic_data(np.random.default_rng(seed), 37, 5)
    return vj.glm.logistic_regression(X, y)


# name: (the method, two configurations that differ only in settings that do not shape the program)
NG, GN = vj.solvers.NewtonCG, vj.solvers.GaussNewton
METHODS = {
    "GKL": (vj.GKL(), (vj.GKL(), vj.GKL(tol=1e-9))),
    "GKL-diagonal": (vj.GKL(covariance=vj.covariance.Diagonal()),
                     (vj.GKL(covariance=vj.covariance.Diagonal()), vj.GKL(covariance=vj.covariance.Diagonal(), tol=1e-8))),
    "GKL-chevron-newton": (vj.GKL(covariance=vj.covariance.Chevron(2), solver=NG()),
                           (vj.GKL(covariance=vj.covariance.Chevron(2), solver=NG()),
                            vj.GKL(covariance=vj.covariance.Chevron(2), solver=NG(tol=1e-9)))),
    "EP": (vj.EP(), (vj.EP(damping=0.8), vj.EP(damping=0.6, tol=1e-7))),
    "EP-power": (vj.EP(power=0.7), (vj.EP(power=0.7), vj.EP(power=0.9, tol=1e-7))),
    "LVB": (vj.LVB(), (vj.LVB(), vj.LVB(tol=1e-8))),
    "Laplace": (vj.Laplace(), (vj.Laplace(solver=GN()), vj.Laplace(solver=GN(tol=1e-9)))),
    "MAP": (vj.MAP(), (vj.MAP(solver=GN()), vj.MAP(solver=GN(tol=1e-9)))),
    "MeanField": (vj.MeanField(), (vj.MeanField(solver=NG()), vj.MeanField(solver=NG(tol=1e-9)))),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_programs_are_built_once_and_reused(name):
    method, (tuned, retuned) = METHODS[name]
    model, other = _model(0), _model(1)
    post, cold = programs(vj.infer, model, method)
    assert bool(post.diagnostics.converged)
    assert cold <= 2, f"{name}: a cold fit built {cold} programs"
    _, new_data = programs(vj.infer, other, method)
    _, warm = programs(lambda: vj.infer(model, method, init=post))
    vj.infer(model, tuned)
    _, settings = programs(vj.infer, model, retuned)
    laplace = vj.infer(model, vj.Laplace())
    _, converted = programs(lambda: vj.infer(model, method, init=laplace))
    assert (new_data, warm, settings) == (0, 0, 0), f"{name}: new data {new_data}, warm {warm}, settings {settings}"
    assert converted <= 1, f"{name}: a start from a Laplace posterior built {converted} programs"


def test_warm_refit_restarts_where_the_fit_ended():
    """``post.state`` is the fit's final State: a refit from it takes at most one (final) step."""
    model = _model(0)
    for method in (vj.GKL(), vj.EP(damping=0.8), vj.LVB(), vj.Laplace()):
        post = vj.infer(model, method)
        again = method.fit(model, method.to_state(model, post))
        assert int(again.diagnostics.iterations) <= 3
        np.testing.assert_allclose(again.log_z, post.log_z, rtol=1e-10)
        np.testing.assert_allclose(again.mean, post.mean, atol=1e-7)


# ------------------------------------------------------------------------------------------ program sizes

# Characters of lowered StableHLO on the demo problem (breast cancer, D = 31, N = 569), measured when
# the budgets were set (and about 15% above that): raise one only with the reason in the commit.
BUDGETS = {
    "start": 60_000,  # 52,202 when set
    "GKL": 126_000,  # 109,450
    "EP": 222_000,  # 192,793 (236,927 before the schedules shared one loop)
    "Laplace": 86_000,  # 74,648
    "LVB": 148_000,  # 128,734
}


def _demo_model():
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return vj.glm.logistic_regression(np.hstack([np.ones((X.shape[0], 1)), X]), y.astype(float))


@pytest.fixture(scope="module")
def demo_model():
    return _demo_model()


def _fit_text(method, model):
    state = jax.eval_shape(lambda: method.init_state(model))
    state = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), state)
    return jax.jit(lambda model, state: method.solve(model, state)).lower(model, state).as_text()


@pytest.mark.parametrize("name", ["start", "GKL", "EP", "Laplace", "LVB"])
def test_program_sizes_stay_within_budget(demo_model, name):
    if name == "start":
        text = jax.jit(lambda m: vj.start.expand_at_mode(m)).lower(demo_model).as_text()
    else:
        text = _fit_text(getattr(vj, name)(), demo_model)
    assert len(text) <= BUDGETS[name], f"{name}: {len(text)} characters, budget {BUDGETS[name]}"


# ------------------------------------------------------------------------------------------ memory at scale

_REALSIM = dict(dim=20_958, num=36_000, nnz=3_700_000)


def _gigabytes(compiled):
    """What a compiled program holds at once: its arguments plus its temporaries, in GiB."""
    memory = compiled.memory_analysis()
    return (memory.argument_size_in_bytes + memory.temp_size_in_bytes) / 2**30


@pytest.fixture(scope="module")
def realsim():
    values, indices, y = sparse_logistic_rows(**_REALSIM)
    H = jsparse.BCOO((jnp.asarray(3.0 * y[indices[:, 0]] * values), jnp.asarray(indices, jnp.int32)),
                     shape=(_REALSIM["num"], _REALSIM["dim"]), indices_sorted=True, unique_indices=True)
    return vj.LatentLinearModel(vj.GaussianFactor.isotropic(_REALSIM["dim"], 1.0), vj.Sites(H, vj.potentials.Logistic()))


@pytest.mark.parametrize("method", [vj.GKL(covariance=vj.covariance.Diagonal()),
                                    vj.GKL(covariance=vj.covariance.Chevron(20)),
                                    vj.MeanField(),
                                    vj.LVB(variances="lanczos", num_lanczos=20, max_iter=5)],
                         ids=["gkl-diagonal", "gkl-chevron", "meanfield", "lvb-lanczos"])
def test_sparse_fits_allocate_by_structure(realsim, method):
    total = _gigabytes(jax.jit(lambda m: vj.infer(m, method)).lower(realsim).compile())
    assert total < 2.0, f"{total:.2f} GB"


def test_sparse_gp_bounds_allocate_by_structure():
    N, M = 200_000, 64
    X, Z = jnp.zeros((N, 2)), jnp.zeros((M, 2))
    kernel = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=1.0)
    collapsed = jax.jit(lambda X, y: vj.gp.sparse.collapsed_elbo(kernel, X, y, 0.1, Z))
    assert _gigabytes(collapsed.lower(X, jnp.zeros(N)).compile()) < 1.0
    bound = lambda m, R, X, labels: vj.gp.sparse.svgp_elbo(m, R, kernel, Z, X, vj.potentials.Logistic(), labels=labels)
    gradient = jax.jit(jax.value_and_grad(bound, argnums=(0, 1)))
    assert _gigabytes(gradient.lower(jnp.zeros(M), jnp.eye(M), X, jnp.ones(N)).compile()) < 1.0


@pytest.mark.parametrize("method", [vj.factor.EM(), vj.factor.EStep()], ids=["em", "e-step"])
def test_factor_fits_allocate_by_structure(method):
    model = vj.factor.factor_analysis(vj.factor.Bernoulli("jaakkola"), 5, jax.random.PRNGKey(0), num_columns=500)
    data = vj.factor.observe(model, np.zeros((20_000, 500)))
    assert _gigabytes(jax.jit(lambda m: vj.infer(m, method)).lower(data).compile()) < 3.0
