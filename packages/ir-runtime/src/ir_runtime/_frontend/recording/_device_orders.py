"""No op combines tensors placed over two device orders.

jax compiles a program for one device assignment: its mesh's devices, in order. Tensors placed
over meshes of other devices, or of the same devices in another order, cannot be the arrays of
one program, so an op that combines them is refused where it is called, as eager torch refuses
tensors of two devices, before any tensor or graph changes. (Meshes of one device order, in
any shape, mix freely: ``Mesh(range(8), (4, 2), ...)`` and ``Mesh(range(8), (8,), ...)``.)

A tensor's order is its mesh's: where it lives (its annotation, or its data's placement), else
the order of the placements its pending value reads (found once per value and kept on the
tensor; the outputs of a checked op take their inputs'). While every placement in the process
is over one order (``_placement.note_order``), nothing is checked and ops cost nothing more;
from the second one on, ``_dispatch`` routes every op through ``check``.
"""

from __future__ import annotations

import torch

from ir_core import DeviceData, post_order
from ir_runtime._errors import DeviceMismatchError
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._tensor import LazyTensor
from ir_runtime._placement import ORDERS, specs_of

_COPY = torch.ops.aten.copy_.default


def _mesh_of_value(value):
    """The mesh of the first placement the graph of ``value`` reads, or None."""
    for n in post_order([value]):
        found = specs_of(n.sharding)
        if found:
            return found[0].mesh
    return None


def mesh_of(t: LazyTensor):
    """The mesh ``t`` lives over, or will (None: unplaced, it goes where its program runs)."""
    where = t._where()
    if where is not None:
        return where.mesh
    ir = t._ir
    kept = t.__dict__.get("_order")
    if kept is not None and kept[0] is ir:
        return kept[1]
    mesh = _mesh_of_value(ir)
    t._order = (ir, mesh)
    return mesh


def differ(a: LazyTensor, b: LazyTensor) -> bool:
    """Whether ``a`` and ``b`` live over meshes of two device orders."""
    ma, mb = mesh_of(a), mesh_of(b)
    return ma is not None and mb is not None and ma.device_ids != mb.device_ids


def check_annotation(t: LazyTensor, spec) -> None:
    """Refuse ``mark_sharding(t, spec)`` of pending work that reads data over another device
    order than ``spec``'s (data is moved instead, so it may change order)."""
    ids = spec.mesh.device_ids
    if type(t._ir.node) is DeviceData or ORDERS <= {ids}:
        return  # (data moves; or every placement so far is over this order)
    mesh = _mesh_of_value(t._ir)
    if mesh is not None and mesh.device_ids != ids:
        raise DeviceMismatchError(
            f"Expected all tensors to be on the same device: mark_sharding places a "
            f"{str(t.dtype).removeprefix('torch.')} tensor {tuple(t.shape)} over {spec.mesh} "
            f"(devices {list(ids)}), but its pending value reads data over {mesh} (devices "
            f"{list(mesh.device_ids)}); a program runs over one mesh's devices in one order. "
            f"Annotate it over that mesh, or run it first (mark_step) and then place its data"
        )


def _lazy_arguments(args, kwargs):
    """(position, tensor) for each lazy tensor argument, in a list argument too."""
    items = list(enumerate(args))
    if kwargs:
        items += list(kwargs.items())
    for position, a in items:
        if isinstance(a, LazyTensor):
            yield position, a
        elif type(a) in (list, tuple):
            for b in a:
                if isinstance(b, LazyTensor):
                    yield position, b


def _describe(position, t, mesh) -> str:
    return (
        f"argument {position!r}, a {str(t.dtype).removeprefix('torch.')} tensor "
        f"{tuple(t.shape)} over {mesh} (devices {list(mesh.device_ids)})"
    )


def check(cls, func, types, args=(), kwargs=None):
    """``__torch_dispatch__`` once two device orders exist: refuse an op whose tensors live
    over both, else record it and give its outputs its inputs' mesh. ``copy_`` is not refused:
    across orders it copies through the host, as eager copies across devices (``_handlers``)."""
    if func is _COPY:
        return _fast.dispatch(cls, func, types, args, kwargs)
    first = None
    for position, t in _lazy_arguments(args, kwargs):
        mesh = mesh_of(t)
        if mesh is None:
            continue
        if first is None:
            first = (position, t, mesh)
        elif mesh.device_ids != first[2].device_ids:
            origin = _fast.origin()
            at = f" at {origin}" if origin is not None else ""
            raise DeviceMismatchError(
                f"Expected all tensors to be on the same device: {func}{at} takes "
                f"{_describe(*first)} and {_describe(position, t, mesh)}; a program runs over "
                f"one mesh's devices in one order. Place both over one mesh (mark_sharding "
                f"the data over it), or move one through the host (t.cpu(), then "
                f"ir_runtime.to_lazy)"
            )
    out = _fast.dispatch(cls, func, types, args, kwargs)
    if first is not None:
        mesh = first[2]
        for o in out if type(out) in (list, tuple) else (out,):
            if isinstance(o, LazyTensor) and o._where() is None:
                o._order = (o._ir, mesh)
    return out
