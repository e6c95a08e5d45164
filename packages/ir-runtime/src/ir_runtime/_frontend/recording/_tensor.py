"""The lazy tensor: a torch.Tensor subclass whose value is an ir-core Value.

Every ATen op that reaches ``__torch_dispatch__`` is recorded as a node (``_record``, routed by
``_dispatch``); in-place ops rebind the tensor to the value of their functional form
(``_views``), so no node is ever mutated. Autograd runs above dispatch, so backward ops are
recorded the same way.

A tensor's value and placement are its own, written only by its methods here (``_set``,
``_bind``, ``_restore``, ``_annotate``, the ``data`` setter), which keep them consistent:
``_ir``, its value; ``_spec``, the sharding the user annotated; ``_placed``, where the data it
last held lives (``NEVER_HELD`` until it holds data); ``_held``, which data that was. The one
exception is the C hot path (``_fast.torch_dispatch``), which gives a tensor it has just made
its pending value, as ``__new__`` would. ``_claim`` is the one rule that says where its next
result lands.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref

import torch

from ir_core import DeviceData, Value
from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend.recording import _convert, _fast
from ir_runtime._frontend.recording._convert import host_numpy, shape_of
from ir_runtime._graph import REPLICATED
from ir_runtime._placement import note_order

DATA = torch._C.TensorBase.data  # torch's own .data descriptor
_ref = weakref.ref
# Every lazy tensor, in creation order (weak references, out of the cyclic collector's sight:
# see _fast), so mark_step finds the live ones with pending work in the same order every step:
# a program's outputs are in that order.
live = _fast.live
NEVER_HELD = "never held data"  # _placed of a tensor that has only ever had pending IR


class LazyTensor(torch.Tensor):
    """A tensor on the lazy device: ``_ir`` is its value in the graph being recorded."""

    # Its value lives in a slot: no instance dict is made for it, and reading it is faster.
    __slots__ = ("_ir",)
    # Class-level defaults, set on an instance only when they differ (tracing stays cheap).
    _spec = None  # the sharding the user annotated
    _placed = NEVER_HELD  # the sharding of the data it last held (None: unsharded)
    # (base, view op, its other args, kwargs) when it is a view of a lazy tensor; a detached
    # alias holds a weak reference to its base.
    _view = None
    _views = None  # weak references to the views made of it: a write must refresh them
    # id of the DeviceData it last held (0: none), which a step's result for it may take the
    # buffer of (_donation.Donor): only ever compared with the ids of nodes alive in that step
    _held = 0

    # ``LazyTensor(value, requires_grad=False)``: a tensor whose value is ``value``, registered
    # among the live ones (``_fast.new``, in C: a replay makes its returned tensors so).
    __new__ = staticmethod(_fast.new)

    __torch_function__ = torch._C._disabled_torch_function_impl

    # A seen op with one output is recorded in C (_fast); the rest comes to _dispatch.
    __torch_dispatch__ = classmethod(_fast.torch_dispatch)

    @property
    def data(self):
        return DATA.__get__(self)

    @data.setter
    def data(self, new):
        """``t.data = other`` (what ``Module.to(dtype)`` does): torch swaps the metadata, and the
        tensor takes ``other``'s value; a sharding annotation stays when the rank does."""
        value = as_value(new)  # first: a bad value changes nothing
        DATA.__set__(self, new)
        if type(value.node) is DeviceData:  # the tensor is now that data, wherever it lives
            self._bind(value.node)
        else:
            self._set(value)
        spec = self._spec
        if spec is not None and spec.rank not in (None, len(value.shape.dims)):
            self._spec = None

    def __repr__(self, *, tensor_contents=None):
        return f"{self.detach().cpu()!r} (on {_convert.DEVICE})"

    def __reduce_ex__(self, protocol):
        return self.detach().cpu().__reduce_ex__(protocol)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """AOTAutograd's check of a gradient flowing into a compiled backward: a lazy tensor
        is the plain tensor its graph was traced with (``torch.compile`` fakes one as a plain
        tensor on the lazy device), so it stands as it is; another subclass it is not."""
        return self if expected_type in (None, torch.Tensor) else None

    def untyped_storage(self) -> LazyStorage:
        """What stands for a storage on the lazy device: no host memory, but an identity
        shared by a tensor and its views and aliases, which is what callers ask a storage for
        (safetensors and ``save_pretrained`` find tied weights by it)."""
        return LazyStorage(self)

    def data_ptr(self) -> int:
        """Where the tensor starts in its storage (``untyped_storage``), as a number to
        compare, never an address to read (a lazy tensor has none): the storage's key plus
        the offset, in bytes, that torch gives the same views of a contiguous tensor."""
        storage = LazyStorage(self)
        return storage.data_ptr() + storage.offset * self.element_size()

    def is_shared(self) -> bool:
        """Lazy data is in no shared host memory."""
        return False

    def is_pinned(self, device=None) -> bool:
        """Lazy data is in no pinned host memory (DCP's planner asks every tensor)."""
        return False

    def share_memory_(self):
        raise RuntimeError(
            f"a tensor on the {_convert.DEVICE} device has no host memory to share: "
            f"share_memory_() (and Module.share_memory()) apply to CPU tensors; move it with "
            f".cpu() first"
        )

    def tolist(self):
        """The value as (nested) Python numbers, read from the device (torch refuses
        ``tolist`` on tensor subclasses; an XLA tensor has it)."""
        return self.detach().cpu().tolist()

    def numpy(self, *, force: bool = False):
        """As torch does for a tensor on any device but the CPU: refused, unless ``force``
        (which copies it to the host)."""
        if force:
            return self.detach().cpu().numpy()
        raise TypeError(
            f"can't convert {_convert.DEVICE} device type tensor to numpy. Use Tensor.cpu() to "
            f"copy the tensor to host memory first (or numpy(force=True))."
        )

    # -- the only writers of _ir, _spec, _placed and _held -----------------------------------

    def _set(self, value: Value) -> None:
        """The tensor's value is now ``value`` (an op's result written in place, a relinked
        graph, a restored checkpoint). Where its data lives stays (``_placed``): a write in
        place keeps a tensor's placement, as torch_xla's ``copy_`` keeps the sharding of its
        destination. Data it now holds is what a step may take the buffer of (``_held``)."""
        self._ir = value
        node = value.node
        if type(node) is DeviceData:
            self._held = id(node)
        if "_order" in self.__dict__:  # (_device_orders' note of the value before)
            del self._order

    def _restore(self, value: Value, held: int) -> None:
        """Undo writes: the value and held data the tensor had before (a region traced on
        placeholders that wrote it)."""
        self._ir = value
        self._held = held
        if "_order" in self.__dict__:
            del self._order

    # ``_bind(data)``: the tensor now holds ``data`` (a step's result, or data placed for it)
    # (``_fast.bind``, in C: a replay binds every tensor it writes so).
    _bind = _fast.bind

    def _annotate(self, spec) -> None:
        """The user's sharding for this tensor (None: none)."""
        if spec is not None:
            note_order(spec.mesh)
        self._spec = spec

    def _where(self):
        """Where the tensor's data is, or will be: its annotation, else its data's placement
        (None: unsharded or not held)."""
        if self._spec is not None:
            return self._spec
        return None if self._placed is NEVER_HELD else self._placed

    def _claim(self) -> tuple:
        """Where the tensor's next result must land, and how strongly it says so (several
        tensors can hold one value; the strongest claim wins): 3, its annotation; 2, where its
        sharded data was; 1, replicated over the program's devices (``_graph.REPLICATED``: a
        tensor that held unsharded data stays replicated when its program runs over a mesh);
        0, wherever XLA puts it (None)."""
        if self._spec is not None:
            return 3, self._spec
        placed = self._placed
        if placed is NEVER_HELD:
            return 0, None
        if placed is not None:
            return 2, placed
        return 1, REPLICATED


_STORAGE_KEYS = itertools.count(1 << 60)  # above any address: never a real pointer's value


class LazyStorage:
    """``untyped_storage()`` of a lazy tensor: the tensor its views and aliases come from
    (their root), standing for the memory they share. ``data_ptr()`` is that root's key, made
    once and never reused (an address could be, once its tensor is gone); ``nbytes()`` its
    size; there are no bytes to read. ``offset``: where the tensor it was asked of starts, in
    elements, as torch places that view in a contiguous root (the view ops replayed on a meta
    tensor), so slices of one tensor are told apart and a tensor is told from its aliases."""

    __slots__ = ("__weakref__", "_root", "offset")

    @property
    def device(self) -> torch.device:
        return _convert.DEVICE

    def __init__(self, t: LazyTensor):
        chain, asked = [], t
        while t._view is not None:
            base = base_of(t._view[0])
            if base is None:  # (an alias of a tensor gone: it is its own root)
                break
            chain.append(t._view)
            t = base
        try:
            meta = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
            for _, op, rest, kwargs in reversed(chain):
                if op is not None:  # (None: an alias)
                    meta = op(meta, *rest, **kwargs)
        except Exception:  # a view op meta tensors lack: a storage of its own, saved whole
            self._root, self.offset = asked, 0
            return
        self._root, self.offset = t, meta.storage_offset()

    def data_ptr(self) -> int:
        key = self._root.__dict__.get("_storage_key")
        if key is None:
            key = self._root.__dict__["_storage_key"] = next(_STORAGE_KEYS)
        return key

    def nbytes(self) -> int:
        return self._root.numel() * self._root.element_size()

    size = nbytes  # (an untyped storage's size is in bytes)


def wrap(value: Value) -> LazyTensor:
    return LazyTensor(value)


def add_view(base: LazyTensor, view: LazyTensor) -> None:
    """Remember ``view`` (weakly) among the views of ``base``: a write to one shows in all."""
    views = base._views
    if views is None:
        base._views = [_ref(view)]
        return
    views.append(_ref(view))
    if len(views) >= 16 and not len(views) & (len(views) - 1):  # at powers of two: drop the dead
        views[:] = [r for r in views if r() is not None]


def base_of(link):
    """A view's base: held weakly by a detached alias (see ``_handlers.same_value``)."""
    return link() if type(link) is weakref.ref else link


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def as_value(x) -> Value:
    """The IR value of an argument: a lazy tensor's value, or a host tensor as a parameter."""
    if type(x) is LazyTensor or isinstance(x, LazyTensor):  # the first test is the fast one
        return x._ir
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise UnsupportedOpError(f"a meta tensor {x.shape} reached the lazy device")
        if type(x).__torch_dispatch__ is not _PLAIN_DISPATCH:
            raise _fast.ForeignTensor(type(x).__name__)
        value = Value(DeviceData(shape_of(x), handle=host_numpy(x)))
        if _HOST_READS is not None:
            base = x._base
            _HOST_READS.append((value.node, (_ref(x), None if base is None else _ref(base))))
        return value
    raise TypeError(f"expected a tensor, got {type(x).__name__}")


# While a compiled step is traced (``host_reads``): the host tensors its program reads.
_HOST_READS: list | None = None


@contextlib.contextmanager
def host_reads():
    """A context that collects the host tensors the lazy ops inside read, as ``(data node,
    (weak reference, one to its base if it is a view))``: a replay of a compiled step reads
    none of them, so it checks that those still alive hold the same."""
    global _HOST_READS
    outer, reads = _HOST_READS, []
    _HOST_READS = reads
    try:
        yield reads
    finally:
        _HOST_READS = outer
