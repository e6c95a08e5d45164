"""LDL (Bunch-Kaufman): factor and solve.

LAPACK's ?sytf2 / ?hetf2 with UPLO='L' (what torch's ?sytrf / ?hetrf gives), step for step:
the same pivot choices, the same compact LD (L below the diagonal, the 1x1 and 2x2 blocks of D
on and under it) and the same 1-based pivots (negative for a 2x2 block). The trailing block is
kept as a full (Hermitian-)symmetric matrix, updated in its lower triangle and mirrored.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import out_dtype, register
from ir_runtime._lowering.linalg._common import (
    _empty,
    batch_to,
    batched,
    hermitian_from,
    is_complex,
    real_dtype,
    refuse_check_errors,
)

_BK_ALPHA = (1 + np.sqrt(17.0)) / 8


def _ldl_factor_one(a, hermitian: bool):
    n = a.shape[-1]
    dtype = a.dtype
    cplx = is_complex(a)
    cj = jnp.conj if hermitian else (lambda x: x)
    rdt = real_dtype(dtype)
    idx = jnp.arange(n)
    ii, jj = idx[:, None], idx[None, :]

    def cabs(x):  # LAPACK's |re| + |im| for complex off-diagonals, |x| for real
        return jnp.abs(jnp.real(x)) + jnp.abs(jnp.imag(x)) if cplx else jnp.abs(x)

    def dabs(x):  # a diagonal entry's size: the real part's for a Hermitian matrix
        return jnp.abs(jnp.real(x)) if hermitian else cabs(x)

    def mirror(w):
        """The lower triangle, mirrored (conjugated when Hermitian) onto the upper one."""
        low = jnp.where(ii >= jj, w, 0)
        out = jnp.where(ii > jj, w, 0) + cj(jnp.where(ii > jj, w, 0)).T
        out = out + jnp.where(ii == jj, low, 0)
        if hermitian:
            out = jnp.where(ii == jj, jnp.real(out).astype(dtype), out)
        return out

    w0 = hermitian_from(a, lower=True) if hermitian else jnp.tril(a) + jnp.tril(a, -1).T
    zero = jnp.zeros((), rdt)

    def body(state):
        w, ipiv, info, k = state
        col = w[:, k]
        absakk = dabs(w[k, k])
        below = idx > k
        colvals = jnp.where(below, cabs(col), -1)
        imax = jnp.argmax(colvals)
        colmax = jnp.where(k < n - 1, jnp.max(jnp.where(below, cabs(col), zero)), zero)
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        row = w[imax, :]
        rowmask = (idx >= k) & (idx != imax)
        rowmax = jnp.max(jnp.where(rowmask, cabs(row), zero))
        safe_rowmax = jnp.where(rowmax == 0, 1, rowmax)
        no_swap = (absakk >= _BK_ALPHA * colmax) | (
            absakk >= _BK_ALPHA * colmax * (colmax / safe_rowmax)
        )
        one_by_one_swap = dabs(w[imax, imax]) >= _BK_ALPHA * rowmax
        kp = jnp.where(singular | no_swap, k, imax)
        kstep = jnp.where(singular | no_swap | one_by_one_swap, 1, 2)
        kk = k + kstep - 1
        # Interchange rows and columns kk and kp of the trailing block.
        p = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trail = (ii >= k) & (jj >= k)
        w = jnp.where(trail & ~singular, w[p][:, p], w)
        if hermitian:
            w = jnp.where((ii == jj) & (ii == k), jnp.real(w).astype(dtype), w)

        def one(w):
            d = jnp.real(w[k, k]).astype(dtype) if hermitian else w[k, k]
            d11 = 1 / d
            x = jnp.where(idx > k, w[:, k], 0)
            upd = w + x[:, None] * (-d11 * cj(x)[None, :])
            sub = (ii > k) & (jj > k)
            w2 = jnp.where(sub, mirror(upd), w)
            newcol = jnp.where(idx > k, x * d11, w2[:, k])
            w2 = w2.at[:, k].set(newcol)
            return w2

        def two(w):
            xk = w[:, k]
            xk1 = w[:, k + 1]
            if hermitian:
                d21c = w[k + 1, k]
                dd = jnp.abs(d21c)
                d11 = jnp.real(w[k + 1, k + 1]) / dd
                d22 = jnp.real(w[k, k]) / dd
                tt = 1 / (d11 * d22 - 1)
                d21 = d21c / dd
                dd = tt / dd
                wk = dd * (d11 * xk - d21 * xk1)
                wkp1 = dd * (d22 * xk1 - jnp.conj(d21) * xk)
            else:
                d21 = w[k + 1, k]
                d11 = w[k + 1, k + 1] / d21
                d22 = w[k, k] / d21
                t = 1 / (d11 * d22 - 1)
                d21 = t / d21
                wk = d21 * (d11 * xk - xk1)
                wkp1 = d21 * (d22 * xk1 - xk)
            rest = idx > k + 1
            wk = jnp.where(rest, wk, 0)
            wkp1 = jnp.where(rest, wkp1, 0)
            upd = w - xk[:, None] * cj(wk)[None, :] - xk1[:, None] * cj(wkp1)[None, :]
            sub = (ii > k + 1) & (jj > k + 1)
            w2 = jnp.where(sub, mirror(upd), w)
            w2 = w2.at[:, k].set(jnp.where(rest, wk, w2[:, k]))
            w2 = w2.at[:, k + 1].set(jnp.where(rest, wkp1, w2[:, k + 1]))
            return w2

        w = lax.cond(singular, lambda w: w, lambda w: lax.cond(kstep == 1, one, two, w), w)
        piv1 = (kp + 1).astype(jnp.int32)
        ipiv = jnp.where(
            kstep == 1,
            ipiv.at[k].set(piv1),
            ipiv.at[k].set(-piv1).at[jnp.minimum(k + 1, n - 1)].set(-piv1),
        )
        info = jnp.where(singular & (info == 0), (k + 1).astype(jnp.int32), info)
        return w, ipiv, info, k + kstep

    state = (w0, jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    w, ipiv, info, _ = lax.while_loop(lambda s: s[3] < n, body, state)
    return jnp.tril(w), ipiv, info


@register("aten::linalg_ldl_factor_ex.default")
def _linalg_ldl_factor_ex(node, a):
    refuse_check_errors(node, "linalg_ldl_factor_ex")
    hermitian = node.attrs["hermitian"] and is_complex(a)
    if a.shape[-1] == 0:
        return a.astype(out_dtype(node, 0)), _empty(node, 1), _empty(node, 2)
    ld, ipiv, info = batched(lambda x: _ldl_factor_one(x, hermitian), (2,), a)
    return ld.astype(out_dtype(node, 0)), ipiv, info


def _ldl_solve_one(ld, ipiv, b, hermitian: bool):
    """LAPACK's ?sytrs / ?hetrs with UPLO='L': ``A X = B`` from ?sytrf's LD and pivots."""
    n = ld.shape[-1]
    cj = jnp.conj if hermitian else (lambda x: x)
    idx = jnp.arange(n)

    def swap(b, r, s):
        p = jnp.where(idx == r, s, jnp.where(idx == s, r, idx))
        return b[p]

    def fwd(state):
        b, k = state
        piv = ipiv[k]

        def one(b):
            b = swap(b, k, piv - 1)
            lcol = jnp.where(idx > k, ld[:, k], 0)
            b = b - lcol[:, None] * b[k][None, :]
            d = jnp.real(ld[k, k]).astype(ld.dtype) if hermitian else ld[k, k]
            if hermitian:
                return b.at[k].set(b[k] * (1 / jnp.real(ld[k, k])).astype(ld.dtype))
            return b.at[k].set(b[k] * (1 / d))

        def two(b):
            b = swap(b, k + 1, -piv - 1)
            l0 = jnp.where(idx > k + 1, ld[:, k], 0)
            l1 = jnp.where(idx > k + 1, ld[:, k + 1], 0)
            b = b - l0[:, None] * b[k][None, :]
            b = b - l1[:, None] * b[k + 1][None, :]
            akm1k = ld[k + 1, k]
            akm1 = ld[k, k] / cj(akm1k)
            ak = ld[k + 1, k + 1] / akm1k
            denom = akm1 * ak - 1
            bkm1 = b[k] / cj(akm1k)
            bk = b[k + 1] / akm1k
            b = b.at[k].set((ak * bkm1 - bk) / denom)
            return b.at[k + 1].set((akm1 * bk - bkm1) / denom)

        b = lax.cond(piv > 0, one, two, b)
        return b, k + jnp.where(piv > 0, 1, 2)

    def bwd(state):
        b, k = state
        piv = ipiv[k]

        def one(b):
            lcol = jnp.where(idx > k, ld[:, k], 0)
            b = b.at[k].add(-jnp.sum(cj(lcol)[:, None] * b, axis=0))
            return swap(b, k, piv - 1)

        def two(b):
            l0 = jnp.where(idx > k, ld[:, k], 0)
            l1 = jnp.where(idx > k, ld[:, k - 1], 0)
            b = b.at[k].add(-jnp.sum(cj(l0)[:, None] * b, axis=0))
            b = b.at[k - 1].add(-jnp.sum(cj(l1)[:, None] * b, axis=0))
            return swap(b, k, -piv - 1)

        b = lax.cond(piv > 0, one, two, b)
        return b, k - jnp.where(piv > 0, 1, 2)

    b, _ = lax.while_loop(lambda s: s[1] < n, fwd, (b, jnp.zeros((), jnp.int32)))
    b, _ = lax.while_loop(lambda s: s[1] >= 0, bwd, (b, jnp.asarray(n - 1, jnp.int32)))
    return b


@register("aten::linalg_ldl_solve.default")
def _linalg_ldl_solve(node, ld, pivots, b):
    hermitian = node.attrs["hermitian"] and is_complex(ld)
    batch = jnp.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    dtype = out_dtype(node)
    ld = batch_to(ld, batch).astype(dtype)
    pivots = batch_to(pivots, batch, core=1)
    b = batch_to(b, batch).astype(dtype)
    if ld.shape[-1] == 0 or b.shape[-1] == 0:
        return b
    return batched(lambda f, p, x: _ldl_solve_one(f, p, x, hermitian), (2, 1, 2), ld, pivots, b)
