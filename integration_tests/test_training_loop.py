"""The training loop every real user writes, as a new user writes it from the READMEs: a tiny
Hugging Face Llama, tensor-parallel over "model" and data-parallel over "data" on the 4x2 mesh,
AdamW with transformers' cosine-with-warmup schedule, under compile_step; a checkpoint mid-run
resumed into a fresh model, optimizer and scheduler; save_pretrained loaded back into eager.
Oracle: the same loop in torch eager (dropout off)."""

import copy
import os

import hf_models
import numpy as np
import pytest
import torch
import transformers as tf

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
STEPS, WARMUP, RESUME_AT = 20, 3, 10
# The Megatron layout: projections into the heads and the MLP split by rows (column-parallel),
# the projections out of them by columns (row-parallel).
ROWS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
COLUMNS = ("o_proj", "down_proj")


def shard(model):
    for name, p in model.named_parameters():
        kind = name.split(".")[-2]
        if kind in ROWS:
            irt.mark_sharding(p, MESH, ("model", None))
        elif kind in COLUMNS:
            irt.mark_sharding(p, MESH, (None, "model"))
    return model


def batches():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 96, (8, 16), generator=g) for _ in range(STEPS)]


def training(model, lr):
    """``(step, optimizer, scheduler)``: the rate in a tensor and capturable=True on the lazy
    device (the documented recipe), a float on the CPU."""
    lazy = isinstance(lr, torch.Tensor)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, capturable=lazy)
    sched = tf.get_cosine_schedule_with_warmup(opt, WARMUP, STEPS)

    def step(ids):
        if lazy:
            irt.mark_sharding(ids, MESH, ("data", None))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        return loss.detach()

    return step, opt, sched


def counters():
    return dict(irt.metrics()["counters"])


def test_a_scheduled_llama_loop_replays_resumes_without_compiling_and_saves_for_eager(tmp_path):
    eager = hf_models.causal()
    lazy = shard(irt.to_lazy(copy.deepcopy(eager)))
    step_e, *_ = training(eager, 1e-3)
    step_l, opt, sched = training(lazy, torch.tensor(1e-3))
    compiled = irt.compile_step(step_l)
    ckpt = irt.CheckpointManager(tmp_path / "ckpt")
    want, got = [], []
    irt.reset_metrics()
    for k, ids in enumerate(batches()):
        want.append(step_e(ids).item())
        got.append(compiled(ids).item())
        if k + 1 == RESUME_AT:
            ckpt.save(RESUME_AT, {"model": lazy, "optim": opt, "sched": sched.state_dict()})
            later = counters()  # what the uninterrupted run compiles after the checkpoint
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    c = counters()
    assert compiled.replaying, compiled.reason or compiled.last_guard_failure
    assert c["StepTraced"] <= 3 and c["StepReplay"] == STEPS - c["StepTraced"]
    assert c["CompileCount"] <= 2  # the first step makes AdamW's state
    assert c["CompileCount"] == later["CompileCount"]

    # Resumed into a fresh model, optimizer and scheduler: the same losses, nothing compiled.
    fresh = shard(irt.to_lazy(hf_models.causal(seed=1)))
    step_r, opt_r, sched_r = training(fresh, torch.tensor(1e-3))
    state = {"model": fresh, "optim": opt_r, "sched": {}}
    assert ckpt.restore(None, state) == RESUME_AT
    sched_r.load_state_dict(state["sched"])
    resumed = irt.compile_step(step_r)
    irt.reset_metrics()
    again = [resumed(ids).item() for ids in batches()[RESUME_AT:]]
    np.testing.assert_allclose(again, got[RESUME_AT:], rtol=1e-6, atol=1e-7)
    c = counters()
    assert c.get("CompileCount", 0) == 0, c
    assert c["StepReplay"] >= STEPS - RESUME_AT - 3

    # save_pretrained as users call it; eager loads it, with the lazy model's logits.
    lazy.save_pretrained(tmp_path / "hf")
    loaded = tf.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    ids = batches()[0]
    with torch.no_grad():
        logits = irt.to_torch(lazy(input_ids=irt.to_lazy(ids)).logits)
        np.testing.assert_allclose(
            loaded(input_ids=ids).logits.numpy(), logits.numpy(), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            eager(input_ids=ids).logits.numpy(), logits.numpy(), rtol=1e-4, atol=1e-4
        )


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "torch-save"])
def test_save_pretrained_of_a_sharded_lazy_model_loads_into_eager_and_lazy(tmp_path, safe):
    """Tied embeddings (one tensor under two names) are saved once, as from eager."""
    eager = hf_models.causal(tie_word_embeddings=True)
    lazy = shard(irt.to_lazy(copy.deepcopy(eager)))
    assert lazy.lm_head.weight is lazy.model.embed_tokens.weight
    lazy.save_pretrained(tmp_path / "lazy", safe_serialization=safe)
    eager.save_pretrained(tmp_path / "eager", safe_serialization=safe)
    assert sorted(os.listdir(tmp_path / "lazy")) == sorted(os.listdir(tmp_path / "eager"))
    ids = batches()[0]
    want = eager(input_ids=ids).logits.detach().numpy()
    loaded = tf.LlamaForCausalLM.from_pretrained(tmp_path / "lazy")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    np.testing.assert_array_equal(loaded(input_ids=ids).logits.detach().numpy(), want)
    again = shard(irt.to_lazy(tf.LlamaForCausalLM.from_pretrained(tmp_path / "lazy")))
    got = irt.to_torch(again(input_ids=irt.to_lazy(ids)).logits.detach())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
