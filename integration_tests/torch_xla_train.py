"""A torch_xla SPMD training script, written against torch_xla's API alone (what a user brings
from torch_xla 2.9): a Hugging Face decoder-only model wrapped in FSDPv2 over a 1-D mesh,
batches from ``MpDeviceLoader`` sharded on the batch dim, the step under
``torch_xla.compile``, losses read in a step closure.

    python -m ir_runtime.torch_xla integration_tests/torch_xla_train.py --steps 4

prints one JSON line: the losses, and the mean seconds of the steps after ``--warmup``. The
model and data come from ``decoder()`` and ``batches()``, which the eager oracle and the
benchmark share."""

import argparse
import json
import time

import numpy as np
import torch

VOCAB, SEQ, BATCH = 256, 32, 16


def decoder(seed: int = 0):
    """A small Llama (transformers 5, built from its config: no weights downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def batches(steps: int, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(steps)]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)

    import functools

    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
        SpmdFullyShardedDataParallel as FSDPv2,
    )
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
    xs.set_global_mesh(mesh)
    device = torch_xla.device()

    model = decoder()
    policy = functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}
    )

    def shard_output(output, mesh):  # (the model's output, and each wrapped layer's)
        t = getattr(output, "logits", output)
        t = t[0] if isinstance(t, tuple) else t
        xs.mark_sharding(t, mesh, ("fsdp",) + (None,) * (t.dim() - 1))

    model = FSDPv2(model, auto_wrap_policy=policy, shard_output=shard_output)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = pl.MpDeviceLoader(
        batches(args.steps), device, input_sharding=xs.ShardingSpec(mesh, ("fsdp", None))
    )

    losses, times = [], []

    @torch_xla.compile(full_graph=True, name="train_step")
    def train_step(ids):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        return loss

    for step, ids in enumerate(loader):
        start = time.perf_counter()
        loss = train_step(ids)
        xm.add_step_closure(lambda loss: losses.append(loss.item()), args=(loss,))
        torch_xla.sync()
        xm.wait_device_ops()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    xm.master_print(json.dumps({"losses": losses, "step_seconds": sum(times) / max(len(times), 1)}))


if __name__ == "__main__":
    main()
