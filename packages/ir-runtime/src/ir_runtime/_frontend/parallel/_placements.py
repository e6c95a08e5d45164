"""Placements (``Shard(d)``, ``Replicate()``, ``Partial(op)``) on lazy tensors.

A distributed tensor here is a lazy tensor, not a torch ``DTensor``: its value is the global
one (a model that runs on one device runs unchanged under any plan), and its placements are a
sharding annotation over the root of its ``LazyDeviceMesh``. torch's ``DTensor`` holds one
rank's shard and runs every op per rank; with one controller that would compute each rank's
part and lose the others. So ``distribute_tensor`` returns a ``LazyTensor``, which has
``placements``, ``device_mesh``, ``full_tensor()``, ``redistribute()`` and ``to_local()``, and
whatever takes plain tensors (``clip_grad_norm_``, ``state_dict()``, DCP, ``save_pretrained``)
takes it as the whole tensor it is.

Conversions:

- ``Shard(d)`` on mesh dim ``i``: tensor dim ``d`` (negative counts from the end) split over
  the root axes mesh dim ``i`` covers; several mesh dims on one tensor dim split it in
  ``DeviceMesh`` order (``[Shard(0), Shard(0)]`` on ``("dp", "tp")`` is dim 0 over
  ``("dp", "tp")``, dp major).
- ``Replicate()``: not split over that mesh dim.
- ``Partial(op)``: the value is the reduction of per-device parts. A lazy tensor always holds
  the reduced value, replicated over that mesh dim: what ``full_tensor()``, ``redistribute()``
  and every read give is eager's, and ``placements`` keeps saying ``Partial`` until the tensor
  is redistributed or written.
- Back from a placement XLA chose (``placements_on``): the placements whose blocks are exactly
  what each device holds; when none are (XLA tiled a dim over part of an axis, or in a device
  order the mesh does not have), the finest placements whose blocks contain what each device
  holds: a correct description that may say a device holds more than it does.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from ir_core import DeviceData, Generic, Value
from ir_runtime._bounded import Bounded
from ir_runtime._frontend.parallel._mesh import LazyDeviceMesh, mesh_of
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_sharding import ShardingError, ShardingKind, ShardingSpec


def _entries(spec: ShardingSpec, ndim: int) -> list[list[str]]:
    """Per tensor dim, the root axis names that split it (a replicated spec: none)."""
    names = spec.mesh.axis_names
    out: list[list[str]] = [[] for _ in range(ndim)]
    for d, entry in enumerate(spec.partition_spec or ()):
        if entry is None:
            continue
        for axis in entry if isinstance(entry, tuple) else (entry,):
            out[d].append(axis if isinstance(axis, str) else names[axis])
    return out


def _spec(root, entries: list[list[str]]) -> ShardingSpec:
    order = {a: i for i, a in enumerate(root.axis_names)}
    spec = []
    for axes in entries:
        axes = sorted(axes, key=order.__getitem__)  # DeviceMesh order
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return ShardingSpec(root, tuple(spec))


def check_placements(mesh: LazyDeviceMesh, placements, ndim: int, what: str) -> tuple:
    """``placements`` as a tuple, one per mesh dim, each ``Shard`` with its dim made
    non-negative; a ``ShardingError`` naming the bad one otherwise."""
    if placements is None:
        return (Replicate(),) * mesh.ndim
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ShardingError(
            f"{what}: {len(placements)} placement(s) {list(placements)} for a mesh of "
            f"{mesh.ndim} dim(s) {mesh.mesh_dim_names}: one placement per mesh dim"
        )
    out = []
    for i, p in enumerate(placements):
        if not isinstance(p, Placement):
            raise ShardingError(
                f"{what}: placement {i} is {p!r}; a placement is Shard(dim), Replicate() or "
                f"Partial(op)"
            )
        if isinstance(p, Shard) and type(p) is not Shard:
            raise ShardingError(
                f"{what}: placement {i} is {p!r}, a strided shard: torch makes those per rank; "
                f"with one controller use Shard(dim) (several mesh dims on one tensor dim split "
                f"it in mesh order)"
            )
        if isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise ShardingError(
                    f"{what}: {p!r} on mesh dim {i} names dim {p.dim} of a tensor with {ndim} "
                    f"dim(s): a Shard's dim is in [{-ndim}, {ndim})"
                )
            p = Shard(p.dim % ndim)
        elif isinstance(p, Partial):
            if p.reduce_op not in ("sum", "avg", "max", "min"):
                raise ShardingError(
                    f"{what}: {p!r}: a Partial's op is 'sum', 'avg', 'max' or 'min'"
                )
        elif not isinstance(p, Replicate):
            raise ShardingError(f"{what}: placement {i} is {p!r}, which has no GSPMD meaning here")
        out.append(p)
    return tuple(out)


def _covered(mesh: LazyDeviceMesh) -> set:
    """The root axes ``mesh``'s dims cover."""
    return {a for axes in mesh._axes for a in axes}


def spec_for(mesh: LazyDeviceMesh, placements: tuple, shape, base=None, what="") -> ShardingSpec:
    """The spec over ``mesh``'s root that places a tensor of ``shape`` as ``placements`` on
    ``mesh``: the root axes ``mesh`` covers as the placements say; the others as in ``base``
    (a spec already on the tensor), else replicated. Checked to divide ``shape`` evenly."""
    root = mesh._ir_mesh
    mine = _covered(mesh)
    if base is not None and base.mesh == root and base.partition_spec is not None:
        entries = [[a for a in axes if a not in mine] for axes in _entries(base, len(shape))]
    else:
        entries = [[] for _ in shape]
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            entries[p.dim].extend(mesh._axes[i])
    spec = _spec(root, entries)
    spec.check_even(tuple(shape), what or f"the tensor {tuple(shape)} placed {list(placements)}")
    return spec


def within(spec: ShardingSpec, mesh: LazyDeviceMesh) -> bool:
    """Whether ``spec`` splits over ``mesh``'s axes alone."""
    mine = _covered(mesh)
    return all(set(axes) <= mine for axes in _entries(spec, spec.rank or 0))


# (root mesh, axis) that ``fully_shard`` made data-parallel: an activation's batch (dim 0) is
# split over them, as each data-parallel rank's batch is its own part of the global one.
DATA_AXES: set = set()


def activation_spec(mesh: LazyDeviceMesh, placements: tuple, shape, what="") -> tuple:
    """``(spec, open dims)`` of an activation placed as ``placements`` on ``mesh``. On a
    sub-mesh the root's other axes are not the placement's: data-parallel axes (``DATA_AXES``)
    split dim 0 when the placement leaves it whole and it divides; if other axes remain, the
    dims the placement does not split are left to XLA (open)."""
    spec = spec_for(mesh, placements, shape, what=what)
    mine = _covered(mesh)
    others = [a for a in mesh._ir_mesh.axis_names if a not in mine]
    if not others:
        return spec, ()
    split = {p.dim for p in placements if isinstance(p, Shard)}
    entries = _entries(spec, len(shape))
    data = [a for a in others if (mesh._ir_mesh, a) in DATA_AXES]
    sizes = dict(zip(mesh._ir_mesh.axis_names, mesh._ir_mesh.shape, strict=True))
    if data and shape and 0 not in split and shape[0] % math.prod(sizes[a] for a in data) == 0:
        entries[0] = data + entries[0]
        others = [a for a in others if a not in data]
        split.add(0)
        spec = _spec(mesh._ir_mesh, entries)
    if not others:
        return spec, ()
    return spec, tuple(d for d in range(len(shape)) if d not in split)


# -- what a tensor says ---------------------------------------------------------------------


def _record(t: LazyTensor, mesh, placements, spec) -> None:
    t.__dict__["_dt"] = (mesh, placements, spec)


def _recorded(t: LazyTensor):
    """The mesh and placements a placement API gave ``t``, while they still describe it."""
    dt = t.__dict__.get("_dt")
    if dt is None:
        return None
    mesh, placements, spec = dt
    node = t._ir.node
    where = t._spec if t._spec is not None else node.sharding
    if where == spec:  # (still so after a step rebinds it to its result)
        return mesh, placements
    if where is None and type(node) is DeviceData and spec.kind is ShardingKind.REPLICATED:
        held = getattr(node.handle, "sharding", None)  # a result held replicated
        if held is not None and len(held.device_set) == spec.mesh.size:
            return mesh, placements
    return None


_DESCRIBED = Bounded(256)  # (mesh, spec, shape) -> placements


def placements_on(mesh: LazyDeviceMesh, spec, shape) -> tuple:
    """The placements on ``mesh`` that describe ``spec`` (module docstring: exact if any are,
    else the finest whose blocks contain each device's). Read off the spec when it is over
    ``mesh``'s root (each mesh dim's axes split the tensor dim that lists them); otherwise
    searched among every placement of each mesh dim (cached)."""
    shape = tuple(shape)
    if spec is None or spec.kind is ShardingKind.REPLICATED:
        return (Replicate(),) * mesh.ndim
    key = (mesh, spec, shape)
    found = _DESCRIBED.get(key)
    if found is None:
        found = _read_off(mesh, spec, shape) or _search(mesh, spec, shape)
        _DESCRIBED[key] = found
    return found


def _read_off(mesh: LazyDeviceMesh, spec, shape):
    """Placements read off a spec over ``mesh``'s own root, or None."""
    if spec.mesh != mesh._ir_mesh or spec.partition_spec is None:
        return None
    entries = _entries(spec, len(shape))
    out = []
    for axes in mesh._axes:
        dims = [d for d, e in enumerate(entries) if set(axes) <= set(e)]
        if not dims:
            if any(set(axes) & set(e) for e in entries):
                return None  # (part of a flattened dim's axes: not one placement)
            out.append(Replicate())
            continue
        e = entries[dims[0]]
        start = e.index(axes[0])
        if tuple(e[start : start + len(axes)]) != tuple(axes):
            return None
        out.append(Shard(dims[0]))
    placements = tuple(out)
    try:
        described = spec_for(mesh, placements, shape, base=spec)
    except ShardingError:
        return None
    return placements if described == spec else None


def _search(mesh: LazyDeviceMesh, spec, shape) -> tuple:
    ndim = len(shape)
    held = spec.device_indices(shape)
    best, best_size = None, None
    for choice in itertools.product(range(-1, ndim), repeat=mesh.ndim):
        placements = tuple(Replicate() if d < 0 else Shard(d) for d in choice)
        try:
            candidate = spec_for(mesh, placements, shape)
        except ShardingError:
            continue
        blocks = candidate.device_indices(shape)
        if not all(_contains(blocks.get(dev), held[dev], shape) for dev in held):
            continue
        size = sum(_size(b, shape) for b in blocks.values())
        if best is None or size < best_size:
            best, best_size = placements, size
    return best if best is not None else (Replicate(),) * mesh.ndim


def _bounds(s: slice, n: int) -> tuple[int, int]:
    lo, hi, _ = s.indices(n)
    return lo, hi


def _contains(outer, inner, shape) -> bool:
    if outer is None:
        return False
    for o, i, n in zip(outer, inner, shape, strict=True):
        olo, ohi = _bounds(o, n)
        ilo, ihi = _bounds(i, n)
        if ilo < ihi and not (olo <= ilo and ihi <= ohi):
            return False
    return True


def _size(block, shape) -> int:
    return math.prod(
        max(0, _bounds(s, n)[1] - _bounds(s, n)[0]) for s, n in zip(block, shape, strict=True)
    )


def describe(t: LazyTensor, run: bool = True):
    """``(mesh, placements)`` of a lazy tensor: those a placement API gave it, else its
    annotation's, else those of the data XLA placed it as. A pending tensor without an
    annotation runs its pending graph first, as reading it would, without the copy to the
    host; with ``run=False`` it is ``(None, None)`` instead (not known without running). A
    tensor on one device: ``(None, ())``."""
    recorded = _recorded(t)
    if recorded is not None:
        return recorded
    spec = t._spec
    if spec is None:
        from ir_runtime._frontend.steps._step import materialize, pending

        if pending(t):
            if not run:
                return None, None
            materialize(t)
        spec = t._where()
    if spec is None:
        node = t._ir.node
        devices = getattr(getattr(node, "handle", None), "sharding", None)
        if devices is None or len(devices.device_set) < 2:
            return None, ()
        spec = ShardingSpec.from_jax(devices, t.dim())  # replicated over those devices
    if spec.kind is ShardingKind.MAXIMAL:
        return None, ()
    mesh = mesh_of(spec)
    return mesh, placements_on(mesh, spec, tuple(t.shape))


# -- constraints ----------------------------------------------------------------------------


def annotated(t: LazyTensor, spec, open=()) -> LazyTensor:
    """``t``'s value as a new tensor constrained to ``spec`` (``open``: dims left to XLA)."""
    attrs = {"open": tuple(open)} if open else {}
    return wrap(Value(Generic("ir::annotate", [t._ir], [t._ir.shape], attrs, spec, _fast.origin())))


class _Constrain(torch.autograd.Function):
    """The identity, its output placed as ``spec`` and its gradient as ``back`` (the placement
    the input had: what torch's ``redistribute`` does to a gradient)."""

    @staticmethod
    def forward(ctx, t, spec, open, back, back_open):
        ctx.back = back, back_open
        return annotated(t, spec, open)

    @staticmethod
    def backward(ctx, grad):
        back, back_open = ctx.back
        if back is None or not isinstance(grad, LazyTensor):
            return grad, None, None, None, None
        from ir_runtime._frontend.regions._shard_map import first_order_only

        g = first_order_only([annotated(grad, back, back_open)], "a placement's gradient")[0]
        return g, None, None, None, None


def current_spec(t: LazyTensor):
    """Where ``t`` is placed, if that is known without running anything (None: not known)."""
    if t._spec is not None:
        return t._spec
    node = t._ir.node
    if node.sharding is not None and not (node.op == "ir::annotate" and node.attrs.get("open")):
        return node.sharding
    return None


def constrain(
    t, mesh: LazyDeviceMesh, placements: tuple, back=None, what="", back_spec=None
) -> LazyTensor:
    """``t`` placed as ``placements`` on ``mesh`` (its gradient as ``back``, placements too,
    or as ``back_spec``: a ``(spec, open dims)`` pair), as a new tensor that remembers them.
    ``t`` itself is left as it was."""
    from ir_runtime._frontend.recording._api import check_lazy

    check_lazy(t, what or "a placement")
    ndim = t.dim()
    placements = check_placements(mesh, placements, ndim, what or "placements")
    spec, opened = activation_spec(mesh, placements, tuple(t.shape), what)
    back_spec, back_open = back_spec if back_spec is not None else (None, None)
    if back is not None:
        back = check_placements(mesh, back, ndim, what or "placements")
        back_spec, back_open = activation_spec(mesh, back, tuple(t.shape), what)
    from ir_runtime._frontend.recording._device_orders import check_annotation

    check_annotation(t, spec)
    if t.requires_grad:
        out = _Constrain.apply(t, spec, opened, back_spec, back_open)
    else:
        out = annotated(t, spec, opened)
    _record(out, mesh, placements, out._ir.node.sharding)
    return out
