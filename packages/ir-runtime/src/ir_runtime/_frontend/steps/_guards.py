"""What a compiled step's replay checks first: one guard per fact a traced call relied on.

A traced call builds its guards from what it saw (``_trace.trace``), into its plan's table
(``_Plan.guards``); a replay checks them top to bottom and, at the first that fails, traces the
call again and records that guard's ``why()`` (``CompiledStep.last_guard_failure``).

A guard's ``holds()`` is its check; it allocates nothing and reads only what it must. A replay
runs the checks one run of same-class guards at a time (``as_runs``), through the class's
``all_hold``: for the kinds a step has one of per tensor, that is one loop over the guards'
``packed()`` tuples (a method call per guard would not be). The checks every replay makes for
optimizers, modules and gradients run in C (``_hot``: ``optimizer_holds``, ``module_holds``,
the ``*_all_hold`` loops); their Python twins (``holds`` of the per-tensor kinds) serve
``first_failure``. ``why()`` runs only once a guard has failed, on the state that made it fail,
and names what changed.

Tensors, optimizers and modules are held weakly (an optimizer's state table and parameter
lists strongly: neither a dict nor a list can be weakly referenced; a new trace lets them go).

Longer than 400 lines, as one table: each kind of guard is a class with its capture, its check
(per guard and per run) and its explanation, and the kinds read best side by side.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from ir_runtime._frontend.recording._convert import host_numpy
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.steps import _hot

_ref = weakref.ref
_NONE = object()  # a key missing from a table
_TENSOR = object()  # a tensor hyperparameter, compared by _tensor_key
_NUMBER = object()  # a number lent to the step, compared by _number_key


class _Float:
    def __repr__(self):
        return "a number"


_FLOAT = _Float()  # (as _number_key keys a float)


class Guard:
    """A fact a replay relies on: built from a traced call, checked by ``holds()`` before each
    replay, explained by ``why()`` once it no longer holds."""

    __slots__ = ()

    def holds(self) -> bool:
        raise NotImplementedError

    def why(self) -> str:
        raise NotImplementedError

    def packed(self):
        """What this class's ``all_hold`` reads of this guard: the guard, unless it inlines."""
        return self

    @staticmethod
    def all_hold(packed) -> bool:
        """Whether each guard (of this class) holds, given their ``packed()``: ``holds()``
        unless a class inlines it."""
        for g in packed:
            if not g.holds():
                return False
        return True


def as_runs(guards) -> tuple:
    """A guard table as a replay checks it, top to bottom: ``(all_hold, what it reads, the
    guards)`` per run of guards of one class."""
    out: list = []
    for g in guards:
        if out and type(out[-1][-1]) is type(g):
            out[-1].append(g)
        else:
            out.append([g])
    return tuple((type(run[0]).all_hold, tuple(g.packed() for g in run), tuple(run)) for run in out)


def first_failure(guards) -> str:
    """Why the first of ``guards`` that fails does (a run whose ``all_hold`` said one did)."""
    for g in guards:
        if not g.holds():
            return g.why()
    return f"a {type(guards[0]).__name__} failed"  # all_hold disagrees with holds: a bug


def tensor_name(shape, dtype) -> str:
    return f"tensor {list(shape)} {str(dtype).removeprefix('torch.')}"


def _weak(v):
    return None if v is None else _ref(v)


# ---------------------------------------------------------------------------------------------
# Optimizers the step stepped.


def _hyper(opt, inputs, numbers=frozenset()) -> tuple:
    """An optimizer's hyperparameters, as a replay compares them: lazy tensors by identity (the
    program reads them), host tensors by identity when ``inputs`` (a set of ids; None: all) has
    them (read afresh into the program at every replay: a learning rate a scheduler fills in
    place), numbers ``numbers`` has (``(group index, key)``, lent to the step: read afresh too)
    by kind, others by value (Python computed with them)."""
    return tuple(
        tuple(
            (
                k,
                _tensor_key(v, inputs)
                if isinstance(v, torch.Tensor)
                else _number_key(v)
                if (i, k) in numbers
                else v,
            )
            for k, v in group.items()
            if k != "params"
        )
        for i, group in enumerate(opt.param_groups)
    )


def _number_key(v):
    """A number lent to the step as it is compared: its kind only (a float, a tuple of so many),
    whatever its value; anything else by value (a change of kind is a change)."""
    if type(v) is float:
        return _FLOAT
    if type(v) is tuple and v and all(type(x) is float for x in v):
        return (_FLOAT, len(v))
    return v


def _tensor_key(v: torch.Tensor, inputs):
    if isinstance(v, LazyTensor):
        return ("lazy", id(v))
    if inputs is None or id(v) in inputs:
        return ("input", id(v), v.dtype, tuple(v.shape))
    return ("host", v.dtype, tuple(v.shape), v.detach().cpu().flatten().tolist())


def _array_text(a: np.ndarray) -> str:
    """An array's values for a message, each as short as its dtype allows (0.1, not 0.100...)."""
    if a.ndim == 0:
        return str(a[()])
    return np.array2string(a, separator=", ", threshold=8)


def _hyper_text(v) -> str:
    """A hyperparameter as ``_hyper`` keeps it, for a message."""
    if type(v) is tuple and len(v) == 4 and v[0] == "host" and isinstance(v[1], torch.dtype):
        t = torch.tensor(v[3], dtype=v[1]).reshape(v[2])
        return _array_text((t.float() if t.dtype == torch.bfloat16 else t).numpy())
    if type(v) is tuple and len(v) == 2 and v[0] == "lazy":
        return "a lazy tensor"
    if type(v) is tuple and len(v) == 4 and v[0] == "input":
        return f"a {tensor_name(v[3], v[2])}"
    return repr(v)


def _constant_hint(opt, kind: str, k: str, a: float) -> str:
    """Why a number among an optimizer's hyperparameters is a constant of the program."""
    if type(opt).__module__.startswith("torch.optim."):  # (lent, and read into Python)
        return (
            f"; its step reads {k} into Python (a branch on it, or a number it computes from "
            f"it), so each value of {k} is a program of its own"
        )
    if "capturable" in opt.defaults:
        return (  # (a number is a constant of the program)
            f"; to change it every call, hold it in a tensor: "
            f"{kind}(..., {k}=torch.tensor({a!r}), capturable=True)"
        )
    return f"; {kind} is not one of torch's optimizers, whose numbers a replay reads afresh"


class OptimizerGuard(Guard):
    """An optimizer the step stepped: its hyperparameters, its state table (the same dict, of
    the same size: ``load_state_dict`` replaces it) and each group's parameter list.
    ``inputs``: ids of the host tensors the program reads afresh at every replay (None: every
    host tensor, by identity: what a call's effects are compared by); ``numbers``: ``(group
    index, key)`` of the numbers lent to its step that Python never read (``_lend``), compared
    by kind only: the program reads each afresh at every replay."""

    __slots__ = ("groups", "hyper", "inputs", "kind", "numbers", "params", "ref", "size", "state")

    def __init__(self, opt, inputs=None, numbers=frozenset()):
        self.ref = _ref(opt)
        self.kind = type(opt).__name__
        self.inputs = inputs
        self.numbers = numbers
        self.hyper = _hyper(opt, inputs, numbers)
        self.state = opt.state
        self.size = len(opt.state)
        self.params = tuple((g["params"], len(g["params"])) for g in opt.param_groups)
        # What holds() compares, per group: its parameter list and length, its size, and each
        # hyperparameter (a tensor's as _hyper keys it: _TENSOR marks one), without building
        # _hyper's tuples on every replay.
        self.groups = tuple(
            (
                g["params"],
                len(g["params"]),
                len(g),
                tuple(
                    (k, _TENSOR, key)
                    if isinstance(v, torch.Tensor)
                    else (k, _NUMBER, key)
                    if (i, k) in numbers
                    else (k, v, None)
                    for (k, key), v in zip(h, (g[k] for k in g if k != "params"), strict=True)
                ),
            )
            for i, (g, h) in enumerate(zip(opt.param_groups, self.hyper, strict=True))
        )

    holds = _hot.optimizer_holds  # (the check every replay makes, in C)
    all_hold = staticmethod(_hot.optimizers_hold)

    def why(self) -> str:
        name = f"optimizer {self.kind}"
        opt = self.ref()
        if opt is None:
            return f"{name} was freed"
        if opt.state is not self.state:
            return f"{name}'s state table was replaced (load_state_dict)"
        if len(opt.state) != self.size:
            return f"{name}'s state has {len(opt.state)} entries, not {self.size}"
        groups = opt.param_groups
        if len(groups) != len(self.params):
            return f"{name} has {len(groups)} parameter groups, not {len(self.params)}"
        now_hyper = _hyper(opt, self.inputs, self.numbers)
        for i, (now, then) in enumerate(zip(now_hyper, self.hyper, strict=True)):
            now, then = dict(now), dict(then)
            where = f" (parameter group {i})" if len(groups) > 1 else ""
            for k in {**then, **now}:
                a, b = then.get(k, _NONE), now.get(k, _NONE)
                if a is _NONE or b is _NONE:
                    return f"{name}'s parameter group {i} {'gained' if a is _NONE else 'lost'} {k}"
                if a != b:
                    changed = (
                        f"{name}'s {k}{where} changed from {_hyper_text(a)} to {_hyper_text(b)}"
                    )
                    if type(a) is float and type(b) is float:
                        changed += _constant_hint(opt, self.kind, k, a)
                    return changed
        for i, (group, (table, n)) in enumerate(zip(groups, self.params, strict=True)):
            if group["params"] is not table:
                return f"{name}'s parameter group {i} has a new parameter list"
            if len(table) != n:
                return f"{name}'s parameter group {i} has {len(table)} parameters, not {n}"
        return f"{name} changed"


# ---------------------------------------------------------------------------------------------
# Modules the step called.


class ModuleGuard(Guard):
    """A module the step called: its mode, which parameters, buffers and submodules it has
    (weakly, by identity), and whether each parameter requires grad."""

    __slots__ = ("buffers", "children", "kind", "params", "ref", "training")

    def __init__(self, m):
        self.ref = _ref(m)
        self.kind = type(m).__name__
        self.training = m.training
        self.params = tuple(
            (k, _weak(p), p is not None and p.requires_grad) for k, p in m._parameters.items()
        )
        self.buffers = tuple((k, _weak(v)) for k, v in m._buffers.items())
        self.children = tuple((k, _weak(v)) for k, v in m._modules.items())

    holds = _hot.module_holds  # (the check every replay makes, in C)
    all_hold = staticmethod(_hot.modules_hold)

    def why(self) -> str:
        m = self.ref()
        if m is None:
            return f"module {self.kind} was freed"
        extra = m.extra_repr()
        name = f"module {self.kind}({extra})" if extra else f"module {self.kind}"
        if m.training is not self.training:
            return f"{name} switched to {'train' if m.training else 'eval'}()"
        for k, ref, requires_grad in self.params:
            p = m._parameters.get(k, _NONE)
            if p is _NONE:
                return f"{name}'s parameter {k!r} was removed"
            if (p is not None) if ref is None else (p is not ref()):
                return f"{name}'s parameter {k!r} was replaced"
            if p is not None and p.requires_grad is not requires_grad:
                now = "now" if p.requires_grad else "no longer"
                return f"{name}'s parameter {k!r} {now} requires grad"
        for what, table, saved in (
            ("buffer", m._buffers, self.buffers),
            ("submodule", m._modules, self.children),
        ):
            for k, ref in saved:
                v = table.get(k, _NONE)
                if v is _NONE:
                    return f"{name}'s {what} {k!r} was removed"
                if (v is not None) if ref is None else (v is not ref()):
                    return f"{name}'s {what} {k!r} was replaced"
        for what, table, saved in (
            ("parameter", m._parameters, self.params),
            ("buffer", m._buffers, self.buffers),
            ("submodule", m._modules, self.children),
        ):
            added = [k for k in table if k not in {s[0] for s in saved}]
            if added:
                return f"{name} has a new {what} {added[0]!r}"
        return f"{name} changed"


# ---------------------------------------------------------------------------------------------
# Tensors: their gradients, whether they require grad, host tensors' values.


class _TensorGuard(Guard):
    """A fact about one tensor, which it names by shape and dtype (also once it is freed)."""

    __slots__ = ("dtype", "ref", "shape")

    def __init__(self, t: torch.Tensor):
        self.ref = _ref(t)
        self.shape = t.shape
        self.dtype = t.dtype

    def _name(self) -> str:
        return tensor_name(self.shape, self.dtype)


class GradGuard(_TensorGuard):
    """A tensor the step gave a new ``.grad``: whether its ``.grad`` was None as the call
    began (``zero_grad`` before or after the step)."""

    __slots__ = ("was_none",)

    def __init__(self, t: torch.Tensor, was_none: bool):
        super().__init__(t)
        self.was_none = was_none

    def holds(self) -> bool:
        t = self.ref()
        return t is not None and (t.grad is None) is self.was_none

    def packed(self):
        return (self.ref, self.was_none)

    all_hold = staticmethod(_hot.grad_all_hold)  # (a replay's check, in C)

    def why(self) -> str:
        if self.ref() is None:
            return f"{self._name()}, whose .grad the step sets, was freed"
        if self.was_none:
            return f"p.grad of {self._name()} was None when traced and is set now"
        return f"p.grad of {self._name()} was set when traced and is None now"


class UnsetGradGuard(_TensorGuard):
    """A tensor whose ``.grad`` was None before and after the traced call (a step that ends in
    ``zero_grad()``): it must still be None, or freed. A ``.grad`` set since would be accumulated
    into by a traced call, which a replay cannot do."""

    __slots__ = ()

    def holds(self) -> bool:
        t = self.ref()
        return t is None or t.grad is None

    def packed(self):
        return self.ref

    all_hold = staticmethod(_hot.unset_grad_all_hold)  # (a replay's check, in C)

    def why(self) -> str:
        return f"p.grad of {self._name()} was None when traced and is set now"


class GradReadGuard(_TensorGuard):
    """A tensor whose ``.grad`` the program reads or writes in place: it must have one, a lazy
    tensor (whichever: a replay reads and writes ``p.grad`` as it is then, as eager would, so a
    ``.grad`` that ``zero_grad()`` dropped and the next backward made anew is read all the
    same)."""

    __slots__ = ()

    def holds(self) -> bool:
        t = self.ref()
        return t is not None and type(t.grad) is LazyTensor

    def packed(self):
        return self.ref

    all_hold = staticmethod(_hot.grad_read_all_hold)  # (a replay's check, in C)

    def why(self) -> str:
        t = self.ref()
        if t is None:
            return f"{self._name()}, whose .grad the step reads, was freed"
        if t.grad is None:
            return f"p.grad of {self._name()} was set to None"
        return f"p.grad of {self._name()} is a {t.grad.device} tensor, not a lazy one"


class RequiresGradGuard(_TensorGuard):
    """A tensor the program reads: whether it requires grad (what backward does with it)."""

    __slots__ = ("flag",)

    def __init__(self, t: torch.Tensor):
        super().__init__(t)
        self.flag = t.requires_grad

    def holds(self) -> bool:
        t = self.ref()
        return t is not None and t.requires_grad is self.flag

    def packed(self):
        return (self.ref, self.flag)

    all_hold = staticmethod(_hot.requires_grad_all_hold)  # (a replay's check, in C)

    def why(self) -> str:
        t = self.ref()
        if t is None:
            return f"{self._name()} that the step reads was freed"
        now = "no longer" if self.flag else "now"
        return f"{self._name()} that the step reads {now} requires grad"


def array_bytes(a: np.ndarray) -> bytes:
    """An array's value (dtype, shape and data), to compare."""
    return _array_head(a) + a.tobytes()


def _array_head(a: np.ndarray) -> bytes:
    return str(a.dtype).encode() + str(a.shape).encode()


def _host_bytes(t: torch.Tensor) -> bytes:
    return array_bytes(host_numpy(t, copy=False))


class ConditionGuard(Guard):
    """A branch the step's Python took on a number lent to an optimizer's step (``if
    weight_decay != 0``): the comparison must come out the same (``_lend``)."""

    __slots__ = ("compare", "index", "key", "other", "ref", "result", "where")

    def __init__(self, ref, group: int, key: str, index, compare, other, result: bool):
        self.ref, self.where, self.key, self.index = ref, group, key, index
        self.compare, self.other, self.result = compare, other, result

    def _value(self):
        opt = self.ref()
        groups = None if opt is None else opt.param_groups
        if groups is None or self.where >= len(groups) or self.key not in groups[self.where]:
            return _NONE
        v = groups[self.where][self.key]
        if self.index is not None:
            v = v[self.index] if type(v) is tuple and len(v) > self.index else _NONE
        return v

    def holds(self) -> bool:
        v = self._value()
        return type(v) in (int, float) and self.compare(v, self.other) is self.result

    def why(self) -> str:
        opt = self.ref()
        name = "an optimizer" if opt is None else f"optimizer {type(opt).__name__}"
        k = self.key if self.index is None else f"{self.key}[{self.index}]"
        symbol = _SYMBOLS[self.compare.__name__]
        return (
            f"{name}'s {k} is now {self._value()!r}: its step's Python took the branch where "
            f"{k} {symbol} {self.other!r} is {self.result}"
        )


_SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class HostGuard(_TensorGuard):
    """A host tensor (or the base of a host view) the program read as a constant: changed in
    place later (a tensor learning rate a scheduler fills), it must be read again."""

    __slots__ = ("value",)

    def __init__(self, t: torch.Tensor):
        super().__init__(t)
        self.value = _host_bytes(t)

    def holds(self) -> bool:
        t = self.ref()
        return t is None or _host_bytes(t) == self.value

    def why(self) -> str:
        name = f"host {self._name()} that the step reads"
        t = self.ref()
        if t is None:
            return f"{name} was freed"  # (holds then: nothing left to read again)
        a = host_numpy(t, copy=False)
        head = _array_head(a)
        if not self.value.startswith(head) or len(self.value) != len(head) + a.nbytes:
            return f"{name} changed dtype or shape"
        then = np.frombuffer(self.value[len(head) :], a.dtype).reshape(a.shape)
        if a.size > 8:
            changed = int(np.count_nonzero(then != a))
            return f"{name} changed in place ({changed} of {a.size} values)"
        return f"{name} changed from {_array_text(then)} to {_array_text(a)}"


_hot.configure_guards(
    none=_NONE,
    tensor=_TENSOR,
    number=_NUMBER,
    float_=_FLOAT,
    tensor_key=_tensor_key,
    number_key=_number_key,
)

__all__ = [
    "ConditionGuard",
    "GradGuard",
    "GradReadGuard",
    "Guard",
    "HostGuard",
    "ModuleGuard",
    "OptimizerGuard",
    "RequiresGradGuard",
    "UnsetGradGuard",
    "as_runs",
    "first_failure",
]
