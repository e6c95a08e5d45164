"""Kernels for torch's Lazy dispatch key (XLA's, once the device is named "xla"): tensors
created directly on the lazy device
(``torch.zeros(3, device="lazy")``, ``torch.tensor(..., device="lazy")``) come here."""

from __future__ import annotations

import warnings

import torch

from ir_core import Generic, Shape, Value
from ir_runtime._frontend.recording import _convert, _fast
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._record import record
from ir_runtime._frontend.recording._rng import random
from ir_runtime._frontend.recording._tensor import LazyTensor, as_value, wrap
from ir_runtime._frontend.recording._views import rebind


def _zeros(size, dtype):
    shape = Shape(ir_dtype(dtype or torch.get_default_dtype()), tuple(int(s) for s in size))
    node = Generic("aten::zeros.default", [], [shape], {"size": shape.dims}, None, _fast.origin())
    return wrap(Value(node))


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # Uninitialized memory, as torch.empty promises: zeros here.
    return _zeros(size, dtype)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _zeros(size, dtype)


def _copy_from(self, dst, non_blocking=False):
    if isinstance(dst, LazyTensor):
        rebind(dst, as_value(self))
        return dst
    raise NotImplementedError("_copy_from into a non-lazy tensor")


def _factory(func):
    def kernel(*args, **kwargs):
        return record(func, args, kwargs)

    return kernel


def _efficientzerotensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    return _zeros(size, dtype)


def _randperm(n, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    shape = Shape(ir_dtype(dtype if dtype is not None else torch.int64), (int(n),))
    return random("ir::random_permutation", shape)


_LIBRARY: list = []  # the Library registering the kernels, kept alive once installed


def install() -> None:
    """Register the kernels with torch's dispatcher, at the device's key."""
    if _LIBRARY:
        return
    lib = torch.library.Library("aten", "IMPL", _convert.DISPATCH_KEYS[_convert.DEVICE.type])
    _LIBRARY.append(lib)
    lib.impl("empty.memory_format", _empty)
    with warnings.catch_warnings():  # torch has a generic Lazy kernel for it: ours replaces it
        warnings.simplefilter("ignore", UserWarning)
        lib.impl("_efficientzerotensor", _efficientzerotensor)
    lib.impl("randperm", _randperm)
    for name in (
        "arange",
        "arange.start",
        "arange.start_step",
        "scalar_tensor",
        "full",
        "eye",
        "eye.m",
        "linspace",
        "logspace",
    ):
        op, _, overload = name.partition(".")
        lib.impl(name, _factory(getattr(getattr(torch.ops.aten, op), overload or "default")))
    lib.impl("empty_strided", _empty_strided)
    lib.impl("_copy_from", _copy_from)
