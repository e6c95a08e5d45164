"""Distances and bilinear layers: cdist and pdist (torch's p-norms, and their backward as torch
computes it), and ``_trilinear``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import norm_dim, out_dims, out_dtype, register

_HIGHEST = lax.Precision.HIGHEST


# -- distances ------------------------------------------------------------------------------------


def _p_norm(diff, p: float, axis: int):
    """The p-norm of ``diff`` along ``axis`` as torch's distance kernels compute it."""
    if diff.shape[axis] == 0:
        return jnp.zeros(diff.shape[:axis] + diff.shape[axis + 1 :], diff.dtype)
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(diff.dtype), axis=axis)
    if p == 1:
        return jnp.sum(a, axis=axis)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=axis))
    if np.isinf(p):
        return jnp.max(a, axis=axis)
    return jnp.sum(a**p, axis=axis) ** (1.0 / p)


def _p_norm_grad(diff, grad, dist, p: float):
    """torch's per-element distance backward (``*_calc::backward`` in DistanceOpsKernel.cpp):
    the gradient of each difference, broadcast against ``grad`` and ``dist``."""
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros(jnp.broadcast_shapes(diff.shape, grad.shape), diff.dtype)
    if p == 1:
        return grad * jnp.sign(diff)
    if p < 2:
        res = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) * grad / dist ** (p - 1)
        res = jnp.where(dist == 0, zero, res)
        return jnp.where((diff == 0) & (p < 1), zero, res)
    if p == 2:
        return jnp.where(dist == 0, zero, grad * diff / dist)
    if np.isinf(p):
        hit = 1 - jnp.minimum(1, jnp.ceil(jnp.abs(jnp.abs(diff) - dist)))
        return grad * jnp.sign(diff) * hit
    res = diff * jnp.abs(diff) ** (p - 2) * grad / dist ** (p - 1)
    return jnp.where(dist == 0, zero, res)


def _check_p(op: str, p):
    if not isinstance(p, (int, float)) or p < 0 or np.isnan(p):
        raise ValueError(f"{op}: p must be a non-negative number, got {p!r}")


@register("aten::_cdist_forward.default")
def _cdist_forward(node, x1, x2):
    p, mode = node.attrs["p"], node.attrs["compute_mode"]
    _check_p("_cdist_forward", p)
    dims = out_dims(node)
    batch = dims[:-2]
    dt = out_dtype(node)
    if x1.size == 0 or x2.size == 0:
        return jnp.zeros(dims, dt)
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:]).astype(dt)
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:]).astype(dt)
    r1, r2 = x1.shape[-2], x2.shape[-2]
    mode = 0 if mode is None else mode
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))):
        # torch's _euclidean_dist: one matmul, then clamp and sqrt.
        n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
        n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
        a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], axis=-1)
        b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
        d2 = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=_HIGHEST)
        return jnp.sqrt(jnp.maximum(d2, 0))
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return _p_norm(diff, p, -1).astype(dt)


@register("aten::_cdist_backward.default")
def _cdist_backward(node, grad, x1, x2, dist):
    """The gradient of x1 (torch calls it again with x1 and x2 swapped for x2's), from the
    forward's own distances, as torch's kernel computes it."""
    p = node.attrs["p"]
    dims = out_dims(node)
    dt = out_dtype(node)
    if x1.size == 0 or x2.size == 0 or grad.size == 0 or p == 0:
        return jnp.zeros(dims, dt)  # torch: zeros like x1
    batch = dims[:-2]
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:]).astype(dt)
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:]).astype(dt)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    g = jnp.broadcast_to(grad, batch + grad.shape[-2:]).astype(dt)[..., None]
    d = jnp.broadcast_to(dist, batch + dist.shape[-2:]).astype(dt)[..., None]
    return jnp.sum(_p_norm_grad(diff, g, d, p), axis=-2).astype(dt)


def _pairs(n: int):
    return np.triu_indices(n, 1)


@register("aten::_pdist_forward.default")
def _pdist_forward(node, x):
    p = node.attrs["p"]
    _check_p("_pdist_forward", p)
    dt = out_dtype(node)
    i, j = _pairs(x.shape[0])
    if len(i) == 0:
        return jnp.zeros(out_dims(node), dt)
    x = x.astype(dt)
    return _p_norm(x[i] - x[j], p, -1).astype(dt)


@register("aten::_pdist_backward.default")
def _pdist_backward(node, grad, x, dist):
    p = node.attrs["p"]
    dt = out_dtype(node)
    i, j = _pairs(x.shape[0])
    if len(i) == 0 or x.size == 0 or p == 0:
        return jnp.zeros(x.shape, dt)
    x = x.astype(dt)
    g = _p_norm_grad(x[i] - x[j], grad.astype(dt)[:, None], dist.astype(dt)[:, None], p)
    return jnp.zeros(x.shape, dt).at[i].add(g).at[j].add(-g)


# -- bilinear layers ------------------------------------------------------------------------------


@register("aten::_trilinear.default")
def _trilinear(node, i1, i2, i3):
    """sum over ``sumdim`` of i1 * i2 * i3, each unsqueezed at its ``expand`` dims, as one
    einsum (size-1 dims broadcast)."""
    a = node.attrs
    total = i1.ndim + len(a["expand1"])
    if total > 26:
        raise ValueError(f"_trilinear: {total} dims is more than this rule handles (26)")
    letters = "abcdefghijklmnopqrstuvwxyz"
    dt = out_dtype(node)
    operands, subscripts, used = [], [], set()
    for t, expand in ((i1, a["expand1"]), (i2, a["expand2"]), (i3, a["expand3"])):
        t = jnp.expand_dims(t.astype(dt), sorted(norm_dim(e, total) for e in expand))
        if t.ndim != total:
            raise ValueError(f"_trilinear: operands reach {t.ndim} dims, expected {total}")
        keep = [d for d in range(total) if t.shape[d] != 1]
        operands.append(t.reshape([t.shape[d] for d in keep]))
        subscripts.append("".join(letters[d] for d in keep))
        used.update(keep)
    sumdim = {norm_dim(d, total) for d in a["sumdim"]}
    out = "".join(letters[d] for d in range(total) if d in used and d not in sumdim)
    r = jnp.einsum(f"{','.join(subscripts)}->{out}", *operands, precision=_HIGHEST)
    return r.reshape(out_dims(node)).astype(dt)
