"""Manual regions: ``shard_map(fn, mesh, in_specs, out_specs)`` and the collectives inside them.

``shard_map(fn, mesh, in_specs, out_specs)(*tensors)`` runs ``fn`` on each device's shards, as
``jax.shard_map`` does: each argument is split over the mesh as its in spec says (per dimension
None, an axis name, or a tuple of names), ``fn`` sees the local shapes one device holds, and
each result is put together from the devices' pieces as its out spec says. Inside ``fn``,
``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``ppermute`` and
``axis_index`` work over named mesh axes (one name or a tuple of names).

``fn`` is traced once per call, on placeholders of the local shapes, into one ``ir::shard_map``
node (lowered by ``ir_runtime._lowering.regions.shard_map``); outside the region the step
stays automatically sharded:
arguments are moved to the in specs and results come out placed as the out specs say, for
GSPMD to carry on from. Gradients flow through: the region is a ``torch.autograd.Function``
whose backward is ``jax.vjp`` of the same ``shard_map``, so each collective's gradient is its
transpose as jax defines it.

Checked before anything is recorded, each a ``ShardingError`` naming the value and the rule: a
mesh axis the mesh does not have, an axis used twice, a spec longer than its tensor's rank, a
dimension that does not divide over its axes, a collective outside a region, an ``out_specs``
that cannot hold a result (one that differs from device to device over an axis its spec does
not split it over: jax's own check, run on the traced body), and a function that reads another
lazy tensor, writes its inputs (or any other tensor) in place, reads a value to the host or
calls ``mark_step``. What the trace records on its placeholders is never live: no step
computes it, even when an exception's traceback or an attribute keeps it.

Longer than 400 lines, as one module: the collectives exist only inside the region
``shard_map`` is tracing, and they read its state (``_REGIONS``: the mesh and its axis sizes)
and share its axis checks and shape arithmetic; apart, that state would cross modules.
"""

from __future__ import annotations

import jax
import torch

from ir_core import DeviceData, Generic, Shape, Value
from ir_runtime._bounded import Bounded
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._convert import IR_TO_TORCH, ir_dtype
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.steps import _step
from ir_runtime._jaxapi import one_frame_locations
from ir_runtime._lowering.regions.shard_map import Region, add_region, jax_mesh, sharded
from ir_sharding import Mesh, ShardingError, ShardingSpec, TupleSharding

_REGIONS: list = []  # the regions being traced, innermost last


class _Tracing:
    """A region being traced: its mesh and each axis's size."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.sizes = dict(zip(mesh.axis_names, mesh.shape, strict=True))


def _entries(spec, rank: int, what: str, mesh: Mesh) -> tuple:
    """A partition spec as attribute entries (per dim None or a tuple of axis names), padded
    with None to ``rank``; checked against the mesh by ir-sharding."""
    if spec is None:
        spec = ()
    if isinstance(spec, (str, bytes)) or not hasattr(spec, "__iter__"):
        raise ShardingError(
            f"shard_map: {what} has spec {spec!r}; a partition spec is a sequence with one "
            f"entry per dimension (None, an axis name, or a tuple of names)"
        )
    spec = tuple(spec)
    if len(spec) > rank:
        raise ShardingError(
            f"shard_map: {what} has rank {rank} but its spec {spec!r} has {len(spec)} entries; "
            f"give at most one entry per dimension"
        )
    spec += (None,) * (rank - len(spec))
    ShardingSpec(mesh, spec)  # unknown axes, an axis used twice: ir-sharding's errors
    for entry in spec:
        if isinstance(entry, int) and not isinstance(entry, bool):
            raise ShardingError(
                f"shard_map: {what} spec {spec!r} names an axis by index; name it "
                f"(one of {list(mesh.axis_names)})"
            )
    return tuple(None if e is None else ((e,) if isinstance(e, str) else tuple(e)) for e in spec)


def _size(axes, sizes: dict) -> int:
    out = 1
    for a in axes:
        out *= sizes[a]
    return out


def _local_shape(shape, entries, sizes: dict, what: str) -> tuple:
    out = []
    for d, (n, axes) in enumerate(zip(shape, entries, strict=True)):
        if axes is None:
            out.append(n)
            continue
        k = _size(axes, sizes)
        if n % k:
            raise ShardingError(
                f"shard_map: {what} {list(shape)}: dimension {d} ({n}) does not divide over "
                f"mesh axes {axes} ({k} devices); shard_map gives every device an equal shard"
            )
        out.append(n // k)
    return tuple(out)


def _global_shape(shape, entries, sizes: dict) -> tuple:
    return tuple(
        n if axes is None else n * _size(axes, sizes)
        for n, axes in zip(shape, entries, strict=True)
    )


_CHECKED = Bounded(256)  # (body, specs, mesh) already checked by jax


def _check_with_jax(name, region, specs, mesh, args, fn_name):
    """jax's own checks of the traced region (what each output varies over against its out
    spec, unless ``check_vma`` is False, and every shape), once per body and specs: ``specs``
    is ``(in_entries, out_entries, check_vma)``."""
    in_entries, out_entries, check_vma = specs
    key = (name, in_entries, out_entries, check_vma, mesh)
    if key in _CHECKED:
        return
    varies: list = []

    def watched(vary, *args):
        outs = region.run(vary, *args)
        varies[:] = [_varying(jax.typeof(o)) for o in outs]
        return outs

    attrs = {"in_specs": in_entries, "out_specs": out_entries, "check_vma": check_vma}
    shapes = [t._ir.shape for t in args] + [f.shape for f in region.free]
    args = [jax.ShapeDtypeStruct(s.dims, to_numpy_dtype(s.dtype)) for s in shapes]
    try:
        fn = sharded(attrs, region, jax_mesh(ShardingSpec.replicated(mesh)), watched)
        with one_frame_locations():  # (what is traced here is located as lowering locates it)
            jax.eval_shape(fn, *args)
    except Exception as e:
        for k, (vma, entries) in enumerate(zip(varies, out_entries, strict=False)):
            split = {a for axes in entries if axes for a in axes}
            extra = sorted(set(vma) - split)
            if extra:
                raise ShardingError(
                    f"shard_map: out_specs[{k}] {_said(entries)} cannot hold output {k} of "
                    f"{fn_name}: it differs from device to device over mesh axis "
                    f"{extra[0]!r}, which its spec does not split it over; split a dimension "
                    f"over {extra[0]!r}, or all_reduce over it first"
                ) from None
        raise ShardingError(
            f"shard_map: jax refuses the region {fn_name} with in_specs "
            f"{[_said(s) for s in in_entries]} and out_specs "
            f"{[_said(s) for s in out_entries]}: {type(e).__name__}: {e}"
        ) from e
    _CHECKED[key] = True


def _varying(aval) -> frozenset:
    """The mesh axes a traced value inside a shard_map differs over (jax's varying manual
    axes: ``aval.vma`` before jax 0.10, ``aval.mat.varying`` since)."""
    vma = getattr(aval, "vma", None)
    return frozenset(vma if vma is not None else aval.mat.varying)


def _said(entries) -> str:
    return repr(tuple(None if a is None else (a[0] if len(a) == 1 else a) for a in entries))


def _trace(fn, mesh: Mesh, args, in_entries, sizes):
    """``fn`` on placeholders of the local shapes: (Region, its free Values, output Values,
    whether fn returned a tuple)."""
    placeholders = []
    for k, (t, entries) in enumerate(zip(args, in_entries, strict=True)):
        local = _local_shape(tuple(t.shape), entries, sizes, f"input {k}")
        placeholders.append(DeviceData(Shape(ir_dtype(t.dtype), local)))
    name = getattr(fn, "__qualname__", type(fn).__name__)
    _REGIONS.append(_Tracing(mesh))
    try:
        with _step.Isolated(f"shard_map: {name}") as isolated, torch.no_grad():
            wrapped = [wrap(Value(p)) for p in placeholders]  # (not live: isolated)
            before = [w._ir for w in wrapped]
            out = fn(*wrapped)
    finally:
        _REGIONS.pop()
    if isolated.written:
        raise ShardingError(
            f"shard_map: {name} writes a tensor {isolated.written[0]} that is not one of its "
            f"arguments in place (it keeps its value); pass it in and return the new value"
        )
    return _region_of(name, out, wrapped, before, placeholders, mesh)


def _region_of(name, out, wrapped, before, placeholders, mesh):
    """The traced region (``_trace``), after checking what ``fn`` returned and read."""
    written = [k for k, w in enumerate(wrapped) if w._ir is not before[k]]
    if written:
        raise ShardingError(
            f"shard_map: {name} writes its input {written[0]} in place; return the new value "
            f"instead"
        )
    several = isinstance(out, (tuple, list))
    outs = list(out) if several else [out]
    for k, o in enumerate(outs):
        if not isinstance(o, LazyTensor):
            raise ShardingError(
                f"shard_map: {name} must return lazy tensors (or a tuple of them); output {k} "
                f"is {type(o).__name__}"
            )
    free, values, key_at = _step.free_inputs(
        [o._ir for o in outs],
        placeholders,
        lambda shape: ShardingError(
            f"shard_map: {name} reads a lazy tensor {shape} that is not one of its "
            f"arguments; pass it in as an argument, with its in spec"
        ),
    )
    region = Region([o._ir for o in outs], placeholders, free, key_at, mesh.axis_names)
    return region, values, outs, several


def first_order_only(grads, what: str) -> list:
    """``grads`` as a backward returns them; when that backward builds a graph of its own
    (``create_graph=True``), each is tied to a node whose backward raises: the gradient of a
    gradient through ``what`` is refused, never silently left out of a sum."""
    if not torch.is_grad_enabled():
        return list(grads)
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    error = torch._C._functions.DelayedError(
        f"{what} gives first-order gradients only: a gradient of its gradient "
        f"(create_graph=True, then backward again) is not supported".encode(),
        len(present),
    )
    tied = error(*[g.detach().requires_grad_() for g in present])
    tied = iter(tied if isinstance(tied, tuple) else (tied,))
    return [None if g is None else next(tied) for g in grads]


def _differentiable(dtype: str) -> bool:
    return dtype in _fast.FLOATS


def cotangents(grads, outs, out_shapes) -> list:
    """The values of the gradients ``grads`` of outputs ``outs`` (their ``out_shapes``), as a
    vjp node's operands: zeros for an output the loss does not use."""
    cts = []
    for k in outs:
        g = grads[k]
        if g is None:
            s = out_shapes[k]
            g = torch.zeros(s.dims, dtype=IR_TO_TORCH[s.dtype], device="lazy")
        cts.append(g._ir)
    return cts


class _ShardMap(torch.autograd.Function):
    """The region's forward as one node; its backward, the region's vjp node."""

    @staticmethod
    def forward(ctx, meta, *inputs):
        name, free, in_entries, out_entries, out_shapes, sharding, origin, check_vma = meta
        attrs = {"body": name, "in_specs": in_entries, "out_specs": out_entries}
        if not check_vma:  # (only then an attribute: other regions' programs stay as they were)
            attrs["check_vma"] = False
        operands = [t._ir for t in inputs] + free
        node = Generic("ir::shard_map", operands, out_shapes, attrs, sharding, origin)
        outs = tuple(wrap(Value(node, k)) for k in range(len(out_shapes)))
        ctx.save_for_backward(*inputs)
        ctx.meta = meta
        ctx.mark_non_differentiable(*(o for o in outs if not _differentiable(o._ir.shape.dtype)))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        inputs = ctx.saved_tensors
        name, free, in_entries, out_entries, out_shapes, sharding, origin, check_vma = ctx.meta
        for k, t in enumerate(inputs):
            if ctx.needs_input_grad[k + 1] and not _differentiable(t._ir.shape.dtype):
                raise ShardingError(
                    f"shard_map: input {k} ({t.dtype}) needs a gradient; gradients flow through "
                    f"a manual region to floating tensors only ({', '.join(sorted(_fast.FLOATS))})"
                )
        wrt = tuple(k for k, t in enumerate(inputs) if ctx.needs_input_grad[k + 1])
        outs = tuple(k for k, s in enumerate(out_shapes) if _differentiable(s.dtype))
        if not wrt:
            return (None,) * (len(inputs) + 1)
        cts = cotangents(grads, outs, out_shapes)
        mesh = sharding.specs[0].mesh if isinstance(sharding, TupleSharding) else sharding.mesh
        grad_sharding = TupleSharding([ShardingSpec(mesh, in_entries[k]) for k in wrt])
        attrs = {
            "body": name,
            "in_specs": in_entries,
            "out_specs": out_entries,
            "wrt": wrt,
            "outs": outs,
        }
        if not check_vma:
            attrs["check_vma"] = False
        operands = [t._ir for t in inputs] + free + cts
        shapes = [inputs[k]._ir.shape for k in wrt]
        node = Generic("ir::shard_map_grad", operands, shapes, attrs, grad_sharding, origin)
        out = [None] * len(inputs)
        for j, k in enumerate(wrt):
            out[k] = wrap(Value(node, j))
        return (None, *first_order_only(out, "shard_map"))


def shard_map(fn, mesh: Mesh, in_specs, out_specs, check_vma: bool = True):
    """``fn`` run on each device's shards (module docstring): returns a function of as many
    lazy tensors as ``in_specs`` has specs, whose results are placed as ``out_specs`` says (one
    spec when ``fn`` returns one tensor, a sequence of them when it returns a tuple).
    ``check_vma``: as ``jax.shard_map``'s: False turns off jax's tracking of what varies over
    which axis, and with it the check that each out spec can hold its output (some jax code
    needs that: jax's Pallas interpreter, called through ``call_jax``)."""
    if type(check_vma) is not bool:
        raise TypeError(f"shard_map: check_vma must be True or False, got {check_vma!r}")
    if not isinstance(mesh, Mesh):
        raise ShardingError(f"shard_map takes an ir_runtime.Mesh, got {type(mesh).__name__}")
    if not callable(fn):
        raise TypeError(f"shard_map takes a function, got {type(fn).__name__}")
    if isinstance(in_specs, (str, bytes)) or not hasattr(in_specs, "__iter__"):
        raise ShardingError(
            f"shard_map: in_specs must be a sequence with one partition spec per argument, "
            f"got {in_specs!r}"
        )
    in_specs = tuple(in_specs)

    def mapped(*args):
        if _REGIONS:
            raise ShardingError(
                "shard_map inside a manual region is not supported: call the inner function "
                "directly (it already runs on one device's shards)"
            )
        if len(args) != len(in_specs):
            raise ShardingError(
                f"shard_map: in_specs has {len(in_specs)} specs for {len(args)} arguments; "
                f"give one partition spec per argument (e.g. in_specs=(('x', None),) for one)"
            )
        for k, t in enumerate(args):
            if not isinstance(t, LazyTensor):
                raise ShardingError(
                    f"shard_map: argument {k} must be a lazy tensor, got {type(t).__name__}"
                )
        origin = _fast.origin()
        sizes = dict(zip(mesh.axis_names, mesh.shape, strict=True))
        in_entries = tuple(
            _entries(s, t.dim(), f"input {k}", mesh)
            for k, (s, t) in enumerate(zip(in_specs, args, strict=True))
        )
        region, free, outs, several = _trace(fn, mesh, args, in_entries, sizes)
        return _record_region(
            fn,
            mesh,
            args,
            out_specs,
            region,
            free,
            outs,
            several,
            in_entries,
            sizes,
            origin,
            check_vma,
        )

    mapped.__wrapped__ = fn
    return mapped


def _record_region(
    fn, mesh, args, out_specs, region, free, outs, several, in_entries, sizes, origin, check_vma
):
    """The region's node, recorded once its outputs are checked against ``out_specs``."""
    name = getattr(fn, "__qualname__", type(fn).__name__)
    specs = out_specs
    if not several:
        specs = (out_specs,)
    elif (
        isinstance(out_specs, (str, bytes))
        or not hasattr(out_specs, "__iter__")
        or len(tuple(out_specs)) != len(outs)
    ):
        raise ShardingError(
            f"shard_map: {name} returns {len(outs)} tensors; out_specs must be a sequence "
            f"of {len(outs)} partition specs, got {out_specs!r}"
        )
    out_entries = tuple(
        _entries(s, o.dim(), f"output {k}", mesh)
        for k, (s, o) in enumerate(zip(specs, outs, strict=True))
    )
    body = add_region(region)
    _check_with_jax(body, region, (in_entries, out_entries, check_vma), mesh, args, name)
    out_shapes = [
        Shape(ir_dtype(o.dtype), _global_shape(tuple(o.shape), e, sizes))
        for o, e in zip(outs, out_entries, strict=True)
    ]
    sharding = TupleSharding([ShardingSpec(mesh, e) for e in out_entries])
    meta = (body, free, in_entries, out_entries, out_shapes, sharding, origin, check_vma)
    results = _ShardMap.apply(meta, *args)
    return tuple(results) if several else results[0]


def _region(what: str) -> _Tracing:
    if not _REGIONS:
        raise ShardingError(
            f"{what} is a collective over mesh axes: call it inside a function run by "
            f"ir_runtime.shard_map, where each device holds its own shard"
        )
    return _REGIONS[-1]


def _axes(axis, region: _Tracing, what: str) -> tuple:
    axes = (axis,) if isinstance(axis, str) else tuple(axis) if hasattr(axis, "__iter__") else None
    if not axes or not all(isinstance(a, str) for a in axes):
        raise ShardingError(
            f"{what}: axis must be a mesh axis name or a tuple of names, got {axis!r}"
        )
    for a in axes:
        if a not in region.sizes:
            raise ShardingError(
                f"{what}: mesh axis {a!r} does not exist; the mesh has axes "
                f"{list(region.mesh.axis_names)}"
            )
    if len(set(axes)) != len(axes):
        raise ShardingError(f"{what}: axis {axis!r} names an axis twice")
    return axes


def _operand(t, axis, what: str) -> tuple:
    """A collective's checks: inside a region, on a lazy tensor, over named axes; returns the
    region and the axes."""
    region = _region(what)
    if not isinstance(t, LazyTensor):
        raise ShardingError(f"{what} takes a lazy tensor, got {type(t).__name__}")
    return region, _axes(axis, region, what)


def _split(shape: list, d: int, axes, n: int, what: str) -> None:
    """Dimension ``d`` of ``shape`` split into ``n`` blocks, one per device along ``axes``."""
    if shape[d] % n:
        raise ShardingError(
            f"{what} ({shape[d]}) does not divide over mesh axes {axes} ({n} devices)"
        )
    shape[d] //= n


def _collective(op: str, t, shape: tuple, attrs: dict) -> LazyTensor:
    node = Generic(op, [t._ir], [Shape(t._ir.shape.dtype, shape)], attrs, None, _fast.origin())
    return wrap(Value(node))


def _dim(d: int, rank: int, what: str, name: str = "dim") -> int:
    if rank == 0:
        raise ShardingError(f"{what} needs a tensor of at least one dimension, got a 0-d one")
    if not isinstance(d, int) or not -rank <= d < rank:
        raise ShardingError(f"{what}: {name} {d!r} is out of range for a tensor of rank {rank}")
    return d % rank


def all_reduce(t, axis, op: str = "sum") -> LazyTensor:
    """The ``op`` ("sum", "max" or "min") of ``t`` over the devices along ``axis``; every one of
    them gets the result (``lax.psum`` / ``pmax`` / ``pmin``)."""
    _, axes = _operand(t, axis, "all_reduce")
    if op not in ("sum", "max", "min"):
        raise ShardingError(f"all_reduce: op must be 'sum', 'max' or 'min', got {op!r}")
    return _collective("ir::all_reduce", t, tuple(t.shape), {"axes": axes, "op": op})


def all_gather(t, axis, dim: int = 0) -> LazyTensor:
    """The devices' shards along ``axis`` concatenated on dimension ``dim``, on every one of
    them (``lax.all_gather(..., tiled=True)``)."""
    region, axes = _operand(t, axis, "all_gather")
    d = _dim(dim, t.dim(), "all_gather")
    shape = list(t.shape)
    shape[d] *= _size(axes, region.sizes)
    return _collective("ir::all_gather", t, tuple(shape), {"axes": axes, "dim": d})


def reduce_scatter(t, axis, dim: int = 0) -> LazyTensor:
    """The sum of ``t`` over the devices along ``axis``, split on dimension ``dim``: each device
    keeps its block (``lax.psum_scatter(..., tiled=True)``)."""
    region, axes = _operand(t, axis, "reduce_scatter")
    d = _dim(dim, t.dim(), "reduce_scatter")
    shape = list(t.shape)
    _split(shape, d, axes, _size(axes, region.sizes), f"reduce_scatter: dimension {d}")
    return _collective("ir::reduce_scatter", t, tuple(shape), {"axes": axes, "dim": d})


def all_to_all(t, axis, split_dim: int, concat_dim: int) -> LazyTensor:
    """``t`` split into one block per device along ``axis`` on ``split_dim``; block ``i`` goes
    to device ``i``, and each device concatenates what it receives on ``concat_dim``
    (``lax.all_to_all(..., tiled=True)``)."""
    region, axes = _operand(t, axis, "all_to_all")
    s = _dim(split_dim, t.dim(), "all_to_all", "split_dim")
    c = _dim(concat_dim, t.dim(), "all_to_all", "concat_dim")
    n = _size(axes, region.sizes)
    shape = list(t.shape)
    _split(shape, s, axes, n, f"all_to_all: split_dim {s}")
    shape[c] *= n
    attrs = {"axes": axes, "split_dim": s, "concat_dim": c}
    return _collective("ir::all_to_all", t, tuple(shape), attrs)


def ppermute(t, axis, perm) -> LazyTensor:
    """``t`` sent along ``axis``: each ``(source, destination)`` pair in ``perm`` (positions
    along the axis) sends the source's ``t`` to the destination; a device no pair sends to
    gets zeros (``lax.ppermute``)."""
    region, axes = _operand(t, axis, "ppermute")
    n = _size(axes, region.sizes)
    pairs = []
    for p in perm:
        try:
            src, dst = p
        except (TypeError, ValueError):
            raise ShardingError(
                f"ppermute: perm entries are (source, destination) pairs, got {p!r}"
            ) from None
        for v in (src, dst):
            if not isinstance(v, int) or not 0 <= v < n:
                raise ShardingError(
                    f"ppermute: {v!r} in pair {tuple(p)} is not a position along mesh axes "
                    f"{axes} (0 to {n - 1})"
                )
        pairs.append((src, dst))
    for k in (0, 1):
        seen = [p[k] for p in pairs]
        if len(set(seen)) != len(seen):
            which = "source" if k == 0 else "destination"
            raise ShardingError(f"ppermute: perm {pairs} uses a {which} twice")
    return _collective("ir::ppermute", t, tuple(t.shape), {"axes": axes, "perm": tuple(pairs)})


def axis_index(axis) -> LazyTensor:
    """This device's position along ``axis`` (a tuple: the position in those axes together,
    the first the slowest), an int32 0-d tensor (``lax.axis_index``)."""
    region = _region("axis_index")
    axes = _axes(axis, region, "axis_index")
    node = Generic("ir::axis_index", [], [Shape("int32", ())], {"axes": axes}, None, _fast.origin())
    return wrap(Value(node))
