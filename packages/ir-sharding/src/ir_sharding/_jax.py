"""Conversion to and from jax shardings: the only module that imports jax, and only inside
functions, so ``import ir_sharding`` does not import it. Public jax API only."""

from __future__ import annotations

import math

import numpy as np

from ir_sharding._errors import ShardingError
from ir_sharding._mesh import Mesh
from ir_sharding._spec import ShardingKind, ShardingSpec

_ORDER: tuple = ()  # jax's devices in global order, filled once jax has them
_ORDINALS: dict = {}  # jax device -> its position in _ORDER, built once

# Axis names of the meshes from_jax builds where the jax sharding has none of its own.
_FLAT_AXIS = "devices"
_REPLICA_AXIS = "replicas"


def global_devices() -> tuple:
    """jax's devices in global order: by process, then by jax id.

    A mesh's device ids are positions in this tuple (torch_xla's global ordinals), so one mesh
    is written the same way in one process or across many; in one process they are jax's own
    device ids. Built once, on the first call (after that, jax's device count is fixed).

    Returns:
        The tuple of every jax device of every process; device id ``k`` is ``[k]``.
    """
    global _ORDER
    if not _ORDER:
        import jax

        _ORDER = tuple(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    return _ORDER


def device_ordinal(device) -> int:
    """The global device id of a jax device: its position in ``global_devices()``.

    Args:
        device: a jax device (``jax.devices()[k]``, an element of ``sharding.device_set``).

    Returns:
        The id a ``Mesh`` uses for that device.

    Raises:
        ShardingError: ``device`` is not one of jax's devices.
    """
    if not _ORDINALS:
        _ORDINALS.update((d, k) for k, d in enumerate(global_devices()))
    try:
        return _ORDINALS[device]
    except (KeyError, TypeError):
        raise ShardingError(
            f"{device!r} is not one of jax's devices; a device id is a position in "
            f"global_devices() ({len(_ORDINALS)} devices)"
        ) from None


def _jax_devices(ids):
    order = global_devices()
    missing = [d for d in ids if not 0 <= d < len(order)]
    if missing:
        raise ShardingError(
            f"device {missing[0]} of the mesh does not exist: the global device ids are "
            f"0..{len(order) - 1} (on CPU, ask for more with jax_num_cpu_devices)"
        )
    return [order[d] for d in ids]


def to_jax(spec: ShardingSpec):
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec, SingleDeviceSharding

    mesh = spec.mesh
    if spec.kind is ShardingKind.MAXIMAL:
        return SingleDeviceSharding(_jax_devices([spec.device_id])[0])
    devices = np.array(_jax_devices(mesh.device_ids), dtype=object).reshape(mesh.shape)
    if spec.kind is ShardingKind.MANUAL:
        manual = jax.sharding.Mesh(devices, mesh.axis_names, (AxisType.Manual,) * mesh.ndim)
        return NamedSharding(manual, PartitionSpec())
    entries = spec.partition_spec or ()
    return NamedSharding(jax.sharding.Mesh(devices, mesh.axis_names), PartitionSpec(*entries))


# -- from jax -----------------------------------------------------------------------------------


def from_jax(sharding, ndim, mesh=None) -> ShardingSpec:
    """``ShardingSpec.from_jax``: see its docstring for the contract."""
    from jax.sharding import NamedSharding, Sharding, SingleDeviceSharding

    if isinstance(ndim, (bool, np.bool_)) or not isinstance(ndim, (int, np.integer)) or ndim < 0:
        raise ShardingError(
            f"ndim must be a non-negative integer (the tensor's rank), got {ndim!r}"
        )
    ndim = int(ndim)
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ShardingError(
            f"mesh must be an ir_sharding.Mesh or None, got {mesh!r} ({type(mesh).__name__})"
        )
    if isinstance(sharding, NamedSharding):
        return _from_named(sharding, ndim)
    if isinstance(sharding, SingleDeviceSharding):
        (device,) = sharding.device_set
        ordinal = device_ordinal(device)
        if mesh is not None and ordinal in mesh.device_ids:
            return ShardingSpec.maximal(mesh, ordinal)
        return ShardingSpec.replicated(Mesh([ordinal], (1,), (_FLAT_AXIS,)))
    if isinstance(sharding, Sharding):
        return _from_indices(sharding, ndim)
    raise ShardingError(
        f"{sharding!r} ({type(sharding).__name__}) is not a jax sharding; from_jax takes a "
        f"jax.sharding.Sharding (NamedSharding, SingleDeviceSharding, or any other kind)"
    )


def _from_named(sharding, ndim: int) -> ShardingSpec:
    import jax
    from jax.sharding import AxisType, PartitionSpec

    jax_mesh = sharding.mesh
    if not isinstance(jax_mesh, jax.sharding.Mesh):
        raise ShardingError(
            f"{sharding!r} is over {type(jax_mesh).__name__}, which names no devices; from_jax "
            f"needs a NamedSharding over a concrete jax.sharding.Mesh"
        )
    ids = [device_ordinal(d) for d in jax_mesh.devices.flat]
    try:
        mesh = Mesh(ids, jax_mesh.devices.shape, jax_mesh.axis_names)
    except ShardingError as e:
        raise ShardingError(f"the mesh of {sharding!r} is not an ir_sharding Mesh: {e}") from None
    manual = [t == AxisType.Manual for t in jax_mesh.axis_types]
    if all(manual):
        return ShardingSpec.manual(mesh)
    if any(manual):
        raise ShardingError(
            f"{sharding!r} is over a mesh with Manual and non-Manual axes "
            f"{jax_mesh.axis_types!r}; ir_sharding has no partly manual spec (all axes Manual "
            f"gives ShardingSpec.manual)"
        )
    spec = sharding.spec
    if getattr(spec, "unreduced", None):
        raise ShardingError(
            f"{sharding!r} has unreduced axes {set(spec.unreduced)!r}: each device holds a "
            f"partial sum, which no ShardingSpec describes"
        )
    entries = tuple(spec.partitions)  # iterating a spec with reduced axes raises
    if len(entries) > ndim:
        raise ShardingError(
            f"the partition spec of {sharding!r} has {len(entries)} entries but ndim is "
            f"{ndim}; a spec has at most one entry per tensor dim"
        )
    for k, entry in enumerate(entries):
        if entry is PartitionSpec.UNCONSTRAINED:
            raise ShardingError(
                f"entry {k} of the partition spec of {sharding!r} is UNCONSTRAINED: it places "
                f"nothing (XLA chooses); compile first and convert the sharding it chose"
            )
    return ShardingSpec(mesh, entries + (None,) * (ndim - len(entries)))


def _from_indices(sharding, ndim: int) -> ShardingSpec:
    """Any other sharding, from what every jax sharding answers: its devices, whether it is
    fully replicated, and which block of a tensor each device holds."""
    devices = list(sharding.device_set)
    ordinals = {d: device_ordinal(d) for d in devices}
    n = len(devices)
    if sharding.is_fully_replicated:
        return ShardingSpec.replicated(Mesh(sorted(ordinals.values()), (n,), (_FLAT_AXIS,)))
    # A tiled sharding over n devices splits each dim into t | n blocks (the product of the
    # tile dims, the replication dim included, is n), so a dim of n cuts evenly into every
    # block count it can have; the distinct slice starts along it give its block count.
    shape = (n,) * ndim
    try:
        index_map = sharding.devices_indices_map(shape)
    except Exception as e:
        raise ShardingError(
            f"{sharding!r} is not fully replicated and gives no device indices for shape "
            f"{shape} ({type(e).__name__}: {e}); ndim must be the tensor's rank, and from_jax "
            f"converts only placements of blocks (a manual GSPMD sharding has none)"
        ) from None
    ranges = {
        d: tuple(s.indices(n) for s in index)
        for d, index in index_map.items()
        if len(index) == ndim
    }
    if len(ranges) != n or set(ranges) != set(devices):
        raise ShardingError(
            f"{sharding!r} does not give each of its {n} devices one block of a rank-{ndim} "
            f"tensor (ndim {ndim} does not match the sharding?)"
        )
    tiles = []
    for k in range(ndim):
        starts = sorted({r[k][0] for r in ranges.values()})
        t = len(starts)
        size = n // t
        if n % t or any(
            r[k] != (r[k][0], r[k][0] + size, 1) or r[k][0] % size for r in ranges.values()
        ):
            raise ShardingError(
                f"{sharding!r} does not cut dim {k} of a tensor of shape {shape} into equal "
                f"blocks; from_jax converts only tiled placements"
            )
        tiles.append(t)
    groups: dict = {}
    for d, r in ranges.items():
        block = tuple(r[k][0] // (n // t) for k, t in enumerate(tiles))
        groups.setdefault(block, []).append(ordinals[d])
    blocks = math.prod(tiles)
    replicas = n // blocks
    if len(groups) != blocks or any(len(g) != replicas for g in groups.values()):
        raise ShardingError(
            f"{sharding!r} places {len(groups)} distinct blocks of {blocks} on {n} devices, not "
            f"each block on the same number of devices; from_jax converts only tiled placements"
        )
    if blocks == 1:
        return ShardingSpec.replicated(Mesh(sorted(ordinals.values()), (n,), (_FLAT_AXIS,)))
    split = [k for k, t in enumerate(tiles) if t > 1]
    ids = [i for block in np.ndindex(*tiles) for i in sorted(groups[block])]
    mesh_shape = tuple(tiles[k] for k in split) + ((replicas,) if replicas > 1 else ())
    names = tuple(f"t{k}" for k in split) + ((_REPLICA_AXIS,) if replicas > 1 else ())
    entries = tuple(f"t{k}" if tiles[k] > 1 else None for k in range(ndim))
    return ShardingSpec(Mesh(ids, mesh_shape, names), entries)
