"""A compiled step's plan: one traced call, as a replay runs it again without its Python.

Where each program input comes from (an argument, a tensor's current data, a constant, the
random key), what each result binds to (a returned tensor, a tensor's new data, a ``.grad``, a
lazy argument), and the guard table a replay checks first (``_guards``). Also the argument and
result trees (nested tuples, lists, dicts and named tuples of tensors and values).
"""

from __future__ import annotations

import functools
from math import copysign

import jax
import numpy as np
import torch

from ir_core import DeviceData
from ir_runtime import _metrics, _runtime_checks
from ir_runtime._data import fetch, put
from ir_runtime._debug import spec_text
from ir_runtime._frontend.recording._convert import host_numpy, host_tensor, shape_of
from ir_runtime._frontend.steps import _hot, _step
from ir_runtime._frontend.steps._guards import (
    GradGuard,
    GradReadGuard,
    UnsetGradGuard,
    array_bytes,
    first_failure,
    tensor_name,
)
from ir_runtime._frontend.steps._hot import (
    ARG,
    GRAD,
    HOSTREAD,
    HYPER,
    OUT,
    PGRAD,
    STATE,
    alive,
)

# ---------------------------------------------------------------------------------------------
# Arguments and results: nested tuples, lists, dicts and named tuples of tensors and values.


def flatten(x, leaves: list):
    """Append ``x``'s leaves to ``leaves``; return its structure (hashable)."""
    t = type(x)
    if t is tuple or t is list:
        return (t, tuple(flatten(v, leaves) for v in x))
    if t is dict:
        return (dict, tuple(x), tuple(flatten(v, leaves) for v in x.values()))
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return (t, tuple(flatten(v, leaves) for v in x))
    leaves.append(x)
    return None


@functools.cache
def flat(n: int):
    """``flatten``'s structure of ``(args, {})`` for ``n`` leaves."""
    return flatten(((None,) * n, {}), [])


def unflatten(structure, leaves):
    if structure is None:  # one leaf (a step's usual return: its loss)
        return leaves[0]
    it = iter(leaves)

    def build(s):
        if s is None:
            return next(it)
        kind = s[0]
        if kind is dict:
            return {k: build(v) for k, v in zip(s[1], s[2], strict=True)}
        items = [build(v) for v in s[1]]
        if kind is tuple or kind is list:
            return kind(items)
        return kind(*items)  # a named tuple

    return build(structure)


# ---------------------------------------------------------------------------------------------
# What a replay reads and writes.

_GRAD_GUARDS = (GradGuard, UnsetGradGuard, GradReadGuard)
# Where a parameter's data comes from (defined in ``_hot``, compared by identity): ARG an
# argument, STATE a tensor's current data, CONST an array, RNG the random key.
# HOSTREAD: a host tensor the program reads, alive after the call and read by nothing but the
# program (a learning rate a scheduler fills in place): placed from its memory at every replay.
# HYPER: a number among an optimizer's hyperparameters, lent to its step (``_lend``): placed as
# the optimizer's group holds it at every replay, as ``(optimizer reference, group index, key,
# index in a tuple or None, dtype)``.
# PGRAD: the current ``.grad`` of a tensor, whichever tensor that is then: read as a parameter,
# or written in place as a result (``p.grad`` accumulated into, or zeroed).
# What a result binds to, besides STATE, ARG, PGRAD: OUT a returned tensor, GRAD a new ``.grad``
# of a tensor, HOST a host argument the step wrote in place, DROP nothing.


class Miss:
    """A replay's answer when a guard fails: the call is traced instead."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why  # the failed guard's reason, in a line


def value_bytes(h) -> bytes:
    """A constant's value, to compare two recordings of a step."""
    return array_bytes(fetch(h) if isinstance(h, jax.Array) else np.asarray(h))


def _unreadable(kind, x, node, shape) -> str:
    """Why a replay cannot read a program parameter's data from the tensor it comes from."""
    if kind is ARG:
        what = f"argument {x}"
    elif kind is PGRAD:
        what = f"p.grad of {tensor_name(shape.dims, shape.dtype)} that the step reads"
    elif kind is HOSTREAD:
        what = f"host {tensor_name(shape.dims, shape.dtype)} that the step reads"
    else:
        what = f"{tensor_name(shape.dims, shape.dtype)} that the step reads"
    if node is None:
        return f"{what} was freed (every tensor holding its data)"
    if kind is HOSTREAD:
        return f"{what} is now {tensor_name(node.dims, node.dtype)}"
    if type(node) is not DeviceData:
        return f"{what} holds pending work (it changed since the last mark_step)"
    return f"{what} holds {node.shape} data, traced as {shape}"


def _moved(kind, x, shape, now, traced) -> str:
    """Why a replay cannot read data placed otherwise than the traced call read it: the
    program's input placement is part of it, and placing the data back would undo the user's
    new placement."""
    what = f"argument {x}" if kind is ARG else f"{tensor_name(shape.dims, shape.dtype)}"
    if kind is PGRAD:
        what = f"p.grad {what}"

    def text(spec):
        return "no placement" if spec is None else spec_text(spec)

    return (
        f"{what} is placed {text(now)}, traced as {text(traced)}: traced again for its new "
        f"placement"
    )


class Replay:
    """One traced call of a step, as a replay would run it."""

    def __init__(self):
        self.reasons: list[str] = []
        self.exe = None
        # Per program parameter: (kind, tensor refs / argument index / array / None).
        self.sources: list = []
        self.shapes: list = []  # per parameter: the data's Shape
        # Per parameter: the placement its data had as the call was traced (an argument's, as
        # the call began); a replay reads data placed so, or traces again (``_moved``).
        self.specs: list = []
        self.const_bytes: list = []  # per CONST parameter: its value
        self.bindings: list = []  # (kind, tensor ref / arg or output index, root index)
        self.cleared: list = []  # refs to the tensors whose .grad the call set to None
        self.structure = None  # the return value's structure
        self.statics: list = []  # the return value's leaves; None where a tensor goes
        self.reseed: int | None = None  # the seed the call gave torch.manual_seed last
        # refs to the learning-rate schedulers the call stepped (after its optimizers read
        # their rates): a replay steps them again once the program has run
        self.schedulers: list = []
        self.watched = True  # whether its effects outside the program were looked for
        self.effects: list[str] = []  # those found, among its reasons
        self.guards: tuple = ()  # what a replay checks first, top to bottom (see _guards)
        self.checks: tuple = ()  # the same, as a replay runs it: as_runs(guards)
        # sources and bindings zipped with what the executable says of each, on first replay
        self._reads: tuple | None = None
        self._writes: tuple | None = None
        self._numbers: dict = {}  # per HYPER parameter: (the number, its array) last placed

    def same_as(self, other: Replay, grads: bool = True) -> bool:
        """Whether two traced calls did the same thing: the condition for replaying ``other``,
        the later, which must have been watched for effects outside its program."""
        if self.reasons or other.reasons or not other.watched or self.exe is not other.exe:
            return False
        if self.structure != other.structure or self.statics != other.statics:
            return False
        if self.reseed != other.reseed:
            return False
        if [r() for r in self.schedulers] != [r() for r in other.schedulers]:
            return False
        if self.const_bytes != other.const_bytes or len(self.sources) != len(other.sources):
            return False
        for (k1, x1), (k2, x2) in zip(self.sources, other.sources, strict=True):
            if (
                k1 != k2
                or (k1 == STATE and alive(x1) is not alive(x2))
                or ((k1 == PGRAD or k1 == HOSTREAD) and x1() is not x2())
                or (k1 == HYPER and (x1[0]() is not x2[0]() or x1[1:] != x2[1:]))
                or (k1 == ARG and x1 != x2)
            ):
                return False
        if len(self.bindings) != len(other.bindings):
            return False
        for (k1, x1, r1), (k2, x2, r2) in zip(self.bindings, other.bindings, strict=True):
            if k1 != k2 or r1 != r2:
                return False
            if (k1 == STATE or k1 == GRAD or k1 == PGRAD) and x1() is not x2():
                return False
            if (k1 == ARG or k1 == OUT) and x1 != x2:
                return False
        if [r() for r in self.cleared] != [r() for r in other.cleared]:
            return False
        # The same program can need p.grad None (a step that makes it) or set (one that
        # accumulates into it): two plans, each replayed when its own guards hold. ``grads``
        # False: equal all the same (``other``, replayed, has its own guards).
        return not grads or _grad_facts(self.guards) == _grad_facts(other.guards)

    # ``replay(leaves, nodes)``: run the step on the current data, or a ``Miss`` when a guard
    # says to trace it (``_hot``: the guards, then ``_read_table``'s inputs read from the
    # tensors' current data, the program, and ``_write_table``'s results bound).
    replay = _hot.replay

    def _read_table(self) -> tuple:
        """Where each program parameter is read from, zipped with what the executable says of
        it (its sharding, whether donated), made on the first replay. Pending work on a tensor
        it reads (``zero_grad(set_to_none=False)`` or ``w.clamp_()`` outside the step) is run
        first, by one ``mark_step``, as a traced call would run it (``_hot.read_inputs``)."""
        if self._reads is None:
            donated = set(self.exe.donate)
            carried = self._carried()
            self._reads = tuple(
                (kind, x, shape, carried.get(k, sharding), k in donated, spec)
                for k, ((kind, x), shape, sharding, spec) in enumerate(
                    zip(self.sources, self.shapes, self.exe.in_shardings, self.specs, strict=True)
                )
            )
        return self._reads

    def _write_table(self) -> tuple:
        """Where each result binds, zipped with a data node of its shape and placement that
        holds nothing (each replay's result node is one ``holding`` its array: no hash computed
        again), made on the first replay (``_hot.bind``)."""
        if self._writes is None:
            exe = self.exe
            # A result's placement as the very object a parameter was read with, where one is
            # alike in every respect (placement, mesh, axis names, kind): the next replay then
            # compares the result it feeds by identity.
            reads: dict = {}  # placement -> the distinct specs read with it
            for read in self.specs:
                if read is not None and not any(r is read for r in reads.get(read, ())):
                    reads.setdefault(read, []).append(read)
            self._writes = tuple(
                (kind, x, DeviceData(exe.out_shapes[k], None, _alike(exe.out_specs[k], reads)), k)
                for kind, x, k in self.bindings
            )
        return self._writes

    def _checked(self, exe, arrays: list, leaves):
        """The replay of a checked program: a failed check comes once the results are bound."""
        with _runtime_checks.deferred():
            outputs = _hot.bind(self, self._write_table(), _hot.launch(exe, arrays), leaves)
        return unflatten(self.structure, outputs)

    def _carried(self) -> dict:
        """Parameter -> the sharding object its array will carry, where the step rebinds the
        tensor it reads (weights, optimizer state): the next replay reads this program's own
        result, whose array carries that result's output sharding, an object equal to the
        parameter's but not it (jax makes one per result). Comparing by identity then runs no
        Python; any other array is compared by value, as before."""
        exe, wrote, out = self.exe, {}, {}
        for kind, x, k in self.bindings:
            t = x() if kind is STATE else None
            if t is not None:
                wrote[id(t)] = k
        for i, ((kind, x), sharding) in enumerate(zip(self.sources, exe.in_shardings, strict=True)):
            t = alive(x) if kind is STATE else None
            k = None if t is None else wrote.get(id(t))
            if k is not None and exe.result_shardings[k] == sharding:
                out[i] = exe.result_shardings[k]
        return out

    def _read_host(self, kind, x, shape, sharding, k: int):
        """Parameter ``k``, read from the host at every replay: a host tensor's value now, as
        eager reads it (HOSTREAD), or a number an optimizer's group holds (HYPER)."""
        if kind is HYPER:  # (its optimizer's guard saw the group, and a number there)
            return self._number(k, x, sharding)
        t = x()
        if t is None or shape_of(t) != shape:
            return Miss(_unreadable(kind, x, None if t is None else shape_of(t), shape))
        _metrics.count("TransferToDevice")
        return put(host_numpy(t), sharding)

    def _number(self, k: int, where, sharding):
        """Parameter ``k``: the number ``where`` names in its optimizer's group now, placed
        (again only when it changed: a constant rate costs no transfer)."""
        ref, gi, key, j, dtype = where
        v = ref().param_groups[gi][key]
        if j is not None:
            v = v[j]
        last = self._numbers.get(k)
        if last is not None and last[0] == v and copysign(1.0, last[0]) == copysign(1.0, v):
            return last[1]
        _metrics.count("TransferToDevice")
        array = put(np.asarray(v, dtype), sharding)
        self._numbers[k] = (v, array)
        return array


def _alike(spec, reads: dict):
    """The spec among ``reads`` (placement -> specs) alike ``spec`` in every respect, else
    ``spec``. (Equal placements can differ in mesh axis names, which users read.)"""
    for read in reads.get(spec, ()):
        if (
            read.mesh == spec.mesh
            and read.partition_spec == spec.partition_spec
            and read.kind is spec.kind
            and read.device_id == spec.device_id
        ):
            return read
    return spec


def _grad_facts(guards) -> list:
    """What a plan's guards require of gradients: (kind, tensor, whether None)."""
    return [(type(g), g.packed()) for g in guards if type(g) in _GRAD_GUARDS]


def write_host(t: torch.Tensor, data: DeviceData) -> None:
    """Copy a program result into the host tensor ``t`` (a host argument the step wrote in
    place, as eager writes it)."""
    _metrics.count("TransferToHost")
    with torch.no_grad():
        t.copy_(host_tensor(fetch(data.handle), data.shape.dtype))


_hot.configure(
    miss_=Miss,
    unreadable_=_unreadable,
    moved_=_moved,
    read_host_=Replay._read_host,
    write_host_=write_host,
    first_failure_=first_failure,
    unflatten_=unflatten,
    flat_=flat,
    steps_=_step,
)
