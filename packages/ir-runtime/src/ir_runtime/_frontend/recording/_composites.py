"""ATen ops that torch neither decomposes nor gives the lazy device a kernel for, recorded as
the ops they are made of (each a formula of torch's own CPU kernel, tested against it):

- ``_weight_norm_interface_backward``: the backward of ``weight_norm`` (``torch.nn.utils``'s,
  and the parametrization's) when the norm is taken over the first or the last dimension;
- ``_pack_padded_sequence``: ``pack_padded_sequence``'s packing. Its lengths are a CPU tensor
  (torch requires it), so the packed shape is known without reading the device; the
  ``batch_sizes`` it returns stay on the CPU, as ``PackedSequence`` requires. Its backward and
  ``_pad_packed_sequence`` have torch decompositions;
- ``copy``: the functional ``copy_`` (``linspace``/``logspace`` with tensor ends record it):
  ``src`` in ``self``'s dtype, broadcast to its shape.
"""

from __future__ import annotations

import itertools

import torch

from ir_runtime._frontend.recording._api import to_lazy
from ir_runtime._frontend.recording._dispatch import special
from ir_runtime._frontend.recording._tensor import LazyTensor

aten = torch.ops.aten


def _others(t: torch.Tensor, dim: int) -> list:
    return [d for d in range(t.dim()) if d != dim]


@special(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(func, args, kwargs):
    """``(grad_v, grad_g)`` of ``w = v * (g / norms)``, ``norms`` the 2-norms of ``v`` over
    every dimension but ``dim`` (saved by the forward, shaped like ``g``)."""
    grad_w, v, g, norms, dim = (*args, *kwargs.values())
    dim = dim % v.dim()
    sums = (grad_w * v).sum(dim=_others(v, dim), keepdim=True)  # per slice: <grad_w, v>
    grad_g = sums / norms
    grad_v = (g / norms) * (grad_w - v * (sums / (norms * norms)))
    return grad_v, grad_g.to(g.dtype)


@special(aten._pack_padded_sequence.default)
def _pack_padded_sequence(func, args, kwargs):
    """``(data, batch_sizes)``: time step ``t`` holds the first ``batch_sizes[t]`` sequences'
    elements (the lengths sorted longest first, as torch requires), steps one after another."""
    values = dict(zip(("input", "lengths", "batch_first"), args, strict=False), **kwargs)
    x, lengths, batch_first = values["input"], values["lengths"], values["batch_first"]
    if isinstance(lengths, torch.Tensor) and lengths.device.type != "cpu":
        raise RuntimeError(
            f"'lengths' argument should be a 1D CPU int64 tensor, but got 1D {lengths.device} "
            f"{str(lengths.dtype).removeprefix('torch.')} tensor"
        )
    lengths = [int(n) for n in torch.as_tensor(lengths).tolist()]
    if batch_first:
        x = x.transpose(0, 1)
    if not lengths or min(lengths) <= 0:
        raise RuntimeError(
            "Length of all samples has to be greater than 0, but found an element in 'lengths' "
            "that is <= 0"
        )
    if any(a < b for a, b in itertools.pairwise(lengths)):
        raise RuntimeError(
            "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
            "You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
            "pack_sequence to sidestep this requirement if you do not need ONNX exportability."
        )
    steps = lengths[0]
    if steps > x.shape[0]:
        raise RuntimeError(
            f"Expected a sequence of length at most {x.shape[0]} along the time dimension, "
            f"but got lengths up to {steps}"
        )
    sizes = [sum(1 for n in lengths if n > t) for t in range(steps)]
    data = torch.cat([x[t, :b] for t, b in enumerate(sizes)])
    return data, torch.tensor(sizes, dtype=torch.int64)


@special(aten.copy.default)
def _copy(func, args, kwargs):
    values = dict(zip(("self", "src", "non_blocking"), args, strict=False), **kwargs)
    x, src = values["self"], values["src"]
    if not isinstance(src, LazyTensor):
        src = to_lazy(torch.as_tensor(src))
    return aten.expand_copy.default(src.to(x.dtype), list(x.shape))
