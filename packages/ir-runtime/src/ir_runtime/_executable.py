"""A compiled program: XLA's executable for one graph, launched with its parameters' buffers.

``Executable(graph, donate, order, fingerprint)`` lowers the graph (``_lower``) and compiles
it; ``run(arrays)`` launches it under the one-collective-in-flight rule (``_collectives``; in
C, ``_launch``) and returns one array per root; ``results`` wraps them as ``DeviceData``. The
cache that keeps executables is ``_cache``; placing the parameters and running a graph end to
end is ``_execute``.
"""

from __future__ import annotations

import math
import os
import time

from ir_core import DeviceData, Shape
from ir_runtime import _launch, _metrics, _profile
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import CompileError
from ir_runtime._lower import lowered
from ir_runtime._memory import check_fits
from ir_runtime._placement import spec_from_jax

_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")

LAST_RUN = _launch.LAST_RUN  # the Executable that ran last

# XLA splits a CPU program's temporaries into blocks of at most this many bytes. XLA's CPU
# client takes each block from malloc on every run, and glibc maps a block above its mmap
# threshold (at most 32 MiB) afresh each time, so the kernel zero-fills every page of it again:
# on a small Llama's step that was a 136 MiB block, 34,000 page faults and a tenth of the
# step. Blocks under the threshold come from glibc's heap and are reused run after run.
# XLA gives any buffer larger than the bound a block of its own, and then a large program's
# blocks cannot share memory (an attention program's temporaries grew 1.6x): the bound is set
# only for programs whose every value fits in it, counting each element as at least 4 bytes
# (half-precision ops compute in float32), and none whose lowering makes values the graph does
# not show (``_HIDDEN``). (Accelerators keep a pool of device memory: their programs are left as
# XLA makes them.)
_CPU_HEAP = "xla_multiheap_size_constraint_per_heap"
CPU_HEAP_BYTES = 16 << 20
# Ops whose lowering makes values the graph does not show: a region's body, attention's blocks
# of logits (rewritten from ops whose values it does show, they are counted there).
_HIDDEN = frozenset(
    (
        "ir::attention",
        "ir::attention_backward",
        "ir::call_jax",
        "ir::call_jax_vjp",
        "ir::scan_layers",
        "ir::scan_layers_grad",
        "ir::shard_map",
        "ir::shard_map_grad",
    )
)
# Read as the compile cache reads them for its key, when ir_runtime is imported (XLA itself reads
# them once, when its backend starts).
_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")


def _fits(order, bound: int) -> bool:
    """Whether every value the nodes in ``order`` make fits in ``bound`` bytes (whole,
    unsharded: at least any device's share of it), and none of them hides values."""
    for node in order:
        if node.op in _HIDDEN:
            return False
        for shape in node.shapes:
            size = max(4, to_numpy_dtype(shape.dtype).itemsize)
            if math.prod(shape.dims) * size > bound:
                return False
    return True


def compiler_options(g) -> dict:
    """XLA's options for the program of graph ``g`` (a function of the graph, its devices'
    platform and XLA_FLAGS, all in the compile cache's key). ``XLA_FLAGS`` naming an option,
    set before ir_runtime is imported, wins."""
    cpu = g.program.devices[0].platform == "cpu"
    if not cpu or _CPU_HEAP in _XLA_FLAGS or not _fits(g.order, CPU_HEAP_BYTES):
        return {}
    return {_CPU_HEAP: CPU_HEAP_BYTES}


def memory_of(compiled) -> dict | None:
    """Device bytes per device of a compiled jax program, from XLA's analysis (exact, on
    every backend that has one; None where it has none): ``arguments``, ``outputs``,
    ``temporaries``, ``aliased`` (outputs written into donated arguments) and ``peak`` (their
    sum, less what is aliased)."""
    m = compiled.memory_analysis()
    if m is None:  # (a backend without the analysis)
        return None
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
    each donated parameter with the result meant to replace it (``_output_order``);
    ``checked``: a checked program (``_runtime_checks``), whose ``run`` raises a failed check."""

    def __init__(self, g, donate: tuple, order, fingerprint: bytes, checked: bool = False):
        self.checks = [] if checked else None  # filled as the program is traced
        lowering = lowered(g, donate, order, self.checks)
        start = time.perf_counter()
        try:
            with _profile.span("ir_runtime.compile"):
                self.compiled = lowering.compile(compiler_options(g))
        except Exception as e:
            raise CompileError(f"XLA could not compile the graph: {type(e).__name__}: {e}") from e
        _metrics.record("CompileTime", time.perf_counter() - start)
        _metrics.count("CompileCount")
        self.fingerprint = fingerprint
        self.donate = donate
        self.program = g.program
        # Parameters fed by earlier results carry the compiled output shardings themselves:
        # use those very objects, so placing them is an identity check. (jax makes one object
        # per result, and equal ones collapse here: a compiled step matches each parameter with
        # the result that feeds it, ``result_shardings``.)
        outs = {o: o for o in self.compiled.output_shardings}
        self.in_shardings = [outs.get(s, s) for s in g.in_shardings()]
        self.out_shapes = [Shape(r.shape.dtype, r.shape.dims) for r in g.roots]
        # The program returns its results in ``order`` (donation's pairing); run() returns
        # them in the roots' order.
        self._unorder = None if order is None else tuple(order.index(r) for r in range(len(order)))
        shardings = self._roots_order(self.compiled.output_shardings[: len(self.out_shapes)])
        self.result_shardings = shardings  # the objects each root's array carries
        self.out_specs = [
            spec_from_jax(s, len(shape.dims), g.program)
            for s, shape in zip(shardings, self.out_shapes, strict=True)
        ]
        check_fits(memory_of(self.compiled), self.program, g, self.out_specs)
        text = self.compiled.as_text() or ""
        self.has_collectives = any(c in text for c in _COLLECTIVES)
        self.sync = self.has_collectives and self.program.devices[0].platform == "cpu"
        self.num_nodes = len(g.order)
        self.call = None  # what ``run`` calls: jax's fast callable, once the first call made it

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

    # ``run(arrays)``: launch the program (``_launch``: in C, every replay's path).
    run = _launch.run
