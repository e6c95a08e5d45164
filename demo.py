"""The main job: a small Llama learns Python's own documentation, sharded 2-D over 8 virtual CPU
devices with PyTorch's own placement APIs, next to the same model trained by torch eager.

- Text: ``pydoc_data.topics`` (the help texts that ship with Python), byte-level tokens.
- Model: Hugging Face's ``LlamaForCausalLM`` from a small config (no weights downloaded).
- Placement: a 4x2 ``DeviceMesh`` ("dp", "tp"); the model's own ``tp_plan`` over "tp"
  (``irt.apply_tp_plan``), FSDP2's ``fully_shard`` over "dp", batches ``distribute_tensor``-ed
  over "dp". torch's functions, unchanged: with one controller a plan is only annotations.
- The step: ``irt.compile_step`` (traced on its first calls, then replayed without its Python).
- Half-way the run "stops": a checkpoint is saved, a fresh model (other initial weights) is
  placed and restored from it, and training goes on; every logged loss must be within 1e-3
  (relative) of eager's uninterrupted run, or the demo fails.
- At the end: a sample generated with ``irt.generate`` (sampling, seeded: eager's draws), and
  both runs' figures.
"""

import argparse
import copy
import sys
import tempfile
import time
from pydoc_data.topics import topics

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

import ir_runtime as irt

SEQ, BATCH, LR = 128, 16, 1e-3


def corpus() -> torch.Tensor:
    """Python's help topics as one byte string, as token ids 0..255."""
    text = "\n\n".join(topics[k] for k in sorted(topics))
    return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).long()


def batches(data: torch.Tensor, steps: int, seed: int = 0):
    """``steps`` batches of BATCH windows of SEQ + 1 bytes at random offsets (the same for
    eager and lazy)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=g)
        out.append(torch.stack([data[s : s + SEQ + 1] for s in starts.tolist()]))
    return out


def build(seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).train()


def place(model: LlamaForCausalLM, mesh) -> LlamaForCausalLM:
    """The model's own tensor-parallel plan over "tp", FSDP2 over "dp"."""
    irt.apply_tp_plan(model, mesh)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def step(model, opt, window):
    logits = model(input_ids=window[:, :-1]).logits
    loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def train(name, run, windows, first, log_every, losses):
    """Run ``run(window)`` over ``windows`` (steps ``first``...), reading the loss every
    ``log_every`` steps into ``losses``; returns the seconds spent."""
    tokens = BATCH * SEQ
    start = time.perf_counter()
    bar = tqdm(windows, desc=f"{name:>13}", unit="step", leave=True, file=sys.stdout)
    for k, window in enumerate(bar, start=first):
        loss = run(window)
        if (k + 1) % log_every == 0:
            losses[k + 1] = float(loss)  # (a read: the lazy step's program runs here)
            rate = tokens * (k + 1 - first) / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{losses[k + 1]:.4f}", tok_s=f"{rate:,.0f}")
    bar.close()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    steps, every = args.steps, args.log_every
    half = steps // 2 // every * every

    irt.init(cpu_devices=8)
    mesh = irt.device_mesh((4, 2), ("dp", "tp"))
    data = corpus()
    windows = batches(data, steps)
    print(
        f"pydoc_data.topics: {len(data):,} bytes; {steps} AdamW steps of {BATCH}x{SEQ} tokens; "
        f"Llama {sum(p.numel() for p in build(0).parameters()):,} parameters, placed over "
        f"{mesh}\n"
    )

    # torch eager: the reference, uninterrupted
    eager = build(0)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=LR)
    want = {}
    eager_s = train("torch eager", lambda w: step(eager, eager_opt, w), windows, 0, every, want)

    # lazy, SPMD: the same initial weights and batches, stopped half-way and resumed
    model = place(irt.to_lazy(copy.deepcopy(build(0))), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    compiled = irt.compile_step(step)

    def run(w):
        return compiled(model, opt, distribute_tensor(w, mesh, [Shard(0), Replicate()]))

    got = {}
    lazy_s = train("ir_runtime", run, windows[:half], 0, every, got)
    directory = tempfile.mkdtemp(prefix="demo-ckpt-")
    ckpt = irt.CheckpointManager(directory)
    ckpt.save(half, {"model": model, "optim": opt, "data": {"step": half}})
    print(f"saved step {half} to {directory}; a fresh model (other initial weights) resumes it")

    model = place(irt.to_lazy(build(1)), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    state = {"model": model, "optim": opt, "data": {"step": 0}}
    resumed = ckpt.restore(None, state)
    assert resumed == half == state["data"]["step"]
    lazy_s += train("ir_runtime", run, windows[half:], half, every, got)

    prompt = "The for statement"
    ids = torch.tensor([list(prompt.encode())])
    how = {"max_new_tokens": 96, "do_sample": True, "top_k": 20, "temperature": 0.7}
    with torch.no_grad():
        torch.manual_seed(7)  # (sampling draws from torch's CPU generator, as eager's does)
        sample = irt.generate(model, ids, **how)
        torch.manual_seed(7)
        eager_sample = eager.generate(ids, **how)
    text = bytes(sample[0].tolist()).decode(errors="replace")
    print(f"\nsample (top-k 20, temperature 0.7, 96 bytes after the prompt):\n{text!r}")
    same = torch.equal(sample.cpu(), eager_sample)
    print(f"eager's sample with the same seed is {'the same' if same else 'different'}")

    print("\n step   ir_runtime   torch eager   relative difference")
    worst = 0.0
    for k in sorted(want):
        diff = abs(got[k] - want[k]) / abs(want[k])
        worst = max(worst, diff)
        print(f"{k:5d}   {got[k]:10.5f}   {want[k]:11.5f}   {diff:.1e}")
    tokens = steps * BATCH * SEQ
    counters = irt.metrics()["counters"]
    print(
        f"\ntokens/s (compile included): ir_runtime {tokens / lazy_s:,.0f} over 8 devices, "
        f"torch eager {tokens / eager_s:,.0f}\n"
        f"compiles: {counters['CompileCount']}; compiled-step replays: "
        f"{counters.get('StepReplay', 0)}; the embedding's weight:"
    )
    print(irt.visualize_sharding(model.model.embed_tokens.weight))
    assert worst <= 1e-3, f"a loss differs from eager's by {worst:.1e} (relative)"


if __name__ == "__main__":
    main()
