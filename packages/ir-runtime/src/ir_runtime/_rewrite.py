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


RULES = (
    (_TRANSPOSES, _transposed_product),
    (_PRODUCTS, _folded_product),
    (_VIEWS, _unmerged_product),
    (frozenset(("aten::embedding_dense_backward.default",)), _ids_whole),
)


class Facts:
    """What rules read of the whole graph: ``uses``, each node's (by id) consumers;
    ``split_tables``, per ids value embeddings read (``(id(node), index)``), the spec of their
    table when every table read through those ids is split over its rows on every device
    (``_rows_split``; ids shared with a table that is not are left out)."""

    __slots__ = ("split_tables", "uses")

    def __init__(self, order):
        self.uses: dict = {}
        tables: dict = {}  # ids -> the specs _rows_split gives of each table they index
        for n in order:
            for v in n.operands:
                self.uses[id(v.node)] = self.uses.get(id(v.node), 0) + 1
            if n.op == EMBEDDING:
                table, ids = n.operands
                tables.setdefault((id(ids.node), ids.index), []).append(_rows_split(table))
        self.split_tables = {
            k: specs[0] for k, specs in tables.items() if all(s is not None for s in specs)
        }


def rewrite(roots: list, order=None) -> list:
    """``roots`` after every rule of ``RULES``; the same objects when no rule applies."""
    order = post_order(roots) if order is None else order
    facts = Facts(order)
    replacements = {}
    for n in order:
        for ops, rule in RULES:
            if n.op in ops:
                new = rule(n, facts)
                if new is not None:
                    replacements[n] = new
                    break
    return relink(roots, replacements) if replacements else roots
