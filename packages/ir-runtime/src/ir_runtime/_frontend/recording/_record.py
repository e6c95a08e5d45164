"""Recording ATen calls as ir-core nodes: an argument plan per op, one preparation (in C),
memoized shape inference, scalars lifted to inputs."""

from __future__ import annotations

import numpy as np
import torch

from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime import _schema
from ir_runtime._bounded import Bounded
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._meta import MEMO, infer
from ir_runtime._frontend.recording._tensor import LazyTensor, add_view, wrap

# Argument kinds in an op's plan (the C preparation's own numbering).
TENSOR, TENSOR_LIST, OPT_TENSOR, SCALAR, OTHER = _fast.KINDS
MISSING = _fast.MISSING  # an argument a call does not give
# Ops whose Scalar arguments decide shapes or are read by Python in their rule: never lifted.
_KEEP_SCALARS = frozenset(("aten::arange", "aten::linspace", "aten::logspace", "aten::pow"))
_PLAIN = frozenset((type(None), bool, int, float, str))  # attributes that are their own value


class Plan:
    """How one ATen overload's arguments map to operands and attributes."""

    __slots__ = ("args", "index", "lift", "name", "op", "positional", "view")

    def __init__(self, func):
        schema = func._schema
        self.name = schema.name
        overload = schema.overload_name or "default"
        self.op = f"{schema.name}.{overload}"
        self.args = []
        for a in schema.arguments:
            default = a.default_value if a.has_default_value() else MISSING
            self.args.append((a.name, _KIND[_schema.argument_kind(a.type)], default))
        self.index = {name: k for k, (name, _, _) in enumerate(self.args)}
        # An op whose result aliases its first argument (view, select, slice, t, ...).
        returns = schema.returns
        self.view = bool(returns) and returns[0].alias_info is not None and not schema.is_mutable
        self.lift = schema.name not in _KEEP_SCALARS
        # An absent default that always gives the same attribute is given as that attribute and
        # its key part.
        constants = [_constant(self, name, kind, default) for name, kind, default in self.args]
        self.positional = _fast.Positional(
            self, [c[0] for c in constants], [c[1] for c in constants]
        )

    def layout(self, args, kwargs) -> tuple:
        """The call's arguments by position, an absent one ``MISSING`` (keyword arguments put in
        their schema place)."""
        if not kwargs:
            return args if type(args) is tuple else tuple(args)
        out = list(args) + [MISSING] * (len(self.args) - len(args))
        for name, v in kwargs.items():
            k = self.index.get(name)
            if k is None:
                raise TypeError(f"{self.op} got an unexpected keyword argument {name!r}")
            out[k] = v
        return tuple(out)

    def bind(self, args, kwargs) -> dict:
        """Every argument of the call by its schema name, defaults filled in (an absent one
        with no default left out)."""
        laid = self.layout(args, kwargs)
        out = {}
        for k, (name, _, default) in enumerate(self.args):
            v = laid[k] if k < len(laid) else MISSING
            if v is MISSING:
                v = default
            if v is not MISSING:
                out[name] = v
        return out


# The schema's argument kinds (``_schema``, which the lowering reads too) as C's numbers.
_KIND = {
    _schema.TENSOR: TENSOR,
    _schema.TENSOR_LIST: TENSOR_LIST,
    _schema.OPTIONAL_TENSOR: OPT_TENSOR,
    _schema.SCALAR: SCALAR,
    _schema.OTHER: OTHER,
}


def _constant(plan: Plan, name: str, kind: int, default):
    """(attribute, key part) an absent argument's default gives on every call, or
    (MISSING, MISSING) when it has none or its part depends on the call."""
    if default is MISSING:
        return MISSING, MISSING
    lifted = plan.lift and type(default) is float and default not in _fast.SPECIAL
    if kind == OTHER or (kind == SCALAR and not lifted):
        a = default if type(default) in _PLAIN else attr_value(default)
        return a, (name, a)
    return MISSING, MISSING


_PLANS = Bounded(8192)  # OpOverload -> Plan; ATen has a few thousand overloads


def plan_of(func) -> Plan:
    plan = _PLANS.get(func)
    if plan is None:
        plan = _PLANS[func] = Plan(func)
    return plan


def prepare(plan: Plan, args, kwargs):
    """The call's shape-inference memo key, operands and attributes (``_fast.Positional``)."""
    prepared = plan.positional(plan.layout(args, kwargs))
    if prepared is None:
        raise TypeError(
            f"{plan.op} takes {len(plan.args)} arguments, got {len(args) + len(kwargs)}"
        )
    return prepared


def bound(func, args, kwargs) -> dict:
    """Every argument of an ATen call by its schema name, defaults filled in."""
    return plan_of(func).bind(args, kwargs)


def attr_value(value):
    """An argument as an ir-core attribute: dtypes by name, sequences as tuples; devices, layouts
    and memory formats dropped (None): placement is the runtime's business."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return ir_dtype(value)
    if isinstance(value, (list, tuple, torch.Size)):
        return tuple(attr_value(v) for v in value)
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return None
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise TypeError(f"symbolic value {value!r}: dynamic shapes are not supported")
    raise TypeError(f"argument {value!r} ({type(value).__name__}) has no attribute encoding")


def make_leaf(value, dtype: str) -> Value:
    return Value(DeviceData(Shape(dtype, ()), handle=np.asarray(value, to_numpy_dtype(dtype))))


def default_float() -> str:
    return ir_dtype(torch.get_default_dtype())


_COMPLEX_PRECISION = {"complex64": "float32", "complex128": "float64"}


def float_dtype(args):
    """The precision of the op's first floating (or complex) tensor argument, as a float dtype:
    lifted scalars take it (complex ones its complex type)."""
    for a in args:
        ir = getattr(a, "_ir", None)  # a lazy tensor, without torch's slow isinstance
        if ir is not None:
            d = ir.shape.dtype
            if d in _fast.FLOATS:
                return d
            if d in _COMPLEX_PRECISION:
                return _COMPLEX_PRECISION[d]
        elif isinstance(a, torch.Tensor) and (a.dtype.is_floating_point or a.is_complex()):
            return ir_dtype(a.dtype.to_real())
    return None


scalar_leaf = _fast.scalar_leaf
number_leaf = _fast.number_leaf


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
    key, operands, attrs = prepared or prepare(plan, args, kwargs)
    layout = MEMO.get(key)
    if layout is None:
        layout = infer(func, key, args, kwargs)
    if layout[0] == "none":
        return None
    node = Generic(plan.op, operands, layout[1], attrs, None, _fast.origin())
    if layout[0] != "one":
        return _wrap_out(layout, node)
    out = LazyTensor.__new__(LazyTensor, Value(node, 0))
    if plan.view:
        out._view = (args[0], func, args[1:], kwargs)
        add_view(args[0], out)
    return out


# The leaves' cache is bounded: a run whose Python scalars keep changing must not grow.
LEAVES = Bounded(8192)
