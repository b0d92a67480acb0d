"""What every method returns: a Gaussian posterior approximation and an evidence estimate."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from .covariance import AbstractFactor
from .model import LatentLinearModel
from .projections import as_projection

__all__ = ["Posterior", "Diagnostics"]


class Diagnostics(eqx.Module):
    """How a fit went.

    - `iterations`, `converged`, `grad_norm` (max |gradient| of the objective at the end);
    - `stationarity`: the measure `converged` was judged by, at the end: for solver-based fits
      (G-KL, Laplace, MAP, mean field with Gaussian factors) the squared Newton decrement
      gᵀ(−∇²f)⁻¹g ≈ 2 × the objective's remaining gain (last measured, before the final step);
      for EP the moment-matching residual; for LVB and free-form mean field the extrapolated
      distance of their parameters from the fixed point; for the natural-parameter G-KL its
      decrement ∇Bᵀ(Δm, Δλ) (see each method);
    - `objective_trace`: objective after each iteration (NaN-padded to ``max_iter + 1``);
    - `num_value_evals`, `num_grad_evals`, `num_hvp_evals`: work done, for cost accounting;
    - `method`, `solver`: names of what produced the answer;
    - `fallback`: True when the method could not use its exact curvature and fell back on
      an approximation (`vj.Laplace` and `vj.MAP`: the Gauss–Newton curvature, where the
      Hessian at the optimum is not negative definite); always False for G-KL;
    - `jitter`: what was added to the diagonal of a curvature matrix before factorising it
      (0 unless it was singular).

    Expectation propagation also reports (NaN, False or 0 for other methods):

    - `max_change`: the largest change of a site parameter in the last iteration, in units of
      the site's marginal (max over sites of |Δτ_n|·V_n and |Δν_n|·√V_n);
    - `oscillating`: True when the moment-matching residual stopped improving (the symptom of
      oscillating or diverging EP);
    - `skipped`: site updates left out because the site's cavity was improper or its tilted
      moments were not finite;
    - `shrunk`: steps shortened so that q and every cavity stay proper.
    """

    iterations: jax.Array
    converged: jax.Array
    grad_norm: jax.Array
    objective_trace: jax.Array
    num_value_evals: jax.Array
    num_grad_evals: jax.Array
    num_hvp_evals: jax.Array
    method: str = eqx.field(static=True)
    solver: str = eqx.field(static=True)
    fallback: jax.Array = eqx.field(default_factory=lambda: jnp.array(False))
    jitter: jax.Array = eqx.field(default_factory=lambda: jnp.array(0.0))
    max_change: jax.Array = eqx.field(default_factory=lambda: jnp.array(jnp.nan))
    oscillating: jax.Array = eqx.field(default_factory=lambda: jnp.array(False))
    skipped: jax.Array = eqx.field(default_factory=lambda: jnp.array(0))
    shrunk: jax.Array = eqx.field(default_factory=lambda: jnp.array(0))
    stationarity: jax.Array = eqx.field(default_factory=lambda: jnp.array(jnp.nan))

    @classmethod
    def from_solution(cls, sol, method: str, solver: str, fallback=False, jitter=0.0) -> "Diagnostics":
        return cls(sol.iterations, sol.converged, sol.grad_norm, sol.trace, sol.num_value_evals,
                   sol.num_grad_evals, sol.num_hvp_evals, method, solver,
                   jnp.asarray(fallback, bool), jnp.asarray(jitter, sol.trace.dtype), stationarity=sol.decrement)


class Posterior(eqx.Module):
    """A Gaussian approximation q(w) = N(mean, S) of p(w) and an estimate of log Z.

    **Fields:**

    - `mean`: shape ``(D,)``.
    - `factor`: the covariance-family factor holding S (``post.covariance`` is S, dense).
    - `log_z`: the method's log-evidence estimate, differentiable in the model's
      hyperparameters. For G-KL, mean field and LVB a lower bound on log Z (envelope theorem); for Laplace an
      approximation; for MAP the log joint at the mode (not an evidence estimate).
    - `is_lower_bound`: whether `log_z` is a guaranteed lower bound.
    - `diagnostics`: a `Diagnostics`.
    - `model`: the model that was fitted (used by predictive functions).
    - `state`: what the method needs to warm-start from this fit (`vj.EP`: its `vj.ep.SiteParams`);
      None for methods whose `init` is the posterior itself.
    """

    mean: jax.Array
    factor: AbstractFactor
    log_z: jax.Array
    diagnostics: Diagnostics
    model: LatentLinearModel
    is_lower_bound: bool = eqx.field(static=True)
    state: object = None

    @property
    def covariance(self):
        """S as a dense ``(D, D)`` matrix (computed on access for structured families)."""
        return self.factor.dense()

    def marginals(self, H):
        """Means and variances of ``H w`` under q: two arrays of shape ``(N,)``.

        ``H`` is a dense ``(N, D)`` array, a BCOO matrix, or `vj.Identity(D)`.
        """
        projection = as_projection(H)
        if projection.shape[1] != self.mean.shape[0]:
            raise ValueError(f"Posterior.marginals: H has {projection.shape[1]} columns, expected {self.mean.shape[0]}.")
        return projection.mv(self.mean), self.factor.projected_variances(projection)

    def sample(self, key, num_samples: int):
        """``num_samples`` draws from q: shape ``(num_samples, D)``."""
        return self.mean + self.factor.sample(key, num_samples)
