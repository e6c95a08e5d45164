"""A small Llama's training step on one CPU device, six ways, side by side in one run.

The model: ``LlamaForCausalLM`` (transformers, built from its config) with hidden size 256,
4 layers, 8 heads (4 key/value heads), batch 8 x 128, AdamW (torch's defaults, lr 1e-3). The
ways:

- ``eager``: torch on the CPU.
- ``inductor``: the model under ``torch.compile`` (torch's default backend), AdamW eager.
- ``ir_runtime``: the model under ``torch.compile(backend="ir_runtime")`` on CPU tensors (its
  forward and backward programs), AdamW eager.
- ``compile_step``: the step on the lazy device under ``ir_runtime.compile_step`` (its replay).
- ``mark_step``: the same step traced every call, run by ``mark_step``.
- ``jax.jit``: the same model and AdamW written in JAX (the torch model's initial weights),
  one ``jax.jit`` with the parameters and optimizer state donated: what XLA does with the
  model when nothing stands between them.

Each way runs in its own process (one CPU device; a process names its devices once); the
ways alternate for several rounds, and each figure is the median over rounds of a round's mean
step after warm-up (every step waited for). Ratios are to eager's time in the same round. Every
way's losses are checked against eager's (rtol 1e-4): a fast wrong step is not a result.

    python packages/ir-runtime/bench/bench_cpu_llama.py [--rounds 3] [--json PATH]

``--xla-flags`` passes XLA_FLAGS to the XLA ways (to try a CPU option on all of them alike).
``--cores N`` runs each way on N of the machine's cores (torch's threads and XLA's pools
sized to them). Beside each way's time the table shows how many cores it kept busy (its CPU
time over its wall time), its kernel time and its page faults per step.
``--sync-every N`` waits for every Nth step only (a loop that logs its loss every N steps), so
the time between steps on the host can overlap the device's work; the default waits for each.
On a machine with an accelerator the XLA ways run there and eager on its CPU.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top

WAYS = ("eager", "inductor", "ir_runtime", "compile_step", "mark_step", "jax.jit")
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 1024, 256, 4, 8, 4, 704
BATCH, SEQ, LR = 8, 128, 1e-3


def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=SEQ,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


class Clock:
    """The timed steps' wall time, CPU time (every thread of the process, user and kernel) and
    minor page faults (pages the kernel mapped afresh), each per step."""

    def start(self):
        self.wall, self.usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)

    def stop(self, steps: int) -> dict:
        wall = time.perf_counter() - self.wall
        now, was = resource.getrusage(resource.RUSAGE_SELF), self.usage
        return {
            "step_seconds": wall / steps,
            "cpu_seconds": (now.ru_utime + now.ru_stime - was.ru_utime - was.ru_stime) / steps,
            "kernel_seconds": (now.ru_stime - was.ru_stime) / steps,
            "page_faults": (now.ru_minflt - was.ru_minflt) / steps,
        }


def batches(n: int) -> list:
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def _torch_way(way: str, steps: int, warmup: int, sync_every: int = 1) -> dict:
    import torch

    import ir_runtime as irt

    net = model()
    lazy = way in ("compile_step", "mark_step")
    if lazy:
        irt.init(cpu_devices=1)
        net = irt.to_lazy(net)
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    forward = net
    if way == "inductor":
        forward = torch.compile(net)
    elif way == "ir_runtime":
        forward = torch.compile(net, backend="ir_runtime", dynamic=False)

    def step(ids):
        opt.zero_grad()
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    run = irt.compile_step(step) if way == "compile_step" else step
    data = [irt.to_lazy(b) for b in batches(steps)] if lazy else batches(steps)
    losses, clock = [], Clock()
    for k, ids in enumerate(data):
        if k == warmup:
            clock.start()
        loss = run(ids)
        if way == "mark_step":
            irt.mark_step()
        losses.append(loss)
        if (k + 1) % sync_every == 0 or k + 1 == len(data):
            losses[-1] = losses[-1].item()  # (waits for the step)
    return {"losses": [float(x) for x in losses], **clock.stop(len(data) - warmup)}


def _jax_way(steps: int, warmup: int, sync_every: int = 1) -> dict:
    import functools

    import jax
    import jax.numpy as jnp

    jax.config.update("jax_num_cpu_devices", 1)
    # float32 products as the lazy device's rules ask for them (XLA's CPU ignores it; a TPU's
    # default would be one bfloat16 pass)
    jax.config.update("jax_default_matmul_precision", "highest")
    net = model()
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in net.state_dict().items()}
    config = net.config
    head = HIDDEN // HEADS
    eps = config.rms_norm_eps
    theta = config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head, 2, dtype=jnp.float32) / head))
    freqs = jnp.arange(SEQ, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))

    def norm(x, w):
        return w * (x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps))

    def rotate(x):
        a, b = jnp.split(x, 2, axis=-1)
        return x * cos + jnp.concatenate([-b, a], axis=-1) * sin

    def loss_of(p, ids):
        x = p["model.embed_tokens.weight"][ids]
        for i in range(LAYERS):
            pre = f"model.layers.{i}."
            h = norm(x, p[pre + "input_layernorm.weight"])

            def proj(name, n, h=h, pre=pre):
                y = h @ p[pre + f"self_attn.{name}.weight"].T
                return y.reshape(BATCH, SEQ, n, head).transpose(0, 2, 1, 3)

            q, k, v = proj("q_proj", HEADS), proj("k_proj", KV_HEADS), proj("v_proj", KV_HEADS)
            q, k = rotate(q), rotate(k)
            k, v = (jnp.repeat(t, HEADS // KV_HEADS, axis=1) for t in (k, v))
            s = (q @ k.transpose(0, 1, 3, 2)) * head**-0.5
            s = jnp.where(causal, s, jnp.finfo(s.dtype).min)
            a = jax.nn.softmax(s, axis=-1) @ v
            a = a.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, HIDDEN)
            x = x + a @ p[pre + "self_attn.o_proj.weight"].T
            h = norm(x, p[pre + "post_attention_layernorm.weight"])
            gate = jax.nn.silu(h @ p[pre + "mlp.gate_proj.weight"].T)
            up = h @ p[pre + "mlp.up_proj.weight"].T
            x = x + (gate * up) @ p[pre + "mlp.down_proj.weight"].T
        logits = norm(x, p["model.norm.weight"]) @ p["lm_head.weight"].T
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    b1, b2, adam_eps, decay = 0.9, 0.999, 1e-8, 0.01

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(p, m, v, t, ids):
        loss, g = jax.value_and_grad(loss_of)(p, ids)
        t = t + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1**t, 1 - b2**t

        def update(p, m, v):
            p = p * (1 - LR * decay)
            return p - LR * (m / c1) / (jnp.sqrt(v / c2) + adam_eps)

        return loss, jax.tree.map(update, p, m, v), m, v, t

    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    t = jnp.zeros((), jnp.float32)
    losses, clock = [], Clock()
    data = [jnp.asarray(ids.numpy()) for ids in batches(steps)]
    for k, ids in enumerate(data):
        if k == warmup:
            clock.start()
        loss, params, m, v, t = step(params, m, v, t, ids)
        losses.append(loss)
        if (k + 1) % sync_every == 0 or k + 1 == len(data):
            losses[-1] = float(losses[-1])  # (waits for the step)
    return {"losses": [float(x) for x in losses], **clock.stop(len(data) - warmup)}


def _child(
    way: str, steps: int, warmup: int, xla_flags: str, sync_every: int, cores: int | None
) -> dict:
    env = dict(os.environ)
    env.pop("IR_RUNTIME_CPU_DEVICES", None)
    if xla_flags and way != "eager" and way != "inductor":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--way",
            way,
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--sync-every",
            str(sync_every),
            *(["--cores", str(cores)] if cores else []),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{way}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--xla-flags", default="")
    parser.add_argument("--sync-every", type=int, default=1)
    parser.add_argument("--cores", type=int, help="run each way on this many of the cores")
    parser.add_argument("--way", choices=WAYS)  # (a child process)
    args = parser.parse_args()
    if args.way:
        if args.cores:  # (before torch and XLA size their thread pools from the affinity)
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
            import torch

            torch.set_num_threads(args.cores)
        if args.way == "jax.jit":
            out = _jax_way(args.steps, args.warmup, args.sync_every)
        else:
            out = _torch_way(args.way, args.steps, args.warmup, args.sync_every)
        print(json.dumps(out))
        return
    ways = args.ways.split(",")
    if "eager" not in ways:
        ways.insert(0, "eager")
    rounds = []
    for _ in range(args.rounds):
        rounds.append(
            {
                w: _child(w, args.steps, args.warmup, args.xla_flags, args.sync_every, args.cores)
                for w in ways
            }
        )
    import torch

    want = torch.tensor(rounds[0]["eager"]["losses"])
    for r in rounds:
        for w, out in r.items():
            got = torch.tensor(out["losses"])
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"{w}'s losses")
    seconds = {w: statistics.median(r[w]["step_seconds"] for r in rounds) for w in ways}
    ratios = {
        w: statistics.median(r[w]["step_seconds"] / r["eager"]["step_seconds"] for r in rounds)
        for w in ways
    }
    # where a way's time goes: how many cores it kept busy, and the kernel's share (most of it
    # zero-filling pages mapped afresh: XLA's temporaries, mapped and unmapped by malloc per run)
    usage = {
        w: {
            k: statistics.median(r[w][k] for r in rounds)
            for k in ("cpu_seconds", "kernel_seconds", "page_faults")
        }
        for w in ways
    }
    print(
        f"A small Llama's training step on one CPU device (hidden {HIDDEN}, {LAYERS} layers, "
        f"batch {BATCH}x{SEQ}, AdamW), median of {args.rounds} rounds"
        + (f"; XLA_FLAGS {args.xla_flags}" if args.xla_flags else "")
        + (f"; on {args.cores} core(s)" if args.cores else f"; {os.cpu_count()} cores")
    )
    print(
        f"{'':16s}{'step (ms)':>12s}{'/ eager':>10s}{'cores busy':>12s}{'kernel (ms)':>13s}"
        f"{'page faults':>13s}"
    )
    for w in ways:
        u = usage[w]
        print(
            f"{w:16s}{seconds[w] * 1e3:12.1f}{ratios[w]:10.3f}"
            f"{u['cpu_seconds'] / seconds[w]:12.2f}{u['kernel_seconds'] * 1e3:13.1f}"
            f"{u['page_faults']:13.0f}"
        )
    if "ir_runtime" in ways and "compile_step" in ways:
        over = statistics.median(
            r["ir_runtime"]["step_seconds"] / r["compile_step"]["step_seconds"] for r in rounds
        )
        print(f"torch.compile(backend='ir_runtime') / compile_step: {over:.3f} (target 1.05)")
    import benchjson

    benchjson.write(
        args.json,
        {
            "step_seconds": seconds,
            "ratio_to_eager": ratios,
            "usage_per_step": usage,
            "cores": args.cores,
            "xla_flags": args.xla_flags,
            "rounds": [{w: r[w]["step_seconds"] for w in ways} for r in rounds],
            "environment": benchjson.environment(torch=torch.__version__),
        },
    )


if __name__ == "__main__":
    main()
