"""``ir::shard_map``, its gradient, and the collectives that run inside it.

A manual region (``shard_map`` in the front end) is recorded as one node whose body is the
graph of the user's function, traced once on placeholders of the local shapes each device
sees: one placeholder per input, and the body's free inputs (lifted scalars, the step's random
key) as further operands, replicated. The node's attributes give the partition spec of each
input and output (``in_specs``, ``out_specs``: per dimension None, an axis name or a tuple of
them); its sharding annotation is the outputs' placement over the mesh, which is also how the
program knows its devices.

Lowered, the node is ``jax.shard_map`` of the body evaluated node by node, as ``_lower``
evaluates a graph: the collective nodes inside (``ir::all_reduce``, ``ir::all_gather``,
``ir::reduce_scatter``, ``ir::all_to_all``, ``ir::ppermute``, ``ir::axis_index``) become
``lax`` collectives over the named mesh axes, and jax checks that each output varies over the
mesh as its out spec says. A body that draws random numbers draws them from the step's key
folded with the device's position along the axes its inputs are split over, so each shard of
data draws its own (and the replicas of one shard draw alike, as one computation). The gradient node
is ``jax.vjp`` of the same ``shard_map``: each collective transposes as jax defines it
(``psum`` to ``psum``, ``psum_scatter`` to a gather, ``ppermute`` to the inverse
permutation, ...). ``all_gather`` is jax's invariant gather: its result is the same on every
device of the axes, so an out spec may leave them out, and its transpose gives each device its
slice of the cotangent. ``all_reduce`` with "max" or "min", which jax does not differentiate,
sends the cotangent to the devices holding the extreme value, shared evenly among ties (as
torch's ``amax`` does).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from ir_core import DeviceData, post_order
from ir_runtime import _lower, _runtime_checks
from ir_runtime._errors import LoweringError
from ir_runtime._jaxapi import all_gather_invariant
from ir_runtime._lowering._registry import register
from ir_runtime._lowering.random import fold_key
from ir_runtime._lowering.regions import bodies
from ir_runtime._placement import spec_at
from ir_sharding import ShardingSpec


class Region:
    """A manual region's graph: ``roots`` (its outputs' Values) in terms of ``params`` (one
    placeholder per input, local shapes) and ``free`` (the other data nodes it reads, in order);
    ``key``: the index in ``free`` of the step's random key, or None; ``axes``: the mesh's axis
    names, in order."""

    __slots__ = ("axes", "free", "key", "order", "params", "roots")

    def __init__(self, roots, params, free, key, axes):
        self.roots, self.params, self.free, self.key = tuple(roots), params, free, key
        self.axes = tuple(axes)
        self.order = post_order(list(self.roots))

    def run(self, vary, *args):
        """The body on one device's shards: ``(*inputs, *free) -> tuple of outputs``; random
        numbers differ along ``vary`` (the mesh axes the inputs are split over)."""
        n = len(self.params)
        env = {id(p): (a,) for p, a in zip(self.params, args[:n], strict=True)}
        free = args[n:]
        env.update((id(f), (a,)) for f, a in zip(self.free, free, strict=True))
        if self.key is not None and vary:
            env[id(self.free[self.key])] = (fold_key(free[self.key], lax.axis_index(vary)),)
        with _runtime_checks.collecting(None):  # (a check's flag would leave the body)
            for node in self.order:
                if type(node) is not DeviceData:
                    operands = [env[id(v.node)][v.index] for v in node.operands]
                    env[id(node)] = _lower.lower_node(node, operands, None)
        return tuple(env[id(r.node)][r.index] for r in self.roots)


def add_region(region: Region) -> str:
    """Register ``region`` (or find an equal one); returns the name the node carries."""
    leaves = [*region.params, *region.free]
    # (how many leaves are inputs: two regions of one graph, a value entering one and read
    # from outside by the other, are two bodies)
    extra = f"{len(region.params)}|{region.key}|{region.axes}".encode()
    return bodies.add(region, list(region.roots), "ir::shard_map", leaves, extra)


def partition(entries) -> PartitionSpec:
    """An attribute's partition spec (per dimension None, a name or a tuple) as jax's."""
    return PartitionSpec(*entries)


def sharded(attrs, region: Region, mesh, body=None):
    """The region as a function of its node's operands: ``jax.shard_map`` of its body, with
    the node's ``attrs`` ``in_specs`` and ``out_specs`` (``body``: a function in place of
    ``region.run``)."""
    in_specs = [partition(s) for s in attrs["in_specs"]]
    in_specs += [PartitionSpec()] * len(region.free)
    out_specs = tuple(partition(s) for s in attrs["out_specs"])
    split = {a for spec in attrs["in_specs"] for axes in spec if axes for a in axes}
    vary = tuple(a for a in region.axes if a in split)
    run = body or region.run
    return jax.shard_map(
        lambda *args: run(vary, *args),
        mesh=mesh,
        in_specs=tuple(in_specs),
        out_specs=out_specs,
        check_vma=attrs.get("check_vma", True),
    )


def jax_mesh(spec: ShardingSpec):
    """The jax mesh of a spec's ir-sharding mesh (its devices, in the mesh's order)."""
    return ShardingSpec.replicated(spec.mesh).to_jax().mesh


@register("ir::shard_map")
def _shard_map(node, *operands):
    region = bodies.of(node)
    return sharded(node.attrs, region, jax_mesh(spec_at(node.sharding, 0)))(*operands)


@register("ir::shard_map_grad")
def _shard_map_grad(node, *operands):
    """Operands: the region's inputs, its free inputs, then one cotangent per output in
    ``outs``; results: one gradient per input in ``wrt``."""
    region = bodies.of(node)
    f = sharded(node.attrs, region, jax_mesh(spec_at(node.sharding, 0)))
    n, wrt, outs = len(region.params), node.attrs["wrt"], node.attrs["outs"]
    m = n + len(region.free)
    xs, free, cts = operands[:n], operands[n:m], operands[m:]

    def differentiable(*diff):
        args = list(xs)
        for k, d in zip(wrt, diff, strict=True):
            args[k] = d
        results = f(*args, *free)
        return tuple(results[k] for k in outs)

    _, vjp = jax.vjp(differentiable, *(xs[k] for k in wrt))
    return tuple(vjp(tuple(cts)))


# The collectives, over ``axes`` (a tuple of mesh axis names), as jax.shard_map runs them.


@register("ir::all_reduce")
def _all_reduce(node, x):
    axes, op = node.attrs["axes"], node.attrs["op"]
    if x.dtype == jnp.bool_:  # (XLA reduces predicates as 0/1)
        return _all_reduce_as(x.astype(jnp.int32), axes, op).astype(jnp.bool_)
    return _all_reduce_as(x, axes, op)


def _all_reduce_as(x, axes, op):
    if op == "sum":
        return lax.psum(x, axes)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return (lax.pmax if op == "max" else lax.pmin)(x, axes)
    return _extremum(x, axes, op)


def _extremum(x, axes, op):
    return _EXTREMUM(x, axes, op)


def _make_extremum():
    """``pmax`` / ``pmin`` with a gradient (jax defines none): the cotangent goes to the devices
    that hold the extreme value, shared evenly among ties, as torch's ``amax`` does."""

    def f(x, axes, op):
        return (lax.pmax if op == "max" else lax.pmin)(x, axes)

    g = jax.custom_vjp(f, nondiff_argnums=(1, 2))

    def fwd(x, axes, op):
        out = f(x, axes, op)
        return out, (x, out)

    def bwd(axes, op, saved, ct):
        x, out = saved
        hit = (x == out).astype(x.dtype)
        return (ct * hit / lax.psum(hit, axes),)

    g.defvjp(fwd, bwd)
    return g


_EXTREMUM = _make_extremum()


@register("ir::all_gather")
def _all_gather(node, x):
    # The gathered value is the same on every device of the axes (jax's invariant gather).
    return all_gather_invariant(x, node.attrs["axes"], node.attrs["dim"])


@register("ir::reduce_scatter")
def _reduce_scatter(node, x):
    return lax.psum_scatter(x, node.attrs["axes"], scatter_dimension=node.attrs["dim"], tiled=True)


@register("ir::all_to_all")
def _all_to_all(node, x):
    a = node.attrs
    return lax.all_to_all(x, a["axes"], a["split_dim"], a["concat_dim"], tiled=True)


@register("ir::ppermute")
def _ppermute(node, x):
    return lax.ppermute(x, node.attrs["axes"], perm=[tuple(p) for p in node.attrs["perm"]])


@register("ir::axis_index")
def _axis_index(node):
    return lax.axis_index(node.attrs["axes"]).astype(jnp.int32)


@register("ir::full_to_shard")
def _full_to_shard(node, x):
    # Only inside a closed region (lifted into ir::shard_map, where it is the body's input).
    raise LoweringError(
        f"a tensor {list(node.shapes[0].dims)} inside an open manual region "
        f"(enable_manual_sharding) reached a program; it holds one device's block, so only "
        f"the region's result (disable_manual_sharding) can be computed"
    )
