"""Bessel and Airy functions (torch's Cephes ports): Airy Ai, J0, J1, Y0, Y1, the modified I0,
I1, K0 and K1 (K scaled or not), and the spherical j0.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ir_runtime._lowering._registry import ieee_div
from ir_runtime._lowering.special._common import PI, _chbevl, _polevl, _while
from ir_runtime._lowering.special._tables import (
    AIRY_AI_AD,
    AIRY_AI_AFD,
    AIRY_AI_AFN,
    AIRY_AI_AGD,
    AIRY_AI_AGN,
    AIRY_AI_AN,
    J0_PP,
    J0_PQ,
    J0_QP,
    J0_QQ,
    J0_RP,
    J0_RQ,
    J1_PP,
    J1_PQ,
    J1_QP,
    J1_QQ,
    J1_RP,
    J1_RQ,
    MI0_A,
    MI0_B,
    MI1_A,
    MI1_B,
    MK0_A,
    MK0_B,
    MK1_A,
    MK1_B,
    Y0_YP,
    Y0_YQ,
    Y1_YP,
    Y1_YQ,
)


def airy_ai(x):
    dt = x.dtype
    eps = float(np.finfo(dt).eps)
    # x < -2.09: the asymptotic form, oscillating.
    neg = x < -2.09
    xn = jnp.where(neg, x, jnp.asarray(-3.0, dt))
    zeta_n = ieee_div(-2.0 * xn * jnp.sqrt(-xn), 3.0)
    z = 1.0 / zeta_n
    zz = z * z
    afn, afd = _polevl(zz, AIRY_AI_AFN), _polevl(zz, AIRY_AI_AFD)
    agn, agd = _polevl(zz, AIRY_AI_AGN), _polevl(zz, AIRY_AI_AGD)
    t = zeta_n + 0.25 * PI
    left = (
        5.64189583547756286948e-01
        / jnp.sqrt(jnp.sqrt(-xn))
        * (jnp.sin(t) * (1.0 + zz * afn / afd) - jnp.cos(t) * (z * agn / agd))
    )
    # x >= 2.09: the exponentially small form.
    pos = x >= 2.09
    xp = jnp.where(pos, x, jnp.asarray(3.0, dt))
    zeta_p = ieee_div(2.0 * xp * jnp.sqrt(xp), 3.0)
    an, ad = _polevl(1.0 / zeta_p, AIRY_AI_AN), _polevl(1.0 / zeta_p, AIRY_AI_AD)
    scale = 2.0 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta_p)
    right = 5.64189583547756286948e-01 * (an / ad) / scale
    # Between: the power series, term by term until |m / f| <= eps.
    mid = ~neg & ~pos
    xs = jnp.where(mid, x, jnp.zeros((), dt))
    cube = xs * xs * xs

    def body(st):
        f, g, k, m, n, active = st
        m1 = m * cube
        k1 = k + 1.0
        m1 = m1 / k1
        n1 = n * cube
        k1 = k1 + 1.0
        n1 = n1 / k1
        m1 = m1 / k1
        f1 = f + m1
        k1 = k1 + 1.0
        n1 = n1 / k1
        g1 = g + n1
        new = (f1, g1, k1, m1, n1)
        old = (f, g, k, m, n)
        f, g, k, m, n = (jnp.where(active, a, b) for a, b in zip(new, old, strict=True))
        return f, g, k, m, n, active & (jnp.abs(m1 / f1) > eps)

    one = jnp.ones_like(xs)
    f, g, *_ = _while(lambda st: jnp.any(st[5]), body, (one, xs, one, one, xs, mid))
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = jnp.where(neg, left, jnp.where(pos, right, series))
    out = jnp.where(x > 103.892, jnp.zeros((), dt), out)
    return jnp.where(jnp.isinf(x), jnp.asarray(np.nan, dt), out)


_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163
_2_OVER_PI = 0.636619772367581343075535053490057448


def _j0_large(x):
    w = 25.0 / (x * x)
    pp, pq = _polevl(w, J0_PP), _polevl(w, J0_PQ)
    qp, qq = _polevl(w, J0_QP), _polevl(w, J0_QQ)
    return pp / pq, 5.0 / x * (qp / qq)


def _j1_large(x):
    w = 5.0 / x * (5.0 / x)
    pp, pq = _polevl(w, J1_PP), _polevl(w, J1_PQ)
    qp, qq = _polevl(w, J1_QP), _polevl(w, J1_QQ)
    return pp / pq, 5.0 / x * (qp / qq)


def bessel_j0(x):
    dt = x.dtype
    x = jnp.abs(x)
    small = x <= 5.0
    xs = jnp.where(small, x, jnp.ones((), dt))
    x2 = xs * xs
    rp, rq = _polevl(x2, J0_RP), _polevl(x2, J0_RQ)
    near = (x2 - 5.78318596294678452118e00) * (x2 - 3.04712623436620863991e01) * rp / rq
    near = jnp.where(xs < 0.00001, 1.0 - x2 / 4.0, near)
    xl = jnp.where(small, jnp.asarray(6.0, dt), x)
    p, q = _j0_large(xl)
    far = (p * jnp.cos(xl - _PI_4) - q * jnp.sin(xl - _PI_4)) * _SQRT_2_OVER_PI / jnp.sqrt(xl)
    return jnp.where(small, near, far)


def bessel_j1(x):
    dt = x.dtype
    sign = jnp.where(x < 0, -1.0, 1.0).astype(dt)
    x = jnp.abs(x)
    small = x <= 5.0
    xs = jnp.where(small, x, jnp.ones((), dt))
    x2 = xs * xs
    rp, rq = _polevl(x2, J1_RP), _polevl(x2, J1_RQ)
    near = rp / rq * xs * (x2 - 1.46819706421238932572e01) * (x2 - 4.92184563216946036703e01)
    xl = jnp.where(small, jnp.asarray(6.0, dt), x)
    p, q = _j1_large(xl)
    far = (p * jnp.cos(xl - _3PI_4) - q * jnp.sin(xl - _3PI_4)) * _SQRT_2_OVER_PI / jnp.sqrt(xl)
    return sign * jnp.where(small, near, far)


def bessel_y0(x):
    dt = x.dtype
    small = x <= 5.0
    xs = jnp.where(small & (x > 0), x, jnp.ones((), dt))
    x2 = xs * xs
    near = _polevl(x2, Y0_YP) / _polevl(x2, Y0_YQ) + _2_OVER_PI * jnp.log(xs) * bessel_j0(xs)
    near = jnp.where(x < 0, jnp.asarray(np.nan, dt), near)
    near = jnp.where(x == 0, jnp.asarray(-np.inf, dt), near)
    xl = jnp.where(small, jnp.asarray(6.0, dt), x)
    p, q = _j0_large(xl)
    far = (p * jnp.sin(xl - _PI_4) + q * jnp.cos(xl - _PI_4)) * _SQRT_2_OVER_PI / jnp.sqrt(xl)
    return jnp.where(small, near, far)


def bessel_y1(x):
    dt = x.dtype
    small = x <= 5.0
    xs = jnp.where(small & (x > 0), x, jnp.ones((), dt))
    x2 = xs * xs
    ratio = _polevl(x2, Y1_YP) / _polevl(x2, Y1_YQ)
    near = xs * ratio + _2_OVER_PI * (bessel_j1(xs) * jnp.log(xs) - 1.0 / xs)
    near = jnp.where(x <= 0, jnp.asarray(np.nan, dt), near)
    near = jnp.where(x == 0, jnp.asarray(-np.inf, dt), near)
    xl = jnp.where(small, jnp.asarray(6.0, dt), x)
    p, q = _j1_large(xl)
    far = (p * jnp.sin(xl - _3PI_4) + q * jnp.cos(xl - _3PI_4)) * _SQRT_2_OVER_PI / jnp.sqrt(xl)
    return jnp.where(small, near, far)


def _modified_i(x, a, b, order: int):
    """Math.h's modified_bessel_i0/i1_forward: Chebyshev series on [0, 8] and (8, inf)."""
    dt = x.dtype
    ax = jnp.abs(x)
    small = ax <= 8.0
    xs = jnp.where(small, ax, jnp.ones((), dt))
    near = _chbevl(xs / 2.0 - 2.0, a)
    xl = jnp.where(small, jnp.asarray(9.0, dt), ax)
    far = jnp.exp(xl) * _chbevl(32.0 / xl - 2.0, b) / jnp.sqrt(xl)
    if order == 0:
        return jnp.where(small, jnp.exp(xs) * near, far)
    out = jnp.where(small, near * xs * jnp.exp(xs), far)
    return jnp.where(x < 0, -out, out)


def _modified_bessel_i0(x):
    return _modified_i(x, MI0_A, MI0_B, 0)


def modified_bessel_i1(x):
    return _modified_i(x, MI1_A, MI1_B, 1)


def modified_k(x, order: int, scaled: bool):
    """Math.h's (scaled_)modified_bessel_k0/k1_forward."""
    dt = x.dtype
    a, b = (MK0_A, MK0_B) if order == 0 else (MK1_A, MK1_B)
    small = x <= 2.0
    xs = jnp.where(small & (x > 0), x, jnp.ones((), dt))
    series = _chbevl(xs * xs - 2.0, a)
    if order == 0:
        near = series - jnp.log(0.5 * xs) * _modified_bessel_i0(xs)
    else:
        near = jnp.log(0.5 * xs) * modified_bessel_i1(xs) + series / xs
    if scaled:
        near = near * jnp.exp(xs)
    xl = jnp.where(small, jnp.asarray(3.0, dt), x)
    far = _chbevl(8.0 / xl - 2.0, b) / jnp.sqrt(xl)
    if not scaled:
        far = jnp.exp(-xl) * far
    out = jnp.where(small, near, far)
    out = jnp.where(x < 0, jnp.asarray(np.nan, dt), out)
    return jnp.where(x == 0, jnp.asarray(np.inf, dt), out)


def spherical_bessel_j0(x):
    dt = x.dtype
    x2 = x * x
    series = 1.0 + x2 * (
        -1.0 / 6.0
        + x2
        * (
            1.0 / 120.0
            + x2
            * (
                -1.0 / 5040.0
                + x2 * (1.0 / 362880.0 + x2 * (-1.0 / 39916800.0 + x2 * (1.0 / 6227020800.0)))
            )
        )
    )
    safe = jnp.where(x == 0, jnp.ones((), dt), x)
    out = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), jnp.zeros((), dt), out)
