"""searchsorted and bucketize: torch's binary search, step by step (its path decides where a NaN
or an unsorted sequence sends a value, so the steps are replayed, not just the contract).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from ir_runtime._dtypes import name_of, to_numpy_dtype
from ir_runtime._lowering._registry import NATIVE, family, out_dtype
from ir_runtime._lowering.sorting._common import take

# Half precision: NATIVE (``_registry``): this family compares: nothing to compute in float32.
register = family(NATIVE)


def _torch_dtype(dtype):
    return getattr(torch, name_of(dtype))  # ir-core's names are torch's


def _compare_dtype(boundaries, value):
    """The dtype torch compares in: the result type of the boundaries and the value (a
    tensor, or a Python number for the Scalar overloads)."""
    b = torch.empty(
        (1,) * max(boundaries.ndim, 1), dtype=_torch_dtype(boundaries.dtype), device="meta"
    )
    if not isinstance(value, (bool, int, float)):
        value = torch.empty(value.shape, dtype=_torch_dtype(value.dtype), device="meta")
    return to_numpy_dtype(str(torch.result_type(b, value)).removeprefix("torch."))


def _binary_search(boundaries, values, right: bool, sorter=None):
    """torch's ``cus_lower_bound``/``cus_upper_bound``: ``boundaries`` (..., n), 1-D or with
    the leading dims of ``values`` (..., m); int64 positions shaped like ``values``."""
    n = boundaries.shape[-1]
    start = jnp.zeros(values.shape, jnp.int64)
    end = jnp.full(values.shape, n, jnp.int64)
    if n == 0:
        return start
    nd = boundaries.ndim > 1

    def value_at(mid):
        pos = mid
        if sorter is not None:
            pos = (take(sorter, mid, -1) if nd else sorter[mid]).astype(jnp.int64)
        return take(boundaries, pos, -1) if nd else boundaries[pos]

    for _ in range(n.bit_length()):
        active = start < end
        mid = start + ((end - start) >> 1)
        mv = value_at(jnp.where(active, mid, 0))
        below = ~(mv > values) if right else ~(mv >= values)
        start = jnp.where(active & below, mid + 1, start)
        end = jnp.where(active & ~below, mid, end)
    return start


def _searchsorted(node, seq, values, sorter, scalar):
    right = node.attrs["right"]
    side = node.attrs["side"]
    if side is not None:
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted: side={side!r} (expected 'left' or 'right')")
        if right and side == "left":
            raise ValueError("searchsorted: side='left' and right=True contradict each other")
        right = side == "right"
    dt = _compare_dtype(seq, scalar if scalar is not None else values)
    if scalar is not None:
        values = jnp.asarray(values, dt)
    out = _binary_search(seq.astype(dt), values.astype(dt), right, sorter)
    return out.astype(out_dtype(node))


@register("aten::searchsorted.Tensor")
def _searchsorted_tensor(node, seq, values, sorter):
    return _searchsorted(node, seq, values, sorter, None)


@register("aten::searchsorted.Scalar")
def _searchsorted_scalar(node, seq, sorter):
    v = node.attrs["self"]
    return _searchsorted(node, seq, v, sorter, v if isinstance(v, (bool, int, float)) else 0.5)


def _bucketize(node, values, boundaries, scalar):
    if boundaries.ndim != 1:
        raise ValueError(f"bucketize: boundaries must be 1-D (got {boundaries.ndim}-D)")
    dt = _compare_dtype(boundaries, scalar if scalar is not None else values)
    out = _binary_search(boundaries.astype(dt), jnp.asarray(values).astype(dt), node.attrs["right"])
    return out.astype(out_dtype(node))


@register("aten::bucketize.Tensor")
def _bucketize_tensor(node, values, boundaries):
    return _bucketize(node, values, boundaries, None)


@register("aten::bucketize.Scalar")
def _bucketize_scalar(node, boundaries):
    v = node.attrs["self"]
    return _bucketize(node, v, boundaries, v if isinstance(v, (bool, int, float)) else 0.5)
