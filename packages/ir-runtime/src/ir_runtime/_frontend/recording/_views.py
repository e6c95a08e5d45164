"""Writes in place, as torch's shared storage would show them: a tensor rebound to a new value
(cast and broadcast to its own dtype and shape), and the write carried through its views and
its base. No node is ever mutated: each view and base is rebound to a new value computed from
the written one."""

from __future__ import annotations

import torch

from ir_core import Value
from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._record import record
from ir_runtime._frontend.recording._tensor import LazyTensor, base_of, wrap

aten = torch.ops.aten


def rebind(t: LazyTensor, value: Value) -> None:
    """Point ``t`` at a new value, cast and broadcast to ``t``'s own dtype and shape."""
    s = value.shape
    want_dtype = ir_dtype(t.dtype)
    want_dims = tuple(t.shape)
    if s.dtype != want_dtype:
        value = record(aten._to_copy.default, (wrap(value),), {"dtype": t.dtype})._ir
    if value.shape.dims != want_dims:
        value = record(aten.expand.default, (wrap(value), list(want_dims)), {})._ir
    t._set(value)


def write_through(t: LazyTensor) -> None:
    """After ``t`` was written in place, show the write where torch's shared storage would: in
    its own views, and, if it is a view, in its base (on up through the base's own base) and
    the base's other views."""
    if t._views:
        _refresh_views(t, written=None)
    while t._view is not None:
        base, func, rest, kwargs = t._view
        base = base_of(base)
        if not isinstance(base, LazyTensor):
            return
        new = wrap(t._ir)
        name = func._schema.name if func is not None else "aten::alias"
        if name in ("aten::alias", "aten::detach"):
            value = new
        elif name in _RESHAPES:
            value = record(aten.reshape.default, (new, list(base.shape)), {})
        elif name == "aten::t" or name == "aten::transpose":
            dims = (0, 1) if name == "aten::t" else (rest[0], rest[1])
            value = record(aten.transpose.int, (new, *dims), {})
        elif name == "aten::permute":
            order = [d % base.dim() for d in rest[0]]
            inverse = [order.index(k) for k in range(len(order))]
            value = record(aten.permute.default, (new, inverse), {})
        elif name == "aten::select":
            value = record(aten.select_scatter.default, (base, new, *rest), kwargs)
        elif name == "aten::slice":
            value = record(aten.slice_scatter.default, (base, new, *rest), kwargs)
        elif name == "aten::view_as_real":
            value = record(aten.view_as_complex.default, (new,), {})
        elif name in ("aten::real", "aten::imag"):
            other = record(
                aten.imag.default if name == "aten::real" else aten.real.default, (base,), {}
            )
            parts = (new, other) if name == "aten::real" else (other, new)
            value = record(aten.complex.default, parts, {})
        elif name == "aten::as_strided":
            value = record(aten.as_strided_scatter.default, (base, new, *rest), kwargs)
        elif name == "aten::diagonal":
            value = record(aten.diagonal_scatter.default, (base, new, *rest), kwargs)
        else:
            raise UnsupportedOpError(
                f"writing in place through a view made by {func} is not supported on the lazy "
                f"device; write the base tensor instead (or clone the view first)"
            )
        base._set(value._ir)
        if len(base._views or ()) > 1:
            _refresh_views(base, written=t)
        t = base


def _refresh_views(base: LazyTensor, written) -> None:
    """Recompute every other live view of ``base`` (and their views) from its new value, as
    shared storage would show it; ``written`` (a view, or None) already holds its own."""
    stack = [base]
    while stack:
        b = stack.pop()
        alive = []
        for r in b._views or ():
            v = r()
            if v is None:
                continue
            alive.append(r)
            link = v._view
            if v is written or link is None or base_of(link[0]) is not b:
                continue
            _, func, rest, kwargs = link
            v._set(b._ir if func is None else record(func, (b, *rest), kwargs)._ir)
            if v._views:
                stack.append(v)
        b._views = alive or None


_RESHAPES = frozenset(
    (
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::squeeze",
        "aten::unsqueeze",
        "aten::flatten",
        "aten::unflatten",
        "aten::expand_as",
    )
)
