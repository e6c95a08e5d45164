"""Ops whose output shape depends on values: ``nonzero``, ``masked_select``, boolean-mask
indexing and ``index_put``, ``unique`` and friends.

XLA programs have static shapes, so the front end does what torch_xla does: it runs what the
shape depends on, reads the size to the host, and continues recording with that size fixed.
``nonzero(x)`` first reads one number (how many elements are nonzero, counted on the device)
and then records ``nonzero_static(x, size=n)``; a mask index becomes integer indices the same
way, so the values and their gradients stay on the device. ``unique`` and its variants read
their input to the host and compute there (their sizes, inverse and counts all depend on it).
Each such read is one ``DataDependentSync`` in the metrics (``DataDependentSync::<op>`` per
op): it ends the graph being recorded for the tensors it reads, like a ``.item()``.
"""

from __future__ import annotations

import torch

from ir_runtime import _metrics
from ir_runtime._frontend.recording._api import to_lazy
from ir_runtime._frontend.recording._dispatch import dispatch, special
from ir_runtime._frontend.recording._record import bound, record
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.steps._step import to_torch

aten = torch.ops.aten


def _sync(op: str) -> None:
    _metrics.count("DataDependentSync")
    _metrics.count(f"DataDependentSync::{op}")


def _count_nonzero(x) -> int:
    """How many elements of ``x`` are nonzero: one number read from the device."""
    flat = record(aten.reshape.default, (x, [-1]), {})
    count = record(aten.count_nonzero.dim_IntList, (flat, [0]), {})
    return int(to_torch(count))


def _nonzero(x, op: str):
    """``nonzero(x)`` on the device: int64 [n, x.dim()], n read first."""
    _sync(op)
    n = _count_nonzero(x)
    return record(aten.nonzero_static.default, (x,), {"size": n, "fill_value": -1})


@special(aten.nonzero.default)
def _nonzero_handler(func, args, kwargs):
    return _nonzero(args[0], "aten::nonzero")


@special(aten.masked_select.default)
def _masked_select(func, args, kwargs):
    x, mask = args[0], args[1]
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    x = record(aten.expand.default, (x, list(shape)), {})
    mask = record(aten.expand.default, (mask, list(shape)), {})
    flat = record(aten.reshape.default, (mask, [-1]), {})
    where = _nonzero(flat, "aten::masked_select")
    column = record(aten.select.int, (where, 1, 0), {})
    values = record(aten.reshape.default, (x, [-1]), {})
    return record(aten.index.Tensor, (values, [column]), {})


def _integer_indices(indices, op: str):
    """An index list with every boolean mask replaced by the integer indices of its True
    elements (one per dim it covers), as torch's indexing reads a mask."""
    out = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
            if not isinstance(i, LazyTensor):
                i = i.to(torch.bool)
                out.extend(i.nonzero().unbind(1) if i.dim() else [i.long()])
                continue
            if i.dim() == 0:  # x[True] adds a dim of size 1 (or 0 for False)
                out.append(_nonzero(record(aten.reshape.default, (i, [1]), {}), op)[:, 0])
                continue
            where = _nonzero(i, op)
            out.extend(record(aten.select.int, (where, 1, k), {}) for k in range(i.dim()))
        else:
            out.append(i)
    return out


def _has_mask(indices) -> bool:
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


@special(aten.index.Tensor)
def _index(func, args, kwargs):
    x, indices = args[0], args[1]
    if _has_mask(indices):
        indices = _integer_indices(indices, "aten::index")
    return record(func, (x, indices), kwargs)


def _index_put_handler(func, args, kwargs):
    x, indices = args[0], args[1]
    if _has_mask(indices):
        static = _masked_put(x, indices, args[2:], kwargs)
        if static is not None:
            return static
        indices = _integer_indices(indices, "aten::index_put")
    return record(func, (x, indices, *args[2:]), kwargs)


def _masked_put(x, indices, rest, kwargs):
    """``x[mask] = values`` (``+=`` with ``accumulate``) as a ``where``, with no count read from
    the device (a sampling loop's ``logits[logits < v] = -inf`` every token): when the one index
    is a lazy boolean mask over ``x``'s leading dims and ``values`` broadcasts over what each
    True element selects, as ``index_put`` broadcasts it. None otherwise."""
    values = rest[0] if rest else kwargs.get("values")
    accumulate = rest[1] if len(rest) > 1 else kwargs.get("accumulate", False)
    mask = indices[0]
    if (
        len(indices) != 1
        or not isinstance(mask, LazyTensor)
        or mask.dtype is not torch.bool
        or not isinstance(values, torch.Tensor)
        or values.dtype != x.dtype
    ):
        return None
    k = mask.dim()
    trailing = tuple(x.shape[k:])
    if k == 0 or k > x.dim() or tuple(mask.shape) != tuple(x.shape[:k]):
        return None
    if values.numel() == 1:
        values = record(aten.reshape.default, (values, []), {})
    elif values.dim() > len(trailing) or any(
        v not in (1, t) for v, t in zip(reversed(values.shape), reversed(trailing), strict=False)
    ):
        return None
    if trailing:
        mask = record(aten.reshape.default, (mask, [*mask.shape, *[1] * len(trailing)]), {})
    if accumulate:
        values = record(aten.add.Tensor, (x, values), {})
    return record(aten.where.self, (mask, values, x), {})


special(aten.index_put.default, aten._index_put_impl.default)(_index_put_handler)


def _on_host(func, args, kwargs, op: str):
    """``func`` computed by torch on the host from the inputs' values; results back lazy."""
    _sync(op)
    host_args = [to_torch(a) if isinstance(a, LazyTensor) else a for a in args]
    out = func(*host_args, **kwargs)
    if isinstance(out, torch.Tensor):
        return to_lazy(out)
    return tuple(to_lazy(o) if isinstance(o, torch.Tensor) else o for o in out)


def _host_op(func):
    name = func._schema.name
    special(func)(lambda f, args, kwargs: _on_host(f, args, kwargs, name))


for _func in (
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default,
):
    _host_op(_func)


def _read_ints(*scalars) -> list:
    """0-d integer lazy tensors read to the host in one program."""
    stacked = record(
        aten.stack.default, ([record(aten.reshape.default, (v, [1]), {}) for v in scalars],), {}
    )
    return [int(v) for v in to_torch(stacked).reshape(-1).tolist()]


@special(aten.repeat_interleave.Tensor)
def _repeat_interleave(func, args, kwargs):
    """``repeat_interleave(repeats)``: each index ``i`` repeated ``repeats[i]`` times, as the
    index of the first cumulative count above each output position. Its length is
    ``output_size`` when given (no read); else ``repeats.sum()``, read from the device."""
    b = bound(func, args, kwargs)
    repeats, size = b["repeats"], b.get("output_size")
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("repeats has to be Long or Int tensor")
    if size is None:
        _sync("aten::repeat_interleave")
        total, least = _read_ints(repeats.sum(), repeats.min()) if repeats.numel() else (0, 0)
        if least < 0:
            raise RuntimeError("repeats can not be negative")
        size = total
    positions = torch.arange(int(size), device=repeats.device, dtype=repeats.dtype)
    return torch.searchsorted(repeats.cumsum(0), positions, right=True).to(repeats.dtype)


_BINCOUNT_DTYPES: dict = {}  # weights' dtype -> bincount's result dtype (eager's, probed)


@special(aten.bincount.default)
def _bincount(func, args, kwargs):
    """``bincount``: counts (or summed weights) per value, ``max(input) + 1`` of them (at least
    ``minlength``): the largest value is read from the device, then the sums are a scatter-add."""
    b = bound(func, args, kwargs)
    x, weights, minlength = b["self"], b.get("weights"), int(b.get("minlength", 0))
    if x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype is torch.bool:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and tuple(weights.shape) != tuple(x.shape):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    _sync("aten::bincount")
    top, least = _read_ints(x.max(), x.min()) if x.numel() else (-1, 0)
    if least < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is None:
        dtype, values = torch.int64, torch.ones_like(x, dtype=torch.int64)
    else:
        dtype = _BINCOUNT_DTYPES.get(weights.dtype)
        if dtype is None:
            probe = torch.ones(1, dtype=weights.dtype)
            dtype = _BINCOUNT_DTYPES[weights.dtype] = torch.bincount(
                torch.zeros(1, dtype=torch.int64), probe
            ).dtype
        values = weights.to(dtype)
    out = torch.zeros(max(minlength, top + 1), dtype=dtype, device=x.device)
    return out.index_add(0, x.to(torch.int64), values)


# -- ops that return Python values: computed on the device, then read ---------------------------


def _read_bool(t) -> bool:
    return bool(to_torch(record(aten.all.default, (t,), {})))


@special(aten.equal.default)
def _equal(func, args, kwargs):
    x, y = args[0], args[1]
    if x.shape != y.shape:
        return False
    return _read_bool(record(aten.eq.Tensor, (x, y), {}))


@special(aten.allclose.default)
def _allclose(func, args, kwargs):
    b = bound(func, args, kwargs)
    close = record(
        aten.isclose.default,
        (b["self"], b["other"], b["rtol"], b["atol"], b["equal_nan"]),
        {},
    )
    return _read_bool(close)


@special(aten._linalg_check_errors.default)
def _linalg_check_errors(func, args, kwargs):
    """torch checks the ``info`` of a factorization (singular, not positive definite) by
    reading it and raising. Reading it would end the graph at every inverse, solve and
    Cholesky, so the lazy device does as torch_xla does and does not check: such a matrix
    gives what XLA computes (inf or NaN). The ``_ex`` variants return ``info`` to check."""
    return None


@special(aten._ctc_loss.Tensor, aten._ctc_loss_backward.Tensor)
def _ctc_loss_lengths(func, args, kwargs):
    """CTC loss with its lengths as tensors: the lengths decide the shape of ``log_alpha``, so
    they are read (as eager's CPU kernel copies them to the host) and the int-list overload is
    recorded."""
    _sync(func._schema.name)
    b = bound(func, args, kwargs)
    for k in ("input_lengths", "target_lengths"):
        v = b[k]
        b[k] = (to_torch(v) if isinstance(v, LazyTensor) else v).tolist()
    target = (
        aten._ctc_loss.default if func is aten._ctc_loss.Tensor else aten._ctc_loss_backward.default
    )
    names = [a.name for a in target._schema.arguments]
    return dispatch(target, [b[n] for n in names if n in b], {})
