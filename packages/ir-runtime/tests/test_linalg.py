"""Linear-algebra rules against torch eager on the CPU: the cases torch's OpInfo samples miss
(non-default arguments, batches that broadcast, upper/left/adjoint/transpose flags, rectangular
and singular matrices, the auxiliary outputs torch's kernels return, complex inputs), values
and input gradients both.

Singular vectors and eigenvectors are unique only up to a sign (a phase, complex), which
LAPACK implementations choose differently (torch's MKL and XLA's LAPACK do), so those are
compared through quantities that do not depend on it: projectors, reconstructions, |V|.
"""

import numpy as np
import pytest
import torch
from aten import check as check_node
from aten import record
from eager import lazy
from torch.utils._pytree import tree_flatten

import ir_runtime as irt
from ir_core import Value

aten = torch.ops.aten
F64, F32, C128 = torch.float64, torch.float32, torch.complex128


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def rnd(*shape, dtype=F64, seed=0, grad=True):
    """A leaf of random values (complex: random real and imaginary parts)."""
    g = _gen(seed)
    if dtype.is_complex:
        real = torch.randn(shape, generator=g, dtype=F64)
        imag = torch.randn(shape, generator=g, dtype=F64)
        t = torch.complex(real, imag).to(dtype)
    else:
        t = torch.randn(shape, generator=g, dtype=F64).to(dtype)
    return t.requires_grad_(grad)


def spd(*shape, dtype=F64, seed=0, grad=True):
    """A leaf holding random Hermitian positive-definite matrices."""
    a = rnd(*shape, dtype=dtype, seed=seed, grad=False)
    n = shape[-1]
    out = a @ a.mH + n * torch.eye(n, dtype=dtype)
    return out.detach().requires_grad_(grad)


def well_conditioned(*shape, dtype=F64, seed=0, grad=True):
    """Random square matrices with a strong diagonal (no ties in pivoting, stable solves)."""
    a = rnd(*shape, dtype=dtype, seed=seed, grad=False)
    out = a + 3 * torch.eye(shape[-1], dtype=dtype)
    return out.detach().requires_grad_(grad)


def _host(t):
    return irt.to_torch(t) if isinstance(t, torch.Tensor) else t


def _assert_same(got, want, rtol, atol, what):
    g, _ = tree_flatten(got)
    w, _ = tree_flatten(want)
    assert len(g) == len(w), f"{what}: {len(g)} results, eager gives {len(w)}"
    for k, (a, b) in enumerate(zip(g, w, strict=True)):
        if not isinstance(b, torch.Tensor):
            assert a == b, f"{what} {k}: {a!r}, eager {b!r}"
            continue
        a = _host(a)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (
            f"{what} {k}: {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}"
        )
        torch.testing.assert_close(
            a,
            b.detach(),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            msg=lambda m, k=k: f"{what} {k}: {m}",
        )


def compare(fn, *inputs, rtol=1e-7, atol=1e-9, grads=True):
    """``fn(*inputs)`` on the lazy device against eager: every output (shape, dtype, values);
    then, with ``grads``, the gradients of every input that requires grad for one random
    cotangent per differentiable output (there must be some)."""
    want = fn(*inputs)
    lazy_inputs = [lazy(t) for t in inputs]
    got = fn(*lazy_inputs)
    _assert_same(got, want, rtol, atol, "output")
    if not grads:
        return
    w_out = [o for o in tree_flatten(want)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    g_out = [o for o in tree_flatten(got)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
    w_in = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    g_in = [t for t in lazy_inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    assert w_out and w_in, "nothing to differentiate: the test would check no gradient"
    assert len(g_out) == len(w_out)
    gen = _gen(1234)
    cots = []
    for o in w_out:
        if o.dtype.is_complex:
            c = torch.complex(
                torch.randn(o.shape, generator=gen, dtype=F64),
                torch.randn(o.shape, generator=gen, dtype=F64),
            )
        else:
            c = torch.randn(o.shape, generator=gen, dtype=F64)
        cots.append(c.to(o.dtype))
    grads_e = torch.autograd.grad(w_out, w_in, cots, allow_unused=True)
    grads_l = torch.autograd.grad(g_out, g_in, [irt.to_lazy(c) for c in cots], allow_unused=True)
    for k, (a, b) in enumerate(zip(grads_l, grads_e, strict=True)):
        assert (a is None) == (b is None), f"gradient {k}: {a is None} against eager {b is None}"
        if b is not None:
            _assert_same(a, b, rtol * 10, atol * 10, f"gradient {k}")


def fails_on_lazy(fn, *inputs, match):
    """The lazy device refuses ``fn(*inputs)`` (when recording or when lowering)."""
    with pytest.raises(Exception, match=match):
        out = fn(*[lazy(t) for t in inputs])
        for o in tree_flatten(out)[0]:
            if isinstance(o, torch.Tensor):
                irt.to_torch(o)


# -- Cholesky ----------------------------------------------------------------------------------


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("dtype", [F64, C128])
def test_cholesky_ex_upper_batched(upper, dtype):
    a = spd(2, 3, 4, 4, dtype=dtype)
    compare(lambda a: torch.linalg.cholesky_ex(a, upper=upper), a)


def test_cholesky_reads_one_triangle_float32():
    a = spd(3, 5, 5, dtype=F32, grad=False)
    # garbage in the triangle torch does not read: the factor must not see it
    junk = torch.triu(rnd(3, 5, 5, dtype=F32, seed=5, grad=False), 1) * 100
    x = (a + junk).requires_grad_()
    compare(lambda x: torch.linalg.cholesky_ex(x), x, rtol=1e-5, atol=1e-5)
    y = (a + junk.mT).requires_grad_()
    compare(lambda y: torch.linalg.cholesky_ex(y, upper=True), y, rtol=1e-5, atol=1e-5)


def test_cholesky_info_names_the_first_failing_minor():
    a = spd(4, 5, 5, grad=False).clone()
    a[1, 2, 2] = -50.0  # leading minor of order 3 not positive definite
    a[2, 0, 0] = 0.0  # order 1
    a[3, 4, 4] = float("nan")  # order 5
    _, info = torch.linalg.cholesky_ex(a)
    _, info_l = torch.linalg.cholesky_ex(lazy(a))
    assert info.tolist() == [0, 3, 1, 5]
    _assert_same(info_l, info, 0, 0, "info")


@pytest.mark.parametrize("upper", [False, True])
def test_deprecated_cholesky(upper):
    compare(lambda a: torch.cholesky(a, upper=upper), spd(2, 4, 4))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_inverse(upper):
    factor = torch.linalg.cholesky(spd(2, 4, 4, grad=False), upper=upper)
    junk = (torch.tril if upper else torch.triu)(rnd(2, 4, 4, seed=3, grad=False), 1)
    factor = (factor + junk).requires_grad_()  # the other triangle is not read
    compare(lambda f: torch.cholesky_inverse(f, upper=upper), factor)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_broadcasts(upper):
    factor = torch.linalg.cholesky(spd(2, 1, 4, 4, grad=False), upper=upper).requires_grad_()
    b = rnd(3, 4, 2, seed=1)
    compare(lambda b, f: torch.cholesky_solve(b, f, upper=upper), b, factor)


def test_cholesky_ex_check_errors_is_refused():
    fails_on_lazy(
        lambda a: torch.linalg.cholesky_ex(a, check_errors=True), spd(3, 3), match="check_errors"
    )


# -- triangular solves -------------------------------------------------------------------------


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unitriangular", [False, True])
def test_solve_triangular(upper, left, unitriangular):
    a = well_conditioned(2, 1, 4, 4)
    b = rnd(3, 4, 2, seed=1) if left else rnd(3, 2, 4, seed=1)
    compare(
        lambda a, b: torch.linalg.solve_triangular(
            a, b, upper=upper, left=left, unitriangular=unitriangular
        ),
        a,
        b,
    )


@pytest.mark.parametrize("dtype", [F64, C128])
def test_solve_triangular_complex(dtype):
    compare(
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=True),
        well_conditioned(4, 4, dtype=dtype),
        rnd(4, 3, dtype=dtype, seed=1),
    )


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
def test_triangular_solve(upper, transpose):
    a = well_conditioned(2, 1, 4, 4)
    b = rnd(3, 4, 2, seed=1)
    compare(
        lambda b, a: torch.triangular_solve(b, a, upper=upper, transpose=transpose),
        b,
        a,
    )
    compare(
        lambda b, a: torch.triangular_solve(b, a, upper=upper, unitriangular=True),
        b,
        a,
    )


# -- LU ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 5, 5), (2, 6, 4), (3, 4, 6)])
def test_lu_factor_ex_pivots_and_info(shape):
    a = rnd(*shape)
    compare(lambda a: torch.linalg.lu_factor_ex(a), a)


def test_lu_factor_ex_info_of_singular_matrices():
    a = rnd(3, 4, 4, grad=False).clone()
    a[1, :, 2] = 0  # third column zero: U[2, 2] exactly zero
    a[2] = 0
    compare(lambda a: torch.linalg.lu_factor_ex(a), a, grads=False)
    assert torch.linalg.lu_factor_ex(a).info.tolist() == [0, 3, 1]


@pytest.mark.parametrize("shape", [(5, 5), (2, 6, 4), (2, 4, 6)])
def test_lu_plu(shape):
    compare(lambda a: torch.linalg.lu(a), rnd(*shape))


@pytest.mark.parametrize("unpack_data", [True, False])
@pytest.mark.parametrize("unpack_pivots", [True, False])
@pytest.mark.parametrize("shape", [(2, 5, 3), (3, 5)])
def test_lu_unpack_flags(unpack_data, unpack_pivots, shape):
    lu, pivots = torch.linalg.lu_factor(rnd(*shape, grad=False))
    lu.requires_grad_()
    compare(
        lambda lu, p: torch.lu_unpack(lu, p, unpack_data=unpack_data, unpack_pivots=unpack_pivots),
        lu,
        pivots,
        grads=unpack_data,  # without data the outputs do not depend on LU
    )


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("dtype", [F64, C128])
def test_lu_solve_flags_and_broadcasting(left, adjoint, dtype):
    lu, pivots = torch.linalg.lu_factor(rnd(2, 1, 4, 4, dtype=dtype, grad=False))
    lu.requires_grad_()
    b = rnd(3, 4, 2, dtype=dtype, seed=1) if left else rnd(3, 2, 4, dtype=dtype, seed=1)
    compare(
        lambda lu, p, b: torch.linalg.lu_solve(lu, p, b, left=left, adjoint=adjoint),
        lu,
        pivots,
        b,
    )


def test_deprecated_lu_and_lu_solve():
    a = rnd(2, 4, 4)
    compare(lambda a: torch.linalg.lu_factor_ex(a)[:2], a)
    lu, pivots = torch.linalg.lu_factor(a.detach())
    compare(lambda b, lu, p: torch.lu_solve(b, lu, p), rnd(2, 4, 3, seed=1), lu, pivots)


def test_lu_without_pivoting_is_refused():
    fails_on_lazy(lambda a: torch.linalg.lu_factor_ex(a, pivot=False), rnd(3, 3), match="pivot")
    fails_on_lazy(lambda a: torch.linalg.lu(a, pivot=False), rnd(3, 3), match="pivot")


# -- solve, inverse, determinants --------------------------------------------------------------


@pytest.mark.parametrize("left", [True, False])
def test_solve_ex_matrix_rhs_broadcasting(left):
    a = well_conditioned(2, 1, 4, 4)
    b = rnd(3, 4, 2, seed=1) if left else rnd(3, 2, 4, seed=1)
    compare(lambda a, b: torch.linalg.solve_ex(a, b, left=left), a, b)


@pytest.mark.parametrize("b_shape", [(4,), (2, 4)])
def test_solve_ex_vector_rhs(b_shape):
    compare(lambda a, b: torch.linalg.solve_ex(a, b), well_conditioned(2, 4, 4), rnd(*b_shape))


def test_solve_ex_auxiliary_outputs_and_info():
    a = well_conditioned(3, 4, 4, grad=False).clone()
    a[2, 1] = 0  # a zero row: singular, info > 0
    b = rnd(3, 4, 2, seed=1, grad=False)
    compare(lambda a, b: aten._linalg_solve_ex(a, b)[1:], a, b, grads=False)
    compare(lambda a, b: aten._linalg_solve_ex(a, b, left=False)[1:], a, b.mT, grads=False)


@pytest.mark.parametrize("dtype", [F64, C128])
def test_solve_ex_complex(dtype):
    compare(
        lambda a, b: torch.linalg.solve_ex(a, b),
        well_conditioned(2, 3, 3, dtype=dtype),
        rnd(2, 3, 2, dtype=dtype, seed=1),
    )


def test_inv_ex_batched_and_info():
    compare(lambda a: torch.linalg.inv_ex(a), well_conditioned(2, 3, 4, 4))
    a = well_conditioned(2, 4, 4, grad=False).clone()
    a[1, :, 3] = 0
    got = torch.linalg.inv_ex(lazy(a)).info
    _assert_same(got, torch.linalg.inv_ex(a).info, 0, 0, "info")


def test_inv_ex_float32():
    compare(
        lambda a: torch.linalg.inv_ex(a), well_conditioned(3, 5, 5, dtype=F32), rtol=1e-5, atol=1e-6
    )


def test_det_and_its_lu_of_the_transpose():
    a = rnd(2, 3, 5, 5)
    compare(lambda a: aten._linalg_det(a), a)  # (det, LU of A.mT, pivots), as torch gives
    compare(lambda a: torch.linalg.det(a), a)


def test_det_of_singular_matrices_and_its_gradient():
    a = rnd(3, 4, 4, grad=False).clone()
    a[0, 2] = 0  # a zero row: exact zero pivot
    a[1, :, 1] = a[1, :, 0]  # two equal columns
    compare(lambda a: torch.linalg.det(a), a.requires_grad_(), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", [F64, C128])
def test_slogdet_signs_and_auxiliary_outputs(dtype):
    a = rnd(4, 4, 4, dtype=dtype, grad=False).clone()
    a[0] = -a[0]
    a = a.requires_grad_()
    # complex: the backward multiplies by the Python scalar 1j, which the front end cannot
    # record yet (a complex attribute)
    grads = not dtype.is_complex
    compare(lambda a: aten._linalg_slogdet(a), a, grads=grads)
    compare(lambda a: torch.linalg.slogdet(a), a, grads=grads)
    compare(lambda a: torch.logdet(a @ a.mH), a, grads=grads)


def test_slogdet_of_a_singular_matrix():
    a = rnd(2, 3, 3, grad=False).clone()
    a[1, 0] = 0
    compare(lambda a: torch.linalg.slogdet(a), a, grads=False)  # sign 0, log|det| -inf


# -- QR, Householder products ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["reduced", "complete"])
@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 4, 6), (5, 5)])
def test_qr_modes(mode, shape):
    if mode == "complete" and shape[-2] > shape[-1]:
        # torch's backward of a complete QR of a tall matrix is not implemented
        compare(lambda a: torch.linalg.qr(a, mode=mode), rnd(*shape), grads=False)
        return
    compare(lambda a: torch.linalg.qr(a, mode=mode), rnd(*shape))


def test_qr_mode_r():
    # no gradient: torch's backward needs Q, which mode='r' does not compute
    compare(lambda a: torch.linalg.qr(a, mode="r"), rnd(2, 6, 4), grads=False)


def test_geqrf_rule_as_the_front_end_records_it():
    # torch has no meta kernel for geqrf, so the front end cannot record it yet: the rule alone
    check_node("geqrf", rnd(6, 4, grad=False), rtol=1e-10, atol=1e-12)
    check_node("geqrf", rnd(2, 4, 6, grad=False), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape,k", [((6, 4), 4), ((2, 6, 4), 2), ((5, 5), 3)])
def test_householder_product(shape, k):
    a, tau = torch.geqrf(rnd(*shape, grad=False))
    a.requires_grad_()
    tau = tau[..., :k].detach().requires_grad_()
    compare(lambda a, t: torch.linalg.householder_product(a, t), a, tau)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
def test_ormqr(left, transpose):
    a, tau = torch.geqrf(rnd(2, 5, 3, grad=False))
    a.requires_grad_()
    tau.requires_grad_()
    c = rnd(2, 5, 2, seed=1) if left else rnd(2, 2, 5, seed=1)
    compare(lambda a, t, c: torch.ormqr(a, t, c, left=left, transpose=transpose), a, tau, c)


# -- SVD, eigendecompositions ------------------------------------------------------------------


def _svd_invariants(full_matrices):
    def fn(a):
        u, s, vh = torch.linalg.svd(a, full_matrices=full_matrices)
        k = s.shape[-1]
        uk, vk = u[..., :k], vh[..., :k, :]
        # S; U S Vh; the projectors onto the singular subspaces (each vector's sign cancels)
        return s, (uk * s[..., None, :]) @ vk, uk @ uk.mH, vk.mH @ vk, u @ u.mH

    return fn


@pytest.mark.parametrize("full_matrices", [False, True])
@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 4, 6)])
@pytest.mark.parametrize("dtype", [F64, C128])
def test_svd_up_to_signs(full_matrices, shape, dtype):
    a = rnd(*shape, dtype=dtype)
    grads = not full_matrices  # torch's backward needs full_matrices=False
    compare(_svd_invariants(full_matrices), a, grads=grads)


def test_svd_vectors_agree_up_to_sign():
    a = rnd(3, 7, 5, grad=False)
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    u_l, s_l, vh_l = (irt.to_torch(t) for t in torch.linalg.svd(lazy(a), full_matrices=False))
    torch.testing.assert_close(s_l, s)
    signs = torch.sign(torch.sum(u_l * u, dim=-2, keepdim=True))
    assert bool((signs.abs() == 1).all())
    torch.testing.assert_close(u_l * signs, u)
    torch.testing.assert_close(vh_l * signs.mT, vh)


def test_svdvals_and_norms():
    a = rnd(2, 5, 3)
    compare(lambda a: torch.linalg.svdvals(a), a)
    compare(lambda a: torch.linalg.matrix_norm(a, ord="nuc"), a)
    compare(lambda a: torch.linalg.matrix_norm(a, ord=2), a)
    compare(lambda a: torch.linalg.cond(a[..., :3, :]), a)


def test_svd_driver_is_refused():
    # torch raises too on the CPU (the drivers are cuSOLVER's)
    fails_on_lazy(lambda a: aten._linalg_svd(a, driver="gesvd"), rnd(3, 3), match="driver")


def _eigh_invariants(uplo):
    def fn(a):
        w, v = torch.linalg.eigh(a, UPLO=uplo)
        # eigenvalues, and V f(W) V^H for an f that separates them (signs cancel)
        return w, (v * torch.exp(w / 4)[..., None, :]) @ v.mH

    return fn


@pytest.mark.parametrize("uplo", ["L", "U"])
@pytest.mark.parametrize("dtype", [F64, C128])
def test_eigh_reads_one_triangle(uplo, dtype):
    # not Hermitian: torch reads only the UPLO triangle, and so must the rule
    compare(_eigh_invariants(uplo), rnd(2, 5, 5, dtype=dtype))


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigvalsh(uplo):
    compare(lambda a: torch.linalg.eigvalsh(a, UPLO=uplo), rnd(3, 4, 4))


def test_eig_invariants():
    a = rnd(2, 4, 4)

    def fn(a):
        w, v = torch.linalg.eig(a)
        # V's columns have unit norm and a free phase: |V| does not depend on it
        return w, v.abs()

    compare(fn, a)
    compare(lambda a: torch.linalg.eigvals(a), a)
    # eigvals of a lazy tensor records linalg_eig (a tensor subclass may need gradients);
    # _linalg_eigvals, its no-gradient form, directly (it has no derivative)
    compare(lambda a: aten._linalg_eigvals(a), a.detach(), grads=False)


def test_eig_reconstructs_its_matrix():
    a = rnd(3, 5, 5, grad=False)
    w, v = (irt.to_torch(t) for t in torch.linalg.eig(lazy(a)))
    torch.testing.assert_close(w, torch.linalg.eigvals(a))
    back = v @ torch.diag_embed(w) @ torch.linalg.inv(v)
    torch.testing.assert_close(back, a.to(back.dtype))


# -- matrix functions, pseudo-inverse, LDL, trace ----------------------------------------------


def test_matrix_exp_batched():
    compare(lambda a: torch.linalg.matrix_exp(a), rnd(2, 3, 4, 4), rtol=1e-9, atol=1e-10)
    compare(lambda a: torch.linalg.matrix_exp(a), rnd(5, 5, dtype=F32) / 2, rtol=1e-4, atol=1e-5)


def _with_singular_values(s, m, n, seed):
    """Random m x n matrices, one per row of ``s``, with those singular values."""
    u = torch.linalg.qr(rnd(s.shape[0], m, m, seed=seed, grad=False))[0][..., :, : s.shape[1]]
    v = torch.linalg.qr(rnd(s.shape[0], n, n, seed=seed + 1, grad=False))[0][..., :, : s.shape[1]]
    return ((u * s[:, None, :]) @ v.mT).requires_grad_()


def test_pinv_tolerances_drop_singular_values():
    s = torch.tensor([[3.0, 1.0, 0.2], [2.0, 0.6, 0.3]], dtype=F64)
    a = _with_singular_values(s, 5, 3, seed=2)
    compare(lambda a: torch.linalg.pinv(a), a)
    atol = torch.tensor(0.5, dtype=F64)  # drops 0.2 and 0.3
    compare(lambda a: torch.linalg.pinv(a, atol=atol), a, grads=False)
    rtol = torch.tensor([0.5, 0.2], dtype=F64)  # one per matrix: drops 1 and 0.2; 0.3
    compare(lambda a: torch.linalg.pinv(a, rtol=rtol), a, grads=False)
    compare(lambda a: torch.linalg.pinv(a, atol=0.25, rtol=0.25), a, grads=False)
    h = (a.detach() @ a.detach().mT).requires_grad_()  # Hermitian, rank 3 of 5
    compare(lambda h: torch.linalg.pinv(h, hermitian=True, atol=0.5), h, grads=False)


def test_pinv_hermitian_and_rank_deficient():
    b = rnd(2, 5, 2, grad=False)
    low_rank = (b @ b.mT).requires_grad_()  # rank 2 of 5
    compare(lambda a: torch.linalg.pinv(a, hermitian=True), low_rank)
    compare(lambda a: torch.linalg.pinv(a), low_rank, rtol=1e-6, atol=1e-8)


def _symmetric(n, dtype, seed, hermitian=True, batch=(3,)):
    a = rnd(*batch, n, n, dtype=dtype, seed=seed, grad=False)
    return a + (a.mH if hermitian else a.mT)


@pytest.mark.parametrize("n", [1, 5, 12])
def test_ldl_factor_and_solve(n):
    # no gradients: torch implements none for the LDL ops
    a = _symmetric(n, F64, seed=n, hermitian=False)
    compare(lambda a: torch.linalg.ldl_factor_ex(a), a, grads=False)
    ld, pivots = torch.linalg.ldl_factor(a)
    b = rnd(3, n, 2, seed=1, grad=False)
    compare(lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b), ld, pivots, b, grads=False)


def test_ldl_two_by_two_pivots_and_singular_matrices():
    a = _symmetric(6, F64, seed=3, hermitian=False).clone()
    a[:, range(6), range(6)] = 1e-3  # tiny diagonal: Bunch-Kaufman takes 2x2 blocks
    ld, pivots, _ = torch.linalg.ldl_factor_ex(a)
    assert bool((pivots < 0).any())
    compare(lambda a: torch.linalg.ldl_factor_ex(a), a, grads=False)
    compare(lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b), ld, pivots, rnd(6, 3), grads=False)
    z = torch.zeros(2, 3, 3, dtype=F64)
    z[1] = _symmetric(3, F64, seed=4, batch=())
    compare(lambda a: torch.linalg.ldl_factor_ex(a), z, grads=False)  # info 1 for the zero one


@pytest.mark.parametrize("hermitian", [False, True])
def test_ldl_complex(hermitian):
    a = _symmetric(7, C128, seed=7, hermitian=hermitian)
    compare(lambda a: torch.linalg.ldl_factor_ex(a, hermitian=hermitian), a, grads=False)
    ld, pivots = torch.linalg.ldl_factor(a, hermitian=hermitian)
    b = rnd(3, 7, 2, dtype=C128, seed=1, grad=False)
    compare(
        lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b, hermitian=hermitian),
        ld,
        pivots,
        b,
        grads=False,
    )


def test_ldl_float32_blocked_size():
    a = _symmetric(70, F32, seed=9, hermitian=False, batch=(2,))
    compare(lambda a: torch.linalg.ldl_factor_ex(a), a, grads=False, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3)])
def test_trace(shape):
    compare(lambda a: torch.trace(a), rnd(*shape))
    compare(lambda a: torch.trace(a), torch.arange(15).reshape(3, 5), grads=False)  # int64


# -- least squares (no meta kernel in torch yet: the rule as the front end would record it) ------


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss", None])
@pytest.mark.parametrize("shape", [(2, 5, 3), (2, 3, 3), (2, 3, 5)])
def test_lstsq_rule_drivers(driver, shape):
    m, n = shape[-2:]
    if driver in ("gelsd", "gelss") and m > n:
        return  # refused: see test_lstsq_refusals
    a = rnd(*shape, grad=False)
    b = rnd(2, m, 2, seed=1, grad=False)
    check_node("linalg_lstsq", a, b, driver=driver, rtol=1e-9, atol=1e-10)
    check_node("linalg_lstsq", a, b[..., 0], driver=driver, rtol=1e-9, atol=1e-10)  # vector
    b3 = rnd(3, m, 2, seed=2, grad=False)
    check_node("linalg_lstsq", a[:1], b3, driver=driver, rtol=1e-9, atol=1e-10)  # broadcast
    if driver == "gelsd" or driver is None:
        check_node("linalg_lstsq", a.float(), b.float(), driver=driver, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
def test_lstsq_rule_rank_deficient(driver):
    a = rnd(3, 4, 6, grad=False).clone()
    a[..., 5] = a[..., 1]  # a repeated column (rank 4 still)
    a[1, 3] = a[1, 0] + a[1, 2]  # a dependent row: rank 3
    b = rnd(3, 4, 2, seed=1, grad=False)
    if driver == "gelsy":
        # Two equal columns tie in the pivoted QR: torch's LAPACK (MKL) breaks the tie per CPU
        # and has answered a full-rank batch with another, larger solution on one machine. The
        # oracle is the truncated minimum-norm solution itself (numpy's pinv) and the rank.
        node, _ = record("linalg_lstsq", (a, b), {"driver": driver})
        x, _, rank, _ = irt.execute([Value(node, k) for k in range(4)])
        np.testing.assert_allclose(
            irt.to_host(x), np.linalg.pinv(a.numpy(), rcond=1e-10) @ b.numpy(), rtol=1e-8, atol=1e-9
        )
        np.testing.assert_array_equal(irt.to_host(rank), np.linalg.matrix_rank(a.numpy()))
        assert irt.to_host(rank).tolist() == [4, 3, 4]
    else:
        check_node("linalg_lstsq", a, b, driver=driver, rtol=1e-8, atol=1e-9)
    if driver != "gelsy":  # torch's gelsy pivots at random when it truncates: no oracle
        s = torch.tensor([[3.0, 1.0, 0.01]] * 2, dtype=F64)
        c = _with_singular_values(s, 3, 5, seed=4).detach()
        check_node("linalg_lstsq", c, b[:2, :3], 0.1, driver=driver, rtol=1e-8, atol=1e-9)


def test_lstsq_rule_complex():
    a = rnd(2, 5, 3, dtype=C128, grad=False)
    b = rnd(2, 5, 2, dtype=C128, seed=1, grad=False)
    check_node("linalg_lstsq", a, b, driver="gels", rtol=1e-9, atol=1e-10)
    check_node("linalg_lstsq", a.mH, b[:, :3], driver="gelsd", rtol=1e-9, atol=1e-10)


def test_lstsq_refusals():
    a, b = rnd(5, 3, grad=False), rnd(5, 2, seed=1, grad=False)
    with pytest.raises(Exception, match="residuals"):
        check_node("linalg_lstsq", a, b, driver="gelsd")
    with pytest.raises(Exception, match="complex"):
        check_node("linalg_lstsq", a.to(C128), b.to(C128), driver="gelsy")
