"""Sites split across devices: one model, several accelerators, the same answer.

Every method in vijax reduces over sites: the G-KL bound is a sum of one expectation per row of
H, and its gradient a sum of rank-one pieces. `shard_sites` lays a model out for JAX's SPMD
partitioner so that each device holds a slice of the rows of every dense site group (and the
matching per-site potential parameters and offsets), while the prior, the variational
parameters and anything without a site axis are replicated. Under `jax.jit` XLA then evaluates
each device's share of the sites locally and reduces the sums across devices; nothing else in
vijax changes, and results equal those of one device up to the order of floating-point sums.

A group of N rows on n devices becomes two groups: the first n·⌊N/n⌋ rows, sharded, and the
remaining N mod n rows, replicated — the bound is a sum over sites, so splitting a group is
exact, and no padding site (which would have to contribute nothing to every method) is needed.

Several GPUs on one host::

    mesh = jax.make_mesh((jax.device_count(),), ("sites",))  # or vj.shard_sites(model): all devices
    post = jax.jit(lambda m: vj.infer(m, vj.GKL()))(vj.shard_sites(model, mesh))

Several hosts: call ``jax.distributed.initialize()`` at the start of the same script on every
host (it reads the coordinator address, process count and id from the cluster environment or
its arguments), build the model from the same data on every host, and call `shard_sites` with a
mesh over ``jax.devices()`` (all hosts' devices). Each host then places only its own rows on its
own devices (`jax.make_array_from_callback`); results are global arrays, readable on every host
after ``jax.experimental.multihost_utils.process_allgather``.

On CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (set before JAX starts) gives
four devices to try this on.
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .model import Dense, Identity, LatentLinearModel, ScaledIdentity, Sparse

__all__ = ["shard_sites"]


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

    - `model`: a `vj.LatentLinearModel`. Dense site groups (H of shape ``(N, D)``) are split
      across devices by rows; groups with `vj.Identity` or `ScaledIdentity` projections (one
      site per coordinate, as many sites as latent dimensions: the models of `vj.gp.model`) are
      replicated with the prior and the rest of the model.
    - `mesh`: a `jax.sharding.Mesh`; by default a one-axis mesh over all ``jax.devices()``.
    - `axis_name`: the mesh axis that sites are split over (other mesh axes, if any, replicate).

    **Returns:** an equivalent `LatentLinearModel` whose arrays are placed on the mesh. Pass it to
    `vj.infer` (inside `jax.jit` for the partitioned computation).

    Raises `ValueError` for sparse (`BCOO`) projections, which JAX cannot yet partition (convert
    such a group to dense rows, ``H.todense()``, or keep it on one device), and for projection
    types other than `Dense`, `Identity` and `ScaledIdentity`.
    """
    if not isinstance(model, LatentLinearModel):
        raise ValueError(f"shard_sites: expected a vj.LatentLinearModel, got {type(model).__name__}.")
    if mesh is None:
        mesh = jax.make_mesh((jax.device_count(),), (axis_name,), axis_types=(AxisType.Auto,))
    if axis_name not in mesh.axis_names:
        raise ValueError(f"shard_sites: the mesh has axes {mesh.axis_names}, not {axis_name!r}; "
                         f"pass axis_name= one of them.")
    # vijax's code carries no sharding annotations: XLA's partitioner places the intermediate
    # arrays, which needs the mesh's axes in Auto mode (jax.make_mesh makes Explicit axes by default).
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
            raise ValueError(f"shard_sites: site group {index} has a {type(projection).__name__} projection, which "
                             "shard_sites does not know how to lay out; it splits dense rows (H an (N, D) array) "
                             "and replicates Identity and ScaledIdentity groups. Give that group a dense H "
                             "(an (N, D) array), or run this model on one device.")
        # One site per coordinate (Identity, ScaledIdentity: GP models): the group costs O(D) against the
        # O(D²)-O(D³) of the replicated prior and variational parameters, so it is replicated with them.
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


def __dir__():
    return list(__all__)
