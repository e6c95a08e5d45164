"""Lowering: a graph becomes one jax function of its parameters, each node through its rule."""

from __future__ import annotations

import jax

from ir_core import DeviceData, Shape, post_order
from ir_runtime import _metrics, _profile, _runtime_checks
from ir_runtime._dtypes import enable_x64, name_of, to_numpy_dtype
from ir_runtime._errors import LoweringError, RuntimeIRError
from ir_runtime._graph import Graph
from ir_runtime._jaxapi import one_frame_locations, recorded_at
from ir_runtime._lowering._registry import (
    HALF,
    HALF_NAMES,
    NATIVE,
    ONCE,
    ONE_DEVICE,
    OPERANDS,
    ROUNDING,
    WIDE,
    rule_for,
)
from ir_runtime._placement import spec_at
from ir_runtime._rewrite import rewrite


class _Lifted:
    """A node as its rule sees it: lifted scalars back in its attributes, as traced values;
    ``shapes``: the node's, or with half precision read as float32 (``_widened``)."""

    __slots__ = ("attrs", "op", "origin", "shapes")

    def __init__(self, node, attrs, shapes=None):
        self.op = node.op
        self.origin = node.origin
        self.shapes = node.shapes if shapes is None else shapes
        self.attrs = attrs


def _widened(n, view, operands):
    """(view, operands) for ``n``'s rule under its rounding mode (``_registry``'s ``ONCE``):
    where an operand or output is half precision and the mode is not NATIVE, a view whose
    half-precision outputs read float32 and, for ONCE, the operands widened to float32. One
    rounding per op, as eager: the rule computes in float32, ``lower_node`` rounds its
    results to the recorded dtypes."""
    mode = ROUNDING.get(n.op, NATIVE)
    if mode == NATIVE or not (
        any(s.dtype in HALF_NAMES for s in n.shapes) or any(o.dtype in HALF for o in operands)
    ):
        return view, operands
    shapes = tuple(Shape("float32", s.dims) if s.dtype in HALF_NAMES else s for s in n.shapes)
    if mode == ONCE:
        operands = [o.astype(WIDE) if o.dtype in HALF else o for o in operands]
    return _Lifted(n, view.attrs, shapes), operands


def lower_node(n, operands, program):
    """The traced outputs of node ``n`` from its operands' traced values, by its rule; each
    output checked against the node's shapes and constrained to the node's sharding. Where
    ``n`` computes in half precision, its rule computes in float32 and the results are rounded
    once (``_widened``)."""
    rule = rule_for(n.op)
    lifted = n.attrs.get("__lifted__")
    view = n
    if lifted:
        k = len(lifted)
        attrs = {a: v for a, v in n.attrs.items() if a != "__lifted__"}
        attrs.update(zip(lifted, operands[-k:], strict=True))
        operands = operands[:-k]
        view = _Lifted(n, attrs)
    view, operands = _widened(n, view, operands)
    split = OPERANDS.get(n.op)
    if split is not None:
        operands = split.split(view.attrs, operands)
    try:
        origin = n.origin
        code = getattr(origin, "code", None)
        if code is None:
            with jax.named_scope(n.op):
                out = rule(view, *operands)
        else:
            # The torch line that recorded the node becomes the location of every operation
            # its rule traces; its function and the op name become their scope (XLA's op_name).
            with recorded_at(code, origin.lasti), jax.named_scope(f"{code.co_qualname}:{n.op}"):
                out = rule(view, *operands)
    except RuntimeIRError:
        raise
    except Exception as e:
        raise LoweringError(
            f"lowering {n.op!r} failed: {type(e).__name__}: {e} (node {n!r})"
        ) from e
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(n.shapes):
        raise LoweringError(
            f"the rule for {n.op!r} gave {len(outs)} output(s), the node has {len(n.shapes)}"
        )
    if view.shapes is not n.shapes:  # rounded once, to the dtypes recorded
        outs = [
            o.astype(to_numpy_dtype(s.dtype)) if s.dtype in HALF_NAMES and o.dtype == WIDE else o
            for o, s in zip(outs, n.shapes, strict=False)
        ]
    checked = []
    for k, (o, s) in enumerate(zip(outs, n.shapes, strict=True)):
        if tuple(o.shape) != s.dims or name_of(o.dtype) != s.dtype:
            raise LoweringError(
                f"the rule for {n.op!r} gave output {k} as {name_of(o.dtype)}{list(o.shape)}, "
                f"but the node says {s}; the rule or the front end's shape inference is wrong"
            )
        spec = spec_at(n.sharding, k)
        if spec is not None:
            sharding = program.jax_sharding(spec)
            if n.op == "ir::annotate" and n.attrs.get("open"):
                sharding = open_dims(sharding, n.attrs["open"])
            o = jax.lax.with_sharding_constraint(o, sharding)
        checked.append(o)
    return tuple(checked)


def open_dims(sharding, dims):
    """``sharding`` with ``dims`` left to XLA (``PartitionSpec.UNCONSTRAINED``): a placement that
    fixes some dims and lets propagation choose the others (a placement on a sub-mesh says
    nothing of the root mesh's other axes)."""
    from jax.sharding import NamedSharding, PartitionSpec

    entries = list(sharding.spec) + [None] * (max(dims) + 1 - len(sharding.spec))
    for d in dims:
        entries[d] = PartitionSpec.UNCONSTRAINED
    return NamedSharding(sharding.mesh, PartitionSpec(*entries))


def function(g: Graph, out_order=None, checks=None):
    """The graph as a function of its parameters' arrays (in ``g.params`` order), after the
    rewrite rules, returning the roots' results (in ``out_order``, when given). It closes over
    the nodes, so it is used only to trace and then dropped: the cache keeps compiled
    programs, not graphs. ``checks``: a list, for a checked program (``_runtime_checks``):
    tracing fills it, and the function returns the checks' flags after the results."""
    params, program = g.params, g.program
    roots = rewrite(g.roots, g.order, program)
    order = g.order if roots is g.roots else post_order(roots)

    def run(*args):
        env = {id(p): (a,) for p, a in zip(params, args, strict=True)}
        one = ONE_DEVICE.set(program.one_device)
        try:
            with _runtime_checks.collecting(checks) as collector:
                for n in order:
                    if type(n) is not DeviceData:
                        operands = [env[id(v.node)][v.index] for v in n.operands]
                        env[id(n)] = lower_node(n, operands, program)
        finally:
            ONE_DEVICE.reset(one)
        outs = [env[id(r.node)][r.index] for r in roots]
        outs = tuple(outs if out_order is None else (outs[k] for k in out_order))
        return outs if collector is None else (*outs, collector.result())

    return run


def lowered(g: Graph, donate: tuple = (), order=None, checks=None):
    """``jax.jit`` of the graph's function, lowered for its parameters' shapes and shardings;
    ``order``: the order it returns the roots' results in (None: theirs); ``checks``: a list,
    for a checked program (``function``), whose flags come last, replicated."""
    outs = g.out_shardings()
    outs = tuple(outs if order is None else (outs[k] for k in order))
    if checks is not None:
        outs += (g.program.replicated,)
    with _metrics.timed("LowerTime"), _profile.span("ir_runtime.lower"):
        fn = jax.jit(
            function(g, order, checks),
            in_shardings=g.in_shardings(),
            out_shardings=outs,
            donate_argnums=donate,
            keep_unused=True,
        )
        with one_frame_locations():
            return fn.lower(*g.abstract_params())


def lower(roots, debug_info: bool = False) -> str:
    """The StableHLO text of the graph of ``roots`` (a ``Value`` or a list of them), checked
    when ``IR_RUNTIME_PROGRAM_CHECKS`` says so; ``debug_info``: with each operation's location
    (``loc(...)``: the file and line that recorded its node, where the node has an
    ``origin``)."""
    enable_x64()
    checks = [] if _runtime_checks.enabled() else None
    return lowered(Graph(roots), checks=checks).as_text(debug_info=debug_info)
