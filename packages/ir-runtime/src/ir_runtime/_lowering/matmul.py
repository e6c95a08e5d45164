"""Matrix products and convolution (forward and backward).

Half precision (``_registry``'s ACCUMULATE): the operands stay bfloat16 or float16 and the node's
outputs read float32, so a product accumulates in float32 (``preferred_element_type``) and its
epilogue (alpha, beta, the bias) is float32 too; ``lower_node`` rounds the result once, as
eager's kernels do."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering._registry import (
    ACCUMULATE,
    ONE_DEVICE,
    cast,
    family,
    out_dtype,
    scalar,
)

register = family(ACCUMULATE)

# Accumulate in full float32 on every backend; XLA's default may use lower precision on GPU/TPU.
_PRECISION = lax.Precision.HIGHEST


@register("aten::mm.default", "aten::bmm.default", "aten::matmul.default")
def _matmul(node, x, y):
    dt = out_dtype(node)
    return jnp.matmul(x, y, precision=_PRECISION, preferred_element_type=dt).astype(dt)


@register("ir::dot")
def _ir_dot(node, x, y, bias=None):
    """``lax.dot_general`` over the node's ``dims`` (a product whose transposes and merged
    batch dims the rewrite rules folded in: ``_rewrite``), plus ``addmm``'s epilogue when there
    is a bias."""
    dt = out_dtype(node)
    dims = node.attrs["dims"]
    prod = _flat_product(x, y, dims, dt) if ONE_DEVICE.get() else None
    if prod is None:
        prod = lax.dot_general(x, y, dims, precision=_PRECISION, preferred_element_type=dt)
    if bias is None:
        return prod.astype(dt)
    return _epilogue(prod, bias, node.attrs["alpha"], node.attrs["beta"], dt)


def _consecutive(dims) -> bool:
    return list(dims) == list(range(dims[0], dims[0] + len(dims)))


def _flat_product(x, y, dims, dt):
    """The product as one matrix product, when reshapes alone make it one: each operand's
    contracted dims side by side and its other dims side by side (what a linear layer on a
    batch of sequences is, forward and backward); None otherwise, or when it already is one.

    On one device only (``ONE_DEVICE``): XLA's CPU emitter runs a ``dot_general`` that
    contracts two dims (a weight's gradient, over batch and sequence) or keeps two free dims by
    copying a transposed operand first, and fuses the elementwise work before it into that
    copy; a matrix product reads its transposed operand in place (a small Llama's training
    step on CPU: the copies took about a sixth of it). Under a mesh the form stays the one
    ``jax.grad`` writes, which XLA's partitioner places well: a merged dim carries only its
    major part's placement."""
    (lc, rc), (lb, rb) = dims
    if lb or rb or not lc or len(lc) != len(rc):
        return None
    lf = [d for d in range(x.ndim) if d not in lc]
    rf = [d for d in range(y.ndim) if d not in rc]
    if not lf or not rf or not all(map(_consecutive, (lc, rc, lf, rf))):
        return None
    if len(lc) == 1 and len(lf) == 1 and len(rf) == 1:
        return None  # a matrix product already

    def matrix(a, contract, free):
        k = math.prod(a.shape[d] for d in contract)
        m = math.prod(a.shape[d] for d in free)
        if contract[0] == 0:  # contracted dims first
            return a.reshape(k, m), 0
        return a.reshape(m, k), 1

    a, ca = matrix(x, lc, lf)
    b, cb = matrix(y, rc, rf)
    prod = lax.dot_general(
        a, b, (((ca,), (cb,)), ((), ())), precision=_PRECISION, preferred_element_type=dt
    )
    return prod.reshape(tuple(x.shape[d] for d in lf) + tuple(y.shape[d] for d in rf))


@register("aten::dot.default")
def _dot(node, x, y):
    dt = out_dtype(node)
    return jnp.dot(x, y, precision=_PRECISION, preferred_element_type=dt).astype(dt)


@register("aten::addmm.default")
def _addmm(node, bias, x, y):
    dt = out_dtype(node)
    beta, alpha = node.attrs["beta"], node.attrs["alpha"]
    prod = jnp.matmul(x, y, precision=_PRECISION, preferred_element_type=dt)
    return _epilogue(prod, bias, alpha, beta, dt)


def _epilogue(prod, bias, alpha, beta, dt):
    """``beta * bias + alpha * prod`` in ``dt`` (the product's accumulator: float32 for half
    precision operands)."""
    prod = cast(prod, dt)
    if not _constant(alpha, 1):
        prod = prod * scalar(alpha, dt)
    if _constant(beta, 0):
        return prod  # torch ignores the bias then, NaNs included
    bias = cast(bias, dt)
    if not _constant(beta, 1):
        bias = bias * scalar(beta, dt)
    return bias + prod


def _constant(v, c) -> bool:
    return isinstance(v, (int, float)) and v == c


@register("aten::baddbmm.default")
def _baddbmm(node, bias, x, y):
    return _addmm(node, bias, x, y)


@register("aten::addbmm.default")
def _addbmm(node, bias, x, y):
    """``beta * bias + alpha * sum_b x[b] @ y[b]``: one contraction over batch and inner dim."""
    dt = out_dtype(node)
    beta, alpha = node.attrs["beta"], node.attrs["alpha"]
    prod = jnp.einsum("bij,bjk->ik", x, y, precision=_PRECISION, preferred_element_type=dt)
    return _epilogue(prod, bias, alpha, beta, dt)


def _per_dim(values, n: int) -> tuple:
    """One value per spatial dim: torch's convolution takes a single one for all of them."""
    return tuple(values) * n if len(values) == 1 else tuple(values)


def _conv(x, w, attrs, dt=None):
    """torch's convolution (NC[spatial] input, OI[spatial] weight) through lax, accumulated in
    ``dt`` (None: the operands' dtype)."""
    n = x.ndim - 2
    stride, padding, dilation = (_per_dim(attrs[k], n) for k in ("stride", "padding", "dilation"))
    groups = attrs["groups"]
    spatial = "DHW"[3 - n :]
    dn = lax.conv_dimension_numbers(
        x.shape, w.shape, (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}")
    )
    if attrs["transposed"]:
        output_padding = _per_dim(attrs["output_padding"], n)
        # A transposed conv is the gradient of a conv: dilate the input by the stride and pad.
        k = w.shape[2:]
        pads = [
            (d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, d, op in zip(k, padding, dilation, output_padding, strict=True)
        ]
        # weight is (in, out/groups, ...): to (out, in/groups, ...), flipped in space.
        cin = w.shape[0]
        w = w.reshape(groups, cin // groups, *w.shape[1:])
        w = jnp.swapaxes(w, 1, 2).reshape(-1, cin // groups, *k)
        w = jnp.flip(w, axis=tuple(range(2, 2 + n)))
        dn = lax.conv_dimension_numbers(
            x.shape, w.shape, (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}")
        )
        return lax.conv_general_dilated(
            x,
            w,
            (1,) * n,
            pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=dn,
            feature_group_count=groups,
            precision=_PRECISION,
            preferred_element_type=dt,
        )
    return lax.conv_general_dilated(
        x,
        w,
        stride,
        [(p, p) for p in padding],
        rhs_dilation=dilation,
        dimension_numbers=dn,
        feature_group_count=groups,
        precision=_PRECISION,
        preferred_element_type=dt,
    )


@register("aten::convolution.default")
def _convolution(node, x, w, bias):
    dt = out_dtype(node)
    out = cast(_conv(x, w, node.attrs, dt), dt)
    if bias is not None:
        out = out + cast(bias, dt).reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


@register("aten::convolution_backward.default")
def _convolution_backward(node, grad, x, w):
    """Gradients of input, weight and bias, each where ``output_mask`` asks for it; through
    jax.vjp of the forward rule, so forward and backward always agree."""
    mask = node.attrs["output_mask"]
    dt = out_dtype(node)  # the accumulator: float32 for half precision operands
    _, vjp = jax.vjp(lambda a, b: _conv(a, b, node.attrs, dt), x, w)
    gx, gw = vjp(cast(grad, dt))
    outs = []
    k = 0
    for want, value in zip(mask, (gx, gw, None), strict=True):
        if not want:
            continue
        if value is None:
            value = jnp.sum(cast(grad, dt), axis=(0, *range(2, grad.ndim)))
        outs.append(value.astype(out_dtype(node, k)))
        k += 1
    return tuple(outs)
