"""segment_reduce and its backward (torch's _segment_reduce_cpu_kernel2, by lengths or
offsets).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ir_runtime._lowering._registry import ieee_div, norm_dim, out_dtype, register
from ir_runtime._lowering.sorting._common import _key, is_float

_SEGMENT_REDUCTIONS = ("max", "mean", "min", "sum", "prod")


def _segments(op, data, lengths, offsets, axis: int):
    """Per position along ``axis``: its segment (``seg``, (B, L)) and whether it is in one;
    the segments' lengths (B, S); the data as (B, L, I)."""
    if (lengths is None) == (offsets is None):
        raise ValueError(f"{op}: give exactly one of lengths and offsets")
    ref = lengths if lengths is not None else offsets
    axis = norm_dim(axis, data.ndim)
    if ref.ndim - 1 != axis:
        raise ValueError(
            f"{op}: axis={axis} but lengths/offsets have {ref.ndim} dims (torch reduces along "
            f"their last dim, dim {ref.ndim - 1})"
        )
    lead = data.shape[:axis]
    b = math.prod(lead)
    size = data.shape[axis]
    d3 = data.reshape(b, size, -1)
    ref = ref.astype(jnp.int64).reshape(b, ref.shape[-1])
    if lengths is not None:
        lens = ref
        starts = jnp.cumsum(lens, axis=1) - lens
    else:
        starts = ref[:, :-1]
        lens = ref[:, 1:] - starts
    ends = starts + lens
    s = lens.shape[1]
    pos = jnp.arange(size, dtype=jnp.int64)
    seg = jax.vmap(lambda e: jnp.searchsorted(e, pos, side="right"))(ends)
    seg_c = jnp.clip(seg, 0, max(s - 1, 0))
    inside = (seg < s) & (pos[None, :] >= jnp.take_along_axis(starts, seg_c, axis=1))
    return seg_c, inside, lens, d3, lead


def _by_segment(values, seg, inside, s: int, combine: str, start=None):
    """Reduce ``values`` (B, L, I) into (B, S, I) by segment, each from ``start`` (a scalar;
    the combination's identity by default), its elements added (multiplied...) in order."""
    b, size, inner = values.shape
    gid = jnp.where(inside, jnp.arange(b)[:, None] * s + seg, b * s).reshape(-1)
    flat = values.reshape(b * size, inner)
    dt = values.dtype
    if start is None:
        if combine in ("sum", "prod"):
            start = 0 if combine == "sum" else 1
        elif jnp.issubdtype(dt, jnp.floating):
            start = -jnp.inf if combine == "max" else jnp.inf
        else:
            start = jnp.iinfo(dt).min if combine == "max" else jnp.iinfo(dt).max
    base = jnp.full((b * s + 1, inner), jnp.asarray(start, dt))
    at = base.at[gid]
    out = {"sum": at.add, "max": at.max, "min": at.min, "prod": at.multiply}[combine](flat)
    return out[: b * s].reshape(b, s, inner)


def _reduce_name(op, reduce):
    if reduce not in _SEGMENT_REDUCTIONS:
        raise ValueError(f"{op}: reduce={reduce!r} (expected one of {_SEGMENT_REDUCTIONS})")
    return reduce


@register("aten::segment_reduce.default")
def _segment_reduce(node, data, lengths, indices, offsets):
    op = "segment_reduce"
    if indices is not None:
        raise ValueError(f"{op}: indices are not supported (torch reduces by lengths or offsets)")
    if not is_float(data):
        raise ValueError(f"{op}: data must be floating point, got {data.dtype}")
    reduce = _reduce_name(op, node.attrs["reduce"])
    initial = node.attrs["initial"]
    seg, inside, lens, d3, lead = _segments(op, data, lengths, offsets, node.attrs["axis"])
    s = lens.shape[1]
    dt = data.dtype
    lens3 = lens[:, :, None]
    if reduce in ("sum", "mean"):
        out = _by_segment(d3, seg, inside, s, "sum", initial)
        if reduce == "mean":  # an empty segment: NaN, or the initial value as it is
            empty = jnp.asarray(jnp.nan, dt) if initial is None else out
            out = jnp.where(lens3 > 0, ieee_div(out, lens3.astype(dt)), empty)
    elif reduce == "prod":
        out = _by_segment(d3, seg, inside, s, "prod", initial)
    else:
        out = _segment_extreme(d3, seg, inside, s, reduce == "max", initial)
    shape = (*lead, s, *data.shape[len(lead) + 1 :])
    return out.reshape(shape).astype(out_dtype(node))


def _segment_extreme(d3, seg, inside, s: int, largest: bool, initial):
    """torch's fold ``v = isnan(d) ? d : std::max(v, d)`` (std::min) from the initial value:
    NaN if any; else the first of (initial, data...) to reach the extreme (ties keep the
    earlier: that is which of -0.0 and 0.0 comes out)."""
    size = d3.shape[1]
    dt = d3.dtype
    k = _key(d3, nan_low=not largest)
    best = _by_segment(k, seg, inside, s, "max" if largest else "min")
    at = jnp.broadcast_to(seg[:, :, None], d3.shape)
    hit = inside[:, :, None] & (k == jnp.take_along_axis(best, at, axis=1))
    pos = jnp.broadcast_to(jnp.arange(size)[None, :, None], d3.shape)
    first = _by_segment(jnp.where(hit, pos, size), seg, inside, s, "min")
    value = jnp.take_along_axis(d3, jnp.clip(first, 0, max(size - 1, 0)), axis=1)
    ident = jnp.asarray(-jnp.inf if largest else jnp.inf, dt)
    value = jnp.where(first < size, value, ident)
    init = ident if initial is None else jnp.asarray(initial, dt)
    keep_init = ~(init < value) if largest else ~(value < init)
    return jnp.where(jnp.isnan(value), value, jnp.where(jnp.isnan(init) | keep_init, init, value))


def _segmented_scan_prod(v, start):
    """Inclusive products along axis 1 of ``v`` (B, L, I), restarting where ``start`` (B, L)."""

    def combine(a, b):
        (va, fa), (vb, fb) = a, b
        return jnp.where(fb[..., None], vb, va * vb), fa | fb

    return lax.associative_scan(combine, (v, start), axis=1)[0]


@register("aten::_segment_reduce_backward.default")
def _segment_reduce_backward(node, grad, output, data, lengths, offsets):
    op = "segment_reduce backward"
    reduce = _reduce_name(op, node.attrs["reduce"])
    initial = node.attrs["initial"]
    seg, inside, lens, d3, _ = _segments(op, data, lengths, offsets, node.attrs["axis"])
    b, size, inner = d3.shape
    s = lens.shape[1]
    dt = d3.dtype
    g3 = grad.reshape(b, s, inner)
    o3 = output.reshape(b, s, inner)
    at = seg[:, :, None]
    gp = jnp.take_along_axis(g3, jnp.broadcast_to(at, (b, size, inner)), axis=1)
    op_ = jnp.take_along_axis(o3, jnp.broadcast_to(at, (b, size, inner)), axis=1)
    lp = jnp.take_along_axis(lens, seg, axis=1)[:, :, None]
    ins = inside[:, :, None]
    if reduce in ("max", "min"):
        hit = ins & (jnp.isnan(d3) | (d3 == op_))
        count = _by_segment(hit.astype(jnp.int64), seg, inside, s, "sum")
        cp = jnp.take_along_axis(count, jnp.broadcast_to(at, (b, size, inner)), axis=1)
        gi = jnp.where(hit, gp, 0)
        # torch divides by the count only the gradients above 0 (so does this).
        gi = jnp.where((cp >= 2) & (gi > 0), ieee_div(gi, cp.astype(dt)), gi)
    elif reduce == "mean":
        gi = jnp.where(ins, ieee_div(gp, lp.astype(dt)), 0)
    elif reduce == "sum":
        gi = jnp.where(ins, gp, 0)
    else:  # prod
        special = jnp.isnan(d3) | (d3 == 0)
        plain = ieee_div(gp * op_, d3)
        pos = jnp.arange(size)
        starts = jnp.take_along_axis(jnp.cumsum(lens, axis=1) - lens, seg, axis=1)
        if offsets is not None:
            o = offsets.astype(jnp.int64).reshape(b, -1)
            starts = jnp.take_along_axis(o[:, :-1], seg, axis=1)
        last_pos = starts + jnp.take_along_axis(lens, seg, axis=1) - 1
        first = ~inside | (pos[None, :] == starts)
        last = ~inside | (pos[None, :] == last_pos)
        v = jnp.where(ins, d3, jnp.ones_like(d3))
        incl = _segmented_scan_prod(v, first)
        before = jnp.where(first[:, :, None], 1, jnp.roll(incl, 1, axis=1))
        rincl = _segmented_scan_prod(v[:, ::-1], last[:, ::-1])[:, ::-1]
        after = jnp.where(last[:, :, None], 1, jnp.roll(rincl, -1, axis=1))
        init = jnp.asarray(1 if initial is None else initial, dt)
        excl = init * before * after
        gi = jnp.where(ins, jnp.where(special, gp * excl, plain), 0)
    gi = jnp.where(lp > 0, gi, 0)
    return gi.reshape(data.shape).astype(out_dtype(node))
