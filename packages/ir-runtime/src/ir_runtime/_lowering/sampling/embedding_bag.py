"""Embedding bags (_embedding_bag, sum, mean or max per bag) and their backward ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ir_runtime import _runtime_checks
from ir_runtime._lowering._registry import out_dims, out_dtype, register

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
    _runtime_checks.in_range(node, indices, 0, weight.shape[0], 0)
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
