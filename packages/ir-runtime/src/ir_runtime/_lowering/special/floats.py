"""Float decomposition and comparison: frexp, nextafter and signbit from the bits (XLA's
arithmetic flushes subnormals), fmax and fmin, and round with decimals.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import (
    NATIVE,
    cast,
    ieee_div,
    out_dims,
    out_dtype,
    register,
)
from ir_runtime._lowering.special._common import work

_BITS = {
    np.dtype(np.float16): (np.int16, 10, 15),
    np.dtype(jnp.bfloat16): (np.int16, 7, 127),
    np.dtype(np.float32): (np.int32, 23, 127),
    np.dtype(np.float64): (np.int64, 52, 1023),
}


@register("aten::frexp.Tensor", rounding=NATIVE)  # reads the recorded dtype's bits
def _frexp(node, x):
    """mantissa in [0.5, 1) and exponent with x = mantissa * 2**exponent, from the bits (XLA
    flushes subnormals in arithmetic; frexp must see them). 0, inf and NaN keep their value
    with exponent 0, as std::frexp gives."""
    dt = out_dtype(node, 0)
    x = cast(x, dt)
    ity, mbits, bias = _BITS[dt]
    nbits = np.dtype(ity).itemsize * 8
    ebits = nbits - 1 - mbits
    bits = lax.bitcast_convert_type(x, ity)
    umag = bits & np.array((1 << (nbits - 1)) - 1, dtype=ity)
    sign = bits ^ umag  # the sign bit alone
    field = umag >> mbits
    frac = umag & np.array((1 << mbits) - 1, dtype=ity)
    # Subnormals: shift the fraction up until its leading bit is the implicit one.
    lead = lax.clz(frac) - (nbits - mbits)  # zeros above the fraction's top bit
    shift = jnp.where(field == 0, lead + 1, 0).astype(ity)
    frac_n = jnp.where(field == 0, (frac << shift) & np.array((1 << mbits) - 1, ity), frac)
    exp = jnp.where(field == 0, 1 - shift, field).astype(np.int32) - (bias - 1)
    # mantissa: the fraction with the exponent field of 2**-1 (bias - 1).
    mant_bits = sign | (np.array(bias - 1, ity) << mbits) | frac_n
    mantissa = lax.bitcast_convert_type(mant_bits, dt)
    special = (umag == 0) | (field == (1 << ebits) - 1)  # 0, inf, NaN
    mantissa = jnp.where(special, x, mantissa)
    exponent = jnp.where(special, 0, exp).astype(out_dtype(node, 1))
    return mantissa, exponent


@register("aten::nextafter.default", rounding=NATIVE)  # the recorded dtype's next value
def _nextafter(node, x, y):
    """The next representable value after x toward y, from the bits (subnormals included,
    which XLA's arithmetic would flush)."""
    dt = out_dtype(node)
    x, y = cast(x, dt), cast(y, dt)
    dims = out_dims(node)
    x, y = jnp.broadcast_to(x, dims), jnp.broadcast_to(y, dims)
    ity = _BITS[dt][0]
    nbits = np.dtype(ity).itemsize * 8
    mag = np.array((1 << (nbits - 1)) - 1, dtype=ity)
    inf_bits = lax.bitcast_convert_type(jnp.asarray(np.inf, dt), ity)
    bx, by = lax.bitcast_convert_type(x, ity), lax.bitcast_convert_type(y, ity)
    mx, my = bx & mag, by & mag
    # An order-preserving integer for each float (+0 and -0 both 0).
    ox = jnp.where(bx < 0, -mx, mx)
    oy = jnp.where(by < 0, -my, my)
    nan = (mx > inf_bits) | (my > inf_bits)
    equal = ox == oy
    toward_bigger = (ox < oy) == (ox > 0)  # away from zero
    stepped = jnp.where(toward_bigger, bx + 1, bx - 1)
    tiny = (by & ~mag) | np.array(1, ity)  # the smallest subnormal with y's sign
    out = jnp.where(mx == 0, tiny, stepped)
    out = jnp.where(equal, by, out)
    out = lax.bitcast_convert_type(out, dt)
    return jnp.where(nan, jnp.asarray(np.nan, dt), out)


@register("aten::signbit.default")
def _signbit(node, x):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.signbit(x)
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger) or x.dtype == np.bool_:
        return jnp.zeros(x.shape, bool)
    return x < 0


def _fmax_fmin(pick_first):
    def rule(node, x, y):
        dt = out_dtype(node)
        dims = out_dims(node)
        x, y = jnp.broadcast_to(cast(x, dt), dims), jnp.broadcast_to(cast(y, dt), dims)
        if not jnp.issubdtype(dt, jnp.inexact):
            return jnp.where(pick_first(x, y), x, y)
        # NaN loses to a number; two NaNs give NaN; a tie gives x (as torch's kernel does).
        return jnp.where(jnp.isnan(y) | pick_first(x, y), x, y)

    return rule


register("aten::fmax.default")(_fmax_fmin(lambda x, y: x >= y))
register("aten::fmin.default")(_fmax_fmin(lambda x, y: x <= y))


@register("aten::round.decimals")
def _round_decimals(node, x):
    """torch's round_decimals_kernel: nearbyint(x * 10**d) / 10**d (for d < 0, x / 10**-d,
    then times it), 10**d in the opmath dtype (float for half types), half to even."""
    dt = out_dtype(node)
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"round(decimals=...) takes a floating tensor, got {dt}")
    w = work(dt)
    d = node.attrs["decimals"]
    x = cast(x, w)
    ten = jnp.asarray(10.0 ** abs(d), w)
    out = jnp.round(ieee_div(x, ten)) * ten if d < 0 else ieee_div(jnp.round(x * ten), ten)
    return cast(out, dt)
