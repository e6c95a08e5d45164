"""Compiled programs and the cache that keeps them, keyed by graph hash."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

import jax
import jaxlib

from ir_core import DeviceData, Shape, graph_fingerprint, graph_hash
from ir_runtime import _collectives, _distributed, _metrics
from ir_runtime._dtypes import _X64, enable_x64
from ir_runtime._errors import CompileError, LoweringError
from ir_runtime._graph import Graph
from ir_runtime._lower import lowered
from ir_runtime._placement import spec_from_jax

# What else changes an executable. XLA reads its flags once, when the backend starts.
_ENV = (jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""))
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


class Executable:
    """A compiled graph: call ``run(arrays)`` with one array per parameter (in ``post_order``
    order of the graph's DeviceData nodes)."""

    def __init__(self, g: Graph, donate: tuple, fingerprint: bytes):
        lowering = lowered(g, donate)
        start = time.perf_counter()
        try:
            self.compiled = lowering.compile()
        except Exception as e:
            raise CompileError(f"XLA could not compile the graph: {type(e).__name__}: {e}") from e
        _metrics.record("CompileTime", time.perf_counter() - start)
        _metrics.count("CompileCount")
        self.fingerprint = fingerprint
        self.donate = donate
        self.program = g.program
        # Parameters fed by earlier results carry the compiled output shardings themselves:
        # use those very objects, so placing them is an identity check.
        outs = {o: o for o in self.compiled.output_shardings}
        self.in_shardings = [outs.get(s, s) for s in g.in_shardings()]
        self.out_shapes = [Shape(r.shape.dtype, r.shape.dims) for r in g.roots]
        self.out_specs = [
            spec_from_jax(s, len(shape.dims), g.program)
            for s, shape in zip(self.compiled.output_shardings, self.out_shapes, strict=True)
        ]
        text = self.compiled.as_text() or ""
        self.has_collectives = any(c in text for c in _COLLECTIVES)
        self.sync = self.has_collectives and self.program.devices[0].platform == "cpu"
        self.num_nodes = len(g.order)

    def results(self, outs) -> list[DeviceData]:
        """One ``DeviceData`` per root, holding the arrays ``run`` returned."""
        return [
            DeviceData(shape, handle=a, sharding=spec)
            for shape, a, spec in zip(self.out_shapes, outs, self.out_specs, strict=True)
        ]

    def run(self, arrays: list) -> list:
        start = time.perf_counter()
        if self.sync:
            _collectives.settle()
        try:
            outs = self.compiled(*arrays)
        except Exception as e:
            raise _distributed.device_failure(e, "the program") from e
        _collectives.launched(outs, self.sync)
        _metrics.record("ExecuteTime", time.perf_counter() - start)
        _metrics.count("ExecuteCount")
        return outs


class CompileCache:
    """Compiled programs by graph hash plus everything else that changes the executable,
    least recently used dropped first. A hit also compares the graph's full fingerprint, so two
    graphs that share a hash never share a program."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def _key(self, g: Graph, donate: tuple):
        pins = (
            None
            if g.pins is None
            else tuple(None if p is None else p.canonical_bytes() for p in g.pins)
        )
        return (graph_hash(g.roots), donate, pins, g.device_ids, _ENV, jax.config.jax_enable_x64)

    def get(self, roots, donate=(), out_shardings=None) -> tuple[Executable, Graph]:
        start = time.perf_counter()
        if not _X64[0]:
            enable_x64()
        g = Graph(roots, out_shardings)
        donate = _donate_indices(g, donate)
        key = self._key(g, donate)
        fingerprint = graph_fingerprint(g.roots)
        with self._lock:
            bucket = self._entries.get(key)
            if bucket is not None:
                self._entries.move_to_end(key)
                for exe in bucket:
                    if exe.fingerprint == fingerprint:
                        _metrics.count("CacheHit")
                        _metrics.record("CacheLookupTime", time.perf_counter() - start)
                        return exe, g
        _metrics.count("CacheMiss")
        _metrics.record("GraphNodes", len(g.order))
        exe = Executable(g, donate, fingerprint)
        with self._lock:
            bucket = self._entries.get(key)
            if bucket is None:
                bucket = self._entries[key] = []
            bucket.append(exe)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return exe, g

    def clear(self):
        with self._lock:
            self._entries.clear()

    def __len__(self):
        return sum(len(b) for b in self._entries.values())


def _donate_indices(g: Graph, donate) -> tuple:
    donate = list(donate)
    if not donate:
        return ()
    position = {id(p): k for k, p in enumerate(g.params)}
    out = []
    for d in donate:
        if id(d) not in position:
            raise LoweringError(f"cannot donate {d!r}: it is not a parameter of this graph")
        out.append(position[id(d)])
    return tuple(sorted(set(out)))


CACHE = CompileCache()


def compile(roots, donate=(), out_shardings=None) -> Executable:
    """The compiled program of the graph of ``roots``, from the cache when it is there."""
    return CACHE.get(roots, donate, out_shardings)[0]
