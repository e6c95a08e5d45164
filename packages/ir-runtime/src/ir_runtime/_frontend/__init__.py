"""The PyTorch lazy-tensor front end."""

from ir_runtime._frontend import (
    _dynamic,  # noqa: F401  (handlers for ops with data-dependent shapes)
    _factories,  # noqa: F401  (registers the Lazy-key kernels)
    _optim,  # noqa: F401  (capturable optimizers on the lazy device)
)
from ir_runtime._frontend._api import (
    clear_sharding,
    dump,
    from_process_local,
    mark_sharding,
    process_local_slices,
    to_lazy,
    visualize_sharding,
)
from ir_runtime._frontend._capture import CaptureWarning, CompiledStep, compile_step
from ir_runtime._frontend._step import mark_step, to_torch
from ir_runtime._frontend._tensor import LazyTensor

__all__ = [
    "CaptureWarning",
    "CompiledStep",
    "LazyTensor",
    "clear_sharding",
    "compile_step",
    "dump",
    "from_process_local",
    "mark_sharding",
    "mark_step",
    "process_local_slices",
    "to_lazy",
    "to_torch",
    "visualize_sharding",
]
