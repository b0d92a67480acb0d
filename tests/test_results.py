"""Results a user can read and trust (issue 23, item 4): `Diagnostics` and its method records, the method
base class, `repr`, `post.std` and `post.summary`, `is_lower_bound` for a non-finite log Z, and warnings
for fits that did not converge."""

import dataclasses
import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax.methods._base import AbstractMethod


@pytest.fixture(scope="module")
def logistic():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = (X @ np.array([1.0, -1.0, 0.5]) + rng.normal(size=30) > 0).astype(float)
    return vj.glm.logistic_regression(X, y, prior_variance=1.0)


@pytest.fixture(scope="module")
def gkl_post(logistic):
    return vj.infer(logistic, vj.GKL())


# ---------------------------------------------------------------------------------------------- Diagnostics
def test_diagnostics_by_keyword_with_defaults():
    trace = jnp.array([1.0, 2.0, jnp.nan])
    d = vj.Diagnostics(iterations=jnp.array(1), status=vj.Status.CONVERGED, objective_trace=trace, method="M",
                       solver="S")
    assert bool(d.converged) and d.reason == "converged" and d.status.dtype == jnp.int32
    assert int(d.num_value_evals) == int(d.num_grad_evals) == int(d.num_hvp_evals) == 0
    assert np.isnan(float(d.grad_norm)) and np.isnan(float(d.stationarity)) and d.info is None
    assert d.grad_norm.dtype == trace.dtype
    with pytest.raises(TypeError):
        vj.Diagnostics(jnp.array(1), jnp.array(True), jnp.nan, jnp.nan, trace, 0, 0, 0, "M", "S")
    # the ten common fields, by keyword, as gp/ and factor/ build them
    full = vj.Diagnostics(iterations=3, status=vj.Status.MAX_ITER, stationarity=1e-3, grad_norm=2e-3, objective_trace=trace,
                          num_value_evals=4, num_grad_evals=5, num_hvp_evals=6, method="M", solver="S")
    assert (int(full.num_value_evals), int(full.num_grad_evals), int(full.num_hvp_evals)) == (4, 5, 6)
    assert dataclasses.replace(full, method="N").method == "N"
    assert not bool(full.converged) and "status=max_iter" in repr(full)
    # the code from a run's flags: non-finite first, then fell back, converged, stalled, out of iterations
    of = vj.Status.of
    assert [int(of(True)), int(of(False)), int(of(False, stalled=True)), int(of(True, value=jnp.nan)),
            int(of(True, fell_back=True))] == [0, 1, 2, 3, 4]


def test_method_records(logistic, gkl_post):
    ep = vj.infer(logistic, vj.EP())
    info = ep.diagnostics.info
    assert isinstance(info, vj.EPInfo) and bool(ep.diagnostics.converged)
    assert 0 <= float(info.max_change) < 1e-4 and not bool(info.fallback)
    assert int(info.skipped) == 0 and int(info.shrunk) == 0

    lap = vj.infer(logistic, vj.Laplace())
    assert isinstance(lap.diagnostics.info, vj.LaplaceInfo)
    assert not bool(lap.diagnostics.info.fallback) and float(lap.diagnostics.info.jitter) == 0.0

    # methods without a record: info is None
    assert gkl_post.diagnostics.info is None


def test_meanfield_free_form_reports_its_work():
    """Free-form mean field: iterations are sweeps, one bound evaluation at the start and after each."""
    prior = vj.GaussianFactor.dense(jnp.zeros(3), jnp.array([[1.0, 0.5, 0.2], [0.5, 1.0, 0.5], [0.2, 0.5, 1.0]]))
    model = vj.LatentLinearModel(prior, vj.Sites(vj.Identity(3), vj.potentials.Probit()))
    post = vj.infer(model, vj.MeanField())
    d = post.diagnostics
    assert d.solver == "coordinate_ascent" and bool(d.converged) and d.info is None
    sweeps = int(d.iterations)
    assert int(d.num_value_evals) == sweeps + 1
    assert np.all(np.isfinite(d.objective_trace[: sweeps + 1])) and np.all(np.isnan(d.objective_trace[sweeps + 1:]))
    assert float(d.stationarity) <= 1e-9 and np.isnan(float(d.grad_norm))


# --------------------------------------------------------------------------------------------- method base
def test_every_method_is_an_abstract_method(logistic):
    assert vj.AbstractMethod is vj.methods.AbstractMethod is AbstractMethod
    for cls in (vj.GKL, vj.EP, vj.Laplace, vj.MAP, vj.LVB, vj.MeanField):
        assert issubclass(cls, AbstractMethod)
    with pytest.raises(TypeError):
        AbstractMethod()
    with pytest.raises(ValueError, match=r"the class vj\.GKL, not an instance.*vj\.GKL\(\)"):
        vj.infer(logistic, vj.GKL)
    with pytest.raises(ValueError, match="AbstractMethod"):
        vj.infer(logistic, object())

    class Duck:  # a fit method alone no longer makes a method
        def fit(self, model, init=None):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="AbstractMethod"):
        vj.infer(logistic, Duck())


def test_iteration_caps_are_named_max_iter():
    assert vj.MeanField(max_iter=7).max_iter == 7 and vj.EP(inner_max_iter=9).inner_max_iter == 9
    with pytest.raises(TypeError):
        vj.MeanField(max_sweeps=5)
    with pytest.raises(TypeError):
        vj.EP(inner_iter=4)
    with pytest.raises(ValueError, match="max_iter"):
        vj.MeanField(max_iter=0)
    with pytest.raises(ValueError, match="schedule"):  # EP's own checks still run
        vj.EP(schedule="bogus")


# ------------------------------------------------------------------------------------------ repr, std, summary
def test_repr_shows_values(gkl_post):
    text = repr(gkl_post)
    assert "weak_" not in text and "f64[]" not in text
    assert f"log_z={float(gkl_post.log_z):.6g}" in text and "is_lower_bound=True" in text
    assert "mean=float64[3]" in text and "objective_trace=float64[" in text
    d = gkl_post.diagnostics
    drepr = repr(d)
    assert f"iterations={int(d.iterations)}" in drepr and "status=converged" in drepr and "method='GKL'" in drepr
    assert "info=None" in drepr
    # under tracing: the default (equinox) form, no error
    seen = []
    jax.jit(lambda p: seen.append(repr(p)) or p.log_z)(gkl_post)
    assert seen and seen[0].startswith("Posterior(") and "weak_" not in repr(gkl_post)


def test_std_and_summary(gkl_post):
    np.testing.assert_allclose(gkl_post.std, np.sqrt(np.diag(gkl_post.covariance)), rtol=1e-12)
    assert gkl_post.std.shape == (3,)
    table = gkl_post.summary(names=["a", "bb", "c"])
    lines = table.splitlines()
    assert "converged" in lines[0] and "GKL" in lines[0]
    assert f"{float(gkl_post.log_z):.6g}" in lines[1] and "lower bound" in lines[1]
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in lines[3:]}
    assert list(rows) == ["a", "bb", "c"]
    np.testing.assert_allclose([r[0] for r in rows.values()], gkl_post.mean, rtol=1e-4)
    np.testing.assert_allclose([r[1] for r in rows.values()], gkl_post.std, rtol=1e-4)
    assert re.search(r"^w\[2\]\s", gkl_post.summary(), re.M)
    assert "1 more coordinates" in gkl_post.summary(max_rows=2)
    with pytest.raises(ValueError, match="2 names for 3 coordinates"):
        gkl_post.summary(names=["a", "b"])


# -------------------------------------------------------------------------------------- lower bound and NaN
def test_non_finite_log_z_is_never_a_bound(gkl_post):
    nan = dataclasses.replace(gkl_post, log_z=jnp.array(jnp.nan))
    assert nan.is_lower_bound is False
    assert dataclasses.replace(gkl_post, log_z=jnp.array(-jnp.inf)).is_lower_bound is False
    assert gkl_post.is_lower_bound is True
    # under jit: a traced flag, False where log Z is not finite
    flag = jax.jit(lambda p, z: dataclasses.replace(p, log_z=z).is_lower_bound)
    assert not bool(flag(gkl_post, jnp.array(jnp.nan))) and bool(flag(gkl_post, jnp.array(-1.0)))
    # under vmap: one flag per fit
    flags = jax.vmap(lambda z: dataclasses.replace(gkl_post, log_z=z).is_lower_bound)(jnp.array([0.0, jnp.nan]))
    assert flags.tolist() == [True, False]
    assert "not finite" in nan.summary()


def test_warm_start_from_a_concrete_fit_compiles_once(logistic, gkl_post):
    # A posterior fitted outside jit and one returned by jit have one pytree structure (the bound claim
    # is static, the flag computed), so a jitted warm-started step is traced once, not once per kind.
    traces = []

    @eqx.filter_jit
    def step(model, init):
        traces.append(None)
        return vj.infer(model, vj.GKL(), init=init)

    post = step(logistic, gkl_post)
    post = step(logistic, post)
    assert len(traces) == 1 and post.is_lower_bound is True
    assert jax.tree_util.tree_structure(post) == jax.tree_util.tree_structure(gkl_post)


def test_failed_fit_warns_and_is_not_a_bound():
    """A log joint that is -inf everywhere: the G-KL fit cannot succeed; infer says so."""
    model = vj.LatentLinearModel(vj.GaussianFactor.isotropic(2, 1.0),
                                 vj.Sites(jnp.eye(2), vj.potentials.Custom(lambda x: jnp.full_like(x, -jnp.inf))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.warns(vj.ConvergenceWarning, match="not a lower bound"):
            post = vj.infer(model, vj.GKL())
    assert not np.isfinite(float(post.log_z)) and post.is_lower_bound is False


# ---------------------------------------------------------------------------------- non-convergence warnings
@pytest.mark.parametrize("method", [
    vj.Laplace(solver=vj.solvers.NewtonCG(max_iter=1)),
    vj.MAP(solver=vj.solvers.NewtonCG(max_iter=1)),
    vj.GKL(solver=vj.solvers.NewtonCG(max_iter=1)),
    vj.EP(max_iter=1, fallback=False),
    vj.LVB(max_iter=2),
    vj.MeanField(solver=vj.solvers.NewtonCG(max_iter=1)),
], ids=["Laplace", "MAP", "GKL", "EP", "LVB", "MeanField"])
def test_every_method_warns_when_it_stops_early(logistic, method):
    # Laplace and MAP start at the shared start's mode, where one step converges: start them at 0.
    init = jnp.zeros(logistic.dim) if isinstance(method, (vj.Laplace, vj.MAP)) else None
    with pytest.warns(vj.ConvergenceWarning, match="without converging"):
        post = vj.infer(logistic, method, init=init)
    assert not bool(post.diagnostics.converged)


def test_free_form_meanfield_warns_when_it_stops_early():
    prior = vj.GaussianFactor.dense(jnp.zeros(3), jnp.array([[1.0, 0.9, 0.8], [0.9, 1.0, 0.9], [0.8, 0.9, 1.0]]))
    model = vj.LatentLinearModel(prior, vj.Sites(vj.Identity(3), vj.potentials.StudentT(3.0, loc=jnp.ones(3),
                                                                                         scale=0.3)))
    with pytest.warns(vj.ConvergenceWarning, match="MeanField \\(coordinate_ascent\\) stopped after 1 "):
        post = vj.infer(model, vj.MeanField(max_iter=1))
    assert int(post.diagnostics.iterations) == 1 and not bool(post.diagnostics.converged)


def test_free_form_meanfield_on_a_student_t_gp():
    """The README's robust GP with `vj.MeanField()`: the free-form bound is finite, a bound, converged, and
    at least the Gaussian-factor mean-field bound (a smaller family)."""
    rng = np.random.default_rng(7)
    X = rng.uniform(-3, 3, size=(12, 1))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=12)
    y[3] += 4.0  # an outlier
    kernel = vj.gp.kernels.SquaredExponential(1.0, 1.0) + vj.gp.kernels.White(1e-2)
    model = vj.gp.model(kernel, X, vj.potentials.StudentT(df=3.0, loc=y, scale=0.1))
    free = vj.infer(model, vj.MeanField())
    gaussian = vj.infer(model, vj.MeanField(free_form=False))
    assert free.diagnostics.solver == "coordinate_ascent" and bool(free.diagnostics.converged)
    assert np.isfinite(float(free.log_z)) and free.is_lower_bound is True
    assert gaussian.is_lower_bound is True and float(free.log_z) >= float(gaussian.log_z) - 1e-8
    assert np.all(np.isfinite(free.std)) and np.all(free.std > 0)
