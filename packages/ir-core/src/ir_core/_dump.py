"""Text and Graphviz DOT dumps of IR graphs: one pass over the post-order, no recursion."""

from ir_core._graph import post_order
from ir_core._nodes import Node, Value


def _numbered(roots):
    nodes = post_order(roots)
    return nodes, {n: k for k, n in enumerate(nodes)}


def _ref(position, value):
    node = value.node
    k = position[node]
    return f"%{k}" if len(node.shapes) == 1 else f"%{k}.{value.index}"


def _roots(roots):
    if isinstance(roots, (Value, Node)):
        return (roots,)
    return tuple(roots)


def dump_text(roots):
    """A readable listing of the graph, one node per line, operands before users.

    Each line reads ``%k = op(%i, %j.1) {attr=value} : dtype[dims]``, with the sharding
    annotation's repr when there is one; ``%j.1`` is output 1 of a multi-output node.
    """
    roots = _roots(roots)
    nodes, position = _numbered(roots)
    lines = []
    for k, n in enumerate(nodes):
        args = ", ".join(_ref(position, v) for v in n.operands)
        line = f"%{k} = {n.op}({args})"
        if n.attrs:
            line += " {" + ", ".join(f"{name}={value!r}" for name, value in n.attrs.items()) + "}"
        shapes = [str(s) for s in n.shapes]
        line += " : " + (shapes[0] if len(shapes) == 1 else "(" + ", ".join(shapes) + ")")
        if n.sharding is not None:
            line += f", sharding={n.sharding!r}"
        lines.append(line)
    refs = [f"%{position[r]}" if isinstance(r, Node) else _ref(position, r) for r in roots]
    lines.append("roots: " + ", ".join(refs))
    return "\n".join(lines) + "\n"


def _dot_quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def dump_dot(roots):
    """The graph in Graphviz DOT: a box per node, an edge per operand labelled with its position
    (and output index, for multi-output producers), and a marker per root."""
    roots = _roots(roots)
    nodes, position = _numbered(roots)
    lines = ["digraph ir {", '  node [shape=box, fontname="monospace"];']
    for k, n in enumerate(nodes):
        label = f"%{k} {n.op}\n" + ", ".join(str(s) for s in n.shapes)
        if n.sharding is not None:
            label += f"\n{n.sharding!r}"
        lines.append(f"  n{k} [label={_dot_quote(label)}];")
        for j, v in enumerate(n.operands):
            edge = str(j) if len(v.node.shapes) == 1 else f"{j} (out {v.index})"
            lines.append(f"  n{position[v.node]} -> n{k} [label={_dot_quote(edge)}];")
    for k, r in enumerate(roots):
        node = r if isinstance(r, Node) else r.node
        lines.append(f"  root{k} [shape=plaintext, label={_dot_quote(f'root {k}')}];")
        lines.append(f"  n{position[node]} -> root{k};")
    lines.append("}")
    return "\n".join(lines) + "\n"
