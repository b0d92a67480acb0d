"""Cholesky factors with a fixed sparsity pattern: `Banded` and `SparseMask`.

S = CᵀC with C upper-triangular and non-zero only on a fixed pattern; row i of C is stored as K values
at K column indices (its diagonal first), a ``(D, K)`` array (thesis §4.3). s_n² = ‖C h_n‖² is gathered in
blocks of rows, O(N D K); log det S = 2 Σ_i log |C_ii|. A fixed pattern is a linear subspace of the
upper-triangular matrices, so the bound stays jointly concave in (m, C) for log-concave sites.
"""

from __future__ import annotations

import abc
import hashlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..projections import Dense, Identity
from ._base import AbstractCovariance, AbstractFactor, as_scale, check_rank

__all__ = ["Banded", "SparseMask", "SparseCholeskyFactor"]

# Elements gathered per block when computing ‖C h_n‖² (bounds the working memory).
_BLOCK_ELEMENTS = 1 << 22


class Pattern:
    """A hashable sparsity pattern: row i of C is non-zero at ``columns[i, valid[i]]``, ``columns[i, 0] == i``."""

    def __init__(self, columns, valid):
        self.columns = np.array(columns, dtype=np.int32)
        self.valid = np.array(valid, dtype=bool)
        self.columns.flags.writeable = self.valid.flags.writeable = False
        digest = hashlib.sha1(self.columns.tobytes() + self.valid.tobytes()).hexdigest()
        self._key = (self.columns.shape, digest)

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, Pattern) and self._key == other._key

    @property
    def shape(self):
        return self.columns.shape

    @property
    def rows(self):
        return np.broadcast_to(np.arange(self.shape[0])[:, None], self.shape)

    def __repr__(self):
        return f"Pattern(dim={self.shape[0]}, nonzeros_per_row={self.shape[1]})"


class SparseCholeskyFactor(AbstractFactor):
    """C with row i equal to ``values[i, k]`` at column ``pattern.columns[i, k]`` (D × K storage)."""

    values: jax.Array
    pattern: Pattern = eqx.field(static=True)

    @property
    def dim(self):
        return self.values.shape[0]

    def _masked(self):
        return jnp.where(self.pattern.valid, self.values, 0.0)

    def cholesky(self):
        C = jnp.zeros((self.dim, self.dim), self.values.dtype)
        return C.at[self.pattern.rows, self.pattern.columns].add(self._masked())

    def projected_variances(self, projection):
        if isinstance(projection, Identity):
            return self.variances()
        if isinstance(projection, Dense):
            return _gathered_squared_norms(projection.matrix, self._masked(), self.pattern.columns)
        return jnp.sum(projection.mv(self.cholesky().T) ** 2, axis=-1)

    def logdet(self):
        return 2 * jnp.sum(jnp.log(jnp.abs(self.values[:, 0])))

    def variances(self):
        flat = self._masked() ** 2
        return jnp.zeros(self.dim, flat.dtype).at[self.pattern.columns.ravel()].add(flat.ravel())

    def canonical(self):
        return SparseCholeskyFactor(self._masked() * jnp.sign(self.values[:, :1]), self.pattern)

    def preconditioner(self, curvature):
        """Jacobi: entry C_ij is scaled by 1/(P_jj + δ_ij / C_ii²), the mean by 1/P_jj."""
        p = curvature.diagonal()
        entropy = jnp.zeros_like(self.values).at[:, 0].set(1.0 / self.values[:, 0] ** 2)
        denominator = p[self.pattern.columns] + entropy

        def apply(mean_tangent, factor_tangent):
            values = jnp.where(self.pattern.valid, factor_tangent.values / denominator, 0.0)
            return mean_tangent / p, SparseCholeskyFactor(values, self.pattern)

        return apply


def _gathered_squared_norms(H, values, columns):
    """Σ_i (Σ_k values[i, k] H[:, columns[i, k]])² in blocks of rows of C, recomputed on the backward pass."""
    num_sites = H.shape[0]
    dim, k = values.shape
    block = int(max(1, min(dim, _BLOCK_ELEMENTS // max(num_sites * k, 1))))
    num_blocks = -(-dim // block)
    pad = num_blocks * block - dim
    values = jnp.pad(values, ((0, pad), (0, 0))).reshape(num_blocks, block, k)
    columns = np.pad(columns, ((0, pad), (0, 0))).reshape(num_blocks, block, k)

    @jax.checkpoint
    def accumulate(total, block_values_columns):
        block_values, block_columns = block_values_columns
        rows_of_CH = jnp.einsum("nbk,bk->nb", H[:, block_columns], block_values)
        return total + jnp.sum(rows_of_CH**2, axis=1), None

    total, _ = jax.lax.scan(accumulate, jnp.zeros(num_sites, values.dtype), (values, jnp.asarray(columns)))
    return total


class _PatternFamily(AbstractCovariance):
    @abc.abstractmethod
    def pattern(self, dim: int) -> Pattern:
        """The non-zero pattern of C (upper-triangular, diagonal included) for dimension ``dim``."""

    def init(self, dim, scale=1.0):
        pattern, scale = self.pattern(dim), as_scale(scale, dim)
        return SparseCholeskyFactor(jnp.zeros(pattern.shape, scale.dtype).at[:, 0].set(scale), pattern)

    def from_dense(self, cov):
        # The pattern's entries of cov's Cholesky factor (exact when that factor fits the pattern).
        pattern, C = self.pattern(cov.shape[0]), jnp.linalg.cholesky(cov).T
        return SparseCholeskyFactor(jnp.where(pattern.valid, C[pattern.rows, pattern.columns], 0.0), pattern)


class Banded(_PatternFamily):
    """Banded Cholesky: C_ij ≠ 0 only for i ≤ j < i + bandwidth (``Banded(1)`` is diagonal, ``Banded(D)`` full).

    About D·bandwidth parameters; O(N D bandwidth) per bound. S is banded; its precision generally is not.
    """

    bandwidth: int = eqx.field(static=True)

    def pattern(self, dim):
        b = check_rank("bandwidth", self.bandwidth, dim, "Banded")
        columns = np.arange(dim)[:, None] + np.arange(b)[None, :]
        valid = columns < dim
        return Pattern(np.where(valid, columns, np.arange(dim)[:, None]), valid)


class SparseMask(_PatternFamily):
    """Cholesky factor non-zero on a user-given ``mask`` (D, D) of C's upper triangle (diagonal always included).

    Cost O(N D K) per bound with K the largest number of non-zeros in a row.
    """

    mask_pattern: Pattern = eqx.field(static=True)

    def __init__(self, mask):
        mask = np.asarray(mask)
        if mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
            raise ValueError(f"SparseMask: `mask` must be a square (D, D) array, got shape {mask.shape}.")
        if mask.dtype != bool and not np.isin(mask, (0, 1)).all():
            raise ValueError("SparseMask: `mask` must be boolean (or 0/1): True marks a free entry of C.")
        mask = mask.astype(bool)
        if np.tril(mask, -1).any():
            i, j = np.argwhere(np.tril(mask, -1))[0]
            raise ValueError(f"SparseMask: `mask` marks entry ({i}, {j}) below the diagonal; C is upper-triangular "
                             "(S = CᵀC), so pass the pattern of C's upper triangle, e.g. np.triu(mask).")
        mask = mask | np.eye(mask.shape[0], dtype=bool)
        counts = mask.sum(axis=1)
        # Row i's non-zero columns in increasing order (the diagonal first), padded with the diagonal.
        columns = np.argsort(~mask, axis=1, kind="stable")[:, :counts.max()]
        valid = np.arange(counts.max()) < counts[:, None]
        self.mask_pattern = Pattern(np.where(valid, columns, np.arange(mask.shape[0])[:, None]), valid)

    def pattern(self, dim):
        if dim != self.mask_pattern.shape[0]:
            raise ValueError(f"SparseMask: the mask is for D = {self.mask_pattern.shape[0]}, but the model has D = {dim}.")
        return self.mask_pattern
