"""How Dynamo captures a graph whose inputs are lazy tensors, for this backend.

Dynamo takes a tensor argument into its graph as a fake tensor (same sizes, strides, dtype,
device, no data); a subclass with its own ``__torch_dispatch__`` that is not a traceable
wrapper (``LazyTensor``: its payload is an IR node, not inner tensors) it does not take at
all, and traces into the subclass's own code instead; and torch's fake-tensor converter
refuses any tensor on the ``lazy`` device. Hooks installed when the backend is first looked up
(importing Dynamo) let a lazy tensor in as what it stands for, a plain tensor on the lazy
device:

- Dynamo's table of variable builders by exact type gets ``LazyTensor``: a lazy tensor is a
  tensor input of the graph (guarded on its sizes, strides, dtype, device and
  ``requires_grad`` as any tensor), but only while Dynamo captures for this backend; for
  another backend it is built as Dynamo would build it without the hook.
- The fake-tensor converter fakes a lazy tensor through a meta tensor of its sizes, strides,
  dtype and autograd standing (leaf or not, ``requires_grad``), kept per tensor so that one
  tensor reached twice (tied weights) is one fake, then names the lazy tensor's device on the
  fake. Dynamic shapes, sources and symbolic contexts are the converter's own.
- Fake tensors' device rule takes host tensors into a lazy op (the result on the lazy
  device), as the front end takes them.
- Dynamo's variable builder notes each module it reads while capturing for this backend
  (``modules_read``): a ``compile_step`` tracing a call of the graph guards them, as it
  guards the modules whose forward it sees called (the graph calls none).

A lazy tensor's views are not torch views (the front end tracks its bases itself), so a fake
never aliases another: a graph that writes an input, called on lazy tensors that share data
(a tensor and its view, or its ``detach()``), would read each input as it was before the
other's write, so the backend runs Dynamo's own graph on them instead (``_backend``), as
lazy mode runs the model's code.

Sharding annotations (``mark_sharding``, a plan's module hooks placing activations) act on the
lazy tensor itself, outside any graph: Dynamo calls those functions as they are, between
graphs.
"""

from __future__ import annotations

import functools
import sys
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ir_runtime._frontend.recording._tensor import LazyTensor

_STAND_INS = WeakIdKeyDictionary()  # lazy tensor -> the meta tensor it is faked through


def install(is_ours) -> None:
    """Installs the hooks once (importing Dynamo); ``is_ours(compiler_fn)`` says whether a
    capture is for this backend."""
    if getattr(install, "done", False):
        return
    from torch._dynamo import trace_rules
    from torch._dynamo.variables.builder import VariableBuilder
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConverter

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

    wrap = VariableBuilder._wrap

    @functools.wraps(wrap)
    def wrap_noting_modules(builder, value):
        if isinstance(value, torch.nn.Module):
            output = builder.tx.output
            if is_ours(output.compiler_fn):
                output.__dict__.setdefault(_MODULES, {})[id(value)] = weakref.ref(value)
        return wrap(builder, value)

    VariableBuilder._wrap = wrap_noting_modules

    convert = FakeTensorConverter.from_real_tensor

    @functools.wraps(convert)
    def from_real_tensor(self, fake_mode, t, *args, **kwargs):
        if not isinstance(t, LazyTensor):
            return convert(self, fake_mode, t, *args, **kwargs)
        fake = convert(self, fake_mode, _stand_in(t), *args, **kwargs)
        fake.fake_device = t.device
        return fake

    FakeTensorConverter.from_real_tensor = from_real_tensor

    common = FakeTensor._find_common_device

    def find_common_device(func, flat_args):
        try:
            return common(func, flat_args)
        except RuntimeError:
            lazy = [a.device for a in flat_args if on_lazy_device(a)]
            devices = {a.device.type for a in flat_args if isinstance(a, torch.Tensor)}
            if lazy and devices <= {lazy[0].type, "cpu"}:
                return lazy[0], False  # (host tensors in a lazy op, as the front end takes them)
            raise

    FakeTensor._find_common_device = staticmethod(find_common_device)
    # Sharding annotations (mark_sharding, the placements of a plan's module hooks) act on the
    # lazy tensor itself, outside any graph: Dynamo calls them as they are, between graphs.
    for name in _RUN_AS_WRITTEN:
        trace_rules.add(name)
    install.done = True


_MODULES = "_ir_runtime_modules"  # (on Dynamo's OutputGraph: the modules a capture read)


def modules_read(output) -> list:
    """Weak references to the modules Dynamo read while capturing ``output`` (its
    ``OutputGraph``) for this backend: from the frame's locals, closure and globals, and
    every attribute path it followed (a submodule, a module in a list)."""
    return [] if output is None else list(output.__dict__.get(_MODULES, {}).values())


def on_lazy_device(t) -> bool:
    """Whether ``t`` is a tensor (a fake one too) on the lazy device."""
    from ir_runtime._frontend.recording import _convert

    return isinstance(t, torch.Tensor) and t.device.type == _convert.DEVICE.type


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
