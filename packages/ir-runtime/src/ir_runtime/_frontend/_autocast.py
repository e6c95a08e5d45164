"""``torch.autocast`` with ``device_type="lazy"``.

torch refuses the lazy device as an autocast device type, even to turn autocast off, and
Hugging Face models do exactly that around their rotary embeddings
(``torch.autocast(device_type=x.device.type, enabled=False)``). The lazy device runs no
autocast of its own, so a region that turns it off needs nothing and changes nothing. A region
that turns it on is refused with an error saying so: lazy tensors compute in the dtypes they
have.
"""

from __future__ import annotations

import torch

from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend._convert import DEVICE

_TORCH_AUTOCAST = torch.amp.autocast_mode.autocast


class autocast(_TORCH_AUTOCAST):
    """torch's ``autocast``, accepting ``device_type="lazy"`` when ``enabled=False``: a region
    that changes nothing (not even CPU autocast, which host tensors inside it still meet)."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self._lazy_off = device_type == DEVICE.type
        if self._lazy_off:
            if enabled:
                raise UnsupportedOpError(
                    "torch.autocast(device_type='lazy') with enabled=True: the lazy device "
                    "runs no autocast; cast the model and inputs to the dtype you want "
                    "(model.to(torch.bfloat16)) instead"
                )
            device_type = "cpu"
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def __enter__(self):
        return self if self._lazy_off else super().__enter__()

    def __exit__(self, *exc):
        return False if self._lazy_off else super().__exit__(*exc)


def install() -> None:
    """``torch.autocast`` and ``torch.amp.autocast`` accept the lazy device (above)."""
    torch.autocast = autocast
    torch.amp.autocast = autocast
