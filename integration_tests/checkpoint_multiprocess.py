"""Save or restore a sharded checkpoint from a run of several processes (test_checkpoints.py).

``save DIR LAYOUT``: the model every test builds (seed 0), placed in LAYOUT, saved as step 1.
``restore DIR LAYOUT OUT``: a model of another seed placed in LAYOUT, step 1 restored into it,
its state gathered and written to OUT by process 0."""

import sys

import numpy as np
import torch

import ir_runtime as irt

LAYOUTS = {  # a 4x2 mesh over every process's devices
    "fsdp": ((("data", "model"), None), (("data", "model"), None)),
    "megatron": (("model", None), (None, "model")),
}


def build(seed, layout):
    torch.manual_seed(seed)
    m = irt.to_lazy(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    )
    mesh = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
    for layer, spec in zip((m[0], m[2]), LAYOUTS[layout], strict=True):
        irt.mark_sharding(layer.weight, mesh, spec)
    return m


def main(mode, directory, layout, out=None):
    irt.init()
    print(f"process {irt.process_index()} of {irt.process_count()}", flush=True)
    if mode == "save":
        irt.CheckpointManager(directory).save(1, {"model": build(0, layout), "meta": {"n": 2}})
        return
    m = build(5, layout)
    state = {"model": m, "meta": None}
    assert irt.CheckpointManager(directory).restore(1, state) == 1 and state["meta"] == {"n": 2}
    values = {k: irt.to_torch(v).numpy() for k, v in m.state_dict().items()}
    if irt.process_index() == 0:
        np.savez(out, **values)


if __name__ == "__main__":
    main(*sys.argv[1:])
