"""``layer_norm`` under autograd recorded as the ops it is made of, so that its gradient is
autograd's of those ops, as jax's autodiff of a hand-written layer norm gives it.

Why: under a mesh, XLA's partitioner (Shardy) places each op by the order in which placements
reach it. With torch's fused ``native_layer_norm_backward`` (one node), the batch placement of
a GPT's gradient, coming from its labels, reaches the attention before the qkv weight's
placement of its heads does, so under FSDP the attention runs batch-parallel and its backward
gathers the qkv weight whole. Spelled out op by op, the layer norm's gradient delays that
wave as jax's program does: the 1 GiB GPT's FSDP AdamW step peaks at 0.997x the bytes of the
same step in ``jax.jit`` (``bench_memory.py``), against 1.047x with the fused node.

What is recorded: the mean and the variance over the normalized dims, ``(x - mean) *
rsqrt(var + eps)``, times the weight, plus the bias. A 16-bit input is computed in float32 and
the result cast back once, as torch's CPU kernel accumulates. Without autograd (grad disabled,
or nothing that requires grad), the one ``native_layer_norm`` node is recorded, as before.
``install()`` registers the kernel at the lazy device's autograd key (``AutogradLazy``), where
torch's own composite would decompose ``layer_norm`` into ``native_layer_norm``.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

_LOW = (torch.bfloat16, torch.float16)


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """The kernel at the lazy device's autograd key (module docstring)."""
    tracked = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (input, weight, bias)
    )
    if not tracked:
        with torch._C._AutoDispatchBelowAutograd():
            return aten.native_layer_norm(input, normalized_shape, weight, bias, eps)[0]
    normalized_shape = tuple(normalized_shape)
    n = len(normalized_shape)
    if n == 0 or tuple(input.shape[input.dim() - n :]) != normalized_shape or input.dim() < n:
        # (torch's own checks and message, from the fused op)
        return aten.native_layer_norm(input, normalized_shape, weight, bias, eps)[0]
    dims = tuple(range(input.dim() - n, input.dim()))
    x = input.float() if input.dtype in _LOW else input
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).square().mean(dims, keepdim=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        out = out * weight.to(x.dtype)  # (in the same dtype, .to returns the tensor itself)
    if bias is not None:
        out = out + bias.to(x.dtype)
    return out.to(input.dtype)


_LIBRARY: list = []


def install() -> None:
    """Register the autograd-key kernel (module docstring); idempotent."""
    if _LIBRARY:
        return
    lib = torch.library.Library("aten", "IMPL", "AutogradLazy")
    lib.impl("layer_norm", _layer_norm)
    _LIBRARY.append(lib)
