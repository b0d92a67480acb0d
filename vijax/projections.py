"""Projections H : R^D → R^N, the linear maps of site groups.

`AbstractProjection` fixes the products vijax uses; `Dense` (an array), `Sparse` (a BCOO), `Identity` (H = I)
and `ScaledIdentity` (H = diag(s)) implement them, and `as_projection` turns a user's ``H`` into one of them.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.experimental import sparse as jsparse

from . import _checks, _ellpack

__all__ = ["AbstractProjection", "Dense", "Sparse", "Identity", "ScaledIdentity", "as_projection"]
__dir__ = __all__.copy


class AbstractProjection(eqx.Module):
    """The linear map w ↦ Hw of a site group, shape ``(N, D)``: vijax uses only the products below."""

    @abc.abstractmethod
    def mv(self, x):
        """``H @ x`` for ``x`` of shape ``(D,)`` or ``(D, K)``."""

    @abc.abstractmethod
    def rmv(self, y):
        """``Hᵀ @ y`` for ``y`` of shape ``(N,)`` or ``(N, K)``."""

    @abc.abstractmethod
    def squared_mv(self, v):
        """``(H ∘ H) @ v``: projected variances of a diagonal covariance ``diag(v)``."""

    @abc.abstractmethod
    def squared_rmv(self, w):
        """``(H ∘ H)ᵀ @ w``, shape ``(D,)``."""

    @abc.abstractmethod
    def gram(self, w):
        """``Hᵀ diag(w) H``, shape ``(D, D)``."""

    def right_multiply(self, L):
        """The projection ``H @ L`` (used by the change of basis w = μ + L w̃)."""
        return Dense(self.mv(L))

    def row(self, n):
        """h_n, row ``n`` of H as a dense ``(D,)`` array (``n`` may be traced)."""
        return self.rmv(jax.nn.one_hot(n, self.shape[0], dtype=self._dtype()))

    def _dtype(self):
        floats = [x.dtype for x in jax.tree_util.tree_leaves(self) if jnp.issubdtype(x.dtype, jnp.floating)]
        return jnp.result_type(*floats) if floats else jnp.result_type(float)


class Dense(AbstractProjection):
    """H as a dense ``(N, D)`` array."""

    matrix: jax.Array

    @property
    def shape(self):
        return self.matrix.shape

    def mv(self, x):
        return self.matrix @ x

    def rmv(self, y):
        return self.matrix.T @ y

    def squared_mv(self, v):
        return (self.matrix**2) @ v

    def squared_rmv(self, w):
        return (self.matrix**2).T @ w

    def gram(self, w):
        return self.matrix.T @ (w[:, None] * self.matrix)

    def row(self, n):
        return self.matrix[n]


class Sparse(AbstractProjection):
    """A sparse H (`jax.experimental.sparse.BCOO`), with products that cost O(nnz(H) · K).

    The products use a blocked ELLPACK copy of the rows (`vijax._ellpack`; 4–6× faster than BCOO's), except
    for a BCOO built under tracing (which must not repeat an index) or with very uneven rows.
    """

    matrix: jsparse.BCOO
    ell_columns: jax.Array | None = None
    ell_values: jax.Array | None = None

    @staticmethod
    def from_bcoo(H: jsparse.BCOO) -> "Sparse":
        if not isinstance(H.indices, jax.core.Tracer):
            # Repeated indices add up in H but would square separately in H ∘ H.
            H = H.sum_duplicates()
        layout = _ellpack.layout(H)
        if layout is None:
            return Sparse(H)
        columns, position, valid = layout
        values = jnp.where(valid, H.data[position], 0).astype(H.data.dtype)
        return Sparse(H, jnp.asarray(columns), values)

    @property
    def shape(self):
        return self.matrix.shape

    def _squared(self):
        return jsparse.BCOO((self.matrix.data**2, self.matrix.indices), shape=self.matrix.shape)

    def mv(self, x):
        if self.ell_values is None:
            return self.matrix @ x
        return _ellpack.mv(self.ell_columns, self.ell_values, x, self.shape[0])

    def rmv(self, y):
        if self.ell_values is None:
            return self.matrix.T @ y
        return _ellpack.rmv(self.ell_columns, self.ell_values, y, self.shape[1])

    def squared_mv(self, v):
        if self.ell_values is None:
            return self._squared() @ v
        return _ellpack.mv(self.ell_columns, self.ell_values**2, v, self.shape[0])

    def squared_rmv(self, w):
        if self.ell_values is None:
            return self._squared().T @ w
        return _ellpack.rmv(self.ell_columns, self.ell_values**2, w, self.shape[1])

    def gram(self, w):
        """Hᵀ diag(w) H, dense ``(D, D)``, by blocks: never an N × D or nnz × D intermediate."""
        if self.ell_values is not None:
            return _ellpack.gram(self.ell_columns, self.ell_values, w, self.shape[1])
        num_rows, dim = self.shape
        b = max(1, min(dim, (1 << 22) // max(int(self.matrix.nse), 1)))
        starts = jnp.arange(0, dim, b)

        def block(start):
            columns = jax.nn.one_hot(start + jnp.arange(b), dim, dtype=self.matrix.dtype).T  # (D, b)
            return self.matrix.T @ (w[:, None] * (self.matrix @ columns))

        out = jax.lax.map(block, starts)  # (blocks, D, b)
        return jnp.moveaxis(out, 0, 1).reshape(dim, -1)[:, :dim]

    def right_multiply(self, L):
        return Dense(self.matrix @ L)


class Identity(AbstractProjection):
    """H = I (one site per coordinate, as in Gaussian-process models)."""

    dim: int = eqx.field(static=True)

    @property
    def shape(self):
        return (self.dim, self.dim)

    def mv(self, x):
        return x

    def rmv(self, y):
        return y

    def squared_mv(self, v):
        return v

    def squared_rmv(self, w):
        return w

    def gram(self, w):
        return jnp.diag(w)


class ScaledIdentity(AbstractProjection):
    """H = diag(scale): one site per coordinate, each scaled (GP classification folds labels ±1 in here)."""

    scale: jax.Array

    @property
    def shape(self):
        return (self.scale.shape[0], self.scale.shape[0])

    def _column(self, x):
        return self.scale.reshape((-1,) + (1,) * (jnp.ndim(x) - 1))

    def mv(self, x):
        return self._column(x) * x

    def rmv(self, y):
        return self._column(y) * y

    def squared_mv(self, v):
        return self._column(v) ** 2 * v

    def squared_rmv(self, w):
        return self._column(w) ** 2 * w

    def gram(self, w):
        return jnp.diag(self.scale**2 * w)


def as_projection(H) -> AbstractProjection:
    """``H`` as a projection: an `AbstractProjection` as it is, a `BCOO` matrix as `Sparse`, an array as `Dense`.

    Raises ``ValueError`` for a missing, non-2-D or non-finite ``H``.
    """
    if isinstance(H, AbstractProjection):
        return H
    if isinstance(H, jsparse.BCOO):
        if H.ndim != 2:
            raise ValueError(f"Sites: a sparse H must be 2-D (N, D), got shape {H.shape}.")
        _checks.check_finite("H.data", H.data, "Sites")
        return Sparse.from_bcoo(H)
    if H is None:
        raise ValueError("Sites: H is required; use vj.Identity(D) for one site per coordinate.")
    H = _checks.as_float_array("H", H, "Sites", ndim=2)
    _checks.check_finite("H", H, "Sites")
    return Dense(H)
