"""A graph prepared for lowering: its roots checked, its post-order, parameters and devices."""

from __future__ import annotations

import jax

from ir_core import DeviceData, Value, post_order
from ir_runtime._dtypes import to_numpy_dtype
from ir_runtime._errors import LoweringError
from ir_runtime._placement import Program, spec_at, specs_of
from ir_sharding import ShardingError, ShardingSpec

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


def _out_specs(pins, roots) -> list:
    """Each root's own annotation, else its pin (``execute``'s ``out_shardings``: None, or one
    ShardingSpec, None or ``REPLICATED`` per root, checked here where it is used), held
    evenly: a dim the root's shape does not divide into its blocks is returned whole (jax holds
    only even blocks; inside the program XLA computes the uneven ones)."""
    own = [spec_at(r.node.sharding, r.index) for r in roots]
    if pins is not None:
        pins = tuple(pins)
        if len(pins) != len(roots):
            raise LoweringError(
                f"out_shardings has {len(pins)} entries for {len(roots)} roots; give one per root"
            )
        for k, (spec, pin, r) in enumerate(zip(own, pins, roots, strict=True)):
            if spec is None and pin is not None:
                if pin is not REPLICATED:
                    specs_of(pin)  # a ShardingSpec, or a clear error
                    pin.check_rank(len(r.shape.dims), f"root {k} ({r.shape})")
                own[k] = pin
    return [
        s if s is None or s is REPLICATED else s.evenly(r.shape.dims)
        for s, r in zip(own, roots, strict=True)
    ]


class Graph:
    """One graph prepared for lowering, resolved in one walk and read by everything downstream
    (the cache's key, donation's pairing, lowering, the executable):

    - ``order``: its nodes in post-order; ``params``: its ``DeviceData`` leaves, in that order;
    - ``mesh`` and ``device_ids``: where the program runs (the mesh of the first result's
      placement in ``out_specs``, else of the first annotated node; none: the default device);
    - ``out_specs``: where each root's result lands: the root's own annotation, else its pin
      (``execute``'s ``out_shardings``, the front end's claims; ``REPLICATED`` resolved over
      the mesh), else None (XLA chooses).

    Finding a cached program needs only these; the ``Program`` (which checks that every
    sharding is over the same devices) is built on a miss, when the graph is compiled."""

    def __init__(self, roots, pins=None):
        self.roots = roots = roots_of(roots)
        specs = _out_specs(pins, roots)
        self.order = post_order(roots)
        self.params = [n for n in self.order if type(n) is DeviceData]
        self._program = None
        mesh = None
        for spec in specs:
            if spec is not None and spec is not REPLICATED:
                mesh = spec.mesh
                break
        for n in self.order if mesh is None else ():
            found = specs_of(n.sharding)  # (a tuple sharding may hold no spec at all)
            if found:
                mesh = found[0].mesh
                break
        self.mesh = mesh
        self.device_ids = DEFAULT_DEVICES if mesh is None else mesh.device_ids
        if any(s is REPLICATED for s in specs):
            everywhere = None if mesh is None else ShardingSpec.replicated(mesh)
            specs = [everywhere if s is REPLICATED else s for s in specs]
        self.out_specs = tuple(specs)

    @property
    def program(self) -> Program:
        if self._program is None:
            ids = None if self.mesh is None else self.mesh.device_ids
            for n in self.order:
                sharding = n.sharding
                if sharding is None:
                    continue
                for k, shape in enumerate(n.shapes):
                    spec = spec_at(sharding, k)
                    if spec is None:
                        continue
                    if spec.mesh.device_ids != ids:
                        raise LoweringError(
                            f"one graph uses two device orders: {list(ids)} (mesh "
                            f"{self.mesh}) and {list(spec.mesh.device_ids)} (mesh {spec.mesh}, "
                            f"from {n!r}); every sharding in a program must be over the same "
                            f"devices in the same order (jax's device assignment)"
                        )
                    try:
                        spec.check_rank(len(shape.dims), f"{n!r}")
                    except ShardingError as e:
                        raise LoweringError(str(e)) from e
            self._program = Program.of(self.mesh)
        return self._program

    def in_shardings(self):
        return [self.program.jax_sharding(spec_at(p.sharding, 0)) for p in self.params]

    def out_shardings(self):
        """``out_specs`` as jax shardings (None: XLA chooses)."""
        program = self.program
        return [None if s is None else program.jax_sharding(s) for s in self.out_specs]

    def abstract_params(self):
        shardings = self.in_shardings()
        return [
            jax.ShapeDtypeStruct(p.shape.dims, to_numpy_dtype(p.shape.dtype), sharding=s)
            for p, s in zip(self.params, shardings, strict=True)
        ]
