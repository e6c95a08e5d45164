"""Running a graph: find its program, place each parameter's buffer, launch, wrap results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ir_core import DeviceData
from ir_runtime import _metrics
from ir_runtime._bounded import Bounded
from ir_runtime._cache import CACHE
from ir_runtime._collectives import settle
from ir_runtime._data import put
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import ExecutionError, LoweringError
from ir_runtime._jaxapi import ArrayImpl

# (sharding, sharding, rank) -> whether they place an array alike; and scalar values placed.
_EQUIVALENT = Bounded(1024)
_SCALARS = Bounded(4096)


def reshard(h, sharding, copy: bool = False):
    """``h`` moved to ``sharding`` by jax, once no collective program is running. jax reuses
    the buffers when the two shardings place the array alike; ``copy`` makes new ones, for a
    result that must not share them with ``h`` (a buffer one node may donate while another
    still reads it)."""
    settle()
    if not isinstance(h, jax.Array):  # host data: placed (and its bytes counted) by put
        return put(np.asarray(h), sharding)
    if not sharding.is_fully_addressable and h.sharding.device_set != sharding.device_set:
        # Across processes jax moves arrays only between shardings over the same devices: a
        # process-local array (a parameter before its first step) goes through the host.
        return put(np.asarray(h), sharding)
    out = jax.device_put(h, sharding)
    if copy and _buffers(out) & _buffers(h):
        # (device_put keeps a shard's buffer even with may_alias=False: one device's data,
        # replicated over a mesh that includes it)
        out = jnp.copy(out)
    return out


def _buffers(a: jax.Array) -> set:
    return {s.data.unsafe_buffer_pointer() for s in a.addressable_shards}


# (current, wanted) shardings by identity -> (current, wanted, equal): a program's results
# carry its output shardings, equal to the next program's input shardings but other objects,
# and comparing two shardings runs Python; each pair is compared once.
_SAME = Bounded(1024)


def same_sharding(current, wanted) -> bool:
    """``current == wanted``, remembered per pair of objects."""
    hit = _SAME.get((id(current), id(wanted)))
    if hit is not None and hit[0] is current and hit[1] is wanted:
        return hit[2]
    equal = current == wanted
    _SAME[(id(current), id(wanted))] = (current, wanted, equal)
    return equal


def place(p: DeviceData, sharding):
    """The parameter's buffer on ``sharding``: moved only when it is not already there."""
    h = p.handle
    if h is None:
        raise LoweringError(f"parameter {p!r} has no data (handle None); bind an array first")
    if type(h) is ArrayImpl and not h.is_deleted():
        current = h.sharding
        if current is sharding or same_sharding(current, sharding):
            return h  # the steady state: a result of the previous step, where it belongs
    if isinstance(h, jax.Array):
        if h.is_deleted():
            raise ExecutionError(f"parameter {p!r} holds a deleted (donated) buffer")
        current = h.sharding
        if same_sharding(current, sharding):
            return h
        key = (current, sharding, h.ndim)
        same = _EQUIVALENT.get(key)
        if same is None:
            same = _EQUIVALENT[key] = current.is_equivalent_to(sharding, h.ndim)
        # An equivalent placement is relabeled without a copy; the exact sharding keeps jax on
        # its fast call path.
        _metrics.count("Relabel" if same else "Reshard")
        return reshard(h, sharding)
    expected = to_numpy_dtype(p.shape.dtype)
    host = np.asarray(h, dtype=expected)
    if host.ndim == 0:
        # Scalars (lifted learning rates, bias corrections) repeat from step to step: place
        # each value once.
        key = (host.dtype, host.tobytes(), sharding)
        placed = _SCALARS.get(key)
        if placed is None:
            _metrics.count("TransferToDevice")
            placed = _SCALARS[key] = put(host, sharding)
        return placed
    _metrics.count("TransferToDevice")
    return put(host, sharding)


def execute(roots, donate=(), out_shardings=None) -> list[DeviceData]:
    """Run the graph of ``roots``; one ``DeviceData`` per root, holding its result.

    Args:
        roots: a ``Value`` or a list of them.
        donate: parameters (``DeviceData`` nodes of the graph) whose buffers the program may
            reuse for its results; their handles are invalid afterwards.
        out_shardings: None, or one ShardingSpec (or None) per root: where its result must
            land, as a root's own annotation would say, without cloning the root. A root that
            carries an annotation of its own lands where that says. Part of the cache key.

    Returns:
        ``DeviceData`` nodes whose handle is the result's ``jax.Array`` and whose sharding is
        where XLA put it (None: replicated over the program's devices).

    Raises:
        UnsupportedOpError, LoweringError, CompileError, ExecutionError. Inputs are untouched by
        any of them, except donated buffers once the program has started.
    """
    return run_graph(roots, donate, out_shardings)[0]


def run_graph(roots, donate=(), out_shardings=None):
    """``execute``, also returning what ran: ``(results, executable, graph, arrays)``, where
    ``arrays`` are the placed parameter buffers (in ``graph.params`` order)."""
    exe, g = CACHE.get(roots, donate, out_shardings)
    arrays = [place(p, s) for p, s in zip(g.params, exe.in_shardings, strict=True)]
    return exe.results(exe.run(arrays)), exe, g, arrays
