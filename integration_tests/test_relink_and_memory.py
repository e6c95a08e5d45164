"""Annotating a value that later ops already read (PR #4555's open case), and memory over a long
training loop."""

import gc
import os
import re

import numpy as np
import pytest
import torch
from training import compiled_step, lazy_step

import ir_runtime as irt
from ir_runtime._frontend import inspect

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def test_annotating_a_value_already_read_relinks_its_consumers():
    torch.manual_seed(0)
    x, w = torch.randn(8, 4), torch.randn(4, 6)
    lx, lw = irt.to_lazy(x), irt.to_lazy(w)
    h = lx @ lw
    a = torch.relu(h)
    b = h * 3.0
    irt.mark_sharding(h, MESH, ("data", None))  # after a and b were recorded
    text = irt.dump([a, b], format="stablehlo")
    assert len(re.findall(r"stablehlo\.dot_general", text)) == 1  # h computed once
    assert "sharding_constraint" in text and "data" in text
    graph = irt.dump([a, b])
    assert graph.count("aten::mm.default") == 1
    assert "sharding=ShardingSpec" in graph
    np.testing.assert_allclose(irt.to_torch(a).numpy(), torch.relu(x @ w).numpy(), rtol=1e-5)
    np.testing.assert_allclose(irt.to_torch(b).numpy(), (x @ w * 3.0).numpy(), rtol=1e-5)
    np.testing.assert_allclose(irt.to_torch(h).numpy(), (x @ w).numpy(), rtol=1e-5)


def test_a_bad_annotation_changes_nothing():
    lx = irt.to_lazy(torch.ones(8, 4))
    h = lx * 2.0
    before = inspect.value_of(h)
    for bad in [("data",), ("nope", None), ("data", "data")]:
        try:
            irt.mark_sharding(h, MESH, bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"{bad} was accepted")
        assert inspect.value_of(h) is before and inspect.annotation_of(h) is None
    np.testing.assert_array_equal(irt.to_torch(h).numpy(), np.full((8, 4), 2.0, np.float32))


def _rss_mb():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("compiled", [False, True], ids=["mark_step", "compile_step"])
def test_500_steps_do_not_grow_memory(compiled):
    torch.manual_seed(0)
    model = irt.to_lazy(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    )
    irt.mark_sharding(model[0].weight, MESH, ("model", None))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(64, 16), torch.randn(64, 8)
    marks = {}
    loss_fn = torch.nn.functional.mse_loss
    step_fn = compiled_step(model, opt, loss_fn, MESH) if compiled else None
    for step in range(500):
        if compiled:
            step_fn(x, y)
        else:
            lazy_step(model, opt, loss_fn, x, y, MESH)
        if step in (99, 499):
            gc.collect()
            marks[step] = (_rss_mb(), len(inspect.live_tensors()))
    grown = marks[499][0] - marks[99][0]
    assert grown < 40, f"RSS grew {grown:.1f} MB from step 100 to 500"
    assert marks[499][1] <= marks[99][1] + 5, marks  # no lazy tensors pile up
