"""ir_runtime: lowering of ir-core graphs to XLA through JAX, a compile cache, SPMD execution,
and the PyTorch lazy-tensor front end.

Not implemented yet: this is the package's skeleton (issue #4). It installs, declares its
version and its range on its siblings, and nothing else.
"""

__version__ = "0.0.2"

__all__: list[str] = []
