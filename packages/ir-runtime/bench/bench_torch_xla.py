"""The torch_xla layer's cost: one training script written against torch_xla's API and the same
model written against ir_runtime's own, side by side on 8 CPU devices.

The torch_xla side is ``integration_tests/torch_xla_train.py`` unchanged (a small Llama under
FSDPv2 over a 1-D mesh, ``MpDeviceLoader`` with ``input_sharding``, the step under
``torch_xla.compile``), run by ``python -m ir_runtime.torch_xla``. The native side places the
same model the same way with ``ir_runtime`` calls (each parameter on ``"fsdp"`` over its largest
dim, each decoder layer's output and the logits on the batch dim, batches from
``ShardedLoader``) and runs the same step with ``mark_step``: both trace every step's Python and
run the cached program, as torch_xla does. The step time is the mean after warm-up steps, each
step waited for; each system runs in its own process (a process names its device once), the
two alternating for several rounds, and the ratio is the median of each round's. The native
step under ``compile_step`` (its replay, without the Python) is reported beside, for scale.

Prints a table and writes JSON (``--json PATH``)."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.join(HERE, "..", "..", "..")
SCRIPT = os.path.join(TOP, "integration_tests", "torch_xla_train.py")
sys.path[:0] = [TOP, os.path.join(TOP, "integration_tests")]


def native(steps: int, warmup: int, compiled: bool) -> dict:
    """The same training, written against ir_runtime's API."""
    import numpy as np
    import torch
    import torch_xla_train as script

    import ir_runtime as irt

    irt.init(cpu_devices=8)
    mesh = irt.Mesh(np.arange(8), (8,), ("fsdp",))
    model = irt.to_lazy(script.decoder())
    for p in model.parameters():
        spec = [None] * p.dim()
        spec[list(p.shape).index(max(p.shape))] = "fsdp"
        irt.mark_sharding(p, mesh, tuple(spec))

    def batch_dim(module, args, output):
        t = getattr(output, "logits", output)
        t = t[0] if isinstance(t, tuple) else t
        irt.mark_sharding(t, mesh, ("fsdp",) + (None,) * (t.dim() - 1))

    for layer in model.model.layers:
        layer.register_forward_hook(batch_dim)
    model.register_forward_hook(batch_dim)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(ids):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        return loss

    run = irt.compile_step(step) if compiled else step
    losses, times = [], []
    for k, ids in enumerate(irt.ShardedLoader(script.batches(steps), mesh, ("fsdp", None))):
        start = time.perf_counter()
        loss = run(ids)
        irt.mark_step()
        irt.wait_device_ops()
        losses.append(loss.item())
        if k >= warmup:
            times.append(time.perf_counter() - start)
    return {"losses": losses, "step_seconds": sum(times) / len(times)}


def _run(args: list) -> dict:
    env = dict(os.environ, CPU_NUM_DEVICES="8")
    env.pop("IR_RUNTIME_CPU_DEVICES", None)
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--native", choices=["traced", "compiled"])  # (a child process)
    args = parser.parse_args()
    if args.native:
        print(json.dumps(native(args.steps, args.warmup, args.native == "compiled")))
        return
    counts = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    rounds = []
    for _ in range(args.rounds):
        layer = _run(["-m", "ir_runtime.torch_xla", SCRIPT, *counts])
        own = _run([__file__, "--native", "traced", *counts])
        rounds.append((layer, own))
    replay = _run([__file__, "--native", "compiled", *counts])
    for layer, own in rounds:
        if max(abs(a - b) for a, b in zip(layer["losses"], own["losses"], strict=True)) > 1e-5:
            raise AssertionError(
                f"the two scripts' losses differ: {layer['losses']} {own['losses']}"
            )
    ratio = statistics.median(a["step_seconds"] / b["step_seconds"] for a, b in rounds)
    t_layer = statistics.median(a["step_seconds"] for a, _ in rounds)
    t_own = statistics.median(b["step_seconds"] for _, b in rounds)
    print("torch_xla layer vs ir_runtime's API: a small Llama, FSDPv2 over 8 CPU devices")
    print(f"{'':40s}{'step (ms)':>12s}")
    print(f"{'torch_xla script (torch_xla.compile)':40s}{t_layer * 1e3:12.1f}")
    print(f"{'ir_runtime API (mark_step)':40s}{t_own * 1e3:12.1f}")
    print(f"{'ir_runtime API (compile_step replay)':40s}{replay['step_seconds'] * 1e3:12.1f}")
    print(f"torch_xla / ir_runtime (median of {args.rounds} rounds): {ratio:.3f}x (target <= 1.05)")
    import torch

    import benchjson

    benchjson.write(
        args.json,
        {
            "step_seconds": {"torch_xla": t_layer, "ir_runtime": t_own},
            "compile_step_seconds": replay["step_seconds"],
            "ratio": ratio,
            "rounds": [[a["step_seconds"], b["step_seconds"]] for a, b in rounds],
            "environment": benchjson.environment(torch=torch.__version__),
        },
    )


if __name__ == "__main__":
    main()
