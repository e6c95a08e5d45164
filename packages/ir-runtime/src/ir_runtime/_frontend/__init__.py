"""The PyTorch lazy-tensor front end.

Importing it installs it into torch, once (``install``): the Lazy dispatch key's kernels
(``torch.zeros(3, device="lazy")``), ``lazy`` among the devices torch's optimizers accept for
``capturable=True``, ``torch.manual_seed`` counted (a reseed restarts the lazy random stream),
``torch._lazy.mark_step`` / ``wait_device_ops`` running this package's, ``torch.autocast``
accepting ``device_type="lazy"`` (``_autocast``), and ``torch.utils.checkpoint`` recomputing
behind an optimization barrier, with ``torch.lazy`` as the device module its RNG helpers use
(``_checkpoint``). ``import ir_runtime`` alone does none of it: the first use of a front-end
name does.

Modules, lowest first (each imports only those above it):
``_convert`` (dtypes, host arrays) -> ``_tensor`` (the type, the live registry, placement) ->
``_meta`` (shape inference) -> ``_record`` (plans, the one preparation, ``record``) -> ``_views``
(writes in place) -> ``_dispatch`` (routing, ``@special``) -> ``_rng`` -> ``_step`` (mark_step,
to_torch) -> ``_api`` -> the handlers (``_handlers``, ``_samplers``, ``_dynamic``,
``_factories``, ``_optim``) -> ``_capture`` (compile_step); beside them ``_checkpoint``,
``_autocast``, ``_layouts`` (placements that follow into gradients), ``_scan``
(scan_layers), ``_shard_map`` (manual regions, collectives), ``_generate``, ``_loader``.
"""

from ir_runtime._dtypes import enable_x64
from ir_runtime._frontend import (
    _autocast,
    _checkpoint,
    _dynamic,  # noqa: F401  (ops with data-dependent shapes)
    _factories,
    _generate,  # noqa: F401
    _handlers,  # noqa: F401  (copies, host reads, aliases, batch norm, dropout)
    _optim,
    _record,
    _rng,
    _samplers,  # noqa: F401  (random samplers)
    _step,
)

# The front end's public names, re-exported by ir_runtime (its __all__ lists them).
from ir_runtime._frontend._api import (  # noqa: F401
    clear_sharding,
    dump,
    from_process_local,
    mark_sharding,
    process_local_slices,
    to_lazy,
    visualize_sharding,
)
from ir_runtime._frontend._capture import CaptureWarning, CompiledStep, compile_step  # noqa: F401
from ir_runtime._frontend._checkpoint_manager import (  # noqa: F401
    CheckpointManager,
    consolidated_state_dict,
)
from ir_runtime._frontend._generate import generate  # noqa: F401
from ir_runtime._frontend._layouts import mark_sharding_with_gradients, shard_as  # noqa: F401
from ir_runtime._frontend._loader import ShardedLoader  # noqa: F401
from ir_runtime._frontend._scan import scan_layers  # noqa: F401
from ir_runtime._frontend._shard_map import (  # noqa: F401
    all_gather,
    all_reduce,
    all_to_all,
    axis_index,
    ppermute,
    reduce_scatter,
    shard_map,
)
from ir_runtime._frontend._step import mark_step, to_torch  # noqa: F401
from ir_runtime._frontend._tensor import LazyTensor  # noqa: F401

_INSTALLED = [False]


def install() -> None:
    """Install the front end into torch (see the module docstring); idempotent."""
    if _INSTALLED[0]:
        return
    enable_x64()
    _record.configure_origins()
    _autocast.install()
    _checkpoint.install()
    _factories.install()
    _optim.install()
    _rng.install()
    _step.install()
    _INSTALLED[0] = True


install()
