"""Annotating values: a new node carrying the sharding, the old one untouched."""

from __future__ import annotations

from ir_core import Value
from ir_sharding._errors import ShardingError
from ir_sharding._spec import ShardingSpec, _ByBytes


class TupleSharding(_ByBytes):
    """The shardings of a node with several outputs: one ``ShardingSpec`` or None per output.

    ``with_sharding`` builds it when one output of a multi-output node is annotated; the other
    outputs keep theirs.
    """

    __slots__ = ("_bytes", "_specs")

    def __init__(self, specs):
        specs = tuple(specs)
        for k, s in enumerate(specs):
            if s is not None and not isinstance(s, ShardingSpec):
                raise ShardingError(
                    f"output {k} of a TupleSharding is {s!r} ({type(s).__name__}); each output "
                    f"takes a ShardingSpec or None"
                )
        parts = [b"irsht", len(specs).to_bytes(4, "little")]
        for s in specs:
            raw = b"" if s is None else s.canonical_bytes()
            parts += [b"N" if s is None else b"S", len(raw).to_bytes(4, "little"), raw]
        self._specs = specs
        self._bytes = b"".join(parts)

    @property
    def specs(self) -> tuple:
        return self._specs

    def canonical_bytes(self) -> bytes:
        return self._bytes

    def __repr__(self):
        return f"TupleSharding({list(self._specs)!r})"


def _check_value(value, what):
    if type(value) is not Value:
        raise ShardingError(
            f"{what} takes an ir_core.Value, got {value!r} ({type(value).__name__}); "
            f"wrap a node as Value(node, output_index)"
        )


def _annotated(value: Value, spec):
    node = value.node
    n = len(node.shapes)
    if n == 1:
        sharding = spec
    else:
        current = node.sharding
        specs = list(current.specs) if isinstance(current, TupleSharding) else [None] * n
        specs[value.index] = spec
        sharding = None if all(s is None for s in specs) else TupleSharding(specs)
    return Value(node.clone(sharding=sharding), value.index)


def with_sharding(value: Value, spec: ShardingSpec) -> Value:
    """A ``Value`` of a clone of ``value``'s node that carries ``spec``; any node kind.

    The original node is untouched. Its consumers still read it: pass
    ``{value.node: result.node}`` to ``relink`` to move them to the clone. For a node with
    several outputs the clone carries a ``TupleSharding`` in which only ``value``'s output
    changes.

    Raises:
        ShardingError: ``value`` is not a ``Value``, ``spec`` not a ``ShardingSpec``, or the
            spec's partition spec does not have one entry per dim of the value's shape.
    """
    _check_value(value, "with_sharding")
    if not isinstance(spec, ShardingSpec):
        raise ShardingError(
            f"with_sharding takes a ShardingSpec, got {spec!r} ({type(spec).__name__}); "
            f"build one with ShardingSpec(mesh, partition_spec); clear with clear_sharding"
        )
    spec.check_rank(value.shape.rank, f"the value {value.shape}")
    return _annotated(value, spec)


def clear_sharding(value: Value) -> Value:
    """A ``Value`` of a clone of ``value``'s node with no sharding on that output: its hashes
    are exactly those of a node that was never sharded."""
    _check_value(value, "clear_sharding")
    return _annotated(value, None)
