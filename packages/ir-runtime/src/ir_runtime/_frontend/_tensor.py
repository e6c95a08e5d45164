"""The lazy tensor: a torch.Tensor subclass whose value is an ir-core Value.

Every ATen op that reaches ``__torch_dispatch__`` is recorded as a node (shapes from torch's
meta kernels, memoized); composite ops without a lowering rule are decomposed with torch's own
decompositions; in-place ops rebind the tensor to the value of their functional form, so no
node is ever mutated. Autograd runs above dispatch, so backward ops are recorded the same way.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch
from torch._decomp import core_aten_decompositions, decomposition_table

from ir_core import DeviceData, Generic, Value
from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend import _record
from ir_runtime._frontend._record import _META, IR_TO_TORCH, Plan, infer, plan_of, prepare
from ir_runtime._lowering import RULES

DEVICE = torch.device("lazy", 0)
aten = torch.ops.aten

# Every lazy tensor, in creation order (weak references), so mark_step finds the live ones with
# pending work in the same order every step: a program's outputs are in that order.
_LIVE: list = []
_compact_at = [100_000]  # drop dead references when the list grows past this


def live() -> list:
    """The lazy tensors still alive, oldest first; drops the dead references."""
    alive, refs = [], []
    for r in _LIVE:
        t = r()
        if t is not None:
            alive.append(t)
            refs.append(r)
    _LIVE[:] = refs
    return alive


# torch's core ATen decompositions first, then its wider table (mse_loss and friends).
_DECOMPOSITIONS = {**decomposition_table, **core_aten_decompositions()}


class LazyTensor(torch.Tensor):
    """A tensor on the lazy device: ``_ir`` is its value in the graph being recorded."""

    _ir: Value
    _spec: object  # the sharding the user annotated, or None
    _placed: object  # the sharding of the data it last held, or None
    _held: bool  # whether it has held data (a parameter, a step's result) rather than only IR

    @staticmethod
    def __new__(cls, value: Value, requires_grad: bool = False):
        s = value.shape
        t = torch.Tensor._make_wrapper_subclass(
            cls, s.dims, dtype=IR_TO_TORCH[s.dtype], device=DEVICE, requires_grad=requires_grad
        )
        t._ir = value
        t._spec = None
        t._held = type(value.node) is DeviceData
        t._placed = value.node.sharding if t._held else None
        _LIVE.append(weakref.ref(t))
        if len(_LIVE) > _compact_at[0]:
            _compact_at[0] = max(100_000, 2 * len(live()))
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None):
        from ir_runtime._frontend._step import to_torch

        return f"{to_torch(self)!r} (on {DEVICE})"

    def __reduce_ex__(self, protocol):
        from ir_runtime._frontend._step import to_torch

        return to_torch(self).__reduce_ex__(protocol)


def wrap(value: Value) -> LazyTensor:
    return LazyTensor(value)


def as_value(x) -> Value:
    """The IR value of an argument: a lazy tensor's value, or a host tensor as a parameter."""
    if isinstance(x, LazyTensor):
        return x._ir
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise UnsupportedOpError(f"a meta tensor {x.shape} reached the lazy device")
        host = x.detach().cpu()
        if host.dtype == torch.bfloat16:
            data = host.float().numpy().astype(IR_NP["bfloat16"])
        else:
            data = host.numpy()
        return Value(DeviceData(_record.shape_of(host), handle=np.array(data)))
    raise TypeError(f"expected a tensor, got {type(x).__name__}")


IR_NP = {"bfloat16": __import__("ml_dtypes").bfloat16}


def _wrap_out(layout, node):
    kind = layout[0]
    if kind == "one":
        return wrap(Value(node, 0))
    if kind == "none":
        return None
    outs, k = [], 0
    for present in layout[2]:
        if present:
            outs.append(wrap(Value(node, k)))
            k += 1
        else:
            outs.append(None)
    return tuple(outs)


def record(func, args, kwargs, plan: Plan | None = None):
    """Record ``func(*args, **kwargs)`` as one node; return lazy tensors like torch's result."""
    plan = plan or plan_of(func)
    key, operands, attrs = prepare(plan, args, kwargs, as_value)
    layout = _META.get(key)
    if layout is None:
        layout = infer(func, key, args, kwargs)
    if layout[0] == "none":
        return None
    return _wrap_out(layout, Generic(plan.op, operands, layout[1], attrs))


def _functional(func):
    """The out-of-place overload of an in-place op (``add_.Tensor`` -> ``add.Tensor``)."""
    name = func._schema.name.split("::")[1]
    packet = getattr(aten, name.rstrip("_"), None) if name.endswith("_") else None
    if packet is None:
        return None
    return getattr(packet, func._overloadname, None)


def rebind(t: LazyTensor, value: Value) -> None:
    """Point ``t`` at a new value, cast and broadcast to ``t``'s own dtype and shape."""
    s = value.shape
    want_dtype = _record.ir_dtype(t.dtype)
    want_dims = tuple(t.shape)
    if s.dtype != want_dtype:
        value = record(aten._to_copy.default, (wrap(value),), {"dtype": t.dtype})._ir
    if value.shape.dims != want_dims:
        value = record(aten.expand.default, (wrap(value), list(want_dims)), {})._ir
    t._ir = value


def _inplace(func, args, kwargs):
    functional = _functional(func)
    if functional is None or not isinstance(args[0], LazyTensor):
        raise UnsupportedOpError(
            f"in-place op {func} has no out-of-place form the lazy device can record; "
            f"report it with the model that needs it, or write the op out of place"
        )
    # torch's own checks of the in-place op on meta tensors (a dtype cannot widen in place,
    # shapes must broadcast into self): the error a CPU user would get.
    plan = plan_of(func)
    infer(func, ("in-place", *prepare(plan, args, kwargs, as_value)[0]), args, kwargs)
    self = args[0]
    result = dispatch(functional, args, kwargs)
    rebind(self, result._ir)
    return self


def _foreach(func, args, kwargs):
    """``_foreach_op[_].X`` as one ``op[_]`` per element."""
    name = func._schema.name.split("::")[1][len("_foreach_") :]
    overload = func._overloadname
    inplace = name.endswith("_")
    per = getattr(aten, name)
    lists = [a for a in args if isinstance(a, (list, tuple))]
    n = len(lists[0])
    results = []
    for i in range(n):
        call_args = []
        for a in args:
            if isinstance(a, (list, tuple)):
                call_args.append(a[i])
            else:
                call_args.append(a)
        op = _element_overload(per, overload, call_args)
        results.append(op(*call_args, **kwargs))
    return None if inplace else results


def _element_overload(packet, overload, call_args):
    # List -> Tensor, ScalarList -> Scalar, Scalar -> Scalar, Tensor -> Tensor.
    mapping = {"List": "Tensor", "ScalarList": "Scalar", "default": "default"}
    name = mapping.get(overload, overload)
    op = getattr(packet, name, None)
    if op is None and isinstance(call_args[-1], torch.Tensor):
        op = getattr(packet, "Tensor", None)
    if op is None:
        op = getattr(packet, "Scalar", None) or packet.default
    return op


def _to_copy(func, args, kwargs):
    device = kwargs.get("device")
    x = args[0]
    if device is not None and torch.device(device).type != DEVICE.type:
        from ir_runtime._frontend._step import to_torch

        host = to_torch(x)
        rest = {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format")}
        return host.to(device=device, **rest) if rest else host.to(device)
    kwargs = {k: v for k, v in kwargs.items() if k == "dtype"}
    if not kwargs or kwargs["dtype"] in (None, x.dtype):
        return wrap(x._ir)
    return record(aten._to_copy.default, (x,), kwargs)


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, LazyTensor):
        rebind(dst, as_value(src) if not isinstance(src, LazyTensor) else src._ir)
        return dst
    from ir_runtime._frontend._step import to_torch

    dst.copy_(to_torch(src))
    return dst


def _local_scalar_dense(func, args, kwargs):
    from ir_runtime._frontend._step import to_torch

    return to_torch(args[0]).item()


def _same_value(func, args, kwargs):
    return wrap(args[0]._ir)


def _native_batch_norm_legit(func, args, kwargs):
    """The training form mutates running stats in place: record the functional form and
    rebind the stats to its results."""
    x, weight, bias, running_mean, running_var, training, momentum, eps = args[:8]
    if running_mean is None or not training:
        return record(func, args, kwargs)
    out = record(
        aten._native_batch_norm_legit_functional.default,
        (x, weight, bias, running_mean, running_var, training, momentum, eps),
        {},
    )
    rebind(running_mean, out[3]._ir)
    rebind(running_var, out[4]._ir)
    return out[0], out[1], out[2]


def _native_dropout(func, args, kwargs):
    from ir_runtime._frontend._rng import bernoulli_mask

    x, p, train = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("train")
    if train is False or p == 0:
        mask = record(aten.ones_like.default, (x,), {"dtype": torch.bool})
        return wrap(x._ir), mask
    keep = bernoulli_mask(x, 1.0 - p)
    scaled = record(aten.mul.Scalar, (x, 1.0 / (1.0 - p)), {})
    zero = record(aten.zeros_like.default, (x,), {})
    out = record(aten.where.self, (keep, scaled, zero), {})
    return out, keep


def _random_(func, args, kwargs):
    from ir_runtime._frontend._rng import random_like

    t = args[0]
    rebind(t, random_like(func, t, args[1:], kwargs)._ir)
    return t


def _unsupported(func, args, kwargs):
    raise UnsupportedOpError(f"{func} is not supported on the lazy device")


SPECIAL = {
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.detach.default: _same_value,
    aten.alias.default: _same_value,
    aten.lift_fresh.default: _same_value,
    aten.clone.default: _same_value,
    aten.contiguous.default: _same_value,
    aten._native_batch_norm_legit.default: _native_batch_norm_legit,
    # Mutates its running stats without saying so in its schema.
    aten.native_batch_norm.default: _native_batch_norm_legit,
    aten.native_dropout.default: _native_dropout,
    aten.uniform_.default: _random_,
    aten.normal_.default: _random_,
    aten.bernoulli_.float: _random_,
}


def dispatch(func, args, kwargs):
    handler = SPECIAL.get(func)
    if handler is not None:
        return handler(func, args, kwargs)
    plan = plan_of(func)
    if plan.op in RULES:
        return record(func, args, kwargs, plan)
    name = plan.name
    if name.startswith("aten::_foreach_"):
        return _foreach(func, args, kwargs)
    if func._schema.is_mutable:
        return _inplace(func, args, kwargs)
    decomposition = _DECOMPOSITIONS.get(func)
    if decomposition is not None:
        out = decomposition(*args, **kwargs)
        if out is not NotImplemented:
            return out
    # A composite op (aten.to.dtype, ...) reached here from inside a decomposition.
    out = func.decompose(*args, **kwargs)
    if out is not NotImplemented:
        return out
    raise UnsupportedOpError(
        f"ATen op {plan.op} has no lowering rule and no decomposition on the lazy device. "
        f"Report it (with the model that needs it); meanwhile compute it on CPU "
        f"(t.cpu()) or register a rule with ir_runtime.register_lowering({plan.op!r})"
    )
