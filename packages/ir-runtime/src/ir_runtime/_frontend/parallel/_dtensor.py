"""``distribute_tensor``, ``distribute_module`` and the ``DTensor`` methods of a lazy tensor
(``placements``, ``device_mesh``, ``full_tensor``, ``redistribute``, ``to_local``), on the
placements of ``_placements``."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Partial, Replicate

from ir_core import DeviceData
from ir_runtime._errors import DistributedError
from ir_runtime._frontend.parallel import _placements as P
from ir_runtime._frontend.parallel._mesh import LazyDeviceMesh, as_lazy_mesh
from ir_runtime._frontend.recording._api import (
    _relink_annotated,
    check_lazy,
    to_lazy,
)
from ir_runtime._frontend.recording._device_orders import check_annotation
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._frontend.regions._layouts import mark_sharding_with_gradients
from ir_runtime._frontend.steps import _step
from ir_sharding import ShardingError


def place(t: LazyTensor, mesh: LazyDeviceMesh, placements: tuple, what: str) -> LazyTensor:
    """Annotate ``t`` itself (a parameter, a buffer, a fresh alias) with ``placements`` on
    ``mesh``, its other root axes as they were; its gradient is placed alike."""
    placements = P.check_placements(mesh, placements, t.dim(), what)
    spec = P.spec_for(mesh, placements, tuple(t.shape), base=t._spec, what=what)
    check_annotation(t, spec)
    if t.requires_grad and t.grad_fn is None:
        mark_sharding_with_gradients(t, spec.mesh, spec.partition_spec)
    else:
        _step.no_region("places a tensor")
        _relink_annotated(t, spec)
        t._annotate(spec)
    root = mesh._get_root_mesh()
    if mesh is not root and not P.within(t._spec, mesh):  # placed on other axes too: the root
        mesh, placements = root, P.placements_on(root, t._spec, tuple(t.shape))
    P._record(t, mesh, placements, t._spec)
    return t


def distribute_tensor(tensor, device_mesh=None, placements=None, *, src_data_rank=0):
    """torch's ``distribute_tensor`` on a mesh of ``ir_runtime.device_mesh``: a new lazy tensor
    with ``tensor``'s value (moved to the lazy device if it is on the CPU), placed as
    ``placements`` (default: replicated). ``src_data_rank`` is accepted: the value is the one
    global tensor, from no rank in particular."""
    mesh = as_lazy_mesh(device_mesh, "distribute_tensor")
    if not isinstance(tensor, torch.Tensor):
        raise ShardingError(f"distribute_tensor takes a tensor, got {type(tensor).__name__}")
    if not tensor.is_leaf:
        raise ShardingError(
            "distribute_tensor takes a leaf tensor (torch's rule); this one has history "
            f"({tensor.grad_fn.name()}): use t.redistribute(...) or detach it first"
        )
    placements = P.check_placements(mesh, placements, tensor.dim(), "distribute_tensor")
    spec = P.spec_for(mesh, placements, tuple(tensor.shape), what="distribute_tensor")
    if isinstance(tensor, LazyTensor):
        value = tensor._ir
        if type(value.node) is not DeviceData:  # pending: a node of its own, the input untouched
            value = P.annotated(tensor, spec)._ir
        out = LazyTensor(value, requires_grad=tensor.requires_grad)  # a leaf, then placed
    elif tensor.device.type == "cpu":
        out = to_lazy(tensor.detach()).requires_grad_(tensor.requires_grad)
    else:
        raise ShardingError(
            f"distribute_tensor on a mesh of ir_runtime.device_mesh takes a CPU or lazy tensor, "
            f"got one on {tensor.device}"
        )
    return place(out, mesh, placements, "distribute_tensor")


def from_local(
    local_tensor,
    device_mesh=None,
    placements=None,
    *,
    run_check=False,
    shape=None,
    stride=None,
    grad_placements=None,
):
    """torch's ``DTensor.from_local`` on a mesh of ``ir_runtime.device_mesh``: this process's
    part of a tensor, placed. With one process, its devices hold the whole tensor, so the local
    tensor is the whole value (as ``to_local`` gives it back): the result is ``local_tensor``
    placed as ``placements``, differentiable (its gradient placed as ``grad_placements``, default
    the placements). Across processes it is refused (``ir_runtime.from_process_local`` builds a
    tensor from each process's part)."""
    from ir_runtime._distributed import process_count

    mesh = as_lazy_mesh(device_mesh, "DTensor.from_local")
    if process_count() > 1:
        raise DistributedError(
            "DTensor.from_local across processes: use ir_runtime.from_process_local(local, "
            "mesh, partition_spec), which builds the global tensor from each process's part"
        )
    if not isinstance(local_tensor, LazyTensor):
        if not isinstance(local_tensor, torch.Tensor) or local_tensor.device.type != "cpu":
            raise ShardingError(
                f"DTensor.from_local takes a lazy or CPU tensor, got {local_tensor!r:.80}"
            )
        local_tensor = to_lazy(local_tensor)
    if shape is not None and tuple(shape) != tuple(local_tensor.shape):
        raise ShardingError(
            f"DTensor.from_local: shape {tuple(shape)} for a local tensor of "
            f"{tuple(local_tensor.shape)}; with one process the local tensor is the whole one"
        )
    placements = P.check_placements(mesh, placements, local_tensor.dim(), "DTensor.from_local")
    back = grad_placements if grad_placements is not None else _resolved(placements)
    return P.constrain(local_tensor, mesh, placements, back, "DTensor.from_local")


def _unplaced(module: torch.nn.Module, root) -> list:
    return [
        (m, kind, name, t)
        for m in module.modules()
        for kind, tensors in (("parameter", m._parameters), ("buffer", m._buffers))
        for name, t in tensors.items()
        if t is not None and not _placed_on(t, root)
    ]


def _placed_on(t, root) -> bool:
    where = t._where() if isinstance(t, LazyTensor) else None
    return where is not None and where.mesh == root


def distribute_module(module, device_mesh=None, partition_fn=None, input_fn=None, output_fn=None):
    """torch's ``distribute_module`` on a mesh of ``ir_runtime.device_mesh``: the module moved
    to the lazy device (if it is not there), ``partition_fn(name, submodule, mesh)`` run on each
    submodule, every parameter and buffer it left unplaced replicated, and ``input_fn`` /
    ``output_fn`` installed as forward pre-hook and hook, as torch does."""
    mesh = as_lazy_mesh(device_mesh, "distribute_module")
    to_lazy(module)
    if partition_fn is not None:
        for name, submodule in module.named_modules():
            partition_fn(name, submodule, mesh)
    replicate = (Replicate(),) * mesh.ndim
    for _, _, name, t in _unplaced(module, mesh._ir_mesh):
        place(t, mesh, replicate, f"distribute_module: {name}")
    for m in module.modules():  # placed data without an annotation: nn.Parameter(a placed
        for name, p in m._parameters.items():  # tensor) drops it; the annotation follows
            if isinstance(p, LazyTensor) and p._spec is None and _placed_on(p, mesh._ir_mesh):
                where = p._where()
                held = mesh if P.within(where, mesh) else mesh._get_root_mesh()
                place(p, held, P.placements_on(held, where, tuple(p.shape)), name)
    if input_fn is not None:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, mesh))
    if output_fn is not None:
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, mesh))
    return module


# -- the DTensor methods of a lazy tensor ---------------------------------------------------


def _placements(self) -> tuple:
    """The tensor's placements on its ``device_mesh`` (see ``_placements.describe``)."""
    return P.describe(self)[1]


def _device_mesh(self):
    """The ``DeviceMesh`` the tensor is placed on (None: on one device)."""
    return P.describe(self)[0]


def _mesh_and_placements(t, what):
    mesh, placements = P.describe(t)
    if mesh is None:
        raise ShardingError(f"{what}: the tensor is on one device, not placed on a mesh")
    return mesh, placements


def _full_tensor(self, *, grad_placements=None):
    """The global value, replicated over every device of the mesh's root (an all-gather where
    it is split); the gradient goes back placed as the tensor is (or as ``grad_placements``;
    left to XLA where that is not known without running the pending graph)."""
    check_lazy(self, "full_tensor")
    mesh, placements = P.describe(self, run=False)
    if mesh is None and placements is None:
        mesh = latest_mesh(self)
    if mesh is None:
        return self.view_as(self)
    shape = tuple(self.shape)
    if grad_placements is not None:
        back = P.activation_spec(
            mesh, P.check_placements(mesh, grad_placements, self.dim(), ""), shape
        )
    else:
        back = P.current_spec(self), ()
    root = mesh._get_root_mesh()
    return P.constrain(self, root, (Replicate(),) * root.ndim, what="full_tensor", back_spec=back)


def latest_mesh(t):
    """The mesh a pending tensor without placements is described on: the latest one
    ``device_mesh`` built (None: none was)."""
    from ir_runtime._frontend.parallel._mesh import _BUILT

    for ref in reversed(_BUILT):
        mesh = ref()
        if mesh is not None:
            return mesh
    return None


def _resolved(placements) -> tuple:
    """A gradient's placements: a Partial reads as replicated (its value is the reduced one)."""
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


def _redistribute(
    self,
    device_mesh=None,
    placements=None,
    *,
    async_op=False,
    forward_dtype=None,
    backward_dtype=None,
):
    """The tensor placed as ``placements`` on ``device_mesh`` (default: its own), as a new
    tensor; its gradient goes back to the placements it had. ``async_op`` is accepted (XLA
    schedules every collective); ``forward_dtype`` casts the result, ``backward_dtype`` the
    gradient, as torch does."""
    check_lazy(self, "redistribute")
    mesh, before = P.describe(self, run=False)  # (None, None): not known without running
    if mesh is None and before is None:
        mesh = latest_mesh(self)
    if device_mesh is not None:
        device_mesh = as_lazy_mesh(device_mesh, "redistribute")
        if mesh is not None and device_mesh._ir_mesh != mesh._ir_mesh:
            raise ShardingError(
                f"redistribute: the tensor is on {mesh!r}, not on {device_mesh!r}: placements "
                f"move a tensor within its mesh (distribute_tensor places it on another)"
            )
        mesh = device_mesh
    if mesh is None:
        raise ShardingError("redistribute: the tensor is on one device, not placed on a mesh")
    if placements is None:
        if before is None:
            raise ShardingError(
                "redistribute: no placements given, and the tensor's own are not known "
                "without running its pending graph (read t.placements first, or pass them)"
            )
        placements = before
    x = self
    if forward_dtype is not None and forward_dtype != x.dtype:
        x = x.to(forward_dtype)
    if backward_dtype is not None and x.requires_grad:
        x = _CastGrad.apply(x, backward_dtype)
    back = _resolved(before) if before is not None and len(before) == mesh.ndim else None
    return P.constrain(x, mesh, placements, back, "redistribute")


class _CastGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, dtype):
        ctx.dtype = t.dtype, dtype
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        original, dtype = ctx.dtype
        return grad.to(dtype).to(original), None


def _to_local(self, *, grad_placements=None):
    """What this process's devices hold together: with one process (every device), the whole
    value, as a new tensor whose gradient flows back (each process's part, across processes,
    is refused: ``to_local`` would make each process's program differ)."""
    check_lazy(self, "to_local")
    from ir_runtime._distributed import process_count

    if process_count() > 1:
        raise DistributedError(
            "to_local() across processes: each process's part is a different program. Use "
            "ir_runtime.process_local_slices(mesh, spec, shape) to see this process's part and "
            "ir_runtime.to_torch to read it; whole tensors are what a program computes on"
        )
    return self.view_as(self)


def install() -> None:
    """Give ``LazyTensor`` the ``DTensor`` methods."""
    LazyTensor.placements = property(_placements)
    LazyTensor.device_mesh = property(_device_mesh)
    LazyTensor.full_tensor = _full_tensor
    LazyTensor.redistribute = _redistribute
    LazyTensor.to_local = _to_local
