"""``torch_xla.core.xla_model`` (``xm``): devices, steps, closures, collectives and host
transfers over the engine."""

from __future__ import annotations

import os
import time

import torch

import ir_runtime as _irt
import torch_xla
from ir_runtime.torch_xla import _core

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"


def _runtime():
    import torch_xla.runtime as xr

    return xr


def is_xla_tensor(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xla"


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None):
    """``['xla:0', ...]``: one under SPMD (the virtual device), else one per local device."""
    n = _runtime().addressable_device_count()
    if max_devices is not None:
        n = min(n, max_devices)
    return [f"xla:{k}" for k in range(n)]


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    import torch_xla

    return torch_xla.device(n)


def xla_device_hw(device) -> str:
    """The hardware behind an ``xla`` device: ``"CPU"``, ``"CUDA"`` or ``"TPU"``."""
    if str(device).split(":")[0] not in ("xla", "cpu", "cuda", "tpu"):
        raise RuntimeError(f"Invalid device format: {device}")
    return _core.device_type()


def xla_device_kind(device=None) -> str:
    return _core.devices()[0].device_kind


def xla_real_devices(devices=None) -> list[str]:
    """The runtime devices behind ``devices`` (all local ones by default): ``['CPU:0', ...]``."""
    kind = _core.device_type()
    local = _core.local_devices()
    if devices is None:
        return [f"{kind}:{d.id}" for d in local]
    return [f"{kind}:{local[int(str(d).partition(':')[2] or 0)].id}" for d in devices]


def xla_replication_devices(local_devices=None) -> list[str]:
    return xla_real_devices(local_devices)


def get_ordinal(defval: int = 0) -> int:
    return _runtime().global_ordinal()


def get_local_ordinal(defval: int = 0) -> int:
    return _runtime().local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    ordinal = get_local_ordinal() if local else get_ordinal()
    return ordinal == 0


def master_print(*args, fd=None, finalizer=None, **kwargs) -> None:
    if is_master_ordinal(local=False):
        print(*args, file=fd, **kwargs)
        if finalizer is not None:
            finalizer()


def xrt_world_size(defval: int = 1) -> int:
    return _runtime().world_size()


def unlazy(tensors) -> None:
    """Compute ``tensors`` now."""
    import torch_xla

    torch_xla._XLAC._xla_sync_multi(tensors, wait=False)


# -- steps -------------------------------------------------------------------------------------


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    _core.sync(wait)


def wait_device_ops(devices=None) -> None:
    _irt.wait_device_ops()


def add_step_closure(closure, args=(), run_async: bool = False) -> None:
    """Run ``closure(*args)`` after the next step's program (``mark_step``/``sync``): reading
    tensors there reads computed values, and costs no extra program."""
    _core.add_step_closure(closure, args, run_async)


def _run_step_closures():
    _core.run_closures()


def optimizer_step(
    optimizer, barrier: bool = False, optimizer_args=None, groups=None, pin_layout: bool = True
):
    """``optimizer.step(**optimizer_args)``; with ``barrier``, then a step. Gradients need no
    reduction across replicas here: one SPMD program computes the global gradient."""
    loss = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return loss


def reduce_gradients(optimizer, groups=None, pin_layout: bool = True) -> None:
    """Nothing to do: under SPMD the gradients already are the global ones."""


def get_stablehlo(tensors=None) -> str:
    tensors = list(tensors or [])
    return _irt.dump(tensors, format="stablehlo")


# -- host transfers ------------------------------------------------------------------------


def send_cpu_data_to_device(datas, device, input_sharding=None, transfer_async: bool = False):
    """CPU tensors in ``datas`` (a tensor or any nesting of lists, tuples and dicts) moved to
    the device, each placed as ``input_sharding`` (an ``xs.ShardingSpec``) says."""

    from torch_xla.distributed.parallel_loader import _place

    if type(datas) is torch.Tensor:
        datas = [datas]
    return _place(datas, device, input_sharding)


def _maybe_convert_to_cpu(data, convert: bool = True):
    from torch.utils._pytree import tree_map

    if not convert:
        return data
    return tree_map(lambda x: x.cpu() if is_xla_tensor(x) else x, data)


def save(data, file_or_path, master_only: bool = True, global_master: bool = False) -> None:
    """``torch.save`` of ``data`` with its device tensors moved to the CPU first."""
    should = is_master_ordinal(local=not global_master) or not master_only
    cpu = _maybe_convert_to_cpu(data)
    if should:
        torch.save(cpu, file_or_path)


def rendezvous(tag: str, payload: bytes = b"", replicas=None) -> list[bytes]:
    """All processes meet here. One process: at once."""
    if _runtime().process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(tag)
    return [payload]


def mesh_reduce(tag: str, data, reduce_fn):
    """``reduce_fn`` over every process's ``data``: one SPMD process holds all of it."""
    if _runtime().process_count() > 1:
        raise NotImplementedError(
            f"xm.mesh_reduce({tag!r}) across {_runtime().process_count()} processes: reduce "
            f"device tensors inside the program instead (their values are global under SPMD)"
        )
    return reduce_fn([data])


def set_rng_state(seed: int, device=None) -> None:
    torch.manual_seed(seed)


def get_rng_state(device=None) -> int:
    return torch.initial_seed()


class MemoryInfo(dict):
    pass


def get_memory_info(device=None) -> MemoryInfo:
    stats = _core.local_devices()[0].memory_stats() or {}
    used = stats.get("bytes_in_use", 0)
    limit = stats.get("bytes_limit", 0)
    return MemoryInfo(
        bytes_used=used, bytes_limit=limit, peak_bytes_used=stats.get("peak_bytes_in_use", used)
    )


def optimization_barrier_(tensors) -> None:
    """Nothing to keep apart in this engine's graphs across a step boundary: a no-op."""


# -- collectives -----------------------------------------------------------------------------


def _manual(t) -> bool:
    """Whether ``t`` is inside an eager manual region (``xs.enable_manual_sharding``), where a
    collective reaches across the devices of its groups."""
    from ir_runtime._frontend.regions import _eager

    return isinstance(t, torch.Tensor) and _eager.region_mesh(_core.lazy(t)) is not None


def _collective(name: str, groups, scale: float = 1.0):
    """torch_xla's collectives across replicas. Under SPMD (one replica per process, its
    tensors global) a collective over one replica is the tensor itself; on a tensor inside a
    manual region (``xs.enable_manual_sharding``) it reaches across the devices of ``groups``
    (mesh axes)."""
    if _runtime().process_count() > 1:
        raise NotImplementedError(
            f"xm.{name} across {_runtime().process_count()} processes: under SPMD tensors are "
            f"global and need no cross-replica {name}; inside a manual region "
            f"(ir_runtime.shard_map) use ir_runtime.{name} over mesh axes"
        )
    if groups not in (None, [], [[0]]):
        raise NotImplementedError(
            f"xm.{name}(groups={groups!r}): with one replica per process the only group is "
            f"[[0]]; groups of devices are mesh axes of a manual region (ir_runtime.shard_map)"
        )


def all_reduce(reduce_type, inputs, scale: float = 1.0, groups=None, pin_layout: bool = True):
    """Over the one replica: each input (times ``scale``), as a list when given one; inside a
    manual region, over the devices of ``groups``."""
    if reduce_type not in (REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX):
        raise ValueError(f"xm.all_reduce: unknown reduce_type {reduce_type!r}")
    if isinstance(inputs, torch.Tensor) and _manual(inputs):
        return torch_xla._XLAC._xla_spmd_all_reduce(reduce_type, inputs, scale, groups or [])
    if not isinstance(inputs, torch.Tensor) and any(_manual(t) for t in inputs):
        for t in inputs:
            t.copy_(torch_xla._XLAC._xla_spmd_all_reduce(reduce_type, t, scale, groups or []))
        return inputs
    _collective("all_reduce", groups)
    if isinstance(inputs, torch.Tensor):
        return inputs * scale if scale != 1.0 else inputs.clone()
    for t in inputs:
        if scale != 1.0:
            t.mul_(scale)
    return inputs


def all_gather(value, dim: int = 0, groups=None, output=None, pin_layout: bool = True):
    if _manual(value):
        from ir_runtime._frontend.regions import _eager

        out = _eager.collective("all_gather", _core.lazy(value), groups, "xm.all_gather", dim)
        if output is not None:
            output.copy_(out)
            return output
        return out
    _collective("all_gather", groups)
    if output is not None:
        output.copy_(value)
        return output
    return value.clone()


def reduce_scatter(
    reduce_type,
    input,
    scale,
    scatter_dim,
    shard_count,
    groups=None,
    output=None,
    pin_layout: bool = True,
):
    if _manual(input):
        out = torch_xla._XLAC._xla_spmd_reduce_scatter(
            reduce_type, input, scale, scatter_dim, shard_count, groups or []
        )
        if output is not None:
            output.copy_(out)
            return output
        return out
    _collective("reduce_scatter", groups)
    if shard_count != 1:
        raise NotImplementedError(
            f"xm.reduce_scatter(shard_count={shard_count}): one replica per process under "
            f"SPMD; scatter over mesh axes in a manual region (ir_runtime.reduce_scatter)"
        )
    out = input * scale
    if output is not None:
        output.copy_(out)
        return output
    return out


def all_to_all(
    value, split_dimension, concat_dimension, split_count, groups=None, pin_layout: bool = True
):
    _collective("all_to_all", groups)
    return value.clone()


def collective_permute(value, pairs):
    raise NotImplementedError(
        "xm.collective_permute: replicas are devices of one SPMD program here; permute over "
        "a mesh axis in a manual region (ir_runtime.ppermute)"
    )


# -- rates -----------------------------------------------------------------------------------


class RateTracker:
    """Items per second: ``rate()`` since the last call (smoothed), ``global_rate()`` since
    creation."""

    def __init__(self, smooth_factor: float | None = None):
        if smooth_factor is None:
            smooth_factor = float(os.environ.get("RATE_TRACKER_SMOOTHING", 0.4))
        self._smooth_factor = smooth_factor
        self._start = self._last = time.time()
        self._count = self._total = 0.0
        self._rate = None

    def add(self, count: float) -> None:
        self._count += count

    def rate(self) -> float:
        now = time.time()
        delta = now - self._last
        if delta <= 0:
            return 0.0
        current = self._count / delta
        if self._rate is not None:
            current = (1 - self._smooth_factor) * current + self._smooth_factor * self._rate
        self._total += self._count
        self._count, self._last, self._rate = 0.0, now, current
        return current

    def global_rate(self) -> float:
        delta = time.time() - self._start
        return (self._total + self._count) / delta if delta > 0 else 0.0
