"""ir_core: immutable IR nodes hashed once, in the constructor, with XXH3-128.

>>> from ir_core import DeviceData, Generic, Shape, Value
>>> x = DeviceData(Shape("float32", (4, 8)))
>>> y = Generic("aten::relu", [Value(x, 0)], [Shape("float32", (4, 8))])
>>> y.dag_hash != x.dag_hash
True
"""

from ir_core._dump import dump_dot, dump_text
from ir_core._errors import (
    AttributeTypeError,
    CycleError,
    IRError,
    NodeSpecError,
    OperandError,
    OutputIndexError,
    ShapeError,
    ShardingTypeError,
)
from ir_core._graph import graph_fingerprint, graph_hash, post_order, relink
from ir_core._nodes import DTYPES, DeviceData, Generic, Node, Shape, Value

__version__ = "0.4.0"

__all__ = [
    "DTYPES",
    "AttributeTypeError",
    "CycleError",
    "DeviceData",
    "Generic",
    "IRError",
    "Node",
    "NodeSpecError",
    "OperandError",
    "OutputIndexError",
    "Shape",
    "ShapeError",
    "ShardingTypeError",
    "Value",
    "dump_dot",
    "dump_text",
    "graph_fingerprint",
    "graph_hash",
    "post_order",
    "relink",
]
