"""A process that saves a checkpoint per step until it is killed (test_checkpoints.py).

Step k's state: a lazy tensor of 1M float32 values all equal to k, sharded over 8 devices, and
the plain value {"step": k}; "ready" is printed once step 1 is complete."""

import sys

import numpy as np
import torch

import ir_runtime as irt


def main(directory, mode):
    irt.init(cpu_devices=8)
    mesh = irt.Mesh(np.arange(8), (8,), ("data",))
    ckpt = irt.CheckpointManager(directory, max_to_keep=3)
    for k in range(1, 10_000):
        t = irt.to_lazy(torch.full((1024, 1024), float(k)))
        irt.mark_sharding(t, mesh, ("data", None))
        if mode == "async":
            ckpt.save_async(k, {"w": t, "meta": {"step": k}})
        else:
            ckpt.save(k, {"w": t, "meta": {"step": k}})
        if k == 1:
            ckpt.join()
            print("ready", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
