"""Graph-to-graph rewrites applied before lowering: a table of rules, read top to bottom.

Each rule is ``(ops, rewrite)``: for a node whose op is in ``ops``, ``rewrite(node, facts)``
returns the node that replaces it (same output shapes), or None to leave it. ``facts`` says
what a rule needs of the whole graph (``Facts``). New nodes are built, never edited, and
``relink`` points the graph at them, so the graph the cache keyed on is untouched: ``rewrite``
runs only on a cache miss, and ``ir_runtime.dump(t, "rewritten")`` shows its result.
"""

from __future__ import annotations

import math

from ir_core import Generic, Shape, Value, post_order, relink
from ir_runtime._placement import spec_at
from ir_sharding import ShardingSpec

_TRANSPOSES = frozenset(("aten::t.default", "aten::transpose.int", "aten::permute.default"))


_VIEWS = frozenset(("aten::view.default", "aten::_unsafe_view.default"))
_PRODUCTS = frozenset(("aten::mm.default", "aten::addmm.default", "aten::bmm.default"))
DOT = "ir::dot"  # attrs: dims ((lhs contract, rhs contract), (lhs batch, rhs batch)), as
# lax.dot_general's; with a bias, alpha and beta (addmm's epilogue)


def _swaps_last_two(n, rank: int) -> bool:
    """Whether ``n`` transposes the last two dims of a tensor of ``rank`` (a matrix's two)."""
    if n.op == "aten::t.default":
        return rank == 2
    if n.op == "aten::transpose.int":
        return {n.attrs["dim0"] % rank, n.attrs["dim1"] % rank} == {rank - 2, rank - 1}
    if n.op == "aten::permute.default":
        dims = [d % rank for d in n.attrs["dims"]]
        return dims == [*range(rank - 2), rank - 1, rank - 2]
    return False


def _see_through(v: Value, flipped: bool) -> tuple:
    """``v`` without the transposes of its last two dims and the expands to its own shape
    that make it (none carrying a sharding of its own): (value, flipped, whether any was)."""
    rank, seen = len(v.shape.dims), False
    while True:
        n = v.node
        if n.sharding is not None or len(n.operands) != 1:
            return v, flipped, seen
        if n.op in _TRANSPOSES and _swaps_last_two(n, rank):
            flipped = not flipped
        elif not (n.op == "aten::expand.default" and n.operands[0].shape.dims == v.shape.dims):
            return v, flipped, seen
        v, seen = n.operands[0], True


def _operand(v: Value, flipped: bool = False) -> list:
    """A product's operand (a matrix, or a batch of them: rank 2 or 3) as the ways to read it:
    each ``(base, batch dims, row dims, col dims)``, the dims of ``base`` each logical dim is
    made of. First, when ``v`` is a view merging ``base``'s leading dims into its first (what
    torch's matmul and linear do to a batch), with those dims apart; last, ``v`` as it is
    (its transposes and no-op expands seen through). The second item: whether anything was
    seen through."""
    v, flipped, seen = _see_through(v, flipped)
    rank = len(v.shape.dims)
    ways = [(v, [[k] for k in range(rank - 2)], [rank - 2], [rank - 1])]
    n = v.node
    if n.op in _VIEWS and n.sharding is None:
        a = n.operands[0]
        dims, got = a.shape.dims, v.shape.dims
        lead = len(dims) - rank + 1
        if lead >= 2 and dims[lead:] == got[1:] and math.prod(dims[:lead]) == got[0]:
            groups = [list(range(lead))] + [[lead + k] for k in range(rank - 1)]
            ways.insert(0, (a, groups[: rank - 2], groups[rank - 2], groups[rank - 1]))
    if flipped:
        ways = [(b, batch, cols, rows) for b, batch, rows, cols in ways]
    return ways, seen


def _sizes(base: Value, dims) -> list:
    return [base.shape.dims[d] for d in dims]


def _product(n, lhs, rhs, bias_of=None):
    """``lhs @ rhs`` (``_operand``'s readings of each) as one ``ir::dot`` of the bases, the
    first pairing whose batch and contracted dims agree; wrapped in a view to ``n``'s shape
    where the dot keeps dims apart that ``n`` merged. ``bias_of``: the addmm node whose
    epilogue the dot keeps (its bias must broadcast to the dot's shape)."""
    (lways, lseen), (rways, rseen) = lhs, rhs
    for lb, lbatch, lrows, lcols in lways:
        for rb, rbatch, rrows, rcols in rways:
            if lb is lways[-1][0] and rb is rways[-1][0] and not (lseen or rseen):
                return None  # (the product as written)
            if [_sizes(lb, g) for g in lbatch] != [_sizes(rb, g) for g in rbatch]:
                continue
            if _sizes(lb, lcols) != _sizes(rb, rrows):
                continue
            lbd = [d for g in lbatch for d in g]
            rbd = [d for g in rbatch for d in g]
            shape = tuple(_sizes(lb, lbd) + _sizes(lb, lrows) + _sizes(rb, rcols))
            attrs = {"dims": ((tuple(lcols), tuple(rrows)), (tuple(lbd), tuple(rbd)))}
            operands = [lb, rb]
            if bias_of is not None:
                bias = bias_of.operands[0]
                if not _broadcasts(bias.shape.dims, shape):
                    continue
                operands.append(bias)
                attrs.update(alpha=bias_of.attrs["alpha"], beta=bias_of.attrs["beta"])
            out = n.shapes[0]
            dot = Generic(DOT, operands, [Shape(out.dtype, shape)], attrs)
            if shape == out.dims:
                return dot
            return Generic("aten::view.default", [Value(dot)], n.shapes, {"size": out.dims})
    return None


def _broadcasts(dims, shape) -> bool:
    if len(dims) > len(shape):
        return False
    return all(d in (1, s) for d, s in zip(reversed(dims), reversed(shape), strict=False))


def _folded_product(n, facts):
    """``mm``, ``addmm`` and ``bmm`` as one ``ir::dot`` of what their operands are made of:
    their transposes become the dot's contracting dims, and a batch torch merged into one dim
    (``linear`` on a 3-d input, ``matmul`` of 4-d tensors) stays apart, as ``jax.grad`` of the
    same product writes it. A transpose left between an FSDP-sharded weight and its dot made
    XLA's partitioner gather the weight once per layout (the forward's and the backward's),
    and a merged batch and heads dim lost the heads' sharding."""
    if n.sharding is not None:
        return None
    a, b = n.operands[-2:]
    bias_of = n if n.op == "aten::addmm.default" else None
    return _product(n, _operand(a), _operand(b), bias_of)


def _transposed_product(n, facts):
    """``t(mm(a, b))`` as ``mm(t(b), t(a))`` (one ``ir::dot``): XLA folds transposed operands
    into the dot for free but writes a transposed result out as a copy (torch's linear
    backward makes exactly this for every weight gradient). Only when the product has no other
    use and neither node carries a sharding of its own."""
    if n.sharding is not None or len(n.operands) != 1 or not _swaps_last_two(n, 2):
        return None
    m = n.operands[0].node
    if m.op != "aten::mm.default" or facts.uses.get(id(m)) != 1 or m.sharding is not None:
        return None
    a, b = m.operands
    (bways, _), (aways, _) = _operand(b, True), _operand(a, True)
    return _product(n, (bways, True), (aways, True))


def _unmerged_product(n, facts):
    """``view(product)`` restoring the dims the product's operands merged: the ``ir::dot``
    itself, not a view of a view of it."""
    p = n.operands[0].node
    if n.sharding is not None or p.op not in _PRODUCTS or facts.uses.get(id(p)) != 1:
        return None
    new = _folded_product(p, facts)
    if new is not None and new.op != DOT and new.operands[0].shape.dims == n.shapes[0].dims:
        return new.operands[0].node
    return None


EMBEDDING = "aten::embedding.default"
_SAME_DIMS = frozenset(("aten::_to_copy.default", "aten::clone.default", "aten::alias.default"))


def _rows_split(v: Value):
    """The spec of the table ``v`` (through copies to another dtype, which autocast makes)
    when it splits the table's rows over every device of its mesh (FSDP's placement), else
    None."""
    while v.node.sharding is None and v.node.op in _SAME_DIMS:
        v = v.node.operands[0]
    spec = spec_at(v.node.sharding, v.index)
    if spec is None or not spec.tile_dims or spec.tile_dims[0] != spec.mesh.size:
        return None
    return spec


def _ids_whole(n, facts):
    """The gradient of an embedding whose table is split over its rows on every device, with
    its ids read whole. Each device adds every token's gradient into its own rows, and XLA's
    partitioner gathers the ids and that gradient whole for it anyway; but on a gradient
    arriving split over its hidden dim (as split biases' and norm weights' gradients leave
    it) it first tried to match the ids' batch split, and fell back to replicating
    ("Involuntary full rematerialization"). Elsewhere the ids stay as the user placed them: a
    whole table (data parallel) has each device add its own tokens' gradients, and reading
    the ids whole would gather them for nothing; a table split over some of the mesh's axes
    is left to the partitioner (not measured)."""
    grad, ids = n.operands
    spec = facts.split_tables.get((id(ids.node), ids.index))
    if n.sharding is not None or spec is None:
        return None
    whole = ShardingSpec.replicated(spec.mesh)
    read = Value(Generic("ir::annotate", [ids], [ids.shape], {}, whole, n.origin))
    return n.clone(operands=[grad, read])


# Elementwise ops XLA's CPU fusion evaluates again wherever their value is read, each costing
# tens of nanoseconds an element (scalar calls into libm): measured on a small Llama's rotary
# embedding, whose cos and sin 16 fusions broadcast over the heads. (Other transcendentals
# were not measured, and are left as they are.)
COMPUTED_ONCE = frozenset(("aten::cos.default", "aten::sin.default"))
MATERIALIZE = "ir::materialize"
_REAL = frozenset(("float16", "bfloat16", "float32", "float64"))
# Consumers that make more elements than they read, each element read once.
_GROWING_ONCE = frozenset(("aten::cat.default", "aten::constant_pad_nd.default"))


def _read_again(n, facts) -> bool:
    """Whether the value of ``n`` is read more than once per element: followed through its
    sole consumer while that makes as many elements (an elementwise op, a view, a cast), it
    reaches a value that two or more consumers read (a root's result counting as one), or a
    consumer that makes more elements than it (a broadcast, a product; not a concatenation
    or a pad, which read each element once)."""
    size = math.prod(n.shapes[0].dims)
    while True:
        users = facts.users.get(id(n))
        if users is None:
            return False
        if len(users) > 1:
            return True
        user = users[0]
        if user is ROOT or len(user.shapes) != 1:
            return False
        made = math.prod(user.shapes[0].dims)
        if made != size:
            return made > size and user.op not in _GROWING_ONCE
        n = user


def _computed_once(n, facts):
    """On one CPU device, a cos or sin whose value is read more than once per element
    (``_read_again``), computed once: through ``ir::materialize``, which XLA's CPU does not fuse
    into the consumers. Its fusion otherwise copies the cos into each consumer and evaluates it
    per element that consumer makes: a small Llama's training step spent 3-6% of its time in
    its rotary embedding's cos and sin, evaluated for each of 8 heads in 16 fusions. Not on a
    mesh: XLA's partitioner cannot see through a custom call, and would gather its operand
    whole."""
    if not facts.one_cpu or n.sharding is not None or n.shapes[0].dtype not in _REAL:
        return None
    if not _read_again(n, facts):
        return None
    once = Value(n.clone())  # (a copy: the replacement reads the node it replaces)
    return Generic(MATERIALIZE, [once], list(n.shapes), {}, None, n.origin)


RULES = (
    (COMPUTED_ONCE, _computed_once),
    (_TRANSPOSES, _transposed_product),
    (_PRODUCTS, _folded_product),
    (_VIEWS, _unmerged_product),
    (frozenset(("aten::embedding_dense_backward.default",)), _ids_whole),
)


ROOT = object()  # ``Facts.users``' entry for a root's result: the program returns it


class Facts:
    """What rules read of the whole graph: ``uses``, how many operands read each node (by id);
    ``users``, the distinct nodes that read it (``ROOT`` for the program's results);
    ``one_cpu``, whether the program runs on one CPU device (no mesh); ``split_tables``, per
    ids value embeddings read (``(id(node), index)``), the spec of their table when every
    table read through those ids is split over its rows on every device (``_rows_split``; ids
    shared with a table that is not are left out)."""

    __slots__ = ("one_cpu", "split_tables", "users", "uses")

    def __init__(self, order, one_cpu: bool = False, roots=()):
        self.one_cpu = one_cpu
        self.uses: dict = {}
        self.users: dict = {}
        tables: dict = {}  # ids -> the specs _rows_split gives of each table they index
        for n in order:
            for v in n.operands:
                self.uses[id(v.node)] = self.uses.get(id(v.node), 0) + 1
                users = self.users.setdefault(id(v.node), [])
                if not users or users[-1] is not n:  # (operands of one node come together)
                    users.append(n)
            if n.op == EMBEDDING:
                table, ids = n.operands
                tables.setdefault((id(ids.node), ids.index), []).append(_rows_split(table))
        for r in roots:
            users = self.users.setdefault(id(r.node), [])
            if not any(u is ROOT for u in users):
                users.append(ROOT)
        self.split_tables = {
            k: specs[0] for k, specs in tables.items() if all(s is not None for s in specs)
        }


def rewrite(roots: list, order=None, program=None) -> list:
    """``roots`` after every rule of ``RULES``; the same objects when no rule applies.
    ``program``: where the graph runs (``_graph.Program``; rules that depend on it apply only
    when it is given)."""
    order = post_order(roots) if order is None else order
    one_cpu = program is not None and program.one_device and program.devices[0].platform == "cpu"
    facts = Facts(order, one_cpu, roots)
    replacements = {}
    for n in order:
        for ops, rule in RULES:
            if n.op in ops:
                new = rule(n, facts)
                if new is not None:
                    replacements[n] = new
                    break
    return relink(roots, replacements) if replacements else roots
