"""``torch_xla.utils.checkpoint``: torch's activation checkpointing, which the engine
recomputes behind an optimization barrier on its device (``torch.utils.checkpoint``)."""

from __future__ import annotations

import torch.utils.checkpoint as _torch_checkpoint

import ir_runtime as _irt

_irt.install()  # (torch's checkpoint routed through the engine's recompute)


def checkpoint(function, *args, use_reentrant=None, **kwargs):
    if use_reentrant is None:
        use_reentrant = True  # torch_xla's default
    return _torch_checkpoint.checkpoint(function, *args, use_reentrant=use_reentrant, **kwargs)


checkpoint_sequential = _torch_checkpoint.checkpoint_sequential
