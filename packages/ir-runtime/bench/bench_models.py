"""Hugging Face models on the lazy device, beside torch eager, in one run.

1. Greedy generation of 32 new tokens with a tiny Llama (batch 8) through the lazy model's own
   ``generate`` with default arguments (``irt.generate``'s path, the static KV cache): programs
   compiled, values read to the host per token, and the per-token latency once warm (a second
   generation of the same shapes), against eager's ``generate`` with the static cache; on one
   device, then on the 4x2 mesh with the attention and MLP weights sharded over "model".
2. ``ShardedLoader`` on the 4x2 mesh: the linear model's SGD step (a few hundred us) and a
   tiny Llama's compiled training step fed by the loader, against the same loops fed batches
   placed beforehand.
3. Training steps of tiny Llama, Qwen2, GPT-2, BERT and T5 under ``compile_step`` on the 4x2 mesh
   (batch sharded over "data"): a replayed step against the same compiled program run alone on
   the same buffers (the overhead above XLA), beside eager and ``mark_step``.
4. The TP tutorial's Llama on a (2, 4) ``irt.device_mesh`` under its TP + SP plan and FSDP2
   (``parallelize_module``, ``fully_shard``), against the same placements written as
   ``mark_sharding`` calls: replayed step times in alternating rounds, the compiled programs'
   collectives and peak bytes, eager beside.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import copy
import functools
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "integration_tests"))  # hf_models

import hf_models  # noqa: E402
import tp_llama  # noqa: E402

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
        "attention_mask": mask,
    }
    static = {**kwargs, "cache_implementation": "static"}

    def timed(fn):
        with torch.no_grad():
            start = time.perf_counter()
            out = fn()
            return time.perf_counter() - start, out

    irt.CACHE.clear()
    irt.reset_metrics()
    first, got = timed(lambda: lazy.generate(ids, **kwargs))
    compiles = irt.metrics()["counters"]["CompileCount"]
    _, want = timed(lambda: eager.generate(ids, **static))
    assert torch.equal(got, want), "the lazy tokens differ from eager's"
    lazy_t, eager_t = [], []
    reads = irt.metrics()["counters"]["TransferToHost"]
    for _ in range(rounds):  # alternating, warm
        lazy_t.append(timed(lambda: lazy.generate(ids, **kwargs))[0])
        eager_t.append(timed(lambda: eager.generate(ids, **static))[0])
    reads = (irt.metrics()["counters"]["TransferToHost"] - reads) / (rounds * new_tokens)
    hits = irt.metrics()["counters"]["CompileCount"] - compiles
    lazy_ms = statistics.median(lazy_t) / new_tokens * 1e3
    eager_ms = statistics.median(eager_t) / new_tokens * 1e3
    return {
        "new_tokens": new_tokens,
        "batch": batch,
        "compiles_first_generation": compiles,
        "compiles_after": hits,
        "host_reads_per_token": reads,
        "first_generation_s": first,
        "lazy_ms_per_token": lazy_ms,
        "eager_ms_per_token": eager_ms,
        "ratio": lazy_ms / eager_ms,
    }


def bench_loader(steps=40, rounds=7):
    """Training loops fed by ``ShardedLoader`` against the same loops fed batches placed
    before the loop: wall time per step, the batch's ``next`` included, with no wait between
    steps (as a training loop runs: each step dispatched while the last one runs). Rounds
    alternate the two; the ratio is the median of the rounds' ratios."""
    out = {}
    for name, make in (("linear", _linear_loop), ("llama", _llama_loop)):
        step, data = make()
        data = data * (steps // len(data) + 1)
        feeds = {
            "preplaced": functools.partial(_preplaced, data),
            "loader": functools.partial(_through_loader, data),
        }
        for feed in feeds.values():  # compile, and warm both
            _loop(step, feed(), 4)
        times = {k: [] for k in feeds}
        for _ in range(rounds):
            for k, feed in feeds.items():
                times[k].append(_loop(step, feed(), steps))
        pairs = list(zip(times["preplaced"], times["loader"], strict=True))
        out[name] = {
            "preplaced_us": statistics.median(times["preplaced"]),
            "loader_us": statistics.median(times["loader"]),
            "ratio": statistics.median(b / a for a, b in pairs),
            "per_batch_us": statistics.median(b - a for a, b in pairs),
        }
    return out


def _preplaced(data):
    return iter([_placed(b) for b in data])


def _through_loader(data):
    return iter(irt.ShardedLoader(data, MESH, ("data", None)))


def _placed(batch):
    out = []
    for t in batch:
        lt = irt.to_lazy(t)
        irt.mark_sharding(lt, MESH, ("data",) + (None,) * (t.dim() - 1))
        out.append(lt)
    return out


def _loop(step, batches, steps):
    """Wall time per step over ``steps`` steps (after one to settle)."""
    x, y = next(batches)
    step(x, y)
    irt.wait_device_ops()
    start = time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        step(x, y)
    irt.wait_device_ops()
    return (time.perf_counter() - start) / steps * 1e6


def _linear_loop(rows=64, features=256):
    """The linear model's SGD step through ``mark_step``: a step of a few hundred us, the
    worst case for what placing a batch costs."""
    torch.manual_seed(0)
    data = [(torch.randn(rows, features), torch.randn(rows, 8)) for _ in range(8)]
    model = irt.to_lazy(torch.nn.Linear(features, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        irt.mark_step()

    return step, data


def _llama_loop():
    """A tiny Llama's AdamW training step under ``compile_step`` (replayed), batches of 8 x 16
    tokens."""
    eager = hf_models.causal("llama").train()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    compiled = irt.compile_step(hf_models.training_step(eager, lazy))
    torch.manual_seed(0)
    data = [(torch.randint(1, 96, (8, 16)), torch.randint(1, 96, (8, 16))) for _ in range(8)]
    return (lambda ids, labels: compiled(lazy, ids, labels)), data


def bench_training(steps=12):
    out = {}
    for name, make in (
        ("llama", lambda: hf_models.causal("llama")),
        ("qwen2", lambda: hf_models.causal("qwen2")),
        ("gpt2", hf_models.gpt2),
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
    plan = next(iter(compiled._replay.values()))[0]  # (the key's first plan)
    exe, run = plan.exe, plan.exe.run
    exe.run = lambda arrays: ran.append([_copy(a) for a in arrays]) or run(arrays)
    compiled(lazy, *lazy_batch())
    exe.run = run
    # fresh buffers for every run, made beforehand: the program takes donated ones over
    fresh = [[_copy(a) for a in ran[-1]] for _ in range(steps - 4)]
    jax.block_until_ready(fresh)
    for arrays in fresh:
        start = time.perf_counter()
        exe.compiled(*arrays)[0].block_until_ready()
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


def bench_plans(steps=24):
    """Section 4: the plan against its hand-written annotations, rounds alternating."""
    import re

    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from ir_runtime._frontend import inspect

    mesh = irt.device_mesh((2, 4), ("dp", "tp"))
    eager = tp_llama.build()
    models = {
        "plan": tp_llama.parallelize(irt.to_lazy(copy.deepcopy(eager)), mesh),
        "hand": tp_llama.annotate_by_hand(irt.to_lazy(copy.deepcopy(eager)), mesh._ir_mesh),
        "eager": eager,
    }
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}

    def step(name, tokens, labels):
        loss = F.cross_entropy(models[name](tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        opts[name].step()
        opts[name].zero_grad()
        return loss

    compiled = {k: irt.compile_step(functools.partial(step, k)) for k in ("plan", "hand")}
    times = {k: [] for k in models}
    programs = {}
    tokens, labels = torch.randint(0, 128, (8, 16)), torch.randint(0, 128, (8, 16))
    for k in range(steps):
        # (the order flips every round: the second program of a round runs slower here)
        for name in ("plan", "hand", "eager") if k % 2 else ("hand", "plan", "eager"):
            if name == "eager":
                start = time.perf_counter()
                step("eager", tokens, labels)
            else:
                batch = [
                    distribute_tensor(t, mesh, [Shard(0), Replicate()]) for t in (tokens, labels)
                ]
                start = time.perf_counter()
                compiled[name](*batch)
                irt.wait_device_ops()
                exe = inspect.last_executable()
                text = exe.compiled.as_text()
                programs[name] = {
                    c: len(re.findall(rf"= \S+ {c}(-start)?\(", text))
                    for c in ("all-reduce", "all-gather", "reduce-scatter", "collective-permute")
                } | {"peak_bytes": exe.memory()["peak"]}
            if k >= 4:
                times[name].append(time.perf_counter() - start)
    out = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    out["plan_over_hand"] = out["plan"] / out["hand"]
    out["programs"] = programs
    return out


def _copy(a):
    """A copy of ``a`` in buffers of its own, placed as ``a`` is."""
    return jax.device_put(jax.numpy.copy(a), a.sharding)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    gen = bench_generate()
    print("Greedy generation, tiny Llama, static cache, one device (programs: prefill + decode)")
    print(
        f"  {gen['new_tokens']} tokens, batch {gen['batch']}: compiles"
        f" {gen['compiles_first_generation']} then {gen['compiles_after']}; host reads per"
        f" token {gen['host_reads_per_token']:.2f}; per token"
        f" {gen['lazy_ms_per_token']:.2f} ms lazy,"
        f" {gen['eager_ms_per_token']:.2f} ms eager: {gen['ratio']:.2f}x"
    )
    print("  targets: at most 3 compiles; 1 host read per token; at most 1.5x eager per token")
    gen_mesh = bench_generate(mesh=True)
    print(
        f'  the same on the 4x2 mesh (weights over "model"): compiles'
        f" {gen_mesh['compiles_first_generation']}; per token {gen_mesh['lazy_ms_per_token']:.2f}"
        f" ms lazy, {gen_mesh['eager_ms_per_token']:.2f} ms eager: {gen_mesh['ratio']:.2f}x"
    )
    loader = bench_loader()
    print("ShardedLoader on the 4x2 mesh, us per step (the batch's next included), no waits")
    for name, t in loader.items():
        print(
            f"  {name:8} placed beforehand {t['preplaced_us']:.0f}, through the loader"
            f" {t['loader_us']:.0f}: {t['ratio']:.3f}x ({t['per_batch_us']:.0f} us a batch)"
        )
    print("  target: at most 1.05x")
    training = bench_training()
    print("Training steps under compile_step, 4x2 mesh, batch 8 x 16 tokens, median us per step")
    print(f"  {'model':8} {'eager':>8} {'mark_step':>10} {'replay':>8} {'alone':>8} replay/alone")
    for name, t in training.items():
        print(
            f"  {name:8} {t['eager']:8.0f} {t['mark_step']:10.0f} {t['replay']:8.0f}"
            f" {t['alone']:8.0f} {t['replay_over_alone']:8.2f}x"
        )
    print("  target: replay at most 1.2x the program run alone")
    plans = bench_plans()
    print("The TP tutorial's Llama, TP + SP plan and FSDP2 on a 2x4 mesh, median us per step")
    print(
        f"  placements {plans['plan']:.0f}, the same by mark_sharding {plans['hand']:.0f}:"
        f" {plans['plan_over_hand']:.2f}x (eager {plans['eager']:.0f})"
    )
    print(f"  programs: placements {plans['programs']['plan']}")
    print(f"            mark_sharding {plans['programs']['hand']}")
    print("  target: the same program (collectives, peak bytes); times within the spread")
    benchjson.write(
        args.json,
        {
            "generate": gen,
            "generate_4x2": gen_mesh,
            "loader": loader,
            "training": training,
            "plans": plans,
            "environment": benchjson.environment(
                torch=torch.__version__, jax=jax.__version__, transformers=transformers.__version__
            ),
        },
    )


if __name__ == "__main__":
    main()
