"""torch's optimizers with ``capturable=True`` on the lazy device, as torch allows on ``xla``.

A capturable optimizer keeps its step counts on the parameters' device and computes Adam's bias
corrections there, so a step's program reads them as tensors instead of Python numbers that
change every step: what a compiled step (``compile_step``) needs to be replayed. torch checks
the device type against a fixed list; this adds ``lazy`` to it, in every optimizer module that
consults it. Each module's ``_get_value`` (a step count or rate read as a Python number) leaves
a lazy tensor as it is while a compiled step's trace lends the optimizer its hyperparameters
(``steps._lend``): Adagrad, which has no capturable form, keeps its step count in the program.

torch's single-tensor Adam with ``capturable=True`` divides by the step size, so a learning rate
of 0 (the first step of every warmup schedule) turns each parameter whose second moment is 0 (an
embedding row never used) into NaN. On CUDA torch takes the multi-tensor (``foreach``) form,
which multiplies instead, as eager's non-capturable form does; on the lazy device a capturable
Adam takes that form too."""

from __future__ import annotations

import importlib

from ir_runtime._frontend.recording import _convert
from ir_runtime._frontend.recording._tensor import LazyTensor

_MODULES = (
    "optimizer",
    "adagrad",
    "adam",
    "adamw",
    "adamax",
    "adadelta",
    "asgd",
    "nadam",
    "radam",
    "rmsprop",
    "rprop",
)


def install() -> None:
    """Add the lazy device to the capturable devices of every torch optimizer module."""
    base = importlib.import_module("torch.optim.optimizer")._get_capturable_supported_devices
    if getattr(base, "_lazy_device", False):
        return

    def supported(supports_xla: bool = True) -> list[str]:
        return [*base(supports_xla), _convert.DEVICE.type]

    supported._lazy_device = True
    from ir_runtime._frontend.steps._lend import get_value

    adam = importlib.import_module("torch.optim.adam")
    adam._single_tensor_adam = _as_cuda_does(adam._single_tensor_adam, adam._multi_tensor_adam)
    for name in _MODULES:
        module = importlib.import_module(f"torch.optim.{name}")
        if hasattr(module, "_get_capturable_supported_devices"):
            module._get_capturable_supported_devices = supported
        if hasattr(module, "_get_value"):  # (a step count stays in the program: _lend)
            module._get_value = get_value(module._get_value)


def _as_cuda_does(single, multi):
    """torch's single-tensor Adam, but for a capturable one on the lazy device: the
    multi-tensor form (the same arguments), whose learning rate of 0 gives no NaN."""

    def adam(params, *args, capturable=False, differentiable=False, **kwargs):
        chosen = single
        if capturable and not differentiable and params and type(params[0]) is LazyTensor:
            chosen = multi
        return chosen(params, *args, capturable=capturable, differentiable=differentiable, **kwargs)

    return adam
