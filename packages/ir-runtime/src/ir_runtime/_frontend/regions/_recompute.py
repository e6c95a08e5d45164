"""Activation checkpointing on the lazy device: ``torch.utils.checkpoint``, recomputed for real.

torch's ``checkpoint`` (reentrant or not, and ``checkpoint_sequential`` on top of it) drops a
region's activations in the forward pass and runs the region again in the backward pass.
Recorded lazily, that recompute is the same ops on the same values as the forward: XLA's
common-subexpression pass would fold it back into the forward and keep every activation alive,
which is what checkpointing exists to avoid. So the recompute's inputs (its lazy arguments and
the step's random key) first pass through one ``ir::optimization_barrier``, together with the
gradients reaching the region's results (handed to the reentrant form's backward; caught by a
pre-hook on the results' backward nodes in the other): values XLA cannot see through, which it
cannot compute before the backward pass has reached the region. The recomputed ops are new,
and run where the backward needs them (torch_xla's checkpoint does the same).

The recompute runs under the lazy autocast the forward ran under (torch restores only the
autocast of the device types it knows). The lazy device's random stream is saved and restored
by torch's own ``preserve_rng_state`` machinery, through the device module registered as
``torch.lazy`` (``get_rng_state`` / ``set_rng_state``: the step and the offset of the next
random op): dropout in the recompute draws the forward's mask.

A checkpointed function that reads a value to the host (``.item()``, ``.cpu()``, a Python
``if`` on a tensor) is refused (``RecomputeError``): the recompute would read it again in the
backward pass, in the middle of the step.

``install()`` registers ``torch.lazy`` and wraps the two places torch's ``checkpoint`` looks up
at call time (``CheckpointFunction`` and ``_checkpoint_without_reentrant_generator``), so code
that imported ``checkpoint`` earlier (Hugging Face's gradient checkpointing) gets it too.
"""

from __future__ import annotations

import contextlib
import sys
import types

import torch
import torch.utils.checkpoint as _torch_checkpoint

from ir_core import Generic, Value
from ir_runtime._errors import RecomputeError
from ir_runtime._frontend.recording import _convert, _rng
from ir_runtime._frontend.recording._fast import live_references
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.regions import _autocast
from ir_runtime._frontend.steps import _step


def _lazy_in(values) -> bool:
    for v in values:
        if isinstance(v, LazyTensor):
            return True
        if isinstance(v, (tuple, list)) and _lazy_in(v):
            return True
        if isinstance(v, dict) and _lazy_in(v.values()):
            return True
    return False


def barrier(values: list) -> list:
    """``values`` (ir-core Values) through one ``ir::optimization_barrier``: the same values,
    as new nodes XLA cannot fold into the ones they came from."""
    node = Generic("ir::optimization_barrier", values, [v.shape for v in values], {})
    return [Value(node, k) for k in range(len(values))]


class _Identity(torch.autograd.Function):
    """Lazy tensors as the barrier's outputs, gradients passed straight through."""

    @staticmethod
    def forward(ctx, values, *tensors):
        return tuple(wrap(v) for v in values)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *grads)


def _through_barrier(args, kwargs, after=()):
    """The lazy tensors among ``args`` and ``kwargs`` (top level) and the random key through
    one barrier, which also waits for the tensors ``after`` (values the backward pass has just
    computed): new args and kwargs, and the barriered key (None when the step drew none)."""
    slots = [("a", i, a) for i, a in enumerate(args) if isinstance(a, LazyTensor)]
    slots += [("k", k, v) for k, v in kwargs.items() if isinstance(v, LazyTensor)]
    key = _rng.current_key()
    values = [t._ir for _, _, t in slots]
    if key is not None:
        values.append(key)
    if not values:
        return args, kwargs, None
    # (every operand of a barrier exists before any of its results: what ties the recompute
    # to the backward pass, used or not)
    out = barrier(values + [t._ir for t in after if isinstance(t, LazyTensor)])
    n = len(slots)
    tensors = [t for _, _, t in slots]
    new = _Identity.apply(out[:n], *tensors) if n else ()
    args, kwargs = list(args), dict(kwargs)
    for (where, k, _), t in zip(slots, new, strict=True):
        if where == "a":
            args[k] = t
        else:
            kwargs[k] = t
    return tuple(args), kwargs, (out[n] if key is not None else None)


class _Recompute:
    """A checkpointed function as torch calls it again in the backward pass: its inputs through
    the barrier first. ``forward_first``: the first call is the forward itself (the reentrant
    form calls the same function for both)."""

    def __init__(self, fn, forward_first: bool):
        self.fn = fn
        self.calls = 0 if forward_first else 1
        # The lazy autocast of the forward, which the recompute runs under again (torch
        # restores only the autocast of device types it knows).
        self.autocast = _autocast.current()
        self.grads: tuple = ()  # the latest gradients reaching the region's results

    def saw(self, grads) -> None:
        """A pre-hook on a result's backward node: the gradients reaching it."""
        self.grads = tuple(g for g in grads if g is not None)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            return _forward(self.fn, args, kwargs)
        after = self.grads or _newest(args, kwargs)
        self.grads = ()  # (held no longer than needed: torch may keep this object for a while)
        args, kwargs, key = _through_barrier(args, kwargs, after)
        dtype = self.autocast
        cast = _autocast.autocast(_convert.DEVICE.type, dtype=dtype, enabled=dtype is not None)
        with _step.watch() as seen, _rng.keyed(key), cast:
            out = self.fn(*args, **kwargs)
        _refuse_reads(self.fn, seen)
        return out


def _newest(args, kwargs) -> tuple:
    """The most recently made lazy tensor still alive that is not one of the recompute's own
    inputs (torch unpacks those, as new aliases, just before the call), or none."""
    inputs = {id(v._ir.node) for v in (*args, *kwargs.values()) if isinstance(v, LazyTensor)}
    for r in reversed(live_references()):
        t = r()
        if t is not None and id(t._ir.node) not in inputs:
            return (t,)
    return ()


def _forward(fn, args, kwargs):
    with _step.watch() as seen:
        out = fn(*args, **kwargs)
    _refuse_reads(fn, seen)
    return out


def _refuse_reads(fn, seen) -> None:
    """Refuse a checkpointed function that read a value to the host while ``seen`` (a
    ``_step.watch``) watched it."""
    if seen.host_reads:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise RecomputeError(
            f"checkpointed function {name} reads a lazy tensor's value to the host (.item(), "
            f".cpu(), print, a Python if on a tensor): its recompute in the backward pass would "
            f"read it again, in the middle of the step; move the read out of the checkpointed "
            f"region"
        )


_CheckpointFunction = _torch_checkpoint.CheckpointFunction
_generator = _torch_checkpoint._checkpoint_without_reentrant_generator


class CheckpointFunction(_CheckpointFunction):
    """torch's reentrant checkpoint, with the recompute behind a barrier on lazy tensors."""

    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        if _lazy_in(args):
            run_function = _Recompute(run_function, forward_first=True)
        return _CheckpointFunction.forward(ctx, run_function, preserve_rng_state, *args)

    @staticmethod
    def backward(ctx, *grads):
        if isinstance(ctx.run_function, _Recompute):
            ctx.run_function.grads = grads
        return _CheckpointFunction.backward(ctx, *grads)


def _checkpoint_without_reentrant_generator(fn, *rest, **kwargs):
    """torch's non-reentrant checkpoint, with the recompute behind a barrier on lazy tensors
    and the forward refused if it reads to the host."""
    if not _lazy_in(rest) and not _lazy_in(kwargs.values()):
        yield from _generator(fn, *rest, **kwargs)
        return
    recompute = _Recompute(fn, forward_first=False)
    inner = _generator(recompute, *rest, **kwargs)
    next(inner)  # torch's pre-forward logic: saved-tensor hooks on
    refs = live_references()
    mark = refs[-1] if refs else None
    with _step.watch() as seen:
        try:
            yield
        except BaseException as e:
            inner.throw(e)
            raise
        with contextlib.suppress(StopIteration):
            next(inner)  # its post-forward logic: the hooks off again
    _refuse_reads(fn, seen)
    # The region's results (what it made that is still alive): the gradients that reach them
    # are what the recompute waits for.
    nodes = {}
    for r in reversed(live_references()):
        if r is mark:
            break
        t = r()
        if t is not None and t.grad_fn is not None:
            nodes[id(t.grad_fn)] = t.grad_fn
    for node in nodes.values():
        node.register_prehook(recompute.saw)


# -- torch.lazy: the device module torch's RNG helpers look up ---------------------------------


def _get_rng_state(device=None) -> torch.Tensor:
    """Where the lazy stream is: its step and the offset of the next random op."""
    return torch.tensor(_rng.state(), dtype=torch.int64)


def _set_rng_state(state, device=None) -> None:
    _rng.restore(*(int(v) for v in state.tolist()))


def _device_module(kind: str) -> types.ModuleType:
    m = types.ModuleType(f"torch.{kind}", "The lazy device, as torch's RNG helpers see it.")
    m._initialized = True
    m.is_available = lambda: True
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.device = lambda device=None: contextlib.nullcontext()
    m.get_rng_state = _get_rng_state
    m.set_rng_state = _set_rng_state
    return m


def install() -> None:
    """Register ``torch.lazy`` (``torch.xla`` under that name) and route torch's checkpoint
    through the wrappers above."""
    kind = _convert.DEVICE.type
    if getattr(torch, kind, None) is None:
        torch._register_device_module(kind, _device_module(kind))
    _torch_checkpoint.CheckpointFunction = CheckpointFunction
    _torch_checkpoint._checkpoint_without_reentrant_generator = (
        _checkpoint_without_reentrant_generator
    )
    sys.modules.setdefault(f"torch.{kind}", getattr(torch, kind))
