"""``torch_xla.distributed.parallel_loader`` (``pl``): batches moved to the device as the
loop asks for them, each tensor placed as ``input_sharding`` says, the next batches prepared
on a background thread."""

from __future__ import annotations

import queue
import threading

import torch

import ir_runtime as irt
from ir_runtime.torch_xla import _core


def _place(batch, device, input_sharding):
    """``batch`` with its CPU tensors on ``device``, sharded by ``input_sharding``: one
    ``xs.ShardingSpec`` (applied to every tensor of its rank), or a dict of them by the
    batch's keys (the batch must be a dict holding every key)."""
    from torch_xla.distributed.spmd import ShardingSpec

    if isinstance(input_sharding, dict):
        if not isinstance(batch, dict):
            raise ValueError(
                f"input_sharding is a dict (keys {sorted(input_sharding)}), so each batch must "
                f"be a dict of tensors; got a {type(batch).__name__}"
            )
        missing = [k for k in batch if k not in input_sharding]
        if missing:
            raise KeyError(
                f"input_sharding has no ShardingSpec for batch key(s) {missing}: give one per "
                f"key of the batch"
            )
        return {k: _place(v, device, input_sharding[k]) for k, v in batch.items()}
    if type(batch) is torch.Tensor and batch.device.type == "cpu":
        # Placed as data in one go, on the loader's thread: no pending tensor that a step on
        # the main thread could take as its own, and no copy to reshard afterwards.
        fits = isinstance(input_sharding, ShardingSpec) and input_sharding.can_apply(batch)
        one = irt.process_count() == 1
        if fits and (one or input_sharding.minibatch):
            input_sharding.check_minibatch(batch)  # (minibatch: each process's part of it)
            return _placed(batch, input_sharding._spec)
        if not fits and one and _core.virtual_device():
            return _placed(batch, _core.replicated_spec())
        t = batch.to(device)  # (across processes, each passing the whole batch)
        if fits:
            input_sharding.apply(t)
        elif _core.virtual_device():
            _core.replicate(t)
        return t
    if isinstance(batch, (list, tuple)):
        return type(batch)(_place(v, device, input_sharding) for v in batch)
    if isinstance(batch, dict):
        return {k: _place(v, device, input_sharding) for k, v in batch.items()}
    return batch


def _placed(batch: torch.Tensor, spec):
    from ir_runtime._frontend.recording._api import place_local, placed_tensor

    return placed_tensor(place_local(batch, spec), spec)


class _Failed:
    def __init__(self, error):
        self.error = error


_DONE = object()


class PerDeviceLoader:
    """Iterates ``loader``'s batches placed on ``device``; ``prefetch`` batches are made
    ahead on a thread (errors surface at the batch that raised them)."""

    def __init__(self, loader, device, input_sharding=None, prefetch: int = 2):
        self._loader = loader
        self._device = torch.device(device)
        self._input_sharding = input_sharding
        self._prefetch = max(1, int(prefetch))
        self._batches = 0

    def __iter__(self):
        q: queue.Queue = queue.Queue(self._prefetch)
        stop = threading.Event()

        def work():
            try:
                for batch in self._loader:
                    if stop.is_set():
                        return
                    q.put(_place(batch, self._device, self._input_sharding))
            except BaseException as e:  # handed to the consumer
                q.put(_Failed(e))
                return
            q.put(_DONE)

        thread = threading.Thread(target=work, daemon=True, name="MpDeviceLoader")
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                self._batches += 1
                yield item
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    thread.join(0.01)

    def __len__(self):
        return len(self._loader)

    def next(self):
        return next(iter(self))


class MpDeviceLoader(PerDeviceLoader):
    """torch_xla's device loader: ``MpDeviceLoader(loader, device, input_sharding=...)``.
    ``loader_prefetch_size`` / ``device_prefetch_size`` set how many batches are made
    ahead; the other keyword arguments of torch_xla's (thread counts, ``batchdim``) are
    taken and have nothing to set here."""

    def __init__(
        self,
        loader,
        device,
        input_sharding=None,
        loader_prefetch_size: int = 8,
        device_prefetch_size: int = 4,
        **kwargs,
    ):
        super().__init__(
            loader, device, input_sharding, prefetch=min(loader_prefetch_size, device_prefetch_size)
        )


class ParallelLoader:
    """``ParallelLoader(loader, devices).per_device_loader(device)``."""

    def __init__(
        self,
        loader,
        devices,
        batchdim: int = 0,
        batches_per_execution: int = 1,
        loader_prefetch_size: int = 8,
        device_prefetch_size: int = 4,
        input_sharding=None,
        **kwargs,
    ):
        self._loader = loader
        self._input_sharding = input_sharding
        self._prefetch = min(loader_prefetch_size, device_prefetch_size)

    def per_device_loader(self, device):
        return PerDeviceLoader(self._loader, device, self._input_sharding, self._prefetch)
