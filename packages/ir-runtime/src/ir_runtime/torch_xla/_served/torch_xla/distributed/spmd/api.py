"""torch_xla's DTensor bridge: what torch's ``distribute_tensor`` / ``distribute_module`` call
for a ``DeviceMesh("xla", ...)``."""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.tensor.placement_types import Replicate

import torch_xla.runtime as xr

from .xla_sharded_tensor import XLAShardedTensor
from .xla_sharding import Mesh, ShardingType, mark_sharding


def auto_policy(mod_name, mod, mesh):
    """torch_xla's partition function for auto-sharding (``use_spmd(auto=True)``): refused,
    as auto-sharding is not available here."""
    xr.use_spmd(auto=True)


def convert_to_xla_mesh(dt_mesh) -> Mesh:
    """The ``xs.Mesh`` of a torch ``DeviceMesh`` (its entries are global device ids)."""
    xr.use_spmd()
    assert dt_mesh.size() == xr.global_runtime_device_count()
    return Mesh(dt_mesh.mesh.flatten().numpy(), tuple(dt_mesh.mesh.size()), dt_mesh.mesh_dim_names)


def convert_to_xla_partition_spec(tensor, placements) -> tuple:
    """``placements`` (``Shard``/``Replicate`` per mesh dim) as torch_xla's partition spec."""
    xr.use_spmd()
    spec = [None] * len(tensor.shape)
    for mesh_dim, p in enumerate(placements):
        if p.is_shard():
            spec[p.dim] = mesh_dim
        elif not p.is_replicate():
            raise ValueError(f"Unsupported placement type: {type(p).__name__}")
    return tuple(spec)


def xla_distribute_tensor(tensor, device_mesh, placements=None) -> XLAShardedTensor:
    xr.use_spmd()
    assert device_mesh.device_type == "xla"
    mesh = convert_to_xla_mesh(device_mesh)
    if not tensor.is_meta:
        tensor = tensor.to(device_mesh.device_type)
    if placements is None:
        placements = [Replicate() for _ in range(device_mesh.ndim)]
    assert len(placements) == device_mesh.ndim, (
        f"`placements` must have the same length as `device_mesh.ndim`! Found placements "
        f"length: {len(placements)}, and device_mesh.ndim: {device_mesh.ndim}."
    )
    spec = convert_to_xla_partition_spec(tensor, placements)
    if type(tensor).__name__ == "DTensor":
        raise ValueError(
            "Cannot distribute a DTensor with local tensor on xla devices. The input tensor "
            "must be global."
        )
    global_tensor = tensor
    if isinstance(tensor, XLAShardedTensor):
        kind = tensor.sharding_type
        assert kind is None or kind == ShardingType.REPLICATED, (
            "XLAShardedTensor `tensor` is already annotated with non-replication sharding. "
            "Clear the existing sharding annotation first, by callling "
            "torch_xla.distributed.spmd.clear_sharding API."
        )
        global_tensor = tensor.global_tensor
    return mark_sharding(global_tensor, mesh, spec)


def xla_distribute_module(
    module: nn.Module, device_mesh=None, partition_fn=None, input_fn=None, output_fn=None
) -> nn.Module:
    """Move ``module`` to the xla device; ``partition_fn(name, submodule, mesh)`` annotates its
    parameters (unannotated ones are left to XLA's propagation); ``input_fn`` /
    ``output_fn`` become forward pre-/post-hooks ``fn(inputs, mesh)`` /
    ``fn(outputs, mesh)``."""
    xr.use_spmd()
    if device_mesh is None:
        from torch.distributed.device_mesh import _mesh_resources

        device_mesh = _mesh_resources.get_current_mesh()
    assert device_mesh.device_type == "xla"
    module = module.to(device_mesh.device_type)
    if partition_fn is not None:
        for name, submod in module.named_modules():
            partition_fn(name, submod, device_mesh)
            for p in submod.parameters(recurse=False):
                if p.device.type != "xla":
                    raise ValueError(
                        f"partition_fn left a parameter of {name or 'the module'} on "
                        f"{p.device}: it must stay on the xla device"
                    )
    if input_fn is not None:
        module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, device_mesh))
    if output_fn is not None:
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(outputs, device_mesh))
    return module
