"""Eager manual regions: tensors switched to per-device shards between ops, and back.

torch_xla's ``enable_manual_sharding`` / ``disable_manual_sharding`` (and the ``_XLAC`` calls
under them) switch a sharded tensor to the block one device holds, let ordinary ops and
collectives run on blocks, and switch the result back. Here that is a ``shard_map`` recorded
op by op:

- ``full_to_shard(t, spec)`` records an ``ir::full_to_shard`` node: the region's entry, of the
  local shape one device holds (``t``'s shape divided as ``spec`` splits it), annotated
  manual. Ops on it record as usual, on local shapes; ``collective`` records
  ``ir::all_reduce`` / ``all_gather`` / ``reduce_scatter`` over the mesh axes whose device
  groups the caller names.
- ``shard_to_full(t, spec, full_shape)`` closes the region: the graph from its entries to
  ``t`` is lifted into one ``ir::shard_map`` node, as ``ir_runtime.shard_map`` records it
  (the entries become the body's inputs, with their specs; anything else the body reads from
  outside, replicated), so the same lowering, gradient (``jax.vjp`` of the ``shard_map``, to
  the tensors that entered) and compile cache serve both. The region is recorded under jax's
  replication check (``check_vma``: what the result varies over against ``spec``); where it
  refuses, torch_xla's unchecked meaning holds for values (a block the spec says is
  replicated is taken as it is on each device), and a gradient is refused: jax's transpose
  of an unchecked region scales cotangents by the axes the spec leaves out.

A tensor inside an open region holds one device's block, which no single value stands for:
steps leave it pending (``split``) and reading it raises ``ShardingError``. Two results of
one region, closed one at a time, each carry the part of the region they need.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ir_core import DeviceData, Generic, Shape, Value, post_order
from ir_runtime._frontend.recording import _fast, _rng
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.regions._shard_map import (
    _collective,
    _global_shape,
    _local_shape,
    _record_region,
    _size,
)
from ir_runtime._frontend.steps import _step
from ir_runtime._lowering.regions.shard_map import Region
from ir_runtime._placement import spec_at
from ir_sharding import Mesh, ShardingError, ShardingKind, ShardingSpec

ENTRY = "ir::full_to_shard"
# Whether a tensor may be inside an open region: set by an entry or a manual annotation, and
# cleared by a step that finds none (``split``), so other programs pay no graph walk.
_OPEN = [False]


def _manual(node, index=None) -> bool:
    s = node.sharding
    if s is None:
        return False
    if index is None:
        return any(_manual(node, k) for k in range(len(node.shapes)))
    s = spec_at(s, index)  # a tuple annotation may leave an output unannotated (None)
    return s is not None and s.kind is ShardingKind.MANUAL


def _inside(roots) -> set:
    """The ids of the nodes of the graph of ``roots`` that are inside an open region (an entry,
    a manual annotation, or anything computed from one)."""
    inside = set()
    for n in post_order(roots):
        if type(n) is DeviceData:
            continue
        if n.op == ENTRY or _manual(n) or any(id(v.node) in inside for v in n.operands):
            inside.add(id(n))
    return inside


def split(busy: list) -> tuple[list, list]:
    """``busy`` (live pending tensors) as (those a step computes, those inside an open region,
    which stay pending)."""
    if not _OPEN[0]:
        return busy, []
    inside = _inside([t._ir for t in busy])
    aside = [t for t in busy if id(t._ir.node) in inside]
    if not aside:
        _OPEN[0] = False
        return busy, []
    return [t for t in busy if id(t._ir.node) not in inside], aside


def check_readable(t: LazyTensor) -> None:
    """Refuse reading ``t`` when it holds one device's block of an open region."""
    if _OPEN[0] and type(t._ir.node) is not DeviceData and id(t._ir.node) in _inside([t._ir]):
        raise ShardingError(
            f"the tensor {list(t.shape)} is inside a manual region (enable_manual_sharding): "
            f"each device holds its own block, and no one value stands for them; close the "
            f"region with disable_manual_sharding and read its result"
        )


def region_mesh(t: LazyTensor) -> Mesh | None:
    """The mesh of the open region ``t`` is inside (None: it is in none)."""
    if not _OPEN[0]:
        return None
    inside = _inside([t._ir])
    if id(t._ir.node) not in inside:
        return None
    for n in post_order([t._ir]):
        if id(n) in inside and (n.op == ENTRY or _manual(n)):
            return spec_at(n.sharding, 0).mesh
    return None


def entries_of(spec: ShardingSpec, rank: int) -> tuple:
    """``spec`` as a region's partition entries (per dim None or a tuple of axis names)."""
    if spec.kind is ShardingKind.REPLICATED:
        return (None,) * rank
    ps = spec.partition_spec
    if ps is None:
        raise ShardingError(
            f"a manual region splits a tensor over mesh axes; {spec.to_hlo_text()} is not "
            f"such a sharding (use a tiled or replicated one)"
        )
    return tuple(None if e is None else (e,) if isinstance(e, str) else tuple(e) for e in ps)


class _Entry(torch.autograd.Function):
    """A node recorded inside a region from a tensor that requires grad (the region's entry,
    or a collective): what closing the region finds through the autograd graph of its result
    (the entries' tensors, to differentiate the region with respect to). ``entry``: whether
    ``node`` is an entry."""

    @staticmethod
    def forward(ctx, x, node, entry):
        ctx.entry = (node, x, x._version) if entry else None
        return wrap(Value(node))

    @staticmethod
    def backward(ctx, grad):
        raise ShardingError(
            "a gradient reached an op inside a manual region directly; gradients flow through "
            "a region from the result of disable_manual_sharding (_spmd_shard_to_full_shape)"
        )


def _tracked(x: LazyTensor, node, entry: bool) -> LazyTensor:
    """``node`` (recorded from ``x``) as a tensor, in ``x``'s autograd graph when ``x``
    requires grad."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _Entry.apply(x, node, entry)
    return wrap(Value(node))


def full_to_shard(t: LazyTensor, spec: ShardingSpec, what: str) -> LazyTensor:
    """The block of ``t`` (sharded as ``spec``) each device holds, as a tensor of the local
    shape inside a new manual region."""
    if region_mesh(t) is not None:
        raise ShardingError(f"{what}: the tensor {list(t.shape)} is already in a manual region")
    entries = entries_of(spec, t.dim())
    mesh = spec.mesh
    sizes = dict(zip(mesh.axis_names, mesh.shape, strict=True))
    local = _local_shape(tuple(t.shape), entries, sizes, f"{what}: the tensor")
    node = Generic(
        ENTRY,
        [t._ir],
        [Shape(t._ir.shape.dtype, local)],
        {"spec": entries},
        ShardingSpec.manual(mesh),
        _fast.origin(),
    )
    _OPEN[0] = True
    return _tracked(t, node, True)


def mark_manual(t: LazyTensor, mesh: Mesh) -> None:
    """Annotate ``t``'s pending value manual: a block per device (``mesh``: the region's, or
    every device's when ``t`` is in none)."""
    from ir_runtime._frontend.recording._api import _relink_annotated

    if type(t._ir.node) is DeviceData:
        raise RuntimeError(
            f"cannot mark the tensor {list(t.shape)} manual: it holds data (a manual "
            f"annotation marks the result of an op, inside a region)"
        )
    if _manual(t._ir.node, t._ir.index):
        return  # (relinking would clone an entry away from the tensors that entered it)
    _relink_annotated(t, ShardingSpec.manual(region_mesh(t) or mesh))
    _OPEN[0] = True


def _entered(t: LazyTensor) -> dict:
    """The tensors that entered ``t``'s region and require grad, by their entry node's id,
    found through ``t``'s autograd graph; refuses one from outside that requires grad."""
    found, seen, stack = {}, set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if isinstance(fn, _Entry._backward_cls) and fn.entry is not None:
            found[id(fn.entry[0])] = fn.entry
            continue
        if type(fn).__name__ == "AccumulateGrad":
            v = fn.variable
            raise ShardingError(
                f"a manual region reads the tensor {list(v.shape)} from outside it, and it "
                f"requires grad: its gradient would be one device's; pass it in through "
                f"enable_manual_sharding (replicated: a spec of None per dim)"
            )
        stack.extend(f for f, _ in fn.next_functions)
    return found


def shard_to_full(
    t: LazyTensor, spec: ShardingSpec, full_shape, what: str, block: bool = False
) -> LazyTensor:
    """Close the region ``t`` (annotated manual) is in: a tensor of ``full_shape``, placed as
    ``spec``, whose blocks are the devices' ``t``. ``block``: take ``t`` as each device's
    block without its annotation (what marking it manual first would say, with nothing
    changed when this raises).

    The region is recorded under jax's replication check (what each result varies over
    against ``spec``); where that check refuses, torch_xla's unchecked meaning (each device's
    block taken as it is) holds for values, and a gradient, which would be wrong there, is
    refused."""
    root = t._ir
    if not (block or _manual(root.node, root.index)):
        raise RuntimeError(
            f"{what}: the tensor {list(t.shape)} is not manually sharded; mark it manual first "
            f"(torch_xla: _mark_manual_sharding)"
        )
    order = post_order([root])
    entries, inside, reached = [], set(), set()  # (reached: the entries and inside nodes)
    for n in order:
        if type(n) is DeviceData:
            continue
        if n.op == ENTRY:
            entries.append(n)
        elif n is root.node or _manual(n) or any(id(v.node) in reached for v in n.operands):
            inside.add(id(n))
        else:
            continue
        reached.add(id(n))
        if n.sharding is not None and not _manual(n):
            raise ShardingError(
                f"{what}: {n.op} inside the manual region carries the sharding "
                f"{n.sharding}; inside a region each value is one device's block, so it "
                f"takes no sharding (annotate the region's result instead)"
            )
    meshes = {spec_at(n.sharding, 0).mesh for n in entries}
    if len(meshes) > 1:
        raise ShardingError(
            f"{what}: the region's tensors entered over {len(meshes)} different meshes; one "
            f"region runs over one mesh"
        )
    mesh = meshes.pop() if meshes else spec.mesh
    out = _out_entries(spec, mesh, t.dim(), what)
    sizes = dict(zip(mesh.axis_names, mesh.shape, strict=True))
    full = tuple(int(d) for d in full_shape)
    made = _global_shape(tuple(t.shape), out, sizes)
    if made != full:
        raise ShardingError(
            f"{what}: blocks {list(t.shape)} placed as {spec.to_hlo_text()} make a tensor "
            f"{list(made)}, not the full shape {list(full)}"
        )
    entered = _entered(t) if t.requires_grad and torch.is_grad_enabled() else {}
    region, args, free = _lift(order, root, entries, inside, entered, mesh, what)
    in_entries = tuple(n.attrs["spec"] for n in entries)

    def name():  # (the region's name in errors and its body's)
        pass

    name.__qualname__ = what

    def record(checked: bool) -> LazyTensor:
        return _record_region(
            name, mesh, args, out, region, free, [t], False, in_entries, sizes, origin, checked
        )

    origin = _fast.origin()
    try:
        return record(True)
    except ShardingError:
        if entered:
            raise
        return record(False)


def _out_entries(spec: ShardingSpec, mesh: Mesh, rank: int, what: str) -> tuple:
    if spec.kind is ShardingKind.REPLICATED:
        return (None,) * rank
    if spec.mesh != mesh:
        raise ShardingError(
            f"{what}: the result's sharding {spec.to_hlo_text()} is over another mesh than "
            f"the region's ({mesh}); place it over the mesh its tensors entered with"
        )
    return entries_of(spec, rank)


def _lift(order, root, entries, inside, entered, mesh, what):
    """The region's body: its inside nodes rebuilt over placeholders (one per entry, one per
    value read from outside), without their manual annotations. Returns (Region, the
    tensors that entered, the outside values)."""
    params = {id(n): DeviceData(n.shapes[0]) for n in entries}
    rebuilt: dict = {}
    free, values, outside = [], [], {}
    key = _rng.current_key()
    key_at = None

    def operand(v):
        nonlocal key_at
        nid = id(v.node)
        if nid in params:
            return Value(params[nid])
        if nid in rebuilt:
            return Value(rebuilt[nid], v.index)
        k = (nid, v.index)
        p = outside.get(k)
        if p is None:
            if key is not None and v.node is key.node:
                key_at = len(free)
            p = outside[k] = DeviceData(v.shape)
            free.append(p)
            values.append(v)
        return Value(p)

    for n in order:
        if id(n) in inside:
            rebuilt[id(n)] = n.clone(operands=[operand(v) for v in n.operands], sharding=None)
    body_root = operand(root)
    args = []
    for n in entries:
        v = n.operands[0]
        got = entered.get(id(n))
        if got is None:
            args.append(wrap(v))
            continue
        x = got[1]
        if x._version != got[2]:  # (a step or a placement rebinds x without writing it)
            raise ShardingError(
                f"{what}: the tensor {list(x.shape)} that entered the region requires grad "
                f"and was written in place since; its gradient would be of another value"
            )
        args.append(x)
    region = Region([body_root], [params[id(n)] for n in entries], free, key_at, mesh.axis_names)
    return region, args, values


# -- collectives inside a region, over device groups ------------------------------------------


def _group_axes(mesh: Mesh, groups, what: str, ordered: bool) -> tuple:
    """The mesh axes whose device groups are ``groups`` (lists of global device ids; empty:
    every device of the mesh). ``ordered``: each group's order must be the axes' order (a
    gather's or scatter's blocks follow it)."""
    names = tuple(mesh.axis_names)
    if not groups:
        return names
    ids = np.asarray(mesh.device_ids).reshape(mesh.shape)
    want = [tuple(int(d) for d in g) for g in groups]
    key = set if ordered else lambda gs: {frozenset(g) for g in gs}
    for r in range(1, ids.ndim + 1):
        for axes in itertools.combinations(range(ids.ndim), r):
            moved = np.moveaxis(ids, axes, range(ids.ndim - r, ids.ndim))
            size = int(np.prod([ids.shape[a] for a in axes]))
            got = [tuple(row) for row in moved.reshape(-1, size).tolist()]
            if key(got) == key(want):
                return tuple(names[a] for a in axes)
    raise ShardingError(
        f"{what}: groups {want} are not the device groups of any mesh axes of the region's "
        f"mesh {mesh} (a group is the devices along some axes, the others fixed"
        f"{', in mesh order' if ordered else ''})"
    )


def _across(op: str, t: LazyTensor, shape: tuple, attrs: dict) -> LazyTensor:
    """The collective ``op``'s node, in ``t``'s autograd graph (the region's gradient is
    ``jax.vjp``'s of the whole region, collectives included)."""
    return _tracked(t, _collective(op, t, shape, attrs)._ir.node, False)


def collective(op: str, t: LazyTensor, groups, what: str, dim: int = 0) -> LazyTensor:
    """``op`` ("sum", "max", "min" reductions as ``all_reduce``; "all_gather";
    "reduce_scatter") of ``t``, a tensor inside a region, over the devices in ``groups``."""
    mesh = region_mesh(t)
    if mesh is None:
        raise ShardingError(f"{what}: the tensor {list(t.shape)} is not in a manual region")
    ordered = op in ("all_gather", "reduce_scatter")
    axes = _group_axes(mesh, groups, what, ordered)
    n = _size(axes, dict(zip(mesh.axis_names, mesh.shape, strict=True)))
    if op in ("sum", "max", "min"):
        return _across("ir::all_reduce", t, tuple(t.shape), {"axes": axes, "op": op})
    rank = t.dim()
    if rank == 0 or not -rank <= dim < rank:
        raise ShardingError(f"{what}: dim {dim} is out of range for a tensor of rank {rank}")
    d = dim % rank
    shape = list(t.shape)
    if op == "all_gather":
        shape[d] *= n
        return _across("ir::all_gather", t, tuple(shape), {"axes": axes, "dim": d})
    if shape[d] % n:
        raise ShardingError(
            f"{what}: dimension {d} ({shape[d]}) does not divide over {n} devices {groups}"
        )
    shape[d] //= n
    return _across("ir::reduce_scatter", t, tuple(shape), {"axes": axes, "dim": d})


_step.EAGER_REGIONS[0] = (split, check_readable)  # (steps consult this module once imported)
