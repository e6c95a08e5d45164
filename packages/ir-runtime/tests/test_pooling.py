"""Pooling on the lazy device against torch eager: values, indices (exactly) and input gradients,
for the options OpInfo's samples miss: ceil_mode (and its rule that the last window starts
inside the input or its left padding), dilation, padding, count_include_pad, divisor_override,
1-d/2-d/3-d with and without a batch dim, adaptive windows that do not divide the input,
fractional pooling given its random samples, NaN, -inf, ties, dtypes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from aten import check
from eager import compare

import ir_runtime as irt

aten = torch.ops.aten


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def ties(*shape, seed=0):
    """Small integers as floats: many equal maxima in each window (the first one wins)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g).float()


# -- max pooling ---------------------------------------------------------------------------------

# (spatial input, kernel, stride, padding, dilation, ceil_mode)
MAX_1D = [
    ((9,), 3, None, 0, 1, False),
    ((9,), 3, 2, 1, 1, True),
    ((5,), 2, 2, 1, 1, True),  # ceil would add a window starting in the right padding: dropped
    ((10,), 3, 2, 1, 2, True),
    ((8,), 4, 3, 2, 1, True),
    ((7,), 2, 3, 0, 3, True),
]
MAX_2D = [
    ((6, 7), (3, 2), (2, 1), (1, 0), (1, 1), False),
    ((6, 7), 3, 2, 1, 1, True),
    ((7, 6), (3, 3), (2, 2), (1, 1), (2, 1), True),
    ((5, 5), 2, 2, 1, 1, True),
    ((9, 8), (2, 3), (3, 2), (1, 1), (2, 3), True),
    ((4, 4), 4, 1, 2, 1, False),
]
MAX_3D = [
    ((4, 5, 6), 2, 2, 1, 1, True),
    ((5, 4, 6), (3, 2, 2), (2, 1, 2), (1, 0, 1), (1, 2, 1), True),
    ((4, 4, 4), 3, 1, 1, 2, False),
]


def _max_cases():
    for fn, cases in ((F.max_pool1d, MAX_1D), (F.max_pool2d, MAX_2D), (F.max_pool3d, MAX_3D)):
        for case in cases:
            for batch in ((2, 3), (3,)):
                yield pytest.param(fn, batch, case, id=f"{fn.__name__}-{len(batch)}-{case}")


@pytest.mark.parametrize("fn, batch, case", list(_max_cases()))
def test_max_pool(fn, batch, case):
    spatial, k, s, p, d, ceil_mode = case
    kw = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil_mode)
    compare(fn, rnd(*batch, *spatial), return_indices=True, **kw)
    compare(fn, ties(*batch, *spatial), return_indices=True, **kw)
    compare(fn, rnd(*batch, *spatial, seed=1), **kw)


def test_max_pool_nan_inf():
    x = rnd(2, 3, 6, 7)
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 1, 2] = float("nan")  # two NaNs in a window: torch takes the last
    x[1, 2, :3, :3] = -float("inf")  # a window of -inf: its first element
    x[1, 1] = -float("inf")
    x[0, 1, 0, :] = float("inf")
    for kw in (
        dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
        dict(kernel_size=2, stride=1, dilation=2),
    ):
        compare(F.max_pool2d, x, return_indices=True, grad=False, **kw)
    compare(F.adaptive_max_pool2d, x, output_size=(4, 3), return_indices=True, grad=False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_max_pool_float_dtypes(dtype):
    tol = dict(rtol=1e-2, atol=1e-2) if dtype != torch.float64 else {}
    x = rnd(2, 3, 7, 6, dtype=dtype)
    compare(
        F.max_pool2d,
        x,
        kernel_size=3,
        stride=2,
        padding=1,
        ceil_mode=True,
        return_indices=True,
        **tol,
    )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_max_pool_integers(dtype):
    low = 0 if dtype == torch.uint8 else -100
    x = torch.randint(low, 100, (2, 3, 7, 6), generator=torch.Generator().manual_seed(0))
    compare(
        F.max_pool2d,
        x.to(dtype),
        kernel_size=3,
        stride=2,
        padding=1,
        ceil_mode=True,
        return_indices=True,
    )
    compare(F.max_pool3d, x.to(dtype)[None], kernel_size=(1, 2, 2), return_indices=True)


def test_max_pool_backward_op_directly():
    """The backward op recorded on its own: overlapping windows add their gradients."""
    x = rnd(2, 3, 6, 7)
    out, idx = aten.max_pool2d_with_indices(x, [3, 3], [1, 2], [1, 1], [1, 1], True)
    check(
        "max_pool2d_with_indices_backward",
        rnd(*out.shape, seed=3),
        x,
        [3, 3],
        [1, 2],
        [1, 1],
        [1, 1],
        True,
        idx,
    )
    x3 = rnd(3, 4, 5, 6)  # no batch dim
    out, idx = aten.max_pool3d_with_indices(x3, [2, 2, 2], [1, 1, 1], [1, 0, 1], [1, 1, 1], True)
    check(
        "max_pool3d_with_indices_backward",
        rnd(*out.shape, seed=4),
        x3,
        [2, 2, 2],
        [1, 1, 1],
        [1, 0, 1],
        [1, 1, 1],
        True,
        idx,
    )


def test_max_unpool_round_trip():
    x = rnd(2, 3, 8, 7)

    def pool_unpool(v):
        out, idx = F.max_pool2d(v, 2, stride=2, return_indices=True, ceil_mode=True)
        return F.max_unpool2d(out, idx, 2, stride=2, output_size=v.shape[-2:])

    compare(pool_unpool, x)

    def pool_unpool_1d(v):
        out, idx = F.max_pool1d(v, 3, stride=2, padding=1, return_indices=True)
        return F.max_unpool1d(out, idx, 3, stride=2, padding=1, output_size=v.shape[-1:])

    compare(pool_unpool_1d, rnd(2, 3, 9))


# -- average pooling ---------------------------------------------------------------------------

# (spatial input, kernel, stride, padding, ceil_mode)
AVG_1D = [
    ((9,), 3, None, 0, False),
    ((9,), 3, 2, 1, True),
    ((5,), 2, 2, 1, True),
    ((8,), 4, 3, 2, True),
    ((9,), 7, 3, 3, True),
]
AVG_2D = [
    ((6, 7), (3, 2), (2, 1), (1, 0), False),
    ((6, 7), 3, 2, 1, True),
    ((5, 5), 2, 2, 1, True),
    ((9, 8), (4, 3), (3, 2), (2, 1), True),
]
AVG_3D = [
    ((4, 5, 6), 2, 2, 1, True),
    ((5, 4, 6), (3, 2, 2), (2, 1, 2), (1, 0, 1), True),
    ((6, 5, 6), (4, 5, 6), (2, 3, 2), 2, True),
]


def _avg_cases():
    for fn, cases in ((F.avg_pool1d, AVG_1D), (F.avg_pool2d, AVG_2D), (F.avg_pool3d, AVG_3D)):
        for case in cases:
            for batch in ((2, 3), (3,)):
                for include in (True, False):
                    yield pytest.param(
                        fn, batch, case, include, id=f"{fn.__name__}-{len(batch)}-{case}-{include}"
                    )


@pytest.mark.parametrize("fn, batch, case, count_include_pad", list(_avg_cases()))
def test_avg_pool(fn, batch, case, count_include_pad):
    spatial, k, s, p, ceil_mode = case
    kw = dict(
        kernel_size=k, stride=s, padding=p, ceil_mode=ceil_mode, count_include_pad=count_include_pad
    )
    compare(fn, rnd(*batch, *spatial), **kw)
    if fn is not F.avg_pool1d:  # avg_pool1d has no divisor_override
        for divisor in (3, -2):
            compare(fn, rnd(*batch, *spatial, seed=2), divisor_override=divisor, **kw)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_avg_pool_float_dtypes(dtype):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float64 else dict(rtol=1e-7, atol=1e-7)
    x = rnd(2, 3, 7, 6, dtype=dtype)
    for kw in (dict(count_include_pad=False), dict(divisor_override=5)):
        compare(F.avg_pool2d, x, kernel_size=3, stride=2, padding=1, ceil_mode=True, **tol, **kw)


def test_avg_pool_int64_truncates():
    """Integer average pooling divides as C++ does: toward zero."""
    x = torch.randint(-50, 50, (2, 3, 7, 6), generator=torch.Generator().manual_seed(0))
    for kw in (
        dict(count_include_pad=True),
        dict(count_include_pad=False),
        dict(divisor_override=-3),
        dict(divisor_override=4),
    ):
        compare(F.avg_pool2d, x, kernel_size=3, stride=2, padding=1, ceil_mode=True, **kw)
    compare(
        F.avg_pool3d,
        x[None],
        kernel_size=(1, 2, 3),
        stride=(1, 2, 2),
        padding=(0, 1, 1),
        ceil_mode=True,
        count_include_pad=False,
    )


# -- adaptive pooling ---------------------------------------------------------------------------

ADAPTIVE = [
    (F.adaptive_avg_pool1d, F.adaptive_max_pool1d, (7,), 3),
    (F.adaptive_avg_pool1d, F.adaptive_max_pool1d, (3,), 5),  # larger than the input
    (F.adaptive_avg_pool2d, F.adaptive_max_pool2d, (7, 10), (3, 4)),
    (F.adaptive_avg_pool2d, F.adaptive_max_pool2d, (5, 3), (4, 5)),
    (F.adaptive_avg_pool2d, F.adaptive_max_pool2d, (8, 9), (1, 1)),
    (F.adaptive_avg_pool2d, F.adaptive_max_pool2d, (8, 9), (None, 2)),
    (F.adaptive_avg_pool3d, F.adaptive_max_pool3d, (5, 7, 6), (2, 3, 4)),
    (F.adaptive_avg_pool3d, F.adaptive_max_pool3d, (3, 4, 5), (4, 3, 7)),
]


@pytest.mark.parametrize("batch", [(2, 3), (3,)], ids=["batch", "nobatch"])
@pytest.mark.parametrize("avg, mx, spatial, out", ADAPTIVE, ids=[str(c[2:]) for c in ADAPTIVE])
def test_adaptive(avg, mx, spatial, out, batch):
    compare(avg, rnd(*batch, *spatial), output_size=out)
    compare(mx, rnd(*batch, *spatial, seed=1), output_size=out, return_indices=True)
    compare(mx, ties(*batch, *spatial), output_size=out, return_indices=True)


def test_adaptive_windows_match_torch_formula():
    """Window i of out over size n is [floor(i*n/out), ceil((i+1)*n/out)): one-hot inputs give
    each output's window exactly."""
    n, out = 10, 4
    x = torch.eye(n)[:, None, :]  # (n, 1, n): plane j is one-hot at j
    got = irt.to_torch(F.adaptive_avg_pool1d(irt.to_lazy(x), out))
    for i in range(out):
        start, end = (i * n) // out, -((-(i + 1) * n) // out)
        want = torch.zeros(n)
        want[start:end] = 1.0 / (end - start)
        torch.testing.assert_close(got[:, 0, i], want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_adaptive_dtypes(dtype):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-7, atol=1e-7)
    x = rnd(2, 3, 7, 5, dtype=dtype)
    compare(F.adaptive_avg_pool2d, x, output_size=(3, 4), **tol)
    compare(F.adaptive_max_pool2d, x, output_size=(3, 4), return_indices=True, **tol)


@pytest.mark.parametrize("size", [(3, 5), (7,), (2, 3, 4)], ids=str)
def test_interpolate_area(size):
    x = rnd(2, 3, *[{3: 7, 5: 4, 7: 10, 2: 5, 4: 3}[s] for s in size])
    compare(F.interpolate, x, size=size, mode="area")


# -- fractional max pooling ----------------------------------------------------------------------

FRACTIONAL = [
    (2, (9, 9), 3, (4, 3)),
    (2, (10, 7), (2, 3), (6, 2)),
    (2, (5, 6), 2, (4, 5)),
    (2, (6, 6), (1, 1), (1, 3)),
    (3, (5, 6, 7), 2, (3, 4, 2)),
    (3, (6, 5, 8), (2, 3, 1), (4, 2, 5)),
]


def _samples(planes_lead, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*planes_lead, n, generator=g)


@pytest.mark.parametrize("batch", [(2, 3), (3,)], ids=["batch", "nobatch"])
@pytest.mark.parametrize("n, spatial, k, out", FRACTIONAL, ids=[str(c) for c in FRACTIONAL])
def test_fractional_max_pool(n, spatial, k, out, batch):
    fn = F.fractional_max_pool2d if n == 2 else F.fractional_max_pool3d
    samples = _samples((batch[0] if len(batch) == 2 else 1, batch[-1]), n, seed=len(spatial))
    for x in (rnd(*batch, *spatial), ties(*batch, *spatial)):
        kw = dict(kernel_size=k, output_size=out, return_indices=True, _random_samples=samples)
        if n == 3:
            # torch has no meta kernel for fractional_max_pool3d_backward: the front end cannot
            # record it (see test_fractional_max_pool3d_gradient).
            compare(fn, x, grad=False, **kw)
        else:
            compare(fn, x, **kw)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_fractional_dtypes(dtype):
    """The window starts are computed in the samples' dtype, as torch does."""
    tol = dict(rtol=1e-7, atol=1e-7) if dtype == torch.float64 else dict(rtol=1e-2, atol=1e-2)
    x = rnd(2, 3, 23, 17, dtype=dtype)
    samples = _samples((2, 3), 2, seed=5).to(dtype)
    compare(
        F.fractional_max_pool2d,
        x,
        kernel_size=3,
        output_size=(7, 6),
        return_indices=True,
        _random_samples=samples,
        **tol,
    )


def test_fractional_samples_with_extra_rows():
    """torch takes the first rows of random_samples when it has more than the batch."""
    samples = _samples((4, 3), 2, seed=3)
    kw = dict(kernel_size=2, output_size=(4, 5), return_indices=True, _random_samples=samples)
    compare(F.fractional_max_pool2d, rnd(2, 3, 7, 8), **kw)
    compare(F.fractional_max_pool2d, rnd(3, 7, 8), **kw)


def test_fractional_max_pool3d_backward_rule():
    """The rule itself, recorded directly (shapes from eager)."""
    x = rnd(2, 3, 6, 5, 8)
    samples = _samples((2, 3), 3, seed=1)
    out, idx = aten.fractional_max_pool3d(x, [2, 3, 1], [4, 2, 5], samples)
    check("fractional_max_pool3d_backward", rnd(*out.shape, seed=2), x, [2, 3, 1], [4, 2, 5], idx)


def test_fractional_max_pool3d_gradient():
    """torch has no meta kernel for its backward: the front end's shape table covers it."""
    samples = _samples((2, 3), 3, seed=1)
    compare(
        F.fractional_max_pool3d,
        rnd(2, 3, 6, 5, 8),
        kernel_size=2,
        output_size=(4, 2, 5),
        _random_samples=samples,
    )


# -- lp pooling (avg pooling of powers) ---------------------------------------------------------


@pytest.mark.parametrize("norm_type", [2.0, 3.0])
@pytest.mark.parametrize(
    "fn, spatial, k, s, ceil_mode",
    [
        (F.lp_pool1d, (9,), 3, 2, True),
        (F.lp_pool1d, (8,), 4, None, False),
        (F.lp_pool2d, (7, 6), (3, 2), (2, 2), True),
        (F.lp_pool2d, (6, 6), 2, None, False),
        (F.lp_pool3d, (5, 6, 4), 2, (2, 1, 2), True),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),  # (ids alike in every process: no address)
)
def test_lp_pool(fn, spatial, k, s, ceil_mode, norm_type):
    x = rnd(2, 3, *spatial).abs() + 0.5  # positive: pow(1/p) is differentiable everywhere
    compare(
        fn,
        x,
        norm_type=norm_type,
        kernel_size=k,
        stride=s,
        ceil_mode=ceil_mode,
        rtol=1e-4,
        atol=1e-5,
    )


def test_rules_read_every_attribute():
    """The regression the avg_pool2d rule had: divisor_override and ceil_mode ignored."""
    x = rnd(1, 2, 5, 5)
    compare(F.avg_pool2d, x, kernel_size=2, stride=2, ceil_mode=True, divisor_override=3)
    np.testing.assert_array_equal(
        irt.to_torch(F.max_pool2d(irt.to_lazy(x), 2, ceil_mode=True)).shape, (1, 2, 3, 3)
    )
