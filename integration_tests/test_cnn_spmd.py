"""A CNN (Conv2d, BatchNorm2d, ReLU, MaxPool2d, Linear, cross-entropy) trained with SGD and
momentum on 8 devices, sharded on the batch, and with conv weights sharded on output
channels; against torch eager."""

import sys

import numpy as np
import pytest
import torch
from training import assert_same_parameters, train_side_by_side

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
STEPS = 6


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 4 * 4, 10),
    )


def batches():
    g = torch.Generator().manual_seed(2)
    return [
        (torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
        for _ in range(STEPS)
    ]


LOSS = torch.nn.functional.cross_entropy


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def shard(model, mode):
    if mode == "channels":  # conv weights split on their output channels
        irt.mark_sharding(model[0].weight, MESH, ("model", None, None, None))
        irt.mark_sharding(model[4].weight, MESH, ("model", None, None, None))


@pytest.mark.parametrize("mode", ["batch", "channels"])
@pytest.mark.parametrize("compiled", [False, True], ids=["mark_step", "compile_step"])
def test_cnn_matches_torch_eager(mode, compiled):
    eager, lazy, losses_e, losses_l = train_side_by_side(sys.modules[__name__], mode, compiled)
    np.testing.assert_allclose(losses_l, losses_e, rtol=2e-4, atol=1e-5)
    assert_same_parameters(eager, lazy, rtol=1e-3, atol=1e-4)
    for be, bl in zip(eager.buffers(), lazy.buffers(), strict=True):
        np.testing.assert_allclose(irt.to_torch(bl).numpy(), be.numpy(), rtol=1e-3, atol=1e-4)
    # Step 1 has no momentum buffers yet; every later step is the same program.
    counters = irt.metrics()["counters"]
    assert counters["CompileCount"] == 2
    if compiled:  # BatchNorm's running statistics are rebound by every replay too
        assert counters["StepReplay"] == len(batches()) - 3
