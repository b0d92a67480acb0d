"""Mean field: the G-KL bound over fully factorised Gaussians q(w) = ∏_d N(w_d | m_d, c_d²).

The mean-field bound of thesis §3.4 (eq. 3.4.1),

.. math::

    \\mathcal B_{\\rm MF} = \\sum_d H[q(w_d)] + \\langle \\log \\mathcal N(w \\mid \\mu, \\Sigma)\\rangle
        + \\sum_n \\langle \\log \\varphi_n(h_n^\\top w + b_n)\\rangle,

restricted to Gaussian factors q(w_d) = N(m_d, c_d²), is the G-KL bound with a diagonal covariance
S = diag(c²): each site expectation only needs the Gaussian marginal of h_nᵀw, N(h_nᵀm + b_n,
Σ_d h_nd² c_d²), so it is tractable for any H, not only H = I. `MeanField` maximises it with
`vj.GKL(covariance=vj.covariance.Diagonal())`.

For H = I the free-form optimal factors of §3.4, q(w_d) ∝ φ_d(w_d) N(w_d | ·, 1/Λ_dd), are not
Gaussian in general; among Gaussian-factorised q the optimum of B_MF is exactly the diagonal G-KL
optimum, and the two coincide when the sites are Gaussian. The free-form bound is at least as
large; vijax reports the Gaussian one, a lower bound on log Z either way.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx

from ..covariance import Diagonal
from ..model import LatentLinearModel
from ..posterior import Posterior
from ..quadrature import GaussHermite
from ..solvers import AbstractSolver
from .gkl import GKL

__all__ = ["MeanField"]


class MeanField(eqx.Module):
    """Gaussian mean field: `vj.GKL` with a diagonal covariance, reported as ``"MeanField"``.

    **Arguments:**

    - `solver`: a `vj.solvers` solver (default: the diagonal family's, `NewtonCG()` with a
      Jacobi preconditioner).
    - `quadrature`: the rule for site expectations without a closed form.

    ``vj.infer(model, vj.MeanField())`` returns a `Posterior` with a `DiagonalFactor` and
    ``log_z`` the mean-field lower bound on log Z; it equals
    ``vj.infer(model, vj.GKL(covariance=vj.covariance.Diagonal()))`` in every field but
    ``diagnostics.method``. O(nnz(H)) per bound evaluation.
    """

    solver: AbstractSolver | None = None
    quadrature: GaussHermite = GaussHermite()

    def fit(self, model: LatentLinearModel, init=None) -> Posterior:
        gkl = GKL(covariance=Diagonal(), solver=self.solver, quadrature=self.quadrature)
        post = gkl.fit(model, init)
        return dataclasses.replace(post, diagnostics=dataclasses.replace(post.diagnostics, method="MeanField"))
