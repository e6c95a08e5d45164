"""``torch.autocast(device_type="lazy", dtype=...)``: mixed precision on the lazy device.

torch's autocast casts at its own dispatch key, which exists per backend (CPU, CUDA, XLA, ...)
but not for the lazy device, and torch refuses ``"lazy"`` as an autocast device type, even to
turn autocast off (Hugging Face's rotary embeddings do exactly that). So ``torch.autocast``
and ``torch.amp.autocast`` are replaced by a subclass that accepts the lazy device and, for it,
casts where torch's CPU policy does, one level higher: a torch-function mode sees each call of
a listed function (``F.linear``, ``torch.matmul``, ``F.cross_entropy``, ...) and casts its
floating lazy tensor arguments first, with ordinary ``Tensor.to`` calls that autograd records.
So the model's weights stay float32 (the master copy), each listed op computes in the autocast
dtype, losses and the ops on the float32 list compute in float32, and the gradients reaching
the weights are float32, as eager autocast gives them:

- to the autocast dtype: matmuls and convolutions (``linear``, ``matmul``, ``mm``, ``bmm``,
  ``addmm``, ``baddbmm``, ``addbmm``, ``conv*``, ``conv_transpose*``, ``prelu``,
  ``scaled_dot_product_attention``, ``linalg.vecdot``);
- to float32: losses, reductions that overflow (``prod``), and the numerically delicate ops
  (``cdist``, ``quantile``, ``linalg.*``, ``fft.*``, 3-d pooling, ``grid_sample``);
- to the widest floating dtype among the arguments: ``cat``, ``stack``, ``index_copy``;
- everything else runs in the dtypes it is given.

Nested ``torch.autocast("lazy", enabled=False)`` turns it off inside; host tensors inside the
region are left to CPU autocast, which this does not turn on. The dtypes are bfloat16 and
float16 (torch's CPU autocast refuses others).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from ir_runtime._errors import DTypeError
from ir_runtime._frontend.recording import _convert, _dispatch
from ir_runtime._frontend.recording._tensor import LazyTensor

_TORCH_AUTOCAST = torch.amp.autocast_mode.autocast
_DTYPES = (torch.bfloat16, torch.float16)

_T = torch.Tensor
_LOWER = {  # computed in the autocast dtype (torch's CPU "lower_precision_fp" list)
    F.linear, torch.matmul, _T.matmul, _T.__matmul__, _T.__rmatmul__, torch.mm, _T.mm,
    torch.bmm, _T.bmm, torch.addmm, _T.addmm, torch.baddbmm, _T.baddbmm, torch.addbmm,
    _T.addbmm, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
    F.conv_transpose3d, torch.conv_tbc, F.prelu, torch.prelu, F.scaled_dot_product_attention,
    torch.linalg.vecdot,
}  # fmt: skip
_FP32 = {  # computed in float32 (its "fp32" list)
    F.mse_loss, F.cross_entropy, F.nll_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss,
    F.kl_div, F.binary_cross_entropy, F.binary_cross_entropy_with_logits,
    F.cosine_embedding_loss, F.hinge_embedding_loss, F.poisson_nll_loss, F.margin_ranking_loss,
    F.soft_margin_loss, F.triplet_margin_loss, F.multi_margin_loss, F.multilabel_margin_loss,
    F.ctc_loss, torch.prod, _T.prod, torch.quantile, _T.quantile, torch.nanquantile,
    _T.nanquantile, torch.cdist, torch.trace, _T.trace, torch.cholesky, torch.cholesky_inverse,
    torch.cholesky_solve, torch.inverse, _T.inverse, torch.pinverse, torch.lu_solve,
    torch.stft, torch.polar, torch.view_as_complex, F.avg_pool3d, F.max_pool3d,
    F.adaptive_avg_pool3d, F.adaptive_max_pool3d, F.grid_sample, F.fractional_max_pool2d,
    F.fractional_max_pool3d, torch.geqrf, torch.triangular_solve, torch.svd, torch.qr,
}  # fmt: skip
for _module in (torch.fft, torch.linalg):  # their functions, but vecdot (a matmul)
    _FP32 |= {
        f
        for n, f in vars(_module).items()
        if callable(f) and not n.startswith("_") and n != "vecdot" and not isinstance(f, type)
    }
_PROMOTE = {
    torch.cat,
    torch.concat,
    torch.concatenate,
    torch.stack,
    torch.index_copy,
    _T.index_copy,
}

_ACTIVE: list = []  # the lazy autocast dtype of each region entered, innermost last (None: off)


def current():
    """The dtype lazy autocast casts to now, or None when it is off."""
    return _ACTIVE[-1] if _ACTIVE else None


def _cast(x, dtype):
    if isinstance(x, LazyTensor) and x.is_floating_point() and x.dtype != dtype:
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _widest(args) -> torch.dtype | None:
    found = None
    for x in args:
        if isinstance(x, (list, tuple)):
            w = _widest(x)
        elif isinstance(x, LazyTensor) and x.is_floating_point():
            w = x.dtype
        else:
            continue
        if w is not None:
            found = w if found is None else torch.promote_types(found, w)
    return found


class _Casts(TorchFunctionMode):
    """Casts the lazy arguments of listed functions while a lazy autocast region is on."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = _ACTIVE[-1] if _ACTIVE else None
        if dtype is not None:
            if func in _LOWER:
                target = dtype
            elif func in _FP32:
                target = torch.float32
            elif func in _PROMOTE:
                target = _widest((*args, *kwargs.values()))
            else:
                target = None
            if target is not None:
                args = _cast(args, target)
                kwargs = {k: _cast(v, target) for k, v in kwargs.items()}
        return func(*args, **kwargs)


class autocast(_TORCH_AUTOCAST):
    """torch's ``autocast``, accepting ``device_type="lazy"``: for the lazy device, the casts
    above (``dtype`` bfloat16, the default, or float16); ``enabled=False`` turns them off
    inside. Other device types are torch's own."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self._lazy = device_type == _convert.DEVICE.type
        if self._lazy:
            dtype = torch.bfloat16 if dtype is None else dtype
            if enabled and dtype not in _DTYPES:
                raise DTypeError(
                    f"torch.autocast(device_type='lazy', dtype={dtype}): autocast computes in "
                    f"torch.bfloat16 or torch.float16; for a whole model in another dtype, "
                    f"cast the model and its inputs (model.to(dtype))"
                )
            self._dtype_lazy = dtype if enabled else None
            self._mode = None
            return
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def __enter__(self):
        if not self._lazy:
            entered = super().__enter__()
            self._cpu = self.device == "cpu" and self._enabled  # (lazy ops inside: a warning)
            _dispatch.CPU_AUTOCAST[0] += self._cpu
            return entered
        _ACTIVE.append(self._dtype_lazy)
        if not any(isinstance(m, _Casts) for m in _get_current_function_mode_stack()):
            self._mode = _Casts()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        if not self._lazy:
            _dispatch.CPU_AUTOCAST[0] -= self._cpu
            return super().__exit__(*exc)
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        _ACTIVE.pop()
        return False

    def __call__(self, func):
        if not self._lazy:
            return super().__call__(func)

        def wrapped(*args, **kwargs):
            with autocast(
                _convert.DEVICE.type, dtype=self._dtype_lazy, enabled=self._dtype_lazy is not None
            ):
                return func(*args, **kwargs)

        return wrapped


def install() -> None:
    """``torch.autocast`` and ``torch.amp.autocast`` accept the lazy device (above)."""
    torch.autocast = autocast
    torch.amp.autocast = autocast
