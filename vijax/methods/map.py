"""Maximum a posteriori (MAP) estimation: the mode of the log joint.

$$
w^* = \\arg\\max_w \\; \\ell(w) = \\log f(w) + \\sum_n \\log \\varphi_n(h_n^\\top w + b_n).
$$

The mode search and the curvature at the mode are `vj.Laplace`'s; MAP differs only in its ``log_z``.
"""

from __future__ import annotations

import jax

from ..model import LatentLinearModel
from ..posterior import Diagnostics, Posterior
from ..solvers import AbstractSolver
from .laplace import AbstractModeMethod, fit_mode, log_joint, mode_solver

__all__ = ["MAP"]
__dir__ = __all__.copy


class MAP(AbstractModeMethod):
    """The posterior mode, with the Laplace covariance around it.

    **Arguments:**

    - `solver`: a `vj.solvers` solver for the mode (default `None`: `GaussNewton()` where every
      site is log-concave, else `NewtonCG()`).

    Returns a `Posterior` with mean w* and covariance (−∇²ℓ(w*))⁻¹; its ``log_z`` is ℓ(w*), **not an
    evidence estimate** (its ``jax.grad`` is ∂_θ ℓ(w*))."""

    solver: AbstractSolver | None = None

    def solve(self, model: LatentLinearModel, state) -> Posterior:
        solver = mode_solver(model, self.solver)
        fit = fit_mode(model, jax.lax.stop_gradient(state).astype(model.dtype), solver)
        diagnostics = Diagnostics.from_solution(fit.solution, method="MAP", solver=type(solver).__name__,
                                                info=fit.info())
        return Posterior(fit.mode, fit.factor(), log_joint(fit.mode, model), diagnostics, model, bound_claim=False,
                         state=fit.mode)
