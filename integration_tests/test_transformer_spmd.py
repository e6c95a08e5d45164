"""A small causal transformer (Embedding, LayerNorm, multi-head attention, GELU MLP) trained 10
steps with AdamW and gradient clipping on a 2D (data x model) mesh, its MLPs split Megatron-style
or every parameter's first dim over both axes (FSDP); against torch eager. The suite's watch on
XLA's log fails either on a partitioner's involuntary full rematerialization."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
VOCAB, DIM, HEADS, SEQ, BATCH, STEPS = 32, 16, 2, 8, 8, 10


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, dropout=0.0, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        mask = torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1).to(x.device)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        positions = torch.arange(SEQ).to(idx.device)
        x = self.tok(idx) + self.pos(positions)
        return self.head(self.ln(self.blocks(x)))


def batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


def step(model, opt, tokens):
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return loss


def megatron(model):
    for block in model.blocks:  # the MLP over "model"
        irt.mark_sharding(block.mlp[0].weight, MESH, ("model", None))
        irt.mark_sharding(block.mlp[2].weight, MESH, (None, "model"))


def fsdp(model):
    # Every parameter's first dim over every device: the embedding tables split over their
    # rows, the biases and norm weights split too (whose gradients leave the activations'
    # gradients split over their hidden dim, meeting the ids' batch split at the embedding).
    for p in model.parameters():
        irt.mark_sharding(p, MESH, (("data", "model"),) + (None,) * (p.dim() - 1))


@pytest.mark.parametrize("place", [megatron, fsdp], ids=["megatron", "fsdp"])
@pytest.mark.parametrize("compiled", [False, True], ids=["mark_step", "compile_step"])
def test_transformer_matches_torch_eager(compiled, place):
    torch.manual_seed(0)
    eager = TinyGPT()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    place(lazy)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    # Compiled: AdamW keeps its step counts on the lazy device, so its bias corrections are
    # computed in the program instead of changing Python numbers a replay could not follow.
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-2, capturable=compiled)

    def lazy_step(tokens):
        t = irt.to_lazy(tokens)
        irt.mark_sharding(t, MESH, ("data", None))
        return step(lazy, opt_l, t)

    run = irt.compile_step(lazy_step) if compiled else lambda t: (lazy_step(t), irt.mark_step())[0]
    irt.reset_metrics()
    losses_e, losses_l = [], []
    for tokens in batches():
        losses_e.append(step(eager, opt_e, tokens).item())
        losses_l.append(run(tokens).item())
    np.testing.assert_allclose(losses_l, losses_e, rtol=2e-4, atol=1e-5)
    for (name, pe), pl in zip(eager.named_parameters(), lazy.parameters(), strict=True):
        got, want = irt.to_torch(pl).numpy(), pe.detach().numpy()
        if name.endswith("attn.in_proj_bias"):
            # The key bias gets an exactly-zero gradient in theory (softmax ignores a constant
            # per query); AdamW divides its rounding noise by its own size, so on either side it
            # moves by up to lr per step in a direction set by noise. Compare the query and
            # value biases tightly, and bound the key bias's drift.
            k = slice(DIM, 2 * DIM)
            np.testing.assert_allclose(
                np.delete(got, np.s_[k]), np.delete(want, np.s_[k]), rtol=2e-3, atol=2e-4
            )
            assert np.abs(got[k] - want[k]).max() <= 1e-2 * STEPS
            continue
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4, err_msg=name)
    # Step 1 creates AdamW's state; every later step is one program, whatever the step's
    # learning-rate and bias-correction scalars.
    counters = irt.metrics()["counters"]
    assert counters["CompileCount"] == 2
    if compiled:
        assert counters["StepReplay"] == STEPS - 3
