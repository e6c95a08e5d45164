"""The table of lowering rules and the helpers every family uses."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import UnsupportedOpError

RULES: dict[str, Callable] = {}
# Called after a rule is added: the front end forgets how it routed ops, so an op it has
# decomposed or refused is recorded from now on.
ON_CHANGE: list[Callable[[], None]] = []


def register(*ops: str):
    """Register the decorated function as the lowering of each op in ``ops``."""

    def add(fn):
        for op in ops:
            if op in RULES:
                raise ValueError(f"{op!r} already has a lowering rule ({RULES[op].__qualname__})")
        for op in ops:
            RULES[op] = fn
        for hook in ON_CHANGE:
            hook()
        return fn

    return add


def rule_for(op: str) -> Callable:
    rule = RULES.get(op)
    if rule is None:
        raise UnsupportedOpError(
            f"no lowering rule for op {op!r}. The runtime lowers {len(RULES)} ops "
            f"(ir_runtime.supported_ops()); add one with "
            f"ir_runtime.register_lowering({op!r})(fn), or report the op with the model that "
            f"needs it"
        )
    return rule


def out_dtype(node, k: int = 0):
    """The numpy dtype of output ``k``."""
    return to_numpy_dtype(node.shapes[k].dtype)


def out_dims(node, k: int = 0) -> tuple:
    return node.shapes[k].dims


def scalar(value, dtype):
    """A Python scalar as a 0-d array of ``dtype``."""
    return jnp.asarray(value, dtype=dtype)


def norm_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def norm_dims(dims, rank: int) -> tuple:
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted(norm_dim(d, rank) for d in dims)) if dims else tuple(range(rank))
