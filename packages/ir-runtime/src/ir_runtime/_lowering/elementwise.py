"""Elementwise math: arithmetic, unary functions, activations and their backward ops.

Arithmetic runs in the output dtype the front end inferred with torch's promotion rules (so
int64 + float32 is computed in float32, as torch does). Comparisons, casts and selection are in
``comparison``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ir_runtime import _runtime_checks
from ir_runtime._lowering._registry import (
    NATIVE,
    cast,
    existing,
    out_dims,
    out_dtype,
    register,
    scalar,
)


def _is_one(v) -> bool:
    """Whether an attribute is the constant 1 (a lifted scalar is a traced value: never)."""
    return isinstance(v, (int, float)) and v == 1


# -- binary arithmetic ---------------------------------------------------------------------

_BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "maximum": jnp.maximum,
    "minimum": jnp.minimum,
    "atan2": jnp.arctan2,
    "bitwise_and": jnp.bitwise_and,
    "bitwise_or": jnp.bitwise_or,
    "bitwise_xor": jnp.bitwise_xor,
    "fmod": jnp.fmod,
    "remainder": jnp.remainder,
    "floor_divide": jnp.floor_divide,
    "copysign": jnp.copysign,
    "hypot": jnp.hypot,
}
# Integer division: a zero divisor is checked in checked programs (``_runtime_checks``).
_DIVIDING = ("fmod", "remainder", "floor_divide")


def _binary(fn, with_alpha, divides):
    def tensor_tensor(node, x, y):
        dt = out_dtype(node)
        y = cast(y, dt)
        if with_alpha and not _is_one(node.attrs["alpha"]):
            y = y * scalar(node.attrs["alpha"], dt)
        if divides:
            _runtime_checks.nonzero(node, y, out_dims(node))
        return fn(cast(x, dt), y)

    def tensor_scalar(node, x):
        dt = out_dtype(node)
        y = scalar(node.attrs["other"], dt)
        if with_alpha and not _is_one(node.attrs["alpha"]):
            y = y * scalar(node.attrs["alpha"], dt)
        if divides:
            _runtime_checks.nonzero(node, y, out_dims(node))
        return fn(cast(x, dt), y)

    return tensor_tensor, tensor_scalar


for _name, _fn in _BINARY.items():
    _tt, _ts = _binary(_fn, _name in ("add", "sub"), _name in _DIVIDING)
    register(*existing(f"aten::{_name}.Tensor", f"aten::{_name}.default"))(_tt)
    register(*existing(f"aten::{_name}.Scalar"))(_ts)


# -- integer-only arithmetic: gcd, lcm and shifts (NATIVE: integers have no rounding) ----------


def _shift(left: bool):
    """torch's shifts: a count below 0 or at least the width gives 0 (left) or the sign
    (right: arithmetic for signed integers, logical for unsigned), as XLA's shifts do for a
    count read as unsigned."""
    op = jnp.left_shift if left else jnp.right_shift

    def shift(x, y, dt):
        return op(cast(x, dt), cast(y, dt))

    return shift


for _name, _fn in (
    ("gcd", lambda x, y, dt: jnp.gcd(cast(x, dt), cast(y, dt))),
    ("lcm", lambda x, y, dt: jnp.lcm(cast(x, dt), cast(y, dt))),
    ("bitwise_left_shift", _shift(True)),
    ("bitwise_right_shift", _shift(False)),
    ("__lshift__", _shift(True)),
    ("__rshift__", _shift(False)),
):

    def _tensors(node, x, y, fn=_fn):
        return fn(x, y, out_dtype(node))

    def _tensor_scalar(node, x, fn=_fn):
        dt = out_dtype(node)
        return fn(x, scalar(node.attrs["other"], dt), dt)

    def _scalar_tensor(node, y, fn=_fn):
        dt = out_dtype(node)
        return fn(scalar(node.attrs["self"], dt), y, dt)

    register(*existing(f"aten::{_name}.default", f"aten::{_name}.Tensor"), rounding=NATIVE)(
        _tensors
    )
    register(*existing(f"aten::{_name}.Tensor_Scalar", f"aten::{_name}.Scalar"), rounding=NATIVE)(
        _tensor_scalar
    )
    register(*existing(f"aten::{_name}.Scalar_Tensor"), rounding=NATIVE)(_scalar_tensor)


@register("aten::pow.Tensor_Tensor")
def _pow_tt(node, x, y):
    dt = out_dtype(node)
    return jnp.power(cast(x, dt), cast(y, dt))


@register("aten::pow.Tensor_Scalar")
def _pow_ts(node, x):
    dt = out_dtype(node)
    e = node.attrs["exponent"]
    if isinstance(e, int) and not isinstance(e, bool) and 0 <= e <= 8:
        return lax.integer_pow(cast(x, dt), e)
    return jnp.power(cast(x, dt), scalar(e, dt))


@register("aten::pow.Scalar")
def _pow_st(node, y):
    dt = out_dtype(node)
    return jnp.power(scalar(node.attrs["self"], dt), cast(y, dt))


@register("aten::rsub.Tensor")
def _rsub_tt(node, x, y):
    dt = out_dtype(node)
    return cast(y, dt) - cast(x, dt) * scalar(node.attrs["alpha"], dt)


@register("aten::rsub.Scalar")
def _rsub_ts(node, x):
    dt = out_dtype(node)
    alpha = scalar(node.attrs["alpha"], dt)
    return scalar(node.attrs["other"], dt) - cast(x, dt) * alpha


def _divide(x, y, mode, dt):
    if mode is None:
        return jnp.true_divide(x, y).astype(dt)
    q = jnp.true_divide(x, y) if jnp.issubdtype(dt, jnp.floating) else None
    if mode == "trunc":
        if q is None:
            return lax.div(x, y)  # integer division rounds toward zero
        return jnp.trunc(q)
    if mode == "floor":
        return jnp.floor_divide(x, y) if q is None else jnp.floor(q)
    raise ValueError(f"div rounding_mode must be None, 'trunc' or 'floor', got {mode!r}")


@register("aten::div.Tensor", "aten::true_divide.Tensor")
def _div_tt(node, x, y):
    dt = out_dtype(node)
    return _divide(cast(x, dt), cast(y, dt), None, dt)


@register("aten::div.Scalar")
def _div_ts(node, x):
    dt = out_dtype(node)
    return _divide(cast(x, dt), scalar(node.attrs["other"], dt), None, dt)


@register("aten::div.Tensor_mode")
def _div_mode(node, x, y):
    dt = out_dtype(node)
    _runtime_checks.nonzero(node, cast(y, dt), out_dims(node))
    return _divide(cast(x, dt), cast(y, dt), node.attrs["rounding_mode"], dt)


@register("aten::div.Scalar_mode")
def _div_scalar_mode(node, x):
    dt = out_dtype(node)
    y = scalar(node.attrs["other"], dt)
    _runtime_checks.nonzero(node, y, out_dims(node))
    return _divide(cast(x, dt), y, node.attrs["rounding_mode"], dt)


# -- unary ---------------------------------------------------------------------------------

_UNARY = {
    "neg": jnp.negative,
    "abs": jnp.abs,
    "exp": jnp.exp,
    "exp2": jnp.exp2,
    "log": jnp.log,
    "log2": jnp.log2,
    "log10": jnp.log10,
    "log1p": jnp.log1p,
    "expm1": jnp.expm1,
    "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt,
    "reciprocal": jnp.reciprocal,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "tanh": jnp.tanh,
    "sinh": jnp.sinh,
    "cosh": jnp.cosh,
    "asin": jnp.arcsin,
    "acos": jnp.arccos,
    "atan": jnp.arctan,
    "asinh": jnp.arcsinh,
    "acosh": jnp.arccosh,
    "atanh": jnp.arctanh,
    "sigmoid": jax.nn.sigmoid,
    "erf": jax.scipy.special.erf,
    "erfinv": jax.scipy.special.erfinv,
    "floor": jnp.floor,
    "ceil": jnp.ceil,
    "round": jnp.round,
    "trunc": jnp.trunc,
    "sign": jnp.sign,
    "sgn": jnp.sign,
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "bitwise_not": jnp.invert,
    "square": jnp.square,
}

for _name, _fn in _UNARY.items():

    def _unary(node, x, _fn=_fn):
        dt = out_dtype(node)  # a complex input is not cast to abs's real output before abs
        return cast(_fn(x), dt) if jnp.iscomplexobj(x) else _fn(cast(x, dt))

    register(f"aten::{_name}.default")(_unary)


@register("aten::logical_not.default")
def _logical_not(node, x):
    return jnp.logical_not(x)


for _name, _fn in (("isnan", jnp.isnan), ("isinf", jnp.isinf), ("isfinite", jnp.isfinite)):
    register(f"aten::{_name}.default")(lambda node, x, _fn=_fn: _fn(x))


@register("aten::gelu.default")
def _gelu(node, x):
    approximate = node.attrs["approximate"] == "tanh"
    return jax.nn.gelu(cast(x, out_dtype(node)), approximate=approximate)


@register("aten::leaky_relu.default")
def _leaky_relu(node, x):
    return jax.nn.leaky_relu(x, node.attrs["negative_slope"])


@register("aten::elu.default")
def _elu(node, x):
    a = node.attrs
    alpha, scale, input_scale = a["alpha"], a["scale"], a["input_scale"]
    return scale * jnp.where(x > 0, x, alpha * jnp.expm1(x * input_scale))


@register("aten::hardtanh.default")
def _hardtanh(node, x):
    return jnp.clip(x, node.attrs["min_val"], node.attrs["max_val"])


def _clamped(node, x, lo, hi, bound):
    """``x`` in the output dtype, raised to ``lo`` then lowered to ``hi`` (None: no bound);
    ``bound(b, dtype)`` makes a bound of that dtype (a Python scalar's or a tensor's)."""
    dt = out_dtype(node)
    x = cast(x, dt)
    if lo is not None:
        x = jnp.maximum(x, bound(lo, dt))
    if hi is not None:
        x = jnp.minimum(x, bound(hi, dt))
    return x


@register("aten::clamp.default")
def _clamp(node, x):
    return _clamped(node, x, node.attrs["min"], node.attrs["max"], scalar)


@register("aten::clamp.Tensor")
def _clamp_tensor(node, x, lo, hi):
    return _clamped(node, x, lo, hi, cast)


@register("aten::nan_to_num.default", rounding=NATIVE)  # its default bounds are the dtype's
def _nan_to_num(node, x):
    a = node.attrs
    nan = a["nan"]
    return jnp.nan_to_num(
        x, nan=0.0 if nan is None else nan, posinf=a["posinf"], neginf=a["neginf"]
    )


# -- lerp, addcmul, addcdiv ----------------------------------------------------------------


@register("aten::lerp.Scalar")
def _lerp(node, x, end):
    dt = out_dtype(node)
    return cast(x, dt) + scalar(node.attrs["weight"], dt) * (cast(end, dt) - cast(x, dt))


@register("aten::lerp.Tensor")
def _lerp_tensor(node, x, end, weight):
    dt = out_dtype(node)
    x = cast(x, dt)
    return x + cast(weight, dt) * (cast(end, dt) - x)


@register("aten::addcmul.default")
def _addcmul(node, x, t1, t2):
    dt = out_dtype(node)
    v = scalar(node.attrs["value"], dt)
    return cast(x, dt) + v * cast(t1, dt) * cast(t2, dt)


@register("aten::addcdiv.default")
def _addcdiv(node, x, t1, t2):
    dt = out_dtype(node)
    v = scalar(node.attrs["value"], dt)
    return cast(x, dt) + v * cast(t1, dt) / cast(t2, dt)


# -- the backward ops of activations ---------------------------------------------------------


@register("aten::threshold_backward.default")
def _threshold_backward(node, grad, x):
    return jnp.where(x <= node.attrs["threshold"], jnp.zeros((), grad.dtype), grad)


@register("aten::sigmoid_backward.default")
def _sigmoid_backward(node, grad, y):
    return grad * y * (1 - y)


@register("aten::tanh_backward.default")
def _tanh_backward(node, grad, y):
    return grad * (1 - y * y)


@register("aten::gelu_backward.default")
def _gelu_backward(node, grad, x):
    approximate = node.attrs["approximate"] == "tanh"
    _, vjp = jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate), x)
    return vjp(grad)[0]


@register("aten::silu_backward.default")
def _silu_backward(node, grad, x):
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@register("aten::leaky_relu_backward.default")
def _leaky_relu_backward(node, grad, x):
    slope = node.attrs["negative_slope"]
    return jnp.where(x > 0, grad, grad * slope)


@register("aten::rrelu_with_noise_backward.default")
def _rrelu_with_noise_backward(node, grad, x, noise):
    """The slopes drawn in training (``noise``); the mean slope otherwise, as torch does (also
    in training when the range is empty). ``lower``/``upper`` may be traced values."""
    a = node.attrs
    fixed = jnp.where(x > 0, grad, grad * ((a["lower"] + a["upper"]) / 2))
    if not a["training"]:
        return fixed.astype(out_dtype(node))
    return jnp.where(a["upper"] - a["lower"] > 1e-6, grad * noise, fixed).astype(out_dtype(node))


@register("aten::hardtanh_backward.default")
def _hardtanh_backward(node, grad, x):
    lo, hi = node.attrs["min_val"], node.attrs["max_val"]
    return jnp.where((x <= lo) | (x >= hi), jnp.zeros((), grad.dtype), grad)
