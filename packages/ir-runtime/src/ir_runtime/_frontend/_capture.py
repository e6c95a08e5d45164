"""``compile_step``: a training step traced like any other, then replayed without its Python.

Tracing a step runs torch's dispatcher, autograd engine and optimizer for every op, every step:
on a small model that costs more than the program it records. A compiled step is traced on its
first calls exactly as ``mark_step`` would run it; once two consecutive calls record the same
program, read the same tensors and bind their results to the same tensors, later calls skip the
function and run the compiled program on the tensors' current data, as ``jax.jit`` does.

What a replay checks before it runs (and traces again when any differs): the arguments' shapes,
dtypes and structure, Python arguments by value, grad mode, every optimizer the step stepped
(hyperparameters, state table, parameter lists), every module it called (its ``training`` flag,
which parameters, buffers and submodules it has, which parameters require grad), whether the
tensors the program reads still require grad and are still the ``.grad`` they were read as,
host tensors the program read (or their view's base), and that every tensor it reads still
exists and holds data. Anything else the function reads from Python (a global, a closure) is
frozen at capture, as in ``jax.jit``: pass it as an argument. Its Python side effects happen on
traced calls only.

A step is never replayed (it stays traced every call, with a ``CaptureWarning`` saying why) when
its recording shows Python work a replay could not reproduce: it reads values to the host,
calls ``mark_step``, keeps a tensor it made outside its return value, rebinds a tensor to new
data without computing it, takes arguments that share data or a lazy argument that requires
grad, or feeds the program values made in Python that change from call to call (Adam's bias
corrections, computed from its CPU step count).
"""

from __future__ import annotations

import functools
import gc
import warnings
import weakref

import jax
import numpy as np
import torch
import torch.nn.modules.module as _module
import torch.optim.optimizer as _optimizer

from ir_core import DeviceData, Value
from ir_runtime import _metrics
from ir_runtime._compile import _place
from ir_runtime._data import fetch, put
from ir_runtime._frontend import _rng, _step, _tensor
from ir_runtime._frontend._api import to_lazy
from ir_runtime._frontend._step import _pending
from ir_runtime._frontend._tensor import LazyTensor, live, wrap

_ref = weakref.ref


class CaptureWarning(UserWarning):
    """A compiled step cannot be replayed, so every call traces it; the message says why."""


# ---------------------------------------------------------------------------------------------
# Arguments and results: nested tuples, lists, dicts and named tuples of tensors and values.


def _flatten(x, leaves: list):
    """Append ``x``'s leaves to ``leaves``; return its structure (hashable)."""
    t = type(x)
    if t is tuple or t is list:
        return (t, tuple(_flatten(v, leaves) for v in x))
    if t is dict:
        return (dict, tuple(x), tuple(_flatten(v, leaves) for v in x.values()))
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return (t, tuple(_flatten(v, leaves) for v in x))
    leaves.append(x)
    return None


@functools.cache
def _flat(n: int):
    """``_flatten``'s structure of ``(args, {})`` for ``n`` leaves."""
    return _flatten(((None,) * n, {}), [])


def _unflatten(structure, leaves):
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


def _leaf_key(k: int, x):
    if isinstance(x, torch.Tensor):
        return (type(x) is LazyTensor, tuple(x.shape), x.dtype, x.requires_grad)
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"argument leaf {k} of a compiled step is a {type(x).__name__}, which is neither a "
            f"tensor nor hashable; a compiled step's Python arguments are part of its key "
            f"(pass tensors, numbers, strings, or tuples, lists and dicts of them)"
        ) from None
    return (type(x), x)


# ---------------------------------------------------------------------------------------------
# What a replay reads and writes.

_ARG, _STATE, _CONST, _RNG = "arg", "state", "const", "rng"  # where a parameter's data comes from
_MISS = object()  # a replay's answer when a guard fails
_OUT, _GRAD, _DROP = "out", "grad", "drop"  # what a result binds to, besides _STATE, _ARG


def _hyper(opt) -> tuple:
    """An optimizer's hyperparameters, as a replay compares them: host tensors (a learning rate
    a scheduler fills in place) by value, lazy ones by identity (the program reads those)."""
    return tuple(
        tuple(
            (k, _tensor_key(v) if isinstance(v, torch.Tensor) else v)
            for k, v in group.items()
            if k != "params"
        )
        for group in opt.param_groups
    )


def _tensor_key(v: torch.Tensor):
    if isinstance(v, LazyTensor):
        return ("lazy", id(v))
    return ("host", v.dtype, tuple(v.shape), v.detach().cpu().flatten().tolist())


def _module_state(m) -> tuple:
    """What a replay checks of a module the step called: its mode, which parameters, buffers
    and submodules it has (weakly, by identity), and whether each parameter requires grad."""
    return (
        m.training,
        tuple((k, _weak(p), p is not None and p.requires_grad) for k, p in m._parameters.items()),
        tuple((k, _weak(v)) for k, v in m._buffers.items()),
        tuple((k, _weak(v)) for k, v in m._modules.items()),
    )


def _weak(v):
    return None if v is None else _ref(v)


def _same_module_state(m, state) -> bool:
    training, params, buffers, children = state
    if m.training is not training:
        return False
    table = m._parameters
    if len(table) != len(params):
        return False
    for k, ref, requires_grad in params:
        p = table.get(k)
        if (
            (p is not None)
            if ref is None
            else (p is not ref() or p.requires_grad is not requires_grad)
        ):
            return False
    for table, saved in ((m._buffers, buffers), (m._modules, children)):
        if len(table) != len(saved):
            return False
        for k, ref in saved:
            v = table.get(k)
            if (v is not None) if ref is None else (v is not ref()):
                return False
    return True


def _value_bytes(h) -> bytes:
    """A constant's value, to compare two recordings of a step."""
    a = fetch(h) if isinstance(h, jax.Array) else np.asarray(h)
    return str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()


def _host_bytes(t: torch.Tensor) -> bytes:
    """A host tensor's value as ``_value_bytes`` gives its data node's."""
    return _value_bytes(_tensor.host_numpy(t))


def _data_node(t: LazyTensor):
    """The data node an argument's value starts from: its own, or the float32 data a bfloat16
    host tensor was converted from."""
    node = t._ir.node
    if type(node) is DeviceData:
        return node
    if node.op == "aten::_to_copy.default" and type(node.operands[0].node) is DeviceData:
        return node.operands[0].node
    return None


class _Plan:
    """One traced call of a step, as a replay would run it."""

    def __init__(self):
        self.reasons: list[str] = []
        self.exe = None
        # Per program parameter: (kind, tensor refs / argument index / array / None).
        self.sources: list = []
        self.shapes: list = []  # per parameter: the data's Shape
        self.const_bytes: list = []  # per _CONST parameter: its value
        self.bindings: list = []  # (kind, tensor ref / arg or output index, root index)
        self.structure = None  # the return value's structure
        self.statics: list = []  # the return value's leaves; None where a tensor goes
        # (optimizer ref, hyperparameters, its state table and size, each group's params and size)
        self.optimizers: list = []
        self.modules: list = []  # (module ref, _module_state of it)
        self.grads: list = []  # (tensor ref, whether its .grad was None when the call began)
        self.hosts: list = []  # (host tensor ref, its value then) for host tensors it read
        self.requires: list = []  # (tensor ref, requires_grad) of tensors the program reads
        self.grad_reads: list = []  # (tensor ref, gradient ref): gradients the program reads

    def same_as(self, other: _Plan) -> bool:
        """Whether two traced calls did the same thing: the condition for replaying."""
        if self.reasons or other.reasons or self.exe is not other.exe:
            return False
        if self.structure != other.structure or self.statics != other.statics:
            return False
        if self.const_bytes != other.const_bytes or len(self.sources) != len(other.sources):
            return False
        for (k1, x1), (k2, x2) in zip(self.sources, other.sources, strict=True):
            if (
                k1 != k2
                or (k1 == _STATE and _alive(x1) is not _alive(x2))
                or (k1 == _ARG and x1 != x2)
            ):
                return False
        if len(self.bindings) != len(other.bindings):
            return False
        for (k1, x1, r1), (k2, x2, r2) in zip(self.bindings, other.bindings, strict=True):
            if k1 != k2 or r1 != r2:
                return False
            if (k1 == _STATE or k1 == _GRAD) and x1() is not x2():
                return False
            if (k1 == _ARG or k1 == _OUT) and x1 != x2:
                return False
        return True

    def replay(self, leaves: list, replayable_args: list):
        """Run the step on the current data, or ``_MISS`` when a guard says to trace it."""
        for ref, hyper, state, size, params in self.optimizers:
            opt = ref()
            if opt is None or opt.state is not state or len(state) != size:
                return _MISS  # gone, or its state loaded (load_state_dict replaces the table)
            groups = opt.param_groups
            if len(groups) != len(params) or _hyper(opt) != hyper:
                return _MISS
            for group, (table, n) in zip(groups, params, strict=True):
                if group["params"] is not table or len(table) != n:
                    return _MISS
        for ref, state in self.modules:
            m = ref()
            if m is None or not _same_module_state(m, state):
                return _MISS
        for ref, was_none in self.grads:
            t = ref()
            if t is None or (t.grad is None) is not was_none:
                return _MISS
        for ref, flag in self.requires:
            t = ref()
            if t is None or t.requires_grad is not flag:
                return _MISS
        for ref, grad in self.grad_reads:
            t = ref()
            if t is None or t.grad is not grad():
                return _MISS
        for ref, value in self.hosts:
            t = ref()
            if t is not None and _host_bytes(t) != value:
                return _MISS
        exe = self.exe
        arrays = []
        rng = None
        for (kind, x), shape, sharding in zip(
            self.sources, self.shapes, exe.in_shardings, strict=True
        ):
            if kind is _CONST:
                arrays.append(x)
                continue
            if kind is _STATE:
                t = _alive(x)
                if t is None:
                    return _MISS
                node = t._ir.node
            elif kind is _ARG:
                leaf = leaves[x]
                node = replayable_args[x]
                if node is None:  # a host tensor: placed straight from its memory
                    host = leaf.detach()
                    if host.dtype == torch.bfloat16:
                        host = host.float()
                    _metrics.count("TransferToDevice")
                    arrays.append(put(host.numpy(), sharding))
                    continue
            else:  # _RNG: drawn last, once nothing can send the call back to tracing
                rng = len(arrays)
                arrays.append(sharding)
                continue
            if type(node) is not DeviceData or node.shape != shape:
                return _MISS
            arrays.append(_place(node, sharding))
        if rng is not None:
            arrays[rng] = _place(_rng._key()[0].node, arrays[rng])
        results = exe.results(exe.run(arrays))
        outputs = list(self.statics)
        for kind, x, k in self.bindings:
            data = results[k]
            if kind is _OUT:
                outputs[x] = LazyTensor(Value(data))
            elif kind is _STATE:
                t = x()
                if t is not None:
                    _step.bind(t, data)
            elif kind is _GRAD:
                t = x()
                if t is not None:
                    t.grad = LazyTensor(Value(data))
            elif kind is _ARG:  # the caller's lazy tensor, written by the step
                _step.bind(leaves[x], data)
        _rng.next_step()
        _metrics.count("StepReplay")
        return _unflatten(self.structure, outputs)


def _alive(refs):
    """The first of ``refs`` (weak references) whose tensor is alive, or None."""
    for r in refs:
        t = r()
        if t is not None:
            return t
    return None


_SIGNATURES = 32  # argument signatures a compiled step keeps plans for


def _classify(leaves, entry_nodes, out_pos, arg_pos, grad_of, bases):
    """What each live lazy tensor is to a traced call: ``(pending tensors, their roles, reasons
    the call cannot be replayed, whether a tensor it made outlives it unexplained)``."""
    pending, roles, reasons, survivors = [], [], [], False
    for t in live():
        tid = id(t)
        busy = _pending(t)
        if tid in arg_pos:
            # Data an argument is rebound to (mark_sharding of the batch) is where a replay
            # places the next argument anyway; computed values go back to a lazy argument.
            if not busy or not isinstance(leaves[arg_pos[tid]], LazyTensor):
                if busy:  # a host tensor's own lazy copy, written by the step
                    pending.append(t)
                    roles.append((_DROP, None))
                continue
            role = (_ARG, arg_pos[tid])
        elif tid in entry_nodes:
            if not busy:
                if t._ir.node is not entry_nodes[tid]:
                    reasons.append(
                        f"it rebinds a tensor ({list(t.shape)}, {t.dtype}) to other data "
                        f"without computing it (mark_sharding of data, .data =): do that "
                        f"outside the step"
                    )
                continue
            role = (_STATE, _ref(t))
        elif tid in out_pos:
            if not busy:
                reasons.append(
                    "it returns a tensor it did not compute (an argument, or a tensor from "
                    "before the call); return only what the step computes"
                )
                continue
            role = (_OUT, out_pos[tid])
        elif tid in grad_of:
            role = (_GRAD, _ref(grad_of[tid]))
        elif tid in bases:
            role = (_DROP, None)
        else:
            survivors = True
            reasons.append(
                f"a tensor it creates ({list(t.shape)}, {t.dtype}) outlives the call other "
                f"than as its result or a gradient (kept in an attribute or a list), and a "
                f"replay cannot recreate it"
            )
            role = (_DROP, None)  # computed all the same: nothing is left pending
        if busy:
            pending.append(t)
            roles.append(role)
    return pending, roles, reasons, survivors


class CompiledStep:
    """A step function traced on its first calls, then replayed (see ``compile_step``)."""

    def __init__(self, fn):
        self.fn = fn
        self._replay: dict = {}  # argument key -> the plan replayed for it
        self._last: dict = {}  # argument key -> the plan of its last traced call
        self._warned: set = set()
        self.reason: str | None = None  # why the last traced call could not be replayed
        functools.update_wrapper(self, fn)

    @property
    def replaying(self) -> bool:
        """Whether some argument signature is being replayed."""
        return bool(self._replay)

    def __call__(self, *args, **kwargs):
        if kwargs or any(isinstance(a, (tuple, list, dict)) for a in args):
            leaves: list = []
            structure = _flatten((args, kwargs), leaves)
        else:  # the common case: positional tensors and values
            leaves = list(args)
            structure = _flat(len(args))
        key = (structure, torch.is_grad_enabled(), *map(_leaf_key, range(len(leaves)), leaves))
        plan = self._replay.get(key)
        if plan is not None:
            nodes = []
            for leaf in leaves:
                node = None
                if isinstance(leaf, LazyTensor):
                    node = leaf._ir.node
                    if type(node) is not DeviceData:
                        _step.mark_step()  # the caller's pending work first
                        node = leaf._ir.node
                nodes.append(node)
            out = plan.replay(leaves, nodes)
            if out is not _MISS:
                return out
            del self._replay[key]
            self._last.pop(key, None)  # what changed is not a reason to refuse: start afresh
            _metrics.count("StepGuardFailed")
        return self._trace(key, leaves, structure)

    def _trace(self, key, leaves: list, structure):
        _metrics.count("StepTraced")
        if any(_pending(t) for t in live()):
            _step.mark_step()  # the step's program holds only the step
        # Strong references until the call is analysed: no id here is reused meanwhile.
        entry = live()
        entry_nodes = {id(t): t._ir.node for t in entry}
        entry_grads = {id(t): t.grad for t in entry if t.requires_grad and t.is_leaf}
        lazy = [
            to_lazy(x) if isinstance(x, torch.Tensor) and not isinstance(x, LazyTensor) else x
            for x in leaves
        ]
        # Data node -> the tensors holding it at entry. Tensors that share data (a gradient and
        # the momentum buffer cloned from it) are one source: a replay reads whichever of them
        # is still alive then.
        holders: dict = {}
        for t in entry:
            holders.setdefault(id(entry_nodes[id(t)]), []).append(t)
        arg_nodes = {}
        aliased = False  # an argument's data reaches the program another way too
        for i, x in enumerate(lazy):
            if isinstance(x, LazyTensor):
                node = _data_node(x)
                if node is not None:
                    others = [h for h in holders.get(id(node), ()) if h is not x]
                    aliased = aliased or id(node) in arg_nodes or bool(others)
                    arg_nodes[id(node)] = i
        arg_grads = any(isinstance(x, LazyTensor) and x.requires_grad for x in leaves)
        optimizers: dict = {}
        modules: dict = {}

        def saw_optimizer(opt, args, kwargs):
            optimizers.setdefault(id(opt), opt)  # returns None: the arguments stay as they are

        def saw_module(m, args):
            modules.setdefault(id(m), m)

        hooks = [
            _optimizer.register_optimizer_step_pre_hook(saw_optimizer),
            _module.register_module_forward_pre_hook(saw_module),
        ]
        events = dict(_step.EVENTS)
        host_reads = _tensor.HOST_READS = []
        try:
            args, kwargs = _unflatten(structure, lazy)
            out = self.fn(*args, **kwargs)
        finally:
            _tensor.HOST_READS = None
            for h in hooks:
                h.remove()
        plan = _Plan()
        if _step.EVENTS["host_reads"] != events["host_reads"]:
            plan.reasons.append(
                "it reads a tensor's value into Python (.item(), .cpu(), printing), so what it "
                "does next can depend on the data; read results after the call instead"
            )
        if _step.EVENTS["mark_steps"] != events["mark_steps"]:
            plan.reasons.append("it calls mark_step(); a compiled step runs as one program")
        if aliased:
            plan.reasons.append(
                "its arguments share data with each other or with tensors it reads (the same "
                "tensor passed twice, a clone or detach of a parameter), which its program "
                "reads as one input"
            )
        if arg_grads:
            plan.reasons.append(
                "a lazy argument requires grad: its gradient goes to the caller's tensor, "
                "which a replay of another call's argument cannot follow"
            )
        out_leaves: list = []
        plan.structure = _flatten(out, out_leaves)
        del out, args, kwargs
        # Results are returned detached: a replay has no autograd graph to give them.
        outputs = [wrap(o._ir) if isinstance(o, LazyTensor) else o for o in out_leaves]
        plan.reasons += [
            f"it returns a tensor on {o.device}, not a lazy tensor"
            for o in out_leaves
            if isinstance(o, torch.Tensor) and not isinstance(o, LazyTensor)
        ]
        del out_leaves  # the results themselves, with their autograd graph: gone from here on
        plan.statics = [None if isinstance(o, LazyTensor) else o for o in outputs]

        grad_of = {}
        for t in entry:
            if id(t) in entry_grads:
                g = t.grad
                if isinstance(g, LazyTensor) and id(g) not in entry_nodes:
                    grad_of[id(g)] = t
                    plan.grads.append((_ref(t), entry_grads[id(t)] is None))
        # A new gradient can be a view (the transpose of a product): its base lives on only
        # through the view's link, which a replay does not recreate (nothing else reads it).
        bases = set()
        for t in grad_of.values():
            v = t.grad._view
            while v is not None:
                b = _tensor._base_of(v[0])
                if not isinstance(b, LazyTensor) or id(b) in entry_nodes:
                    break
                bases.add(id(b))
                v = b._view
        out_pos = {id(o): j for j, o in enumerate(outputs) if isinstance(o, LazyTensor)}
        arg_pos = {id(x): i for i, x in enumerate(lazy) if isinstance(x, LazyTensor)}
        classified = _classify(leaves, entry_nodes, out_pos, arg_pos, grad_of, bases)
        if classified[3]:
            # Tensors that seem to outlive the call may be held only by reference cycles (an
            # autograd graph returned with a result): collect those before blaming the step.
            classified = None
            gc.collect()
            classified = _classify(leaves, entry_nodes, out_pos, arg_pos, grad_of, bases)
        pending, roles, reasons, _ = classified
        plan.reasons += reasons
        for i, x in enumerate(lazy):
            if isinstance(x, LazyTensor) and type(x._ir.node) is DeviceData:
                arg_nodes.setdefault(id(x._ir.node), i)  # placed inside the step
        key_node = _rng._state["key"]
        key_node = key_node.node if key_node is not None else None
        read_from = {id(node): refs for node, refs in host_reads}
        # A gradient at entry -> the tensor it is the .grad of.
        grad_owner = {id(g): t for t in entry if (g := entry_grads.get(id(t))) is not None}
        if pending:
            (_, exe, g, arrays), where = _step._run(pending)
            plan.exe = exe
            for p, a in zip(g.params, arrays, strict=True):
                plan.shapes.append(p.shape)
                pid = id(p)
                if pid in arg_nodes:
                    plan.sources.append((_ARG, arg_nodes[pid]))
                elif pid in holders:
                    refs = tuple(_ref(h) for h in holders[pid])
                    plan.sources.append((_STATE, refs))
                    if len(refs) == 1:  # (aliases may differ; the one read then is unknown)
                        t = refs[0]()
                        plan.requires.append((refs[0], t.requires_grad))
                        owner = grad_owner.get(id(t))
                        if owner is not None:  # read as p.grad: p must still have it
                            plan.grad_reads.append((_ref(owner), refs[0]))
                elif p is key_node:
                    plan.sources.append((_RNG, None))
                else:
                    plan.sources.append((_CONST, a))
                    plan.const_bytes.append(_value_bytes(p.handle))
                    # A host tensor (or the base of the view) read that outlives the call:
                    # changed in place later (a tensor learning rate a scheduler fills), it
                    # must be read again.
                    for ref in read_from.get(pid, ()):
                        host = ref() if ref is not None else None
                        if host is not None:
                            plan.hosts.append((ref, _host_bytes(host)))
            plan.bindings = [(kind, x, k) for (kind, x), k in zip(roles, where, strict=True)]
        else:
            plan.reasons.append("it computes nothing on the lazy device")
        _rng.next_step()
        plan.optimizers = [
            (
                _ref(o),
                _hyper(o),
                o.state,  # held: a dict cannot be weakly referenced; a new trace lets it go
                len(o.state),
                tuple((g["params"], len(g["params"])) for g in o.param_groups),
            )
            for o in optimizers.values()
        ]
        plan.modules = [(_ref(m), _module_state(m)) for m in modules.values()]

        self._settle(key, plan)
        return _unflatten(plan.structure, outputs)  # the lazy ones now hold their results

    def _settle(self, key, plan: _Plan) -> None:
        last = self._last.pop(key, None)
        self._last[key] = plan  # the most recent signature last
        if len(self._last) > _SIGNATURES:
            stale = next(iter(self._last))
            del self._last[stale]
            self._replay.pop(stale, None)
            self._warn(
                f"it was called with more than {_SIGNATURES} argument signatures (shapes, "
                f"dtypes, Python values; the oldest are dropped): Python numbers among the "
                f"arguments are part of the key, so pass numbers that change as tensors"
            )
        if last is not None and last.same_as(plan):
            self._replay[key] = plan
            self.reason = None
            return
        if (
            last is not None
            and not plan.reasons
            and last.exe is plan.exe
            and last.const_bytes != plan.const_bytes
        ):
            plan.reasons.append(
                "values it computes in Python change from call to call (a learning rate set "
                "every step; Adam's bias corrections from its CPU step count: give torch's "
                "Adam-family optimizers capturable=True); pass such values as tensors"
            )
        if plan.reasons and last is not None and last.reasons:
            # Refused twice in a row: not the first call's one-time setup (optimizer state).
            self.reason = plan.reasons[0]
            self._warn(self.reason)

    def _warn(self, reason: str) -> None:
        """A ``CaptureWarning``, once per reason, pointing at the caller's line."""
        if reason in self._warned:
            return
        self._warned.add(reason)
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        warnings.warn(
            f"compiled step {name} is traced on every call, as mark_step would run it, "
            f"because {reason}",
            CaptureWarning,
            stacklevel=5,
        )


def compile_step(fn=None):
    """Compile a training step: ``step = compile_step(fn)``, or ``@compile_step``.

    Each call runs the step and its program, as ``fn(...); mark_step()`` would, and returns
    ``fn``'s result with lazy tensors detached and holding data. The first calls are traced;
    once two calls in a row record the same program over the same tensors, later calls with
    arguments of the same shapes and dtypes replay the program without running ``fn``'s Python
    (the module docstring lists what a replay checks first, and what is frozen at capture).
    """
    if fn is None:
        return compile_step
    if not callable(fn):
        raise TypeError(f"compile_step takes a function, got {type(fn).__name__}")
    return CompiledStep(fn)


__all__ = ["CaptureWarning", "CompiledStep", "compile_step"]
