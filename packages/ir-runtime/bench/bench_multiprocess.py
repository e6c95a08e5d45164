"""2 processes x 4 CPU devices against 1 process x 8 devices: the linear-model SGD step of
bench_frontend (nn.Linear, MSE, SGD, mark_step; W sharded on "model", the batch on "data" of a
4x2 mesh), per-step medians and their ratio.

    python bench_multiprocess.py [--steps 100] [--json out.json]

Each configuration runs in fresh processes (twice, alternating); in the 2-process runs each
process feeds only its half of the batch, and the collectives between processes go over gloo
on loopback.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # the repository root: benchjson
sys.path.insert(0, HERE)  # bench_runtime's jax.jit step
SIZES = {"tiny": (16, 32, 8), "large": (1024, 1024, 1024)}


def worker(size: str, steps: int) -> None:
    import numpy as np
    import torch

    import ir_runtime as irt

    irt.init()
    batch, n_in, n_out = SIZES[size]
    mesh = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
    torch.manual_seed(0)
    model = irt.to_lazy(torch.nn.Linear(n_in, n_out))
    irt.mark_sharding(model.weight, mesh, ("model", None))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, n_in, generator=g), torch.randn(batch, n_out, generator=g)
    spec = ("data", None)
    lx = irt.from_process_local(x[irt.process_local_slices(mesh, spec, x.shape)], mesh, spec)
    ly = irt.from_process_local(y[irt.process_local_slices(mesh, spec, y.shape)], mesh, spec)

    def step():
        loss = torch.nn.functional.mse_loss(model(lx), ly)
        loss.backward()
        opt.step()
        opt.zero_grad()
        irt.mark_step()
        return loss

    for _ in range(5):
        step()
    loss = step()
    loss.item()
    times = []
    for _ in range(max(3, steps // 10)):  # blocks of 10 steps, each waited for
        t0 = time.perf_counter()
        for _ in range(10):
            loss = step()
        irt.wait_device_ops()
        times.append((time.perf_counter() - t0) / 10)
    final = loss.item()
    jax_us = jax_peer(mesh, x.numpy(), y.numpy(), steps)
    if irt.process_index() == 0:
        result = {"us": statistics.median(times) * 1e6, "jax_us": jax_us, "loss": final}
        print("RESULT " + json.dumps(result))


def jax_peer(mesh, x, y, steps) -> float:
    """The hand-written jax.jit step of bench_runtime over the same devices, each process
    feeding its half of the batch; median microseconds (each step waits for its loss)."""
    import jax
    import numpy as np
    from bench_runtime import jax_step_fn

    import ir_runtime as irt

    fn, xs, ws, rep = jax_step_fn(lr=0.01)
    sl = irt.process_local_slices(mesh, ("data", None), x.shape)
    jx = jax.make_array_from_process_local_data(xs, x[sl], x.shape)
    jy = jax.make_array_from_process_local_data(xs, y[sl], y.shape)
    zeros_w = np.zeros((x.shape[1], y.shape[1]), np.float32)
    w = jax.make_array_from_callback(zeros_w.shape, ws, lambda i: zeros_w[i])
    b = jax.make_array_from_callback(
        (y.shape[1],), rep, lambda i: np.zeros(y.shape[1], np.float32)[i]
    )
    times = []
    for k in range(steps + 5):
        t0 = time.perf_counter()
        w, b, loss = fn(w, b, jx, jy)
        loss.block_until_ready()
        if k >= 5:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def run(config: str, size: str, steps: int) -> dict:
    me = [os.path.abspath(__file__), "--worker", size, "--steps", str(steps)]
    env = dict(os.environ)
    if config == "1x8":
        env["IR_RUNTIME_CPU_DEVICES"] = "8"
        cmd = [sys.executable, *me]
    else:
        cmd = [sys.executable, "-m", "ir_runtime.launch", "--nprocs", "2", "--cpu-devices", "4"]
        cmd += me
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"{config} {size} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--json")
    parser.add_argument("--worker", choices=list(SIZES))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    results = {}
    print("Linear-model SGD step, 4x2 mesh, per-step medians (us)")
    print(
        f"{'size':<8}{'1 process x 8':>16}{'2 processes x 4':>18}{'ratio':>8}"
        f"{'jax.jit 1x8':>14}{'jax.jit 2x4':>14}{'ratio':>8}"
    )
    for size in SIZES:
        steps = args.steps if size == "tiny" else max(10, args.steps // 5)
        samples = {"1x8": [], "2x4": []}
        peer = {"1x8": [], "2x4": []}
        losses = {}
        for _ in range(2):
            for config in samples:
                r = run(config, size, steps)
                samples[config].append(r["us"])
                peer[config].append(r["jax_us"])
                losses[config] = r["loss"]
        one, two = min(samples["1x8"]), min(samples["2x4"])
        j1, j2 = min(peer["1x8"]), min(peer["2x4"])
        results[size] = {
            "us_1x8": round(one, 1),
            "us_2x4": round(two, 1),
            "ratio_2x4_over_1x8": round(two / one, 3),
            "jax_us_1x8": round(j1, 1),
            "jax_us_2x4": round(j2, 1),
            "jax_ratio_2x4_over_1x8": round(j2 / j1, 3),
            "final_loss": losses,
        }
        print(
            f"{size:<8}{one:>16.0f}{two:>18.0f}{two / one:>8.2f}{j1:>14.0f}{j2:>14.0f}"
            f"{j2 / j1:>8.2f}"
        )
    if args.json:
        import jax
        import torch

        import benchjson

        env = benchjson.environment(torch=torch.__version__, jax=jax.__version__)
        benchjson.write(args.json, {"sgd_step": results, "environment": env})


if __name__ == "__main__":
    main()
