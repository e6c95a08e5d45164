"""Complex tensors and FFTs on the lazy device against torch eager: transfers, the views and
conjugation torch implements with bits (view_as_real/complex, real, imag, conj), angle, polar,
complex, the FFT family with its norms and sizes, stft, and gradients through them."""

import math

import pytest
import torch

import ir_runtime as irt
from ir_runtime import DTypeError

C64, C128 = torch.complex64, torch.complex128
REAL = {C64: torch.float32, C128: torch.float64}
TOL = {torch.float32: (1e-5, 1e-5), C64: (1e-5, 1e-5), torch.float64: (1e-10, 1e-12)}
TOL[C128] = TOL[torch.float64]


def lazy(x):
    return irt.to_lazy(x) if isinstance(x, torch.Tensor) else x


def same(got, want):
    got = irt.to_torch(got)
    want = want.resolve_conj().resolve_neg()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype)
    if want.dtype.is_floating_point or want.dtype.is_complex:
        rtol, atol = TOL[want.dtype]
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert torch.equal(got, want)


def check(fn, *args):
    want = fn(*args)
    got = fn(*map(lazy, args))
    if isinstance(want, tuple):
        for g, w in zip(got, want, strict=True):
            same(g, w)
    else:
        same(got, want)


def check_grad(fn, *args):
    """Gradients of a real loss of fn with respect to every argument (complex ones too)."""
    eager = [a.detach().clone().requires_grad_(True) for a in args]
    wants = torch.autograd.grad(fn(*eager), eager)
    lz = [lazy(a.detach()).requires_grad_(True) for a in args]
    gots = torch.autograd.grad(fn(*lz), lz)
    for g, w in zip(gots, wants, strict=True):
        same(g, w)


def cplx(*shape, dtype=C64, seed=0):
    z = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    flat = z.view(-1)
    if flat.numel() >= 4:  # zero, a negative real, a purely imaginary, a negative imaginary
        flat[:4] = torch.tensor([0, -1.5, 2j, -0.5 - 0j], dtype=dtype)
    return z


@pytest.mark.parametrize("dtype", [C64, C128])
def test_transfer_round_trip(dtype):
    z = cplx(3, 5, dtype=dtype)
    lz = irt.to_lazy(z)
    assert lz.dtype == dtype and lz.is_complex()
    assert torch.equal(irt.to_torch(lz), z)
    assert torch.equal(lz.cpu(), z)
    scalar = torch.tensor(1 + 2j, dtype=dtype)  # 0-d
    assert torch.equal(irt.to_torch(irt.to_lazy(scalar)), scalar)


@pytest.mark.parametrize("dtype", [C64, C128])
def test_views_and_conjugation(dtype):
    z = cplx(3, 4, dtype=dtype)
    for fn in (
        torch.view_as_real,
        lambda t: t.real,
        lambda t: t.imag,
        lambda t: t.conj(),
        lambda t: t.conj().imag,  # a negative view in eager
        lambda t: t.conj().real,
        lambda t: torch.conj_physical(t),
        lambda t: t.conj().resolve_conj(),
        lambda t: t.conj().imag.resolve_neg(),
        lambda t: torch._conj(t) * 2,
        lambda t: torch.view_as_complex(torch.view_as_real(t) * 2),
        lambda t: torch.view_as_real(t.conj()[1:, ::2].contiguous()),
        lambda t: t.real + t.imag * 2,
    ):
        check(fn, z)
    check(torch.view_as_complex, torch.randn(3, 4, 2, dtype=REAL[dtype]))
    check(torch.view_as_complex, torch.randn(2, dtype=REAL[dtype]))  # 0-d result
    check(lambda t: t.real, torch.randn(3, dtype=REAL[dtype]))  # real of a real tensor: itself
    check(lambda t: t.conj(), torch.randn(3, dtype=REAL[dtype]))
    # No conjugate bit on the lazy device: the value is already conjugated.
    assert not lazy(z).conj().is_conj()


@pytest.mark.parametrize("dtype", [C64, C128])
def test_elementwise(dtype):
    z, w = cplx(3, 4, dtype=dtype), cplx(3, 4, dtype=dtype, seed=1)
    fns = [torch.abs, torch.angle, torch.sgn, torch.exp, torch.sqrt, torch.neg, torch.isnan]
    fns += [lambda t: t.sum(1), lambda t: t.mean(), lambda t: t * 3, lambda t: t + 1.5]
    fns += [lambda t: t @ t.T, lambda t: t.to(REAL[dtype]), lambda t: torch.cat([t, t])]
    for fn in fns:
        check(fn, z)
    for fn in (torch.mul, torch.add, torch.sub, lambda a, b: a / (b + 3), torch.eq):
        check(fn, z, w)
    check(torch.mul, z, torch.randn(4, dtype=REAL[dtype]))  # real times complex
    check(lambda t: t.to(C128 if dtype == C64 else C64), z)


@pytest.mark.parametrize("dtype", [C64, C128])
def test_complex_python_numbers(dtype):
    z, r = cplx(5, dtype=dtype), torch.randn(5, dtype=REAL[dtype])
    for x in (z, r):  # a real tensor times 1j is complex in its precision
        for fn in (lambda t: t * 1j, lambda t: t + (1 + 2j), lambda t: (1 - 1j) * t,
                   lambda t: t / 2j, lambda t: t.mul(0.5 + 0.25j), lambda t: t - 3j):  # fmt: skip
            check(fn, x)


@pytest.mark.parametrize("dtype", [C64, C128])
def test_gradients_of_angle_polar_sgn(dtype):
    z = cplx(3, 4, dtype=dtype) + 0.25  # (the formulas multiply by 1j)
    a, b = torch.rand(3, 4, dtype=REAL[dtype]) + 0.5, torch.randn(3, 4, dtype=REAL[dtype])
    check_grad(lambda t: torch.angle(t).sum(), z)
    check_grad(lambda t: (torch.sgn(t) * t).real.sum(), z)
    check_grad(lambda x, y: torch.polar(x, y).imag.sum(), a, b)
    check_grad(lambda t: torch.angle(t).sum(), b)  # real input: zero gradient


def test_abs_is_the_modulus():
    # A complex input is not cast to abs's real output dtype first.
    z = torch.tensor([3 + 4j, -1j, 0j, -2 + 0j], dtype=C64)
    assert irt.to_torch(lazy(z).abs()).tolist() == [5.0, 1.0, 0.0, 2.0]


def test_angle_of_real_and_integer():
    x = torch.tensor([-1.0, 0.0, -0.0, 2.0, math.nan, -math.inf, math.inf])
    check(torch.angle, x)
    check(torch.angle, x.double())
    check(torch.angle, torch.tensor([-2, 0, 3]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_complex_and_polar(dtype):
    a, b = torch.randn(3, 4, dtype=dtype), torch.randn(4, dtype=dtype)
    check(torch.complex, a, b)  # broadcasting
    check(torch.polar, a.abs(), b)
    two, angles = torch.tensor(2.0, dtype=dtype), torch.tensor([0.0, math.pi / 2], dtype=dtype)
    check(torch.polar, two, angles)
    check_grad(lambda x, y: torch.complex(x, y).abs().sum(), a, b.expand(3, 4).contiguous())


@pytest.mark.parametrize("dtype", [C64, C128])
def test_fft_c2c(dtype):
    z = cplx(4, 6, 5, dtype=dtype)
    for fn in (
        torch.fft.fft,
        lambda t: torch.fft.fft(t, n=7, dim=1, norm="ortho"),
        lambda t: torch.fft.fft(t, n=3, dim=0, norm="forward"),
        lambda t: torch.fft.ifft(t, norm="backward"),
        lambda t: torch.fft.ifft(t, n=8, norm="ortho"),
        lambda t: torch.fft.fft2(t),
        lambda t: torch.fft.fft2(t, s=(3, 9), dim=(0, 2), norm="forward"),
        lambda t: torch.fft.ifft2(t, norm="ortho"),
        lambda t: torch.fft.fftn(t),
        lambda t: torch.fft.fftn(t, s=(5, 6), dim=(-1, 0)),
        lambda t: torch.fft.ifftn(t, dim=(1,)),
    ):
        check(fn, z)
    check(torch.fft.fft, cplx(9, dtype=dtype))  # 1-D, odd length
    check(torch.fft.fft, torch.tensor([1 + 1j], dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fft_real_input(dtype):
    x = torch.randn(4, 6, 5, dtype=dtype)
    for fn in (
        torch.fft.fft,  # r2c, not onesided
        torch.fft.rfft,
        lambda t: torch.fft.rfft(t, n=8, dim=1, norm="ortho"),
        lambda t: torch.fft.rfft(t, n=3, norm="forward"),
        lambda t: torch.fft.rfft2(t),
        lambda t: torch.fft.rfftn(t, s=(3, 4), dim=(0, 1)),
        lambda t: torch.fft.rfftn(t),
        lambda t: torch.fft.ihfft(t),
        lambda t: torch.fft.ihfft(t, n=7, norm="ortho"),
        lambda t: torch.fft.ihfft2(t),
        lambda t: torch.fft.ihfftn(t, s=(3, 6), dim=(0, 2)),
        lambda t: torch.fft.fftn(t, dim=(0, 2)),
        lambda t: torch.fft.ifft(t),
    ):
        check(fn, x)
    check(torch.fft.rfft, torch.randn(7, dtype=dtype))
    check(torch.fft.rfft, torch.tensor([2.0], dtype=dtype))
    check(torch.fft.fft, torch.tensor([1, 2, 3, 4]))  # integers promote to float


@pytest.mark.parametrize("dtype", [C64, C128])
def test_fft_c2r(dtype):
    z = cplx(4, 6, 5, dtype=dtype)
    for fn in (
        torch.fft.irfft,
        lambda t: torch.fft.irfft(t, n=7),  # odd output length
        lambda t: torch.fft.irfft(t, n=12, dim=1, norm="ortho"),
        lambda t: torch.fft.irfft(t, n=2, norm="forward"),
        lambda t: torch.fft.irfft2(t),
        lambda t: torch.fft.irfftn(t, s=(5, 9), dim=(0, 2)),
        lambda t: torch.fft.irfftn(t, norm="forward"),
        torch.fft.hfft,
        lambda t: torch.fft.hfft(t, n=9, norm="ortho"),
        lambda t: torch.fft.hfft2(t),
        lambda t: torch.fft.hfftn(t, s=(4, 4)),
    ):
        check(fn, z)


@pytest.mark.parametrize("dtype", [C64, C128])
def test_gradients_through_complex(dtype):
    z = cplx(3, 4, dtype=dtype)
    r = torch.randn(3, 8, dtype=REAL[dtype])
    check_grad(lambda t: (t * t.conj()).real.sum(), z)
    check_grad(lambda t: torch.view_as_real(t).pow(2).sum(), z)
    check_grad(lambda t: (t.imag * 3 - t.real).sum(), z)
    check_grad(lambda t: t.abs().sum(), z + 0.1)
    check_grad(lambda t: torch.exp(t).real.sum(), z)
    check_grad(lambda t: torch.fft.fft(t).abs().sum(), z + 0.1)
    check_grad(lambda t: torch.fft.irfft(t, n=6).pow(2).sum(), z)
    check_grad(lambda t: torch.fft.hfft(t).sum(), z)
    check_grad(lambda t: torch.fft.rfft(t, norm="ortho").abs().sum(), r)
    check_grad(lambda t: torch.fft.ihfft(t).imag.sum(), r)
    pairs = torch.view_as_real(z + 0.1).contiguous()
    check_grad(lambda t: torch.view_as_complex(t).abs().sum(), pairs)
    check_grad(lambda t: t.cfloat().real.sum() if dtype == C64 else t.cdouble().imag.sum(), r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stft(dtype):
    x = torch.randn(2, 40, dtype=dtype)
    window = torch.hann_window(8, dtype=dtype)

    def with_window(fn):
        return lambda t: fn(t, lazy(window) if isinstance(t, irt.LazyTensor) else window)

    check(lambda t: torch.stft(t, 8, hop_length=2, return_complex=True), x)
    check(lambda t: torch.stft(t, 8, hop_length=3, center=False, return_complex=True), x)
    check(with_window(lambda t, w: torch.stft(t, 8, hop_length=2, window=w, normalized=True,
                                              onesided=False, return_complex=True)), x)  # fmt: skip
    check(with_window(lambda t, w: torch.istft(torch.stft(t, 8, 2, window=w, return_complex=True),
                                               8, 2, window=w)), x)  # fmt: skip
    check(lambda t: torch.stft(t, 6, return_complex=True), x[0])  # 1-D signal
    check_grad(lambda t: torch.stft(t, 8, hop_length=2, return_complex=True).abs().sum(), x)


def test_complex32_is_refused():
    z = lazy(cplx(3))
    with pytest.raises(DTypeError, match="complex32"):
        z.to(torch.complex32)
    with pytest.raises(DTypeError, match="complex32"):
        torch.view_as_complex(lazy(torch.randn(3, 2).half()))


def test_writing_through_view_as_real_reaches_the_complex_tensor():
    # torch writes into the complex tensor's storage; the lazy device rebinds it the same way.
    want = cplx(3)
    z = lazy(want.clone())
    torch.view_as_real(z).mul_(2)
    torch.view_as_real(want).mul_(2)
    assert torch.equal(irt.to_torch(z), want)
