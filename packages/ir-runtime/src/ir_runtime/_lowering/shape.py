"""Shape and layout: reshape, permute, expand, squeeze, slice, select, concat, pad, flip, and
tensors built from attributes alone (constants, full, arange); the optimization barrier and
the identities the graph keeps for their effect on XLA (annotate, materialize)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import NATIVE, family, norm_dim, out_dims, out_dtype

# Half precision: NATIVE (``_registry``): this family moves and builds data: nothing to compute
# in float32 (arange and linspace compute in float64 themselves).
register = family(NATIVE)


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
    if x.ndim == 0:  # torch takes dims 0 and -1 of a 0-d tensor: itself
        return x
    return jnp.swapaxes(x, node.attrs["dim0"], node.attrs["dim1"])


@register("aten::t.default")
def _t(node, x):
    return x.T


@register("aten::expand.default", "aten::expand_copy.default")
def _expand(node, x):
    return jnp.broadcast_to(x, out_dims(node))


@register("aten::slice.Tensor", "aten::slice_copy.Tensor")
def _slice(node, x):
    dim = norm_dim(node.attrs["dim"], x.ndim)
    start, end, step = _bounds(node.attrs, x.shape[dim])
    return lax.slice_in_dim(x, start, end, step, axis=dim)


def _bounds(attrs, size):
    start, end, step = attrs["start"], attrs["end"], attrs["step"]
    return slice(start, end, step).indices(size)


@register("aten::slice_scatter.default")
def _slice_scatter(node, x, src):
    dim = norm_dim(node.attrs["dim"], x.ndim)
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
    if not xs:  # every one of them was skipped
        return jnp.zeros(out_dims(node), dt)
    return jnp.concatenate(xs, axis=norm_dim(node.attrs["dim"], len(out_dims(node))))


@register("aten::stack.default")
def _stack(node, xs):
    return jnp.stack(xs, axis=norm_dim(node.attrs["dim"], len(out_dims(node))))


@register(
    "aten::split_with_sizes.default", "aten::split.Tensor", "aten::split_with_sizes_copy.default"
)
def _split(node, x):
    dim = norm_dim(node.attrs["dim"], x.ndim)
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
    return lax.pad(x, jnp.asarray(node.attrs["value"], x.dtype), config)


@register("aten::flip.default")
def _flip(node, x):
    return jnp.flip(x, axis=[norm_dim(d, x.ndim) for d in node.attrs["dims"]])


@register("aten::roll.default")
def _roll(node, x):
    return jnp.roll(x, tuple(node.attrs["shifts"]), axis=tuple(node.attrs["dims"]) or None)


@register("aten::repeat.default")
def _repeat(node, x):
    return jnp.tile(x, tuple(node.attrs["repeats"]))


register("aten::tril.default")(lambda node, x: jnp.tril(x, node.attrs["diagonal"]))
register("aten::triu.default")(lambda node, x: jnp.triu(x, node.attrs["diagonal"]))


# -- strided views and diagonals ---------------------------------------------------------------


def _strided_positions(node, x):
    """Which of ``x``'s elements (row-major: a lazy tensor is contiguous, as its strides say)
    each element of ``as_strided(x, size, stride, storage_offset)`` reads."""
    a = node.attrs
    size, stride = tuple(a["size"]), tuple(a["stride"])
    offset = a["storage_offset"] or 0
    positions = np.full(size, offset, np.int64)
    for k, (n, st) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[k] = n
        positions = positions + (np.arange(n, dtype=np.int64) * st).reshape(shape)
    if positions.size and (positions.min() < 0 or positions.max() >= x.size):
        raise ValueError(
            f"as_strided size {list(size)}, stride {list(stride)}, offset {offset} reads "
            f"outside the {x.size} elements of its input"
        )
    return positions


@register("aten::as_strided.default", "aten::as_strided_copy.default")
def _as_strided(node, x):
    return x.reshape(-1)[_strided_positions(node, x)]


@register("aten::as_strided_scatter.default")
def _as_strided_scatter(node, x, src):
    flat = x.reshape(-1).at[_strided_positions(node, x).reshape(-1)]
    return flat.set(src.reshape(-1).astype(x.dtype)).reshape(x.shape)


@register("aten::diagonal.default", "aten::diagonal_copy.default")
def _diagonal(node, x):
    a = node.attrs
    return jnp.diagonal(x, a["offset"], norm_dim(a["dim1"], x.ndim), norm_dim(a["dim2"], x.ndim))


def _diagonal_positions(shape, offset, dim1, dim2):
    """Index arrays addressing the ``offset`` diagonal of ``dim1``/``dim2`` of a ``shape``
    tensor, shaped as ``jnp.diagonal`` returns it (the diagonal last)."""
    n1, n2 = shape[dim1], shape[dim2]
    length = max(0, min(n1 + min(offset, 0), n2 - max(offset, 0)))
    k = np.arange(length)
    rows, cols = k - min(offset, 0), k + max(offset, 0)
    rest = [d for d in range(len(shape)) if d not in (dim1, dim2)]
    out_rank = len(rest) + 1
    index = [None] * len(shape)
    for j, d in enumerate(rest):
        view = [1] * out_rank
        view[j] = shape[d]
        index[d] = np.arange(shape[d]).reshape(view)
    index[dim1] = rows.reshape((1,) * len(rest) + (length,))
    index[dim2] = cols.reshape((1,) * len(rest) + (length,))
    return tuple(index)


def _scatter_diagonal(base, src, a):
    dim1, dim2 = norm_dim(a["dim1"], base.ndim), norm_dim(a["dim2"], base.ndim)
    where = _diagonal_positions(base.shape, a["offset"], dim1, dim2)
    return base.at[where].set(src.astype(base.dtype))


@register("aten::diagonal_scatter.default")
def _diagonal_scatter(node, x, src):
    return _scatter_diagonal(x, src, node.attrs)


@register("aten::diagonal_backward.default")
def _diagonal_backward(node, grad):
    return _scatter_diagonal(jnp.zeros(out_dims(node), grad.dtype), grad, node.attrs)


@register("aten::diag_embed.default")
def _diag_embed(node, x):
    return _scatter_diagonal(jnp.zeros(out_dims(node), out_dtype(node)), x, node.attrs)


@register("aten::resize.default", "aten::resize_as.default")
def _resize(node, x, *like):
    """A tensor of the new size holding ``x``'s elements in order; elements past them are
    uninitialized in torch, zeros here."""
    n = int(np.prod(out_dims(node)))
    flat = x.reshape(-1)[:n]
    if flat.size < n:
        flat = jnp.concatenate([flat, jnp.zeros((n - flat.size,), x.dtype)])
    return flat.reshape(out_dims(node))


# -- tensors from attributes -----------------------------------------------------------------


def _filled(value):
    """A factory's rule: its output shape and dtype, every element ``value(attrs)``."""

    def rule(node, *like):
        return jnp.full(out_dims(node), value(node.attrs), dtype=out_dtype(node))

    return rule


# Uninitialized memory (empty, empty_like, new_empty), as torch promises it: zeros here.
register(
    "aten::zeros.default",
    "aten::new_zeros.default",
    "aten::zeros_like.default",
    "aten::empty.memory_format",
    "aten::new_empty.default",
    "aten::empty_like.default",
)(_filled(lambda a: 0))
register("aten::ones.default", "aten::new_ones.default", "aten::ones_like.default")(
    _filled(lambda a: 1)
)
register("aten::full.default", "aten::new_full.default", "aten::full_like.default")(
    _filled(lambda a: a["fill_value"])
)
register("aten::scalar_tensor.default")(_filled(lambda a: a["s"]))


def _arange_from(start, end, step, node):
    n = out_dims(node)[0]
    exact = all(isinstance(v, int) for v in (start, end, step))
    return (start + step * jnp.arange(n, dtype=np.int64 if exact else np.float64)).astype(
        out_dtype(node)
    )


register("aten::arange.default")(lambda node: _arange_from(0, node.attrs["end"], 1, node))
register("aten::arange.start")(
    lambda node: _arange_from(node.attrs["start"], node.attrs["end"], 1, node)
)
register("aten::arange.start_step")(
    lambda node: _arange_from(node.attrs["start"], node.attrs["end"], node.attrs["step"], node)
)


@register("aten::eye.default", "aten::eye.m")
def _eye(node):
    n, m = out_dims(node)
    return jnp.eye(n, m, dtype=out_dtype(node))


def _spaced(start, end, steps):
    """torch's linspace: from both ends toward the middle, so both ends are exact."""
    if steps == 1:
        return np.array([start], np.float64)
    step = (end - start) / (steps - 1)
    i = np.arange(steps, dtype=np.float64)
    return np.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


@register("aten::linspace.default")
def _linspace(node):
    a = node.attrs
    dt = out_dtype(node)
    values = _spaced(float(a["start"]), float(a["end"]), a["steps"])
    return jnp.asarray(values, np.float64).astype(dt)


@register("aten::logspace.default")
def _logspace(node):
    a = node.attrs
    exponents = _spaced(float(a["start"]), float(a["end"]), a["steps"])
    return jnp.power(float(a["base"]), jnp.asarray(exponents)).astype(out_dtype(node))


@register("ir::optimization_barrier")
def _optimization_barrier(node, *xs):
    """The operands unchanged, as values XLA may neither see through nor compute before all of
    them exist (activation checkpointing's recompute)."""
    return tuple(lax.optimization_barrier(tuple(xs)))


@register("ir::annotate")
def _annotate(node, x):
    """``x`` unchanged: the node exists for its sharding, which lowering applies to its
    output (``mark_sharding_with_gradients``'s gradient, ``shard_as``)."""
    return x


FFI_MATERIALIZE = "ir_runtime_materialize"  # the CPU handler's name in XLA's FFI registry
_REGISTERED: list = []  # [True] once the handler is registered (at the first CPU lowering)


def register_handler() -> None:
    """Register ``ir::materialize``'s CPU handler (``_ffi``) with XLA, once."""
    if not _REGISTERED:
        from ir_runtime._lowering import _ffi

        jax.ffi.register_ffi_target(FFI_MATERIALIZE, _ffi.materialize(), platform="cpu")
        _REGISTERED.append(True)


def _handed_on(x):
    """``x`` through the CPU handler of ``ir::materialize``: a custom call whose result is its
    operand's buffer (aliased), the handler registered at its first use."""
    register_handler()
    call = jax.ffi.ffi_call(
        FFI_MATERIALIZE,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={0: 0},
        vmap_method="broadcast_all",
    )
    return call(x)


@jax.custom_jvp
def materialized(x):
    """``x`` unchanged, computed into a buffer of its own: on XLA's CPU through a custom call,
    which XLA does not fuse into ``x``'s consumers; elsewhere ``x`` itself. Its derivative is
    the identity's (a region's ``jax.vjp`` may meet it)."""
    return lax.platform_dependent(x, cpu=_handed_on, default=lambda x: x)


@materialized.defjvp
def _materialized_jvp(primals, tangents):
    return materialized(primals[0]), tangents[0]


@register("ir::materialize")
def _materialize(node, x):
    """``x`` unchanged, computed once (``_rewrite._computed_once``): XLA's CPU fusion would
    evaluate an elementwise producer again in every fusion that consumes it, per element each
    makes (a rotary embedding's cos, broadcast over the heads)."""
    return materialized(x)


@register("ir::shard_alike")
def _shard_alike(node, x, y):
    """``x`` and ``y`` unchanged, placed alike: XLA picks one placement for both (``shard_as``
    when neither is annotated)."""
    from jax.experimental.shard_alike import shard_alike

    return tuple(shard_alike(x, y))
