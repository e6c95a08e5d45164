"""Neural-network ops: softmax and log-softmax with their backward ops, NLL loss, layer norm,
batch norm, pooling. Backward ops without a short closed form go through jax.vjp of the forward
rule, so the pair always agrees."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import norm_dim, out_dtype, register


@register("aten::_softmax.default", "aten::softmax.int")
def _softmax(node, x):
    return jax.nn.softmax(x.astype(out_dtype(node)), axis=norm_dim(node.attrs["dim"], x.ndim))


@register("aten::_log_softmax.default", "aten::log_softmax.int")
def _log_softmax(node, x):
    return jax.nn.log_softmax(x.astype(out_dtype(node)), axis=norm_dim(node.attrs["dim"], x.ndim))


@register("aten::_softmax_backward_data.default")
def _softmax_backward(node, grad, y):
    dim = norm_dim(node.attrs["dim"], y.ndim)
    return (y * (grad - jnp.sum(grad * y, axis=dim, keepdims=True))).astype(out_dtype(node))


@register("aten::_log_softmax_backward_data.default")
def _log_softmax_backward(node, grad, y):
    dim = norm_dim(node.attrs["dim"], y.ndim)
    return (grad - jnp.exp(y) * jnp.sum(grad, axis=dim, keepdims=True)).astype(out_dtype(node))


_REDUCTION = {0: "none", 1: "mean", 2: "sum"}


def _nll_terms(node, x, target, weight):
    """Per-sample picked log-probabilities times their class weight, and those weights."""
    ignore = node.attrs.get("ignore_index", -100)
    c_dim = 1 if x.ndim > 1 else 0
    valid = target != ignore
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, c_dim), axis=c_dim).squeeze(c_dim)
    w = jnp.where(valid, 1.0, 0.0).astype(x.dtype)
    if weight is not None:
        w = w * weight[safe]
    return picked, w


@register("aten::nll_loss_forward.default")
def _nll_loss(node, x, target, *rest):
    reduction = _REDUCTION[node.attrs.get("reduction", 1)]
    (weight,) = _optional(node, rest, "weight")
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
def _nll_loss_backward(node, grad, x, target, *rest):
    weight, total = _optional(node, rest, "weight", "total_weight")
    reduction = _REDUCTION[node.attrs.get("reduction", 1)]
    _, w = _nll_terms(node, x, target, weight)
    scale = grad * w if reduction == "none" else grad * w / (total if reduction == "mean" else 1)
    c_dim = 1 if x.ndim > 1 else 0
    classes = x.shape[c_dim]
    ignore = node.attrs.get("ignore_index", -100)
    onehot = jax.nn.one_hot(
        jnp.where(target == ignore, 0, target), classes, dtype=x.dtype, axis=c_dim
    )
    return (-onehot * jnp.expand_dims(scale, c_dim)).astype(out_dtype(node))


def _layer_norm(x, normalized, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


def _optional(node, rest, *names):
    """Optional tensor arguments: one that was None is an attribute set to None, one that was
    given is the next operand."""
    it = iter(rest)
    return tuple(None if name in node.attrs else next(it) for name in names)


def _affine(node, rest):
    return _optional(node, rest, "weight", "bias")


@register("aten::native_layer_norm.default")
def _native_layer_norm(node, x, *rest):
    weight, bias = _affine(node, rest)
    out, mean, rstd = _layer_norm(
        x, node.attrs["normalized_shape"], weight, bias, node.attrs["eps"]
    )
    return (
        out.astype(out_dtype(node)),
        mean.astype(out_dtype(node, 1)),
        rstd.astype(out_dtype(node, 2)),
    )


@register("aten::native_layer_norm_backward.default")
def _native_layer_norm_backward(node, grad, x, mean, rstd, *rest):
    weight, bias = _affine(node, rest)
    normalized, eps = node.attrs["normalized_shape"], node.attrs.get("eps", 1e-5)
    args = [x] + [p for p in (weight, bias) if p is not None]

    def forward(x, *params):
        it = iter(params)
        w = next(it) if weight is not None else None
        b = next(it) if bias is not None else None
        return _layer_norm(x, normalized, w, b, eps)[0]

    _, vjp = jax.vjp(forward, *args)
    grads = list(vjp(grad))
    mask = node.attrs.get("output_mask", (True, True, True))
    gx = grads.pop(0)
    gw = grads.pop(0) if weight is not None else None
    gb = grads.pop(0) if bias is not None else None
    outs = [g for want, g in zip(mask, (gx, gw, gb), strict=True) if want and g is not None]
    return tuple(o.astype(out_dtype(node, k)) for k, o in enumerate(outs))


def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


@register("aten::_native_batch_norm_legit_functional.default", "aten::native_batch_norm.default")
def _batch_norm_train(node, x, weight, bias, running_mean, running_var):
    """Training mode: normalize by the batch statistics; also the updated running stats."""
    momentum, eps = node.attrs.get("momentum", 0.1), node.attrs.get("eps", 1e-5)
    training = node.attrs.get("training", True)
    axes = (0, *range(2, x.ndim))
    if not training:
        mean, var = running_mean, running_var
    else:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(_bn_shape(x))), axis=axes)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean.reshape(_bn_shape(x))) * rstd.reshape(_bn_shape(x))
    out = out * weight.reshape(_bn_shape(x)) + bias.reshape(_bn_shape(x))
    outs = [out.astype(out_dtype(node)), mean, rstd]
    if node.op.startswith("aten::_native_batch_norm_legit_functional"):
        n = x.size // x.shape[1]
        if training:
            new_mean = (1 - momentum) * running_mean + momentum * mean
            new_var = (1 - momentum) * running_var + momentum * var * n / max(n - 1, 1)
        else:
            new_mean, new_var = running_mean, running_var
        outs += [new_mean, new_var]
    return tuple(o.astype(out_dtype(node, k)) for k, o in enumerate(outs))


@register("aten::_native_batch_norm_legit_no_training.default")
def _batch_norm_eval(node, x, weight, bias, running_mean, running_var):
    eps = node.attrs.get("eps", 1e-5)
    rstd = lax.rsqrt(running_var + eps)
    out = (x - running_mean.reshape(_bn_shape(x))) * rstd.reshape(_bn_shape(x))
    out = out * weight.reshape(_bn_shape(x)) + bias.reshape(_bn_shape(x))
    empty = jnp.zeros((0,), out_dtype(node, 1))
    return out.astype(out_dtype(node)), empty, empty


@register("aten::native_batch_norm_backward.default")
def _batch_norm_backward(node, grad, x, weight, running_mean, running_var, save_mean, save_rstd):
    """In training mode the batch statistics depend on x; in eval mode (``train`` false) the
    running statistics are constants."""
    eps = node.attrs.get("eps", 1e-5)
    axes = (0, *range(2, x.ndim))
    train = node.attrs.get("train", True)

    def forward(x, w):
        if train:
            mean = jnp.mean(x, axis=axes, keepdims=True)
            var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
        else:
            mean, var = running_mean.reshape(_bn_shape(x)), running_var.reshape(_bn_shape(x))
        return (x - mean) * lax.rsqrt(var + eps) * w.reshape(_bn_shape(x))

    _, vjp = jax.vjp(forward, x, weight)
    gx, gw = vjp(grad)
    gb = jnp.sum(grad, axis=axes)
    mask = node.attrs.get("output_mask", (True, True, True))
    outs = [g for want, g in zip(mask, (gx, gw, gb), strict=True) if want]
    return tuple(o.astype(out_dtype(node, k)) for k, o in enumerate(outs))


def _pool_window(node, x):
    n = x.ndim - 2
    k = tuple(node.attrs["kernel_size"])
    k = k * n if len(k) == 1 else k
    stride = tuple(node.attrs.get("stride") or k)
    stride = stride * n if len(stride) == 1 else stride
    pad = tuple(node.attrs.get("padding", (0,) * n))
    pad = pad * n if len(pad) == 1 else pad
    dil = tuple(node.attrs.get("dilation", (1,) * n))
    dil = dil * n if len(dil) == 1 else dil
    return k, stride, pad, dil


def _max_pool(x, k, stride, pad, dil):
    # Concrete (numpy) init values: jax then uses its differentiable max/sum window reducers.
    init = -np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    return lax.reduce_window(
        x,
        np.array(init, x.dtype),
        lax.max,
        (1, 1, *k),
        (1, 1, *stride),
        [(0, 0), (0, 0), *[(p, p) for p in pad]],
        window_dilation=(1, 1, *dil),
    )


@register("aten::max_pool2d_with_indices.default", "aten::max_pool3d_with_indices.default")
def _max_pool_with_indices(node, x):
    k, stride, pad, dil = _pool_window(node, x)
    if node.attrs.get("ceil_mode", False):
        raise ValueError("max_pool with ceil_mode=True is not supported yet")
    out = _max_pool(x, k, stride, pad, dil)
    # Indices: flat positions within each (N, C) plane of the input, as torch returns them.
    spatial = x.shape[2:]
    flat = jnp.arange(math.prod(spatial), dtype=jnp.float64)
    positions = jnp.broadcast_to(flat.reshape(spatial), x.shape)
    # Pick the position of the max by reducing (value, -position) pairs.
    _, idx = lax.reduce_window(
        (x, -positions),
        (jnp.asarray(-jnp.inf, x.dtype), jnp.asarray(-jnp.inf, positions.dtype)),
        _argmax_pair,
        (1, 1, *k),
        (1, 1, *stride),
        [(0, 0), (0, 0), *[(p, p) for p in pad]],
        window_dilation=(1, 1, *dil),
    )
    return out.astype(out_dtype(node)), (-idx).astype(out_dtype(node, 1))


def _argmax_pair(a, b):
    (va, ia), (vb, ib) = a, b
    take_a = (va > vb) | ((va == vb) & (ia > ib))
    return jnp.where(take_a, va, vb), jnp.where(take_a, ia, ib)


@register("aten::max_pool2d_with_indices_backward.default")
def _max_pool_backward(node, grad, x, indices):
    """Each output's gradient goes to the input position its index names, as in torch."""
    n, c = x.shape[:2]
    flat = jnp.zeros((n, c, math.prod(x.shape[2:])), grad.dtype)
    rows = jnp.arange(n)[:, None, None]
    chans = jnp.arange(c)[None, :, None]
    flat = flat.at[rows, chans, indices.reshape(n, c, -1)].add(grad.reshape(n, c, -1))
    return flat.reshape(x.shape).astype(out_dtype(node))


def _avg_pool(node, x):
    k, stride, pad, _ = _pool_window(node, x)
    window = [(0, 0), (0, 0), *[(p, p) for p in pad]]
    summed = lax.reduce_window(
        x, np.array(0, x.dtype), lax.add, (1, 1, *k), (1, 1, *stride), window
    )
    if node.attrs.get("count_include_pad", True) or not any(pad):
        return summed / jnp.asarray(float(math.prod(k)), x.dtype)
    ones = jnp.ones(x.shape[2:], x.dtype)[None, None]
    counts = lax.reduce_window(
        ones, np.array(0, x.dtype), lax.add, (1, 1, *k), (1, 1, *stride), window
    )
    return summed / counts


@register("aten::avg_pool2d.default")
def _avg_pool2d(node, x):
    return _avg_pool(node, x).astype(out_dtype(node))


@register("aten::avg_pool2d_backward.default")
def _avg_pool2d_backward(node, grad, x):
    _, vjp = jax.vjp(lambda v: _avg_pool(node, v), x)
    return vjp(grad)[0].astype(out_dtype(node))


@register("aten::_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(node, x):
    out_h, out_w = node.attrs["output_size"]
    h, w = x.shape[-2:]
    if h % out_h or w % out_w:
        raise ValueError(
            f"adaptive_avg_pool2d from {(h, w)} to {(out_h, out_w)}: sizes must divide"
        )
    return (
        x.reshape(*x.shape[:-2], out_h, h // out_h, out_w, w // out_w)
        .mean(axis=(-3, -1))
        .astype(out_dtype(node))
    )


@register("aten::mse_loss.default")
def _mse_loss(node, x, target):
    dt = out_dtype(node)
    diff = x.astype(dt) - target.astype(dt)
    losses = diff * diff
    reduction = _REDUCTION[node.attrs.get("reduction", 1)]
    if reduction == "none":
        return losses
    return jnp.mean(losses) if reduction == "mean" else jnp.sum(losses)


@register("aten::mse_loss_backward.default")
def _mse_loss_backward(node, grad, x, target):
    dt = out_dtype(node)
    scale = 2.0 / x.size if _REDUCTION[node.attrs.get("reduction", 1)] == "mean" else 2.0
    return (grad.astype(dt) * (x.astype(dt) - target.astype(dt)) * jnp.asarray(scale, dt)).astype(
        dt
    )
