"""vj.sklearn: the estimators fit the models they wrap, work in pipelines and grid searches, and save."""

import pickle

import jax
import numpy as np
import pytest

pytest.importorskip("sklearn")
import equinox as eqx
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import vijax as vj
from vijax import sklearn as vjs

# One shape for the GLM tests: 40 rows (padded to 64) or 20 per fold (padded to 32), 3 features.
_RNG = np.random.default_rng(0)
X = _RNG.normal(size=(40, 3)) @ np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.4], [0.0, 0.0, 1.0]])
y = np.where(X @ np.array([3.0, -4.0, 1.5]) + 0.5 + _RNG.logistic(size=40) > 0, "yes", "no")


def _with_ones(A):
    return np.concatenate([A, np.ones((A.shape[0], 1))], axis=1)


@pytest.fixture(scope="module")
def logistic():
    return vjs.BayesianLogisticRegression(method="laplace").fit(X, y)


def test_logistic_estimator_fits_the_glm_with_an_intercept(logistic):
    """The estimator's posterior is the GLM's on [X, 1] with labels yes -> 1 (padded: exact, see test_padding)."""
    model = vj.pad_sites(vj.glm.logistic_regression(_with_ones(X), (y == "yes").astype(float)), 64)
    direct = vj.infer(model, vj.Laplace())
    np.testing.assert_allclose(logistic.coef_, direct.mean[:3], rtol=1e-8)
    np.testing.assert_allclose(logistic.intercept_, direct.mean[3], rtol=1e-8)
    np.testing.assert_allclose(logistic.log_z_, direct.log_z, rtol=1e-10)
    proba = logistic.predict_proba(X[:5])
    np.testing.assert_allclose(proba[:, 1], vj.glm.predict_proba(direct, _with_ones(X[:5])), rtol=1e-8)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert list(logistic.classes_) == ["no", "yes"]
    assert set(logistic.predict(X)) <= {"no", "yes"}
    assert logistic.score(X, y) > 0.7


def test_pipeline_and_grid_search_choose_method_and_prior():
    # 80 rows in 2 folds of 40: each fold fit is padded to 64 rows, the fixture's compiled program;
    # refit=False keeps the search from compiling a fit of all 80 rows.
    rng = np.random.default_rng(1)
    X2 = rng.normal(size=(80, 3)) @ np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.4], [0.0, 0.0, 1.0]])
    y2 = np.where(X2 @ np.array([3.0, -4.0, 1.5]) + 0.5 + rng.logistic(size=80) > 0, "yes", "no")
    pipe = make_pipeline(StandardScaler(), vjs.BayesianLogisticRegression(method="laplace"))
    # (the method is a parameter like any other: "bayesianlogisticregression__method": ["gkl", "ep"])
    search = GridSearchCV(pipe, {"bayesianlogisticregression__prior_variance": [0.01, 10.0]}, cv=2,
                          scoring="neg_log_loss", refit=False)
    search.fit(X2, y2)
    # A prior variance of 0.01 shrinks every coefficient to ~0, so p ≈ ½ everywhere: the search must prefer 10.
    assert search.best_params_["bayesianlogisticregression__prior_variance"] == 10.0
    # The same folds with scikit-learn's own L2 logistic regression (C = prior variance): a close log loss.
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    reference = cross_val_score(make_pipeline(StandardScaler(), LogisticRegression(C=10.0)), X2, y2, cv=2,
                                scoring="neg_log_loss").mean()
    assert abs(search.best_score_ - reference) <= 0.1


def test_fitted_estimator_and_posterior_save_and_load(logistic, tmp_path):
    again = pickle.loads(pickle.dumps(logistic))
    np.testing.assert_array_equal(again.predict_proba(X), logistic.predict_proba(X))
    # A posterior alone: equinox serialisation into a template of the same structure.
    path = tmp_path / "posterior.eqx"
    eqx.tree_serialise_leaves(path, logistic.posterior_)
    model = vj.glm.logistic_regression(_with_ones(X), (y == "yes").astype(float))
    template = jax.eval_shape(lambda: vj.infer(vj.pad_sites(model, 64), vj.Laplace()))
    loaded = eqx.tree_deserialise_leaves(path, template)
    assert float(loaded.log_z) == logistic.log_z_
    np.testing.assert_array_equal(vj.glm.predict_proba(loaded, _with_ones(X)), logistic.predict_proba(X)[:, 1])


@pytest.mark.slow  # a GP compilation each (about 10 s of CPU)
def test_gp_regressor_is_exact_gp_regression():
    """Gaussian likelihood: the predictive mean and sd are the closed-form GP regression ones."""
    x = np.linspace(-2.0, 2.0, 15)[:, None]
    t = np.sin(2.0 * x[:, 0])
    reg = vjs.GPRegressor(likelihood="gaussian", scale=0.2, method="laplace").fit(x, t)
    x_new = np.array([[-1.3], [0.25], [2.5]])
    k = lambda a, b: np.exp(-0.5 * (a - b.T) ** 2)  # the default kernel: lengthscale 1, variance 1
    A = k(x, x) + 0.04 * np.eye(15)
    mean = k(x_new, x) @ np.linalg.solve(A, t)
    var = 1.0 - np.sum(k(x_new, x) * np.linalg.solve(A, k(x, x_new)).T, axis=1)
    got_mean, got_sd = reg.predict(x_new, return_std=True)
    np.testing.assert_allclose(got_mean, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_sd, np.sqrt(var), rtol=1e-4, atol=1e-6)
    assert reg.score(x, t) > 0.9


@pytest.mark.slow
def test_gp_classifier_separates_and_predicts_probabilities():
    x = np.linspace(-3.0, 3.0, 30)[:, None]
    labels = np.where(x[:, 0] > 0.0, 1, 0)
    clf = vjs.GPClassifier(kernel=vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=4.0)).fit(x, labels)
    proba = clf.predict_proba(np.array([[-2.0], [2.0]]))
    assert proba[0, 0] > 0.8 and proba[1, 1] > 0.8
    assert clf.score(x, labels) == 1.0
    assert np.isfinite(clf.log_z_) and clf.kernel_ is not None


# Three classes over 24 two-dimensional inputs: the shapes of tests/test_multiclass_api.py (its programs).
def _three_blobs(rng, n=24):
    labels = np.arange(n) % 3
    return rng.normal(size=(n, 2)) + 3.0 * np.eye(3)[labels][:, :2], labels


X3, Y3 = _three_blobs(np.random.default_rng(11))
X3_TEST, Y3_TEST = _three_blobs(np.random.default_rng(12))
NAMES = np.array(["virginica", "setosa", "versicolor"])  # sorted: setosa (1), versicolor (2), virginica (0)
ORDER = [1, 2, 0]  # classes_ in terms of the integer classes
KERNEL3 = vj.gp.kernels.SquaredExponential(lengthscale=1.0, variance=3.0)


def test_gp_classifier_with_three_classes_is_nested_ep():
    mc = vj.gp.multiclass
    clf = vjs.GPClassifier(kernel=KERNEL3).fit(X3, NAMES[Y3])
    assert list(clf.classes_) == ["setosa", "versicolor", "virginica"]
    # The same numbers as nested EP called directly on the labels 0 … C − 1 in the order of classes_.
    encoded = np.searchsorted(clf.classes_, NAMES[Y3])
    direct = vj.infer(mc.model(KERNEL3, X3, encoded, 3), mc.NestedEP())
    assert isinstance(clf.posterior_, mc.NestedEPPosterior)
    np.testing.assert_allclose(clf.log_z_, float(direct.log_z), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(clf.posterior_.mean), np.asarray(direct.mean), rtol=1e-10, atol=1e-12)
    proba = clf.predict_proba(X3_TEST)
    np.testing.assert_allclose(proba, np.asarray(mc.predict_proba(direct, X3_TEST)), rtol=1e-10, atol=1e-14)
    assert proba.shape == (24, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(clf.predict(X3_TEST), clf.classes_[proba.argmax(axis=1)])
    assert clf.n_iter_ == int(direct.diagnostics.iterations)
    # Held-out accuracy: blobs 3 apart with unit noise (0.91 for the Bayes rule; here 20 of 24 right);
    # scikit-learn's one-vs-rest GPC with the same fixed kernel (21 of 24) is the reference, within 2 of 24.
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    accuracy = clf.score(X3_TEST, NAMES[Y3_TEST])
    reference = GaussianProcessClassifier(ConstantKernel(3.0, "fixed") * RBF(1.0, "fixed"), optimizer=None)
    reference_accuracy = reference.fit(X3, NAMES[Y3]).score(X3_TEST, NAMES[Y3_TEST])
    assert accuracy >= 0.8 and accuracy >= reference_accuracy - 0.09, (accuracy, reference_accuracy)


def test_gp_classifier_ml2_with_three_classes():
    """optimize=True: ML-II over the one shared kernel, the fit of vj.gp.fit_hyperparameters(num_classes=3)."""
    clf = vjs.GPClassifier(kernel=KERNEL3, optimize=True, max_iter=30).fit(X3, Y3)
    fit = vj.gp.fit_hyperparameters(KERNEL3, X3, None, vj.gp.multiclass.NestedEP(), labels=Y3, num_classes=3,
                                    max_iter=30)
    np.testing.assert_allclose(clf.log_z_, float(fit.log_z), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(clf.kernel_.log_lengthscale), np.asarray(fit.kernel.log_lengthscale))
    trace = np.asarray(fit.diagnostics.objective_trace)
    assert fit.converged and trace[-1] > trace[0] + 1.0 and clf.n_iter_ == int(fit.diagnostics.iterations)
    # A maximum: refits (same program, other kernel values) a step away in each log-parameter are no higher.
    import equinox as eqx

    mc = vj.gp.multiclass
    for where in (lambda k: k.log_lengthscale, lambda k: k.log_variance):
        for step in (-0.05, 0.05):
            kernel = eqx.tree_at(where, clf.kernel_, where(clf.kernel_) + step)
            assert float(vj.infer(mc.model(kernel, X3, Y3, 3), mc.NestedEP()).log_z) < clf.log_z_
    # The posterior predicts under the fitted kernel.
    proba = clf.predict_proba(X3_TEST)
    np.testing.assert_allclose(proba, np.asarray(mc.predict_proba(fit.posterior, X3_TEST)), rtol=1e-10, atol=1e-14)


def test_gp_classifier_restarts_and_softmax_option():
    # Binary: n_restarts_optimizer and bounds pass through to vj.gp.fit_hyperparameters.
    x = np.linspace(-3.0, 3.0, 30)[:, None]
    labels = np.where(x[:, 0] > 0.0, 1, 0)
    bounds = {"lengthscale": (1e-4, 10.0), "variance": (0.1, 100.0)}
    bad = vj.gp.kernels.SquaredExponential(lengthscale=1e-4, variance=1.0)
    clf = vjs.GPClassifier(kernel=bad, optimize=True, n_restarts_optimizer=2, bounds=bounds, random_state=0)
    clf.fit(x, labels)
    seed = int(np.random.RandomState(0).randint(np.iinfo(np.int32).max))
    fit = vj.gp.fit_hyperparameters(bad, x, vj.potentials.Logistic(), vj.Laplace(), labels=labels.astype(float),
                                    max_iter=50, num_restarts=2, bounds=bounds, seed=seed)
    np.testing.assert_allclose(clf.log_z_, float(fit.log_z), rtol=1e-12)
    assert clf.log_z_ == float(np.max(fit.run_log_z)) and clf.score(x, labels) == 1.0
    with pytest.raises(ValueError, match="n_restarts_optimizer"):
        vjs.GPClassifier(optimize=True, n_restarts_optimizer=-1).fit(x, labels)
    # Three classes by the softmax bound: a lower bound, below nested EP's estimate of its own model's evidence.
    soft = vjs.GPClassifier(kernel=KERNEL3, multiclass_method="softmax").fit(X3, Y3)
    assert soft.posterior_.is_lower_bound and np.isfinite(soft.log_z_)
    proba = soft.predict_proba(X3_TEST)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(proba, soft.predict_proba(X3_TEST))  # a fixed key: deterministic
    assert soft.score(X3_TEST, Y3_TEST) >= 0.8
    with pytest.raises(ValueError, match="multiclass_method"):
        vjs.GPClassifier(multiclass_method="ovr").fit(X3, Y3)


def test_bad_method_and_multiclass_labels_raise():
    with pytest.raises(ValueError, match="method"):
        vjs.BayesianLogisticRegression(method="nuts").fit(X, y)
    with pytest.raises(ValueError, match="Only binary"):
        vjs.BayesianLogisticRegression().fit(X, np.arange(40) % 3)
    with pytest.raises(ValueError, match="at least 2 classes"):
        vjs.GPClassifier().fit(X, np.zeros(40))


# scikit-learn's own estimator checks: about 55 checks, each fitting several shapes (one compilation
# each), so minutes per estimator; `check_estimator` with the GLMs' method set to Laplace (the fastest
# to compile; the checks concern the scikit-learn contract, not the method).
CHECKED = [
    vjs.BayesianLogisticRegression(method="laplace"),
    vjs.BayesianProbitRegression(method="laplace"),
    vjs.BayesianPoissonRegression(method="laplace"),
    vjs.BayesianRobustRegression(method="laplace"),
    vjs.GPClassifier(),
    vjs.GPRegressor(),
]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", CHECKED, ids=lambda e: type(e).__name__)
def test_check_estimator(estimator):
    from sklearn.utils.estimator_checks import check_estimator

    # Checks that cannot apply are listed, with why, in vijax.sklearn._EXPECTED_FAILED_CHECKS.
    expected = vjs._expected_failed_checks(estimator)
    results = check_estimator(estimator, on_fail=None, expected_failed_checks=expected)
    failed = [(r["check_name"], repr(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    assert not failed
    assert {r["check_name"] for r in results if r["status"] == "xfail"} <= set(expected)


@pytest.mark.parametrize("estimator", CHECKED, ids=lambda e: type(e).__name__)
def test_predicting_before_fit_raises_not_fitted(estimator):
    """scikit-learn's contract (its slow `check_estimators_unfitted`, here in the default suite): `predict` on an
    unfitted estimator raises `NotFittedError`, not an `AttributeError` from a fitted attribute."""
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        clone(estimator).predict(np.ones((3, 2)))
