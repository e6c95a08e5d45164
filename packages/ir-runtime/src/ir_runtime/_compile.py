"""Graphs to XLA: lowering to one jitted function, the compile cache, execution."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

import jax
import jaxlib
import numpy as np
from jax._src.array import ArrayImpl

from ir_core import DeviceData, Shape, Value, graph_fingerprint, graph_hash, post_order
from ir_runtime import _distributed, _metrics
from ir_runtime._data import put
from ir_runtime._dtypes import name_of, to_numpy_dtype
from ir_runtime._errors import CompileError, ExecutionError, LoweringError, RuntimeIRError
from ir_runtime._lowering import OPERANDS, rule_for
from ir_runtime._placement import Program, spec_at, spec_from_jax, specs_of

_DEFAULT = ()  # device ids of a graph with no sharding: the default device
# What else changes an executable. XLA reads its flags once, when the backend starts.
_ENV = (jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""))
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def _roots(roots) -> list:
    if isinstance(roots, Value):
        return [roots]
    out = []
    for k, r in enumerate(roots):
        if not isinstance(r, Value):
            raise LoweringError(f"root {k} is {r!r}; roots are ir_core.Value objects")
        out.append(r)
    return out


def _pins(pins, roots):
    """``execute``'s ``out_shardings``: None, or one ShardingSpec (or None) per root."""
    if pins is None:
        return None
    pins = tuple(pins)
    if len(pins) != len(roots):
        raise LoweringError(
            f"out_shardings has {len(pins)} entries for {len(roots)} roots; give one per root"
        )
    for k, (spec, r) in enumerate(zip(pins, roots, strict=True)):
        if spec is not None:
            specs_of(spec)  # a ShardingSpec, or a clear error
            spec.check_rank(r.shape.rank, f"root {k} ({r.shape})")
    return pins if any(p is not None for p in pins) else None


class _Graph:
    """One graph prepared for lowering: its post-order, parameters and program devices.

    Finding a cached program needs only the device ids; the full ``Program`` (which checks every
    sharding) is built on a miss, when the graph is compiled."""

    def __init__(self, roots, pins=None):
        self.roots = _roots(roots)
        self.pins = _pins(pins, self.roots)
        self.order = post_order(self.roots)
        self.params = [n for n in self.order if type(n) is DeviceData]
        self._program = None
        self.mesh = None
        self.device_ids = _DEFAULT
        for spec in self.pins or ():
            if spec is not None:
                self.mesh, self.device_ids = spec.mesh, spec.mesh.device_ids
                break
        for n in self.order if self.mesh is None else ():
            specs = specs_of(n.sharding)
            if specs:
                self.mesh, self.device_ids = specs[0].mesh, specs[0].mesh.device_ids
                break

    @property
    def program(self) -> Program:
        if self._program is None:
            self._program = Program.of(self.order, self.mesh)
        return self._program

    def in_shardings(self):
        return [self.program.jax_sharding(spec_at(p.sharding, 0)) for p in self.params]

    def out_shardings(self):
        # A pin given to execute, else the root's own annotation; None lets XLA choose.
        outs = []
        for k, r in enumerate(self.roots):
            spec = self.pins[k] if self.pins else None
            if spec is None:
                spec = spec_at(r.node.sharding, r.index)
            outs.append(None if spec is None else self.program.jax_sharding(spec))
        return outs

    def abstract_params(self):
        shardings = self.in_shardings()
        return [
            jax.ShapeDtypeStruct(p.shape.dims, to_numpy_dtype(p.shape.dtype), sharding=s)
            for p, s in zip(self.params, shardings, strict=True)
        ]

    def function(self):
        """The graph as a function of its parameters' arrays. It closes over the nodes, so it is
        used only to trace and then dropped: the cache keeps compiled programs, not graphs."""
        order, params, roots = self.order, self.params, self.roots
        program = self.program

        uses: dict = {}
        for n in order:
            for v in n.operands:
                uses[id(v.node)] = uses.get(id(v.node), 0) + 1

        def run(*args):
            env = {id(p): (a,) for p, a in zip(params, args, strict=True)}
            for n in order:
                if type(n) is DeviceData:
                    continue
                swapped = _transposed_product(n, env, uses)
                if swapped is not None:
                    env[id(n)] = swapped
                    continue
                env[id(n)] = _lower_node(n, [env[id(v.node)][v.index] for v in n.operands], program)
            return tuple(env[id(r.node)][r.index] for r in roots)

        return run


_TRANSPOSES = frozenset(("aten::t.default", "aten::transpose.int", "aten::permute.default"))


def _transposed_product(n, env, uses):
    """``t(mm(a, b))`` as ``mm(b.T, a.T)``: XLA folds transposed operands into the dot for free
    but writes a transposed result out as a copy (torch's linear backward makes exactly this
    for every weight gradient). Only when the product has no other use and ``n`` carries no
    sharding of its own; otherwise None, and the node is lowered as it is."""
    if n.op not in _TRANSPOSES or n.sharding is not None or len(n.operands) != 1:
        return None
    m = n.operands[0].node
    if m.op != "aten::mm.default" or uses.get(id(m)) != 1 or m.sharding is not None:
        return None
    if n.op == "aten::permute.default" and tuple(n.attrs["dims"]) not in ((1, 0), (-1, -2)):
        return None
    if n.op == "aten::transpose.int" and {n.attrs["dim0"] % 2, n.attrs["dim1"] % 2} != {0, 1}:
        return None
    a = env[id(m.operands[0].node)][m.operands[0].index]
    b = env[id(m.operands[1].node)][m.operands[1].index]
    out = jax.numpy.matmul(b.T, a.T, precision=jax.lax.Precision.HIGHEST)
    return (out.astype(to_numpy_dtype(n.shapes[0].dtype)),)


class _Lifted:
    """A node seen by its rule with lifted scalars back in its attributes, as traced values."""

    __slots__ = ("attrs", "op", "shapes")

    def __init__(self, node, attrs):
        self.op = node.op
        self.shapes = node.shapes
        self.attrs = attrs


def _lower_node(n, operands, program):
    rule = rule_for(n.op)
    lifted = n.attrs.get("__lifted__")
    view = n
    if lifted:
        k = len(lifted)
        attrs = {a: v for a, v in n.attrs.items() if a != "__lifted__"}
        attrs.update(zip(lifted, operands[-k:], strict=True))
        operands = operands[:-k]
        view = _Lifted(n, attrs)
    split = OPERANDS.get(n.op)
    if split is not None:
        operands = split.split(view.attrs, operands)
    try:
        out = rule(view, *operands)
    except RuntimeIRError:
        raise
    except Exception as e:
        raise LoweringError(
            f"lowering {n.op!r} failed: {type(e).__name__}: {e} (node {n!r})"
        ) from e
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(n.shapes):
        raise LoweringError(
            f"the rule for {n.op!r} gave {len(outs)} output(s), the node has {len(n.shapes)}"
        )
    checked = []
    for k, (o, s) in enumerate(zip(outs, n.shapes, strict=True)):
        if tuple(o.shape) != s.dims or name_of(o.dtype) != s.dtype:
            raise LoweringError(
                f"the rule for {n.op!r} gave output {k} as {name_of(o.dtype)}{list(o.shape)}, "
                f"but the node says {s}; the rule or the front end's shape inference is wrong"
            )
        spec = spec_at(n.sharding, k)
        if spec is not None:
            o = jax.lax.with_sharding_constraint(o, program.jax_sharding(spec))
        checked.append(o)
    return tuple(checked)


def lower(roots) -> str:
    """The StableHLO text of the graph of ``roots`` (a ``Value`` or a list of them)."""
    g = _Graph(roots)
    return _lowered(g, ()).as_text()


def _lowered(g: _Graph, donate: tuple):
    with _metrics.timed("LowerTime"):
        fn = jax.jit(
            g.function(),
            in_shardings=g.in_shardings(),
            out_shardings=tuple(g.out_shardings()),
            donate_argnums=donate,
            keep_unused=True,
        )
        return fn.lower(*g.abstract_params())


class Executable:
    """A compiled graph: call ``run(arrays)`` with one array per parameter (in ``post_order``
    order of the graph's DeviceData nodes)."""

    def __init__(self, g: _Graph, donate: tuple, fingerprint: bytes):
        lowered = _lowered(g, donate)
        start = time.perf_counter()
        try:
            self.compiled = lowered.compile()
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
            settle()
        try:
            outs = self.compiled(*arrays)
        except Exception as e:
            raise _distributed.device_failure(e, "the program") from e
        if outs:
            _LAST[0] = outs[0]
            if self.sync:
                _IN_FLIGHT[0] = outs[0]
        _distributed.STATE.launched += 1
        _metrics.record("ExecuteTime", time.perf_counter() - start)
        _metrics.count("ExecuteCount")
        return outs


# XLA's CPU collectives deadlock when several executions of collective programs overlap
# (README, collectives): at most one may be in flight. Its first result is kept here; the next
# collective program, or a reshard, waits for it before it starts. One execution's results
# become ready together, so waiting on one is enough. The host meanwhile traces the next step.
_IN_FLIGHT: list = [None]


def settle() -> None:
    """Wait for the collective program still running on CPU devices, if there is one."""
    a = _IN_FLIGHT[0]
    if a is None:
        return
    _IN_FLIGHT[0] = None
    _metrics.count("CollectiveSync")
    try:
        if not a.is_deleted():
            a.block_until_ready()
    except Exception as e:
        raise _distributed.device_failure(e, "the previous program") from e


_LAST: list = [None]  # the first result of the last program launched


def wait_device_ops() -> None:
    """Wait until the programs launched so far have finished (torch_xla's
    ``xm.wait_device_ops``): programs run in launch order, so waiting for the last is enough.
    ``mark_step`` returns once its program is launched; time a loop with this at its end."""
    settle()
    a = _LAST[0]
    _LAST[0] = None
    if a is not None and not a.is_deleted():
        a.block_until_ready()


def reshard(h, sharding):
    """``h`` moved to ``sharding`` by jax, once no collective program is running."""
    settle()
    if (
        isinstance(h, jax.Array)
        and not sharding.is_fully_addressable
        and h.sharding.device_set != sharding.device_set
    ):
        # Across processes jax moves arrays only between shardings over the same devices: a
        # process-local array (a parameter before its first step) goes through the host.
        return put(np.asarray(h), sharding)
    return jax.device_put(h, sharding)


class CompileCache:
    """Compiled programs by graph hash plus everything else that changes the executable. A hit
    also compares the graph's full fingerprint, so two graphs that share a hash never share a
    program."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def _key(self, roots, g: _Graph, donate: tuple):
        pins = (
            None
            if g.pins is None
            else tuple(None if p is None else p.canonical_bytes() for p in g.pins)
        )
        return (graph_hash(roots), donate, pins, g.device_ids, _ENV, jax.config.jax_enable_x64)

    def get(self, roots, donate=(), out_shardings=None) -> tuple[Executable, _Graph]:
        start = time.perf_counter()
        g = _Graph(roots, out_shardings)
        donate = _donate_indices(g, donate)
        key = self._key(g.roots, g, donate)
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
            self._entries.setdefault(key, []).append(exe)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return exe, g

    def clear(self):
        with self._lock:
            self._entries.clear()

    def __len__(self):
        return sum(len(b) for b in self._entries.values())


def _donate_indices(g: _Graph, donate) -> tuple:
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
_EQUIVALENT: dict = {}
_ArrayImpl = ArrayImpl  # jax.Array's concrete type: an exact type check is cheap
_SCALARS: dict = {}


def _place(p: DeviceData, sharding):
    """The parameter's buffer on ``sharding``: moved only when it is not already there."""
    h = p.handle
    if h is None:
        raise LoweringError(f"parameter {p!r} has no data (handle None); bind an array first")
    if type(h) is _ArrayImpl and h.sharding is sharding and not h.is_deleted():
        return h  # the steady state: a result of the previous step, where it belongs
    if isinstance(h, jax.Array):
        if h.is_deleted():
            raise ExecutionError(f"parameter {p!r} holds a deleted (donated) buffer")
        current = h.sharding
        if current == sharding:
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
            if len(_SCALARS) > 4096:
                _SCALARS.clear()
            _metrics.count("TransferToDevice")
            placed = _SCALARS[key] = put(host, sharding)
        return placed
    _metrics.count("TransferToDevice")
    return put(host, sharding)


def compile(roots, donate=(), out_shardings=None) -> Executable:
    """The compiled program of the graph of ``roots``, from the cache when it is there."""
    return CACHE.get(roots, donate, out_shardings)[0]


def execute(roots, donate=(), out_shardings=None) -> list[DeviceData]:
    """Run the graph of ``roots``; one ``DeviceData`` per root, holding its result.

    Args:
        roots: a ``Value`` or a list of them.
        donate: parameters (``DeviceData`` nodes of the graph) whose buffers the program may
            reuse for its results; their handles are invalid afterwards.
        out_shardings: None, or one ShardingSpec (or None) per root: where its result must
            land, as a root's own annotation would say, without cloning the root. Part of the
            cache key.

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
    arrays = [_place(p, s) for p, s in zip(g.params, exe.in_shardings, strict=True)]
    if exe.donate:
        _metrics.count("DonatedBuffers", len(exe.donate))
    return exe.results(exe.run(arrays)), exe, g, arrays
