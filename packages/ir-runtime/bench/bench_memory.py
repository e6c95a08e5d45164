"""Training big models: memory from XLA's own analysis of each program, step and compile time.

Peak bytes per device = arguments + outputs + temporaries - aliased (outputs written into
donated arguments), from ``compiled.memory_analysis()``: exact, and the same on every backend.

1. Buffer donation: a GPT-style transformer whose parameters plus AdamW state take about 1 GB,
   FSDP-style (every weight's first dim sharded over all 8 devices of the 4x2 mesh, the batch
   over "data"), one AdamW step through ``mark_step``: with donation (the default), without it
   (``IR_RUNTIME_DONATE=0``: the program before donation existed), and the same step
   hand-written in ``jax.jit`` with ``donate_argnums`` and the same shardings.
2. Activation checkpointing: a 16-block residual MLP, each block through
   ``torch.utils.checkpoint`` or not: the program's temporaries and the step time, beside the
   same ratio for ``jax.checkpoint`` on the same step in ``jax.jit``.
3. bfloat16 autocast against float32 on the large linear step: peak bytes and step time.
4. Compile time (lower + XLA compile) of a 2-, 8- and 32-block GPT stack's training step,
   unrolled against ``scan_layers`` (the layers' tensors per layer, and stored stacked by
   ``stack_layers``), beside ``jax.jit`` of the same step unrolled and with
   ``lax.scan``.
5. Attention: a causal ``scaled_dot_product_attention`` forward and backward (batch 2, 8 heads
   of 64) at 2048 and 8192 keys, the ``ir::attention`` rule against torch's math path recorded
   op by op (the front end before the rule) and ``jax.nn.dot_product_attention`` (its "xla"
   implementation) in ``jax.jit``: peak bytes, and at 2048 the step time.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import copy
import math
import os
import statistics
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
import torch.utils.checkpoint as checkpoint  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ir_runtime import _donation  # noqa: E402
from ir_runtime._executable import memory_of  # noqa: E402
from ir_runtime._frontend import inspect  # noqa: E402
from ir_runtime._frontend.regions import _attention  # noqa: E402
from ir_sharding import ShardingSpec  # noqa: E402

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
MESH_JAX = ShardingSpec(MESH, ()).to_jax().mesh  # the same devices, in the same order
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


BLOCK_PARAMS = ("ln1_w", "ln1_b", "ln2_w", "ln2_b", "qkv_w", "qkv_b", "proj_w", "proj_b", "up_w",
                "up_b", "down_w", "down_b")  # fmt: skip


def block_shapes(d) -> dict:
    """A Block's parameters in jax: name -> shape (torch's layouts: Linear weights out x in)."""
    return {
        "ln1_w": (d,), "ln1_b": (d,), "ln2_w": (d,), "ln2_b": (d,), "qkv_w": (3 * d, d),
        "qkv_b": (3 * d,), "proj_w": (d, d), "proj_b": (d,), "up_w": (4 * d, d),
        "up_b": (4 * d,), "down_w": (d, 4 * d), "down_b": (d,),
    }  # fmt: skip


def _ln(x, w, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * w + b


def jax_block(g, x, heads):
    """``Block.forward`` hand-written in jax, on the parameters ``g`` (``block_shapes``)."""
    b, s, d = x.shape
    causal = jnp.tril(jnp.ones((s, s), bool))
    h = _ln(x, g["ln1_w"], g["ln1_b"]) @ g["qkv_w"].T + g["qkv_b"]
    q, k, v = (
        t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3) for t in jnp.split(h, 3, -1)
    )
    sc = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), -jnp.inf)
    a = (jax.nn.softmax(sc, -1) @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
    x = x + a @ g["proj_w"].T + g["proj_b"]
    u = _ln(x, g["ln2_w"], g["ln2_b"]) @ g["up_w"].T + g["up_b"]
    return x + jax.nn.gelu(u, approximate=False) @ g["down_w"].T + g["down_b"]


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
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lids, llabels = irt.to_lazy(ids), irt.to_lazy(labels)
    irt.mark_sharding(lids, MESH, ("data", None))
    irt.mark_sharding(llabels, MESH, ("data", None))
    _donation.ENABLED[0] = donate
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
        _donation.ENABLED[0] = True


def jax_step(config, ids, labels):
    """The same step hand-written in jax.jit, donating parameters and AdamW state."""
    vocab, d, layers, heads = config
    jm = MESH_JAX
    rep = NamedSharding(jm, P())

    def fsdp(shape):
        return NamedSharding(jm, P(FSDP, *([None] * (len(shape) - 1))))

    shapes = {"embed": (vocab, d), "ln_w": (d,), "ln_b": (d,), "head": (vocab, d)}
    for i in range(layers):
        for name, shape in block_shapes(d).items():
            shapes[f"{i}.{name}"] = shape
    shardings = {k: fsdp(s) for k, s in shapes.items()}

    def loss(p, ids, labels):
        x = p["embed"][ids]
        for i in range(layers):
            x = jax_block({n: p[f"{i}.{n}"] for n in BLOCK_PARAMS}, x, heads)
        logits = _ln(x, p["ln_w"], p["ln_b"]) @ p["head"].T
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
    return memory_of(fn.lower(*args).compile())


def bench_donation(config=(8192, 1024, 6, 16), batch=8, seq=32):
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


def _timed_steps(step, steps: int) -> float:
    """Median seconds per step over ``steps`` steps after two warm-up steps, each waited for."""
    for _ in range(2):
        step()
    irt.wait_device_ops()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        irt.wait_device_ops()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_checkpointing(layers=16, d=256, batch=4096, steps=5):
    """A residual MLP of ``layers`` blocks (h + GELU(Linear(h))), batch over "data": each block
    checkpointed (non-reentrant) or not; the program's temporaries and the step time. Beside
    it, the same step in jax.jit, each block under ``jax.checkpoint`` or not."""
    torch.manual_seed(0)
    base = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU()) for _ in range(layers)
    )
    x = torch.randn(batch, d, generator=torch.Generator().manual_seed(1))
    out = {}
    for name, how in (("plain", None), ("checkpointed", False)):
        model = irt.to_lazy(copy.deepcopy(base))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        lx = irt.to_lazy(x)
        irt.mark_sharding(lx, MESH, ("data", None))

        def loss_of(model=model, lx=lx, how=how):
            h = lx
            for block in model:
                h = h + (
                    block(h) if how is None else checkpoint.checkpoint(block, h, use_reentrant=how)
                )
            return h.square().mean()

        def step(model=model, opt=opt):
            loss_of().backward()  # (the activations go with the forward's locals)
            opt.step()
            opt.zero_grad()
            irt.mark_step()

        seconds = _timed_steps(step, steps)
        out[name] = {"memory": inspect.last_executable().memory(), "step_s": seconds}
    out["temporaries_ratio"] = (
        out["checkpointed"]["memory"]["temporaries"] / out["plain"]["memory"]["temporaries"]
    )
    out["step_time_ratio"] = out["checkpointed"]["step_s"] / out["plain"]["step_s"]
    jm = MESH_JAX
    rep, xs = NamedSharding(jm, P()), NamedSharding(jm, P("data", None))

    def block(p, h):
        return h + jax.nn.gelu(h @ p[0].T + p[1], approximate=False)

    def step(ps, x, remat):
        def loss(ps):
            h = x
            for p in ps:
                h = (jax.checkpoint(block) if remat else block)(p, h)
            return (h**2).mean()

        return jax.tree.map(lambda p, g: p - 1e-3 * g, ps, jax.grad(loss)(ps))

    params = [
        (jax.ShapeDtypeStruct((d, d), jnp.float32, sharding=rep),) * 1
        + (jax.ShapeDtypeStruct((d,), jnp.float32, sharding=rep),)
        for _ in range(layers)
    ]
    xa = jax.ShapeDtypeStruct((batch, d), jnp.float32, sharding=xs)
    temps = {}
    for remat in (False, True):
        c = jax.jit(step, static_argnums=2, donate_argnums=0).lower(params, xa, remat).compile()
        temps[remat] = c.memory_analysis().temp_size_in_bytes
    out["jax.checkpoint temporaries_ratio"] = temps[True] / temps[False]
    return out


def bench_autocast(batch=1024, n=1024, steps=5):
    """The large linear step (x @ W.T + b, MSE, SGD; W over "model", x over "data") in float32
    and under bfloat16 autocast: the program's peak bytes and the step time."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, n, generator=g), torch.randn(batch, n, generator=g)
    out = {}
    for name, dtype in (("float32", None), ("bfloat16 autocast", torch.bfloat16)):
        torch.manual_seed(0)
        model = irt.to_lazy(torch.nn.Linear(n, n))
        irt.mark_sharding(model.weight, MESH, ("model", None))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        lx, ly = irt.to_lazy(x), irt.to_lazy(y)
        irt.mark_sharding(lx, MESH, ("data", None))
        irt.mark_sharding(ly, MESH, ("data", None))

        def step(model=model, opt=opt, lx=lx, ly=ly, dtype=dtype):
            with torch.autocast("lazy", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = torch.nn.functional.mse_loss(model(lx), ly)
            loss.backward()
            opt.step()
            opt.zero_grad()
            irt.mark_step()

        seconds = _timed_steps(step, steps)
        out[name] = {"memory": inspect.last_executable().memory(), "step_s": seconds}
    return out


def _jax_stack_loss(ps, x, heads, layers, scan):
    """The mean square of a stack of ``jax_block``s (parameters stacked, layer first)."""
    if scan:
        x = lax.scan(lambda carry, g: (jax_block(g, carry, heads), None), x, ps)[0]
    else:
        for i in range(layers):
            x = jax_block({k: v[i] for k, v in ps.items()}, x, heads)
    return (x**2).mean()


def _compile_seconds() -> float:
    t = irt.metrics()["timers"]
    return sum(t.get(k, {}).get("total", 0.0) for k in ("LowerTime", "CompileTime"))


def bench_compile_time(depths=(2, 8, 32), d=256, heads=4, batch=2, seq=32):
    """Lower + XLA compile of a GPT block stack's training step (forward, backward, SGD), the
    blocks unrolled or through ``scan_layers``; beside each, jax.jit of the same step written
    in jax, unrolled (a Python loop) and with ``lax.scan``."""
    x = torch.randn(batch, seq, d, generator=torch.Generator().manual_seed(0))
    out = {}
    for layers in (depths[0], *depths):  # the first pass warms jax and XLA up, untimed
        row = {}
        for name in ("unrolled", "scan_layers", "scan_layers stacked"):
            torch.manual_seed(0)
            blocks = irt.to_lazy(torch.nn.ModuleList(Block(d, heads) for _ in range(layers)))
            irt.CACHE.clear()
            irt.reset_metrics()
            if name == "scan_layers stacked":  # (its one program of stacking counted too)
                irt.stack_layers(blocks)
            opt = torch.optim.SGD(blocks.parameters(), lr=1e-3)
            h = irt.to_lazy(x)
            if name.startswith("scan_layers"):
                h = irt.scan_layers(blocks, h)
            else:
                for b in blocks:
                    h = b(h)
            h.square().mean().backward()
            opt.step()
            opt.zero_grad()
            irt.mark_step()
            irt.wait_device_ops()
            row[name] = _compile_seconds()
        shapes = block_shapes(d)

        for name, scan in (("jax.jit unrolled", False), ("jax.jit lax.scan", True)):

            def step(ps, x, scan=scan, layers=layers):
                g = jax.grad(_jax_stack_loss)(ps, x, heads, layers, scan)
                return jax.tree.map(lambda p, g: p - 1e-3 * g, ps, g)

            abstract = {
                k: jax.ShapeDtypeStruct((layers, *s), jnp.float32) for k, s in shapes.items()
            }
            xs = jax.ShapeDtypeStruct((batch, seq, d), jnp.float32)
            start = time.perf_counter()
            jax.jit(step).lower(abstract, xs).compile()
            row[name] = time.perf_counter() - start
        out[layers] = row
    ratios = {}
    for name in ("scan_layers", "scan_layers stacked"):
        ratios[name] = out[depths[-1]][name] / out[depths[0]][name]
    deepest = out[depths[-1]]
    return {
        "seconds": out,
        "scan_deepest_over_shallowest": ratios["scan_layers"],
        "stacked_deepest_over_shallowest": ratios["scan_layers stacked"],
        "stacked_over_lax_scan_deepest": deepest["scan_layers stacked"]
        / deepest["jax.jit lax.scan"],
    }


def bench_attention(seqs=(2048, 8192), batch=2, heads=8, head=64, steps=3, timed=2048):
    """Peak bytes of a causal attention's forward and backward (the gradients of q, k and v
    from a sum), three ways: the rule, torch's math path (the rule off) and jax's reference
    kernel in jax.jit. Step times at ``timed`` keys only (8192 is minutes of CPU)."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for seq in seqs:
        qkv = [torch.randn(batch, heads, seq, head, generator=g) for _ in range(3)]
        row = {}
        for name, enabled in (("ir::attention", True), ("math path", False)):
            leaves = [irt.to_lazy(t).requires_grad_() for t in qkv]

            def grads(leaves=leaves, enabled=enabled):
                _attention.ENABLED[0] = enabled
                try:
                    o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
                    return torch.autograd.grad(o.sum(), leaves)
                finally:
                    _attention.ENABLED[0] = True

            row[name] = {"memory": irt.compile([t._ir for t in grads()]).memory()}
            if seq == timed:

                def step(grads=grads):
                    kept = grads()
                    irt.mark_step()
                    return kept

                row[name]["step_s"] = _timed_steps(step, steps)

        def f(q, k, v):
            o, vjp = jax.vjp(
                lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True), q, k, v
            )
            return vjp(jnp.ones_like(o))

        xs = jax.ShapeDtypeStruct((batch, seq, heads, head), jnp.float32)
        compiled = jax.jit(f).lower(xs, xs, xs).compile()
        row["jax.nn.dot_product_attention"] = {"memory": memory_of(compiled)}
        if seq == timed:
            arrays = [jnp.asarray(t.transpose(1, 2).numpy()) for t in qkv]
            row["jax.nn.dot_product_attention"]["step_s"] = _timed_steps(
                lambda arrays=arrays, c=compiled: jax.block_until_ready(c(*arrays)), steps
            )
        peak = {name: r["memory"]["peak"] for name, r in row.items()}
        row["rule_over_math_peak"] = peak["ir::attention"] / peak["math path"]
        row["rule_over_jax_peak"] = peak["ir::attention"] / peak["jax.nn.dot_product_attention"]
        out[seq] = row
    return out


def _mib(m: dict) -> dict:
    return {k: v / 2**20 for k, v in m.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    d = bench_donation()
    print(
        f"\n1. Buffer donation: GPT {d['config']}, parameters + AdamW state "
        f"{d['params_and_adamw_bytes'] / 2**30:.2f} GiB, FSDP over the 4x2 mesh; per-device "
        f"MiB from XLA's memory analysis ({d['donated_buffers']} buffers donated)"
    )
    print(f"{'program':<28}{'arguments':>11}{'outputs':>10}{'temps':>9}{'aliased':>10}{'peak':>9}")
    for name, m in d["per_device_bytes"].items():
        mib = _mib(m)
        print(
            f"{name:<28}{mib['arguments']:>11.1f}{mib['outputs']:>10.1f}"
            f"{mib['temporaries']:>9.1f}{mib['aliased']:>10.1f}{mib['peak']:>9.1f}"
        )
    print(
        f"peak: ours / jax.jit {d['ours_over_jax']:.3f} (target at most 1.1); ours / without "
        f"donation {d['ours_over_undonated']:.3f} (target at most 0.7)"
    )
    c = bench_checkpointing()
    print("\n2. Activation checkpointing: 16 residual blocks h + GELU(Linear(h)) (256, batch 4096)")
    for name in ("plain", "checkpointed"):
        m = _mib(c[name]["memory"])
        print(
            f"{name:<14} temporaries {m['temporaries']:7.1f} MiB  peak {m['peak']:7.1f} MiB  "
            f"step {c[name]['step_s'] * 1e3:7.1f} ms"
        )
    print(
        f"temporaries ratio {c['temporaries_ratio']:.3f} (target at most 0.5; jax.checkpoint on "
        f"the same step: {c['jax.checkpoint temporaries_ratio']:.3f}); step time ratio "
        f"{c['step_time_ratio']:.3f} (target at most 1.4)"
    )
    a = bench_autocast()
    print("\n3. bfloat16 autocast: the large linear step (batch 1024, W 1024x1024, 4x2 mesh)")
    for name, r in a.items():
        m = _mib(r["memory"])
        print(f"{name:<18} peak {m['peak']:7.1f} MiB  step {r['step_s'] * 1e3:7.1f} ms")
    t = bench_compile_time()
    print("\n4. Compile time (lower + XLA compile, s) of a GPT block stack's training step")
    names = list(next(iter(t["seconds"].values())))
    print(f"{'layers':<8}" + "".join(f"{n:>21}" for n in names))
    for layers, row in t["seconds"].items():
        print(f"{layers:<8}" + "".join(f"{row[n]:>21.2f}" for n in names))
    print(
        f"the deepest over the shallowest: scan_layers stacked "
        f"{t['stacked_deepest_over_shallowest']:.2f} (target at most 1.5), per-layer storage "
        f"{t['scan_deepest_over_shallowest']:.2f}; stacked over jax.jit lax.scan at the deepest "
        f"{t['stacked_over_lax_scan_deepest']:.2f} (target at most 1.2)"
    )
    att = bench_attention()
    print("\n5. Attention: causal, batch 2, 8 heads of 64, forward and backward; peak MiB")
    for seq, row in att.items():
        cells = "  ".join(
            f"{name} {r['memory']['peak'] / 2**20:8.1f}"
            + (f" ({r['step_s'] * 1e3:.0f} ms)" if "step_s" in r else "")
            for name, r in row.items()
            if isinstance(r, dict)
        )
        print(
            f"{seq:>6} keys  {cells}  rule / math {row['rule_over_math_peak']:.3f} (target at "
            f"most 0.25 at 8192), rule / jax {row['rule_over_jax_peak']:.3f}"
        )
    results = {
        "donation": d,
        "attention": att,
        "checkpointing": c,
        "autocast": a,
        "compile_time": t,
        "targets": {
            "ours_over_jax_max": 1.1,
            "ours_over_undonated_max": 0.7,
            "checkpoint_temporaries_ratio_max": 0.5,
            "checkpoint_step_time_ratio_max": 1.4,
            "stacked_deepest_over_shallowest_max": 1.5,
            "stacked_over_lax_scan_deepest_max": 1.2,
            "attention_rule_over_math_peak_at_8192_max": 0.25,
        },
        "environment": benchjson.environment(torch=torch.__version__, jax=jax.__version__),
    }
    benchjson.write(args.json, results)


if __name__ == "__main__":
    main()
