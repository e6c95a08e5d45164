"""Resampling, distances and a few losses: interpolation (nearest, nearest-exact, linear, cubic,
antialiased), grid sampling, embedding bags, cdist/pdist, ``_trilinear`` (bilinear layers), CTC
and margin losses, replicate padding, hard/soft shrinkage and ``Tensor.unfold``, with their
backward ops.

Resampling indices and weights depend only on shapes and Python-float scales, so they are
computed at trace time with NumPy, in the float type torch's CPU kernels use (float32 for
float32 and narrower inputs), following those kernels step by step. Backward ops that are the
transpose of a linear forward go through ``jax.vjp`` of the forward rule, so the pair always
agrees; where torch's backward is not the derivative of its forward (cdist's inf-norm, CTC) it
is written out as torch computes it.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import norm_dim, out_dims, out_dtype, register

_NEG_INF = -np.inf
_HIGHEST = lax.Precision.HIGHEST


def _compute_dtype(dtype):
    """torch's opmath type: float64 stays, every other float computes in float32."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def _require_float(x, op: str):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{op}: input of dtype {x.dtype} is not supported (floating only)")


# -- interpolation ------------------------------------------------------------------------------


def _scales_value(scale, n_in: int, n_out: int, ft):
    """torch's ``compute_scales_value``: 1 / scale where a positive scale was given."""
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _area_scale(n_in: int, n_out: int, align: bool, scale, ft):
    """torch's ``area_pixel_compute_scale``."""
    if align:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    return _scales_value(scale, n_in, n_out, ft)


def _source_index(scale, n_out: int, align: bool, cubic: bool, ft):
    """torch's ``area_pixel_compute_source_index`` for every output index."""
    i = np.arange(n_out).astype(ft)
    if align:
        return (scale * i).astype(ft)
    src = (scale * (i + ft(0.5)) - ft(0.5)).astype(ft)
    return src if cubic else np.where(src < 0, ft(0), src).astype(ft)


def _guard(src, n_in: int, ft):
    """torch's ``guard_index_and_lambda``: the floor index (at most n_in - 1) and the fraction."""
    idx = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - idx.astype(ft), ft(0), ft(1)).astype(ft)
    return idx, lam


def _cc1(x, a):
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cc2(x, a):
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def _cubic_coeffs(t, a):
    """torch's ``get_cubic_upsample_coefficients`` (works on NumPy and JAX arrays)."""
    x2 = 1 - t
    return [_cc2(t + 1, a), _cc1(t, a), _cc1(x2, a), _cc2(x2 + 1, a)]


def _aa_filter_linear(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0)


def _aa_filter_cubic(x):
    a = -0.5  # Keys' a, as Pillow and torch's antialiased bicubic use
    x = np.abs(x)
    return np.where(x < 1, _cc1(x, a), np.where(x < 2, _cc2(x, a), 0))


def _taps(kind: str, n_in: int, n_out: int, align: bool, scale, ft, forward: bool):
    """(indices [n_out, K], weights [n_out, K] or None) of output positions along one axis,
    as torch's CPU kernels compute them (for the forward op, or for the backward op's
    transpose where torch's two kernels differ)."""
    out = np.arange(n_out)
    if kind == "nearest":
        if n_out == n_in:
            idx = out
        elif n_out == 2 * n_in:
            idx = out >> 1
        else:
            s = _scales_value(scale, n_in, n_out, np.float32)
            idx = np.minimum(np.floor(out.astype(np.float32) * s).astype(np.int64), n_in - 1)
        return idx[:, None], None
    if kind == "nearest_exact":
        s = _scales_value(scale, n_in, n_out, np.float32)
        # (dst + 0.5) * scale in double, then floorf: the product rounds to float first.
        prod = ((out + 0.5) * np.float64(s)).astype(np.float32)
        idx = np.minimum(np.floor(prod).astype(np.int64), n_in - 1)
        return idx[:, None], None
    if n_out == n_in and (kind == "linear" or (forward and kind in ("aa_linear", "aa_cubic"))):
        # torch copies an axis whose size does not change, whatever scale it is given: linear
        # modes both ways, antialiased ones only forward (their backward applies the scale);
        # bicubic's forward never does (its backward does: see the backward rule).
        return out[:, None], None
    s = _area_scale(n_in, n_out, align, scale, ft)
    if kind == "linear":
        idx0, lam = _guard(_source_index(s, n_out, align, False, ft), n_in, ft)
        idx1 = idx0 + (idx0 < n_in - 1)
        return np.stack([idx0, idx1], 1), np.stack([ft(1) - lam, lam], 1).astype(ft)
    if kind == "cubic":
        idx0, t = _guard(_source_index(s, n_out, align, True, ft), n_in, ft)
        w = np.stack(_cubic_coeffs(t, ft(-0.75)), 1).astype(ft)
        idx = np.clip(idx0[:, None] + np.arange(-1, 3)[None, :], 0, n_in - 1)
        return idx, w
    # Antialiased (separable, as Pillow): torch's _compute_indices_min_size_weights_aa.
    interp, filt = (2, _aa_filter_linear) if kind == "aa_linear" else (4, _aa_filter_cubic)
    support = ft(interp * 0.5) * s if s >= 1 else ft(interp * 0.5)
    max_size = int(np.ceil(support)) * 2 + 1
    invscale = ft(1) / s if s >= 1 else ft(1)
    center = (s * (out + 0.5)).astype(ft)
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)
    xsize = np.minimum((center + support + 0.5).astype(np.int64), n_in) - xmin
    xsize = np.clip(xsize, 0, max_size)
    j = np.arange(max_size)[None, :]
    used = j < xsize[:, None]
    arg = ((j + xmin[:, None]) - center[:, None] + 0.5) * invscale
    w = np.where(used, filt(arg.astype(ft)), 0).astype(ft)
    total = w.sum(1, keepdims=True, dtype=ft)
    w = np.where(total != 0, w / np.where(total != 0, total, 1), w).astype(ft)
    idx = np.clip(xmin[:, None] + j, 0, n_in - 1)
    return idx, w


def _apply_taps(y, axis: int, idx, w):
    """Sum over taps k of y taken at idx[:, k] along ``axis``, times w[:, k]."""
    shape = [1] * y.ndim
    shape[axis] = idx.shape[0]
    out = None
    for k in range(idx.shape[1]):
        term = jnp.take(y, jnp.asarray(idx[:, k]), axis=axis, mode="clip")
        if w is not None:
            term = term * jnp.asarray(w[:, k].reshape(shape), y.dtype)
        out = term if out is None else out + term
    return out


def _resample(kind: str, x, out_sizes, align: bool, scales, op: str, forward: bool = True):
    """x [N, C, *spatial] resampled to ``out_sizes`` one spatial axis at a time."""
    n = len(out_sizes)
    if kind not in ("nearest", "nearest_exact"):
        _require_float(x, op)
        x = x.astype(_compute_dtype(x.dtype))
    ft = np.dtype(_compute_dtype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else "f4")
    for a in range(n):
        axis = x.ndim - n + a
        idx, w = _taps(kind, x.shape[axis], out_sizes[a], align, scales[a], ft.type, forward)
        x = _apply_taps(x, axis, idx, w)
    return x


_SCALE_NAMES = {
    1: ("scales",),
    2: ("scales_h", "scales_w"),
    3: ("scales_d", "scales_h", "scales_w"),
}


def _upsample_rules(kind: str, forward: str, backward: str, n: int, has_align: bool):
    names = _SCALE_NAMES[n]

    def attrs(node):
        a = node.attrs
        align = a["align_corners"] if has_align else False
        return tuple(a["output_size"]), align, [a[s] for s in names]

    @register(forward)
    def rule(node, x):
        size, align, scales = attrs(node)
        return _resample(kind, x, size, align, scales, forward).astype(out_dtype(node))

    @register(backward)
    def rule_backward(node, grad):
        size, align, scales = attrs(node)
        ct = _compute_dtype(grad.dtype)
        if kind == "cubic" and tuple(node.attrs["input_size"][2:]) == size:
            # torch's bicubic backward copies when no size changes, though its forward still
            # applies a given scale there: the gradient torch gives.
            return grad.astype(out_dtype(node))
        primal = jnp.zeros(tuple(node.attrs["input_size"]), ct)
        _, vjp = jax.vjp(lambda v: _resample(kind, v, size, align, scales, backward, False), primal)
        return vjp(grad.astype(ct))[0].astype(out_dtype(node))

    return rule, rule_backward


for _n in (1, 2, 3):
    _upsample_rules(
        "nearest",
        f"aten::upsample_nearest{_n}d.default",
        f"aten::upsample_nearest{_n}d_backward.default",
        _n,
        False,
    )
    _upsample_rules(
        "nearest_exact",
        f"aten::_upsample_nearest_exact{_n}d.default",
        f"aten::_upsample_nearest_exact{_n}d_backward.default",
        _n,
        False,
    )
for _name, _n in (("linear1d", 1), ("bilinear2d", 2), ("trilinear3d", 3)):
    _upsample_rules(
        "linear",
        f"aten::upsample_{_name}.default",
        f"aten::upsample_{_name}_backward.default",
        _n,
        True,
    )
_upsample_rules(
    "cubic",
    "aten::upsample_bicubic2d.default",
    "aten::upsample_bicubic2d_backward.default",
    2,
    True,
)
_upsample_rules(
    "aa_linear",
    "aten::_upsample_bilinear2d_aa.default",
    "aten::_upsample_bilinear2d_aa_backward.default",
    2,
    True,
)
_upsample_rules(
    "aa_cubic",
    "aten::_upsample_bicubic2d_aa.default",
    "aten::_upsample_bicubic2d_aa_backward.default",
    2,
    True,
)


# -- grid sampling --------------------------------------------------------------------------------

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
    _require_float(x, op)
    ct = _compute_dtype(jnp.result_type(x.dtype, grid.dtype))
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
        wy, wx = (_cubic_coeffs(r - f, -0.75) for r, f in zip(raw, floors, strict=True))
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
    ct = _compute_dtype(x.dtype)
    _, vjp = jax.vjp(lambda v, g: _grid_sample(v, g, *args), x.astype(ct), grid.astype(ct))
    gx, gg = vjp(grad.astype(ct))
    if len(node.shapes) == 1:
        return gg.astype(out_dtype(node, 0))
    return gx.astype(out_dtype(node, 0)), gg.astype(out_dtype(node, 1))


# -- embedding bags -------------------------------------------------------------------------------

_SUM, _MEAN, _MAX = 0, 1, 2


def _bag_of(offsets, n: int, num_bags: int):
    """The bag of each of ``n`` indices: the last of the first ``num_bags`` offsets at or
    before it (torch's CPU kernel puts indices past the last offset in the last bag)."""
    starts = offsets[:num_bags]
    bag = jnp.searchsorted(starts, jnp.arange(n, dtype=starts.dtype), side="right") - 1
    return jnp.clip(bag, 0, max(num_bags - 1, 0))


def _kept(indices, padding_idx: int):
    if padding_idx < 0:
        return jnp.ones(indices.shape, bool)
    return indices != padding_idx


@register("aten::_embedding_bag.default", "aten::_embedding_bag_forward_only.default")
def _embedding_bag(node, weight, indices, offsets, per_sample_weights):
    """(output, offset2bag, bag_size, max_indices) as torch's CPU kernel fills them, in the
    shapes its meta kernel gives."""
    a = node.attrs
    mode, pad = a["mode"], a["padding_idx"]
    if indices.ndim != 1 or offsets.ndim != 1:
        raise ValueError("_embedding_bag: indices and offsets must be 1-D")
    if per_sample_weights is not None and mode != _SUM:
        raise ValueError("_embedding_bag: per_sample_weights only works with mode='sum'")
    if mode not in (_SUM, _MEAN, _MAX):
        raise ValueError(f"_embedding_bag: mode {mode} is not supported")
    num_bags, _ = out_dims(node)
    n = indices.shape[0]
    dt = out_dtype(node)
    bag = _bag_of(offsets, n, num_bags)
    keep = _kept(indices, pad)
    rows = jnp.take(weight, indices, axis=0, mode="clip").astype(dt)
    count = jax.ops.segment_sum(keep.astype(jnp.int64), bag, num_segments=num_bags)
    max_indices = None
    if mode == _MAX:
        masked = jnp.where(keep[:, None], rows, jnp.asarray(-jnp.inf, dt))
        best = jax.ops.segment_max(masked, bag, num_segments=num_bags)
        hit = keep[:, None] & (rows == best[bag])
        pos = jnp.broadcast_to(jnp.arange(n)[:, None], rows.shape)
        first = jax.ops.segment_min(jnp.where(hit, pos, n), bag, num_segments=num_bags)
        nonempty = (count > 0)[:, None]
        out = jnp.where(nonempty, best, jnp.zeros((), dt))
        picked = jnp.take(indices, jnp.clip(first, 0, max(n - 1, 0)), mode="clip")
        max_indices = jnp.where(nonempty & (first < n), picked, 0)
    else:
        scale = keep.astype(dt)
        if per_sample_weights is not None:
            scale = scale * per_sample_weights.astype(dt)
        out = jax.ops.segment_sum(rows * scale[:, None], bag, num_segments=num_bags)
        if mode == _MEAN:
            out = out / jnp.where(count == 0, 1, count).astype(dt)[:, None]
    # The auxiliary outputs as torch's CPU kernel fills them (offset2bag: each index's bag;
    # bag_size: non-padding indices a bag, zeros in sum mode; max_indices: the argmax rows in
    # max mode, the bag sizes in mean mode, zeros in sum mode), in the shapes torch's meta
    # kernel gives, which are not always the CPU kernel's: offset2bag is never empty there,
    # bag_size has one entry an offset (one more than the bags with include_last_offset: the
    # last is 0 here) and max_indices is empty outside max mode.
    aux = [bag, count if mode != _SUM else jnp.zeros_like(count), count]
    if mode == _MAX:
        aux[2] = max_indices
    outs = [out.astype(dt)]
    for k, value in enumerate(aux, 1):
        dims = node.shapes[k].dims
        if value.shape != dims:
            if value.ndim != 1 or len(dims) != 1:
                raise ValueError(f"_embedding_bag: output {k} has shape {dims}, not {value.shape}")
            value = value[: dims[0]]
            value = jnp.pad(value, (0, dims[0] - value.shape[0]))
        outs.append(value.astype(out_dtype(node, k)))
    return tuple(outs)


def _bag_weight_grad(node, grad, indices, bag, bag_size, max_indices, per_sample_weights):
    a = node.attrs
    mode, pad, num_weights = a["mode"], a["padding_idx"], a["num_weights"]
    dt = out_dtype(node)
    g = grad.astype(dt)
    if mode == _MAX:
        nonempty = (bag_size[: g.shape[0]] != 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(g.shape[1])[None, :], max_indices.shape)
        return (
            jnp.zeros((num_weights, g.shape[1]), dt)
            .at[max_indices, cols]
            .add(jnp.where(nonempty, g, jnp.zeros((), dt)))
        )
    keep = _kept(indices, pad)
    scale = keep.astype(dt)
    if a["scale_grad_by_freq"]:
        counts = jnp.zeros((num_weights,), dt).at[indices].add(1)
        scale = scale / jnp.take(counts, indices, mode="clip")
    if mode == _MEAN:
        size = jnp.take(bag_size[: g.shape[0]], bag, mode="clip").astype(dt)
        scale = scale / jnp.where(size == 0, 1, size)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(dt)
    rows = jnp.take(g, bag, axis=0, mode="clip") * scale[:, None]
    return jnp.zeros((num_weights, g.shape[1]), dt).at[indices].add(rows)


def _bag_size(indices, bag, num_bags, pad):
    """The per-bag count of non-padding indices (what torch's forward gives in mean mode)."""
    return jax.ops.segment_sum(_kept(indices, pad).astype(jnp.int64), bag, num_segments=num_bags)


@register("aten::_embedding_bag_backward.default")
def _embedding_bag_backward(
    node, grad, indices, offsets, offset2bag, bag_size, max_indices, per_sample_weights
):
    if node.attrs["sparse"]:
        raise ValueError("_embedding_bag_backward: sparse=True gradients are not supported")
    bag = _bag_of(offsets, indices.shape[0], grad.shape[0])
    if node.attrs["mode"] == _MEAN:
        bag_size = _bag_size(indices, bag, grad.shape[0], node.attrs["padding_idx"])
    return _bag_weight_grad(node, grad, indices, bag, bag_size, max_indices, per_sample_weights)


@register("aten::_embedding_bag_dense_backward.default")
def _embedding_bag_dense_backward(
    node, grad, indices, offset2bag, bag_size, max_indices, per_sample_weights
):
    if node.attrs["mode"] != _MAX and offset2bag.shape[0] != indices.shape[0]:
        raise ValueError(
            "_embedding_bag_dense_backward: offset2bag must give every index's bag (torch's "
            "fast sum path leaves it empty; use _embedding_bag_backward)"
        )
    bag = offset2bag
    return _bag_weight_grad(node, grad, indices, bag, bag_size, max_indices, per_sample_weights)


@register("aten::_embedding_bag_per_sample_weights_backward.default")
def _embedding_bag_per_sample_weights_backward(node, grad, weight, indices, offsets, offset2bag):
    if node.attrs["mode"] != _SUM:
        raise ValueError(
            "_embedding_bag_per_sample_weights_backward: only mode='sum' has per_sample_weights"
        )
    dt = out_dtype(node)
    bag = _bag_of(offsets, indices.shape[0], grad.shape[0])
    rows = jnp.take(weight, indices, axis=0, mode="clip").astype(dt)
    g = jnp.take(grad.astype(dt), bag, axis=0, mode="clip")
    out = jnp.sum(rows * g, axis=1)
    return jnp.where(_kept(indices, node.attrs["padding_idx"]), out, jnp.zeros((), dt))


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


# -- CTC loss -------------------------------------------------------------------------------------


class _Ctc:
    """What the CTC forward and backward share: extended labels l' (blank, l1, blank, l2, ...,
    blank), the log-probabilities picked along them, and the static masks."""

    def __init__(self, node, log_probs, targets):
        a = node.attrs
        if log_probs.ndim != 3:
            raise ValueError("_ctc_loss: log_probs must be 3-D (T, N, C)")
        _require_float(log_probs, "_ctc_loss")
        T, N, C = log_probs.shape
        self.blank = blank = a["blank"]
        self.in_lens = in_lens = np.asarray(a["input_lengths"], np.int64).reshape(-1)
        self.tg_lens = tg_lens = np.asarray(a["target_lengths"], np.int64).reshape(-1)
        if len(in_lens) != N or len(tg_lens) != N:
            raise ValueError("_ctc_loss: input_lengths and target_lengths need one entry a batch")
        if (in_lens < 0).any() or (in_lens > T).any():
            raise ValueError(f"_ctc_loss: input_lengths must be in [0, {T}], got {in_lens}")
        if (tg_lens < 0).any():
            raise ValueError("_ctc_loss: target_lengths must be non-negative")
        if not 0 <= blank < C:
            raise ValueError(f"_ctc_loss: blank {blank} is not a class of {C}")
        L = int(tg_lens.max(initial=0))
        S = 2 * L + 1
        k = np.arange(L)
        if targets.ndim == 1:
            starts = np.concatenate([[0], np.cumsum(tg_lens)[:-1]])
            if tg_lens.sum() > targets.shape[0]:
                raise ValueError("_ctc_loss: targets are shorter than the target lengths' sum")
            flat = np.where(k[None] < tg_lens[:, None], starts[:, None] + k[None], 0)
            tg = jnp.take(targets, jnp.asarray(flat.reshape(-1)), mode="clip").reshape(N, L)
        else:
            if targets.shape[1] < L:
                raise ValueError(
                    f"_ctc_loss: targets have {targets.shape[1]} columns, target lengths reach {L}"
                )
            tg = targets[:, :L]
        tg = jnp.clip(tg.astype(jnp.int32), 0, C - 1)
        s = np.arange(S)
        lprime = jnp.full((N, S), blank, jnp.int32)
        if L:
            lprime = lprime.at[:, 1::2].set(tg)
        self.lprime = lprime
        self.ct = ct = _compute_dtype(log_probs.dtype)
        self.lp = log_probs.astype(ct)
        self.lp_ext = jnp.take_along_axis(
            self.lp, jnp.broadcast_to(lprime[None], (T, N, S)), axis=2
        )  # [T, N, S]
        self.valid_s = jnp.asarray(s[None, :] < 2 * tg_lens[:, None] + 1)  # [N, S]
        # Where alpha may come from s - 2 (l'(s-2) != l'(s)) and beta from s + 2.
        self.skip = jnp.asarray(s >= 2)[None] & (_shift(lprime, 2, -1) != lprime)
        self.skip_back = jnp.asarray(s + 2 < S)[None] & (_shift(lprime, -2, -1) != lprime)
        self.T, self.N, self.C, self.S = T, N, C, S

    def neg_inf(self, shape):
        return jnp.full(shape, _NEG_INF, self.ct)


def _logadd3(a, b, c):
    """log(e^a + e^b + e^c) as torch's CTC kernel computes it (max shift; 0 when all -inf)."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == _NEG_INF, jnp.zeros((), m.dtype), m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _shift(x, k: int, fill):
    """x shifted right (k > 0) or left (k < 0) along its last axis, ``fill`` coming in."""
    if abs(k) >= x.shape[-1]:
        return jnp.full(x.shape, fill, x.dtype)
    pad = jnp.full((*x.shape[:-1], abs(k)), fill, x.dtype)
    if k > 0:
        return jnp.concatenate([pad, x[..., :-k]], axis=-1)
    return jnp.concatenate([x[..., -k:], pad], axis=-1)


@register("aten::_ctc_loss.default")
def _ctc_loss(node, log_probs, targets):
    """(negative log-likelihood [N], log_alpha [N, T, 2 * max target length + 1]) by the
    forward algorithm in log space; log_alpha is -inf where torch leaves it unwritten."""
    c = _Ctc(node, log_probs, targets)
    T, N, S = c.T, c.N, c.S
    ninf = c.neg_inf((N, S))
    if T == 0:
        log_alpha = c.neg_inf((N, 0, S))
    else:
        s = jnp.arange(S)[None]
        has_target = jnp.asarray(c.tg_lens > 0)[:, None]
        alpha0 = jnp.where(s == 0, c.lp_ext[0], jnp.where((s == 1) & has_target, c.lp_ext[0], ninf))
        alpha0 = jnp.where(c.valid_s, alpha0, ninf)

        def step(alpha, lp_t):
            la3 = jnp.where(c.skip, _shift(alpha, 2, _NEG_INF), ninf)
            new = _logadd3(alpha, _shift(alpha, 1, _NEG_INF), la3) + lp_t
            new = jnp.where(c.valid_s, new, ninf)
            return new, new

        _, rest = lax.scan(step, alpha0, c.lp_ext[1:])
        log_alpha = jnp.concatenate([alpha0[None], rest], axis=0)  # [T, N, S]
        live = jnp.asarray(np.arange(T)[:, None] < c.in_lens[None, :])[..., None]
        log_alpha = jnp.where(live, log_alpha, jnp.full((), _NEG_INF, c.ct))
        log_alpha = jnp.transpose(log_alpha, (1, 0, 2))
    # The likelihood: alpha at the last input step, in l' positions 2L and 2L - 1.
    last_t = np.maximum(c.in_lens - 1, 0)
    rows = np.arange(N)
    if T == 0:
        l1 = l2 = c.neg_inf((N,))
    else:
        final = log_alpha[rows, last_t]  # [N, S]
        l1 = final[rows, 2 * c.tg_lens]
        l2 = jnp.where(
            jnp.asarray(c.tg_lens > 0), final[rows, np.maximum(2 * c.tg_lens - 1, 0)], _NEG_INF
        )
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == _NEG_INF, jnp.zeros((), m.dtype), m)
    nll = -(jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m)
    # No input steps: the empty target has likelihood 1, any other 0.
    empty = jnp.asarray(c.in_lens == 0)
    nll = jnp.where(empty, jnp.where(jnp.asarray(c.tg_lens == 0), -0.0, jnp.inf), nll)
    return nll.astype(out_dtype(node, 0)), log_alpha.astype(out_dtype(node, 1))


@register("aten::_ctc_loss_backward.default")
def _ctc_loss_backward(node, grad, log_probs, targets, nll, log_alpha):
    """torch's CTC gradient: beta by the backward recursion, then per class c at step t
    exp(lp) - exp(logsumexp_{s: l'(s) = c}(alpha + beta) + nll - lp), times the incoming
    gradient; zero past each input length, and for infinite losses when zero_infinity."""
    c = _Ctc(node, log_probs, targets)
    T, N, S, C = c.T, c.N, c.S, c.C
    dt = out_dtype(node)
    if T == 0:
        return jnp.zeros(log_probs.shape, dt)
    ninf = c.neg_inf((N, S))
    s = jnp.arange(S)[None]
    two_l = jnp.asarray(2 * c.tg_lens)[:, None]
    start = jnp.asarray(c.in_lens - 1)[:, None]  # the step each sequence's beta starts at

    def step(beta, xs):
        lp_t, t = xs
        init = jnp.where((s == two_l) | ((s == two_l - 1) & (two_l > 0)), lp_t, ninf)
        lb3 = jnp.where(c.skip_back, _shift(beta, -2, _NEG_INF), ninf)
        rec = _logadd3(beta, _shift(beta, -1, _NEG_INF), lb3) + lp_t
        new = jnp.where(t == start, init, jnp.where(t < start, rec, ninf))
        new = jnp.where(c.valid_s, new, ninf)
        return new, new

    ts = jnp.arange(T - 1, -1, -1)
    _, betas = lax.scan(step, ninf, (c.lp_ext[::-1], ts))
    log_beta = betas[::-1]  # [T, N, S]
    ab = jnp.transpose(log_alpha.astype(c.ct), (1, 0, 2)) + log_beta
    # Per class: logsumexp over the l' positions holding it (shift by each class's max).
    t_idx = jnp.arange(T)[:, None, None]
    n_idx = jnp.arange(N)[None, :, None]
    cls = jnp.broadcast_to(c.lprime[None], (T, N, S))
    mx = jnp.full((T, N, C), _NEG_INF, c.ct).at[t_idx, n_idx, cls].max(ab)
    mx = jnp.where(jnp.isfinite(mx), mx, jnp.zeros((), c.ct))
    share = jnp.exp(ab - mx[t_idx, n_idx, cls])
    total = jnp.zeros((T, N, C), c.ct).at[t_idx, n_idx, cls].add(share)
    lcab = jnp.log(total) + mx
    nll_b = nll.astype(c.ct)[None, :, None]
    g = (jnp.exp(c.lp) - jnp.exp(lcab + nll_b - c.lp)) * grad.astype(c.ct)[None, :, None]
    live = jnp.asarray(np.arange(T)[:, None] < c.in_lens[None, :])[..., None]
    g = jnp.where(live, g, jnp.zeros((), c.ct))
    if node.attrs["zero_infinity"]:
        g = jnp.where(nll_b == jnp.inf, jnp.zeros((), c.ct), g)
    return g.astype(dt)


# -- margin losses --------------------------------------------------------------------------------

_NONE, _MEAN_R, _SUM_R = 0, 1, 2


def _reduce(losses, reduction: int, shape):
    if reduction == _NONE:
        return losses.reshape(shape)
    if reduction == _MEAN_R:
        return jnp.mean(losses).reshape(shape)
    if reduction == _SUM_R:
        return jnp.sum(losses).reshape(shape)
    raise ValueError(f"reduction {reduction} is not one of 0 (none), 1 (mean), 2 (sum)")


def _multi_margin(x, target, p, margin, weight, reduction, shape):
    if not isinstance(p, (int, float)) or p not in (1, 2):
        raise ValueError(f"multi_margin_loss: p must be 1 or 2, got {p!r}")
    c = x.shape[-1] if x.ndim else 1
    x2 = x.reshape(-1, c)
    t = target.reshape(-1).astype(jnp.int32)
    picked = jnp.take_along_axis(x2, t[:, None], axis=1, mode="clip")
    z = margin - picked + x2
    h = jnp.where(z > 0, z if p == 1 else z * z, jnp.zeros((), x2.dtype))
    if weight is not None:
        h = h * jnp.take(weight.astype(x2.dtype), t, mode="clip")[:, None]
    h = jnp.where(jnp.arange(c)[None, :] == t[:, None], jnp.zeros((), x2.dtype), h)
    return _reduce(jnp.sum(h, axis=1) / c, reduction, shape)


@register("aten::multi_margin_loss.default")
def _multi_margin_loss(node, x, target, weight):
    a = node.attrs
    _require_float(x, "multi_margin_loss")
    dt = out_dtype(node)
    return _multi_margin(
        x.astype(dt), target, a["p"], a["margin"], weight, a["reduction"], out_dims(node)
    ).astype(dt)


@register("aten::multi_margin_loss_backward.default")
def _multi_margin_loss_backward(node, grad, x, target, weight):
    a = node.attrs
    dt = out_dtype(node)
    shape = grad.shape
    _, vjp = jax.vjp(
        lambda v: _multi_margin(v, target, a["p"], a["margin"], weight, a["reduction"], shape),
        x.astype(dt),
    )
    return vjp(grad.astype(dt))[0].astype(dt)


def _multilabel_margin(x, target, reduction, shape):
    c = x.shape[-1] if x.ndim else 1
    x2 = x.reshape(-1, c)
    t2 = target.reshape(-1, c).astype(jnp.int32)
    # A row's targets run up to its first negative entry.
    valid = jnp.cumprod((t2 >= 0).astype(jnp.int32), axis=1).astype(bool)
    safe = jnp.where(valid, t2, 0)
    rows = jnp.arange(x2.shape[0])[:, None]
    is_target = jnp.zeros(x2.shape, bool).at[rows, safe].max(valid)
    picked = jnp.take_along_axis(x2, safe, axis=1, mode="clip")  # [N, J]
    z = 1 - picked[:, :, None] + x2[:, None, :]  # [N, J, K]
    use = valid[:, :, None] & ~is_target[:, None, :] & (z > 0)
    losses = jnp.sum(jnp.where(use, z, jnp.zeros((), x2.dtype)), axis=(1, 2)) / c
    return _reduce(losses, reduction, shape), is_target


@register("aten::multilabel_margin_loss_forward.default")
def _multilabel_margin_loss(node, x, target):
    _require_float(x, "multilabel_margin_loss")
    dt = out_dtype(node)
    loss, is_target = _multilabel_margin(
        x.astype(dt), target, node.attrs["reduction"], out_dims(node)
    )
    return loss.astype(dt), is_target.reshape(out_dims(node, 1)).astype(out_dtype(node, 1))


@register("aten::multilabel_margin_loss_backward.default")
def _multilabel_margin_loss_backward(node, grad, x, target, is_target):
    dt = out_dtype(node)
    reduction = node.attrs["reduction"]
    _, vjp = jax.vjp(
        lambda v: _multilabel_margin(v, target, reduction, grad.shape)[0], x.astype(dt)
    )
    return vjp(grad.astype(dt))[0].astype(dt)


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
