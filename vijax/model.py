"""The latent linear model p(w) ∝ N(w | μ, Σ) · ∏_n φ_n(h_nᵀ w + b_n).

- `GaussianFactor` — the Gaussian term (prior, or a linear-Gaussian likelihood);
  its constructors return one of four concrete forms, each of which knows its own
  log density, precision and the trace terms the bounds need.
- `Sites` — a group of site potentials with its projection matrix H (dense,
  `jax.experimental.sparse.BCOO`, or `Identity`) and an optional offset b.
- `LatentLinearModel` — a Gaussian factor (or none) and one or more site groups.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse
from jax.scipy.linalg import cho_solve, solve_triangular

from . import _checks
from ._linalg import LOG_2PI
from .potentials import AbstractPotential

__all__ = [
    "GaussianFactor",
    "IsotropicGaussian",
    "DiagonalGaussian",
    "DenseGaussian",
    "NaturalGaussian",
    "Identity",
    "ScaledIdentity",
    "Sites",
    "LatentLinearModel",
]


# ----------------------------------------------------------------------------------------------
# Projections H : R^D -> R^N


class AbstractProjection(eqx.Module):
    """The linear map w ↦ Hw of a site group, shape ``(N, D)``.

    Covariance families only ever use the products below, so dense, sparse and
    identity projections are interchangeable.
    """

    def mv(self, x):
        """``H @ x`` for ``x`` of shape ``(D,)`` or ``(D, K)``."""
        raise NotImplementedError

    def rmv(self, y):
        """``Hᵀ @ y`` for ``y`` of shape ``(N,)`` or ``(N, K)``."""
        raise NotImplementedError

    def squared_mv(self, v):
        """``(H ∘ H) @ v``: projected variances of a diagonal covariance ``diag(v)``."""
        raise NotImplementedError

    def squared_rmv(self, w):
        """``(H ∘ H)ᵀ @ w``, shape ``(D,)``."""
        raise NotImplementedError

    def gram(self, w):
        """``Hᵀ diag(w) H``, shape ``(D, D)``."""
        raise NotImplementedError

    def right_multiply(self, L):
        """The projection ``H @ L`` (used by the change of basis w = μ + L w̃)."""
        raise NotImplementedError

    def row(self, n):
        """h_n, row ``n`` of H as a dense ``(D,)`` array (``n`` may be traced)."""
        return self.rmv(jax.nn.one_hot(n, self.shape[0], dtype=self._dtype()))

    def _dtype(self):
        floats = [x.dtype for x in jax.tree_util.tree_leaves(self) if jnp.issubdtype(x.dtype, jnp.floating)]
        return jnp.result_type(*floats) if floats else jnp.result_type(float)


class Dense(AbstractProjection):
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

    def right_multiply(self, L):
        return Dense(self.matrix @ L)

    def row(self, n):
        return self.matrix[n]


class Sparse(AbstractProjection):
    """A sparse H (`jax.experimental.sparse.BCOO`), with products that cost O(nnz(H) · K).

    For the products, the rows are also stored in ELLPACK form — each row's column
    indices and values padded to the longest row, shape ``(N_pad, width)`` — and
    processed in blocks of rows by one `lax.map`: a gather and a small contraction per
    block, whose transpose (for gradients and ``rmv``) is a scatter-add of the same size.
    That keeps the working set in cache, where a single BCOO product with a ``(D, K)``
    right-hand side materialises all nnz · K partial products at once (about 4× slower
    on CPU at the sizes of vijax's large benchmarks).

    The layout needs concrete indices; a BCOO built under tracing, or one whose longest
    row exceeds `_MAX_PADDING` × the mean row length, uses the BCOO products instead
    (a BCOO built under tracing must not repeat an index: H ∘ H would square the parts).
    """

    matrix: jsparse.BCOO
    ell_columns: jax.Array | None = None
    ell_values: jax.Array | None = None

    @staticmethod
    def from_bcoo(H: jsparse.BCOO) -> "Sparse":
        if not isinstance(H.indices, jax.core.Tracer):
            # Repeated indices add up in H, but would square separately in H ∘ H.
            H = H.sum_duplicates()
        layout = _ell_layout(H)
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
        return _ell_mv(self.ell_columns, self.ell_values, x, self.shape[0])

    def rmv(self, y):
        if self.ell_values is None:
            return self.matrix.T @ y
        return _ell_rmv(self.ell_columns, self.ell_values, y, self.shape[1])

    def squared_mv(self, v):
        if self.ell_values is None:
            return self._squared() @ v
        return _ell_mv(self.ell_columns, self.ell_values**2, v, self.shape[0])

    def squared_rmv(self, w):
        if self.ell_values is None:
            return self._squared().T @ w
        return _ell_rmv(self.ell_columns, self.ell_values**2, w, self.shape[1])

    def gram(self, w):
        rows = self.matrix.indices[:, 0]
        weighted = jsparse.BCOO((self.matrix.data * w[rows], self.matrix.indices), shape=self.matrix.shape)
        return self.matrix.T @ weighted.todense()

    def right_multiply(self, L):
        return Dense(self.matrix @ L)


# ELLPACK rows are padded to a multiple of this, or of the next power of two of N if smaller
# (so that power-of-two blocks divide them) ...
_ROW_ALIGN = 1024
# ... and a block holds about this many gathered elements (block rows × width × K).
_BLOCK_ELEMENTS = 1 << 19
# Rows longer than this many times the mean make the padded layout wasteful: keep BCOO.
_MAX_PADDING = 8


def _ell_layout(H):
    """Column indices, positions in ``H.data`` and validity, each ``(N_pad, width)``; None if not possible."""
    if isinstance(H.indices, jax.core.Tracer) or H.nse == 0:
        return None
    indices = np.asarray(H.indices)
    num_rows = H.shape[0]
    rows, columns = indices[:, 0], indices[:, 1]
    order = np.argsort(rows, kind="stable")
    counts = np.bincount(rows, minlength=num_rows)
    width = int(counts.max())
    if width > _MAX_PADDING * max(counts.mean(), 1.0):
        return None
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(order.size) - starts[rows[order]]
    align = min(_ROW_ALIGN, 1 << int(np.ceil(np.log2(num_rows))))
    padded_rows = -(-num_rows // align) * align
    ell_columns = np.zeros((padded_rows, width), np.int32)
    position = np.zeros((padded_rows, width), np.int64)
    valid = np.zeros((padded_rows, width), bool)
    ell_columns[rows[order], slot] = columns[order]
    position[rows[order], slot] = order
    valid[rows[order], slot] = True
    return ell_columns, position, valid


def _block_rows(padded, width, x):
    k = int(np.prod(x.shape[1:], dtype=int))
    target = max(_BLOCK_ELEMENTS // max(width * k, 1), 1)
    return int(min(2 ** int(np.log2(target)), _ROW_ALIGN, padded & -padded))


def _ell_mv(columns, values, x, num_rows):
    padded, width = columns.shape
    x = jnp.asarray(x)
    b = _block_rows(padded, width, x)
    blocks = (columns.reshape(-1, b, width), values.reshape(-1, b, width))
    out = jax.lax.map(lambda cv: jnp.einsum("bw,bw...->b...", cv[1], x[cv[0]]), blocks)
    return out.reshape((padded,) + x.shape[1:])[:num_rows]


def _ell_rmv(columns, values, y, dim):
    padded, width = columns.shape
    y = jnp.asarray(y)
    b = _block_rows(padded, width, y)
    y = jnp.pad(y, ((0, padded - y.shape[0]),) + ((0, 0),) * (y.ndim - 1))
    blocks = (columns.reshape(-1, b, width), values.reshape(-1, b, width), y.reshape((-1, b) + y.shape[1:]))

    def accumulate(total, block):
        c, v, yb = block
        contributions = jnp.einsum("bw,b...->bw...", v, yb)
        return total.at[c.reshape(-1)].add(contributions.reshape((-1,) + yb.shape[1:])), None

    zero = jnp.zeros((dim,) + y.shape[1:], jnp.result_type(values, y))
    return jax.lax.scan(accumulate, zero, blocks)[0]


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

    def right_multiply(self, L):
        return Dense(L)

    def row(self, n):
        return jax.nn.one_hot(n, self.dim, dtype=self._dtype())


class ScaledIdentity(AbstractProjection):
    """H = diag(scale): one site per coordinate, each scaled (GP classification folds labels ±1 in here)."""

    scale: jax.Array

    @property
    def shape(self):
        return (self.scale.shape[0], self.scale.shape[0])

    def _column(self, x):
        # the scale along the first axis, so that x may be a vector or a matrix of columns
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

    def right_multiply(self, L):
        return Dense(self.scale[:, None] * L)

    def row(self, n):
        return self.scale[n] * jax.nn.one_hot(n, self.scale.shape[0], dtype=self.scale.dtype)


def _as_projection(H) -> AbstractProjection:
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


class Sites(eqx.Module):
    """A group of site potentials φ_n(h_nᵀ w + b_n).

    **Arguments:**

    - `H`: projections, shape ``(N, D)``: a dense array, a `BCOO` matrix, or `Identity(D)`.
    - `potential`: an `AbstractPotential` whose per-site parameters broadcast to ``(N,)``.
    - `offset`: b, a scalar or shape ``(N,)`` (default 0).
    """

    projection: AbstractProjection
    potential: AbstractPotential
    offset: jax.Array

    def __init__(self, H, potential, offset=0.0):
        if not isinstance(potential, AbstractPotential):
            raise ValueError(f"Sites: `potential` must be a vj.potentials potential, got {type(potential).__name__}.")
        self.projection = _as_projection(H)
        self.potential = potential
        self.offset = _checks.as_float_array("offset", offset, "Sites")
        _checks.check_finite("offset", self.offset, "Sites")
        n = self.num_sites
        _checks.check_broadcastable("offset", self.offset, n, "Sites")
        potential.check_num_sites(n)

    @property
    def num_sites(self) -> int:
        return self.projection.shape[0]

    @property
    def dim(self) -> int:
        return self.projection.shape[1]

    def project(self, w):
        """``H w + b``."""
        return self.projection.mv(w) + self.offset

    def change_basis(self, loc, L):
        """The same sites on w̃ where w = loc + L w̃."""
        return Sites(self.projection.right_multiply(L), self.potential, self.offset + self.projection.mv(loc))


# ----------------------------------------------------------------------------------------------
# Gaussian factors


class GaussianFactor(eqx.Module):
    """A Gaussian term exp(−½ wᵀΛw + ηᵀw + c) of the target.

    Build it with one of the constructors; each returns the concrete form whose
    algebra is cheapest:

    - `GaussianFactor.isotropic(dim, variance, mean=0)` — N(w | μ, v I);
    - `GaussianFactor.diagonal(variance, mean=0)` — N(w | μ, diag(v));
    - `GaussianFactor.dense(mean, cov)` — N(w | μ, Σ), Σ positive definite;
    - `GaussianFactor.precision(mean, prec)` — N(w | μ, Λ⁻¹), Λ positive definite;
    - `GaussianFactor.linear_gaussian(M, y, noise_variance)` — the likelihood
      N(y | M w, ν² I) as a function of w (its precision MᵀM/ν² may be singular).
    """

    # Whether Λ is diagonal, so that tr(ΛS) needs only diag(S).
    diagonal_precision: ClassVar[bool] = False

    @property
    def dim(self) -> int:
        raise NotImplementedError

    # Algebra every family and method uses -------------------------------------------------
    def log_density(self, w):
        """log of the factor at ``w`` (shape ``(D,)``), normalising constant included."""
        raise NotImplementedError

    def trace_gram(self, C):
        """tr(Λ CᵀC) for a square ``C``: the trace term of ⟨log f⟩ under S = CᵀC."""
        raise NotImplementedError

    def precision_diagonal(self):
        raise NotImplementedError

    def precision_matrix(self):
        raise NotImplementedError

    def expected_log_density(self, mean, cov):
        """⟨log f(w)⟩ under N(mean, S) with S given by a covariance-family factor."""
        return self.log_density(mean) - 0.5 * cov.trace_precision(self)

    def initial_moments(self):
        """A starting mean and per-coordinate scale for the approximation."""
        raise NotImplementedError

    def whitening(self):
        """``(loc, L)`` with w = loc + L w̃ turning the factor into N(w̃ | 0, I), or None."""
        return None

    # Constructors ----------------------------------------------------------------------------
    @staticmethod
    def isotropic(dim: int, variance=1.0, mean=0.0) -> "IsotropicGaussian":
        if not (isinstance(dim, (int, np.integer)) and dim >= 1):
            raise ValueError(f"GaussianFactor.isotropic: `dim` must be a positive integer, got {dim!r}.")
        return IsotropicGaussian(int(dim), variance, mean)

    @staticmethod
    def diagonal(variance, mean=0.0) -> "DiagonalGaussian":
        return DiagonalGaussian(variance, mean)

    @staticmethod
    def dense(mean, cov, jitter=0.0) -> "DenseGaussian":
        return DenseGaussian(mean, cov, jitter)

    @staticmethod
    def precision(mean, prec) -> "NaturalGaussian":
        owner = "GaussianFactor.precision"
        mean = _checks.as_float_array("mean", mean, owner, ndim=1)
        prec = _checks.as_float_array("prec", prec, owner, ndim=2)
        _check_square(prec, mean.shape[0], "prec", owner)
        _check_positive_definite(prec, "prec", owner)
        L = jnp.linalg.cholesky(prec)
        logdet = 2 * jnp.sum(jnp.log(jnp.diag(L)))
        shift = prec @ mean
        const = 0.5 * logdet - 0.5 * mean.shape[0] * LOG_2PI - 0.5 * mean @ shift
        return NaturalGaussian(prec, shift, const)

    @staticmethod
    def linear_gaussian(M, y, noise_variance) -> "NaturalGaussian":
        owner = "GaussianFactor.linear_gaussian"
        M = _checks.as_float_array("M", M, owner, ndim=2)
        y = _checks.as_float_array("y", y, owner, ndim=1)
        if M.shape[0] != y.shape[0]:
            raise ValueError(f"{owner}: M has {M.shape[0]} rows but y has {y.shape[0]} entries.")
        _checks.check_finite("M", M, owner)
        _checks.check_finite("y", y, owner)
        _checks.check_positive("noise_variance", noise_variance, owner)
        nu2 = jnp.asarray(noise_variance, M.dtype)
        const = -0.5 * (y @ y) / nu2 - 0.5 * y.shape[0] * (LOG_2PI + jnp.log(nu2))
        return NaturalGaussian(M.T @ M / nu2, M.T @ y / nu2, const)


def _check_square(A, dim, name, owner):
    if A.shape != (dim, dim):
        raise ValueError(f"{owner}: `{name}` must have shape ({dim}, {dim}) to match the mean, got {A.shape}.")


def _check_positive_definite(A, name, owner):
    _checks.check_finite(name, A, owner)
    if not _checks.is_concrete(A):
        return
    a = np.asarray(A, dtype=np.float64)
    if not np.allclose(a, a.T, rtol=1e-10, atol=1e-12 * max(1.0, np.abs(a).max())):
        raise ValueError(f"{owner}: `{name}` must be symmetric.")
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        lam = np.linalg.eigvalsh(a).min()
        raise ValueError(f"{owner}: `{name}` is not positive definite (smallest eigenvalue {lam:.3g}); "
                         "add jitter to its diagonal or check how it was built.") from None


class IsotropicGaussian(GaussianFactor):
    """N(w | μ, v I)."""

    diagonal_precision: ClassVar[bool] = True

    num_dims: int = eqx.field(static=True)
    variance: jax.Array
    mean: jax.Array

    def __init__(self, dim, variance=1.0, mean=0.0):
        owner = "GaussianFactor.isotropic"
        self.num_dims = dim
        self.variance = _checks.as_float_array("variance", variance, owner, ndim=0)
        _checks.check_positive("variance", self.variance, owner)
        self.mean = jnp.broadcast_to(_checks.as_float_array("mean", mean, owner), (dim,))
        _checks.check_finite("mean", self.mean, owner)

    @property
    def dim(self):
        return self.num_dims

    def log_density(self, w):
        r = w - self.mean
        return -0.5 * (self.dim * (LOG_2PI + jnp.log(self.variance)) + r @ r / self.variance)

    def trace_gram(self, C):
        return jnp.sum(C**2) / self.variance

    def precision_diagonal(self):
        return jnp.full((self.dim,), 1.0 / self.variance)

    def precision_matrix(self):
        return jnp.eye(self.dim, dtype=self.mean.dtype) / self.variance

    def initial_moments(self):
        return self.mean, jnp.full((self.dim,), jnp.sqrt(self.variance))


class DiagonalGaussian(GaussianFactor):
    """N(w | μ, diag(v))."""

    diagonal_precision: ClassVar[bool] = True

    variance: jax.Array
    mean: jax.Array

    def __init__(self, variance, mean=0.0):
        owner = "GaussianFactor.diagonal"
        self.variance = _checks.as_float_array("variance", variance, owner, ndim=1)
        _checks.check_positive("variance", self.variance, owner)
        self.mean = jnp.broadcast_to(_checks.as_float_array("mean", mean, owner), self.variance.shape)
        _checks.check_finite("mean", self.mean, owner)

    @property
    def dim(self):
        return self.variance.shape[0]

    def log_density(self, w):
        r = w - self.mean
        return -0.5 * (self.dim * LOG_2PI + jnp.sum(jnp.log(self.variance)) + jnp.sum(r**2 / self.variance))

    def trace_gram(self, C):
        return jnp.sum(C**2 / self.variance[None, :])

    def precision_diagonal(self):
        return 1.0 / self.variance

    def precision_matrix(self):
        return jnp.diag(1.0 / self.variance)

    def initial_moments(self):
        return self.mean, jnp.sqrt(self.variance)


class DenseGaussian(GaussianFactor):
    """N(w | μ, Σ) with a dense positive-definite Σ = L Lᵀ (L lower-triangular).

    ``jitter`` is added to the diagonal of Σ before factorising and kept for reporting.
    """

    mean: jax.Array
    cov: jax.Array
    chol: jax.Array
    jitter: jax.Array

    def __init__(self, mean, cov, jitter=0.0):
        owner = "GaussianFactor.dense"
        self.mean = _checks.as_float_array("mean", mean, owner, ndim=1)
        _checks.check_finite("mean", self.mean, owner)
        cov = _checks.as_float_array("cov", cov, owner, ndim=2)
        _check_square(cov, self.mean.shape[0], "cov", owner)
        self.jitter = jnp.asarray(jitter, cov.dtype)
        self.cov = cov + self.jitter * jnp.eye(cov.shape[0], dtype=cov.dtype)
        _check_positive_definite(self.cov, "cov", owner)
        self.chol = jnp.linalg.cholesky(self.cov)

    @property
    def dim(self):
        return self.mean.shape[0]

    def log_density(self, w):
        r = solve_triangular(self.chol, w - self.mean, lower=True)
        logdet = 2 * jnp.sum(jnp.log(jnp.diag(self.chol)))
        return -0.5 * (self.dim * LOG_2PI + logdet + r @ r)

    def trace_gram(self, C):
        # tr(Σ⁻¹ CᵀC) = ‖L⁻¹ Cᵀ‖²_F
        return jnp.sum(solve_triangular(self.chol, C.T, lower=True) ** 2)

    def precision_diagonal(self):
        inv_chol = solve_triangular(self.chol, jnp.eye(self.dim, dtype=self.chol.dtype), lower=True)
        return jnp.sum(inv_chol**2, axis=0)

    def precision_matrix(self):
        return cho_solve((self.chol, True), jnp.eye(self.dim, dtype=self.chol.dtype))

    def initial_moments(self):
        return self.mean, jnp.sqrt(jnp.diag(self.cov))

    def whitening(self):
        return self.mean, self.chol


class NaturalGaussian(GaussianFactor):
    """exp(−½ wᵀΛw + ηᵀw + c) with symmetric positive semi-definite Λ (may be singular)."""

    prec: jax.Array
    shift: jax.Array
    log_const: jax.Array

    @property
    def dim(self):
        return self.shift.shape[0]

    def log_density(self, w):
        return -0.5 * w @ (self.prec @ w) + self.shift @ w + self.log_const

    def trace_gram(self, C):
        return jnp.sum((C @ self.prec) * C)

    def precision_diagonal(self):
        return jnp.diag(self.prec)

    def precision_matrix(self):
        return self.prec

    def initial_moments(self):
        d = jnp.diag(self.prec)
        scale = jnp.where(d > 0, jnp.minimum(1.0 / jnp.sqrt(jnp.where(d > 0, d, 1.0)), 1.0), 1.0)
        return jnp.zeros_like(self.shift), scale


# ----------------------------------------------------------------------------------------------


class LatentLinearModel(eqx.Module):
    """p(w) ∝ f(w) · ∏_g ∏_n φ_{gn}(h_{gn}ᵀ w + b_{gn}).

    **Arguments:**

    - `prior`: a `GaussianFactor`, or None for a target with no Gaussian term.
    - `sites`: a `Sites` group or a tuple of them (e.g. likelihood sites and
      Laplace-prior sites with H = I).
    """

    prior: GaussianFactor | None
    sites: tuple[Sites, ...]

    def __init__(self, prior, sites):
        if prior is not None and not isinstance(prior, GaussianFactor):
            raise ValueError("LatentLinearModel: `prior` must be a vj.GaussianFactor or None, "
                             f"got {type(prior).__name__}.")
        if isinstance(sites, Sites):
            sites = (sites,)
        sites = tuple(sites)
        if not sites or not all(isinstance(s, Sites) for s in sites):
            raise ValueError("LatentLinearModel: `sites` must be a vj.Sites or a non-empty tuple of them.")
        dims = {s.dim for s in sites} | ({prior.dim} if prior is not None else set())
        if len(dims) != 1:
            raise ValueError(f"LatentLinearModel: dimensions disagree: prior and site groups have D = {sorted(dims)}; "
                             "every H must have one column per latent coordinate.")
        self.prior = prior
        self.sites = sites

    @property
    def dim(self) -> int:
        return self.sites[0].dim

    @property
    def dtype(self):
        """The floating dtype of the model's data (that of its projections, else of its prior)."""
        leaves = [s.projection for s in self.sites if not isinstance(s.projection, Identity)] or [self.prior]
        # Only floating leaves: a sparse projection also holds integer column indices.
        floats = [x.dtype for x in jax.tree_util.tree_leaves(leaves) if jnp.issubdtype(x.dtype, jnp.floating)]
        return jnp.result_type(*floats)

    def initial_moments(self):
        """A starting mean and per-coordinate scale: the Gaussian factor's, or (0, 1) without one."""
        dtype = self.dtype
        if self.prior is None:
            return jnp.zeros(self.dim, dtype), jnp.ones(self.dim, dtype)
        return tuple(a.astype(dtype) for a in self.prior.initial_moments())

    def log_joint(self, w):
        """log f(w) + Σ log φ_n(h_nᵀw + b_n): the unnormalised log target at ``w`` (shape ``(D,)``)."""
        value = self.prior.log_density(w) if self.prior is not None else 0.0
        for group in self.sites:
            value = value + jnp.sum(group.potential.log_phi(group.project(w)))
        return value
