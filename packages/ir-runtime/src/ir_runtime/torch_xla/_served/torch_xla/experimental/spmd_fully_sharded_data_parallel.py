"""``SpmdFullyShardedDataParallel`` (torch_xla's FSDPv2): the module moved to the device,
every parameter not sharded yet split over the mesh's ``"fsdp"`` axis on its largest dim (the
first of equals; an uneven split is padded by XLA), and the module's output on its batch dim
(over ``(extra_data_axis, "fsdp")`` when given); XLA gathers and reduce-scatters (GSPMD)."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

import torch_xla
import torch_xla.distributed.spmd as xs


def _prepare_spmd_partition_spec(param, extra_data_axis=None, shard_maximal=False):
    """``"fsdp"`` on dim 0 (on the largest dim with ``shard_maximal``), ``(extra_data_axis,
    "fsdp")`` there when given, None elsewhere; ``()`` for a 0-d tensor."""
    spec = [None] * param.dim()
    if not spec:
        return ()
    shape = list(param.shape)
    at = shape.index(max(shape)) if shard_maximal else 0
    spec[at] = (extra_data_axis, "fsdp") if extra_data_axis else "fsdp"
    return tuple(spec)


def _shard_first_output(extra_data_axis):
    def shard(output, mesh):
        first = None
        if isinstance(output, torch.Tensor):
            first = output
        elif isinstance(output, tuple) and output:
            first = output[0] if isinstance(output[0], torch.Tensor) else None
            warnings.warn(
                "The output is a tuple, but only the first element is sharded. If this is not "
                "intended, please provide your own shard_output callable.",
                stacklevel=3,
            )
        if first is None:
            raise RuntimeError(
                f"The output type is not supported: {type(output)}. Please provide your own "
                f"shard_output callable."
            )
        xs.mark_sharding(first, mesh, _prepare_spmd_partition_spec(first, extra_data_axis))

    return shard


class SpmdFullyShardedDataParallel(nn.Module):
    """Wrap ``module`` (moved to the device): shard its parameters that carry no sharding yet
    (those of wrapped children do) over ``mesh``'s ``"fsdp"`` axis, and its output as
    ``shard_output(output, mesh)`` does (default: the output, or a tuple's first element, on
    its batch dim). ``auto_wrap_policy`` wraps submodules first (torch's policies,
    ``fsdp.wrap``), with ``auto_wrapper_callable`` or this class."""

    def __init__(
        self,
        module: nn.Module,
        *,
        mesh=None,
        shard_output=None,
        auto_wrap_policy=None,
        auto_wrapper_callable=None,
        extra_data_axis=None,
    ):
        if isinstance(module, SpmdFullyShardedDataParallel):
            raise RuntimeError("Cannot wrap a module that is already wrapped with FSDP.")
        forward = getattr(getattr(module, "forward", None), "__func__", None)
        if forward is None or forward is nn.Module.forward:
            raise RuntimeError(
                "The module wrapped by FSDP *must define a `forward` method and call it during "
                "the module's forward pass for FSDP to work correctly.* (not an nn.ModuleList "
                "or nn.ModuleDict)"
            )
        mesh = mesh if mesh is not None else xs.get_global_mesh()
        if mesh is None:
            raise ValueError(
                "No mesh is provided and no global mesh is set. Please provide a mesh."
            )
        if "fsdp" not in (mesh.axis_names or ()):
            raise ValueError("The mesh must have an axis named 'fsdp'.")
        if extra_data_axis and extra_data_axis not in mesh.axis_names:
            raise ValueError(f"The provided {extra_data_axis} axis is not in the mesh.")
        super().__init__()
        if auto_wrap_policy is not None:
            from torch.distributed.fsdp.wrap import _recursive_wrap

            _recursive_wrap(
                module,
                auto_wrap_policy,
                auto_wrapper_callable or SpmdFullyShardedDataParallel,
                ignored_modules=set(),
                ignored_params=set(),
                only_wrap_children=True,
                mesh=mesh,
                shard_output=shard_output,
            )
        self._orig_module = module.to("xla")
        self._mesh = mesh
        for p in module.parameters():
            if torch_xla._XLAC._get_xla_sharding_spec(p) == "":
                xs.mark_sharding(p, mesh, _prepare_spmd_partition_spec(p, shard_maximal=True))
        self._shard_output = shard_output or _shard_first_output(extra_data_axis)

    @property
    def module(self) -> nn.Module:
        return self._orig_module

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._orig_module, name)

    def __getitem__(self, key):
        return self._orig_module[key]

    def forward(self, *args, **kwargs):
        output = self._orig_module(*args, **kwargs)
        self._shard_output(output, self._mesh)
        return output
