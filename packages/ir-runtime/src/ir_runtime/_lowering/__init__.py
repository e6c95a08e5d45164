"""Lowering rules, op name -> JAX function, one module (or package, for the large ones) per op
family.

A rule is ``rule(node, *operands) -> array or tuple of arrays`` (one per output): ``node`` gives
the attributes (``node.attrs``, named as in the ATen schema) and the output shapes the front end
inferred (``node.shapes``); ``operands`` are the operands' values, as traced JAX arrays. Rules
are registered beside their definition with ``@register("aten::op.overload", ...)``.

ATen ops are recorded as the front end sees them in ``__torch_dispatch__``: tensor arguments
are operands, in schema order; every other argument is an attribute under its schema name. An
optional tensor argument that was None is an attribute set to None instead of an operand.
"""

from ir_runtime._lowering import (  # noqa: F401  (importing registers the rules)
    attention,
    comparison,
    elementwise,
    fft,
    indexing,
    linalg,
    matmul,
    max_pooling,
    nn,
    pooling,
    random,
    reductions,
    regions,
    sampling,
    shape,
    sorting,
    special,
)
from ir_runtime._lowering._registry import OPERANDS, RULES, register, rule_for

__all__ = ["OPERANDS", "RULES", "register", "rule_for"]
