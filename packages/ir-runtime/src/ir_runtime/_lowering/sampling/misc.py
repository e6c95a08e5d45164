"""Replicate padding, hard and soft shrinkage, and ``Tensor.unfold`` (windows), with their
backward ops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ir_runtime._lowering._registry import norm_dim, out_dims, out_dtype, register

# -- replicate padding ----------------------------------------------------------------------------


def _replicate(x, pad):
    """Pad (or, where negative, crop) the last len(pad) // 2 dims by repeating edge values."""
    for k in range(len(pad) // 2):
        axis = x.ndim - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        size = x.shape[axis]
        if size + lo + hi < 0:
            raise ValueError(f"replication_pad: padding {tuple(pad)} leaves a negative size")
        idx = np.clip(np.arange(size + lo + hi) - lo, 0, size - 1)
        x = jnp.take(x, jnp.asarray(idx), axis=axis, mode="clip")
    return x


for _n in (1, 2, 3):

    @register(f"aten::replication_pad{_n}d.default")
    def _replication_pad(node, x):
        return _replicate(x, tuple(node.attrs["padding"])).astype(out_dtype(node))

    @register(f"aten::replication_pad{_n}d_backward.default")
    def _replication_pad_backward(node, grad, x):
        pad = tuple(node.attrs["padding"])
        _, vjp = jax.vjp(lambda v: _replicate(v, pad), jnp.zeros(x.shape, grad.dtype))
        return vjp(grad)[0].astype(out_dtype(node))


# -- shrinkage ------------------------------------------------------------------------------------


def _inside(x, lambd):
    lambd = jnp.asarray(lambd, x.dtype)
    return (x >= -lambd) & (x <= lambd), lambd


@register("aten::hardshrink.default")
def _hardshrink(node, x):
    inside, _ = _inside(x, node.attrs["lambd"])
    return jnp.where(inside, jnp.zeros((), x.dtype), x).astype(out_dtype(node))


@register("aten::softshrink.default")
def _softshrink(node, x):
    lambd = jnp.asarray(node.attrs["lambd"], x.dtype)
    out = jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))
    return out.astype(out_dtype(node))


@register("aten::hardshrink_backward.default", "aten::softshrink_backward.default")
def _shrink_backward(node, grad, x):
    inside, _ = _inside(x, node.attrs["lambd"])
    return jnp.where(inside, jnp.zeros((), grad.dtype), grad).astype(out_dtype(node))


# -- windows --------------------------------------------------------------------------------------


def _unfold_windows(x, dim: int, size: int, step: int, dims):
    if x.ndim == 0:
        return jnp.broadcast_to(x, dims)
    d = norm_dim(dim, x.ndim)
    n = dims[d]
    idx = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    y = jnp.take(x, jnp.asarray(idx.reshape(-1)), axis=d, mode="clip")
    y = y.reshape((*x.shape[:d], n, size, *x.shape[d + 1 :]))
    return jnp.moveaxis(y, d + 1, -1)


@register("aten::unfold.default", "aten::unfold_copy.default")
def _unfold(node, x):
    """Tensor.unfold: the windows of ``size`` every ``step`` along ``dimension``, as a new
    last dim (a gather: the lazy device has no strided views)."""
    a = node.attrs
    return _unfold_windows(x, a["dimension"], a["size"], a["step"], out_dims(node))


@register("aten::unfold_backward.default")
def _unfold_backward(node, grad):
    a = node.attrs
    sizes = tuple(a["input_sizes"])
    dims = grad.shape
    _, vjp = jax.vjp(
        lambda v: _unfold_windows(v, a["dim"], a["size"], a["step"], dims),
        jnp.zeros(sizes, grad.dtype),
    )
    return vjp(grad)[0].astype(out_dtype(node))
