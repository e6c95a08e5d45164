"""mark_step and materialization: turn pending lazy values into data."""

from __future__ import annotations

import os
import sys
import time

import jax
import numpy as np
import torch
import torch._lazy

from ir_core import DeviceData, Value, post_order
from ir_runtime import _debug, _metrics, _profile
from ir_runtime._collectives import references, wait_device_ops
from ir_runtime._data import fetch
from ir_runtime._execute import run_graph
from ir_runtime._frontend.recording import _fast, _rng
from ir_runtime._frontend.recording._convert import host_tensor
from ir_runtime._frontend.recording._tensor import LazyTensor, live
from ir_runtime._placement import spec_at
from ir_sharding import ShardingError


def pending(t: LazyTensor) -> bool:
    """Whether ``t`` waits for a program (its value is not data yet)."""
    return type(t._ir.node) is not DeviceData


def _pin(tensors):
    """Roots for ``tensors``, and where each result must land: its tensors' strongest claim
    (``LazyTensor._claim``), so the next step's graph is the same program."""
    roots, seen, pins, strength = [], {}, [], []
    for t in tensors:
        v = t._ir
        key = (id(v.node), v.index)
        k = seen.get(key)
        if k is None:
            k = seen[key] = len(roots)
            roots.append(v)
            pins.append(None)
            strength.append(0)
        claim, spec = t._claim()
        if claim > strength[k]:
            strength[k], pins[k] = claim, spec
    for k, v in enumerate(roots):
        if spec_at(v.node.sharding, v.index) is not None:
            pins[k] = None  # the node says it already
    return roots, seen, pins


# Whether steps donate buffers; IR_RUNTIME_DONATE=0 turns it off (torch_xla's
# XLA_ENABLE_PARAM_ALIASING=0), to compare or to rule it out.
DONATE = [os.environ.get("IR_RUNTIME_DONATE", "1") != "0"]


class Donor:
    """Which parameters of a step's graph give their buffers to its results (XLA then writes
    the new values in place, as torch_xla aliases a parameter to its update): those whose data
    nothing can read once the step has run. The step rebinds every tensor it computes, so its
    old data is left to whatever else holds it: a live tensor still holding that data (a
    detached copy, a tensor the step only reads, a batch), a live pending tensor the step does
    not compute whose graph reads it (``held``, by node), or anyone holding the array itself
    (``private``). Host data is placed afresh each step, so its device copy is the program's
    own, except a scalar's: placed once and reused (``_execute.place``). A callable for
    ``run_graph``'s ``donate``; only what a result can take over is donated (``_cache``)."""

    __slots__ = ("held", "only", "replaces")

    def __init__(self, held: set, only=None, replaces=None):
        self.held = held  # ids of the DeviceData nodes something still reads
        self.only = only  # None, or the ids of the nodes that may be donated at all
        # id of the data a tensor held -> the root of its new value: which result is to take
        # over which buffer (_cache pairs them; a wrong pair costs XLA a copy)
        self.replaces = replaces or {}

    def __call__(self, p: DeviceData) -> bool:
        pid = id(p)
        if pid in self.held or (self.only is not None and pid not in self.only):
            return False
        if isinstance(p.handle, jax.Array):
            return private(p)
        return isinstance(p.handle, np.ndarray) and p.handle.ndim > 0


def private(p: DeviceData) -> bool:
    """Whether only the node ``p`` holds its array (besides the runtime's own note of the last
    program's result): no one else could read it once donated."""
    # getrefcount's count: the node's handle, and getrefcount's own argument.
    return sys.getrefcount(p.handle) - 2 == references(p.handle)


def run(tensors, held: set, only=None):
    """Run the graph of ``tensors`` and bind each to its result, donating what ``Donor(held,
    only)`` allows; returns ``run_graph``'s ``(results, executable, graph, arrays)`` and each
    tensor's root index."""
    roots, position, pins = _pin(tensors)
    where = [position[(id(t._ir.node), t._ir.index)] for t in tensors]
    donate = ()
    if DONATE[0]:
        replaces = {t._held: k for t, k in zip(tensors, where, strict=True) if t._held}
        donate = Donor(held, only, replaces)
    ran = run_graph(roots, donate=donate, out_shardings=pins)
    results = ran[0]
    for t, k in zip(tensors, where, strict=True):
        t._bind(results[k])
    return ran, where


_last_step_end = [None]
# What a captured step (compile_step) must notice while it traces: values read into Python,
# and programs run in the middle of the step.
EVENTS = {"host_reads": 0, "mark_steps": 0}


# The bodies being traced on placeholders (a manual region, a scanned layer), innermost last,
# as "shard_map: fn": what they record reads placeholders, which have no data to read, and is
# not registered as live.
REGIONS: list = []


class Isolated:
    """A context for tracing ``name`` (``"shard_map: fn"``) on placeholders: the tensors it
    creates are not live (no step computes them, whatever keeps them), and a live tensor from
    outside that it writes in place gets its value back, and is named in ``written`` (shape,
    dtype) for the caller's error. Host reads and ``mark_step`` inside raise."""

    def __init__(self, name: str):
        self.name = name
        self.written: list = []

    def __enter__(self):
        self.before = [(t, t._ir) for t in live()]
        REGIONS.append(self.name)
        _fast.untracked(True)
        return self

    def __exit__(self, *exc):
        _fast.untracked(False)
        REGIONS.pop()
        for t, value in self.before:
            if t._ir is not value:
                t._ir = value
                self.written.append(f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}")
        self.before = None
        return False


def free_inputs(roots, placeholders, foreign):
    """The data a body traced on ``placeholders`` reads besides them: ``(nodes, their Values,
    the index among them of the step's random key or None)``. Only lifted scalars and the key
    may be read; any other data node is refused with ``foreign(shape)``, an exception."""
    mine = {id(p) for p in placeholders}
    key = _rng._state["key"]
    free, values, key_at = [], [], None
    for n in post_order(roots):
        if type(n) is not DeviceData or id(n) in mine:
            continue
        if key is not None and n is key.node:
            key_at = len(free)
        elif not (n.shape.dims == () and isinstance(n.handle, np.ndarray)):  # a lifted scalar
            raise foreign(n.shape)
        free.append(n)
        values.append(Value(n))
    return free, values, key_at


def no_region(what: str) -> None:
    if REGIONS:
        raise ShardingError(
            f"{REGIONS[-1]} {what}; it is traced once, on placeholders, and must stay on the device"
        )


def mark_step() -> None:
    """Run everything the live lazy tensors are waiting for, as one program, and bind each
    tensor to its result. Tensors no longer alive are not computed."""
    no_region("calls mark_step")
    start = time.perf_counter()
    _profile.step_started()
    EVENTS["mark_steps"] += 1
    if _last_step_end[0] is not None:
        # Host time between two steps: recording the step (and whatever else the loop does).
        _metrics.record("TraceTime", start - _last_step_end[0])
    tensors, held = split_live()
    _rng.next_step()
    if tensors:
        with _metrics.timed("MarkStepTime"), _profile.span("ir_runtime.mark_step"):
            run(tensors, held)
    _last_step_end[0] = time.perf_counter()
    _profile.step_ended()


def materialize(t: LazyTensor) -> DeviceData:
    """``t``'s data. If it is pending, its graph runs together with every live pending tensor
    whose graph shares a node with it: those values are computed by the same program at little
    cost, and no later read or step runs that history again (a decoding loop that reads a
    stopping flag per token runs one token's program per read, not everything so far)."""
    no_region("reads a value to the host (.item(), a Python if on a tensor)")
    if pending(t):
        busy, held = split_live()
        tensors = _sharing(t, busy)
        _metrics.count("HostRead")
        _metrics.count("HostReadTensors", len(tensors))
        if _debug.DEBUG[0]:
            _debug.host_read(_debug._shape_text(t._ir.shape), _fast.origin(), len(tensors))
        if len(tensors) < len(busy):  # what the others will still read is not donated
            chosen = {id(u) for u in tensors}
            rest = [u._ir for u in busy if id(u) not in chosen]
            held.update(id(n) for n in post_order(rest) if type(n) is DeviceData)
        run(tensors, held)
    return t._ir.node


def split_live() -> tuple[list, set]:
    """The live pending tensors, oldest first, and the ids of the data the others hold."""
    busy, held = [], set()
    for t in live():
        n = t._ir.node
        if type(n) is DeviceData:
            held.add(id(n))
        else:
            busy.append(t)
    return busy, held


def _sharing(t: LazyTensor, busy: list) -> list:
    """``t`` and those of the live pending tensors ``busy`` whose graphs share a computed node
    with ``t``'s, oldest first (as mark_step orders them)."""
    if len(busy) == 1:
        return busy
    # Shared computed nodes only: data leaves (parameters, the random key, lifted scalars, one
    # per value) are shared by everything that uses them, and computing that is not the point.
    mine = {id(n) for n in post_order([t._ir]) if type(n) is not DeviceData}
    touches: dict = {}
    for n in post_order([u._ir for u in busy]):
        nid = id(n)
        touches[nid] = type(n) is not DeviceData and (
            nid in mine or any(touches[id(v.node)] for v in n.operands)
        )
    return [u for u in busy if u is t or touches[id(u._ir.node)]]


def to_torch(t) -> torch.Tensor:
    """An ordinary CPU torch tensor with ``t``'s value."""
    if not isinstance(t, LazyTensor):
        return t
    data = materialize(t)
    EVENTS["host_reads"] += 1
    _metrics.count("TransferToHost")
    return host_tensor(fetch(data.handle), data.shape.dtype)


def _torch_lazy_mark_step(device: str = "", wait: bool = False) -> None:
    """``torch._lazy.mark_step``: this package owns torch's ``lazy`` device, so torch's own
    helpers that sync it (``torch.testing``'s ``wrapper_set_seed``) run our step."""
    mark_step()
    if wait:
        wait_device_ops()


def _torch_lazy_wait_device_ops(devices=None) -> None:
    wait_device_ops()


def install() -> None:
    """torch's ``torch._lazy.mark_step`` and ``wait_device_ops`` run this package's."""
    torch._lazy.mark_step = _torch_lazy_mark_step
    torch._lazy.wait_device_ops = _torch_lazy_wait_device_ops
