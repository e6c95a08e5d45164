"""Hugging Face models trained on the lazy device under compile_step, on the 4x2 mesh with the
batch sharded over "data": tiny Llama, Qwen2, Mistral (a sliding window shorter than the
sequence), BERT, T5, GPT-2 (a pad token and no attention mask: transformers' padding check reads
no lazy data) and ViT (images) built from their configs (no weights downloaded, dropout off so
eager is an exact oracle). Every one replays, with eager's losses."""

import copy

import hf_models
import numpy as np
import pytest
import torch

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def llama():
    return hf_models.causal("llama")


def qwen2():
    return hf_models.causal("qwen2")


def mistral():  # (a window shorter than the batch's sequence: the sliding mask is in play)
    return hf_models.causal("mistral", sliding_window=4)


bert, t5, gpt2 = hf_models.bert, hf_models.t5, hf_models.gpt2


MODELS = [llama, qwen2, mistral, bert, t5, gpt2, hf_models.vit]


@pytest.mark.parametrize("make", MODELS, ids=lambda f: f.__name__)
def test_a_hugging_face_model_trains_under_compile_step_and_replays(make):
    eager = make().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    step = hf_models.training_step(eager, lazy)
    compiled = irt.compile_step(step)
    irt.reset_metrics()
    for _ in range(5):
        ids, labels = torch.randint(1, 96, (4, 8)), torch.randint(0, 3, (4,))
        if make is hf_models.vit:
            ids = torch.randn(4, 3, 16, 16)
        want = step(eager, ids, labels)
        lids, llabels = irt.to_lazy(ids), irt.to_lazy(labels)
        irt.mark_sharding(lids, MESH, ("data",) + (None,) * (lids.dim() - 1))
        got = compiled(lazy, lids, llabels)
        torch.testing.assert_close(irt.to_torch(got), want, rtol=1e-5, atol=1e-5)
    counters = irt.metrics()["counters"]
    assert compiled.replaying, compiled.reason or compiled.last_guard_failure
    assert (counters["StepTraced"], counters["StepReplay"]) == (3, 2)
    assert counters.get("StepGuardFailed", 0) == 0


def test_a_padding_check_that_only_warns_reads_no_data_under_mark_step():
    """GPT-2 without an attention mask: one program per step, no value read to the host."""
    eager = gpt2().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    step = hf_models.training_step(eager, lazy)
    for _ in range(2):
        ids = torch.randint(1, 96, (4, 8))
        want = step(eager, ids, None)
        irt.reset_metrics()
        got = step(lazy, irt.to_lazy(ids), None)
        irt.mark_step()
        assert irt.metrics()["counters"].get("HostRead", 0) == 0
        torch.testing.assert_close(irt.to_torch(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_gradient_checkpointing_of_a_hugging_face_model_equals_eager(reentrant):
    """``gradient_checkpointing_enable()``: transformers calls torch's checkpoint per decoder
    layer (imported before ir_runtime installed itself); losses and gradients as eager's."""
    eager = llama().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    for m in (eager, lazy):
        m.gradient_checkpointing_enable({"use_reentrant": reentrant})
    ids = torch.randint(1, 96, (4, 8), generator=torch.Generator().manual_seed(0))
    want = hf_models.loss_of(eager, ids, None)
    want.backward()
    got = hf_models.loss_of(lazy, irt.to_lazy(ids), None)
    got.backward()
    first = lazy.model.layers[0].self_attn.q_proj.weight.grad
    assert "optimization_barrier" in irt.dump(first, "stablehlo")  # recomputed, behind it
    irt.mark_step()
    torch.testing.assert_close(irt.to_torch(got), want.detach(), rtol=1e-5, atol=1e-6)
    for (name, p_l), p_e in zip(lazy.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(
            irt.to_torch(p_l.grad),
            p_e.grad,
            rtol=1e-4,
            atol=1e-6,
            msg=lambda m, n=name: f"{n}: {m}",
        )


def test_a_hugging_face_model_under_bfloat16_autocast_is_eager_autocasts():
    eager = llama().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids = torch.randint(1, 96, (4, 8), generator=torch.Generator().manual_seed(0))
    losses = []
    for model, dev, x in ((eager, "cpu", ids), (lazy, "lazy", irt.to_lazy(ids))):
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = hf_models.loss_of(model, x, None)
        loss.backward()
        losses.append(loss)
    irt.mark_step()
    assert losses[1].dtype == losses[0].dtype == torch.float32
    torch.testing.assert_close(irt.to_torch(losses[1]), losses[0].detach(), rtol=1e-2, atol=1e-2)
    for p_l, p_e in zip(lazy.parameters(), eager.parameters(), strict=True):
        assert p_l.grad.dtype == torch.float32
        torch.testing.assert_close(irt.to_torch(p_l.grad), p_e.grad, rtol=5e-2, atol=5e-3)
