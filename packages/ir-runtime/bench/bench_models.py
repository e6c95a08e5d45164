"""Hugging Face models on the lazy device, beside torch eager, in one run.

1. Greedy generation of 32 new tokens with a tiny Llama (batch 8, static KV cache) through
   ``irt.generate``: programs compiled, and the per-token latency once warm (a second
   generation of the same shapes), against eager's ``generate``; on one device, then on the
   4x2 mesh with the attention and MLP weights sharded over "model".
2. ``ShardedLoader``: the linear model's SGD step on the 4x2 mesh fed by the loader, against
   the same steps fed batches placed beforehand.
3. Training steps of tiny Llama, Qwen2, BERT and T5 under ``compile_step`` on the 4x2 mesh
   (batch sharded over "data"): a replayed step against the same compiled program run alone on
   the same buffers (the overhead above XLA), beside eager and ``mark_step``.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import copy
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "integration_tests"))  # hf_models

import hf_models  # noqa: E402

import benchjson  # noqa: E402
import ir_runtime as irt  # noqa: E402

irt.init(cpu_devices=8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def _megatron(lazy):
    """Attention and MLP weights over "model": in projections by rows, out projections by
    columns."""
    for layer in lazy.model.layers:
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj):
            irt.mark_sharding(lin.weight, MESH, ("model", None))
        for lin in (a.o_proj, m.down_proj):
            irt.mark_sharding(lin.weight, MESH, (None, "model"))


def bench_generate(new_tokens=32, batch=8, rounds=3, mesh=False):
    eager = hf_models.causal("llama", vocab_size=256, hidden_size=64).eval()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    if mesh:
        _megatron(lazy)
    torch.manual_seed(1)
    ids = torch.randint(1, 256, (batch, 8))
    mask = torch.ones_like(ids)
    kwargs = {
        "max_new_tokens": new_tokens,
        "do_sample": False,
        "pad_token_id": 0,
        "cache_implementation": "static",
        "attention_mask": mask,
    }

    def timed(fn):
        with torch.no_grad():
            start = time.perf_counter()
            out = fn()
            return time.perf_counter() - start, out

    irt.CACHE.clear()
    irt.reset_metrics()
    first, got = timed(lambda: irt.generate(lazy, ids, **kwargs))
    compiles = irt.metrics()["counters"]["CompileCount"]
    _, want = timed(lambda: eager.generate(ids, **kwargs))
    assert torch.equal(got, want), "the lazy tokens differ from eager's"
    lazy_t, eager_t = [], []
    for _ in range(rounds):  # alternating, warm
        lazy_t.append(timed(lambda: irt.generate(lazy, ids, **kwargs))[0])
        eager_t.append(timed(lambda: eager.generate(ids, **kwargs))[0])
    hits = irt.metrics()["counters"]["CompileCount"] - compiles
    lazy_ms = statistics.median(lazy_t) / new_tokens * 1e3
    eager_ms = statistics.median(eager_t) / new_tokens * 1e3
    return {
        "new_tokens": new_tokens,
        "batch": batch,
        "compiles_first_generation": compiles,
        "compiles_after": hits,
        "first_generation_s": first,
        "lazy_ms_per_token": lazy_ms,
        "eager_ms_per_token": eager_ms,
        "ratio": lazy_ms / eager_ms,
    }


def bench_loader(steps=60, rows=64, features=256):
    torch.manual_seed(0)
    data = [(torch.randn(rows, features), torch.randn(rows, 8)) for _ in range(8)]

    def run(batches):
        torch.manual_seed(1)
        model = irt.to_lazy(torch.nn.Linear(features, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        times = []
        for k, (x, y) in enumerate(batches):
            start = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            irt.mark_step()
            irt.wait_device_ops()
            if k >= 5:  # past compilation
                times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    def placed():
        out = []
        for k in range(steps):
            x, y = data[k % len(data)]
            x, y = irt.to_lazy(x), irt.to_lazy(y)
            irt.mark_sharding(x, MESH, ("data", None))
            irt.mark_sharding(y, MESH, ("data", None))
            out.append((x, y))
        return out

    def loaded():
        return irt.ShardedLoader((data[k % len(data)] for k in range(steps)), MESH, ("data", None))

    before = run(placed())  # placed before the loop starts: the floor
    with_loader = run(loaded())
    return {"preplaced_us": before, "loader_us": with_loader, "ratio": with_loader / before}


def bench_training(steps=12):
    out = {}
    for name, make in (
        ("llama", lambda: hf_models.causal("llama")),
        ("qwen2", lambda: hf_models.causal("qwen2")),
        ("bert", hf_models.bert),
        ("t5", hf_models.t5),
    ):
        out[name] = _bench_training(make, steps)
    return out


def _bench_training(make, steps):
    eager = make().train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    step = hf_models.training_step(eager, lazy)
    compiled = irt.compile_step(step)
    ids, labels = torch.randint(1, 96, (8, 16)), torch.randint(0, 3, (8,))

    def lazy_batch():
        lids = irt.to_lazy(ids)
        irt.mark_sharding(lids, MESH, ("data", None))
        return lids, irt.to_lazy(labels)

    ran = []  # the executable and its buffers, as the last replay ran them
    times = {"replay": [], "alone": [], "mark_step": [], "eager": []}
    for k in range(steps):
        lids, llabels = lazy_batch()
        start = time.perf_counter()
        compiled(lazy, lids, llabels)
        irt.wait_device_ops()
        if k >= 4:
            times["replay"].append(time.perf_counter() - start)
    assert compiled.replaying, compiled.reason
    plan = next(iter(compiled._replay.values()))
    exe, run = plan.exe, plan.exe.run
    exe.run = lambda arrays: ran.append(arrays) or run(arrays)
    compiled(lazy, *lazy_batch())
    exe.run = run
    for _ in range(steps - 4):
        start = time.perf_counter()
        exe.compiled(*ran[-1])[0].block_until_ready()
        times["alone"].append(time.perf_counter() - start)
    for k in range(steps):
        lids, llabels = lazy_batch()
        start = time.perf_counter()
        step(lazy, lids, llabels)
        irt.mark_step()
        irt.wait_device_ops()
        if k >= 4:
            times["mark_step"].append(time.perf_counter() - start)
        start = time.perf_counter()
        step(eager, ids, labels)
        if k >= 4:
            times["eager"].append(time.perf_counter() - start)
    us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    us["replay_over_alone"] = us["replay"] / us["alone"]
    return us


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    gen = bench_generate()
    print("Greedy generation, tiny Llama, static cache, one device (programs: prefill + decode)")
    print(
        f"  {gen['new_tokens']} tokens, batch {gen['batch']}: compiles"
        f" {gen['compiles_first_generation']} then {gen['compiles_after']}; per token"
        f" {gen['lazy_ms_per_token']:.2f} ms lazy,"
        f" {gen['eager_ms_per_token']:.2f} ms eager: {gen['ratio']:.2f}x"
    )
    print("  targets: at most 3 compiles; at most 2x eager per token")
    gen_mesh = bench_generate(mesh=True)
    print(
        f'  the same on the 4x2 mesh (weights over "model"): compiles'
        f" {gen_mesh['compiles_first_generation']}; per token {gen_mesh['lazy_ms_per_token']:.2f}"
        f" ms lazy, {gen_mesh['eager_ms_per_token']:.2f} ms eager: {gen_mesh['ratio']:.2f}x"
    )
    loader = bench_loader()
    print("ShardedLoader, linear SGD step on the 4x2 mesh, median us per step")
    print(
        f"  batches placed beforehand {loader['preplaced_us']:.0f}, through the loader"
        f" {loader['loader_us']:.0f}: {loader['ratio']:.2f}x (target: at most 1.05x)"
    )
    training = bench_training()
    print("Training steps under compile_step, 4x2 mesh, batch 8 x 16 tokens, median us per step")
    print(f"  {'model':8} {'eager':>8} {'mark_step':>10} {'replay':>8} {'alone':>8} replay/alone")
    for name, t in training.items():
        print(
            f"  {name:8} {t['eager']:8.0f} {t['mark_step']:10.0f} {t['replay']:8.0f}"
            f" {t['alone']:8.0f} {t['replay_over_alone']:8.2f}x"
        )
    print("  target: replay at most 1.2x the program run alone")
    benchjson.write(
        args.json,
        {
            "generate": gen,
            "generate_4x2": gen_mesh,
            "loader": loader,
            "training": training,
            "environment": benchjson.environment(
                torch=torch.__version__, jax=jax.__version__, transformers=transformers.__version__
            ),
        },
    )


if __name__ == "__main__":
    main()
