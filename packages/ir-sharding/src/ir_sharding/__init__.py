"""ir_sharding: meshes, sharding specs, clone-with-sharding and relink for ir-core graphs.

>>> from ir_core import DeviceData, Shape, Value
>>> mesh = Mesh(range(8), (4, 2), ("data", "model"))
>>> spec = ShardingSpec(mesh, ("data", None))
>>> spec.kind
<ShardingKind.PARTIAL: 3>
>>> x = Value(DeviceData(Shape("float32", (16, 4))))
>>> with_sharding(x, spec).node.sharding == spec
True
"""

from ir_core import relink
from ir_sharding._annotate import TupleSharding, clear_sharding, with_sharding
from ir_sharding._errors import ShardingError
from ir_sharding._jax import device_ordinal, global_devices
from ir_sharding._mesh import Mesh
from ir_sharding._spec import ShardingKind, ShardingSpec

__version__ = "0.3.6"

__all__ = [
    "Mesh",
    "ShardingError",
    "ShardingKind",
    "ShardingSpec",
    "TupleSharding",
    "clear_sharding",
    "device_ordinal",
    "global_devices",
    "relink",
    "with_sharding",
]
