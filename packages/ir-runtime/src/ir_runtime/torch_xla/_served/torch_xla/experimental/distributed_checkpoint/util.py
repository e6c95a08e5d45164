"""``prime_optimizer``: an optimizer's state made before a checkpoint is loaded into it."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

import torch_xla
import torch_xla.core.xla_model as xm


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Run one update with zero gradients (each placed as its parameter), so that the
    optimizer's state exists for DCP to load into in place. It changes the state (and, with
    weight decay, the parameters): call it only right before a restore overwrites them."""
    torch_xla.sync()
    xm.wait_device_ops()

    def zero_grad(x):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            x.grad = torch.zeros_like(x, requires_grad=False)
            spec = x._spec if hasattr(x, "_spec") else None
            if spec is not None:
                from ir_runtime._frontend.recording._api import annotate

                annotate(x.grad, spec)

    tree_map(zero_grad, optimizer.param_groups)
    optimizer.step()
    torch_xla.sync()
    xm.wait_device_ops()
    return optimizer
