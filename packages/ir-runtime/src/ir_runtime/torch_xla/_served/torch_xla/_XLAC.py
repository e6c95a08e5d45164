"""``torch_xla._XLAC``: the private calls torch_xla scripts and tests make most, answered by
the engine. Shardings print as torch_xla 2.9 prints them (explicit device lists); HLO text is
the engine's program for the tensors, before partitioning, with the same sharding form."""

from __future__ import annotations

import re

import numpy as np

import ir_runtime as _irt
from ir_runtime._frontend.regions import _eager
from ir_runtime.torch_xla import _core
from ir_sharding import Mesh as _IrMesh
from ir_sharding import ShardingError as _ShardingError
from ir_sharding import ShardingKind as _Kind
from ir_sharding import ShardingSpec as _IrSpec

# ShardingKind -> torch_xla's ShardingType value
_TYPES = {"REPLICATED": 0, "MAXIMAL": 1, "TILED": 3, "MANUAL": 4, "PARTIAL": 5}


class OpSharding:
    """An XLA sharding: built from torch_xla's arguments (``tile_assignment``,
    ``group_assignment``, ``replication_groups``, ``sharding_type``), or by ``Mesh``."""

    def __init__(self, tile_assignment, group_assignment, replication_groups, sharding_type):
        self.spec = _from_tiles(
            tile_assignment, group_assignment, replication_groups, int(sharding_type)
        )

    @classmethod
    def _of(cls, spec: _IrSpec) -> OpSharding:
        o = cls.__new__(cls)
        o.spec = spec
        return o

    def __repr__(self):
        return self.spec.to_hlo_text(devices="ids")


def _from_tiles(tiles, groups, replication_groups, kind: int) -> _IrSpec:
    n = len(_core.devices())
    everyone = _IrMesh(list(range(n)), (n,), ("all",))
    if kind == 4:
        return _IrSpec.manual(everyone)
    if kind == 0 or (kind == 1 and n == 1) or not tiles:
        return _IrSpec.replicated(everyone)
    tiles = np.asarray(tiles)
    if kind == 1:
        return _IrSpec.maximal(everyone, int(tiles.flatten()[0]))
    if kind == 3:  # one mesh axis per tensor dim
        names = tuple(f"d{k}" for k in range(tiles.ndim))
        mesh = _IrMesh(tiles.flatten().tolist(), tiles.shape, names)
        return _IrSpec(mesh, tuple(None if s == 1 else names[k] for k, s in enumerate(tiles.shape)))
    if kind == 5:  # leading tile axes shard the dims split in groups; the rest replicate
        shape = np.asarray(groups).shape
        names = tuple(f"d{k}" for k in range(tiles.ndim))
        mesh = _IrMesh(tiles.flatten().tolist(), tiles.shape, names)
        entries, axis = [], 0
        for size in shape:
            if size == 1:
                entries.append(None)
                continue
            while tiles.shape[axis] != size:
                axis += 1
            entries.append(names[axis])
            axis += 1
        return _IrSpec(mesh, tuple(entries))
    raise NotImplementedError(f"OpSharding of sharding type {kind} is not supported here")


# -- shardings of tensors ----------------------------------------------------------------


def _get_xla_sharding_spec(t) -> str:
    return _core.sharding_text(t)


def _get_xla_sharding_specs(tensors) -> list[str]:
    return [_core.sharding_text(t) for t in tensors]


def _get_xla_sharding_type(t):
    spec = _core.spec_of(t)
    if spec is None:
        return None
    kind = spec.kind.name if isinstance(spec.kind, _Kind) else str(spec.kind)
    return _TYPES.get(kind.upper(), 6)


def _xla_mark_sharding(t, op_sharding: OpSharding) -> None:
    from torch_xla.distributed.spmd.xla_sharding import _mark

    _mark(_core.lazy(t), op_sharding.spec)


def _xla_annotate_custom_sharding(t, op_sharding: OpSharding) -> None:
    _xla_mark_sharding(t, op_sharding)


def _xla_clear_sharding(t) -> None:
    _irt.clear_sharding(_core.lazy(t))


def _get_xla_tensor_debug_info(t) -> str:
    """What torch_xla's debug string says of ``t``: its device (``SPMD:0``, the virtual device,
    under SPMD), its IR, its sharding, and where its data is: still on the host (a tensor moved
    to the device is copied there when a program or a placement first needs it, as torch_xla
    defers it), or on the devices (``xla::device_data``)."""
    import jax

    from ir_core import DeviceData

    t = _core.lazy(t)
    device = "SPMD:0" if _core.virtual_device() else str(t.device)
    spec = _core.spec_of(t)
    text = spec.to_hlo_text(devices="ids") if spec is not None else None
    lines = ["XLATensor {", f"TensorID: {id(t)}", f"Device: {device}", f"XLA Shape: {_shape(t)}"]
    lines.append(f"ShardingSpec: {text or 'None'}")
    node = t._ir.node
    on_host = None
    if type(node) is not DeviceData:
        lines += [f"IR: {node.op}", "XLAData: None"]
    elif not isinstance(node.handle, jax.Array):
        lines += ["IR: None", "XLAData: None"]
        on_host = f"with size [{', '.join(str(d) for d in t.shape)}]"
    else:
        lines.append("IR: xla::device_data")
        lines.append("XLAShardedData" if text is not None else "XLAData:")
        lines.append(f"  Data Device: {device}")
        lines.append(f"  Data Shape: {_shape(t)}")
        if text is not None:
            lines.append(f"  OpSharding: {text}")
            lines.append(f"  NumShards: {len(spec.mesh.device_ids)}")
    lines.append(f"Tensor on host: {on_host}")
    lines.append("}")
    return "\n".join(lines) + "\n"


_SHORT = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "s64",
    "int32": "s32",
    "int16": "s16",
    "int8": "s8",
    "uint8": "u8",
    "bool": "pred",
    "complex64": "c64",
    "complex128": "c128",
}


def _shape(t) -> str:
    s = t._ir.shape
    return f"{_SHORT.get(s.dtype, s.dtype)}[{','.join(str(d) for d in s.dims)}]"


# -- graphs --------------------------------------------------------------------------------


def _roots(tensors):
    from ir_runtime._frontend.recording._tensor import as_value

    return [as_value(_core.lazy(t)) for t in tensors]


def _get_xla_tensors_text(tensors) -> str:
    return _irt.dump([_core.lazy(t) for t in tensors], format="text")


def _get_xla_tensors_hlo(tensors) -> str:
    """The HLO text of the program computing ``tensors`` (before SPMD partitioning)."""
    from jax._src.lib import _jax

    from ir_runtime._lower import lower

    for t in tensors:
        if _eager.region_mesh(_core.lazy(t)) is not None:
            raise _ShardingError(
                f"_get_xla_tensors_hlo: the tensor {list(t.shape)} is inside a manual region "
                f"still open (enable_manual_sharding); the region becomes a program when it "
                f"closes (disable_manual_sharding): ask for the HLO of its result"
            )
    text = lower(_roots(tensors))
    computation = _jax.mlir.mlir_module_to_xla_computation(
        text, use_tuple_args=False, return_tuple=False
    )
    return explicit_devices(computation.as_hlo_text())


_IOTA = re.compile(r"devices=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def explicit_devices(hlo: str) -> str:
    """HLO text with each iota tile assignment (``devices=[2,4]<=[4,2]T(1,0)``) written as
    the explicit device list torch_xla prints (``devices=[2,4]0,2,4,6,1,3,5,7``)."""

    def expand(m):
        dims = [int(d) for d in m.group(1).split(",")]
        reshape = [int(d) for d in m.group(2).split(",")]
        ids = np.arange(int(np.prod(reshape))).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(p) for p in m.group(3).split(",")])
        return f"devices=[{','.join(map(str, dims))}]{','.join(map(str, ids.flatten()))}"

    return _IOTA.sub(expand, hlo)


def _get_graph_hash(tensors) -> bytes:
    from ir_core import graph_hash

    h = graph_hash(_roots(tensors))
    return h if isinstance(h, bytes) else int(h).to_bytes(16, "little")


def _xla_sync_multi(tensors, devices=None, wait: bool = True, sync_xla_data: bool = True):
    from ir_runtime._frontend.steps._step import materialize

    for t in tensors:
        t = _core.lazy(t)
        if isinstance(t, _irt.LazyTensor):
            materialize(t)
    if wait:
        _irt.wait_device_ops()


def _xla_step_marker(device="", devices=(), wait: bool = True, reset_scope: bool = True):
    _core.sync(wait)


# -- devices ---------------------------------------------------------------------------------


def _xla_get_default_device() -> str:
    return "xla:0"


def _xla_get_default_device_ordinal() -> int:
    return 0


def _xla_set_default_device(device) -> None:
    if str(device) not in ("xla", "xla:0"):
        raise NotImplementedError(f"only xla:0 is a device here, not {device}")


def _xla_num_devices() -> int:
    import torch_xla.runtime as xr

    return xr.addressable_device_count()


def _xla_num_runtime_devices() -> int:
    return len(_core.local_devices())


def _xla_get_all_devices() -> list[str]:
    import torch_xla.runtime as xr

    return [f"xla:{k}" for k in range(xr.global_device_count())]


def _xla_get_all_runtime_devices() -> list[str]:
    kind = _core.device_type()
    return [f"{kind}:{d.id}" for d in _core.devices()]


def _xla_real_devices(devices=None) -> list[str]:
    from torch_xla.core import xla_model

    return xla_model.xla_real_devices(devices)


def _xla_get_process_index() -> int:
    return _irt.process_index()


def _xla_get_num_processes() -> int:
    return _irt.process_count()


def _xla_get_spmd_config_is_locked() -> bool:
    return False


def _xla_get_auto_sharding() -> bool:
    return False


def _xla_computation_cache_is_initialized() -> bool:
    from ir_runtime._jaxapi import backends_are_initialized

    return backends_are_initialized()


# -- data ------------------------------------------------------------------------------------


def _global_tensor_from_cpu_shards(shards, op_sharding: OpSharding, global_shape=None):
    """A device tensor from one padded CPU block per device (in device id order), placed as
    ``op_sharding`` says; ``global_shape`` defaults to every block's data, padding included
    (torch_xla's rules: ``xla_sharded_tensor.global_from_shards``)."""
    from ir_core import DeviceData, Shape, Value
    from ir_runtime._frontend.recording._convert import ir_dtype
    from ir_runtime._frontend.recording._tensor import wrap
    from torch_xla.distributed.spmd.xla_sharded_tensor import global_from_shards

    spec = op_sharding.spec
    ids = sorted(spec.mesh.device_ids)
    if len(shards) != len(ids):
        raise RuntimeError(f"{len(shards)} shards for {len(ids)} devices: give one per device")
    blocks = dict(zip(ids, shards, strict=True))
    what = "_global_tensor_from_cpu_shards"
    array, shape = global_from_shards(blocks, spec, global_shape, what)
    node = DeviceData(
        Shape(ir_dtype(shards[0].dtype), shape), handle=array, sharding=spec.evenly(shape)
    )
    t = wrap(Value(node))
    t._annotate(spec)
    return t


# -- eager manual regions (the engine's ``regions._eager``) ------------------------------------


def _spmd_full_to_shard_shape(t):
    """The block of ``t`` each device holds, opening a manual region; ``t`` must be sharded."""
    x = _core.lazy(t)
    spec = _core.spec_of(x)
    if spec is None or spec.kind is _Kind.MANUAL:
        raise RuntimeError(
            f"_spmd_full_to_shard_shape: the tensor {list(x.shape)} is not sharded; "
            f"mark_sharding it first"
        )
    return _eager.full_to_shard(x, spec, "_spmd_full_to_shard_shape")


def _spmd_shard_to_full_shape(t, op_sharding: OpSharding, full_shape, dtype):
    """The devices' blocks ``t`` (marked manual) as one tensor of ``full_shape`` placed as
    ``op_sharding``, closing the region."""
    x = _core.lazy(t)
    if dtype is not None and dtype != x.dtype:
        raise ValueError(
            f"_spmd_shard_to_full_shape: dtype {dtype} differs from the tensor's {x.dtype}"
        )
    return _eager.shard_to_full(x, op_sharding.spec, full_shape, "_spmd_shard_to_full_shape")


def _mark_manual_sharding(t, op_sharding: OpSharding) -> None:
    if op_sharding.spec.kind is not _Kind.MANUAL:
        raise RuntimeError(f"_mark_manual_sharding takes a manual OpSharding, got {op_sharding}")
    _eager.mark_manual(_core.lazy(t), op_sharding.spec.mesh)


_REDUCE = {"sum": "sum", "max": "max", "min": "min"}


def _reduce(reduce_type, what: str) -> str:
    op = _REDUCE.get(reduce_type)
    if op is None:
        raise NotImplementedError(
            f"{what}: reduce_type {reduce_type!r} inside a manual region; the engine reduces "
            f"with 'sum', 'max' or 'min'"
        )
    return op


def _scaled(t, scale):
    return t if scale == 1.0 else t * scale


def _xla_spmd_all_reduce(reduce_type, input, scale, groups):
    """``input`` (inside a manual region) reduced over the devices of each group, times
    ``scale``."""
    what = "_xla_spmd_all_reduce"
    return _scaled(_eager.collective(_reduce(reduce_type, what), input, groups, what), scale)


def _xla_spmd_reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups):
    what = "_xla_spmd_reduce_scatter"
    if _reduce(reduce_type, what) != "sum":
        raise NotImplementedError(f"{what}: reduce_type {reduce_type!r}; the engine scatters sums")
    if groups and len(groups[0]) != shard_count:
        raise ValueError(f"{what}: shard_count {shard_count} but groups of {len(groups[0])}")
    return _scaled(_eager.collective("reduce_scatter", input, groups, what, scatter_dim), scale)
