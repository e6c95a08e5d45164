"""Rules for ``ir::call_jax`` (a JAX function run on lazy tensors as one node) and its vjp.

Such a node holds no function: its ``fn`` attribute names one in ``FUNCTIONS`` by a digest of
the function's StableHLO at the operands' shapes and dtypes (``_frontend.regions._jax``), so the
name is the same in every process that traces the same function, and two functions that compute
the same share a program. The function takes and returns flat lists of arrays (the front end
wraps the user's pytrees). Lowered, it is called inside the step's program: XLA partitions and
fuses it with the rest, and shardings flow through it as through any op.
"""

from __future__ import annotations

import jax

from ir_runtime._bounded import Bounded
from ir_runtime._errors import LoweringError
from ir_runtime._lowering._registry import register

FUNCTIONS = Bounded(256)  # digest -> the function (flat arrays in, a flat list out)


def function(node):
    """The function a node names."""
    fn = FUNCTIONS.get(node.attrs["fn"])
    if fn is None:
        raise LoweringError(
            f"the JAX function of {node.op!r} ({node.attrs['name']}, {node.attrs['fn']}) is no "
            f"longer registered: more than {FUNCTIONS.capacity} distinct functions were called "
            f"since; run the step sooner"
        )
    return fn


@register("ir::call_jax")
def _call_jax(node, *operands):
    return tuple(function(node)(*operands))


@register("ir::call_jax_vjp")
def _call_jax_vjp(node, *operands):
    """Operands: the call's inputs, then one cotangent per output in ``outs``; results: one
    gradient per input in ``wrt``."""
    fn = function(node)
    wrt, outs = node.attrs["wrt"], node.attrs["outs"]
    xs, cts = operands[: node.attrs["inputs"]], operands[node.attrs["inputs"] :]

    def differentiable(*diff):
        args = list(xs)
        for k, d in zip(wrt, diff, strict=True):
            args[k] = d
        results = fn(*args)
        return tuple(results[k] for k in outs)

    _, vjp = jax.vjp(differentiable, *(xs[k] for k in wrt))
    return tuple(vjp(tuple(cts)))
