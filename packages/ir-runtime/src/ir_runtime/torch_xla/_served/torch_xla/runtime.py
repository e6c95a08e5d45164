"""``torch_xla.runtime`` (``xr``): the engine's devices and processes in torch_xla's terms."""

from __future__ import annotations

import functools
import os
import warnings

import ir_runtime as _irt
from ir_runtime.torch_xla import _core


def device_type() -> str:
    """``"CPU"`` here; the real platform (``"CUDA"``, ``"TPU"``) where jax has one."""
    return _core.device_type()


def set_device_type(pjrt_device: str) -> None:
    if pjrt_device.upper() != device_type():
        raise NotImplementedError(
            f"torch_xla.runtime.set_device_type({pjrt_device!r}): the engine's platform is "
            f"{device_type()!r} (jax's backend); choose it with JAX_PLATFORMS before starting"
        )


def is_bf16_supported() -> bool:
    return True


def use_spmd(auto: bool | None = False) -> None:
    """SPMD mode: one virtual device ``xla:0`` over every device, shardings by annotation.
    The engine always runs SPMD programs; this sets torch_xla's flag (``XLA_USE_SPMD``) that
    the device names and counts below follow. ``auto=True`` (XLA's auto-sharding) is not
    available: annotate with ``mark_sharding``."""
    if auto:
        raise NotImplementedError(
            "torch_xla.runtime.use_spmd(auto=True): XLA's auto-sharding is not available in "
            "this engine; annotate tensors with torch_xla.distributed.spmd.mark_sharding (or "
            "PyTorch's parallelize_module / fully_shard)"
        )
    os.environ["XLA_USE_SPMD"] = "1"
    _core.is_spmd()  # (data goes to the virtual device from now on)


def is_spmd() -> bool:
    return _core.is_spmd()


@functools.lru_cache
def global_runtime_device_count() -> int:
    """Every device across all processes."""
    return len(_core.devices())


def addressable_runtime_device_count() -> int:
    return len(_core.local_devices())


def global_device_count() -> int:
    """torch_xla's devices: one virtual device per process under SPMD, else every device."""
    return process_count() if is_spmd() else global_runtime_device_count()


def addressable_device_count() -> int:
    return 1 if is_spmd() else addressable_runtime_device_count()


def local_process_count() -> int:
    return int(os.environ.get("PJRT_LOCAL_PROCESS_COUNT", os.environ.get("LOCAL_WORLD_SIZE", 1)))


def local_device_count() -> int:
    return local_process_count() * addressable_device_count()


def process_index() -> int:
    _core.devices()
    return _irt.process_index()


def process_count() -> int:
    _core.devices()
    return _irt.process_count()


def world_size() -> int:
    """Processes taking part (torch_xla's replicas: one per process here)."""
    return process_count()


def global_ordinal() -> int:
    return process_index()


def local_ordinal() -> int:
    return int(os.environ.get("PJRT_LOCAL_PROCESS_RANK", os.environ.get("LOCAL_RANK", 0)))


def host_index() -> int:
    return process_index()


def runtime_device_attributes(device: str) -> dict:
    _kind, _, index = str(device).partition(":")
    d = _core.devices()[int(index or 0)]
    return {"name": str(d), "kind": d.device_kind, "id": d.id, "process_index": d.process_index}


def global_runtime_device_attributes() -> list[dict]:
    return [runtime_device_attributes(f"{device_type()}:{d.id}") for d in _core.devices()]


def get_master_ip() -> str:
    raise RuntimeError(f"IP discovery not supported for device: {device_type()}")


def initialize_cache(path: str, readonly: bool = False) -> None:
    """The persistent compilation cache at ``path`` (jax's; ``readonly`` is not offered by
    it: a read-only cache directory is refused by name)."""
    if readonly:
        warnings.warn(
            "torch_xla.runtime.initialize_cache(readonly=True): jax's persistent cache has no "
            "read-only mode; the cache at this path is read and written",
            stacklevel=2,
        )
    os.environ["IR_RUNTIME_CACHE_DIR"] = path
    from ir_runtime._jaxapi import backends_are_initialized

    if backends_are_initialized():
        import jax

        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def get_num_cached_compilation_graph() -> int:
    return _irt.CACHE.__len__() if hasattr(_irt.CACHE, "__len__") else 0
