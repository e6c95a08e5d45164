"""Tiny Hugging Face models built from their configs (no weights downloaded), for the
integration suite and the benchmarks. Dropout is off, so torch eager is an exact oracle."""

import torch
import transformers as tf


def causal(kind="llama", vocab_size=96, hidden_size=32, layers=2, seed=0, **overrides):
    """A Llama, Qwen2 or Mistral causal LM: 4 attention heads over 2 key/value heads unless
    ``overrides`` (more config fields: ``tie_word_embeddings=True``, ``sliding_window=4``,
    ``num_key_value_heads=4``) say otherwise."""
    config_class, model_class = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
    }[kind]
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    config = config_class(**(fields | overrides))
    return _build(model_class, config, seed)


def _build(model_class, config, seed):
    torch.manual_seed(seed)
    return model_class(config)


def bert(seed=0):
    """A BERT sequence classifier over 3 labels, with the eager attention (transformers' SDPA
    path reads the attention mask to the host to skip it)."""
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    config = tf.BertConfig(
        vocab_size=96, num_attention_heads=4, num_labels=3, attn_implementation="eager", **sizes
    )
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return _build(tf.BertForSequenceClassification, config, seed)


def t5(seed=0):
    sizes = {"d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 2, "num_heads": 4}
    config = tf.T5Config(vocab_size=96, decoder_start_token_id=0, dropout_rate=0.0, **sizes)
    return _build(tf.T5ForConditionalGeneration, config, seed)


def gpt2(seed=0):
    """A GPT-2 LM (Conv1D layers, its head tied to the embedding) whose config has a pad token:
    trained without an attention mask, transformers checks every batch for padding to warn."""
    config = tf.GPT2Config(
        vocab_size=96,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        pad_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return _build(tf.GPT2LMHeadModel, config, seed)


def vit(seed=0):
    """A ViT image classifier over 3 labels: 16x16 RGB images in 4x4 patches."""
    config = tf.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return _build(tf.ViTForImageClassification, config, seed)


def loss_of(model, ids, labels):
    """The model's training loss on a batch: BERT and ViT classify (``labels``; ViT's ``ids``
    are images); the causal LMs and T5 predict the sequence ``ids`` itself."""
    if isinstance(model, tf.BertForSequenceClassification):
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
    if isinstance(model, tf.ViTForImageClassification):  # (``ids``: the images)
        return model(pixel_values=ids, labels=labels).loss
    return model(input_ids=ids, labels=ids).loss


def training_step(eager, lazy):
    """``step(model, ids, labels)`` for either model: AdamW as written for eager (a compiled
    step replays it: its numbers are lent to the traced step); returns the loss, detached."""
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, lazy)}

    def step(model, ids, labels):
        loss = loss_of(model, ids, labels)
        loss.backward()
        opts[model].step()
        opts[model].zero_grad()
        return loss.detach()

    return step
