"""Hugging Face models trained on the lazy device under compile_step, on the 4x2 mesh with the
batch sharded over "data": tiny Llama, Qwen2, BERT and T5 built from their configs (no weights
downloaded, dropout off so eager is an exact oracle). Every one replays, with eager's losses."""

import copy

import numpy as np
import pytest
import torch
import transformers as tf

import ir_runtime as irt

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
SMALL = {"vocab_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}


def llama():
    config = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **SMALL)
    return tf.LlamaForCausalLM(config)


def qwen2():
    config = tf.Qwen2Config(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **SMALL)
    return tf.Qwen2ForCausalLM(config)


def bert():
    # The eager attention: transformers' SDPA path reads the mask to the host to skip it.
    config = tf.BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager",
        **SMALL,
    )
    return tf.BertForSequenceClassification(config)


def t5():
    config = tf.T5Config(
        vocab_size=96,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        dropout_rate=0.0,
    )
    return tf.T5ForConditionalGeneration(config)


def loss_of(model, ids, labels):
    if isinstance(model, tf.BertForSequenceClassification):
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
    return model(input_ids=ids, labels=ids).loss  # causal LM and T5: predict the sequence


@pytest.mark.parametrize("make", [llama, qwen2, bert, t5], ids=lambda f: f.__name__)
def test_a_hugging_face_model_trains_under_compile_step_and_replays(make):
    torch.manual_seed(0)
    eager = make().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    opts = {
        eager: torch.optim.AdamW(eager.parameters(), lr=1e-3),
        lazy: torch.optim.AdamW(lazy.parameters(), lr=1e-3, capturable=True),
    }

    def step(model, ids, labels):
        loss = loss_of(model, ids, labels)
        loss.backward()
        opts[model].step()
        opts[model].zero_grad()
        return loss.detach()

    compiled = irt.compile_step(step)
    irt.reset_metrics()
    for _ in range(5):
        ids, labels = torch.randint(1, 96, (4, 8)), torch.randint(0, 3, (4,))
        want = step(eager, ids, labels)
        lids, llabels = irt.to_lazy(ids), irt.to_lazy(labels)
        irt.mark_sharding(lids, MESH, ("data", None))
        got = compiled(lazy, lids, llabels)
        torch.testing.assert_close(irt.to_torch(got), want, rtol=1e-5, atol=1e-5)
    counters = irt.metrics()["counters"]
    assert compiled.replaying, compiled.reason or compiled.last_guard_failure
    assert (counters["StepTraced"], counters["StepReplay"]) == (3, 2)
    assert counters.get("StepGuardFailed", 0) == 0
