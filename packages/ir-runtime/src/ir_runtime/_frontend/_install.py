"""``install()``: the front end's changes to torch, made once.

Importing the modules below registers the handlers of the ops they own in the front end's own
tables; only ``install()`` touches torch: the Lazy dispatch key's kernels
(``torch.zeros(3, device="lazy")``), ``lazy`` among the devices torch's optimizers accept for
``capturable=True``, ``torch.manual_seed`` counted (a reseed restarts the lazy random stream),
``torch._lazy.mark_step`` / ``wait_device_ops`` running this package's, ``torch.autocast``
accepting ``device_type="lazy"``, and ``torch.utils.checkpoint`` recomputing behind an
optimization barrier, with ``torch.lazy`` as the device module its RNG helpers use.
"""

from __future__ import annotations

from ir_runtime._dtypes import enable_x64
from ir_runtime._frontend.recording import (  # noqa: F401  (importing registers their handlers)
    _dispatch,
    _dynamic,
    _factories,
    _handlers,
    _optim,
    _rng,
    _samplers,
)
from ir_runtime._frontend.regions import _autocast, _recompute
from ir_runtime._frontend.steps import _step

_INSTALLED = [False]


def install() -> None:
    """Install the front end into torch (see the module docstring); idempotent."""
    if _INSTALLED[0]:
        return
    enable_x64()
    _dispatch.configure_origins()
    _autocast.install()
    _recompute.install()
    _factories.install()
    _optim.install()
    _rng.install()
    _step.install()
    _INSTALLED[0] = True
