"""JAX from torch: ``call_jax(fn, *tensors, **static)`` runs a JAX function on lazy tensors as
one node of the step, and ``jax_op(fn)`` makes one a reusable torch function.

``fn`` takes arrays (the lazy tensors' values; tuples, lists and dicts of them as given) and the
``static`` keywords (hashable Python values: shapes, flags, a block size), and returns an array
or a tuple, list or dict of them, which come back as lazy tensors in the same structure. It is
traced by jax once per shapes, dtypes and static values (as ``jax.jit`` traces), into one
``ir::call_jax`` node that the step's program calls (``_lowering.regions.jax_call``): XLA fuses
and partitions it with the rest, so shardings flow in and out. The node names the function by
a digest of its StableHLO at those shapes (never by ``id(fn)``): every process that traces the
same function records the same node, and compiled programs are shared across processes.

Gradients flow through ``jax.vjp`` of the same function (a ``custom_vjp`` is honoured), to the
floating inputs; integer and boolean results carry none. torch's dtypes are jax's here: int64
and float64 stay 64-bit, bfloat16 is bfloat16. Inside a manual region (``shard_map``) the
function runs on each device's shards, as in ``jax.shard_map``: a kernel written for one device
(a Pallas kernel) is partitioned that way. A function jax cannot trace (one that reads an
array's value into Python, or calls numpy on it) is refused by name, with jax's reason.
"""

from __future__ import annotations

import functools
import hashlib

import jax
import torch
import torch.utils._pytree as pytree

from ir_core import Generic, Shape, Value
from ir_runtime._bounded import Bounded
from ir_runtime._dtypes import name_of, to_numpy_dtype
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.regions._shard_map import (
    _differentiable,
    cotangents,
    first_order_only,
)
from ir_runtime._lowering.regions.jax_call import FUNCTIONS

# (fn, argument structure, shapes and dtypes, static values) -> (digest, name, output
# structure, output shapes): what tracing ``fn`` with jax found, once per signature, as jax.jit
# caches its traces.
_TRACED = Bounded(256)


def _name(fn) -> str:
    base = getattr(fn, "func", fn)  # (a functools.partial: its function)
    module = getattr(base, "__module__", None) or ""
    name = getattr(base, "__qualname__", None) or type(base).__name__
    return f"{module}.{name}" if module else name


def _flat(fn, in_spec, static, out_tree=None):
    """``fn`` as the node's function: flat arrays in, a flat list out (``out_tree``: a list
    that gets the output's structure when jax traces it)."""

    def flat(*arrays):
        args = pytree.tree_unflatten(list(arrays), in_spec)
        leaves, tree = jax.tree_util.tree_flatten(fn(*args, **static))
        if out_tree is not None:
            out_tree[:] = [tree]
        return leaves

    return flat


def _trace(fn, in_spec, tensors, static):
    """``(digest, name, output structure, output shapes)`` of ``fn`` at these inputs."""
    shapes = tuple((tuple(t._ir.shape.dims), t._ir.shape.dtype) for t in tensors)
    try:
        key = (fn, in_spec, shapes, tuple(sorted(static.items())))
        hash(key)
    except TypeError as e:
        bad = [k for k, v in static.items() if not _hashable(v)]
        raise TypeError(
            f"call_jax: the static arguments of {_name(fn)} must be hashable (they key its "
            f"traces, as jax.jit's static arguments do); {', '.join(bad) or 'one'} is not: {e}"
        ) from None
    found = _TRACED.get(key)
    if found is not None:
        if found[0] not in FUNCTIONS:  # (dropped by the bound since: registered again)
            FUNCTIONS[found[0]] = _flat(fn, in_spec, static)
        return found
    name = _name(fn)
    avals = [jax.ShapeDtypeStruct(dims, to_numpy_dtype(dtype)) for dims, dtype in shapes]
    out_tree: list = []
    flat = _flat(fn, in_spec, static, out_tree)
    try:
        outs = jax.eval_shape(flat, *avals)
        text = jax.jit(flat).lower(*avals).as_text()
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TypeError(
            f"call_jax: jax cannot trace {name} on {_signature(shapes)}: "
            f"{type(e).__name__}: {reason}"
        ) from e
    for k, o in enumerate(outs):
        if not isinstance(o, jax.ShapeDtypeStruct):
            raise TypeError(
                f"call_jax: {name} returned a {type(o).__name__} (result {k}), not an array"
            )
    out_shapes = tuple(Shape(name_of(o.dtype), tuple(o.shape)) for o in outs)
    h = hashlib.sha256(f"{name}|{out_tree[0]}|".encode())
    h.update(text.encode())
    digest = h.hexdigest()[:32]
    FUNCTIONS[digest] = _flat(fn, in_spec, static)
    found = _TRACED[key] = (digest, name, out_tree[0], out_shapes)
    return found


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _signature(shapes) -> str:
    return ", ".join(f"{dtype}{list(dims)}" for dims, dtype in shapes) or "no arrays"


class _CallJax(torch.autograd.Function):
    """The call as one node; its backward, the vjp node."""

    @staticmethod
    def forward(ctx, meta, *inputs):
        digest, name, out_shapes, origin = meta
        attrs = {"fn": digest, "name": name}
        node = Generic(
            "ir::call_jax", [t._ir for t in inputs], list(out_shapes), attrs, None, origin
        )
        outs = tuple(wrap(Value(node, k)) for k in range(len(out_shapes)))
        ctx.save_for_backward(*inputs)
        ctx.meta = meta
        ctx.mark_non_differentiable(*(o for o in outs if not _differentiable(o._ir.shape.dtype)))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        inputs = ctx.saved_tensors
        digest, name, out_shapes, origin = ctx.meta
        wrt = tuple(
            k
            for k, t in enumerate(inputs)
            if ctx.needs_input_grad[k + 1] and _differentiable(t._ir.shape.dtype)
        )
        outs = tuple(k for k, s in enumerate(out_shapes) if _differentiable(s.dtype))
        if not wrt:
            return (None,) * (len(inputs) + 1)
        cts = cotangents(grads, outs, out_shapes)
        attrs = {"fn": digest, "name": name, "wrt": wrt, "outs": outs, "inputs": len(inputs)}
        shapes = [inputs[k]._ir.shape for k in wrt]
        operands = [t._ir for t in inputs] + cts
        node = Generic("ir::call_jax_vjp", operands, shapes, attrs, None, origin)
        out = [None] * len(inputs)
        for j, k in enumerate(wrt):
            out[k] = wrap(Value(node, j))
        return (None, *first_order_only(out, f"call_jax({name})"))


def call_jax(fn, *args, **static):
    """Run the JAX function ``fn`` on lazy tensors, as one node of the step (module
    docstring): ``fn(*args, **static)`` with each lazy tensor among ``args`` (tuples, lists and
    dicts of them) as an array; ``static``: hashable Python values passed as they are. Returns
    its result as lazy tensors, in its structure."""
    if not callable(fn):
        raise TypeError(f"call_jax takes a JAX function, got {type(fn).__name__}")
    tensors, in_spec = pytree.tree_flatten(args)
    for k, t in enumerate(tensors):
        if not isinstance(t, LazyTensor):
            what = type(t).__name__
            if isinstance(t, torch.Tensor):
                what = f"a {t.device.type} tensor"
            raise TypeError(
                f"call_jax({_name(fn)}): argument leaf {k} is {what}; pass lazy tensors "
                f"(irt.to_lazy(t)) positionally, and Python values as keywords (static)"
            )
    digest, name, out_tree, out_shapes = _trace(fn, in_spec, tensors, static)
    outs = _CallJax.apply((digest, name, out_shapes, _fast.origin()), *tensors)
    return jax.tree_util.tree_unflatten(out_tree, list(outs))


def jax_op(fn=None, **static):
    """``fn`` (a JAX function) as a torch function of lazy tensors: ``jax_op(fn)`` or
    ``@jax_op``; keywords given here are static for every call, with the call's own added."""
    if fn is None:
        return functools.partial(jax_op, **static)
    if not callable(fn):
        raise TypeError(f"jax_op takes a JAX function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def op(*args, **kwargs):
        return call_jax(fn, *args, **static, **kwargs)

    return op


__all__ = ["call_jax", "jax_op"]
