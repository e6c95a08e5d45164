"""The PyTorch lazy-tensor front end."""

from ir_runtime._frontend import _factories  # noqa: F401  (registers the Lazy-key kernels)
from ir_runtime._frontend._api import (
    clear_sharding,
    dump,
    from_process_local,
    mark_sharding,
    process_local_slices,
    to_lazy,
    visualize_sharding,
)
from ir_runtime._frontend._step import mark_step, to_torch
from ir_runtime._frontend._tensor import LazyTensor

__all__ = [
    "LazyTensor",
    "clear_sharding",
    "dump",
    "from_process_local",
    "mark_sharding",
    "mark_step",
    "process_local_slices",
    "to_lazy",
    "to_torch",
    "visualize_sharding",
]
