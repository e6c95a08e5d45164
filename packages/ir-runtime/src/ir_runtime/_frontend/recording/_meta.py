"""Output shapes of ATen calls, from torch's meta kernels, memoized per call signature.

A few ops have no meta kernel, or one that disagrees with the CPU kernel: ``_NO_META`` gives
their shapes instead.
"""

from __future__ import annotations

import torch

from ir_runtime._bounded import Bounded
from ir_runtime._frontend.recording import _convert
from ir_runtime._frontend.recording._convert import shape_of

# memo key (op, input shapes and dtypes, attributes) -> output layout; read from C by _fast.
MEMO = Bounded(1 << 16)


def _like(k: int):
    return lambda *args, **kwargs: torch.empty_like(args[k])


def _margin_loss(func):
    """torch's meta kernel gives a 1-D input's unreduced loss shape [1]; CPU gives []."""

    names = [a.name for a in func._schema.arguments]
    (reduction,) = [a for a in func._schema.arguments if a.name == "reduction"]
    default = reduction.default_value if reduction.has_default_value() else None

    def shapes(x, *args, **kwargs):
        out = func(x, *args, **kwargs)
        given = dict(zip(names[1:], args, strict=False)) | kwargs
        if x.dim() == 1 and given.get("reduction", default) == 0:
            first = out[0] if isinstance(out, tuple) else out
            squeezed = first.new_empty(())
            return (squeezed, *out[1:]) if isinstance(out, tuple) else squeezed
        return out

    return shapes


def _lstsq(a, b, rcond=None, *, driver=None):
    """linalg_lstsq's outputs: solution, residuals, rank, singular values, as the CPU kernel
    gives them for its driver (gelsy by default)."""
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    b2 = b.unsqueeze(-1) if vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], b2.shape[:-2])
    k = b2.shape[-1]
    real = a.real.dtype if a.is_complex() else a.dtype
    return (
        a.new_empty((*batch, n) if vector else (*batch, n, k)),
        a.new_empty((*batch, k) if m > n and driver != "gelsy" else (0,), dtype=real),
        a.new_empty(a.shape[:-2] if driver != "gels" else (0,), dtype=torch.int64),
        a.new_empty(
            (*a.shape[:-2], min(m, n)) if driver in ("gelsd", "gelss") else (0,), dtype=real
        ),
    )


_HALF = (torch.bfloat16, torch.float16)


def _statistics(func, params, stats, running=()):
    """A normalization's outputs as the CPU kernel gives them in half precision: its meta
    kernel makes the saved statistics (outputs ``stats``) float32 (or, for group norm, the
    input's dtype) whatever the parameters; the CPU kernel makes them the input's dtype, or
    the parameters' where a half-precision input has float32 parameters (its "mixed type").
    ``params``: the arguments that are parameters; ``running``: pairs (output, argument) of
    updated running statistics, in that argument's dtype."""

    def shapes(x, *args, **kwargs):
        out = func(x, *args, **kwargs)
        if x.dtype not in _HALF:
            return out
        given = [args[k - 1] for k in params if k <= len(args) and args[k - 1] is not None]
        dtype = next((p.dtype for p in given if p.dtype != x.dtype), x.dtype)
        out = list(out)
        for k in stats:
            out[k] = out[k].to(dtype)
        for k, a in running:
            out[k] = out[k].to(args[a - 1].dtype)
        return tuple(out)

    return shapes


_aten = torch.ops.aten
_BATCH_NORMS = (_aten.native_batch_norm.default, _aten._native_batch_norm_legit.default)
# Output shapes (as meta tensors) of the ATen ops torch has no meta kernel for, or whose meta
# kernel disagrees with the CPU kernel; the rest come from torch's meta kernels.
_NO_META = {
    _aten.fractional_max_pool3d_backward.default: _like(1),
    _aten._ctc_loss_backward.default: _like(1),
    _aten.multi_margin_loss_backward.default: _like(1),
    _aten.multilabel_margin_loss_backward.default: _like(1),
    _aten.geqrf.default: lambda x: (
        torch.empty_like(x),
        x.new_empty((*x.shape[:-2], min(x.shape[-2], x.shape[-1]))),
    ),
    _aten.linalg_lstsq.default: _lstsq,
    _aten.histogram.bin_ct: lambda x, bins=100, *, range=None, weight=None, density=False: (
        x.new_empty((bins,)),
        x.new_empty((bins + 1,)),
    ),
    _aten.histogram.bins_tensor: lambda x, bins, *, weight=None, density=False: (
        x.new_empty((bins.numel() - 1,)),
        bins.new_empty(bins.shape),
    ),
    _aten._histogramdd_bin_edges.default: (
        lambda x, bins, *, range=None, weight=None, density=False: [
            x.new_empty((b + 1,)) for b in bins
        ]
    ),
    _aten._histogramdd_from_bin_cts.default: (
        lambda x, bins, *, range=None, weight=None, density=False: x.new_empty(tuple(bins))
    ),
    _aten._histogramdd_from_bin_tensors.default: (
        lambda x, bins, *, weight=None, density=False: x.new_empty(
            tuple(b.numel() - 1 for b in bins)
        )
    ),
    _aten.native_layer_norm.default: _statistics(_aten.native_layer_norm.default, (2, 3), (1, 2)),
    **{f: _statistics(f, (1, 2, 3, 4), (1, 2)) for f in _BATCH_NORMS},
    _aten._native_batch_norm_legit.no_stats: _statistics(
        _aten._native_batch_norm_legit.no_stats, (1, 2), (1, 2)
    ),
    _aten._native_batch_norm_legit_functional.default: _statistics(
        _aten._native_batch_norm_legit_functional.default, (1, 2, 3, 4), (1, 2), ((3, 3), (4, 4))
    ),
    _aten._native_batch_norm_legit_no_training.default: _statistics(
        _aten._native_batch_norm_legit_no_training.default, (1, 2, 3, 4), (1, 2)
    ),
    _aten.native_group_norm.default: _statistics(_aten.native_group_norm.default, (1, 2), (1, 2)),
    _aten.multi_margin_loss.default: _margin_loss(_aten.multi_margin_loss.default),
    _aten.multilabel_margin_loss_forward.default: _margin_loss(
        _aten.multilabel_margin_loss_forward.default
    ),
}


def _is_bool(v) -> bool:
    return v.dtype == torch.bool if isinstance(v, torch.Tensor) else isinstance(v, bool)


def _subtraction(self, other, *rest, **kwargs):
    """torch's ``sub_check``, which its CPU kernel runs and its meta kernel skips for a number
    ``other``: a bool operand is refused, with eager's message."""
    if _is_bool(self) and _is_bool(other):
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` "
            "or `logical_xor()` operator instead."
        )
    if _is_bool(self) or _is_bool(other):
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
            "trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )


# Eager's checks of an op's arguments that its meta kernel lacks: run before it.
_CHECKS = {
    f: _subtraction
    for f in (_aten.sub.Tensor, _aten.sub.Scalar, _aten.rsub.Tensor, _aten.rsub.Scalar)
}


def _meta_arg(v):
    if isinstance(v, torch.Tensor):
        return torch.empty(v.shape, dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_arg(x) for x in v)
    return v


def infer(func, key, args, kwargs):
    """Output (structure, shapes) of ``func`` for inputs like ``args``, from torch's meta
    kernels; memoized by ``key`` (op, input shapes and dtypes, attributes)."""
    hit = MEMO.get(key)
    if hit is not None:
        return hit
    check = _CHECKS.get(func)
    if check is not None:
        check(*args, **kwargs)
    meta_kwargs = {k: _meta_arg(v) for k, v in kwargs.items()}
    if "device" in meta_kwargs:  # a factory: build it on meta, not on the lazy device again
        meta_kwargs["device"] = "meta"
    shapes = _NO_META.get(func)
    if shapes is not None:
        out = shapes(*_meta_arg(list(args)), **meta_kwargs)
    else:
        out = func(*_meta_arg(list(args)), **meta_kwargs)
    if isinstance(out, torch.Tensor):
        # The output's dims and torch dtype ride along: tracing's fast path builds the wrapper
        # from them directly (the keyword arguments of _make_wrapper_subclass, made once).
        dims = tuple(out.shape)
        result = (
            "one",
            (shape_of(out),),
            dims,
            out.dtype,
            {"dtype": out.dtype, "device": _convert.DEVICE},
        )
    elif isinstance(out, (tuple, list)):
        layout = tuple(isinstance(o, torch.Tensor) for o in out)
        result = ("many", tuple(shape_of(o) for o in out if isinstance(o, torch.Tensor)), layout)
    elif out is None:
        result = ("none", ())
    else:
        raise TypeError(f"{func} returned {type(out).__name__}; expected tensors")
    MEMO[key] = result
    return result
