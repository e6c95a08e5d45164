"""Moving arrays between the host and devices as DeviceData nodes."""

from __future__ import annotations

import os
import sys
import time
import warnings

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ir_core import DeviceData, Shape
from ir_runtime import _distributed, _metrics
from ir_runtime._bounded import Bounded
from ir_runtime._collectives import settle
from ir_runtime._dtypes import enable_x64, name_of
from ir_runtime._jaxapi import batched_put
from ir_runtime._placement import Program


def put(host: np.ndarray, sharding):
    """A host array placed on ``sharding``. Over devices of several processes, each process
    places only the blocks its own devices hold (every process passes the same array).
    ``OutboundData`` records the bytes sent to this process's devices (a replicated array once
    per device, as torch_xla counts them), ``TransferToDeviceTime`` the time (torch_xla's
    metrics); a transfer that fails records neither."""
    start = time.perf_counter()
    placed, nbytes = _put(host, sharding)
    _metrics.transferred(nbytes, time.perf_counter() - start)
    return placed


def _sent(placed) -> int:
    return sum(s.data.nbytes for s in placed.addressable_shards)


def _put(host: np.ndarray, sharding) -> tuple:
    """(the placed array, the bytes sent to this process's devices)"""
    enable_x64()
    if not sharding.is_fully_addressable:
        placed = jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
        return placed, _sent(placed)
    if type(host) is not np.ndarray or not host.dtype.isnative:
        placed = jax.device_put(host, sharding)  # jax checks (and converts) anything unusual
        return placed, _sent(placed)
    key = (host.shape, host.dtype, sharding, jax.config.jax_enable_x64)
    plan = _PUTS.get(key)
    if plan is None:
        # The first of its kind goes through jax.device_put, which checks the array against
        # the sharding (rank, divisibility, dtype) and says what it makes of it; later ones of
        # the same kind are placed as that one was.
        placed = jax.device_put(host, sharding)
        index = sharding.addressable_devices_indices_map(host.shape)
        # replicated: every device holds the whole array (indexing a 0-d one gives a scalar)
        slices = None if sharding.is_fully_replicated else tuple(index.values())
        _PUTS[key] = (placed.aval, list(index), slices)
        return placed, _sent(placed)
    aval, devices, slices = plan
    if slices is None:
        shards = [host] * len(devices)
        nbytes = host.nbytes * len(devices)
    else:
        shards = [host[i] for i in slices]
        nbytes = sum(a.nbytes for a in shards)
    return batched_put(aval, sharding, shards, devices), nbytes


# (shape, dtype, sharding, x64) -> what ``put`` hands jax: a loader places batches of one shape over
# one sharding every step, and jax.device_put would work out which slice goes to which device,
# and check it, anew each time (half the cost of placing a small batch)
_PUTS = Bounded(256)


_GATHERS = Bounded(64)  # replicated sharding -> the jitted identity that gathers onto it
_warned = [False]


def fetch(handle) -> np.ndarray:
    """The value of a parameter's handle as numpy. An array sharded across processes is first
    gathered: an all-gather between processes, which every process must join at the same point,
    and which brings the whole array to each of them."""
    if isinstance(handle, jax.Array) and not (
        handle.is_fully_addressable or handle.is_fully_replicated
    ):
        handle = _gather(handle)
    try:
        return np.asarray(jax.device_get(handle))
    except jax.errors.JaxRuntimeError as e:
        raise _distributed.device_failure(e, "the program computing this result") from e


def _gather(a):
    nbytes = a.size * a.dtype.itemsize
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(
            f"reading an array {a.dtype}{list(a.shape)} sharded across "
            f"{jax.process_count()} processes: every process must read it at the same point "
            f"(an all-gather between processes) and each receives all of it ({nbytes} bytes). "
            f"Read replicated results (a loss) or gather once, after training; the metrics "
            f"count every gather (CrossProcessGather, CrossProcessGatherBytes)",
            GatherWarning,
            stacklevel=_caller_level(),
        )
    mesh = a.sharding.mesh if isinstance(a.sharding, NamedSharding) else None
    if mesh is None:
        flat = np.array(sorted(a.sharding.device_set, key=lambda d: d.id), dtype=object)
        mesh = jax.sharding.Mesh(flat, ("devices",))
    replicated = NamedSharding(mesh, PartitionSpec())
    identity = _GATHERS.get(replicated)
    if identity is None:
        identity = _GATHERS[replicated] = jax.jit(lambda x: x, out_shardings=replicated)
    settle()  # a collective program: never beside another one (README, collectives)
    _metrics.count("CrossProcessGather")
    _metrics.count("CrossProcessGatherBytes", nbytes)
    return identity(a).addressable_data(0)


_INSIDE = (os.path.dirname(os.path.abspath(__file__)),)


def _caller_level() -> int:
    """The warnings stacklevel of the first frame outside ir_runtime and torch: the user's
    line that read the tensor."""
    inside = _INSIDE
    torch = sys.modules.get("torch")
    if torch is not None:
        inside += (os.path.dirname(os.path.abspath(torch.__file__)),)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


class GatherWarning(UserWarning):
    """Reading a tensor sharded across processes: a collective every process must join."""


def to_device(array, sharding=None) -> DeviceData:
    """A ``DeviceData`` holding a copy of ``array`` placed per ``sharding`` (an ir_sharding
    ``ShardingSpec``; None: the default device). A copy: jax places a numpy array on a CPU
    device without copying it, and writing ``array`` afterwards must change nothing."""
    return device_data(np.array(array), sharding)


def device_data(a: np.ndarray, sharding=None) -> DeviceData:
    """``to_device`` of an array nothing else writes (no copy)."""
    shape = Shape(name_of(a.dtype), a.shape)
    if sharding is not None:
        sharding = sharding.evenly(a.shape)  # (jax holds even blocks; XLA computes uneven ones)
    program = Program.of(None if sharding is None else sharding.mesh)
    _metrics.count("TransferToDevice")
    return DeviceData(shape, handle=put(a, program.jax_sharding(sharding)), sharding=sharding)


def to_host(data: DeviceData) -> np.ndarray:
    """The array a ``DeviceData`` holds, as numpy."""
    _metrics.count("TransferToHost")
    return fetch(data.handle)
