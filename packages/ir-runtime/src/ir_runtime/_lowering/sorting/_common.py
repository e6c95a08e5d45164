"""What the family's rules share: keys (integers in torch's order: NaN above everything, every NaN
equal, -0.0 == 0.0), rows (a dim moved last, as (rows, n)) and the stable sort. IEEE division
(``ieee_div``) is every family's, in ``_registry``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

I32 = jnp.int32


def is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def check_real(op: str, x) -> None:
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise ValueError(f"{op}: complex input ({x.dtype}) is not supported (torch refuses it too)")


def _key(x, nan_low: bool = False):
    """An integer array ordered as torch orders ``x``: NaN the largest (the smallest with
    ``nan_low``), all NaNs equal, -0.0 equal to 0.0. Integers are their own key."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.int8)
    if not is_float(x):
        return x
    it = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[x.dtype.itemsize]
    big = jnp.iinfo(it).max
    b = lax.bitcast_convert_type(x, it)
    k = jnp.where(b < 0, b ^ jnp.asarray(big, it), b)
    k = jnp.where(x == 0, jnp.zeros_like(k), k)
    return jnp.where(jnp.isnan(x), jnp.asarray(jnp.iinfo(it).min if nan_low else big, it), k)


def negative_zero(x):
    """Whether ``x`` holds a -0.0 anywhere (a tie whose order shows in the values)."""
    if not is_float(x):
        return jnp.asarray(False)
    return jnp.any((x == 0) & jnp.signbit(x))


def to_rows(x, axis: int):
    """``x`` with ``axis`` last, as (rows, n), and the shape to go back."""
    moved = jnp.moveaxis(x, axis, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape


def from_rows(r, shape, axis: int):
    return jnp.moveaxis(r.reshape(shape[:-1] + r.shape[-1:]), -1, axis)


def _stable(s, *rest, axis=-1):
    """Stable ascending sort of ``s`` along ``axis``, carrying ``rest`` along."""
    iota = lax.broadcasted_iota(I32, s.shape, axis if axis >= 0 else s.ndim + axis)
    out = lax.sort(
        (s, iota, *rest), dimension=axis if axis >= 0 else s.ndim + axis, num_keys=1, is_stable=True
    )
    return out


def lg(n: int) -> int:
    return n.bit_length() - 1


def take(x, idx, axis):
    return jnp.take_along_axis(x, idx, axis=axis)
