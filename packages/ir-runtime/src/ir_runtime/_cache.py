"""The compile cache: compiled programs (``_executable``) kept by graph hash, least recently
used dropped first."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

import jax
import jaxlib

from ir_core import graph_fingerprint, graph_hash
from ir_runtime import _check, _debug, _donation, _metrics, _runtime_checks
from ir_runtime._dtypes import X64, enable_x64
from ir_runtime._executable import Executable
from ir_runtime._graph import Graph

# What else changes an executable. XLA reads its flags once, when the backend starts.
_ENV = (jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""))


class CompileCache:
    """Compiled programs by graph hash plus everything else that changes the executable,
    least recently used dropped first. A hit also compares the graph's full fingerprint, so two
    graphs that share a hash never share a program."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def _key(self, g: Graph, donate: tuple, checked: bool):
        # (a root's own annotation is in its hash already; a pin is not)
        outs = tuple(None if s is None else s.canonical_bytes() for s in g.out_specs)
        x64 = jax.config.jax_enable_x64
        return (graph_hash(g.roots), donate, outs, g.device_ids, _ENV, x64, checked)

    def get(self, roots, donate=(), out_shardings=None) -> tuple[Executable, Graph]:
        start = time.perf_counter()
        if not X64[0]:
            enable_x64()
        g = Graph(roots, out_shardings)
        donate = _donation.indices(g, donate)  # (indices, the order of the results)
        checked = _runtime_checks.enabled()  # (a checked program is another program)
        key = self._key(g, donate, checked)
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
        if _check.enabled():  # the IR verifier (docs/dialect.md)
            _check.check_graph(g.roots, order=g.order)
        _metrics.record("GraphNodes", len(g.order))
        summary = None
        if _debug.DEBUG[0]:
            summary = _debug.compiling(g.order, g.roots, _debug_extra(g, donate, checked))
        exe = Executable(g, *donate, fingerprint, checked=checked)
        _debug.compiled(summary)
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


def _debug_extra(g: Graph, donate, checked: bool) -> dict:
    """What else keys the program, as the debugger names it."""
    return {
        "checked (IR_RUNTIME_PROGRAM_CHECKS)": checked,
        "donated parameters": list(donate[0]),
        "the order of the results (donation's pairing)": donate[1],
        "where the results land": [None if s is None else str(s) for s in g.out_specs],
        "devices": list(g.device_ids),
        "jax x64": jax.config.jax_enable_x64,
        "jax, jaxlib, XLA_FLAGS": _ENV,
    }


CACHE = CompileCache()


def compile(roots, donate=(), out_shardings=None) -> Executable:
    """The compiled program of the graph of ``roots``, from the cache when it is there."""
    return CACHE.get(roots, donate, out_shardings)[0]
