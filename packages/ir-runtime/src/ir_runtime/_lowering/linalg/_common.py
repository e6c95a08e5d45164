"""What the family's rules share: transposes and products at full precision, batching (broadcast
or vmapped), empty outputs, refusals, a Hermitian matrix from one triangle, triangular solves,
and torch's test for a vector right-hand side.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.lax import linalg as lax_linalg

from ir_runtime._lowering._registry import out_dims, out_dtype

_PRECISION = lax.Precision.HIGHEST


def mT(x):
    return jnp.swapaxes(x, -1, -2)


def mH(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def matmul(a, b):
    return jnp.matmul(a, b, precision=_PRECISION)


def is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def real_dtype(dtype):
    return jnp.finfo(dtype).dtype


def batch_to(x, batch: tuple, core: int = 2):
    """``x`` broadcast to batch dims ``batch`` (its last ``core`` dims kept)."""
    return jnp.broadcast_to(x, tuple(batch) + tuple(x.shape[x.ndim - core :]))


def _empty(node, k: int):
    """Output ``k`` as torch gives it when it is not computed (shape (0,) and the like)."""
    return jnp.zeros(out_dims(node, k), out_dtype(node, k))


def eye_like(n: int, batch: tuple, dtype):
    return jnp.broadcast_to(jnp.eye(n, dtype=dtype), (*tuple(batch), n, n))


def refuse_check_errors(node, op: str):
    if node.attrs["check_errors"]:
        raise NotImplementedError(
            f"{op}(check_errors=True) would raise on the host when the factorization fails, "
            f"which a lazy program cannot do; call it with check_errors=False and test the "
            f"info output"
        )


def hermitian_from(x, lower: bool):
    """The Hermitian matrix LAPACK reads from one triangle of ``x`` (the diagonal's imaginary
    part ignored), the other triangle not read at all."""
    t = jnp.tril(x, -1) if lower else jnp.triu(x, 1)
    d = jnp.diagonal(x, axis1=-2, axis2=-1)
    if is_complex(x):
        d = jnp.real(d).astype(x.dtype)
    n = x.shape[-1]
    eye = jnp.eye(n, dtype=bool)
    return jnp.where(eye, d[..., None, :], t + mH(t))


def tri_solve(a, b, *, lower: bool, left: bool = True, unit: bool = False, trans: str = "N"):
    """``op(a) x = b`` (left) or ``x op(a) = b`` (right), op in N, T (transpose) or C
    (conjugate transpose); the batch dims of ``a`` and ``b`` broadcast."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = batch_to(a, batch)
    b = batch_to(b, batch)
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


def is_vector_rhs(a_shape, b_shape) -> bool:
    """torch's linalg_solve_is_vector_rhs."""
    return len(b_shape) == 1 or (
        len(a_shape) - 1 == len(b_shape) and tuple(b_shape) == tuple(a_shape[:-1])
    )


def batched(fn, core_ndims: tuple, *args):
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
