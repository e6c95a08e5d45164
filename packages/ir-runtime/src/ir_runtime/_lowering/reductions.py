"""Reductions: sum, mean, max/min (values and indices), arg-max/min, prod, var/std, any/all,
logsumexp, cumulative sums."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ir_runtime._lowering._registry import (
    NATIVE,
    norm_dim,
    norm_dims,
    out_dims,
    out_dtype,
    register,
)


def _dims(node, x):
    return norm_dims(node.attrs["dim"], x.ndim)


def _whole_and_dims(fn, cast):
    """Rules for a reduction's two overloads: over everything (``op.default``), and over
    ``dim`` with ``keepdim`` (``op.dim...``)."""

    def whole(node, x):
        return fn(x.astype(out_dtype(node)) if cast else x, axis=None).astype(out_dtype(node))

    def dims(node, x):
        x = x.astype(out_dtype(node)) if cast else x
        return fn(x, axis=_dims(node, x), keepdims=node.attrs["keepdim"]).astype(out_dtype(node))

    return whole, dims


for _name, _fn, _cast, _overloads in (
    ("sum", jnp.sum, True, ("default", "dim_IntList")),
    ("nansum", jnp.nansum, True, (None, "default")),
    ("mean", jnp.mean, True, ("default", "dim")),
    ("prod", jnp.prod, True, ("default", "dim_int")),
    ("amax", jnp.max, False, (None, "default")),
    ("amin", jnp.min, False, (None, "default")),
    ("max", jnp.max, False, ("default", None)),
    ("min", jnp.min, False, ("default", None)),
    ("any", jnp.any, False, ("default", "dim")),
    ("all", jnp.all, False, ("default", "dim")),
    ("logsumexp", jax.nn.logsumexp, True, (None, "default")),
):
    for _overload, _rule in zip(_overloads, _whole_and_dims(_fn, _cast), strict=True):
        if _overload is not None:
            register(f"aten::{_name}.{_overload}")(_rule)
register("aten::any.dims")(_whole_and_dims(jnp.any, False)[1])
register("aten::all.dims")(_whole_and_dims(jnp.all, False)[1])


def _with_indices(reduce, arg):
    def rule(node, x):
        if x.ndim == 0:  # one element: itself, at index 0
            return x, jnp.zeros((), out_dtype(node, 1))
        dim = norm_dim(node.attrs["dim"], x.ndim)
        keep = node.attrs["keepdim"]
        values = reduce(x, axis=dim, keepdims=keep)
        return values, arg(x, axis=dim, keepdims=keep).astype(out_dtype(node, 1))

    return rule


register("aten::max.dim")(_with_indices(jnp.max, jnp.argmax))
register("aten::min.dim")(_with_indices(jnp.min, jnp.argmin))


def _arg(fn):
    def rule(node, x):
        dim = node.attrs["dim"]
        keep = node.attrs["keepdim"]
        if dim is None or x.ndim == 0:
            out = fn(x.reshape(-1))
            return out.reshape((1,) * x.ndim if keep else ()).astype(out_dtype(node))
        return fn(x, axis=norm_dim(dim, x.ndim), keepdims=keep).astype(out_dtype(node))

    return rule


register("aten::argmax.default")(_arg(jnp.argmax))
register("aten::argmin.default")(_arg(jnp.argmin))


@register("aten::aminmax.default")
def _aminmax(node, x):
    dim, keep = node.attrs["dim"], node.attrs["keepdim"]
    axis = None if dim is None else _dims(node, x)
    lo = jnp.min(x, axis=axis, keepdims=keep and dim is not None)
    hi = jnp.max(x, axis=axis, keepdims=keep and dim is not None)
    return lo.reshape(out_dims(node, 0)), hi.reshape(out_dims(node, 1))


@register("aten::count_nonzero.dim_IntList", "aten::count_nonzero.default")
def _count_nonzero(node, x):
    return jnp.sum(x != 0, axis=_dims(node, x)).astype(out_dtype(node))


def _variance(x, node, ddof):
    dt = out_dtype(node)
    return jnp.var(x.astype(dt), axis=_dims(node, x), ddof=ddof, keepdims=node.attrs["keepdim"])


def _correction(node):
    """``correction`` (None: Bessel's, 1), as torch's var/std take it."""
    c = node.attrs["correction"]
    return 1 if c is None else c


def _unbiased(node):
    return 1 if node.attrs["unbiased"] else 0


@register("aten::var.correction")
def _var(node, x):
    return _variance(x, node, _correction(node))


@register("aten::var.dim")
def _var_dim(node, x):
    return _variance(x, node, _unbiased(node))


@register("aten::var.default")
def _var_all(node, x):
    return jnp.var(x.astype(out_dtype(node)), ddof=_unbiased(node))


@register("aten::std.correction")
def _std(node, x):
    return jnp.sqrt(_variance(x, node, _correction(node)))


@register("aten::std.dim")
def _std_dim(node, x):
    return jnp.sqrt(_variance(x, node, _unbiased(node)))


@register("aten::std.default")
def _std_all(node, x):
    return jnp.std(x.astype(out_dtype(node)), ddof=_unbiased(node))


def _with_mean(spread):
    def rule(node, x):
        dt = out_dtype(node)
        mean = jnp.mean(x.astype(dt), axis=_dims(node, x), keepdims=node.attrs["keepdim"])
        return spread(_variance(x, node, _correction(node))), mean

    return rule


register("aten::var_mean.correction")(_with_mean(lambda v: v))
register("aten::std_mean.correction")(_with_mean(jnp.sqrt))


@register("aten::hash_tensor.default")
def _hash_tensor(node, x):
    """torch's mode 0: the XOR of every element's bits, floats as float64 and integers as
    int64 (sign-extended), read as uint64."""
    if node.attrs["mode"] != 0:
        raise ValueError(f"hash_tensor mode {node.attrs['mode']} is not supported (only 0)")
    wide = np.float64 if jnp.issubdtype(x.dtype, jnp.floating) else np.int64
    bits = jax.lax.bitcast_convert_type(x.astype(wide), np.uint64)
    dims = _dims(node, x)
    out = jax.lax.reduce(bits, np.uint64(0), jax.lax.bitwise_xor, dims)
    if node.attrs["keepdim"]:
        out = out.reshape(out_dims(node))
    return out


def _accumulator(dt):
    """torch's CPU kernels accumulate float32 in float64 and half precision in float32."""
    if dt == np.float32:
        return np.float64
    if dt in (np.float16, jnp.bfloat16):
        return np.float32
    return dt


@register("aten::cumsum.default", rounding=NATIVE)  # it picks torch's accumulator itself
def _cumsum(node, x):
    dt = out_dtype(node)
    if x.ndim == 0:
        return x.astype(dt)
    axis = norm_dim(node.attrs["dim"], x.ndim)
    return jnp.cumsum(x.astype(_accumulator(dt)), axis=axis).astype(dt)
