"""The gamma family: lgamma, digamma, trigamma, polygamma and mvlgamma, and the Hurwitz zeta
function polygamma is computed from (torch's calc_digamma, trigamma and calc_polygamma; Cephes'
zeta, summed in float64 as torch's CPU kernel does).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jss
import numpy as np

from ir_runtime._lowering._registry import cast, ieee_div, out_dtype, register
from ir_runtime._lowering.special._common import PI, _polevl, _while, work


def _lgamma(x):
    """log|gamma(x)|; float32 through float64 (jax's float32 gammaln is off by ~5e-7 near its
    zeros at 1 and 2, where torch's lgammaf gives 0)."""
    if x.dtype == np.float64:
        return jss.gammaln(x)
    return jss.gammaln(x.astype(np.float64)).astype(x.dtype)


_PSI_10 = 2.25175258906672110764
_DIGAMMA_A = (
    8.33333333333333333333e-2,
    -2.10927960927960927961e-2,
    7.57575757575757575758e-3,
    -4.16666666666666666667e-3,
    3.96825396825396825397e-3,
    -8.33333333333333333333e-3,
    8.33333333333333333333e-2,
)


def _digamma(x):
    """torch's calc_digamma: reflection below 0, the recurrence up to 10, then the
    asymptotic series; +-inf at +-0, NaN at negative integers."""
    dt = x.dtype
    neg = x < 0
    # pi / tan(pi * r), r the fractional part (modf): more accurate than tan(pi * x); in
    # float64, as torch computes it for float32 too.
    r = (x - jnp.trunc(x)).astype(np.float64)
    reflection = (PI / jnp.tan(PI * r)).astype(dt)
    y = jnp.where(neg, 1 - x, x)
    result = jnp.zeros_like(y)
    for _ in range(10):  # y > 0 here: ten steps reach 10
        low = y < 10
        result = jnp.where(low, result - 1 / y, result)
        y = jnp.where(low, y + 1, y)
    z = 1 / (y * y)
    series = jnp.where(y < 1.0e17, z * _polevl(z, _DIGAMMA_A), jnp.zeros((), dt))
    value = result + jnp.log(y) - 0.5 / y - series
    value = jnp.where(y == 10, result + _PSI_10, value)
    value = jnp.where(neg, value - reflection, value)
    value = jnp.where(neg & (x == jnp.trunc(x)), jnp.asarray(np.nan, dt), value)
    return jnp.where(x == 0, jnp.copysign(jnp.asarray(np.inf, dt), -x), value)


def _trigamma(x):
    """torch's trigamma: reflection below 0.5, six recurrence steps, the asymptotic series."""
    dt = x.dtype
    low = x < 0.5
    s = jnp.sin(PI * x)
    result = jnp.where(low, -(PI * PI) / (s * s), jnp.zeros((), dt))
    x = jnp.where(low, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(low, -result, result)


_ZETA_A = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)
_MACHEP = 1.11022302462515654042e-16


def _zeta(x, q, first=None):
    """torch's Hurwitz zeta (Cephes): direct summation until ``q + i > 9`` (at least nine
    terms) or convergence, then the Euler-Maclaurin tail. inf at x == 1 and at non-positive
    integer q; NaN for x < 1, and for q < 0 with x not an integer."""
    dt = x.dtype
    machep = jnp.asarray(_MACHEP, dt)
    s0 = jnp.power(q, -x) if first is None else first
    zeros = jnp.zeros_like(x)
    # Elements answered by their edge value take no part in the loops (a safe q for them).
    edge = (x == 1) | (x < 1) | ((q <= 0) & ((q == jnp.floor(q)) | (x != jnp.floor(x))))
    a0 = jnp.where(edge, jnp.ones((), dt), q)
    s0 = jnp.where(edge, jnp.ones((), dt), s0)

    def cond(st):
        return jnp.any(st[4])

    def body(st):
        i, a, b, s, active, converged = st
        a1 = a + 1
        b1 = jnp.power(a1, -x)
        s1 = s + b1
        conv = (-machep * s1 < b1) & (b1 < machep * s1)
        i1 = i + 1
        a, b, s = (jnp.where(active, n, o) for n, o in ((a1, a), (b1, b), (s1, s)))
        i = jnp.where(active, i1, i)
        converged = converged | (active & conv)
        active = active & ~conv & ((i < 9) | (a <= 9))
        return i, a, b, s, active, converged

    state = (jnp.zeros(x.shape, jnp.int32), a0, zeros, s0, ~edge, jnp.zeros(x.shape, bool))
    _, a, b, s, _, direct = _while(cond, body, state)
    # The Euler-Maclaurin tail, each element stopped at its own convergence.
    w = a
    tail = s + b * w / (x - 1) - 0.5 * b
    aa = jnp.ones_like(x)
    k = zeros
    stop = direct
    for coef in _ZETA_A:
        aa = aa * (x + k)
        b = b / w
        t = ieee_div(aa * b, coef)
        new = tail + t
        tail = jnp.where(stop, tail, new)
        stop = stop | (jnp.abs(t / new) < machep)
        k = k + 1
        aa = aa * (x + k)
        b = b / w
        k = k + 1
    out = jnp.where(direct, s, tail)
    nan, inf = jnp.asarray(np.nan, dt), jnp.asarray(np.inf, dt)
    q_bad = q <= 0
    out = jnp.where(q_bad & (x != jnp.floor(x)), nan, out)
    out = jnp.where(q_bad & (q == jnp.floor(q)), inf, out)
    out = jnp.where(x < 1, nan, out)
    return jnp.where(x == 1, inf, out)


def _zeta64(x, q):
    """zeta summed in float64 whatever the dtype, as torch's CPU kernel does (its acc_type):
    for q < 0 the sum cancels far below float32's precision (polygamma of negative x). Its
    first term, q**-x, torch computes in the input dtype (std::pow of two floats): rounded
    to it here (in its normal range: XLA would flush a subnormal to zero)."""
    x64, q64 = x.astype(np.float64), q.astype(np.float64)
    first = jnp.power(q64, -x64)
    if x.dtype != np.float64:
        rounded = first.astype(x.dtype).astype(np.float64)
        first = jnp.where(jnp.abs(first) >= float(np.finfo(x.dtype).tiny), rounded, first)
    return _zeta(x64, q64, first)


def zeta_acc(x, q):
    return _zeta64(x, q).astype(x.dtype)


def _polygamma(n: int, x):
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    # torch's calc_polygamma: (-1)^(n+1) n! zeta(n+1, x), n! as exp(lgamma(n+1)) in the
    # dtype (inf beyond its range: then inf times a tiny zeta is inf, as in torch, so the
    # product is taken in float64, where that zeta is not flushed to zero).
    dt = x.dtype
    sign = 1.0 if n % 2 else -1.0
    big = n > 170 or math.factorial(n) > float(np.finfo(dt).max)
    factorial = np.inf if big else float(np.asarray(float(math.factorial(n)), dt))
    z = _zeta64(jnp.full_like(x, n + 1.0), x)
    out = sign * factorial * z
    if big:  # a zeta that rounds to 0 in the dtype: inf * 0
        underflow = jnp.abs(z) <= float(np.finfo(dt).smallest_subnormal) / 2
        out = jnp.where(underflow, np.nan, out)
    return cast(out, dt)


@register("aten::polygamma.default")
def _polygamma_rule(node, x):
    n = node.attrs["n"]
    if n < 0:
        raise ValueError(f"polygamma(n, x): n must be non-negative, got {n}")
    dt = out_dtype(node)
    return cast(_polygamma(n, cast(x, work(dt))), dt)


@register("aten::mvlgamma.default")
def _mvlgamma(node, x):
    """sum_j lgamma(x - j/2) + p(p-1)/4 log(pi), over the whole real line as torch computes
    it (no domain check: x <= (p-1)/2 gives lgamma's values there)."""
    p = node.attrs["p"]
    if p < 1:
        raise ValueError(f"mvlgamma: p must be at least 1, got {p}")
    if x.dtype == np.bool_:
        raise ValueError("mvlgamma: the input tensor may not be a boolean tensor (as torch)")
    dt = out_dtype(node)
    x = cast(x, work(dt))
    total = None
    for j in range(p):  # torch's order: x - (p-1)/2, ..., x - 1/2, x
        term = _lgamma(x + (-0.5 * (p - 1) + 0.5 * j))
        total = term if total is None else total + term
    total = total + p * (p - 1) * math.log(math.pi) / 4
    return cast(total, dt)
