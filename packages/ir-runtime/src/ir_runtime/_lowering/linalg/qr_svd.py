"""QR and Householder products (geqrf, householder_product, ormqr), the SVD and
eigendecompositions, and matrix functions (matrix_exp, pinv, trace).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.lax import linalg as lax_linalg

from ir_runtime._lowering._registry import out_dims, out_dtype, register
from ir_runtime._lowering.linalg._common import (
    _empty,
    batch_to,
    eye_like,
    hermitian_from,
    matmul,
    mH,
    mT,
    real_dtype,
)

# -- QR and Householder products ---------------------------------------------------------------


@register("aten::linalg_qr.default")
def _linalg_qr(node, a):
    mode = node.attrs["mode"]
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"linalg_qr: mode {mode!r} is not one of 'reduced', 'complete', 'r'")
    m, n = a.shape[-2:]
    if mode == "r":
        r = jnp.linalg.qr(a, mode="r") if min(m, n) else jnp.zeros(out_dims(node, 1), a.dtype)
        return _empty(node, 0), r.astype(out_dtype(node, 1))
    if min(m, n) == 0:
        k = m if mode == "complete" else 0
        q = eye_like(m, a.shape[:-2], a.dtype)[..., :, :k]
        return (
            jnp.broadcast_to(q, out_dims(node, 0)).astype(out_dtype(node, 0)),
            jnp.zeros(out_dims(node, 1), out_dtype(node, 1)),
        )
    q, r = jnp.linalg.qr(a, mode=mode)
    return q.astype(out_dtype(node, 0)), r.astype(out_dtype(node, 1))


@register("aten::geqrf.default")
def _geqrf(node, a):
    """LAPACK's geqrf: R above the diagonal, the Householder vectors below it, and tau."""
    if min(a.shape[-2:]) == 0:
        return a.astype(out_dtype(node, 0)), _empty(node, 1)
    h, tau = jnp.linalg.qr(a, mode="raw")
    return mT(h).astype(out_dtype(node, 0)), tau.astype(out_dtype(node, 1))


@register("aten::linalg_householder_product.default")
def _householder_product(node, a, tau):
    m, n = a.shape[-2:]
    k = tau.shape[-1]
    if m < n or k > n:
        raise ValueError(
            f"linalg_householder_product: input {list(a.shape)} must have rows >= columns and "
            f"tau {list(tau.shape)} at most as many entries as it has columns"
        )
    batch = jnp.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
    a = batch_to(a, batch)
    tau = batch_to(tau, batch, core=1).astype(a.dtype)
    if n == 0:
        return a.astype(out_dtype(node))
    if k == 0:
        return eye_like(m, batch, a.dtype)[..., :n].astype(out_dtype(node))
    return lax_linalg.householder_product(a, tau).astype(out_dtype(node))


@register("aten::ormqr.default")
def _ormqr(node, a, tau, c):
    """``op(Q) C`` (or ``C op(Q)`` when not ``left``), Q the product of the Householder
    reflectors in ``a`` and ``tau``; op the conjugate transpose when ``transpose``."""
    left, transpose = node.attrs["left"], node.attrs["transpose"]
    batch = jnp.broadcast_shapes(a.shape[:-2], tau.shape[:-1], c.shape[:-2])
    a = batch_to(a, batch)
    tau = batch_to(tau, batch, core=1)
    c = batch_to(c, batch)
    dtype = out_dtype(node)
    if tau.shape[-1] == 0 or c.size == 0:
        return c.astype(dtype)
    # Q (m x m) from the reflectors, padded with identity reflectors (tau 0).
    m, k = a.shape[-2], tau.shape[-1]
    full = jnp.zeros((*batch, m, m), dtype).at[..., :, :k].set(a[..., :, :k].astype(dtype))
    taus = jnp.zeros((*batch, m), dtype).at[..., :k].set(tau.astype(dtype))
    q = lax_linalg.householder_product(full, taus)
    if transpose:
        q = mH(q)
    return (matmul(q, c) if left else matmul(c, q)).astype(dtype)


# -- SVD and eigendecompositions ---------------------------------------------------------------


@register("aten::_linalg_svd.default")
def _linalg_svd(node, a):
    """(U, S, Vh) through LAPACK's gesdd, torch's CPU driver; U and Vh empty without
    ``compute_uv``."""
    if node.attrs["driver"] is not None:
        raise NotImplementedError(
            f"_linalg_svd(driver={node.attrs['driver']!r}): a cuSOLVER driver is not available "
            f"on the lazy device; leave driver=None"
        )
    full, compute_uv = node.attrs["full_matrices"], node.attrs["compute_uv"]
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    if min(m, n) == 0:
        s = jnp.zeros(out_dims(node, 1), out_dtype(node, 1))
        if not compute_uv:
            return _empty(node, 0), s, _empty(node, 2)
        u = eye_like(m, batch, out_dtype(node, 0))[..., : out_dims(node, 0)[-1]]
        vh = eye_like(n, batch, out_dtype(node, 2))[..., : out_dims(node, 2)[-2], :]
        return u, s, vh
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return _empty(node, 0), s.astype(out_dtype(node, 1)), _empty(node, 2)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full)
    return u.astype(out_dtype(node, 0)), s.astype(out_dtype(node, 1)), vh.astype(out_dtype(node, 2))


@register("aten::_linalg_eigh.default")
def _linalg_eigh(node, a):
    """(ascending eigenvalues, eigenvectors) of the Hermitian matrix in the ``UPLO`` triangle of
    ``a``; eigenvectors empty without ``compute_v``."""
    uplo = node.attrs["UPLO"]
    if uplo not in ("L", "U"):
        raise ValueError(f"_linalg_eigh: UPLO must be 'L' or 'U', got {uplo!r}")
    lower = uplo == "L"
    if a.shape[-1] == 0:
        w = jnp.zeros(out_dims(node, 0), out_dtype(node, 0))
        v = jnp.zeros(out_dims(node, 1), out_dtype(node, 1))
        return w, v
    h = hermitian_from(a, lower)
    v, w = lax_linalg.eigh(h, lower=lower, symmetrize_input=False)
    w = w.astype(out_dtype(node, 0))
    if not node.attrs["compute_v"]:
        return w, _empty(node, 1)
    return w, v.astype(out_dtype(node, 1))


def _eig(a, vectors: bool):
    """(eigenvalues, right eigenvectors or None) of a non-empty square ``a``."""
    out = lax_linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=vectors)
    return out[0], (out[1] if vectors else None)


@register("aten::linalg_eig.default")
def _linalg_eig(node, a):
    """Eigenvalues and unit-norm right eigenvectors (LAPACK's geev, as torch), complex."""
    if a.shape[-1] == 0:
        return _empty(node, 0), _empty(node, 1)
    w, v = _eig(a, True)
    return w.astype(out_dtype(node, 0)), v.astype(out_dtype(node, 1))


@register("aten::_linalg_eigvals.default")
def _linalg_eigvals(node, a):
    if a.shape[-1] == 0:
        return _empty(node, 0)
    return _eig(a, False)[0].astype(out_dtype(node))


# -- matrix functions --------------------------------------------------------------------------


@register("aten::linalg_matrix_exp.default")
def _linalg_matrix_exp(node, a):
    if a.shape[-1] == 0:
        return a.astype(out_dtype(node))
    if a.ndim == 2:
        return jsl.expm(a).astype(out_dtype(node))
    flat = a.reshape((-1, *a.shape[-2:]))
    out = jax.vmap(jsl.expm)(flat)
    return out.reshape(a.shape).astype(out_dtype(node))


@register("aten::linalg_pinv.atol_rtol_tensor")
def _linalg_pinv(node, a, atol, rtol):
    """torch's: from the SVD (the eigendecomposition when ``hermitian``), singular values at
    most ``max(atol, rtol * largest)`` dropped, the tolerances in float64 as torch has them."""
    dtype = out_dtype(node)
    if a.size == 0:
        return jnp.zeros(out_dims(node), dtype)
    m, n = a.shape[-2:]
    if atol is None:
        atol_ = jnp.zeros((), jnp.float64)
    else:
        atol_ = atol.astype(jnp.float64)
    if rtol is not None:
        rtol_ = rtol.astype(jnp.float64)
    else:
        eps = float(jnp.finfo(real_dtype(a.dtype)).eps)
        default = jnp.asarray(eps * max(m, n), jnp.float64)
        rtol_ = default if atol is None else jnp.where(atol_ > 0, 0.0, default)
    if node.attrs["hermitian"]:
        h = hermitian_from(a, lower=True)
        vecs, s = lax_linalg.eigh(h, lower=True, symmetrize_input=False)
        top = jnp.max(jnp.abs(s), axis=-1, keepdims=True)
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * top)
        keep = jnp.abs(s).astype(jnp.float64) > tol
        s_inv = jnp.where(keep, 1 / s, 0).astype(a.dtype)
        out = matmul(vecs * s_inv[..., None, :], mH(vecs))
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
        top = s[..., :1]
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * top)
        keep = s.astype(jnp.float64) > tol
        s_inv = jnp.where(keep, 1 / s, 0).astype(a.dtype)
        out = matmul(mH(vh) * s_inv[..., None, :], mH(u))
    return jnp.broadcast_to(out, out_dims(node)).astype(dtype)


@register("aten::trace.default")
def _trace(node, x):
    return jnp.trace(x).astype(out_dtype(node))
