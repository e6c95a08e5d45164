"""Pooling: max pooling (with indices), average pooling, adaptive average and max pooling,
fractional max pooling, and their backward ops.

Every op takes ``n`` spatial dims (the last ``n`` of its input) and any leading dims (``N, C``
or, without a batch, ``C``). Windows follow torch's CPU kernels exactly:

- max and average pooling: window ``i`` starts at ``i * stride - padding``; the output size is
  torch's ``pooling_output_shape`` (with ``ceil_mode`` the last window must start inside the
  input or its left padding);
- adaptive pooling: window ``i`` of ``out`` over ``size`` is
  ``[floor(i * size / out), ceil((i + 1) * size / out))``;
- fractional max pooling: the window starts torch's ``generate_intervals`` draws from the op's
  ``random_samples`` operand (computed in the samples' dtype, as torch does).

A max picks the first largest element of its window in row-major order, or the last NaN, and
its index is the element's flat position in its input plane, as torch's kernels do. The backward
ops of max pooling add each output's gradient at its index; the others are jax.vjp of their
forward rule, so forward and backward always agree.

This module holds the helpers and window geometry of the family and average pooling (plain and
adaptive); max pooling (plain, adaptive and fractional, and the backward op they share) is in
``max_pooling``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ir_runtime._lowering._registry import out_dims, out_dtype, register

_LOW_PRECISION = (jnp.float16, jnp.bfloat16)


def _op(node) -> str:
    return node.op.removeprefix("aten::")


def _ints(node, name: str, n: int, empty=None) -> tuple:
    """Attribute ``name`` as ``n`` ints: one int (or a one-element list) stands for all dims;
    an empty list is ``empty`` (stride: the kernel size)."""
    v = node.attrs[name]
    if isinstance(v, int):
        v = (v,)
    v = tuple(int(e) for e in v)
    if not v and empty is not None:
        return empty
    if len(v) == 1:
        v = v * n
    if len(v) != n:
        raise ValueError(f"{_op(node)}: {name}={node.attrs[name]!r} must have 1 or {n} entries")
    return v


def _acc(dtype):
    """The dtype sums and means are computed in: float32 for half precision, as torch does."""
    return np.dtype(np.float32) if dtype in _LOW_PRECISION else np.dtype(dtype)


def check_out(node, x, n: int, sizes, k: int = 0) -> tuple:
    """``sizes`` (the spatial output sizes a rule computes) against the node's output shape."""
    sizes = tuple(int(s) for s in sizes)
    want = tuple(out_dims(node, k))
    if want != (*x.shape[:-n], *sizes):
        raise ValueError(
            f"{_op(node)}: input {tuple(x.shape)} pools to {(*x.shape[:-n], *sizes)}, but the "
            f"node's output {k} is {want}"
        )
    return sizes


def _spatial(node, x, n: int):
    if x.ndim not in (n + 1, n + 2):
        raise ValueError(
            f"{_op(node)}: input must be {n + 1}-D or {n + 2}-D (with a batch dim), got "
            f"{tuple(x.shape)}"
        )
    return tuple(x.shape[-n:])


def _vjp_rule(node, forward, grad, x):
    """A backward op's result: the gradient of ``forward`` (the forward rule on ``x``, in
    ``grad``'s dtype) at ``x`` for the cotangent ``grad``, in the node's dtype."""
    _, vjp = jax.vjp(lambda v: forward(v).astype(grad.dtype), x)
    return vjp(grad)[0].astype(out_dtype(node))


# -- window geometry -----------------------------------------------------------------------------


def _pool_out_size(size, k, s, p, d, ceil_mode) -> int:
    """torch's pooling_output_shape."""
    numerator = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = numerator // s + 1  # floor division: torch's div_rtn
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def _geometry(node, x, n: int, dilation: bool):
    """(kernel, stride, padding, dilation, output sizes, input sizes) of a max or avg pool."""
    sizes = _spatial(node, x, n)
    k = _ints(node, "kernel_size", n)
    s = _ints(node, "stride", n, empty=k)
    p = _ints(node, "padding", n)
    d = _ints(node, "dilation", n) if dilation else (1,) * n
    ceil_mode = node.attrs["ceil_mode"]
    for name, v in (("kernel_size", k), ("stride", s), ("dilation", d)):
        if any(e <= 0 for e in v):
            raise ValueError(f"{_op(node)}: {name}={v} must be positive")
    for pd, kd, dd in zip(p, k, d, strict=True):
        if pd < 0 or pd > ((kd - 1) * dd + 1) // 2:
            raise ValueError(
                f"{_op(node)}: padding={p} must be at least 0 and at most half the "
                f"effective kernel size (kernel_size={k}, dilation={d})"
            )
    out = tuple(_pool_out_size(*a, ceil_mode) for a in zip(sizes, k, s, p, d, strict=True))
    if any(o <= 0 for o in out):
        raise ValueError(f"{_op(node)}: input {tuple(x.shape)} is too small: output {out}")
    return k, s, p, d, out, sizes


def padding_for(sizes, k, s, p, d, out) -> list:
    """(low, high) padding per spatial dim so the windows of ``out`` outputs all fit: ``p``
    each side, and more on the right where ceil_mode's last window overhangs it."""
    pads = []
    for size, kd, sd, pd, dd, od in zip(sizes, k, s, p, d, out, strict=True):
        needed = (od - 1) * sd + (kd - 1) * dd + 1
        pads.append((pd, max(pd, needed - size - pd)))
    return pads


# -- average pooling ------------------------------------------------------------------------------


def _avg_divisor(sizes, k, s, p, out, count_include_pad) -> np.ndarray:
    """torch's divide factor of each output (before divisor_override): the window's size
    clipped to the padded input (count_include_pad) or to the input; 0 where a window holds no
    input element (its output is 0)."""
    per_dim = []
    for size, kd, sd, pd, od in zip(sizes, k, s, p, out, strict=True):
        start = np.arange(od) * sd - pd
        end = np.minimum(start + kd, size + pd)
        pool = end - start
        inside = np.minimum(end, size) - np.maximum(start, 0)
        inside = np.maximum(inside, 0)
        per_dim.append(np.where(inside > 0, pool, 0) if count_include_pad else inside)
    total = per_dim[0]
    for a in per_dim[1:]:
        total = np.multiply.outer(total, a)
    return total


def _avg_pool(node, x, n: int, forward: bool = True):
    k, s, p, _, out, sizes = _geometry(node, x, n, dilation=False)
    if forward:
        check_out(node, x, n, out)
    divisor_override = node.attrs["divisor_override"]
    if divisor_override is not None and int(divisor_override) == 0:
        raise ValueError(f"{_op(node)}: divisor_override must not be zero")
    acc = _acc(x.dtype)
    pads = padding_for(sizes, k, s, p, (1,) * n, out)
    lead = x.ndim - n
    summed = lax.reduce_window(
        x.astype(acc),
        np.array(0, acc),
        lax.add,
        (1,) * lead + tuple(k),
        (1,) * lead + tuple(s),
        [(0, 0)] * lead + pads,
    )
    summed = summed[(Ellipsis, *(slice(0, o) for o in out))]
    counts = _avg_divisor(sizes, k, s, p, out, node.attrs["count_include_pad"])
    if divisor_override is not None:
        divisor = np.full(out, int(divisor_override))
    else:
        divisor = np.where(counts > 0, counts, 1)  # no input element: the sum, 0, stays
    if jnp.issubdtype(acc, jnp.integer):
        # torch divides integers in C++: truncation toward zero.
        result = lax.div(summed, jnp.broadcast_to(jnp.asarray(divisor, acc), summed.shape))
    else:
        result = summed / jnp.asarray(divisor, acc)
    if divisor_override is not None:
        result = jnp.where(jnp.asarray(counts > 0), result, jnp.zeros((), acc))
    return result.astype(x.dtype)


def _avg_pool_rule(n: int):
    def rule(node, x):
        return _avg_pool(node, x, n).astype(out_dtype(node))

    return rule


def _avg_pool_backward(n: int):
    def rule(node, grad, x):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            raise ValueError(f"{_op(node)}: the input must be floating, got {x.dtype}")
        if tuple(grad.shape) != (*x.shape[:-n], *_geometry(node, x, n, dilation=False)[4]):
            raise ValueError(
                f"{_op(node)}: grad_output {tuple(grad.shape)} does not match the "
                f"pooled input {tuple(x.shape)}"
            )
        return _vjp_rule(node, lambda v: _avg_pool(node, v, n, False), grad, x)

    return rule


# -- adaptive pooling -----------------------------------------------------------------------------


def adaptive_windows(size: int, out: int):
    """torch's adaptive windows: start floor(i * size / out), end ceil((i + 1) * size / out)."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    return start, end


def adaptive_out(node, x, n: int, out_sizes):
    sizes = _spatial(node, x, n)
    out = tuple(int(o) for o in out_sizes)
    if len(out) != n or any(o <= 0 for o in out):
        raise ValueError(f"{_op(node)}: output_size={out} must be {n} positive sizes")
    if any(sz <= 0 for sz in sizes):
        raise ValueError(f"{_op(node)}: input {tuple(x.shape)} has an empty spatial dim")
    return sizes, out


def _adaptive_avg(node, x, n: int, out_sizes):
    """Window sums as one 0/1 matrix product per spatial dim, divided by the window sizes."""
    sizes, out = adaptive_out(node, x, n, out_sizes)
    acc = _acc(x.dtype)
    y = x.astype(acc)
    counts = None
    for axis, (size, od) in enumerate(zip(sizes, out, strict=True)):
        start, end = adaptive_windows(size, od)
        j = np.arange(size)
        member = ((j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])).astype(acc)
        y = jnp.moveaxis(
            jnp.tensordot(
                y,
                jnp.asarray(member),
                axes=([y.ndim - n + axis], [1]),
                precision=lax.Precision.HIGHEST,
            ),
            -1,
            y.ndim - n + axis,
        )
        lengths = end - start
        counts = lengths if counts is None else np.multiply.outer(counts, lengths)
    return y / jnp.asarray(counts, acc)


def _adaptive_avg_rule(n: int):
    def rule(node, x):
        out = _ints(node, "output_size", n)
        check_out(node, x, n, out)
        return _adaptive_avg(node, x, n, out).astype(out_dtype(node))

    return rule


def _adaptive_avg_backward(n: int):
    """The output size is the gradient's: the op has no other attribute."""

    def rule(node, grad, x):
        out = grad.shape[-n:]
        return _vjp_rule(node, lambda v: _adaptive_avg(node, v, n, out), grad, x)

    return rule


# Each op in 2-d and 3-d: aten::avg_pool2d.default, aten::avg_pool3d.default, ...
for _op_name, _make in (
    ("avg_pool{}d", _avg_pool_rule),
    ("avg_pool{}d_backward", _avg_pool_backward),
    ("_adaptive_avg_pool{}d", _adaptive_avg_rule),
    ("_adaptive_avg_pool{}d_backward", _adaptive_avg_backward),
):
    for _n in (2, 3):
        register(f"aten::{_op_name.format(_n)}.default")(_make(_n))
