"""Devices: N virtual XLA CPU devices, or the machine's accelerators, and the persistent cache."""

from __future__ import annotations

import os

import jax
from jax._src import xla_bridge

from ir_runtime import _metrics
from ir_runtime._errors import DeviceCountError

ENV_CPU_DEVICES = "IR_RUNTIME_CPU_DEVICES"
ENV_CACHE_DIR = "IR_RUNTIME_CACHE_DIR"

_listening = False


def _on_event(event: str, **_kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _metrics.count("PersistentCacheHit")


def init(cpu_devices: int | None = None, cache_dir: str | None = None) -> list:
    """Start the backend; returns ``devices()``.

    Args:
        cpu_devices: how many virtual XLA CPU devices to create (default: the
            ``IR_RUNTIME_CPU_DEVICES`` environment variable, else jax's default). Only on a
            machine whose backend is the CPU; on a GPU or TPU machine the real devices are used.
        cache_dir: a directory for JAX's persistent compilation cache, shared across processes
            (default: ``IR_RUNTIME_CACHE_DIR``, else none).

    Raises:
        DeviceCountError: the backend has already started with a different CPU device count.
    """
    global _listening
    if cpu_devices is None and os.environ.get(ENV_CPU_DEVICES):
        try:
            cpu_devices = int(os.environ[ENV_CPU_DEVICES])
        except ValueError:
            raise DeviceCountError(
                f"{ENV_CPU_DEVICES}={os.environ[ENV_CPU_DEVICES]!r} is not an integer"
            ) from None
    if cpu_devices is not None:
        if isinstance(cpu_devices, bool) or not isinstance(cpu_devices, int) or cpu_devices < 1:
            raise DeviceCountError(f"cpu_devices must be a positive int, got {cpu_devices!r}")
        if xla_bridge.backends_are_initialized():
            have = len(jax.devices("cpu"))
            if have != cpu_devices:
                raise DeviceCountError(
                    f"the XLA backend already started with {have} CPU device(s); cannot switch "
                    f"to {cpu_devices}. Call ir_runtime.init(cpu_devices={cpu_devices}) (or set "
                    f"{ENV_CPU_DEVICES}) before anything touches jax devices, in a new process"
                )
        else:
            jax.config.update("jax_num_cpu_devices", cpu_devices)
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
    """The devices programs run on (jax devices), ordered by id."""
    return sorted(jax.devices(), key=lambda d: d.id)


def device_by_id() -> dict:
    return {d.id: d for d in jax.devices()}
