"""Diagnostics on a real model: a tiny Hugging Face Llama's nodes name transformers' own source
lines, in the StableHLO and in the explanation of a recompile when the sequence grows; and a
manual region (shard_map) inside it trains like eager."""

import copy
import os

import hf_models
import numpy as np
import pytest
import torch

import ir_runtime as irt
from ir_core import DeviceData, post_order

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


@pytest.fixture
def debug():
    irt.set_debug(True)
    yield
    irt.set_debug(False)


@pytest.mark.rematerializes
def test_the_suite_sees_xla_rematerialize_a_value_in_full():
    """The watch every test here runs under (conftest's ``pytest_runtest_call``)
    sees the partitioner's fallback: a slice across the shards of one axis, placed over
    another, which XLA can only reach by replicating it first. The values stay right."""
    from conftest import REMATERIALIZED, StderrAtFd

    host = torch.randn(8, 16, 1024)
    x = irt.to_lazy(host)
    irt.mark_sharding(x, MESH, (None, None, ("data", "model")))
    y = x[:, :, 40:424] * 2
    irt.mark_sharding(y, MESH, ("data", None, None))
    with StderrAtFd() as err:
        irt.mark_step()
    assert REMATERIALIZED in err.text
    torch.testing.assert_close(y.cpu(), host[:, :, 40:424] * 2)


def test_a_llama_step_names_transformers_lines_and_explains_a_recompile(debug, capsys):
    model = irt.to_lazy(hf_models.causal("llama").eval())
    logits = {}
    for length in (8, 9):
        ids = irt.to_lazy(torch.randint(1, 96, (4, length)))
        irt.mark_sharding(ids, MESH, ("data", None))
        with torch.no_grad():
            logits[length] = model(ids).logits
        if length == 8:
            nodes = [n for n in post_order([logits[8]._ir]) if type(n) is not DeviceData]
            files = {os.path.basename(n.origin.filename) for n in nodes if n.origin is not None}
            assert "modeling_llama.py" in files  # the model's own source, not torch's
            assert not any("/torch/" in n.origin.filename for n in nodes if n.origin is not None)
            text = irt.dump(logits[8], format="stablehlo")
            assert "modeling_llama.py" in text and "LlamaMLP.forward:aten::" in text
        irt.mark_step()
    err = capsys.readouterr().err
    assert "differs from compile" in err and "modeling_llama.py:" in err
    assert "was int64[4, 8], now int64[4, 9] (a growing sequence?" in err


def _column_then_row(x, w1, w2):
    """A Megatron MLP block by hand: column-parallel up, row-parallel down, one all-reduce."""
    return irt.all_reduce(torch.nn.functional.gelu(x @ w1) @ w2, "model")


def test_a_manual_megatron_block_in_a_training_loop_equals_eager():
    torch.manual_seed(0)
    d, h = 16, 64
    eager = torch.nn.ModuleDict(
        {"up": torch.nn.Linear(d, h, bias=False), "down": torch.nn.Linear(h, d, bias=False)}
    )
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.mark_sharding(lazy.up.weight, MESH, ("model", None))
    irt.mark_sharding(lazy.down.weight, MESH, (None, "model"))
    block = irt.shard_map(
        _column_then_row, MESH, in_specs=(("data", None), (None, "model"), ("model", None)),
        out_specs=("data", None),
    )  # fmt: skip
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-2, capturable=True)

    @irt.compile_step
    def step(x):
        y = block(x, lazy.up.weight.t(), lazy.down.weight.t())
        loss = (y - x).square().mean()
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        return loss

    for k in range(6):
        x = torch.randn(8, d, generator=torch.Generator().manual_seed(k))
        want = (eager.down(torch.nn.functional.gelu(eager.up(x))) - x).square().mean()
        want.backward()
        opt_e.step()
        opt_e.zero_grad()
        lx = irt.to_lazy(x)
        irt.mark_sharding(lx, MESH, ("data", None))
        torch.testing.assert_close(irt.to_torch(step(lx)), want.detach(), rtol=1e-5, atol=1e-6)
    assert step.replaying, step.reason or step.last_guard_failure
    for name in ("up", "down"):
        torch.testing.assert_close(
            irt.to_torch(lazy[name].weight), eager[name].weight.detach(), rtol=1e-5, atol=1e-6
        )
