"""Device memory of a training step, from XLA's own analysis of each compiled program.

Peak bytes per device = arguments + outputs + temporaries - aliased (outputs written into
donated arguments), from ``compiled.memory_analysis()``: exact, and the same on every backend.

1. Buffer donation: a GPT-style transformer whose parameters plus AdamW state take about 1 GB,
   FSDP-style (every weight's first dim sharded over all 8 devices of the 4x2 mesh, the batch
   over "data"), one AdamW step through ``mark_step``: with donation (the default), without it
   (``IR_RUNTIME_DONATE=0``: the program before donation existed), and the same step
   hand-written in ``jax.jit`` with ``donate_argnums`` and the same shardings.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top

import benchjson  # noqa: E402
import ir_runtime as irt  # noqa: E402

irt.init(cpu_devices=8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ir_runtime._frontend import _step, inspect  # noqa: E402
from ir_sharding import ShardingSpec  # noqa: E402

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
FSDP = ("data", "model")  # a weight's first dim, over every device


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def loss_of(model, ids, labels):
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def ours(config, ids, labels, donate: bool):
    """Peak bytes of the lazy AdamW step's program, run through mark_step (its second step:
    the first makes the optimizer's state)."""
    torch.manual_seed(0)
    model = irt.to_lazy(GPT(*config))
    for p in model.parameters():
        irt.mark_sharding(p, MESH, (FSDP,) + (None,) * (p.dim() - 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=FOREACH[0])
    lids, llabels = irt.to_lazy(ids), irt.to_lazy(labels)
    irt.mark_sharding(lids, MESH, ("data", None))
    irt.mark_sharding(llabels, MESH, ("data", None))
    _step.DONATE[0] = donate
    try:
        for _ in range(2):
            loss_of(model, lids, llabels).backward()
            opt.step()
            opt.zero_grad()  # before mark_step: the gradients are not among its results
            irt.mark_step()
        irt.wait_device_ops()
        exe = inspect.last_executable()
        state = sum(p.numel() * 4 * 3 for p in model.parameters())
        return exe.memory(), len(exe.donate), state
    finally:
        _step.DONATE[0] = True


def jax_step(config, ids, labels):
    """The same step hand-written in jax.jit, donating parameters and AdamW state."""
    vocab, d, layers, heads = config
    jm = MESH_JAX
    rep = NamedSharding(jm, P())

    def fsdp(shape):
        return NamedSharding(jm, P(FSDP, *([None] * (len(shape) - 1))))

    shapes = {"embed": (vocab, d), "ln_w": (d,), "ln_b": (d,), "head": (vocab, d)}
    for i in range(layers):
        for name, shape in (
            ("ln1_w", (d,)), ("ln1_b", (d,)), ("ln2_w", (d,)), ("ln2_b", (d,)),
            ("qkv_w", (3 * d, d)), ("qkv_b", (3 * d,)), ("proj_w", (d, d)), ("proj_b", (d,)),
            ("up_w", (4 * d, d)), ("up_b", (4 * d,)), ("down_w", (d, 4 * d)), ("down_b", (d,)),
        ):  # fmt: skip
            shapes[f"{i}.{name}"] = shape
    shardings = {k: fsdp(s) for k, s in shapes.items()}

    def ln(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * w + b

    def loss(p, ids, labels):
        x = p["embed"][ids]
        b, s, _ = x.shape
        causal = jnp.tril(jnp.ones((s, s), bool))
        for i in range(layers):
            g = {n: p[f"{i}.{n}"] for n in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")}
            h = ln(x, g["ln1_w"], g["ln1_b"]) @ p[f"{i}.qkv_w"].T + p[f"{i}.qkv_b"]
            q, k, v = (
                t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)
                for t in jnp.split(h, 3, -1)
            )
            sc = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), -jnp.inf)
            a = (jax.nn.softmax(sc, -1) @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
            x = x + a @ p[f"{i}.proj_w"].T + p[f"{i}.proj_b"]
            u = ln(x, g["ln2_w"], g["ln2_b"]) @ p[f"{i}.up_w"].T + p[f"{i}.up_b"]
            x = x + jax.nn.gelu(u, approximate=False) @ p[f"{i}.down_w"].T + p[f"{i}.down_b"]
        logits = ln(x, p["ln_w"], p["ln_b"]) @ p["head"].T
        logp = jax.nn.log_softmax(logits.reshape(-1, vocab), -1)
        return -jnp.take_along_axis(logp, labels.reshape(-1, 1), 1).mean()

    def step(p, m, v, t, ids, labels):
        g = jax.grad(loss)(p, ids, labels)
        t = t + 1
        b1, b2, lr, eps, wd = 0.9, 0.999, 1e-4, 1e-8, 0.01
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1**t, 1 - b2**t

        def update(p, m, v):
            return p * (1 - lr * wd) - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)

        return jax.tree.map(update, p, m, v), m, v, t

    batch = NamedSharding(jm, P("data", None))
    fn = jax.jit(
        step,
        in_shardings=(shardings, shardings, shardings, rep, batch, batch),
        out_shardings=(shardings, shardings, shardings, rep),
        donate_argnums=(0, 1, 2),
    )
    abstract = {
        k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=shardings[k]) for k, s in shapes.items()
    }
    args = (
        abstract,
        abstract,
        abstract,
        jax.ShapeDtypeStruct((), jnp.float32, sharding=rep),
        jax.ShapeDtypeStruct(ids.shape, jnp.int32, sharding=batch),
        jax.ShapeDtypeStruct(labels.shape, jnp.int32, sharding=batch),
    )
    m = fn.lower(*args).compile().memory_analysis()
    out = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
    }
    out["peak"] = out["arguments"] + out["outputs"] + out["temporaries"] - out["aliased"]
    return out


MESH_JAX = None
FOREACH = [None]


def bench_donation(config=(8192, 1024, 6, 16), batch=8, seq=32):
    global MESH_JAX
    MESH_JAX = ShardingSpec(MESH, ()).to_jax().mesh  # the same devices, in the same order
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config[0], (batch, seq), generator=g)
    labels = torch.randint(0, config[0], (batch, seq), generator=g)
    start = time.perf_counter()
    donated, n_donated, state = ours(config, ids, labels, donate=True)
    plain, _, _ = ours(config, ids, labels, donate=False)
    hand = jax_step(config, ids, labels)
    return {
        "config": {
            "vocab": config[0],
            "d_model": config[1],
            "layers": config[2],
            "batch": batch,
            "seq": seq,
        },
        "params_and_adamw_bytes": state,
        "per_device_bytes": {
            "ours": donated,
            "ours, IR_RUNTIME_DONATE=0": plain,
            "jax.jit donate_argnums": hand,
        },
        "donated_buffers": n_donated,
        "ours_over_jax": donated["peak"] / hand["peak"],
        "ours_over_undonated": donated["peak"] / plain["peak"],
        "seconds": time.perf_counter() - start,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    d = bench_donation()
    print(
        f"\nBuffer donation: GPT {d['config']}, parameters + AdamW state "
        f"{d['params_and_adamw_bytes'] / 2**30:.2f} GiB, FSDP over the 4x2 mesh; per-device "
        f"MiB from XLA's memory analysis ({d['donated_buffers']} buffers donated)"
    )
    print(f"{'program':<28}{'arguments':>11}{'outputs':>10}{'temps':>9}{'aliased':>10}{'peak':>9}")
    for name, m in d["per_device_bytes"].items():
        mib = {k: v / 2**20 for k, v in m.items()}
        print(
            f"{name:<28}{mib['arguments']:>11.1f}{mib['outputs']:>10.1f}"
            f"{mib['temporaries']:>9.1f}{mib['aliased']:>10.1f}{mib['peak']:>9.1f}"
        )
    print(
        f"peak: ours / jax.jit {d['ours_over_jax']:.3f} (target at most 1.1); ours / without "
        f"donation {d['ours_over_undonated']:.3f} (target at most 0.7)"
    )
    results = {
        "donation": d,
        "targets": {"ours_over_jax_max": 1.1, "ours_over_undonated_max": 0.7},
        "environment": benchjson.environment(torch=torch.__version__, jax=jax.__version__),
    }
    benchjson.write(args.json, results)


if __name__ == "__main__":
    main()
