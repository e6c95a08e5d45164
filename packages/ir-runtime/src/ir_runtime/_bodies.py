"""The bodies of nodes that run a graph of their own (``ir::scan_layers``, ``ir::shard_map``),
by a digest of that graph.

Such a node holds no graph: its ``body`` attribute names one here, by the sha256 of the body's
exact graph, so equal bodies share a program and the outer graph's hash says which body it runs.
The registry is bounded; a node whose body was dropped fails to lower with a clear error.
"""

from __future__ import annotations

import hashlib

from ir_core import graph_fingerprint
from ir_runtime._bounded import Bounded
from ir_runtime._errors import LoweringError

BODIES = Bounded(256)  # digest -> body


def add(body, roots, kind: str) -> str:
    """Register ``body`` (whose graph is that of ``roots``; ``kind`` the node's op), or find an
    equal one; returns the name the node carries."""
    digest = hashlib.sha256(kind.encode() + graph_fingerprint(roots)).hexdigest()[:32]
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
