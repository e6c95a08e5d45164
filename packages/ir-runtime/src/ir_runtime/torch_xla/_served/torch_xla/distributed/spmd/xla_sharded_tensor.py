"""``XLAShardedTensor``: torch_xla's view of a sharded tensor, wrapping the engine's lazy
tensor (``global_tensor``). Ops on it run on the global tensor and give ``XLAShardedTensor``s;
``local_shards`` reads each local device's block of the computed value."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
from torch.utils._pytree import tree_map

import torch_xla
from ir_runtime.torch_xla import _core


@dataclass
class XLAShard:
    """One device's block: ``data`` (a CPU tensor, padded as XLA pads uneven blocks),
    ``indices`` (the slices of the global tensor it holds, or ``...`` for all of it),
    ``shard_device`` (``"CPU:3"``) and ``replica_id``."""

    data: torch.Tensor
    indices: object
    shard_device: str
    replica_id: int

    @property
    def unpadded_data(self) -> torch.Tensor:
        if self.indices is Ellipsis:
            return self.data
        return self.data[tuple(slice(0, s.stop - s.start) for s in self.indices)]


def local_shards(t) -> list[XLAShard]:
    """The blocks of ``t``'s value on this process's devices, in device id order, as its
    sharding (annotation, else placement) cuts them: XLA's rule, ceil-sized blocks, the last
    ones shorter and zero-padded here to the block shape, as torch_xla pads them. Each device's
    block lies in the block its data holds (uneven dims are held whole), so it is cut from the
    device's own data."""
    import jax

    from ir_runtime._data import fetch
    from ir_runtime._frontend.recording._convert import host_tensor
    from ir_runtime._frontend.steps._step import materialize

    spec = _core.spec_of(t)
    data = materialize(t)
    handle = data.handle
    if not isinstance(handle, jax.Array):
        handle = jax.device_put(np.asarray(handle), _core.local_devices()[0])
    shape = tuple(t.shape)
    wanted = spec.device_indices(shape) if spec is not None else {}
    padded = spec.shard_shape(shape) if spec is not None else shape
    replica, seen = {}, {}
    if spec is not None:
        # Replica ids count, in mesh order, the devices holding the same tile: read from a
        # shape of one element per tile (an uneven shape's empty blocks would look alike).
        for device, block in spec.device_indices(spec.tile_dims).items():
            key = tuple(sl.indices(n)[:2] for sl, n in zip(block, spec.tile_dims, strict=True))
            replica[device] = seen[key] = seen.get(key, -1) + 1
    kind = _core.device_type()
    out = []
    for s in sorted(handle.addressable_shards, key=lambda s: s.device.id):
        block = host_tensor(fetch(s.data), data.shape.dtype)
        held = [sl.indices(n) for sl, n in zip(s.index, shape, strict=False)]
        spans, replica_id = held, s.replica_id
        if s.device.id in wanted:
            spans = [sl.indices(n) for sl, n in zip(wanted[s.device.id], shape, strict=True)]
            cut = tuple(
                slice(a - h, b - h) for (a, b, _), (h, _, _) in zip(spans, held, strict=True)
            )
            block = _padded(block[cut], padded)
            replica_id = replica[s.device.id]
        if all(a == 0 and b == n for (a, b, _), n in zip(spans, shape, strict=False)):
            indices = Ellipsis
        else:
            indices = [slice(a, b, 1) for a, b, _ in spans]
        out.append(XLAShard(block, indices, f"{kind}:{s.device.id}", replica_id))
    return out


def global_from_shards(blocks: dict, spec, global_shape=None, what="shards"):
    """The data of a global tensor from each device's block (``blocks``: device id -> a CPU
    tensor of the padded block shape), placed as ``spec`` says (held evenly): torch_xla's rules.
    Every device of ``spec``'s mesh gives one block; the blocks share one shape, the padded
    shape of a block of ``global_shape`` (default: the blocks' shape times the tiles, padding
    included). Returns ``(array, shape)``; raises ``RuntimeError`` naming the rule broken."""
    from ir_runtime._data import put
    from ir_runtime._frontend.recording._convert import host_numpy

    ids = sorted(spec.mesh.device_ids)
    if sorted(blocks) != ids:
        raise RuntimeError(
            f"{what}: {len(blocks)} blocks (devices {sorted(blocks)}) for a sharding over "
            f"{len(ids)} devices ({ids}): give one per device"
        )
    shapes = {tuple(b.shape) for b in blocks.values()}
    if len(shapes) != 1:
        raise RuntimeError(f"{what}: blocks of several shapes {sorted(shapes)}; give one shape")
    block_shape = shapes.pop()
    tiles = spec.tile_dims if spec.rank is not None else (1,) * len(block_shape)
    if global_shape is None:
        global_shape = tuple(b * t for b, t in zip(block_shape, tiles, strict=False))
    global_shape = tuple(int(d) for d in global_shape)
    if len(global_shape) != len(block_shape) or spec.shard_shape(global_shape) != block_shape:
        raise RuntimeError(
            f"{what}: global shape {list(global_shape)} does not fit blocks of shape "
            f"{list(block_shape)} tiled {list(tiles)} (each block is the ceiling of the global "
            f"shape over its tiles)"
        )
    first = next(iter(blocks.values()))
    host = np.zeros(global_shape, host_numpy(first).dtype)
    for device, index in spec.device_indices(global_shape).items():
        extent = tuple(
            slice(0, len(range(*sl.indices(n)))) for sl, n in zip(index, global_shape, strict=True)
        )
        host[index] = host_numpy(blocks[device])[extent]
    return put(host, spec.evenly(global_shape).to_jax()), global_shape


def _padded(block: torch.Tensor, shape) -> torch.Tensor:
    """``block`` zero-padded at the end of each dim to ``shape``."""
    if tuple(block.shape) == tuple(shape):
        return block
    out = block.new_zeros(shape)
    out[tuple(slice(0, n) for n in block.shape)] = block
    return out


class XLAShardedTensor(DTensor):
    """A wrapper of the engine's tensor with torch_xla's sharding view of it."""

    __slots__ = ["_cached_spec", "global_tensor", "mesh_shape", "partition_spec"]

    @staticmethod
    def __new__(cls, elem, mesh_shape=None, partition_spec=None, *args, **kwargs):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=elem.device,
            requires_grad=kwargs.get("requires_grad", False),
        )
        r.global_tensor = elem.detach() if r.requires_grad else elem
        r.mesh_shape = mesh_shape or (
            elem.mesh_shape if isinstance(elem, XLAShardedTensor) else None
        )
        r.partition_spec = partition_spec or (
            elem.partition_spec if isinstance(elem, XLAShardedTensor) else None
        )
        r._cached_spec = None
        return r

    @property
    def local_shards(self) -> list[XLAShard]:
        return local_shards(self.global_tensor)

    def load_local_shards_(self, shards) -> None:
        """Replace every device's block with ``shards``' data (``XLAShard``s, one per device,
        each of the padded block shape), as torch_xla does; a replicated tensor refuses."""
        from ir_core import DeviceData
        from ir_sharding import ShardingKind

        inner = self.global_tensor
        spec = _core.spec_of(inner)
        if spec is None or spec.kind in (ShardingKind.REPLICATED, ShardingKind.MAXIMAL):
            raise RuntimeError(
                "load_local_shards_ takes the blocks of a tiled tensor: this one is "
                f"{'not sharded' if spec is None else spec.kind.name.lower()}"
            )
        blocks = {int(s.shard_device.rpartition(":")[2]): s.data for s in shards}
        if len(blocks) != len(shards):
            raise RuntimeError("load_local_shards_: two shards for one device")
        array, _ = global_from_shards(blocks, spec, tuple(inner.shape), "load_local_shards_")
        held = spec.evenly(tuple(inner.shape))
        inner._bind(DeviceData(inner._ir.shape, handle=array, sharding=held))
        self._cached_spec = None

    @property
    def sharding_spec(self) -> str:
        return torch_xla._XLAC._get_xla_sharding_spec(self.global_tensor)

    @property
    def sharding_type(self):
        from torch_xla.distributed.spmd import ShardingType

        return ShardingType(torch_xla._XLAC._get_xla_sharding_type(self.global_tensor))

    def __repr__(self):
        if not hasattr(self, "global_tensor"):
            return str(self.cpu())
        return f"XLAShardedTensor({self.global_tensor})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(elem):
            return elem.global_tensor if isinstance(elem, XLAShardedTensor) else elem

        def wrap(elem):
            return XLAShardedTensor(elem) if isinstance(elem, torch.Tensor) else elem

        return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super(DTensor, cls).__torch_function__(func, types, args, kwargs)

    @property
    def _spec(self):
        """torch's ``DTensorSpec`` of this tensor, from ``mesh_shape`` and ``partition_spec``
        (over a ``DeviceMesh("xla", ...)`` of every device)."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        if self._cached_spec is not None:
            return self._cached_spec
        if self.mesh_shape is None:
            raise ValueError(
                "mesh_shape must be specified to create DTensorSpec: use "
                "wrap_as_sharded_tensor() to set mesh_shape before accessing _spec"
            )
        if self.partition_spec is None:
            raise ValueError(
                "partition_spec must be specified to create DTensorSpec: use "
                "wrap_as_sharded_tensor() to set partition_spec before accessing _spec"
            )
        import torch_xla.runtime as xr

        n = xr.global_runtime_device_count()
        mesh = DeviceMesh("xla", torch.arange(n).reshape(self.mesh_shape))
        placements = []
        for mesh_dim in range(len(self.mesh_shape)):
            dims = [d for d, m in enumerate(self.partition_spec) if m == mesh_dim]
            placements.append(Shard(dims[0]) if dims else Replicate())
        g = self.global_tensor
        meta = TensorMeta(shape=g.shape, stride=g.stride(), dtype=g.dtype)
        self._cached_spec = DTensorSpec(mesh=mesh, placements=tuple(placements), tensor_meta=meta)
        return self._cached_spec

    @property
    def placements(self):
        try:
            return self._spec.placements
        except Exception:
            raise ValueError(
                "Placements not available: XLAShardedTensor requires mesh_shape and "
                "partition_spec to be set. Use mark_sharding() to properly initialize "
                "sharding information."
            ) from None

    def invalidate_spec_cache(self) -> None:
        self._cached_spec = None

    def redistribute(self, device_mesh, placements, *, async_op: bool = False):
        if len(placements) != len(device_mesh.mesh_shape):
            raise ValueError(
                f"Number of placements ({len(placements)}) must match mesh dimensions "
                f"({len(device_mesh.mesh_shape)})"
            )
        for p in placements:
            if isinstance(p, Partial):
                raise NotImplementedError(
                    "Partial placement is not yet implemented and may have unexpected "
                    "behavior. Use Shard or Replicate placements instead."
                )
        spec = [None] * len(self.global_tensor.shape)
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Shard):
                if p.dim >= len(self.global_tensor.shape):
                    raise IndexError(
                        f"Shard dimension {p.dim} is out of bounds for tensor with "
                        f"{len(self.global_tensor.shape)} dimensions"
                    )
                spec[p.dim] = mesh_dim
        from torch_xla.distributed.spmd.xla_sharding import mark_sharding

        result = self.global_tensor.clone() if async_op else self.global_tensor
        mark_sharding(result, device_mesh, tuple(spec))
        return XLAShardedTensor(
            result, mesh_shape=device_mesh.mesh_shape, partition_spec=tuple(spec)
        )


@contextlib.contextmanager
def no_dispatch():
    guard = torch._C._DisableTorchDispatch()
    try:
        yield
    finally:
        del guard
