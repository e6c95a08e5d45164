"""Compiled programs and the cache that keeps them, keyed by graph hash."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

import jax
import jaxlib

from ir_core import DeviceData, Shape, graph_fingerprint, graph_hash
from ir_runtime import _collectives, _debug, _distributed, _metrics, _profile
from ir_runtime._dtypes import _X64, enable_x64
from ir_runtime._errors import CompileError, LoweringError
from ir_runtime._graph import Graph
from ir_runtime._lower import lowered
from ir_runtime._placement import spec_at, spec_from_jax
from ir_sharding import ShardingKind

# What else changes an executable. XLA reads its flags once, when the backend starts.
_ENV = (jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""))
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


LAST_RUN: list = [None]  # the Executable that ran last


def memory_of(compiled) -> dict:
    """Device bytes per device of a compiled jax program, from XLA's analysis (exact, on
    every backend): ``arguments``, ``outputs``, ``temporaries``, ``aliased`` (outputs written
    into donated arguments) and ``peak`` (their sum, less what is aliased)."""
    m = compiled.memory_analysis()
    out = {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
    }
    out["peak"] = out["arguments"] + out["outputs"] + out["temporaries"] - out["aliased"]
    return out


class Executable:
    """A compiled graph: call ``run(arrays)`` with one array per parameter (in ``post_order``
    order of the graph's DeviceData nodes); it returns one array per root, in the roots' order.

    ``donate``: the parameters (indices) whose buffers the results take over; ``order``: the
    order the program itself returns its results in (None: the roots'), so that jax pairs
    each donated parameter with the result meant to replace it (``_output_order``)."""

    def __init__(self, g: Graph, donate: tuple, order, fingerprint: bytes):
        lowering = lowered(g, donate, order)
        start = time.perf_counter()
        try:
            with _profile.span("ir_runtime.compile"):
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
        # The program returns its results in ``order`` (donation's pairing); run() returns
        # them in the roots' order.
        self._unorder = None if order is None else tuple(order.index(r) for r in range(len(order)))
        shardings = self._roots_order(self.compiled.output_shardings)
        self.out_specs = [
            spec_from_jax(s, len(shape.dims), g.program)
            for s, shape in zip(shardings, self.out_shapes, strict=True)
        ]
        text = self.compiled.as_text() or ""
        self.has_collectives = any(c in text for c in _COLLECTIVES)
        self.sync = self.has_collectives and self.program.devices[0].platform == "cpu"
        self.num_nodes = len(g.order)

    def _roots_order(self, outs):
        u = self._unorder
        return outs if u is None else [outs[j] for j in u]

    def memory(self) -> dict:
        """``memory_of`` the compiled program."""
        return memory_of(self.compiled)

    def results(self, outs) -> list[DeviceData]:
        """One ``DeviceData`` per root, holding the arrays ``run`` returned."""
        return [
            DeviceData(shape, handle=a, sharding=spec)
            for shape, a, spec in zip(self.out_shapes, outs, self.out_specs, strict=True)
        ]

    def run(self, arrays: list) -> list:
        start = time.perf_counter()
        LAST_RUN[0] = self
        if self.sync:
            _collectives.settle()
        try:
            if _profile.ACTIVE[0]:
                with _profile.span("ir_runtime.execute"):
                    outs = self.compiled(*arrays)
            else:
                outs = self.compiled(*arrays)
        except Exception as e:
            raise _distributed.device_failure(e, "the program") from e
        if self._unorder is not None:
            outs = [outs[j] for j in self._unorder]
        _collectives.launched(outs, self.sync)
        _metrics.executed(time.perf_counter() - start, len(self.donate))
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
        donate = _donate_indices(g, donate)  # (indices, the order of the results)
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
        summary = None
        if _debug.DEBUG[0]:
            summary = _debug.compiling(g.order, g.roots, _debug_extra(g, donate))
        exe = Executable(g, *donate, fingerprint)
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


def _debug_extra(g: Graph, donate) -> dict:
    """What else keys the program, as the debugger names it."""
    return {
        "donated parameters": list(donate[0]),
        "the order of the results (donation's pairing)": donate[1],
        "pinned outputs": None if g.pins is None else [str(p) for p in g.pins],
        "devices": list(g.device_ids),
        "jax x64": jax.config.jax_enable_x64,
        "jax, jaxlib, XLA_FLAGS": _ENV,
    }


def _donate_indices(g: Graph, donate) -> tuple:
    """The donated parameters' indices, and the order of the results (None: the roots')."""
    if callable(donate):
        candidates = [k for k, p in enumerate(g.params) if donate(p)]
        pairs = _aliasable(g, candidates, getattr(donate, "replaces", {}))
        return tuple(k for k, _ in pairs), _output_order(pairs, len(g.roots))
    donate = list(donate)
    if not donate:
        return (), None
    position = {id(p): k for k, p in enumerate(g.params)}
    out = []
    for d in donate:
        if id(d) not in position:
            raise LoweringError(f"cannot donate {d!r}: it is not a parameter of this graph")
        out.append(position[id(d)])
    return tuple(sorted(set(out))), None


def _aliasable(g: Graph, candidates: list, replaces: dict) -> tuple:
    """``(parameter index, root index)`` for each of the ``candidates`` (parameter indices)
    whose buffer a result can take over: one of the same shape, dtype and sharding (or one
    whose sharding XLA chooses). The result that replaces it (``replaces``: id of a
    parameter -> root index, what the caller knows) first; else any such result left. A
    parameter no result can take is left out: donating it would free nothing, and jax would
    warn that it was not usable."""
    if not candidates:
        return ()
    # Compared as specs, not as jax shardings: those need the graph's Program, a walk of every
    # node, which a cache hit never pays for otherwise. Replicated data and a parameter with no
    # spec (replicated over the program's devices) are one placement, as jax sees them.
    ins = {k: _placement(spec_at(g.params[k].sharding, 0)) for k in candidates}
    outs = []  # per root: where its result must land (None: XLA chooses), as out_shardings
    for r, v in enumerate(g.roots):
        spec = g.pins[r] if g.pins else None
        if spec is None:
            spec = spec_at(v.node.sharding, v.index)
        outs.append(None if spec is None else _placement(spec))
    roots = g.roots

    def fits(k, r) -> bool:
        p, root = g.params[k], roots[r]
        return (
            p.shape.dims == root.shape.dims
            and p.shape.dtype == root.shape.dtype
            and (outs[r] is None or outs[r] == ins[k])
        )

    pairs, taken, left = [], set(), []
    for k in candidates:
        r = replaces.get(id(g.params[k]))
        if r is not None and r not in taken and fits(k, r):
            pairs.append((k, r))
            taken.add(r)
        else:
            left.append(k)
    free: dict = {}  # (dims, dtype) -> the roots of that shape not yet paired
    for r, root in enumerate(roots):
        if r not in taken:
            free.setdefault((root.shape.dims, root.shape.dtype), []).append(r)
    for exact in (True, False):  # results of the parameter's own sharding first
        rest = []
        for k in left:
            p = g.params[k]
            pool = free.get((p.shape.dims, p.shape.dtype), ())
            for i, r in enumerate(pool):
                if fits(k, r) and (outs[r] is not None) is exact:
                    pairs.append((k, pool.pop(i)))
                    break
            else:
                rest.append(k)
        left = rest
    return tuple(sorted(pairs))


_REPLICATED = object()  # the placement of replicated data, whatever spec says it


def _placement(spec):
    """A spec as ``_aliasable`` compares it: replicated (or no spec) as one value."""
    if spec is None or spec.kind is ShardingKind.REPLICATED:
        return _REPLICATED
    return spec


def _output_order(pairs: tuple, n: int):
    """The order the program returns its ``n`` results in, so that jax's pairing (each result
    takes the first donated parameter of its shape left) gives each result the parameter
    ``pairs`` gives it: the paired results first, by parameter, then the others. None when
    that is the roots' own order."""
    first = [r for _, r in pairs]  # (pairs are sorted by parameter)
    paired = set(first)
    order = tuple(first + [r for r in range(n) if r not in paired])
    return None if order == tuple(range(n)) else order


CACHE = CompileCache()


def compile(roots, donate=(), out_shardings=None) -> Executable:
    """The compiled program of the graph of ``roots``, from the cache when it is there."""
    return CACHE.get(roots, donate, out_shardings)[0]
