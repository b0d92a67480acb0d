"""Padded site groups: one compiled fit for data sets of nearby sizes.

`pad_sites` gives every site group a fixed size N': the real sites, then copies of the last one switched off by
`vijax.potentials.Masked` (φ̃_n ≡ 1, so p(w) ∝ f(w) ∏_{n ≤ N} φ_n(h_nᵀw + b_n) and every method's answer is the
unpadded model's). Copies, not zero rows, keep every value under the mask finite for reverse-mode derivatives. The
mask is traced, so models padded to the same sizes share one compiled fit::

    fit = jax.jit(lambda m: vj.infer(m, vj.GKL()))
    for X, y in folds:                                    # 90 … 110 training points each
        post = fit(vj.pad_sites(vj.glm.logistic_regression(X, y), 112))   # compiled once
"""

from __future__ import annotations


import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from . import _checks
from .model import Dense, LatentLinearModel, Sites, Sparse
from .potentials import Masked

__all__ = ["pad_sites"]
__dir__ = __all__.copy

_OWNER = "pad_sites"


def pad_sites(model: LatentLinearModel, size=None, *, multiple=None) -> LatentLinearModel:
    """``model`` with each site group padded to a fixed number of sites that contribute nothing.

    Dense and sparse (`BCOO`, outside ``jax.jit``) groups can be padded; groups on `vj.Identity` or `ScaledIdentity`
    cannot grow (pass None or an equal size for them). Give either ``size`` or ``multiple``:

    - `size`: the number of sites N' ≥ N of every group (an int), or one per group (a tuple, None keeping a group).
    - `multiple`: pad each group to the next multiple of this (``multiple=16``: 90 … 110 points give 96 or 112).

    **Returns:** a `vj.LatentLinearModel` whose padded groups (also those already of size N') carry a
    `vijax.potentials.Masked` potential, True for the N real sites; every answer equals ``model``'s up to rounding.
    """
    if not isinstance(model, LatentLinearModel):
        raise ValueError(f"{_OWNER}: expected a vj.LatentLinearModel, got {type(model).__name__}.")
    sizes = _target_sizes(model, size, multiple)
    groups = tuple(group if target is None else _pad_group(group, target, index)
                   for index, (group, target) in enumerate(zip(model.sites, sizes)))
    return model.replace(sites=groups)


def _target_sizes(model, size, multiple):
    counts = [g.num_sites for g in model.sites]
    if (size is None) == (multiple is None):
        raise ValueError(f"{_OWNER}: give exactly one of `size` (the padded number of sites) and `multiple` "
                         "(pad to the next multiple of it).")
    if multiple is not None:
        multiple = _checks.integer("multiple", multiple, _OWNER)
        return [max(-(-n // multiple), 1) * multiple for n in counts]
    if isinstance(size, (tuple, list)):
        if len(size) != len(counts):
            raise ValueError(f"{_OWNER}: `size` has {len(size)} entries but the model has {len(counts)} site "
                             "group(s); give one per group (None leaves a group as it is).")
        sizes = [None if s is None else _checks.integer(f"size[{i}]", s, _OWNER) for i, s in enumerate(size)]
    else:
        sizes = [_checks.integer("size", size, _OWNER)] * len(counts)
    for index, (n, target) in enumerate(zip(counts, sizes)):
        if target is not None and target < n:
            raise ValueError(f"{_OWNER}: site group {index} has {n} sites, more than the padded size {target}; "
                             "the size must be at least the number of sites of every group it applies to.")
    return sizes


def _pad_rows(leaf, extra):
    """A per-site array (shape ``(N,)``, or ``(N, ...)``) with its last row repeated ``extra`` times."""
    if extra == 0:
        return leaf
    tail = jnp.broadcast_to(leaf[-1:], (extra,) + leaf.shape[1:])
    return jnp.concatenate([leaf, tail.astype(leaf.dtype)])


def _pad_group(group: Sites, target: int, index: int) -> Sites:
    n = group.num_sites
    extra = target - n
    projection = group.projection
    if extra > 0:
        if n == 0:
            raise ValueError(f"{_OWNER}: site group {index} has no sites to copy; padding sites are copies of a "
                             "real one.")
        if isinstance(projection, Dense):
            projection = Dense(_pad_rows(projection.matrix, extra))
        elif isinstance(projection, Sparse):
            projection = _pad_sparse(projection.matrix, extra, index)
        else:
            raise ValueError(f"{_OWNER}: site group {index} has a {type(projection).__name__} projection, whose "
                             "sites are the latent coordinates and cannot be padded; pass size=(…, None, …) to "
                             "leave the group as it is (dense and sparse H can be padded).")
    potential = group.potential
    if isinstance(potential, Masked):  # padding a padded group again
        mask, potential = jnp.broadcast_to(potential.mask, (n,)), potential.potential
    else:
        mask = jnp.ones((n,), bool)
    pad = lambda leaf: _pad_rows(leaf, extra) if eqx.is_array(leaf) and leaf.ndim == 1 and leaf.shape[0] == n else leaf
    potential = jax.tree_util.tree_map(pad, potential)
    mask = jnp.concatenate([mask, jnp.zeros((extra,), bool)])
    return Sites(projection, Masked(potential, mask), pad(group.offset))


def _pad_sparse(H: jsparse.BCOO, extra: int, index: int) -> Sparse:
    if isinstance(H.indices, jax.core.Tracer) or isinstance(H.data, jax.core.Tracer):
        raise ValueError(f"{_OWNER}: site group {index} has a sparse H built under tracing; pad sparse groups "
                         "outside jax.jit (the number of stored entries is a shape).")
    indices, data = np.asarray(H.indices), np.asarray(H.data)
    n = H.shape[0]
    last = indices[:, 0] == n - 1
    rows = np.repeat(np.arange(n, n + extra), int(last.sum()))
    columns = np.tile(indices[last, 1], extra)
    new_indices = np.concatenate([indices, np.stack([rows, columns], axis=1).astype(indices.dtype)])
    new_data = jnp.asarray(np.concatenate([data, np.tile(data[last], extra)]), H.data.dtype)
    return Sparse.from_bcoo(jsparse.BCOO((new_data, jnp.asarray(new_indices)), shape=(n + extra, H.shape[1])))
