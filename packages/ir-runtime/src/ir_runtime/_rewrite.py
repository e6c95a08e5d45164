"""Graph-to-graph rewrites applied before lowering: a table of rules, read top to bottom.

Each rule is ``(ops, rewrite)``: for a node whose op is in ``ops``, ``rewrite(node, uses)``
returns the node that replaces it (same output shapes), or None to leave it. ``uses`` counts
each node's consumers in the graph. New nodes are built, never edited, and ``relink`` points
the graph at them, so the graph the cache keyed on is untouched: ``rewrite`` runs only on a
cache miss, and ``ir_runtime.dump(t, "rewritten")`` shows its result.
"""

from __future__ import annotations

from ir_core import Generic, Value, post_order, relink

_TRANSPOSES = frozenset(("aten::t.default", "aten::transpose.int", "aten::permute.default"))


def _is_matrix_transpose(n) -> bool:
    if n.op == "aten::permute.default":
        return tuple(n.attrs["dims"]) in ((1, 0), (-1, -2))
    if n.op == "aten::transpose.int":
        return {n.attrs["dim0"] % 2, n.attrs["dim1"] % 2} == {0, 1}
    return True  # aten::t


def _peel(v: Value) -> tuple:
    """``v`` without the matrix transposes it is made of (none that carries a sharding of its
    own), and whether an odd number of them was peeled; None when there was none."""
    flipped, peeled = False, False
    while True:
        n = v.node
        if (
            n.op not in _TRANSPOSES
            or n.sharding is not None
            or len(n.operands) != 1
            or len(n.shapes[0].dims) != 2
            or not _is_matrix_transpose(n)
        ):
            return (v, flipped) if peeled else None
        v, flipped, peeled = n.operands[0], not flipped, True


def _dot(lhs: tuple, rhs: tuple, shapes, addmm=None) -> Generic:
    """``lhs @ rhs``, each given as ``(value, transposed)``, as one ``ir::dot`` of the values
    themselves: the transposes become the dot's contracting dims, as ``jax.grad`` of ``x @ w``
    writes them. ``addmm``: the ``aten::addmm`` node whose bias, alpha and beta it keeps."""
    (a, ta), (b, tb) = lhs, rhs
    attrs = {"contract": (0 if ta else 1, 1 if tb else 0)}
    operands = [a, b]
    if addmm is not None:
        operands.append(addmm.operands[0])
        attrs.update(alpha=addmm.attrs["alpha"], beta=addmm.attrs["beta"])
    return Generic(DOT, operands, shapes, attrs)


def _folded_product(n, uses):
    """``mm(t(a), t(b))`` and the like (``addmm`` too) as one ``ir::dot`` of ``a`` and ``b``.
    torch's linear writes ``x @ t(w)`` and its backward ``g @ t(t(w))`` and ``t(x) @ g``; a
    transpose left between an FSDP-sharded weight and its dot makes XLA's partitioner gather
    the weight once per layout (the forward's and the backward's), where one dot_general of
    the weight itself shares one gather."""
    if n.sharding is not None:
        return None
    a, b = n.operands[-2:]
    pa, pb = _peel(a), _peel(b)
    if pa is None and pb is None:
        return None
    lhs, rhs = pa or (a, False), pb or (b, False)
    return _dot(lhs, rhs, n.shapes, n if n.op == "aten::addmm.default" else None)


def _transposed_product(n, uses):
    """``t(mm(a, b))`` as ``mm(t(b), t(a))`` (one ``ir::dot``): XLA folds transposed operands
    into the dot for free but writes a transposed result out as a copy (torch's linear
    backward makes exactly this for every weight gradient). Only when the product has no other
    use and neither node carries a sharding of its own."""
    if n.sharding is not None or len(n.operands) != 1 or not _is_matrix_transpose(n):
        return None
    m = n.operands[0].node
    if m.op != "aten::mm.default" or uses.get(id(m)) != 1 or m.sharding is not None:
        return None
    a, b = m.operands
    (a, ta), (b, tb) = _peel(a) or (a, False), _peel(b) or (b, False)
    return _dot((b, not tb), (a, not ta), n.shapes)


DOT = "ir::dot"  # attrs: contract (lhs dim, rhs dim); with a bias, alpha and beta (addmm's)
RULES = (
    (_TRANSPOSES, _transposed_product),
    (frozenset(("aten::mm.default", "aten::addmm.default")), _folded_product),
)


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
