"""``SPMDSavePlanner`` and ``SPMDLoadPlanner``: torch.distributed.checkpoint (DCP) planners
for the engine's tensors, as torch_xla's are for its own.

Saving writes a sharded tensor as one DCP chunk per distinct block of its sharding held on
this process's devices (the device holding replica 0 writes it; uneven blocks unpadded), any
other engine tensor whole from the coordinator, everything else as DCP's default planner
does: DCP's own format, which DCP reads into any other chunking. Loading reads, for each
engine tensor, the part this process's devices hold (the whole tensor in one process) into a
CPU buffer, and places it as the tensor's sharding says once every chunk of it has arrived;
everything else loads in place as with DCP's default planner."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_load_plan,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.utils._pytree import tree_map

import ir_runtime as _irt
from ir_runtime.torch_xla import _core

from ._helpers import _CpuShards, blocks, lazy, sharded


def _unwrap(v):
    t = lazy(v)
    return v if t is None else t


class SPMDSavePlanner(DefaultSavePlanner):
    """DCP's save planner for state dicts holding the engine's tensors (module docstring)."""

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False) -> None:
        super().set_up_planner(tree_map(_unwrap, state_dict), storage_meta, is_coordinator)
        self._blocks = {}  # fqn -> (global shape, [(offsets, CPU data)])
        for fqn, v in list(self.state_dict.items()):
            if isinstance(v, _CpuShards):
                self._blocks[fqn] = (tuple(v.global_shape), blocks(v.shards))
            elif lazy(v) is not None:
                if sharded(v):
                    from torch_xla.distributed.spmd.xla_sharded_tensor import local_shards

                    self._blocks[fqn] = (tuple(v.shape), blocks(local_shards(v)))
                else:
                    self.state_dict[fqn] = v.detach().cpu()
        self._data = {}

    def create_local_plan(self):
        rest = {k: v for k, v in self.state_dict.items() if k not in self._blocks}
        plan = create_default_local_save_plan(rest, self.is_coordinator)
        if self.flatten_state_dict:
            plan = dataclasses.replace(plan, planner_data=self.mappings)
        for fqn, (shape, parts) in self._blocks.items():
            for k, (offsets, data) in enumerate(parts):
                chunk = ChunkStorageMetadata(torch.Size(offsets), torch.Size(data.shape))
                plan.items.append(
                    WriteItem(
                        index=MetadataIndex(fqn, torch.Size(offsets), k),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=chunk,
                            properties=TensorProperties.create_from_tensor(data),
                            size=torch.Size(shape),
                        ),
                    )
                )
                self._data[(fqn, tuple(offsets))] = data
        self.plan = plan
        return plan

    def resolve_data(self, write_item):
        index = write_item.index
        data = self._data.get((index.fqn, tuple(index.offset or ())))
        if data is not None and write_item.type is WriteItemType.SHARD:
            return data.contiguous()
        return super().resolve_data(write_item)


class SPMDLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner for state dicts holding the engine's tensors (module docstring)."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        self._lazy = {}
        for fqn, v in self.state_dict.items():
            t = lazy(v)
            if t is not None:
                self._lazy[fqn] = t
        self._buffers = {}  # fqn -> (CPU buffer, its slices of the global tensor)
        self._pending = {}

    def create_local_plan(self):
        rest = {k: v for k, v in self.state_dict.items() if k not in self._lazy}
        plan = create_default_local_load_plan(rest, self.metadata, not self.allow_partial_load)
        for fqn, t in self._lazy.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if md is None:
                if self.allow_partial_load:
                    continue
                raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
            if not isinstance(md, TensorStorageMetadata) or tuple(md.size) != tuple(t.shape):
                raise ValueError(
                    f"Size mismatch between saved {getattr(md, 'size', type(md).__name__)} "
                    f"and current: {tuple(t.shape)} for {fqn}"
                )
            region = _region(t)
            sizes = [len(range(*sl.indices(n))) for sl, n in zip(region, t.shape, strict=True)]
            starts = [sl.indices(n)[0] for sl, n in zip(region, t.shape, strict=True)]
            buffer = torch.empty(sizes, dtype=t.dtype)
            chunk = ChunkStorageMetadata(torch.Size(starts), torch.Size(sizes))
            plan.items.extend(create_read_items_for_chunk_list(fqn, md, [chunk]))
            self._buffers[fqn] = (buffer, region)
            self._pending[fqn] = buffer.numel()
            if buffer.numel() == 0:
                self._place(fqn)
        return plan

    def resolve_tensor(self, read_item):
        fqn = read_item.dest_index.fqn
        if fqn in self._buffers:
            buffer = self._buffers[fqn][0]
            for dim, (at, n) in enumerate(
                zip(read_item.dest_offsets, read_item.lengths, strict=True)
            ):
                buffer = buffer.narrow(dim, at, n)
            return buffer
        return super().resolve_tensor(read_item)

    def commit_tensor(self, read_item, tensor) -> None:
        fqn = read_item.dest_index.fqn
        if fqn not in self._buffers:
            return super().commit_tensor(read_item, tensor)
        self._pending[fqn] -= math.prod(read_item.lengths)
        if self._pending[fqn] == 0:
            self._place(fqn)

    def _place(self, fqn) -> None:
        """The tensor's part, all read: placed as its sharding says."""
        t = self._lazy[fqn]
        buffer, region = self._buffers.pop(fqn)
        if all(sl == slice(None) for sl in region):
            with torch.no_grad():
                t.copy_(buffer)
        else:  # this process's part of a tensor sharded across processes
            from ir_core import DeviceData
            from ir_runtime._frontend.recording._api import place_local

            spec = _core.spec_of(t)
            array = place_local(buffer, spec, tuple(t.shape))
            t._bind(DeviceData(t._ir.shape, handle=array, sharding=spec))


def _region(t) -> tuple:
    """The slices of ``t`` this process's devices hold: all of it in one process (or when it
    is not split across processes)."""
    spec = _core.spec_of(t)
    whole = (slice(None),) * t.dim()
    if spec is None or _irt.process_count() == 1 or not sharded(t):
        return whole
    local = _irt.process_local_slices(spec.mesh, spec.partition_spec, tuple(t.shape))
    if all(sl.indices(n)[:2] == (0, n) for sl, n in zip(local, t.shape, strict=True)):
        return whole
    return tuple(local)
