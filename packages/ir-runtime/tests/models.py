"""Training steps written directly as IR graphs (the front end records the same ops)."""

import numpy as np

from ir_core import DeviceData, Generic, Shape, Value
from ir_sharding import ShardingSpec, with_sharding


def f32(*dims):
    return Shape("float32", dims)


def op(name, *operands, shape, **attrs):
    return Value(Generic(name, list(operands), [shape], attrs))


def linear_sgd_step(x, y, w, b, lr=0.1):
    """One SGD step of y = x @ W + b under mean-squared error: new W, new b, loss."""
    batch, n_in = x.shape.dims
    n_out = w.shape.dims[1]
    pred = op(
        "aten::add.Tensor",
        op("aten::mm.default", x, w, shape=f32(batch, n_out)),
        b,
        shape=f32(batch, n_out),
        alpha=1,
    )
    diff = op("aten::sub.Tensor", pred, y, shape=f32(batch, n_out), alpha=1)
    loss = op(
        "aten::mean.default",
        op("aten::mul.Tensor", diff, diff, shape=f32(batch, n_out)),
        shape=f32(),
    )
    grad = op("aten::mul.Scalar", diff, shape=f32(batch, n_out), other=2.0 / (batch * n_out))
    grad_w = op(
        "aten::mm.default",
        op("aten::permute.default", x, shape=f32(n_in, batch), dims=(1, 0)),
        grad,
        shape=f32(n_in, n_out),
    )
    grad_b = op("aten::sum.dim_IntList", grad, shape=f32(n_out), dim=(0,), keepdim=False)
    new_w = op("aten::sub.Tensor", w, grad_w, shape=f32(n_in, n_out), alpha=lr)
    new_b = op("aten::sub.Tensor", b, grad_b, shape=f32(n_out), alpha=lr)
    return [new_w, new_b, loss]


def numpy_sgd_step(x, y, w, b, lr=0.1):
    pred = x @ w + b
    diff = pred - y
    loss = np.mean(diff * diff)
    grad = diff * (2.0 / diff.size)
    return w - lr * (x.T @ grad), b - lr * grad.sum(0), loss


def leaf(array, spec=None):
    a = np.asarray(array, np.float32)
    return Value(DeviceData(f32(*a.shape), handle=a, sharding=spec))


def data(seed, batch, n_in, n_out):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    y = rng.standard_normal((batch, n_out)).astype(np.float32)
    return x, y


def params(seed, n_in, n_out):
    rng = np.random.default_rng(1000 + seed)
    return (
        rng.standard_normal((n_in, n_out)).astype(np.float32) * 0.1,
        np.zeros(n_out, np.float32),
    )


def pinned(roots, specs):
    """The roots with each one's result pinned to its spec (None: left to XLA)."""
    return [r if s is None else with_sharding(r, s) for r, s in zip(roots, specs, strict=True)]


__all__ = ["ShardingSpec", "data", "leaf", "linear_sgd_step", "numpy_sgd_step", "params", "pinned"]
