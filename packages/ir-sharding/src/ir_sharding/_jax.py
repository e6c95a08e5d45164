"""Conversion to jax shardings: the only module that imports jax."""

from __future__ import annotations

import numpy as np

from ir_sharding._errors import ShardingError
from ir_sharding._spec import ShardingKind, ShardingSpec

_ORDER: list = []  # jax's devices in global order, filled once jax has them


def global_devices() -> list:
    """jax's devices in global order: by process, then by jax id. A mesh's device ids are
    positions in this list (torch_xla's global ordinals), so one mesh is written the same way in
    one process or across many; in one process they are jax's own device ids."""
    if not _ORDER:
        import jax

        _ORDER.extend(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    return _ORDER


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
