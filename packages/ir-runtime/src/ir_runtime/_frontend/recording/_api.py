"""What users type: to_lazy, mark_sharding, clear_sharding, dump, visualize_sharding."""

from __future__ import annotations

import jax
import torch

from ir_core import DeviceData, Shape, Value, dump_dot, dump_text, relink
from ir_runtime import _metrics
from ir_runtime._data import device_data, put
from ir_runtime._dtypes import name_of
from ir_runtime._errors import LoweringError
from ir_runtime._execute import reshard
from ir_runtime._frontend import _transformers
from ir_runtime._frontend.recording._convert import host_numpy
from ir_runtime._frontend.recording._device_orders import check_annotation
from ir_runtime._frontend.recording._tensor import LazyTensor, as_value, live
from ir_runtime._frontend.steps import _step
from ir_runtime._graph import Graph
from ir_runtime._lower import lower
from ir_runtime._rewrite import rewrite
from ir_sharding import Mesh, ShardingError, ShardingSpec, with_sharding
from ir_sharding import clear_sharding as _clear


def _lazy_tensor(t: torch.Tensor) -> LazyTensor:
    if isinstance(t, LazyTensor):
        return t
    return LazyTensor(Value(device_data(host_numpy(t))), requires_grad=t.requires_grad)


def to_lazy(x):
    """Move a tensor, or a module's parameters and buffers, to the lazy device.

    A tensor gives a new lazy tensor (``requires_grad`` kept); a module is changed in place
    (its parameters become lazy ``Parameter``s) and returned.
    """
    if isinstance(x, torch.nn.Module):
        _transformers.patch()  # (a Hugging Face model's warn-only checks read no lazy data)
        moved: dict = {}  # one lazy tensor per host tensor: tied weights stay tied
        for module in x.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and not isinstance(p, LazyTensor):
                    param = moved.get(id(p))
                    if param is None:
                        param = torch.nn.Parameter(
                            _lazy_tensor(p.data), requires_grad=p.requires_grad
                        )
                        param._view = None  # Parameter detaches a temporary: no base to write
                        moved[id(p)] = param
                    module._parameters[name] = param
            for name, b in list(module._buffers.items()):
                if b is not None and not isinstance(b, LazyTensor):
                    if id(b) not in moved:
                        moved[id(b)] = _lazy_tensor(b)
                    module._buffers[name] = moved[id(b)]
        return x
    if isinstance(x, torch.Tensor):
        return _lazy_tensor(x)
    raise TypeError(f"to_lazy takes a torch.Tensor or nn.Module, got {type(x).__name__}")


def check_lazy(t, what):
    if not isinstance(t, LazyTensor):
        raise ShardingError(
            f"{what} takes a lazy tensor (ir_runtime.to_lazy(t)), got "
            f"{type(t).__name__} on {getattr(t, 'device', '?')}"
        )


def _relink_annotated(t: LazyTensor, spec) -> None:
    """Rebind ``t`` to its value carrying ``spec`` (None: none); relink every live tensor that
    reads the old node. All of it is computed before anything is assigned."""
    v = t._ir
    node = v.node
    if type(node) is DeviceData:
        if spec is None:
            new = node.clone(sharding=None)
        else:
            # held evenly: a dim that does not divide into its blocks stays whole in the data
            # (jax holds only even blocks); programs compute its uneven blocks as XLA pads them
            held = spec.evenly(node.shape.dims)
            handle = node.handle
            placed = handle
            if handle is not None:
                # Never the old buffers under a new array: the old node may still be read (a
                # copy of the tensor, a pending op) after this one's data is donated.
                placed = reshard(handle, held.to_jax(), copy=True)
            new = DeviceData(node.shape, handle=placed, sharding=held)
        t._bind(new)
        return
    if node.op == "ir::annotate" and node.attrs.get("open"):
        # a placement's constraint with open dims: the user's annotation replaces it whole
        v = Value(node.clone(attrs={k: a for k, a in node.attrs.items() if k != "open"}), v.index)
    clone = (with_sharding(v, spec) if spec is not None else _clear(v)).node
    readers = [x for x in live() if x is not t]
    roots = [x._ir for x in readers]
    relinked = relink(roots, {node: clone}) if roots else []
    for x, r in zip(readers, relinked, strict=True):
        x._set(r)
    t._set(Value(clone, v.index))


def from_process_local(local, mesh: Mesh, partition_spec, global_shape=None) -> LazyTensor:
    """A lazy tensor sharded over ``mesh`` as ``partition_spec`` says, built from this
    process's part of it: each process passes only the rows (blocks) its own devices hold, as
    ``jax.make_array_from_process_local_data`` takes them. ``process_local_slices`` says which.

    In one process the local part is the whole tensor: the same program runs either way.
    ``global_shape`` defaults to what the local parts of all processes add up to.
    """
    spec = ShardingSpec(mesh, partition_spec)
    if not isinstance(local, torch.Tensor):
        raise TypeError(f"from_process_local takes a torch.Tensor, got {type(local).__name__}")
    return placed_tensor(place_local(local, spec, global_shape), spec, local.requires_grad)


def place_local(local: torch.Tensor, spec: ShardingSpec, global_shape=None, what=None):
    """This process's part ``local`` of a tensor sharded as ``spec``, placed: a global
    ``jax.Array`` (each process passes its own rows); ``what`` names it in errors. Touches no
    lazy tensor, so a loader's thread may call it."""
    what = what or f"the tensor {tuple(local.shape)}"
    spec.check_rank(local.dim(), what)
    if global_shape is not None:
        global_shape = tuple(int(d) for d in global_shape)
    sharding = spec.to_jax()
    whole = sharding.is_fully_addressable and global_shape in (None, tuple(local.shape))
    if not whole and global_shape is not None:  # each process passes its own (even) blocks
        spec.check_even(global_shape, f"global_shape {global_shape}")
    try:
        if whole:  # one process: the whole tensor, held evenly (``ShardingSpec.evenly``)
            array = put(host_numpy(local), spec.evenly(tuple(local.shape)).to_jax())
        else:
            array = jax.make_array_from_process_local_data(
                sharding, host_numpy(local), global_shape
            )
    except ValueError as e:
        raise ShardingError(
            f"this process's part {tuple(local.shape)} does not fit {spec} with global shape "
            f"{global_shape}: {e}"
        ) from e
    _metrics.count("TransferToDevice")
    return array


def placed_tensor(array, spec: ShardingSpec, requires_grad: bool = False) -> LazyTensor:
    """A lazy tensor holding ``array`` (placed as ``spec``, held evenly), annotated with
    ``spec``."""
    held = spec.evenly(array.shape)
    node = DeviceData(Shape(name_of(array.dtype), array.shape), handle=array, sharding=held)
    t = LazyTensor(Value(node), requires_grad=requires_grad)
    t._annotate(spec)
    return t


def process_local_slices(mesh: Mesh, partition_spec, global_shape) -> tuple:
    """The part of a tensor of ``global_shape`` sharded as ``partition_spec`` that this
    process's devices hold, as a tuple of slices: what to load and pass to
    ``from_process_local``."""
    spec = ShardingSpec(mesh, partition_spec)
    global_shape = tuple(int(d) for d in global_shape)
    spec.check_even(global_shape, f"global_shape {global_shape}")
    index = spec.to_jax().addressable_devices_indices_map(global_shape)
    out = []
    for dim, n in enumerate(global_shape):
        lo = min((idx[dim].indices(n)[0] for idx in index.values()), default=0)
        hi = max((idx[dim].indices(n)[1] for idx in index.values()), default=n)
        out.append(slice(lo, hi))
    return tuple(out)


def mark_sharding(t, mesh: Mesh, partition_spec) -> LazyTensor:
    """Shard ``t`` over ``mesh`` as ``partition_spec`` says (one entry per dim).

    A tensor holding data is placed so; a tensor with pending work gets its node cloned with
    the sharding, and every consumer already recorded is relinked to the clone. Each step's
    result for ``t`` stays there. Errors leave ``t`` as it was.

    Args:
        t: a lazy tensor (``to_lazy``).
        mesh: the ``Mesh`` of devices to shard over.
        partition_spec: a tuple (or list) with exactly one entry per dim of ``t``: a shorter
            spec is not padded with ``None`` (as jax's ``PartitionSpec`` is) but refused, and a
            0-d tensor takes ``()``. Each entry is one of:

            - ``None``: the dim is not split (an empty tuple says the same).
            - a mesh axis name (``"data"``): the dim is split into as many blocks as that axis
              has devices.
            - a mesh axis index (an int from 0 to ``mesh.ndim - 1``; not a bool, not negative):
              the same, the axis named by its position.
            - a tuple of axis names or indices (``("data", "model")``): the dim is split over
              several axes, into the product of their sizes, the first axis major.

            Each mesh axis shards at most one dim, once. Mesh axes the spec leaves out
            replicate: each block is held by every device along them (``(None, None)``
            replicates ``t`` whole). A split dim need not be a multiple of its number of
            blocks (XLA's rule: the last blocks are shorter); such data is held evenly
            (``ShardingSpec.evenly``) and programs compute the uneven blocks.

    Returns:
        ``t`` itself, annotated (and placed, if it holds data).

    Raises:
        ShardingError: ``t`` is not a lazy tensor; ``mesh`` is not a ``Mesh``;
            ``partition_spec`` is not a tuple or list (a bare ``"data"``), has an entry of
            another kind, an unknown axis name, an index out of range, or a mesh axis twice,
            or has not one entry per dim of ``t``; or the call is inside a body traced on
            placeholders (``shard_map``, ``scan_layers``).

    Example, with 8 devices as a 4 x 2 mesh::

        mesh = irt.Mesh(range(8), (4, 2), ("data", "model"))
        w = irt.to_lazy(torch.zeros(8, 6))
        irt.mark_sharding(w, mesh, ("data", None))  # rows in 4 blocks, each on 2 devices
        irt.mark_sharding(w, mesh, (None, 1))  # axis 1 ("model"): columns in 2 blocks
        irt.mark_sharding(w, mesh, ("data", "model"))  # 4 x 2 blocks, one per device
        irt.mark_sharding(w, mesh, (("data", "model"), None))  # rows in 8 blocks, by device
        irt.mark_sharding(w, mesh, (None, None))  # replicated: every device holds all of w
        irt.mark_sharding(irt.to_lazy(torch.tensor(2.0)), mesh, ())  # a 0-d tensor
        irt.mark_sharding(w, mesh, ("data",))  # ShardingError: 1 entry, but w has 2 dims
    """
    check_lazy(t, "mark_sharding")
    return annotate(t, ShardingSpec(mesh, partition_spec))


def annotate(t: LazyTensor, spec: ShardingSpec) -> LazyTensor:
    """``mark_sharding`` with the spec made: ``t`` (a lazy tensor) annotated with ``spec``."""
    _step.no_region("calls mark_sharding (inside a manual region every tensor is one device's)")
    if spec.partition_spec is not None:
        spec.check_rank(t.dim(), f"the tensor {tuple(t.shape)}")
    check_annotation(t, spec)
    _relink_annotated(t, spec)
    t._annotate(spec)
    return t


def clear_sharding(t) -> LazyTensor:
    """Undo ``mark_sharding``: no annotation on ``t``'s value."""
    check_lazy(t, "clear_sharding")
    _relink_annotated(t, None)
    t._annotate(None)
    return t


def dump(tensors, format: str = "text") -> str:
    """The pending graph of ``tensors``: ``"text"``, ``"dot"``, ``"rewritten"`` (the text of the
    graph as it is lowered, after the rewrite rules of ``ir_runtime._rewrite``, for the program
    these tensors alone make: a step that also runs pinned placements may differ) or
    ``"stablehlo"`` (each operation's ``loc(...)`` the torch file and line that recorded it)."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    roots = [as_value(t) for t in tensors]
    if format == "text":
        return dump_text(roots)
    if format == "dot":
        return dump_dot(roots)
    if format == "rewritten":
        try:
            program = Graph(roots).program
        except LoweringError:  # (no program, such as two device orders: the rules needing one
            program = None  # do not apply, and the text is still shown)
        return dump_text(rewrite(roots, program=program))
    if format == "stablehlo":
        return lower(roots, debug_info=True)
    raise ValueError(f"format must be 'text', 'dot', 'rewritten' or 'stablehlo', got {format!r}")


def visualize_sharding(t) -> str:
    """A text picture of where ``t``'s data lives (or will, per its annotation)."""
    check_lazy(t, "visualize_sharding")
    spec = t._where()
    if spec is None:
        return f"{tuple(t.shape)}: not sharded (on one device, or replicated)"
    return spec.visualize(tuple(t.shape))
