"""``install()``: the front end's changes to torch, made once.

Importing the modules below registers the handlers of the ops they own in the front end's own
tables; only ``install()`` touches torch: the Lazy dispatch key's kernels
(``torch.zeros(3, device="lazy")``), ``lazy`` among the devices torch's optimizers accept for
``capturable=True`` (their ``_get_value`` leaving a lent step count lazy),
``torch.manual_seed`` counted (a reseed restarts the lazy random stream),
``torch._lazy.mark_step`` / ``wait_device_ops`` running this package's, ``torch.autocast``
accepting ``device_type="lazy"``, ``torch.utils.checkpoint`` recomputing behind an
optimization barrier, with ``torch.lazy`` as the device module its RNG helpers use, and
transformers' warn-only padding check skipping lazy inputs (``_transformers``), and
``scaled_dot_product_attention`` recorded as one ``ir::attention`` op at the lazy device's
autograd key (``regions/_attention``), and ``layer_norm`` under autograd as the ops it is made
of there (``recording/_layer_norm``).

``import ir_runtime`` registers one thing: a fallback for torch's Lazy dispatch key, which only
an op with no kernel for that key reaches, where torch would raise. It calls ``on_lazy_key``:
the first tensor made on the lazy device (``torch.zeros(3, device="lazy")``, ``.to("lazy")``)
installs the front end, then is made by the kernel ``install()`` registered for it.
"""

from __future__ import annotations

import torch

from ir_runtime._dtypes import enable_x64
from ir_runtime._errors import DeviceMismatchError, UnsupportedOpError
from ir_runtime._frontend import _transformers
from ir_runtime._frontend.recording import (  # noqa: F401  (importing registers their handlers)
    _composites,
    _convert,
    _dispatch,
    _dynamic,
    _factories,
    _handlers,
    _layer_norm,
    _optim,
    _rng,
    _samplers,
)
from ir_runtime._frontend.regions import _attention, _autocast, _recompute
from ir_runtime._frontend.steps import _step

_INSTALLED = [False]


def install() -> None:
    """Install the front end into torch (see the module docstring); idempotent."""
    if _INSTALLED[0]:
        return
    enable_x64()
    _dispatch.configure_origins()
    _attention.install()
    _layer_norm.install()
    _autocast.install()
    _recompute.install()
    _factories.install()
    _optim.install()
    _rng.install()
    _step.install()
    _transformers.patch()
    _INSTALLED[0] = True


def name_device(kind: str) -> None:
    """Name the engine's device ``kind``: ``"lazy"`` (the default) or ``"xla"`` (what
    ``ir_runtime.torch_xla.install()`` asks, so tensors read ``xla:0`` as torch_xla's do). One
    engine under either name: a process uses one, chosen before the front end installs.

    Raises:
        DeviceMismatchError: the front end has installed under the other name (a tensor may
            exist on it), or ``kind`` is neither name.
    """
    if kind not in _convert.DISPATCH_KEYS:
        raise DeviceMismatchError(
            f"device name {kind!r}: the engine's device is named one of "
            f"{sorted(_convert.DISPATCH_KEYS)}"
        )
    if _convert.DEVICE.type == kind:
        return
    if _INSTALLED[0]:
        raise DeviceMismatchError(
            f"the engine's device is already named {_convert.DEVICE.type!r} in this process "
            f"(the front end installed under that name); name it {kind!r} before the first "
            f"lazy tensor: ir_runtime.torch_xla.install() first thing, or run the script "
            f"under python -m ir_runtime.torch_xla"
        )
    _convert.DEVICE = torch.device(kind, 0)


def on_lazy_key(keyset, op, *args, **kwargs):
    """torch's Lazy dispatch key's fallback (``import ir_runtime`` registers it; the XLA key's
    once the device is named "xla"): ``op`` reached the key with no kernel there. Install the
    front end, then run ``op`` on the kernel that registers for it; an op the front end has no
    kernel for either is refused, and so is a tensor made under the name the device does not
    have in this process."""
    install()
    name, kind = op.name(), _convert.DEVICE.type
    key = _convert.DISPATCH_KEYS[kind]
    if not keyset.has(getattr(torch._C.DispatchKey, key)):
        other = "xla" if kind == "lazy" else "lazy"
        raise DeviceMismatchError(
            f"ATen op {name} on device {other!r}: this process names the engine's device "
            f"{kind!r}, and one process uses one name (the same engine either way: "
            f"ir_runtime.torch_xla.install() names it 'xla', as torch_xla scripts expect); "
            f"use device={kind!r}"
        )
    if not torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
        raise UnsupportedOpError(
            f"ATen op {name} has no kernel for the {kind} device: tensors made on it directly "
            f"(torch.zeros(..., device='{kind}'), .to('{kind}')) come through the front end's "
            f"kernels, and this op has none. Make the tensor on the CPU and move it with "
            f".to('{kind}'), and report the op (with the model that needs it)"
        )
    return op.redispatch(keyset, *args, **kwargs)
