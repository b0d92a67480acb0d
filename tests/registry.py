"""The methods × models registry behind `test_methods.py` (the Optimistix/Lineax pattern).

`METHODS` names each inference method as the tests configure it; `MODELS` names each test problem,
built from a fixed seed with its oracle. `PAIRS` says what each (method, model) pair must satisfy:

- ``"exact"``: q and log Z equal the closed-form posterior (a Gaussian target, full covariance);
- ``"mode"``: MAP on a Gaussian target: q exact, log Z the log joint at the mode;
- ``"diagonal"``: the best diagonal Gaussian on a Gaussian target: the exact mean, variances
  1/diag(precision), and log Z a strict lower bound (correlations are lost).

Every conjugate model has the same shapes (N = 30 sites, D = 4), and every classification problem
the same (N = 30, D = 4, or a batch of three with D = 3), so that programs compiled for one test are
found again in the persistent compilation cache and JAX's in-process caches by the next.

Pairs marked ``slow`` widen the matrix (every prior kind and projection kind for every method);
the default suite runs the pairs that cover each method's code paths once.
"""

import dataclasses
from typing import Callable

import numpy as np
from jax.experimental import sparse as jsparse

import vijax as vj

from helpers import gaussian_posterior, logistic_data, neal, regression_data, se_kernel, spd

N, D, NOISE = 30, 4, 0.6
TIGHT = vj.solvers.NewtonCG(tol=1e-10, max_iter=200)
cov = vj.covariance


@dataclasses.dataclass(frozen=True)
class Method:
    """A method as the shared tests configure it.

    - `make()`: the method object for exactness and warm starts (tight tolerances);
    - `default()`: the method with its default settings, for the jit/vmap/grad checks;
    - `gradient()`: the method for evidence gradients (tight enough that the envelope gradient at
      the refitted optimum agrees with finite differences to `gradient_rtol`);
    - `warm()`: the method for a refit started from the answer of `make()` (default: `make()`);
    - `warm_iterations`: the most iterations that refit may take;
    - `warm_rtol`: how closely that refit reproduces log Z;
    - `tols`: (log_z, mean, covariance) absolute tolerances of the exactness check."""

    make: Callable
    default: Callable = None
    gradient: Callable = None
    gradient_rtol: float = 1e-6
    warm: Callable = None
    warm_iterations: int = None
    warm_rtol: float = 1e-12
    tols: tuple = (1e-8, 1e-8, 1e-8)
    is_lower_bound: bool = False


METHODS = {
    # A converged start still takes its last (tiny) Newton step: one iteration.
    "gkl": Method(lambda: vj.GKL(solver=TIGHT), default=vj.GKL, gradient=lambda: vj.GKL(solver=TIGHT),
                  warm=lambda: vj.GKL(solver=vj.solvers.NewtonCG(tol=1e-6)), warm_iterations=1, is_lower_bound=True),
    "gkl_unwhitened": Method(lambda: vj.GKL(solver=TIGHT, whiten=False), is_lower_bound=True),
    "gkl_diagonal": Method(lambda: vj.GKL(covariance=cov.Diagonal(), solver=TIGHT), is_lower_bound=True),
    # Members of the structured families that contain every covariance: exact too.
    "gkl_banded": Method(lambda: vj.GKL(covariance=cov.Banded(D), solver=TIGHT), is_lower_bound=True,
                         tols=(1e-8, 1e-7, 1e-7)),
    "gkl_chevron": Method(lambda: vj.GKL(covariance=cov.Chevron(D - 1), solver=TIGHT), is_lower_bound=True,
                          tols=(1e-8, 1e-7, 1e-7)),
    "gkl_subspace": Method(lambda: vj.GKL(covariance=cov.Subspace(D, num_updates=0), solver=TIGHT),
                           is_lower_bound=True, tols=(1e-8, 1e-7, 1e-7)),
    "gkl_sparse_mask": Method(lambda: vj.GKL(covariance=cov.SparseMask(np.triu(np.ones((D, D), bool))),
                                             solver=TIGHT), is_lower_bound=True, tols=(1e-8, 1e-7, 1e-7)),
    "ep": Method(vj.EP, default=vj.EP, gradient=lambda: vj.EP(tol=1e-11), gradient_rtol=1e-5,
                 warm_iterations=0, tols=(1e-8, 1e-6, 1e-6)),
    "ep_sequential": Method(lambda: vj.EP(schedule="sequential"), tols=(1e-8, 1e-6, 1e-6)),
    "ep_double_loop": Method(lambda: vj.EP(schedule="double_loop"), tols=(1e-8, 1e-6, 1e-6)),
    "ep_power": Method(lambda: vj.EP(power=0.5), tols=(1e-8, 1e-6, 1e-6)),
    # At the optimum the Newton decrement is below the threshold at once: one (tiny) final step.
    # On logistic regression the log-determinant depends on θ through w*: the gradient is total.
    "laplace": Method(lambda: vj.Laplace(solver=TIGHT), default=vj.Laplace, gradient=lambda: vj.Laplace(solver=TIGHT),
                      warm_iterations=1, warm_rtol=1e-14),
    "map": Method(lambda: vj.MAP(solver=TIGHT), default=vj.MAP),
    # The envelope gradient's error is about √tol (ξ* is accurate to √tol): keep tol tight.
    "lvb": Method(vj.LVB, default=vj.LVB, gradient=lambda: vj.LVB(tol=1e-14, max_iter=2000), gradient_rtol=1e-5,
                  warm_iterations=3, warm_rtol=1e-10, tols=(1e-8, 1e-8, 1e-8), is_lower_bound=True),
    "meanfield": Method(vj.MeanField, is_lower_bound=True),
}


@dataclasses.dataclass(frozen=True)
class Model:
    """A test problem: `build()` returns the model and its oracle, (mean, covariance, log Z) of the
    exact posterior where one is known in closed form (else None)."""

    build: Callable
    conjugate: bool = False


def _conjugate(prior_kind, h_kind, seed=0):
    rng = np.random.default_rng(seed)
    X, y = regression_data(rng, N, D, NOISE)
    mu = rng.normal(size=D)
    if prior_kind == "isotropic":
        prior, prior_cov, mu = vj.GaussianFactor.isotropic(D, 2.0), 2.0 * np.eye(D), np.zeros(D)
    elif prior_kind == "diagonal":
        var = rng.uniform(0.5, 3.0, size=D)
        prior, prior_cov = vj.GaussianFactor.diagonal(var, mu), np.diag(var)
    elif prior_kind == "dense":
        prior_cov = spd(rng, D)
        prior = vj.GaussianFactor.dense(mu, prior_cov)
    else:
        prior_cov = spd(rng, D)
        prior = vj.GaussianFactor.precision(mu, np.linalg.inv(prior_cov))
    H = jsparse.BCOO.fromdense(X) if h_kind == "sparse" else X
    model = vj.LatentLinearModel(prior, vj.Sites(H, vj.potentials.Gaussian(loc=y, scale=NOISE)))
    return model, gaussian_posterior(mu, prior_cov, X, y, NOISE**2)


def _offset():
    """Gaussian sites with offsets: N(y | Xw, ν²) written as N(y + b | Xw + b, ν²); a dense prior."""
    rng = np.random.default_rng(1)
    X, y = regression_data(rng, N, D, NOISE)
    mu, prior_cov = rng.normal(size=D), spd(rng, D)
    b = rng.normal(size=N)
    model = vj.LatentLinearModel(vj.GaussianFactor.dense(mu, prior_cov),
                                 vj.Sites(X, vj.potentials.Gaussian(y + b, NOISE), offset=b))
    return model, gaussian_posterior(mu, prior_cov, X, y, NOISE**2)


def _multi_group():
    """No Gaussian factor: the prior N(0, I) given as Gaussian sites on H = I, the likelihood split
    over two site groups."""
    X, y = regression_data(np.random.default_rng(2), N, D, NOISE)
    groups = (
        vj.Sites(X[:18], vj.potentials.Gaussian(loc=y[:18], scale=NOISE)),
        vj.Sites(X[18:], vj.potentials.Gaussian(loc=y[18:], scale=NOISE)),
        vj.Sites(vj.Identity(D), vj.potentials.Gaussian(loc=0.0, scale=1.0)),
    )
    return vj.LatentLinearModel(None, groups), gaussian_posterior(np.zeros(D), np.eye(D), X, y, NOISE**2)


def _logistic():
    X, y = logistic_data(np.random.default_rng(3), N, D)
    return vj.glm.logistic_regression(X, y), None


def _probit_gp():
    rng = np.random.default_rng(3)
    x = np.sort(rng.uniform(-3, 3, 30))
    y = np.where(np.sin(2 * x) + 0.3 * rng.normal(size=30) > 0, 1.0, -1.0)
    K = se_kernel(x, 2.0, 0.8)
    return vj.LatentLinearModel(vj.GaussianFactor.dense(np.zeros(30), K),
                                vj.Sites(np.diag(y), vj.potentials.Probit())), None


def _robust_gp():
    x, y = neal(0, 25)
    y = y.copy()
    y[3] += 3.0  # a clear outlier
    return vj.LatentLinearModel(vj.GaussianFactor.dense(np.zeros(25), se_kernel(x)),
                                vj.Sites(vj.Identity(25), vj.potentials.StudentT(3.0, y, 0.1))), None


PRIOR_KINDS = ("isotropic", "diagonal", "dense", "precision")
H_KINDS = ("dense", "sparse")

MODELS = {
    **{f"conjugate_{p}_{h}": Model(lambda p=p, h=h: _conjugate(p, h), conjugate=True)
       for p in PRIOR_KINDS for h in H_KINDS},
    "conjugate_offset": Model(_offset, conjugate=True),
    "multi_group": Model(_multi_group, conjugate=True),
    "logistic": Model(_logistic),
    "probit_gp": Model(_probit_gp),
    "robust_gp": Model(_robust_gp),
}

CONJUGATE = [name for name, m in MODELS.items() if m.conjugate]


@dataclasses.dataclass(frozen=True)
class Pair:
    method: str
    model: str
    expect: str  # "exact", "mode" or "diagonal"
    slow: bool = False


def _pairs():
    full = {  # method -> (expectation, the conjugate models of the default suite)
        "gkl": ("exact", CONJUGATE),
        "gkl_unwhitened": ("exact", ["conjugate_dense_dense", "conjugate_dense_sparse"]),
        "gkl_diagonal": ("diagonal", ["conjugate_isotropic_dense", "conjugate_offset"]),
        "gkl_banded": ("exact", ["conjugate_isotropic_dense"]),
        "gkl_chevron": ("exact", ["conjugate_isotropic_dense"]),
        "gkl_subspace": ("exact", ["conjugate_isotropic_dense"]),
        "gkl_sparse_mask": ("exact", ["conjugate_isotropic_dense"]),
        "ep": ("exact", ["conjugate_dense_dense"]),
        "ep_sequential": ("exact", ["conjugate_dense_dense"]),
        "ep_double_loop": ("exact", ["conjugate_dense_dense"]),
        "ep_power": ("exact", ["conjugate_dense_dense"]),
        "laplace": ("exact", ["conjugate_isotropic_dense", "conjugate_dense_sparse", "conjugate_precision_dense"]),
        "map": ("mode", ["conjugate_isotropic_dense", "conjugate_dense_sparse", "conjugate_precision_dense"]),
        "lvb": ("exact", ["conjugate_offset"]),
        "meanfield": ("diagonal", ["conjugate_offset"]),
    }
    # The wider matrix, run with -m slow: the main variant of each method on every conjugate model.
    wide = ("gkl_diagonal", "ep", "laplace", "map", "lvb", "meanfield")
    pairs = []
    for method, (expect, default) in full.items():
        for model in CONJUGATE:
            if model in default:
                pairs.append(Pair(method, model, expect))
            elif method in wide:
                pairs.append(Pair(method, model, expect, slow=True))
    return pairs


PAIRS = _pairs()


# ------------------------------------------------------------------------------------------ hyperparameters

def _hyper_logistic(theta):
    """Logistic regression (the `logistic` data) with prior variance exp(θ)."""
    import jax.numpy as jnp

    X, y = logistic_data(np.random.default_rng(3), N, D)
    return vj.glm.logistic_regression(X, y, prior_variance=jnp.exp(theta))


def _hyper_robust(theta):
    """Laplace-likelihood robust regression with scale exp(θ) (non-log-concave curvature at outliers)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(4)
    X = rng.normal(size=(N, D))
    y = X @ rng.normal(size=D) + 0.3 * rng.standard_t(3, size=N)
    return vj.glm.robust_regression(X, y, likelihood="laplace", scale=jnp.exp(theta))


def _hyper_sparse_prior(theta):
    """Gaussian likelihood sites and Laplace-prior sites of scale exp(θ) on the coordinates; no Gaussian factor."""
    import jax.numpy as jnp

    rng = np.random.default_rng(5)
    X = rng.normal(size=(N, D))
    y = X @ np.where(rng.random(D) < 0.5, rng.laplace(size=D), 0.0) + 0.5 * rng.normal(size=N)
    return vj.LatentLinearModel(None, (vj.Sites(X, vj.potentials.Gaussian(y, 0.5)),
                                       vj.Sites(vj.Identity(D), vj.potentials.Laplace(0.0, jnp.exp(theta)))))


def _hyper_conjugate(theta):
    """Bayesian linear regression with prior variance exp(θ), and its exact log Z as a function of θ."""
    import jax.numpy as jnp

    X, y = regression_data(np.random.default_rng(0), N, D, NOISE)
    model = vj.glm.linear_regression(X, y, noise_scale=NOISE, prior_variance=jnp.exp(theta))
    return model


def _hyper_conjugate_exact(theta):
    X, y = regression_data(np.random.default_rng(0), N, D, NOISE)
    return gaussian_posterior(np.zeros(D), np.exp(theta) * np.eye(D), X, y, NOISE**2)[2]


# name -> (build(θ), exact log Z(θ) or None)
HYPERS = {
    "logistic_prior_variance": (_hyper_logistic, None),
    "robust_scale": (_hyper_robust, None),
    "laplace_prior_scale": (_hyper_sparse_prior, None),
    "conjugate_prior_variance": (_hyper_conjugate, _hyper_conjugate_exact),
}

# (method, hyperparameter family, slow): d log Z/dθ by autodiff against refitted finite differences.
GRADIENT_PAIRS = [
    ("gkl", "logistic_prior_variance", False),
    ("gkl", "robust_scale", False),
    ("laplace", "conjugate_prior_variance", False),
    ("laplace", "logistic_prior_variance", False),
    ("lvb", "logistic_prior_variance", False),
    ("lvb", "laplace_prior_scale", False),
    ("ep", "logistic_prior_variance", True),
    ("ep", "robust_scale", True),
]
