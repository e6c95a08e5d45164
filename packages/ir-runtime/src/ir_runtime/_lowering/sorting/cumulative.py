"""Cumulative ops: cummax and cummin (the latest index of the running extreme), cumprod and
logcumsumexp (accumulated as torch CPU does: at::acc_type).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering._registry import NATIVE, family, norm_dim, out_dtype
from ir_runtime._lowering.sorting._common import _key, check_real, take

# Half precision: NATIVE (``_registry``): this family accumulates in torch's accumulator type
# itself (``_acc``); cummax and cummin select.
register = family(NATIVE)


# --------------------------------------------------------------------------------------------
# cummax, cummin


def _cum_extreme(largest: bool):
    def rule(node, x):
        check_real("cummax" if largest else "cummin", x)
        idt = out_dtype(node, 1)
        if x.ndim == 0:
            return x, jnp.zeros((), idt)
        axis = norm_dim(node.attrs["dim"], x.ndim)
        if x.size == 0:
            return x, jnp.zeros(x.shape, idt)
        # torch: out = x where x >= out (<= for cummin) or x is NaN: the latest index of the
        # running extreme, NaN above (below) everything.
        k = _key(x, nan_low=not largest)
        run = lax.cummax(k, axis=axis) if largest else lax.cummin(k, axis=axis)
        iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
        idx = lax.cummax(jnp.where(k == run, iota, -1), axis=axis)
        return take(x, idx, axis), idx.astype(idt)

    return rule


register("aten::cummax.default")(_cum_extreme(True))
register("aten::cummin.default")(_cum_extreme(False))


# --------------------------------------------------------------------------------------------
# cumprod, logcumsumexp


def _acc(dt):
    """torch CPU's accumulation type for cumulative ops (at::acc_type<T, false>): double for
    float, float for half and bfloat16."""
    if dt == jnp.float32:
        return jnp.float64
    if dt in (jnp.float16, jnp.bfloat16):
        return jnp.float32
    if dt == jnp.complex64:
        return jnp.complex128
    return dt


@register("aten::cumprod.default")
def _cumprod(node, x):
    dt = out_dtype(node)
    x = x.astype(dt)
    if x.ndim == 0:
        return x
    return jnp.cumprod(x.astype(_acc(dt)), axis=norm_dim(node.attrs["dim"], x.ndim)).astype(dt)


@register("aten::logcumsumexp.default")
def _logcumsumexp(node, x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise ValueError("logcumsumexp: complex input is not supported on the lazy device")
    dt = out_dtype(node)
    x = x.astype(dt)
    if x.ndim == 0 or x.size == 0:
        return x
    axis = norm_dim(node.attrs["dim"], x.ndim)
    return lax.cumlogsumexp(x.astype(_acc(dt)), axis=axis).astype(dt)
