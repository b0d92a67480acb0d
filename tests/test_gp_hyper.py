"""vj.gp.fit_hyperparameters' restarts and bounds: the best run is kept, every step stays in the box, and
the restarts reuse the first run's programs."""

import numpy as np
import optax
import pytest

import vijax as vj
from helpers import programs
from vijax.gp import hyper

K_ = vj.gp.kernels

# scikit-learn's plot_gpc data, the problem of test_defaults' ML-II test (the same programs).
_RNG = np.random.RandomState(0)
X = _RNG.uniform(0, 5, 100)[:50, None]
LABELS = (X[:, 0] > 2.5).astype(int)
LOGISTIC = vj.potentials.Logistic()
# A lengthscale of 1e-4 is far below the inputs' spacing (≥ 0.002): K = vI, every ∫σ(f)N(f | 0, v) df is
# ½ whatever v, so log Ẑ ≈ 50 log ½ with a gradient of ~1e-80: a flat plateau that one run cannot leave.
BAD = K_.SquaredExponential(lengthscale=1e-4, variance=1.0)
BOUNDS = {"lengthscale": (1e-4, 10.0), "variance": (0.1, 100.0)}


def _fit(kernel, **kwargs):
    return vj.gp.fit_hyperparameters(kernel, X, LOGISTIC, vj.Laplace(), labels=LABELS, max_iter=30, **kwargs)


def _inside(kernel, bounds):
    for name, (low, high) in bounds.items():
        value = float(getattr(kernel, name))
        assert low * (1 - 1e-12) <= value <= high * (1 + 1e-12), (name, value)


def test_restarts_keep_the_best_run_and_reuse_the_programs():
    single = _fit(BAD, bounds=BOUNDS)
    assert single.converged and float(single.log_z) < 50 * np.log(0.5) + 0.1  # stuck on the plateau
    restarted, built = programs(lambda: _fit(BAD, bounds=BOUNDS, num_restarts=3, seed=0))
    assert built == 0  # the restarts (same shapes) run on the first run's programs
    runs = np.asarray(restarted.run_log_z)
    assert runs.shape == (4,) and runs[0] == float(single.log_z)  # run 0 is the single run
    assert float(restarted.log_z) == runs.max() and float(restarted.log_z) > float(single.log_z) + 20
    assert float(restarted.log_z) == float(restarted.posterior.log_z)
    _inside(restarted.kernel, BOUNDS)
    # Each restart is the run a call from its drawn start makes: the same final log Ẑ.
    params = (BAD, {})
    starts = [hyper._draw(params, hyper._limits(BOUNDS, params, "test"), rng) for rng in [np.random.default_rng(0)]
              for _ in range(3)]
    for r, (kernel, _) in enumerate(starts, start=1):
        _inside(kernel, BOUNDS)
        np.testing.assert_allclose(float(_fit(kernel, bounds=BOUNDS).log_z), runs[r], rtol=1e-12)
    # The best run's diagnostics are reported.
    trace = np.asarray(restarted.diagnostics.objective_trace)
    assert trace[-1] == float(restarted.log_z)


def test_bounds_clip_every_step():
    box = {"variance": (0.5, 2.0)}  # log Ẑ rises with the variance (separable data): the bound is active
    fit = _fit(K_.SquaredExponential(1.0, 1.0), bounds=box, tol=1e-12)
    assert fit.converged and float(fit.kernel.variance) == pytest.approx(2.0, rel=1e-12)
    # At the box's optimum: the lengthscale's gradient vanishes (the reported norm leaves out the variance,
    # whose gradient pushes out of the box), and a larger variance would be better.
    assert float(fit.diagnostics.grad_norm) < 1e-4
    free = _fit(K_.SquaredExponential(1.0, 1.0))
    assert float(free.kernel.variance) > 2.0 and float(free.log_z) > float(fit.log_z)
    # One pair bounds every parameter; a start outside the box is projected into it.
    both = _fit(K_.SquaredExponential(20.0, 1.0), bounds=(0.5, 2.0))
    _inside(both.kernel, {"lengthscale": (0.5, 2.0), "variance": (0.5, 2.0)})
    # A given optax optimizer's updates are clipped too.
    adam = vj.gp.fit_hyperparameters(K_.SquaredExponential(1.0, 1.0), X, LOGISTIC, vj.Laplace(), labels=LABELS,
                                      optimizer=optax.adam(0.5), max_iter=4, bounds=box)
    _inside(adam.kernel, {"variance": (0.5, 2.0)})


def test_restart_and_bound_arguments_are_validated():
    kernel = K_.SquaredExponential(1.0, 1.0)
    with pytest.raises(ValueError, match="within `bounds`"):
        _fit(kernel, num_restarts=2)
    with pytest.raises(ValueError, match="`num_restarts` must be a non-negative integer"):
        _fit(kernel, num_restarts=-1, bounds=(0.1, 10.0))
    for bad in ((1.0, 0.5), (0.0, 1.0), (1.0, np.inf), 3.0, (1.0, 2.0, 3.0)):
        with pytest.raises(ValueError, match=r"pair \(low, high\)"):
            _fit(kernel, bounds=bad)
    with pytest.raises(ValueError, match=r"names \['scale'\].*\['lengthscale', 'variance'\]"):
        _fit(kernel, bounds={"scale": (0.1, 1.0)})
    with pytest.raises(ValueError, match="`seed`"):
        _fit(kernel, num_restarts=1, bounds=(0.1, 10.0), seed="zero")
    with pytest.raises(ValueError, match="`likelihood` is None"):
        vj.gp.fit_hyperparameters(kernel, X, None, vj.Laplace(), labels=LABELS)
    with pytest.raises(ValueError, match="likelihood=None"):
        vj.gp.fit_hyperparameters(kernel, X, LOGISTIC, vj.gp.multiclass.NestedEP(), labels=LABELS, num_classes=2)
    with pytest.raises(ValueError, match="needs `labels`"):
        vj.gp.fit_hyperparameters(kernel, X, None, vj.gp.multiclass.NestedEP(), num_classes=2)
