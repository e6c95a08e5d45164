"""``ShardedLoader``: batches placed on the mesh before the step asks for them.

torch_xla's ``MpDeviceLoader(loader, device, input_sharding=...)``, done as jax's input
pipelines do it: each ``next`` places a batch ``prefetch`` batches ahead over the mesh, then
yields one placed earlier, as lazy tensors holding that data, annotated with their sharding,
in the loader's structure (tensors inside tuples, lists and dicts; anything else passed
through). A placement only starts the host-to-device copy, so the copy runs while the steps
before that batch's run.

No thread: a loading thread would fight the training loop for Python's lock on every batch
(on a 2-core machine that cost a third of a small step, against a tenth to a fifth for
placing on the loop's own thread). The loading itself is the loader's: a ``DataLoader`` with
``num_workers`` reads and collates batches in its worker processes, ahead of the loop.

Across processes each process's loader yields only this process's rows (what
``process_local_slices`` names: a ``DistributedSampler`` does it), and every process places
its part of one global batch, as ``from_process_local`` does. A tensor the spec leaves
replicated must then be the same in every process.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import torch

from ir_runtime._frontend.recording._api import place_local, placed_tensor
from ir_sharding import Mesh, ShardingError, ShardingSpec


class _Placed:
    """A batch tensor's data, placed ahead: ``placed_tensor``'s arguments."""

    __slots__ = ("array", "spec")

    def __init__(self, array, spec):
        self.array, self.spec = array, spec


class _Failed:
    """What placing a batch ahead raised (the loader's own error, or a tensor that does not
    fit its spec): raised by the ``next`` that would have yielded that batch, once the batches
    before it have been used."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class ShardedLoader:
    """Iterate ``loader``'s batches as lazy tensors already placed over ``mesh``.

    Args:
        loader: any iterable of batches (a ``torch.utils.data.DataLoader``): tensors, or
            tuples, lists and dicts of them (other values pass through unchanged).
        mesh: the ``Mesh`` to place them over.
        partition_spec: how to shard each tensor, by its leading dims: one entry per dim, batch
            first (``("data", None)``). A tensor with fewer dims takes the first entries (those
            beyond its rank must be None), one with more dims is replicated along the rest.
            For dict batches, a dict of partition specs by key (a key left out: replicated).
        prefetch: how many batches to place ahead of the one being used (at least 1). Each
            holds device memory until it is used.

    Raises (at the ``next`` that would yield the batch):
        ShardingError: a tensor whose dims do not divide over the mesh axes of its spec.
    """

    def __init__(self, loader, mesh: Mesh, partition_spec, prefetch: int = 2):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"ShardedLoader takes an ir_sharding Mesh, got {type(mesh).__name__}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be a positive int, got {prefetch!r}")
        self.loader, self.mesh, self.prefetch = loader, mesh, prefetch
        if isinstance(partition_spec, dict):
            self.specs = {k: _entries(v, k) for k, v in partition_spec.items()}
        else:
            self.specs = _entries(partition_spec, "partition_spec")
        self.batches = 0  # batches placed so far (ahead of the ones yielded)
        self._specs: dict = {}  # (key, rank) -> ShardingSpec: one per kind of tensor

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        source = iter(self.loader)
        ahead: deque = deque()  # placed batches (or a _Failed last), in the loader's order
        more = True  # the loader may yield more (it has neither ended nor failed)
        while True:
            while more and len(ahead) <= self.prefetch:
                try:
                    placed = _rebuild(next(source), self._place)
                except StopIteration:
                    more = False
                    break
                # The loader's own error, or a batch that does not fit its spec: raised after the
                # batches before it. (An interrupt, not an Exception, comes out at once.)
                except Exception as e:
                    ahead.append(_Failed(e))
                    more = False
                    break
                ahead.append(placed)
                self.batches += 1
            if not ahead:
                return
            item = ahead.popleft()
            if type(item) is _Failed:
                raise item.error
            yield _rebuild(item, _lazy)

    def _place(self, t, key):
        if not isinstance(t, torch.Tensor):
            return t
        spec = self._specs.get((key, t.dim()))
        if spec is None:  # the same spec object each batch: its jax sharding is made once
            entries = self.specs.get(key, ()) if isinstance(self.specs, dict) else self.specs
            spec = ShardingSpec(self.mesh, _fit(entries, t.dim(), key))
            self._specs[(key, t.dim())] = spec
        name = "" if key is None else f"{key!r}, "
        what = f"batch {self.batches} ({name}the tensor {tuple(t.shape)})"
        return _Placed(place_local(t, spec, what=what), spec)


def _lazy(x, key):
    return placed_tensor(x.array, x.spec) if type(x) is _Placed else x


def _entries(partition_spec, what) -> tuple:
    if partition_spec is None:
        return ()
    if isinstance(partition_spec, (str, bytes)) or not hasattr(partition_spec, "__iter__"):
        raise ShardingError(
            f"{what}: a partition spec is a tuple of mesh axis names (or None, or tuples of "
            f"names), one per dim; got {partition_spec!r}"
        )
    return tuple(partition_spec)


def _fit(entries, rank: int, key) -> tuple:
    """``entries`` for a tensor of ``rank`` dims: its first ``rank`` entries, None beyond."""
    if any(e is not None for e in entries[rank:]):
        name = "" if key is None else f" {key!r}"
        raise ShardingError(
            f"the batch's tensor{name} has {rank} dims but its partition spec {entries} shards "
            f"dim {rank + min(i for i, e in enumerate(entries[rank:]) if e is not None)}"
        )
    return tuple(entries[:rank]) + (None,) * (rank - len(entries[:rank]))


def _rebuild(batch, leaf, key=None):
    """``batch`` in its structure (tuples, lists, named tuples, dicts) with every other value
    ``v`` replaced by ``leaf(v, key)``, ``key`` the top-level dict key above it."""
    if isinstance(batch, Mapping):  # dicts, and Hugging Face's BatchEncoding (a UserDict)
        items = {k: _rebuild(v, leaf, k if key is None else key) for k, v in batch.items()}
        try:
            return type(batch)(items)
        except TypeError:  # a mapping type not built from a dict (defaultdict): a dict
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_rebuild(v, leaf, key) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_rebuild(v, leaf, key) for v in batch)
    return leaf(batch, key)
