"""Mean field: the bound over fully factorised q(w) = ∏_d q(w_d) (thesis §3.4).

.. math::

    \\mathcal B_{\\rm MF} = \\sum_d H[q(w_d)] + \\langle \\log f(w)\\rangle
        + \\sum_n \\langle \\log \\varphi_n(h_n^\\top w + b_n)\\rangle .

**One site per coordinate (H = I) with a Gaussian term f = N(μ, Λ⁻¹): free-form factors.** The
optimal factor given the others is the tilted density

.. math::

    q(w_k) = \\varphi_k(w_k + b_k)\\, \\mathcal N(w_k \\mid c_k, v_k) / Z_k, \\qquad
    v_k = 1/\\Lambda_{kk},\\quad c_k = m_k - [\\Lambda(m - \\mu)]_k / \\Lambda_{kk}

(m the factors' means; the thesis's printed sign of the cross term is corrected, see the research
errata), found by asynchronous coordinate ascent, which never lowers the bound. Z_k = ⟨φ_k⟩ under
N(c_k, v_k) is the potential's `log_expected_phi`, and the factor's mean and variance follow from
its derivatives, m_k = c_k + v_k ∂ log Z_k/∂c_k and s_k = v_k + v_k² ∂² log Z_k/∂c_k². For any
(c, v) the bound is then, exactly,

.. math::

    \\mathcal B_{\\rm MF} = \\sum_k \\Big[\\log Z_k + \\tfrac12 \\log 2\\pi v_k
        + \\frac{s_k + (m_k - c_k)^2}{2 v_k}\\Big] + \\log f(m) - \\tfrac12 \\sum_k \\Lambda_{kk} s_k .

The factors are not Gaussian; the `Posterior` holds their means and variances (a `DiagonalFactor`).

**Any other model: Gaussian factors.** Restricted to q(w_d) = N(m_d, c_d²) the bound is the G-KL
bound with a diagonal covariance, tractable for any H (each site needs only the Gaussian marginal
of h_nᵀw), maximised by `vj.GKL(covariance=vj.covariance.Diagonal())`. For H = I it is below the
free-form bound, with equality when the sites are Gaussian.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from ..covariance import Diagonal, DiagonalFactor
from ..model import Identity, LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..quadrature import GaussHermite
from ..solvers import AbstractSolver
from .gkl import GKL

__all__ = ["MeanField", "free_form_applies", "factor_moments", "bound"]

_LOG_2PI = math.log(2 * math.pi)


def free_form_applies(model: LatentLinearModel) -> bool:
    """Whether ``model`` has a Gaussian term and a single site group on ``vj.Identity``: the free-form case."""
    return model.prior is not None and len(model.sites) == 1 and isinstance(model.sites[0].projection, Identity)


def factor_moments(c, v, model: LatentLinearModel, quadrature: GaussHermite = GaussHermite()):
    """(log Z, mean, variance) of every tilted factor φ_k(w_k + b_k) N(w_k | c_k, v_k) / Z_k, each ``(D,)``."""
    group = model.sites[0]
    sigma = jnp.sqrt(v)

    def log_z(c):
        return group.potential.log_expected_phi(group.project(c), sigma, quadrature)

    # log Z_k depends on c_k alone, so the gradient of the sum is the vector of derivatives and
    # its directional derivative along ones the vector of second derivatives.
    slope = jax.grad(lambda c: jnp.sum(log_z(c)))
    first, second = jax.jvp(slope, (c,), (jnp.ones_like(c),))
    return log_z(c), c + v * first, v + v**2 * second


def bound(c, v, model: LatentLinearModel, quadrature: GaussHermite = GaussHermite()):
    """The mean-field bound of the tilted factors with parameters ``c`` and ``v`` (pure; see the module)."""
    log_z, mean, var = factor_moments(c, v, model, quadrature)
    entropy_and_sites = jnp.sum(log_z + 0.5 * (_LOG_2PI + jnp.log(v)) + (var + (mean - c) ** 2) / (2 * v))
    return entropy_and_sites + model.prior.expected_log_density(mean, DiagonalFactor(jnp.sqrt(var)))


class MeanField(eqx.Module):
    """Mean-field approximation: free-form factors where H = I, Gaussian factors otherwise.

    **Arguments:**

    - `solver`: for Gaussian factors, a `vj.solvers` solver (default: the diagonal family's,
      `NewtonCG()` with a Jacobi preconditioner).
    - `quadrature`: the rule for expectations without a closed form.
    - `max_sweeps`, `tol`: for free-form factors, the most coordinate-ascent sweeps, and the
      relative change of the bound over a sweep at which they stop.
    - `free_form`: use free-form factors when the model allows them (``True``, default) or always
      Gaussian factors (``False``).

    ``vj.infer(model, vj.MeanField())`` returns a `Posterior` with the factors' means and variances
    (a `DiagonalFactor`) and ``log_z`` the mean-field lower bound on log Z, differentiable in the
    model's hyperparameters (envelope theorem, with the factors' parameters frozen).
    ``diagnostics.solver`` says which case ran: ``"coordinate_ascent"`` (free form) or the solver's
    name (Gaussian factors, the same fit as ``vj.GKL(covariance=vj.covariance.Diagonal())``).
    """

    solver: AbstractSolver | None = None
    quadrature: GaussHermite = GaussHermite()
    max_sweeps: int = eqx.field(static=True, default=200)
    tol: float = eqx.field(static=True, default=1e-12)
    free_form: bool = eqx.field(static=True, default=True)

    def fit(self, model: LatentLinearModel, init=None) -> Posterior:
        if self.free_form and free_form_applies(model):
            return self._fit_free_form(model, init)
        gkl = GKL(covariance=Diagonal(), solver=self.solver, quadrature=self.quadrature)
        post = gkl.fit(model, init)
        return dataclasses.replace(post, diagnostics=dataclasses.replace(post.diagnostics, method="MeanField"))

    def _fit_free_form(self, model, init):
        frozen = jax.lax.stop_gradient(model)
        precision = frozen.prior.precision_matrix()
        v = 1.0 / jnp.diag(precision)
        if isinstance(init, Posterior):
            mean = jax.lax.stop_gradient(init.mean)
        elif init is None:
            mean = frozen.initial_moments()[0]
        else:
            raise ValueError(f"MeanField: `init` must be a Posterior or None, got {type(init).__name__}.")
        # r = Λ(m − μ) = −∇ log f(m), kept up to date as single coordinates of m move.
        residual = -jax.grad(frozen.prior.log_density)(mean)
        c = mean - residual * v

        def update(k, state):
            c, mean, residual = state
            c_k = mean[k] - residual[k] * v[k]
            c = c.at[k].set(c_k)
            _, new_mean, _ = factor_moments(c, v, frozen, self.quadrature)
            step = new_mean[k] - mean[k]
            return c, mean.at[k].set(new_mean[k]), residual + step * precision[:, k]

        def sweep(state):
            c, mean, residual, _, k, trace = state
            c, mean, residual = jax.lax.fori_loop(0, mean.shape[0], update, (c, mean, residual))
            value = bound(c, v, frozen, self.quadrature)
            return c, mean, residual, trace[k], k + 1, trace.at[k + 1].set(value)

        def unfinished(state):
            _, _, _, previous, k, trace = state
            change = jnp.abs(trace[k] - previous)
            return (k < self.max_sweeps) & ~(change <= self.tol * jnp.maximum(jnp.abs(trace[k]), 1.0))

        first = bound(c, v, frozen, self.quadrature)
        trace = jnp.full((self.max_sweeps + 1,), jnp.nan, first.dtype).at[0].set(first)
        start = (c, mean, residual, jnp.asarray(jnp.inf, first.dtype), jnp.array(0), trace)
        c, _, _, previous, sweeps, trace = jax.lax.while_loop(unfinished, sweep, start)
        change = jnp.abs(trace[sweeps] - previous)
        converged = change <= self.tol * jnp.maximum(jnp.abs(trace[sweeps]), 1.0)

        c, v = jax.lax.stop_gradient((c, v))
        _, mean, var = factor_moments(c, v, frozen, self.quadrature)
        log_z = bound(c, v, model, self.quadrature)  # live model: the envelope theorem
        zero = jnp.array(0)
        diagnostics = Diagnostics(sweeps, converged, change, trace, zero, zero, zero, "MeanField", "coordinate_ascent")
        return Posterior(mean, DiagonalFactor(jnp.sqrt(var)), log_z, diagnostics, model, is_lower_bound=True)
