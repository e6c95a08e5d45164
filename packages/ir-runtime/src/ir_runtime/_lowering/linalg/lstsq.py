"""Least squares, linalg_lstsq, with torch's CPU drivers: gels (QR), gelsy (pivoted QR and the
rank from LAPACK's incremental condition estimate, dlaic1, step for step), gelsd and gelss
(SVD).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.lax import linalg as lax_linalg

from ir_runtime._lowering._registry import out_dtype, register
from ir_runtime._lowering.linalg._common import (
    _empty,
    batch_to,
    batched,
    is_vector_rhs,
    matmul,
    mH,
    real_dtype,
    tri_solve,
)


def _laic1(job: int, x, sest, w, gamma, eps):
    """LAPACK's dlaic1 (real): one step of incremental condition estimation. Given ``x`` (unit
    norm, zeros past the current size) with ``sest`` the estimate of the largest (job 1) or
    smallest (job 2) singular value of the leading triangle, and the new column ``w`` (zeros
    past the current size) with diagonal entry ``gamma``: (new estimate, s, c)."""
    alpha = jnp.sum(x * w)
    absalp, absgam, absest = jnp.abs(alpha), jnp.abs(gamma), jnp.abs(sest)
    one = jnp.ones((), sest.dtype)

    def safe(d):
        return jnp.where(d == 0, one, d)

    # LAPACK's cases, tested in the same order by both jobs: the first that holds picks its
    # values, ``normal`` where none does.
    cases = (
        sest == 0,
        absgam <= eps * absest,
        absalp <= eps * absest,
        (absest <= eps * absalp) | (absest <= eps * absgam),
    )
    # What both jobs' third and fourth cases read.
    le_est, le_alp = absgam <= absest, absgam <= absalp
    tmp_a = absgam / safe(absalp)
    root_a = jnp.sqrt(1 + tmp_a * tmp_a)
    tmp_b = absalp / safe(absgam)
    root_b = jnp.sqrt(1 + tmp_b * tmp_b)
    if job == 1:
        s1 = jnp.maximum(absgam, absalp)
        s_ = alpha / safe(s1)
        c_ = gamma / safe(s1)
        tmp = jnp.sqrt(s_ * s_ + c_ * c_)
        zero_est = (
            jnp.where(s1 == 0, 0.0, s1 * tmp),
            jnp.where(s1 == 0, 0.0, s_ / safe(tmp)),
            jnp.where(s1 == 0, 1.0, c_ / safe(tmp)),
        )
        tmp = jnp.maximum(absest, absalp)
        t1, t2 = absest / safe(tmp), absalp / safe(tmp)
        small_gam = (tmp * jnp.sqrt(t1 * t1 + t2 * t2), one, 0 * one)
        small_alp = (
            jnp.where(le_est, absest, absgam),
            jnp.where(le_est, 1.0, 0.0),
            jnp.where(le_est, 0.0, 1.0),
        )
        small_est = (
            jnp.where(le_alp, absalp * root_a, absgam * root_b),
            jnp.where(le_alp, jnp.sign(alpha) / root_a, (alpha / safe(absgam)) / root_b),
            jnp.where(le_alp, (gamma / safe(absalp)) / root_a, jnp.sign(gamma) / root_b),
        )
        z1, z2 = alpha / safe(absest), gamma / safe(absest)
        b = (1 - z1 * z1 - z2 * z2) * 0.5
        c = z1 * z1
        t = jnp.where(b > 0, c / safe(b + jnp.sqrt(b * b + c)), jnp.sqrt(b * b + c) - b)
        sine, cosine = -z1 / safe(t), -z2 / (1 + t)
        tmp = jnp.sqrt(sine * sine + cosine * cosine)
        normal = (jnp.sqrt(t + 1) * absest, sine / safe(tmp), cosine / safe(tmp))
    else:
        zero_in = jnp.maximum(absgam, absalp) == 0
        sine = jnp.where(zero_in, 1.0, -gamma)
        cosine = jnp.where(zero_in, 0.0, alpha)
        s1 = jnp.maximum(jnp.abs(sine), jnp.abs(cosine))
        s_, c_ = sine / s1, cosine / s1
        tmp = jnp.sqrt(s_ * s_ + c_ * c_)
        zero_est = (0 * one, s_ / tmp, c_ / tmp)
        small_gam = (absgam, 0 * one, one)
        small_alp = (
            jnp.where(le_est, absgam, absest),
            jnp.where(le_est, 0.0, 1.0),
            jnp.where(le_est, 1.0, 0.0),
        )
        small_est = (
            jnp.where(le_alp, absest * (tmp_a / root_a), absest / root_b),
            jnp.where(le_alp, -(gamma / safe(absalp)) / root_a, -jnp.sign(gamma) / root_b),
            jnp.where(le_alp, jnp.sign(alpha) / root_a, (alpha / safe(absgam)) / root_b),
        )
        z1, z2 = alpha / safe(absest), gamma / safe(absest)
        norma = jnp.maximum(1 + z1 * z1 + jnp.abs(z1 * z2), jnp.abs(z1 * z2) + z2 * z2)
        test = 1 + 2 * (z1 - z2) * (z1 + z2)
        b0 = (z1 * z1 + z2 * z2 + 1) * 0.5
        c0 = z2 * z2
        t0 = c0 / safe(b0 + jnp.sqrt(jnp.abs(b0 * b0 - c0)))
        sine0, cosine0 = z1 / safe(1 - t0), -z2 / safe(t0)
        est0 = jnp.sqrt(t0 + 4 * eps * eps * norma) * absest
        b1 = (z2 * z2 + z1 * z1 - 1) * 0.5
        c1 = z1 * z1
        t1 = jnp.where(
            b1 >= 0, -c1 / safe(b1 + jnp.sqrt(b1 * b1 + c1)), b1 - jnp.sqrt(b1 * b1 + c1)
        )
        sine1, cosine1 = -z1 / safe(t1), -z2 / safe(1 + t1)
        est1 = jnp.sqrt(1 + t1 + 4 * eps * eps * norma) * absest
        close = test >= 0
        sine = jnp.where(close, sine0, sine1)
        cosine = jnp.where(close, cosine0, cosine1)
        tmp = jnp.sqrt(sine * sine + cosine * cosine)
        normal = (jnp.where(close, est0, est1), sine / safe(tmp), cosine / safe(tmp))
    out = normal
    picks = (zero_est, small_gam, small_alp, small_est)
    for cond, vals in reversed(tuple(zip(cases, picks, strict=True))):
        out = tuple(jnp.where(cond, v, o) for v, o in zip(vals, out, strict=True))
    return tuple(o.astype(sest.dtype) for o in out)


def _gelsy_rank(r, rcond, eps):
    """dgelsy's rank: the largest leading triangle of the pivoted QR's R whose estimated
    condition number (incremental condition estimation) stays below 1 / rcond."""
    k = min(r.shape[-2:])
    idx = jnp.arange(k)
    diag0 = jnp.abs(r[0, 0])
    e0 = (idx == 0).astype(r.dtype)

    def cond(state):
        rank, _, _, _, _, go = state
        return go & (rank < k)

    def body(state):
        rank, xmin, xmax, smin, smax, _ = state
        col = r[:k, rank]
        w = jnp.where(idx < rank, col, 0)
        gamma = r[rank, rank]
        sminpr, s1, c1 = _laic1(2, xmin, smin, w, gamma, eps)
        smaxpr, s2, c2 = _laic1(1, xmax, smax, w, gamma, eps)
        ok = smaxpr * rcond <= sminpr
        new_min = jnp.where(idx == rank, c1, s1 * xmin)
        new_max = jnp.where(idx == rank, c2, s2 * xmax)
        return (
            jnp.where(ok, rank + 1, rank),
            jnp.where(ok, new_min, xmin),
            jnp.where(ok, new_max, xmax),
            jnp.where(ok, sminpr, smin),
            jnp.where(ok, smaxpr, smax),
            ok,
        )

    start = jnp.where(diag0 == 0, 0, 1).astype(jnp.int32)
    state = (start, e0, e0, diag0, diag0, diag0 != 0)
    return lax.while_loop(cond, body, state)[0]


def _gelsy_one(a, b, rcond, eps):
    """dgelsy on one matrix: (minimum-norm solution of the rank-truncated problem, rank)."""
    m, n = a.shape
    k = min(m, n)
    q, r, perm = lax_linalg.qr(a, pivoting=True, full_matrices=False)  # a[:, perm] = q r
    rank = _gelsy_rank(r, rcond, eps)
    rows = jnp.arange(k)
    c = jnp.where((rows < rank)[:, None], matmul(mH(q), b), 0)  # (Q^H b)[:rank]
    top = jnp.where((rows < rank)[:, None], r, 0)  # [R11 R12] in the first rank rows
    # [R11 R12] = T^H Z^H from the QR of its transpose; the rows past the rank get identity.
    z, t = jnp.linalg.qr(mH(top), mode="reduced")  # (n, k), (k, k)
    t = t + jnp.diag(jnp.where(rows < rank, 0, 1).astype(t.dtype))
    y = matmul(z, tri_solve(t, c, lower=False, trans="C"))  # (n, nrhs), pivoted order
    x = jnp.zeros_like(y).at[perm].set(y)
    return x, rank


@register("aten::linalg_lstsq.default")
def _linalg_lstsq(node, a, b):
    """(solution, residuals, rank, singular values) as torch's CPU drivers give them: ``gels``
    (QR, full rank assumed; residuals when m > n), ``gelsy`` (the default: pivoted QR and
    LAPACK's incremental condition estimate of the rank, real matrices), ``gelsd`` and ``gelss``
    (SVD; rank and singular values). gelsd and gelss give residuals for m > n only when every
    matrix has full rank, a shape that depends on the values: refused, as is complex gelsy."""
    driver = node.attrs["driver"] or "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise ValueError(f"linalg_lstsq: driver {driver!r} is not gels, gelsy, gelsd or gelss")
    m, n = a.shape[-2:]
    if driver in ("gelsd", "gelss") and m > n:
        raise NotImplementedError(
            f"linalg_lstsq(driver={driver!r}) of a tall matrix: its residuals are empty or not "
            f"depending on the rank the values have; use driver='gels' (full rank) or 'gelsy'"
        )
    dtype = out_dtype(node, 0)
    if driver == "gelsy" and jnp.issubdtype(dtype, jnp.complexfloating):
        raise NotImplementedError(
            "linalg_lstsq(driver='gelsy') of a complex matrix: LAPACK's complex rank estimate "
            "is not implemented on the lazy device; use driver='gelsd' (or 'gels', full rank)"
        )
    vector = is_vector_rhs(a.shape, b.shape)
    b_ = b[..., None] if vector else b
    batch = jnp.broadcast_shapes(a.shape[:-2], b_.shape[:-2])
    a_b = batch_to(a, batch).astype(dtype)
    b_b = batch_to(b_, batch).astype(dtype)
    k = min(m, n)
    rcond = node.attrs["rcond"]
    real = real_dtype(dtype)
    if rcond is None:
        rcond = float(jnp.finfo(real).eps) * max(m, n)
    outs = [None, _empty(node, 1), _empty(node, 2), _empty(node, 3)]
    if k == 0:
        x = jnp.zeros((*batch, n, b_.shape[-1]), dtype)
    elif driver == "gels":
        if m >= n:
            q, r = jnp.linalg.qr(a_b, mode="complete")
            qtb = matmul(mH(q), b_b)
            x = tri_solve(r[..., :n, :], qtb[..., :n, :], lower=False)
            if m > n:
                res = jnp.sum(jnp.abs(qtb[..., n:, :]) ** 2, axis=-2)
                outs[1] = res.astype(out_dtype(node, 1))
        else:  # minimum norm: A^H = Q R, x = Q R^-H b
            q, r = jnp.linalg.qr(mH(a_b), mode="reduced")
            x = matmul(q, tri_solve(r, b_b, lower=False, trans="C"))
    elif driver == "gelsy":
        eps = jnp.asarray(float(jnp.finfo(real).eps) / 2, real)  # LAPACK's dlamch('E')
        rc = jnp.asarray(rcond, real)
        x, rank = batched(lambda p, q: _gelsy_one(p, q, rc, eps), (2, 2), a_b, b_b)
        if a.shape[:-2] != batch:  # the rank is A's own, not broadcast against b
            _, rank = batched(
                lambda p: _gelsy_one(p, jnp.zeros((m, 1), dtype), rc, eps), (2,), a.astype(dtype)
            )
        outs[2] = rank.astype(out_dtype(node, 2))
    else:
        u, s, vh = jnp.linalg.svd(a_b, full_matrices=False)
        keep = s > rcond * s[..., :1]
        s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(dtype)
        x = matmul(mH(vh) * s_inv[..., None, :], matmul(mH(u), b_b))
        # rank and singular values are A's own (not broadcast against b)
        s_a = jnp.linalg.svd(a, compute_uv=False) if a.shape[:-2] != batch else s
        outs[2] = jnp.sum(s_a > rcond * s_a[..., :1], axis=-1).astype(out_dtype(node, 2))
        outs[3] = s_a.astype(out_dtype(node, 3))
    outs[0] = (x[..., 0] if vector else x).astype(dtype)
    return tuple(outs)
