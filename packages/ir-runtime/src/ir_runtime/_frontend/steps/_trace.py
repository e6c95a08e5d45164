"""Tracing one call of a compiled step: run it as ``mark_step`` would, and make its plan.

The live tensors are taken stock of as the call begins (``_Entry``); ``fn`` runs under hooks
that note the optimizers it steps and the modules it calls (``_call``); what it left pending is
classified by what each tensor is to the call (``_classify``); the program runs, and each of
its inputs and results gets its role in the plan (``_program``); last, the guard table.
"""

from __future__ import annotations

import gc
import weakref
from collections import Counter

import torch
import torch.nn.modules.module as _module
import torch.optim.optimizer as _optimizer

from ir_core import DeviceData
from ir_runtime import _donation, _runtime_checks
from ir_runtime._frontend.recording import _rng, _tensor
from ir_runtime._frontend.recording._api import to_lazy
from ir_runtime._frontend.recording._tensor import LazyTensor, base_of, live, wrap
from ir_runtime._frontend.steps import _step
from ir_runtime._frontend.steps._guards import (
    GradGuard,
    GradReadGuard,
    HostGuard,
    ModuleGuard,
    OptimizerGuard,
    RequiresGradGuard,
    UnsetGradGuard,
    as_runs,
)
from ir_runtime._frontend.steps._replay import (
    ARG,
    CONST,
    DROP,
    GRAD,
    OUT,
    RNG,
    STATE,
    Replay,
    flatten,
    unflatten,
    value_bytes,
)
from ir_runtime._frontend.steps._step import pending as _pending

_ref = weakref.ref


def _classify(leaves, entry_nodes, out_pos, arg_pos, grad_of, bases):
    """What each live lazy tensor is to a traced call: ``(pending tensors, their roles, reasons
    the call cannot be replayed, whether a tensor it made outlives it unexplained)``."""
    pending, roles, reasons, survivors = [], [], [], False
    for t in live():
        tid = id(t)
        busy = _pending(t)
        if busy and _step.SET_ASIDE and _step._set_aside(t):
            continue  # set aside by a failed step: left out, as mark_step leaves it
        if tid in arg_pos:
            # Data an argument is rebound to (mark_sharding of the batch) is where a replay
            # places the next argument anyway; computed values go back to a lazy argument.
            if not busy or not isinstance(leaves[arg_pos[tid]], LazyTensor):
                if busy:  # a host tensor's own lazy copy, written by the step
                    pending.append(t)
                    roles.append((DROP, None))
                continue
            role = (ARG, arg_pos[tid])
        elif tid in entry_nodes:
            if not busy:
                if t._ir.node is not entry_nodes[tid]:
                    reasons.append(
                        f"it rebinds a tensor ({list(t.shape)}, {t.dtype}) to other data "
                        f"without computing it (mark_sharding of data, .data =): do that "
                        f"outside the step"
                    )
                continue
            role = (STATE, _ref(t))
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
        aliased = False  # an argument's data reaches the program another way too
        for i, x in enumerate(lazy):
            if isinstance(x, LazyTensor):
                node = x._ir.node
                if type(node) is DeviceData:
                    others = [h for h in holders.get(id(node), ()) if h is not x]
                    aliased = aliased or id(node) in arg_nodes or bool(others)
                    arg_nodes[id(node)] = i
                    self.arg_data.append(node)
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


def _call(fn, structure, lazy: list, plan: Replay):
    """Run ``fn`` on the lazy arguments, noting the optimizers it steps, the modules it calls
    and the host tensors its program reads; ``plan`` gets the result's structure and reasons
    from what the call did. Returns ``(its result's leaves, lazy ones detached, optimizers,
    modules, host reads)``; the result itself, with its autograd graph, goes with this frame."""
    optimizers: dict = {}
    modules: dict = {}

    def saw_optimizer(opt, args, kwargs):
        optimizers.setdefault(id(opt), opt)  # returns None: the arguments stay as they are

    def saw_module(m, args):
        ref = modules.get(id(m))
        if ref is None or ref() is not m:  # (a dead module's id can be reused)
            modules[id(m)] = _ref(m)  # weakly: a module made and dropped by the call dies

    hooks = [
        _optimizer.register_optimizer_step_pre_hook(saw_optimizer),
        _module.register_module_forward_pre_hook(saw_module),
    ]
    try:
        with _step.watch() as seen, _tensor.host_reads() as host_reads:
            args, kwargs = unflatten(structure, lazy)
            out = fn(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    if seen.host_reads:
        plan.reasons.append(
            "it reads a tensor's value into Python (.item(), .cpu(), printing), so what it "
            "does next can depend on the data; read results after the call instead"
        )
    if seen.mark_steps:
        plan.reasons.append("it calls mark_step(); a compiled step runs as one program")
    out_leaves: list = []
    plan.structure = flatten(out, out_leaves)
    # Results are returned detached: a replay has no autograd graph to give them.
    outputs = [wrap(o._ir) if isinstance(o, LazyTensor) else o for o in out_leaves]
    # A module the call created and dropped (a loss module built in ``forward``) is gone: a
    # replay will not call it, and a traced call would build it again. No guard on it.
    called = [m for ref in modules.values() if (m := ref()) is not None]
    return outputs, list(optimizers.values()), called, host_reads


def _new_gradients(entry: _Entry):
    """The gradients a traced call made: ``({id(gradient): the tensor it is the .grad of}, ids
    of the view bases only they hold, its guards on gradients)``: a GradGuard per tensor it
    gave a new ``.grad``, an UnsetGradGuard per tensor whose ``.grad`` was None before and
    after it (a step ending in ``zero_grad()``: a ``.grad`` set since would be accumulated
    into by a traced call)."""
    grad_of, guards = {}, []
    for t in entry.tensors:
        if id(t) in entry.grads:
            g = t.grad
            if isinstance(g, LazyTensor) and id(g) not in entry.nodes:
                grad_of[id(g)] = t
                guards.append(GradGuard(t, entry.grads[id(t)] is None))
            elif g is None and entry.grads[id(t)] is None:
                guards.append(UnsetGradGuard(t))
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
    return grad_of, bases, guards


def _roles(leaves, entry: _Entry, outputs, grad_of, bases):
    """``_classify`` of the tensors a traced call left pending, after a garbage collection if
    some seem to outlive it: they may be held only by reference cycles (an autograd graph
    returned with a result), which must go before the step is blamed."""
    out_pos = {id(o): j for j, o in enumerate(outputs) if isinstance(o, LazyTensor)}
    arg_pos = {id(x): i for i, x in enumerate(entry.lazy) if isinstance(x, LazyTensor)}
    classified = _classify(leaves, entry.nodes, out_pos, arg_pos, grad_of, bases)
    if classified[3]:
        classified = None
        gc.collect()
        classified = _classify(leaves, entry.nodes, out_pos, arg_pos, grad_of, bases)
    return classified[:3]


def _program(plan: Replay, entry: _Entry, pending, roles, host_reads) -> list:
    """Run the pending tensors' program, and fill ``plan``'s sources (where each parameter's
    data comes from at a replay) and bindings (what each result goes to). Returns the guards
    on what it reads: gradients, requires_grad, host tensors' values, in that order."""
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
    grad_reads, requires, hosts = [], [], []
    # Donated: what a replay reads from a tensor (or an argument) the step rebinds, never a
    # constant the plan keeps to pass again.
    only = holders.keys() | arg_nodes.keys()
    with _runtime_checks.deferred():  # a failed program check comes once results are bound
        (_, exe, g, arrays), where = _step.run(pending, entry.held(), only)
    plan.exe = exe
    for p, a in zip(g.params, arrays, strict=True):
        plan.shapes.append(p.shape)
        pid = id(p)
        if pid in arg_nodes:
            plan.sources.append((ARG, arg_nodes[pid]))
        elif pid in holders:
            plan.sources.append((STATE, tuple(_ref(h) for h in holders[pid])))
            if len(holders[pid]) == 1:  # (aliases may differ; the one read then is unknown)
                t = holders[pid][0]
                requires.append(RequiresGradGuard(t))
                owner = grad_owner.get(id(t))
                if owner is not None:  # read as p.grad: p must still have it
                    grad_reads.append(GradReadGuard(owner, t))
        elif p is key_node:
            plan.sources.append((RNG, None))
        else:
            plan.sources.append((CONST, a))
            plan.const_bytes.append(value_bytes(p.handle))
            # A host tensor (or the base of the view) read that outlives the call: changed in
            # place later (a tensor learning rate a scheduler fills), it must be read again.
            for ref in read_from.get(pid, ()):
                host = ref() if ref is not None else None
                if host is not None:
                    hosts.append(HostGuard(host))
    plan.bindings = [(kind, x, k) for (kind, x), k in zip(roles, where, strict=True)]
    return grad_reads + requires + hosts


def trace(fn, leaves: list, structure) -> tuple[Replay, list]:
    """Run one call of the step as ``fn(...); mark_step()`` would, and make its plan: returns
    ``(plan, the call's result leaves)``, the lazy ones holding their results."""
    if any(_pending(t) for t in live()):
        _step.mark_step()  # the step's program holds only the step
    entry = _Entry(leaves)
    plan = Replay()
    outputs, optimizers, modules, host_reads = _call(fn, structure, entry.lazy, plan)
    plan.reasons += entry.reasons
    plan.reasons += [
        f"it returns a tensor on {o.device}, not a lazy tensor"
        for o in outputs
        if isinstance(o, torch.Tensor) and not isinstance(o, LazyTensor)
    ]
    plan.statics = [None if isinstance(o, LazyTensor) else o for o in outputs]
    grad_of, bases, grad_guards = _new_gradients(entry)
    pending, roles, reasons = _roles(leaves, entry, outputs, grad_of, bases)
    plan.reasons += reasons
    read_guards = []
    if pending:
        read_guards = _program(plan, entry, pending, roles, host_reads)
    else:
        plan.reasons.append("it computes nothing on the lazy device")
    _rng.next_step()
    # The guard table, checked in this order: the cheap checks first, host values last.
    plan.guards = (
        *map(OptimizerGuard, optimizers),
        *map(ModuleGuard, modules),
        *grad_guards,
        *read_guards,
    )
    plan.checks = as_runs(plan.guards)
    return plan, outputs
