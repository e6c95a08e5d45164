"""``torch.autocast`` with ``device_type="lazy"``.

torch refuses the lazy device as an autocast device type, even to turn autocast off, and
Hugging Face models do exactly that around their rotary embeddings
(``torch.autocast(device_type=x.device.type, enabled=False)``). The lazy device runs no
autocast of its own, so a region that turns it off needs nothing: it is entered as a region
that turns CPU autocast off (which lazy tensors never meet). A region that turns it on is
refused with an error saying so: lazy tensors compute in the dtypes they have.
"""

from __future__ import annotations

import torch

from ir_runtime._errors import UnsupportedOpError
from ir_runtime._frontend._convert import DEVICE

_TORCH_AUTOCAST = torch.amp.autocast_mode.autocast


class autocast(_TORCH_AUTOCAST):
    """torch's ``autocast``, accepting ``device_type="lazy"`` when ``enabled=False``."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == DEVICE.type:
            if enabled:
                raise UnsupportedOpError(
                    "torch.autocast(device_type='lazy') with enabled=True: the lazy device "
                    "runs no autocast; cast the model and inputs to the dtype you want "
                    "(model.to(torch.bfloat16)) instead"
                )
            device_type = "cpu"
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def install() -> None:
    """``torch.autocast`` and ``torch.amp.autocast`` accept the lazy device (above)."""
    torch.autocast = autocast
    torch.amp.autocast = autocast
