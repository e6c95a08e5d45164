"""The lazy tensor: a torch.Tensor subclass whose value is an ir-core Value.

Every ATen op that reaches ``__torch_dispatch__`` is recorded as a node (shapes from torch's
meta kernels, memoized); composite ops without a lowering rule are decomposed with torch's own
decompositions; in-place ops rebind the tensor to the value of their functional form, so no
node is ever mutated. Autograd runs above dispatch, so backward ops are recorded the same way.
"""

from __future__ import annotations

import weakref

import ml_dtypes
import numpy as np
import torch
from torch._decomp import core_aten_decompositions, decomposition_table

from ir_core import DeviceData, Generic, Value
from ir_runtime import _metrics
from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend import _fast, _record
from ir_runtime._frontend._record import _META, DEVICE, IR_TO_TORCH, Plan, infer, plan_of, prepare
from ir_runtime._lowering import RULES, _registry

_make = torch.Tensor._make_wrapper_subclass
_DATA = torch._C.TensorBase.data  # torch's own .data descriptor
_ref = weakref.ref
aten = torch.ops.aten

# Every lazy tensor, in creation order (weak references, out of the cyclic collector's sight:
# see _fast), so mark_step finds the live ones with pending work in the same order every step:
# a program's outputs are in that order.
_LIVE: list = []


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


def _compact() -> None:
    """Drop the dead references once the list has grown past its threshold; the next one is
    twice what is left (at least 10,000), so compaction stays amortized O(1) per tensor."""
    _fast.set_compact_at(max(10_000, 2 * len(live())))


# torch's core ATen decompositions first, then its wider table (mse_loss and friends).
_DECOMPOSITIONS = {**decomposition_table, **core_aten_decompositions()}


class LazyTensor(torch.Tensor):
    """A tensor on the lazy device: ``_ir`` is its value in the graph being recorded."""

    # Its value lives in a slot: no instance dict is made for it, and reading it is faster.
    __slots__ = ("_ir",)
    # Class-level defaults, set on an instance only when they differ (tracing stays cheap).
    _spec = None  # the sharding the user annotated
    _placed = None  # the sharding of the data it last held
    _held = False  # whether it has held data (a parameter, a step's result), not only IR
    # (base, view op, its other args, kwargs) when it is a view of a lazy tensor; a detached
    # alias holds a weak reference to its base.
    _view = None
    _views = None  # weak references to the views made of it: a write must refresh them

    @staticmethod
    def __new__(cls, value: Value, requires_grad: bool = False):
        s = value.shape
        if requires_grad:
            t = _make(cls, s.dims, dtype=IR_TO_TORCH[s.dtype], device=DEVICE, requires_grad=True)
        else:  # tracing's case: one keyword fewer to parse
            t = _make(cls, s.dims, dtype=IR_TO_TORCH[s.dtype], device=DEVICE)
        t._ir = value
        if type(value.node) is DeviceData:
            t._held = True
            t._placed = value.node.sharding
        _track(t)
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def data(self):
        return _DATA.__get__(self)

    @data.setter
    def data(self, new):
        """``t.data = other`` (what ``Module.to(dtype)`` does): torch swaps the metadata, and the
        tensor takes ``other``'s value; a sharding annotation stays when the rank does."""
        value = as_value(new)  # first: a bad value changes nothing
        _DATA.__set__(self, new)
        self._ir = value
        spec = self._spec
        if spec is not None and spec.rank not in (None, len(value.shape.dims)):
            self._spec = None
        if type(value.node) is DeviceData:
            self._held, self._placed = True, value.node.sharding

    # A seen op with one output is recorded in C (_fast); the rest comes to _dispatch.
    __torch_dispatch__ = classmethod(_fast.torch_dispatch)

    def __repr__(self, *, tensor_contents=None):
        from ir_runtime._frontend._step import to_torch

        return f"{to_torch(self)!r} (on {DEVICE})"

    def __reduce_ex__(self, protocol):
        from ir_runtime._frontend._step import to_torch

        return to_torch(self).__reduce_ex__(protocol)


def wrap(value: Value) -> LazyTensor:
    return LazyTensor(value)


def host_numpy(x: torch.Tensor) -> np.ndarray:
    """A host tensor's value as numpy, bfloat16 kept (as ml_dtypes' bfloat16)."""
    host = movable(x).cpu()
    if host.dtype == torch.bfloat16:
        return host.float().numpy().astype(ml_dtypes.bfloat16)
    return host.numpy()


def movable(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, its conjugate and negative bits applied, once it is known to be a tensor
    the lazy device can hold: dense, of a dtype XLA takes (else a clear error, before any copy)."""
    if x.layout != torch.strided:
        raise UnsupportedOpError(
            f"a {x.layout} tensor {tuple(x.shape)} cannot move to the lazy device: only dense "
            f"(strided) tensors can; use t.to_dense() first"
        )
    _record.ir_dtype(x.dtype)
    return x.detach().resolve_conj().resolve_neg()


def as_value(x) -> Value:
    """The IR value of an argument: a lazy tensor's value, or a host tensor as a parameter."""
    if type(x) is LazyTensor or isinstance(x, LazyTensor):  # the first test is the fast one
        return x._ir
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise UnsupportedOpError(f"a meta tensor {x.shape} reached the lazy device")
        value = Value(DeviceData(_record.shape_of(x), handle=np.array(host_numpy(x))))
        if HOST_READS is not None:
            base = x._base
            HOST_READS.append((value.node, (_ref(x), None if base is None else _ref(base))))
        return value
    raise TypeError(f"expected a tensor, got {type(x).__name__}")


# While a compiled step is traced: the host tensors its program reads, as (data node, (weak
# reference, one to its base if it is a view)). A replay reads none of them, so it checks that
# those still alive hold the same.
HOST_READS: list | None = None


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


def record(func, args, kwargs, plan: Plan | None = None, prepared=None):
    """Record ``func(*args, **kwargs)`` as one node; return lazy tensors like torch's result.
    ``prepared``: the plan's (key, operands, attributes) when the caller already has them."""
    if plan is None:
        plan = plan_of(func)
    key, operands, attrs = prepared or prepare(plan, args, kwargs, as_value)
    layout = _META.get(key)
    if layout is None:
        layout = infer(func, key, args, kwargs)
    if layout[0] == "none":
        return None
    node = Generic(plan.op, operands, layout[1], attrs)
    if layout[0] != "one":
        return _wrap_out(layout, node)
    out = LazyTensor.__new__(LazyTensor, Value(node, 0))
    if plan.view:
        out._view = (args[0], func, args[1:], kwargs)
        _add_view(args[0], out)
    return out


def _add_view(base: LazyTensor, view: LazyTensor) -> None:
    views = base._views
    if views is None:
        base._views = [_ref(view)]
        return
    views.append(_ref(view))
    if len(views) >= 16 and not len(views) & (len(views) - 1):  # at powers of two: drop the dead
        views[:] = [r for r in views if r() is not None]


_FUNCTIONAL: dict = {}


def _functional(func):
    """The out-of-place overload of an in-place op (``add_.Tensor`` -> ``add.Tensor``): the
    overload of the op without ``_`` that takes the same arguments, by name and type (overload
    names do not always match: ``pow_.Scalar`` is ``pow.Tensor_Scalar``). Found once per op."""
    if func not in _FUNCTIONAL:
        _FUNCTIONAL[func] = _find_functional(func)
    return _FUNCTIONAL[func]


def _find_functional(func):
    name = func._schema.name.split("::")[1]
    packet = getattr(aten, name.rstrip("_"), None) if name.endswith("_") else None
    if packet is None:
        return None
    candidates = [getattr(packet, o) for o in packet.overloads()]
    candidates = [c for c in candidates if not c._schema.is_mutable]
    for named in (True, False):  # the same names and types; else (dropout_'s self is
        wanted = _signature_of(func, named)  # dropout's input) the only one of the same types
        found = [c for c in candidates if _signature_of(c, named) == wanted]
        if len(found) == 1 or (found and named):
            return found[0]
    return None


def _signature_of(func, named: bool):
    return tuple((a.name if named else "", str(a.type)) for a in func._schema.arguments)


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


def write_through(t: LazyTensor) -> None:
    """After ``t`` was written in place, show the write where torch's shared storage would: in
    its own views, and, if it is a view, in its base (on up through the base's own base) and
    the base's other views."""
    if t._views:
        _refresh_views(t, written=None)
    while t._view is not None:
        base, func, rest, kwargs = t._view
        base = _base_of(base)
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
        base._ir = value._ir
        if len(base._views or ()) > 1:
            _refresh_views(base, written=t)
        t = base


def _base_of(link):
    """A view's base: held weakly by a detached alias (see ``_same_value``)."""
    return link() if type(link) is weakref.ref else link


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
            if v is written or link is None or _base_of(link[0]) is not b:
                continue
            _, func, rest, kwargs = link
            v._ir = b._ir if func is None else record(func, (b, *rest), kwargs)._ir
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


_OUT_FORMS = {"arange.start_out": "start_step", "arange.out": "default"}


def _out_variant(func, args, kwargs):
    """``op.out(..., out=t)``: the functional overload, then ``t`` rebound to its result."""
    kwargs = dict(kwargs)
    out = kwargs.pop("out")
    name = func._schema.name.split("::")[1]
    packet = getattr(aten, name)
    overload = func._overloadname
    candidates = [_OUT_FORMS.get(f"{name}.{overload}"), overload.replace("_out", ""), "default"]
    given = {a.name for a in func._schema.arguments[: len(args)]} | set(kwargs)
    for candidate in candidates:
        functional = getattr(packet, candidate, None) if candidate else None
        if functional is None or functional._schema.is_mutable:
            continue
        names = {a.name for a in functional._schema.arguments}
        if given <= names:
            if "dtype" in names:
                kwargs.setdefault("dtype", out.dtype)
            result = dispatch(functional, args, kwargs)
            rebind(out, result._ir)
            write_through(out)
            return out
    raise UnsupportedOpError(f"{func} has no functional form the lazy device can record")


_INPLACE_CHECKED: set = set()


def _signature(x):
    """What an in-place op's validity depends on: tensors by shape and dtype, numbers by
    type, anything else by value."""
    if type(x) is LazyTensor:
        return x._ir.shape
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype)
    if type(x) in (float, int, bool):
        return type(x)
    if isinstance(x, (list, tuple)):
        return tuple(map(_signature, x))
    return x


def _inplace(func, args, kwargs):
    if "out" in kwargs:
        return _out_variant(func, args, kwargs)
    functional = _functional(func)
    if functional is None or not isinstance(args[0], LazyTensor):
        raise UnsupportedOpError(
            f"in-place op {func} has no out-of-place form the lazy device can record; "
            f"report it with the model that needs it, or write the op out of place"
        )
    # torch's own checks of the in-place op on meta tensors (a dtype cannot widen in place,
    # shapes must broadcast into self): the error a CPU user would get. Once per signature.
    key = (id(func), *map(_signature, args), *((k, _signature(v)) for k, v in kwargs.items()))
    if key not in _INPLACE_CHECKED:
        infer(func, ("in-place", key), args, kwargs)
        _INPLACE_CHECKED.add(key)
    self = args[0]
    result = dispatch(functional, args, kwargs)
    if func._schema.name in _RESHAPE_IN_PLACE:
        # squeeze_, t_, ...: the tensor's own shape changes (torch's matmul of a 1-D operand
        # squeezes its product in place). ``.data``'s setter swaps in the result's metadata.
        _DATA.__set__(self, result)
        self._ir = result._ir
        return self
    rebind(self, result._ir)
    write_through(self)
    return self


# In-place ops that change the tensor's shape rather than its values.
_RESHAPE_IN_PLACE = frozenset(
    f"aten::{name}_"
    for name in (
        "squeeze",
        "unsqueeze",
        "transpose",
        "t",
        "swapdims",
        "swapaxes",
        "as_strided",
        "resize",
        "resize_as",
    )
)


def _foreach(func, args, kwargs):
    """``_foreach_op[_].X`` as one ``op[_]`` per element, through torch's own Python API (which
    picks the overload)."""
    name = func._schema.name.split("::")[1][len("_foreach_") :]
    bound = dict(zip([a.name for a in func._schema.arguments], args, strict=False))
    bound.update(kwargs)
    n = len(bound["self"])
    results = []
    for i in range(n):
        positional, keywords = [], {}
        for arg, v in bound.items():
            item = v[i] if isinstance(v, (list, tuple)) else v
            if arg in ("alpha", "value") or (arg in ("scalars", "scalar") and "addc" in name):
                keywords["value" if arg.startswith("scalar") else arg] = item
            elif arg == "ord" and name == "norm":
                keywords["ord"] = item
            elif item is not None or arg == "self":
                positional.append(item)
        if name == "norm":
            results.append(torch.linalg.vector_norm(*positional, **keywords))
        elif name.endswith("_"):
            getattr(torch.Tensor, name)(*positional, **keywords)
        else:
            results.append(getattr(torch, name)(*positional, **keywords))
    return None if name.endswith("_") else results


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
        write_through(dst)
        return dst
    from ir_runtime._frontend._step import to_torch

    dst.copy_(to_torch(src))
    return dst


def _local_scalar_dense(func, args, kwargs):
    from ir_runtime._frontend._step import to_torch

    return to_torch(args[0]).item()


def _same_value(func, args, kwargs):
    out = wrap(args[0]._ir)
    if func is not aten.clone.default and func is not aten.contiguous.default:
        # Detach and alias share the tensor's storage, so writes go through to it. Weakly: the
        # autograd engine saves a result for backward as its detached alias, which would
        # otherwise hold the result (and its graph) alive in a cycle through C++ that no
        # garbage collection sees.
        out._view = (_ref(args[0]), None, (), {})
        _add_view(args[0], out)
    return out


def _native_batch_norm_legit(func, args, kwargs):
    """The training form mutates running stats in place: record the functional form and
    rebind the stats to its results. In eval mode torch saves no statistics (shape [0])."""
    x, weight, bias, running_mean, running_var, training, momentum, eps = args[:8]
    if not training:
        out = record(
            aten._native_batch_norm_legit_no_training.default, (*args[:5], momentum, eps), {}
        )
        empty = record(aten.new_zeros.default, (x, [0]), {})
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


def _batch_norm_with_update(func, args, kwargs):
    """``_batch_norm_with_update`` (training batch norm, as torch.nn.functional calls it): the
    functional form, stats rebound; its ``reserve`` output is empty on CPU."""
    x, weight, bias, running_mean, running_var, momentum, eps = args[:7]
    out = _native_batch_norm_legit(
        func, (x, weight, bias, running_mean, running_var, True, momentum, eps), {}
    )
    reserve = record(aten.new_zeros.default, (x, [0]), {"dtype": torch.uint8})
    return (*out, reserve)


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
    aten._batch_norm_with_update.default: _batch_norm_with_update,
    aten.native_dropout.default: _native_dropout,
}


def special(*funcs):
    """Register the decorated ``handler(func, args, kwargs)`` for the ATen overloads ``funcs``:
    the front end calls it instead of recording the op (ops that mutate, read the host, draw
    random numbers or have data-dependent shapes)."""

    def add(handler):
        for func in funcs:
            if func in SPECIAL:
                raise ValueError(f"{func} already has a front-end handler")
            SPECIAL[func] = handler
        _forget_routes()
        return handler

    return add


# By id: OpOverload hashes in Python, and ids of its (cached, immortal) overloads are stable.
_ROUTES: dict = {}
_NO_KWARGS: dict = {}


def _forget_routes() -> None:
    _ROUTES.clear()
    _fast.forget()


_registry.ON_CHANGE.append(_forget_routes)


def _route(func):
    handler = SPECIAL.get(func)
    plan = plan_of(func)
    recordable = plan if handler is None and plan.op in RULES else None
    route = _ROUTES[id(func)] = (handler, recordable, plan)
    if recordable is not None:
        _fast.register(func, plan.positional)
    return route


def _dispatch(cls, func, types, args=(), kwargs=None):
    """What the C dispatch leaves: keyword arguments, first sightings, several outputs, views,
    in-place and special ops."""
    route = _ROUTES.get(id(func))
    if route is not None:
        plan = route[1]
        if plan is not None:
            if kwargs:
                return record(func, args, kwargs, plan)
            return record(func, args, _NO_KWARGS, plan, plan.positional(args))
    return dispatch(func, args, kwargs or _NO_KWARGS)


def dispatch(func, args, kwargs):
    route = _ROUTES.get(id(func)) or _route(func)
    handler, recordable, plan = route
    if handler is not None:
        return handler(func, args, kwargs)
    if recordable is not None:
        return record(func, args, kwargs, recordable)
    name = plan.name
    if name.startswith("aten::_foreach_"):
        return _foreach(func, args, kwargs)
    if func._schema.is_mutable:
        return _inplace(func, args, kwargs)
    decomposition = _DECOMPOSITIONS.get(func)
    if decomposition is not None:
        out = decomposition(*args, **kwargs)
        if out is not NotImplemented:
            _metrics.count(f"Decomposed::{plan.op}")  # slow on the hot path: worth a rule?
            return out
    # A composite op (aten.to.dtype, ...) reached here from inside a decomposition.
    out = func.decompose(*args, **kwargs)
    if out is not NotImplemented:
        return out
    _metrics.count(f"Unsupported::{plan.op}")
    raise UnsupportedOpError(
        f"ATen op {plan.op} has no lowering rule and no decomposition on the lazy device. "
        f"Report it (with the model that needs it); meanwhile compute it on CPU "
        f"(t.cpu()) or register a rule with ir_runtime.register_lowering({plan.op!r})"
    )


_fast.configure(
    lazy=LazyTensor,
    make=_make,
    generic=Generic,
    value=Value,
    meta=_META,
    leaves=_record._NUMBER_LEAVES,
    floats=_record._FLOATS,
    special=_record._SPECIAL,
    number_leaf=_record.number_leaf,
    float_dtype=_record._float_dtype,
    scalar_leaf=_record.scalar_leaf,
    attr_value=_record.attr_value,
    as_value=as_value,
    slow=_dispatch,
    record=record,
    live=_LIVE,
    compact=_compact,
    missing=_record._MISSING,
)
_track = _fast.track
