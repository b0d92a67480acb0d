"""Covariance families for the Gaussian approximation q(w) = N(m, S).

A *family* (`Full`, `Diagonal`, `Banded`, `Chevron`, `SparseMask`, `Subspace`,
`FactorAnalysis`) is configuration; ``family.init(dim, scale)`` returns a *factor*,
the pytree of parameters of one S. A factor knows everything the bounds need about
S, at the cost its structure allows, without forming the D × D matrix:

- ``projected_variances(projection)`` — s_n² = h_nᵀ S h_n for every site;
- ``logdet()`` — log det S; ``variances()`` — diag(S);
- ``trace_precision(gaussian_factor)`` — tr(Λ S) for the model's Gaussian term;
- ``dense()`` — S itself, ``sample(key, n)`` — draws from N(0, S);
- ``preconditioner(curvature)`` — an approximate inverse of the negative Hessian of
  the G-KL bound in (m, factor), used by Newton-CG;
- ``trainable()`` — which leaves the solvers move (a subspace basis is held fixed).

Cholesky diagonals enter only through log|C_dd| and S = CᵀC, so any sign is a valid
point; ``canonical()`` returns the factor with a positive diagonal, which is what
vijax reports.

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

__all__ = [
    "AbstractCovariance",
    "AbstractFactor",
    "Full",
    "Diagonal",
    "Banded",
    "Chevron",
    "SparseMask",
    "Subspace",
    "FactorAnalysis",
    "CholeskyFactor",
    "DiagonalFactor",
    "SparseCholeskyFactor",
    "ChevronFactor",
    "SubspaceFactor",
    "FactorAnalysisFactor",
]


def __dir__():
    return list(__all__)
