"""Kernels for torch's Lazy dispatch key: tensors created directly on the lazy device
(``torch.zeros(3, device="lazy")``, ``torch.tensor(..., device="lazy")``) come here."""

from __future__ import annotations

import warnings

import torch

from ir_core import Generic, Value
from ir_runtime._frontend._record import Shape, ir_dtype
from ir_runtime._frontend._tensor import LazyTensor, as_value, rebind, wrap

_lib = torch.library.Library("aten", "IMPL", "Lazy")


def _zeros(size, dtype):
    shape = Shape(ir_dtype(dtype or torch.get_default_dtype()), tuple(int(s) for s in size))
    return wrap(Value(Generic("aten::zeros.default", [], [shape], {"size": shape.dims})))


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
        from ir_runtime._frontend._tensor import record

        return record(func, args, kwargs)

    return kernel


def _efficientzerotensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    return _zeros(size, dtype)


def _randperm(n, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    from ir_runtime._frontend._rng import _random

    shape = Shape(ir_dtype(dtype if dtype is not None else torch.int64), (int(n),))
    return _random("ir::random_permutation", shape)


_lib.impl("empty.memory_format", _empty)
with warnings.catch_warnings():  # torch has a generic Lazy kernel for it: ours replaces it
    warnings.simplefilter("ignore", UserWarning)
    _lib.impl("_efficientzerotensor", _efficientzerotensor)
_lib.impl("randperm", _randperm)
for _name in (
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
    _op, _, _overload = _name.partition(".")
    _lib.impl(_name, _factory(getattr(getattr(torch.ops.aten, _op), _overload or "default")))
_lib.impl("empty_strided", _empty_strided)
_lib.impl("_copy_from", _copy_from)
