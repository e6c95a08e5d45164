"""The front end's one internal seam: what tests and tools may read of its state.

Everything else under ``ir_runtime._frontend`` may change without notice; these functions
keep their meaning. They read; none of them changes a tensor, a graph or a cache.
"""

from __future__ import annotations

from ir_core import DeviceData
from ir_runtime._executable import LAST_RUN
from ir_runtime._frontend.recording import _dispatch, _fast, _record
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.steps import _step


def value_of(t: LazyTensor):
    """The ir-core ``Value`` a lazy tensor stands for now: pending IR, or data it holds."""
    return t._ir


def data_of(t: LazyTensor):
    """The device array a lazy tensor holds, or None while its value is pending. Held, it
    keeps its buffers from being donated; an array derived from it in jax (a shard's
    ``.data``, a ``device_put`` that reuses the buffers) does not, and is valid only until the
    step that replaces the tensor's data."""
    node = t._ir.node
    return node.handle if type(node) is DeviceData else None


def annotation_of(t: LazyTensor):
    """The sharding the user annotated on ``t`` (``mark_sharding``), or None."""
    return t._spec


def last_executable():
    """The ``Executable`` that ran last (a step's program: its ``donate``, its ``memory()``)."""
    return LAST_RUN[0]


def live_tensors() -> list:
    """Every lazy tensor still alive, oldest first."""
    return _fast.live()


def live_references() -> list:
    """The live registry itself: weak references, oldest first (dead ones until compaction)."""
    return _fast.live_references()


def device_orders_checked() -> bool:
    """Whether every op is checked for tensors over two device orders (from the second device
    order a placement uses on)."""
    return _fast.checking_devices()


def set_aside() -> list:
    """The live tensors a failed step set aside (left out of later steps until written)."""
    return [t for t in _fast.live() if _step.SET_ASIDE and _step._set_aside(t)]


def functional_of(func):
    """The out-of-place overload the front end records for an in-place ATen op, or None."""
    return _dispatch.functional_of(func)


def prepared(func, args, kwargs) -> tuple:
    """``(memo key, operands, attributes)`` the front end records for ``func(*args,
    **kwargs)``: operands as ir-core Values, attributes with every default filled in."""
    return _record.prepare(_record.plan_of(func), args, kwargs)
