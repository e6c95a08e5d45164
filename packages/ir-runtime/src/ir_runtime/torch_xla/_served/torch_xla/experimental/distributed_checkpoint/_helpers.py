"""What the planners and the manager share: which values are the engine's tensors, each one's
sharding, its blocks on this process's devices, and a state dict moved to the CPU as blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map

import ir_runtime as _irt
from ir_runtime.torch_xla import _core
from ir_sharding import ShardingKind


def lazy(v):
    """The engine's tensor behind ``v`` (an ``XLAShardedTensor``'s global tensor), or None."""
    v = _core.lazy(v)
    return v if isinstance(v, _irt.LazyTensor) else None


def sharded(t) -> bool:
    """Whether ``t`` (an engine tensor) is split into blocks (a tiled or partly tiled spec)."""
    spec = _core.spec_of(t)
    return spec is not None and spec.kind not in (ShardingKind.REPLICATED, ShardingKind.MAXIMAL)


@dataclass
class _CpuShards:
    """A sharded tensor's blocks on this process's devices, on the CPU (``XLAShard``s), and its
    global shape: what an asynchronous save writes while training goes on."""

    shards: list
    global_shape: torch.Size


def blocks(shards) -> list:
    """``(offsets, data)`` for each distinct non-empty block among ``shards`` that its replica 0
    holds (across processes exactly one device holds replica 0 of each block)."""
    out, seen = [], set()
    for s in shards:
        if s.replica_id != 0:
            continue
        data = s.unpadded_data
        if s.indices is Ellipsis:
            offsets = (0,) * data.dim()
        else:
            offsets = tuple(sl.start for sl in s.indices)
        if data.numel() == 0 or offsets in seen:
            continue
        seen.add(offsets)
        out.append((offsets, data))
    return out


def _sharded_cpu_state_dict(state_dict):
    """``state_dict`` with each engine tensor on the CPU: a sharded one as its blocks on this
    process's devices (``_CpuShards``), any other whole."""
    from torch_xla.distributed.spmd.xla_sharded_tensor import local_shards

    def move(v):
        t = lazy(v)
        if t is None:
            return v
        if sharded(t):
            return _CpuShards(local_shards(t), t.shape)
        return t.detach().cpu()

    _irt.mark_step()
    return tree_map(move, state_dict)
