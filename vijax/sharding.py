"""Sites split across devices: one model, several accelerators, the same answer.

Every method reduces over sites, so `shard_sites` gives each device a slice of the rows of every dense site group
(with their per-site parameters) and replicates the rest; under `jax.jit` XLA reduces the sums across devices, so
results equal one device's up to summation order. A group of N rows on n devices becomes two: n·⌊N/n⌋ rows sharded,
the N mod n others replicated. ::

    post = jax.jit(lambda m: vj.infer(m, vj.GKL()))(vj.shard_sites(model))  # over all devices

Several hosts: call ``jax.distributed.initialize()`` on each, build the model from the same data and pass a mesh
over ``jax.devices()``. On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` gives four devices.
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .model import Dense, Identity, LatentLinearModel, ScaledIdentity, Sparse

__all__ = ["shard_sites"]
__dir__ = __all__.copy


def _place(tree, sharding_of):
    """Every array leaf of ``tree`` as a global array with the sharding ``sharding_of(leaf)``."""

    def place(leaf):
        if not eqx.is_array(leaf):
            return leaf
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding_of(leaf), lambda index: host[index])

    return jax.tree_util.tree_map(place, tree)


def _rows(tree, rows: slice, num_sites: int):
    """``tree`` restricted to ``rows`` along the leading site axis of every leaf that has one."""
    take = lambda leaf: leaf[rows] if eqx.is_array(leaf) and leaf.ndim >= 1 and leaf.shape[0] == num_sites else leaf
    return jax.tree_util.tree_map(take, tree)


def shard_sites(model: LatentLinearModel, mesh: Mesh | None = None, axis_name: str = "sites") -> LatentLinearModel:
    """``model`` with the sites of every dense group sharded over ``mesh``'s ``axis_name`` axis.

    **Arguments:**

    - `model`: a `vj.LatentLinearModel`; dense groups are split by rows, `vj.Identity` and `ScaledIdentity` groups
      replicated (sparse and other projections raise `ValueError`).
    - `mesh`: a `jax.sharding.Mesh`; by default a one-axis mesh over all ``jax.devices()``.
    - `axis_name`: the mesh axis that sites are split over (other mesh axes, if any, replicate).

    **Returns:** an equivalent `LatentLinearModel` whose arrays are placed on the mesh, for `vj.infer` under `jax.jit`.
    """
    if not isinstance(model, LatentLinearModel):
        raise ValueError(f"shard_sites: expected a vj.LatentLinearModel, got {type(model).__name__}.")
    if mesh is None:
        mesh = jax.make_mesh((jax.device_count(),), (axis_name,), axis_types=(AxisType.Auto,))
    if axis_name not in mesh.axis_names:
        raise ValueError(f"shard_sites: the mesh has axes {mesh.axis_names}, not {axis_name!r}; "
                         f"pass axis_name= one of them.")
    # No sharding annotations in vijax: XLA places the intermediates, which needs Auto axes (not make_mesh's default).
    mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
    num_devices = mesh.shape[axis_name]
    replicated = NamedSharding(mesh, PartitionSpec())
    split = NamedSharding(mesh, PartitionSpec(axis_name))

    groups = []
    for index, group in enumerate(model.sites):
        projection = group.projection
        if isinstance(projection, Sparse):
            raise ValueError(f"shard_sites: site group {index} has a sparse (BCOO) H, which JAX cannot partition; "
                             "use a dense H for sharded sites (H.todense()), or run this model on one device.")
        if not isinstance(projection, (Dense, Identity, ScaledIdentity)):
            raise ValueError(f"shard_sites: site group {index} has a {type(projection).__name__} projection; it splits "
                             "dense H (an (N, D) array) and replicates Identity and ScaledIdentity groups only.")

        # One site per coordinate costs O(D) against the replicated prior's O(D²): replicated with it.

        if isinstance(projection, (Identity, ScaledIdentity)) or group.num_sites < num_devices:
            groups.append(_place(group, lambda _: replicated))
            continue
        n = group.num_sites
        cut = n - n % num_devices
        head = _rows(group, slice(0, cut), n)
        groups.append(_place(head, lambda leaf: split if leaf.ndim >= 1 and leaf.shape[0] == cut else replicated))
        if cut < n:
            groups.append(_place(_rows(group, slice(cut, n), n), lambda _: replicated))
    prior = None if model.prior is None else _place(model.prior, lambda _: replicated)
    return model.replace(prior=prior, sites=groups)
