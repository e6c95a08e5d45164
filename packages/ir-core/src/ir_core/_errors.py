"""Exceptions raised by ir_core. Each message names the bad value, the rule, and the fix."""


class IRError(Exception):
    """Base class of every error ir_core raises."""


class ShapeError(IRError, ValueError):
    """A Shape with an unknown dtype name or a dim that is not a non-negative integer."""


class OperandError(IRError, TypeError):
    """An operand that is not a ``Value``, or a ``Value`` over something that is not a node."""


class OutputIndexError(IRError, IndexError):
    """A ``Value`` whose output index is outside the node's outputs."""


class AttributeTypeError(IRError, TypeError):
    """An attribute key or value that has no canonical encoding."""


class ShardingTypeError(IRError, TypeError):
    """A sharding annotation that does not supply its canonical bytes."""


class NodeSpecError(IRError, TypeError):
    """A node's op or shapes argument of the wrong type, or an unknown ``clone`` field."""


class CycleError(IRError, ValueError):
    """Replacements that would make a node depend on itself."""
