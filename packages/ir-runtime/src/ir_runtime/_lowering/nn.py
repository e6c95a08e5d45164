"""Neural-network ops: softmax and log-softmax with their backward ops, NLL loss, layer norm,
batch norm, pooling. Backward ops without a short closed form go through jax.vjp of the forward
rule, so the pair always agrees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ir_runtime import _runtime_checks
from ir_runtime._lowering._registry import norm_dim, out_dtype, register


def _along_dim(fn, node, *xs):
    """``fn(*xs, axis)`` along the node's ``dim``; a 0-d tensor is its one element (torch takes
    dim 0 or -1 there: softmax 1, log-softmax 0)."""
    rank = xs[0].ndim
    axis = norm_dim(node.attrs["dim"], rank)
    if rank:
        return fn(*xs, axis).astype(out_dtype(node))
    return fn(*(x.reshape(1) for x in xs), 0).reshape(()).astype(out_dtype(node))


def _softmax_along(v, axis):
    """``exp(v - max - log(sum(exp(v - max))))``: the normalizer is subtracted inside the
    exponent, so XLA fuses the last pass into one elementwise loop instead of keeping a
    full-size broadcast of ``1 / sum`` (what ``v / sum`` becomes on its CPU backend)."""
    shifted = v - jnp.max(v, axis=axis, keepdims=True)
    return jnp.exp(shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True)))


@register("aten::_softmax.default", "aten::softmax.int")
def _softmax(node, x):
    return _along_dim(_softmax_along, node, x.astype(out_dtype(node)))


@register("aten::_log_softmax.default", "aten::log_softmax.int")
def _log_softmax(node, x):
    return _along_dim(lambda v, a: jax.nn.log_softmax(v, axis=a), node, x.astype(out_dtype(node)))


@register("aten::_softmax_backward_data.default")
def _softmax_backward(node, grad, y):
    return _along_dim(
        lambda g, v, a: v * (g - jnp.sum(g * v, axis=a, keepdims=True)), node, grad, y
    )


@register("aten::_log_softmax_backward_data.default")
def _log_softmax_backward(node, grad, y):
    return _along_dim(
        lambda g, v, a: g - jnp.exp(v) * jnp.sum(g, axis=a, keepdims=True), node, grad, y
    )


_REDUCTION = {0: "none", 1: "mean", 2: "sum"}


def _nll_terms(node, x, target, weight):
    """Per-sample picked log-probabilities times their class weight, and those weights."""
    ignore = node.attrs["ignore_index"]
    c_dim = 1 if x.ndim > 1 else 0
    valid = target != ignore
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, c_dim), axis=c_dim).squeeze(c_dim)
    w = jnp.where(valid, 1.0, 0.0).astype(x.dtype)
    if weight is not None:
        w = w * weight[safe]
    return picked, w


@register("aten::nll_loss_forward.default")
def _nll_loss(node, x, target, weight):
    c_dim = 1 if x.ndim > 1 else 0
    classes, ignore = x.shape[c_dim], node.attrs["ignore_index"]
    _runtime_checks.in_range(node, target, 0, classes, c_dim, "target", ignore)
    reduction = _REDUCTION[node.attrs["reduction"]]
    picked, w = _nll_terms(node, x, target, weight)
    losses = -picked * w
    total = jnp.sum(w)
    if reduction == "none":
        # torch reports total_weight 0 when it does not reduce.
        return losses, jnp.zeros((), out_dtype(node, 1))
    out = jnp.sum(losses)
    if reduction == "mean":
        out = out / total
    return out.astype(out_dtype(node)), total.astype(out_dtype(node, 1))


@register("aten::nll_loss_backward.default")
def _nll_loss_backward(node, grad, x, target, weight, total):
    reduction = _REDUCTION[node.attrs["reduction"]]
    _, w = _nll_terms(node, x, target, weight)
    scale = grad * w if reduction == "none" else grad * w / (total if reduction == "mean" else 1)
    c_dim = 1 if x.ndim > 1 else 0
    classes = x.shape[c_dim]
    ignore = node.attrs["ignore_index"]
    onehot = jax.nn.one_hot(
        jnp.where(target == ignore, 0, target), classes, dtype=x.dtype, axis=c_dim
    )
    return (-onehot * jnp.expand_dims(scale, c_dim)).astype(out_dtype(node))


# -- normalization -----------------------------------------------------------------------------


def _masked(node, mask, grads):
    """The gradients a backward op returns: those ``output_mask`` asks for that are defined
    (a missing weight has no gradient), each in its output's dtype."""
    outs = [g for want, g in zip(mask, grads, strict=True) if want and g is not None]
    return tuple(o.astype(out_dtype(node, k)) for k, o in enumerate(outs))


@register("aten::native_layer_norm.default")
def _native_layer_norm(node, x, weight, bias):
    axes = tuple(range(x.ndim - len(node.attrs["normalized_shape"]), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + node.attrs["eps"])
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return (
        out.astype(out_dtype(node)),
        mean.astype(out_dtype(node, 1)),
        rstd.astype(out_dtype(node, 2)),
    )


@register("aten::native_layer_norm_backward.default")
def _native_layer_norm_backward(node, grad, x, mean, rstd, weight, bias):
    """From the forward's own ``mean`` and ``rstd`` (its eps is in them; this op has none)."""
    axes = tuple(range(x.ndim - len(node.attrs["normalized_shape"]), x.ndim))
    outer = tuple(range(x.ndim - len(axes)))
    xhat = (x - mean) * rstd
    g = grad if weight is None else grad * weight
    gx = rstd * (
        g
        - jnp.mean(g, axis=axes, keepdims=True)
        - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True)
    )
    gw = None if weight is None else jnp.sum(grad * xhat, axis=outer)
    gb = None if bias is None else jnp.sum(grad, axis=outer)
    return _masked(node, node.attrs["output_mask"], (gx, gw, gb))


def _channel(v, x):
    """A per-channel vector shaped to broadcast over an N, C, ... input."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _batch_stats(x):
    axes = (0, *range(2, x.ndim))
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - _channel(mean, x)), axis=axes)
    return mean, var


def _normalize(x, weight, bias, mean, rstd):
    out = (x - _channel(mean, x)) * _channel(rstd, x)
    if weight is not None:
        out = out * _channel(weight, x)
    if bias is not None:
        out = out + _channel(bias, x)
    return out


def _updated(running, batch, momentum):
    return (1 - momentum) * running + momentum * batch


@register("aten::_native_batch_norm_legit_functional.default")
def _batch_norm_functional(node, x, weight, bias, running_mean, running_var):
    """Batch norm that returns its updated running statistics instead of writing them."""
    momentum, eps = node.attrs["momentum"], node.attrs["eps"]
    if node.attrs["training"]:
        mean, var = _batch_stats(x)
        n = x.size // x.shape[1]
        new_mean = _updated(running_mean, mean, momentum)
        new_var = _updated(running_var, var * n / max(n - 1, 1), momentum)
    else:
        mean, var, new_mean, new_var = running_mean, running_var, running_mean, running_var
    rstd = lax.rsqrt(var + eps)
    outs = (_normalize(x, weight, bias, mean, rstd), mean, rstd, new_mean, new_var)
    return tuple(o.astype(out_dtype(node, k)) for k, o in enumerate(outs))


def _batch_norm(node, x, weight, bias, running_mean, running_var, training):
    """Output and saved statistics; in eval mode torch saves none (shape [0])."""
    eps = node.attrs["eps"]
    if training:
        mean, var = _batch_stats(x)
    else:
        mean, var = running_mean, running_var
    rstd = lax.rsqrt(var + eps)
    out = _normalize(x, weight, bias, mean, rstd).astype(out_dtype(node))
    if node.shapes[1].dims == (0,):
        empty = jnp.zeros((0,), out_dtype(node, 1))
        return out, empty, empty
    return out, mean.astype(out_dtype(node, 1)), rstd.astype(out_dtype(node, 2))


@register("aten::native_batch_norm.default", "aten::_native_batch_norm_legit.default")
def _native_batch_norm(node, x, weight, bias, running_mean, running_var):
    return _batch_norm(node, x, weight, bias, running_mean, running_var, node.attrs["training"])


@register("aten::_native_batch_norm_legit.no_stats")
def _batch_norm_no_stats(node, x, weight, bias):
    return _batch_norm(node, x, weight, bias, None, None, True)


@register("aten::_native_batch_norm_legit_no_training.default")
def _batch_norm_eval(node, x, weight, bias, running_mean, running_var):
    return _batch_norm(node, x, weight, bias, running_mean, running_var, False)


@register("aten::native_batch_norm_backward.default")
def _batch_norm_backward(node, grad, x, weight, running_mean, running_var, save_mean, save_rstd):
    """In training mode from the saved batch statistics (which depend on x); in eval mode
    (``train`` false) from the running statistics, constants."""
    axes = (0, *range(2, x.ndim))
    if node.attrs["train"]:
        mean, rstd = save_mean, save_rstd
    else:
        mean, rstd = running_mean, lax.rsqrt(running_var + node.attrs["eps"])
    xhat = (x - _channel(mean, x)) * _channel(rstd, x)
    g = grad if weight is None else grad * _channel(weight, x)
    if node.attrs["train"]:
        gx = _channel(rstd, x) * (
            g
            - jnp.mean(g, axis=axes, keepdims=True)
            - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True)
        )
    else:
        gx = g * _channel(rstd, x)
    gw = jnp.sum(grad * xhat, axis=axes)
    gb = jnp.sum(grad, axis=axes)
    return _masked(node, node.attrs["output_mask"], (gx, gw, gb))


def _groups(node, x):
    """``x`` as (N, group, C/group * HxW), the layout group norm reduces over (from the
    attributes: with N or HxW 0 a -1 would be ambiguous)."""
    a = node.attrs
    return x.reshape(a["N"], a["group"], a["C"] // a["group"] * a["HxW"])


def _channels(node, x):
    """``x`` as (N, C, HxW)."""
    a = node.attrs
    return x.reshape(a["N"], a["C"], a["HxW"])


def _per_channel(v, node):
    """A per-group (N, group) statistic broadcast to (N, C, HxW)."""
    a = node.attrs
    return jnp.repeat(v, a["C"] // a["group"], axis=1)[:, :, None]


@register("aten::native_group_norm.default")
def _native_group_norm(node, x, weight, bias):
    a = node.attrs
    g = _groups(node, x)
    # torch's mean of an empty group is 0 (its rstd NaN)
    mean = jnp.sum(g, axis=2) / max(g.shape[2], 1)
    rstd = lax.rsqrt(jnp.mean(jnp.square(g - mean[:, :, None]), axis=2) + a["eps"])
    out = (_channels(node, x) - _per_channel(mean, node)) * _per_channel(rstd, node)
    if weight is not None:
        out = out * weight[None, :, None]
    if bias is not None:
        out = out + bias[None, :, None]
    outs = (out.reshape(x.shape), mean, rstd)
    return tuple(o.astype(out_dtype(node, k)) for k, o in enumerate(outs))


@register("aten::native_group_norm_backward.default")
def _native_group_norm_backward(node, grad, x, mean, rstd, weight):
    """From the forward's saved ``mean`` and ``rstd``."""
    a = node.attrs
    x3, g3 = _channels(node, x), _channels(node, grad)
    xhat = (x3 - _per_channel(mean, node)) * _per_channel(rstd, node)
    gxhat = g3 if weight is None else g3 * weight[None, :, None]
    gx_groups = _groups(node, gxhat)
    xhat_groups = _groups(node, xhat)
    gx = rstd[:, :, None] * (
        gx_groups
        - jnp.mean(gx_groups, axis=2, keepdims=True)
        - xhat_groups * jnp.mean(gx_groups * xhat_groups, axis=2, keepdims=True)
    )
    gw = None if weight is None else jnp.sum(g3 * xhat, axis=(0, 2))
    gb = jnp.sum(g3, axis=(0, 2))
    return _masked(node, a["output_mask"], (gx.reshape(x.shape), gw, gb))


@register("aten::mse_loss.default")
def _mse_loss(node, x, target):
    dt = out_dtype(node)
    diff = x.astype(dt) - target.astype(dt)
    losses = diff * diff
    reduction = _REDUCTION[node.attrs["reduction"]]
    if reduction == "none":
        return losses
    return jnp.mean(losses) if reduction == "mean" else jnp.sum(losses)


@register("aten::mse_loss_backward.default")
def _mse_loss_backward(node, grad, x, target):
    dt = out_dtype(node)
    scale = 2.0 / x.size if _REDUCTION[node.attrs["reduction"]] == "mean" else 2.0
    return (grad.astype(dt) * (x.astype(dt) - target.astype(dt)) * jnp.asarray(scale, dt)).astype(
        dt
    )
