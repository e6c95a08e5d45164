"""``scaled_dot_product_attention`` on lazy tensors as one op: an ``ir::attention`` node and,
for its gradient, one ``ir::attention_backward`` node (``_lowering/attention.py``: memory
linear in the key length, cuDNN's fused kernel on a GPU in half precision), never the math
decomposition's ``L x S`` logits, softmax and their gradients.

torch's ``scaled_dot_product_attention`` is a composite op: above the dispatcher's autograd
key it picks a backend by device, and for a device with no fused kernel (the lazy device is
one) decomposes into the math path. ``install()`` registers a kernel for it at the lazy
device's autograd key (``AutogradLazy``), which records the two nodes through an autograd
function; under ``torch.inference_mode`` (no autograd key), the dispatch handler records the
forward node. Both take every argument torch takes, with its meaning:

- ``attn_mask``: boolean (True attends) or additive in the query's dtype, broadcastable to
  ``(*B, Hq, L, S)``; ``is_causal``: torch's top-left lower triangle; ``scale``: default
  ``1 / sqrt(E)``; ``enable_gqa``: ``Hq`` a multiple of ``Hk``, K and V never repeated.
- A row whose keys are all hidden gives zeros, as torch's math kernel does.

Where the op's contract is one the rule does not take, torch's own composite runs (its
validation and errors, then its math path, recorded op by op): dropout (``dropout_p > 0``:
the math path draws from the lazy random stream), a mask that requires a gradient (its
gradient is as large as the logits), inputs whose batch dimensions broadcast against each
other, mixed dtypes, fewer than 3 dimensions, and empty tensors.
"""

from __future__ import annotations

import math

import torch

from ir_core import Generic, Shape, Value
from ir_runtime._frontend.recording import _fast
from ir_runtime._frontend.recording._convert import ir_dtype
from ir_runtime._frontend.recording._dispatch import special
from ir_runtime._frontend.recording._tensor import LazyTensor, wrap
from ir_runtime._frontend.regions._shard_map import first_order_only
from ir_runtime._lowering.attention import broadcastable, lse_dtype

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# False: every call takes torch's composite (the benchmarks' "before" side).
ENABLED = [True]


def _arguments(args, kwargs) -> dict:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    given = dict(zip(names, args, strict=False), **kwargs)
    return {
        "query": given["query"],
        "key": given["key"],
        "value": given["value"],
        "attn_mask": given.get("attn_mask"),
        "dropout_p": float(given.get("dropout_p", 0.0)),
        "is_causal": bool(given.get("is_causal", False)),
        "scale": given.get("scale"),
        "enable_gqa": bool(given.get("enable_gqa", False)),
    }


def takes(a: dict) -> bool:
    """Whether the rule computes this call (else torch's composite does: module docstring)."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not ENABLED[0] or not all(isinstance(t, LazyTensor) for t in (q, k, v)):
        return False
    if a["dropout_p"] != 0.0 or q.dtype not in _FLOATS or not q.dtype == k.dtype == v.dtype:
        return False
    if not q.dim() == k.dim() == v.dim() >= 3 or 0 in (*q.shape, *k.shape, *v.shape):
        return False
    if not q.shape[:-3] == k.shape[:-3] == v.shape[:-3]:
        return False
    hq, hk = q.shape[-3], k.shape[-3]
    if v.shape[-3] != hk or v.shape[-2] != k.shape[-2] or q.shape[-1] != k.shape[-1]:
        return False
    if hq % hk or not (hq == hk or hk == 1 or a["enable_gqa"]):
        return False
    if mask is not None:
        if a["is_causal"] or not isinstance(mask, LazyTensor) or mask.requires_grad:
            return False
        if mask.dtype not in (torch.bool, q.dtype):
            return False
        if not broadcastable(tuple(mask.shape), (*q.shape[:-1], k.shape[-2])):
            return False
    return True


def _attrs(a: dict) -> dict:
    scale = a["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(a["query"].shape[-1])
    return {"causal": a["is_causal"], "scale": float(scale)}


def _forward_node(a: dict, attrs: dict, origin):
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    operands = [q._ir, k._ir, v._ir] + ([] if mask is None else [mask._ir])
    dtype = ir_dtype(q.dtype)
    shapes = [
        Shape(dtype, (*q.shape[:-1], v.shape[-1])),
        Shape(lse_dtype(dtype), tuple(q.shape[:-1])),
    ]
    return Generic("ir::attention", operands, shapes, attrs, None, origin)


class _Attention(torch.autograd.Function):
    """The forward node; its backward, the backward node."""

    @staticmethod
    def forward(ctx, a, attrs, origin, q, k, v, mask):
        node = _forward_node(a, attrs, origin)
        out, lse = wrap(Value(node, 0)), wrap(Value(node, 1))
        ctx.save_for_backward(q, k, v, out, lse, *(() if mask is None else (mask,)))
        ctx.attrs, ctx.origin = attrs, origin
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad, _lse_grad):
        q, k, v, out, lse, *mask = ctx.saved_tensors
        operands = [grad._ir, q._ir, k._ir, v._ir, out._ir, lse._ir] + [m._ir for m in mask]
        shapes = [q._ir.shape, k._ir.shape, v._ir.shape]
        node = Generic("ir::attention_backward", operands, shapes, ctx.attrs, None, ctx.origin)
        grads = [wrap(Value(node, j)) if ctx.needs_input_grad[3 + j] else None for j in range(3)]
        return (None, None, None, *first_order_only(grads, "scaled_dot_product_attention"), None)


def _sdpa(*args, **kwargs):
    """The kernel at the lazy device's autograd key."""
    a = _arguments(args, kwargs)
    if not takes(a):
        return _SDPA.decompose(*args, **kwargs)
    out, _ = _Attention.apply(
        a, _attrs(a), _fast.origin(), a["query"], a["key"], a["value"], a["attn_mask"]
    )
    return out


@special(_SDPA)
def _sdpa_no_autograd(func, args, kwargs):
    """The op as it reaches the lazy tensor with no autograd key (``inference_mode``)."""
    a = _arguments(args, kwargs)
    if not takes(a):
        return func.decompose(*args, **kwargs)
    return wrap(Value(_forward_node(a, _attrs(a), _fast.origin()), 0))


# The CPU flash kernel's own ops, which torch's ``scaled_dot_product_attention`` becomes when
# traced on CPU tensors (AOTAutograd's graphs under ``torch.compile``): the same two nodes,
# the log-sum-exp passed between them as the kernel's (natural log, one per query row,
# float32 for half precision). torch's decomposition of the forward returns the attention
# weights in its place, which the backward kernel would read as log-sum-exps: so the forward
# is never left to it, and a call the rule does not take raises here (run on the host by the
# caller, the forward and the backward both, with the kernel's own values).
_FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
_FLASH_CPU_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _flash_arguments(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    return {
        "query": q,
        "key": k,
        "value": v,
        "attn_mask": attn_mask,
        "dropout_p": float(dropout_p),
        "is_causal": bool(is_causal),
        "scale": scale,
        "enable_gqa": q.shape[-3] != k.shape[-3],
    }


def _not_taken(func, a):
    from ir_runtime._errors import UnsupportedOpError

    return UnsupportedOpError(
        f"{func} with these arguments (dropout {a['dropout_p']}, query {list(a['query'].shape)} "
        f"{a['query'].dtype}, key {list(a['key'].shape)}) has no rule on the lazy device"
    )


@special(_FLASH_CPU)
def _flash_cpu(func, args, kwargs):
    a = _flash_arguments(*args, **kwargs)
    if not takes(a):
        raise _not_taken(func, a)
    node = _forward_node(a, _attrs(a), _fast.origin())
    return wrap(Value(node, 0)), wrap(Value(node, 1))


@special(_FLASH_CPU_BACKWARD)
def _flash_cpu_backward(func, args, kwargs):
    grad, q, k, v, out, lse, *rest = args
    a = _flash_arguments(q, k, v, *rest, **kwargs)
    if not takes(a) or not isinstance(lse, LazyTensor):
        raise _not_taken(func, a)
    mask = a["attn_mask"]
    operands = [grad._ir, q._ir, k._ir, v._ir, out._ir, lse._ir] + (
        [] if mask is None else [mask._ir]
    )
    shapes = [q._ir.shape, k._ir.shape, v._ir.shape]
    node = Generic("ir::attention_backward", operands, shapes, _attrs(a), None, _fast.origin())
    return tuple(wrap(Value(node, j)) for j in range(3))


_LIBRARY: list = []


def install() -> None:
    """Register the autograd-key kernel (module docstring); idempotent."""
    if _LIBRARY:
        return
    lib = torch.library.Library("aten", "IMPL", "AutogradLazy")
    lib.impl("scaled_dot_product_attention", _sdpa)
    _LIBRARY.append(lib)
