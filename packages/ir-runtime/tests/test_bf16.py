"""Half precision on the lazy device is as accurate as eager: one rounding per op.

Eager's CPU kernels compute a bfloat16 or float16 op in float32 and round the result once (a
reduction accumulates in float32, addmm adds its bias to the float32 product, layer norm and the
activations run in float32), and so does the lowering (``_lowering._registry``'s rounding
modes). Each op here is compared with eager and with float64 on the same (half-precision)
values: its error against float64 is at most eager's, and almost every element is eager's, bit
for bit, or else float64's correctly rounded (eager's log_softmax rounds an intermediate: a
seventh of its elements are an ulp off). The saved statistics of the normalizations have
eager's dtypes (the meta kernels say float32 where the CPU kernels give the input's dtype).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import ir_runtime as irt

HALF = [torch.bfloat16, torch.float16]
# Elements equal to eager's (or float64's rounded), bit for bit, at least: the float32
# computations inside differ only in the order a reduction adds in (XLA's tree against eager's
# cascade), and in an ulp of float32 in a transcendental.
SAME = 0.95
SLACK = 1.001  # on eager's error: the lazy error is at most eager's, up to float64's rounding
# Sums of products (the dots, sum, mean) accumulate in float32 on both sides, each in its own
# order (XLA's tree; eager's depends on the CPU's kernel): a max error may move by float32's
# accumulation bound, n * 2**-24 * the sum of |terms| (Higham's), far below a half-precision ulp
# (a product rounded to half precision before the sum would be 2**-11 of it).
LINEAR = frozenset(("linear_with_bias", "addmm_alpha_beta", "matmul", "sum", "mean"))


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    w = torch.randn(96, 256, generator=g) / 16
    b = torch.randn(96, generator=g)
    lw, lb = torch.randn(256, generator=g), torch.randn(256, generator=g)
    return [t.to(dtype) for t in (x, w, b, lw, lb)]


CASES = {
    "layer_norm": lambda x, w, b, lw, lb: F.layer_norm(x, (256,), lw, lb),
    "linear_with_bias": lambda x, w, b, lw, lb: F.linear(x, w, b),
    "addmm_alpha_beta": lambda x, w, b, lw, lb: torch.addmm(b, x, w.T, beta=0.5, alpha=2.0),
    "matmul": lambda x, w, *_: x @ w.T,
    "sigmoid": lambda x, *_: torch.sigmoid(x),
    "silu": lambda x, *_: F.silu(x),
    "gelu": lambda x, *_: F.gelu(x),
    "gelu_tanh": lambda x, *_: F.gelu(x, approximate="tanh"),
    "softmax": lambda x, *_: torch.softmax(x, -1),
    "log_softmax": lambda x, *_: torch.log_softmax(x, -1),
    "sum": lambda x, *_: x.sum(-1),
    "mean": lambda x, *_: x.mean(0),
    "var": lambda x, *_: x.var(-1),
}


def _errors(fn, args):
    """(lazy's max error against float64, eager's, the fraction of lazy's elements equal to
    eager's or to float64's rounded), float64 computed on the same half-precision values."""
    exact = fn(*(a.double() for a in args))
    eager = fn(*args)
    lazy = irt.to_torch(fn(*(irt.to_lazy(a) for a in args)))
    assert lazy.dtype == eager.dtype and lazy.shape == eager.shape
    lazy_error = (lazy.double() - exact).abs().max().item()
    eager_error = (eager.double() - exact).abs().max().item()
    same = (lazy == eager) | (lazy == exact.to(lazy.dtype))
    return lazy_error, eager_error, same.double().mean().item()


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_as_accurate_as_eager(name, dtype):
    args = _inputs(dtype)
    lazy_error, eager_error, same = _errors(CASES[name], args)
    order = 0.0
    if name in LINEAR:  # the op on |inputs| is the sum of |terms|: all its weights are positive
        order = 256 * 2**-24 * CASES[name](*(a.double().abs() for a in args)).max().item()
    assert lazy_error <= eager_error * SLACK + order, (lazy_error, eager_error, order)
    assert same >= SAME, same


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_the_backward_of_layer_norm_and_linear_is_as_accurate_as_eager(dtype):
    x, w, b, lw, lb = _inputs(dtype)
    cot = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)).to(dtype)

    def grads(x, w, b, lw, lb):
        leaves = [t.detach().requires_grad_() for t in (x, w, b, lw, lb)]
        y = F.linear(F.layer_norm(leaves[0], (256,), leaves[3], leaves[4]), leaves[1], leaves[2])
        c = irt.to_lazy(cot) if y.device.type == "lazy" else cot.to(y.dtype)
        return torch.autograd.grad(y, leaves, c)

    exact = grads(*(a.double() for a in (x, w, b, lw, lb)))
    eager = grads(x, w, b, lw, lb)
    lazy = grads(*(irt.to_lazy(a) for a in (x, w, b, lw, lb)))
    for e, lz, ex in zip(eager, lazy, exact, strict=True):
        lz = irt.to_torch(lz)
        assert lz.dtype == e.dtype
        scale = ex.abs().max().item()
        lazy_error = (lz.double() - ex).abs().max().item()
        eager_error = (e.double() - ex).abs().max().item()
        # a few roundings, at other points than eager's (a chain of ops, not one): within two
        # of eager's error, and both small against the gradient's scale
        assert lazy_error <= 2 * eager_error + 1e-3 * scale, (lazy_error, eager_error)


INDEX_CASES = {
    # eager accumulates these in float32 and rounds once: its result, bit for bit
    "scatter_add": lambda o, i, s: o.scatter_add(0, i, s),
    "scatter_reduce_sum": lambda o, i, s: o.scatter_reduce(0, i, s, "sum"),
    "scatter_reduce_prod": lambda o, i, s: o.scatter_reduce(0, i, s, "prod"),
    "index_add": lambda o, i, s: o.index_add(0, i[:, 0], s),
}
# eager rounds these after every addition, in its loop's order: nearer the exact sum than that
INDEX_ROUNDING_EVERY_ADD = {
    "index_put_accumulate": lambda o, i, s: o.index_put((i[:, 0],), s, accumulate=True),
    "put_accumulate": lambda o, i, s: o.put(i[:, 0], s[:, 0], accumulate=True),
    "index_reduce_mean": lambda o, i, s: o.index_reduce(0, i[:, 0], s, "mean"),
    "embedding_backward": lambda o, i, s: torch.ops.aten.embedding_dense_backward(
        s, i[:, 0], 4, -1, False
    ),
}


def _index_inputs():
    g = torch.Generator().manual_seed(0)
    o = torch.randn(4, 5, generator=g).bfloat16()
    i = torch.randint(0, 4, (40, 5), generator=g)
    s = (torch.rand(40, 5, generator=g) * 0.1 + 1).bfloat16()
    return o, i, s


@pytest.mark.parametrize("name", INDEX_CASES)
def test_index_ops_accumulate_in_float32_as_eager(name):
    o, i, s = _index_inputs()
    fn = INDEX_CASES[name]
    lazy = irt.to_torch(fn(irt.to_lazy(o), irt.to_lazy(i), irt.to_lazy(s)))
    assert torch.equal(lazy, fn(o, i, s))


@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")
@pytest.mark.parametrize("name", INDEX_ROUNDING_EVERY_ADD)
def test_index_ops_accumulate_in_float32_where_eager_rounds_every_add(name):
    o, i, s = _index_inputs()
    fn = INDEX_ROUNDING_EVERY_ADD[name]
    lazy = irt.to_torch(fn(irt.to_lazy(o), irt.to_lazy(i), irt.to_lazy(s)))
    exact = fn(o.double(), i, s.double())
    assert lazy.dtype == torch.bfloat16
    assert torch.equal(lazy, exact.bfloat16())  # the exact sum, rounded once
    eager_error = (fn(o, i, s).double() - exact).abs().max().item()
    assert (lazy.double() - exact).abs().max().item() <= eager_error


def _stat_dtypes(fn, args):
    eager = fn(*args)
    lazy = fn(*(irt.to_lazy(a) if isinstance(a, torch.Tensor) else a for a in args))
    return [t.dtype for t in eager], [t.dtype for t in lazy]


_aten = torch.ops.aten


@pytest.mark.parametrize("params", ["half", "float32", "none"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_normalization_statistics_have_eagers_dtypes(dtype, params):
    """The CPU kernels save statistics in the input's dtype, or in the parameters' where a
    half-precision input has float32 ones ("mixed type"); torch's meta kernels say float32."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 5, generator=g).to(dtype)
    pd = dtype if params == "half" else torch.float32

    def param(n, fill):
        return None if params == "none" else torch.full((n,), fill, dtype=pd)

    def running(fill):
        return torch.full((6,), fill, dtype=dtype if params == "none" else pd)

    w, b = param(6, 1.5), param(6, 0.5)
    cases = [
        (_aten.native_layer_norm.default, (x, [5], param(5, 1.5), param(5, 0.5), 1e-5)),
        (_aten.native_group_norm.default, (x, w, b, 4, 6, 5, 3, 1e-5)),
        (_aten._native_batch_norm_legit.no_stats, (x, w, b, True, 0.1, 1e-5)),
    ]
    for training in (True, False):
        stats = (running(0.0), running(1.0))
        cases += [
            (_aten.native_batch_norm.default, (x, w, b, *stats, training, 0.1, 1e-5)),
            (_aten._native_batch_norm_legit.default, (x, w, b, *stats, training, 0.1, 1e-5)),
        ]
    cases += [
        (
            _aten._native_batch_norm_legit_functional.default,
            (x, w, b, running(0.0), running(1.0), True, 0.1, 1e-5),
        ),
        (
            _aten._native_batch_norm_legit_no_training.default,
            (x, w, b, running(0.0), running(1.0), 0.1, 1e-5),
        ),
    ]
    for fn, args in cases:
        eager, lazy = _stat_dtypes(
            fn, [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        )
        assert lazy == eager, (fn, eager, lazy)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_layer_norm_statistics_match_eager(dtype):
    x, _, _, lw, lb = _inputs(dtype)
    fn = _aten.native_layer_norm.default
    eager = fn(x, [256], lw, lb, 1e-5)
    lazy = [
        irt.to_torch(t) for t in fn(irt.to_lazy(x), [256], irt.to_lazy(lw), irt.to_lazy(lb), 1e-5)
    ]
    for e, lz in zip(eager, lazy, strict=True):
        assert lz.dtype == e.dtype
        assert (lz == e).double().mean().item() >= SAME


def test_products_keep_half_precision_operands_and_accumulate_in_float32():
    """Dot products and convolutions take their bfloat16 operands as they are (what matrix
    units take) and ask for a float32 result, rounded once after the bias."""
    x, w, b, _, _ = (irt.to_lazy(t) for t in _inputs(torch.bfloat16))
    text = irt.lower(F.linear(x, w, b)._ir)
    signature = r"\(tensor<[\dx]+xbf16>, tensor<[\dx]+xbf16>\) -> tensor<[\dx]+xf32>$"
    dots = re.findall(r"stablehlo\.dot_general.*", text)
    assert dots and all(re.search(signature, d.rstrip()) for d in dots), dots
    img = irt.to_lazy(torch.randn(2, 3, 8, 8).bfloat16())
    k = irt.to_lazy(torch.randn(4, 3, 3, 3).bfloat16())
    text = irt.lower(F.conv2d(img, k, irt.to_lazy(torch.randn(4).bfloat16()))._ir)
    convs = re.findall(r"stablehlo\.convolution.*", text)
    assert convs and all(re.search(signature, c.rstrip()) for c in convs), convs
    # the bias is added in float32, then the one rounding
    assert re.search(r"stablehlo\.add .*: tensor<[\dx]+xf32>", text), text


def test_data_movement_is_not_widened():
    """A rule that only moves data sees the recorded dtype: no convert in its program."""
    x = irt.to_lazy(torch.randn(4, 6).bfloat16())
    text = irt.lower(x.t().reshape(3, 8)[1:]._ir)
    assert "convert" not in text, text
