"""``torch_xla.distributed.xla_backend``: torch.distributed's ``"xla"`` backend and the
``xla://`` rendezvous (registered by ``import torch_xla``).

``init_method="xla://"`` is torch_xla's rendezvous: a store, this process's rank and the
process count, taken from this engine's processes (``ir_runtime.process_index`` and
``process_count``; one process: a ``HashStore``; several: a ``TCPStore`` at ``MASTER_ADDR``
and ``MASTER_PORT``, else beside the coordinator). torch_xla's SPMD scripts use it for a CPU
process group (``init_process_group("gloo", init_method="xla://")``, for distributed
checkpoints). The ``"xla"`` backend itself carries collectives between per-device replicas,
torch_xla's non-SPMD model: under SPMD it is an ``AssertionError`` as in torch_xla, and
otherwise refused by name (this engine runs one SPMD program over every process)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

import ir_runtime as _irt
from ir_runtime.torch_xla import _core


def _create_xla_process_group(prefix_store, rank, size, timeout):
    assert not _core.is_spmd(), "XLA backend is not supported with SPMD"
    raise NotImplementedError(
        "torch.distributed's 'xla' backend (collectives between per-device replicas): this "
        "engine runs one SPMD program over every process (python -m ir_runtime.launch, "
        "jax.distributed), and tensors are global; use torch_xla.runtime.use_spmd() and "
        "shardings, and a 'gloo' group (init_method='xla://') for what needs one"
    )


def _store_address() -> tuple[str, int]:
    host = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if host and port:
        return host, int(port)
    from ir_runtime._distributed import ENV_COORDINATOR

    coordinator = os.environ.get(ENV_COORDINATOR)
    if not coordinator:
        raise RuntimeError(
            "init_method='xla://' over several processes needs MASTER_ADDR and MASTER_PORT "
            f"(as torchrun sets them) or {ENV_COORDINATOR} (as python -m ir_runtime.launch "
            f"sets it)"
        )
    host, _, port = coordinator.rpartition(":")
    return host.strip("[]"), int(port) + 1  # (the coordinator's port is jax's)


def _xla_rendezvous(url: str, timeout: timedelta = timedelta(minutes=5), **kwargs):
    _core.devices()  # (the runtime starts as torch_xla's environment says, if it has not)
    rank, size = _irt.process_index(), _irt.process_count()
    if size == 1:
        store = dist.HashStore()
    else:
        host, port = _store_address()
        store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout)
    yield store, rank, size


def register() -> None:
    """Register the ``xla`` backend and the ``xla://`` rendezvous with torch.distributed."""
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _create_xla_process_group, devices=["xla"])
    try:
        dist.register_rendezvous_handler("xla", _xla_rendezvous)
    except RuntimeError:  # (registered already)
        pass


register()
