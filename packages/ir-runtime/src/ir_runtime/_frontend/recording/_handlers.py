"""Front-end handlers for the ops that cannot simply be recorded: copies across devices,
reads to the host, aliases, batch norm's running statistics, dropout."""

from __future__ import annotations

import weakref

import torch

from ir_core import DeviceData
from ir_runtime import _metrics
from ir_runtime._data import put
from ir_runtime._frontend.recording import _convert, _fast
from ir_runtime._frontend.recording._convert import host_numpy, shape_of
from ir_runtime._frontend.recording._device_orders import differ
from ir_runtime._frontend.recording._dispatch import special
from ir_runtime._frontend.recording._record import record
from ir_runtime._frontend.recording._rng import bernoulli_mask
from ir_runtime._frontend.recording._tensor import LazyTensor, add_view, as_value, wrap
from ir_runtime._frontend.recording._views import rebind, write_through
from ir_runtime._frontend.steps._step import to_torch

aten = torch.ops.aten


@special(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    device = kwargs.get("device")
    x = args[0]
    if device is not None and torch.device(device).type != _convert.DEVICE.type:
        host = to_torch(x)
        rest = {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format")}
        return host.to(device=device, **rest) if rest else host.to(device)
    kwargs = {k: v for k, v in kwargs.items() if k == "dtype"}
    if not kwargs or kwargs["dtype"] in (None, x.dtype):
        return wrap(x._ir)
    return record(aten._to_copy.default, (x,), kwargs)


@special(aten.copy_.default)
def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, LazyTensor):
        if isinstance(src, LazyTensor) and _fast.checking_devices() and differ(dst, src):
            src = to_torch(src)  # over another device order: through the host, as eager does
        if _placed_copy(dst, src):
            return dst
        rebind(dst, as_value(src) if not isinstance(src, LazyTensor) else src._ir)
        write_through(dst)
        return dst
    dst.copy_(to_torch(src))
    return dst


def _placed_copy(dst: LazyTensor, src) -> bool:
    """A host tensor copied into an annotated lazy tensor of its shape and dtype (what
    ``load_state_dict`` of an ordinary state dict does to a sharded model): the data is placed
    at once as the annotation says, each device receiving only its shard (each process only its
    devices' blocks), instead of a program input every device gets whole."""
    spec = dst._spec
    if (
        spec is None
        or isinstance(src, LazyTensor)
        or not isinstance(src, torch.Tensor)
        or src.device.type != "cpu"
        or src.shape != dst.shape
        or src.dtype != dst.dtype
        or dst._view is not None
    ):
        return False
    shape = shape_of(dst)
    held = spec.evenly(shape.dims)
    _metrics.count("TransferToDevice")
    dst._bind(DeviceData(shape, handle=put(host_numpy(src), held.to_jax()), sharding=held))
    write_through(dst)
    return True


@special(aten._local_scalar_dense.default)
def _local_scalar_dense(func, args, kwargs):
    return to_torch(args[0]).item()


@special(
    aten.detach.default,
    aten.alias.default,
    aten.lift_fresh.default,
    aten.clone.default,
    aten.contiguous.default,
)
def _same_value(func, args, kwargs):
    out = wrap(args[0]._ir)
    if func is not aten.clone.default and func is not aten.contiguous.default:
        # Detach and alias share the tensor's storage, so writes go through to it. Weakly: the
        # autograd engine saves a result for backward as its detached alias, which would
        # otherwise hold the result (and its graph) alive in a cycle through C++ that no
        # garbage collection sees.
        out._view = (weakref.ref(args[0]), None, (), {})
        add_view(args[0], out)
    return out


# native_batch_norm mutates its running stats without saying so in its schema.
@special(aten._native_batch_norm_legit.default, aten.native_batch_norm.default)
def _native_batch_norm_legit(func, args, kwargs):
    """The training form mutates running stats in place: record the functional form and
    rebind the stats to its results. In eval mode torch saves no statistics (shape [0])."""
    x, weight, bias, running_mean, running_var, training, momentum, eps = args[:8]
    if not training:
        out = record(
            aten._native_batch_norm_legit_no_training.default, (*args[:5], momentum, eps), {}
        )
        empty = record(aten.new_zeros.default, (x, [0]), {"dtype": out[1].dtype})
        return out[0], empty, wrap(empty._ir)
    if running_mean is None:
        return record(func, args, kwargs)
    out = record(
        aten._native_batch_norm_legit_functional.default,
        (x, weight, bias, running_mean, running_var, training, momentum, eps),
        {},
    )
    rebind(running_mean, out[3]._ir)
    rebind(running_var, out[4]._ir)
    return out[0], out[1], out[2]


@special(aten._batch_norm_with_update.default)
def _batch_norm_with_update(func, args, kwargs):
    """``_batch_norm_with_update`` (training batch norm, as torch.nn.functional calls it): the
    functional form, stats rebound; its ``reserve`` output is empty on CPU."""
    x, weight, bias, running_mean, running_var, momentum, eps = args[:7]
    out = _native_batch_norm_legit(
        func, (x, weight, bias, running_mean, running_var, True, momentum, eps), {}
    )
    reserve = record(aten.new_zeros.default, (x, [0]), {"dtype": torch.uint8})
    return (*out, reserve)


@special(aten.native_dropout.default)
def _native_dropout(func, args, kwargs):
    x, p, train = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("train")
    if train is False or p == 0:
        mask = record(aten.ones_like.default, (x,), {"dtype": torch.bool})
        return wrap(x._ir), mask
    keep = bernoulli_mask(x, 1.0 - p)
    scaled = record(aten.mul.Scalar, (x, 1.0 / (1.0 - p)), {})
    zero = record(aten.zeros_like.default, (x,), {})
    out = record(aten.where.self, (keep, scaled, zero), {})
    return out, keep
