"""Train the TP tutorial's Llama under its plan (TP + SP on ``mesh["tp"]``, FSDP on
``mesh["dp"]``, a (2, 4) ``irt.device_mesh``), in one process or as one of two under
``python -m ir_runtime.launch``; process 0 writes the losses, the final parameters and what
each process's mesh answered to ``--out``.

    IR_RUNTIME_CPU_DEVICES=8 python plan_train.py --out one.npz
    python -m ir_runtime.launch --nprocs 2 --cpu-devices 4 plan_train.py --out two.npz
"""

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import ir_runtime as irt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_llama


def mesh_answers(mesh) -> list:
    """What this process's mesh says of itself: rank, coordinate, sub-meshes, local ranks."""
    return [
        mesh.get_rank(),
        *mesh.get_coordinate(),
        *mesh["tp"].mesh.tolist(),
        *mesh["dp"].mesh.tolist(),
        mesh.get_local_rank("dp"),
        mesh.get_local_rank("tp"),
    ]


def train(steps=4, compiled=True):
    """Losses, final parameters (numpy) and mesh answers of one run; every process calls it
    with the same global batches (each places them; a process holds only its blocks)."""
    mesh = irt.device_mesh((2, 4), ("dp", "tp"))
    model = tp_llama.parallelize(irt.to_lazy(tp_llama.build()), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(tokens, labels):
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    if compiled:
        step = irt.compile_step(step)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        tokens, labels = (torch.randint(0, 128, (8, 16), generator=generator) for _ in range(2))
        batch = [distribute_tensor(t, mesh, [Shard(0), Replicate()]) for t in (tokens, labels)]
        losses.append(step(*batch).item())
    params = [irt.to_torch(p).numpy() for p in model.parameters()]
    return losses, params, mesh_answers(mesh)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    irt.init()
    print(f"process {irt.process_index()} of {irt.process_count()}, pid {os.getpid()}", flush=True)
    losses, params, answers = train()
    print(f"mesh {answers}", flush=True)
    if args.out and irt.process_index() == 0:
        arrays = {f"p{k}": p for k, p in enumerate(params)}
        np.savez(args.out, losses=np.array(losses), **arrays)


if __name__ == "__main__":
    main()
