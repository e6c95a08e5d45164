"""Run many sharded SGD steps with collectives on 8 virtual CPU devices; report how long.

    python stress_collectives.py --steps 1000                 # through ir_runtime.execute:
                                                              # one program in flight while
                                                              # the host builds the next step
    python stress_collectives.py --steps 1000 --raw           # the compiled program back to
                                                              # back, waiting for each step
    python stress_collectives.py --steps 300 --raw --no-sync  # the same without waiting

--raw dispatches the compiled program back to back, as a plain jax loop does, so many
executions can be in flight; with --no-sync nothing waits, and on 2 cores XLA's CPU rendezvous
can time out and abort the process (README, collectives). The other modes must finish every time.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import jax  # noqa: E402
from models import data, leaf, linear_sgd_step, params, pinned  # noqa: E402

import ir_runtime as irt  # noqa: E402
from ir_core import Value, post_order  # noqa: E402
from ir_sharding import Mesh, ShardingSpec  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--raw", action="store_true")
    parser.add_argument("--no-sync", action="store_true")
    args = parser.parse_args()
    irt.init(cpu_devices=8)
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    xs, ws = ShardingSpec(mesh, ("data", None)), ShardingSpec(mesh, (None, "model"))
    rs = ShardingSpec.replicated(mesh)
    batches = [data(k, 32, 16, 8) for k in range(10)]
    w0, b0 = params(0, 16, 8)
    w, b = leaf(w0, ws), leaf(b0)
    start = time.perf_counter()
    if args.raw:
        x, y = batches[0]
        xl, yl = leaf(x, xs), leaf(y, xs)
        roots = pinned(linear_sgd_step(xl, yl, w, b), [ws, rs, None])
        exe = irt.compile(roots)
        leaves = [n for n in post_order(roots) if n.op == "device_data"]  # parameter order
        arrays = {
            id(n): jax.device_put(n.handle, s)
            for n, s in zip(leaves, exe.in_shardings, strict=True)
        }
        order = [id(n) for n in leaves]
        for _ in range(args.steps):
            new_w, new_b, loss = exe.compiled(*[arrays[k] for k in order])
            arrays[id(w.node)], arrays[id(b.node)] = new_w, new_b
            if not args.no_sync:
                loss.block_until_ready()
        print(
            f"{args.steps} raw steps in {time.perf_counter() - start:.1f} s, final loss "
            f"{float(loss):.4f}, waited for each: {not args.no_sync}"
        )
        return
    for k in range(args.steps):
        x, y = batches[k % len(batches)]
        roots = pinned(linear_sgd_step(leaf(x, xs), leaf(y, xs), w, b), [ws, rs, None])
        new_w, new_b, loss = irt.execute(roots)
        w, b = Value(new_w), Value(new_b)
    final = float(irt.to_host(loss))
    c = irt.metrics()["counters"]
    print(
        f"{args.steps} steps in {time.perf_counter() - start:.1f} s, final loss {final:.4f}, "
        f"compiles {c['CompileCount']}, collective waits {c['CollectiveSync']}"
    )


if __name__ == "__main__":
    main()
