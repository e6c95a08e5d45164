"""ir-runtime benchmarks, side by side in one run.

1. A linear-model SGD step (y = x @ W + b, MSE) as an IR graph, W sharded (None, "model") and x
   ("data", None) over a 4x2 mesh of virtual CPU devices, against the same step hand-written in
   jax.jit with the same shardings; batch 16 / W 32x8 and batch 1024 / W 1024x1024. The IR step
   is what a front end does every step: build the graph over new leaves, then execute (cache
   hit, place, run, bind results). Both wait for each step to finish (XLA CPU collectives must
   not overlap; README, collectives). The steps alternate; the overhead is the median of the paired
   differences.
2. Compile-cache lookup of a 10,000-node graph: prepare, hash, key, fingerprint, find.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import benchjson  # noqa: E402
import ir_runtime as irt  # noqa: E402

# 8 devices, unless a launcher (bench_multiprocess) already chose this process's count.
irt.init(cpu_devices=None if os.environ.get("IR_RUNTIME_CPU_DEVICES") else 8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402
from models import linear_sgd_step, pinned  # noqa: E402

from ir_core import DeviceData, Generic, Shape, Value  # noqa: E402
from ir_sharding import Mesh, ShardingSpec  # noqa: E402

MESH = Mesh(range(8), (4, 2), ("data", "model"))
XS, WS = ShardingSpec(MESH, ("data", None)), ShardingSpec(MESH, (None, "model"))
RS = ShardingSpec.replicated(MESH)


def jax_step_fn(lr=0.1):
    jm = XS.to_jax().mesh
    xs, ws = (
        NamedSharding(jm, PartitionSpec("data", None)),
        NamedSharding(jm, PartitionSpec(None, "model")),
    )
    rep = NamedSharding(jm, PartitionSpec())

    def step(w, b, x, y):
        diff = x @ w + b - y
        loss = jnp.mean(diff * diff)
        grad = diff * (2.0 / diff.size)
        return w - lr * (x.T @ grad), b - lr * grad.sum(0), loss

    return jax.jit(step, in_shardings=(ws, rep, xs, xs), out_shardings=(ws, rep, rep)), xs, ws, rep


def time_steps(step, steps):
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6, samples


def bench_sgd(batch, n_in, n_out, steps, warmup=5):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    y = rng.standard_normal((batch, n_out)).astype(np.float32)
    w0 = (rng.standard_normal((n_in, n_out)) * 0.01).astype(np.float32)
    b0 = np.zeros(n_out, np.float32)

    fn, xs, ws, rep = jax_step_fn()
    jx, jy = jax.device_put(x, xs), jax.device_put(y, xs)
    state = [jax.device_put(w0, ws), jax.device_put(b0, rep)]

    def jax_step():
        w, b, loss = fn(state[0], state[1], jx, jy)
        jax.block_until_ready(loss)
        state[0], state[1] = w, b

    f32 = Shape("float32", (batch, n_in))
    fy = Shape("float32", (batch, n_out))
    ix, iy = jax.device_put(x, XS.to_jax()), jax.device_put(y, XS.to_jax())
    ir_state = [irt.to_device(w0, WS), irt.to_device(b0)]

    def ir_step():
        roots = linear_sgd_step(
            Value(DeviceData(f32, handle=ix, sharding=XS)),
            Value(DeviceData(fy, handle=iy, sharding=XS)),
            Value(ir_state[0]),
            Value(ir_state[1]),
        )
        new_w, new_b, _ = irt.execute(pinned(roots, [WS, RS, None]))
        ir_state[0], ir_state[1] = new_w, new_b
        irt.wait_device_ops()  # execute returns once launched; wait as the jax step does

    for _ in range(warmup):
        jax_step()
        ir_step()
    # Alternate step by step, so both see the same moments of a noisy machine.
    jax_samples, ir_samples = [], []
    for _ in range(steps):
        jax_samples += time_steps(jax_step, 1)[1]
        ir_samples += time_steps(ir_step, 1)[1]
    j = statistics.median(jax_samples) * 1e6
    i = statistics.median(ir_samples) * 1e6
    # Each IR step ran right after a jax step: the median of the pairs' differences is the
    # host overhead, robust to the machine's slow and fast moments.
    paired = statistics.median(a - b for a, b in zip(ir_samples, jax_samples, strict=True)) * 1e6
    build = []
    for _ in range(200):
        t0 = time.perf_counter()
        linear_sgd_step(
            Value(DeviceData(f32, handle=ix, sharding=XS)),
            Value(DeviceData(fy, handle=iy, sharding=XS)),
            Value(ir_state[0]),
            Value(ir_state[1]),
        )
        build.append(time.perf_counter() - t0)
    loss_ir = float(
        irt.to_host(
            irt.execute(
                pinned(
                    linear_sgd_step(
                        Value(DeviceData(f32, handle=ix, sharding=XS)),
                        Value(DeviceData(fy, handle=iy, sharding=XS)),
                        Value(ir_state[0]),
                        Value(ir_state[1]),
                    ),
                    [WS, RS, None],
                )
            )[2]
        )
    )
    return {
        "batch": batch,
        "w": [n_in, n_out],
        "jax_jit_us": round(j, 1),
        "ir_us": round(i, 1),
        "ratio": round(i / j, 3),
        "overhead_us": round(paired, 1),
        "graph_build_us": round(statistics.median(build) * 1e6, 1),
        "final_loss": loss_ir,
    }


def bench_lookup(nodes, repeats):
    s = Shape("float32", (8, 8))
    x = DeviceData(s, handle=np.ones((8, 8), np.float32))

    def graph():
        v = Value(x)
        for k in range(nodes - 1):
            v = Value(
                Generic(
                    "aten::mul.Scalar" if k % 2 else "aten::add.Scalar",
                    [v],
                    [s],
                    {"other": 0.5, "alpha": 1} if k % 2 == 0 else {"other": 0.5},
                )
            )
        return [v]

    irt.CACHE.get(graph())  # compile once
    samples = []
    for _ in range(repeats):
        roots = graph()
        t0 = time.perf_counter()
        irt.CACHE.get(roots)
        samples.append(time.perf_counter() - t0)
    return {"nodes": nodes, "lookup_ms": round(statistics.median(samples) * 1e3, 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    tiny = bench_sgd(16, 32, 8, args.steps)
    large = bench_sgd(1024, 1024, 1024, max(20, args.steps // 5), warmup=3)
    lookup = bench_lookup(10_000, 15)
    print("\nLinear-model SGD step, 4x2 mesh, per-step medians (both wait for each step)")
    print(
        f"{'size':<28}{'jax.jit us':>12}{'ir_runtime us':>15}{'ratio':>8}{'overhead us':>13}"
        f"{'of it: graph build us':>23}"
    )
    for name, r in [("tiny: batch 16, W 32x8", tiny), ("large: batch 1024, W 1024^2", large)]:
        print(
            f"{name:<28}{r['jax_jit_us']:>12.0f}{r['ir_us']:>15.0f}{r['ratio']:>8.2f}"
            f"{r['overhead_us']:>13.0f}{r['graph_build_us']:>23.0f}"
        )
    print("targets: tiny at most jax.jit + 100 us; large at most 1.05x jax.jit")
    print(
        f"\ncompile-cache lookup, {lookup['nodes']:,}-node graph: "
        f"{lookup['lookup_ms']:.2f} ms (target <= 5 ms)"
    )
    results = {
        "sgd_tiny": tiny,
        "sgd_large": large,
        "cache_lookup": lookup,
        "targets": {"tiny_overhead_us_max": 100, "large_ratio_max": 1.05, "lookup_ms_max": 5},
        "environment": benchjson.environment(jax=jax.__version__),
    }
    benchjson.write(args.json, results)


if __name__ == "__main__":
    main()
