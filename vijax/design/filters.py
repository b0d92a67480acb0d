"""Linear filters B for the sparsity prior of a sparse linear model: s = B w.

Each filter is a projection (`vijax.projections.AbstractProjection`) acting on an image of shape ``(h, w)``
as the vector ``w = image.ravel()`` (D = h·w). Products with B, Bᵀ and B∘B are exact and matrix-free
(stencils for finite differences, separable products for wavelets); `stack` puts filters' rows one after
another (thesis §5.4: finite differences plus wavelets, B ∈ R^{3D × D}).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks
from ..projections import AbstractProjection, Identity, as_projection

__all__ = ["identity", "finite_differences", "wavelets", "stack", "FiniteDifferences", "Wavelets", "Stacked",
           "DB4_LOW", "DB4_HIGH", "max_level", "as_dense"]
__dir__ = __all__.copy

# Daubechies-4 (8 taps, 4 vanishing moments) analysis filters, as in PyWavelets' Wavelet("db4").dec_lo/dec_hi.
DB4_LOW = np.array([-0.010597401785069032, 0.0328830116668852, 0.030841381835560764, -0.18703481171909309,
                    -0.027983769416859854, 0.6308807679298589, 0.7148465705529157, 0.2303778133088965])
DB4_HIGH = np.array([(-1) ** (k + 1) * DB4_LOW[::-1][k] for k in range(8)])


def _check_shape(shape, owner):
    if (not isinstance(shape, (tuple, list)) or len(shape) != 2
            or not all(isinstance(n, (int, np.integer)) and n >= 1 for n in shape)):
        raise ValueError(f"{owner}: `shape` must be an image shape (h, w) of two positive integers, got {shape!r}.")
    return int(shape[0]), int(shape[1])


class _Filter(AbstractProjection):
    """Products with B (or B∘B when ``squared``) from ``_forward``, and their transposes by ``jax.linear_transpose``."""

    def _forward(self, x, squared):
        raise NotImplementedError

    def _adjoint(self, y, squared):
        primal = jax.ShapeDtypeStruct((self.shape[1], *y.shape[1:]), y.dtype)
        (out,) = jax.linear_transpose(lambda x: self._forward(x, squared), primal)(y)
        return out

    def _check(self, x, rows):
        expected = self.shape[0] if rows else self.shape[1]
        if x.shape[0] != expected:
            raise ValueError(f"{type(self).__name__} product: expected {expected} rows, got shape {x.shape}.")
        return x

    def mv(self, x):
        return self._forward(self._check(x, False), False)

    def rmv(self, y):
        return self._adjoint(self._check(y, True), False)

    def squared_mv(self, v):
        return self._forward(self._check(v, False), True)

    def squared_rmv(self, w):
        return self._adjoint(self._check(w, True), True)

    def _dtype(self):
        return self.dtype


class FiniteDifferences(_Filter):
    """Differences of horizontal, then vertical, neighbours of an ``(h, w)`` image (see `finite_differences`)."""

    image_shape: tuple[int, int] = eqx.field(static=True)
    periodic: bool = eqx.field(static=True)
    dtype: object = eqx.field(static=True)

    def __init__(self, image_shape, periodic=False, dtype=None):
        self.image_shape = _check_shape(image_shape, "finite_differences")
        self.periodic = bool(periodic)
        self.dtype = jnp.dtype(jnp.result_type(float) if dtype is None else dtype)

    @property
    def shape(self):
        h, w = self.image_shape
        rows = 2 * h * w if self.periodic else h * (w - 1) + (h - 1) * w
        return (rows, h * w)

    def _neighbours(self, image):
        """(right, left, below, above): row r of B is e_a − e_b with a from (right, below), b from (left, above)."""
        if self.periodic:
            return jnp.roll(image, -1, axis=1), image, jnp.roll(image, -1, axis=0), image
        return image[:, 1:], image[:, :-1], image[1:, :], image[:-1, :]

    def _forward(self, x, squared):
        # Every row has entries +1 and −1, so B∘B is the same stencil with both signs +.
        sign = 1.0 if squared else -1.0
        right, left, below, above = self._neighbours(x.reshape(*self.image_shape, *x.shape[1:]))
        batch = x.shape[1:]
        return jnp.concatenate([(right + sign * left).reshape(-1, *batch), (below + sign * above).reshape(-1, *batch)])

    def _pairs(self):
        """(a, b) with row r of B equal to e_a − e_b, in row order."""
        right, left, below, above = self._neighbours(jnp.arange(self.shape[1]).reshape(self.image_shape))
        return jnp.concatenate([right.ravel(), below.ravel()]), jnp.concatenate([left.ravel(), above.ravel()])

    def gram(self, w):
        # Bᵀ diag(u) B = Σ_r u_r (e_a − e_b)(e_a − e_b)ᵀ: a weighted graph Laplacian, O(D) scattered entries.
        a, b = self._pairs()
        dim = self.shape[1]
        G = jnp.zeros((dim, dim), w.dtype)
        return G.at[a, a].add(w).at[b, b].add(w).at[a, b].add(-w).at[b, a].add(-w)


def max_level(image_shape) -> int:
    """The deepest useful Daubechies-4 level for an image: ⌊log₂(min(h, w) / 7)⌋ (PyWavelets' ``dwt_max_level``)."""
    n = min(image_shape)
    return max(int(math.floor(math.log2(n / 7.0))), 0) if n >= 7 else 0


def _analysis_matrix(n, taps):
    """One periodic analysis step, (n/2, n): out[k] = Σ_j taps[j] x[(2k + 4 − j) mod n]."""
    A = np.zeros((n // 2, n))
    for k in range(n // 2):
        for j in range(8):
            A[k, (2 * k + 4 - j) % n] += taps[j]
    return A


def _composite_filters(n, levels):
    """Per level ℓ = 1…L, the (n/2^ℓ, n) matrices (low_ℓ, high_ℓ) of ℓ analysis steps."""
    out, approx = [], np.eye(n)
    for level in range(levels):
        m = n >> level
        low, high = _analysis_matrix(m, DB4_LOW), _analysis_matrix(m, DB4_HIGH)
        out.append((low @ approx, high @ approx))
        approx = low @ approx
    return out


class Wavelets(_Filter):
    """The orthonormal multi-scale Daubechies-4 transform of an ``(h, w)`` image (see `wavelets`); B Bᵀ = BᵀB = I.

    Level ℓ is a separable product with the composite filters of ℓ analysis steps:

    $$
    Y_\\ell = A_\\ell X C_\\ell^\\top
    = \\begin{pmatrix} c_{A,\\ell} & c_{V,\\ell} \\\\ c_{H,\\ell} & c_{D,\\ell} \\end{pmatrix},
    \\qquad A_\\ell = \\begin{pmatrix} \\mathrm{low}_\\ell \\\\ \\mathrm{high}_\\ell \\end{pmatrix},\\
    C_\\ell = \\begin{pmatrix} \\mathrm{low}'_\\ell \\\\ \\mathrm{high}'_\\ell \\end{pmatrix}
    $$

    (c_A kept at the coarsest level L only). A row of B is a ⊗ c, so B∘B uses A_ℓ∘A_ℓ and C_ℓ∘C_ℓ.
    """

    image_shape: tuple[int, int] = eqx.field(static=True)
    levels: int = eqx.field(static=True)
    matrices: tuple  # per level ℓ = 1…L: (A_ℓ (2h/2^ℓ, h), C_ℓ (2w/2^ℓ, w)), the stacked composite filters

    def __init__(self, image_shape, levels=None, dtype=None):
        h, w = self.image_shape = _check_shape(image_shape, "wavelets")
        levels = max_level((h, w)) if levels is None else levels
        if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 1:
            raise ValueError(f"wavelets: `levels` must be a positive integer, got {levels!r} (an image of shape "
                             f"{(h, w)} allows up to {max(max_level((h, w)), 1)}).")
        if h % 2**levels or w % 2**levels:
            raise ValueError(f"wavelets: an image of shape {(h, w)} cannot be halved {levels} times; both sides "
                             f"must be multiples of 2**levels = {2**levels}: pass fewer `levels` or crop the image.")
        self.levels = int(levels)
        dtype = jnp.result_type(float) if dtype is None else dtype
        rows, cols = _composite_filters(h, self.levels), _composite_filters(w, self.levels)
        self.matrices = tuple((jnp.asarray(np.concatenate(r), dtype), jnp.asarray(np.concatenate(c), dtype))
                              for r, c in zip(rows, cols))

    @property
    def dtype(self):
        return self.matrices[0][0].dtype

    @property
    def shape(self):
        dim = self.image_shape[0] * self.image_shape[1]
        return (dim, dim)

    def _level_shapes(self):
        h, w = self.image_shape
        return [(h >> level, w >> level) for level in range(1, self.levels + 1)]

    def _forward(self, x, squared):
        image = x.reshape(*self.image_shape, *x.shape[1:])
        grids = [jnp.einsum("ah,hw...,bw->ab...", A * A, image, C * C) if squared
                 else jnp.einsum("ah,hw...,bw->ab...", A, image, C) for A, C in self.matrices]
        return self._flatten(grids)

    def _flatten(self, grids):
        """Each level's grid Y_ℓ (2h/2^ℓ, 2w/2^ℓ, K…) as coefficients (D, K…): c_A of level L, then (c_H, c_V,
        c_D) from level L down to 1."""
        blocks = []
        for Y, (hl, wl) in zip(grids, self._level_shapes()):
            blocks.append([Y[hl:, :wl], Y[:hl, wl:], Y[hl:, wl:]])  # c_H, c_V, c_D
        flat = [Y[:hl, :wl]] + [b for level in reversed(blocks) for b in level]
        return jnp.concatenate([b.reshape(-1, *Y.shape[2:]) for b in flat])

    def _grids(self, y):
        """The transpose of `_flatten` (c_A zero below the coarsest level)."""
        primal = [jax.ShapeDtypeStruct((2 * hl, 2 * wl, *y.shape[1:]), y.dtype) for hl, wl in self._level_shapes()]
        (grids,) = jax.linear_transpose(self._flatten, primal)(y)
        return grids

    def gram(self, w):
        """Bᵀ diag(u) B from the separable rows a_i ⊗ c_j, O(D²·(h + w)) rather than O(D³)."""
        h, w_ = self.image_shape
        G = jnp.zeros((h, w_, h, w_), w.dtype)
        for (A, C), U in zip(self.matrices, self._grids(w)):
            T = jnp.einsum("ij,jw,jv->iwv", U, C, C)  # (2h_ℓ, w, w)
            G = G + jnp.einsum("ih,ik,iwv->hwkv", A, A, T)
        return G.reshape(h * w_, h * w_)


class Stacked(AbstractProjection):
    """The rows of several projections, one block after another: B = [B_1; B_2; …]."""

    parts: tuple

    @property
    def shape(self):
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    def _split(self, y):
        edges = np.cumsum([p.shape[0] for p in self.parts])[:-1]
        return jnp.split(y, edges, axis=0)

    def mv(self, x):
        return jnp.concatenate([p.mv(x) for p in self.parts], axis=0)

    def rmv(self, y):
        return sum(p.rmv(block) for p, block in zip(self.parts, self._split(y)))

    def squared_mv(self, v):
        return jnp.concatenate([p.squared_mv(v) for p in self.parts], axis=0)

    def squared_rmv(self, w):
        return sum(p.squared_rmv(block) for p, block in zip(self.parts, self._split(w)))

    def gram(self, w):
        return sum(p.gram(block) for p, block in zip(self.parts, self._split(w)))

    def _dtype(self):
        return self.parts[0]._dtype()


def identity(dim: int) -> Identity:
    """B = I: the sparsity prior acts on each coordinate of w (``vj.Identity(dim)``)."""
    return Identity(_checks.integer("dim", dim, "identity"))


def finite_differences(shape, periodic=False, dtype=None) -> FiniteDifferences:
    """Horizontal and vertical neighbour differences of an image of ``shape`` (h, w).

    Rows: the h(w−1) differences x[i, j+1] − x[i, j] (row-major), then the (h−1)w ones x[i+1, j] − x[i, j].
    ``periodic=True`` wraps around the border: 2D rows (the thesis's B ∈ R^{3D×D} with wavelets).
    """
    return FiniteDifferences(shape, periodic, dtype)


def wavelets(shape, levels=None, dtype=None) -> Wavelets:
    """The orthonormal Daubechies-4 wavelet transform of an image of ``shape`` (h, w), periodic boundary.

    ``levels`` defaults to `max_level`; both sides must be multiples of ``2**levels``. Rows in the order of
    PyWavelets' ``wavedec2(image, "db4", mode="periodization", level=levels)``, each block raveled.
    """
    return Wavelets(shape, levels, dtype)


def stack(*filters) -> Stacked:
    """The rows of ``filters`` (projections or dense arrays with the same D) one after another."""
    if not filters:
        raise ValueError("stack: give at least one filter.")
    parts = tuple(as_projection(f) for f in filters)
    dims = {p.shape[1] for p in parts}
    if len(dims) != 1:
        raise ValueError(f"stack: the filters act on different dimensions D = {sorted(dims)}; "
                         "every filter must have one column per coordinate of w.")
    return Stacked(parts)


def as_dense(B) -> jax.Array:
    """Any projection as a dense ``(N, D)`` array (its products with the columns of I); for checks and plots."""
    B = as_projection(B)
    return jax.jit(lambda B: B.mv(jnp.eye(B.shape[1], dtype=B._dtype())))(B)
