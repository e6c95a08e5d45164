"""Hugging Face models under torch.compile(backend="ir_runtime"), against the same models in
torch eager: Llama, GPT-2, BERT and T5 built from small configs (dropout off, so eager is an
exact oracle), 5 AdamW steps (eager's losses at rtol 1e-4), then inference. On plain CPU
tensors (every parameter after the steps; each compiles its programs once), and on lazy
tensors placed on the 4x2 mesh (fully_shard, a tp_plan, a sharded batch under compile_step)."""

import copy

import hf_models
import numpy as np
import pytest
import torch
import transformers
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import ir_runtime as irt

MODELS = {
    "llama": hf_models.causal,
    "gpt2": hf_models.gpt2,
    "bert": hf_models.bert,
    "t5": hf_models.t5,
}


def _loss(compiled, ids, labels):
    """``hf_models.loss_of`` through the compiled module (which is not of the model's class)."""
    if isinstance(compiled._orig_mod, transformers.BertForSequenceClassification):
        return compiled(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
    return compiled(input_ids=ids, labels=ids).loss


def _eager_step(model, opt, ids, labels):
    """One AdamW step of the eager oracle; its loss."""
    loss = hf_models.loss_of(model, ids, labels)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize("name", MODELS)
def test_a_hugging_face_model_trains_and_infers_as_eager(name):
    torch._dynamo.reset()
    eager = MODELS[name]().train()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="ir_runtime", dynamic=False)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_c = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    irt.reset_metrics()
    for k in range(5):
        ids, labels = torch.randint(1, 96, (4, 8), generator=g), torch.randint(0, 3, (4,))
        want = _eager_step(eager, opt_e, ids, labels)
        got = _loss(compiled, ids, labels)
        got.backward()
        opt_c.step()
        opt_c.zero_grad()
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-4)
        if k == 0:
            first = irt.metrics()["counters"]["CompileCount"]
    assert first > 0 and irt.metrics()["counters"]["CompileCount"] == first  # none after step 1
    for (n, pe), pc in zip(eager.named_parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(pc.detach().numpy(), pe.detach().numpy(), atol=2e-5, err_msg=n)
    eager.eval(), model.eval()
    with torch.no_grad():
        ids = torch.randint(1, 96, (4, 8), generator=g)
        kw = {"input_ids": ids}
        if name == "t5":
            kw["decoder_input_ids"] = ids
        np.testing.assert_allclose(
            compiled(**kw).logits.numpy(), eager(**kw).logits.numpy(), rtol=1e-4, atol=1e-5
        )


MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def test_a_lazy_llama_sharded_4x2_under_torch_compile_trains_as_eager():
    """Lazy inputs: Dynamo captures the lazy Llama in one graph per pass, whose ops are
    recorded on the lazy device with the batch's sharding; compile_step replays the step;
    eager's losses."""
    torch._dynamo.reset()
    eager = hf_models.causal().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    compiled = torch.compile(lazy, backend="ir_runtime")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-3)

    @irt.compile_step
    def step(ids):
        irt.mark_sharding(ids, MESH, ("data", None))
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        return loss

    g = torch.Generator().manual_seed(0)
    irt.reset_metrics()
    for _ in range(5):
        ids = torch.randint(1, 96, (4, 8), generator=g)
        want = _eager_step(eager, opt_e, ids, None)
        got = irt.to_torch(step(irt.to_lazy(ids)))
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-4)
    c = irt.metrics()["counters"]
    assert step.replaying and c["StepReplay"] == 2  # (after 3 traces)
    assert c["DynamoLazyCalls"] > 0


def test_a_lazy_llama_placed_by_its_tp_plan_under_torch_compile_trains_as_eager():
    """Parameters placed on a 4x2 DeviceMesh by the model's own tp_plan, the batch by
    distribute_tensor; the plan's hooks place activations between Dynamo's graphs; each step
    runs at mark_step with eager's losses."""
    torch._dynamo.reset()
    mesh = irt.device_mesh((4, 2), ("dp", "tp"))
    eager = hf_models.causal().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    irt.apply_tp_plan(lazy, mesh)
    assert lazy.model.layers[0].self_attn.o_proj.weight.placements == (Shard(1),)
    compiled = torch.compile(lazy, backend="ir_runtime")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    irt.reset_metrics()
    for _ in range(5):
        ids = torch.randint(1, 96, (4, 8), generator=g)
        want = _eager_step(eager, opt_e, ids, None)
        batch = distribute_tensor(ids, mesh, [Shard(0), Replicate()])
        loss = compiled(input_ids=batch, labels=batch).loss
        loss.backward()
        opt_l.step()
        opt_l.zero_grad()
        irt.mark_step()
        np.testing.assert_allclose(irt.to_torch(loss).item(), want.item(), rtol=1e-4)
    c = irt.metrics()["counters"]
    assert c["DynamoLazyCalls"] > 0 and c["CompileCount"] <= 3  # (steps 1 and 2 differ)


# Each model's blocks, which fully_shard places (the embeddings and heads stay whole: BERT's
# 2 token types and 3 labels do not split over 4).
BLOCKS = {
    "llama": ["model.layers"],
    "gpt2": ["transformer.h"],
    "bert": ["bert.encoder.layer"],
    "t5": ["encoder.block", "decoder.block"],
}


@pytest.mark.parametrize("name", MODELS)
def test_a_lazy_hugging_face_model_placed_on_the_4x2_mesh_trains_and_infers_as_eager(name):
    """The four models on lazy tensors, their blocks' parameters placed by FSDP2's fully_shard
    over the mesh's "dp" dim and the batch by distribute_tensor: Dynamo captures them on the lazy
    tensors, each step runs SPMD at mark_step (forward and backward one program there) with
    eager's losses; then inference."""
    from torch.distributed.fsdp import fully_shard

    torch._dynamo.reset()
    mesh = irt.device_mesh((4, 2), ("dp", "tp"))
    eager = MODELS[name]().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    for path in BLOCKS[name]:
        for block in lazy.get_submodule(path):
            fully_shard(block, mesh=mesh["dp"])
    placed = [p for p in lazy.parameters() if p.placements == (Shard(0),)]
    assert len(placed) > len(list(lazy.parameters())) // 2
    compiled = torch.compile(lazy, backend="ir_runtime")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_l = torch.optim.AdamW(lazy.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(2)
    irt.reset_metrics()

    def batch(t):
        return distribute_tensor(t, mesh, [Shard(0), Replicate()])

    for _ in range(5):
        ids, labels = torch.randint(1, 96, (4, 8), generator=g), torch.randint(0, 3, (4,))
        want = _eager_step(eager, opt_e, ids, labels)
        got = _loss(compiled, batch(ids), batch(labels))
        got.backward()
        opt_l.step()
        opt_l.zero_grad()
        irt.mark_step()
        np.testing.assert_allclose(irt.to_torch(got).item(), want.item(), rtol=1e-4)
    assert irt.metrics()["counters"]["DynamoLazyCalls"] >= 10  # (forward and backward, 5x)
    eager.eval(), lazy.eval()
    ids = torch.randint(1, 96, (4, 8), generator=g)
    kw = {"input_ids": ids}
    if name == "t5":
        kw["decoder_input_ids"] = ids
    with torch.no_grad():
        got = compiled(**{k: batch(v) for k, v in kw.items()}).logits
        np.testing.assert_allclose(
            irt.to_torch(got).numpy(), eager(**kw).logits.numpy(), rtol=1e-4, atol=1e-5
        )
