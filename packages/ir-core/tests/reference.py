"""An independent, plain-Python implementation of ir_core's canonical encoding and hashes.

Written from the specification in the package README, on top of the ``xxhash`` package; the
tests hold the Cython implementation to it, and the benchmark uses ``PyNode`` as its
plain-Python peer. Nothing here imports ir_core.
"""

import math
import struct
from collections.abc import Mapping

import xxhash

_NAN = struct.pack("<Q", 0x7FF8000000000000)


def encode(value) -> bytes:
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def _length(tag: bytes, n: int) -> bytes:
    return tag + struct.pack("<I", n)


def _encode(v, out: bytearray) -> None:
    t = type(v)
    if v is None:
        out += b"N"
    elif t is bool:
        out += b"B\x01" if v else b"B\x00"
    elif t is int:
        if -(2**63) <= v < 2**63:
            out += b"i" + struct.pack("<q", v)
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            out += _length(b"J", len(raw)) + raw
    elif t is float:
        out += b"f" + (_NAN if math.isnan(v) else struct.pack("<d", v))
    elif t is str:
        raw = v.encode("utf-8")
        out += _length(b"s", len(raw)) + raw
    elif t is bytes:
        out += _length(b"y", len(v)) + v
    elif t is tuple:
        out += _length(b"t", len(v))
        for item in v:
            _encode(item, out)
    elif isinstance(v, Mapping):
        out += _length(b"m", len(v))
        for key in sorted(v):
            _encode(key, out)
            _encode(v[key], out)
    else:
        raise TypeError(f"no canonical encoding for {v!r}")


def xxh128(data: bytes) -> int:
    return xxhash.xxh3_128_intdigest(data)


def h16(h: int) -> bytes:
    return h.to_bytes(16, "little")


def node_hash(kind, op, shapes, attrs, sharding_bytes) -> int:
    """``shapes``: a sequence of (dtype, dims); ``sharding_bytes``: bytes or None."""
    shapes = tuple((dtype, tuple(dims)) for dtype, dims in shapes)
    return xxh128(encode((kind, op, shapes, attrs, sharding_bytes)))


def dag_hash(nh: int, operands) -> int:
    """``operands``: a sequence of (operand's dag_hash, output index)."""
    return xxh128(encode((h16(nh), tuple((h16(dh), index) for dh, index in operands))))


class PyNode:
    """A node that hashes itself the plain-Python way: the benchmark's peer."""

    __slots__ = ("attrs", "dag_hash", "kind", "node_hash", "op", "operands", "shapes", "sharding")

    def __init__(self, kind, op, operands, shapes, attrs=None, sharding=None):
        self.kind = kind
        self.op = op
        self.operands = tuple(operands)  # (PyNode, output index) pairs
        self.shapes = tuple(shapes)  # (dtype, dims) pairs
        self.attrs = dict(attrs or {})
        self.sharding = sharding
        raw = None if sharding is None else sharding.canonical_bytes()
        self.node_hash = node_hash(kind, op, self.shapes, self.attrs, raw)
        self.dag_hash = dag_hash(self.node_hash, [(n.dag_hash, i) for n, i in self.operands])


def post_order(roots):
    """Reference post-order over (PyNode-like) objects with ``.operands`` of (node, index)."""
    seen, order = set(), []
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.operands))]
        while stack:
            node, it = stack[-1]
            for child, _ in it:
                if id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, iter(child.operands)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def graph_hash(roots) -> int:
    """``roots``: a sequence of (node, output index), index -1 for a whole node."""
    order = post_order([node for node, _ in roots])
    position = {id(n): k for k, n in enumerate(order)}
    records = b"".join(
        encode((h16(n.node_hash), tuple((position[id(c)], i) for c, i in n.operands)))
        for n in order
    )
    head = (len(order), h16(xxh128(records)), tuple((position[id(n)], i) for n, i in roots))
    return xxh128(encode(head))


def graph_fingerprint(roots) -> bytes:
    """``roots`` as for ``graph_hash``: every node's full record, its operand positions, roots."""
    order = post_order([node for node, _ in roots])
    position = {id(n): k for k, n in enumerate(order)}
    records = tuple(
        (
            (
                n.kind,
                n.op,
                tuple((dtype, tuple(dims)) for dtype, dims in n.shapes),
                n.attrs,
                None if n.sharding is None else n.sharding.canonical_bytes(),
            ),
            tuple((position[id(c)], i) for c, i in n.operands),
        )
        for n in order
    )
    return encode((len(order), records, tuple((position[id(n)], i) for n, i in roots)))
