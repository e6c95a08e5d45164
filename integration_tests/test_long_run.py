"""A long training run with everything a big model needs at once, on the 4x2 mesh: a small
transformer whose blocks run through scan_layers (their tensors per layer, and stored stacked by
stack_layers), a checkpointed head, bfloat16 autocast, AdamW (capturable) under compile_step
with donated buffers. It must stay flat: no compile after the first steps, the same live device
bytes and no growing process memory; stacked, it logs the losses the per-layer run logs."""

import resource

import jax
import numpy as np
import pytest
import torch
import torch.utils.checkpoint as checkpoint

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
STEPS = 2000


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


class Model(torch.nn.Module):
    def __init__(self, vocab=64, d=32, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.head = torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab))

    def forward(self, ids):
        h = irt.scan_layers(self.blocks, self.embed(ids))
        return checkpoint.checkpoint(self.head, h, use_reentrant=False)


def live_device_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


LOSSES: dict = {}  # stacked -> the losses each run logged


@pytest.mark.parametrize("stacked", [False, True], ids=["per-layer", "stacked"])
def test_two_thousand_steps_stay_flat(stacked):
    torch.manual_seed(0)
    model = irt.to_lazy(Model().train())
    for block in model.blocks:
        irt.mark_sharding(block.up.weight, MESH, ("model", None))
        irt.mark_sharding(block.down.weight, MESH, (None, "model"))
    if stacked:
        irt.stack_layers(model.blocks)
        assert model.blocks.up__weight.shape == (4, 128, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)

    @irt.compile_step
    def step(ids):
        with torch.autocast("lazy", dtype=torch.bfloat16):
            logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 64, (8, 17), generator=g) for _ in range(16)]
    losses, marks = [], {}
    irt.reset_metrics()
    for k in range(STEPS):
        ids = irt.to_lazy(batches[k % len(batches)])
        irt.mark_sharding(ids, MESH, ("data", None))
        loss = step(ids)
        if k % 100 == 0:
            losses.append(irt.to_torch(loss).item())
        if k in (2, 200, STEPS - 100):  # (each after its loss was read, as at the others)
            irt.wait_device_ops()
            c = irt.metrics()["counters"]
            marks[k] = (c["CompileCount"], live_device_bytes(), rss_mib())
    c = irt.metrics()["counters"]
    assert step.replaying and c["StepReplay"] >= STEPS - 3
    assert c["DonatedBuffers"] > 0
    end = STEPS - 100
    assert marks[2][0] == marks[end][0] == c["CompileCount"], marks  # no compile after step 2
    assert marks[200][1] == marks[end][1], marks  # the same device buffers alive
    assert marks[end][2] - marks[200][2] < 64, marks  # process memory flat (MiB)
    assert losses[-1] < losses[0]  # and it learns
    LOSSES[stacked] = losses
    if len(LOSSES) == 2:  # (both ran, in this process): the same run, stored two ways, to
        # one bfloat16 step (the loss is bfloat16; 2,000 steps of summation orders apart)
        np.testing.assert_allclose(LOSSES[True], LOSSES[False], rtol=2**-7)
