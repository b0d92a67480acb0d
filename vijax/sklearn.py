"""scikit-learn estimators over vijax's models (needs the ``sklearn`` extra: ``pip install "vijax[sklearn]"``).

``vj.sklearn`` loads this module on first access. The inference method is a parameter (``"gkl"``, ``"ep"``,
``"laplace"``, ``"map"``, ``"lvb"``, ``"meanfield"`` or an instance such as ``vj.GKL(covariance=...)``), so
``GridSearchCV`` can choose it. GLM fits pad the rows to the next power of two (`vj.pad_sites`, exact), so
folds of similar sizes share one compiled program. Estimators and posteriors pickle.
"""

from __future__ import annotations

import math
from typing import Self

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _checks
from . import glm as _glm
from . import gp as _gp
from . import potentials as _potentials
from .gp.kernels import AbstractKernel
from .methods import EP, GKL, LVB, MAP, AbstractMethod, Laplace, MeanField
from .inference import infer as _infer
from .padding import pad_sites as _pad_sites

__all__ = ["BayesianLogisticRegression", "BayesianProbitRegression", "BayesianPoissonRegression",
           "BayesianRobustRegression", "GPClassifier", "GPRegressor"]
__dir__ = __all__.copy

_METHODS = {"gkl": GKL, "ep": EP, "laplace": Laplace, "map": MAP, "lvb": LVB, "meanfield": MeanField}


def _method(method, owner, name="method", table=_METHODS, types=AbstractMethod, kind="a vijax method (e.g. vj.GKL())"):
    """``method`` if an instance of ``types``, else a new instance of its name in ``table``."""
    if isinstance(method, types):
        return method
    if isinstance(method, str) and method.lower() in table:
        return table[method.lower()]()
    raise ValueError(f"{owner}: `{name}` must be one of {sorted(table)} or {kind}; got {method!r}.")


def _padded_size(n):
    """Rows after padding: the next power of two (at least 16) up to 4096, then the next multiple of 4096."""
    if n <= 4096:
        return max(16, 1 << math.ceil(math.log2(max(n, 1))))
    return 4096 * math.ceil(n / 4096)


def _store(estimator, params):
    """Keep ``__init__``'s arguments unchanged as attributes, as scikit-learn requires."""
    for name, value in params.items():
        if name != "self":
            setattr(estimator, name, value)


def _with_intercept(X, fit_intercept):
    X = jnp.asarray(X, dtype=jnp.result_type(float))
    return jnp.concatenate([X, jnp.ones((X.shape[0], 1), X.dtype)], axis=1) if fit_intercept else X


def _test_inputs(estimator, X, fit_intercept=False):
    check_is_fitted(estimator)
    return _with_intercept(validate_data(estimator, X, reset=False), fit_intercept)


class _GLM(BaseEstimator):
    """The GLM estimators' parameters and fit."""

    def __init__(self, method: str | AbstractMethod = "gkl", prior_variance: float = 1.0, fit_intercept: bool = True):
        _store(self, locals())

    def _fit_glm(self, build, X):
        """Fit the padded GLM; set posterior_, log_z_, coef_ and intercept_."""
        model = build(_with_intercept(X, self.fit_intercept))
        post = _infer(_pad_sites(model, _padded_size(X.shape[0])), _method(self.method, type(self).__name__))
        self.posterior_ = post
        self.log_z_ = float(post.log_z)
        mean = np.asarray(post.mean)
        self.coef_ = mean[:-1] if self.fit_intercept else mean
        self.intercept_ = float(mean[-1]) if self.fit_intercept else 0.0
        return self


class _ClassifierMixin(ClassifierMixin):
    """Label handling shared by the classifiers: classes_, the encoding 0 … C − 1 and predict."""

    _binary = True  # only two classes (the GLMs); GPClassifier takes more

    def _encode(self, y):
        check_classification_targets(y)
        self.classes_, encoded = np.unique(y, return_inverse=True)
        if self._binary and len(self.classes_) != 2:
            raise ValueError(f"{type(self).__name__}: Only binary classification is supported: y must have "
                             f"exactly 2 classes, got {len(self.classes_)} class(es) {list(self.classes_)[:10]}; "
                             "for more classes use vj.sklearn.GPClassifier or vj.gp.multiclass.")
        if len(self.classes_) < 2:
            raise ValueError(f"{type(self).__name__}: y must have at least 2 classes, got {len(self.classes_)} "
                             f"class {list(self.classes_)}.")
        return encoded

    def predict(self, X: ArrayLike) -> np.ndarray:
        """The class with the largest predictive probability, shape ``(n_samples,)``."""
        proba = self.predict_proba(X)  # first: it raises NotFittedError before `classes_` is looked up
        return self.classes_[np.argmax(proba, axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = not self._binary
        return tags


class _GLMClassifier(_ClassifierMixin, _GLM):
    _builder = None

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit q(w) to the training data ``X`` (n_samples, n_features) and binary labels ``y``."""
        X, y = validate_data(self, X, y)
        y01 = self._encode(y).astype(float)
        return self._fit_glm(lambda Xd: type(self)._builder(Xd, y01, self.prior_variance), X)

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Posterior predictive class probabilities, shape ``(n_samples, 2)`` in the order of ``classes_``."""
        X = _test_inputs(self, X, self.fit_intercept)
        p1 = np.asarray(_glm.predict_proba(self.posterior_, X), dtype=float)
        return np.stack([1.0 - p1, p1], axis=1)


class BayesianLogisticRegression(_GLMClassifier):
    """Bayesian logistic regression, p(w) ∝ N(w | 0, v I) ∏ σ(y_n x_nᵀw), fitted by any vijax method.

    Args:
        method: ``"gkl"`` (default; ``log_z_`` a lower bound), ``"ep"``, ``"laplace"``, ``"map"``,
            ``"lvb"``, ``"meanfield"``, or a vijax method instance.
        prior_variance: v, the prior variance of every weight and of the intercept (default 1).
        fit_intercept: append a column of ones to X (its weight is ``intercept_``).

    Attributes:
        posterior_: the fitted `vj.Posterior` over (coef, intercept).
        log_z_: the method's log evidence estimate (float).
        coef_: posterior mean weights, shape ``(n_features,)``.
        intercept_: posterior mean intercept (0.0 without ``fit_intercept``).
        classes_: the two class labels.
    """

    _builder = staticmethod(_glm.logistic_regression)


class BayesianProbitRegression(_GLMClassifier):
    """Bayesian probit regression, p(w) ∝ N(w | 0, v I) ∏ Φ(y_n x_nᵀw).

    Parameters and attributes as for `BayesianLogisticRegression` (LVB has no bound for probit sites and raises).
    """

    _builder = staticmethod(_glm.probit_regression)


class BayesianPoissonRegression(RegressorMixin, _GLM):
    """Bayesian Poisson regression with log link; ``predict`` is the posterior predictive mean count.

    Parameters and attributes as for `BayesianLogisticRegression`.
    """

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit q(w) to covariates ``X`` and non-negative counts ``y``."""
        X, y = validate_data(self, X, y, y_numeric=True)
        if np.any(y < 0):
            raise ValueError("BayesianPoissonRegression: counts y must be non-negative; got negative values.")
        return self._fit_glm(lambda Xd: _glm.poisson_regression(Xd, y, self.prior_variance), X)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """E[y_* | x_*] = ⟨exp(x_*ᵀw)⟩_q = exp(m_* + v_*/2), shape ``(n_samples,)``."""
        X = _test_inputs(self, X, self.fit_intercept)
        mean, var = self.posterior_.marginals(X)
        return np.asarray(jnp.exp(mean + 0.5 * var), dtype=float)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True
        return tags


class BayesianRobustRegression(RegressorMixin, _GLM):
    """Bayesian linear regression with Student-t or Laplace noise; ``predict`` is the posterior mean of x_*ᵀw.

    ``"ep"`` suits heavy-tailed noise. The other parameters and the attributes as for `BayesianLogisticRegression`.

    Args:
        likelihood: ``"student_t"`` or ``"laplace"``.
        scale: the noise scale.
        df: Student-t degrees of freedom.
    """

    def __init__(self, method: str | AbstractMethod = "gkl", likelihood: str = "student_t", scale: float = 1.0,
                 df: float = 3.0, prior_variance: float = 1.0, fit_intercept: bool = True):
        _store(self, locals())

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit q(w) to covariates ``X`` and real targets ``y``."""
        X, y = validate_data(self, X, y, y_numeric=True)
        return self._fit_glm(lambda Xd: _glm.robust_regression(Xd, y, self.likelihood, self.scale, self.df,
                                                               self.prior_variance), X)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Posterior mean of x_*ᵀw, shape ``(n_samples,)``."""
        return np.asarray(_test_inputs(self, X, self.fit_intercept) @ self.posterior_.mean, dtype=float)


# These checks draw real-valued positive targets for a positive_only regressor; vj.potentials.Poisson needs counts.
_POISSON_NEEDS_COUNTS = "the check's targets are not integer counts; the Poisson likelihood needs counts"
_EXPECTED_FAILED_CHECKS = {
    "BayesianPoissonRegression": {name: _POISSON_NEEDS_COUNTS for name in [
        "check_n_features_in", "check_n_features_in_after_fitting", "check_regressors_train",
        "check_regressor_data_not_an_array", "check_regressors_no_decision_function", "check_fit_idempotent",
        "check_fit_check_is_fitted"]},
}


def _expected_failed_checks(estimator) -> dict[str, str]:
    """The `check_estimator` checks that cannot apply to ``estimator``, with why (``expected_failed_checks=``)."""
    return dict(_EXPECTED_FAILED_CHECKS.get(type(estimator).__name__, {}))


# scikit-learn's kernels default to bounds (1e-5, 1e5) for every hyperparameter; restarts draw within them.
_DEFAULT_BOUNDS = (1e-5, 1e5)
_MULTICLASS = {"nested_ep": _gp.multiclass.NestedEP, "softmax": lambda: _gp.softmax.SoftmaxBound("log")}


def _fit_gp(est, X, likelihood, labels, method, num_classes=None):
    """Fit `vj.gp.model` (with ``num_classes``: `vj.gp.multiclass.model`); set kernel_, posterior_, log_z_, n_iter_."""
    kernel = _gp.kernels.SquaredExponential(lengthscale=1.0, variance=1.0) if est.kernel is None else est.kernel
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"`kernel` must be a vj.gp.kernels kernel or None, got {type(kernel).__name__}.")
    X = jnp.asarray(X, dtype=jnp.result_type(float))
    if est.optimize:
        n = _checks.integer("n_restarts_optimizer", est.n_restarts_optimizer, type(est).__name__, 0)
        bounds = est.bounds if est.bounds is not None or n == 0 else _DEFAULT_BOUNDS
        seed = int(check_random_state(est.random_state).randint(np.iinfo(np.int32).max)) if n else 0
        fit = _gp.fit_hyperparameters(kernel, X, likelihood, method, labels=labels, num_classes=num_classes,
                                      max_iter=est.max_iter, num_restarts=n, bounds=bounds, seed=seed)
        est.kernel_, post, diagnostics = fit.kernel, fit.posterior, fit.diagnostics
    else:
        model = (_gp.model(kernel, X, likelihood, labels=labels) if num_classes is None
                 else _gp.multiclass.model(kernel, X, labels, num_classes))
        est.kernel_, post = kernel, _infer(model, method)
        diagnostics = post.diagnostics
    est.n_iter_ = max(1, int(diagnostics.iterations))
    est.posterior_ = post
    est.log_z_ = float(post.log_z)
    return est


class GPClassifier(_ClassifierMixin, BaseEstimator):
    """GP classification, binary or multi-class.

    Two classes: f ~ GP(0, k), p(y = 1 | f) = σ(f) or Φ(f) (`vj.gp.model`), fitted by ``method``. More classes:
    f_c ~ GP(0, k) sharing ``kernel`` in one joint model (`vj.gp.multiclass.model`), fitted by ``multiclass_method``:
    ``"nested_ep"``, the multinomial probit by nested EP (deterministic, ``log_z`` differentiable in the kernel),
    or ``"softmax"``, the softmax log bound (``predict_proba`` averages 4000 draws with a fixed key).

    Args:
        kernel: a `vj.gp.kernels` kernel; ``None`` is ``SquaredExponential(lengthscale=1, variance=1)``.
        likelihood: ``"logistic"`` or ``"probit"`` (two classes).
        method: ``"laplace"`` (default), ``"ep"``, ``"gkl"``, ``"lvb"`` (logistic only) or an instance.
        optimize: ML-II: maximise ``log_z`` over the kernel's parameters (`vj.gp.fit_hyperparameters`).
        max_iter: the number of ML-II steps at most (per run).
        multiclass_method: ``"nested_ep"`` (default), ``"softmax"``, or an instance (C > 2 classes).
        n_restarts_optimizer: further ML-II runs from log-uniform draws within ``bounds``; the best is kept.
        bounds: natural-scale bounds clipping every ML-II step: a pair ``(low, high)`` or a dict name → pair.
            ``None``: unbounded, or, with restarts, scikit-learn's default kernel bounds (1e-5, 1e5).
        random_state: the restarts' draws (an int, a ``numpy.random.RandomState`` or None).

    Attributes:
        posterior_: the fit over the latent f at the training inputs (C > 2: over the class-major f).
        log_z_: the method's log evidence estimate.
        kernel_: the kernel used (fitted if ``optimize``).
        n_iter_: ML-II steps taken (``optimize=True``; the kept run's), else the inference method's iterations.
        classes_: the class labels, sorted; ``predict_proba``'s columns follow them.
    """

    _binary = False

    def __init__(self, kernel: AbstractKernel | None = None, likelihood: str = "logistic",
                 method: str | AbstractMethod = "laplace", optimize: bool = False, max_iter: int = 50,
                 multiclass_method: str | AbstractMethod = "nested_ep", n_restarts_optimizer: int = 0,
                 bounds: tuple | dict | None = None, random_state: int | np.random.RandomState | None = None):
        _store(self, locals())

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit q(f) to inputs ``X`` (n_samples, n_features) and labels ``y`` (two classes or more)."""
        X, y = validate_data(self, X, y)
        encoded = self._encode(y)
        if len(self.classes_) > 2:
            method = _method(self.multiclass_method, "GPClassifier", "multiclass_method", _MULTICLASS,
                             (_gp.multiclass.NestedEP, _gp.softmax.SoftmaxBound),
                             "a vj.gp.multiclass.NestedEP or vj.gp.softmax.SoftmaxBound")
            return _fit_gp(self, X, None, encoded, method, num_classes=len(self.classes_))
        if self.likelihood not in ("logistic", "probit"):
            raise ValueError(f"GPClassifier: `likelihood` must be 'logistic' or 'probit', got {self.likelihood!r}.")
        likelihood = _potentials.Logistic() if self.likelihood == "logistic" else _potentials.Probit()
        return _fit_gp(self, X, likelihood, encoded.astype(float), _method(self.method, "GPClassifier"))

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """p(y_* | x_*, data) under q(f_*), shape ``(n_samples, n_classes)`` in the order of ``classes_``."""
        X = _test_inputs(self, X)
        if len(self.classes_) > 2:
            if isinstance(self.posterior_, _gp.multiclass.NestedEPPosterior):
                proba = _gp.multiclass.predict_proba(self.posterior_, X)
            else:
                proba = _gp.softmax.predict_proba(self.posterior_, X, key=jax.random.PRNGKey(0))
            return np.asarray(proba, dtype=float)
        p1 = np.asarray(_gp.predict_proba(self.posterior_, X), dtype=float)
        return np.stack([1.0 - p1, p1], axis=1)


class GPRegressor(RegressorMixin, BaseEstimator):
    """GP regression with Gaussian, Student-t or Laplace noise of scale ``scale`` around f(x).

    The other parameters (``bounds`` may also name ``"scale"``) and the attributes as for `GPClassifier`.

    Args:
        likelihood: ``"gaussian"``, ``"student_t"`` or ``"laplace"``.
        scale: the noise scale (learned with ``optimize=True``).
        df: Student-t degrees of freedom.
        method: ``"ep"`` (default), ``"gkl"``, ``"laplace"``, ``"lvb"``, or an instance.
    """

    def __init__(self, kernel: AbstractKernel | None = None, likelihood: str = "gaussian", scale: float = 0.1,
                 df: float = 3.0, method: str | AbstractMethod = "ep", optimize: bool = False, max_iter: int = 50,
                 n_restarts_optimizer: int = 0, bounds: tuple | dict | None = None,
                 random_state: int | np.random.RandomState | None = None):
        _store(self, locals())

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Fit q(f) to inputs ``X`` and real targets ``y``."""
        X, y = validate_data(self, X, y, y_numeric=True)
        y = jnp.asarray(y, dtype=jnp.result_type(float))
        likelihoods = {"gaussian": lambda: _potentials.Gaussian(loc=y, scale=self.scale),
                       "student_t": lambda: _potentials.StudentT(df=self.df, loc=y, scale=self.scale),
                       "laplace": lambda: _potentials.Laplace(loc=y, scale=self.scale)}
        if self.likelihood not in likelihoods:
            raise ValueError("GPRegressor: `likelihood` must be 'gaussian', 'student_t' or 'laplace', "
                             f"got {self.likelihood!r}.")
        return _fit_gp(self, X, likelihoods[self.likelihood](), None, _method(self.method, "GPRegressor"))

    def predict(self, X: ArrayLike, return_std: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Posterior mean of f(x_*) (and, with ``return_std``, its standard deviation, noise excluded)."""
        X = _test_inputs(self, X)
        mean, var = _gp.predict(self.posterior_, X)
        mean = np.asarray(mean, dtype=float)
        return (mean, np.sqrt(np.asarray(var, dtype=float))) if return_std else mean
