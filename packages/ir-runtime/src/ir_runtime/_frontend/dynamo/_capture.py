"""How Dynamo captures a graph whose inputs are lazy tensors, for this backend.

Dynamo takes a tensor argument into its graph as a fake tensor (same sizes, strides, dtype,
device, no data); a subclass with its own ``__torch_dispatch__`` that is not a traceable
wrapper (``LazyTensor``: its payload is an IR node, not inner tensors) it does not take at
all, and traces into the subclass's own code instead; and torch's fake-tensor converter
refuses any tensor on the ``lazy`` device. Two hooks, installed when the backend is first
looked up, let a lazy tensor in as what it stands for, a plain tensor on the lazy device:

- Dynamo's table of variable builders by exact type gets ``LazyTensor``: a lazy tensor is a
  tensor input of the graph (guarded on its sizes, strides, dtype, device and
  ``requires_grad`` as any tensor), but only while Dynamo captures for this backend; for
  another backend it is built as Dynamo would build it without the hook.
- The fake-tensor converter fakes a lazy tensor through a meta tensor of its sizes, strides,
  dtype and autograd standing (leaf or not, ``requires_grad``), kept per tensor so that one
  tensor reached twice (tied weights) is one fake, then names the lazy tensor's device on the
  fake. Dynamic shapes, sources and symbolic contexts are the converter's own.

A lazy tensor's views are not torch views (the front end tracks its bases itself), so a fake
never aliases another; AOTAutograd's input-mutation write-backs (``copy_``) and regenerated
views then run on the lazy tensors through the front end, which keeps views in step.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ir_runtime._frontend.recording._tensor import LazyTensor

_STAND_INS = WeakIdKeyDictionary()  # lazy tensor -> the meta tensor it is faked through


def install(is_ours) -> None:
    """Installs both hooks once; ``is_ours(compiler_fn)`` says whether a capture is for this
    backend."""
    if getattr(install, "done", False):
        return
    from torch._dynamo.variables.builder import VariableBuilder
    from torch._subclasses.fake_tensor import FakeTensorConverter

    def build(builder, value):
        if is_ours(builder.tx.output.compiler_fn):
            return builder.wrap_tensor(value)
        table = VariableBuilder._type_dispatch()
        del table[LazyTensor]  # (as Dynamo builds it without the hook)
        try:
            return builder._wrap(value)
        finally:
            table[LazyTensor] = build

    # Dynamo's own cached dicts by exact type, one per setting of config.trace_numpy.
    for trace_numpy in (False, True):
        VariableBuilder._type_dispatch_impl(trace_numpy)[LazyTensor] = build
    convert = FakeTensorConverter.from_real_tensor

    @functools.wraps(convert)
    def from_real_tensor(self, fake_mode, t, *args, **kwargs):
        if not isinstance(t, LazyTensor):
            return convert(self, fake_mode, t, *args, **kwargs)
        fake = convert(self, fake_mode, _stand_in(t), *args, **kwargs)
        fake.fake_device = t.device
        return fake

    FakeTensorConverter.from_real_tensor = from_real_tensor
    # Sharding annotations (mark_sharding, the placements of a plan's module hooks) act on the
    # lazy tensor itself, outside any graph: Dynamo calls them as they are, between graphs.
    from torch._dynamo import trace_rules

    for name in _RUN_AS_WRITTEN:
        trace_rules.add(name)
    install.done = True


_RUN_AS_WRITTEN = ("ir_runtime._frontend.parallel", "ir_runtime._frontend.recording._api")


def _stand_in(t: LazyTensor) -> torch.Tensor:
    """The meta tensor ``t`` is faked through: the same one while ``t``'s sizes, strides,
    dtype and autograd standing stay (so the converter's memo makes one fake of it)."""
    seen = _STAND_INS.get(t)
    if (
        seen is not None
        and seen.shape == t.shape
        and seen.stride() == t.stride()
        and seen.dtype == t.dtype
        and seen.requires_grad == t.requires_grad
        and seen.is_leaf == t.is_leaf
    ):
        return seen
    with torch.no_grad():
        meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    if t.requires_grad:
        meta.requires_grad_(True)
        if not t.is_leaf:
            meta = meta.clone()  # (an intermediate: a result of autograd, not a leaf)
    _STAND_INS[t] = meta
    return meta


def for_this_backend(is_ours) -> bool:
    """Whether the frame Dynamo is deciding whether to compile (the caller is its frame
    converter) is captured for this backend: the converter's own backend, read from its
    frame (Dynamo clears its callback while it converts)."""
    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code.co_name == "__call__" and code.co_filename.endswith("convert_frame.py"):
            owner = f.f_locals.get("self")
            if hasattr(owner, "_torchdynamo_orig_backend"):
                return is_ours(owner._torchdynamo_orig_backend)
        f = f.f_back
    return False
