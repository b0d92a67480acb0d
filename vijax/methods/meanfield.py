"""Mean field: the bound B_MF = Σ_d H[q(w_d)] + ⟨log f(w)⟩ + Σ_n ⟨log φ_n(h_nᵀw + b_n)⟩ over q(w) = ∏_d q(w_d)
(thesis §3.4).

**Free-form factors** (one site per coordinate, H = I, f = N(μ, Λ⁻¹)), found by coordinate ascent: the optimal
factor given the others is the tilted density q(w_k) = φ_k(w_k + b_k) N(w_k | c_k, v_k) / Z_k, v_k = 1/Λ_kk,
c_k = m_k − [Λ(m − μ)]_k / Λ_kk (m the factors' means; the thesis's sign corrected). With Z_k, m_k, s_k its moments,

$$
\\mathcal B_{\\rm MF} = \\sum_k \\Big[\\log Z_k + \\tfrac12 \\log 2\\pi v_k
+ \\frac{s_k + (m_k - c_k)^2}{2 v_k}\\Big] + \\log f(m) - \\tfrac12 \\sum_k \\Lambda_{kk} s_k .
$$

**Otherwise, Gaussian factors** q(w_d) = N(m_d, c_d²): `vj.GKL(covariance=vj.covariance.Diagonal())`.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _checks
from .._linalg import LOG_2PI as _LOG_2PI, nan_trace
from ..covariance import Diagonal, DiagonalFactor
from ..model import Identity, LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..quadrature import GaussHermite
from ..solvers import AbstractSolver, Status, extrapolated_distance, iterate
from ._base import AbstractMethod
from .gkl import GKL
from .laplace import is_point

__all__ = ["MeanField", "free_form_applies", "factor_moments", "bound"]
__dir__ = __all__.copy


def free_form_applies(model: LatentLinearModel) -> bool:
    """Whether ``model`` has a Gaussian term and a single site group on ``vj.Identity``: the free-form case."""
    return model.prior is not None and len(model.sites) == 1 and isinstance(model.sites[0].projection, Identity)


def factor_moments(c, v, model: LatentLinearModel, quadrature: GaussHermite = GaussHermite()):
    """(log Z, mean, variance) ``(D,)`` of the tilted factors φ_k(w_k + b_k) N(w_k | c_k, v_k) / Z_k (no quadrature)."""
    group = model.sites[0]
    offset = jnp.broadcast_to(group.offset, c.shape)
    log_z, mean, var = group.potential.tilted_moments(group.project(c), jnp.broadcast_to(v, c.shape), 1.0)
    return log_z, mean - offset, var


def bound(c, v, model: LatentLinearModel, quadrature: GaussHermite = GaussHermite()):
    """The mean-field bound of the tilted factors with parameters ``c`` and ``v`` (pure; see the module)."""
    return _bound(c, v, model, *factor_moments(c, v, model, quadrature))


def _bound(c, v, model, log_z, mean, var):
    entropy_and_sites = jnp.sum(log_z + 0.5 * (_LOG_2PI + jnp.log(v)) + (var + (mean - c) ** 2) / (2 * v))
    return entropy_and_sites + model.prior.expected_log_density(mean, DiagonalFactor(jnp.sqrt(var)))


class MeanField(AbstractMethod):
    """Mean-field approximation: free-form factors where H = I, Gaussian factors otherwise.

    The `Posterior` holds the factors' means and variances (a `DiagonalFactor`) and ``log_z`` the mean-field lower
    bound, differentiable by the envelope theorem.

    **Arguments:**

    - `solver`: for Gaussian factors (default: `NewtonCG()` with a Jacobi preconditioner).
    - `quadrature`: the rule for expectations without a closed form.
    - `max_iter`: for free-form factors, the most sweeps (default 1000).
    - `tol`: the factors' means' distance from the fixed point, in their standard deviations, at which free-form
      sweeps stop (default 1e-9; `vj.solvers.extrapolated_distance`).
    - `free_form`: use free-form factors when the model allows them (default ``True``).
    """

    solver: AbstractSolver | None = None
    quadrature: GaussHermite = GaussHermite()
    max_iter: int = eqx.field(static=True, default=1000)
    tol: float = 1e-9
    free_form: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        _checks.integer("max_iter", self.max_iter, "MeanField")

    def _free(self, model) -> bool:
        return self.free_form and free_form_applies(model)

    def _gaussian(self) -> GKL:
        return GKL(covariance=Diagonal(), solver=self.solver, quadrature=self.quadrature)

    def start_dense(self, model):
        return None if self._free(model) else False

    def shares_start(self, model):
        return self._free(model)  # the diagonal family's G-KL does not share it

    def from_expansion(self, model, expansion):
        return expansion.mode if self._free(model) else self._gaussian().from_expansion(model, expansion)

    def from_gaussian(self, model, mean, factor):
        return mean if self._free(model) else self._gaussian().from_gaussian(model, mean, factor)

    def is_state(self, model, state):
        return is_point(model, state) if self._free(model) else self._gaussian().is_state(model, state)

    def solve(self, model: LatentLinearModel, state) -> Posterior:
        if self._free(model):
            return self._fit_free_form(model, state)
        post = self._gaussian().solve(model, state)
        return dataclasses.replace(post, diagnostics=dataclasses.replace(post.diagnostics, method="MeanField"))

    def _fit_free_form(self, model, mean):
        frozen = jax.lax.stop_gradient(model)
        precision = frozen.prior.precision_matrix()
        v = 1.0 / jnp.diag(precision)
        mean = jax.lax.stop_gradient(mean).astype(frozen.dtype)
        # r = Λ(m − μ) = −∇ log f(m), kept up to date as single coordinates of m move.
        residual = -jax.grad(frozen.prior.log_density)(mean)
        c = mean - residual * v

        group = frozen.sites[0]
        offset = jnp.broadcast_to(group.offset, mean.shape)

        def update(k, state):
            c, mean, residual = state
            c_k = mean[k] - residual[k] * v[k]
            # Factor k's mean only: its tilted moments, in x = w_k + b_k.
            _, new_mean_k, _ = group.potential.site(k, mean.shape[0]).tilted_moments(c_k + offset[k], v[k], 1.0)
            step = new_mean_k - offset[k] - mean[k]
            return c.at[k].set(c_k), mean.at[k].add(step), residual + step * precision[:, k]

        floor = 1e3 * float(jnp.finfo(mean.dtype).eps)
        distance = lambda change, previous: extrapolated_distance(change, previous, floor)

        def sweep(k, state):
            c, mean, residual, change, _, trace = state
            c, new_mean, residual = jax.lax.fori_loop(0, mean.shape[0], update, (c, mean, residual))
            moments = factor_moments(c, v, frozen, self.quadrature)
            new_change = jnp.max(jnp.abs(new_mean - mean) / jnp.sqrt(moments[2]))
            value = _bound(c, v, frozen, *moments)
            return c, new_mean, residual, new_change, change, trace.at[k + 1].set(value)

        def finished(k, state):
            *_, change, previous, trace = state
            return (distance(change, previous) <= self.tol) | ~jnp.isfinite(trace[k])

        first = bound(c, v, frozen, self.quadrature)
        trace = nan_trace(self.max_iter, first.dtype, first)
        inf = jnp.asarray(jnp.inf, first.dtype)
        start = (c, mean, residual, inf, inf, trace)
        (c, _, _, change, previous, trace), sweeps = iterate(sweep, start, self.max_iter, finished)
        stationarity = distance(change, previous)

        c, v = jax.lax.stop_gradient((c, v))
        _, mean, var = factor_moments(c, v, frozen, self.quadrature)
        log_z = bound(c, v, model, self.quadrature)  # live model: the envelope theorem
        status = Status.of(stationarity <= self.tol, value=trace[sweeps])
        diagnostics = Diagnostics(iterations=sweeps, status=status, stationarity=stationarity,
                                  objective_trace=trace, num_value_evals=sweeps + 1, method="MeanField",
                                  solver="coordinate_ascent")
        return Posterior(mean, DiagonalFactor(jnp.sqrt(var)), log_z, diagnostics, model, bound_claim=True,
                         state=mean)
