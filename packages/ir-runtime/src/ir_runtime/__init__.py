"""ir_runtime: lower ir-core graphs to XLA through JAX, cache compiled programs, run them SPMD.

>>> import numpy as np
>>> from ir_core import Generic, Value
>>> x = to_device(np.ones((2, 3), np.float32))
>>> y = Generic("aten::mul.Scalar", [Value(x)], [x.shape], {"other": 2.0})
>>> to_host(execute([Value(y)])[0]).tolist()
[[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
"""

import jax

# torch's dtypes: int64 and float64 stay 64-bit.
jax.config.update("jax_enable_x64", True)

from ir_runtime._cache import CACHE, Executable, compile  # noqa: E402
from ir_runtime._collectives import wait_device_ops  # noqa: E402
from ir_runtime._data import (  # noqa: E402
    GatherWarning,
    to_device,
    to_host,
)
from ir_runtime._devices import devices, init  # noqa: E402
from ir_runtime._distributed import process_count, process_index  # noqa: E402
from ir_runtime._errors import (  # noqa: E402
    CompileError,
    DeviceCountError,
    DistributedError,
    DTypeError,
    ExecutionError,
    LoweringError,
    RuntimeIRError,
    UnsupportedOpError,
)
from ir_runtime._execute import execute  # noqa: E402
from ir_runtime._frontend import (  # noqa: E402
    CaptureWarning,
    CompiledStep,
    LazyTensor,
    clear_sharding,
    compile_step,
    dump,
    from_process_local,
    mark_sharding,
    mark_step,
    process_local_slices,
    to_lazy,
    to_torch,
    visualize_sharding,
)
from ir_runtime._lower import lower  # noqa: E402
from ir_runtime._lowering import RULES, register  # noqa: E402
from ir_runtime._metrics import metrics, metrics_report, reset_metrics  # noqa: E402
from ir_sharding import Mesh  # noqa: E402

__version__ = "0.5.0"

register_lowering = register


def supported_ops() -> list[str]:
    """Every op name with a lowering rule."""
    return sorted(RULES)


__all__ = [
    "CACHE",
    "CaptureWarning",
    "CompileError",
    "CompiledStep",
    "DTypeError",
    "DeviceCountError",
    "DistributedError",
    "Executable",
    "ExecutionError",
    "GatherWarning",
    "LazyTensor",
    "LoweringError",
    "Mesh",
    "RuntimeIRError",
    "UnsupportedOpError",
    "clear_sharding",
    "compile",
    "compile_step",
    "devices",
    "dump",
    "execute",
    "from_process_local",
    "init",
    "lower",
    "mark_sharding",
    "mark_step",
    "metrics",
    "metrics_report",
    "process_count",
    "process_index",
    "process_local_slices",
    "register_lowering",
    "reset_metrics",
    "supported_ops",
    "to_device",
    "to_host",
    "to_lazy",
    "to_torch",
    "visualize_sharding",
    "wait_device_ops",
]
