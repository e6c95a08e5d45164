"""torch_xla's SPMD linear-model test, done right: Linear -> ReLU -> Linear -> Linear trained
20 SGD steps on 8 devices in three sharding modes, against torch eager on CPU."""

import copy

import numpy as np
import pytest
import torch

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


@pytest.mark.parametrize("mode", ["data", "fsdp", "megatron"])
def test_linear_model_matches_torch_eager(mode):
    eager = make_model()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    shard(lazy, mode)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_l = torch.optim.SGD(lazy.parameters(), lr=0.05)
    irt.reset_metrics()
    irt.CACHE.clear()
    losses_e, losses_l = [], []
    for x, y in batches():
        loss = torch.nn.functional.mse_loss(eager(x), y)
        loss.backward()
        opt_e.step()
        opt_e.zero_grad()
        losses_e.append(loss.item())

        xl, yl = irt.to_lazy(x), irt.to_lazy(y)
        irt.mark_sharding(xl, MESH, ("data", None))
        irt.mark_sharding(yl, MESH, ("data", None))
        loss_l = torch.nn.functional.mse_loss(lazy(xl), yl)
        loss_l.backward()
        opt_l.step()
        opt_l.zero_grad()
        irt.mark_step()
        losses_l.append(loss_l.item())
    np.testing.assert_allclose(losses_l, losses_e, rtol=1e-4, atol=1e-6)
    for pe, pl in zip(eager.parameters(), lazy.parameters(), strict=True):
        np.testing.assert_allclose(
            irt.to_torch(pl).numpy(), pe.detach().numpy(), rtol=1e-4, atol=1e-5
        )
    assert irt.metrics()["counters"]["CompileCount"] == 1
