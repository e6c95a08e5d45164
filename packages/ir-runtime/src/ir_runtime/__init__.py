"""ir_runtime: lower ir-core graphs to XLA through JAX, cache compiled programs, run them SPMD.

>>> import numpy as np
>>> from ir_core import Generic, Value
>>> x = to_device(np.ones((2, 3), np.float32))
>>> y = Generic("aten::mul.Scalar", [Value(x)], [x.shape], {"other": 2.0})
>>> to_host(execute([Value(y)])[0]).tolist()
[[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]

Importing ir_runtime changes no torch or jax setting (its lowering rules read torch's op
schemas, nothing more). The PyTorch front end (``to_lazy``, ``mark_step``, ``compile_step``,
...) is imported and installed into torch the first time one of its names is used, or a tensor
is made on the lazy device (``torch.zeros(3, device="lazy")``, ``.to("lazy")``: a fallback for
torch's Lazy dispatch key, reached only where torch would raise, installs it), or by
``install()``; jax's x64 mode is turned on by ``init``, the first placement and the first
compile.
"""

import importlib

from ir_runtime._cache import CACHE, compile
from ir_runtime._check import check_graph
from ir_runtime._collectives import wait_device_ops
from ir_runtime._data import GatherWarning, to_device, to_host
from ir_runtime._debug import set_debug
from ir_runtime._devices import devices, init
from ir_runtime._distributed import process_count, process_index
from ir_runtime._donation import DonationWarning
from ir_runtime._errors import (
    CheckedDivisionError,
    CheckedIndexError,
    CheckpointArgumentError,
    CheckpointDirectoryError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointKeyError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointReadError,
    CheckpointSaveError,
    CheckpointStateError,
    CompileError,
    DeviceCountError,
    DeviceMismatchError,
    DistributedError,
    DTypeError,
    ExecutionError,
    GraphError,
    LoweringError,
    OutOfMemoryError,
    ProgramCheckError,
    RecomputeError,
    RuntimeIRError,
    UnsupportedOpError,
)
from ir_runtime._executable import Executable
from ir_runtime._execute import execute
from ir_runtime._lower import lower
from ir_runtime._lowering import RULES, register
from ir_runtime._metrics import metrics, metrics_report, reset_metrics
from ir_runtime._profile import profile
from ir_runtime._runtime_checks import set_program_checks
from ir_sharding import Mesh

__version__ = "0.17.11"

register_lowering = register


# The front end's public names: the module under ir_runtime._frontend that defines each. The
# first use of one imports it and installs the front end into torch (``install``).
_FRONTEND = {
    **dict.fromkeys(
        (
            "clear_sharding",
            "dump",
            "from_process_local",
            "mark_sharding",
            "process_local_slices",
            "to_lazy",
            "visualize_sharding",
        ),
        "recording._api",
    ),
    "LazyTensor": "recording._tensor",
    "AutocastWarning": "recording._dispatch",
    **dict.fromkeys(("mark_step", "to_torch"), "steps._step"),
    **dict.fromkeys(("CaptureWarning", "CompiledStep", "compile_step"), "steps._capture"),
    **dict.fromkeys(("GenerationWarning", "generate"), "steps._generate"),
    **dict.fromkeys(
        (
            "all_gather",
            "all_reduce",
            "all_to_all",
            "axis_index",
            "ppermute",
            "reduce_scatter",
            "shard_map",
        ),
        "regions._shard_map",
    ),
    "scan_layers": "regions._scan",
    "dynamo_backend": "dynamo._backend",
    **dict.fromkeys(
        ("STACK_SAFE_OPTIMIZERS", "StackWarning", "stack_layers", "unstack_layers"),
        "regions._stack",
    ),
    **dict.fromkeys(("call_jax", "jax_op"), "regions._jax"),
    **dict.fromkeys(("mark_sharding_with_gradients", "shard_as"), "regions._layouts"),
    **dict.fromkeys(("CheckpointManager", "consolidated_state_dict"), "io._checkpoints"),
    "ShardedLoader": "io._loader",
    **dict.fromkeys(("LazyDeviceMesh", "device_mesh"), "parallel._mesh"),
    "apply_tp_plan": "parallel._plans",
    "install": "_install",
}


def __getattr__(name: str):
    where = _FRONTEND.get(name)
    if where is None:
        raise AttributeError(f"module 'ir_runtime' has no attribute {name!r}")
    from ir_runtime._frontend._install import install

    install()
    module = importlib.import_module(f"ir_runtime._frontend.{where}")
    value = getattr(module, name)
    if name == "dynamo_backend":  # (about to be given to torch.compile: Dynamo's hooks)
        module.install_capture()
    globals()[name] = value  # found once
    return value


def _on_lazy_key(keyset, op, *args, **kwargs):
    from ir_runtime._frontend._install import on_lazy_key

    return on_lazy_key(keyset, op, *args, **kwargs)


def _lazy_key_fallback(key: str = "Lazy"):
    """The fallback of torch's dispatch key ``key`` (Lazy; XLA once the device is named "xla")
    (``_install.on_lazy_key``), kept alive as long as the Library returned. None where the key
    has one already: torch's own lazy backend, or this module imported a second time."""
    import torch

    if torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, key)):
        return None
    library = torch.library.Library("_", "IMPL")
    library.fallback(_on_lazy_key, key, with_keyset=True)
    return library


_LAZY_KEY = _lazy_key_fallback()


def supported_ops() -> list[str]:
    """Every op name with a lowering rule."""
    return sorted(RULES)


__all__ = [
    "CACHE",
    "STACK_SAFE_OPTIMIZERS",
    "AutocastWarning",
    "CaptureWarning",
    "CheckedDivisionError",
    "CheckedIndexError",
    "CheckpointArgumentError",
    "CheckpointDirectoryError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointKeyError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointReadError",
    "CheckpointSaveError",
    "CheckpointStateError",
    "CompileError",
    "CompiledStep",
    "DTypeError",
    "DeviceCountError",
    "DeviceMismatchError",
    "DistributedError",
    "DonationWarning",
    "Executable",
    "ExecutionError",
    "GatherWarning",
    "GenerationWarning",
    "GraphError",
    "LazyDeviceMesh",
    "LazyTensor",
    "LoweringError",
    "Mesh",
    "OutOfMemoryError",
    "ProgramCheckError",
    "RecomputeError",
    "RuntimeIRError",
    "ShardedLoader",
    "StackWarning",
    "UnsupportedOpError",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "apply_tp_plan",
    "axis_index",
    "call_jax",
    "check_graph",
    "clear_sharding",
    "compile",
    "compile_step",
    "consolidated_state_dict",
    "device_mesh",
    "devices",
    "dump",
    "dynamo_backend",
    "execute",
    "from_process_local",
    "generate",
    "init",
    "install",
    "jax_op",
    "lower",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "mark_step",
    "metrics",
    "metrics_report",
    "ppermute",
    "process_count",
    "process_index",
    "process_local_slices",
    "profile",
    "reduce_scatter",
    "register_lowering",
    "reset_metrics",
    "scan_layers",
    "set_debug",
    "set_program_checks",
    "shard_as",
    "shard_map",
    "stack_layers",
    "supported_ops",
    "to_device",
    "to_host",
    "to_lazy",
    "to_torch",
    "unstack_layers",
    "visualize_sharding",
    "wait_device_ops",
]


def __dir__():
    return sorted(set(globals()) | _FRONTEND.keys())
