"""``torch_xla.distributed.xla_backend``: torch.distributed's ``"xla"`` backend. Under this
engine one SPMD program spans every process (``jax.distributed``), so a process group has
nothing to carry: ``dist.init_process_group("xla", init_method="xla://")`` is refused by name,
pointing at the SPMD form."""

from __future__ import annotations

import torch.distributed as dist


def _create_xla_process_group(prefix_store, rank, size, timeout):
    raise NotImplementedError(
        "torch.distributed's 'xla' backend: this engine runs one SPMD program over every "
        "process (python -m ir_runtime.launch, jax.distributed), and tensors are global; "
        "use torch_xla.runtime.use_spmd() and shardings instead of a process group"
    )


if "xla" not in dist.Backend.backend_list:
    dist.Backend.register_backend("xla", _create_xla_process_group, devices=["xla"])
