"""The bodies of nodes that run a graph of their own (``ir::scan_layers``, ``ir::shard_map``),
by a digest of that graph.

Such a node holds no graph: its ``body`` attribute names one here, by the sha256 of the body's
exact graph, so equal bodies share a program and the outer graph's hash says which body it runs.
The digest also holds which operand feeds which leaf of the body (two functions of ``(x, y)``,
``x - y`` and ``y - x``, have one graph but not one wiring). The registry is bounded; a node
whose body was dropped fails to lower with a clear error.
"""

from __future__ import annotations

import hashlib

from ir_core import graph_fingerprint, post_order
from ir_runtime._bounded import Bounded
from ir_runtime._errors import LoweringError

BODIES = Bounded(256)  # digest -> body


def add(body, roots, kind: str, leaves, extra: bytes = b"") -> str:
    """Register ``body`` (whose graph is that of ``roots``; ``kind`` the node's op), or find an
    equal one; returns the name the node carries. ``leaves``: the body's data nodes in the
    order its node's operands feed them (placeholders, then free inputs): the fingerprint says
    which leaf is where in the graph, not which operand feeds it, so the digest also holds each
    leaf's position in the graph (-1: unused); ``extra``: anything else the body's meaning
    depends on."""
    position = {id(n): k for k, n in enumerate(post_order(roots))}
    wiring = ",".join(str(position.get(id(n), -1)) for n in leaves).encode()
    h = hashlib.sha256(kind.encode() + b"|" + wiring + b"|" + extra + b"|")
    h.update(graph_fingerprint(roots))
    digest = h.hexdigest()[:32]
    body = BODIES.pop(digest, body)  # an equal body registered before stays, now the newest
    BODIES[digest] = body
    return digest


def of(node):
    """The body a node names."""
    body = BODIES.get(node.attrs["body"])
    if body is None:
        raise LoweringError(
            f"the body of {node.op!r} ({node.attrs['body']}) is no longer registered: more than "
            f"{BODIES.capacity} distinct bodies were recorded since; run the step sooner"
        )
    return body
