"""What the served torch_xla modules share: the engine's devices, steps and their closures,
and the reading of a tensor's sharding the way torch_xla reports it."""

from __future__ import annotations

import os
import threading

import ir_runtime as irt
from ir_runtime._jaxapi import backends_are_initialized

_PLATFORMS = {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "rocm": "CUDA", "tpu": "TPU"}


def devices() -> list:
    """The engine's devices, started on first use (``CPU_NUM_DEVICES`` or
    ``IR_RUNTIME_CPU_DEVICES`` virtual CPU devices where the backend is the CPU)."""
    found = irt.init() if not backends_are_initialized() else irt.devices()
    # (torch_xla sets PJRT_DEVICE once it has chosen a platform)
    os.environ.setdefault("PJRT_DEVICE", _platform(found[0]))
    return found


def _platform(device) -> str:
    return _PLATFORMS.get(device.platform, device.platform.upper())


def device_type() -> str:
    """torch_xla's name for the platform: ``"CPU"``, ``"CUDA"``, ``"TPU"``."""
    return _platform(devices()[0])


def local_devices() -> list:
    import jax

    devices()
    return jax.local_devices()


def is_spmd() -> bool:
    """torch_xla's ``xr.is_spmd()``: the ``XLA_USE_SPMD`` flag as it is now."""
    on = os.environ.get("XLA_USE_SPMD", "0").lower() in ("1", "true", "yes")
    if on:
        _VIRTUAL[0] = True
    return on


_VIRTUAL = [False]  # SPMD was switched on in this process


def virtual_device() -> bool:
    """Whether data goes to torch_xla's SPMD virtual device: once SPMD is on in a process it
    stays so for data (torch_xla fixes it at ``use_spmd()``), even where the flag is cleared
    later (torch_xla's tests clear it in their tear-down)."""
    return is_spmd() or _VIRTUAL[0]


# -- steps and their closures ----------------------------------------------------------------

_CLOSURES = threading.local()


def closures() -> list:
    if not hasattr(_CLOSURES, "pending"):
        _CLOSURES.pending = []
    return _CLOSURES.pending


def add_step_closure(closure, args=(), run_async=False) -> None:
    closures().append((closure, tuple(args)))


def sync(wait: bool = False) -> None:
    """torch_xla's ``sync``/``mark_step``: run what the live tensors wait for, then the step's
    closures (in the order they were added; their errors propagate, as torch_xla's do). With
    ``XLA_SAVE_TENSORS_FILE`` set, the step's graph is appended to that file first."""
    if os.environ.get("XLA_SAVE_TENSORS_FILE"):
        save_tensors_graph(os.environ["XLA_SAVE_TENSORS_FILE"])
    irt.mark_step()
    if wait:
        irt.wait_device_ops()
    run_closures()


def save_tensors_graph(path: str) -> None:
    """torch_xla's graph dump (``XLA_SAVE_TENSORS_FILE``, ``XLA_SAVE_TENSORS_FMT``): the
    pending graph of the live tensors, appended to ``path`` + ``.<ordinal>`` between
    ``## BEGIN_GRAPH`` and ``## END_GRAPH``; as ``text`` (the engine's IR, the default),
    ``dot`` or ``hlo`` (StableHLO, followed by each output's sharding between
    ``#OUTPUT_SHARDING_BEGIN`` and ``#OUTPUT_SHARDING_END``)."""
    import traceback

    from ir_core import DeviceData
    from ir_runtime._frontend import inspect

    tensors = [t for t in inspect.live_tensors() if type(t._ir.node) is not DeviceData]
    if not tensors:
        return
    fmt = os.environ.get("XLA_SAVE_TENSORS_FMT", "text")
    graph = irt.dump(tensors, {"hlo": "stablehlo", "dot": "dot"}.get(fmt, "text"))
    frames = "".join(f"  {f.name} ({f.filename}:{f.lineno})\n" for f in traceback.extract_stack())
    lines = ["[ScheduleSyncTensorsGraph]", "TensorsGraphInfo:", frames, "## BEGIN_GRAPH", graph]
    lines += ["## END_GRAPH", ""]
    if fmt == "hlo":
        specs = [spec_of(t) for t in tensors]
        lines += ["#OUTPUT_SHARDING_BEGIN", ""]
        lines += [s.to_hlo_text(devices="ids") if s is not None else "" for s in specs]
        lines += ["#OUTPUT_SHARDING_END", ""]
    with open(f"{path}.{irt.process_index()}", "a") as f:
        f.write("\n".join(lines) + "\n")


def run_closures() -> None:
    pending = closures()
    while pending:
        todo = list(pending)
        pending.clear()
        for closure, args in todo:
            closure(*args)


# -- shardings as torch_xla reports them -----------------------------------------------------


def lazy(t):
    """The engine's tensor behind ``t`` (an ``XLAShardedTensor``'s global tensor)."""
    inner = getattr(t, "global_tensor", None)
    return inner if inner is not None else t


def spec_of(t):
    """The ``ShardingSpec`` torch_xla would report for ``t``: its annotation, else where its
    data is (None: no sharding)."""
    t = lazy(t)
    if not isinstance(t, irt.LazyTensor):
        return None
    where = t._where()
    if where is None:  # a pending value annotated inside autograd (its node carries it)
        from ir_runtime._placement import spec_at

        where = spec_at(t._ir.node.sharding, t._ir.index)
    return where


def sharding_text(t) -> str:
    """``torch_xla._XLAC._get_xla_sharding_spec``: the HLO sharding with explicit device ids,
    as torch_xla 2.9 prints it; ``""`` for a tensor without one (moved with ``.to("xla")`` and
    never annotated, or cleared)."""
    spec = spec_of(t)
    return "" if spec is None else spec.to_hlo_text(devices="ids")


def replicate(t) -> None:
    """Annotate ``t`` replicated over every device: what torch_xla gives data sent to the
    device without a sharding under SPMD (``send_cpu_data_to_device``, ``MpDeviceLoader``)."""
    from ir_runtime._frontend.recording._api import annotate

    annotate(t, replicated_spec())


def replicated_spec():
    """Replicated over every device (one mesh axis, "devices")."""
    from ir_sharding import Mesh, ShardingSpec

    ids = [d.id for d in devices()]
    return ShardingSpec.replicated(Mesh(ids, (len(ids),), ("devices",)))
