"""Elementwise comparisons and logic, selection (where, masked_fill), casts and fills.

Comparisons run in the operands' common dtype and return bool; the others give the output
dtype the front end inferred.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ir_runtime._lowering._registry import NATIVE, cast, existing, family, out_dtype, scalar

# Half precision: NATIVE (``_registry``): this family compares, casts and selects in the
# recorded dtypes (a Python scalar compared with a bfloat16 tensor is rounded to bfloat16, as
# eager does).
register = family(NATIVE)


# -- comparisons and logic -----------------------------------------------------------------

_COMPARE = {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
    "logical_and": jnp.logical_and,
    "logical_or": jnp.logical_or,
    "logical_xor": jnp.logical_xor,
}


def _common(x, y):
    dt = jnp.promote_types(x.dtype, y.dtype)
    return cast(x, dt), cast(y, dt)


def _scalar_like(x, value):
    """A Python scalar compared with a tensor, as torch does: in the tensor's dtype unless the
    scalar is a float and the tensor is not, then in float32 (torch's default dtype)."""
    if isinstance(value, float) and not jnp.issubdtype(x.dtype, jnp.inexact):
        return cast(x, np.float32), scalar(value, np.float32)
    return x, scalar(value, x.dtype)


for _name, _fn in _COMPARE.items():

    def _cmp_tt(node, x, y, _fn=_fn):
        return _fn(*_common(x, y))

    def _cmp_ts(node, x, _fn=_fn):
        return _fn(*_scalar_like(x, node.attrs["other"]))

    register(*existing(f"aten::{_name}.Tensor", f"aten::{_name}.default"))(_cmp_tt)
    register(*existing(f"aten::{_name}.Scalar"))(_cmp_ts)


@register("aten::isclose.default")
def _isclose(node, x, y):
    """torch's isclose: equal, or finite and within ``atol + rtol * |other|``."""
    a = node.attrs
    x, y = _common(x, y)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x, y = x.astype(np.float64), y.astype(np.float64)
    close = (x == y) | (
        jnp.isfinite(x) & jnp.isfinite(y) & (jnp.abs(x - y) <= a["atol"] + a["rtol"] * jnp.abs(y))
    )
    if a["equal_nan"]:
        close = close | (jnp.isnan(x) & jnp.isnan(y))
    return close


# -- selection, casts, fills ---------------------------------------------------------------


@register("aten::where.self")
def _where(node, cond, x, y):
    dt = out_dtype(node)
    return jnp.where(cond, cast(x, dt), cast(y, dt))


@register("aten::where.ScalarOther")
def _where_scalar_other(node, cond, x):
    dt = out_dtype(node)
    return jnp.where(cond, cast(x, dt), scalar(node.attrs["other"], dt))


@register("aten::where.ScalarSelf")
def _where_scalar_self(node, cond, y):
    dt = out_dtype(node)
    return jnp.where(cond, scalar(node.attrs["self"], dt), cast(y, dt))


# (clone, alias, detach and contiguous never reach a rule: the front end gives the same value.)
@register("aten::_to_copy.default", "aten::lift_fresh_copy.default")
def _copy(node, x):
    dt = out_dtype(node)
    if jnp.iscomplexobj(x) and not jnp.issubdtype(dt, jnp.complexfloating):
        x = jnp.real(x)  # torch drops the imaginary part
    return cast(x, dt)


@register("aten::masked_fill.Scalar")
def _masked_fill(node, x, mask):
    dt = out_dtype(node)
    return jnp.where(mask, scalar(node.attrs["value"], dt), cast(x, dt))


@register("aten::masked_fill.Tensor")
def _masked_fill_tensor(node, x, mask, value):
    dt = out_dtype(node)
    return jnp.where(mask, cast(value, dt), cast(x, dt))


@register("aten::fill.Scalar")
def _fill(node, x):
    dt = out_dtype(node)
    return jnp.full(x.shape, node.attrs["value"], dtype=dt)


@register("aten::fill.Tensor")
def _fill_tensor(node, x, value):
    return jnp.broadcast_to(cast(value, out_dtype(node)), x.shape)
