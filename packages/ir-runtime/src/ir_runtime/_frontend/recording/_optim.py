"""torch's optimizers with ``capturable=True`` on the lazy device, as torch allows on ``xla``.

A capturable optimizer keeps its step counts on the parameters' device and computes Adam's bias
corrections there, so a step's program reads them as tensors instead of Python numbers that
change every step: what a compiled step (``compile_step``) needs to be replayed. torch checks
the device type against a fixed list; this adds ``lazy`` to it, in every optimizer module that
consults it."""

from __future__ import annotations

import importlib

from ir_runtime._frontend.recording._convert import DEVICE

_MODULES = (
    "optimizer",
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
        return [*base(supports_xla), DEVICE.type]

    supported._lazy_device = True
    for name in _MODULES:
        module = importlib.import_module(f"torch.optim.{name}")
        if hasattr(module, "_get_capturable_supported_devices"):
            module._get_capturable_supported_devices = supported
