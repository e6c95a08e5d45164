"""mark_step and materialization: turn pending lazy values into data."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch._lazy

from ir_core import DeviceData, Value, post_order
from ir_runtime import _metrics
from ir_runtime._collectives import wait_device_ops
from ir_runtime._data import fetch
from ir_runtime._execute import run_graph
from ir_runtime._frontend import _rng
from ir_runtime._frontend._record import IR_TO_TORCH
from ir_runtime._frontend._tensor import LazyTensor, live
from ir_runtime._placement import spec_at, specs_of
from ir_sharding import ShardingSpec


def _pending(t: LazyTensor) -> bool:
    return type(t._ir.node) is not DeviceData


def _target(t: LazyTensor, mesh):
    """Where a result should land: the annotation, else where the tensor's data was (a tensor
    that held unsharded data stays replicated over the mesh); None: wherever XLA puts it."""
    if t._spec is not None:
        return t._spec
    if t._placed is not None:
        return t._placed
    if t._held and mesh is not None:
        return ShardingSpec.replicated(mesh)
    return None


def _mesh_of(tensors):
    for t in tensors:
        for spec in (t._spec, t._placed):
            if spec is not None:
                return spec.mesh
    for n in post_order([t._ir for t in tensors]):
        specs = specs_of(n.sharding)
        if specs:
            return specs[0].mesh
    return None


def _pin(tensors):
    """Roots for ``tensors``, and where each result must land: its tensor's placement, so the
    next step's graph is the same program."""
    roots, seen, pins, rank = [], {}, [], []
    mesh = _mesh_of(tensors)
    for t in tensors:
        v = t._ir
        key = (id(v.node), v.index)
        k = seen.get(key)
        if k is None:
            k = seen[key] = len(roots)
            roots.append(v)
            pins.append(None)
            rank.append(0)
        # Several tensors can hold one value (aliases): an annotation beats a past placement.
        r = 3 if t._spec is not None else 2 if t._placed is not None else 1 if t._held else 0
        if r > rank[k]:
            rank[k] = r
            pins[k] = _target(t, mesh)
    for k, v in enumerate(roots):
        if spec_at(v.node.sharding, v.index) is not None:
            pins[k] = None  # the node says it already
    return roots, seen, pins


def _run(tensors):
    """Run the graph of ``tensors`` and bind each to its result; returns ``run_graph``'s
    ``(results, executable, graph, arrays)`` and each tensor's root index."""
    roots, position, pins = _pin(tensors)
    ran = run_graph(roots, out_shardings=pins)
    results = ran[0]
    where = [position[(id(t._ir.node), t._ir.index)] for t in tensors]
    for t, k in zip(tensors, where, strict=True):
        bind(t, results[k])
    return ran, where


def bind(t: LazyTensor, data: DeviceData) -> None:
    """``t`` now holds ``data``."""
    t._ir = Value(data)
    t._placed = data.sharding
    t._held = True


_last_step_end = [None]
# What a captured step (compile_step) must notice while it traces: values read into Python,
# and programs run in the middle of the step.
EVENTS = {"host_reads": 0, "mark_steps": 0}


def mark_step() -> None:
    """Run everything the live lazy tensors are waiting for, as one program, and bind each
    tensor to its result. Tensors no longer alive are not computed."""
    start = time.perf_counter()
    EVENTS["mark_steps"] += 1
    if _last_step_end[0] is not None:
        # Host time between two steps: recording the step (and whatever else the loop does).
        _metrics.record("TraceTime", start - _last_step_end[0])
    tensors = [t for t in live() if _pending(t)]
    _rng.next_step()
    if tensors:
        with _metrics.timed("MarkStepTime"):
            _run(tensors)
    _last_step_end[0] = time.perf_counter()


def _torch_lazy_mark_step(device: str = "", wait: bool = False) -> None:
    """``torch._lazy.mark_step``: this package owns torch's ``lazy`` device, so torch's own
    helpers that sync it (``torch.testing``'s ``wrapper_set_seed``) run our step."""
    mark_step()
    if wait:
        wait_device_ops()


def _torch_lazy_wait_device_ops(devices=None) -> None:
    wait_device_ops()


torch._lazy.mark_step = _torch_lazy_mark_step
torch._lazy.wait_device_ops = _torch_lazy_wait_device_ops


def materialize(t: LazyTensor) -> DeviceData:
    """``t``'s data, running its pending graph (only its own) if it has one."""
    if _pending(t):
        _run([t])
    return t._ir.node


def to_torch(t) -> torch.Tensor:
    """An ordinary CPU torch tensor with ``t``'s value."""
    if not isinstance(t, LazyTensor):
        return t
    data = materialize(t)
    EVENTS["host_reads"] += 1
    _metrics.count("TransferToHost")
    host = fetch(data.handle)
    dtype = IR_TO_TORCH[data.shape.dtype]
    if dtype == torch.bfloat16:
        return torch.from_numpy(host.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(host)).to(dtype)


__all__ = ["ShardingSpec", "mark_step", "materialize", "to_torch"]
