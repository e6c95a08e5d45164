"""Moving arrays between the host and devices as DeviceData nodes."""

from __future__ import annotations

import jax
import numpy as np

from ir_core import DeviceData, Shape
from ir_runtime import _metrics
from ir_runtime._dtypes import name_of
from ir_runtime._placement import Program


def to_device(array, sharding=None) -> DeviceData:
    """A ``DeviceData`` holding ``array`` placed per ``sharding`` (an ir_sharding
    ``ShardingSpec``; None: the default device)."""
    a = np.asarray(array)
    shape = Shape(name_of(a.dtype), a.shape)
    if sharding is not None:
        sharding.check_rank(a.ndim, f"the array {shape}")
    program = Program.of((), None if sharding is None else sharding.mesh)
    _metrics.count("TransferToDevice")
    return DeviceData(
        shape, handle=jax.device_put(a, program.jax_sharding(sharding)), sharding=sharding
    )


def to_host(data: DeviceData) -> np.ndarray:
    """The array a ``DeviceData`` holds, as numpy."""
    _metrics.count("TransferToHost")
    return np.asarray(jax.device_get(data.handle))
