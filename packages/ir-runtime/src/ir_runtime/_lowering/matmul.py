"""Matrix products and convolution (forward and backward)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering._registry import out_dtype, register, scalar

# Accumulate in full float32 on every backend; XLA's default may use lower precision on GPU/TPU.
_PRECISION = lax.Precision.HIGHEST


@register("aten::mm.default", "aten::bmm.default", "aten::matmul.default")
def _matmul(node, x, y):
    return jnp.matmul(x, y, precision=_PRECISION).astype(out_dtype(node))


@register("aten::dot.default")
def _dot(node, x, y):
    return jnp.dot(x, y, precision=_PRECISION)


@register("aten::addmm.default")
def _addmm(node, bias, x, y):
    dt = out_dtype(node)
    beta, alpha = node.attrs["beta"], node.attrs["alpha"]
    prod = jnp.matmul(x, y, precision=_PRECISION)
    if not _constant(alpha, 1):
        prod = prod * scalar(alpha, dt)
    if _constant(beta, 0):
        return prod.astype(dt)  # torch ignores the bias then, NaNs included
    if not _constant(beta, 1):
        bias = bias * scalar(beta, dt)
    return (bias + prod).astype(dt)


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
    prod = jnp.einsum("bij,bjk->ik", x, y, precision=_PRECISION)
    if not _constant(alpha, 1):
        prod = prod * scalar(alpha, dt)
    if _constant(beta, 0):
        return prod.astype(dt)
    if not _constant(beta, 1):
        bias = bias * scalar(beta, dt)
    return (bias + prod).astype(dt)


def _per_dim(values, n: int) -> tuple:
    """One value per spatial dim: torch's convolution takes a single one for all of them."""
    return tuple(values) * n if len(values) == 1 else tuple(values)


def _conv(x, w, attrs):
    """torch's convolution (NC[spatial] input, OI[spatial] weight) through lax."""
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
    )


@register("aten::convolution.default")
def _convolution(node, x, w, bias):
    out = _conv(x, w, node.attrs)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out.astype(out_dtype(node))


@register("aten::convolution_backward.default")
def _convolution_backward(node, grad, x, w):
    """Gradients of input, weight and bias, each where ``output_mask`` asks for it; through
    jax.vjp of the forward rule, so forward and backward always agree."""
    mask = node.attrs["output_mask"]
    _, vjp = jax.vjp(lambda a, b: _conv(a, b, node.attrs), x, w)
    gx, gw = vjp(grad)
    outs = []
    k = 0
    for want, value in zip(mask, (gx, gw, None), strict=True):
        if not want:
            continue
        if value is None:
            value = jnp.sum(grad, axis=(0, *range(2, grad.ndim)))
        outs.append(value.astype(out_dtype(node, k)))
        k += 1
    return tuple(outs)
