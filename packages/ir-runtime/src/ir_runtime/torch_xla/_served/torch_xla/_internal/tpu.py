"""``torch_xla._internal.tpu``: TPU facts, where there is no TPU (the engine runs on jax's
platform: these answer for what jax sees)."""

from __future__ import annotations

from ir_runtime.torch_xla import _core


def _tpu_devices() -> list:
    return [d for d in _core.devices() if d.platform == "tpu"]


def version() -> int:
    """The TPU generation (4 for a v4); an error where there is no TPU, as torch_xla's is."""
    tpus = _tpu_devices()
    if not tpus:
        raise OSError("no TPU here: torch_xla._internal.tpu.version() has none to read")
    kind = tpus[0].device_kind.lower()
    digits = "".join(c for c in kind.split("v", 1)[-1] if c.isdigit())
    return int(digits or 0)


def num_available_chips() -> int:
    return len(_tpu_devices())


num_available_devices = num_available_chips


def num_expected_global_devices() -> int:
    return len(_tpu_devices())


def num_local_processes() -> int:
    return 1


def task_id():
    return None


def worker_id() -> int:
    return 0
