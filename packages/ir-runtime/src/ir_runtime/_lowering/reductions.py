"""Reductions: sum, mean, max/min (values and indices), arg-max/min, prod, var/std, any/all,
logsumexp, cumulative sums."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ir_runtime._lowering._registry import norm_dim, norm_dims, out_dtype, register


def _dims(node, x):
    return norm_dims(node.attrs.get("dim"), x.ndim)


@register("aten::sum.default", "aten::sum.dim_IntList")
def _sum(node, x):
    dt = out_dtype(node)
    return jnp.sum(x.astype(dt), axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False))


@register("aten::mean.default", "aten::mean.dim")
def _mean(node, x):
    dt = out_dtype(node)
    return jnp.mean(x.astype(dt), axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False))


@register("aten::prod.default", "aten::prod.dim_int")
def _prod(node, x):
    dt = out_dtype(node)
    return jnp.prod(x.astype(dt), axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False))


@register("aten::amax.default", "aten::max.default")
def _amax(node, x):
    return jnp.max(x, axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False))


@register("aten::amin.default", "aten::min.default")
def _amin(node, x):
    return jnp.min(x, axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False))


def _with_indices(reduce, arg):
    def rule(node, x):
        dim = norm_dim(node.attrs["dim"], x.ndim)
        keep = node.attrs.get("keepdim", False)
        return reduce(x, axis=dim, keepdims=keep), arg(x, axis=dim, keepdims=keep).astype(
            out_dtype(node, 1)
        )

    return rule


register("aten::max.dim")(_with_indices(jnp.max, jnp.argmax))
register("aten::min.dim")(_with_indices(jnp.min, jnp.argmin))


def _arg(fn):
    def rule(node, x):
        dim = node.attrs.get("dim")
        keep = node.attrs.get("keepdim", False)
        if dim is None:
            out = fn(x.reshape(-1))
            return out.reshape((1,) * x.ndim if keep else ()).astype(out_dtype(node))
        return fn(x, axis=norm_dim(dim, x.ndim), keepdims=keep).astype(out_dtype(node))

    return rule


register("aten::argmax.default")(_arg(jnp.argmax))
register("aten::argmin.default")(_arg(jnp.argmin))


@register("aten::var.correction", "aten::var.dim", "aten::var.default")
def _var(node, x):
    correction = node.attrs.get("correction", 1 if node.attrs.get("unbiased", True) else 0)
    dt = out_dtype(node)
    return jnp.var(
        x.astype(dt),
        axis=_dims(node, x),
        ddof=correction,
        keepdims=node.attrs.get("keepdim", False),
    )


@register("aten::std.correction", "aten::std.dim", "aten::std.default")
def _std(node, x):
    return jnp.sqrt(_var(node, x))


@register("aten::any.default", "aten::any.dim", "aten::any.dims")
def _any(node, x):
    return jnp.any(x, axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False))


@register("aten::all.default", "aten::all.dim", "aten::all.dims")
def _all(node, x):
    return jnp.all(x, axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False))


@register("aten::logsumexp.default")
def _logsumexp(node, x):
    return jax.nn.logsumexp(
        x.astype(out_dtype(node)), axis=_dims(node, x), keepdims=node.attrs.get("keepdim", False)
    )


@register("aten::cumsum.default")
def _cumsum(node, x):
    return jnp.cumsum(x.astype(out_dtype(node)), axis=norm_dim(node.attrs["dim"], x.ndim))
