"""mark_step and materialization: turn pending lazy values into data."""

from __future__ import annotations

import time
import weakref

import numpy as np
import torch
import torch._lazy

from ir_core import DeviceData, Value, post_order
from ir_runtime import _debug, _donation, _metrics, _profile, _runtime_checks
from ir_runtime._cache import CACHE
from ir_runtime._collectives import wait_device_ops
from ir_runtime._data import fetch
from ir_runtime._errors import ProgramCheckError
from ir_runtime._execute import run_graph
from ir_runtime._frontend.recording import _device_orders, _fast, _rng
from ir_runtime._frontend.recording._convert import host_tensor
from ir_runtime._frontend.recording._tensor import LazyTensor, live
from ir_sharding import ShardingError

_ref = weakref.ref


def data_read(values) -> set:
    """The ids of the data nodes the graphs of ``values`` read: what a program computing other
    tensors must not donate."""
    return {id(n) for n in post_order(values) if type(n) is DeviceData}


def pending(t: LazyTensor) -> bool:
    """Whether ``t`` waits for a program (its value is not data yet)."""
    return type(t._ir.node) is not DeviceData


def _pin(tensors):
    """Roots for ``tensors``, and where each result must land: its tensors' strongest claim
    (``LazyTensor._claim``), so the next step's graph is the same program. A root's own
    annotation comes first (``_graph.Graph.out_specs``)."""
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
    return roots, seen, pins


def _prepare(tensors, held: set, only=None):
    """``(roots, each tensor's root index, what to donate, where each root lands)`` for a
    program computing ``tensors``."""
    roots, position, pins = _pin(tensors)
    where = [position[(id(t._ir.node), t._ir.index)] for t in tensors]
    donate = ()
    if _donation.ENABLED[0]:
        replaces = {t._held: k for t, k in zip(tensors, where, strict=True) if t._held}
        donate = _donation.Donor(held, only, replaces)
    return roots, where, donate, pins


def run(tensors, held: set, only=None):
    """Run the graph of ``tensors`` and bind each to its result, donating what
    ``_donation.Donor(held, only)`` allows; returns ``run_graph``'s ``(results, executable,
    graph, arrays)`` and each tensor's root index."""
    roots, where, donate, pins = _prepare(tensors, held, only)
    values = [t._ir for t in tensors]
    ran = run_graph(roots, donate=donate, out_shardings=pins)
    results = ran[0]
    for t, k, value in zip(tensors, where, values, strict=True):
        # A tensor written while its program was made and ran (another thread: a loader's
        # .to(device) is torch's empty() then copy_, and a step can take the empty() as a
        # root between the two) keeps what was written: the result is of its old value.
        if t._ir is value:
            t._bind(results[k])
    _rng.rebase()  # later draws start a new key: the next graph's offsets begin at 0
    return ran, where


_last_step_end = [None]
# What a traced body must notice happened while it ran (``watch``): values read into Python,
# and mark_steps run. Counted here, and only here.
_EVENTS = {"host_reads": 0, "mark_steps": 0}


class watch:
    """A context that counts what happens while it is open: ``host_reads`` (values read to
    the host) and ``mark_steps``. Each is the count since the context was entered, up to its
    exit once it has exited."""

    __slots__ = ("_end", "_start")

    def __enter__(self):
        self._start = dict(_EVENTS)
        self._end = None
        return self

    def __exit__(self, *exc):
        self._end = dict(_EVENTS)
        return False

    def _since(self, kind: str) -> int:
        return (self._end or _EVENTS)[kind] - self._start[kind]

    @property
    def host_reads(self) -> int:
        return self._since("host_reads")

    @property
    def mark_steps(self) -> int:
        return self._since("mark_steps")


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
        self.before = [(t, t._ir, t._held) for t in live()]
        REGIONS.append(self.name)
        _fast.untracked(True)
        return self

    def __exit__(self, *exc):
        _fast.untracked(False)
        REGIONS.pop()
        for t, value, held in self.before:
            if t._ir is not value:
                t._restore(value, held)
                self.written.append(f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}")
        self.before = None
        return False


def free_inputs(roots, placeholders, foreign):
    """The data a body traced on ``placeholders`` reads besides them: ``(nodes, their Values,
    the index among them of the step's random key or None)``. Only lifted scalars and the key
    may be read; any other data node is refused with ``foreign(shape)``, an exception."""
    mine = {id(p) for p in placeholders}
    key = _rng.current_key()
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


# Tensors whose program failed before it bound anything: id -> (a weak reference to the
# tensor, the value it failed with). While a tensor keeps that value, steps leave it out, so
# that a later step with other work does not fail for it again; reading it runs it alone.
SET_ASIDE: dict = {}


def _set_aside(t: LazyTensor) -> bool:
    entry = SET_ASIDE.get(id(t))
    if entry is None:
        return False
    if entry[0]() is t and entry[1] is t._ir:
        return True
    del SET_ASIDE[id(t)]  # written since (or a new tensor where a dead one was)
    return False


def _components(tensors) -> list[list]:
    """``tensors`` grouped by the computed nodes their graphs share (data leaves do not
    join them), oldest first: the programs they could run as separately."""
    parent: dict = {}

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for n in post_order([t._ir for t in tensors]):
        if type(n) is DeviceData:
            continue
        nid = parent[id(n)] = id(n)
        for v in n.operands:
            if type(v.node) is not DeviceData:
                a, b = find(id(v.node)), find(nid)
                if a != b:
                    parent[a] = b
    groups: dict = {}
    for t in tensors:
        groups.setdefault(find(id(t._ir.node)), []).append(t)
    return list(groups.values())


def _run_or_set_aside(tensors, held: set) -> None:
    """``run``; when its program cannot be made or run, set aside the tensors it fails for
    (``SET_ASIDE``), named in a note on the error, before raising it.

    Those are found by compiling the step again, a group of tensors (``_components``) at a
    time, oldest first, each added to those that fit: a group whose program fails alone, or
    that makes the groups before it fail, is set aside. When every group fits (the program
    failed when it ran), every tensor of the step is."""
    try:
        with _runtime_checks.deferred():  # a failed program check comes once results are bound
            run(tensors, held)
    except ProgramCheckError:
        raise  # (the step ran and bound its results: nothing to set aside)
    except Exception as e:
        tensors = [t for t in tensors if pending(t)]  # (none is bound, unless a bind failed)
        groups = _components(tensors)
        failing, fits = [], []
        for group in groups if len(groups) > 1 else ():
            trial = fits + group
            chosen = {id(t) for t in trial}
            rest = [u._ir for u in tensors if id(u) not in chosen]
            keep = held | data_read(rest)
            roots, _, donate, pins = _prepare(trial, keep)
            try:
                CACHE.get(roots, donate, pins)
            except Exception:  # (whatever failed the step)
                failing += group
            else:
                fits = trial
        failing = failing or tensors
        for t in failing:
            SET_ASIDE[id(t)] = (_ref(t), t._ir)
        names = ", ".join(_name(t) for t in failing[:8])
        more = f" and {len(failing) - 8} more" if len(failing) > 8 else ""
        e.add_note(
            f"ir_runtime: {len(failing)} tensor(s) set aside: {names}{more}. Each keeps its "
            f"pending value; later steps leave it out until it is written, and reading it "
            f"runs it alone (raising this again if it still cannot run)"
        )
        raise


def _by_device_order(tensors) -> list[list]:
    """``tensors`` grouped by the device order of their meshes (``_device_orders``), each in
    creation order: one program each, since no op combines two. Tensors over no mesh join the
    first group."""
    keys = []
    for t in tensors:
        mesh = _device_orders.mesh_of(t)
        keys.append(None if mesh is None else mesh.device_ids)
    orders = [k for k in dict.fromkeys(keys) if k is not None]
    if len(orders) <= 1:
        return [tensors]
    groups: dict = {k: [] for k in orders}
    for t, k in zip(tensors, keys, strict=True):
        groups[orders[0] if k is None else k].append(t)
    return list(groups.values())


def _name(t: LazyTensor) -> str:
    node = t._ir.node
    origin = node.origin
    at = f" at {origin}" if origin is not None else ""
    return f"{t._ir.shape} from {node.op}{at}"


def mark_step() -> None:
    """Run everything the live lazy tensors are waiting for, as one program, and bind each
    tensor to its result. Tensors no longer alive are not computed."""
    no_region("calls mark_step")
    start = time.perf_counter()
    _profile.step_started()
    _EVENTS["mark_steps"] += 1
    if _last_step_end[0] is not None:
        # Host time between two steps: recording the step (and whatever else the loop does).
        _metrics.record("TraceTime", start - _last_step_end[0])
    tensors, held = split_live()
    _rng.next_step()
    if tensors:
        with _metrics.timed("MarkStepTime"), _profile.span("ir_runtime.mark_step"):
            groups = _by_device_order(tensors) if _fast.checking_devices() else [tensors]
            failed = None
            for group in groups:
                keep = held
                if len(groups) > 1:  # what the other programs read is not donated
                    others = [u._ir for g in groups if g is not group for u in g]
                    keep = held | data_read(others)
                try:
                    _run_or_set_aside(group, keep)
                except Exception as e:
                    failed = failed or e
            if failed is not None:
                try:
                    raise failed
                finally:
                    failed = None  # (kept, this frame and the error would form a cycle)
    _last_step_end[0] = time.perf_counter()
    _profile.step_ended()


def read_besides(tensors, busy: list) -> set:
    """The data that the live pending tensors ``busy`` read, but for ``tensors``: what a
    program of ``tensors`` alone must not donate."""
    chosen = {id(u) for u in tensors}
    return data_read([u._ir for u in busy if id(u) not in chosen])


def materialize(t: LazyTensor) -> DeviceData:
    """``t``'s data. If it is pending, its graph runs together with every live pending tensor
    whose graph shares a node with it: those values are computed by the same program at little
    cost, and no later read or step runs that history again (a decoding loop that reads a
    stopping flag per token runs one token's program per read, not everything so far)."""
    no_region("reads a value to the host (.item(), a Python if on a tensor)")
    if pending(t):
        if EAGER_REGIONS[0] is not None:
            EAGER_REGIONS[0][1](t)
        busy, held = split_live()
        tensors = [t] if SET_ASIDE and _set_aside(t) else _sharing(t, busy)
        _metrics.count("HostRead")
        _metrics.count("HostReadTensors", len(tensors))
        if _debug.DEBUG[0]:
            _debug.host_read(_debug.shape_text(t._ir.shape), _fast.origin(), len(tensors))
        if len(tensors) < len(busy):  # what the others will still read is not donated
            held |= read_besides(tensors, busy)
        _run_or_set_aside(tensors, held)
    return t._ir.node


# Once an eager manual region has been opened (``regions._eager``): (split, check_readable),
# which keep a step from computing, and a read from reading, a tensor inside an open region.
EAGER_REGIONS: list = [None]


def split_live() -> tuple[list, set]:
    """The live pending tensors, oldest first (but those set aside, and those inside an open
    eager manual region), and the ids of the data the others hold or read (a tensor left out
    still needs what its value reads)."""
    busy, held = [], set()
    aside = []
    for t in live():
        n = t._ir.node
        if type(n) is DeviceData:
            held.add(id(n))
            if SET_ASIDE:
                SET_ASIDE.pop(id(t), None)  # it holds data again (.data =, a restore)
        elif SET_ASIDE and _set_aside(t):
            aside.append(t._ir)
        else:
            busy.append(t)
    if EAGER_REGIONS[0] is not None:
        busy, manual = EAGER_REGIONS[0][0](busy)
        aside += [t._ir for t in manual]
    if SET_ASIDE:
        for k in [k for k, (ref, _) in SET_ASIDE.items() if ref() is None]:
            del SET_ASIDE[k]
    if aside:
        held |= data_read(aside)
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


def host_read_count() -> int:
    """How many values have been read to the host so far."""
    return _EVENTS["host_reads"]


# The hyperparameters lent to an optimizer's step while a compiled step is traced
# (``_lend.Lending``), whose values Python may read without reading the step's data.
LENT: list = [None]


def to_torch(t) -> torch.Tensor:
    """An ordinary CPU torch tensor with ``t``'s value."""
    if not isinstance(t, LazyTensor):
        return t
    if LENT[0] is not None:
        value = LENT[0].free(t)
        if value is not None:  # made of lent numbers alone: not a read of the step's data
            return host_tensor(value, t._ir.shape.dtype)
    data = materialize(t)
    _EVENTS["host_reads"] += 1
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
