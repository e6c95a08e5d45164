"""Cholesky, triangular solves, LU, and the solves, inverses and determinants built on them, with
torch's auxiliary outputs (LAPACK's info codes and 1-based int32 pivots).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.lax import linalg as lax_linalg

from ir_runtime._lowering._registry import out_dims, out_dtype, register
from ir_runtime._lowering.linalg._common import (
    _empty,
    batch_to,
    eye_like,
    hermitian_from,
    is_complex,
    is_vector_rhs,
    matmul,
    mH,
    mT,
    refuse_check_errors,
    tri_solve,
)


def _pivots_to_perm(pivots, m: int):
    """LAPACK's 1-based row interchanges as the permutation ``perm``: ``A[perm] = L @ U``."""
    if pivots.shape[-1] == 0:
        return jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), (*pivots.shape[:-1], m))
    return lax_linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _lu_factor(a):
    """(LU, 1-based int32 pivots, int32 info) as LAPACK's getrf gives them: info is the first
    exactly zero diagonal entry of U (1-based), else 0."""
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    if k == 0:
        return a, jnp.zeros((*batch, 0), jnp.int32), jnp.zeros(batch, jnp.int32)
    lu, pivots, _ = lax_linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diag == 0
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    info = jnp.where(jnp.any(zero, axis=-1), first, 0).astype(jnp.int32)
    return lu, (pivots + 1).astype(jnp.int32), info


def _permute_rows(b, perm):
    """``b[perm]`` on the row axis, batched (``perm`` broadcasts against ``b``'s batch)."""
    return jnp.take_along_axis(b, perm[..., :, None], axis=-2)


def _lu_solve(lu, pivots, b, *, left: bool, adjoint: bool):
    """``A x = b`` (or ``A^H x = b``; or ``x A = b``, ``x A^H = b`` when not ``left``) for
    ``A = P L U`` given as getrf's LU and 1-based pivots; batch dims broadcast."""
    if not left:
        return mH(_lu_solve(lu, pivots, mH(b), left=True, adjoint=not adjoint))
    n = lu.shape[-1]
    batch = jnp.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    dtype = jnp.result_type(lu.dtype, b.dtype)
    lu = batch_to(lu, batch).astype(dtype)
    b = batch_to(b, batch).astype(dtype)
    if n == 0 or b.shape[-1] == 0:
        return b
    perm = batch_to(_pivots_to_perm(pivots, n), batch, core=1)
    if not adjoint:
        y = _permute_rows(b, perm)
        y = tri_solve(lu, y, lower=True, unit=True)
        return tri_solve(lu, y, lower=False)
    y = tri_solve(lu, b, lower=False, trans="C")
    y = tri_solve(lu, y, lower=True, unit=True, trans="C")
    return _permute_rows(y, jnp.argsort(perm, axis=-1))


def _det_p(pivots):
    """The determinant of the permutation the pivots make: -1 per row interchange."""
    k = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, k + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1)


def _uses_transpose(a) -> bool:
    """Whether torch factors ``A.mT`` for ``A`` (a contiguous real matrix; lazy tensors are
    contiguous)."""
    return not is_complex(a)


# -- Cholesky ----------------------------------------------------------------------------------


def _cholesky_info(h):
    """LAPACK potrf's info for the Hermitian ``h`` (lower triangle): the order of the first
    leading minor that is not positive definite (a pivot <= 0 or NaN), else 0. An unblocked
    Cholesky, run only where the factorization failed."""
    n = h.shape[-1]
    batch = h.shape[:-2]
    idx = jnp.arange(n)

    def step(j, carry):
        low, info = carry
        row = lax.dynamic_index_in_dim(low, j, axis=-2, keepdims=False)  # L[j, :j], zeros after
        a_jj = jnp.real(
            lax.dynamic_index_in_dim(
                lax.dynamic_index_in_dim(h, j, axis=-2, keepdims=False), j, axis=-1, keepdims=False
            )
        )
        d = a_jj - jnp.sum(jnp.abs(row) ** 2, axis=-1)
        fail = ~(d > 0)
        info = jnp.where((info == 0) & fail, j + 1, info)
        l_jj = jnp.sqrt(jnp.where(fail, 1, d))
        col_a = lax.dynamic_index_in_dim(h, j, axis=-1, keepdims=False)
        col = (
            col_a
            - jnp.einsum("...ik,...k->...i", low, jnp.conj(row), precision=lax.Precision.HIGHEST)
        ) / l_jj[..., None]
        col = jnp.where(idx > j, col, jnp.where(idx == j, l_jj[..., None].astype(h.dtype), 0))
        low = lax.dynamic_update_index_in_dim(low, col[..., :, None], j, axis=-1)
        return low, info

    _, info = lax.fori_loop(0, n, step, (jnp.zeros_like(h), jnp.zeros(batch, jnp.int32)))
    return info


def _cholesky(a, upper: bool):
    """(factor, info): the lower (or upper) Cholesky factor from that triangle of ``a``."""
    x = mH(a) if upper else a
    h = hermitian_from(x, lower=True)
    batch = a.shape[:-2]
    if a.shape[-1] == 0:
        return a, jnp.zeros(batch, jnp.int32)
    low = jnp.tril(lax_linalg.cholesky(h, symmetrize_input=False))
    failed = jnp.any(jnp.isnan(low))
    info = lax.cond(failed, _cholesky_info, lambda h: jnp.zeros(batch, jnp.int32), h)
    return (mH(low) if upper else low), info


@register("aten::linalg_cholesky_ex.default")
def _linalg_cholesky_ex(node, a):
    refuse_check_errors(node, "linalg_cholesky_ex")
    factor, info = _cholesky(a, node.attrs["upper"])
    return factor.astype(out_dtype(node, 0)), info


@register("aten::cholesky.default")
def _cholesky_deprecated(node, a):
    """torch raises when ``a`` is not positive definite; here the factor is NaN then."""
    return _cholesky(a, node.attrs["upper"])[0].astype(out_dtype(node))


@register("aten::cholesky_inverse.default")
def _cholesky_inverse(node, factor):
    """``(L L^H)^-1`` from the lower factor (``(U^H U)^-1`` from the upper), reading only its
    triangle."""
    upper = node.attrs["upper"]
    n = factor.shape[-1]
    eye = eye_like(n, factor.shape[:-2], factor.dtype)
    if upper:
        inv = tri_solve(factor, eye, lower=False)  # U^-1
        out = matmul(inv, mH(inv))
    else:
        inv = tri_solve(factor, eye, lower=True)  # L^-1
        out = matmul(mH(inv), inv)
    return out.astype(out_dtype(node))


@register("aten::cholesky_solve.default")
def _cholesky_solve(node, b, factor):
    """``A x = b`` with ``A = L L^H`` (or ``U^H U``); batch dims broadcast."""
    upper = node.attrs["upper"]
    if upper:
        y = tri_solve(factor, b, lower=False, trans="C")
        x = tri_solve(factor, y, lower=False)
    else:
        y = tri_solve(factor, b, lower=True)
        x = tri_solve(factor, y, lower=True, trans="C")
    return x.astype(out_dtype(node))


# -- triangular solves -------------------------------------------------------------------------


@register("aten::linalg_solve_triangular.default")
def _linalg_solve_triangular(node, a, b):
    x = tri_solve(
        a,
        b,
        lower=not node.attrs["upper"],
        left=node.attrs["left"],
        unit=node.attrs["unitriangular"],
    )
    return x.astype(out_dtype(node))


@register("aten::triangular_solve.default")
def _triangular_solve(node, b, a):
    """(solution, the coefficient matrix broadcast): ``op(A) X = B``, op the plain transpose
    when ``transpose`` (not the conjugate one, as torch)."""
    x = tri_solve(
        a,
        b,
        lower=not node.attrs["upper"],
        unit=node.attrs["unitriangular"],
        trans="T" if node.attrs["transpose"] else "N",
    )
    coeff = jnp.broadcast_to(a, out_dims(node, 1))
    return x.astype(out_dtype(node, 0)), coeff.astype(out_dtype(node, 1))


# -- LU ----------------------------------------------------------------------------------------


def _refuse_no_pivot(node, op: str):
    if not node.attrs["pivot"]:
        raise NotImplementedError(
            f"{op}(pivot=False): LU without pivoting is not supported on the lazy device (nor "
            f"by torch on CPU); use pivot=True"
        )


@register("aten::linalg_lu_factor_ex.default")
def _linalg_lu_factor_ex(node, a):
    _refuse_no_pivot(node, "linalg_lu_factor_ex")
    refuse_check_errors(node, "linalg_lu_factor_ex")
    lu, pivots, info = _lu_factor(a)
    return lu.astype(out_dtype(node, 0)), pivots, info


def _unpack(lu, pivots, node, unpack_data: bool, unpack_pivots: bool):
    """(P, L, U) from getrf's LU and pivots, as lu_unpack gives them."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    if unpack_pivots:
        perm = _pivots_to_perm(pivots, m)
        # A = P L U with A[perm] = L U: P[perm[i], i] = 1.
        p = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=out_dtype(node, 0)), -1, -2)
        p = jnp.broadcast_to(p, out_dims(node, 0))
    else:
        p = _empty(node, 0)
    if unpack_data:
        low = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
        up = jnp.triu(lu[..., :k, :])
        low, up = low.astype(out_dtype(node, 1)), up.astype(out_dtype(node, 2))
    else:
        low, up = _empty(node, 1), _empty(node, 2)
    return p, low, up


@register("aten::linalg_lu.default")
def _linalg_lu(node, a):
    _refuse_no_pivot(node, "linalg_lu")
    lu, pivots, _ = _lu_factor(a)
    return _unpack(lu, pivots, node, True, True)


@register("aten::lu_unpack.default")
def _lu_unpack(node, lu, pivots):
    return _unpack(lu, pivots, node, node.attrs["unpack_data"], node.attrs["unpack_pivots"])


@register("aten::linalg_lu_solve.default")
def _linalg_lu_solve(node, lu, pivots, b):
    x = _lu_solve(lu, pivots, b, left=node.attrs["left"], adjoint=node.attrs["adjoint"])
    return x.astype(out_dtype(node))


# -- solve, inverse, determinants --------------------------------------------------------------


def _solve_ex(a, b, left: bool):
    """torch's _linalg_solve_ex: (X, LU, pivots, info), LU that of ``A`` itself (its backward
    solves the adjoint system with it)."""
    lu, pivots, info = _lu_factor(a)
    vector = is_vector_rhs(lu.shape, b.shape)
    b_ = b[..., None] if vector else b
    x = _lu_solve(lu, pivots, b_, left=left, adjoint=False)
    if vector:
        x = x[..., 0]
    return x, lu, pivots, info


@register("aten::_linalg_solve_ex.default")
def _linalg_solve_ex(node, a, b):
    refuse_check_errors(node, "linalg_solve_ex")
    x, lu, pivots, info = _solve_ex(a, b, node.attrs["left"])
    return (
        jnp.broadcast_to(x, out_dims(node, 0)).astype(out_dtype(node, 0)),
        lu.astype(out_dtype(node, 1)),
        pivots,
        info,
    )


@register("aten::linalg_inv_ex.default")
def _linalg_inv_ex(node, a):
    """torch's: ``solve_ex(A, I)``."""
    refuse_check_errors(node, "linalg_inv_ex")
    eye = eye_like(a.shape[-1], a.shape[:-2], a.dtype)
    x, _, _, info = _solve_ex(a, eye, True)
    return x.astype(out_dtype(node, 0)), info


@register("aten::_linalg_det.default")
def _linalg_det(node, a):
    """(det, LU, pivots): LU of ``A.mT`` for real ``A``, as torch."""
    lu, pivots, _ = _lu_factor(mT(a) if _uses_transpose(a) else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    det = _det_p(pivots).astype(lu.dtype) * jnp.prod(diag, axis=-1)
    return det.astype(out_dtype(node, 0)), lu.astype(out_dtype(node, 1)), pivots


@register("aten::_linalg_slogdet.default")
def _linalg_slogdet(node, a):
    """(sign, log|det|, LU, pivots), as torch: the sign from the product of the signs of U's
    diagonal (0 for a singular matrix, whose log|det| is -inf)."""
    lu, pivots, _ = _lu_factor(mT(a) if _uses_transpose(a) else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    absdiag = jnp.abs(diag)
    if is_complex(lu):
        sgn = jnp.where(absdiag == 0, 0, diag / jnp.where(absdiag == 0, 1, absdiag))
    else:
        sgn = jnp.sign(diag)
    sign = jnp.prod(sgn, axis=-1) * _det_p(pivots).astype(lu.dtype)
    logabs = jnp.sum(jnp.log(absdiag), axis=-1)
    return (
        sign.astype(out_dtype(node, 0)),
        logabs.astype(out_dtype(node, 1)),
        lu.astype(out_dtype(node, 2)),
        pivots,
    )
