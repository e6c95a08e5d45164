"""Grid sampling (grid_sampler_2d, grid_sampler_3d) and its backward: bilinear, nearest and
bicubic, with zeros, border and reflection padding.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp

from ir_runtime._lowering._registry import out_dtype, register
from ir_runtime._lowering.sampling._common import compute_dtype, require_float
from ir_runtime._lowering.sampling.interpolate import cubic_coeffs

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2
_INT_MAX = 2**31 - 1


def _gs_unnormalize(coord, size: int, align: bool):
    if align:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _gs_clip(c, size: int):
    """torch's clip_coordinates, with its gradient: 0 at and beyond either bound."""
    zero = jnp.zeros((), c.dtype)
    return jnp.where(c <= 0, zero, jnp.where(c >= size - 1, jnp.asarray(size - 1, c.dtype), c))


def _gs_reflect(c, twice_low: int, twice_high: int):
    """torch's reflect_coordinates (gradient -1 on a reflected stretch)."""
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    c = c - lo
    c = jnp.where(c < 0, -c, c)
    extra = jnp.fmod(c, span)
    flips = jnp.floor(c / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + lo, span - extra + lo)


def _gs_coordinates(c, size: int, padding: int, align: bool):
    """torch's compute_coordinates: padding applied, then non-finite or out-of-int-range
    coordinates sent to -100 (outside every image)."""
    if padding == _BORDER:
        c = _gs_clip(c, size)
    elif padding == _REFLECTION:
        c = _gs_reflect(c, 0, 2 * (size - 1)) if align else _gs_reflect(c, -1, 2 * size - 1)
        c = _gs_clip(c, size)
    ok = jnp.isfinite(c) & (c <= _INT_MAX - 1) & (c >= -_INT_MAX - 1)
    return jnp.where(ok, c, jnp.asarray(-100.0, c.dtype))


def _gs_gather(xt, batch, ints, sizes):
    """xt [N, *spatial, C] at integer positions ``ints`` (one [N, *out] array per spatial axis);
    zero where a position is outside."""
    inside = functools.reduce(
        jnp.logical_and, [(i >= 0) & (i < s) for i, s in zip(ints, sizes, strict=True)]
    )
    safe = [jnp.clip(i, 0, s - 1) for i, s in zip(ints, sizes, strict=True)]
    v = xt[(batch, *safe)]
    return jnp.where(inside[..., None], v, jnp.zeros((), v.dtype))


def _grid_sample(x, grid, mode: int, padding: int, align: bool, op: str):
    """x [N, C, *spatial], grid [N, *out, n] (last entry: x, y(, z) = the last spatial axis
    first) -> [N, C, *out], as torch's CPU grid sampler."""
    require_float(x, op)
    ct = compute_dtype(jnp.result_type(x.dtype, grid.dtype))
    x, grid = x.astype(ct), grid.astype(ct)
    n = grid.shape[-1]
    sizes = x.shape[2:]
    if mode not in (_BILINEAR, _NEAREST, _BICUBIC) or (mode == _BICUBIC and n != 2):
        raise ValueError(f"{op}: interpolation_mode {mode} is not supported")
    if padding not in (_ZEROS, _BORDER, _REFLECTION):
        raise ValueError(f"{op}: padding_mode {padding} is not supported")
    xt = jnp.moveaxis(x, 1, -1)
    batch = jnp.arange(x.shape[0]).reshape((x.shape[0],) + (1,) * (grid.ndim - 2))
    # raw[a]: the unnormalized coordinate along spatial axis a (grid lists them backwards).
    raw = [_gs_unnormalize(grid[..., n - 1 - a], sizes[a], align) for a in range(n)]
    if mode == _BICUBIC:
        floors = [jnp.floor(r) for r in raw]
        wy, wx = (cubic_coeffs(r - f, -0.75) for r, f in zip(raw, floors, strict=True))
        rows = []
        for i in range(4):
            yi = _gs_coordinates(floors[0] - 1 + i, sizes[0], padding, align)
            row = 0
            for j in range(4):
                xj = _gs_coordinates(floors[1] - 1 + j, sizes[1], padding, align)
                ints = [yi.astype(jnp.int32), xj.astype(jnp.int32)]  # integral already
                row = row + _gs_gather(xt, batch, ints, sizes) * wx[j][..., None]
            rows.append(row)
        out = sum(r * w[..., None] for r, w in zip(rows, wy, strict=True))
        return jnp.moveaxis(out, -1, 1)
    coords = [_gs_coordinates(r, s, padding, align) for r, s in zip(raw, sizes, strict=True)]
    if mode == _NEAREST:
        ints = [jnp.round(c).astype(jnp.int32) for c in coords]  # nearbyint: half to even
        return jnp.moveaxis(_gs_gather(xt, batch, ints, sizes), -1, 1)
    floors = [jnp.floor(c) for c in coords]
    out = 0
    for corner in itertools.product((0, 1), repeat=n):
        w = 1
        ints = []
        for c, f, bit in zip(coords, floors, corner, strict=True):
            w = w * ((c - f) if bit else (f + 1 - c))
            ints.append((f + bit).astype(jnp.int32))
        out = out + _gs_gather(xt, batch, ints, sizes) * w[..., None]
    return jnp.moveaxis(out, -1, 1)


@register("aten::grid_sampler_2d.default", "aten::grid_sampler_3d.default")
def _grid_sampler(node, x, grid):
    a = node.attrs
    out = _grid_sample(
        x, grid, a["interpolation_mode"], a["padding_mode"], a["align_corners"], node.op
    )
    return out.astype(out_dtype(node))


@register("aten::grid_sampler_2d_backward.default", "aten::grid_sampler_3d_backward.default")
def _grid_sampler_backward(node, grad, x, grid):
    """(input gradient, grid gradient); torch leaves out the input's when output_mask[0] is
    false (the grid's is always there)."""
    a = node.attrs
    args = (a["interpolation_mode"], a["padding_mode"], a["align_corners"], node.op)
    ct = compute_dtype(x.dtype)
    _, vjp = jax.vjp(lambda v, g: _grid_sample(v, g, *args), x.astype(ct), grid.astype(ct))
    gx, gg = vjp(grad.astype(ct))
    if len(node.shapes) == 1:
        return gg.astype(out_dtype(node, 0))
    return gx.astype(out_dtype(node, 0)), gg.astype(out_dtype(node, 1))
