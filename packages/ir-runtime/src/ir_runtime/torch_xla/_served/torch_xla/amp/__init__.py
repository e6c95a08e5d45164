"""``torch_xla.amp``: ``autocast`` on the ``xla`` device, the engine's mixed precision
(``torch.autocast("xla", dtype=...)``: bfloat16 by default)."""

from __future__ import annotations

import torch

import ir_runtime as _irt

_irt.install()


def autocast(device=None, enabled: bool = True, dtype=None, cache_enabled=None):
    """torch_xla's ``autocast(device, ...)``: the engine's autocast for the ``xla`` device;
    another device is torch's own."""
    kind = "xla" if device is None else torch.device(device).type
    return torch.autocast(kind, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


GradScaler = torch.amp.GradScaler
