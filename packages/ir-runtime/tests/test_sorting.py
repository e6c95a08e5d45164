"""Sorting and selection on the lazy device against torch eager (CPU), the oracle: values
bit for bit (NaN where eager has NaN, the sign of every zero), index outputs exactly (ties
included: torch's own tie order), and input gradients.

The cases OpInfo's samples miss: ties (stable and not, with NaN and -0.0), descending, 0-d and
1-D inputs, dim=-1, keepdim, int64 inputs, searchsorted's right/side/sorter/out_int32,
histogram edge conventions, empty segments.
"""

import numpy as np
import pytest
import torch
from aten import record
from eager import lazy

import ir_runtime as irt
from ir_core import Value

NAN = float("nan")


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [o for o in out if isinstance(o, torch.Tensor)]


def assert_same(got, want, what="", rtol=0.0, atol=0.0):
    """Same dtype, shape and values: NaN where ``want`` has NaN, zeros of the same sign;
    exactly unless a tolerance is given."""
    assert got.dtype == want.dtype and got.shape == want.shape, (
        what,
        got.dtype,
        list(got.shape),
        want.dtype,
        list(want.shape),
    )
    if want.is_floating_point():
        assert torch.equal(got.isnan(), want.isnan()), (what, got, want)
        g, w = got.nan_to_num(0.0), want.nan_to_num(0.0)
        if rtol == atol == 0.0:
            assert torch.equal(g, w), (what, got, want)
            assert torch.equal(g.signbit(), w.signbit()), (what, "sign of zero", got, want)
        else:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=what)
    else:
        assert torch.equal(got, want), (what, got, want)


def check(fn, *inputs, grad=False, rtol=0.0, atol=0.0, grad_tol=(1e-5, 1e-6)):
    """``fn`` on the lazy device against eager: every output, and with ``grad`` the inputs'
    gradients for a random cotangent on each floating output (within ``grad_tol``)."""
    inputs = [
        x.clone().requires_grad_(grad)
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in inputs
    ]
    want = _flat(fn(*inputs))
    lazy_in = [lazy(x) for x in inputs]
    got = _flat(fn(*lazy_in))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(irt.to_torch(g), w.detach(), f"output {k}", rtol, atol)
    if not grad:
        return
    outs = [(g, w) for g, w in zip(got, want, strict=True) if w.requires_grad]
    gen = torch.Generator().manual_seed(7)
    cots = [torch.randn(w.shape, generator=gen, dtype=w.dtype) for _, w in outs]
    ins = [
        (li, x)
        for li, x in zip(lazy_in, inputs, strict=True)
        if isinstance(x, torch.Tensor) and x.requires_grad
    ]
    ge = torch.autograd.grad([w for _, w in outs], [x for _, x in ins], cots, allow_unused=True)
    gl = torch.autograd.grad(
        [g for g, _ in outs], [li for li, _ in ins], [lazy(c) for c in cots], allow_unused=True
    )
    for k, (a, b) in enumerate(zip(gl, ge, strict=True)):
        assert (a is None) == (b is None), f"gradient {k}"
        if b is not None:
            torch.testing.assert_close(
                irt.to_torch(a), b, rtol=grad_tol[0], atol=grad_tol[1], msg=f"gradient {k}"
            )


def ties(*shape, seed=0, nan=0.2, negzero=0.2, values=3):
    """Few distinct values (ties everywhere), some NaN, some -0.0 beside 0.0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, values, shape, generator=g).float()
    x[torch.rand(shape, generator=g) < nan] = NAN
    x[torch.rand(shape, generator=g) < negzero] = -0.0
    return x


def randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def ints(*shape, seed=0, values=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-values // 2, values - values // 2, shape, generator=g)


# --------------------------------------------------------------------------------------------
# sort, argsort, msort


@pytest.mark.parametrize("stable", [None, False, True])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_ties(stable, descending):
    # 40 along the sorted dim: past std::sort's insertion-sort threshold (16), where its tie
    # order is not the stable one; 7: below it.
    for x, dim in ((ties(3, 40), -1), (ties(7, 4, seed=1), 0)):
        check(lambda t, d=dim: torch.sort(t, dim=d, descending=descending, stable=stable), x)


def test_sort_ints_and_bool():
    check(lambda t: torch.sort(t), ints(4, 33))
    check(lambda t: torch.sort(t, dim=0, descending=True), ints(20, 3, seed=2))
    check(lambda t: torch.sort(t, stable=True, descending=True), ints(2, 30, seed=3) > 0)
    check(lambda t: torch.argsort(t, dim=-1, stable=True), ints(3, 25, seed=4))
    check(lambda t: torch.sort(t, descending=True), ties(3, 20, seed=51).to(torch.bfloat16))
    check(lambda t: torch.topk(t, 4), ties(3, 20, seed=52).to(torch.float16))
    check(lambda t: torch.sort(t), ints(3, 20, seed=53).to(torch.uint8))


def test_sort_small_shapes():
    check(lambda t: torch.sort(t), torch.tensor(3.0))
    check(lambda t: torch.sort(t, dim=-1, descending=True), torch.tensor(-0.0))
    check(lambda t: torch.sort(t, descending=True), torch.tensor([2.0, NAN, -0.0, 0.0, 2.0]))
    check(lambda t: torch.sort(t), torch.zeros(0))
    check(lambda t: torch.sort(t, dim=1), torch.zeros(3, 0))


def test_sort_gradients():
    x = ties(4, 20, nan=0.0, seed=5)
    check(lambda t: torch.sort(t, descending=True)[0], x, grad=True)
    check(lambda t: torch.sort(t, dim=0, stable=True)[0] * 2, x, grad=True)
    check(lambda t: torch.msort(t), randn(6, 5, seed=44), grad=True)


def test_argsort_msort():
    check(lambda t: torch.argsort(t, descending=True), ties(5, 18, seed=6))
    check(lambda t: torch.argsort(t, dim=0, stable=True), ties(18, 5, seed=7))
    check(lambda t: torch.msort(t), ties(20, 3, seed=8))


# --------------------------------------------------------------------------------------------
# topk


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("srt", [True, False])
def test_topk_ties(largest, srt):
    x = ties(4, 30, seed=9)
    for k in (1, 4, 30):  # std::nth_element (+ std::sort)
        check(lambda t, k=k: torch.topk(t, k, largest=largest, sorted=srt), x)
    # k * 64 <= n: std::partial_sort
    check(lambda t: torch.topk(t, 2, dim=0, largest=largest, sorted=srt), ties(140, 3, seed=10))


def test_topk_small_and_ints():
    check(lambda t: torch.topk(t, 1), torch.tensor(5.0))
    check(lambda t: torch.topk(t, 1, dim=-1, largest=False), torch.tensor(5.0))
    check(lambda t: torch.topk(t, 2), torch.tensor([1.0, 1.0, NAN]))
    check(lambda t: torch.topk(t, 3, dim=0), ints(9, 4, seed=11))
    check(lambda t: torch.topk(t, 0), randn(3, 4, seed=45))


def test_topk_gradients():
    check(lambda t: torch.topk(t, 3, dim=1)[0], ties(3, 12, nan=0.0, seed=12), grad=True)
    check(
        lambda t: torch.topk(t, 2, largest=False, sorted=False)[0], randn(4, 9, seed=46), grad=True
    )


# --------------------------------------------------------------------------------------------
# kthvalue


def test_kthvalue_ties():
    x = ties(5, 25, seed=13)
    for k in (1, 7, 13, 25):
        check(lambda t, k=k: torch.kthvalue(t, k), x)
    check(lambda t: torch.kthvalue(t, 3, dim=0, keepdim=True), ties(9, 4, seed=14))
    check(lambda t: torch.kthvalue(t, 2, dim=-1), ints(3, 11, seed=15))


def test_kthvalue_small_and_gradients():
    check(lambda t: torch.kthvalue(t, 1), torch.tensor(2.0))
    check(lambda t: torch.kthvalue(t, 1, 0, True), torch.tensor(2.0))
    check(lambda t: torch.kthvalue(t, 2), torch.tensor([3.0, 3.0]))
    check(
        lambda t: torch.kthvalue(t, 4, dim=1, keepdim=True)[0],
        ties(3, 10, nan=0, seed=16),
        grad=True,
    )


# --------------------------------------------------------------------------------------------
# median, nanmedian


@pytest.mark.parametrize("fn", [torch.median, torch.nanmedian])
def test_median_dim(fn):
    x = ties(6, 9, seed=17, nan=0.3)
    x[0] = NAN  # an all-NaN row: nanmedian's index is std::nth_element's doing
    check(lambda t: fn(t, dim=1), x)
    check(lambda t: fn(t, dim=0, keepdim=True), x)
    check(lambda t: fn(t, -1), torch.full((2, 37), NAN))
    check(lambda t: fn(t, 0), torch.tensor(1.5))
    check(lambda t: fn(t, -1, True), torch.tensor(NAN))
    check(lambda t: fn(t, dim=1), ints(4, 6, seed=18))


@pytest.mark.parametrize("fn", [torch.median, torch.nanmedian])
def test_median_all(fn):
    check(fn, ties(5, 7, seed=19, nan=0.0))  # -0.0 and 0.0 around the median: nth_element's
    check(fn, ties(5, 7, seed=20, nan=0.1))
    check(fn, torch.full((4,), NAN))
    check(fn, torch.tensor(-0.0))
    check(fn, ints(4, 5, seed=21))


def test_median_gradients():
    x = ties(4, 6, nan=0.0, seed=22)
    check(lambda t: torch.median(t, dim=1)[0], x, grad=True)
    check(lambda t: torch.median(t), x, grad=True)  # evenly split between the ties
    y = ties(4, 6, nan=0.3, seed=23)
    check(lambda t: torch.nanmedian(t, dim=0, keepdim=True)[0], y, grad=True)
    check(lambda t: torch.nanmedian(t), y, grad=True)


# --------------------------------------------------------------------------------------------
# mode


def test_mode():
    check(torch.mode, ties(4, 10, seed=24, nan=0.0))  # std::sort of <= 16: stable
    check(torch.mode, ties(4, 40, seed=25, nan=0.0))  # > 16: introsort's tie order
    check(lambda t: torch.mode(t, 0, keepdim=True), ties(30, 3, seed=26))  # with NaN
    check(lambda t: torch.mode(t, -1), ints(5, 50, seed=27, values=6))
    check(lambda t: torch.mode(t, 0), torch.tensor(4.0))
    check(lambda t: torch.mode(t)[0], ties(3, 20, nan=0.0, seed=28), grad=True)


# --------------------------------------------------------------------------------------------
# cummax, cummin, cumprod, logcumsumexp


@pytest.mark.parametrize("fn", [torch.cummax, torch.cummin])
def test_cummax_cummin(fn):
    check(lambda t: fn(t, 1), ties(4, 15, seed=29))
    check(lambda t: fn(t, 0), ints(6, 3, seed=30))
    check(lambda t: fn(t, -1), torch.tensor(2.0))
    check(lambda t: fn(t, 0)[0], ties(8, 3, nan=0.0, seed=31), grad=True)


def test_cumprod():
    x = torch.tensor([[2.0, 0.0, 3.0, 0.0, 0.5], [1.5, -1.0, 0.0, 4.0, 2.0]])
    check(lambda t: torch.cumprod(t, 1), x, grad=True)  # zeros: the classic gradient trap
    check(lambda t: torch.cumprod(t, 0), x, grad=True)
    # (its backward sums with cumsum: see test_cumsum_accumulates_in_double)
    check(
        lambda t: torch.cumprod(t, -1),
        randn(3, 200, seed=47).abs() / 4 + 0.8,
        grad=True,
        rtol=1e-6,
        grad_tol=(1e-4, 1e-5),
    )
    check(lambda t: torch.cumprod(t, 0), torch.tensor(3.0), grad=True)
    check(lambda t: torch.cumprod(t, 1, dtype=torch.float64), x, grad=True)
    check(lambda t: torch.cumprod(t, 1), ints(3, 6, seed=32))


def test_cumsum_accumulates_in_double():
    """torch CPU adds float32 in double (at::acc_type), as cumprod and logcumsumexp here do."""
    check(lambda t: torch.cumsum(t, -1), randn(3, 200, seed=49) * 10)


def test_logcumsumexp():
    inf = float("inf")
    x = torch.tensor(
        [[-inf, -inf, 1.0, inf, 2.0, NAN, 0.0], [3.0, -1e30, 80.0, -inf, 1.0, 2.0, 3.0]]
    )
    check(lambda t: torch.logcumsumexp(t, 1), x)
    # torch's backward subtracts two exponentials of reverse logcumsumexps: it magnifies the
    # last bit of exp and log (XLA's are not torch's), hence the gradient tolerance.
    y = torch.randn(30, 4, generator=torch.Generator().manual_seed(43)) * 20
    check(lambda t: torch.logcumsumexp(t, 0), y, grad=True, rtol=1e-6, grad_tol=(1e-4, 1e-5))
    check(lambda t: torch.logcumsumexp(t, -1), torch.tensor(1.0), grad=True)


# --------------------------------------------------------------------------------------------
# searchsorted, bucketize


def test_searchsorted():
    seq = torch.tensor([1.0, 2.0, 2.0, 3.0, 5.0, 8.0])
    vals = torch.tensor([[0.0, 1.0, 2.0, 2.5], [5.0, 8.0, 9.0, NAN]])
    for kw in (
        {},
        {"right": True},
        {"side": "right"},
        {"side": "left"},
        {"out_int32": True},
        {"right": True, "side": "right", "out_int32": True},
    ):
        check(lambda s, v, kw=kw: torch.searchsorted(s, v, **kw), seq, vals)
    # sorter: the sequence unsorted, with the permutation that sorts it
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = torch.empty_like(seq)
    shuffled[perm] = seq
    check(lambda s, v, p: torch.searchsorted(s, v, sorter=p), shuffled, vals, perm)
    check(lambda s, v, p: torch.searchsorted(s, v, side="right", sorter=p), shuffled, vals, perm)
    # N-D boundaries, one sequence per row of values
    rows = torch.sort(ties(3, 7, nan=0.0, negzero=0.0, values=5, seed=33), dim=1)[0]
    check(lambda s, v: torch.searchsorted(s, v, right=True), rows, ints(3, 4, seed=34).float())
    unsorted = ties(3, 7, nan=0.0, negzero=0.0, values=5, seed=50)
    order = torch.argsort(unsorted, dim=1, stable=True)
    check(lambda s, v, p: torch.searchsorted(s, v, sorter=p), unsorted, ints(3, 5).float(), order)
    # a NaN inside the sequence: torch's binary search path decides
    check(
        lambda s, v: torch.searchsorted(s, v),
        torch.tensor([1.0, NAN, 3.0, 4.0, 5.0]),
        torch.tensor([0.0, 2.0, 3.5, 6.0, NAN]),
    )
    # a scalar, int64 sequences, mixed dtypes
    check(lambda s: torch.searchsorted(s, 2.0), seq)
    check(lambda s: torch.searchsorted(s, 2, right=True, out_int32=True), seq)
    iseq = torch.tensor([1, 3, 3, 7, 16777217])
    check(lambda s, v: torch.searchsorted(s, v, right=True), iseq, torch.tensor([3, 16777216]))
    check(lambda s, v: torch.searchsorted(s, v, right=True), iseq, torch.tensor([16777216.0]))
    check(lambda s: torch.searchsorted(s, 16777216.5, right=True), iseq)
    check(lambda s, v: torch.searchsorted(s, v), torch.zeros(0), torch.tensor([1.0]))
    check(lambda s, v: torch.searchsorted(s, v), seq, torch.tensor(2.0))


def test_bucketize():
    b = torch.tensor([-1.0, 0.0, 0.0, 2.5, 4.0])
    x = torch.tensor([[-2.0, -1.0, 0.0, -0.0], [2.5, 3.0, 4.0, NAN]])
    for kw in ({}, {"right": True}, {"out_int32": True}, {"right": True, "out_int32": True}):
        check(lambda t, bb, kw=kw: torch.bucketize(t, bb, **kw), x, b)
    check(lambda bb: torch.bucketize(0.0, bb), b)
    check(lambda bb: torch.bucketize(0.0, bb, right=True, out_int32=True), b)
    check(lambda t, bb: torch.bucketize(t, bb), ints(3, 4, seed=35), torch.tensor([-1, 0, 1]))
    check(lambda t, bb: torch.bucketize(t, bb, right=True), torch.tensor(2.5), b)


# --------------------------------------------------------------------------------------------
# Histograms. torch has no meta kernels for histogram and histogramdd (the front end needs
# their shapes): these run the rules on nodes recorded directly, with eager's output shapes.


def run_node(name, *args, rtol=0.0, **kwargs):
    """Counts exactly; with weights (summed in another order) within ``rtol``."""
    node, want = record(name, args, kwargs)
    got = irt.execute([Value(node, k) for k in range(len(want))])
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(
            torch.from_numpy(np.asarray(irt.to_host(g)).astype(np.float64)).to(w.dtype),
            w,
            f"{name} output {k}",
            rtol=rtol,
            atol=rtol,
        )


def test_histc_edges():
    x = torch.tensor([0.0, 1.0, 2.5, 5.0, 7.5, 10.0, -0.5, 10.5, NAN, 9.999999])
    check(lambda t: torch.histc(t, bins=4, min=0, max=10), x)  # last bin closed; outside out
    check(lambda t: torch.histc(t, bins=3, min=0, max=0), x[:8])  # min == max: the data's
    check(lambda t: torch.histc(t, bins=5), torch.full((6,), 2.0))  # all equal: -1, +1
    check(lambda t: torch.histc(t, bins=7, min=-3.3, max=2.2), randn(1000, seed=48))
    check(lambda t: torch.histc(t, bins=10, min=1, max=3), torch.tensor(2.0))
    check(lambda t: torch.histc(t, bins=2, min=0, max=1), torch.zeros(0))
    # values on the edges of 0.1-wide bins (float rounding decides: as torch does)
    check(lambda t: torch.histc(t, bins=10, min=0, max=1), torch.arange(11) / 10)
    check(lambda t: torch.histc(t, bins=100, min=-1, max=1), torch.linspace(-1, 1, 201))


def test_histogram():
    g = torch.Generator().manual_seed(36)
    x = torch.randn(50, generator=g)
    w = torch.rand(50, generator=g)
    run_node("histogram.bin_ct", x, 7)
    run_node("histogram.bin_ct", x, 5, range=(-1.0, 1.0), weight=w, density=True, rtol=1e-6)
    run_node("histogram.bin_ct", torch.linspace(-1, 1, 201), 100)  # every edge hit
    run_node("histogram.bin_ct", torch.arange(11.0) / 10, 10, range=(0.0, 1.0))
    run_node("histogram.bin_ct", torch.full((3,), 4.0), 4)  # min == max: +-0.5
    run_node("histogram.bin_ct", torch.zeros(0), 3)  # empty: [0, 1]
    run_node("histogram.bin_ct", torch.arange(11.0, dtype=torch.float64) / 10, 10)
    # half precision: torch's c10::Half arithmetic, rounded after every operation
    for dt in (torch.float16, torch.bfloat16):
        run_node("histogram.bin_ct", (x * 3).to(dt), 100, range=(-3.0, 4.0))
        check(lambda t: torch.histc(t, bins=13), (x * 3).to(dt))
    edges = torch.tensor([-2.0, -0.5, 0.0, 0.0, 1.0, 3.0])
    run_node("histogram.bins_tensor", x, edges)
    run_node("histogram.bins_tensor", x, edges, weight=w, density=True, rtol=1e-6)
    run_node("histogram.bins_tensor", torch.tensor([-2.0, 0.0, 3.0, 3.5]), edges)


def test_histogramdd():
    g = torch.Generator().manual_seed(37)
    x = torch.randn(40, 3, generator=g)
    w = torch.rand(40, generator=g)
    run_node("_histogramdd_bin_edges", x, [2, 3, 4])
    run_node("_histogramdd_from_bin_cts", x, [2, 3, 4])
    run_node(
        "_histogramdd_from_bin_cts",
        x,
        [3, 1, 2],
        range=[-1.0, 1.0, 0.0, 0.0, -2.0, 2.0],
        weight=w,
        density=True,
        rtol=1e-6,
    )
    bins = [
        torch.tensor([-1.0, 0.0, 1.0]),
        torch.tensor([-3.0, 3.0]),
        torch.tensor([-0.5, 0.0, 0.25, 2.0]),
    ]
    run_node("_histogramdd_from_bin_tensors", x, bins)
    run_node("_histogramdd_from_bin_tensors", x, bins, weight=w, density=True, rtol=1e-6)
    run_node("_histogramdd_bin_edges", x.reshape(2, 20, 3), [5, 5, 5])


# --------------------------------------------------------------------------------------------
# segment_reduce


@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean", "prod"])
def test_segment_reduce(reduce):
    data = torch.tensor([3.0, 3.0, 1.0, -2.0, -2.0, 0.0, 5.0, NAN, 2.0])
    lengths = torch.tensor([2, 0, 4, 3])
    offsets = torch.tensor([0, 2, 2, 6, 9])
    for initial in (None, 1.5):
        check(
            lambda d, n, i=initial: torch.segment_reduce(d, reduce, lengths=n, initial=i),
            data,
            lengths,
        )
        check(
            lambda d, o, i=initial: torch.segment_reduce(d, reduce, offsets=o, initial=i),
            data,
            offsets,
        )
    # -0.0 against 0.0: torch's fold keeps the earlier of two equal values
    zeros = torch.tensor([-0.0, 0.0, 0.0, -0.0, -1.0, 5.0])
    check(
        lambda d, n: torch.segment_reduce(d, reduce, lengths=n, initial=-0.0),
        -torch.zeros(4),
        torch.tensor([2, 0, 2]),
    )
    for initial in (None, 0.0, -0.0):
        check(
            lambda d, n, i=initial: torch.segment_reduce(d, reduce, lengths=n, initial=i),
            zeros,
            torch.tensor([2, 2, 2]),
        )
    # gradients (max/min with ties: torch divides by the count only the positive ones)
    clean = data.nan_to_num(4.0)
    check(lambda d, n: torch.segment_reduce(d, reduce, lengths=n), clean, lengths, grad=True)
    check(
        lambda d, n: torch.segment_reduce(d, reduce, lengths=n, initial=2.0),
        clean,
        lengths,
        grad=True,
    )
    # 2-D: segments along dim 1, one set of lengths per row; offsets not starting at 0
    d2 = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(38))
    check(
        lambda d, n: torch.segment_reduce(d, reduce, lengths=n, axis=1),
        d2,
        torch.tensor([[3, 4], [0, 7]]),
        grad=True,
        rtol=1e-6,
        atol=1e-6,
    )
    check(
        lambda d, o: torch.segment_reduce(d, reduce, offsets=o, axis=0),
        d2[0],
        torch.tensor([1, 3, 6]),
        grad=True,
        rtol=1e-6,
        atol=1e-6,
    )


# --------------------------------------------------------------------------------------------
# Through the ops above: quantile, isin


def test_quantile_isin():
    x = ties(6, 20, nan=0.0, seed=39)
    q = torch.tensor([0.0, 0.3, 0.5, 1.0])
    for fn in (torch.quantile, torch.nanquantile):
        check(lambda t, qq, fn=fn: fn(t, qq, dim=1, keepdim=True), x, q, grad=True, rtol=1e-6)
        check(
            lambda t, fn=fn: fn(t, 0.25, interpolation="midpoint"),
            ties(5, 7, seed=40),
            grad=True,
            rtol=1e-6,
        )
    check(lambda a, b: torch.isin(a, b), ints(5, 6, seed=41), torch.tensor([0, 1, 7]))
    check(lambda a, b: torch.isin(a, b, invert=True), ties(30, seed=42), torch.tensor([1.0, NAN]))
