"""Multi-class GP classification with the softmax likelihood and its local bounds (Khan thesis ch. 5).

The model of `vj.gp.multiclass.model`, p(y_i = c | f_i) = softmax(f_i)_c, fitted by `SoftmaxBound`. Only
η_ik = f_ik − f_i0 enter the likelihood, so in the whitened values f̃_c = L_c⁻¹f_c (K_c + εI = L_cL_cᵀ) it is a
one-point factor model with prior N(0, I), whose E-step (Newton steps in the mean) ascends

    log Z ≥ −KL(q(f̃) ‖ N(0, I)) + Σ_i f̲(y_i, m̃_i, Ṽ_i)

with the Böhning, log, tilted or product-of-sigmoids bound f̲ on ⟨log softmax⟩.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.scipy.linalg import block_diag, cho_solve, solve_triangular

from .. import _checks
from .._factorisation import conditional
from ..covariance import CholeskyFactor
from ..factor import Block, FactorModel, Multinomial, elbo_point
from ..factor.em import Posteriors, e_step_run
from ..posterior import Diagnostics, Posterior
from ..solvers import Status
from ._layout import MulticlassMethod, MulticlassModel

__all__ = ["SoftmaxBound", "SoftmaxState", "BOUNDS", "predict", "predict_proba"]
__dir__ = __all__.copy

BOUNDS = ("bohning", "log", "tilted", "pos")


class SoftmaxState(eqx.Module):
    """The State of `SoftmaxBound`: q(f̃) = N(mean, cov) over the whitened latents (class-major, C·N),
    ``precision`` = cov⁻¹; the cold start is the prior, N(0, I)."""

    mean: jax.Array
    cov: jax.Array
    precision: jax.Array


def _factor_model(chol, likelihood):
    """The one-point factor model over the whitened latents f̃, one column per input; its loadings
    (N, C−1, C·N) have row (i, k) e_{k,i}ᵀL − e_{0,i}ᵀL, the map from f̃ to η_ik = f_ik − f_i0."""
    c, n = chol.shape[0], chol.shape[1]
    loadings = jnp.zeros((n, c - 1, c, n), chol.dtype).at[:, :, 0, :].set(-chol[0][:, None, :])
    idx = jnp.arange(1, c)
    loadings = loadings.at[:, idx - 1, idx, :].set(jnp.transpose(chol[1:], (1, 0, 2))).reshape(n, c - 1, c * n)
    block = Block(tuple(range(n)), likelihood, loadings, jnp.zeros((n, c - 1), chol.dtype))
    return FactorModel(jnp.zeros(c * n, chol.dtype), jnp.eye(c * n, dtype=chol.dtype), (block,),
                       learn_prior=False, learn_loadings=False)


class SoftmaxBound(MulticlassMethod):
    """The softmax multi-class GP by a local bound on ⟨log softmax⟩ (Khan thesis ch. 5).

    Fits a `vj.gp.multiclass.model` to a `vj.Posterior` over the class-major f (``(C·N,)``, a full
    `vj.covariance.CholeskyFactor`); ``log_z``, the bound at its optimum, is a lower bound on log p(y | X),
    differentiable in the kernels (envelope theorem). Another method's posterior of the model converts.

    **Arguments:**

    - `bound`: ``"bohning"``, ``"log"``, ``"tilted"`` (full-covariance tilted) or ``"pos"`` (product of
      sigmoids); static.
    - `tol`: q within ``tol`` of its optimum, in units of its marginal standard deviations.
    - `max_iter`: most E-step iterations (static).

    **Diagnostics:** `stationarity` is the extrapolated distance of q from the optimum, `grad_norm`
    max |∂bound/∂m̃| at the end.
    """

    bound: str = eqx.field(static=True, default="log")
    tol: float = 1e-9
    max_iter: int = eqx.field(static=True, default=500)

    def __check_init__(self):
        if self.bound not in BOUNDS:
            raise ValueError(f"SoftmaxBound: `bound` must be one of {BOUNDS}, got {self.bound!r}.")
        if _checks.is_concrete(self.tol) and not self.tol >= 0:
            raise ValueError(f"SoftmaxBound: `tol` must be a non-negative number, got {self.tol!r}.")
        _checks.integer("max_iter", self.max_iter, "SoftmaxBound")

    def init_state(self, model: MulticlassModel) -> SoftmaxState:
        eye = jnp.eye(model.dim, dtype=model.dtype)
        return SoftmaxState(jnp.zeros(model.dim, model.dtype), eye, eye)

    def from_gaussian(self, model: MulticlassModel, mean, factor) -> SoftmaxState:
        """q over f = N(mean, S) in the whitened coordinates: m̃ = L⁻¹m, Ṽ = L⁻¹SL⁻ᵀ (L = blkdiag L_c)."""
        chol = jnp.linalg.cholesky(jax.lax.stop_gradient(model.prior_covariances()))
        L = block_diag(*chol)
        mean_w = solve_triangular(L, mean, lower=True)
        A = solve_triangular(L, factor.dense(), lower=True)
        cov = solve_triangular(L, A.T, lower=True)
        cov = 0.5 * (cov + cov.T)
        precision = cho_solve((jnp.linalg.cholesky(cov), True), jnp.eye(cov.shape[0], dtype=cov.dtype))
        return SoftmaxState(mean_w, cov, 0.5 * (precision + precision.T))

    def is_state(self, model, state) -> bool:
        d = model.dim
        return (isinstance(state, SoftmaxState) and jnp.shape(state.mean) == (d,) and jnp.shape(state.cov) == (d, d)
                and jnp.shape(state.precision) == (d, d))

    def solve(self, model: MulticlassModel, state: SoftmaxState) -> Posterior:
        chol = jnp.linalg.cholesky(model.prior_covariances())  # live: the bound is differentiated through it
        frozen = jax.lax.stop_gradient(chol)
        likelihood = Multinomial(model.num_classes, self.bound)
        y = jax.lax.stop_gradient(model.labels).astype(model.dtype)[None]
        mask = jnp.ones((1, model.num_inputs), bool)
        state = jax.lax.stop_gradient(state)
        q0 = Posteriors(state.mean[None], state.cov[None], state.precision[None], jnp.full(1, -jnp.inf, model.dtype),
                        jnp.zeros(1, jnp.int32), jnp.zeros(1, bool))
        q, extras = e_step_run(_factor_model(frozen, likelihood), y, mask, q0, self.max_iter, self.tol, newton=True,
                               record=True)
        mean_w, cov_w = jax.lax.stop_gradient((q.mean[0], q.cov[0]))
        # Envelope theorem: at q's optimum the bound's derivative in the kernels at fixed q is the total one.
        log_z = elbo_point(_factor_model(chol, likelihood), y[0], mask[0], mean_w, cov_w)
        iterations = q.iterations[0]
        trace = extras.trace[0].at[iterations].set(jax.lax.stop_gradient(log_z))
        diagnostics = Diagnostics(
            iterations=iterations, status=Status.of(q.converged[0], value=log_z), stationarity=extras.distance[0],
            grad_norm=extras.grad_norm[0], objective_trace=trace, num_value_evals=iterations + 1,
            num_grad_evals=iterations + 1, num_hvp_evals=jnp.zeros((), iterations.dtype), method="SoftmaxBound",
            solver="E-step (Newton)")
        # q over f: f_c = L_c f̃_c, so m = L m̃ and S = L Ṽ Lᵀ = (C̃ Lᵀ)ᵀ(C̃ Lᵀ), C̃ upper with Ṽ = C̃ᵀC̃.
        L = block_diag(*frozen)
        upper = jnp.linalg.cholesky(cov_w).T @ L.T
        factor = CholeskyFactor.from_matrix(upper).canonical()
        return Posterior(L @ mean_w, factor, log_z, diagnostics, model, bound_claim=True,
                         state=SoftmaxState(mean_w, cov_w, jax.lax.stop_gradient(q.precision[0])))


def predict(post: Posterior, X_test):
    """Predictive latent means (T, C) and covariances (T, C, C) at ``X_test`` (T, d)."""
    return _predict(post, X_test, "vj.gp.softmax.predict")


def _predict(post, X_test, owner):
    if not (isinstance(post, Posterior) and isinstance(post.model, MulticlassModel)
            and isinstance(post.state, SoftmaxState)):
        raise ValueError(f"{owner}: `post` must be the posterior of vj.infer(vj.gp.multiclass.model(...), "
                         f"vj.gp.softmax.SoftmaxBound(...)), got {type(post).__name__}"
                         f"{' of ' + type(post.model).__name__ if isinstance(post, Posterior) else ''}.")
    X_test = _checks.as_inputs(X_test, owner)
    model, shape = post.model, (post.model.num_classes, post.model.num_inputs)
    chol = jnp.linalg.cholesky(model.prior_covariances())
    # A_c = K_*c L_c⁻ᵀ maps the whitened f̃_c to the conditional mean of f_*c.
    conds = [conditional(chol[c], k(model.X, X_test), k.diagonal(X_test)) for c, k in enumerate(model.kernels)]
    A = jnp.stack([cond.whitened.T for cond in conds])
    mean = jnp.einsum("cmn,cn->mc", A, post.state.mean.reshape(shape))
    cov = jnp.einsum("cmn,cndo,dmo->mcd", A, post.state.cov.reshape(shape + shape), A)
    prior_var = jnp.stack([cond.variances for cond in conds], -1)
    return mean, cov + jax.vmap(jnp.diag)(prior_var)


def predict_proba(post: Posterior, X_test, *, key, num_samples: int = 4000):
    """Class probabilities (T, C): ⟨softmax(f_*)⟩ under the predictive Gaussian, by Monte Carlo with
    ``num_samples`` draws from ``key`` (a `jax.random` key; required)."""
    owner = "vj.gp.softmax.predict_proba"
    if key is None:
        raise ValueError(f"{owner}: pass `key=jax.random.PRNGKey(...)`: the probabilities are a Monte Carlo estimate.")
    mean, cov = _predict(post, X_test, owner)
    chol = jnp.linalg.cholesky(cov + 1e-10 * jnp.eye(cov.shape[-1], dtype=cov.dtype))
    eps = jax.random.normal(key, (num_samples,) + mean.shape, mean.dtype)
    samples = mean + jnp.einsum("mcd,smd->smc", chol, eps)
    return jnp.mean(jax.nn.softmax(samples, -1), 0)
