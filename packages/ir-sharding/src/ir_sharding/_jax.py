"""Conversion to jax shardings: the only module that imports jax."""

from __future__ import annotations

import numpy as np

from ir_sharding._errors import ShardingError
from ir_sharding._spec import ShardingKind, ShardingSpec


def _jax_devices(ids):
    import jax

    by_id = {d.id: d for d in jax.devices()}
    missing = [d for d in ids if d not in by_id]
    if missing:
        raise ShardingError(
            f"device {missing[0]} of the mesh is not a jax device; jax has devices "
            f"{sorted(by_id)} (on CPU, ask for more with jax_num_cpu_devices)"
        )
    return [by_id[d] for d in ids]


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
