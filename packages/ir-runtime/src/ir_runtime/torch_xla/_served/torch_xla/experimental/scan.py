"""``torch_xla.experimental.scan``: ``scan(fn, init, xs)``, ``jax.lax.scan``'s contract:
``fn(carry, x) -> (carry, y)`` over the leading dimension of ``xs`` (a pytree of tensors),
returning the last carry and the ``y``s stacked. torch_xla traces ``fn`` once into a ``While``
loop; here its iterations are recorded one after another into the step's program (the same
values and gradients; the program grows with the length). For a stack of identical layers,
``scan_layers`` compiles one layer."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


def scan(fn, init, xs, partition_fn=None, is_fn_pure=False):
    del partition_fn, is_fn_pure  # (knobs of torch_xla's tracing; values are the same)
    leaves, spec = tree_flatten(xs)
    if not leaves:
        raise ValueError("scan: xs has no tensors to iterate over")
    length = leaves[0].size(0)
    if any(t.size(0) != length for t in leaves):
        raise ValueError(
            f"scan: every tensor of xs needs the same leading dimension, got "
            f"{[t.size(0) for t in leaves]}"
        )
    carry, ys = init, []
    for k in range(length):
        carry, y = fn(carry, tree_unflatten([t[k] for t in leaves], spec))
        ys.append(y)
    y_leaves = [tree_flatten(y)[0] for y in ys]
    y_spec = tree_flatten(ys[0])[1]
    stacked = [torch.stack(parts) for parts in zip(*y_leaves, strict=True)]
    return carry, tree_unflatten(stacked, y_spec)


__all__ = ["scan"]
