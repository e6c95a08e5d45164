"""Max pooling: with indices, adaptive and fractional, and the backward op all three share
(each output's gradient added at its index). A max picks the first largest element of its
window in row-major order, or the last NaN, as torch's kernels do.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import NATIVE, family, out_dtype
from ir_runtime._lowering.pooling import (
    _acc,
    _geometry,
    _ints,
    _op,
    _spatial,
    adaptive_out,
    adaptive_windows,
    check_out,
    padding_for,
)

# Half precision: NATIVE (``_registry``): this family selects, computes the fractional windows'
# starts in the samples' dtype as torch does, and its backward op accumulates in torch's
# accumulator itself (``_acc``).
register = family(NATIVE)

# -- windows and their max -------------------------------------------------------------------------


def _plane_strides(sizes) -> tuple:
    """The flat-index stride of each spatial dim within one plane (row-major)."""
    return tuple(math.prod(sizes[i + 1 :]) for i in range(len(sizes)))


def _combine(per_dim, n: int, op):
    """Per-dim window arrays (``lead + (out_d, k_d)``, lead the same for all) combined with
    ``op`` into one array ``lead + (out_1, ..., out_n, k_1 * ... * k_n)``, kernel offsets in
    row-major order (torch's scan order)."""
    lead = per_dim[0].shape[:-2]
    total = None
    for i, a in enumerate(per_dim):
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = a.shape[-2], a.shape[-1]
        a = jnp.reshape(a, (*lead, *shape))
        total = a if total is None else op(total, a)
    outs = tuple(a.shape[-2] for a in per_dim)
    ks = tuple(a.shape[-1] for a in per_dim)
    total = jnp.broadcast_to(total, (*lead, *outs, *ks))
    return jnp.reshape(total, (*lead, *outs, math.prod(ks)))


def _flat_positions(per_dim_pos, sizes, n: int):
    strides = _plane_strides(sizes)
    return _combine(
        [jnp.asarray(p, jnp.int64) * st for p, st in zip(per_dim_pos, strides, strict=True)],
        n,
        jnp.add,
    )


def _strided_windows(x, n: int, k, s, d, pads, out):
    """The pooling windows of ``x`` as ``lead + out + (prod(k),)``: one strided slice of the
    padded input per kernel offset (row-major), no gather."""
    lead = x.ndim - n
    xp = lax.pad(x, np.array(0, x.dtype), [(0, 0, 0)] * lead + [(lo, hi, 0) for lo, hi in pads])
    slices = []
    for offsets in itertools.product(*(range(kd) for kd in k)):
        start = [0] * lead + [j * dd for j, dd in zip(offsets, d, strict=True)]
        limit = list(xp.shape[:lead]) + [
            j * dd + (od - 1) * sd + 1 for j, dd, od, sd in zip(offsets, d, out, s, strict=True)
        ]
        slices.append(lax.slice(xp, start, limit, (1,) * lead + tuple(s)))
    return jnp.stack(slices, axis=-1)


def _gather_windows(x, n: int, per_dim_pos):
    """Windows ``lead + out + (prod(k),)`` of ``x`` at the (in-range) positions ``per_dim_pos``,
    one ``(out_d, k_d)`` int array per spatial dim, the same for every plane."""
    idx = []
    for i, p in enumerate(per_dim_pos):
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = p.shape
        idx.append(jnp.reshape(jnp.asarray(p), shape))
    w = x[(Ellipsis, *idx)]  # lead + (out_1, .., out_n, k_1, .., k_n)
    return jnp.reshape(w, (*w.shape[: x.ndim], math.prod(w.shape[x.ndim :])))


def _select_max(w, valid, positions):
    """Max over the last axis of ``w`` among ``valid`` entries, and the position it is at:
    torch's rule, the first largest or else the last NaN (a window of -inf gives its first
    valid entry)."""
    floating = jnp.issubdtype(w.dtype, jnp.floating)
    low = -np.inf if floating else jnp.iinfo(w.dtype).min
    v = jnp.where(valid, w, np.array(low, w.dtype))
    top = jnp.max(v, axis=-1, keepdims=True)
    pick = jnp.argmax(valid & (v == top), axis=-1)
    if floating:
        nan = valid & jnp.isnan(w)
        last_nan = w.shape[-1] - 1 - jnp.argmax(jnp.flip(nan, axis=-1), axis=-1)
        pick = jnp.where(jnp.any(nan, axis=-1), last_nan, pick)
    pick = pick[..., None]
    value = jnp.take_along_axis(w, pick, axis=-1)[..., 0]
    positions = jnp.broadcast_to(positions, w.shape)
    index = jnp.take_along_axis(positions, pick, axis=-1)[..., 0]
    return value, index


def _check_outs(node, x, n: int, out):
    """``out`` (the spatial output sizes) against both outputs' shapes: values and indices."""
    check_out(node, x, n, out)
    check_out(node, x, n, out, 1)


def _window_max(node, w, per_dim_valid, per_dim_pos, sizes, n: int):
    """A max pool's outputs: the max of each window of ``w`` over its valid entries and that
    entry's index in the input plane. ``per_dim_valid`` and ``per_dim_pos``: one ``(out_d,
    k_d)`` array per spatial dim, whether each window entry is in the input and where."""
    valid = _combine([jnp.asarray(v) for v in per_dim_valid], n, jnp.logical_and)
    value, index = _select_max(w, valid, _flat_positions(per_dim_pos, sizes, n))
    return value.astype(out_dtype(node)), index.astype(out_dtype(node, 1))


# -- max pooling ----------------------------------------------------------------------------------


def _max_pool_with_indices(n: int):
    def rule(node, x):
        k, s, p, d, out, sizes = _geometry(node, x, n, dilation=True)
        _check_outs(node, x, n, out)
        w = _strided_windows(x, n, k, s, d, padding_for(sizes, k, s, p, d, out), out)
        per_dim_pos, per_dim_valid = [], []
        for size, kd, sd, pd, dd, od in zip(sizes, k, s, p, d, out, strict=True):
            pos = np.arange(od)[:, None] * sd - pd + np.arange(kd)[None, :] * dd
            per_dim_pos.append(pos)
            per_dim_valid.append((pos >= 0) & (pos < size))
        return _window_max(node, w, per_dim_valid, per_dim_pos, sizes, n)

    return rule


register("aten::max_pool2d_with_indices.default")(_max_pool_with_indices(2))
register("aten::max_pool3d_with_indices.default")(_max_pool_with_indices(3))


def _index_backward(n: int):
    """The backward of a max pool that saved indices: each output's gradient is added at the
    input position its index names (overlapping windows accumulate), as torch does."""

    def rule(node, grad, x, indices):
        sizes = _spatial(node, x, n)
        if tuple(grad.shape) != tuple(indices.shape) or grad.shape[:-n] != x.shape[:-n]:
            raise ValueError(
                f"{_op(node)}: grad_output {tuple(grad.shape)} and indices "
                f"{tuple(indices.shape)} must match and share the input's leading dims "
                f"{tuple(x.shape[:-n])}"
            )
        planes = math.prod(x.shape[:-n])
        acc = _acc(grad.dtype)
        flat = jnp.zeros((planes, math.prod(sizes)), acc)
        per_plane = math.prod(grad.shape[-n:])  # not -1: a batch of 0 planes is ambiguous
        g = grad.reshape(planes, per_plane).astype(acc)
        idx = indices.reshape(planes, per_plane).astype(jnp.int64)
        flat = flat.at[jnp.arange(planes)[:, None], idx].add(g, mode="drop")
        return flat.reshape(x.shape).astype(out_dtype(node))

    return rule


for _n, _ops in (
    (
        2,
        (
            "aten::max_pool2d_with_indices_backward.default",
            "aten::adaptive_max_pool2d_backward.default",
            "aten::fractional_max_pool2d_backward.default",
        ),
    ),
    (
        3,
        (
            "aten::max_pool3d_with_indices_backward.default",
            "aten::adaptive_max_pool3d_backward.default",
            "aten::fractional_max_pool3d_backward.default",
        ),
    ),
):
    for _name in _ops:
        register(_name)(_index_backward(_n))


# -- adaptive max pooling --------------------------------------------------------------------------


def _adaptive_max(n: int):
    def rule(node, x):
        sizes, out = adaptive_out(node, x, n, _ints(node, "output_size", n))
        _check_outs(node, x, n, out)
        per_dim_pos, per_dim_valid = [], []
        for size, od in zip(sizes, out, strict=True):
            start, end = adaptive_windows(size, od)
            width = int((end - start).max())
            pos = start[:, None] + np.arange(width)[None, :]
            valid = pos < end[:, None]
            per_dim_pos.append(np.where(valid, pos, start[:, None]))
            per_dim_valid.append(valid)
        return _window_max(
            node, _gather_windows(x, n, per_dim_pos), per_dim_valid, per_dim_pos, sizes, n
        )

    return rule


register("aten::adaptive_max_pool2d.default")(_adaptive_max(2))
register("aten::adaptive_max_pool3d.default")(_adaptive_max(3))


# -- fractional max pooling -----------------------------------------------------------------------


def _intervals(samples, size: int, out: int, k: int):
    """torch's generate_intervals for each plane's sample (``samples``: (planes,)), in the
    samples' dtype: window starts, (planes, out) int64."""
    dt = samples.dtype
    planes = samples.shape[0]
    last = jnp.full((planes, 1), size - k, jnp.int64)
    if out == 1:
        return last
    # alpha in the samples' dtype: numpy rounds the quotient to it, as C++ does.
    alpha = jnp.asarray(np.array(size - k, np.float64).astype(dt) / np.array(out - 1).astype(dt))
    u = samples[:, None]
    i = jnp.arange(out - 1).astype(dt)[None, :]
    starts = jnp.trunc((i + u) * alpha).astype(jnp.int64) - jnp.trunc(u * alpha).astype(jnp.int64)
    return jnp.concatenate([starts, last], axis=1)


def _fractional_max(n: int):
    """Torch's samples are per plane, in dim order W, H for 2-d, and T, H, W for 3-d."""
    order = (1, 0) if n == 2 else (0, 1, 2)  # which sample each spatial dim uses

    def rule(node, x, samples):
        sizes = _spatial(node, x, n)
        k = _ints(node, "kernel_size", n)
        out = _ints(node, "output_size", n)
        _check_outs(node, x, n, out)
        for size, kd, od in zip(sizes, k, out, strict=True):
            if kd <= 0 or od <= 0 or od + kd - 1 > size:
                raise ValueError(
                    f"{_op(node)}: output_size={out} with kernel_size={k} needs an input of "
                    f"at least output + kernel - 1 per dim, got {sizes}"
                )
        planes = math.prod(x.shape[:-n])
        batch = x.shape[0] if x.ndim == n + 2 else 1
        if (
            samples.ndim != 3
            or samples.shape[0] < batch
            or samples.shape[1:] != (x.shape[-n - 1], n)
        ):
            raise ValueError(
                f"{_op(node)}: random_samples {tuple(samples.shape)} must be (at least {batch}, "
                f"{x.shape[-n - 1]}, {n}) for input {tuple(x.shape)}"
            )
        # As torch: the first rows when there are more than the batch holds.
        u = samples[:batch].reshape(planes, n)
        per_dim_pos = []
        for axis, (size, kd, od) in enumerate(zip(sizes, k, out, strict=True)):
            starts = _intervals(u[:, order[axis]], size, od, kd)
            per_dim_pos.append(starts[:, :, None] + jnp.arange(kd, dtype=jnp.int64))
        xp = x.reshape(planes, *sizes)
        w = jax.vmap(lambda plane, *pos: _gather_windows(plane, n, pos))(xp, *per_dim_pos)
        positions = _flat_positions(per_dim_pos, sizes, n)
        valid = jnp.ones((1,) * w.ndim, bool)
        value, index = _select_max(w, valid, positions)
        shape = (*x.shape[:-n], *out)
        return (
            value.reshape(shape).astype(out_dtype(node)),
            index.reshape(shape).astype(out_dtype(node, 1)),
        )

    return rule


register("aten::fractional_max_pool2d.default")(_fractional_max(2))
register("aten::fractional_max_pool3d.default")(_fractional_max(3))
