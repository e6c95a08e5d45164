"""Recording ATen calls as ir-core nodes: argument plans per op, memoized shape inference,
scalars lifted to inputs."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

from ir_core import DeviceData, Shape, Value
from ir_runtime._errors import DTypeError
from ir_runtime._frontend import _fast

DEVICE = torch.device("lazy", 0)

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


# Argument kinds in an op's plan (the C preparation's own numbering).
TENSOR, TENSOR_LIST, OPT_TENSOR, SCALAR, OTHER = _fast.KINDS

# Scalars XLA programs keep as constants (as torch_xla does); any other float in a Scalar
# argument becomes a 0-d input, so a learning rate or a bias correction that changes every step
# does not change the program.
_SPECIAL = frozenset((0.0, 1.0, -1.0, 2.0, 0.5))
# Ops whose Scalar arguments decide shapes or are read by Python in their rule: never lifted.
_KEEP_SCALARS = frozenset(("aten::arange", "aten::linspace", "aten::logspace", "aten::pow"))


class Plan:
    """How one ATen overload's arguments map to operands and attributes."""

    __slots__ = ("args", "lift", "name", "op", "positional", "prepare", "view")

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
        self.prepare = None  # (args, kwargs, as_value) -> (key, operands, attributes)
        # An op whose result aliases its first argument (view, select, slice, t, ...).
        returns = schema.returns
        self.view = bool(returns) and returns[0].alias_info is not None and not schema.is_mutable
        self.lift = schema.name not in _KEEP_SCALARS
        # (args,) -> the same as prepare, for a call without keyword arguments (how torch
        # dispatches), in C. An absent default that always gives the same attribute is given
        # as that attribute and its key part.
        constants = [_constant(self, name, kind, default) for name, kind, default in self.args]
        self.positional = _fast.Positional(
            self, [c[0] for c in constants], [c[1] for c in constants]
        )


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
    if isinstance(value, complex):  # the complex type of the op's float precision
        return "complex128" if float_dtype in ("float64", "complex128") else "complex64"
    return float_dtype


def _leaf_key(value, dtype: str):
    """A leaf's cache key: (type, value, dtype), with -0.0 apart from 0.0 (equal as numbers,
    not as leaves: 1 / -0.0 is -inf)."""
    if value == 0 and type(value) is float and math.copysign(1.0, value) < 0:
        return (float, "-0.0", dtype)
    return (type(value), value, dtype)


_LEAVES: dict = {}


def scalar_leaf(value, dtype: str) -> Value:
    """A lifted scalar: a 0-d parameter holding the value, one per (value, dtype)."""
    key = _leaf_key(value, dtype)
    leaf = _LEAVES.get(key)
    if leaf is None:
        np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        if len(_LEAVES) > 4096:
            _LEAVES.clear()
        handle = np.asarray(value, dtype=np_dtype)
        leaf = _LEAVES[key] = Value(DeviceData(Shape(dtype, ()), handle=handle))
    return leaf


_META: dict = {}


def _like(k: int):
    return lambda *args, **kwargs: torch.empty_like(args[k])


def _margin_loss(func):
    """torch's meta kernel gives a 1-D input's unreduced loss shape [1]; CPU gives []."""

    names = [a.name for a in func._schema.arguments]
    (reduction,) = [a for a in func._schema.arguments if a.name == "reduction"]
    default = reduction.default_value if reduction.has_default_value() else None

    def shapes(x, *args, **kwargs):
        out = func(x, *args, **kwargs)
        given = dict(zip(names[1:], args, strict=False)) | kwargs
        if x.dim() == 1 and given.get("reduction", default) == 0:
            first = out[0] if isinstance(out, tuple) else out
            squeezed = first.new_empty(())
            return (squeezed, *out[1:]) if isinstance(out, tuple) else squeezed
        return out

    return shapes


def _lstsq(a, b, rcond=None, *, driver=None):
    """linalg_lstsq's outputs: solution, residuals, rank, singular values, as the CPU kernel
    gives them for its driver (gelsy by default)."""
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    b2 = b.unsqueeze(-1) if vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], b2.shape[:-2])
    k = b2.shape[-1]
    real = a.real.dtype if a.is_complex() else a.dtype
    return (
        a.new_empty((*batch, n) if vector else (*batch, n, k)),
        a.new_empty((*batch, k) if m > n and driver != "gelsy" else (0,), dtype=real),
        a.new_empty(a.shape[:-2] if driver != "gels" else (0,), dtype=torch.int64),
        a.new_empty(
            (*a.shape[:-2], min(m, n)) if driver in ("gelsd", "gelss") else (0,), dtype=real
        ),
    )


_aten = torch.ops.aten
# Output shapes (as meta tensors) of the ATen ops torch has no meta kernel for, or whose meta
# kernel disagrees with the CPU kernel; the rest come from torch's meta kernels.
_NO_META = {
    _aten.fractional_max_pool3d_backward.default: _like(1),
    _aten._ctc_loss_backward.default: _like(1),
    _aten.multi_margin_loss_backward.default: _like(1),
    _aten.multilabel_margin_loss_backward.default: _like(1),
    _aten.geqrf.default: lambda x: (
        torch.empty_like(x),
        x.new_empty((*x.shape[:-2], min(x.shape[-2], x.shape[-1]))),
    ),
    _aten.linalg_lstsq.default: _lstsq,
    _aten.histogram.bin_ct: lambda x, bins=100, *, range=None, weight=None, density=False: (
        x.new_empty((bins,)),
        x.new_empty((bins + 1,)),
    ),
    _aten.histogram.bins_tensor: lambda x, bins, *, weight=None, density=False: (
        x.new_empty((bins.numel() - 1,)),
        bins.new_empty(bins.shape),
    ),
    _aten._histogramdd_bin_edges.default: (
        lambda x, bins, *, range=None, weight=None, density=False: [
            x.new_empty((b + 1,)) for b in bins
        ]
    ),
    _aten._histogramdd_from_bin_cts.default: (
        lambda x, bins, *, range=None, weight=None, density=False: x.new_empty(tuple(bins))
    ),
    _aten._histogramdd_from_bin_tensors.default: (
        lambda x, bins, *, weight=None, density=False: x.new_empty(
            tuple(b.numel() - 1 for b in bins)
        )
    ),
    _aten.multi_margin_loss.default: _margin_loss(_aten.multi_margin_loss.default),
    _aten.multilabel_margin_loss_forward.default: _margin_loss(
        _aten.multilabel_margin_loss_forward.default
    ),
}


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
    shapes = _NO_META.get(func)
    if shapes is not None:
        out = shapes(*_meta_arg(list(args)), **meta_kwargs)
    else:
        out = func(*_meta_arg(list(args)), **meta_kwargs)
    if isinstance(out, torch.Tensor):
        # The output's dims and torch dtype ride along: tracing's fast path builds the wrapper
        # from them directly (the keyword arguments of _make_wrapper_subclass, made once).
        dims = tuple(out.shape)
        result = ("one", (shape_of(out),), dims, out.dtype, {"dtype": out.dtype, "device": DEVICE})
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
_NUMBERS = (float, int, bool, complex)
_PLAIN = frozenset((type(None), bool, int, float, str))  # attributes that are their own value
_NUMBER_LEAVES: dict = {}


def number_leaf(v, args) -> Value:
    """A Python number passed for a Tensor argument: a lifted 0-d leaf, floats in the dtype of
    the op's first floating tensor, or beside none in torch's default dtype (as torch promotes
    a Python float). One dict lookup once seen."""
    fd = _float_dtype(args)
    if fd is None and type(v) is float:
        fd = ir_dtype(torch.get_default_dtype())
    key = _leaf_key(v, fd)
    leaf = _NUMBER_LEAVES.get(key)
    if leaf is None:
        if len(_NUMBER_LEAVES) > 4096:
            _NUMBER_LEAVES.clear()
        leaf = _NUMBER_LEAVES[key] = scalar_leaf(v, _number_dtype(v, fd))
    return leaf


def _float_dtype(args):
    """The precision of the op's first floating (or complex) tensor argument, as a float dtype:
    lifted scalars take it (complex ones its complex type)."""
    for a in args:
        ir = getattr(a, "_ir", None)  # a lazy tensor, without torch's slow isinstance
        if ir is not None:
            d = ir.shape.dtype
            if d in _FLOATS:
                return d
            if d in _COMPLEX_PRECISION:
                return _COMPLEX_PRECISION[d]
        elif isinstance(a, torch.Tensor) and (a.dtype.is_floating_point or a.is_complex()):
            return ir_dtype(a.dtype.to_real())
    return None


_COMPLEX_PRECISION = {"complex64": "float32", "complex128": "float64"}


def prepare(plan: Plan, args, kwargs, as_value):
    """One pass over an op's arguments: the shape-inference memo key (tensors by Shape, lifted
    floats by kind only), the operands, and the attributes. Each op gets its own straight-line
    function, generated from its schema the first time. (Calls without keyword arguments, as
    torch makes them, take ``plan.positional`` in C instead: the same results.)"""
    fn = plan.prepare
    if fn is None:
        fn = plan.prepare = _generate(plan)
    return fn(args, kwargs, as_value)


def _environment(plan: Plan) -> dict:
    from ir_runtime._frontend._tensor import LazyTensor

    env = {
        "LAZY": LazyTensor,
        "OP": plan.op,
        "MISSING": _MISSING,
        "NUMBERS": _NUMBERS,
        "SPECIAL": _SPECIAL,
        "PLAIN": _PLAIN,
        "LIFT": plan.lift,
        "scalar_leaf": scalar_leaf,
        "number_leaf": number_leaf,
        "float_dtype": _float_dtype,
        "attr_value": attr_value,
    }
    for k, (_, _, default) in enumerate(plan.args):
        env[f"D{k}"] = default
    return env


def _generate(plan: Plan):
    """Python source for ``prepare`` specialized to one schema: no loop, no kind dispatch."""
    lines = [
        "def prepare(args, kwargs, as_value):",
        "    n = len(args)",
        "    key = [OP]",
        "    operands = []",
        "    attrs = {}",
        "    lifted = None",
    ]
    for k, (name, kind, _) in enumerate(plan.args):
        lines.append(f"    v = args[{k}] if n > {k} else kwargs.get({name!r}, D{k})")
        lines.append("    if v is not MISSING:")
        lines += [f"        {line}" for line in _argument(name, kind, "key.append({})")]
    lines += [
        "    if lifted is not None:",
        "        attrs['__lifted__'] = tuple(lifted[0])",
        "        operands.extend(lifted[1])",
        "    return tuple(key), operands, attrs",
    ]
    namespace: dict = {}
    exec("\n".join(lines), _environment(plan), namespace)
    return namespace["prepare"]


def _constant(plan: Plan, name: str, kind: int, default):
    """(attribute, key part) an absent argument's default gives on every call, or
    (MISSING, MISSING) when it has none or its part depends on the call."""
    if default is _MISSING:
        return _MISSING, _MISSING
    lifted = plan.lift and type(default) is float and default not in _SPECIAL
    if kind == OTHER or (kind == SCALAR and not lifted):
        a = default if type(default) in _PLAIN else attr_value(default)
        return a, (name, a)
    return _MISSING, _MISSING


def _argument(name: str, kind: int, keep: str) -> list[str]:
    """The lines that take one argument ``v`` in: operands, attributes, lifted scalars, and its
    part of the key, given to ``keep`` (a format string)."""
    return {
        TENSOR: [
            "if type(v) is LAZY:",
            "    v = v._ir",
            "elif type(v) in NUMBERS:",
            "    v = number_leaf(v, args)",
            "else:",
            "    v = as_value(v)",
            "operands.append(v)",
            keep.format("v.shape"),
        ],
        OTHER: [
            "a = v if type(v) in PLAIN else attr_value(v)",
            f"attrs[{name!r}] = a",
            keep.format(f"({name!r}, a)"),
        ],
        SCALAR: [
            "fd = float_dtype(args) if LIFT and type(v) is float and v not in SPECIAL else None",
            "if fd is not None or type(v) is complex:",  # complex: no attribute encoding
            "    lifted = lifted or ([], [])",
            f"    lifted[0].append({name!r})",
            "    lifted[1].append(number_leaf(v, args) if fd is None else scalar_leaf(v, fd))",
            "    " + keep.format(repr(name)),
            "else:",
            "    a = v if type(v) in PLAIN else attr_value(v)",
            f"    attrs[{name!r}] = a",
            "    " + keep.format(f"({name!r}, a)"),
        ],
        OPT_TENSOR: [
            "if v is None:",
            f"    attrs[{name!r}] = None",
            "    " + keep.format("None"),
            "else:",
            "    v = as_value(v)",
            "    operands.append(v)",
            "    " + keep.format("v.shape"),
        ],
        TENSOR_LIST: [
            "present = []",
            "for t in v:",
            "    if t is None:",
            "        present.append(None)",
            "    else:",
            "        t = as_value(t)",
            "        operands.append(t)",
            "        present.append(t.shape)",
            "if None in present:",
            "    attrs['indexed'] = tuple(p is not None for p in present)",
            keep.format("tuple(present)"),
        ],
    }[kind]
