"""``torch_xla.distributed.spmd.xla_sharding``: meshes and sharding annotations, onto the
engine's (``ir_sharding.Mesh``, ``ir_runtime.mark_sharding``)."""

from __future__ import annotations

import ast
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import torch

import ir_runtime as _irt
import torch_xla
import torch_xla.runtime as xr
from ir_runtime.torch_xla import _core
from ir_sharding import Mesh as _IrMesh
from ir_sharding import ShardingSpec as _IrSpec

from .xla_sharded_tensor import XLAShardedTensor


class ShardingType(IntEnum):
    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


class Mesh:
    """torch_xla's logical device mesh: ``device_ids`` (global device ids) reshaped row-major
    to ``mesh_shape``, with optional ``axis_names``. An engine mesh underneath (unnamed axes
    are named ``"0"``, ``"1"``, ...)."""

    def __init__(self, device_ids, mesh_shape, axis_names=None):
        if not isinstance(device_ids, np.ndarray):
            device_ids = np.array(device_ids)
        num_devices = xr.global_runtime_device_count()
        assert num_devices == len(device_ids), (
            f"Number of device IDs ({len(device_ids)}) must match the global number of "
            f"devices ({num_devices})"
        )
        if axis_names is not None:
            assert len(mesh_shape) == len(axis_names), (
                f"Number of axis names ({len(axis_names)}) must match mesh dimensions "
                f"({len(mesh_shape)})"
            )
            assert len(set(axis_names)) == len(axis_names), (
                f"Axis names must be unique, got: {axis_names}"
            )
        expected = int(np.prod(mesh_shape))
        assert len(device_ids) == expected, (
            f"Number of device IDs ({len(device_ids)}) must match mesh size ({expected})"
        )
        assert len(device_ids) == len(np.unique(device_ids)), (
            f"Device IDs must be unique, got: {device_ids}"
        )
        self.device_ids = device_ids
        self.mesh_shape = tuple(mesh_shape)
        self.axis_names = None if axis_names is None else tuple(axis_names)
        assert all(d < self.size() for d in device_ids), (
            f"Device IDs must be less than mesh size ({self.size()}), got: {device_ids}"
        )
        names = self.axis_names or tuple(str(k) for k in range(len(self.mesh_shape)))
        self._ir = _IrMesh([int(d) for d in device_ids], self.mesh_shape, names)
        self._specs = {}  # partition spec -> the engine's spec, made once (as torch_xla caches)

    def size(self):
        return int(np.prod(self.mesh_shape))

    def shape(self):
        if self.axis_names is None:
            return OrderedDict(enumerate(self.mesh_shape))
        return OrderedDict(zip(self.axis_names, self.mesh_shape, strict=False))

    def get_logical_mesh(self):
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str):
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    def get_op_sharding(self, partition_spec):
        """The ``OpSharding`` of ``partition_spec`` over this mesh."""
        return torch_xla._XLAC.OpSharding._of(self._spec(partition_spec))

    def _spec(self, partition_spec) -> _IrSpec:
        """The engine's spec of ``partition_spec`` over this mesh, made once per spec as
        torch_xla caches its ``OpSharding`` (counted as ``CreateOpSharding``)."""
        partition_spec = _translate_named_partition_spec(self, tuple(partition_spec))
        made = self._specs.get(partition_spec)
        if made is None:
            from ir_runtime import _metrics

            _metrics.count("CreateOpSharding")
            if len(partition_spec) == 0 or all(p is None for p in partition_spec):
                made = _IrSpec.replicated(self._ir)
            else:
                made = _IrSpec(self._ir, partition_spec)
            self._specs[partition_spec] = made
        return made

    def __str__(self):
        return (
            f"{{'device_ids': {self.device_ids.tolist()}, 'mesh_shape': {self.mesh_shape}, "
            f"'axis_names': {self.axis_names}}}"
        )

    def __eq__(self, other):
        return (
            isinstance(other, Mesh)
            and self.mesh_shape == other.mesh_shape
            and self.axis_names == other.axis_names
            and np.array_equal(self.device_ids, other.device_ids)
        )

    def __hash__(self):
        return hash((tuple(self.device_ids.tolist()), self.mesh_shape, self.axis_names))

    @classmethod
    def from_str(cls, mesh_str: str):
        try:
            d = ast.literal_eval(mesh_str.replace("Mesh", ""))
            return cls(np.array(d["device_ids"]), d["mesh_shape"], d["axis_names"])
        except (ValueError, SyntaxError, KeyError, TypeError):
            return None

    def get_jax_mesh(self):
        import jax.sharding

        names = self.axis_names or tuple(str(k) for k in range(len(self.mesh_shape)))
        by_id = {d.id: d for d in _core.devices()}
        devices = np.vectorize(by_id.get, otypes=[object])(self.get_logical_mesh())
        return jax.sharding.Mesh(devices, names)


class HybridMesh(Mesh):
    """A mesh over ``dcn_mesh_shape`` slices of ``ici_mesh_shape`` devices each (one slice
    here unless processes say otherwise): the devices in id order, slices outermost."""

    def __init__(self, *, ici_mesh_shape, dcn_mesh_shape=None, axis_names=None):
        if dcn_mesh_shape is None:
            dcn_mesh_shape = tuple([1] * len(ici_mesh_shape))
        assert len(ici_mesh_shape) == len(dcn_mesh_shape)
        mesh_shape = tuple(i * d for i, d in zip(ici_mesh_shape, dcn_mesh_shape, strict=False))
        n = int(np.prod(mesh_shape))
        ids = np.arange(n).reshape(tuple(dcn_mesh_shape) + tuple(ici_mesh_shape))
        k = len(mesh_shape)
        order = [a for pair in zip(range(k), range(k, 2 * k), strict=False) for a in pair]
        ids = ids.transpose(order).reshape(mesh_shape)
        super().__init__(ids.flatten(), mesh_shape, axis_names)


_GLOBAL_MESH: list = [None]


def set_global_mesh(mesh: Mesh) -> None:
    _GLOBAL_MESH[0] = mesh


def get_global_mesh() -> Mesh | None:
    return _GLOBAL_MESH[0]


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    n = xr.global_runtime_device_count()
    names = None if axis_name is None else (axis_name,)
    return Mesh(np.arange(n), (n,), names)


def _translate_named_partition_spec(mesh: Mesh, partition_spec):
    out = []
    for p in partition_spec:
        if type(p) is tuple:
            assert not any(type(x) is tuple for x in p), (
                "Partition spec cannot contain nested tuples"
            )
            out.append(_translate_named_partition_spec(mesh, p))
        elif p is None or isinstance(p, (int, np.integer)):
            out.append(None if p is None else int(p))
        elif type(p) is str:
            idx = mesh.get_axis_name_idx(p)
            if idx is None:
                raise ValueError(f"Axis name {p} is not defined in the given mesh")
            out.append(idx)
        else:
            raise ValueError(f"Spec type {type(p)} is not supported in partition spec")
    return tuple(out)


def _check_rank(t, partition_spec) -> None:
    assert len(t.shape) == len(partition_spec), (
        f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
        f"({len(t.shape)})."
    )


def _lazy(t, what: str):
    inner = unwrap_sharded_tensor(t)
    if not isinstance(inner, _irt.LazyTensor):
        raise ValueError(
            f"{what} takes a tensor on the xla device, got one on {inner.device}: move it "
            f"with .to('xla') first"
        )
    return inner


def mark_sharding(t, mesh: Mesh, partition_spec) -> XLAShardedTensor:
    """Annotate ``t`` (in place) with ``partition_spec`` over ``mesh``; returns an
    ``XLAShardedTensor`` view of it."""
    _check_rank(t, partition_spec)
    inner = _lazy(t, "mark_sharding")
    spec = mesh._spec(partition_spec)
    _mark(inner, spec)
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def _mark(inner, spec: _IrSpec) -> None:
    """torch_xla's rule for data: an annotation other than a replicated one is not replaced
    by another (``clear_sharding`` first); pending values take any."""
    from ir_core import DeviceData
    from ir_runtime._frontend.recording._api import annotate
    from ir_sharding import ShardingKind

    current = inner._spec
    if (
        type(inner._ir.node) is DeviceData
        and current is not None
        and current.kind is not ShardingKind.REPLICATED
        and current != spec
    ):
        raise RuntimeError(
            f"Existing annotation must be cleared first: the tensor's data is placed as "
            f"{current.to_hlo_text(devices='ids')}, and mark_sharding asks for "
            f"{spec.to_hlo_text(devices='ids')} (xs.clear_sharding(t) first, as torch_xla "
            f"requires)"
        )
    annotate(inner, spec)


@torch.library.custom_op("xla::aot_mark_sharding", mutates_args=())
def _aot_mark_sharding(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    """A copy of ``t`` annotated ``partition_spec`` over ``mesh`` (both as ``str`` gives
    them): an op of its own, so AOTAutograd's graphs keep the annotation (torch_xla's op)."""
    out = t.clone()
    mark_sharding(out, Mesh.from_str(mesh), ast.literal_eval(partition_spec))
    return out


@_aot_mark_sharding.register_fake
def _aot_mark_sharding_fake(t, mesh, partition_spec):
    return torch.empty_like(t)


class MarkShardingFunction(torch.autograd.Function):
    """``mark_sharding`` as an autograd function: the result and its gradient both carry the
    annotation, through ``xla::aot_mark_sharding`` (traceable by AOTAutograd)."""

    @staticmethod
    def forward(ctx, torch_tensor, mesh, partition_spec):
        ctx.mesh, ctx.partition_spec = mesh, partition_spec
        return _aot_mark_sharding(torch_tensor, str(mesh), str(partition_spec))

    @staticmethod
    def backward(ctx, grad_output):
        spec = str(ctx.partition_spec)
        return _aot_mark_sharding(grad_output, str(ctx.mesh), spec), None, None


def mark_sharding_with_gradients(t, mesh: Mesh, partition_spec) -> torch.Tensor:
    _check_rank(t, partition_spec)
    inner = _lazy(t, "mark_sharding_with_gradients")
    spec = _translate_named_partition_spec(mesh, partition_spec)
    return _irt.mark_sharding_with_gradients(inner, mesh._ir, spec)


def shard_as(a, b):
    """``a`` and ``b`` (matching pytrees) sharded alike (``ir_runtime.shard_as``)."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    assert sa == sb, f"a and b must have the same structure. got {sa} and {sb}"
    outa, outb = [], []
    for x, y in zip(fa, fb, strict=False):
        if x is None or y is None:
            assert x is None and y is None
        else:
            x, y = _irt.shard_as(unwrap_sharded_tensor(x), unwrap_sharded_tensor(y))
        outa.append(x)
        outb.append(y)
    return tree_unflatten(outa, sa), tree_unflatten(outb, sb)


def clear_sharding(t) -> torch.Tensor:
    _irt.clear_sharding(_lazy(t, "clear_sharding"))
    return unwrap_sharded_tensor(t)


def wrap_as_sharded_tensor(t, mesh_shape=None, partition_spec=None) -> XLAShardedTensor:
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)
    if mesh_shape is not None:
        t.mesh_shape = mesh_shape
    if partition_spec is not None:
        t.partition_spec = partition_spec
    if mesh_shape is not None or partition_spec is not None:
        t.invalidate_spec_cache()
    return t


def unwrap_sharded_tensor(t):
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def wrap_if_sharded(x):
    if (
        isinstance(x, torch.Tensor)
        and not isinstance(x, XLAShardedTensor)
        and x.device.type == "xla"
        and torch_xla._XLAC._get_xla_sharding_type(x) is not None
    ):
        return XLAShardedTensor(x)
    return x


def _mark_manual_sharding(t, user_partition_spec=None):
    """Mark ``t``'s pending value manual (each device's block): what closes a manual region
    (``disable_manual_sharding``); a tensor holding data raises RuntimeError, as in
    torch_xla."""
    manual_sharding = torch_xla._XLAC.OpSharding([], [], [], ShardingType.MANUAL)
    torch_xla._XLAC._mark_manual_sharding(unwrap_sharded_tensor(t), manual_sharding)
    return wrap_as_sharded_tensor(t)


def enable_manual_sharding(t, partition_spec, *, mesh=None):
    """``t`` sharded as ``partition_spec`` over ``mesh`` (the global mesh by default), then
    switched to the block each device holds: ops on the result run per device, and
    ``xm.all_reduce`` / ``all_gather`` / ``reduce_scatter`` over device groups reach across,
    until ``disable_manual_sharding`` (the engine records the region as one ``shard_map``)."""
    mesh = get_global_mesh() if mesh is None else mesh
    t = mark_sharding(unwrap_sharded_tensor(t), mesh, partition_spec)
    t = torch_xla._XLAC._spmd_full_to_shard_shape(unwrap_sharded_tensor(t))
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def disable_manual_sharding(t, partition_spec, full_shape, *, mesh=None):
    """The devices' blocks ``t`` put together as a tensor of ``full_shape`` sharded as
    ``partition_spec``: the manual region closes."""
    from ir_runtime._frontend.regions import _eager

    mesh = get_global_mesh() if mesh is None else mesh
    # torch_xla marks ``t`` manual, then closes: here ``t`` is taken as each device's block
    # directly, so a refused call leaves ``t`` as it was
    spec = mesh.get_op_sharding(partition_spec).spec
    x = _core.lazy(unwrap_sharded_tensor(t))
    t = _eager.shard_to_full(x, spec, full_shape, "disable_manual_sharding", block=True)
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def annotate_custom_sharding(t, mesh: Mesh, partition_spec):
    """A sharding constraint on ``t``'s value as it is now, its data left where it is: ``t``
    becomes the pending value of an ``ir::annotate`` node over its current value, and its
    result lands as the constraint says."""
    from ir_core import Generic, Value
    from ir_runtime._frontend.recording import _fast

    _check_rank(t, partition_spec)
    inner = _lazy(t, "annotate_custom_sharding")
    spec = mesh._spec(partition_spec)
    v = inner._ir
    inner._set(Value(Generic("ir::annotate", [v], [v.shape], {}, spec, _fast.origin())))
    inner._annotate(spec)
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def apply_backward_optimization_barrier(m: torch.nn.Module) -> None:
    """Nothing to do: the engine's recompute keeps its barrier itself."""


@dataclass
class ShardingSpec:
    """A reusable sharding of tensors of one rank: ``apply(t)`` marks ``t``;
    ``minibatch=True`` says each process feeds its part of the batch (dim 0)."""

    mesh: Mesh
    partition_spec: tuple
    minibatch: bool | None = False
    _spec: object = field(init=False, default=None, repr=False)

    def __post_init__(self):
        self.partition_spec = tuple(self.partition_spec)
        self._spec = self.mesh._spec(self.partition_spec)

    def xla_spec(self, t):
        return self._spec if self.can_apply(t) else None

    def can_apply(self, t) -> bool:
        return len(t.shape) == len(self.partition_spec)

    def check_minibatch(self, t) -> None:
        """torch_xla's rule for ``minibatch=True``: this process's batch (dim 0) splits evenly
        over its devices (each process feeds its own part of the global batch)."""
        n = xr.addressable_runtime_device_count()
        if self.minibatch and t.dim() and t.shape[0] % n:
            raise RuntimeError(
                f"When minibatch is configured, the per-host batch size must be divisible by "
                f"local runtime device count. Per host input data shape = {list(t.shape)}, "
                f"local_runtime_device_count = {n}"
            )

    def apply(self, t) -> None:
        mark_sharding(t, self.mesh, self.partition_spec)


def xla_patched_nn_linear_forward(m, input):
    return torch.nn.functional.linear(input, m.weight, m.bias)


class XLAPatchedLinear(torch.autograd.Function):
    """torch_xla's einsum-based linear (a workaround for its own lowering): here plain
    ``F.linear``, whose backward the engine shards as the forward."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        return torch.nn.functional.linear(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_output @ weight
        grad_weight = torch.einsum("...n,...p->np", grad_output, input)
        grad_bias = (
            None if bias is None else grad_output.sum(dim=tuple(range(grad_output.dim() - 1)))
        )
        return grad_input, grad_weight, grad_bias
