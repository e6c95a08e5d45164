"""Devices: N virtual XLA CPU devices, or the machine's accelerators, and the persistent cache."""

from __future__ import annotations

import os

import jax

from ir_runtime import _distributed, _metrics
from ir_runtime._dtypes import enable_x64
from ir_runtime._errors import DeviceCountError
from ir_runtime._jaxapi import backends_are_initialized
from ir_sharding import global_devices

ENV_CPU_DEVICES = "IR_RUNTIME_CPU_DEVICES"
ENV_CACHE_DIR = "IR_RUNTIME_CACHE_DIR"

_listening = False


def _on_event(event: str, **_kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _metrics.count("PersistentCacheHit")


def init(
    cpu_devices: int | None = None,
    cache_dir: str | None = None,
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout: float | None = None,
) -> list:
    """Start the backend; returns ``devices()``, the devices of every process in global order.

    Args:
        cpu_devices: how many virtual XLA CPU devices to create (default: the
            ``IR_RUNTIME_CPU_DEVICES`` environment variable, else jax's default). Only on a
            machine whose backend is the CPU; on a GPU or TPU machine the real devices are used.
            In a run across processes, the count of each process.
        cache_dir: a directory for JAX's persistent compilation cache, shared across processes
            (default: ``IR_RUNTIME_CACHE_DIR``, else none).
        coordinator_address, num_processes, process_id: join a run across processes through
            jax.distributed: ``'host:port'`` of process 0's coordinator, how many processes,
            and this one's id (defaults: ``IR_RUNTIME_COORDINATOR``, ``IR_RUNTIME_NUM_PROCESSES``,
            ``IR_RUNTIME_PROCESS_ID``, as ``python -m ir_runtime.launch`` sets them).
        timeout: seconds another process may stop responding before this one reports it by
            name and exits (default ``IR_RUNTIME_TIMEOUT``, else 30).

    Raises:
        DeviceCountError: the backend has already started with a different CPU device count.
        DistributedError: bad or partial process arguments, or the backend already started.
    """
    global _listening
    enable_x64()
    joining = _distributed.resolve(coordinator_address, num_processes, process_id, timeout)
    if cpu_devices is None:
        cpu_devices = _distributed.env_value(ENV_CPU_DEVICES, int, DeviceCountError, "an integer")
    if cpu_devices is not None:
        if isinstance(cpu_devices, bool) or not isinstance(cpu_devices, int) or cpu_devices < 1:
            raise DeviceCountError(f"cpu_devices must be a positive int, got {cpu_devices!r}")
        if backends_are_initialized():
            have = len(jax.local_devices(backend="cpu"))
            if have != cpu_devices:
                raise DeviceCountError(
                    f"the XLA backend already started with {have} CPU device(s); cannot switch "
                    f"to {cpu_devices}. Call ir_runtime.init(cpu_devices={cpu_devices}) (or set "
                    f"{ENV_CPU_DEVICES}) before anything touches jax devices, in a new process"
                )
        else:
            jax.config.update("jax_num_cpu_devices", cpu_devices)
    if joining is not None and _distributed.STATE.address is None:
        if backends_are_initialized():
            raise _distributed.DistributedError(
                "the XLA backend already started in this process, so it cannot join other "
                "processes; call ir_runtime.init(...) first, before anything touches jax devices"
            )
    if joining is not None:
        _distributed.start(*joining)
    cache_dir = cache_dir or os.environ.get(ENV_CACHE_DIR)
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if not _listening:
        jax.monitoring.register_event_listener(_on_event)
        _listening = True
    return devices()


def devices() -> list:
    """Every device programs run on (jax devices, across all processes), in global order: a
    mesh's device id ``k`` is ``devices()[k]``. In one process that is jax's own device id."""
    return list(global_devices())


_BY_ID: dict = {}


def device_by_id() -> dict:
    """Global device id -> jax device (``ir_sharding.global_devices`` is the order)."""
    if not _BY_ID:
        _BY_ID.update(enumerate(global_devices()))
    return _BY_ID
