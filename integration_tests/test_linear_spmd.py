"""torch_xla's SPMD linear-model test, done right: Linear -> ReLU -> Linear -> Linear trained
20 SGD steps on 8 devices in three sharding modes, against torch eager on CPU."""

import sys

import numpy as np
import pytest
import torch
from training import assert_same_parameters, train_side_by_side

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
STEPS = 20


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)
    )


def batches():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(64, 16, generator=g), torch.randn(64, 8, generator=g)) for _ in range(STEPS)
    ]


LOSS = torch.nn.functional.mse_loss


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05)


def shard(model, mode):
    if mode == "data":
        return
    if mode == "fsdp":  # every weight split on its first dim over all devices
        for layer in (model[0], model[2], model[3]):
            irt.mark_sharding(layer.weight, MESH, (("data", "model"), None))
    if mode == "megatron":  # column-parallel, then row-parallel
        irt.mark_sharding(model[0].weight, MESH, ("model", None))
        irt.mark_sharding(model[0].bias, MESH, ("model",))
        irt.mark_sharding(model[2].weight, MESH, (None, "model"))


@pytest.mark.parametrize("compiled", [False, True], ids=["mark_step", "compile_step"])
@pytest.mark.parametrize("mode", ["data", "fsdp", "megatron"])
def test_linear_model_matches_torch_eager(mode, compiled):
    eager, lazy, losses_e, losses_l = train_side_by_side(sys.modules[__name__], mode, compiled)
    np.testing.assert_allclose(losses_l, losses_e, rtol=1e-4, atol=1e-6)
    assert_same_parameters(eager, lazy, rtol=1e-4, atol=1e-5)
    counters = irt.metrics()["counters"]
    assert counters["CompileCount"] == 1
    if compiled:  # two steps traced, the rest replayed
        assert (counters["StepTraced"], counters["StepReplay"]) == (2, STEPS - 2)
