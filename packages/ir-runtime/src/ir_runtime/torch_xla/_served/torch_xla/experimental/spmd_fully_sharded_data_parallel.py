"""``SpmdFullyShardedDataParallel`` (torch_xla's FSDPv2): every parameter sharded over the
mesh's ``"fsdp"`` axis on its largest dim, the module's output sharded on its batch dim; XLA
gathers and reduce-scatters (GSPMD), as in torch_xla."""

from __future__ import annotations

import torch
import torch.nn as nn

import torch_xla.distributed.spmd as xs


def _prepare_spmd_partition_spec(param, mesh, extra_data_axis=None):
    """``"fsdp"`` (with ``extra_data_axis``) on ``param``'s largest dim that it splits evenly
    (the first of equals), None elsewhere; a parameter no dim of which splits evenly (a bias
    of 1) stays replicated, where torch_xla pads it: the engine splits evenly only."""
    axes = ("fsdp", extra_data_axis) if extra_data_axis else ("fsdp",)
    ways = 1
    for a in axes:
        ways *= mesh.shape()[a]
    spec = [None] * param.dim()
    even = [d for d in range(param.dim()) if param.shape[d] % ways == 0]
    if even:
        dim = max(even, key=lambda d: param.shape[d])
        spec[dim] = axes if extra_data_axis else "fsdp"
    return tuple(spec)


class SpmdFullyShardedDataParallel(nn.Module):
    """Wrap ``module``: shard its parameters (those not sharded by a wrapped child) over
    ``mesh``'s ``"fsdp"`` axis, and its output on dim 0 (``shard_output(output, mesh)``
    instead, for an output that is not a tensor or a tuple led by one).
    ``auto_wrap_policy`` wraps submodules first (torch's policies, ``fsdp.wrap``)."""

    def __init__(
        self,
        module: nn.Module,
        *args,
        mesh=None,
        shard_output=None,
        auto_wrap_policy=None,
        auto_wrapper_callable=None,
        extra_data_parallel_axis=None,
        **kwargs,
    ):
        if isinstance(module, SpmdFullyShardedDataParallel):
            raise RuntimeError("Cannot wrap a module that is already wrapped with FSDP.")
        super().__init__()
        mesh = mesh if mesh is not None else xs.get_global_mesh()
        if mesh is None:
            raise ValueError(
                "SpmdFullyShardedDataParallel needs a mesh: mesh=, or xs.set_global_mesh"
            )
        if "fsdp" not in (mesh.axis_names or ()):
            raise ValueError(f"The mesh must have an axis named 'fsdp', got {mesh.axis_names}")
        if extra_data_parallel_axis and extra_data_parallel_axis not in mesh.axis_names:
            raise ValueError(
                f"The provided ddp axis is not in the mesh. ({extra_data_parallel_axis!r}, "
                f"mesh axes {mesh.axis_names})"
            )
        if auto_wrap_policy is not None:
            from torch.distributed.fsdp.wrap import _recursive_wrap

            def wrapper(m, **kw):
                if auto_wrapper_callable is not None:
                    return auto_wrapper_callable(m, **kw)
                return SpmdFullyShardedDataParallel(m, **kw)

            _recursive_wrap(
                module,
                auto_wrap_policy,
                wrapper,
                ignored_modules=set(),
                ignored_params=set(),
                only_wrap_children=True,
                mesh=mesh,
                shard_output=shard_output,
                extra_data_parallel_axis=extra_data_parallel_axis,
            )
        self._orig_module = module
        self._mesh = mesh
        self._extra = extra_data_parallel_axis
        self._shard_output = shard_output
        sharded = {
            id(p)
            for m in module.modules()
            if isinstance(m, SpmdFullyShardedDataParallel)
            for p in m.parameters()
        }
        for p in module.parameters():
            if id(p) not in sharded:
                xs.mark_sharding(p, mesh, _prepare_spmd_partition_spec(p, mesh, self._extra))

    @property
    def module(self) -> nn.Module:
        return self._orig_module

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig_module, name)

    def forward(self, *args, **kwargs):
        output = self._orig_module(*args, **kwargs)
        if self._shard_output is not None:
            self._shard_output(output, self._mesh)
            return output
        first = output if isinstance(output, torch.Tensor) else None
        if first is None and isinstance(output, (tuple, list)) and output:
            first = output[0] if isinstance(output[0], torch.Tensor) else None
        if first is None:
            raise NotImplementedError(
                f"SpmdFullyShardedDataParallel cannot shard an output of type "
                f"{type(output).__name__}: pass shard_output=fn(output, mesh)"
            )
        batch = ("fsdp", self._extra) if self._extra else "fsdp"
        xs.mark_sharding(first, self._mesh, (batch,) + (None,) * (first.dim() - 1))
        return output
