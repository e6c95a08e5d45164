"""Linear algebra: factorizations, solves, inverses, determinants, eigen- and singular-value
decompositions, least squares, through jax.numpy.linalg, jax.scipy.linalg and jax.lax.linalg.

Each rule gives exactly what torch's CPU kernel gives, its auxiliary outputs included: LU and
pivots (LAPACK's, 1-based, int32), info codes, and LU of ``A.mT`` where torch factors the
transpose (``_linalg_det`` and ``_linalg_slogdet`` do for a contiguous real matrix, and their
backward formulas solve with the adjoint to match; a lazy tensor is always contiguous). LDL
(Bunch-Kaufman) and gelsy's rank estimate follow LAPACK's algorithms step for step. Whatever
cannot be computed as torch does (LU without pivoting, a cuSOLVER SVD driver, raising on a
failed factorization, a shape that depends on the values) is refused with a message naming the
op and the argument.

Singular vectors and eigenvectors are unique up to a sign (a phase): XLA's LAPACK and torch's
MKL may pick different ones; the subspaces, reconstructions and sign-invariant gradients agree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax
from jax.lax import linalg as lax_linalg

from ir_runtime._lowering._registry import out_dims, out_dtype, register

_PRECISION = lax.Precision.HIGHEST


# -- helpers -----------------------------------------------------------------------------------


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _matmul(a, b):
    return jnp.matmul(a, b, precision=_PRECISION)


def _is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _real_dtype(dtype):
    return jnp.finfo(dtype).dtype


def _batch_to(x, batch: tuple, core: int = 2):
    """``x`` broadcast to batch dims ``batch`` (its last ``core`` dims kept)."""
    return jnp.broadcast_to(x, tuple(batch) + tuple(x.shape[x.ndim - core :]))


def _empty(node, k: int):
    """Output ``k`` as torch gives it when it is not computed (shape (0,) and the like)."""
    return jnp.zeros(out_dims(node, k), out_dtype(node, k))


def _eye_like(n: int, batch: tuple, dtype):
    return jnp.broadcast_to(jnp.eye(n, dtype=dtype), (*tuple(batch), n, n))


def _refuse_check_errors(node, op: str):
    if node.attrs["check_errors"]:
        raise NotImplementedError(
            f"{op}(check_errors=True) would raise on the host when the factorization fails, "
            f"which a lazy program cannot do; call it with check_errors=False and test the "
            f"info output"
        )


def _hermitian_from(x, lower: bool):
    """The Hermitian matrix LAPACK reads from one triangle of ``x`` (the diagonal's imaginary
    part ignored), the other triangle not read at all."""
    t = jnp.tril(x, -1) if lower else jnp.triu(x, 1)
    d = jnp.diagonal(x, axis1=-2, axis2=-1)
    if _is_complex(x):
        d = jnp.real(d).astype(x.dtype)
    n = x.shape[-1]
    eye = jnp.eye(n, dtype=bool)
    return jnp.where(eye, d[..., None, :], t + _mH(t))


def _tri_solve(a, b, *, lower: bool, left: bool = True, unit: bool = False, trans: str = "N"):
    """``op(a) x = b`` (left) or ``x op(a) = b`` (right), op in N, T (transpose) or C
    (conjugate transpose); the batch dims of ``a`` and ``b`` broadcast."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = _batch_to(a, batch)
    b = _batch_to(b, batch)
    dtype = jnp.result_type(a.dtype, b.dtype)
    if a.shape[-1] == 0 or b.shape[-1] == 0 or b.shape[-2] == 0:
        return jnp.zeros(b.shape, dtype)
    return lax_linalg.triangular_solve(
        a.astype(dtype),
        b.astype(dtype),
        left_side=left,
        lower=lower,
        transpose_a=trans != "N",
        conjugate_a=trans == "C",
        unit_diagonal=unit,
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
        return _mH(_lu_solve(lu, pivots, _mH(b), left=True, adjoint=not adjoint))
    n = lu.shape[-1]
    batch = jnp.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    dtype = jnp.result_type(lu.dtype, b.dtype)
    lu = _batch_to(lu, batch).astype(dtype)
    b = _batch_to(b, batch).astype(dtype)
    if n == 0 or b.shape[-1] == 0:
        return b
    perm = _batch_to(_pivots_to_perm(pivots, n), batch, core=1)
    if not adjoint:
        y = _permute_rows(b, perm)
        y = _tri_solve(lu, y, lower=True, unit=True)
        return _tri_solve(lu, y, lower=False)
    y = _tri_solve(lu, b, lower=False, trans="C")
    y = _tri_solve(lu, y, lower=True, unit=True, trans="C")
    return _permute_rows(y, jnp.argsort(perm, axis=-1))


def _det_p(pivots):
    """The determinant of the permutation the pivots make: -1 per row interchange."""
    k = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, k + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1)


def _uses_transpose(a) -> bool:
    """Whether torch factors ``A.mT`` for ``A`` (a contiguous real matrix; lazy tensors are
    contiguous)."""
    return not _is_complex(a)


def _is_vector_rhs(a_shape, b_shape) -> bool:
    """torch's linalg_solve_is_vector_rhs."""
    return len(b_shape) == 1 or (
        len(a_shape) - 1 == len(b_shape) and tuple(b_shape) == tuple(a_shape[:-1])
    )


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
        col = (col_a - jnp.einsum("...ik,...k->...i", low, jnp.conj(row))) / l_jj[..., None]
        col = jnp.where(idx > j, col, jnp.where(idx == j, l_jj[..., None].astype(h.dtype), 0))
        low = lax.dynamic_update_index_in_dim(low, col[..., :, None], j, axis=-1)
        return low, info

    _, info = lax.fori_loop(0, n, step, (jnp.zeros_like(h), jnp.zeros(batch, jnp.int32)))
    return info


def _cholesky(a, upper: bool):
    """(factor, info): the lower (or upper) Cholesky factor from that triangle of ``a``."""
    x = _mH(a) if upper else a
    h = _hermitian_from(x, lower=True)
    batch = a.shape[:-2]
    if a.shape[-1] == 0:
        return a, jnp.zeros(batch, jnp.int32)
    low = jnp.tril(lax_linalg.cholesky(h, symmetrize_input=False))
    failed = jnp.any(jnp.isnan(low))
    info = lax.cond(failed, _cholesky_info, lambda h: jnp.zeros(batch, jnp.int32), h)
    return (_mH(low) if upper else low), info


@register("aten::linalg_cholesky_ex.default")
def _linalg_cholesky_ex(node, a):
    _refuse_check_errors(node, "linalg_cholesky_ex")
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
    eye = _eye_like(n, factor.shape[:-2], factor.dtype)
    if upper:
        inv = _tri_solve(factor, eye, lower=False)  # U^-1
        out = _matmul(inv, _mH(inv))
    else:
        inv = _tri_solve(factor, eye, lower=True)  # L^-1
        out = _matmul(_mH(inv), inv)
    return out.astype(out_dtype(node))


@register("aten::cholesky_solve.default")
def _cholesky_solve(node, b, factor):
    """``A x = b`` with ``A = L L^H`` (or ``U^H U``); batch dims broadcast."""
    upper = node.attrs["upper"]
    if upper:
        y = _tri_solve(factor, b, lower=False, trans="C")
        x = _tri_solve(factor, y, lower=False)
    else:
        y = _tri_solve(factor, b, lower=True)
        x = _tri_solve(factor, y, lower=True, trans="C")
    return x.astype(out_dtype(node))


# -- triangular solves -------------------------------------------------------------------------


@register("aten::linalg_solve_triangular.default")
def _linalg_solve_triangular(node, a, b):
    x = _tri_solve(
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
    x = _tri_solve(
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
    _refuse_check_errors(node, "linalg_lu_factor_ex")
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
    vector = _is_vector_rhs(lu.shape, b.shape)
    b_ = b[..., None] if vector else b
    x = _lu_solve(lu, pivots, b_, left=left, adjoint=False)
    if vector:
        x = x[..., 0]
    return x, lu, pivots, info


@register("aten::_linalg_solve_ex.default")
def _linalg_solve_ex(node, a, b):
    _refuse_check_errors(node, "linalg_solve_ex")
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
    _refuse_check_errors(node, "linalg_inv_ex")
    eye = _eye_like(a.shape[-1], a.shape[:-2], a.dtype)
    x, _, _, info = _solve_ex(a, eye, True)
    return x.astype(out_dtype(node, 0)), info


@register("aten::_linalg_det.default")
def _linalg_det(node, a):
    """(det, LU, pivots): LU of ``A.mT`` for real ``A``, as torch."""
    lu, pivots, _ = _lu_factor(_mT(a) if _uses_transpose(a) else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    det = _det_p(pivots).astype(lu.dtype) * jnp.prod(diag, axis=-1)
    return det.astype(out_dtype(node, 0)), lu.astype(out_dtype(node, 1)), pivots


@register("aten::_linalg_slogdet.default")
def _linalg_slogdet(node, a):
    """(sign, log|det|, LU, pivots), as torch: the sign from the product of the signs of U's
    diagonal (0 for a singular matrix, whose log|det| is -inf)."""
    lu, pivots, _ = _lu_factor(_mT(a) if _uses_transpose(a) else a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    absdiag = jnp.abs(diag)
    if _is_complex(lu):
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
        q = _eye_like(m, a.shape[:-2], a.dtype)[..., :, :k]
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
    return _mT(h).astype(out_dtype(node, 0)), tau.astype(out_dtype(node, 1))


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
    a = _batch_to(a, batch)
    tau = _batch_to(tau, batch, core=1).astype(a.dtype)
    if n == 0:
        return a.astype(out_dtype(node))
    if k == 0:
        return _eye_like(m, batch, a.dtype)[..., :n].astype(out_dtype(node))
    return lax_linalg.householder_product(a, tau).astype(out_dtype(node))


@register("aten::ormqr.default")
def _ormqr(node, a, tau, c):
    """``op(Q) C`` (or ``C op(Q)`` when not ``left``), Q the product of the Householder
    reflectors in ``a`` and ``tau``; op the conjugate transpose when ``transpose``."""
    left, transpose = node.attrs["left"], node.attrs["transpose"]
    batch = jnp.broadcast_shapes(a.shape[:-2], tau.shape[:-1], c.shape[:-2])
    a = _batch_to(a, batch)
    tau = _batch_to(tau, batch, core=1)
    c = _batch_to(c, batch)
    dtype = out_dtype(node)
    if tau.shape[-1] == 0 or c.size == 0:
        return c.astype(dtype)
    # Q (m x m) from the reflectors, padded with identity reflectors (tau 0).
    m, k = a.shape[-2], tau.shape[-1]
    full = jnp.zeros((*batch, m, m), dtype).at[..., :, :k].set(a[..., :, :k].astype(dtype))
    taus = jnp.zeros((*batch, m), dtype).at[..., :k].set(tau.astype(dtype))
    q = lax_linalg.householder_product(full, taus)
    if transpose:
        q = _mH(q)
    return (_matmul(q, c) if left else _matmul(c, q)).astype(dtype)


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
        u = _eye_like(m, batch, out_dtype(node, 0))[..., : out_dims(node, 0)[-1]]
        vh = _eye_like(n, batch, out_dtype(node, 2))[..., : out_dims(node, 2)[-2], :]
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
    h = _hermitian_from(a, lower)
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
        eps = float(jnp.finfo(_real_dtype(a.dtype)).eps)
        default = jnp.asarray(eps * max(m, n), jnp.float64)
        rtol_ = default if atol is None else jnp.where(atol_ > 0, 0.0, default)
    if node.attrs["hermitian"]:
        h = _hermitian_from(a, lower=True)
        vecs, s = lax_linalg.eigh(h, lower=True, symmetrize_input=False)
        top = jnp.max(jnp.abs(s), axis=-1, keepdims=True)
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * top)
        keep = jnp.abs(s).astype(jnp.float64) > tol
        s_inv = jnp.where(keep, 1 / s, 0).astype(a.dtype)
        out = _matmul(vecs * s_inv[..., None, :], _mH(vecs))
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
        top = s[..., :1]
        tol = jnp.maximum(atol_[..., None], rtol_[..., None] * top)
        keep = s.astype(jnp.float64) > tol
        s_inv = jnp.where(keep, 1 / s, 0).astype(a.dtype)
        out = _matmul(_mH(vh) * s_inv[..., None, :], _mH(u))
    return jnp.broadcast_to(out, out_dims(node)).astype(dtype)


@register("aten::trace.default")
def _trace(node, x):
    return jnp.trace(x).astype(out_dtype(node))


# -- LDL (Bunch-Kaufman) -----------------------------------------------------------------------
#
# LAPACK's ?sytf2 / ?hetf2 with UPLO='L' (what torch's ?sytrf / ?hetrf gives), step for step:
# the same pivot choices, the same compact LD (L below the diagonal, the 1x1 and 2x2 blocks of D
# on and under it) and the same 1-based pivots (negative for a 2x2 block). The trailing block is
# kept as a full (Hermitian-)symmetric matrix, updated in its lower triangle and mirrored.

_BK_ALPHA = (1 + np.sqrt(17.0)) / 8


def _ldl_factor_one(a, hermitian: bool):
    n = a.shape[-1]
    dtype = a.dtype
    cplx = _is_complex(a)
    cj = jnp.conj if hermitian else (lambda x: x)
    rdt = _real_dtype(dtype)
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

    w0 = _hermitian_from(a, lower=True) if hermitian else jnp.tril(a) + jnp.tril(a, -1).T
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


def _batched(fn, core_ndims: tuple, *args):
    """``fn`` on one matrix (each argument with ``core_ndims`` dims), vmapped over the leading
    dims of ``args`` (the same batch for all)."""
    batch = args[0].shape[: args[0].ndim - core_ndims[0]]
    if batch == ():
        return fn(*args)
    flat = [x.reshape((-1, *x.shape[x.ndim - c :])) for x, c in zip(args, core_ndims, strict=True)]
    outs = jax.vmap(fn)(*flat)
    if isinstance(outs, tuple):
        return tuple(o.reshape(batch + o.shape[1:]) for o in outs)
    return outs.reshape(batch + outs.shape[1:])


@register("aten::linalg_ldl_factor_ex.default")
def _linalg_ldl_factor_ex(node, a):
    _refuse_check_errors(node, "linalg_ldl_factor_ex")
    hermitian = node.attrs["hermitian"] and _is_complex(a)
    if a.shape[-1] == 0:
        return a.astype(out_dtype(node, 0)), _empty(node, 1), _empty(node, 2)
    ld, ipiv, info = _batched(lambda x: _ldl_factor_one(x, hermitian), (2,), a)
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
    hermitian = node.attrs["hermitian"] and _is_complex(ld)
    batch = jnp.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    dtype = out_dtype(node)
    ld = _batch_to(ld, batch).astype(dtype)
    pivots = _batch_to(pivots, batch, core=1)
    b = _batch_to(b, batch).astype(dtype)
    if ld.shape[-1] == 0 or b.shape[-1] == 0:
        return b
    return _batched(lambda f, p, x: _ldl_solve_one(f, p, x, hermitian), (2, 1, 2), ld, pivots, b)


# -- least squares -----------------------------------------------------------------------------


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

    # Each branch in order; the first whose condition holds is LAPACK's.
    branches = []
    if job == 1:
        s1 = jnp.maximum(absgam, absalp)
        s_ = alpha / safe(s1)
        c_ = gamma / safe(s1)
        tmp = jnp.sqrt(s_ * s_ + c_ * c_)
        zero_case = (
            jnp.where(s1 == 0, 0.0, s1 * tmp),
            jnp.where(s1 == 0, 0.0, s_ / safe(tmp)),
            jnp.where(s1 == 0, 1.0, c_ / safe(tmp)),
        )
        branches.append((sest == 0, zero_case))
        tmp = jnp.maximum(absest, absalp)
        t1, t2 = absest / safe(tmp), absalp / safe(tmp)
        branches.append((absgam <= eps * absest, (tmp * jnp.sqrt(t1 * t1 + t2 * t2), one, 0 * one)))
        le = absgam <= absest
        branches.append(
            (
                absalp <= eps * absest,
                (jnp.where(le, absest, absgam), jnp.where(le, 1.0, 0.0), jnp.where(le, 0.0, 1.0)),
            )
        )
        le = absgam <= absalp
        tmp_a = absgam / safe(absalp)
        sa = jnp.sqrt(1 + tmp_a * tmp_a)
        tmp_b = absalp / safe(absgam)
        cb = jnp.sqrt(1 + tmp_b * tmp_b)
        tiny = (
            jnp.where(le, absalp * sa, absgam * cb),
            jnp.where(le, jnp.sign(alpha) / sa, (alpha / safe(absgam)) / cb),
            jnp.where(le, (gamma / safe(absalp)) / sa, jnp.sign(gamma) / cb),
        )
        branches.append(((absest <= eps * absalp) | (absest <= eps * absgam), tiny))
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
        branches.append((sest == 0, (0 * one, s_ / tmp, c_ / tmp)))
        branches.append((absgam <= eps * absest, (absgam, 0 * one, one)))
        le = absgam <= absest
        branches.append(
            (
                absalp <= eps * absest,
                (jnp.where(le, absgam, absest), jnp.where(le, 0.0, 1.0), jnp.where(le, 1.0, 0.0)),
            )
        )
        le = absgam <= absalp
        tmp_a = absgam / safe(absalp)
        ca = jnp.sqrt(1 + tmp_a * tmp_a)
        tmp_b = absalp / safe(absgam)
        sb = jnp.sqrt(1 + tmp_b * tmp_b)
        tiny = (
            jnp.where(le, absest * (tmp_a / ca), absest / sb),
            jnp.where(le, -(gamma / safe(absalp)) / ca, -jnp.sign(gamma) / sb),
            jnp.where(le, jnp.sign(alpha) / ca, (alpha / safe(absgam)) / sb),
        )
        branches.append(((absest <= eps * absalp) | (absest <= eps * absgam), tiny))
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
    for cond, vals in reversed(branches):
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
    c = jnp.where((rows < rank)[:, None], _matmul(_mH(q), b), 0)  # (Q^H b)[:rank]
    top = jnp.where((rows < rank)[:, None], r, 0)  # [R11 R12] in the first rank rows
    # [R11 R12] = T^H Z^H from the QR of its transpose; the rows past the rank get identity.
    z, t = jnp.linalg.qr(_mH(top), mode="reduced")  # (n, k), (k, k)
    t = t + jnp.diag(jnp.where(rows < rank, 0, 1).astype(t.dtype))
    y = _matmul(z, _tri_solve(t, c, lower=False, trans="C"))  # (n, nrhs), pivoted order
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
    vector = _is_vector_rhs(a.shape, b.shape)
    b_ = b[..., None] if vector else b
    batch = jnp.broadcast_shapes(a.shape[:-2], b_.shape[:-2])
    a_b = _batch_to(a, batch).astype(dtype)
    b_b = _batch_to(b_, batch).astype(dtype)
    k = min(m, n)
    rcond = node.attrs["rcond"]
    real = _real_dtype(dtype)
    if rcond is None:
        rcond = float(jnp.finfo(real).eps) * max(m, n)
    outs = [None, _empty(node, 1), _empty(node, 2), _empty(node, 3)]
    if k == 0:
        x = jnp.zeros((*batch, n, b_.shape[-1]), dtype)
    elif driver == "gels":
        if m >= n:
            q, r = jnp.linalg.qr(a_b, mode="complete")
            qtb = _matmul(_mH(q), b_b)
            x = _tri_solve(r[..., :n, :], qtb[..., :n, :], lower=False)
            if m > n:
                res = jnp.sum(jnp.abs(qtb[..., n:, :]) ** 2, axis=-2)
                outs[1] = res.astype(out_dtype(node, 1))
        else:  # minimum norm: A^H = Q R, x = Q R^-H b
            q, r = jnp.linalg.qr(_mH(a_b), mode="reduced")
            x = _matmul(q, _tri_solve(r, b_b, lower=False, trans="C"))
    elif driver == "gelsy":
        eps = jnp.asarray(float(jnp.finfo(real).eps) / 2, real)  # LAPACK's dlamch('E')
        rc = jnp.asarray(rcond, real)
        x, rank = _batched(lambda p, q: _gelsy_one(p, q, rc, eps), (2, 2), a_b, b_b)
        if a.shape[:-2] != batch:  # the rank is A's own, not broadcast against b
            _, rank = _batched(
                lambda p: _gelsy_one(p, jnp.zeros((m, 1), dtype), rc, eps), (2,), a.astype(dtype)
            )
        outs[2] = rank.astype(out_dtype(node, 2))
    else:
        u, s, vh = jnp.linalg.svd(a_b, full_matrices=False)
        keep = s > rcond * s[..., :1]
        s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(dtype)
        x = _matmul(_mH(vh) * s_inv[..., None, :], _matmul(_mH(u), b_b))
        # rank and singular values are A's own (not broadcast against b)
        s_a = jnp.linalg.svd(a, compute_uv=False) if a.shape[:-2] != batch else s
        outs[2] = jnp.sum(s_a > rcond * s_a[..., :1], axis=-1).astype(out_dtype(node, 2))
        outs[3] = s_a.astype(out_dtype(node, 3))
    outs[0] = (x[..., 0] if vector else x).astype(dtype)
    return tuple(outs)
