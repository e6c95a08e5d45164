"""Train the integration suite's linear model or CNN over 8 devices: in one process, or as one
of several processes under ``python -m ir_runtime.launch`` (each loads only its part of every
batch). Process 0 writes the per-step losses and the final parameters to ``--out``.

    IR_RUNTIME_CPU_DEVICES=8 python spmd_train.py --model linear --mode fsdp --out one.npz
    python -m ir_runtime.launch --nprocs 2 --cpu-devices 4 spmd_train.py --out two.npz
"""

import argparse
import os
import sys
import time

import numpy as np

import ir_runtime as irt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _local_batches(data, mesh, steps):
    """This process's rows of every batch (``process_local_slices``), as host tensors."""
    for k in range(steps):
        x, y = data[k % len(data)]
        yield tuple(
            t[irt.process_local_slices(mesh, ("data",) + (None,) * (t.dim() - 1), t.shape)]
            for t in (x, y)
        )


def train(
    model_name: str,
    mode: str,
    steps=None,
    sleep=0.0,
    log=None,
    raise_at=None,
    compiled=False,
    loader=False,
):
    """Per-step losses, final parameters (numpy) and the compile count of one training run.
    Every process calls it; each feeds only its own part of every batch. ``compiled``: the step
    is an ``irt.compile_step``, replayed once captured. ``loader``: the batches come through an
    ``irt.ShardedLoader`` over this process's rows."""
    if model_name == "linear":
        import test_linear_spmd as suite
    else:
        import test_cnn_spmd as suite
    mesh = suite.MESH
    model = irt.to_lazy(suite.make_model())
    suite.shard(model, mode)
    opt = suite.make_optimizer(model)
    data = suite.batches()
    irt.reset_metrics()

    def step(lx, ly):
        loss = suite.LOSS(model(lx), ly)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    if compiled:
        step = irt.compile_step(step)
    losses = []
    local = _local_batches(data, mesh, steps or len(data))
    if loader:
        local = irt.ShardedLoader(local, mesh, ("data", None))
    for k, (lx, ly) in enumerate(local):
        if not loader:
            lx, ly = (
                irt.from_process_local(t, mesh, ("data",) + (None,) * (t.dim() - 1))
                for t in (lx, ly)
            )
        loss = step(lx, ly)
        if not compiled:
            irt.mark_step()
        losses.append(loss.item())  # replicated: no gather between processes
        if log:
            log(f"step {k} loss {losses[-1]:.6f}")
        if sleep:
            time.sleep(sleep)
        if raise_at == k and irt.process_index() == 1:
            raise RuntimeError(f"process 1 fails on purpose at step {k}")
    # Every process takes part in gathering a parameter sharded across processes.
    params = [irt.to_torch(p).numpy() for p in model.parameters()]
    return losses, params, irt.metrics()["counters"]["CompileCount"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["linear", "cnn"], default="linear")
    parser.add_argument("--mode", default="data")
    parser.add_argument("--steps", type=int, default=None, help="default: the suite's own")
    parser.add_argument("--out", default=None)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds between steps")
    parser.add_argument("--raise-at", type=int, default=None, help="process 1 raises here")
    parser.add_argument("--uneven", action="store_true", help="process 1 runs 3 more steps")
    parser.add_argument("--compiled", action="store_true", help="the step as irt.compile_step")
    parser.add_argument("--loader", action="store_true", help="batches through ShardedLoader")
    parser.add_argument(
        "--runs",
        default=None,
        help="model/mode[+compiled][+loader],...: these runs one after another in the same "
        "processes, each from an empty compile cache, written to --out with the prefix rK_",
    )
    args = parser.parse_args()
    irt.init()
    print(f"process {irt.process_index()} of {irt.process_count()}, pid {os.getpid()}", flush=True)
    if args.runs:
        _runs(args.runs.split(","), args.out)
        return
    steps = args.steps
    if args.uneven and irt.process_index() == 1:
        steps += 3
    losses, params, compiles = train(
        args.model,
        args.mode,
        steps,
        args.sleep,
        lambda m: print(m, flush=True),
        args.raise_at,
        args.compiled,
        args.loader,
    )
    print(f"compiles {compiles}", flush=True)
    if args.out and irt.process_index() == 0:
        arrays = {f"p{k}": p for k, p in enumerate(params)}
        replays = irt.metrics()["counters"].get("StepReplay", 0)
        np.savez(args.out, losses=np.array(losses), compiles=compiles, replays=replays, **arrays)


def _runs(runs: list, out) -> None:
    """Each run as its own launch would do it (a compile cache of its own), one npz for all."""
    arrays = {}
    for k, run in enumerate(runs):
        name, *flags = run.split("+")
        model, mode = name.split("/")
        irt.CACHE.clear()
        losses, params, compiles = train(
            model, mode, compiled="compiled" in flags, loader="loader" in flags
        )
        print(f"run {k} {run}: compiles {compiles}", flush=True)
        arrays.update({f"r{k}_p{j}": p for j, p in enumerate(params)})
        arrays[f"r{k}_losses"] = np.array(losses)
        arrays[f"r{k}_compiles"] = compiles
        arrays[f"r{k}_replays"] = irt.metrics()["counters"].get("StepReplay", 0)
    if out and irt.process_index() == 0:
        np.savez(out, **arrays)


if __name__ == "__main__":
    main()
