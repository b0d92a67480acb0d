"""Covariance families for the Gaussian approximation q(w) = N(m, S).

A *family* is configuration; ``family.init(dim, scale)`` returns a *factor*, the pytree of parameters of
one S, which gives the bounds what they need (s_n² = h_nᵀ S h_n, log det S, diag(S), tr(Λ S), samples, a
Newton-CG preconditioner; see `AbstractFactor`) at the cost its structure allows, without forming S.
Cholesky diagonals enter only through log|C_dd| and S = CᵀC, so any sign is valid; ``canonical()`` fixes
them positive, as vijax reports them.

| family | S | cost of {s_n²} | concave* |
|---|---|---|---|
| `Full()` | CᵀC, C upper-triangular | O(N D²) | yes |
| `Diagonal()` | diag(c²) | O(nnz(H)) | yes |
| `Banded(b)` | CᵀC, C_ij ≠ 0 for i ≤ j < i + b | O(N D b) | yes |
| `Chevron(K)` | CᵀC, K dense rows then a diagonal | O(N D K) | yes |
| `SparseMask(mask)` | CᵀC, C non-zero on `mask` | O(N D K) | yes |
| `Subspace(K)` | E CᵀC Eᵀ + c²(I − EEᵀ), E fixed per round | O(N D K) | yes (E fixed) |
| `FactorAnalysis(K)` | ΘΘᵀ + diag(d²) | O(N D K) | no |

\\* jointly in the mean and the factor, when every site potential is log-concave.
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


def __dir__():
    return list(__all__)
