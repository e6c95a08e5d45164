"""ATen schemas, read the same way by the front end (what becomes an operand or an attribute)
and by the lowering (which operand is which argument)."""

from __future__ import annotations

import torch

TENSOR, TENSOR_LIST, OPTIONAL_TENSOR, SCALAR, OTHER = (
    "tensor",
    "tensor_list",
    "optional_tensor",
    "scalar",
    "other",
)


def argument_kind(t) -> str:
    """How an argument of torch type ``t`` is recorded: tensors (one, a list, or optional) are
    operands, numbers are scalars (liftable), everything else is an attribute."""
    if isinstance(t, torch.TensorType):
        return TENSOR
    if isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.TensorType):
        return OPTIONAL_TENSOR
    if isinstance(t, torch.ListType) and isinstance(
        t.getElementType(), (torch.TensorType, torch.OptionalType)
    ):
        return TENSOR_LIST
    if isinstance(t, torch.NumberType) or (
        isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.NumberType)
    ):
        return SCALAR
    return OTHER


def overload(op: str):
    """The ``torch.ops.aten`` overload an IR op name (``aten::name.overload``) records, or None
    when the name is not one."""
    namespace, _, rest = op.partition("::")
    name, dot, over = rest.partition(".")
    if namespace != "aten" or not dot:
        return None
    packet = getattr(torch.ops.aten, name, None)
    found = getattr(packet, over, None) if packet is not None else None
    return found if isinstance(found, torch._ops.OpOverload) else None


def recordable(op: str) -> bool:
    """Whether ``op`` names an ATen overload that returns tensors: only those reach the lazy
    tensor's dispatch (``add.default`` adds two numbers, ``eq.default`` compares them)."""
    found = overload(op)
    return found is not None and any(
        isinstance(r.type, torch.TensorType)
        or (
            isinstance(r.type, torch.ListType)
            and isinstance(r.type.getElementType(), torch.TensorType)
        )
        for r in found._schema.returns
    )


class Operands:
    """Splits a node's operands back into its schema's tensor arguments: a tensor, an optional
    tensor (None when it was None: then it is an attribute set to None), or a list of tensors
    (a tuple; None where an entry was None, as the ``indexed`` attribute marks)."""

    __slots__ = ("args", "fixed")

    def __init__(self, schema):
        self.args = tuple(
            (a.name, kind)
            for a in schema.arguments
            if (kind := argument_kind(a.type)) in (TENSOR, OPTIONAL_TENSOR, TENSOR_LIST)
        )
        self.fixed = sum(kind == TENSOR for _, kind in self.args)

    def split(self, attrs, operands) -> list:
        if len(self.args) == self.fixed:  # tensors only: the operands as they are
            return operands
        present = self.fixed + sum(
            kind == OPTIONAL_TENSOR and name not in attrs for name, kind in self.args
        )
        rest = len(operands) - present
        it = iter(operands)
        out = []
        for name, kind in self.args:
            if kind == TENSOR:
                out.append(next(it))
            elif kind == OPTIONAL_TENSOR:
                out.append(None if name in attrs else next(it))
            else:
                items = [next(it) for _ in range(rest)]
                indexed = attrs.get("indexed")
                if indexed is not None:
                    items.reverse()
                    items = [items.pop() if p else None for p in indexed]
                out.append(tuple(items))
        return out
