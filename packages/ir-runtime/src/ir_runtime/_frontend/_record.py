"""Recording ATen calls as ir-core nodes: argument plans per op, memoized shape inference,
scalars lifted to inputs."""

from __future__ import annotations

import numpy as np
import torch

from ir_core import DeviceData, Shape, Value
from ir_runtime._errors import DTypeError

TORCH_TO_IR = {
    torch.bool: "bool",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}
IR_TO_TORCH = {v: k for k, v in TORCH_TO_IR.items()}


def ir_dtype(dtype: torch.dtype) -> str:
    try:
        return TORCH_TO_IR[dtype]
    except KeyError:
        raise DTypeError(
            f"torch dtype {dtype} has no XLA equivalent here; use one of "
            f"{', '.join(str(d) for d in TORCH_TO_IR)}"
        ) from None


# Argument kinds in an op's plan.
TENSOR, TENSOR_LIST, OPT_TENSOR, SCALAR, OTHER = range(5)

# Scalars XLA programs keep as constants (as torch_xla does); any other float in a Scalar
# argument becomes a 0-d input, so a learning rate or a bias correction that changes every step
# does not change the program.
_SPECIAL = frozenset((0.0, 1.0, -1.0, 2.0, 0.5))
# Ops whose Scalar arguments decide shapes or are read by Python in their rule: never lifted.
_KEEP_SCALARS = frozenset(("aten::arange", "aten::linspace", "aten::logspace", "aten::pow"))


class Plan:
    """How one ATen overload's arguments map to operands and attributes."""

    __slots__ = ("args", "lift", "name", "op", "positional", "view")

    def __init__(self, func):
        schema = func._schema
        self.name = schema.name
        overload = schema.overload_name or "default"
        self.op = f"{schema.name}.{overload}"
        self.args = []
        for a in schema.arguments:
            t = a.type
            if isinstance(t, torch.TensorType):
                kind = TENSOR
            elif isinstance(t, torch.OptionalType) and isinstance(
                t.getElementType(), torch.TensorType
            ):
                kind = OPT_TENSOR
            elif isinstance(t, torch.ListType) and isinstance(
                t.getElementType(), (torch.TensorType, torch.OptionalType)
            ):
                kind = TENSOR_LIST
            elif isinstance(t, torch.NumberType) or (
                isinstance(t, torch.OptionalType)
                and isinstance(t.getElementType(), torch.NumberType)
            ):
                kind = SCALAR
            else:
                kind = OTHER
            self.args.append((a.name, kind, a.default_value if a.has_default_value() else _MISSING))
        self.positional = len(self.args)
        # An op whose result aliases its first argument (view, select, slice, t, ...).
        returns = schema.returns
        self.view = bool(returns) and returns[0].alias_info is not None and not schema.is_mutable
        self.lift = schema.name not in _KEEP_SCALARS

    def bind(self, args, kwargs):
        """(name, kind, value) for each argument given or defaulted."""
        out = []
        n = len(args)
        for k, (name, kind, default) in enumerate(self.args):
            if k < n:
                value = args[k]
            elif name in kwargs:
                value = kwargs[name]
            elif default is not _MISSING:
                value = default
            else:
                continue
            out.append((name, kind, value))
        return out


_MISSING = object()
_PLANS: dict = {}


def plan_of(func) -> Plan:
    plan = _PLANS.get(func)
    if plan is None:
        plan = _PLANS[func] = Plan(func)
    return plan


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


def shape_of(t: torch.Tensor) -> Shape:
    return Shape(ir_dtype(t.dtype), tuple(t.shape))


def _number_dtype(value, float_dtype):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    return float_dtype or "float32"


_LEAVES: dict = {}


def scalar_leaf(value, dtype: str) -> Value:
    """A lifted scalar: a 0-d parameter holding the value, one per (value, dtype)."""
    key = (type(value), value, dtype)
    leaf = _LEAVES.get(key)
    if leaf is None:
        import ml_dtypes

        np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        if len(_LEAVES) > 4096:
            _LEAVES.clear()
        handle = np.asarray(value, dtype=np_dtype)
        leaf = _LEAVES[key] = Value(DeviceData(Shape(dtype, ()), handle=handle))
    return leaf


_META: dict = {}


def _meta_arg(v):
    if isinstance(v, torch.Tensor):
        return torch.empty(v.shape, dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_arg(x) for x in v)
    return v


def infer(func, key, args, kwargs):
    """Output (structure, shapes) of ``func`` for inputs like ``args``, from torch's meta
    kernels; memoized by ``key`` (op, input shapes and dtypes, attributes)."""
    hit = _META.get(key)
    if hit is not None:
        return hit
    meta_kwargs = {k: _meta_arg(v) for k, v in kwargs.items()}
    if "device" in meta_kwargs:  # a factory: build it on meta, not on the lazy device again
        meta_kwargs["device"] = "meta"
    out = func(*_meta_arg(list(args)), **meta_kwargs)
    if isinstance(out, torch.Tensor):
        result = ("one", (shape_of(out),))
    elif isinstance(out, (tuple, list)):
        layout = tuple(isinstance(o, torch.Tensor) for o in out)
        result = ("many", tuple(shape_of(o) for o in out if isinstance(o, torch.Tensor)), layout)
    elif out is None:
        result = ("none", ())
    else:
        raise TypeError(f"{func} returned {type(out).__name__}; expected tensors")
    _META[key] = result
    return result


_FLOATS = frozenset(("float16", "bfloat16", "float32", "float64"))
_NUMBERS = (float, int, bool)


def _float_dtype(args):
    """The dtype of the op's first floating tensor argument: lifted scalars take it."""
    for a in args:
        ir = getattr(a, "_ir", None)  # a lazy tensor, without torch's slow isinstance
        if ir is not None:
            if ir.shape.dtype in _FLOATS:
                return ir.shape.dtype
        elif isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            return ir_dtype(a.dtype)
    return None


def prepare(plan: Plan, args, kwargs, as_value):
    """One pass over an op's arguments: the shape-inference memo key (tensors by Shape, lifted
    floats by kind only), the operands, and the attributes."""
    key = [plan.op]
    operands, attrs, lifted, lifted_values = [], {}, None, None
    n = len(args)
    for k, (name, kind, default) in enumerate(plan.args):
        if k < n:
            value = args[k]
        elif name in kwargs:
            value = kwargs[name]
        elif default is not _MISSING:
            value = default
        else:
            continue
        if kind == TENSOR:
            if type(value) in _NUMBERS:  # a Python number where the schema has a Tensor
                v = scalar_leaf(value, _number_dtype(value, _float_dtype(args)))
            else:
                v = as_value(value)
            operands.append(v)
            key.append(v.shape)
        elif kind == OTHER:
            a = attr_value(value)
            attrs[name] = a
            key.append((name, a))
        elif kind == SCALAR:
            if plan.lift and type(value) is float and value not in _SPECIAL:
                dtype = _float_dtype(args)
                if dtype is not None:
                    if lifted is None:
                        lifted, lifted_values = [], []
                    lifted.append(name)
                    lifted_values.append(scalar_leaf(value, dtype))
                    key.append(name)  # lifted: its value is not part of the program
                    continue
            a = attr_value(value)
            attrs[name] = a
            key.append((name, a))
        elif kind == OPT_TENSOR:
            if value is None:
                attrs[name] = None
                key.append(None)
            else:
                v = as_value(value)
                operands.append(v)
                key.append(v.shape)
        else:  # TENSOR_LIST
            present = []
            for t in value:
                if t is None:
                    present.append(None)
                else:
                    v = as_value(t)
                    operands.append(v)
                    present.append(v.shape)
            if None in present:
                attrs["indexed"] = tuple(p is not None for p in present)
            key.append(tuple(present))
    if lifted is not None:
        attrs["__lifted__"] = tuple(lifted)
        operands.extend(lifted_values)
    return tuple(key), operands, attrs


def _hashable(v):
    if isinstance(v, (list, tuple, torch.Size)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.dtype)
    return v


def shape_of_lazy(t) -> Shape:
    return Shape(ir_dtype(t.dtype), tuple(t.shape))
