"""Graph-to-graph rewrites applied before lowering: a table of rules, read top to bottom.

Each rule is ``(ops, rewrite)``: for a node whose op is in ``ops``, ``rewrite(node, uses)``
returns the node that replaces it (same output shapes), or None to leave it. ``uses`` counts
each node's consumers in the graph. New nodes are built, never edited, and ``relink`` points
the graph at them, so the graph the cache keyed on is untouched: ``rewrite`` runs only on a
cache miss, and ``ir_runtime.dump(t, "rewritten")`` shows its result.
"""

from __future__ import annotations

from ir_core import Generic, Shape, Value, post_order, relink

_TRANSPOSES = frozenset(("aten::t.default", "aten::transpose.int", "aten::permute.default"))


def _is_matrix_transpose(n) -> bool:
    if n.op == "aten::permute.default":
        return tuple(n.attrs["dims"]) in ((1, 0), (-1, -2))
    if n.op == "aten::transpose.int":
        return {n.attrs["dim0"] % 2, n.attrs["dim1"] % 2} == {0, 1}
    return True  # aten::t


def _transposed(v: Value) -> Value:
    s = v.shape
    return Value(Generic("aten::t.default", [v], [Shape(s.dtype, s.dims[::-1])], {}))


def _transposed_product(n, uses):
    """``t(mm(a, b))`` as ``mm(t(b), t(a))``: XLA folds transposed operands into the dot for
    free but writes a transposed result out as a copy (torch's linear backward makes exactly
    this for every weight gradient). Only when the product has no other use and neither node
    carries a sharding of its own."""
    if n.sharding is not None or len(n.operands) != 1 or not _is_matrix_transpose(n):
        return None
    m = n.operands[0].node
    if m.op != "aten::mm.default" or uses.get(id(m)) != 1 or m.sharding is not None:
        return None
    a, b = m.operands
    return Generic("aten::mm.default", [_transposed(b), _transposed(a)], n.shapes, {})


RULES = ((_TRANSPOSES, _transposed_product),)


def rewrite(roots: list, order=None) -> list:
    """``roots`` after every rule of ``RULES``; the same objects when no rule applies."""
    order = post_order(roots) if order is None else order
    uses: dict = {}
    for n in order:
        for v in n.operands:
            uses[id(v.node)] = uses.get(id(v.node), 0) + 1
    replacements = {}
    for n in order:
        for ops, rule in RULES:
            if n.op in ops:
                new = rule(n, uses)
                if new is not None:
                    replacements[n] = new
                    break
    return relink(roots, replacements) if replacements else roots
