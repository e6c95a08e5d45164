"""Tracing one call of a compiled step: run it as ``mark_step`` would, and make its plan.

The live tensors are taken stock of as the call begins (``_Entry``); ``fn`` runs under hooks
that note the optimizers it steps and the modules it calls (``_call``); what it left pending is
classified by what each tensor is to the call (``_classify``); the program runs, and each of
its inputs and results gets its role in the plan (``_program``); last, the guard table.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import warnings
import weakref
from collections import Counter
from typing import ClassVar

import torch
import torch.nn.modules.module as _module
import torch.optim.optimizer as _optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils._python_dispatch import TorchDispatchMode

from ir_core import DeviceData
from ir_runtime import _donation, _runtime_checks
from ir_runtime._frontend import _transformers
from ir_runtime._frontend.recording import _rng, _tensor
from ir_runtime._frontend.recording._api import to_lazy
from ir_runtime._frontend.recording._tensor import LazyTensor, base_of, live, wrap
from ir_runtime._frontend.steps import _lend, _step
from ir_runtime._frontend.steps._guards import (
    ConditionGuard,
    GradGuard,
    GradReadGuard,
    HostGuard,
    ModuleGuard,
    OptimizerGuard,
    RequiresGradGuard,
    UnsetGradGuard,
    as_runs,
    tensor_name,
)
from ir_runtime._frontend.steps._hot import (
    ARG,
    CONST,
    DROP,
    GRAD,
    HOST,
    HOSTREAD,
    HYPER,
    OUT,
    PGRAD,
    RNG,
    STATE,
)
from ir_runtime._frontend.steps._replay import (
    Replay,
    flatten,
    unflatten,
    value_bytes,
    write_host,
)
from ir_runtime._frontend.steps._step import pending as _pending

_ref = weakref.ref


def _classify(leaves, entry_nodes, out_pos, arg_pos, grad_of, bases, kept):
    """What each live lazy tensor is to a traced call: ``(pending tensors, their roles, reasons
    the call cannot be replayed, whether a tensor it made outlives it unexplained)``. ``kept``:
    id of a ``.grad`` at entry that is still its tensor's ``.grad`` -> that tensor."""
    pending, roles, reasons, survivors = [], [], [], False
    for t in live():
        tid = id(t)
        busy = _pending(t)
        if busy and _step.SET_ASIDE and _step._set_aside(t):
            continue  # set aside by a failed step: left out, as mark_step leaves it
        if tid in arg_pos:
            # Data an argument is rebound to (mark_sharding of the batch) is where a replay
            # places the next argument anyway; computed values go back to a lazy argument.
            if not busy:
                continue
            # A host argument's lazy copy, written by the step: the program's result is copied
            # back into the caller's host tensor, on every call, as eager writes it.
            role = (ARG if isinstance(leaves[arg_pos[tid]], LazyTensor) else HOST, arg_pos[tid])
        elif tid in entry_nodes:
            if not busy:
                if t._ir.node is not entry_nodes[tid]:
                    reasons.append(
                        f"it rebinds a tensor ({list(t.shape)}, {t.dtype}) to other data "
                        f"without computing it (mark_sharding of data, .data =): do that "
                        f"outside the step"
                    )
                continue
            owner = kept.get(tid)
            # p.grad written in place (accumulated into, zeroed): a replay writes p.grad as it
            # is then, which the next backward may have made anew since
            role = (STATE, _ref(t)) if owner is None else (PGRAD, _ref(owner))
        elif tid in out_pos:
            if not busy:
                reasons.append(
                    "it returns a tensor it did not compute (an argument, or a tensor from "
                    "before the call); return only what the step computes"
                )
                continue
            role = (OUT, out_pos[tid])
        elif tid in grad_of:
            role = (GRAD, _ref(grad_of[tid]))
        elif tid in bases:
            role = (DROP, None)
        else:
            survivors = True
            reasons.append(
                f"a tensor it creates ({list(t.shape)}, {t.dtype}) outlives the call other "
                f"than as its result or a gradient (kept in an attribute or a list), and a "
                f"replay cannot recreate it"
            )
            role = (DROP, None)  # computed all the same: nothing is left pending
        if busy:
            pending.append(t)
            roles.append(role)
    return pending, roles, reasons, survivors


# ---------------------------------------------------------------------------------------------
# What a traced call does outside its program. A replay redoes the program's writes, the random
# stream's step and a reseed (``Replay.reseed``), nothing else: a call with any other effect is
# not replayed, and its reason names the effect. A one-time effect (the optimizer state of a
# first step, an attribute set once) only keeps that call from being the one replayed.

_VALUES = (int, float, bool, complex, str, bytes, type(None))  # compared by value
# Attributes torch sets for its own checks, whose later values a replay need not redo: a
# scheduler marks its optimizer's first step (``_opt_called``) to warn about the call order.
_BOOKKEEPING = frozenset({"_opt_called"})
_MISSING = object()
_WRITES: dict = {}  # ATen op -> the (position, name) of the arguments it writes in place


def _same(a, b) -> bool:
    return a is b or (type(a) is type(b) and type(a) in _VALUES and a == b)


def _written_args(func) -> tuple:
    found = _WRITES.get(func)
    if found is None:
        found = _WRITES[func] = tuple(
            (i, a.name)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
    return found


class _HostWrites(TorchDispatchMode):
    """Notes (weakly) the host tensors the ops inside write in place, and those CPU ops read. A
    lazy op writes a lazy tensor, which the program rebinds; a host tensor written by a CPU op
    (a counter ``seen += n``, ``AveragedModel``'s ``n_averaged``) is Python work that no
    program holds. A host tensor a CPU op reads feeds Python (``lr.item()``), so the program's
    reading it afresh at a replay would not be enough: it is compared by value instead. Ops
    inside a scheduler's step, which a replay redoes, are not looked at (``_PAUSED``)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Whether Dynamo may compile a frame under this mode (torch asks as it converts one):
        for this project's backend only. Its graphs run through the front end's dispatch, or
        note the host tensors they read (``_backend``), so the mode still sees each op at run
        time; another backend's kernels would hide a host write from it, so Dynamo runs
        those frames as written."""
        from ir_runtime._frontend.dynamo import _backend, _capture

        return _capture.for_this_backend(_backend._ours)

    def __init__(self):
        super().__init__()
        # id of the tensor written (a view's base) -> (weak reference, the view or None)
        self.written: dict = {}
        self.read: set = set()  # ids of the host tensors (views' bases) CPU ops read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _PAUSED[0]:
            return func(*args, **kwargs)
        if LazyTensor not in types:  # a CPU op
            for x in (*args, *kwargs.values()):
                for t in x if isinstance(x, (list, tuple)) else (x,):
                    if isinstance(t, torch.Tensor):
                        self.read.add(id(t if t._base is None else t._base))
        written = _WRITES.get(func)
        for i, name in _written_args(func) if written is None else written:
            x = args[i] if i < len(args) else kwargs.get(name)
            for t in x if isinstance(x, (list, tuple)) else (x,):
                if isinstance(t, torch.Tensor) and not isinstance(t, LazyTensor):
                    base = t if t._base is None else t._base  # a view dies with the call
                    seen = self.written.get(id(base))
                    if seen is None or seen[0]() is not base:  # (a dead temporary's id)
                        view = None if base is t else (t.shape, t.dtype)
                        self.written[id(base)] = (_ref(base), view)
        return func(*args, **kwargs)


# What torch warns when a torch.compile'd module is called with a global module hook present.
_GLOBAL_HOOKS_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


class _ModuleHook:
    """``fn`` called before each module's forward while a call is traced, through one global
    forward pre-hook registered once and put back under the same key each time: Dynamo
    guards a compiled module's code on the global hooks it sees, so one hook of one identity
    keeps its graphs valid from one traced call to the next. Dynamo does not trace ``fn``
    (the module calls inside its graph run no hooks at run time)."""

    handle = None
    skipped = False  # (whether Dynamo was told to run _saw_module as written)
    seeing: ClassVar[list] = []  # the ``fn`` of each traced call in progress

    def __init__(self, fn):
        cls = type(self)
        if cls.handle is None:
            cls.handle = _module.register_module_forward_pre_hook(_saw_module)
        if not cls.skipped and "torch._dynamo" in sys.modules:
            # Traced into a graph that inlines a module call (where it does nothing: the
            # capture notes the modules it read), never compiled as a frame of its own:
            # Dynamo runs it as written where it meets it outside a graph (a module call it
            # does not trace, such as Module.compile()'s _call_impl), so it notes the module.
            from torch._dynamo.eval_frame import skip_code

            skip_code(_saw_module.__code__)
            cls.skipped = True
        _module._global_forward_pre_hooks[cls.handle.id] = _saw_module
        cls.seeing.append(fn)
        self.fn = fn

    def remove(self) -> None:
        seeing = type(self).seeing
        seeing.remove(self.fn)
        if not seeing:
            _module._global_forward_pre_hooks.pop(type(self).handle.id, None)


def module_watchers() -> tuple:
    """What each traced call in progress calls for a module it meets: what a graph that runs
    no module hooks (a ``torch.compile`` capture) calls for the modules it read."""
    return tuple(_ModuleHook.seeing)


def _saw_module(m, args):
    if torch.compiler.is_compiling():  # (Dynamo tracing a module call: nothing to note)
        return
    for fn in tuple(_ModuleHook.seeing):  # (each traced call in progress, as each had its hook)
        fn(m, args)


def note_host_reads(tensors) -> None:
    """Host tensors a compiled program read without dispatching an op on them (a
    ``torch.compile`` graph this project's backend ran on CPU tensors), noted as a CPU op's
    reads are by the ``_HostWrites`` watching the step being traced, if any."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if _PAUSED[0]:
        return
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, _HostWrites):
            for t in tensors:
                if isinstance(t, torch.Tensor) and not isinstance(t, LazyTensor):
                    mode.read.add(id(t if t._base is None else t._base))


# Optimizers whose step read a lent host tensor hyperparameter into Python (``_call``; a number
# lent, Python reads from the number itself: ``_lend``): their host tensors are lent no more,
# but stay host tensors (compared by value), and their steps replay while they hold.
_KEEPS_HOST: weakref.WeakSet = weakref.WeakSet()

# While a call is traced: [the schedulers it stepped, as (weak reference, host reads before
# the step, whether called with arguments)]. Ops inside a scheduler's step are not effects to
# look for (``_PAUSED``): a replay steps the scheduler again.
_STEPPED: list | None = None
_PAUSED = [0]


def _recorded(step):
    """An ``LRScheduler`` class's ``step``, noted in ``_STEPPED`` while a call is traced (the
    outermost only: ``SequentialLR`` steps its schedulers inside its own step)."""

    @functools.wraps(step)
    def stepped(self, *args, **kwargs):
        if _STEPPED is None or _PAUSED[0]:
            return step(self, *args, **kwargs)
        reads = _tensor._HOST_READS
        opt = getattr(self, "optimizer", None)
        # (ref, host reads before, with arguments, its optimizer's values before and after)
        noted = [_ref(self), 0 if reads is None else len(reads), bool(args or kwargs)]
        noted += [_values(opt), None]
        _STEPPED.append(noted)
        _PAUSED[0] += 1
        try:
            return step(self, *args, **kwargs)
        finally:
            _PAUSED[0] -= 1
            noted[4] = _values(opt)

    stepped._recorded = True
    return stepped


def _values(opt) -> list | None:
    """An optimizer's hyperparameters now, per group (a scheduler's doing is what its step
    changed)."""
    if not isinstance(opt, torch.optim.Optimizer):
        return None
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def _same_value(a, b) -> bool:
    return a is b or (type(a) is type(b) and not isinstance(a, torch.Tensor) and bool(a == b))


def _set_by_schedulers(entry, now, steps, inputs) -> bool:
    """Whether every hyperparameter that differs between ``entry`` and ``now`` (``_values``) is
    an input of the program (``inputs``: (group index, key)) that only the schedulers' steps
    changed (``steps``: their (before, after) values, in order): a replay steps them again."""
    if entry is None or now is None or len(entry) != len(now):
        return False
    for gi, (was, is_) in enumerate(zip(entry, now, strict=True)):
        for k in {**was, **is_}:
            a = was.get(k, _MISSING)
            if _same_value(a, is_.get(k, _MISSING)):
                continue
            if (gi, k) not in inputs:
                return False
            for before, after in steps:
                if len(before) <= gi or len(after) <= gi:
                    return False
                if not _same_value(a, before[gi].get(k, _MISSING)):
                    return False  # changed outside a scheduler's step
                a = after[gi].get(k, _MISSING)
            if not _same_value(a, is_.get(k, _MISSING)):
                return False
    return True


def _record_scheduler_steps() -> None:
    """Wrap the ``step`` of torch's scheduler classes (a subclass defined later that overrides
    ``step`` is not: its step's effects keep the call from being replayed, as any other)."""
    classes, todo = [], [LRScheduler]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo += cls.__subclasses__()
    for cls in classes:
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "_recorded", False):
            cls.step = _recorded(step)


_record_scheduler_steps()


def _roots(fn) -> list:
    """What ``fn`` reaches by name, as ``(name, object)``: its closure's variables, the globals
    it names, and the object a bound method (or a callable object) belongs to, with that
    object's attributes."""
    owner = getattr(fn, "__self__", None)  # a bound method's object
    func = getattr(fn, "__func__", fn)
    if not hasattr(func, "__code__"):  # a callable object: its class's __call__
        owner, func = fn, getattr(type(fn).__call__, "__func__", None)
    roots = []
    code = getattr(func, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False):
            try:
                roots.append((name, cell.cell_contents))
            except ValueError:  # a cell not filled yet
                pass
        names = func.__globals__
        roots += [(n, names[n]) for n in code.co_names if n in names]
    if owner is not None and not isinstance(owner, type(torch)):
        roots.append(("self", owner))
        roots += [(f"self.{k}", v) for k, v in getattr(owner, "__dict__", {}).items()]
    return roots


class _Effects:
    """The state a traced call could change outside its program, noted as the call begins (a
    module or optimizer first met inside it, as it is called or stepped), and what changed."""

    def __init__(self, fn, entry: _Entry):
        self.roots = roots = _roots(fn)
        # id -> (label, a reference to it, its attributes, its guard, optimizer state)
        self.seen: dict = {}
        for name, x in roots:
            if isinstance(x, torch.nn.Module):
                for sub, m in x.named_modules(remove_duplicate=True):
                    self.note(m, f"{name}.{sub}" if sub else name)
            elif isinstance(x, (torch.optim.Optimizer, LRScheduler)) or name == "self":
                self.note(x, name)
        self.entry = entry
        self.flags = [t.requires_grad for t in entry.tensors]
        self.mode = _HostWrites()
        self.seedings = _rng.seedings()
        self.cpu_rng = torch.get_rng_state()

    def note(self, x, label: str | None = None) -> None:
        if id(x) in self.seen:
            return
        label = label or type(x).__name__
        guard = state = None
        if isinstance(x, torch.nn.Module):
            guard = ModuleGuard(x)
        elif isinstance(x, torch.optim.Optimizer):
            _PAUSED[0] += 1  # (reading its hyperparameters is not the call's doing)
            try:
                # (its numbers as a scheduler the replay steps again may change them: loose;
                # what changed is then checked against the schedulers' steps)
                loose = OptimizerGuard(x, None, _lend.numbers_of(x))
                guard = (OptimizerGuard(x), loose, _values(x))
            finally:
                _PAUSED[0] -= 1
            state = {id(p): (p, dict(s)) for p, s in x.state.items()}
        try:  # weakly: a module the call makes and drops (a loss module) must die with it
            ref = _ref(x)
        except TypeError:
            ref = (lambda y: lambda: y)(x)
        self.seen[id(x)] = (label, ref, dict(getattr(x, "__dict__", {})), guard, state)

    def reasons(self, stepped=(), scheduled=None, inputs=None) -> list:
        """Why the call cannot be replayed: each effect of it that a replay would not redo
        (``stepped``: ids of the schedulers a replay steps again, whose state is theirs;
        ``scheduled``: id of each of their optimizers -> the (before, after) values of its
        scheduler steps; ``inputs``: id of an optimizer -> its numbers the program reads)."""
        scheduled = scheduled or {}
        out = []
        for label, ref, attrs, guard, state in self.seen.values():
            x = ref()
            if x is None or id(x) in stepped:
                continue
            now = getattr(x, "__dict__", {})
            for k in [*attrs, *(k for k in now if k not in attrs)]:
                if k in _BOOKKEEPING:
                    continue
                a, b = attrs.get(k, _MISSING), now.get(k, _MISSING)
                if not _same(a, b):
                    what = "deletes" if b is _MISSING else "sets"
                    was = "unset" if a is _MISSING else _short(a)
                    out.append(
                        f"it {what} the Python attribute {label}.{k} (it was {was}), which a "
                        f"replay would not redo; keep a count in a lazy tensor, or set it "
                        f"outside the step"
                    )
            if type(guard) is tuple:
                strict, loose, entry = guard
                guard = strict
                steps = scheduled.get(id(x))
                if (
                    steps
                    and not strict.holds()
                    and loose.holds()
                    and _set_by_schedulers(entry, _values(x), steps, inputs.get(id(x), ()))
                ):
                    guard = None  # its schedulers' doing, which a replay redoes
            if guard is not None and not guard.holds():
                out.append(
                    f"it changes what a replay checks ({guard.why()}), which a replay would "
                    f"not redo; do that outside the step"
                )
            for p, entries in (state or {}).values():
                after = x.state.get(p, {})
                for k in [*entries, *(k for k in after if k not in entries)]:
                    if not _same(entries.get(k, _MISSING), after.get(k, _MISSING)):
                        out.append(
                            f"it sets {label}'s state entry {k!r} in Python, which a replay "
                            f"would not redo; keep it in a tensor the step updates in place"
                        )
        cpu_rng = self.cpu_rng
        if _rng.seedings() != self.seedings:  # a replay reseeds: CPU torch's stream restarts
            cpu_rng = torch.Generator().manual_seed(torch.initial_seed()).get_state()
        if not torch.equal(torch.get_rng_state(), cpu_rng):
            out.append(
                "it draws from CPU torch's random generator (a host torch.rand, a sampler), "
                "which a replay would not; draw on the lazy device, or outside the step"
            )
        for t, flag in zip(self.entry.tensors, self.flags, strict=True):
            if t.requires_grad is not flag:
                out.append(
                    f"it calls requires_grad_({not flag}) on a "
                    f"{tensor_name(t.shape, t.dtype)}, which a replay would not redo; do "
                    f"that outside the step"
                )
        for ref, view in self.mode.written.values():
            t = ref()
            if t is not None:
                name = self.name(t, view)
                if ".state[" in name:  # (torch's Adam family: its CPU step count)
                    out.append(
                        f"values it computes in Python change from call to call: it writes "
                        f"a host {name} in place with CPU ops, which its program does not "
                        f"hold; give torch's Adam-family optimizers capturable=True"
                    )
                    continue
                out.append(
                    f"it writes a host {name} in place with CPU ops, which its program does "
                    f"not hold; keep that tensor on the lazy device, or update it outside "
                    f"the step"
                )
        return out

    def name(self, base: torch.Tensor, view) -> str:
        """A host tensor as the step reaches it (a variable, a buffer, optimizer state), or a
        view of it (``view``: its shape and dtype; None for the tensor itself)."""
        where = None
        noted = [(label, ref()) for label, ref, *_ in self.seen.values()]
        for label, x in [*self.roots, *noted]:
            if x is base:
                where = label
            elif isinstance(x, torch.nn.Module):
                found = [n for n, b in x.named_buffers() if b is base]
                found += [n for n, p in x.named_parameters() if p is base]
                where = f"{label}.{found[0]}" if found else None
            elif isinstance(x, torch.optim.Optimizer):
                found = [k for s in x.state.values() for k, v in s.items() if v is base]
                where = f"{label}.state[...][{found[0]!r}]" if found else None
            if where is not None:
                break
        what = tensor_name(base.shape, base.dtype)
        if where is not None:
            what = f"tensor {where} ({what})"
        return what if view is None else f"view ({tensor_name(*view)}) of {what}"


def _short(x) -> str:
    text = repr(x) if type(x) in _VALUES else f"a {type(x).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------------------------------------
# A traced call, step by step: what is live as it begins, the call itself under hooks, what
# each tensor left pending is to it, then the program, its sources, bindings and guards.


class _Entry:
    """The lazy tensors live as a traced call begins, and its arguments made lazy. It holds the
    tensors strongly until the call is analysed: no id here is reused meanwhile."""

    def __init__(self, leaves: list):
        self.tensors = entry = live()
        self.nodes = {id(t): t._ir.node for t in entry}
        self.grads = {id(t): t.grad for t in entry if t.requires_grad and t.is_leaf}
        self.lazy = lazy = [
            to_lazy(x) if isinstance(x, torch.Tensor) and not isinstance(x, LazyTensor) else x
            for x in leaves
        ]
        # Data node -> the tensors holding it at entry. Tensors that share data (a gradient and
        # the momentum buffer cloned from it) are one source: a replay reads whichever of them
        # is still alive then.
        self.holders = holders = {}
        for t in entry:
            holders.setdefault(id(self.nodes[id(t)]), []).append(t)
        self.arg_nodes = arg_nodes = {}  # id of a data node -> the argument it is
        # The argument nodes themselves, held: the call may rebind an argument (mark_sharding
        # places it anew), and a node that died could lend its id to a parameter of the
        # program, which would then be read from that argument at a replay.
        self.arg_data = []
        # Per argument index: the placement (annotation) its data had as the call began, which
        # a replay's argument must have too (the call may place it anew: mark_sharding).
        self.arg_specs = {}
        aliased = False  # an argument's data reaches the program another way too
        for i, x in enumerate(lazy):
            if isinstance(x, LazyTensor):
                node = x._ir.node
                if type(node) is DeviceData:
                    others = [h for h in holders.get(id(node), ()) if h is not x]
                    aliased = aliased or id(node) in arg_nodes or bool(others)
                    arg_nodes[id(node)] = i
                    self.arg_data.append(node)
                    self.arg_specs[i] = node.sharding
        self.reasons = []  # why its arguments keep the call from being replayed
        if aliased:
            self.reasons.append(
                "its arguments share data with each other or with tensors it reads (the same "
                "tensor passed twice, a clone or detach of a parameter), which its program "
                "reads as one input"
            )
        if any(isinstance(x, LazyTensor) and x.requires_grad for x in leaves):
            self.reasons.append(
                "a lazy argument requires grad: its gradient goes to the caller's tensor, "
                "which a replay of another call's argument cannot follow"
            )

    def held(self) -> set:
        """Ids of the data nodes that tensors holding data still hold, leaving out the tensors
        only this entry keeps alive (a ``.grad`` that ``zero_grad()`` dropped during the call):
        once the call is analysed nothing can read those, so their data may be donated."""
        # (a comprehension: no loop name left holding the last gradient)
        grads = Counter(id(g) for g in self.grads.values() if g is not None)
        nodes = self.nodes
        # The entry's own references to a tensor: its tensor list, its holders list, each
        # .grad it noted.
        return _donation.held(live(), lambda tid: 2 + grads.get(tid, 0) if tid in nodes else 0)


def _call(fn, structure, lazy: list, plan: Replay, effects: _Effects | None):
    """Run ``fn`` on the lazy arguments, noting the optimizers it steps, the modules it calls,
    the host tensors its program reads and its other ``effects``; ``plan`` gets the result's
    structure and reasons from what the call did (``effects`` None: not looked for). Returns
    ``(its result's leaves, lazy ones detached, optimizers, modules, host reads)``; the result
    itself, with its autograd graph, goes with this frame."""
    optimizers: dict = {}
    modules: dict = {}
    lending = _lend.Lending()
    reads = [0]  # host reads before the optimizer's step

    def saw_optimizer(opt, args, kwargs):
        optimizers.setdefault(id(opt), opt)  # returns None: the arguments stay as they are
        if effects is not None:
            effects.note(opt)
        # Its hyperparameters are lent to the step as lazy tensors that the program reads
        # (_lend): a scheduled rate is an input of the program, not a constant of it. (A host
        # tensor one whose step read it into Python stays one, compared by value.)
        reads[0] = _step.host_read_count()
        _PAUSED[0] += 1
        try:
            lending.lend(opt, host=opt not in _KEEPS_HOST)
        finally:
            _PAUSED[0] -= 1

    def stepped_optimizer(opt, args, kwargs):
        if lending.host and opt is not None and _step.host_read_count() != reads[0]:
            _KEEPS_HOST.add(opt)  # it read a lent host tensor into Python
        lending.give_back()

    def saw_module(m, args):
        # (torch.compile's module: its graph calls its submodules without hooks. No call of
        # saw_module from itself: a closure referring to itself would keep this call's
        # state alive until a garbage collection, and with it what it refers to.)
        dynamo = sys.modules.get("torch._dynamo.eval_frame")
        compiled = dynamo is not None and isinstance(m, dynamo.OptimizedModule)
        for sub in (m, *m._orig_mod.modules()) if compiled else (m,):
            ref = modules.get(id(sub))
            if ref is None or ref() is not sub:  # (a dead module's id can be reused)
                modules[id(sub)] = _ref(sub)  # weakly: a module made and dropped by the call dies
                if effects is not None:
                    effects.note(sub)

    hooks = [
        _optimizer.register_optimizer_step_pre_hook(saw_optimizer),
        _optimizer.register_optimizer_step_post_hook(stepped_optimizer),
        _ModuleHook(saw_module),
    ]
    global _STEPPED
    outer, _STEPPED = _STEPPED, []
    try:
        mode = contextlib.nullcontext() if effects is None else effects.mode
        with _step.watch() as seen, _tensor.host_reads() as host_reads, mode:
            args, kwargs = unflatten(structure, lazy)
            with warnings.catch_warnings():  # (torch's about the hook above: harmless)
                warnings.filterwarnings("ignore", message=_GLOBAL_HOOKS_WARNING)
                out = fn(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
        stepped_optimizer(None, (), {})  # (a step that raised)
        stepped, _STEPPED = _STEPPED, outer
    scheduled: dict = {}  # id of an optimizer -> its replayed schedulers' (before, after) values
    for ref, before, with_args, values_before, values_after in stepped:
        name = type(ref()).__name__
        if with_args:
            plan.reasons.append(
                f"it steps the scheduler {name} with arguments, which a replay would pass "
                f"again as they were; step it outside the step"
            )
        elif before < len(host_reads):
            plan.reasons.append(
                f"it steps the scheduler {name} before its optimizer reads the learning rate; "
                f"call scheduler.step() after optimizer.step(), as torch's order is"
            )
        else:
            plan.schedulers.append(ref)
            opt = getattr(ref(), "optimizer", None)
            scheduled.setdefault(id(opt), []).append((values_before, values_after))
    if seen.host_reads:
        plan.reasons.append(
            "it reads a tensor's value into Python (.item(), .cpu(), printing), so what it "
            "does next can depend on the data; read results after the call instead"
        )
    if seen.mark_steps:
        plan.reasons.append("it calls mark_step(); a compiled step runs as one program")
    if effects is not None:
        inputs = {id(opt): lending.numbers(opt) for opt in optimizers.values()}
        plan.effects = effects.reasons({id(r()) for r in plan.schedulers}, scheduled, inputs)
        plan.reasons += plan.effects
    out_leaves: list = []
    plan.structure = flatten(out, out_leaves)
    # Results are returned detached: a replay has no autograd graph to give them.
    outputs = [wrap(o._ir) if isinstance(o, LazyTensor) else o for o in out_leaves]
    # A module the call created and dropped (a loss module built in ``forward``) is gone: a
    # replay will not call it, and a traced call would build it again. No guard on it.
    called = [m for ref in modules.values() if (m := ref()) is not None]
    return outputs, list(optimizers.values()), called, host_reads, lending


def _new_gradients(entry: _Entry, plan: Replay):
    """The gradients a traced call made: ``({id(gradient): the tensor it is the .grad of}, ids
    of the view bases only they hold, its guards on gradients, {id(a .grad at entry that still
    is): its tensor})``: a GradGuard per tensor it gave a new ``.grad``, an UnsetGradGuard per
    tensor whose ``.grad`` was None before and after it (a step ending in ``zero_grad()``: a
    ``.grad`` set since would be accumulated into by a traced call). ``plan.cleared`` gets the
    tensors whose ``.grad`` it set to None (``zero_grad()`` after a backward outside the step),
    which a replay sets to None too; its reasons, a ``.grad`` it set to another tensor."""
    grad_of, guards, kept = {}, [], {}
    for t in entry.tensors:
        if id(t) in entry.grads:
            g, was = t.grad, entry.grads[id(t)]
            if isinstance(g, LazyTensor) and id(g) not in entry.nodes:
                grad_of[id(g)] = t
                guards.append(GradGuard(t, was is None))
            elif g is None:
                if was is None:
                    guards.append(UnsetGradGuard(t))
                else:
                    plan.cleared.append(_ref(t))
            elif g is was:
                kept[id(g)] = t
            else:
                plan.reasons.append(
                    f"it sets the .grad of a {tensor_name(t.shape, t.dtype)} to a tensor from "
                    f"before the call, which a replay would not redo; do that outside the step"
                )
    # A new gradient can be a view (the transpose of a product): its base lives on only
    # through the view's link, which a replay does not recreate (nothing else reads it).
    bases = set()
    for t in grad_of.values():
        v = t.grad._view
        while v is not None:
            b = base_of(v[0])
            if not isinstance(b, LazyTensor) or id(b) in entry.nodes:
                break
            bases.add(id(b))
            v = b._view
    return grad_of, bases, guards, kept


def _roles(leaves, entry: _Entry, outputs, grad_of, bases, kept):
    """``_classify`` of the tensors a traced call left pending, after a garbage collection if
    some seem to outlive it: they may be held only by reference cycles (an autograd graph
    returned with a result), which must go before the step is blamed."""
    out_pos = {id(o): j for j, o in enumerate(outputs) if isinstance(o, LazyTensor)}
    arg_pos = {id(x): i for i, x in enumerate(entry.lazy) if isinstance(x, LazyTensor)}
    classified = _classify(leaves, entry.nodes, out_pos, arg_pos, grad_of, bases, kept)
    if classified[3]:
        classified = None
        gc.collect()
        classified = _classify(leaves, entry.nodes, out_pos, arg_pos, grad_of, bases, kept)
    return classified[:3]


def _hyperparameters(optimizers) -> dict:
    """id -> each host tensor among the optimizers' hyperparameters (a learning rate in a
    tensor, which a scheduler fills in place)."""
    found = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for k, v in group.items():
                for t in v if k != "params" and isinstance(v, (tuple, list)) else (v,):
                    if isinstance(t, torch.Tensor) and not isinstance(t, LazyTensor):
                        found[id(t)] = t
    return found


def _program(plan: Replay, entry: _Entry, pending, roles, host_reads, inputs) -> list:
    """Run the pending tensors' program, and fill ``plan``'s sources (where each parameter's
    data comes from at a replay) and bindings (what each result goes to). Returns the guards
    on what it reads: gradients, requires_grad, host tensors' values, in that order.

    ``inputs``: ``(the optimizers' host tensor hyperparameters (_hyperparameters), ids of the
    host tensors CPU ops read (None: not looked for), a set)``: each hyperparameter the program
    reads that no CPU op did is read afresh at every replay (``HOSTREAD``), its id added to the
    set: a scheduler's rate is an input of the program, not a constant of it."""
    hyper, cpu_read, fresh, numbers = inputs
    arg_nodes, holders = entry.arg_nodes, entry.holders
    for i, x in enumerate(entry.lazy):
        if isinstance(x, LazyTensor) and type(x._ir.node) is DeviceData:
            arg_nodes.setdefault(id(x._ir.node), i)  # placed inside the step
            entry.arg_data.append(x._ir.node)
    key_node = _rng.current_key()
    key_node = key_node.node if key_node is not None else None
    read_from = {id(node): refs for node, refs in host_reads}
    # A gradient at entry -> the tensor it is the .grad of.
    grad_owner = {id(g): t for t in entry.tensors if (g := entry.grads.get(id(t))) is not None}
    grad_owners, requires, hosts = [], [], []
    # Donated: what a replay reads from a tensor (or an argument) the step rebinds, never a
    # constant the plan keeps to pass again.
    only = holders.keys() | arg_nodes.keys()
    with _runtime_checks.deferred():  # a failed program check comes once results are bound
        (_, exe, g, arrays), where = _step.run(pending, entry.held(), only)
    plan.exe = exe
    for p, a in zip(g.params, arrays, strict=True):
        plan.shapes.append(p.shape)
        pid = id(p)
        # (an argument's placement as it was passed; the call may have placed it anew)
        arg = arg_nodes.get(pid)
        plan.specs.append(p.sharding if arg is None else entry.arg_specs.get(arg))
        if arg is not None:
            plan.sources.append((ARG, arg))
        elif pid in holders:
            owner = grad_owner.get(id(holders[pid][0])) if len(holders[pid]) == 1 else None
            if owner is not None:  # read as p.grad, whichever tensor that is at a replay
                plan.sources.append((PGRAD, _ref(owner)))
                grad_owners.append(owner)
                continue
            plan.sources.append((STATE, tuple(_ref(h) for h in holders[pid])))
            if len(holders[pid]) == 1:  # (aliases may differ; the one read then is unknown)
                requires.append(RequiresGradGuard(holders[pid][0]))
        elif p is key_node:
            plan.sources.append((RNG, None))
        elif pid in numbers:  # a number lent to an optimizer's step: its value then
            plan.sources.append((HYPER, numbers[pid]))
        else:
            refs = read_from.get(pid)
            host = refs[0]() if refs is not None else None
            if (
                host is not None
                and id(host) in hyper
                and (cpu_read is None or id(host) not in cpu_read)
            ):
                plan.sources.append((HOSTREAD, refs[0]))
                fresh.add(id(host))
                continue
            plan.sources.append((CONST, a))
            plan.const_bytes.append(value_bytes(p.handle))
            # A host tensor (or the base of the view) read that outlives the call: changed in
            # place later (a tensor learning rate a scheduler fills), it must be read again.
            for ref in read_from.get(pid, ()):
                host = ref() if ref is not None else None
                if host is not None:
                    hosts.append(HostGuard(host))
    plan.bindings = [(kind, x, k) for (kind, x), k in zip(roles, where, strict=True)]
    grad_owners += [x() for kind, x, _ in plan.bindings if kind is PGRAD]
    # p must have a lazy .grad to read and write (one guard per tensor)
    grad_reads = [GradReadGuard(t) for t in {id(t): t for t in grad_owners}.values()]
    return grad_reads + requires + hosts


def trace(fn, leaves: list, structure, watch: bool = True) -> tuple[Replay, list]:
    """Run one call of the step as ``fn(...); mark_step()`` would, and make its plan: returns
    ``(plan, the call's result leaves)``, the lazy ones holding their results. ``watch``:
    whether to look for its effects outside the program (``_Effects``); a plan made without
    must not be replayed, only compared with the next."""
    _transformers.patch()  # (transformers imported since: its warn-only checks read no data)
    if any(_pending(t) for t in live()):
        _step.mark_step()  # the step's program holds only the step
    entry = _Entry(leaves)
    plan = Replay()
    seedings = _rng.seedings()
    plan.watched = watch
    effects = _Effects(fn, entry) if watch else None
    called = _call(fn, structure, entry.lazy, plan, effects)
    outputs, optimizers, modules, host_reads, lending = called
    cpu_read = None if effects is None else effects.mode.read
    effects = None
    if _rng.seedings() != seedings:  # it reseeded: a replay reseeds the same way
        plan.reseed = torch.initial_seed()
    plan.reasons += entry.reasons
    plan.reasons += [
        f"it returns a tensor on {o.device}, not a lazy tensor"
        for o in outputs
        if isinstance(o, torch.Tensor) and not isinstance(o, LazyTensor)
    ]
    plan.statics = [None if isinstance(o, LazyTensor) else o for o in outputs]
    grad_of, bases, grad_guards, kept = _new_gradients(entry, plan)
    pending, roles, reasons = _roles(leaves, entry, outputs, grad_of, bases, kept)
    plan.reasons += reasons
    read_guards = []
    inputs: set = set()  # ids of the hyperparameters read afresh at every replay
    if pending:
        hyper = _hyperparameters(optimizers)
        read_guards = _program(
            plan, entry, pending, roles, host_reads, (hyper, cpu_read, inputs, lending.nodes)
        )
        hyper = None
        for kind, i, _ in plan.bindings:
            if kind is HOST:
                write_host(leaves[i], entry.lazy[i]._ir.node)
    else:
        plan.reasons.append("it computes nothing on the lazy device")
    _rng.next_step()
    # A parameter's requires_grad is checked once: its module's guard, checked first, holds
    # only while the module has that very tensor, requiring grad as traced.
    checked = {id(p) for m in modules for p in m._parameters.values() if p is not None}
    read_guards = [
        g for g in read_guards if not (type(g) is RequiresGradGuard and id(g.ref()) in checked)
    ]
    # The guard table, checked in this order: the cheap checks first, host values last.
    plan.guards = (
        *(OptimizerGuard(opt, inputs, lending.numbers(opt)) for opt in optimizers),
        *(ConditionGuard(*c) for c in lending.conditions),
        *map(ModuleGuard, modules),
        *grad_guards,
        *read_guards,
    )
    plan.checks = as_runs(plan.guards)
    return plan, outputs
