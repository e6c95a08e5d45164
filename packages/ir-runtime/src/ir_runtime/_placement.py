"""Where a program runs and how its arrays are placed: ShardingSpec <-> jax shardings."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from ir_runtime._bounded import Bounded
from ir_runtime._devices import device_by_id
from ir_runtime._errors import LoweringError
from ir_sharding import ShardingKind, ShardingSpec, TupleSharding, device_ordinal


def specs_of(sharding) -> list:
    """The ShardingSpecs inside a node's sharding annotation."""
    if sharding is None:
        return []
    if isinstance(sharding, TupleSharding):
        return [s for s in sharding.specs if s is not None]
    if isinstance(sharding, ShardingSpec):
        return [sharding]
    raise LoweringError(
        f"sharding {sharding!r} ({type(sharding).__name__}) is not an ir_sharding ShardingSpec "
        f"or TupleSharding; the runtime places arrays only by those"
    )


def spec_at(sharding, index: int):
    """The ShardingSpec of output ``index`` of a node whose annotation is ``sharding``."""
    if isinstance(sharding, TupleSharding):
        return sharding.specs[index]
    return specs_of(sharding)[0] if sharding is not None else None


_PROGRAMS = Bounded(64)  # mesh -> Program, reused from step to step

# The device orders (a mesh's ``device_ids``) placements have used, and who wants to know when
# a second one appears: tensors over two orders cannot meet in one program (jax compiles a
# program for one device assignment), and while there is only one, nobody needs to check.
ORDERS: set = set()
ON_SECOND_ORDER: list = []


def note_order(mesh) -> None:
    """Remember that something is placed over ``mesh``'s devices, in its order."""
    ids = mesh.device_ids
    if ids not in ORDERS:
        ORDERS.add(ids)
        if len(ORDERS) == 2:
            for tell in ON_SECOND_ORDER:
                tell()


class Program:
    """The devices a graph runs on: the mesh of its shardings, or one device when it has none.

    An unsharded parameter or result is replicated over these devices (``sharding=None`` means
    exactly that, so a step whose results come back replicated hashes like the step before).
    """

    @staticmethod
    def of(mesh):
        """The Program over ``mesh`` (None: no sharding), made once per mesh."""
        program = _PROGRAMS.get(mesh)
        if program is None:
            program = _PROGRAMS[mesh] = Program(mesh)
            if mesh is not None:
                note_order(mesh)
        return program

    def __init__(self, mesh):
        self.mesh = mesh
        by_id = device_by_id()
        if mesh is None:
            # This process's first device: in several processes, each runs an unsharded
            # graph on its own.
            self.device_ids = (device_ordinal(jax.local_devices()[0]),)
        else:
            missing = [d for d in mesh.device_ids if d not in by_id]
            if missing:
                raise LoweringError(
                    f"mesh device {missing[0]} does not exist; the backend has devices "
                    f"{sorted(by_id)} (ir_runtime.init(cpu_devices=N) on CPU)"
                )
            self.device_ids = mesh.device_ids
        self.devices = [by_id[d] for d in self.device_ids]
        self.one_device = mesh is None and len(self.devices) == 1  # (no partitioner runs)
        if mesh is not None:
            # Over the mesh itself, so a replicated parameter's sharding equals the replicated
            # results the program returns (jax's fast call path compares them).
            self.replicated = ShardingSpec.replicated(mesh).to_jax()
        elif len(self.devices) == 1:
            self.replicated = SingleDeviceSharding(self.devices[0])
        else:
            flat = jax.sharding.Mesh(np.array(self.devices, dtype=object), ("devices",))
            self.replicated = NamedSharding(flat, PartitionSpec())

    def jax_sharding(self, spec):
        """The jax sharding for a ShardingSpec, or the replicated default for None."""
        if spec is None:
            return self.replicated
        # Not a dict keyed by spec: specs compare by placement, and two specs with one placement
        # can be written for different ranks. Each spec caches its own conversion.
        return spec.to_jax()


def spec_from_jax(sharding, ndim: int, program: Program):
    """The ShardingSpec of a placement jax reports for a program's result, None when it is
    replicated over the program's devices (so a step whose results come back replicated hashes
    like the step before). A ``NamedSharding`` converts to a spec over a mesh equal to the one
    it was built from, so a result fed back into the next step has the device order of the
    arrays beside it."""
    spec = ShardingSpec.from_jax(sharding, ndim, mesh=program.mesh)
    if spec.kind is ShardingKind.REPLICATED and set(spec.mesh.device_ids) == set(
        program.device_ids
    ):
        return None
    return spec
