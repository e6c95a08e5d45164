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

The family's modules: ``cholesky_lu`` (Cholesky, triangular solves, LU, solve, inverse,
determinants), ``qr_svd`` (QR, Householder products, SVD, eigendecompositions, matrix functions),
``ldl`` (Bunch-Kaufman), ``lstsq`` (least squares); ``_common`` holds their shared helpers.
"""

from ir_runtime._lowering.linalg import (  # noqa: F401  (importing registers the rules)
    cholesky_lu,
    ldl,
    lstsq,
    qr_svd,
)
