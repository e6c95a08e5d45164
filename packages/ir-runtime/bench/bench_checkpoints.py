"""Sharded checkpoints: save and restore throughput, async saving's cost, time to resume.

1. About 1 GB of sharded state (a stack of float32 weights over the 8 devices of a 4x2 mesh):
   ``CheckpointManager.save`` and ``restore`` throughput, beside ``torch.save`` of the same
   state as host tensors and the disk's raw write speed (``dd`` of as many bytes, fsync'd).
2. A training loop with ``save_async`` every 10 steps against the same loop saving nothing
   (past the first save, which starts orbax's machinery once per run).
3. From ``restore`` to the first step's result, against the first step of a fresh start.

Prints a table and writes JSON (``--json PATH``).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))  # benchjson, at the top

import benchjson  # noqa: E402
import ir_runtime as irt  # noqa: E402

irt.init(cpu_devices=8)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

MESH = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))


def _state(total_bytes):
    """Weights of 4096 x 4096 float32 (64 MiB each), sharded over both axes."""
    n = max(1, total_bytes // (4096 * 4096 * 4))
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(4096, 4096, bias=False) for _ in range(n))
    lazy = irt.to_lazy(layers)
    for layer in lazy:
        irt.mark_sharding(layer.weight, MESH, (("data", "model"), None))
    return layers, lazy


def _dd(path, nbytes) -> float:
    """Seconds to write ``nbytes`` with dd, synced to the disk."""
    start = time.perf_counter()
    subprocess.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={path}",
            "bs=16M",
            f"count={max(1, nbytes >> 24)}",
            "conv=fsync",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def bench_throughput(total_bytes=1 << 30):
    host, lazy = _state(total_bytes)
    nbytes = sum(p.numel() * 4 for p in lazy.parameters())
    root = tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        raw = _dd(os.path.join(root, "dd.bin"), nbytes)
        os.remove(os.path.join(root, "dd.bin"))
        start = time.perf_counter()
        torch.save(host.state_dict(), os.path.join(root, "torch.pt"))
        os.sync()
        torch_s = time.perf_counter() - start
        ckpt = irt.CheckpointManager(os.path.join(root, "ours"))
        start = time.perf_counter()
        ckpt.save(1, {"model": lazy})
        os.sync()
        save_s = time.perf_counter() - start
        fresh = irt.to_lazy(
            torch.nn.ModuleList(torch.nn.Linear(4096, 4096, bias=False) for _ in range(len(lazy)))
        )
        for layer in fresh:
            irt.mark_sharding(layer.weight, MESH, (("data", "model"), None))
        start = time.perf_counter()
        irt.CheckpointManager(os.path.join(root, "ours")).restore(1, {"model": fresh})
        jax.block_until_ready([p._ir.node.handle for p in fresh.parameters()])
        restore_s = time.perf_counter() - start
        start = time.perf_counter()
        torch.load(os.path.join(root, "torch.pt"))
        torch_load_s = time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gb = nbytes / 1e9
    return {
        "bytes": nbytes,
        "dd_GBps": gb / raw,
        "save_GBps": gb / save_s,
        "restore_GBps": gb / restore_s,
        "torch_save_GBps": gb / torch_s,
        "torch_load_GBps": gb / torch_load_s,
        "save_over_dd": raw / save_s,
    }


def _loop(steps, every, directory=None):
    torch.manual_seed(0)
    model = irt.to_lazy(
        torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    )
    irt.mark_sharding(model[0].weight, MESH, ("model", None))
    irt.mark_sharding(model[2].weight, MESH, (None, "model"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = irt.CheckpointManager(directory, max_to_keep=2) if every else None
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 512, generator=g)
    times = []
    for k in range(1, steps + 1):
        start = time.perf_counter()
        lx = irt.to_lazy(x)
        irt.mark_sharding(lx, MESH, ("data", None))
        model(lx).square().mean().backward()
        opt.step()
        opt.zero_grad()
        irt.mark_step()
        # (the first save, at step 5, is untimed: orbax starts its machinery, once per run)
        if ckpt is not None and (k % every == 0 or k == 5):
            ckpt.save_async(k, {"model": model, "optim": opt})
        irt.wait_device_ops()
        if k > 5:
            times.append(time.perf_counter() - start)
    if ckpt is not None:
        ckpt.join()
    return sum(times) / len(times), model, opt


def bench_async(steps=60, every=10):
    root = tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        plain, _, _ = _loop(steps, 0)
        saving, _, _ = _loop(steps, every, os.path.join(root, "run"))
        plain2, _, _ = _loop(steps, 0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = (plain + plain2) / 2
    return {
        "step_ms": base * 1e3,
        "saving_step_ms": saving * 1e3,
        "throughput_ratio": base / saving,
    }


def bench_resume():
    root = tempfile.mkdtemp(prefix="ckpt-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        _, model, opt = _loop(12, 0)
        irt.CheckpointManager(os.path.join(root, "run")).save(12, {"model": model, "optim": opt})
        irt.CACHE.clear()

        def first_step(restore):
            start = time.perf_counter()
            torch.manual_seed(0)
            m = irt.to_lazy(
                torch.nn.Sequential(
                    torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)
                )
            )
            irt.mark_sharding(m[0].weight, MESH, ("model", None))
            irt.mark_sharding(m[2].weight, MESH, (None, "model"))
            o = torch.optim.AdamW(m.parameters(), lr=1e-3)
            if restore:
                irt.CheckpointManager(os.path.join(root, "run")).restore(
                    None, {"model": m, "optim": o}
                )
            lx = irt.to_lazy(torch.randn(256, 512))
            irt.mark_sharding(lx, MESH, ("data", None))
            loss = m(lx).square().mean()
            loss.backward()
            o.step()
            o.zero_grad()
            loss.item()
            return time.perf_counter() - start

        fresh = first_step(False)
        irt.CACHE.clear()
        resumed = first_step(True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"fresh_first_step_s": fresh, "resumed_first_step_s": resumed}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    t = bench_throughput()
    print(f"\n1. {t['bytes'] / 2**30:.2f} GiB of state sharded over 8 devices, GB/s")
    print(
        f"dd (raw disk) {t['dd_GBps']:.2f}   CheckpointManager.save {t['save_GBps']:.2f} "
        f"({t['save_over_dd']:.2f}x dd; target at least 0.5x)   restore {t['restore_GBps']:.2f}   "
        f"torch.save {t['torch_save_GBps']:.2f}   torch.load {t['torch_load_GBps']:.2f}"
    )
    a = bench_async()
    print(
        f"\n2. save_async every 10 steps: {a['saving_step_ms']:.1f} ms per step against "
        f"{a['step_ms']:.1f} ms saving nothing: throughput {a['throughput_ratio']:.2f}x "
        f"(target at least 0.9x)"
    )
    r = bench_resume()
    print(
        f"\n3. to the first step's result: resumed {r['resumed_first_step_s']:.2f} s, fresh "
        f"start {r['fresh_first_step_s']:.2f} s (both compiling their programs)"
    )
    results = {
        "throughput": t,
        "async": a,
        "resume": r,
        "targets": {"save_over_dd_min": 0.5, "async_throughput_ratio_min": 0.9},
        "environment": benchjson.environment(torch=torch.__version__, jax=jax.__version__),
    }
    benchjson.write(args.json, results)


if __name__ == "__main__":
    main()
