"""Pooling: max (with indices) and average pooling, adaptive pooling, and their backward ops."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import out_dtype, register


def _pool_window(node, x):
    n = x.ndim - 2
    k = tuple(node.attrs["kernel_size"])
    k = k * n if len(k) == 1 else k
    stride = tuple(node.attrs.get("stride") or k)
    stride = stride * n if len(stride) == 1 else stride
    pad = tuple(node.attrs.get("padding", (0,) * n))
    pad = pad * n if len(pad) == 1 else pad
    dil = tuple(node.attrs.get("dilation", (1,) * n))
    dil = dil * n if len(dil) == 1 else dil
    return k, stride, pad, dil


def _max_pool(x, k, stride, pad, dil):
    # Concrete (numpy) init values: jax then uses its differentiable max/sum window reducers.
    init = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return lax.reduce_window(
        x,
        np.array(init, x.dtype),
        lax.max,
        (1, 1, *k),
        (1, 1, *stride),
        [(0, 0), (0, 0), *[(p, p) for p in pad]],
        window_dilation=(1, 1, *dil),
    )


@register("aten::max_pool2d_with_indices.default", "aten::max_pool3d_with_indices.default")
def _max_pool_with_indices(node, x):
    k, stride, pad, dil = _pool_window(node, x)
    if node.attrs.get("ceil_mode", False):
        raise ValueError("max_pool with ceil_mode=True is not supported yet")
    out = _max_pool(x, k, stride, pad, dil)
    # Indices: flat positions within each (N, C) plane of the input, as torch returns them.
    spatial = x.shape[2:]
    flat = jnp.arange(math.prod(spatial), dtype=jnp.float64)
    positions = jnp.broadcast_to(flat.reshape(spatial), x.shape)
    # Pick the position of the max by reducing (value, -position) pairs.
    _, idx = lax.reduce_window(
        (x, -positions),
        (jnp.asarray(-jnp.inf, x.dtype), jnp.asarray(-jnp.inf, positions.dtype)),
        _argmax_pair,
        (1, 1, *k),
        (1, 1, *stride),
        [(0, 0), (0, 0), *[(p, p) for p in pad]],
        window_dilation=(1, 1, *dil),
    )
    return out.astype(out_dtype(node)), (-idx).astype(out_dtype(node, 1))


def _argmax_pair(a, b):
    (va, ia), (vb, ib) = a, b
    take_a = (va > vb) | ((va == vb) & (ia > ib))
    return jnp.where(take_a, va, vb), jnp.where(take_a, ia, ib)


@register("aten::max_pool2d_with_indices_backward.default")
def _max_pool_backward(node, grad, x, indices):
    """Each output's gradient goes to the input position its index names, as in torch."""
    n, c = x.shape[:2]
    flat = jnp.zeros((n, c, math.prod(x.shape[2:])), grad.dtype)
    rows = jnp.arange(n)[:, None, None]
    chans = jnp.arange(c)[None, :, None]
    flat = flat.at[rows, chans, indices.reshape(n, c, -1)].add(grad.reshape(n, c, -1))
    return flat.reshape(x.shape).astype(out_dtype(node))


def _avg_pool(node, x):
    k, stride, pad, _ = _pool_window(node, x)
    window = [(0, 0), (0, 0), *[(p, p) for p in pad]]
    summed = lax.reduce_window(
        x, np.array(0, x.dtype), lax.add, (1, 1, *k), (1, 1, *stride), window
    )
    if node.attrs.get("count_include_pad", True) or not any(pad):
        return summed / jnp.asarray(float(math.prod(k)), x.dtype)
    ones = jnp.ones(x.shape[2:], x.dtype)[None, None]
    counts = lax.reduce_window(
        ones, np.array(0, x.dtype), lax.add, (1, 1, *k), (1, 1, *stride), window
    )
    return summed / counts


@register("aten::avg_pool2d.default")
def _avg_pool2d(node, x):
    return _avg_pool(node, x).astype(out_dtype(node))


@register("aten::avg_pool2d_backward.default")
def _avg_pool2d_backward(node, grad, x):
    _, vjp = jax.vjp(lambda v: _avg_pool(node, v), x)
    return vjp(grad)[0].astype(out_dtype(node))


@register("aten::_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(node, x):
    out_h, out_w = node.attrs["output_size"]
    h, w = x.shape[-2:]
    if h % out_h or w % out_w:
        raise ValueError(
            f"adaptive_avg_pool2d from {(h, w)} to {(out_h, out_w)}: sizes must divide"
        )
    return (
        x.reshape(*x.shape[:-2], out_h, h // out_h, out_w, w // out_w)
        .mean(axis=(-3, -1))
        .astype(out_dtype(node))
    )
