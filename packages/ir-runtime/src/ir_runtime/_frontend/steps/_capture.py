"""``compile_step``: a training step traced like any other, then replayed without its Python.

This module decides when to trace and when to replay; ``_trace`` traces one call into a
``Replay`` (``_replay``), which runs it again; ``_guards`` holds the checks a replay makes first.

Tracing a step runs torch's dispatcher, autograd engine and optimizer for every op, every step:
on a small model that costs more than the program it records. A compiled step is traced on its
first calls exactly as ``mark_step`` would run it; once a call records the same program as an
earlier one (of the last four with its argument key), reads the same tensors, binds its results
to the same tensors and needs the same of gradients, later calls skip the function and run the
compiled program on the tensors' current data, as ``jax.jit`` does. A key keeps up to four such
plans and replays the first whose guards hold: a micro-batch step traced with ``p.grad`` None
(it makes the gradients) and with ``p.grad`` set (it adds to them) replays both ways.

What a replay checks before it runs (and traces again when any differs): the argument key (the
arguments' shapes, dtypes and structure, Python arguments by value, grad mode) picks the plans of
its traced calls; then each plan's guard table (``Replay.guards``; the guard kinds are in
``_guards``), top to bottom: every optimizer the step stepped (hyperparameters, state table,
parameter lists), every module it called that outlives the call (its ``training`` flag, which
parameters, buffers and submodules it has, which parameters require grad), whether each tensor it
gave a new ``.grad`` had one as the call began, that each tensor whose ``.grad`` the program reads
or writes in place has one (whichever tensor: the plan reads ``p.grad`` as it is then), whether the
tensors the program reads still require grad, and the values of host tensors the program read (or
of their view's base); last, as its inputs are read, that every tensor it reads still exists and
holds data of the shape traced, placed as traced (a ``mark_sharding`` of a parameter or of an
argument since is traced again at the new placement, never undone by the replay). When no
plan's guards all hold, the first plan's first failing check says why in
``CompiledStep.last_guard_failure``. A guard failing call after call is named in
a ``CaptureWarning`` (and ``replaying`` reads False). A step ending in ``zero_grad()`` also checks
that the ``.grad`` it left None is still None. Anything else the function reads from Python (a
global, a closure) is frozen at capture, as in ``jax.jit``: pass it as an argument.

A replay is the call it replaces: it redoes the program's writes (tensors, gradients, lazy
arguments, and host arguments the step wrote in place, copied back), the random stream's step, a
``torch.manual_seed`` the step called (the same seed again, CPU torch's generator too), and the
``.grad`` it set to None (``zero_grad()``). A call with any other effect is not replayed, and its
reason names the effect (``_trace``'s ``_Effects``): a host tensor written by CPU ops (a counter,
``AveragedModel``'s ``n_averaged``), directly or through a view; a Python attribute set on a
module, optimizer or scheduler it reaches, or on the object of a bound method (``self.count +=
1``); optimizer state set in Python, or created; ``requires_grad_``; a module's parameters, buffers
or submodules replaced or registered; a draw from CPU torch's generator. A one-time effect (the
first step's optimizer state) only keeps that call from being the one replayed. Other Python side
effects (printing, appending to a list, a global) happen on traced calls only.

A step is never replayed (it stays traced every call, with a ``CaptureWarning`` saying why) when
its recording shows Python work a replay could not reproduce: it reads values to the host,
calls ``mark_step``, keeps a tensor it made outside its return value, rebinds a tensor to new
data without computing it, takes arguments that share data or a lazy argument that requires
grad, or feeds the program values made in Python that change from call to call (Adam's bias
corrections, computed from its CPU step count).
"""

from __future__ import annotations

import functools
import sys
import warnings

from ir_core import DeviceData
from ir_runtime import _metrics, _profile
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.steps import _hot, _step
from ir_runtime._frontend.steps._hot import call_key
from ir_runtime._frontend.steps._replay import (
    Miss,
    Replay,
    flat,
    flatten,
    unflatten,
)
from ir_runtime._frontend.steps._trace import trace


class CaptureWarning(UserWarning):
    """A compiled step cannot be replayed, so every call traces it; the message says why."""


_SIGNATURES = 32  # argument signatures a compiled step keeps plans for
_VARIANTS = 4  # plans per signature, each replayed when its guards hold
_VARYING = (
    "values it computes in Python change from call to call (a count kept in Python; the "
    "learning rate, in a Python number, of an optimizer that is not torch's own): hold such a "
    "value in a tensor, a rate as lr=torch.tensor(1e-3) with capturable=True, and pass other "
    "such values as tensors"
)


def _data_nodes(leaves) -> list:
    """Each argument's data node (None for a host value), the caller's pending work run first.
    No local outlives it holding a node: a replay counts who references an argument's data."""
    nodes = [leaf._ir.node if isinstance(leaf, LazyTensor) else None for leaf in leaves]
    if any(n is not None and type(n) is not DeviceData for n in nodes):
        nodes = None
        _step.mark_step()
        for leaf in leaves:  # one a failed step set aside: run alone, or its error again
            if isinstance(leaf, LazyTensor) and _step.pending(leaf):
                _step.materialize(leaf)
        return _data_nodes(leaves)
    return nodes


def _new_signature(last: tuple, key: tuple) -> str:
    """What differs between two argument keys (``_hot._leaf_key``s after the structure and grad
    mode), as ``last_guard_failure`` says it."""
    then = "a new argument signature, traced (and replayed once two of its calls agree)"
    if last[0] != key[0] or len(last) != len(key):
        return f"the arguments' structure changed: {then}"
    if last[1] != key[1]:
        return f"grad mode changed from {last[1]} to {key[1]}: {then}"
    for k, (a, b) in enumerate(zip(last[2:], key[2:], strict=True)):
        if a != b:
            return f"argument {k} was {_leaf_text(a)}, now {_leaf_text(b)}: {then}"
    return then  # (unreachable: the keys differ)


def _leaf_text(leaf: tuple) -> str:
    if leaf[0] is True and len(leaf) == 3:  # a lazy tensor: (True, Shape, requires_grad)
        return f"a lazy {leaf[1]}" + (" requiring grad" if leaf[2] else "")
    if len(leaf) == 4:  # a host tensor: (False, dims, dtype, requires_grad)
        dtype = str(leaf[2]).removeprefix("torch.")
        return f"a host {dtype}{list(leaf[1])}" + (" requiring grad" if leaf[3] else "")
    return repr(leaf[1])  # a Python value: (type, value)


class CompiledStep:
    """A step function traced on its first calls, then replayed (see ``compile_step``).

    ``replaying``: whether the last call's argument signature is replayed (False while its
    guards keep failing). ``reason``: why the last traced call could not be replayed (None when
    it could). ``last_guard_failure``: why the most recent replay was refused and the call
    traced instead, as the first guard of its plan's table that failed says it in a line
    (``"optimizer SGD's lr changed from 0.1 to 0.05"``, ``"module Linear(...) switched to
    eval()"``), or what differs from the replayed call before it when the arguments' signature
    is new (``"argument 0 was a lazy float32[8,4], now a lazy float32[16,4]: ..."``); None
    until then.
    Each guard failure also counts ``StepGuardFailed`` in ``metrics()``.
    """

    def __init__(self, fn):
        self.fn = fn
        # argument key -> the plans replayed for it, the one that last ran first: calls with
        # one key can alternate between plans (a micro-batch that makes p.grad, then one that
        # accumulates into it), each chosen by its guards
        self._replay: dict = {}
        # argument key -> its plans none of whose guards held at the last call: set aside
        # until a new plan is replayed (what changed, a learning rate, may change back)
        self._parked: dict = {}
        self._last: dict = {}  # argument key -> the plans of its last traced calls, newest first
        self._warned: set = set()
        self.reason: str | None = None  # why the last traced call could not be replayed
        self.last_guard_failure: str | None = None  # why the last replay was refused
        self._failures: dict = {}  # argument key -> guard failures since its last replay
        self._key = None  # the last call's argument key
        functools.update_wrapper(self, fn)

    @property
    def replaying(self) -> bool:
        """Whether the last call's argument signature is replayed: it has a plan, and its
        guards have not failed twice since it last replayed."""
        key = self._key
        return key in self._replay and self._failures.get(key, 0) < 2

    # The usual call, positional, is replayed in C when its key has a plan (``_hot.call``);
    # any other call takes ``_call``.
    __call__ = _hot.step_call

    def _call(self, args: tuple, kwargs: dict):
        """A call ``_hot.step_call`` leaves to Python: keywords, nested arguments, a key with
        no plan, a profile recorded. (A replay whose guards fail goes from ``_hot.call`` to
        ``_missed``.)"""
        leaves = args
        if kwargs:
            leaves = None
        else:
            for a in args:
                if isinstance(a, _hot.NESTED):
                    leaves = None
                    break
        if leaves is None:
            leaves = []
            structure = flatten((args, kwargs), leaves)
        else:  # positional tensors and values
            structure = flat(len(args))
        key = call_key(structure, leaves)
        last, self._key = self._key, key
        plans = self._replay.get(key)
        if plans is None and last is not None and last != key and last in self._last:
            self.last_guard_failure = _new_signature(last, key)
        if plans is not None:
            with _profile.span("ir_runtime.replay"):
                out = _hot.run_plans(plans, leaves)
            if type(out) is not Miss:
                self._failures.pop(key, None)
                return out
            return self._missed(key, leaves, structure, out)
        return self._trace(key, leaves, structure)

    def _missed(self, key, leaves, structure, miss: Miss):
        """No plan of ``key`` replays (``miss`` says why its first does not): set them aside,
        and trace the call."""
        self.last_guard_failure = miss.why
        self._parked[key] = self._replay.pop(key)
        _metrics.count("StepGuardFailed")
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        if failures == 2:  # again, right after a trace re-enabled the replay
            self._warn(
                f"a guard fails call after call (the last: {miss.why}); make that value the "
                f"same on every call, or pass it as an argument",
                once="guard",
            )
        return self._trace(key, leaves, structure, missed=True)

    def _trace(self, key, leaves: list, structure, missed: bool = False):
        """Trace the call; ``missed``: its replays' guards failed (what changed, a learning
        rate say, is no reason to refuse the plan: the call is compared with earlier plans, but
        not taken for values that vary from call to call)."""
        _metrics.count("StepTraced")
        # Its effects outside the program are watched (which costs each op a Python call) when
        # this call's plan could be the one replayed: when the last plan was not refused.
        last = self._last.get(key)
        watch = last is None or not last[0].reasons
        with _profile.span("ir_runtime.trace"):
            plan, outputs = trace(self.fn, leaves, structure, watch)
        self._settle(key, plan, missed)
        return unflatten(plan.structure, outputs)  # the lazy ones now hold their results

    def _settle(self, key, plan: Replay, missed: bool) -> None:
        lasts = self._last.pop(key, None) or []
        self._last[key] = [plan, *lasts[: _VARIANTS - 1]]  # the most recent signature last
        last = lasts[0] if lasts and not missed else None
        if len(self._last) > _SIGNATURES:
            stale = next(iter(self._last))
            del self._last[stale]
            self._replay.pop(stale, None)
            self._parked.pop(stale, None)
            self._failures.pop(stale, None)
            self._warn(
                f"it was called with more than {_SIGNATURES} argument signatures (shapes, "
                f"dtypes, Python values; the oldest are dropped): Python numbers among the "
                f"arguments are part of the key, so pass numbers that change as tensors"
            )
        for earlier in lasts:
            if earlier.same_as(plan, grads=False):  # two calls alike: replayed, first
                others = self._replay.pop(key, []) + self._parked.pop(key, [])
                others = [p for p in others if not p.same_as(plan)]
                self._replay[key] = [plan, *others][:_VARIANTS]
                self.reason = None
                return
        if (
            last is not None
            and not plan.reasons
            and last.exe is plan.exe
            and last.const_bytes != plan.const_bytes
        ):
            plan.reasons.append(_VARYING)
        if not plan.watched and last is not None:
            plan.effects = last.effects  # as found when last watched
        if plan.reasons and last is not None and (last.reasons or not last.watched):
            # Refused twice in a row (or now and when last watched: a call after a refused one
            # is not watched): not the first call's one-time setup (optimizer state).
            self.reason = plan.reasons[0]
            if self.reason is _VARYING and last.effects:  # what the last call, watched, did
                self.reason = last.effects[0]  # (a CPU counter the program reads, say)
            self._warn(self.reason)

    def _warn(self, reason: str, once: str | None = None) -> None:
        """A ``CaptureWarning``, once per reason (or per ``once``), pointing at the caller's
        line: the first frame outside this module (a replay's C path calls in with none of
        its own)."""
        tag = reason if once is None else once
        if tag in self._warned:
            return
        self._warned.add(tag)
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        warnings.warn(
            f"compiled step {name} is traced on every call, as mark_step would run it, "
            f"because {reason}",
            CaptureWarning,
            stacklevel=_outside(),
        )


def _outside() -> int:
    """The ``stacklevel`` of the first frame outside this module, for a ``warnings.warn`` made
    in it (level 1: the frame that calls ``warn``, whose caller calls this)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


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


_hot.configure_step(data_nodes_=_data_nodes)
