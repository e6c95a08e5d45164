"""Special functions on the lazy device against torch eager: values (and gradients) at edge
values, both float dtypes, the non-default arguments OpInfo samples leave out."""

import math

import pytest
import torch

import ir_runtime as irt

S = torch.special
F32, F64 = torch.float32, torch.float64
NAN, INF = math.nan, math.inf
TOL = {F32: (2e-5, 1e-6), F64: (1e-10, 1e-13), torch.float16: (1e-2, 1e-3)}
TOL[torch.bfloat16] = (2e-2, 1e-2)


def lazy(x):
    return irt.to_lazy(x) if isinstance(x, torch.Tensor) else x


def same(got, want, rtol=None, atol=None):
    got = irt.to_torch(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype)
    if not (want.dtype.is_floating_point or want.dtype.is_complex):
        assert torch.equal(got, want), (got, want)
        return
    r, a = TOL[want.dtype]
    torch.testing.assert_close(
        got,
        want,
        rtol=r if rtol is None else rtol,
        atol=a if atol is None else atol,
        equal_nan=True,
    )


def check(fn, *args, rtol=None, atol=None):
    """fn on the lazy device gives eager's values (every output)."""
    want = fn(*args)
    got = fn(*map(lazy, args))
    if isinstance(want, tuple):
        for g, w in zip(got, want, strict=True):
            same(g, w, rtol, atol)
    else:
        same(got, want, rtol, atol)


def check_grad(fn, *args, rtol=1e-4, atol=1e-6):
    """Input gradients (of the floating arguments) equal eager's, for one random cotangent."""
    eager = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = fn(*eager)
    cot = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
    wants = torch.autograd.grad(out, [a for a in eager if a.requires_grad], cot)
    lz = [lazy(a.detach()).requires_grad_(a.is_floating_point()) for a in args]
    outs = fn(*lz)
    gots = torch.autograd.grad(outs, [a for a in lz if a.requires_grad], lazy(cot))
    for g, w in zip(gots, wants, strict=True):
        same(g, w, rtol, atol)


EDGE = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-30, -1e-30, 1e-8, 8.0, -8.0, 8.0001, 10.0,
        20.0, 50.0, 100.0, 700.0, -700.0, 1e10, -1e10, INF, -INF, NAN, -3.5, -4.0, -100.5, 26.5,
        -26.5, 1e-3, 5.0, 5.00001, 4.99999, 2.09, -2.09, 2.0899, 103.9, 8.32, 8.33, 1.99999,
        2.00001, -1.5, -2.5, 9.3, 26.6, -6.2]  # fmt: skip


def grid(dtype):
    g = torch.Generator().manual_seed(0)
    return torch.cat(
        [
            torch.tensor(EDGE, dtype=F64),
            torch.randn(200, generator=g, dtype=F64) * 3,
            torch.randn(60, generator=g, dtype=F64) * 30,
            torch.rand(60, generator=g, dtype=F64),
        ]
    ).to(dtype)


# torch.special's functions of one tensor, tested under their own names.
SPECIAL_UNARY = (
    "erfcx", "log_ndtr", "i0e", "i1", "i1e", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1",
    "modified_bessel_i0", "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
    "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0",
)  # fmt: skip
UNARY = {
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "trigamma": lambda t: torch.polygamma(1, t),
    "polygamma2": lambda t: torch.polygamma(2, t),
    "polygamma3": lambda t: torch.polygamma(3, t),
    "erfc": torch.erfc,
    "i0": torch.i0,
    "signbit": torch.signbit,
    **{name: getattr(S, name) for name in SPECIAL_UNARY},
}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_edges(name, dtype):
    check(UNARY[name], grid(dtype))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_airy_ai(dtype):
    # Beyond x < -100 float32's phase (2/3 |x|^1.5) has no correct digits left.
    x = grid(dtype)
    check(S.airy_ai, x[(x > -100) | x.isnan()], atol=1e-5 if dtype == F32 else None)


def test_ndtri():
    for dtype in (F32, F64):
        p = torch.cat([torch.linspace(0, 1, 301, dtype=dtype), torch.tensor([-0.1, 1.1, NAN,
                       1e-30, 1 - 1e-7, 0.135, 0.8647], dtype=dtype)])  # fmt: skip
        check(S.ndtri, p)


def test_erfcx_where_jax_gives_zero():
    # jax.scipy.special.erfcx is 0 on [26.54, 26.64] (float64) and [9.19, 9.42] (float32).
    check(S.erfcx, torch.linspace(26.5, 26.7, 101, dtype=F64))
    check(S.erfcx, torch.linspace(9.1, 9.5, 101, dtype=F32))
    check(S.log_ndtr, -torch.linspace(9.0, 40.0, 101, dtype=F64) * math.sqrt(2))


def test_digamma_poles_and_signed_zero():
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, -10.0, -INF, INF, NAN, 1e-20, -1e-20], dtype=F64)
    check(torch.digamma, x)
    check(torch.digamma, x.float())
    got = irt.to_torch(torch.digamma(lazy(torch.tensor([0.0, -0.0]))))
    assert got.tolist() == [-INF, INF]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 10, 20])
def test_polygamma_orders(n):
    x = torch.tensor([0.5, 1.0, 2.5, 10.0, 100.0, -0.5, -3.25, -18.5, -27.5, 0.0, -1.0, 1e-3,
                      INF, NAN, -0.49572], dtype=F64)  # fmt: skip
    check(lambda t: torch.polygamma(n, t), x)
    check(lambda t: torch.polygamma(n, t), x.float())


def test_polygamma_overflow_like_torch():
    # float32: n! overflows to inf; inf times a zeta that underflows to 0 is NaN, else inf.
    x = torch.tensor([2.5, 10.0, 0.5], dtype=F32)
    for n in (34, 35, 40, 100):
        check(lambda t, n=n: torch.polygamma(n, t), x)


def test_polygamma_negative_order_refused():
    with pytest.raises(RuntimeError, match="negative n"):
        torch.polygamma(-1, lazy(torch.randn(3)))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_zeta(dtype):
    xs = [1.0, 0.5, 2.0, 3.0, 1.5, 4.0, 10.0, 50.0, INF, NAN, -1.0, 0.0, 1.0000001, 200.0]
    qs = [0.0, -0.0, 1.0, 0.5, 2.0, -1.0, -2.5, -3.0, 1e-3, 5.0, 20.0, INF, -INF, NAN, -100.5,
          1e10, -1e-3, -7.25, 9.0, 8.99]  # fmt: skip
    x, q = torch.meshgrid(torch.tensor(xs, dtype=dtype), torch.tensor(qs, dtype=dtype),
                          indexing="ij")  # fmt: skip
    check(S.zeta, x.reshape(-1), q.reshape(-1))
    check(lambda q: S.zeta(3.0, q), q.reshape(-1))  # the self_scalar overload
    check(lambda x: S.zeta(x, 2.5), x.reshape(-1))  # other_scalar
    g = torch.Generator().manual_seed(1)
    check(S.zeta, torch.rand(200, generator=g).to(dtype) * 10 + 1,
          torch.randn(200, generator=g).to(dtype) * 5)  # fmt: skip


@pytest.mark.parametrize("dtype", [F32, F64])
def test_igamma_igammac(dtype):
    a_values = [0.0, 1.0, 0.5, 2.0, 1e-3, 5.0, 20.5, 25.0, 150.0, 250.0, 1000.0, INF, NAN, -1.0,
                1e-20, 3.0, 199.9, 200.1, 21.0]  # fmt: skip
    x_values = [0.0, 1.0, 0.5, 2.0, 1e-3, 5.0, 20.0, 25.0, 150.0, 260.0, 1000.0, INF, NAN, -1.0,
                1e-20, 0.6, 1.2, 1.05, 0.4, 22.0, 1e5]  # fmt: skip
    a, x = torch.meshgrid(torch.tensor(a_values, dtype=dtype), torch.tensor(x_values, dtype=dtype),
                          indexing="ij")  # fmt: skip
    a, x = a.reshape(-1), x.reshape(-1)
    check(torch.igamma, a, x)
    check(torch.igammac, a, x)
    g = torch.Generator().manual_seed(2)
    a = torch.rand(300, generator=g, dtype=F64) * 300
    x = a * (1 + 0.3 * torch.randn(300, generator=g, dtype=F64)).abs()  # the asymptotic regime
    check(torch.igamma, a.to(dtype), x.to(dtype))
    check(torch.igammac, a.to(dtype), x.to(dtype))


def test_igamma_gradient_wrt_x():
    a = torch.tensor([0.5, 2.0, 30.0, 5.0], dtype=F64)
    x = torch.tensor([0.3, 2.5, 31.0, 1.0], dtype=F64, requires_grad=True)
    want = torch.autograd.grad(torch.igamma(a, x).sum(), x)[0]
    xl = lazy(x.detach()).requires_grad_(True)
    same(torch.autograd.grad(torch.igamma(lazy(a), xl).sum(), xl)[0], want)


# torch.special's <family>_polynomial_<letter>, as "<family>_<letter>".
POLYNOMIALS = {
    f"{family}_{letter}": getattr(S, f"{family}_polynomial_{letter}")
    for family, letters in (
        ("chebyshev", "tuvw"),
        ("shifted_chebyshev", "tuvw"),
        ("hermite", ("h", "he")),
        ("laguerre", "l"),
        ("legendre", "p"),
    )
    for letter in letters
}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(POLYNOMIALS))
def test_polynomials(name, dtype):
    """n broadcasts with x as a tensor: negative, fractional (truncated), NaN/inf (0), large
    (the trigonometric forms, hermite's NaN beyond 128/512), and the special points."""
    fn = POLYNOMIALS[name]
    xs = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.99999, -0.99999, 1.00001, 2.0, -2.0, 3.7, -3.7,
          0.25, 0.75, 1e-3, NAN, INF, -INF, 0.123, -0.987, 10.0]  # fmt: skip
    ns = [-5.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.9, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0,
          15.0, 30.0, 100.0, 129.0, 200.0, 513.0, NAN, INF, -INF, 3e19]  # fmt: skip
    x, n = torch.meshgrid(torch.tensor(xs, dtype=dtype), torch.tensor(ns, dtype=dtype),
                          indexing="ij")  # fmt: skip
    loose = (1e-3, 1e-5) if dtype == F32 else (1e-8, 1e-12)  # long float32 recurrences
    check(fn, x.reshape(-1), n.reshape(-1), rtol=loose[0], atol=loose[1])
    g = torch.Generator().manual_seed(4)
    xr = (torch.rand(200, generator=g, dtype=F64) * 2.2 - 1.1).to(dtype)
    nr = torch.randint(-3, 40, (200,), generator=g).to(dtype)
    check(fn, xr, nr, rtol=loose[0], atol=loose[1])
    check(lambda x: fn(x, 5), xr, rtol=loose[0], atol=loose[1])  # n_scalar
    check(lambda n: fn(0.3, n), nr, rtol=loose[0], atol=loose[1])  # x_scalar
    check(fn, xr.reshape(20, 10), nr[:10], rtol=loose[0], atol=loose[1])  # broadcasting
    check(fn, torch.tensor(0.4, dtype=dtype), torch.tensor(7.0, dtype=dtype))  # 0-d


def test_polynomial_integer_degree_tensor():
    x = torch.linspace(-1.2, 1.2, 25)
    n = torch.arange(25) - 3  # int64 n with a float x: computed in float32
    for fn in POLYNOMIALS.values():
        check(fn, x, n, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_mvlgamma(p):
    # torch computes mvlgamma on the whole line (no domain check): lgamma's values there.
    x = torch.tensor([3.0, 5.5, 2.01, 1.0, 2.0, 0.9, 10.0, 100.0, -0.5, 0.0], dtype=F64)
    check(lambda t: torch.mvlgamma(t, p), x)
    check(lambda t: torch.mvlgamma(t, p), x.float())
    check_grad(lambda t: torch.mvlgamma(t, p), torch.tensor([3.0, 5.5, 2.5, 10.0], dtype=F64))


def test_frexp():
    for dtype in (F32, F64, torch.float16, torch.bfloat16):
        fi = torch.finfo(dtype)
        values = [0.0, -0.0, 1.0, -1.0, 3.5, fi.tiny, fi.tiny / 4, -fi.tiny / 8, fi.max,
                  -fi.max, INF, -INF, NAN, 1e-3, 0.75, -1234.5]  # fmt: skip
        x = torch.tensor(values, dtype=dtype)
        check(torch.frexp, x)
        mantissa, _ = torch.frexp(lazy(x))
        number = ~x.isnan()  # (a NaN's sign is not frexp's business)
        assert torch.equal(torch.signbit(irt.to_torch(mantissa))[number], torch.signbit(x)[number])
    check_grad(lambda t: torch.frexp(t)[0], torch.tensor([3.0, -0.1, 1e5], dtype=F64))


def test_nextafter():
    for dtype in (F32, F64):
        fi = torch.finfo(dtype)
        x = torch.tensor([0.0, -0.0, 1.0, -1.0, 3.5, fi.tiny, fi.tiny / 4, -fi.tiny / 8, fi.max,
                          INF, -INF, NAN, 1.0, 2.0, -fi.tiny / 2**20], dtype=dtype)  # fmt: skip
        y = torch.tensor([1.0, -1.0, 0.0, 0.0, 4.0, 0.0, 1.0, 1.0, INF, 0.0, 0.0, 1.0, 1.0, NAN,
                          0.0], dtype=dtype)  # fmt: skip
        for a, b in ((x, y), (y, x), (x, x)):
            want = torch.nextafter(a, b)
            got = irt.to_torch(torch.nextafter(lazy(a), lazy(b)))
            assert torch.equal(got.isnan(), want.isnan())
            bits = torch.int32 if dtype == F32 else torch.int64
            keep = ~want.isnan()
            assert torch.equal(got[keep].view(bits), want[keep].view(bits)), (got, want)
        one, towards = torch.tensor(1.0, dtype=dtype), torch.tensor([0.0, 2.0], dtype=dtype)
        check(torch.nextafter, one, towards)


def test_signbit_integer_and_bool():
    check(torch.signbit, torch.tensor([-3, 0, 5], dtype=torch.int64))
    check(torch.signbit, torch.tensor([-3, 0, 5], dtype=torch.int32))
    check(torch.signbit, torch.tensor([0, 200], dtype=torch.uint8))
    check(torch.signbit, torch.tensor([True, False]))


def test_fmax_fmin():
    a = torch.tensor([1.0, NAN, NAN, -0.0, 0.0, -INF, 3.0, 2.0])
    b = torch.tensor([NAN, 2.0, NAN, 0.0, -0.0, 1.0, 3.0, 5.0])
    for fn in (torch.fmax, torch.fmin):
        for x, y in ((a, b), (b, a)):
            want = fn(x, y)
            got = irt.to_torch(fn(lazy(x), lazy(y)))
            same(got, want)
            assert torch.equal(torch.signbit(got), torch.signbit(want))
        check(fn, a.double(), torch.tensor(0.5, dtype=F64))  # broadcast, float64
        check(fn, torch.tensor([1, 5, -2]), torch.tensor([3, 2, -2]))  # integers
        check(fn, torch.tensor([1, 5, -2]), torch.tensor([3.5, NAN, -2.0]))  # promoted
        check_grad(fn, torch.tensor([1.0, NAN, 3.0, 2.0], dtype=F64),
                   torch.tensor([NAN, 2.0, 1.0, 2.0], dtype=F64))  # fmt: skip


@pytest.mark.parametrize("dtype", [F32, F64, torch.float16, torch.bfloat16])
def test_round_decimals(dtype):
    x = torch.cat([grid(F64)[:80], torch.tensor([2.675, 0.125, 0.135, -0.5, 1.5, 2.5, 1e6 + 0.5,
                                                 12345.678, -0.0049])]).to(dtype)  # fmt: skip
    for d in (0, 1, 2, 3, 5, -1, -2, -3):
        check(lambda t, d=d: torch.round(t, decimals=d), x, rtol=0, atol=0)
    check_grad(lambda t: torch.round(t, decimals=2), torch.randn(5, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    x = torch.tensor([0.5, 1.0, 2.5, 7.0, -0.5, -2.5, 12.0], dtype=dtype)
    fns = [torch.lgamma, torch.digamma, torch.i0, torch.erfc, S.i0e, S.i1, S.i1e]
    fns += [lambda t: torch.polygamma(2, t), lambda t: torch.mvlgamma(t.abs() + 1, 2)]
    for fn in fns:
        check(fn, x)


def test_integer_inputs_promote():
    x = torch.tensor([1, 2, 5, 10, 3])
    for fn in (torch.lgamma, torch.digamma, torch.erfc, torch.i0, S.i1, S.bessel_j0,
               S.modified_bessel_k0, lambda t: torch.polygamma(1, t), S.spherical_bessel_j0,
               S.airy_ai, S.ndtri, S.erfcx):  # fmt: skip
        check(fn, x)
    check(S.zeta, torch.tensor([2, 3, 4]), torch.tensor([1, 2, 3]))


def test_zero_dim_and_one_element():
    fns = [torch.lgamma, lambda t: torch.polygamma(3, t), S.airy_ai, S.bessel_y1, torch.frexp]
    fns += [lambda t: S.zeta(t + 1, t), lambda t: torch.mvlgamma(t + 2, 3)]
    fns += [lambda t: torch.round(t, decimals=2), lambda t: S.chebyshev_polynomial_u(t, 12)]
    for fn in fns:
        check(fn, torch.tensor(0.7))
        check(fn, torch.tensor([0.7], dtype=F64))
    check(torch.igamma, torch.tensor(2.0), torch.tensor([0.1, 2.0, 30.0]))


GRADIENTS = {
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "polygamma2": lambda t: torch.polygamma(2, t),
    "erfc": torch.erfc,
    "erfcx": S.erfcx,
    "i0": torch.i0,
    "i0e": S.i0e,
    "i1": S.i1,
    "i1e": S.i1e,
    "log_ndtr": S.log_ndtr,
    "sgn": torch.sgn,
    "zeta_q": lambda q: S.zeta(3.0, q),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradients(name):
    x = torch.tensor([0.3, 1.7, 4.5, -0.6, 0.0, 12.0, -7.5], dtype=F64)
    if name in ("zeta_q",):
        x = x.abs() + 0.5
    check_grad(GRADIENTS[name], x)


def test_ndtri_gradient():
    check_grad(S.ndtri, torch.tensor([0.01, 0.3, 0.5, 0.97], dtype=F64))
