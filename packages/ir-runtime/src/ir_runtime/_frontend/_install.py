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
autograd key (``regions/_attention``).

``import ir_runtime`` registers one thing: a fallback for torch's Lazy dispatch key, which only
an op with no kernel for that key reaches, where torch would raise. It calls ``on_lazy_key``:
the first tensor made on the lazy device (``torch.zeros(3, device="lazy")``, ``.to("lazy")``)
installs the front end, then is made by the kernel ``install()`` registered for it.
"""

from __future__ import annotations

import torch

from ir_runtime._dtypes import enable_x64
from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend import _transformers
from ir_runtime._frontend.recording import (  # noqa: F401  (importing registers their handlers)
    _composites,
    _dispatch,
    _dynamic,
    _factories,
    _handlers,
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
    _autocast.install()
    _recompute.install()
    _factories.install()
    _optim.install()
    _rng.install()
    _step.install()
    _transformers.patch()
    _INSTALLED[0] = True


def on_lazy_key(keyset, op, *args, **kwargs):
    """torch's Lazy dispatch key's fallback (``import ir_runtime`` registers it): ``op`` reached
    the key with no kernel there. Install the front end, then run ``op`` on the kernel that
    registers for it; an op the front end has no kernel for either is refused."""
    install()
    name = op.name()
    if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "Lazy"):
        raise UnsupportedOpError(
            f"ATen op {name} has no kernel for the lazy device: tensors made on it directly "
            f"(torch.zeros(..., device='lazy'), .to('lazy')) come through the front end's "
            f"kernels, and this op has none. Make the tensor on the CPU and move it with "
            f".to('lazy'), and report the op (with the model that needs it)"
        )
    return op.redispatch(keyset, *args, **kwargs)
