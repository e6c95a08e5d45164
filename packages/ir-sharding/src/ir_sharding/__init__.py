"""ir_sharding: Meshes, sharding specs, clone-with-sharding and relink for ir-core graphs.

Not implemented yet: this is the package's skeleton (issue #3). It installs, declares its
version and its range on its siblings, and nothing else.
"""

__version__ = "0.0.1"

__all__: list[str] = []
