"""Orthogonal polynomials: Chebyshev of the four kinds (and shifted), Hermite (H and He), Laguerre
and Legendre, each with its three overloads (x or n a Python scalar).

torch's kernels (Math.h) take n as a tensor broadcasting with x, both in the promoted dtype T,
and truncate n to int64 (NaN, inf and out-of-range n give a negative n there: 0). Special
values and closed forms come first, as in torch's chain of tests; what is left runs torch's
three-term recurrence, one step per iteration for every element still short of its own n.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import ieee_div, register
from ir_runtime._lowering.special._common import float_rule


def _degree(n):
    """n (in T) truncated to int64 as torch's static_cast does on x86 (NaN, inf and values out
    of range become INT64_MIN: negative)."""
    ok = jnp.isfinite(n) & (jnp.abs(n) < 2.0**63)
    return jnp.where(ok, jnp.trunc(jnp.where(ok, n, 0)), -1).astype(jnp.int64)


def _recur(x, n, p, q, start, stop_offset, step, needs):
    """Run ``r = step(k, p, q); p, q = q, r`` for k = start, start+1, ... while
    ``k <= n + stop_offset`` and q is not NaN (elements of ``needs`` only); returns q."""

    def cond(st):
        k, _, q = st
        return jnp.any(needs & (k <= n + stop_offset) & ~jnp.isnan(q))

    def body(st):
        k, p, q = st
        run = needs & (k <= n + stop_offset) & ~jnp.isnan(q)
        r = step(k.astype(x.dtype), p, q)
        return k + 1, jnp.where(run, q, p), jnp.where(run, r, q)

    return lax.while_loop(cond, body, (jnp.asarray(start, jnp.int64), p, q))[2]


def _select(default, *cases):
    """The first case whose condition holds, else ``default`` (torch's if/return chain)."""
    out = default
    for cond, value in reversed(cases):
        out = jnp.where(cond, value, out)
    return out


def _chebyshev(kind: str, shifted: bool):
    """T, U, V, W (first to fourth kind) of x, or shifted: of y = 2x - 1 (torch tests x == 1
    and x == 0 there, which are y == 1 and y == -1)."""
    # The degree above which torch takes the trigonometric form for |y| < 1.
    trig_above = (4 if kind == "w" else 6) if shifted else (6 if kind == "t" else 8)

    def fn(x, n_t):
        dt = x.dtype
        n = _degree(n_t)
        nf = n.astype(dt)
        one = jnp.ones((), dt)
        y = x + x - 1.0 if shifted else x
        two_y = y + y
        even = n % 2 == 0
        sign = jnp.where(even, one, -one)
        # The values at y == 1 and y == -1, the degree-1 polynomial, the trigonometric form.
        inside = jnp.abs(y) < 1.0
        theta = jnp.arccos(jnp.where(inside, y, jnp.zeros((), dt)))
        if kind == "t":
            at_plus, at_minus, q1 = one, sign, y
            trig = jnp.cos(nf * theta)
        elif kind == "u":
            at_plus, at_minus, q1 = nf + 1, sign * (nf + 1), two_y
            s = jnp.sin(theta)
            ok = s != 0.0
            trig = jnp.where(
                ok,
                jnp.sin((nf + 1) * theta) / jnp.where(ok, s, one),
                (nf + 1) * jnp.cos((nf + 1) * theta) / y,
            )
        elif kind == "v":
            at_plus, at_minus, q1 = one, sign * (nf + nf + 1), two_y - 1.0
            ok = jnp.sin(theta / 2.0) != 1.0
            trig = jnp.where(ok, jnp.cos((nf + 0.5) * theta) / jnp.cos(theta / 2.0), at_minus)
        else:
            at_plus, at_minus, q1 = nf + nf + 1, sign, two_y + 1.0
            ok = jnp.cos(theta / 2.0) != 1.0
            fallback = sign if shifted else jnp.where(x > 0, at_plus, at_minus)
            half = jnp.sin(theta / 2.0)
            trig = jnp.where(ok, jnp.sin((nf + 0.5) * theta) / jnp.where(ok, half, one), fallback)
        if shifted:
            plus, minus = x == 1.0, x == 0.0
        else:
            plus, minus = x == 1.0, x == -1.0
        trig_case = inside & (n > trig_above)
        needs = (n >= 2) & ~plus & ~minus & ~trig_case
        rec = _recur(x, n, jnp.ones_like(x), q1, 2, 0, lambda k, p, q: two_y * q - p, needs)
        return _select(
            rec,
            (n < 0, jnp.zeros((), dt)),
            (plus, at_plus),
            (minus, at_minus),
            (trig_case, trig),
            (n == 0, one),
            (n == 1, q1),
        )

    return fn


def _from_degree_one(x, n, q1, step, needs, *cases):
    """Hermite's, Laguerre's and Legendre's shape: P_0 = 1, P_1 = ``q1``, then
    ``P_{k+1} = step(k, P_{k-1}, P_k)`` up to n where ``needs``; after torch's tests: 0 for a
    negative n, then ``cases`` (condition, value) in order."""
    rec = _recur(x, n, jnp.ones_like(x), q1, 1, -1, step, needs)
    return _select(rec, (n < 0, jnp.zeros((), x.dtype)), *cases)


def _hermite(physicists: bool):
    """H (``physicists``: H_{k+1} = 2x H_k - 2k H_{k-1}) or He (He_{k+1} = x He_k - k He_{k-1});
    NaN above degree 128 (float32) or 512, as torch."""

    def fn(x, n_t):
        dt = x.dtype
        n = _degree(n_t)
        limit = 128 if dt == np.float32 else 512
        q1 = x + x if physicists else x

        def step(k, p, q):
            return q1 * q - ((k + k) if physicists else k) * p

        return _from_degree_one(
            x,
            n,
            q1,
            step,
            n >= 2,
            (n == 0, jnp.ones((), dt)),
            (n == 1, q1),
            (n > limit, jnp.asarray(np.nan, dt)),
        )

    return fn


def _laguerre_l(x, n_t):
    n = _degree(n_t)
    one = jnp.ones((), x.dtype)
    return _from_degree_one(
        x,
        n,
        1.0 - x,
        lambda k, p, q: ieee_div(((k + k) + (1.0 - x)) * q - k * p, k + 1),
        (n >= 2) & (jnp.abs(x) != 0),
        (jnp.abs(x) == 0, one),
        (n == 0, one),
        (n == 1, 1.0 - x),
    )


def _legendre_p(x, n_t):
    n = _degree(n_t)
    one = jnp.ones((), x.dtype)
    at_one = jnp.where((x > 0) | (n % 2 == 0), one, -one)
    return _from_degree_one(
        x,
        n,
        x,
        lambda k, p, q: ieee_div((k + k + 1) * x * q - k * p, k + 1),
        (n >= 2) & (jnp.abs(x) != 1.0),
        (jnp.abs(x) == 1.0, at_one),
        (n == 0, one),
        (n == 1, x),
    )


def _polynomial_rules(name, fn):
    """The three overloads: (Tensor x, Tensor n), (Scalar x, Tensor n), (Tensor x, Scalar n)."""

    def tensor_tensor(node, x, n):
        return float_rule(fn, arity=2)(node, x, n)

    def scalar_x(node, n):
        return float_rule(fn, arity=2)(node, jnp.asarray(node.attrs["x"]), n)

    def scalar_n(node, x):
        return float_rule(fn, arity=2)(node, x, jnp.asarray(node.attrs["n"]))

    register(f"aten::{name}.default")(tensor_tensor)
    register(f"aten::{name}.x_scalar")(scalar_x)
    register(f"aten::{name}.n_scalar")(scalar_n)


_POLYNOMIALS = {
    "special_chebyshev_polynomial_t": _chebyshev("t", False),
    "special_chebyshev_polynomial_u": _chebyshev("u", False),
    "special_chebyshev_polynomial_v": _chebyshev("v", False),
    "special_chebyshev_polynomial_w": _chebyshev("w", False),
    "special_shifted_chebyshev_polynomial_t": _chebyshev("t", True),
    "special_shifted_chebyshev_polynomial_u": _chebyshev("u", True),
    "special_shifted_chebyshev_polynomial_v": _chebyshev("v", True),
    "special_shifted_chebyshev_polynomial_w": _chebyshev("w", True),
    "special_hermite_polynomial_h": _hermite(True),
    "special_hermite_polynomial_he": _hermite(False),
    "special_laguerre_polynomial_l": _laguerre_l,
    "special_legendre_polynomial_p": _legendre_p,
}
for _name, _fn in _POLYNOMIALS.items():
    _polynomial_rules(_name, _fn)
