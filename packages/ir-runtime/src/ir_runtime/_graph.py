"""A graph prepared for lowering: its roots checked, its post-order, parameters and devices."""

from __future__ import annotations

import jax

from ir_core import DeviceData, Value, post_order
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import LoweringError
from ir_runtime._placement import Program, spec_at, specs_of
from ir_sharding import ShardingSpec

DEFAULT_DEVICES = ()  # device ids of a graph with no sharding: the default device
# A pin (the front end's): replicated over the devices of the graph's program, whichever they
# turn out to be (None, unsharded, when the graph has no mesh).
REPLICATED = "replicated over the program's devices"


def roots_of(roots) -> list:
    """``roots`` (a ``Value`` or an iterable of them) as a list, each checked to be a Value."""
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
        if spec is not None and spec is not REPLICATED:
            specs_of(spec)  # a ShardingSpec, or a clear error
            spec.check_rank(r.shape.rank, f"root {k} ({r.shape})")
    return pins if any(p is not None for p in pins) else None


class Graph:
    """One graph prepared for lowering: its post-order, parameters and program devices.

    Finding a cached program needs only the device ids; the full ``Program`` (which checks every
    sharding) is built on a miss, when the graph is compiled."""

    def __init__(self, roots, pins=None):
        self.roots = roots_of(roots)
        self.pins = _pins(pins, self.roots)
        self.order = post_order(self.roots)
        self.params = [n for n in self.order if type(n) is DeviceData]
        self._program = None
        self.mesh = None
        self.device_ids = DEFAULT_DEVICES
        for spec in self.pins or ():
            if spec is not None and spec is not REPLICATED:
                self.mesh, self.device_ids = spec.mesh, spec.mesh.device_ids
                break
        for n in self.order if self.mesh is None else ():
            specs = specs_of(n.sharding)
            if specs:
                self.mesh, self.device_ids = specs[0].mesh, specs[0].mesh.device_ids
                break
        if self.pins is not None and any(p is REPLICATED for p in self.pins):
            everywhere = None if self.mesh is None else ShardingSpec.replicated(self.mesh)
            self.pins = tuple(everywhere if p is REPLICATED else p for p in self.pins)

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
