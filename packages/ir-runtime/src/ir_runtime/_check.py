"""The IR verifier: ``check_graph(roots)`` checks a graph against the dialect the front end
records and the lowering reads (``docs/dialect.md``), before it is lowered.

The rules are one table, ``RULES``, read top to bottom: each names what it reads, the nodes it
applies to (by op, decided once per op), the check (``check(node, walk)`` -> None, or what is
wrong) and the requirement it enforces. Every violation is collected, in one post-order walk
of the graph (ir-core's, iterative: no recursion limit, linear time) and one of each body a
node names (``ir::scan_layers``, ``ir::shard_map``); each says the node's op, its position and
the source line that recorded it. ``check_graph`` raises one ``GraphError`` listing them, or
returns them. A rule that reads only a node's own record (op, shapes, attributes, sharding)
runs once per distinct record (ir-core's ``node_hash``): a model's repeated layers cost one
dict lookup per node for those.

The compile cache runs it on a cache miss, before lowering, while ``IR_RUNTIME_DEBUG`` is on
(``set_debug``) or ``IR_RUNTIME_CHECK=1`` (``ALWAYS``; the test suites set it): a cache hit,
and a replayed step, pay nothing.

One module, though long, because the rules are one table: each check sits above the row that
names it, and the table reads top to bottom as the dialect's requirements.

What ir-core already refuses when a node is built (a dtype it does not know, an output index
out of range, an operand that is not a ``Value``, an attribute value it cannot hash) is not
checked again here: no graph can hold it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from ir_core import DeviceData, Shape, Value, post_order
from ir_runtime import _debug, _schema
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import DTypeError, GraphError, UnsupportedOpError
from ir_runtime._lowering import _registry
from ir_runtime._lowering.attention import broadcastable, lse_dtype
from ir_runtime._lowering.regions import bodies, jax_call
from ir_runtime._lowering.regions.scan import Body
from ir_runtime._lowering.regions.shard_map import Region
from ir_sharding import ShardingSpec, TupleSharding

# Verify every graph compiled, debugging or not (the test suites turn it on).
ALWAYS = [os.environ.get("IR_RUNTIME_CHECK", "0") not in ("", "0")]
SHOWN = 50  # violations a GraphError's message lists; all of them are in its ``violations``


def enabled() -> bool:
    """Whether the cache verifies the graphs it compiles: debugging (read at each miss, so
    ``set_debug`` takes effect at once) or ``ALWAYS``."""
    return _debug.DEBUG[0] or ALWAYS[0]


class Violation(NamedTuple):
    """One broken rule: ``rule`` its name in ``RULES``; ``node`` the node (None for a root that
    is not a Value); ``where`` the node as text (op, source line, position); ``message`` what
    is wrong."""

    rule: str
    node: object
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message} [{self.rule}]"


class _UnsupportedGraphError(GraphError, UnsupportedOpError):
    """A graph whose violations include an op with no lowering rule: also the
    ``UnsupportedOpError`` lowering would have raised, so checking changes no ``except``."""


# -- what each ATen op's schema allows --------------------------------------------------------


class _Aten:
    """An ATen overload's schema, as the front end records it (``_schema``)."""

    __slots__ = ("attrs", "dtypes", "fixed", "list", "optional", "outputs", "scalars", "tensors")

    def __init__(self, op: str):
        schema = _schema.overload(op)._schema
        split = _registry.OPERANDS[op]
        self.fixed = split.fixed
        self.optional = tuple(name for name, kind in split.args if kind == _schema.OPTIONAL_TENSOR)
        self.list = any(kind == _schema.TENSOR_LIST for _, kind in split.args)
        self.tensors = frozenset(
            name for name, kind in split.args if kind in (_schema.TENSOR, _schema.TENSOR_LIST)
        )
        names = {a.name for a in schema.arguments}
        self.attrs = frozenset(
            (names - self.tensors) | {"__lifted__"} | ({"indexed"} if self.list else set())
        )
        self.scalars = frozenset(
            a.name for a in schema.arguments if _schema.argument_kind(a.type) == _schema.SCALAR
        )
        self.dtypes = tuple(
            a.name
            for a in schema.arguments
            if str(a.real_type) in ("ScalarType", "Optional[ScalarType]")
        )
        returns = [str(r.type) for r in schema.returns]
        self.outputs = len(returns) if all(r == "Tensor" for r in returns) else None


_ATEN: dict = {}


def _aten(op: str) -> _Aten:
    info = _ATEN.get(op)
    if info is None:
        info = _ATEN[op] = _Aten(op)
    return info


def _numpy_dtype(name):
    """The numpy dtype of a dtype name, or None when the runtime has none."""
    try:
        return to_numpy_dtype(name)
    except DTypeError:
        return None


def _lifted(n) -> int:
    """How many trailing operands are lifted scalars."""
    lifted = n.attrs.get("__lifted__")
    return len(lifted) if type(lifted) is tuple else 0


# -- the checks: each returns None, or what is wrong -------------------------------------------


def _root(r, walk):
    if type(r) is not Value:
        return f"root {r!r} ({type(r).__name__}) is not an ir_core.Value; roots are Values"
    return None


def _no_rule(n, walk):
    return (
        f"no lowering rule for op {n.op!r}: add one with ir_runtime.register_lowering({n.op!r}) "
        f"(ir_runtime.supported_ops() lists the {len(_registry.RULES)} it has)"
    )


def _output_dtypes(n, walk):
    for k, s in enumerate(n.shapes):
        if _numpy_dtype(s.dtype) is None:
            return f"output {k} has dtype {s.dtype!r}, which the runtime cannot lower"
    return None


def _handle(n, walk):
    h = n.handle
    if h is None:  # an abstract leaf: a body's placeholder, a graph compiled without data
        return None
    dims = n.shape.dims
    shape = getattr(h, "shape", None)
    if shape is None:
        try:
            shape = np.shape(h)
        except Exception as e:
            return f"its handle {type(h).__name__} is not an array: {e}"
    if tuple(shape) != dims:
        return f"its handle holds an array of shape {list(shape)}, the node says {n.shape}"
    if isinstance(h, jax.Array) and _numpy_dtype(n.shape.dtype) != h.dtype:
        return f"its handle is a jax array of {h.dtype}, the node says {n.shape}"
    return None


def _sharding_type(n, walk):
    s = n.sharding
    if isinstance(s, TupleSharding):
        if len(s.specs) != len(n.shapes):
            return (
                f"its TupleSharding has {len(s.specs)} entries for {len(n.shapes)} outputs; "
                f"give one (a ShardingSpec or None) per output"
            )
        return None
    if isinstance(s, ShardingSpec):
        return None
    return (
        f"its sharding {s!r} ({type(s).__name__}) is not an ir_sharding ShardingSpec or "
        f"TupleSharding"
    )


def _specs(n) -> list:
    """(output, spec) for each ShardingSpec of a node's sharding (a ShardingSpec is every
    output's); none for a sharding of another type."""
    s = n.sharding
    if isinstance(s, TupleSharding):
        return [(k, spec) for k, spec in enumerate(s.specs) if spec is not None]
    if isinstance(s, ShardingSpec):
        return [(k, s) for k in range(len(n.shapes))]
    return []


def _sharding_rank(n, walk):
    for k, spec in _specs(n):
        if k < len(n.shapes) and spec.rank is not None and spec.rank != len(n.shapes[k].dims):
            return (
                f"output {k} ({n.shapes[k]}) has rank {len(n.shapes[k].dims)}, but its sharding "
                f"{spec.partition_spec} has {spec.rank} entries"
            )
    return None


def _one_device_set(n, walk):
    for _, spec in _specs(n):
        ids = walk.devices_of(spec.mesh)
        if walk.devices is None:
            walk.devices, walk.devices_at = ids, walk.where(n)
        elif ids != walk.devices:
            return (
                f"its sharding is over devices {sorted(ids)}, but {walk.devices_at} is over "
                f"{sorted(walk.devices)}; one program runs on one set of devices"
            )
    return None


def _aten_operands(n, walk):
    info = _ATEN.get(n.op) or _aten(n.op)
    attrs = n.attrs
    lifted = attrs.get("__lifted__")
    count = len(n.operands) - (len(lifted) if type(lifted) is tuple else 0)
    tensors = info.fixed
    if info.optional:
        tensors += sum(1 for name in info.optional if name not in attrs)
    if not info.list:
        if count != tensors:
            return _operand_count(n, count, f"{tensors}", info)
        return None
    if count < tensors:
        return _operand_count(n, count, f"at least {tensors}", info)
    indexed = attrs.get("indexed")
    if type(indexed) is tuple and sum(1 for p in indexed if p is True) != count - tensors:
        return (
            f"its `indexed` attribute marks {sum(1 for p in indexed if p is True)} present "
            f"entries of its tensor list, but {count - tensors} operands are left for the list"
        )
    return None


def _operand_count(n, count: int, want: str, info: _Aten) -> str:
    lifted = _lifted(n)
    return (
        f"has {count} tensor operand{'s' if count != 1 else ''}"
        f"{f' (plus {lifted} lifted scalars)' if lifted else ''}; "
        f"its schema takes {want} ({info.fixed} tensors, and each optional tensor not given "
        f"as an attribute set to None)"
    )


def _aten_attrs(n, walk):
    info = _aten(n.op)
    attrs = n.attrs
    if not attrs.keys() <= info.attrs:
        bad = sorted(set(attrs) - info.attrs)
        what = "a tensor argument (an operand)" if bad[0] in info.tensors else "no argument"
        return f"attribute {bad[0]!r} is {what} of its schema"
    for name in info.optional:
        if name in attrs and attrs[name] is not None:
            return (
                f"optional tensor {name!r} is an attribute set to {attrs[name]!r}; an absent one "
                f"is an attribute set to None, a present one an operand"
            )
    lifted = attrs.get("__lifted__")
    if lifted is not None:
        if type(lifted) is not tuple or not all(type(a) is str for a in lifted):
            return f"`__lifted__` is {lifted!r}; it is a tuple of scalar argument names"
        for name in lifted:
            if name not in info.scalars:
                return f"`__lifted__` names {name!r}, which is not a Scalar argument of its schema"
            if name in attrs:
                return f"scalar {name!r} is both lifted and an attribute"
        if len(lifted) > len(n.operands):
            return (
                f"`__lifted__` names {len(lifted)} scalars, but it has {len(n.operands)} operands"
            )
    indexed = attrs.get("indexed")
    if indexed is not None and (
        type(indexed) is not tuple or not all(type(p) is bool for p in indexed)
    ):
        return f"`indexed` is {indexed!r}; it is a tuple of bools, one per entry of the list"
    return None


def _lifted_scalars(n, walk):
    lifted = n.attrs.get("__lifted__")
    if type(lifted) is tuple and 0 < len(lifted) <= len(n.operands):
        for name, v in zip(lifted, n.operands[-len(lifted) :], strict=True):
            if v.shape.dims != ():
                return f"lifted scalar {name!r} is {v.shape}, not a 0-d operand"
    return None


def _aten_dtype_attrs(n, walk):
    attrs = n.attrs
    for name in _aten(n.op).dtypes:
        v = attrs.get(name)
        if v is not None and (type(v) is not str or _numpy_dtype(v) is None):
            return f"attribute {name!r} (a ScalarType) is {v!r}, not a dtype name the runtime knows"
    return None


def _aten_outputs(n, walk):
    most = _aten(n.op).outputs
    if not n.shapes or (most is not None and len(n.shapes) > most):
        return f"has {len(n.shapes)} outputs; its schema returns {most} tensors"
    return None


# The ir:: ops of fixed arity: (operands, outputs) and the attributes their rules read.
_RANDOM = {
    "ir::random_uniform": ("low", "high"),
    "ir::random_normal": ("mean", "std"),
    "ir::random_log_normal": ("mean", "std"),
    "ir::random_exponential": ("lambd",),
    "ir::random_cauchy": ("median", "sigma"),
    "ir::random_geometric": ("p",),
    "ir::random_randint": ("low", "high"),
    "ir::random_bernoulli": ("p",),
    "ir::random_bernoulli_tensor": (),
    "ir::random_multinomial": ("replacement",),
    "ir::random_permutation": (),
}
_COLLECTIVES = {
    "ir::all_reduce": ("axes", "op"),
    "ir::all_gather": ("axes", "dim"),
    "ir::reduce_scatter": ("axes", "dim"),
    "ir::all_to_all": ("axes", "split_dim", "concat_dim"),
    "ir::ppermute": ("axes", "perm"),
    "ir::axis_index": ("axes",),
}
_ARITY = {
    **{op: (1, 1) for op in _RANDOM},
    "ir::random_bernoulli_tensor": (2, 1),
    "ir::random_multinomial": (2, 1),
    **{op: (1, 1) for op in _COLLECTIVES},
    "ir::axis_index": (0, 1),
    "ir::annotate": (1, 1),
    "ir::materialize": (1, 1),
    "ir::shard_alike": (2, 2),
}
_SCANS = ("ir::scan_layers", "ir::scan_layers_grad")
_JAX_CALLS = ("ir::call_jax", "ir::call_jax_vjp")
_SHARD_MAPS = ("ir::shard_map", "ir::shard_map_grad")
_ATTENTIONS = ("ir::attention", "ir::attention_backward")
_ATTRS = {
    **{op: ("offset", *names) for op, names in _RANDOM.items()},
    **_COLLECTIVES,
    **dict.fromkeys(_SCANS, ("body", "params", "layers")),
    "ir::shard_map": ("body", "in_specs", "out_specs"),
    "ir::shard_map_grad": ("body", "in_specs", "out_specs", "wrt", "outs"),
    "ir::call_jax": ("fn", "name"),
    "ir::call_jax_vjp": ("fn", "name", "wrt", "outs", "inputs"),
    **dict.fromkeys(_ATTENTIONS, ("causal", "scale")),
}
_SAME_SHAPES = ("ir::annotate", "ir::materialize", "ir::shard_alike", "ir::optimization_barrier")
_KEY = ("uint32", (3,))


def _ir_arity(n, walk):
    operands, outputs = _ARITY[n.op]
    if len(n.operands) != operands or len(n.shapes) != outputs:
        return (
            f"has {len(n.operands)} operands and {len(n.shapes)} outputs; it takes {operands} "
            f"and gives {outputs}"
        )
    return None


def _ir_attrs(n, walk):
    attrs = n.attrs
    for name in _ATTRS[n.op]:
        if name not in attrs:
            return f"has no {name!r} attribute, which its lowering rule reads"
    return None


def _open_dims(n, walk):
    dims = n.attrs.get("open")
    if dims is None:
        return None
    rank = len(n.shapes[0].dims)
    if (
        type(dims) is not tuple
        or not dims
        or any(type(d) is not int or not 0 <= d < rank for d in dims)
        or len(set(dims)) != len(dims)
    ):
        return f"its `open` is {dims!r}; it is a non-empty tuple of distinct dims in [0, {rank})"
    if n.sharding is None:
        return "has `open` dims but no sharding: open dims leave part of a placement to XLA"
    return None


def _random_key(n, walk):
    if not n.operands or (n.operands[0].shape.dtype, n.operands[0].shape.dims) != _KEY:
        got = n.operands[0].shape if n.operands else "no operand"
        return (
            f"operand 0 is {got}; a random op draws from a uint32[3] key (seed, step, base), "
            f"its operand 0"
        )
    offset = n.attrs.get("offset")
    if type(offset) is not int or not 0 <= offset < 2**32:
        return f"its `offset` is {offset!r}; it is an int in [0, 2**32), folded into the key"
    return None


def _same_shapes(n, walk):
    if len(n.operands) != len(n.shapes):
        return f"has {len(n.operands)} operands and {len(n.shapes)} outputs; one output per operand"
    for k, (v, s) in enumerate(zip(n.operands, n.shapes, strict=True)):
        if v.shape != s:
            return f"output {k} is {s}, but operand {k} is {v.shape}; they pass through unchanged"
    return None


def _body(n):
    """The registered body a node names, of its kind, or None."""
    body = bodies.BODIES.get(n.attrs.get("body"))
    kind = Body if n.op in _SCANS else Region
    return body if isinstance(body, kind) else None


def _body_registered(n, walk):
    name = n.attrs.get("body")
    if type(name) is not str:
        return f"its `body` is {name!r}; it is the name of a registered body (a str)"
    found = bodies.BODIES.get(name)
    if found is None:
        return (
            f"its body {name!r} is not registered (more than {bodies.BODIES.capacity} bodies "
            f"recorded since, or a name made up)"
        )
    if _body(n) is None:
        return f"its body {name!r} is a {type(found).__name__}, not the body of an {n.op}"
    walk.enter(n, found)
    return None


def _attention(n, walk):
    back = n.op == "ir::attention_backward"
    counts = (6, 7) if back else (3, 4)
    if len(n.operands) not in counts:
        return f"has {len(n.operands)} operands; it takes {counts[0]}, or {counts[1]} with a mask"
    causal, scale = n.attrs.get("causal"), n.attrs.get("scale")
    if type(causal) is not bool or type(scale) is not float:
        return f"`causal` {causal!r} and `scale` {scale!r}: a bool and a float"
    q, k, v = (o.shape for o in n.operands[back : back + 3])
    if not (len(q.dims) == len(k.dims) == len(v.dims) >= 3) or not (
        q.dims[:-3] == k.dims[:-3] == v.dims[:-3] and q.dtype == k.dtype == v.dtype
    ):
        return f"q {q}, k {k}, v {v}: one dtype, rank 3 or more, the same batch dimensions"
    (hq, _, e), (hk, s, ek), (hv, sv, ev) = q.dims[-3:], k.dims[-3:], v.dims[-3:]
    if hq % hk or (hv, sv, ek) != (hk, s, e):
        return f"q {q}, k {k}, v {v}: q's heads a multiple of k's, k and v alike, q and k's E"
    if len(n.operands) == counts[1]:
        mask, logits = n.operands[-1].shape, (*q.dims[:-1], s)
        if mask.dtype not in ("bool", q.dtype) or not broadcastable(mask.dims, logits):
            return f"the mask {mask} is bool or q's dtype, broadcastable to {list(logits)}"
    out = Shape(q.dtype, (*q.dims[:-1], ev))
    lse = Shape(lse_dtype(q.dtype), q.dims[:-1])
    if back:
        given = [n.operands[0].shape, n.operands[4].shape, n.operands[5].shape]
        if given != [out, out, lse]:
            return f"the gradient, output and log-sum-exp are {given}; they are {[out, out, lse]}"
    want = [q, k, v] if back else [out, lse]
    if list(n.shapes) != want:
        return f"its outputs are {list(n.shapes)}; for these operands they are {want}"
    return None


def _jax_function(n, walk):
    digest = n.attrs.get("fn")
    if type(digest) is not str or digest not in jax_call.FUNCTIONS:
        return (
            f"its `fn` {digest!r} names no registered JAX function (more than "
            f"{jax_call.FUNCTIONS.capacity} functions called since, or a name made up)"
        )
    if n.op == "ir::call_jax_vjp":
        a = n.attrs
        inputs, wrt, outs = a.get("inputs"), a.get("wrt"), a.get("outs")
        if type(inputs) is not int or type(wrt) is not tuple or type(outs) is not tuple:
            return f"its `inputs` {inputs!r}, `wrt` {wrt!r}, `outs` {outs!r} are not int, tuples"
        if len(n.operands) != inputs + len(outs):
            return (
                f"has {len(n.operands)} operands; it takes {inputs + len(outs)}: {inputs} "
                f"inputs, then one cotangent per output in `outs`"
            )
        if len(n.shapes) != len(wrt) or any(
            type(k) is not int or not 0 <= k < inputs or n.shapes[j] != n.operands[k].shape
            for j, k in enumerate(wrt)
        ):
            return f"its outputs {list(map(str, n.shapes))} are not the gradients of inputs {wrt}"
    return None


def _scan_wiring(n, walk):
    body = _body(n)
    a = n.attrs
    p, layers = a.get("params"), a.get("layers")
    if body is None or type(p) is not int or type(layers) is not int:
        return None if body is None else f"its `params` {p!r} and `layers` {layers!r} are not ints"
    grad = n.op == "ir::scan_layers_grad"
    if p != len(body.params):
        return f"its `params` is {p}, but its body has {len(body.params)} parameters"
    want = 1 + p + len(body.free) + grad
    if len(n.operands) != want:
        return (
            f"has {len(n.operands)} operands; it takes {want}: the input, {p} stacked "
            f"parameters, {len(body.free)} free inputs of its body"
            + (", the output's gradient" if grad else "")
        )
    ops = n.operands
    x = ops[0].shape
    if x != body.carry.shape or body.root.shape != x:
        return f"operand 0 is {x}; its body takes {body.carry.shape} to {body.root.shape}"
    for j, ph in enumerate(body.params):
        s = ops[1 + j].shape
        if s.dtype != ph.shape.dtype or s.dims != (layers, *ph.shape.dims):
            return f"stacked parameter {j} is {s}; {layers} layers of {ph.shape} are expected"
    for j, leaf in enumerate(body.free):
        if ops[1 + p + j].shape != leaf.shape:
            return f"free input {j} is {ops[1 + p + j].shape}; its body reads {leaf.shape}"
    want = [x, *(v.shape for v in ops[1 : 1 + p])] if grad else [x]
    if grad and ops[-1].shape != x:
        return f"the gradient operand is {ops[-1].shape}; the output is {x}"
    if list(n.shapes) != want:
        return f"outputs are {list(map(str, n.shapes))}; {list(map(str, want))} are expected"
    return None


def _entries_ok(entries) -> bool:
    return type(entries) is tuple and all(
        e is None or (type(e) is tuple and all(type(a) is str for a in e)) for e in entries
    )


def _resized(dims, entries, sizes: dict, local: bool):
    """``dims`` split over (``local``) or put together from the mesh axes of ``entries``; None
    when a dimension does not divide or an axis is not the mesh's."""
    if len(dims) != len(entries):
        return None
    out = []
    for d, axes in zip(dims, entries, strict=True):
        k = 1
        for a in axes or ():
            if a not in sizes:
                return None
            k *= sizes[a]
        if local and d % k:
            return None
        out.append(d // k if local else d * k)
    return tuple(out)


def _shard_map_wiring(n, walk):
    region = _body(n)
    if region is None:
        return None
    a = n.attrs
    ins, outs_specs = a.get("in_specs"), a.get("out_specs")
    if type(ins) is not tuple or type(outs_specs) is not tuple:
        return f"its `in_specs` {ins!r} and `out_specs` {outs_specs!r} are not tuples"
    if not all(_entries_ok(e) for e in (*ins, *outs_specs)):
        return "a partition spec in `in_specs` or `out_specs` is not a tuple of None or names"
    np_, nf = len(region.params), len(region.free)
    if len(ins) != np_ or len(outs_specs) != len(region.roots):
        return (
            f"has {len(ins)} in specs and {len(outs_specs)} out specs; its body takes {np_} "
            f"inputs and gives {len(region.roots)} outputs"
        )
    grad = n.op == "ir::shard_map_grad"
    wrt, outs = (a.get("wrt"), a.get("outs")) if grad else ((), ())
    if grad and not (
        type(wrt) is tuple
        and type(outs) is tuple
        and all(type(k) is int and 0 <= k < np_ for k in wrt)
        and all(type(k) is int and 0 <= k < len(region.roots) for k in outs)
    ):
        return f"its `wrt` {wrt!r} and `outs` {outs!r} are not tuples of input/output indices"
    want = np_ + nf + len(outs)
    if len(n.operands) != want:
        return (
            f"has {len(n.operands)} operands; it takes {want}: {np_} inputs, {nf} free inputs "
            f"of its body" + (f", {len(outs)} output gradients" if grad else "")
        )
    specs = _specs(n)
    sizes = walk.sizes_of(specs[0][1].mesh) if specs else None
    ops = n.operands
    for k, (v, entries, ph) in enumerate(zip(ops, ins, region.params, strict=False)):
        s = v.shape
        local = None if sizes is None else _resized(s.dims, entries, sizes, True)
        if s.dtype != ph.shape.dtype or (sizes is not None and local != ph.shape.dims):
            return f"input {k} is {s} with spec {entries}; its body takes {ph.shape} per device"
    for j, leaf in enumerate(region.free):
        if ops[np_ + j].shape != leaf.shape:
            return f"free input {j} is {ops[np_ + j].shape}; its body reads {leaf.shape}"
    if sizes is None:
        return None

    def global_of(k):
        r = region.roots[k].shape
        dims = _resized(r.dims, outs_specs[k], sizes, False)
        return None if dims is None else (r.dtype, dims)

    if not grad:
        for k, s in enumerate(n.shapes):
            if (s.dtype, s.dims) != global_of(k):
                return f"output {k} is {s}; its body's output {k} put together is {global_of(k)}"
        if len(n.shapes) != len(region.roots):
            return f"has {len(n.shapes)} outputs; its body gives {len(region.roots)}"
        return None
    for j, k in enumerate(outs):
        s = ops[np_ + nf + j].shape
        if (s.dtype, s.dims) != global_of(k):
            return f"output gradient {j} is {s}; output {k} of the region is {global_of(k)}"
    if [(s.dtype, s.dims) for s in n.shapes] != [
        (ops[k].shape.dtype, ops[k].shape.dims) for k in wrt
    ]:
        return f"outputs are {list(map(str, n.shapes))}; one per input in `wrt` {wrt}, like it"
    return None


def _sharded(n, walk):
    if n.sharding is None:
        return "has no sharding; its lowering reads the mesh from it"
    return None


def _collective(n, walk):
    region = walk.region
    if region is None:
        return "is a collective outside a shard_map body (it runs over a manual region's axes)"
    axes = n.attrs.get("axes")
    if type(axes) is not tuple or not axes or not all(a in region for a in axes):
        return f"its `axes` {axes!r} are not axes of the region's mesh {tuple(region)}"
    if n.op == "ir::axis_index":
        return None if n.shapes[0].dims == () else "its output is not 0-d"
    size = 1
    for a in axes:
        size *= region[a]
    x, dims = n.operands[0].shape, list(n.operands[0].shape.dims)
    a = n.attrs
    try:
        if n.op == "ir::all_gather":
            dims[a["dim"]] *= size
        elif n.op == "ir::reduce_scatter":
            dims[a["dim"]] //= size
        elif n.op == "ir::all_to_all":
            dims[a["split_dim"]] //= size
            dims[a["concat_dim"]] *= size
    except (IndexError, TypeError):
        return f"its dims are not dims of its operand {x}"
    if n.shapes[0].dtype != x.dtype or n.shapes[0].dims != tuple(dims):
        return f"its output is {n.shapes[0]}; from {x} over {size} devices, {tuple(dims)}"
    return None


def _unsharded_in_body(n, walk):
    if n.sharding is not None:
        return "carries a sharding inside a body, which is lowered without a program to place it"
    return None


# -- the table ----------------------------------------------------------------------------------


class Rule(NamedTuple):
    """``name``; ``on``: what it reads. "root": each root. "record": the node's own record (op,
    shapes, attributes, sharding: what ir-core's ``node_hash`` hashes), so it runs once per
    distinct record in a graph and its finding holds for every node of that record. "node":
    also the node's operands or handle, on every node. "sharded": the record of an annotated
    node outside a body; "body": the record of a node inside one. ``applies(op)``: whether it
    checks nodes of ``op`` (None: a DeviceData leaf), decided once per op. ``check(x, walk)``:
    None, or what is wrong. ``message``: the requirement, as ``docs/dialect.md`` states it."""

    name: str
    on: str
    applies: Callable[[str | None], bool]
    check: Callable
    message: str


def _known(op) -> bool:
    return op is not None and op in _registry.RULES


def _is_aten(op) -> bool:
    return _known(op) and op in _registry.OPERANDS


def _every(op) -> bool:
    return True


def _generic(op) -> bool:
    return op is not None


def _ir(ops):
    return lambda op: _known(op) and op in ops


RULES = (
    Rule("root", "root", _every, _root, "every root is an ir_core.Value"),
    Rule(
        "op-known",
        "record",
        lambda op: op is not None and op not in _registry.RULES,
        _no_rule,
        "a Generic's op has a lowering rule",
    ),
    Rule("output-dtype", "record", _every, _output_dtypes, "every output's dtype is the runtime's"),
    Rule(
        "leaf-handle",
        "node",
        lambda op: op is None,
        _handle,
        "a DeviceData's handle is None (abstract) or an array of its shape (a jax array also of "
        "its dtype)",
    ),
    Rule(
        "aten-operands",
        "node",
        _is_aten,
        _aten_operands,
        "an ATen node's operands are its schema's tensors in order, then its lifted scalars",
    ),
    Rule(
        "aten-attrs",
        "record",
        _is_aten,
        _aten_attrs,
        "an ATen node's attributes are its schema's other arguments (an absent optional tensor "
        "as None), `__lifted__` and `indexed`",
    ),
    Rule(
        "lifted-scalar",
        "node",
        lambda op: _is_aten(op) and bool(_aten(op).scalars),
        _lifted_scalars,
        "each lifted scalar is a 0-d operand",
    ),
    Rule(
        "aten-dtype-attr",
        "record",
        lambda op: _is_aten(op) and bool(_aten(op).dtypes),
        _aten_dtype_attrs,
        "a ScalarType attribute is None or a dtype name",
    ),
    Rule(
        "aten-outputs",
        "record",
        _is_aten,
        _aten_outputs,
        "an ATen node has one to as many outputs as its schema returns tensors",
    ),
    Rule(
        "ir-arity",
        "node",
        _ir(_ARITY),
        _ir_arity,
        "an ir:: op has its fixed number of operands and outputs",
    ),
    Rule(
        "ir-attrs", "record", _ir(_ATTRS), _ir_attrs, "an ir:: op has the attributes its rule reads"
    ),
    Rule(
        "annotate-open",
        "node",
        _ir(("ir::annotate",)),
        _open_dims,
        "an annotation's `open` dims, if any, are distinct dims of its output, beside a sharding",
    ),
    Rule(
        "random-key",
        "node",
        _ir(_RANDOM),
        _random_key,
        "a random op's operand 0 is a uint32[3] key and its `offset` an int in [0, 2**32)",
    ),
    Rule(
        "same-shapes",
        "node",
        _ir(_SAME_SHAPES),
        _same_shapes,
        "an identity op's outputs are its operands' shapes",
    ),
    Rule(
        "body-registered",
        "node",
        _ir((*_SCANS, *_SHARD_MAPS)),
        _body_registered,
        "a `body` attribute names a registered body of the node's kind",
    ),
    Rule(
        "jax-function",
        "node",
        _ir(_JAX_CALLS),
        _jax_function,
        "a call_jax node's `fn` names a registered JAX function; its vjp's operands are the "
        "inputs and a cotangent per output in `outs`, its outputs one gradient per input in `wrt`",
    ),
    Rule(
        "attention-shapes",
        "node",
        _ir(_ATTENTIONS),
        _attention,
        "an attention op's q, k, v, mask and outputs are as scaled_dot_product_attention's",
    ),
    Rule(
        "scan-wiring",
        "node",
        _ir(_SCANS),
        _scan_wiring,
        "a scan's operands and outputs are its body's input, stacked parameters, free inputs",
    ),
    Rule(
        "shard-map-wiring",
        "node",
        _ir(_SHARD_MAPS),
        _shard_map_wiring,
        "a shard_map's specs, operands and outputs fit its body over its mesh",
    ),
    Rule(
        "shard-map-sharding",
        "record",
        _ir(_SHARD_MAPS),
        _sharded,
        "a shard_map node carries the sharding of its outputs",
    ),
    Rule(
        "collective",
        "node",
        _ir(_COLLECTIVES),
        _collective,
        "a collective is inside a shard_map body, over its mesh's axes, with the shapes it makes",
    ),
    Rule(
        "sharding-type",
        "sharded",
        _every,
        _sharding_type,
        "a sharding is a ShardingSpec, or a TupleSharding with one entry per output",
    ),
    Rule(
        "sharding-rank",
        "sharded",
        _every,
        _sharding_rank,
        "a ShardingSpec written for a rank has its output's rank",
    ),
    Rule(
        "one-device-set",
        "sharded",
        _every,
        _one_device_set,
        "every sharding in a graph is over one set of devices",
    ),
    Rule(
        "body-unsharded",
        "body",
        _generic,
        _unsharded_in_body,
        "a node inside a body carries no sharding",
    ),
)


# -- the walk -------------------------------------------------------------------------------------

# op (None: a leaf) -> the rules that apply to its nodes: (record, sharded, body, node)
_PLANS: dict = {}
_registry.ON_CHANGE.append(_PLANS.clear)  # (a rule added or removed changes what applies)
_LEAF = None


def _plan(op):
    plan = _PLANS.get(op)
    if plan is None:
        plan = _PLANS[op] = tuple(
            tuple(r for r in RULES if r.on == on and r.applies(op))
            for on in ("record", "sharded", "body", "node")
        )
    return plan


class _Walk:
    """One check: the violations found, the devices of the first sharding, the bodies left."""

    def __init__(self):
        self.found: list = []
        self.devices = None
        self.devices_at = ""
        self.region = None  # in a shard_map body: its mesh's axis sizes by name
        self.inside = ""  # in a body: "in the body of `op` at x.py:3, "
        self.pending: list = []
        self.seen: set = set()
        self._meshes: dict = {}
        self.position = 0  # the node being checked, in post-order

    def devices_of(self, mesh) -> frozenset:
        ids = self._meshes.get(mesh)
        if ids is None:
            ids = self._meshes[mesh] = frozenset(mesh.device_ids)
        return ids

    def sizes_of(self, mesh) -> dict:
        return dict(zip(mesh.axis_names, mesh.shape, strict=True))

    def where(self, n) -> str:
        origin = n.origin
        at = f" at {_debug.where(origin)}" if origin is not None else ""
        return f"{self.inside}`{n.op}` (node {self.position}){at}"

    def enter(self, n, body) -> None:
        """Check ``body`` (named by ``n``) after this graph, once per body and mesh."""
        region = self.region
        if n.op in _SHARD_MAPS:
            specs = _specs(n)
            region = self.sizes_of(specs[0][1].mesh) if specs else None
        key = (n.attrs["body"], None if region is None else tuple(region.items()))
        if key not in self.seen:
            self.seen.add(key)
            roots = [body.root] if isinstance(body, Body) else list(body.roots)
            self.pending.append((roots, region, f"in the body of {self.where(n)}, "))

    def graph(self, order) -> None:
        """Every rule on every node of ``order`` (a post-order); the record rules once per
        distinct record (``memo``: node_hash -> what they found)."""
        in_body = bool(self.inside)
        memo: dict = {}
        found = self.found
        for self.position, n in enumerate(order):
            key = _LEAF if type(n) is DeviceData else n.op
            if in_body and key is _LEAF:
                continue  # a placeholder, or a free input the graph around it has
            record, sharded, body, rules = _PLANS.get(key) or _plan(key)
            h = n.node_hash
            broken = memo.get(h)
            if broken is None:
                if in_body:
                    record += body
                elif n.sharding is not None:
                    record += sharded
                broken = memo[h] = tuple(
                    (r, d) for r in record if (d := r.check(n, self)) is not None
                )
            for rule, detail in broken:
                found.append(Violation(rule.name, n, self.where(n), detail))
            for rule in rules:
                detail = rule.check(n, self)
                if detail is not None:
                    found.append(Violation(rule.name, n, self.where(n), detail))


def check_graph(roots, *, raise_on_error: bool = True, order=None) -> list[Violation]:
    """Check the graph of ``roots`` (a ``Value`` or a list of them) against the dialect, every
    rule of ``RULES`` on every node, and the bodies its nodes name.

    Args:
        roots: the graph's outputs.
        raise_on_error: raise one ``GraphError`` listing every violation (the default), or
            return them.
        order: the graph's post-order when the caller has it (``Graph.order``).

    Returns:
        The violations (``Violation``), in post-order: an empty list for a good graph.

    Raises:
        GraphError: some rule is broken (also an ``UnsupportedOpError`` when one is an op with
            no lowering rule, as lowering would raise).
    """
    walk = _Walk()
    roots = [roots] if type(roots) is Value or not hasattr(roots, "__iter__") else list(roots)
    values = []
    root_rule = RULES[0]
    for r in roots:
        detail = root_rule.check(r, walk)
        if detail is None:
            values.append(r)
        else:
            walk.found.append(Violation(root_rule.name, None, "a root", detail))
    walk.graph(post_order(values) if order is None else order)
    while walk.pending:
        body_roots, walk.region, walk.inside = walk.pending.pop()
        walk.graph(post_order(body_roots))
    found = walk.found
    if found and raise_on_error:
        raise _error(found)
    return found


def _error(found: list) -> GraphError:
    lines = [f"  {v}" for v in found[:SHOWN]]
    if len(found) > SHOWN:
        lines.append(f"  ... and {len(found) - SHOWN} more (GraphError.violations has all)")
    many = "s" if len(found) != 1 else ""
    text = (
        f"the graph breaks the IR dialect (ir-runtime's docs/dialect.md) in {len(found)} "
        f"place{many}:\n" + "\n".join(lines)
    )
    unsupported = any(v.rule == "op-known" for v in found)
    return (_UnsupportedGraphError if unsupported else GraphError)(text, found)
