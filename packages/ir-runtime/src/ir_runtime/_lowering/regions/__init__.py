"""Rules for the region nodes: a body graph traced once and lowered inside one JAX construct.

``bodies`` keeps the traced bodies by digest; ``scan`` lowers ``ir::scan_layers`` (one
``lax.scan`` over a layer's graph) and its gradient; ``shard_map`` lowers ``ir::shard_map``
(a manual region), its gradient and the collectives used inside it; ``jax_call`` lowers
``ir::call_jax`` (a JAX function called from torch) and its vjp. Registered with the other
rules when ``ir_runtime._lowering`` is imported, so ``supported_ops()`` lists them from
``import ir_runtime`` on.
"""

from ir_runtime._lowering.regions import jax_call, scan, shard_map  # noqa: F401  (their rules)
