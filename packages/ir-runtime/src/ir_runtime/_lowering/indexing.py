"""Indexing: gather and scatter (with every reduction), index_select/add/copy/fill/reduce,
index and index_put, take and put, masked_scatter, embedding (and its max_norm renorm).

In a checked program (``_runtime_checks``) every index is checked against the size of the dim
it addresses, with the range torch takes for that op: ``-size..size-1`` for index, index_put,
index_fill, take and put; ``0..size-1`` for the others."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ir_runtime import _runtime_checks
from ir_runtime._lowering._registry import NATIVE, ONCE, family, norm_dim, out_dims, out_dtype

# Half precision (``_registry``): NATIVE, this family moves data by index; the rules that add or
# multiply into their positions (scatter's reductions, index_add, index_reduce, index_put and put
# with accumulate, embedding's backward) are ONCE: they accumulate in float32 and round once.
# Eager does so in scatter_add and scatter_reduce, and in index_add along dim 0 of a matrix;
# elsewhere (index_put, put, index_reduce, embedding's backward, a vector's index_add) its loops
# round after every addition, in their order: ONCE is nearer the exact sum than that, and
# does not depend on the order XLA's scatter adds in.
register = family(NATIVE)


def _check(node, x, index, dim: int, negative: bool = False):
    """In a checked program: ``index`` addresses dim ``dim`` of ``x`` (a 0-d ``x``: one
    position); ``negative``: counting from the end too, as torch allows for this op."""
    size = x.shape[dim] if x.ndim else 1
    _runtime_checks.in_range(node, index, -size if negative else 0, size, dim)


def _grids(index, dim):
    """Full index arrays addressing ``x`` at ``index`` (shaped like the index) along ``dim``,
    and at the index's own position along every other dim (torch's gather/scatter)."""
    grids = list(jnp.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


@register("aten::gather.default")
def _gather(node, x, index):
    if index.size == 0:  # torch takes an empty index of any rank
        return jnp.zeros(index.shape, x.dtype)
    dim = norm_dim(node.attrs["dim"], x.ndim)
    _check(node, x, index, dim)
    if x.ndim == 0:
        return jnp.broadcast_to(x, index.shape)
    return x[_grids(index, dim)]


def _identity(reduce, dtype):
    """The value a reduction starts from: what leaves any element unchanged."""
    if reduce in ("sum", "mean"):
        return np.array(0, dtype)
    if reduce == "prod":
        return np.array(1, dtype)
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype)
    if reduce == "amax":
        return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else info.min, dtype)
    return np.array(np.inf if jnp.issubdtype(dtype, jnp.floating) else info.max, dtype)


def _apply(at, reduce, values):
    if reduce in ("sum", "mean"):
        return at.add(values)
    if reduce == "prod":
        return at.multiply(values)
    if reduce == "amax":
        return at.max(values)
    if reduce == "amin":
        return at.min(values)
    raise ValueError(f"unknown reduction {reduce!r}: sum, prod, mean, amax or amin")


def _reduce_into(x, where, values, reduce, include_self):
    """``x`` with ``values`` reduced into the positions ``where`` (an index tuple), as torch's
    scatter_reduce/index_reduce do: ``include_self`` False leaves x out of every position
    written; ``mean`` divides by how many values (and x, if included) each position got."""
    base = x if include_self else x.at[where].set(_identity(reduce, x.dtype))
    out = _apply(base.at[where], reduce, values)
    if reduce != "mean":
        return out
    counts = jnp.zeros(x.shape, x.dtype).at[where].add(jnp.ones_like(values))
    if include_self:
        counts = counts + 1
    counts = jnp.maximum(counts, jnp.ones((), x.dtype))
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.floor_divide(out, counts)
    return out / counts


def _source(src, index, dtype):
    """The part of ``src`` that ``index`` addresses (torch lets src be larger)."""
    return src[tuple(slice(0, s) for s in index.shape)].astype(dtype)


def _scatter_rule(mode):
    """``scatter`` overloads: the values from ``src`` or the scalar ``value``, written (mode
    None) or reduced ("add"/"multiply", torch's names for sum and prod)."""
    reduce = {None: None, "add": "sum", "multiply": "prod"}

    def rule(node, x, index, src=None):
        if index.size == 0:  # nothing to write (an empty index may have other dims)
            return x
        if x.ndim == 0:
            x, index = x.reshape(1), index.reshape(1)
            src = None if src is None else src.reshape(1)
            return rule(node, x, index, src).reshape(())
        dim = norm_dim(node.attrs["dim"], x.ndim)
        _check(node, x, index, dim)
        if src is None:
            values = jnp.full(index.shape, node.attrs["value"], x.dtype)
        else:
            values = _source(src, index, x.dtype)
        where = _grids(index, dim)
        how = reduce[node.attrs["reduce"]] if mode == "reduce" else None
        if how is None:
            return x.at[where].set(values)
        return _apply(x.at[where], how, values)

    return rule


register("aten::scatter.src", "aten::scatter.value")(_scatter_rule(None))
register("aten::scatter.reduce", "aten::scatter.value_reduce", rounding=ONCE)(
    _scatter_rule("reduce")
)


@register("aten::scatter_add.default", rounding=ONCE)
def _scatter_add(node, x, index, src):
    if index.size == 0:  # (gather's backward of an empty index of other dims)
        return x
    dim = norm_dim(node.attrs["dim"], x.ndim)
    _check(node, x, index, dim)
    if x.ndim == 0:
        return x + jnp.sum(src.reshape(-1)[: index.size].astype(x.dtype))
    return x.at[_grids(index, dim)].add(_source(src, index, x.dtype))


@register("aten::scatter_reduce.two", rounding=ONCE)
def _scatter_reduce(node, x, index, src):
    if index.size == 0:
        return x
    a = node.attrs
    dim = norm_dim(a["dim"], x.ndim)
    _check(node, x, index, dim)
    if x.ndim == 0:
        x, index, src = x.reshape(1), index.reshape(1), src.reshape(1)
        return _reduce_into(x, (index,), src, a["reduce"], a["include_self"]).reshape(())
    where = _grids(index, dim)
    return _reduce_into(x, where, _source(src, index, x.dtype), a["reduce"], a["include_self"])


def _along(x, dim, index):
    """The index tuple addressing ``x`` at ``index`` (1-D) along ``dim``, every position
    elsewhere."""
    return (slice(None),) * dim + (index,)


def _index_args(node, x, index, negative: bool = False):
    """The dim, and the index tuple addressing ``x`` at ``index`` along it (checked)."""
    dim = norm_dim(node.attrs["dim"], x.ndim)
    _check(node, x, index, dim, negative)
    return dim, _along(x, dim, index.reshape(-1))


@register("aten::index_select.default")
def _index_select(node, x, index):
    dim = norm_dim(node.attrs["dim"], x.ndim)
    _check(node, x, index, dim)
    if x.ndim == 0:
        return jnp.broadcast_to(x, out_dims(node))
    return jnp.take(x, index.reshape(-1), axis=dim)


def _index_source(source, x, dim):
    """index_add/copy's source, its indexed dim as in x's layout (0-d sources as 1 element)."""
    return source.reshape((*x.shape[:dim], -1, *x.shape[dim + 1 :])).astype(x.dtype)


@register("aten::index_add.default", rounding=ONCE)
def _index_add(node, x, index, source):
    dim, where = _index_args(node, x, index)
    if x.ndim == 0:
        return x + source.reshape(()).astype(x.dtype) * node.attrs["alpha"]
    return x.at[where].add(_index_source(source, x, dim) * node.attrs["alpha"])


@register("aten::index_copy.default")
def _index_copy(node, x, index, source):
    dim, where = _index_args(node, x, index)
    if x.ndim == 0:
        return source.reshape(()).astype(x.dtype)
    return x.at[where].set(_index_source(source, x, dim))


@register("aten::index_fill.int_Scalar")
def _index_fill(node, x, index):
    _, where = _index_args(node, x, index, negative=True)
    if x.ndim == 0:
        return jnp.full((), node.attrs["value"], x.dtype)
    return x.at[where].set(jnp.asarray(node.attrs["value"], x.dtype))


@register("aten::index_fill.int_Tensor")
def _index_fill_tensor(node, x, index, value):
    _, where = _index_args(node, x, index, negative=True)
    if x.ndim == 0:
        return value.astype(x.dtype).reshape(())
    return x.at[where].set(value.astype(x.dtype))


@register("aten::index_reduce.default", rounding=ONCE)
def _index_reduce(node, x, index, source):
    a = node.attrs
    dim, where = _index_args(node, x, index)
    if x.ndim == 0:
        x, source = x.reshape(1), source.reshape(1)
        return _reduce_into(x, (index.reshape(-1),), source, a["reduce"], a["include_self"])[0]
    values = _index_source(source, x, dim)
    return _reduce_into(x, where, values, a["reduce"], a["include_self"])


def _indices(node, x, indices):
    """aten::index's index list (checked): a dim without a tensor (None) takes every
    position."""
    for dim, i in enumerate(indices[: x.ndim]):
        if i is not None:
            _check(node, x, i, dim, negative=True)
    return tuple(slice(None) if i is None else i for i in indices)


@register("aten::index.Tensor", "aten::_unsafe_index.Tensor")
def _index(node, x, indices):
    for i in indices:
        if i is not None and i.dtype == jnp.bool_:
            raise ValueError(
                "a boolean mask index has a data-dependent shape; the front end turns it into "
                "integer indices before recording"
            )
    return x[_indices(node, x, indices)]


@register(
    "aten::index_put.default",
    "aten::_index_put_impl.default",
    "aten::_unsafe_index_put.default",
    rounding=ONCE,
)
def _index_put(node, x, indices, values):
    where = x.at[_indices(node, x, indices)]
    values = values.astype(x.dtype)
    return where.add(values) if node.attrs["accumulate"] else where.set(values)


@register("aten::take.default")
def _take(node, x, index):
    _runtime_checks.in_range(node, index, -x.size, x.size)
    return x.reshape(-1)[index]


@register("aten::put.default", rounding=ONCE)
def _put(node, x, index, source):
    _runtime_checks.in_range(node, index, -x.size, x.size)
    flat = x.reshape(-1)
    values = source.reshape(-1).astype(x.dtype)
    at = flat.at[index.reshape(-1)]
    out = at.add(values) if node.attrs["accumulate"] else at.set(values)
    return out.reshape(x.shape)


def _masked_positions(mask, shape):
    """For each element (row-major) of a ``shape`` tensor: whether ``mask`` selects it, and
    which selected element it is."""
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    return m, jnp.cumsum(m.astype(np.int64)) - 1


@register("aten::masked_scatter.default")
def _masked_scatter(node, x, mask, source):
    m, k = _masked_positions(mask, out_dims(node))
    flat = jnp.broadcast_to(x, out_dims(node)).reshape(-1)
    if source.size == 0:  # nothing to take: the mask selects nothing
        return flat.reshape(out_dims(node))
    taken = source.reshape(-1).astype(x.dtype)[jnp.clip(k, 0, max(source.size - 1, 0))]
    return jnp.where(m, taken, flat).reshape(out_dims(node))


@register("aten::masked_scatter_backward.default")
def _masked_scatter_backward(node, grad, mask):
    """The source's gradient: the selected elements of ``grad`` in order, zeros after."""
    m, k = _masked_positions(mask, grad.shape)
    n = int(np.prod(out_dims(node)))
    slots = jnp.where(m, k, n)  # unselected elements go past the end, and are dropped
    out = jnp.zeros((n,), grad.dtype).at[slots].add(grad.reshape(-1), mode="drop")
    return out.reshape(out_dims(node))


@register("aten::nonzero_static.default")
def _nonzero_static(node, x):
    """The first ``size`` nonzero positions (row-major), padded with ``fill_value``."""
    size = node.attrs["size"]
    if x.ndim == 0:  # positions of a 0-d tensor have no coordinates
        return jnp.zeros(out_dims(node), out_dtype(node))
    if x.size == 0:  # (jnp.nonzero pads an empty array with 0, not fill_value)
        return jnp.full(out_dims(node), node.attrs["fill_value"], out_dtype(node))
    found = jnp.nonzero(x, size=size, fill_value=node.attrs["fill_value"])
    return jnp.stack(found, axis=1).astype(out_dtype(node)).reshape(out_dims(node))


@register("aten::embedding.default")
def _embedding(node, weight, indices):
    _check(node, weight, indices, 0)
    return jnp.take(weight, indices, axis=0)


@register("aten::embedding_renorm.default")
def _embedding_renorm(node, weight, indices):
    """The rows ``indices`` names whose ``norm_type``-norm exceeds ``max_norm``, scaled to
    ``max_norm`` (F.embedding's ``max_norm``), as torch does: by ``max_norm / (norm + 1e-7)``."""
    max_norm, p = node.attrs["max_norm"], node.attrs["norm_type"]
    _check(node, weight, indices, 0)
    named = jnp.zeros((weight.shape[0],), bool).at[indices.reshape(-1)].set(True)
    norm = jnp.linalg.vector_norm(weight, ord=p, axis=1).astype(jnp.float64)
    scale = (max_norm / (norm + 1e-7)).astype(weight.dtype)
    return jnp.where((named & (norm > max_norm))[:, None], weight * scale[:, None], weight)


@register("aten::embedding_dense_backward.default", rounding=ONCE)
def _embedding_backward(node, grad, indices):
    n = node.attrs["num_weights"]
    pad = node.attrs["padding_idx"]
    flat = indices.reshape(-1)
    g = grad.reshape(flat.shape[0], grad.shape[-1])  # not -1: there may be no ids
    if pad >= 0:
        g = jnp.where((flat == pad)[:, None], jnp.zeros((), g.dtype), g)
    if node.attrs["scale_grad_by_freq"]:  # each occurrence's share: 1 / how often its id occurs
        counts = jnp.zeros((n,), jnp.int64).at[flat].add(1)
        g = g * (1 / counts[flat][:, None]).astype(g.dtype)
    return jnp.zeros((n, g.shape[1]), g.dtype).at[flat].add(g).astype(out_dtype(node))
