"""Shape and layout: reshape, permute, expand, squeeze, slice, select, concat, pad, flip, and
tensors built from attributes alone (constants, full, arange)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import norm_dim, out_dims, out_dtype, register


@register(
    "aten::view.default",
    "aten::_unsafe_view.default",
    "aten::reshape.default",
    "aten::view_copy.default",
    "aten::squeeze.default",
    "aten::squeeze.dim",
    "aten::squeeze.dims",
    "aten::unsqueeze.default",
)
def _reshape(node, x):
    return x.reshape(out_dims(node))


@register("aten::permute.default")
def _permute(node, x):
    return jnp.transpose(x, [norm_dim(d, x.ndim) for d in node.attrs["dims"]])


@register("aten::transpose.int")
def _transpose(node, x):
    return jnp.swapaxes(x, node.attrs["dim0"], node.attrs["dim1"])


@register("aten::t.default")
def _t(node, x):
    return x.T


@register("aten::expand.default", "aten::expand_copy.default")
def _expand(node, x):
    return jnp.broadcast_to(x, out_dims(node))


@register("aten::slice.Tensor", "aten::slice_copy.Tensor")
def _slice(node, x):
    dim = norm_dim(node.attrs.get("dim", 0), x.ndim)
    start, end, step = _bounds(node.attrs, x.shape[dim])
    return lax.slice_in_dim(x, start, end, step, axis=dim)


def _bounds(attrs, size):
    start, end, step = attrs.get("start"), attrs.get("end"), attrs.get("step", 1)
    return slice(start, end, step).indices(size)


@register("aten::slice_scatter.default")
def _slice_scatter(node, x, src):
    dim = norm_dim(node.attrs.get("dim", 0), x.ndim)
    start, end, step = _bounds(node.attrs, x.shape[dim])
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@register("aten::select.int", "aten::select_copy.int")
def _select(node, x):
    dim = norm_dim(node.attrs["dim"], x.ndim)
    i = node.attrs["index"]
    return lax.index_in_dim(x, i + x.shape[dim] if i < 0 else i, axis=dim, keepdims=False)


@register("aten::select_scatter.default")
def _select_scatter(node, x, src):
    dim = norm_dim(node.attrs["dim"], x.ndim)
    i = node.attrs["index"]
    index = [slice(None)] * x.ndim
    index[dim] = i + x.shape[dim] if i < 0 else i
    return x.at[tuple(index)].set(src.astype(x.dtype))


@register("aten::cat.default", "aten::concat.default")
def _cat(node, xs):
    dt = out_dtype(node)
    xs = [x.astype(dt) for x in xs if x.size or x.ndim != 1]  # torch skips empty 1-D tensors
    return jnp.concatenate(xs, axis=norm_dim(node.attrs.get("dim", 0), len(out_dims(node))))


@register("aten::stack.default")
def _stack(node, xs):
    return jnp.stack(xs, axis=norm_dim(node.attrs.get("dim", 0), len(out_dims(node))))


@register(
    "aten::split_with_sizes.default", "aten::split.Tensor", "aten::split_with_sizes_copy.default"
)
def _split(node, x):
    dim = norm_dim(node.attrs.get("dim", 0), x.ndim)
    outs, start = [], 0
    for k in range(len(node.shapes)):
        size = node.shapes[k].dims[dim]
        outs.append(lax.slice_in_dim(x, start, start + size, axis=dim))
        start += size
    return tuple(outs)


@register("aten::constant_pad_nd.default")
def _constant_pad(node, x):
    pad = list(node.attrs["pad"])
    # torch lists (before, after) pairs from the last dim backwards; negative pads crop.
    config = [(0, 0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        config[x.ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1], 0)
    return lax.pad(x, jnp.asarray(node.attrs.get("value", 0), x.dtype), config)


@register("aten::flip.default")
def _flip(node, x):
    return jnp.flip(x, axis=[norm_dim(d, x.ndim) for d in node.attrs["dims"]])


@register("aten::roll.default")
def _roll(node, x):
    return jnp.roll(
        x, tuple(node.attrs["shifts"]), axis=tuple(node.attrs.get("dims") or ()) or None
    )


@register("aten::repeat.default")
def _repeat(node, x):
    return jnp.tile(x, tuple(node.attrs["repeats"]))


@register("aten::tril.default", "aten::triu.default")
def _tri(node, x):
    fn = jnp.tril if "tril" in node.op else jnp.triu
    return fn(x, node.attrs.get("diagonal", 0))


# -- tensors from attributes -----------------------------------------------------------------


@register("ir::constant")
def _constant(node):
    """A constant: attr ``value`` holds the raw bytes in the output dtype, C order."""
    dt = out_dtype(node)
    return jnp.asarray(np.frombuffer(node.attrs["value"], dtype=dt).reshape(out_dims(node)))


@register(
    "aten::full.default",
    "aten::scalar_tensor.default",
    "aten::zeros.default",
    "aten::ones.default",
    "aten::empty.memory_format",
    "aten::new_zeros.default",
    "aten::new_ones.default",
    "aten::new_full.default",
    "aten::new_empty.default",
    "aten::zeros_like.default",
    "aten::ones_like.default",
    "aten::full_like.default",
    "aten::empty_like.default",
)
def _full(node, *like):
    a = node.attrs
    op = node.op
    if "ones" in op:
        value = 1
    elif "zeros" in op or "empty" in op:
        value = 0
    else:
        value = a.get("fill_value", a.get("s", 0))
    return jnp.full(out_dims(node), value, dtype=out_dtype(node))


@register("aten::arange.start_step", "aten::arange.default", "aten::arange.start")
def _arange(node):
    a = node.attrs
    start, step = a.get("start", 0), a.get("step", 1)
    n = out_dims(node)[0]
    return (
        start + step * jnp.arange(n, dtype=np.float64 if isinstance(step, float) else np.int64)
    ).astype(out_dtype(node))


@register("ir::iota")
def _iota(node):
    return lax.broadcasted_iota(out_dtype(node), out_dims(node), node.attrs.get("dimension", 0))
