"""The table of lowering rules and the helpers every family uses."""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from ir_runtime import _schema
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import UnsupportedOpError

RULES: dict[str, Callable] = {}
# For each ATen rule: how its node's operands split into the schema's tensor arguments.
OPERANDS: dict[str, _schema.Operands] = {}
# Called after a rule is added: the front end forgets how it routed ops, so an op it has
# decomposed or refused is recorded from now on.
ON_CHANGE: list[Callable[[], None]] = []

# Whether the program being lowered runs on one device (no mesh): a rule may then pick the form
# XLA's emitters run fastest, with no partitioner to read it (``_lower.function`` sets it).
ONE_DEVICE: contextvars.ContextVar[bool] = contextvars.ContextVar("one_device", default=False)

# -- half precision: one rounding per op, as eager -------------------------------------------
#
# torch's CPU kernels compute a bfloat16 or float16 op in float32 and round its result once:
# a reduction accumulates in float32, addmm adds its bias to the float32 product, layer norm,
# softmax, sigmoid, silu and gelu run in float32 throughout. A rule is written once, for any
# dtype; where a node has a half-precision operand or output, ``_lower.lower_node`` applies
# the rule's rounding mode:
#
# ONCE (an ATen rule's default): the rule gets its half-precision operands widened to float32
#   and a node whose half-precision outputs read float32 (``out_dtype``), so every intermediate
#   it computes is float32; its results are rounded to the recorded dtypes once, at the end.
# ACCUMULATE (dot products, convolutions): the operands stay half precision (what matrix units
#   take), the outputs read float32: the rule asks for ``preferred_element_type`` float32 and
#   computes its epilogue (bias, alpha, beta) in float32, rounded once.
# NATIVE (an ``ir::`` rule's default): the rule sees the node as recorded. For rules with no
#   arithmetic to widen (data movement, indexing, sorting, comparisons, selection: widening
#   would only add converts), for the runtime's own ops (random bits are drawn per dtype), and
#   for rules that compute as torch does in half precision themselves (``histc`` rounds after
#   every operation as c10::BFloat16 arithmetic does; cumulative ops pick torch's accumulator).
#
# The widening and the rounding are converts that XLA fuses into the rule's computation; where
# a ONCE rule only moves data (index_put without accumulate), XLA's simplifier drops a
# widening convert that meets its narrowing one (across a reshape, the program is a copy).
ONCE, ACCUMULATE, NATIVE = "once", "accumulate", "native"
ROUNDING: dict[str, str] = {}
HALF = frozenset((np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)))
HALF_NAMES = frozenset(("float16", "bfloat16"))
WIDE = np.dtype(np.float32)


def register(*ops: str, rounding: str | None = None):
    """Register the decorated function as the lowering of each op in ``ops``.

    An ATen op is named as the front end records it, ``aten::name.overload`` (``.default``
    for the overload without a name), and its rule is called as ``rule(node, *tensors)``: one
    argument per tensor argument of the schema, in order; None for an optional tensor that was
    None; a tuple for a list of tensors. Other ops (``ir::...``) get their operands as they are.

    ``rounding``: how the rule meets bfloat16 and float16 (the comment above ``ONCE``): ONCE,
    ACCUMULATE or NATIVE; None: ONCE for an ATen op (the rule computes in float32 and its
    results are rounded once, as eager's kernels do), NATIVE for an ``ir::`` op.
    """
    if rounding not in (None, ONCE, ACCUMULATE, NATIVE):
        raise ValueError(f"rounding must be ONCE, ACCUMULATE or NATIVE, not {rounding!r}")

    def add(fn):
        for op in ops:
            if op in RULES:
                raise ValueError(f"{op!r} already has a lowering rule ({RULES[op].__qualname__})")
            if op.startswith("aten::") and not _schema.recordable(op):
                raise ValueError(
                    f"{op!r} is not an ATen overload the front end can record: name a real "
                    f"one, 'aten::name.overload' ('.default' for the unnamed overload), that "
                    f"returns tensors"
                )
        for op in ops:
            RULES[op] = fn
            ROUNDING[op] = rounding or (ONCE if op.startswith("aten::") else NATIVE)
            found = _schema.overload(op)
            if found is not None:
                OPERANDS[op] = _schema.Operands(found._schema)
        for hook in ON_CHANGE:
            hook()
        return fn

    return add


def family(rounding: str) -> Callable:
    """``register`` for a family of rules that share a rounding mode (``shape``'s are NATIVE);
    a rule of it may still name another."""

    def register_in_family(*ops: str, rounding: str = rounding):
        return register(*ops, rounding=rounding)

    return register_in_family


def unregister(op: str) -> None:
    """Remove the rule of ``op`` (a rule a user or a test registered); ops routed through it are
    routed afresh."""
    if op not in RULES:
        raise KeyError(f"{op!r} has no lowering rule to remove")
    del RULES[op]
    ROUNDING.pop(op, None)
    OPERANDS.pop(op, None)
    for hook in ON_CHANGE:
        hook()


def existing(*ops: str) -> tuple:
    """Those of ``ops`` that the front end can record (a family registered by a loop: ``maximum``
    has no ``.Scalar`` overload, and ``add.default`` adds two Python numbers)."""
    return tuple(op for op in ops if _schema.recordable(op))


def rule_for(op: str) -> Callable:
    rule = RULES.get(op)
    if rule is None:
        raise UnsupportedOpError(
            f"no lowering rule for op {op!r}. The runtime lowers {len(RULES)} ops "
            f"(ir_runtime.supported_ops()); add one with "
            f"ir_runtime.register_lowering({op!r})(fn), or report the op with the model that "
            f"needs it"
        )
    return rule


def out_dtype(node, k: int = 0):
    """The numpy dtype of output ``k``."""
    return to_numpy_dtype(node.shapes[k].dtype)


def out_dims(node, k: int = 0) -> tuple:
    return node.shapes[k].dims


def scalar(value, dtype):
    """A Python scalar as a 0-d array of ``dtype``."""
    return jnp.asarray(value, dtype=dtype)


def cast(x, dtype):
    """``x`` in ``dtype``: ``x`` itself when it already is (no convert in the program)."""
    return x if x.dtype == dtype else x.astype(dtype)


def ieee_div(a, b):
    """``a / b`` as torch computes it: each element's IEEE quotient (``x / 0`` is inf or NaN), in
    the dtype ``a`` and ``b`` promote to (a Python scalar takes the other's dtype).

    XLA turns a division by a broadcast (of a scalar: a constant, a loop counter, a sum; or along
    a dim: a per-segment count) into a multiplication by the rounded reciprocals, an ulp off
    torch's quotients (a density, a mean or ``round(x, decimals)`` then differ). A barrier on
    ``b`` alone does not stop it, as the broadcast comes after the barrier: both operands are
    broadcast to one shape first, then go through one barrier, and XLA sees a plain divide.
    """
    a = jnp.asarray(a)
    dt = jnp.result_type(a, b)
    a, b = jnp.asarray(a, dt), jnp.asarray(b, dt)
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = lax.optimization_barrier((jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)))
    return a / b


def norm_dim(dim: int, rank: int) -> int:
    """A dim in ``[0, rank)``; on a 0-d tensor torch takes 0 and -1 and means the tensor."""
    if rank == 0:
        if dim not in (0, -1):
            raise IndexError(f"dim {dim} is out of range for a 0-d tensor (0 or -1)")
        return 0
    return dim + rank if dim < 0 else dim


def norm_dims(dims, rank: int) -> tuple:
    """Reduced dims in ``[0, rank)``; None or () is every dim; on a 0-d tensor, none."""
    if rank == 0:
        for d in (dims,) if isinstance(dims, int) else dims or ():
            norm_dim(d, 0)
        return ()
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted(norm_dim(d, rank) for d in dims)) if dims else tuple(range(rank))
