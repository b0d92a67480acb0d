"""Covariance families for the Gaussian approximation q(w) = N(m, S).

A *family* is configuration; ``family.init(dim, scale)`` returns a *factor*, the pytree of parameters of
one S, which gives the bounds what they need (s_n² = h_nᵀ S h_n, log det S, diag(S), tr(Λ S), samples, a
Newton-CG preconditioner; see `AbstractFactor`) at the cost its structure allows, without forming S.
Any sign of a Cholesky diagonal gives the same S; ``canonical()`` fixes them positive, as vijax reports them.

The families, their cost per bound and their concavity are tabled in the covariance guide.
"""

from ._base import AbstractCovariance, AbstractFactor
from ._dense import CholeskyFactor, Diagonal, DiagonalFactor, Full
from .chevron import Chevron, ChevronFactor
from .factor_analysis import FactorAnalysis, FactorAnalysisFactor
from .sparse import Banded, SparseCholeskyFactor, SparseMask
from .subspace import Subspace, SubspaceFactor

__all__ = ["AbstractCovariance", "AbstractFactor", "Full", "Diagonal", "Banded", "Chevron", "SparseMask", "Subspace",
           "FactorAnalysis", "CholeskyFactor", "DiagonalFactor", "SparseCholeskyFactor", "ChevronFactor",
           "SubspaceFactor", "FactorAnalysisFactor"]
__dir__ = __all__.copy
