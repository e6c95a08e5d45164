"""What every special function shares: the dtype it computes in (float16 and bfloat16 in
float32), a rule computing in it, Cephes' polevl and chbevl, and a while loop with an iteration
cap. The IEEE quotient (``ieee_div``) and ``cast`` are every family's, in ``_registry``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import cast, out_dims, out_dtype

PI = math.pi
_HALF_TYPES = (np.dtype(np.float16), np.dtype(jnp.bfloat16))


def work(dt):
    """The dtype a special function is computed in for output dtype ``dt``."""
    if dt in _HALF_TYPES:
        return np.dtype(np.float32)
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"special functions compute in a floating dtype, not {dt}")
    return dt


def float_rule(fn, arity=1):
    """A rule computing ``fn`` on its tensors in the working dtype of the output."""

    def rule(node, *xs):
        dt = out_dtype(node)
        w = work(dt)
        dims = out_dims(node)
        args = [jnp.broadcast_to(cast(x, w), dims) for x in xs[:arity]]
        return cast(fn(*args), dt)

    return rule


def _polevl(x, coeffs):
    """Cephes' polevl (Horner from the highest coefficient), starting from 0 as torch does."""
    r = jnp.zeros_like(x)
    for c in coeffs:
        r = r * x + c
    return r


def _chbevl(y, coeffs):
    """Cephes' chbevl: a Chebyshev series at ``y``, as Math.h's modified Bessel functions
    unroll it (``0.5 * (a - p)``)."""
    p = jnp.zeros_like(y)
    q = jnp.zeros_like(y)
    a = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p = q
        q = a
        a = y * q - p + c
    return 0.5 * (a - p)


def _while(cond, body, state, max_iter=None):
    """``lax.while_loop`` carrying an iteration count (for a hard cap)."""

    def c(s):
        i, st = s
        go = cond(st)
        return go if max_iter is None else go & (i < max_iter)

    def b(s):
        i, st = s
        return i + 1, body(st)

    return lax.while_loop(c, b, (jnp.asarray(0, jnp.int32), state))[1]
